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
# Steps on first use (Debian/Ubuntu, root or sudo): a deb-src entry for sid in
# its own apt sources file unless one is configured (scripts/apt-sources.sh), apt-get update, apt-get source valkey/sid in a temp
# dir under the cache dir, make $VALKEY9_MAKE_FLAGS (default BUILD_TLS=no), copy
# valkey-server and valkey-cli into the cache dir. About 3-5 minutes on 2 cores.
#
# --libc: the build for valgrind (make memcheck), as Valkey's own `make
# valgrind` does it: MALLOC=libc OPTIMIZATION=-O0 (and BUILD_TLS=no), cached in
# valkey-9-libc next to the default build. The flags a cache was built with are
# kept in its MAKE_FLAGS file; other flags rebuild it.
set -euo pipefail

say() { printf 'valkey9: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

NAME=valkey-9
FLAGS_DEFAULT="BUILD_TLS=no"
case "${1:-}" in
  "") ;;
  --libc) NAME=valkey-9-libc; FLAGS_DEFAULT="BUILD_TLS=no MALLOC=libc OPTIMIZATION=-O0" ;;
  *) die "unknown option $1 (usage: valkey9.sh [--libc])" ;;
esac
MAKE_FLAGS="${VALKEY9_MAKE_FLAGS:-$FLAGS_DEFAULT}"

default_cache() {
  local sys=/var/cache/valkey-ratelimit/$NAME
  if mkdir -p "$sys" 2>/dev/null && [ -w "$sys" ]; then
    echo "$sys"
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/valkey-ratelimit/$NAME"
  fi
}

CACHE="${VALKEY9_CACHE:-$(default_cache)}"
BIN="$CACHE/valkey-server"
mkdir -p "$CACHE"

# A cached build that runs, is a 9.x and was made with these flags: done.
# (Caches from before MAKE_FLAGS was recorded were made with BUILD_TLS=no.)
cached_ok() {
  [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q ' v=9\.' &&
    [ "$(cat "$CACHE/MAKE_FLAGS" 2>/dev/null || echo BUILD_TLS=no)" = "$MAKE_FLAGS" ]
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

# deb-src for Debian unstable (source packages only), unless an entry in
# either format provides it already (scripts/apt-sources.sh).
# shellcheck source=scripts/apt-sources.sh
. "$(dirname "$0")/apt-sources.sh"
apt_ensure_source deb-src http://deb.debian.org/debian sid main valkey-ratelimit-sid-src ||
  die "cannot add deb-src for sid (see above)"
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
read -r -a flags <<<"$MAKE_FLAGS"
say "make -j$jobs $MAKE_FLAGS (log: $CACHE/build.log)"
if ! make -j"$jobs" "${flags[@]}" >"$CACHE/build.log" 2>&1; then
  say "build failed; installing pkg-config and libsystemd-dev and retrying"
  $SUDO apt-get install -y -qq pkg-config libsystemd-dev >&2
  make distclean >/dev/null 2>&1 || true
  make -j"$jobs" "${flags[@]}" >"$CACHE/build.log" 2>&1 ||
    die "build failed again; see $CACHE/build.log:
$(tail -30 "$CACHE/build.log")"
fi

install -m 0755 src/valkey-server "$CACHE/valkey-server.new"
install -m 0755 src/valkey-cli "$CACHE/valkey-cli"
mv -f "$CACHE/valkey-server.new" "$BIN"
echo "$version" >"$CACHE/DEBIAN_VERSION"
echo "$MAKE_FLAGS" >"$CACHE/MAKE_FLAGS"
# Valkey's own valgrind suppressions, for reference (make memcheck uses the repo's
# scripts/valgrind.supp).
[ ! -f src/valgrind.sup ] || install -m 0644 src/valgrind.sup "$CACHE/valgrind.sup"
cached_ok || die "built $BIN but it does not run as a 9.x: $("$BIN" --version 2>&1 || true)"
say "built: $("$BIN" --version)"
echo "$BIN"
