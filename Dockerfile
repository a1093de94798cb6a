# Valkey 8.0 (the official image) with the valkey-ratelimit module loaded.
#
#   docker build -t valkey-ratelimit .
#   docker run --rm -p 6379:6379 valkey-ratelimit
#   valkey-cli RL.TOKENBUCKET demo 10 5 1s
#
# The official image runs `docker-entrypoint.sh` (which drops to the valkey
# user and works in /data) with the CMD below. Arguments given to `docker run`
# replace that CMD, so repeat the --loadmodule when passing your own:
#
#   docker run --rm -p 6379:6379 valkey-ratelimit valkey-server \
#     --loadmodule /usr/lib/valkey/modules/libvalkey_ratelimit.so --ratelimit.events yes
#
# With a config file of your own (the official image's convention is a mount
# at /usr/local/etc/valkey), put the lines of packaging/valkey-ratelimit.conf in
# it and run `valkey-server /usr/local/etc/valkey/valkey.conf`.
#
# The module is built on Debian bookworm (glibc 2.36) and needs glibc 2.34 or
# newer: it runs in the Debian-based valkey/valkey images, not the -alpine ones.

FROM rust:1-bookworm AS build
# libclang: the valkey-module crate runs bindgen while building.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked

FROM valkey/valkey:8.0
COPY --from=build /src/target/release/libvalkey_ratelimit.so /usr/lib/valkey/modules/libvalkey_ratelimit.so
# The licence travels with the binary (BSD-3-Clause asks for it).
COPY --from=build /src/LICENSE /usr/share/doc/valkey-ratelimit/LICENSE
CMD ["valkey-server", "--loadmodule", "/usr/lib/valkey/modules/libvalkey_ratelimit.so"]
