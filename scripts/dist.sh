#!/usr/bin/env bash
# make dist: a binary release archive of the module.
#
#   target/dist/valkey-ratelimit-<version>-<os>-<arch>.tar.gz
#   target/dist/valkey-ratelimit-<version>-<os>-<arch>.tar.gz.sha256
#
# The archive holds one directory of the same name: libvalkey_ratelimit.so
# (the release build, which `make dist` makes first), valkey-ratelimit.conf
# (packaging/: the loadmodule line, its cl-throttle argument and the module
# configs with their defaults), README.md, docs/ (the pages it links to),
# CHANGELOG.md, LICENSE when there is one, and SHA256SUMS of those files. The version is Cargo.toml's.
#
# Reproducible from the same .so: files sorted by name, owner and group 0,
# fixed modes, every mtime set to SOURCE_DATE_EPOCH (default: the last
# commit's time), gzip without a name or timestamp.
#
# Then the check: the archive is unpacked in a temporary directory, its
# SHA256SUMS verified, and valkey-server ($VALKEY_SERVER, else the one on
# PATH) started twice on a free loopback port with the unpacked conf snippet
# as its config file (pointed at the unpacked .so): as shipped, then with the
# configs uncommented and the `cl-throttle no` line. Skipped, with a line that
# says so, when there is no valkey-server or valkey-cli. A failed check
# removes the archive and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

so="${RL_MODULE:-$root/target/release/libvalkey_ratelimit.so}"
[ -f "$so" ] || { echo "dist: $so is missing: run make build (cargo build --release)" >&2; exit 1; }
newer="$(find src Cargo.toml Cargo.lock -type f -newer "$so" 2>/dev/null | head -1 || true)"
[ -z "$newer" ] || echo "dist: warning: $newer is newer than $so (make dist rebuilds it first)" >&2

version="$(awk -F'"' '/^\[/ { p = ($0 == "[package]") } p && /^version *=/ { print $2; exit }' Cargo.toml)"
[ -n "$version" ] || { echo "dist: no version in Cargo.toml's [package]" >&2; exit 1; }
os="$(uname -s | tr '[:upper:]' '[:lower:]')"
arch="$(uname -m)"
name="valkey-ratelimit-$version-$os-$arch"
out="$root/target/dist"
tarball="$out/$name.tar.gz"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || stat -c %Y Cargo.toml)}"

