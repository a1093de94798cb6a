#!/usr/bin/env bash
# make test-deb: the package of make deb, installed and removed on this
# machine (root or sudo; Debian or Ubuntu with valkey-server 8.0 or newer).
#
#  0. lintian, when it is installed: no errors
#  1. purges any valkey-ratelimit installed before, then `dpkg -i` the .deb;
#     checks the files are where the package says and its dependencies hold
#  2. starts Debian's own valkey-server with Debian's /etc/valkey/valkey.conf
#     plus the one line a user adds (`include /etc/valkey/valkey-ratelimit.conf`),
#     only moved to a free loopback port, a temporary dir and the foreground
#  3. smoke test: MODULE LIST (the version), INFO, a limiter of each
#     algorithm, a lease, COMMAND DOCS, a module config from the conf file;
#     with RL_DEB_SUITE=1 also the integration tests against it
#     (scripts/test-external.sh)
#  4. stops it, `dpkg -r` (the conffile stays, as dpkg keeps conffiles),
#     `dpkg -P`, and checks that no file of the package is left
# The last line is the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'test-deb: %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
server=/usr/bin/valkey-server
[ -x "$server" ] || fail "Debian's valkey-server is not installed (scripts/setup.sh installs it)"
[ -f /etc/valkey/valkey.conf ] || fail "/etc/valkey/valkey.conf is missing"
deb="${1:-$(bash scripts/deb.sh 2>/dev/null)}"
[ -f "$deb" ] || fail "no package: $deb"

pid="" dir=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ -n "$dir" ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

# 0. Debian's package checker, where it is installed (errors fail the test).
if command -v lintian >/dev/null 2>&1; then
  lintian --fail-on error --suppress-tags initial-upload-closes-no-bugs "$deb" >&2 || fail "lintian reports errors"
  say "ok: lintian finds no errors"
fi

# 1. install
if dpkg-query -W -f='${Status}' valkey-ratelimit 2>/dev/null | grep -q installed; then
  say "purging the valkey-ratelimit installed before"
  $SUDO dpkg -P valkey-ratelimit >/dev/null
fi
say "dpkg -i $(basename "$deb")"
$SUDO dpkg -i "$deb" >/dev/null || fail "dpkg -i refused the package (dependencies?)"
files="$(dpkg -L valkey-ratelimit)"
for f in /usr/lib/valkey/modules/libvalkey_ratelimit.so /etc/valkey/valkey-ratelimit.conf \
  /usr/share/doc/valkey-ratelimit/copyright /usr/share/doc/valkey-ratelimit/README.md; do
  [ -f "$f" ] && grep -qx "$f" <<<"$files" || fail "$f is not installed by the package"
done
dpkg-query -W -f='${Conffiles}' valkey-ratelimit | grep -q /etc/valkey/valkey-ratelimit.conf ||
  fail "/etc/valkey/valkey-ratelimit.conf is not a conffile"
grep -q 'BSD 3-Clause\|BSD-3-Clause' /usr/share/doc/valkey-ratelimit/copyright || fail "no licence in copyright"
if $SUDO apt-get check >/dev/null 2>&1; then :; else fail "apt-get check: broken dependencies after install"; fi

# 2. Debian's server, Debian's config, plus the include line a user adds.
dir="$(mktemp -d)"
chmod 0777 "$dir"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$dir/valkey.conf" <<CONF
include /etc/valkey/valkey.conf
include /etc/valkey/valkey-ratelimit.conf
# The test's own place: a free port, a temporary dir, in the foreground.
port $port
bind 127.0.0.1
dir $dir
daemonize no
supervised no
pidfile $dir/valkey.pid
logfile $dir/valkey.log
save ""
appendonly no
CONF
# ratelimit.* lines in the conf file take effect (the sample's are
# commented): one set here proves the module reads them.
echo "ratelimit.max-limiters 20" >>"$dir/valkey.conf"
"$server" "$dir/valkey.conf" >"$dir/stdout.log" 2>&1 &
pid=$!
cli() { valkey-cli -p "$port" "$@"; }
for _ in $(seq 100); do
  if cli PING 2>/dev/null | grep -q PONG; then break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
