#!/usr/bin/env bash
# make deb: a Debian package of the module, for this machine's architecture.
#
#   target/deb/valkey-ratelimit_<version>-1_<arch>.deb
#
# It installs:
#   /usr/lib/valkey/modules/libvalkey_ratelimit.so  the release build, stripped
#   /etc/valkey/valkey-ratelimit.conf               conffile: the loadmodule line
#       and the module's configs, commented, with their defaults
#       (packaging/valkey-ratelimit.conf); load the module by adding
#       `include /etc/valkey/valkey-ratelimit.conf` to /etc/valkey/valkey.conf
#   /usr/share/doc/valkey-ratelimit/                README.md, docs/, the
#       changelogs and copyright (the BSD-3-Clause licence)
#
# Depends on the C library and libgcc it links (the versions read from the
# .so), recommends valkey-server (>= 8.0). No maintainer scripts: nothing runs
# at install, and the package never edits valkey.conf (another package's
# conffile). Built with dpkg-deb alone (no debhelper); mtimes are
# SOURCE_DATE_EPOCH (default: the last commit's time), owners root.
#
# make test-deb installs it with dpkg, loads it into Debian's valkey-server
# through its config, and purges it: see scripts/deb-test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

say() { printf 'deb: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is missing: make deb needs a Debian or Ubuntu system"
so="${RL_MODULE:-$root/target/release/libvalkey_ratelimit.so}"
[ -f "$so" ] || die "$so is missing: run make build (cargo build --release)"

version="$(awk -F'"' '/^\[/ { p = ($0 == "[package]") } p && /^version *=/ { print $2; exit }' Cargo.toml)"
[ -n "$version" ] || die "no version in Cargo.toml's [package]"
revision="${DEB_REVISION:-1}"
arch="$(dpkg --print-architecture)"
name="valkey-ratelimit"
out="$root/target/deb"
deb="$out/${name}_${version}-${revision}_${arch}.deb"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || stat -c %Y Cargo.toml)}"
export SOURCE_DATE_EPOCH="$epoch"

work="$(mktemp -d "${TMPDIR:-/tmp}/rl-deb.XXXXXX")"
trap 'rm -rf "$work"' EXIT
pkg="$work/$name"
doc="$pkg/usr/share/doc/$name"
mkdir -p "$pkg/DEBIAN" "$pkg/usr/lib/valkey/modules" "$pkg/etc/valkey" "$doc/docs"

# The module, stripped. 0755, not the 0644 of a shared library: Valkey
# refuses a module without execute permission ("It does not have execute
# permissions").
install -m 0755 "$so" "$pkg/usr/lib/valkey/modules/libvalkey_ratelimit.so"
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
  "$pkg/usr/lib/valkey/modules/libvalkey_ratelimit.so"

# The sample config, with the package's own header.
{
  cat <<'HEADER'
# valkey-ratelimit, installed by the Debian package valkey-ratelimit.
#
# To load the module into Debian's valkey-server, add this line to
# /etc/valkey/valkey.conf and restart the service:
#
#   include /etc/valkey/valkey-ratelimit.conf
#
# (or copy the lines below into valkey.conf). Documentation:
# /usr/share/doc/valkey-ratelimit/README.md and docs/.
#
HEADER
  sed -e '1,/^$/d' packaging/valkey-ratelimit.conf
} >"$pkg/etc/valkey/valkey-ratelimit.conf"
chmod 0644 "$pkg/etc/valkey/valkey-ratelimit.conf"
echo /etc/valkey/valkey-ratelimit.conf >"$pkg/DEBIAN/conffiles"

# Docs: README, docs/ (Markdown and images), the changelogs, the copyright.
install -m 0644 README.md "$doc/README.md"
find docs -maxdepth 1 -type f \( -name '*.md' -o -name '*.png' \) -exec install -m 0644 {} "$doc/docs/" \;
gzip -9 -n -c CHANGELOG.md >"$doc/changelog.gz"
date_rfc="$(LC_ALL=C date -u -d "@$epoch" '+%a, %d %b %Y %H:%M:%S +0000')"
maintainer="${DEB_MAINTAINER:-valkey-ratelimit maintainers <maintainers@valkey-ratelimit.invalid>}"
printf '%s (%s-%s) unstable; urgency=medium\n\n  * Release %s (see changelog.gz).\n\n -- %s  %s\n' \
  "$name" "$version" "$revision" "$version" "$maintainer" "$date_rfc" | gzip -9 -n >"$doc/changelog.Debian.gz"
{
  printf 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n'
  printf 'Upstream-Name: valkey-ratelimit\n\nFiles: *\n'
  printf 'Copyright: %s\n' "$(sed -n 's/^Copyright (c) //p' LICENSE | head -1)"
  printf 'License: BSD-3-Clause\n'
  sed -e '1,/^Copyright/d' -e 's/^$/./' -e 's/^/ /' LICENSE
} >"$doc/copyright"
chmod 0644 "$doc"/*

# Depends: the libraries the .so needs, at the versions its symbols ask for.
glibc="$(objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
depends="libc6 (>= ${glibc:-2.34})"
if readelf -d "$so" | grep -q 'NEEDED.*libgcc_s'; then depends="$depends, libgcc-s1"; fi
size="$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)"
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: $name
Version: $version-$revision
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $depends
Recommends: valkey-server (>= 8.0)
Section: database
Priority: optional
Description: native, atomic rate-limit commands for Valkey (module)
 A Valkey module with rate limiting as server commands: token bucket
 (RL.TOKENBUCKET), fixed and sliding windows (RL.WINDOW), an exact sliding
 log (RL.SLIDINGLOG), GCRA (RL.GCRA, RL.THROTTLE, and CL.THROTTLE as a
 drop-in for redis-cell), several limits at once (RL.ALL), stored policies,
 lockouts, refunds, concurrency leases and BLOCK to wait for a permit.
 .
 Every decision is one atomic command on the server's clock; replicas and
 the AOF receive the decided change, not the request. Needs Valkey 8.0 or
 newer; load it with "include /etc/valkey/valkey-ratelimit.conf" in
 /etc/valkey/valkey.conf.
CONTROL
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f ! -path './etc/*' -printf '%P\n' | LC_ALL=C sort | xargs md5sum >DEBIAN/md5sums)
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/conffiles" "$pkg/DEBIAN/md5sums"
find "$pkg" -type d -exec chmod 0755 {} +
find "$pkg" -exec touch -h -d "@$epoch" {} +

mkdir -p "$out"
rm -f "$deb"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
say "$deb ($(du -k "$deb" | cut -f1) KB)"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p' | sed 's/^/  /' >&2
dpkg-deb --contents "$deb" | awk '{ print "  " $1, $6 }' >&2
echo "$deb"
