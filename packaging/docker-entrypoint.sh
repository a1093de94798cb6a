#!/bin/sh
# The image's entrypoint: loads the module into valkey-server, however it is
# started, then hands over to the official image's docker-entrypoint.sh
# (which moves to the valkey user and /data).
#
#   docker run IMAGE                            valkey-server + the module
#   docker run IMAGE --maxmemory 1gb            the same, with those flags
#   docker run IMAGE /usr/local/etc/valkey/valkey.conf
#                                               a config of your own; the
#                                               module is added unless it
#                                               already has a loadmodule line
#   docker run IMAGE valkey-server ...          likewise
#   docker run IMAGE sh                         anything else runs as given
#
# RATELIMIT_ARGS: the module's load arguments (e.g. "cl-throttle no").
set -e

MODULE=/usr/lib/valkey/libvalkey_ratelimit.so

# Flags or a config file first: valkey-server is meant (as the official image).
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- valkey-server "$@"
fi

if [ "$1" = valkey-server ]; then
    loaded=no
    for arg in "$@"; do
        if [ "$arg" = "$MODULE" ]; then loaded=yes; fi
        case "$arg" in
            *.conf) if [ -f "$arg" ] && grep -q "^[[:space:]]*loadmodule[[:space:]]\+$MODULE" "$arg"; then loaded=yes; fi ;;
        esac
    done
    if [ "$loaded" = no ]; then
        # shellcheck disable=SC2086
        set -- "$@" --loadmodule "$MODULE" ${RATELIMIT_ARGS:-}
    fi
fi

exec docker-entrypoint.sh "$@"
