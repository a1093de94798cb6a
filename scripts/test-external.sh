#!/usr/bin/env bash
# The integration tests against a server that is already running with the
# module loaded (a container, a packaged install), the way valkey-bundle runs
# each module's tests against its image:
#
#   RL_TEST_SERVER=127.0.0.1:6379 bash scripts/test-external.sh
#
# Every test that needs no server of its own runs there, one at a time, each
# after a FLUSHALL and a reset of the module's policies and configs (so do not
# point it at a server whose data you want to keep). Tests that need their own
# server (other arguments, a restart, a replica, a cluster, the log, another
# clock) stop at once and are counted as skipped. The last line is the verdict:
# "test-external: N passed, N skipped (need their own server), N failed".
#
# Without RL_TEST_SERVER it starts Debian's (or $VALKEY_SERVER's) valkey-server
# with target/release/libvalkey_ratelimit.so on a free loopback port, runs the
# tests against it and stops it (make test-external).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'test-external: %s\n' "$*" >&2; }
CARGO="${CARGO:-cargo}"

pid=""
dir=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ -n "$dir" ]; then rm -rf "$dir"; fi
}
trap cleanup EXIT

if [ -z "${RL_TEST_SERVER:-}" ]; then
  server="${VALKEY_SERVER:-$(command -v valkey-server || echo /usr/bin/valkey-server)}"
  module="${RL_MODULE:-$PWD/target/release/libvalkey_ratelimit.so}"
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  dir="$(mktemp -d)"
  # As a user would start it, plus DEBUG from loopback, which some tests use
  # (on a server without it they are skipped).
  "$server" --bind 127.0.0.1 --port "$port" --dir "$dir" --save '' --appendonly no \
    --enable-debug-command local --loadmodule "$module" >"$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null || { cat "$dir/server.log" >&2; say "the server did not start"; exit 1; }
  export RL_TEST_SERVER="127.0.0.1:$port"
  say "started $("$server" --version | cut -d' ' -f1-3) with the module on $RL_TEST_SERVER"
fi
export RL_TEST_SERVER

# Every test binary but those whose every test needs servers of its own
# (cluster*: six nodes each) and the ones that start none (apt_sources).
# fuzz runs too: its short run needs only one server.
# RL_EXTERNAL_TESTS="basic leases" picks binaries.
binaries=()
for file in tests/*.rs; do
  name="$(basename "$file" .rs)"
  case "$name" in cluster*|apt_sources) continue ;; esac
  if [ -n "${RL_EXTERNAL_TESTS:-}" ] && ! [[ " $RL_EXTERNAL_TESTS " == *" $name "* ]]; then continue; fi
  binaries+=("$name")
done

$CARGO build --release --tests >&2
mkdir -p target
log=target/test-external.log
: >"$log"
passed=0 skipped=0 failed=0 failures=""
for name in "${binaries[@]}"; do
  out="$($CARGO test --release --test "$name" -- --test-threads=1 2>&1 || true)"
  printf '%s\n' "$out" >>"$log"
  # Per failed test: skipped when its panic says it needs its own server.
  read -r p f <<<"$(printf '%s\n' "$out" | awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }')"
  own="$(printf '%s\n' "$out" | awk '
    /^---- .* stdout ----$/ { name = $2; next }
    /RL_TEST_SERVER: this test needs a server of its own/ && name != "" { print name; name = "" }' | sort -u)"
  all_failed="$(printf '%s\n' "$out" | sed -n 's/^    \([A-Za-z_0-9:]*\)$/\1/p' | sort -u)"
  real="$(comm -23 <(printf '%s\n' "$all_failed" | sed '/^$/d') <(printf '%s\n' "$own" | sed '/^$/d'))"
  n_own="$(printf '%s\n' "$own" | sed '/^$/d' | wc -l)"
  n_real="$(printf '%s\n' "$real" | sed '/^$/d' | wc -l)"
  if [ "$f" -gt 0 ] && [ "$n_own" -eq 0 ] && [ "$n_real" -eq 0 ]; then
    n_real="$f"; real="(see $log)"   # a binary that failed to run at all
  fi
  passed=$((passed + p)); skipped=$((skipped + n_own)); failed=$((failed + n_real))
  say "$name: $p passed, $n_own skipped, $n_real failed"
  if [ "$n_real" -gt 0 ]; then failures="$failures $(printf '%s\n' "$real" | sed "s/^/$name::/" | tr '\n' ' ')"; fi
done
[ -z "$failures" ] || say "failed:$failures (log: $log)"
echo "test-external: $passed passed, $skipped skipped (need their own server), $failed failed"
[ "$failed" -eq 0 ]
