# shellcheck shell=bash
# Shared test helper for the recipes: source it from examples/<lang>/test.sh.
#
#   . "$here/../lib/valkey.sh"
#   valkey_require || exit 77   # "SKIP: ..." when valkey-server or the module is missing
#   valkey_start   || exit 1    # exports RL_TEST_VALKEY_ADDR=127.0.0.1:<port>; stopped on exit
#
# The server binds 127.0.0.1 only, keeps nothing on disk, and is always
# stopped: by an EXIT/INT/TERM trap, and by a watchdog if the test script
# itself is killed with SIGKILL (a trap cannot run then). That watchdog is a
# background child of the test script: wait for your own jobs by pid, never
# with a bare `wait`, which would wait for the watchdog too.

RL_EXAMPLES_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RL_REPO_ROOT="$(cd "$RL_EXAMPLES_ROOT/.." && pwd)"
: "${RL_MODULE:=$RL_REPO_ROOT/target/release/libvalkey_ratelimit.so}"
: "${VALKEY_SERVER:=$(command -v valkey-server || true)}"
export RL_MODULE VALKEY_SERVER RL_REPO_ROOT

# valkey_require: say why the tests cannot run, or return 0.
valkey_require() {
  if [ -z "$VALKEY_SERVER" ] || ! [ -x "$VALKEY_SERVER" ]; then
    echo "SKIP: valkey-server not found (install it, or set VALKEY_SERVER=/path/to/valkey-server)"
    return 1
  fi
  if ! [ -f "$RL_MODULE" ]; then
    echo "SKIP: module not built: $RL_MODULE (run cargo build --release, or set RL_MODULE)"
    return 1
  fi
}

# _valkey_listening PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
_valkey_listening() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# valkey_free_port: print a loopback port nobody listens on (a random one in
# 20000-59999, so concurrent runs rarely pick the same; valkey_start retries
# when it loses a race anyway).
valkey_free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    if ! _valkey_listening "$port"; then echo "$port"; return 0; fi
  done
  echo "valkey_free_port: no free port found" >&2
  return 1
}

# _valkey_ping PORT: true when the server there answers PING with PONG.
_valkey_ping() {
  ( exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'PING\r\n' >&3
    IFS= read -r -t 2 reply <&3 || exit 1
    [ "${reply%$'\r'}" = "+PONG" ] ) 2>/dev/null
}

# valkey_start: start a fresh server with the module on a free port, wait
# until it answers, export RL_TEST_VALKEY_ADDR and VALKEY_TEST_PORT.
valkey_start() {
  local port
  VALKEY_TEST_DIR="$(mktemp -d "${TMPDIR:-/tmp}/rl-example-valkey.XXXXXX")"
  trap valkey_stop EXIT
  trap 'valkey_stop; exit 130' INT
  trap 'valkey_stop; exit 143' TERM
  for _ in 1 2 3 4 5; do
    port="$(valkey_free_port)" || return 1
    "$VALKEY_SERVER" --bind 127.0.0.1 --port "$port" --protected-mode yes \
      --save '' --appendonly no --dir "$VALKEY_TEST_DIR" \
      --logfile "$VALKEY_TEST_DIR/valkey.log" --daemonize no \
      --loadmodule "$RL_MODULE" >/dev/null 2>&1 &
    VALKEY_TEST_PID=$!
    for _ in $(seq 1 100); do          # up to 10 s on a loaded machine
      if ! kill -0 "$VALKEY_TEST_PID" 2>/dev/null; then break; fi
      if _valkey_ping "$port"; then
        # Stop the server even if this shell is killed with SIGKILL.
        ( parent=$$; while kill -0 "$parent" 2>/dev/null && kill -0 "$VALKEY_TEST_PID" 2>/dev/null; do sleep 1; done
          kill "$VALKEY_TEST_PID" 2>/dev/null; sleep 1; rm -rf "$VALKEY_TEST_DIR" ) >/dev/null 2>&1 &
        VALKEY_TEST_WATCHDOG=$!
        VALKEY_TEST_PORT="$port"
        RL_TEST_VALKEY_ADDR="127.0.0.1:$port"
        export VALKEY_TEST_PORT RL_TEST_VALKEY_ADDR
        echo "valkey: $("$VALKEY_SERVER" --version | awk '{print $3}') with $(basename "$RL_MODULE") on $RL_TEST_VALKEY_ADDR (pid $VALKEY_TEST_PID)"
        return 0
      fi
      sleep 0.1
    done
    kill "$VALKEY_TEST_PID" 2>/dev/null; wait "$VALKEY_TEST_PID" 2>/dev/null
    VALKEY_TEST_PID=""
    # A lost race for the port is retried; anything else is shown.
    if ! grep -q 'Address already in use' "$VALKEY_TEST_DIR/valkey.log" 2>/dev/null; then
      echo "valkey_start: the server did not start; its log:" >&2
      tail -n 20 "$VALKEY_TEST_DIR/valkey.log" >&2 2>/dev/null
      return 1
    fi
  done
  echo "valkey_start: no free port after 5 attempts" >&2
  return 1
}

# valkey_stop: stop the server started by valkey_start (idempotent).
valkey_stop() {
  if [ -n "${VALKEY_TEST_WATCHDOG:-}" ]; then
    kill "$VALKEY_TEST_WATCHDOG" 2>/dev/null; wait "$VALKEY_TEST_WATCHDOG" 2>/dev/null
    VALKEY_TEST_WATCHDOG=""
  fi
  if [ -n "${VALKEY_TEST_PID:-}" ]; then
    kill "$VALKEY_TEST_PID" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$VALKEY_TEST_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$VALKEY_TEST_PID" 2>/dev/null
    wait "$VALKEY_TEST_PID" 2>/dev/null
    VALKEY_TEST_PID=""
  fi
  if [ -n "${VALKEY_TEST_DIR:-}" ]; then rm -rf "$VALKEY_TEST_DIR"; VALKEY_TEST_DIR=""; fi
  return 0
}
