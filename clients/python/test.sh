#!/usr/bin/env bash
# The Python package's tests, as `make test-clients` runs every
# clients/*/test.sh: see scripts/test-clients.sh (from the repository root).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec bash scripts/test-clients.sh
