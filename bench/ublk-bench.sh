#!/usr/bin/env bash
# ublk benchmark in the test VM (tests/vm/vm.sh): 4 KiB random reads, QD1 and QD32, through
#   loop            the kernel loop device on base.img (the reference)
#   file-*          /dev/ublkbN serving base.img as a plain file: copy, zero-copy (planned reads:
#                   one io_uring read from base.img into the request pages), zero-copy without the
#                   planner (generic path + one copy through /dev/ublkcN)
#   snap-<cow>-*    /dev/ublkbN serving base.img + a COW made by `snapblk cow create`:
#                   copy (COPY ops only: new = base rotated by 1 MiB), zero (ZERO ops),
#                   replace-lz4 (compressible new data, lz4), replace-none (uncompressed REPLACE)
#   with REALISTIC_MB=N (e.g. 64): also the change-heavy ext4 pair of bench/cow/make-pair.py
#   (N MiB), served as base old.img + a v3 lz4 COW from `cow create` (COPY, XOR, REPLACE, ZERO:
#   snap-realistic-*) against the same export of the raw new image (new-*) and loop on it
#   (loop-new): realistic-COW reads through ublk against the raw image; snap-realistic-zc-norec
#   serves the same COW with --no-record (the other snap-* rows check blocks against the COW
#   record that `cow create` writes beside each COW, as `serve` does by default).
# Reports IOPS and the VM's busy CPU time per I/O (server + kernel + load generator) and ratios
# against loop. Under TCG (software emulation) absolute numbers are meaningless; ratios are not.
# Env: SIZE_MB (32), SECS (2 per run), ROUNDS (3), VM_SMP (1), VM_MEM; ROWS=realistic (with
# REALISTIC_MB) runs only the realistic pair's rows, for more rounds in the same time. Output
# also saved in bench/results/scratch/.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${SIZE_MB:-32}
SECS=${SECS:-2}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-all}
case $ROWS in all | realistic) ;; *) echo "ROWS must be all or realistic"; exit 2 ;; esac
if [ "$ROWS" = realistic ] && [ -z "${REALISTIC_MB:-}" ]; then echo "ROWS=realistic needs REALISTIC_MB"; exit 2; fi
# One vCPU by default: under TCG, cross-vCPU wake-ups cost milliseconds and swamp QD1 latency;
# with one vCPU the time per I/O tracks the instructions executed per I/O.
export VM_SMP=${VM_SMP:-1}

tgt=${CARGO_TARGET_DIR:-target}
[ -n "${UBLK_BENCH_NO_BUILD:-}" ] || cargo build --release -q -p snapblk-cli --bin snapblk -p snapblk-ublk --example ublk-loadgen
bash tests/vm/vm.sh setup

P=$(mktemp -d "${TMPDIR:-/tmp}/snapblk-ublk-bench.XXXXXX")
trap 'rm -rf "$P"' EXIT
mkdir -p "$P/bin" "$P/img"
strip -o "$P/bin/snapblk" "$tgt/release/snapblk"
strip -o "$P/bin/ublk-loadgen" "$tgt/release/examples/ublk-loadgen"
I=$P/img
dd if=/dev/urandom of="$I/base.img" bs=1M count="$SIZE_MB" status=none
S=$tgt/release/snapblk
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
if [ -n "${REALISTIC_MB:-}" ]; then
  python3 bench/cow/make-pair.py "$P/pair" "$REALISTIC_MB" >&2
  $S cow create --old "$P/pair/old.img" --new "$P/pair/new.img" -o "$I/realistic.cow"
  mv "$P/pair/old.img" "$I/realistic-old.img"; mv "$P/pair/new.img" "$I/realistic-new.img"
  rm -rf "$P/pair"
fi
{ echo '#!/bin/sh'; echo "SECS=$SECS ROUNDS=$ROUNDS ROWS=$ROWS exec /test/bench.sh"; } > "$P/run.sh"
cp bench/ublk-bench-guest.sh "$P/bench.sh"
chmod +x "$P/bench.sh"
chmod +x "$P/run.sh"
ls -la "$I"

