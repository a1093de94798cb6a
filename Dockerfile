# Valkey (the official image) with the valkey-ratelimit module, built the way
# valkey-bundle builds its modules: a build stage on the same Debian release
# as the final image, then the .so copied into /usr/lib/valkey/ and loaded by
# the entrypoint.
#
#   docker build -t valkey-ratelimit .
#   docker run --rm -p 6379:6379 valkey-ratelimit
#   valkey-cli RL.TOKENBUCKET demo 10 5 1s
#
# Arguments after the image name go to valkey-server and the module is still
# loaded (packaging/docker-entrypoint.sh):
#
#   docker run --rm -p 6379:6379 valkey-ratelimit --ratelimit.events yes
#   docker run --rm -e RATELIMIT_ARGS="cl-throttle no" valkey-ratelimit
#   docker run --rm -v "$PWD/conf:/usr/local/etc/valkey" valkey-ratelimit \
#     /usr/local/etc/valkey/valkey.conf
#
# VALKEY_VERSION and DEBIAN_RELEASE pick the official image (tag
# <version>-<release>); the build stage uses the same Debian release, so the
# module links against the glibc the server runs with. Debian-based images
# only: the module needs glibc 2.34 or newer (not the -alpine images).
#
# make docker-check verifies what this machine can without a container
# runtime: see scripts/docker-check.sh.

ARG VALKEY_VERSION=8.0
ARG DEBIAN_RELEASE=bookworm

FROM rust:1-${DEBIAN_RELEASE} AS build
# libclang: the valkey-module crate runs bindgen while building.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked

FROM valkey/valkey:${VALKEY_VERSION}-${DEBIAN_RELEASE}
COPY --from=build /src/target/release/libvalkey_ratelimit.so /usr/lib/valkey/libvalkey_ratelimit.so
# The licence and the sample config travel with the binary.
COPY LICENSE packaging/valkey-ratelimit.conf /usr/share/doc/valkey-ratelimit/
COPY packaging/docker-entrypoint.sh /usr/local/bin/ratelimit-entrypoint.sh
ENTRYPOINT ["ratelimit-entrypoint.sh"]
EXPOSE 6379
CMD ["valkey-server"]
