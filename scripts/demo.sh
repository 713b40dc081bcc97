#!/usr/bin/env bash
# The main job on a small built-in example: two versions of a file tree become two ext4 images
# (old and new); snapblk creates an Android COW from them, inspects and verifies it, reads the new
# image through the snapshot device, and merges the COW into a copy of the old image in place;
# then makes an Android OTA payload of the same update (`ota generate`), applies it and writes
# the Virtual A/B COW a device would write for it (`ota cow --verify`), and mounts the
# post-update file system served from the old image and that COW (`ota serve --fuse`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release -p snapblk-cli
SNAPBLK=${CARGO_TARGET_DIR:-$PWD/target}/release/snapblk   # where cargo just built it

work=$(mktemp -d /tmp/snapblk-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== workdir $work"

# Version 1 of a tree: text, binary-ish and empty files; version 2 edits, moves, deletes and adds.
mkdir -p "$work/v1/etc" "$work/v1/lib" "$work/v1/share"
for i in $(seq 1 40); do
  seq "$i" 7 40000 > "$work/v1/lib/text$i.txt"
  head -c $((i * 3000)) /dev/urandom > "$work/v1/share/blob$i.bin"
done
echo "version=1" > "$work/v1/etc/release"
cp -a "$work/v1" "$work/v2"
echo "version=2" > "$work/v2/etc/release"
for i in 3 7 11; do sed -i 's/1/one/g' "$work/v2/lib/text$i.txt"; done       # small edits (XOR)
mv "$work/v2/share/blob5.bin" "$work/v2/share/moved5.bin"                    # moved data (COPY)
rm "$work/v2/share/blob9.bin"                                                 # freed blocks
head -c 300000 /dev/urandom > "$work/v2/share/new.bin"                        # new data (REPLACE)

mke2fs -q -t ext4 -b 4096 -E root_owner=0:0 -d "$work/v1" "$work/old.img" 16M
mke2fs -q -t ext4 -b 4096 -E root_owner=0:0 -U "$(tune2fs -l "$work/old.img" | awk '/UUID/{print $3}')" -d "$work/v2" "$work/new.img" 16M

echo; echo "== snapblk cow create (v3, lz4)"
"$SNAPBLK" cow create --old "$work/old.img" --new "$work/new.img" -o "$work/update.cow" --format v3 --compression lz4
echo; echo "== snapblk cow inspect"
"$SNAPBLK" cow inspect "$work/update.cow"
echo; echo "== snapblk cow verify"
"$SNAPBLK" cow verify "$work/update.cow" --base "$work/old.img" --expect "$work/new.img"
echo; echo "== snapblk cow apply"
"$SNAPBLK" cow apply "$work/update.cow" --base "$work/old.img" -o "$work/applied.img"
cmp "$work/applied.img" "$work/new.img" && echo "applied image == new image"

echo; echo "== read the new image through the snapshot device (4 KiB random reads, QD8)"
"$SNAPBLK" bench "snapshot:base=$work/old.img,cow=$work/update.cow" --rw randread --bs 4k --iodepth 8 --size 16M --runtime 2 --time_based
echo; echo "== snapblk merge (in place, resumable)"
cp "$work/old.img" "$work/device.img"
"$SNAPBLK" merge "$work/update.cow" --base "$work/device.img"
cmp "$work/device.img" "$work/new.img" && echo "merged device == new image"

echo; echo "== snapblk ota generate: an incremental OTA payload of the same update (old/new as system)"
mkdir -p "$work/ota-old" "$work/ota-new"
cp "$work/old.img" "$work/ota-old/system.img"
cp "$work/new.img" "$work/ota-new/system.img"
"$SNAPBLK" ota generate --source "$work/ota-old" --target "$work/ota-new" -o "$work/update.bin"
echo; echo "== snapblk ota apply: the post-update partition from the old image and the payload"
"$SNAPBLK" ota apply "$work/update.bin" --source "$work/ota-old" -o "$work/ota-applied"
cmp "$work/ota-applied/system.img" "$work/new.img" && echo "applied system.img == new image"
echo "post-update /etc/release: $(debugfs -R 'cat /etc/release' "$work/ota-applied/system.img" 2>/dev/null)"
echo; echo "== snapblk ota cow: the Virtual A/B COW a device would write, its view and merge checked"
"$SNAPBLK" ota cow "$work/update.bin" --source "$work/ota-old" -o "$work/ota-cow" --verify
echo; echo "== snapblk ota serve --fuse: the post-update partition as old image + COW, mounted"
mkdir -p "$work/fuse" "$work/mnt"
"$SNAPBLK" ota serve "$work/update.bin" --source "$work/ota-old" --fuse "$work/fuse" 2> "$work/serve.log" &
serve_pid=$!
for _ in $(seq 1 150); do [[ -f "$work/fuse/system/system.img" ]] && break; sleep 0.2; done
if [[ $(id -u) == 0 ]]; then
  mount -o loop,ro "$work/fuse/system/system.img" "$work/mnt"
  echo "post-update /etc/release (mounted): $(cat "$work/mnt/etc/release")"
  umount "$work/mnt"
else
  echo "post-update /etc/release (debugfs): $(debugfs -R 'cat /etc/release' "$work/fuse/system/system.img" 2>/dev/null)"
fi
kill -INT "$serve_pid"; wait "$serve_pid"
echo; echo "demo: OK"
