#!/usr/bin/env bash
# make docker-check: what can be proven about the Dockerfile on a machine
# with no image registry and no container runtime (root needed: debootstrap
# and chroot). Takes minutes the first time (the chroot is cached in
# DOCKER_CHECK_ROOT, default /var/cache/valkey-ratelimit/<release>-root).
#
#  1. the Dockerfile's shape: two stages, both on the same Debian release
#     (the ARG), the final one the official valkey/valkey image; the .so
#     copied to /usr/lib/valkey/, the entrypoint that loads it
#  2. the build stage's commands, run as written in a debootstrap chroot of
#     that Debian release standing in for rust:1-<release>: its apt-get line,
#     then COPY (the files git tracks, less .dockerignore's) and
#     `cargo build --release --locked`, with this machine's Rust toolchain
#     and crate cache bind-mounted (CARGO_NET_OFFLINE: no download)
#  3. the final stage's layout in the same chroot, standing in for
#     valkey/valkey:<version>-<release>: Debian's valkey-server 8.0 (from
#     <release>-backports), the .so at the COPY's destination, the entrypoint
#     run as ENTRYPOINT + CMD would run it (a stub docker-entrypoint.sh that
#     only execs, for the official one), then MODULE LIST and a command, also
#     with arguments and a config file given as `docker run` would pass them
# What it cannot prove is said at the end: pulling the images, the official
# image's own valkey-server build and entrypoint, a container starting.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

