#!/usr/bin/env bash
# The Rust recipe's tests: cargo test (its own workspace, target dir under the
# repository's target/examples/rust) against a real valkey-server with the
# module. Exit 0 passed, 77 skipped, anything else failed.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib/valkey.sh"

cargo="${CARGO:-cargo}"
if ! command -v "$cargo" >/dev/null; then echo "SKIP: cargo not found (install a Rust toolchain)"; exit 77; fi
valkey_require || exit 77

# Build outside the main crate's target/release and target/debug, so the
# module's own build is never disturbed.
export CARGO_TARGET_DIR="$RL_REPO_ROOT/target/examples/rust"
cd "$here" || exit 1

# Dependencies come from crates.io, pinned by Cargo.lock; offline works when
# they are already in the cargo cache.
if ! "$cargo" fetch --locked -q 2>/dev/null && ! "$cargo" fetch --locked --offline -q; then
  echo "SKIP: cannot fetch the crates in Cargo.lock (is crates.io reachable?)"; exit 77
fi
# Compile first (minutes on a cold cache), then start the server for the run.
"$cargo" test --locked --no-run -q || exit 1
valkey_start || exit 1
"$cargo" test --locked -q "$@"
