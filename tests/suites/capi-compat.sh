#!/usr/bin/env bash
# Compatibility run: the same C test (tests/c/capi_test.c), compiled against the REAL libblkio
# header and run against the real libblkio 1.5 (Debian trixie, fetched by bench/real-libblkio.sh
# without installing it) and against snapblk's libblkio.so.1. Passes when snapblk passes every
# check and every check the real library fails is tagged [fix] (a documented bug fix,
# docs/blkio.md). Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
die() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
command -v gcc >/dev/null || die "gcc not found"
real=$(bash bench/real-libblkio.sh) || die "could not fetch the real libblkio (needs deb.debian.org)"
realinc=$(cd "$real/../../include" && pwd)
cargo build --release -p snapblk-capi || die "cargo build -p snapblk-capi"
work=$(mktemp -d /tmp/snapblk-compat.XXXXXX)
shm=$(mktemp -d /dev/shm/snapblk-compat.XXXXXX)
disk=$(mktemp -d /var/tmp/snapblk-compat.XXXXXX)
trap 'rm -rf "$work" "$shm" "$disk"' EXIT
mkdir -p "$work/snap"
tgt=${CARGO_TARGET_DIR:-$root/target}
ln -sf "$tgt/release/libblkio.so" "$work/snap/libblkio.so.1"
ln -sf "$tgt/release/libblkio.so" "$work/snap/libblkio.so"
# Built once against the real header and the real library: the binary is the same for both runs.
gcc -std=gnu11 -Wall -O2 -I "$realinc" tests/c/capi_test.c -L "$real" -l:libblkio.so.1 -lpthread -o "$work/t" \
  || die "gcc against the real header"
run() { LD_LIBRARY_PATH="$1" "$work/t" "$shm" "$disk" 2>&1 | grep -E '^(PASS|FAIL)'; }
run "$real" > "$work/real.txt"
run "$work/snap" > "$work/snap.txt"
passed=0; failed=0
echo "== checks the real libblkio 1.5 fails (each must be a documented [fix]):"
while read -r line; do
  echo "  real: $line"
  case "$line" in
    "FAIL [fix] "*) passed=$((passed+1)) ;;
    *) echo "FAIL undocumented difference: $line"; failed=$((failed+1)) ;;
  esac
done < <(grep '^FAIL' "$work/real.txt")
nreal=$(grep -c '^PASS' "$work/real.txt")
echo "== real libblkio passes $nreal checks"
echo "== snapblk:"
nsnap_fail=$(grep -c '^FAIL' "$work/snap.txt")
grep '^FAIL' "$work/snap.txt" | sed 's/^/  snapblk: /'
if [ "$nsnap_fail" -eq 0 ]; then echo "PASS snapblk passes all $(grep -c '^PASS' "$work/snap.txt") checks"; passed=$((passed+1));
else echo "FAIL snapblk fails $nsnap_fail checks"; failed=$((failed+1)); fi
# Same set of check names in both runs (no check silently missing, e.g. after a crash).
if diff <(sed -E 's/^(PASS|FAIL) //; s/ \(line [0-9]+\).*//' "$work/real.txt") \
        <(sed -E 's/^(PASS|FAIL) //; s/ \(line [0-9]+\).*//' "$work/snap.txt") >/dev/null; then
  echo "PASS both runs executed the same checks"; passed=$((passed+1))
else
  echo "FAIL the runs executed different checks"; failed=$((failed+1))
fi
# `snapblk bench --libblkio` loading both libraries in one run (the cargo test that needs the real
# library, ignored in the plain `cargo test` for want of it; the library is here now).
if cargo test -q -p snapblk-cli --test bench_libblkio -- --ignored --exact \
     real_libblkio_and_snapblk_compared_in_one_run > "$work/bench.txt" 2>&1 \
   && grep -q '^test result: ok. 1 passed' "$work/bench.txt"; then
  echo "PASS snapblk bench compares the real libblkio and snapblk's in one run"; passed=$((passed+1))
else
  sed 's/^/  /' "$work/bench.txt" | tail -30
  echo "FAIL snapblk bench comparing the real libblkio and snapblk's"; failed=$((failed+1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
