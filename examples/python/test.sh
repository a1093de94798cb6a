#!/usr/bin/env bash
# The Python recipe's tests: a venv under target/examples/, then pytest against
# a real valkey-server with the module. Exit 0 passed, 77 skipped, else failed.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib/valkey.sh"

python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null; then echo "SKIP: $python not found"; exit 77; fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "SKIP: Python 3.11 or newer needed (found $("$python" --version 2>&1))"; exit 77
fi
valkey_require || exit 77

# The venv is rebuilt only when requirements.txt changes.
venv="$RL_REPO_ROOT/target/examples/python-venv"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  if ! "$python" -m venv "$venv" >/dev/null 2>&1; then
    echo "SKIP: cannot create a venv with $python (on Debian: apt-get install python3-venv)"; exit 77
  fi
  echo "installing requirements.txt into $venv"
  if ! "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements.txt"; then
    rm -rf "$venv"
    echo "SKIP: pip install -r requirements.txt failed (is PyPI reachable?)"; exit 77
  fi
  echo "$want" >"$stamp"
fi

# The valkey-ratelimit package from this repository (clients/python), installed
# afresh on every run: the recipe is built on it.
if ! "$venv/bin/pip" install --disable-pip-version-check -q --no-deps --force-reinstall "$RL_REPO_ROOT/clients/python"; then
  echo "SKIP: pip install clients/python failed (hatchling from PyPI?)"; exit 77
fi

valkey_start || exit 1
cd "$here" && "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
