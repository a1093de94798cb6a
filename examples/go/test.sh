#!/usr/bin/env bash
# The Go recipe's tests: go test against a real valkey-server with the module.
# Exit 0 passed, 77 skipped, anything else failed.
#
# Builds offline from Debian's packages: Go (golang-1.22-go, or golang-go)
# and redigo (golang-github-gomodule-redigo-dev, source under
# /usr/share/gocode), in GOPATH mode, with no module proxy. When they are
# missing and we are root with apt-get, they are installed (set
# RL_EXAMPLES_NO_INSTALL=1 to skip instead); otherwise the tests are skipped.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/../lib/valkey.sh"

redigo_src=/usr/share/gocode/src/github.com/gomodule/redigo

find_go() {
  local g
  for g in "${GO:-}" "$(command -v go 2>/dev/null)" $(ls -d /usr/lib/go-*/bin/go 2>/dev/null | sort -rV); do
    if [ -n "$g" ] && [ -x "$g" ]; then echo "$g"; return 0; fi
  done
  return 1
}

go="$(find_go)"
if [ -z "$go" ] || ! [ -d "$redigo_src" ]; then
  pkgs=()
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ "${RL_EXAMPLES_NO_INSTALL:-0}" != 1 ]; then
    aptlog="$RL_REPO_ROOT/target/examples/go-apt.log"
    mkdir -p "$(dirname "$aptlog")"
    apt-cache show golang-github-gomodule-redigo-dev >/dev/null 2>&1 || apt-get update -q >"$aptlog" 2>&1
    if [ -z "$go" ]; then
      # Go 1.22 from bookworm-backports when that source is configured
      # (scripts/setup.sh adds it), else the distribution's golang-go.
      if apt-cache show golang-1.22-go >/dev/null 2>&1; then pkgs+=(golang-1.22-go); else pkgs+=(golang-go); fi
    fi
    [ -d "$redigo_src" ] || pkgs+=(golang-github-gomodule-redigo-dev)
    echo "installing ${pkgs[*]} (apt-get, log $aptlog)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "${pkgs[@]}" >>"$aptlog" 2>&1; then
      tail -n 5 "$aptlog"
      echo "SKIP: apt-get install ${pkgs[*]} failed (log $aptlog)"; exit 77
    fi
    go="$(find_go)"
  fi
  if [ -z "$go" ]; then
    echo "SKIP: Go not found (on Debian: apt-get install golang-1.22-go or golang-go)"; exit 77
  fi
  if ! [ -d "$redigo_src" ]; then
    echo "SKIP: redigo not found at $redigo_src (on Debian: apt-get install golang-github-gomodule-redigo-dev)"; exit 77
  fi
fi
valkey_require || exit 77

# GOPATH mode: imports resolve from Debian's /usr/share/gocode, nothing is
# downloaded; caches stay under the repository's target/examples/go.
cache="$RL_REPO_ROOT/target/examples/go"
mkdir -p "$cache/gopath"
export GO111MODULE=off GOPROXY=off GOFLAGS= GOTOOLCHAIN=local CGO_ENABLED=0
export GOPATH="$cache/gopath:/usr/share/gocode" GOCACHE="$cache/build-cache"
echo "go: $("$go" version) ($go), redigo from $redigo_src"

cd "$here" || exit 1
# Compile (and vet) first, then start the server for the run.
"$go" vet . || exit 1
valkey_start || exit 1
"$go" test -count=1 "$@" .
