#!/usr/bin/env bash
# Peak RSS of `snapblk ota cow`, `ota apply` and `ota extract` on one large partition, against
# the bounds docs/ota.md states (a script, not a test; never run by CI: CI's
# crates/cli/tests/ota_cow_memory.rs checks on 8 and 32 MiB partitions that memory does not
# grow with the partition).
#
# 1. Makes a pair of SIZE_MiB images (default 512, sparse): old = 16 MiB of random data, then
#    zeros; new = the old 16 MiB in place, the old first 8 MiB again (moved), 16 MiB of new
#    random data, then zeros. `snapblk ota generate` (release build) makes two incremental
#    payloads of the pair (Virtual A/B metadata for COW v3 lz4, and for v2 gz) and a full one
#    of the new image.
# 2. Runs under /usr/bin/time, 2 threads each: `ota cow --verify` (v3 lz4), `ota cow` (v2 gz),
#    `ota apply` and `ota extract`; checks every output (cmp with the new image; --verify
#    checks the snapshot view's SHA-256).
# 3. Prints each run's peak RSS and wall time against its bound: apply and extract, threads x
#    (largest operation's source + destination) + 64 MiB (the largest operations here: a
#    16 MiB SOURCE_COPY for apply, 2 MiB chunks for extract); ota cow, 150 MiB (it builds the
#    image as apply does, then writes the COW and its record streaming from the files; one
#    image is SIZE_MiB). Exits 1 if a run is over its bound.
#
# Usage: bench/ota-memory.sh [WORKDIR] [SIZE_MiB]
#   WORKDIR default /dev/shm (the files go to a new directory in it, removed at exit).
#   Env: SNAPBLK (release binary; built if unset).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=${1:-/dev/shm}
SIZE=${2:-512}
THREADS=2
(( SIZE >= 48 )) || { echo "SIZE_MiB must be at least 48" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "/usr/bin/time missing (apt-get install time)" >&2; exit 1; }
if [[ -z "${SNAPBLK:-}" ]]; then
  (cd "$ROOT" && cargo build --release -q -p snapblk-cli)
  SNAPBLK=${CARGO_TARGET_DIR:-$ROOT/target}/release/snapblk
fi

mkdir -p "$BASE"
WORK=$(mktemp -d "$BASE/snapblk-ota-memory.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/old" "$WORK/new"
old=$WORK/old/system.img new=$WORK/new/system.img
head -c $((16 << 20)) /dev/urandom > "$WORK/a"
head -c $((16 << 20)) /dev/urandom > "$WORK/b"
cp "$WORK/a" "$old"
truncate -s "${SIZE}M" "$old"
cp "$WORK/a" "$new"
dd if="$WORK/a" of="$new" bs=1M count=8 seek=16 conv=notrunc status=none
dd if="$WORK/b" of="$new" bs=1M seek=24 conv=notrunc status=none
truncate -s "${SIZE}M" "$new"
gen() { "$SNAPBLK" --quiet ota generate --threads "$THREADS" "$@" > /dev/null; }
echo "generating payloads of the $SIZE MiB pair" >&2
gen --source "$WORK/old" --target "$WORK/new" -o "$WORK/lz4.bin"
gen --source "$WORK/old" --target "$WORK/new" -o "$WORK/gz.bin" --cow-version 2 --vabc-compression gz
gen --target "$WORK/new" -o "$WORK/full.bin"

declare -a NAMES LIMITS
declare -A CMD RSS WALL
add() { NAMES+=("$1"); LIMITS+=("$2"); CMD[$1]=$3; }
add "ota cow v3 lz4 --verify" 150 \
  "$SNAPBLK --quiet ota cow $WORK/lz4.bin --source $WORK/old -o $WORK/cow-lz4 --threads $THREADS --verify"
add "ota cow v2 gz" 150 \
  "$SNAPBLK --quiet ota cow $WORK/gz.bin --source $WORK/old -o $WORK/cow-gz --threads $THREADS"
add "ota apply" $((THREADS * (16 + 16) + 64)) \
  "$SNAPBLK --quiet ota apply $WORK/lz4.bin --source $WORK/old -o $WORK/applied --threads $THREADS"
add "ota extract" $((THREADS * (2 + 2) + 64)) \
  "$SNAPBLK --quiet ota extract $WORK/full.bin -o $WORK/extracted --threads $THREADS"
for n in "${NAMES[@]}"; do
  # shellcheck disable=SC2086 # the command is split on purpose
  /usr/bin/time -f '%e %M' -o "$WORK/time.txt" ${CMD[$n]} > /dev/null
  read -r e m < "$WORK/time.txt"
  WALL[$n]=$e RSS[$n]=$((m / 1024))
done
for d in applied extracted; do
  cmp "$WORK/$d/system.img" "$new" || { echo "$d: not the new image" >&2; exit 1; }
done

echo "peak RSS on a $SIZE MiB partition ($THREADS threads; $("$SNAPBLK" --version))"
printf '%-26s %13s %10s %8s\n' run "peak RSS MiB" "bound MiB" "wall s"
over=0
for i in "${!NAMES[@]}"; do
  n=${NAMES[$i]} l=${LIMITS[$i]}
  flag=""
  if (( RSS[$n] >= l )); then flag="  OVER"; over=1; fi
  printf '%-26s %13s %10s %8s%s\n' "$n" "${RSS[$n]}" "$l" "${WALL[$n]}" "$flag"
done
exit "$over"
