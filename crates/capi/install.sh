#!/usr/bin/env bash
# Install snapblk's libblkio into PREFIX (default /usr/local): lib + symlinks, header, blkio.pc.
# Usage: crates/capi/install.sh [PREFIX]   (after: cargo build --release -p snapblk-capi)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
prefix="${1:-/usr/local}"
lib="$root/target/release/libblkio.so"
[ -f "$lib" ] || { echo "build first: cargo build --release -p snapblk-capi" >&2; exit 1; }
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$lib" "$prefix/lib/libblkio.so.1.5.0"
ln -sf libblkio.so.1.5.0 "$prefix/lib/libblkio.so.1"
ln -sf libblkio.so.1 "$prefix/lib/libblkio.so"
install -m 0644 "$root/include/blkio.h" "$prefix/include/blkio.h"
sed "s|@PREFIX@|$prefix|" "$root/crates/capi/blkio.pc.in" > "$prefix/lib/pkgconfig/blkio.pc"
echo "installed libblkio (snapblk) into $prefix"
