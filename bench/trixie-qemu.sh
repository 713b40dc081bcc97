#!/usr/bin/env bash
# Fetch Debian trixie's QEMU 10 tools (qemu-utils: qemu-io, qemu-img; qemu-block-extra: the
# blkio block driver) and the libraries they need, WITHOUT installing anything: a private apt
# config downloads the .debs (the host's apt state is untouched) and dpkg-deb extracts them
# into a cache dir. They run through trixie's own dynamic loader, with a libblkio.so.1 of our
# choice first on the library path (docs/blkio.md, "QEMU end to end"). Prints the root dir.
# Usage: bench/trixie-qemu.sh   (cache: $TRIXIE_QEMU_CACHE, default /var/tmp/snapblk-trixie-qemu)
set -euo pipefail
C=${TRIXIE_QEMU_CACHE:-/var/tmp/snapblk-trixie-qemu}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root="$C/root"
if [ -x "$root/usr/bin/qemu-io" ] && [ -e "$root/usr/lib/x86_64-linux-gnu/qemu/block-blkio.so" ]; then
  echo "$root"; exit 0
fi
mkdir -p "$C/apt/lists/partial" "$C/apt/cache/archives/partial" "$C/debs" "$root"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" > "$C/apt/sources.list"
: > "$C/apt/status"
O=(-o "Dir::Etc::SourceList=$C/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
   -o "Dir::State::Lists=$C/apt/lists" -o "Dir::Cache=$C/apt/cache"
   -o "Dir::State::Status=$C/apt/status" -o APT::Architectures=amd64 -o Acquire::Languages=none
   -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
   -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
   -o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false)
apt-get "${O[@]}" -qq update >&2
# The set verified to run qemu-io / qemu-img on a bookworm host (shared notes §3.2).
PKGS=(qemu-utils qemu-block-extra libc6 libaio1t64 libfuse3-4 libglib2.0-0t64 libgmp10
      libgnutls30t64 libhogweed6t64 libnettle8t64 libnuma1 libselinux1 liburing2 libzstd1 zlib1g
      libffi8 libpcre2-8-0 libmount1 libblkid1 libidn2-0 libp11-kit0 libtasn1-6 libunistring5
      libgcc-s1 libatomic1)
(cd "$C/debs" && apt-get "${O[@]}" -qq download "${PKGS[@]}" >&2)
for d in "$C"/debs/*.deb; do dpkg-deb -x "$d" "$root"; done
[ -x "$root/usr/bin/qemu-io" ] || { echo "qemu-io not found after extraction" >&2; exit 1; }
echo "$root"