say() { printf 'docker-check: %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot, mount)"

# --- 1. the Dockerfile ------------------------------------------------------
arg() { sed -n "s/^ARG $1=\(.*\)/\1/p" Dockerfile | sed -n 1p; }
release="$(arg DEBIAN_RELEASE)"
valkey="$(arg VALKEY_VERSION)"
[ -n "$release" ] && [ -n "$valkey" ] || fail "Dockerfile: no ARG DEBIAN_RELEASE / VALKEY_VERSION"
froms="$(grep '^FROM ' Dockerfile)"
[ "$(grep -c . <<<"$froms")" = 2 ] || fail "Dockerfile: expected two stages, found: $froms"
grep -qx 'FROM rust:1-${DEBIAN_RELEASE} AS build' <<<"$froms" || fail "build stage is not rust:1-\${DEBIAN_RELEASE}"
grep -qx 'FROM valkey/valkey:${VALKEY_VERSION}-${DEBIAN_RELEASE}' <<<"$froms" || fail "final stage is not valkey/valkey:\${VALKEY_VERSION}-\${DEBIAN_RELEASE}"
so_dest="$(sed -n 's|^COPY --from=build /src/target/release/libvalkey_ratelimit.so \(.*\)|\1|p' Dockerfile)"
[ "$so_dest" = /usr/lib/valkey/libvalkey_ratelimit.so ] || fail "the .so is not copied to /usr/lib/valkey/ ($so_dest)"
grep -q "^MODULE=$so_dest\$" packaging/docker-entrypoint.sh || fail "the entrypoint does not load $so_dest"
grep -qx 'ENTRYPOINT \["ratelimit-entrypoint.sh"\]' Dockerfile || fail "ENTRYPOINT"
grep -qx 'CMD \["valkey-server"\]' Dockerfile || fail "CMD"
[ -x packaging/docker-entrypoint.sh ] || fail "packaging/docker-entrypoint.sh is not executable (COPY keeps the mode)"
say "ok: two stages on Debian $release; valkey/valkey:$valkey-$release; .so at $so_dest; entrypoint loads it"

# --- 2. the build stage in a chroot -------------------------------------------
root="${DOCKER_CHECK_ROOT:-/var/cache/valkey-ratelimit/$release-root}"
if [ ! -f "$root/.complete" ]; then
  command -v debootstrap >/dev/null 2>&1 || apt-get install -y -qq debootstrap >/dev/null
  say "debootstrap $release into $root (once; minutes)"
  rm -rf "$root"
  mkdir -p "$root"
  debootstrap --variant=minbase "$release" "$root" http://deb.debian.org/debian >"$root.log" 2>&1 ||
    fail "debootstrap failed: $(tail -5 "$root.log")"
  # rust:1-<release> is buildpack-deps:<release> plus rustup: what linking needs.
  echo "deb http://deb.debian.org/debian $release-backports main" >"$root/etc/apt/sources.list.d/backports.list"
  # No service starts in the chroot: it shares this machine's network.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  touch "$root/.complete"
fi
grep -q "^VERSION_CODENAME=$release\$" "$root/etc/os-release" || fail "$root is not Debian $release"

mounts=()
mnt() { mkdir -p "$root$2"; mount --bind "$1" "$root$2"; mounts+=("$root$2"); }
srv_pid=""
cleanup() {
  if [ -n "$srv_pid" ]; then kill "$srv_pid" 2>/dev/null || true; fi
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mnt /proc /proc
mnt /dev /dev
cp /etc/resolv.conf "$root/etc/resolv.conf"
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
mnt "$rustup_home" /usr/local/rustup
mnt "$cargo_home" /usr/local/cargo
in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo CARGO_NET_OFFLINE=true \
    DEBIAN_FRONTEND=noninteractive "$@"
}
in_root apt-get update -qq >/dev/null
in_root apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates >/dev/null
say "ok: chroot of Debian $(cat "$root/etc/debian_version") with gcc, $(in_root rustc --version)"

# The build stage's RUN lines, as written (continuations joined).
build_runs="$(awk '/^FROM / { stage++ } stage == 1' Dockerfile | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | sed -n 's/^RUN //p')"
first_run="$(sed -n 1p <<<"$build_runs")"
second_run="$(sed -n 2p <<<"$build_runs")"
[ "$second_run" = "cargo build --release --locked" ] || fail "unexpected build command: $second_run"
say "RUN $first_run"
in_root sh -c "$first_run" >/dev/null || fail "the build stage's apt-get line"
# COPY . . with .dockerignore: git's files, less what it ignores.
# (target/ is kept between runs: an incremental build, as a cached layer.)
mkdir -p "$root/src"
find "$root/src" -mindepth 1 -maxdepth 1 ! -name target -exec rm -rf {} +
git ls-files -z | grep -zv -E '^(examples|docs|bench)/|(^|/)node_modules/' | tar --null -T - -cf - | tar -C "$root/src" -xf -
say "RUN $second_run (WORKDIR /src; crates from this machine's cache)"
in_root sh -c "cd /src && $second_run" >"$root/build.log" 2>&1 || fail "cargo build in the chroot: $(tail -15 "$root/build.log")"
so="$root/src/target/release/libvalkey_ratelimit.so"
[ -f "$so" ] || fail "no $so"
glibc_needed="$(objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
glibc_has="$(in_root ldd --version | sed -n 1p | awk '{ print $NF }')"
[ "$(printf '%s\n%s\n' "$glibc_needed" "$glibc_has" | sort -V | tail -1)" = "$glibc_has" ] ||
  fail "the .so needs glibc $glibc_needed, Debian $release has $glibc_has"
say "ok: built $(du -k "$so" | cut -f1) KB .so in the chroot; needs glibc $glibc_needed, $release has $glibc_has"

# --- 3. the final stage's layout and load line ----------------------------
# The build stage's RUN emptied the apt lists.
in_root apt-get update -qq >/dev/null
in_root apt-get install -y -qq --no-install-recommends -t "$release-backports" valkey-server valkey-tools >/dev/null ||
  fail "valkey-server from $release-backports"
server_version="$(in_root valkey-server --version | sed 's/.* v=\([^ ]*\).*/\1/')"
case "$server_version" in "$valkey"*) ;; *) say "note: the chroot's valkey-server is $server_version, the image's $valkey" ;; esac
install -D -m 0755 "$so" "$root$so_dest"
install -m 0755 packaging/docker-entrypoint.sh "$root/usr/local/bin/ratelimit-entrypoint.sh"
# Stand-in for the official docker-entrypoint.sh (it drops to the valkey user).
printf '#!/bin/sh\nexec "$@"\n' >"$root/usr/local/bin/docker-entrypoint.sh"
chmod 0755 "$root/usr/local/bin/docker-entrypoint.sh"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cli() { in_root valkey-cli -p "$port" "$@"; }
run_image() { # what `docker run IMAGE args...` runs: ENTRYPOINT + (args or CMD)
  in_root ratelimit-entrypoint.sh "$@" >"$root/server.log" 2>&1 &
  srv_pid=$!
  for _ in $(seq 100); do
    if cli PING 2>/dev/null | grep -q PONG; then return 0; fi
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
  done
  fail "the image's command did not start: $(tail -5 "$root/server.log")"
}
stop_image() { cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true; wait "$srv_pid" 2>/dev/null || true; srv_pid=""; }
check_loaded() {
  local modules; modules="$(cli MODULE LIST | tr '\n' ' ')"
  grep -q "name ratelimit ver [0-9]* path $so_dest" <<<"$modules" || fail "$1: MODULE LIST: $modules"
  [ "$(cli RL.TOKENBUCKET demo 10 5 1s | sed -n 1p)" = 1 ] || fail "$1: RL.TOKENBUCKET"
  say "ok: $1"
}
run_image --port "$port" --save ''
check_loaded "docker run IMAGE --port N: the entrypoint adds --loadmodule $so_dest"
stop_image
in_root sh -c "printf 'port $port\nsave \"\"\nloadmodule $so_dest cl-throttle no\n' >/tmp/valkey.conf"
run_image /tmp/valkey.conf
check_loaded "docker run IMAGE /path/valkey.conf with its own loadmodule line: loaded once"
[ "$(cli COMMAND INFO cl.throttle | sed -n 1p)" = "" ] || fail "cl-throttle no from the config file was not used"
stop_image
say "PASS (built and loaded in a Debian $release chroot)"
say "NOT PROVEN here: pulling rust:1-$release and valkey/valkey:$valkey-$release (no registry); the"
say "  official image's own valkey-server build (Debian's $server_version stood in) and its docker-entrypoint.sh"
say "  (a stub that only execs stood in: the move to the valkey user is untested); a container starting"
say "  (no runtime); the build with crates downloaded from crates.io (this machine's cache was used)"
