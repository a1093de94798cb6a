#!/usr/bin/env bash
# The Node recipe's tests: builds the valkey-ratelimit package (clients/node),
# npm ci into node_modules/, then node:test against a
# real valkey-server with the module. Exit 0 passed, 77 skipped, else failed.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib/valkey.sh"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then echo "SKIP: node or npm not found"; exit 77; fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then echo "SKIP: Node 20 or newer needed (found $(node --version))"; exit 77; fi
valkey_require || exit 77

# The valkey-ratelimit package (clients/node), built: a file: dependency.
pkg="$here/../../clients/node"
if ! [ -x "$pkg/node_modules/.bin/tsc" ]; then
  echo "installing clients/node's build tools (npm ci)"
  (cd "$pkg" && npm ci --no-audit --no-fund --loglevel=error) || { echo "SKIP: npm ci failed in clients/node (is the npm registry reachable?)"; exit 77; }
fi
(cd "$pkg" && npm run --silent build) || { echo "clients/node: build failed"; exit 1; }

cd "$here" || exit 1
# Reinstalled only when package-lock.json changes.
stamp="node_modules/.package-lock.sha256"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing node_modules (npm ci)"
  if ! npm ci --no-audit --no-fund --loglevel=error; then
    echo "SKIP: npm ci failed (is the npm registry reachable?)"; exit 77
  fi
  echo "$want" >"$stamp"
fi

valkey_start || exit 1
# The tests of one file run in order, one at a time.
node --test --test-reporter=spec "$@" test/
