#!/usr/bin/env bash
# The valkey-ratelimit npm package's tests: npm ci, build (tsc, ESM and
# CommonJS), then node:test against a real valkey-server with the module of
# this tree (RL_MODULE; `make test-clients-node` builds it first).
# Exit 0 passed, 77 skipped (no node, npm, server or module), else failed.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../../examples/lib/valkey.sh"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then echo "SKIP: node or npm not found"; exit 77; fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then echo "SKIP: Node 20 or newer needed (found $(node --version))"; exit 77; fi
valkey_require || exit 77

cd "$here" || exit 1
# Reinstalled only when package-lock.json changes.
stamp="node_modules/.package-lock.sha256"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing node_modules (npm ci)"
  npm ci --no-audit --no-fund --loglevel=error || { echo "npm ci failed"; exit 1; }
  echo "$want" >"$stamp"
fi
npm run --silent build || { echo "build failed"; exit 1; }
npm run --silent typecheck || { echo "typecheck failed"; exit 1; }

valkey_start || exit 1
# One file at a time (several start their own processes and servers).
node --test --test-concurrency=1 --test-reporter=spec "$@" test/*.test.mjs
