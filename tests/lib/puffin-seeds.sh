#!/usr/bin/env bash
# Seeds for the puffin fuzz target (crates/ota/fuzz, `puffin`) in DIR, one per mode of the
# harness (snapblk_ota::puffin_testing::fuzz_puffin): flag byte 0 (shifted by 0-7 bits in bits
# 2-4) and a raw deflate stream by Python's zlib at several levels and strategies; flag byte 1
# and a puff of whole blocks (fixed, stored, and a dynamic one as snapblk puffs zlib's
# Z_HUFFMAN_ONLY output); flag byte 2, a destination length and a PUF1 patch whose inner patch
# is the destination's puff stream.
# usage: tests/lib/puffin-seeds.sh DIR
set -euo pipefail
python3 - "$1" <<'PY'
import sys, zlib, random
d = sys.argv[1]
r = random.Random(3)
text = b" ".join(r.choice([b"puff", b"huff", b"deflate", b"block", b"stored", b"fixed"])
                 for _ in range(600))
mixed = text[:1500] + r.randbytes(1500) + text[1500:3000]
runs = [(text, 1, "Z_DEFAULT_STRATEGY"), (text, 6, "Z_DEFAULT_STRATEGY"), (text, 9, "Z_FILTERED"),
        (text, 6, "Z_FIXED"), (text, 9, "Z_HUFFMAN_ONLY"), (text, 6, "Z_RLE"),
        (mixed, 0, "Z_DEFAULT_STRATEGY"), (mixed, 6, "Z_DEFAULT_STRATEGY")]
for i, (data, level, strategy) in enumerate(runs):
    c = zlib.compressobj(level, zlib.DEFLATED, -15, 8, getattr(zlib, strategy))
    z = c.compress(data) + c.flush()
    open(f"{d}/deflate-{i}-{level}-{strategy}", "wb").write(bytes([(i % 8) << 2]) + z)

def meta(b):
    return (len(b) - 1).to_bytes(2, "big") + b
def lits(b):
    return bytes([len(b) - 1]) + b
EOB = b"\xff\x81"
fixed = meta(b"\xa0") + lits(b"abc") + bytes([0x80 | (9 - 3)]) + (2).to_bytes(2, "big") + EOB
stored = meta(b"\x00") + lits(b"stored bytes") + EOB + meta(b"\x80") + EOB
# zlib Z_HUFFMAN_ONLY of 16 a, 20 b, 26 c, 28 d, 13 e, puffed: one dynamic block of 369 bits.
dynamic = bytes.fromhex(
    "0017c000010e0020000000020302037203020202049b210401016661616161616161616161616161616161"
    "626262626262626262626262626262626262626263636363636363636363636363636363636363636363"
    "636363636464646464646464646464646464646464646464646464646464646465656565656565656565"
    "656565ff81")
for name, p in [("fixed", fixed), ("stored", stored), ("dynamic", dynamic)]:
    open(f"{d}/puff-{name}", "wb").write(b"\x01" + p)

def varint(v):
    out = b""
    while True:
        b, v = v & 0x7f, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out
def field(tag, payload):
    return varint(tag << 3 | 2) + varint(len(payload)) + payload
def num(tag, v):
    return varint(tag << 3) + varint(v) if v else b""
def extent(o, l):
    return num(1, o) + num(2, l)
bits = 369
dst_len = (bits + 7) // 8
trailing = dst_len - bits // 8
stream = (field(1, extent(0, bits)) + field(2, extent(0, len(dynamic) * 8))
          + num(3, len(dynamic) + trailing))
header = num(1, 1) + field(2, b"") + field(3, stream)
patch = b"PUF1" + len(header).to_bytes(4, "big") + header + dynamic + bytes(trailing)
open(f"{d}/patch-dynamic", "wb").write(b"\x02" + dst_len.to_bytes(2, "big") + patch)
PY
