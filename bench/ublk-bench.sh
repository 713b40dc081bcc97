#!/usr/bin/env bash
# ublk benchmark in the test VM (tests/vm/vm.sh): 4 KiB random reads, QD1 and QD32, through
#   loop            the kernel loop device on base.img (the reference)
#   file-*          /dev/ublkbN serving base.img as a plain file: copy, zero-copy (planned reads:
#                   one io_uring read from base.img into the request pages), zero-copy without the
#                   planner (generic path + one copy through /dev/ublkcN)
#   snap-<cow>-*    /dev/ublkbN serving base.img + a COW made by `snapblk cow create`:
#                   copy (COPY ops only: new = base rotated by 1 MiB), zero (ZERO ops),
#                   replace-lz4 (compressible new data, lz4), replace-none (uncompressed REPLACE)
# Reports IOPS and the VM's busy CPU time per I/O (server + kernel + load generator) and ratios
# against loop. Under TCG (software emulation) absolute numbers are meaningless; ratios are not.
# Env: SIZE_MB (64), SECS (3 per run), VM_SMP, VM_MEM. Output also saved in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${SIZE_MB:-64}
SECS=${SECS:-3}

cargo build --release -q -p snapblk-cli -p snapblk-ublk --example ublk-loadgen
bash tests/vm/vm.sh setup

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-ublk-bench.XXXXXX")
trap 'rm -rf "$P"' EXIT
mkdir -p "$P/bin" "$P/img"
cp target/release/snapblk target/release/examples/ublk-loadgen "$P/bin/"
I=$P/img
dd if=/dev/urandom of="$I/base.img" bs=1M count="$SIZE_MB" status=none
S=target/release/snapblk
# COPY only: the new image is the base rotated by 1 MiB
{ tail -c +$((1024 * 1024 + 1)) "$I/base.img"; head -c $((1024 * 1024)) "$I/base.img"; } > "$P/new-copy.img"
$S cow create --old "$I/base.img" --new "$P/new-copy.img" -o "$I/copy.cow" --no-xor --compression none --no-scratch
# ZERO only
truncate -s "${SIZE_MB}M" "$P/new-zero.img"
$S cow create --old "$I/base.img" --new "$P/new-zero.img" -o "$I/zero.cow" --no-xor --no-scratch
# REPLACE: compressible text, each block distinct
awk -v n=$((SIZE_MB * 1024 * 1024 / 64)) 'BEGIN { for (i = 0; i < n; i++) printf "snapblk replace block line %036d\n", i }' > "$P/new-repl.img"
$S cow create --old "$I/base.img" --new "$P/new-repl.img" -o "$I/replace-lz4.cow" --no-xor --compression lz4 --no-scratch
$S cow create --old "$I/base.img" --new "$P/new-repl.img" -o "$I/replace-none.cow" --no-xor --compression none --no-scratch
rm -f "$P"/new-*.img
cp bench/ublk-bench-guest.sh "$P/run.sh"
chmod +x "$P/run.sh"
ls -la "$I"

VM_MEM=${VM_MEM:-2G} VM_TIMEOUT=${VM_TIMEOUT:-1800} SECS=$SECS \
    VM_APPEND="${VM_APPEND:-}" bash tests/vm/vm.sh run "$P" || { echo "guest benchmark failed"; exit 1; }

mkdir -p bench/results
out=bench/results/ublk-bench-$(date +%Y%m%d-%H%M%S).txt
grep -a '^BENCH ' tests/vm/cache/last-run.log | awk '
function num(s, k,   m) { m = s; sub(".*\"" k "\":", "", m); sub("[,}].*", "", m); return m + 0 }
{ name = $2; j = $0; sub("^BENCH [^ ]+ ", "", j); qd = num(j, "qd");
  iops[name, qd] = num(j, "iops"); cpu[name, qd] = num(j, "sys_cpu_us_per_io");
  if (!(name in seen)) { seen[name] = 1; order[++n] = name } }
END {
  printf "%-22s %10s %8s %10s %8s | %10s %8s %10s %8s\n", "device", "QD1 IOPS", "vs loop", "CPU us/IO", "vs loop", "QD32 IOPS", "vs loop", "CPU us/IO", "vs loop"
  for (i = 1; i <= n; i++) { d = order[i]; line = sprintf("%-22s", d)
    for (q = 1; q <= 32; q += 31) {
      r1 = iops["loop", q] ? iops[d, q] / iops["loop", q] : 0; r2 = cpu["loop", q] ? cpu[d, q] / cpu["loop", q] : 0
      line = line sprintf(" %10.0f %8.2f %10.1f %8.2f", iops[d, q], r1, cpu[d, q], r2); if (q == 1) line = line " |" }
    print line }
}' | tee "$out"
echo "saved $out (raw lines: grep ^BENCH tests/vm/cache/last-run.log)"
