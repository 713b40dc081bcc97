#!/usr/bin/env bash
# Seeds for the bsdiff applier's fuzz target (crates/ota/fuzz, `bspatch`) in DIR, in the
# harness's layout (old length as two little-endian bytes, the old file, the patch): BSDIFF40
# patches made by Debian's bsdiff between small related files, each also repacked as BSDF2 with
# uncompressed and with bzip2 streams (python3's bz2).
# usage: tests/lib/bspatch-seeds.sh DIR
set -euo pipefail
dir=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" <<'PY'
import os, random, sys
d = sys.argv[1]
r = random.Random(7)
old = bytes(r.randrange(256) for _ in range(3000))
pairs = {
    "edit": bytearray(old),
    "insert": old[:1000] + b"inserted" * 40 + old[1000:],
    "shrink": old[500:2200],
    "moved": old[1500:] + old[:1500],
}
for i in range(0, 3000, 97):
    pairs["edit"][i] ^= 0x21
open(os.path.join(d, "old"), "wb").write(old)
for name, new in pairs.items():
    open(os.path.join(d, name + ".new"), "wb").write(bytes(new))
PY
for n in edit insert shrink moved; do
  bsdiff "$tmp/old" "$tmp/$n.new" "$tmp/$n.patch"
  python3 - "$tmp/old" "$tmp/$n.patch" "$dir/$n" <<'PY'
import bz2, struct, sys
old = open(sys.argv[1], "rb").read()
p = open(sys.argv[2], "rb").read()
out = sys.argv[3]
def seed(patch):
    return struct.pack("<H", len(old)) + old + patch
def enc(x):
    return struct.pack("<Q", x)  # non-negative bsdiff integers
open(out + "_bsdiff40", "wb").write(seed(p))
c, d = struct.unpack("<QQ", p[8:24])
streams = [bz2.decompress(s) for s in (p[32:32 + c], p[32 + c:32 + c + d], p[32 + c + d:])]
for codes, tag in ((b"\0\0\0", "none"), (b"\1\0\1", "mixed")):
    packed = [bz2.compress(s) if k == 1 else s for s, k in zip(streams, codes)]
    body = b"BSDF2" + codes + enc(len(packed[0])) + enc(len(packed[1])) + p[24:32]
    open(f"{out}_bsdf2_{tag}", "wb").write(seed(body + b"".join(packed)))
PY
done
