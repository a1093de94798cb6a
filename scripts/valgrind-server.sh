#!/usr/bin/env bash
# A valkey-server for VALKEY_SERVER that runs under valgrind memcheck (make
# memcheck sets it up; see scripts/memcheck.sh):
#
#   MEMCHECK_SERVER   valkey-server built with MALLOC=libc (scripts/valkey9.sh --libc)
#   MEMCHECK_LOG_DIR  where valgrind writes valgrind-<pid>.log, one per process
#                     (fork children of the server, for BGSAVE and the like, too)
#   MEMCHECK_VALGRIND_ARGS  more valgrind options (e.g. -s, --gen-suppressions=all)
#
# It execs valgrind, so the test harness's child pid is the server's pid (the
# harness checks INFO's process_id against it). Appended to the arguments:
# --shutdown-on-sigterm now force, so a SIGTERM always ends in a normal exit,
# which is when valgrind writes the leak report. `--version` and `--help` run
# the server without valgrind.
#
# No --error-exitcode: a fork child (BGSAVE, BGREWRITEAOF, replication) inherits
# the server's heap and its leak report, and a non-zero exit of the child makes
# the server count the rewrite or save as failed. scripts/memcheck.sh reads the
# logs instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
server="${MEMCHECK_SERVER:?set MEMCHECK_SERVER to a valkey-server built with MALLOC=libc}"
logs="${MEMCHECK_LOG_DIR:?set MEMCHECK_LOG_DIR to the directory for valgrind logs}"

case "${1:-}" in
  -v | --version | -h | --help) exec "$server" "$@" ;;
esac

mkdir -p "$logs"
# scripts/memcheck.sh preloads its kill shim (MEMCHECK_SHIM) into the test
# binaries only: not into the server (another preload, libfaketime say, stays).
if [ -n "${MEMCHECK_SHIM:-}" ] && [ -n "${LD_PRELOAD:-}" ]; then
  LD_PRELOAD="$(tr ': ' '\n\n' <<<"$LD_PRELOAD" | grep -vxF -e "$MEMCHECK_SHIM" -e '' | paste -sd: -)" || true
  if [ -n "$LD_PRELOAD" ]; then export LD_PRELOAD; else unset LD_PRELOAD; fi
fi

exec valgrind --tool=memcheck \
  --track-origins=yes \
  --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
  --num-callers=40 --keep-debuginfo=yes \
  --suppressions="$here/valgrind.supp" \
  --log-file="$logs/valgrind-%p.log" \
  ${MEMCHECK_VALGRIND_ARGS:-} \
  "$server" "$@" --shutdown-on-sigterm now force
