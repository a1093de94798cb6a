# make run   build the module, start Valkey on 127.0.0.1:6379 with it loaded (foreground)
# make test  unit, property and integration tests against a real valkey-server
# Both install what is missing first (Debian/Ubuntu): see scripts/setup.sh.
# make memcheck  integration tests with every server under valgrind: see below.
# make fuzz      the long fuzz run (make test runs a short one): see below.

SHELL := /bin/bash
CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libvalkey_ratelimit.so
VALKEY_SERVER ?= $(shell command -v valkey-server 2>/dev/null)
PORT ?= 6379
export VALKEY_SERVER
export RL_MODULE := $(MODULE)

.PHONY: setup build run test lint unit integration bench bench-quick clean test-matrix memcheck fuzz profile demo dist test-examples test-external deb test-deb docker-check test-clients test-clients-node test-clients-python

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
# The clock tests need a server that runs under libfaketime: Debian's 8.0.1
# hangs there, so they use the Valkey 9 build of scripts/valkey9.sh (made
# here once per machine, about 5 minutes; test-matrix uses the same cache).
test: setup lint build
	@echo "test: the clock tests run on Valkey 9 (scripts/valkey9.sh, cached)"; bash scripts/valkey9.sh >/dev/null
	@set -o pipefail; $(CARGO) test --release 2>&1 | tee target/test.log; status=$$?; \
	awk '/^test result:/ { p += $$4; f += $$6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log; \
	exit $$status

# The integration tests against a server that is already running with the
# module (a container, a packaged install), as valkey-bundle runs each
# module's tests against its image: RL_TEST_SERVER=host:port make
# test-external. It FLUSHALLs that server. Tests that need a server of their
# own are skipped; without RL_TEST_SERVER, a valkey-server with the module is
# started here (and stopped). Last line: passed, skipped, failed.
# See docs/testing.md and scripts/test-external.sh.
test-external: build
	@bash scripts/test-external.sh

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

# The integration tests with every valkey-server under valgrind memcheck, on
# Valkey 9 built with MALLOC=libc OPTIMIZATION=-O0 (scripts/valkey9.sh --libc,
# cached outside the tree like test-matrix's). FAIL on an invalid access, an
# uninitialised read, a crash, a failed test, or a definite leak with a frame in
# the module; each problem is printed once with its stack, the last line is the
# verdict. Takes minutes. MEMCHECK_TESTS (test binaries), MEMCHECK_SKIP (test
# names) and MEMCHECK_THREADS (default 2) change the run; logs in
# target/memcheck. See scripts/memcheck.sh.
memcheck: build
	@$(if $(MEMCHECK_TESTS),MEMCHECK_TESTS="$(MEMCHECK_TESTS)") \
	  $(if $(MEMCHECK_SKIP),MEMCHECK_SKIP="$(MEMCHECK_SKIP)") \
	  $(if $(MEMCHECK_THREADS),MEMCHECK_THREADS="$(MEMCHECK_THREADS)") \
	  CARGO="$(CARGO)" bash scripts/memcheck.sh

# The long fuzz run: tests/fuzz.rs (random and mutated commands, RESTORE of
# mutated DUMP payloads, RL.APPLY of mutated effects, against real servers)
# and the codec's decode fuzzers, with FUZZ_CASES cases each (make test runs
# a few thousand). FUZZ_SEED picks another seed; the last line is the verdict.
FUZZ_CASES ?= 200000
fuzz: build
	@seed="$${FUZZ_SEED:-$$(date +%s)}"; log=target/fuzz.log; start=$$(date +%s); \
	echo "fuzz: seed $$seed, $(FUZZ_CASES) cases per target, log $$log"; \
	if RL_FUZZ_SEED=$$seed RL_FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release --test fuzz -- --nocapture >$$log 2>&1 && \
	   RL_FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release --lib -- codec_survives every_change_to_a_loadable_state >>$$log 2>&1; \
	then grep '^fuzz_' $$log; echo "fuzz: PASS, seed $$seed, $(FUZZ_CASES) cases per target, $$(( $$(date +%s) - start )) s"; \
	else grep -E '^fuzz_|panicked|seed [0-9]+ case' $$log | head -20; \
	  echo "fuzz: FAIL, seed $$seed (reproduce: make fuzz FUZZ_SEED=$$seed), see $$log"; exit 1; fi

# Instructions per command under callgrind, beside INCR's (bench/profile.py):
# a stable figure on a noisy machine. Writes bench/PROFILE.md. Needs valgrind.
profile: build
	@bash scripts/setup.sh --valgrind
	python3 bench/profile.py

