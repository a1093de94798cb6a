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

.PHONY: setup build run test lint unit integration bench bench-quick clean

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

test: setup lint build
	$(CARGO) test --release

# Benchmarks: see bench/bench.py. The chart needs matplotlib, installed from
# PyPI into target/bench-venv on first use (the table does not need it).
BENCH_PY := $(CURDIR)/target/bench-venv/bin/python

$(BENCH_PY):
	python3 -m venv $(CURDIR)/target/bench-venv
	$(BENCH_PY) -m pip install --quiet matplotlib || echo "matplotlib unavailable: the chart will be skipped"

bench: build $(BENCH_PY)
	$(BENCH_PY) bench/bench.py

bench-quick: build
	python3 bench/bench.py --quick

clean:
	$(CARGO) clean
