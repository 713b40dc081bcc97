#!/usr/bin/env bash
# C ABI suite: builds snapblk's libblkio.so.1 and the C tests in tests/c/ with gcc against
# include/blkio.h, runs them, and fails loudly if gcc, the build or any check fails. Then builds
# the lean variant (`--no-default-features --features io_uring`: the io_uring driver alone, no
# snapshot driver or COW codecs) into its own target dir and runs the io_uring tests against it.
# Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
command -v gcc >/dev/null || { echo "FAIL: gcc not found (scripts/install-deps.sh installs build-essential)"; echo "0 passed, 1 failed"; exit 1; }
cargo build --release -p snapblk-capi || { echo "FAIL: cargo build -p snapblk-capi"; echo "0 passed, 1 failed"; exit 1; }
work=$(mktemp -d /tmp/snapblk-capi.XXXXXX)
shm=$(mktemp -d /dev/shm/snapblk-capi.XXXXXX)
disk=$(mktemp -d /var/tmp/snapblk-capi.XXXXXX)
trap 'rm -rf "$work" "$shm" "$disk"' EXIT
tgt=${CARGO_TARGET_DIR:-$root/target}
# The runtime name is the SONAME: libblkio.so.1
ln -sf "$tgt/release/libblkio.so" "$work/libblkio.so.1"
ln -sf "$tgt/release/libblkio.so" "$work/libblkio.so"
passed=0; failed=0
gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/capi_test.c -L "$work" -lblkio -lpthread -o "$work/capi_test" \
  || { echo "FAIL: gcc tests/c/capi_test.c"; echo "0 passed, 1 failed"; exit 1; }
# A file with only the header must compile warning-free (as with the real header).
echo '#include <blkio.h>' > "$work/hdr.c"
if gcc -Wall -Wextra -Werror -I include -c "$work/hdr.c" -o "$work/hdr.o"; then
  echo "PASS header compiles alone"; passed=$((passed+1))
else
  echo "FAIL header compiles alone"; failed=$((failed+1))
fi
if readelf -d "$tgt/release/libblkio.so" | grep -q 'SONAME.*\[libblkio.so.1\]'; then
  echo "PASS SONAME libblkio.so.1"; passed=$((passed+1))
else
  echo "FAIL SONAME"; failed=$((failed+1))
