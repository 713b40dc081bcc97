#!/usr/bin/env bash
# Seeds for the OTA payload fuzz target (crates/ota/fuzz, `payload`) in DIR: each AOSP sample
# payload (tests/data/ota) twice, as the harness reads it: flag byte 0 and the payload, and flag
# byte 1 and its manifest alone (the harness wraps it in a valid header).
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
