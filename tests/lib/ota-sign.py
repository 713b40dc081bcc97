#!/usr/bin/env python3
"""Sign an unsigned OTA payload (update_engine's payload.bin, major version 2) with the openssl
CLI, the way delta_generator lays a signed payload out, written from the format alone:

1. room first: the manifest gets signatures_offset (field 4: the data area's length, so the
   blob goes last) and signatures_size (field 5) appended, and the header the metadata
   signature's size, with placeholder Signatures messages of the final size (each signature
   zero-padded to PAD bytes, unpadded_signature_size a fixed32, so the size does not depend on
   the signature);
2. then the signatures: the metadata signature signs bytes [0, 24 + M) (header and manifest),
   the payload signature those bytes followed by the data area up to the payload signature
   blob (the metadata signature left out); `openssl dgst -sha256 -sign KEY` makes each.

usage: ota-sign.py IN OUT KEY.pem PAD   (PAD: 72 for P-256, the modulus' bytes for RSA)
"""
import struct
import subprocess
import sys
import tempfile


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def sigset(sig, pad):
    data = sig.ljust(pad, b"\0")
    inner = b"\x12" + varint(len(data)) + data + b"\x1d" + struct.pack("<I", len(sig))
    return b"\x0a" + varint(len(inner)) + inner


def sign(key, message):
    with tempfile.NamedTemporaryFile() as f:
        f.write(message)
        f.flush()
        return subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", key, f.name],
            check=True, capture_output=True).stdout


def main():
    src, dst, key, pad = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    b = open(src, "rb").read()
    assert b[:4] == b"CrAU" and struct.unpack(">Q", b[4:12])[0] == 2
    m = struct.unpack(">Q", b[12:20])[0]
    assert struct.unpack(">I", b[20:24])[0] == 0, "already has a metadata signature"
    manifest, data = b[24:24 + m], b[24 + m:]
    blob_len = len(sigset(b"", pad))
    manifest += b"\x20" + varint(len(data)) + b"\x28" + varint(blob_len)
    header = b[:12] + struct.pack(">Q", len(manifest)) + struct.pack(">I", blob_len)
    metadata = header + manifest
    meta_sig = sigset(sign(key, metadata), pad)
    payload_sig = sigset(sign(key, metadata + data), pad)
    assert len(meta_sig) == len(payload_sig) == blob_len
    open(dst, "wb").write(metadata + meta_sig + data + payload_sig)


main()
