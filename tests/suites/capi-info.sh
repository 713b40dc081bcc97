#!/usr/bin/env bash
# `snapblk info DEVICE [--json]` over the device-spec grammar. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p snapblk-cli || { echo "FAIL: build"; echo "0 passed, 1 failed"; exit 1; }
bin=target/release/snapblk
passed=0; failed=0
t() { if eval "$2"; then echo "PASS $1"; passed=$((passed+1)); else echo "FAIL $1"; failed=$((failed+1)); fi; }
f=$(mktemp /dev/shm/snapblk-info.XXXXXX); trap 'rm -f "$f"' EXIT
head -c 1048576 /dev/zero > "$f"
t "null json capacity with size suffix" '[ "$($bin info --json null:size=8M | python3 -c "import json,sys; print(json.load(sys.stdin)[\"capacity\"])")" = 8388608 ]'
t "path spec uses io_uring" '$bin info "$f" | grep -Eq "^driver +io_uring$"'
t "table lists capacity" '$bin info "$f" | grep -Eq "^capacity +1.00 MiB \(1048576 bytes\)$"'
t "sync driver, direct, read-only" '$bin info --json "sync:path=$f,direct=true,read-only=true" | python3 -c "import json,sys; d=json.load(sys.stdin); assert d[\"driver\"]==\"sync\" and d[\"direct\"] and d[\"read-only\"] and d[\"request-alignment\"]==4096"'
t "missing file is a one-line error" '[ "$($bin info /nonexistent/x 2>&1 >/dev/null | wc -l)" = 1 ] && ! $bin info /nonexistent/x 2>/dev/null'
t "unknown property fails" '! $bin info null:bogus=1 2>/dev/null'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
