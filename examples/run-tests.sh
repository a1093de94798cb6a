#!/usr/bin/env bash
# Run every examples/*/test.sh (or the recipes named as arguments), print a
# table of recipe, result and seconds, and exit non-zero when any failed.
# Skips (exit 77: a toolchain or dependency is unavailable) do not fail,
# unless RL_EXAMPLES_REQUIRE=1 (for CI, where every recipe must run): then a
# skipped recipe counts as failed, with its SKIP reason.
# Each recipe's output goes to target/examples/logs/<recipe>.log; a failed
# recipe's log tail is printed.
#
#   examples/run-tests.sh [recipe ...]
#   RECIPE_TIMEOUT=900 (seconds per recipe, default 900)
#   RL_EXAMPLES_REQUIRE=1 (a skip is a failure)
set -u
examples="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$examples/.." && pwd)"
logs="$repo/target/examples/logs"
mkdir -p "$logs"
timeout_s="${RECIPE_TIMEOUT:-900}"
require="${RL_EXAMPLES_REQUIRE:-0}"
case $require in
  0|1) ;;
  *) echo "RL_EXAMPLES_REQUIRE must be 0 or 1, not '$require'" >&2; exit 2 ;;
esac

if [ $# -gt 0 ]; then
  recipes=("$@")
else
  recipes=()
  for t in "$examples"/*/test.sh; do
    [ -f "$t" ] && recipes+=("$(basename "$(dirname "$t")")")
  done
fi

passed=0 failed=0 skipped=0
rows=()
for r in "${recipes[@]}"; do
  script="$examples/$r/test.sh"
  log="$logs/$r.log"
  if ! [ -f "$script" ]; then
    rows+=("$(printf '%-10s %-8s %8s  %s' "$r" "FAIL" "-" "no $script")"); failed=$((failed + 1)); continue
  fi
  echo "== $r: $script (log $log)"
  start=$(date +%s.%N)
  if command -v timeout >/dev/null; then
    timeout --kill-after=30 "$timeout_s" bash "$script" >"$log" 2>&1 </dev/null
  else
    bash "$script" >"$log" 2>&1 </dev/null
  fi
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  note=""
  case $rc in
    0) result=PASS; passed=$((passed + 1)) ;;
    77) note="$(grep -m1 '^SKIP:' "$log" | sed 's/^SKIP: *//')"
        if [ "$require" = 1 ]; then
          result=FAIL; failed=$((failed + 1))
          note="skipped, and RL_EXAMPLES_REQUIRE=1: ${note:-no SKIP: line in the log}"
        else
          result=SKIP; skipped=$((skipped + 1))
        fi ;;
    124|137) result=FAIL; failed=$((failed + 1)); note="timed out after ${timeout_s}s" ;;
    *) result=FAIL; failed=$((failed + 1)); note="exit $rc" ;;
  esac
  if [ "$result" = FAIL ]; then
    echo "-- last 40 lines of $log:"; tail -n 40 "$log" | sed 's/^/   /'
  fi
  echo "== $r: $result in ${secs}s${note:+ ($note)}"
  rows+=("$(printf '%-10s %-8s %8s  %s' "$r" "$result" "$secs" "$note")")
done

echo
printf '%-10s %-8s %8s  %s\n' recipe result seconds note
printf '%-10s %-8s %8s  %s\n' ------ ------ ------- ----
for row in "${rows[@]}"; do echo "$row"; done
echo
echo "examples: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
