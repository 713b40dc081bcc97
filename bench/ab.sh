#!/usr/bin/env bash
# Old against new: builds libblkio.so.1 at two revisions and runs them interleaved in one
# `snapblk bench` run (its --libblkio LABEL=PATH, repeated, alternates the libraries inside every
# round), then reports for each configuration the median of the per-round paired IOPS ratios
# new/old and their range. The way to check that a change to a hot path kept its speed: the
# host's run-to-run spread (11-17 %) is much wider than what a paired ratio resolves.
# Workloads, on tmpfs (/dev/shm):
#   io_uring   4 KiB random reads of a 256 MiB file, QD1 and QD32 (the driver's two paths:
#              inline preadv2 at QD1, the ring at QD32)
#   snapshot   4 KiB random and sequential reads, QD1, of the snapshot driver serving a realistic
#              ext4 update (bench/cow/make-pair.py, COPY/XOR/REPLACE/ZERO; lz4 COW written by
#              the new build's `snapblk cow create`)
# usage: bench/ab.sh OLD_REV [NEW_REV]      (NEW_REV defaults to the work tree's HEAD)
# env:   ROUNDS (default 7), SECS per run (default 2), MIB snapshot image size (default 128;
#        make-pair.py needs about 100 or more),
#        WORKLOADS (comma list, default io_uring,snapshot),
#        AB_TARGET (cargo target dir shared by both builds, default /var/tmp/snapblk-ab-target),
#        CALLGRIND=0 skips the instruction counts (valgrind)
# results: bench/results/scratch/ab-<time>.json (both bench documents and the ratios)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
old_rev=${1:?usage: bench/ab.sh OLD_REV [NEW_REV]}
new_rev=${2:-HEAD}
ROUNDS=${ROUNDS:-7}; SECS=${SECS:-2}; MIB=${MIB:-128}
WORKLOADS=${WORKLOADS:-io_uring,snapshot}
want() { [[ ",$WORKLOADS," == *",$1,"* ]]; }
target=${AB_TARGET:-/var/tmp/snapblk-ab-target}
old_sha=$(git rev-parse --verify "$old_rev^{commit}")
new_sha=$(git rev-parse --verify "$new_rev^{commit}")
work=$(mktemp -d /tmp/snapblk-ab.XXXXXX)
data=/dev/shm/snapblk-ab
trees=()
cleanup() {
  for t in "${trees[@]}"; do git -C "$root" worktree remove --force "$t" 2>/dev/null || true; done
  rm -rf "$work" "$data"
}
trap cleanup EXIT

# build LABEL SHA: libblkio.so.1 (and the CLI) of SHA into $work/LABEL
build() {
  local label=$1 sha=$2 src="$work/src-$1"
  git -C "$root" worktree add --detach -q "$src" "$sha"
  trees+=("$src")
  echo "building $label ($sha)" >&2
  (cd "$src" && CARGO_TARGET_DIR="$target" cargo build --release -q -p snapblk-capi -p snapblk-cli)
  mkdir -p "$work/$label"
  cp "$target/release/libblkio.so" "$work/$label/libblkio.so.1"
  cp "$target/release/snapblk" "$work/$label/snapblk"
}
build old "$old_sha"
build new "$new_sha"
snapblk="$work/new/snapblk"
libs=(--libblkio "old=$work/old/libblkio.so.1" --libblkio "new=$work/new/libblkio.so.1")
mkdir -p "$data" "$root/bench/results/scratch"
stamp=$(date -u +%Y-%m-%dT%H%M)
out="$root/bench/results/scratch/ab-$stamp.json"
docs=()

if want io_uring; then
  head -c $((256 << 20)) /dev/urandom > "$data/file.img"
  "$snapblk" bench "${libs[@]}" --driver io_uring "$data/file.img" --rw randread --bs 4k \
    --iodepth 1,32 --runtime "$SECS" --time_based --repeat "$ROUNDS" --json -o "$work/io_uring.json" >/dev/null
  docs+=("$work/io_uring.json")
fi
if want snapshot; then
  python3 bench/cow/make-pair.py "$data/pair" "$MIB" >/dev/null
  "$snapblk" cow create --old "$data/pair/old.img" --new "$data/pair/new.img" \
    --compression lz4 -o "$data/pair/update.cow" >/dev/null
  rm "$data/pair/new.img"
  "$snapblk" bench "${libs[@]}" --driver snapshot --prop "base=$data/pair/old.img" \
    --prop "cow=$data/pair/update.cow" --rw randread,read --bs 4k --iodepth 1 \
    --runtime "$SECS" --time_based --repeat "$ROUNDS" --json -o "$work/snapshot.json" >/dev/null
  docs+=("$work/snapshot.json")
