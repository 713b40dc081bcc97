#!/usr/bin/env bash
# Fetch Debian trixie's QEMU 10 tools (qemu-utils: qemu-io, qemu-img; qemu-block-extra: the
# blkio block driver) and the libraries they need, WITHOUT installing anything: a private apt
# config downloads the .debs (the host's apt state is untouched) and dpkg-deb extracts them
# into a cache dir. They run through trixie's own dynamic loader, with a libblkio.so.1 of our
# choice first on the library path (docs/blkio.md, "QEMU end to end"). Prints the root dir.
# Usage: bench/trixie-qemu.sh   (cache: $TRIXIE_QEMU_CACHE, default /var/tmp/snapblk-trixie-qemu)
set -euo pipefail
C=${TRIXIE_QEMU_CACHE:-/var/tmp/snapblk-trixie-qemu}
root="$C/root"
if [ -x "$root/usr/bin/qemu-io" ] && [ -e "$root/usr/lib/x86_64-linux-gnu/qemu/block-blkio.so" ]; then
  echo "$root"; exit 0
fi
# The set verified to run qemu-io / qemu-img on a bookworm host (shared notes §3.2).
PKGS=(qemu-utils qemu-block-extra libc6 libaio1t64 libfuse3-4 libglib2.0-0t64 libgmp10
      libgnutls30t64 libhogweed6t64 libnettle8t64 libnuma1 libselinux1 liburing2 libzstd1 zlib1g
      libffi8 libpcre2-8-0 libmount1 libblkid1 libidn2-0 libp11-kit0 libtasn1-6 libunistring5
      libgcc-s1 libatomic1)
. "$(dirname "$0")/lib/trixie-fetch.sh"
trixie_fetch "$C" "${PKGS[@]}"
[ -x "$root/usr/bin/qemu-io" ] || { echo "qemu-io not found after extraction" >&2; exit 1; }
echo "$root"
