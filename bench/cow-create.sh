#!/usr/bin/env bash
# Benchmark `snapblk cow create` against the anchor figures for Android's COW writer (not a test).
#
# Builds a change-heavy ext4 image pair with bench/cow/make-pair.py (op mix close to the anchor
# pair: ~78% COPY, ~11% REPLACE, ~7% XOR, ~4% ZERO, ~70 MiB of blocks to compress and a 29.8 MB
# v2 lz4 COW at 512 MiB, vs 30.4 MB for the anchor),
# then for v2 lz4/zstd/gz(9) and v3 lz4/zstd-64K, with 1 and 2 threads, runs
# `snapblk cow create --json --time-writer` REPEAT times and keeps the best of each figure:
#
#   gen     diff + order + compress + write (images already mapped)
#   writer  the writer stage alone given the computed op list (every payload encoded here):
#           what the anchor measures for Android's writer ("same op list")
#   e2e     the whole command, including mapping both images
#
# "per CPU-s" columns divide by CPU time (all threads) instead of wall time: on a shared
# machine they show the work per byte independent of other jobs (for 1 thread they are what an
# idle machine's wall time would be; for 2 threads they hide the parallel speed-up).
# Image MB/s = new image bytes / seconds; data MB/s = bytes handed to the compressor
# ((REPLACE + XOR blocks) x 4096) / seconds, as in the anchor table. "x anchor" = our writer
# image MB/s / Android's (1 thread), for the same format and codec.
#
# Usage: bench/cow-create.sh [WORKDIR]   (default /dev/shm/snapblk-cow-bench; use tmpfs)
# Env:   SIZES ("512 1024", MiB), REPEAT (3), SNAPBLK (release binary; built if unset),
#        KEEP=1 keeps the images.
set -euo pipefail

WORK=${1:-/dev/shm/snapblk-cow-bench}
SIZES=${SIZES:-512 1024}
REPEAT=${REPEAT:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [[ -z "${SNAPBLK:-}" ]]; then
  (cd "$ROOT" && cargo build --release -q -p snapblk-cli)
  SNAPBLK=$ROOT/target/release/snapblk
fi
command -v mke2fs >/dev/null || { echo "mke2fs missing (apt-get install e2fsprogs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 missing" >&2; exit 1; }

for mb in $SIZES; do
  dir=$WORK/$mb
  rm -rf "$dir"; mkdir -p "$dir"
  echo "== building the ${mb} MiB pair" >&2
  python3 "$ROOT/bench/cow/make-pair.py" "$dir" "$mb" 2>&1 | grep -v '^Creating' >&2
  cd "$dir"
  # How many cores this run really gets: one sha256sum of the new image vs two at once.
  t1=$( { /usr/bin/time -f %e sha256sum new.img >/dev/null; } 2>&1 )
  t2=$( { /usr/bin/time -f %e bash -c 'sha256sum new.img >/dev/null & sha256sum new.img >/dev/null; wait'; } 2>&1 )
  echo "effective cores: $(python3 -c "print(f'{2 * $t1 / $t2:.2f}')") (sha256sum x1 ${t1}s, x2 concurrently ${t2}s); load: $(cut -d' ' -f1-3 /proc/loadavg)"
  out=()
  for cfg in "v2 lz4" "v2 zstd" "v2 gz" "v3 lz4" "v3 zstd 65536"; do
    set -- $cfg
    for t in 1 2; do
      args=(--format "$1" --compression "$2" --threads "$t")
      [[ -n "${3:-}" ]] && args+=(--unit "$3")
      js=()
      for ((k = 0; k < REPEAT; k++)); do
        js+=("$("$SNAPBLK" cow create --old old.img --new new.img -o bench.cow --json --time-writer "${args[@]}")")
      done
      "$SNAPBLK" cow verify bench.cow --base old.img --expect new.img > /dev/null
      out+=("$(python3 - "$cfg" "$("$SNAPBLK" cow inspect --json bench.cow)" "${js[@]}" <<'PY'
import json, sys
cfg, ins = sys.argv[1], json.loads(sys.argv[2])
runs = [json.loads(a) for a in sys.argv[3:]]
best = lambda k: min(r[k] for r in runs)
r = runs[0]
print(json.dumps(dict(cfg=cfg, threads=r["threads"], new=r["new_blocks"] * 4096,
    data=r["compressed_input_bytes"], cow=r["cow_bytes"], gen=best("seconds_generate"),
    writer=best("seconds_writer_only"), wcpu=best("cpu_seconds_writer_only"),
    gcpu=min(r["cpu_seconds_plan"] + r["cpu_seconds_order"] + r["cpu_seconds_write"] for r in runs), e2e=best("seconds_total"), plan=best("seconds_plan"),
    order=best("seconds_order"), by_type={k: [v["ops"], v["payload_bytes"]] for k, v in ins["by_type"].items()})))
PY
)")
      rm -f bench.cow
    done
  done
  python3 - "$mb" "${out[@]}" <<'PY'
import json, sys
mb, rows = sys.argv[1], [json.loads(a) for a in sys.argv[2:]]
# Android's writer, same op list, 1 thread, 512 MiB anchor pair (image MB/s, data MB/s, COW MB).
anchor = {"v2 lz4": (5516, 760, 30.4), "v2 zstd": (2483, 342, 24.2), "v2 gz": (310, 43, 23.6),
          "v3 lz4": (7366, 1014, 30.4), "v3 zstd 65536": (4106, 565, 21.3)}
r0 = rows[0]
bt = r0["by_type"]
nops = sum(v[0] for v in bt.values())
print(f"\n### {mb} MiB pair: {nops} ops: " + ", ".join(f"{v[0]} {k.upper()}" for k, v in bt.items())
      + f"; {r0['data'] / 2**20:.1f} MiB to compress\n")
print("| config | threads | writer image MB/s | writer data MB/s | x anchor | writer image MB/s per CPU-s | gen image MB/s | gen per CPU-s | e2e image MB/s | COW MB (anchor) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    a = anchor[r["cfg"]]
    name = r["cfg"].replace("65536", "64K")
    wi, wd = r["new"] / r["writer"] / 1e6, r["data"] / r["writer"] / 1e6
    print(f"| {name} | {r['threads']} | {wi:.0f} | {wd:.0f} | {wi / a[0]:.2f} | {r['new'] / r['wcpu'] / 1e6:.0f} "
          f"| {r['new'] / r['gen'] / 1e6:.0f} | {r['new'] / r['gcpu'] / 1e6:.0f} "
          f"| {r['new'] / r['e2e'] / 1e6:.0f} | {r['cow'] / 1e6:.1f} ({a[2]}) |")
types = sorted({k for r in rows for k in r["by_type"]})
print("\nCOW payload size per op type, MB (ops), from `cow inspect --json`; the rest of the file is op records and headers:\n")
print("| config | " + " | ".join(t.upper() for t in types) + " | COW MB |")
print("|---|" + "---|" * (len(types) + 1))
for r in rows:
    if r["threads"] != rows[0]["threads"]:
        continue
    cells = [f"{r['by_type'][t][1] / 1e6:.2f} ({r['by_type'][t][0]})" if t in r["by_type"] else "-" for t in types]
    print(f"| {r['cfg'].replace('65536', '64K')} | " + " | ".join(cells) + f" | {r['cow'] / 1e6:.1f} |")
PY
  cd /
  [[ "${KEEP:-0}" == 1 ]] || rm -rf "$dir"
done
