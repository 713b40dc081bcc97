#!/usr/bin/env bash
# Seeds for the OTA payload fuzz target (crates/ota/fuzz, `payload`) in DIR: each AOSP sample
# payload (tests/data/ota) twice, as the harness reads it: flag byte 0 and the payload, and flag
# byte 1 and its manifest alone (the harness wraps it in a valid header); and the full sample
# signed by an EC P-256 key that openssl makes here (metadata and payload signatures, laid out
# as delta_generator does; tests/lib/ota-sign.py), once with flag byte 6 and the public key
# appended (the harness checks the signatures with it and hashes the whole payload) and once
# with flag byte 0.
# usage: tests/lib/ota-seeds.sh DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
dir=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xf "$ROOT/tests/data/ota/sample_payloads.tar.xz" -C "$tmp"
for p in full_payload delta_payload; do
  { printf '\000'; cat "$tmp/$p.bin"; } > "$dir/$p"
  python3 - "$tmp/$p.bin" "$dir/${p}_manifest" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
m = struct.unpack(">Q", b[12:20])[0]
open(sys.argv[2], "wb").write(b"\x01" + b[24:24 + m])
PY
done
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/k.pem" 2> /dev/null
openssl pkey -in "$tmp/k.pem" -pubout -outform DER -out "$tmp/k.der"
python3 "$ROOT/tests/lib/ota-sign.py" "$tmp/full_payload.bin" "$tmp/signed.bin" "$tmp/k.pem" 72
{ printf '\000'; cat "$tmp/signed.bin"; } > "$dir/full_payload_signed"
python3 - "$tmp/signed.bin" "$tmp/k.der" "$dir/full_payload_signed_key" <<'PY'
import struct, sys
p, k = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
open(sys.argv[3], "wb").write(b"\x06" + p + k + struct.pack(">H", len(k)))
PY