cli PING 2>/dev/null | grep -q PONG || { tail -20 "$dir/stdout.log" "$dir/valkey.log" >&2; fail "valkey-server did not start with the package's config"; }
say "valkey-server $("$server" --version | sed 's/.* v=\([^ ]*\).*/\1/') runs /etc/valkey/valkey.conf + include /etc/valkey/valkey-ratelimit.conf on port $port"

# 3. smoke test
version="$(awk -F'"' '/^\[/ { p = ($0 == "[package]") } p && /^version *=/ { print $2; exit }' Cargo.toml)"
IFS=. read -r major minor patch <<<"$version"
ver=$((major * 10000 + minor * 100 + patch))
expect() { # expect "what" "wanted" actual...
  local what="$1" wanted="$2"; shift 2
  local got; got="$("$@" 2>&1 | tr '\n' ' ' | sed 's/ *$//')"
  [ "$got" = "$wanted" ] || fail "$what: wanted '$wanted', got '$got'"
  say "ok: $what"
}
expect "MODULE LIST names ratelimit at ver $ver" "name ratelimit ver $ver path /usr/lib/valkey/modules/libvalkey_ratelimit.so args" cli MODULE LIST
expect "INFO ratelimit_version" "$version" sh -c "valkey-cli -p $port INFO ratelimit | tr -d '\r' | sed -n 's/^ratelimit_version://p'"
expect "the conf file's ratelimit.max-limiters" "ratelimit.max-limiters 20" cli CONFIG GET ratelimit.max-limiters
expect "RL.TOKENBUCKET allows" "1 10 9 0 100" cli RL.TOKENBUCKET smoke:tb 10 1 100ms
expect "RL.WINDOW allows" "1 5 4 0" sh -c "valkey-cli -p $port RL.WINDOW smoke:w 5 1h | head -4"
expect "RL.SLIDINGLOG allows" "1 5 4 0" sh -c "valkey-cli -p $port RL.SLIDINGLOG smoke:l 5 1h | head -4"
expect "RL.GCRA allows" "1 10 9 0" sh -c "valkey-cli -p $port RL.GCRA smoke:g 10 1 1s | head -4"
expect "CL.THROTTLE answers as redis-cell" "0 16 15 -1 2" cli CL.THROTTLE smoke:cell 15 30 60 1
expect "RL.LEASE grants" "1 2 1" sh -c "valkey-cli -p $port RL.LEASE smoke:lease 2 30s | head -3"
expect "the type" "ratelimit" cli TYPE smoke:tb
expect "COMMAND DOCS knows RL.ALL" "1" sh -c "valkey-cli -p $port COMMAND DOCS rl.all | grep -c '^Applies one request'"
if [ "${RL_DEB_SUITE:-0}" = 1 ]; then
  say "the integration tests against the packaged install"
  RL_TEST_SERVER="127.0.0.1:$port" bash scripts/test-external.sh || fail "integration tests against the package"
fi

# 4. stop, remove, purge
cli SHUTDOWN NOSAVE >/dev/null 2>&1 || true
wait "$pid" 2>/dev/null || true
pid=""
grep -q "Module 'ratelimit' loaded from /usr/lib/valkey/modules/libvalkey_ratelimit.so" "$dir/valkey.log" ||
  fail "the server log does not say the module loaded from the package's path"
$SUDO dpkg -r valkey-ratelimit >/dev/null || fail "dpkg -r failed"
[ ! -e /usr/lib/valkey/modules/libvalkey_ratelimit.so ] || fail "dpkg -r left the module"
[ -f /etc/valkey/valkey-ratelimit.conf ] || fail "dpkg -r removed the conffile (it keeps conffiles until purge)"
$SUDO dpkg -P valkey-ratelimit >/dev/null || fail "dpkg -P failed"
left=""
while read -r f; do
  if [ -f "$f" ]; then left="$left $f"; fi
done <<<"$files"
[ -z "$left" ] || fail "files left after purge:$left"
! dpkg-query -W -f='${Status}' valkey-ratelimit 2>/dev/null | grep -q 'installed\|config-files' ||
  fail "dpkg still lists the package"
say "PASS: installed, loaded by Debian's valkey-server through its config, smoke-tested, removed and purged"
