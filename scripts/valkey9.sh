#!/usr/bin/env bash
# Builds the newest Valkey 9 from Debian's source package (unstable/sid) and
# prints the path of the built valkey-server on stdout; everything else goes to
# stderr. The build is cached outside the work tree and done once per machine:
#
#   VALKEY9_CACHE (default /var/cache/valkey-ratelimit/valkey-9 when writable,
#   else ${XDG_CACHE_HOME:-$HOME/.cache}/valkey-ratelimit/valkey-9)
#
# Usage: VALKEY_SERVER=$(bash scripts/valkey9.sh) cargo test --release
#
# Steps on first use (Debian/Ubuntu, root or sudo): a deb-src line for sid in
# its own apt sources file, apt-get update, apt-get source valkey/sid in a temp
# dir under the cache dir, make BUILD_TLS=no, copy valkey-server and valkey-cli
# into the cache dir. About 3-5 minutes on 2 cores.
set -euo pipefail

say() { printf 'valkey9: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

default_cache() {
  local sys=/var/cache/valkey-ratelimit/valkey-9
  if mkdir -p "$sys" 2>/dev/null && [ -w "$sys" ]; then
    echo "$sys"
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/valkey-ratelimit/valkey-9"
  fi
}

CACHE="${VALKEY9_CACHE:-$(default_cache)}"
BIN="$CACHE/valkey-server"
mkdir -p "$CACHE"

# A cached build that runs and is a 9.x: done.
cached_ok() {
  [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q ' v=9\.'
}

if cached_ok; then
  say "cached: $("$BIN" --version)"
  echo "$BIN"
  exit 0
fi

# One build at a time per cache dir (parallel `make test-matrix` runs, ...).
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if cached_ok; then
    say "cached (built meanwhile): $("$BIN" --version)"
    echo "$BIN"
    exit 0
  fi
fi

command -v apt-get >/dev/null 2>&1 ||
  die "no apt-get: build Valkey 9 yourself and set VALKEY_SERVER=/path/to/valkey-server"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

SRC_LIST=/etc/apt/sources.list.d/valkey-ratelimit-sid-src.list
if ! grep -qs '^deb-src .* sid main' "$SRC_LIST"; then
  say "adding $SRC_LIST (deb-src for Debian unstable, source packages only)"
  echo "deb-src http://deb.debian.org/debian sid main" | $SUDO tee "$SRC_LIST" >/dev/null
fi
say "apt-get update"
$SUDO apt-get update -qq >&2

missing=()
command -v dpkg-source >/dev/null 2>&1 || missing+=(dpkg-dev)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

version="$(apt-cache showsrc valkey 2>/dev/null | awk '/^Version: 9\./ {print $2}' | sort -V | tail -1)"
[ -n "$version" ] || die "Debian sid has no valkey 9.x source package (apt-cache showsrc valkey)"
say "building valkey $version from Debian's source package"

WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# apt downloads as root when _apt cannot write here: harmless warning.
apt-get source -qq "valkey=$version" >&2
srcdir="$(find . -mindepth 1 -maxdepth 1 -type d -name 'valkey-*' | head -1)"
[ -n "$srcdir" ] || die "apt-get source left no valkey-* directory in $WORK"
cd "$srcdir"

jobs="$(nproc 2>/dev/null || echo 2)"
say "make -j$jobs BUILD_TLS=no (log: $CACHE/build.log)"
if ! make -j"$jobs" BUILD_TLS=no >"$CACHE/build.log" 2>&1; then
  say "build failed; installing pkg-config and libsystemd-dev and retrying"
  $SUDO apt-get install -y -qq pkg-config libsystemd-dev >&2
  make distclean >/dev/null 2>&1 || true
  make -j"$jobs" BUILD_TLS=no >"$CACHE/build.log" 2>&1 ||
    die "build failed again; see $CACHE/build.log:
$(tail -30 "$CACHE/build.log")"
fi

install -m 0755 src/valkey-server "$CACHE/valkey-server.new"
install -m 0755 src/valkey-cli "$CACHE/valkey-cli"
mv -f "$CACHE/valkey-server.new" "$BIN"
echo "$version" >"$CACHE/DEBIAN_VERSION"
cached_ok || die "built $BIN but it does not run as a 9.x: $("$BIN" --version 2>&1 || true)"
say "built: $("$BIN" --version)"
echo "$BIN"
