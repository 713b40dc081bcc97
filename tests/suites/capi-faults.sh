#!/usr/bin/env bash
# Injected I/O errors reach C clients of libblkio.so.1 as -EIO: builds a libblkio.so with the
# test-only `fault` driver (cargo feature fault-injection, into its own target dir so the shipped
# library never has it), runs tests/c/fault_test.c against it, and checks that the shipped build
# has no such driver. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
command -v gcc >/dev/null || { echo "FAIL: gcc not found (scripts/install-deps.sh installs build-essential)"; echo "0 passed, 1 failed"; exit 1; }
tdir=${CARGO_TARGET_DIR:-$root/target}
variant=$tdir/fault-injection
CARGO_TARGET_DIR=$variant cargo build -q -p snapblk-capi --features fault-injection \
  || { echo "FAIL: cargo build -p snapblk-capi --features fault-injection"; echo "0 passed, 1 failed"; exit 1; }
cargo build --release -q -p snapblk-capi \
  || { echo "FAIL: cargo build --release -p snapblk-capi"; echo "0 passed, 1 failed"; exit 1; }
work=$(mktemp -d /tmp/snapblk-capi-faults.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/fault" "$work/shipped"
ln -sf "$variant/debug/libblkio.so" "$work/fault/libblkio.so.1"
ln -sf "$variant/debug/libblkio.so" "$work/fault/libblkio.so"
ln -sf "$tdir/release/libblkio.so" "$work/shipped/libblkio.so.1"
ln -sf "$tdir/release/libblkio.so" "$work/shipped/libblkio.so"
passed=0; failed=0
gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/fault_test.c -L "$work/fault" -lblkio -o "$work/fault_test" \
  || { echo "FAIL: gcc tests/c/fault_test.c"; echo "0 passed, 1 failed"; exit 1; }
run() {
  local dir=$1; shift
  out=$(LD_LIBRARY_PATH="$work/$dir" "$work/fault_test" "$@" 2>&1); rc=$?
  echo "$out"
  p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
  passed=$((passed+p)); failed=$((failed+f))
  [ "$p" -gt 0 ] || { echo "FAIL fault_test $* ran no check"; failed=$((failed+1)); }
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL fault_test $* exited $rc"; failed=$((failed+1)); fi
}
run fault
run shipped --absent
# The facade's own tests with the feature on (a `fault:` device spec; the known-driver list).
if CARGO_TARGET_DIR=$variant cargo test -q -p snapblk --features fault-injection >"$work/facade.log" 2>&1; then
  echo "PASS cargo test -p snapblk --features fault-injection"; passed=$((passed+1))
else
  tail -30 "$work/facade.log"; echo "FAIL cargo test -p snapblk --features fault-injection"; failed=$((failed+1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
