#!/usr/bin/env bash
# make test-clients: the Python package (clients/python) against real servers.
#
#  1. a venv (target/clients-venv) with clients/python/requirements-test.txt,
#     rebuilt when that file changes; the package is built into a wheel and
#     an sdist (target/clients-dist) and the wheel is installed;
#  2. ruff and mypy --strict; the wheel alone in a fresh venv, with
#     Flask-Limiter, serving a limited app;
#  3. the package's own tests (every command, sync and asyncio, standalone and
#     cluster; the failure policy);
#  4. Flask-Limiter and slowapi apps over HTTP (clients/python/webapps);
#  5. limits' own test suite: the pinned sdist from PyPI (checked against its
#     sha256), patched by clients/python/limits-suite/limits-5.8.0.patch, its
#     storage, strategy and concurrency tests, sync and asyncio, for the
#     valkey-ratelimit storages.
# Every valkey-server is started by the tests on free loopback ports and
# always stopped. Exit 0 only when every step passed; each step's pytest
# summary is printed, the totals last.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkg="$repo/clients/python"
venv="$repo/target/clients-venv"
dist="$repo/target/clients-dist"
work="$repo/target/clients-limits"
limits_version=5.8.0
limits_sha256=c9e0d74aed837e8f6f50d1fcebcf5fd8130957287206bc3799adaee5092655da
: "${RL_MODULE:=$repo/target/release/libvalkey_ratelimit.so}"
: "${VALKEY_SERVER:=$(command -v valkey-server || true)}"
export RL_MODULE VALKEY_SERVER
[ -x "$VALKEY_SERVER" ] || { echo "test-clients: valkey-server not found (set VALKEY_SERVER)" >&2; exit 1; }
[ -f "$RL_MODULE" ] || { echo "test-clients: module not built: $RL_MODULE" >&2; exit 1; }

want="$(sha256sum "$pkg/requirements-test.txt" | cut -d' ' -f1)"
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv" || { echo "test-clients: cannot create a venv (apt-get install python3-venv)" >&2; exit 1; }
  echo "test-clients: installing clients/python/requirements-test.txt into $venv"
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$pkg/requirements-test.txt" || exit 1
  echo "$want" >"$venv/.requirements.sha256"
fi
py="$venv/bin/python"

echo "== build: wheel and sdist into $dist"
rm -rf "$dist" && mkdir -p "$dist"
(cd "$pkg" && "$py" -m hatchling build -d "$dist" >/dev/null) || { echo "test-clients: build failed" >&2; exit 1; }
"$venv/bin/pip" install --disable-pip-version-check -q --no-deps --force-reinstall "$dist"/valkey_ratelimit-*.whl || exit 1
ls "$dist"

status=0
summaries=()
step() {  # step NAME COMMAND...: run it, keep pytest's closing line
  local name=$1; shift
  echo "== $name"
  local log="$repo/target/clients-$name.log"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  local last; last="$(grep -E '^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$log" | tail -1)"
  summaries+=("$(printf '%-8s %s %s' "$name" "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)" "${last:-(rc $rc)}")")
}

echo "== lint: ruff, mypy --strict"
if (cd "$pkg" && "$venv/bin/ruff" check . && "$venv/bin/ruff" format --check . \
  && "$venv/bin/mypy" --strict src webapps/flask_app.py webapps/fastapi_app.py webapps/wheel_smoke.py bench); then
  summaries+=("lint     PASS ruff, mypy --strict")
else
  status=1; summaries+=("lint     FAIL ruff or mypy (see above)")
fi

echo "== wheel: a fresh venv with only the wheel ([limits]) and Flask-Limiter"
fresh="$repo/target/clients-fresh-venv"
rm -rf "$fresh"
if python3 -m venv "$fresh" && "$fresh/bin/pip" install --disable-pip-version-check -q \
     -c "$pkg/requirements-test.txt" "$(ls "$dist"/valkey_ratelimit-*.whl)[limits]" Flask Flask-Limiter \
   && PYTHONPATH="$pkg/tests" "$fresh/bin/python" "$pkg/webapps/wheel_smoke.py"; then
  summaries+=("wheel    PASS pip install of the wheel into a fresh venv, then a Flask-Limiter app")
else
  status=1; summaries+=("wheel    FAIL see above")
fi

# The tests import the installed wheel, never the source tree.
cd "$pkg"
export PYTHONPATH="$pkg/tests"
step client "$py" -m pytest -p no:cacheprovider -ra --import-mode=importlib -o asyncio_mode=auto tests
step webapps "$py" -m pytest -p no:cacheprovider -ra webapps

echo "== limits $limits_version: sdist from PyPI, patched"
mkdir -p "$work/download"
sdist="$work/download/limits-$limits_version.tar.gz"
if [ ! -f "$sdist" ] || [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$limits_sha256" ]; then
  "$venv/bin/pip" download --disable-pip-version-check -q --no-deps --no-binary :all: \
    "limits==$limits_version" -d "$work/download" || exit 1
fi
[ "$(sha256sum "$sdist" | cut -d' ' -f1)" = "$limits_sha256" ] || { echo "test-clients: $sdist: sha256 mismatch" >&2; exit 1; }
rm -rf "$work/limits-$limits_version"
tar -xzf "$sdist" -C "$work"
(cd "$work/limits-$limits_version" && patch -p1 -s <"$pkg/limits-suite/limits-$limits_version.patch") || exit 1
# Run from the unpacked tree, importing the installed limits (the same
# version): its tests are what we take from the sdist.
cd "$work/limits-$limits_version" && rm -rf limits
step limits "$py" -m pytest -p no:cacheprovider -m valkey_ratelimit \
  tests/test_storage.py tests/test_strategy.py tests/integration/test_concurrency.py \
  tests/aio/test_storage.py tests/aio/test_strategy.py

echo
echo "== test-clients summary"
printf '%s\n' "${summaries[@]}"
if [ "$status" -eq 0 ]; then echo "test-clients: PASS"; else echo "test-clients: FAIL"; fi
exit "$status"
