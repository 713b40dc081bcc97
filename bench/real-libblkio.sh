#!/usr/bin/env bash
# Fetch the real libblkio (Debian trixie's libblkio1 + libblkio-dev) WITHOUT installing it:
# a private apt config (nothing of the host's apt state is touched) downloads the .debs and
# dpkg-deb extracts them into a cache dir. Prints the directory holding libblkio.so.1.
# Usage: bench/real-libblkio.sh   (cache: $REAL_LIBBLKIO_CACHE, default /var/tmp/snapblk-real-libblkio)
set -euo pipefail
C=${REAL_LIBBLKIO_CACHE:-/var/tmp/snapblk-real-libblkio}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
libdir="$C/root/usr/lib/x86_64-linux-gnu"
if [ -e "$libdir/libblkio.so.1" ]; then echo "$libdir"; exit 0; fi
mkdir -p "$C/apt/lists/partial" "$C/apt/cache/archives/partial" "$C/debs" "$C/root"
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
(cd "$C/debs" && apt-get "${O[@]}" -qq download libblkio1 libblkio-dev >&2)
for d in "$C"/debs/*.deb; do dpkg-deb -x "$d" "$C/root"; done
[ -e "$libdir/libblkio.so.1" ] || { echo "real libblkio not found after extraction" >&2; exit 1; }
ls "$C"/debs >&2
echo "$libdir"
