#!/usr/bin/env bash
# Installs what building and testing the module needs, on Debian/Ubuntu; elsewhere
# names what is missing and stops. Idempotent: does nothing when all is present.
# --valgrind: also valgrind and a C compiler (make memcheck).
set -euo pipefail

want_valgrind=no
case "${1:-}" in
  "") ;;
  --valgrind) want_valgrind=yes ;;
  *) printf 'setup: unknown option %s (usage: setup.sh [--valgrind])\n' "$1" >&2; exit 2 ;;
esac

say() { printf 'setup: %s\n' "$*" >&2; }

need_libclang() {
  # bindgen (run by the valkey-module crate) needs libclang and its headers.
  ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 ||
    ! ls /usr/lib/llvm-*/lib/clang/*/include/stddef.h >/dev/null 2>&1
}

server_bin() {
  if [ -n "${VALKEY_SERVER:-}" ]; then echo "$VALKEY_SERVER"; else command -v valkey-server || true; fi
}

need_valkey() { [ -z "$(server_bin)" ]; }

# Redis 7 stands in for a server older than Valkey 8.0 in tests/release.rs
# (the module must refuse it with a reason, not crash it).
# Installed only where apt-get is; elsewhere the test skips that check.
need_redis() { command -v apt-get >/dev/null 2>&1 && ! command -v redis-server >/dev/null 2>&1; }

# libfaketime: the clock tests run servers on a shifted clock.
LIBFAKETIME=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
need_faketime() { [ ! -e "$LIBFAKETIME" ] && [ "$(uname -m)" = x86_64 ]; }

# The packages make memcheck needs that are missing (none unless --valgrind).
valgrind_packages() {
  [ "$want_valgrind" = yes ] || return 0
  command -v valgrind >/dev/null 2>&1 || echo valgrind
  command -v cc >/dev/null 2>&1 || echo gcc
}
need_valgrind() { [ -n "$(valgrind_packages)" ]; }

if ! need_libclang && ! need_valkey && ! need_valgrind && ! need_faketime && ! need_redis; then
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  need_libclang && say "missing libclang (the development package of clang, e.g. clang-devel / llvm); install it and retry"
  need_valkey && say "missing valkey-server 8.0 or newer; install it or set VALKEY_SERVER=/path/to/valkey-server"
  need_valgrind && say "missing for make memcheck: $(valgrind_packages | tr '\n' ' ')"
  need_faketime && say "missing libfaketime (package faketime): the clock tests need it"
  exit 1
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

. /etc/os-release
if need_valkey && [ "${VERSION_CODENAME:-}" = bookworm ]; then
  # valkey-server lives in bookworm-backports on Debian 12; an entry in either
  # format (one-line or deb822) is used as it is (scripts/apt-sources.sh).
  # shellcheck source=scripts/apt-sources.sh
  . "$(dirname "$0")/apt-sources.sh"
  if ! apt_has_source deb http://deb.debian.org/debian bookworm-backports main; then
    apt_ensure_source deb http://deb.debian.org/debian bookworm-backports main bookworm-backports
  fi
fi

say "running apt-get update"
$SUDO apt-get update -qq
if need_libclang; then
  say "installing libclang-dev (needed by bindgen)"
  $SUDO apt-get install -y -qq libclang-dev >/dev/null
fi
if need_valkey; then
  if [ "${VERSION_CODENAME:-}" = bookworm ]; then
    say "installing valkey-server from bookworm-backports"
    $SUDO apt-get install -y -qq -t bookworm-backports valkey-server valkey-tools >/dev/null
  else
    say "installing valkey-server"
    $SUDO apt-get install -y -qq valkey-server valkey-tools >/dev/null
  fi
  # The package starts a system service on 6379; our tests and `make run` start their own.
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now valkey-server >/dev/null 2>&1 || true; fi
fi
if need_redis; then
  say "installing redis-server (tests/release.rs: a server the module must refuse)"
  $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
fi
if need_faketime; then
  say "installing faketime (libfaketime, for the clock tests)"
  $SUDO apt-get install -y -qq faketime >/dev/null
fi
if need_valgrind; then
  packages="$(valgrind_packages | tr '\n' ' ')"
  say "installing $packages(make memcheck)"
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq $packages >/dev/null
fi
say "installed: $(valkey-server --version 2>/dev/null | head -1)"
