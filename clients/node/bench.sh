#!/usr/bin/env bash
# The Node benchmarks on a fresh valkey-server with this tree's module,
# started and stopped here: bench/bench.mjs (throughput), or with `scale` as
# the first argument bench/scale.mjs (server calls per admitted request with
# the deny cache, batching and split budgets). Other arguments go to the script.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../../examples/lib/valkey.sh"
valkey_require || exit 1
cd "$here" || exit 1
[ -x node_modules/.bin/tsc ] || npm ci --no-audit --no-fund --loglevel=error || exit 1
npm run --silent build || exit 1
valkey_start || exit 1
if [ "${1:-}" = scale ]; then shift; node bench/scale.mjs "$@"; else node bench/bench.mjs "$@"; fi