VM_MEM=${VM_MEM:-2G} VM_TIMEOUT=${VM_TIMEOUT:-1800} \
    VM_APPEND="${VM_APPEND:-}" bash tests/vm/vm.sh run "$P" || { echo "guest benchmark failed"; exit 1; }

mkdir -p bench/results/scratch
out=bench/results/scratch/ublk-bench-$(date +%Y%m%d-%H%M%S).txt
grep -a '^BENCH ' tests/vm/cache/last-run.log | awk '
function num(s, k,   m) { m = s; sub(".*\"" k "\":", "", m); sub("[,}].*", "", m); return m + 0 }
function median(arr, key, cnt,   i, j, t, v) {   # median of arr[key, 1..cnt]
  for (i = 1; i <= cnt; i++) v[i] = arr[key, i]
  for (i = 1; i <= cnt; i++) for (j = i + 1; j <= cnt; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
  return cnt % 2 ? v[(cnt + 1) / 2] : (v[cnt / 2] + v[cnt / 2 + 1]) / 2 }
{ name = $2; j = $0; sub("^BENCH [^ ]+ ", "", j); if (j !~ /iops/) next; qd = num(j, "qd"); k = name SUBSEP qd
  c = ++cnt[k]; iops[k, c] = num(j, "iops"); cpu[k, c] = num(j, "sys_cpu_us_per_io")
  if (!(name in seen)) { seen[name] = 1; order[++n] = name } }
END {
  for (k in cnt) { I[k] = median(iops, k, cnt[k]); U[k] = median(cpu, k, cnt[k]) }
  ref = (("loop" SUBSEP 1) in cnt) ? "loop" : "loop-new"
  printf "medians of %d rounds; ratios against %s (IOPS: higher is better; CPU: lower is better)\n", cnt[ref SUBSEP 1], ref
  printf "%-24s %9s %7s %10s %7s | %9s %7s %10s %7s\n", "device", "QD1 IOPS", "x " ref, "CPU us/IO", "x " ref, "QD32 IOPS", "x " ref, "CPU us/IO", "x " ref
  for (i = 1; i <= n; i++) { d = order[i]; line = sprintf("%-24s", d)
    for (q = 1; q <= 32; q += 31) { k = d SUBSEP q; l = ref SUBSEP q
      line = line sprintf(" %9.0f %7.2f %10.1f %7.2f", I[k], I[l] ? I[k] / I[l] : 0, U[k], U[l] ? U[k] / U[l] : 0); if (q == 1) line = line " |" }
    print line }
  # The realistic COW against the same export of the raw new image, paired per round (the
  # rounds interleave all rows, so each round is a pair measured minutes apart at most).
  split("snap-realistic-copy new-copy snap-realistic-zc new-zc snap-realistic-zc-norec new-zc", P, " ")
  for (p = 1; p <= 6; p += 2) for (q = 1; q <= 32; q += 31) {
    a = P[p] SUBSEP q; b = P[p + 1] SUBSEP q; m = cnt[a] < cnt[b] ? cnt[a] : cnt[b]
    if (m == 0) continue
    lo = 1e9; hi = 0; rs = ""
    for (r = 1; r <= m; r++) { x = iops[b, r] ? iops[a, r] / iops[b, r] : 0; R[P[p] q, r] = x
      if (x < lo) lo = x; if (x > hi) hi = x; rs = rs sprintf(" %.2f", x) }
    printf "%s / %s QD%d, paired per round: median %.2fx [%.2f-%.2f] (rounds:%s)\n", P[p], P[p + 1], q, median(R, P[p] q, m), lo, hi, rs }
}' | tee "$out"
echo "saved $out (raw lines: grep ^BENCH tests/vm/cache/last-run.log)"