fi
nsyms=$(nm -D --defined-only "$tgt/release/libblkio.so" | awk '$2=="T" && $3 ~ /^blkio/' | wc -l)
if [ "$nsyms" -eq 45 ]; then echo "PASS 45 exported blkio* functions"; passed=$((passed+1)); else echo "FAIL exported functions: $nsyms"; failed=$((failed+1)); fi
out=$(LD_LIBRARY_PATH="$work" "$work/capi_test" "$shm" "$disk" 2>&1); rc=$?
echo "$out"
p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
passed=$((passed+p)); failed=$((failed+f))
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL capi_test exited $rc"; failed=$((failed+1)); fi
# snapblk's snapshot driver through the C ABI: a COW record beside the COW turns a corrupt block
# into -EIO (tests/c/snapshot_record_test.c).
if gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/snapshot_record_test.c -L "$work" -lblkio \
    -o "$work/snapshot_record_test" && cargo build --release -q -p snapblk-cli; then
  rec=$(python3 - "$shm" "$tgt/release/snapblk" <<'PY'
import json, os, subprocess, sys
d, snap = sys.argv[1], sys.argv[2]
old = bytes((i // 4096 * 7 + i) % 251 for i in range(256 * 4096))
new = bytearray(old)
new[40 * 4096:60 * 4096] = os.urandom(20 * 4096)
new[100 * 4096:120 * 4096] = old[102 * 4096:122 * 4096]
open(f"{d}/old.img", "wb").write(old)
open(f"{d}/new.img", "wb").write(new)
subprocess.check_call([snap, "cow", "create", "--old", f"{d}/old.img", "--new", f"{d}/new.img",
                       "-o", f"{d}/r.cow", "--compression", "none"], stdout=subprocess.DEVNULL)
j = json.loads(subprocess.check_output([snap, "cow", "inspect", "--json", "--ops", f"{d}/r.cow"]))
op = [o for o in j["ops"] if o["kind"]["type"] == "replace"][3]
data = bytearray(open(f"{d}/r.cow", "rb").read())
data[op["kind"]["payload"]["offset"] + 9] ^= 1
open(f"{d}/r.cow", "wb").write(data)
print(op["new_block"])
PY
)
  out=$(LD_LIBRARY_PATH="$work" "$work/snapshot_record_test" "$shm/old.img" "$shm/r.cow" "$shm/new.img" "$rec" 2>&1)
  echo "$out"
  p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
  passed=$((passed+p)); failed=$((failed+f))
  [ "$p" -gt 0 ] || { echo "FAIL snapshot_record_test ran no check"; failed=$((failed+1)); }
else
  echo "FAIL build of tests/c/snapshot_record_test.c"; failed=$((failed+1))
fi
# The driver conformance suite's binary (crates/conformance) against a tmpfs file with io_uring
# (O_DIRECT and buffered) and against the null driver, with 30 instances each dropped with reads
# not reaped (open files must not grow); a run without --allow-destructive must leave its target
# unchanged.
if cargo build --release -q -p snapblk-conformance; then
  conf="${CARGO_TARGET_DIR:-$root/target}/release/snapblk-conformance"
  head -c 8388608 /dev/urandom > "$shm/conf.img"
  for spec in "io_uring:path=$shm/conf.img,direct=true" "io_uring:path=$shm/conf.img" "null:size=64M"; do
    out=$("$conf" "$spec" --allow-destructive --drop-unreaped 30 2>&1); rc=$?
    echo "$out" | grep -q '^PASS drop-unreaped' || { echo "FAIL snapblk-conformance $spec: no drop-unreaped pass"; failed=$((failed+1)); }
    echo "snapblk-conformance $spec --allow-destructive:"; echo "$out"
    p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
    passed=$((passed+p)); failed=$((failed+f))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL snapblk-conformance $spec exited $rc"; failed=$((failed+1)); fi
    [ "$p" -gt 0 ] || { echo "FAIL snapblk-conformance $spec ran no check"; failed=$((failed+1)); }
  done
  before=$(sha256sum < "$shm/conf.img")
  out=$("$conf" "io_uring:path=$shm/conf.img,direct=true" 2>&1); rc=$?
  if [ $rc -eq 0 ] && echo "$out" | grep -q '^PASS write-refusal' && [ "$(sha256sum < "$shm/conf.img")" = "$before" ]; then
    echo "PASS snapblk-conformance without --allow-destructive leaves its target unchanged"; passed=$((passed+1))
  else
    echo "$out"; echo "FAIL snapblk-conformance read-only run (exit $rc)"; failed=$((failed+1))
  fi
else
  echo "FAIL cargo build -p snapblk-conformance"; failed=$((failed+1))
fi

# Which drivers each build ships: drivers are cargo features (crates/capi/Cargo.toml).
if gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/drivers_test.c -L "$work" -lblkio \
    -o "$work/drivers_test"; then
  out=$(LD_LIBRARY_PATH="$work" "$work/drivers_test" +io_uring +sync +null +snapshot +nvme-io_uring +virtio-blk-vhost-user +virtio-blk-vhost-vdpa +virtio-blk-vfio-pci +rbd +s3 +http -no-such-driver 2>&1)
  echo "$out"
  p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
  passed=$((passed+p)); failed=$((failed+f))
else
  echo "FAIL build of tests/c/drivers_test.c"; failed=$((failed+1))
fi

# The lean variant: io_uring only, in its own target dir so the full library above stays as built.
lean_tgt="$tgt/capi-io_uring"
lean="$work/lean"; mkdir -p "$lean"
if cargo build --release -p snapblk-capi --no-default-features --features io_uring --target-dir "$lean_tgt"; then
  ln -sf "$lean_tgt/release/libblkio.so" "$lean/libblkio.so.1"
  echo "lean libblkio.so: $(stat -c %s "$lean_tgt/release/libblkio.so") bytes (full: $(stat -c %s "$tgt/release/libblkio.so"))"
  if readelf -d "$lean_tgt/release/libblkio.so" | grep -q 'SONAME.*\[libblkio.so.1\]'; then
    echo "PASS lean: SONAME libblkio.so.1"; passed=$((passed+1))
  else
    echo "FAIL lean: SONAME"; failed=$((failed+1))
  fi
  nsyms=$(nm -D --defined-only "$lean_tgt/release/libblkio.so" | awk '$2=="T" && $3 ~ /^blkio/' | wc -l)
  if [ "$nsyms" -eq 45 ]; then echo "PASS lean: 45 exported blkio* functions"; passed=$((passed+1)); else echo "FAIL lean: exported functions: $nsyms"; failed=$((failed+1)); fi
  # No COW codec, HTTP client or TLS made it into the lean library (zstd's C symbols would show
  # in the dynamic symbol table only if exported, so look at all symbols of the unstripped file);
  # the full library has them (the control). From files, not `nm | grep -q`: under pipefail,
  # grep's early exit kills nm and hides the match.
  pat='zstd|brotli|snapblk_snapshot|snapblk_remote|ureq|rustls'
  nm "$lean_tgt/release/libblkio.so" > "$work/lean.nm" 2>&1
  nm "$tgt/release/libblkio.so" > "$work/full.nm" 2>&1
  if grep -qiE "$pat" "$work/lean.nm"; then
    echo "FAIL lean: snapshot driver, COW codecs or the HTTP/TLS stack linked in"; failed=$((failed+1))
  elif ! grep -q snapblk_remote "$work/full.nm" || ! grep -q rustls "$work/full.nm"; then
    echo "FAIL full library: no snapblk_remote / rustls symbols (the lean check's control)"; failed=$((failed+1))
  else
    echo "PASS lean: no snapshot driver, COW codec or HTTP/TLS symbols (the full library has them)"; passed=$((passed+1))
  fi
  # Every check of capi_test.c uses the io_uring driver: all of them apply.
  out=$(LD_LIBRARY_PATH="$lean" "$work/capi_test" "$shm" "$disk" 2>&1); rc=$?
  echo "$out" | sed 's/^\(PASS\|FAIL\) /\1 lean: /'
  p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
  passed=$((passed+p)); failed=$((failed+f))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL lean: capi_test exited $rc"; failed=$((failed+1)); fi
  out=$(LD_LIBRARY_PATH="$lean" "$work/drivers_test" +io_uring -snapshot -sync -null -nvme-io_uring -virtio-blk-vhost-user -virtio-blk-vhost-vdpa -virtio-blk-vfio-pci -rbd -s3 -http 2>&1)
  echo "$out" | sed 's/^\(PASS\|FAIL\) /\1 lean: /'
  p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
  passed=$((passed+p)); failed=$((failed+f))
  [ "$p" -gt 0 ] || { echo "FAIL lean: drivers_test ran no check"; failed=$((failed+1)); }
else
  echo "FAIL cargo build -p snapblk-capi --no-default-features --features io_uring"; failed=$((failed+1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