fi

# User-space instructions per 4 KiB QD1 read inside each library's request calls (callgrind,
# counting only inside blkioq_* — blkioq_read and blkioq_do_io with everything they call — so
# the load generator's own timing calibration does not blur it): Ir of a pass over 24 MiB minus
# a pass over 8 MiB, divided by the 4096 reads between. Free of the timing noise of a shared
# machine; kernel work is not counted.
ir_file="$work/ir.txt"; : > "$ir_file"
if [ "${CALLGRIND:-1}" != 0 ] && command -v valgrind >/dev/null; then
  ir() { # LIB ARGS... -> Ir of one run
    local f="$work/cg.out" lib=$1; shift
    valgrind --tool=callgrind --toggle-collect='blkioq_*' --callgrind-out-file="$f" "$snapblk" bench --libblkio "$lib" "$@" \
      --bs 4k --iodepth 1 >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$f"
  }
  cases=()
  want io_uring && cases+=("io_uring randread|--driver io_uring $data/file.img --rw randread")
  want snapshot && cases+=("snapshot randread|--driver snapshot --prop base=$data/pair/old.img --prop cow=$data/pair/update.cow --rw randread"
                           "snapshot read|--driver snapshot --prop base=$data/pair/old.img --prop cow=$data/pair/update.cow --rw read")
  for c in "${cases[@]}"; do
    name=${c%%|*}; read -r -a args <<< "${c#*|}"
    for lib in old new; do
      a=$(ir "$work/$lib/libblkio.so.1" "${args[@]}" --size 8M)
      b=$(ir "$work/$lib/libblkio.so.1" "${args[@]}" --size 24M)
      echo "$name $lib $(( (b - a) / 4096 ))" >> "$ir_file"
    done
  done
fi

python3 - "$out" "$old_rev" "$old_sha" "$new_rev" "$new_sha" "$ir_file" "${docs[@]}" <<'EOF'
import json, statistics, sys
out, old_rev, old_sha, new_rev, new_sha, ir_file, *docs = sys.argv[1:]
rows, kept = [], []
for path in docs:
    doc = json.load(open(path))
    kept.append(doc)
    by = {}
    for r in doc["results"]:
        c = r["config"]
        key = (r["target"]["driver"], c.get("rw"), c.get("bs"), c.get("iodepth"))
        by.setdefault(key, {})[r["library"]] = [x["iops"] for x in r["runs"]]
    for key, libs in by.items():
        old, new = libs["old"], libs["new"]
        ratios = [n / o for o, n in zip(old, new) if o > 0]
        rows.append({"driver": key[0], "rw": key[1], "bs": key[2], "iodepth": key[3],
                     "old_iops_median": statistics.median(old),
                     "new_iops_median": statistics.median(new),
                     "paired_ratio_median": statistics.median(ratios),
                     "paired_ratio_min": min(ratios), "paired_ratio_max": max(ratios),
                     "rounds": len(ratios)})
print(f"old {old_rev} ({old_sha[:10]})  new {new_rev} ({new_sha[:10]})")
print(f"{'driver':9} {'rw':9} {'bs':>5} {'qd':>3} {'old IOPS':>10} {'new IOPS':>10} "
      f"{'new/old (paired median, range)':>32}")
for r in rows:
    print(f"{r['driver']:9} {r['rw']:9} {r['bs']:>5} {r['iodepth']:>3} "
          f"{r['old_iops_median']:>10.0f} {r['new_iops_median']:>10.0f} "
          f"{r['paired_ratio_median']:>12.3f}  ({r['paired_ratio_min']:.3f}-{r['paired_ratio_max']:.3f})")
ir = {}
for line in open(ir_file):
    *name, lib, n = line.split()
    ir.setdefault(" ".join(name), {})[lib] = int(n)
if ir:
    print(f"\nuser-space instructions per 4 KiB QD1 read inside blkioq_* (callgrind)")
    for name, v in ir.items():
        print(f"{name:20} old {v['old']:>7}  new {v['new']:>7}  new/old {v['new'] / v['old']:.3f}")
json.dump({"old": {"rev": old_rev, "commit": old_sha}, "new": {"rev": new_rev, "commit": new_sha},
           "ratios": rows, "ir_per_read": ir, "bench": kept}, open(out, "w"), indent=1)
print(f"results: {out}")
EOF
