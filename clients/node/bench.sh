#!/usr/bin/env bash
# The Node benchmark (bench/bench.mjs) on a fresh valkey-server with this
# tree's module, started and stopped here. Arguments go to bench.mjs.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../../examples/lib/valkey.sh"
valkey_require || exit 1
cd "$here" || exit 1
[ -x node_modules/.bin/tsc ] || npm ci --no-audit --no-fund --loglevel=error || exit 1
npm run --silent build || exit 1
valkey_start || exit 1
node bench/bench.mjs "$@"