# The client recipes under examples/ (Python, Node, Go, Rust), each tested
# against a real valkey-server with the module; a recipe whose toolchain is
# missing is skipped with a line saying why. See examples/README.md.
test-examples: build
	@bash examples/run-tests.sh

# The client packages under clients/, each tested against a real
# valkey-server with this tree's module (RL_MODULE): make test-clients runs
# every clients/*/test.sh; a package whose toolchain is missing (exit 77)
# fails the run when RL_CLIENTS_REQUIRE=1 (CI), else is skipped.
test-clients: build
	@status=0; for t in clients/*/test.sh; do \
	  echo "== $$t"; bash "$$t"; rc=$$?; \
	  if [ $$rc -eq 77 ] && [ "$${RL_CLIENTS_REQUIRE:-0}" != 1 ]; then echo "== $$t: SKIP"; \
	  elif [ $$rc -ne 0 ]; then echo "== $$t: FAIL (exit $$rc)"; status=1; else echo "== $$t: PASS"; fi; \
	done; exit $$status

# The Node package (clients/node, npm valkey-ratelimit): npm ci, tsc, node:test.
test-clients-node: build
	@bash clients/node/test.sh

# The Python package (clients/python): lint, its tests, Flask-Limiter and
# slowapi apps over HTTP, and limits' own test suite (the pinned sdist from
# PyPI, patched) for its storage; installs what it needs into
# target/clients-venv. See scripts/test-clients.sh.
test-clients-python: build
	@bash clients/python/test.sh

# Shell: sets $$py to a python3 with matplotlib (installed from PyPI into
# target/bench-venv on first use), or to plain python3 when that fails.
WITH_MATPLOTLIB = py=python3; \
	if [ -x target/bench-venv/bin/python ] || python3 -m venv target/bench-venv >/dev/null 2>&1; then \
	  if target/bench-venv/bin/python -c 'import matplotlib' 2>/dev/null || \
	     target/bench-venv/bin/python -m pip install --quiet matplotlib; then py=target/bench-venv/bin/python; fi; \
	fi

# make demo: one traffic pattern (steady, a burst straddling a window boundary,
# a client hammering, idle) through every algorithm at the same limit, on its
# own valkey-server; about 15 s. Prints allowed/denied per algorithm and phase
# and draws target/demo/demo.png (copied to docs/demo.png). The chart needs
# matplotlib, installed into target/bench-venv as for bench; without it, the
# summary only.
demo: build
	@$(WITH_MATPLOTLIB); \
	$$py scripts/demo.py

# make dist: target/dist/valkey-ratelimit-<version>-<os>-<arch>.tar.gz and its
# .sha256 (the release .so, packaging/valkey-ratelimit.conf, README, CHANGELOG,
# SHA256SUMS), then unpacked and loaded into $(VALKEY_SERVER) as a check.
# See scripts/dist.sh.
dist: build
	@bash scripts/dist.sh

# make deb: target/deb/valkey-ratelimit_<version>-1_<arch>.deb, installing the
# module in /usr/lib/valkey/modules/, the sample config as the conffile
# /etc/valkey/valkey-ratelimit.conf, the docs and the licence; depends on
# libc6 and libgcc-s1, recommends valkey-server (>= 8.0). See scripts/deb.sh.
deb: build
	@bash scripts/deb.sh >/dev/null

# make test-deb: installs that package with dpkg (root or sudo), loads it into
# Debian's valkey-server through /etc/valkey/valkey.conf plus the include line,
# smoke-tests it, runs the integration tests against it (as test-external),
# then removes and purges it and checks nothing is left. See scripts/deb-test.sh.
test-deb: deb
	@RL_DEB_SUITE=1 bash scripts/deb-test.sh "$$(ls -t target/deb/*.deb | head -1)"

# make docker-check: what can be proven about the Dockerfile without a registry
# or a container runtime (root; minutes the first time; not in CI): its shape,
# the build stage's commands run in a debootstrap chroot of the same Debian
# release, the final layout and the entrypoint's load line there. Says at the
# end what it cannot prove. See scripts/docker-check.sh and docs/testing.md.
docker-check:
	@bash scripts/docker-check.sh

# Benchmarks: see bench/bench.py. The chart needs matplotlib, installed from
# PyPI into target/bench-venv on first use; without it the table is still made.
bench: build
	@$(WITH_MATPLOTLIB); \
	[ "$$py" = python3 ] && echo "bench: matplotlib unavailable, the chart is skipped"; \
	$$py bench/bench.py

bench-quick: build
	python3 bench/bench.py --quick

clean:
	$(CARGO) clean
