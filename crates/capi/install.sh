#!/usr/bin/env bash
# Install snapblk's libblkio into PREFIX (default /usr/local): lib + symlinks, header, blkio.pc.
# Usage: crates/capi/install.sh [PREFIX]   (after: cargo build --release -p snapblk-capi)
# Honours CARGO_TARGET_DIR, and DESTDIR for staged installs (files go to DESTDIR/PREFIX,
# blkio.pc still names PREFIX). scripts/install.sh installs the CLI with it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
prefix="${1:-/usr/local}"
dest="${DESTDIR:-}$prefix"
lib="${CARGO_TARGET_DIR:-$root/target}/release/libblkio.so"
[ -f "$lib" ] || { echo "build first: cargo build --release -p snapblk-capi" >&2; exit 1; }
install -d "$dest/lib/pkgconfig" "$dest/include"
install -m 0755 "$lib" "$dest/lib/libblkio.so.1.5.0"
ln -sf libblkio.so.1.5.0 "$dest/lib/libblkio.so.1"
ln -sf libblkio.so.1 "$dest/lib/libblkio.so"
install -m 0644 "$root/include/blkio.h" "$dest/include/blkio.h"
sed "s|@PREFIX@|$prefix|" "$root/crates/capi/blkio.pc.in" > "$dest/lib/pkgconfig/blkio.pc"
echo "installed libblkio (snapblk) into $dest"
