#!/usr/bin/env bash
# Fetch the real libblkio (Debian trixie's libblkio1 + libblkio-dev) WITHOUT installing it:
# a private apt config (nothing of the host's apt state is touched) downloads the .debs and
# dpkg-deb extracts them into a cache dir. Prints the directory holding libblkio.so.1.
# Usage: bench/real-libblkio.sh   (cache: $REAL_LIBBLKIO_CACHE, default /var/tmp/snapblk-real-libblkio)
set -euo pipefail
C=${REAL_LIBBLKIO_CACHE:-/var/tmp/snapblk-real-libblkio}
libdir="$C/root/usr/lib/x86_64-linux-gnu"
if [ -e "$libdir/libblkio.so.1" ]; then echo "$libdir"; exit 0; fi
. "$(dirname "$0")/lib/trixie-fetch.sh"
trixie_fetch "$C" libblkio1 libblkio-dev
[ -e "$libdir/libblkio.so.1" ] || { echo "real libblkio not found after extraction" >&2; exit 1; }
ls "$C"/debs >&2
echo "$libdir"
