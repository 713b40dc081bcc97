#!/usr/bin/env bash
# Benchmark `snapblk cow create` on a realistic pair of ext4 images (not a test).
#
# Builds two versions of a directory tree (a /usr/lib subset; version 2 has files deleted,
# edited in place, appended to, rewritten, a directory renamed and new files added), makes
# ext4 images of IMG_MB MiB from them with `mke2fs -d` (fixed UUID/hash seed/time so the
# metadata is stable), then creates COWs in several formats and reports, per run: seconds,
# GB/s of new image (generate only, and end to end including reading both images), the COW
# size, and op counts / payload bytes per op type.
#
# Usage: bench/cow-create.sh [WORKDIR]   (default /dev/shm/snapblk-cow-bench; use tmpfs)
# Env:   IMG_MB (1024), CONTENT_MB (700), SNAPBLK (path to a release binary; built if unset),
#        KEEP=1 to keep the work directory.
set -euo pipefail

WORK=${1:-/dev/shm/snapblk-cow-bench}
IMG_MB=${IMG_MB:-1024}
CONTENT_MB=${CONTENT_MB:-700}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

if [[ -z "${SNAPBLK:-}" ]]; then
  (cd "$ROOT" && cargo build --release -q -p snapblk-cli)
  SNAPBLK=$ROOT/target/release/snapblk
fi
command -v mke2fs >/dev/null || { echo "mke2fs missing (apt-get install e2fsprogs)" >&2; exit 1; }

rm -rf "$WORK"
mkdir -p "$WORK/v1" "$WORK/v2"
cd "$WORK"

echo "== building trees (${CONTENT_MB} MiB of /usr/lib files)" >&2
# Deterministic file list: sorted paths, regular files, until CONTENT_MB is reached.
find /usr/lib -xdev -type f -size -64M -printf '%s\t%p\n' 2>/dev/null | sort -k2 |
  awk -v lim=$((CONTENT_MB * 1024 * 1024)) -F'\t' '{ if (tot + $1 > lim) exit; tot += $1; print $2 }' > files.txt || true
# (pipelines cut short by awk/head end with SIGPIPE upstream; unreadable files are skipped)
tar -cf - -T files.txt 2>/dev/null | tar -xf - -C v1 || true
cp -a v1/. v2/

# Version 2: deterministic edits chosen by position in the file list.
i=0
while IFS= read -r f; do
  i=$((i + 1))
  p="v2/${f#/}"
  [[ -f "$p" ]] || continue
  sz=$(stat -c %s "$p")
  if (( i % 37 == 0 )); then
    rm -f "$p"
  elif (( i % 23 == 0 && sz > 8192 )); then
    # Edit 100 bytes in the middle (XOR / REPLACE candidates).
    printf 'snapblk-edit-%08d-%s' "$i" "$(printf '%087d' 0)" | dd of="$p" bs=1 seek=$((sz / 2)) conv=notrunc status=none
  elif (( i % 29 == 0 )); then
    head -c 10240 "/usr/lib/os-release" >> "$p" 2>/dev/null || printf 'appended %d\n' "$i" >> "$p"
  elif (( i % 101 == 0 )); then
    # Rewritten file: new content of the same size.
    head -c "$sz" /dev/zero | tr '\0' 'x' | sed "s/xxxxxxxx/v2-$i-/g" > "$p.tmp" && mv "$p.tmp" "$p"
  fi
done < files.txt
# A renamed directory moves its files elsewhere in the new image (COPY from another offset).
d=$(cd v2 && find usr/lib -mindepth 2 -maxdepth 2 -type d | sort | sed -n '5p')
[[ -n "$d" ]] && mv "v2/$d" "v2/${d}-renamed"
# New files.
mkdir -p v2/usr/share/newdata
find /usr/share -xdev -type f -size -4M -printf '%p\n' 2>/dev/null | sort | head -3000 > new-files.txt || true
tar -cf - -T new-files.txt 2>/dev/null | tar -xf - -C v2/usr/share/newdata || true

echo "== mke2fs -d (${IMG_MB} MiB images)" >&2
mk() {
  E2FSPROGS_FAKE_TIME=1700000000 mke2fs -q -F -t ext4 -b 4096 -m 0 \
    -U 6f1c0000-0000-4000-8000-000000000001 -E root_owner=0:0,hash_seed=6f1c0000-0000-4000-8000-000000000002 \
    -d "$1" "$2" "${IMG_MB}M"
}
mk v1 old.img
mk v2 new.img
rm -rf v1 v2
NEW_BYTES=$(stat -c %s new.img)

echo "new image: $NEW_BYTES bytes; best of ${REPEAT:-3} runs per config" >&2
printf '\n%-22s %7s %7s %8s %8s %8s  %s\n' config threads gen_s GB/s_gen GB/s_e2e cow_MB "per op type: ops / payload MB"

run() {
  local name=$1; shift
  local js=()
  for ((k = 0; k < ${REPEAT:-3}; k++)); do
    js+=("$("$SNAPBLK" cow create --old old.img --new new.img -o "$name.cow" --json "$@")")
  done
  "$SNAPBLK" cow verify "$name.cow" --base old.img --expect new.img > /dev/null
  local ins
  ins=$("$SNAPBLK" cow inspect --json "$name.cow")
  python3 - "$name" "$NEW_BYTES" "$ins" "${js[@]}" <<'PY'
import json, sys
name, nb, ins = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
runs = [json.loads(a) for a in sys.argv[4:]]
j = min(runs, key=lambda r: r["seconds_generate"])   # best of REPEAT (shared machine)
g, t = j["seconds_generate"], min(r["seconds_total"] for r in runs)
bt = ins["by_type"]
print(f'{name:<22} {j["threads"]:>7} {g:7.3f} {nb/g/1e9:8.2f} {nb/t/1e9:8.2f} {j["cow_bytes"]/1e6:8.2f}  '
      + "  ".join(f'{k} {v["ops"]} ops/{v["payload_bytes"]/1e6:.2f} MB' for k, v in bt.items())
      + f'  cycles {j["cycle_breaks"]}')
PY
  rm -f "$name.cow"
}
run v2-lz4 --format v2 --compression lz4
run v2-zstd --format v2 --compression zstd
run v2-gz --format v2 --compression gz
run v3-lz4 --format v3 --compression lz4
run v3-zstd-64k --format v3 --compression zstd --unit 65536
run v3-lz4-1thread --format v3 --compression lz4 --threads 1
run v3-zstd-64k-1thread --format v3 --compression zstd --unit 65536 --threads 1
run v3-none-noxor --format v3 --compression none --no-xor

[[ "${KEEP:-0}" == 1 ]] || { cd /; rm -rf "$WORK"; }