work="$(mktemp -d "${TMPDIR:-/tmp}/rl-dist.XXXXXX")"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# --- the archive ------------------------------------------------------------
stage="$work/stage/$name"
mkdir -p "$stage"
chmod 0755 "$stage"
install -m 0755 "$so" "$stage/libvalkey_ratelimit.so"
install -m 0644 packaging/valkey-ratelimit.conf README.md CHANGELOG.md "$stage/"
# The pages the README links to.
mkdir -p "$stage/docs"
chmod 0755 "$stage/docs"
install -m 0644 docs/*.md docs/*.png "$stage/docs/"
for f in LICENSE LICENSE.md LICENSE.txt LICENSE-* COPYING; do
  if [ -f "$f" ]; then install -m 0644 "$f" "$stage/"; fi
done
(cd "$stage" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
chmod 0644 "$stage/SHA256SUMS"

mkdir -p "$out"
rm -f "$tarball" "$tarball.sha256"
tar --sort=name --format=gnu --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
  -C "$work/stage" -cf - "$name" | gzip -9 -n >"$tarball"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")

glibc="$(objdump -T "$so" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 || true)"
echo "dist: $tarball ($(du -k "$tarball" | cut -f1) KB${glibc:+, needs $glibc or newer})"
TZ=UTC tar -tvzf "$tarball" | sed 's/^/  /'
echo "  $(cat "$tarball.sha256")"

# --- the check --------------------------------------------------------------
fail() {
  echo "dist: FAIL: $*" >&2
  [ -z "${log:-}" ] || [ ! -f "$log" ] || tail -20 "$log" >&2
  rm -f "$tarball" "$tarball.sha256"
  exit 1
}

server="${VALKEY_SERVER:-$(command -v valkey-server || true)}"
cli="$(command -v valkey-cli || true)"
if [ -n "$server" ] && [ -x "$(dirname "$server")/valkey-cli" ]; then cli="$(dirname "$server")/valkey-cli"; fi
if [ -z "$server" ] || [ -z "$cli" ]; then
  echo "dist: no valkey-server or valkey-cli (set VALKEY_SERVER): the load check is skipped"
  exit 0
fi
[ -x "$server" ] || fail "VALKEY_SERVER=$server is not an executable"

check="$work/check"
mkdir -p "$check"
tar -xzf "$tarball" -C "$check"
unpacked="$check/$name"
(cd "$unpacked" && sha256sum --check --quiet SHA256SUMS) || fail "SHA256SUMS does not match the unpacked files"
if TZ=UTC tar -tvzf "$tarball" | awk -v want="$(date -u -d "@$epoch" '+%Y-%m-%d %H:%M')" \
     '$2 != "0/0" || ($4 " " $5) != want { bad = 1 } END { exit !bad }'; then
  fail "an archive entry has another owner than 0/0 or another mtime than @$epoch"
fi

snippet="$unpacked/valkey-ratelimit.conf"
installed="/usr/lib/valkey/modules/libvalkey_ratelimit.so"
grep -q "^loadmodule $installed\$" "$snippet" || fail "the snippet has no active 'loadmodule $installed' line"
# The defaults the snippet documents: "# ratelimit.<name> <value>" lines.
defaults="$(sed -n 's/^# \(ratelimit\.[a-z-]*\) \([^ ]*\)$/\1 \2/p' "$snippet" | LC_ALL=C sort)"
# (Every config the server has must be there: compared with CONFIG GET below.)
[ -n "$defaults" ] || fail "no commented module configs in the snippet"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + RANDOM % 40000))
}

# start <conf>: runs the server on <conf> in the background, waits for PING.
start() {
  port="$(free_port)"
  log="$check/server-$port.log"
  "$server" "$1" --port "$port" --bind 127.0.0.1 --dir "$check" --save '' --appendonly no \
    --daemonize no --logfile "$log" &
  server_pid=$!
  for _ in $(seq 100); do
    if [ "$("$cli" -p "$port" PING 2>/dev/null)" = PONG ]; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  fail "$server did not start with $1"
}

stop() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

# cmd <args>: one command; its reply, one line per element (valkey-cli's raw output).
cmd() { "$cli" -p "$port" "$@" 2>&1; }
first() { local reply; reply="$(cmd "$@")"; echo "${reply%%$'\n'*}"; }
has_module() { local reply; reply="$(cmd MODULE LIST)"; grep -qx ratelimit <<<"$reply"; }
configs() { local reply; reply="$(cmd CONFIG GET 'ratelimit.*')"; paste -d' ' - - <<<"$reply" | LC_ALL=C sort; }

# 1. The snippet as shipped, the module path pointed at the unpacked .so.
sed "s#$installed#$unpacked/libvalkey_ratelimit.so#" "$snippet" >"$check/shipped.conf"
start "$check/shipped.conf"
has_module || fail "MODULE LIST has no ratelimit module"
[ "$(configs)" = "$defaults" ] || fail "CONFIG GET ratelimit.* is '$(configs)', the snippet says '$defaults'"
[ "$(first RL.TOKENBUCKET dist:check 10 10 1s)" = 1 ] || fail "RL.TOKENBUCKET did not allow a first request"
[ "$(first CL.THROTTLE dist:cell 15 30 60 1)" = 0 ] || fail "CL.THROTTLE did not allow a first request"
stop

# 2. Every commented line of the snippet made active: the configs at their
#    documented defaults and the second loadmodule line, `cl-throttle no`.
sed -e "s#$installed#$unpacked/libvalkey_ratelimit.so#" \
    -e '/^loadmodule \//d' -e 's/^# \(loadmodule \/.*\)$/\1/' -e 's/^# \(ratelimit\.[a-z-]* [^ ]*\)$/\1/' \
    "$snippet" >"$check/uncommented.conf"
start "$check/uncommented.conf"
has_module || fail "MODULE LIST has no ratelimit module (cl-throttle no)"
[ "$(configs)" = "$defaults" ] || fail "with the configs set, CONFIG GET ratelimit.* is '$(configs)'"
[[ "$(first CL.THROTTLE dist:cell 15 30 60 1)" == *"unknown command"* ]] ||
  fail "with cl-throttle no, CL.THROTTLE is still registered"
[ "$(first RL.GCRA dist:check 10 10 1s)" = 1 ] || fail "RL.GCRA did not allow a first request"
stop

echo "dist: PASS: unpacked, SHA256SUMS verified, loaded by $("$server" --version | cut -d' ' -f1-3) with valkey-ratelimit.conf (as shipped, and uncommented with cl-throttle no)"
