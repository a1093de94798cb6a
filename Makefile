# make run   build the module, start Valkey on 127.0.0.1:6379 with it loaded (foreground)
# make test  unit, property and integration tests against a real valkey-server
# Both install what is missing first (Debian/Ubuntu): see scripts/setup.sh.

SHELL := /bin/bash
CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libvalkey_ratelimit.so
VALKEY_SERVER ?= $(shell command -v valkey-server 2>/dev/null)
PORT ?= 6379
export VALKEY_SERVER
export RL_MODULE := $(MODULE)

.PHONY: setup build run test lint unit integration bench bench-quick clean test-matrix

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release

run: build
	@server="$${VALKEY_SERVER:-$$(command -v valkey-server)}"; \
	echo "Starting $$server on 127.0.0.1:$(PORT) with $(MODULE) (Ctrl-C stops it)"; \
	exec "$$server" --bind 127.0.0.1 --port $(PORT) --save '' --appendonly no \
	  --enable-debug-command local --loadmodule $(MODULE)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --all-targets -- -D warnings

unit: setup
	$(CARGO) test --release --lib

integration: build
	@server="$${VALKEY_SERVER:-$$(command -v valkey-server)}"; echo "integration tests against: $$($$server --version)"
	$(CARGO) test --release --test '*'

# The last line sums every test binary's result: "tests: N passed, N failed".
test: setup lint build
	@set -o pipefail; $(CARGO) test --release 2>&1 | tee target/test.log; status=$$?; \
	awk '/^test result:/ { p += $$4; f += $$6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log; \
	exit $$status

# The whole suite once per supported server: Debian's valkey-server (8.0) and
# Valkey 9 built from Debian's source package by scripts/valkey9.sh (cached
# outside the tree, built once per machine). Logs: target/test-matrix-<version>.log.
test-matrix: build
	@default="$$(command -v valkey-server || echo /usr/bin/valkey-server)"; \
	v9="$$(bash scripts/valkey9.sh)" || { echo "test-matrix: could not build Valkey 9" >&2; exit 1; }; \
	table=""; status=0; \
	for server in "$$default" "$$v9"; do \
	  version="$$("$$server" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"; \
	  log="target/test-matrix-$$version.log"; \
	  echo "test-matrix: cargo test --release against Valkey $$version ($$server), log $$log"; \
	  start=$$(date +%s); \
	  if VALKEY_SERVER="$$server" $(CARGO) test --release --no-fail-fast >"$$log" 2>&1; \
	  then result=pass; else result=FAIL; status=1; fi; \
	  counts="$$(awk '/^test result:/ { for (i = 2; i <= NF; i++) { \
	    if ($$i ~ /^passed/) p += $$(i-1); if ($$i ~ /^failed/) f += $$(i-1); \
	    if ($$i ~ /^ignored/) g += $$(i-1) } } \
	    END { printf "%d passed, %d failed, %d ignored", p, f, g }' "$$log")"; \
	  failed="$$(sed -n 's/^    \([a-z_0-9:]*\)$$/\1/p' "$$log" | sort -u | tr '\n' ' ')"; \
	  table="$$table$$(printf '%-10s | %-6s | %s in %ss %s' "$$version" "$$result" "$$counts" "$$(( $$(date +%s) - start ))" "$${failed:+(failed: $$failed)}")\n"; \
	done; \
	printf '\n%-10s | %-6s | %s\n' version result tests; \
	printf -- '-----------+--------+------------------------------\n'; \
	printf "$$table"; \
	exit $$status

# Benchmarks: see bench/bench.py. The chart needs matplotlib, installed from
# PyPI into target/bench-venv on first use; without it the table is still made.
bench: build
	@py=python3; \
	if [ -x target/bench-venv/bin/python ] || python3 -m venv target/bench-venv >/dev/null 2>&1; then \
	  if target/bench-venv/bin/python -c 'import matplotlib' 2>/dev/null || \
	     target/bench-venv/bin/python -m pip install --quiet matplotlib; then py=target/bench-venv/bin/python; fi; \
	fi; \
	[ "$$py" = python3 ] && echo "bench: matplotlib unavailable, the chart is skipped"; \
	$$py bench/bench.py

bench-quick: build
	python3 bench/bench.py --quick

clean:
	$(CARGO) clean
