#!/usr/bin/env python3
"""Build a change-heavy old/new ext4 image pair for bench/cow-create.sh (not a test).

The op mix aims at the anchor pair in /work/shared/notes/anchor-figures.md (Android's writer on
a 512 MiB pair: ~79% COPY, ~11% REPLACE, ~6% XOR, ~4% ZERO of 104,757 ops, 70.5 MiB to
compress). Version 1 is a deterministic subset of /usr/lib (sorted paths, files < 16 MiB) of
about 78% of the image size. Version 2, chosen per file by crc32(path) % 100:

  0-10   deleted                         -> everything after it moves: COPY from elsewhere
  11-21  "relinked": 16 8-byte words     -> unchanged blocks COPY, changed ones XOR against
         changed in every other non-zero    the old block (relocation-like scattered edits)
         4 KiB block
  24-25  100 bytes edited in the middle  -> one XOR or REPLACE block
  26     replaced by a different file    -> REPLACE (new content of similar size)
  rest   unchanged (but usually moved)   -> COPY

plus new files (the /usr/lib shared libraries following the v1 cutoff, ~10% of v1's bytes)
-> REPLACE.
v2 ends up ~2% smaller than v1, so old data at the tail becomes ZERO ops.
Both trees go through `mke2fs -d` with a fixed UUID, hash seed and time.

Usage: make-pair.py WORKDIR IMG_MB   (writes WORKDIR/old.img, WORKDIR/new.img)
"""

import os
import shutil
import subprocess
import sys
import zlib

work, img_mb = sys.argv[1], int(sys.argv[2])
content = int(img_mb * 0.68 * 2**20)
new_bytes = int(content * 0.10)

files = []
for root, dirs, names in os.walk("/usr/lib"):
    dirs.sort()
    for n in sorted(names):
        p = os.path.join(root, n)
        try:
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            s = os.path.getsize(p)
            if 0 < s < 16 * 2**20 and os.access(p, os.R_OK):
                files.append((p, s))
        except OSError:
            pass

v1, extra, tot = [], [], 0
it = iter(files)
for p, s in it:
    if tot + s > content:
        break
    v1.append((p, s))
    tot += s
tot_new = 0
for p, s in it:
    if tot_new >= new_bytes:
        break
    if ".so" not in os.path.basename(p):
        continue  # new content: shared libraries (compress like the anchor's REPLACE data)
    extra.append((p, s))
    tot_new += s


def sel(p):
    return zlib.crc32(p.encode()) % 100


def dst(tree, p):
    d = os.path.join(work, tree, p.lstrip("/"))
    os.makedirs(os.path.dirname(d), exist_ok=True)
    return d


stats = dict(deleted=0, relinked=0, edited=0, replaced=0, new=tot_new)
donors = [f for f in v1 if sel(f[0]) >= 90]
for i, (p, s) in enumerate(v1):
    shutil.copyfile(p, dst("v1", p))
    k = sel(p)
    d = dst("v2", p)
    if k < 11:
        stats["deleted"] += s
        continue
    with open(p, "rb") as f:
        data = bytearray(f.read())
    if 11 <= k <= 21 and s >= 16384:
        for b0 in range(4096, len(data) - 4096, 8192):
            if not any(data[b0 : b0 + 4096]):
                continue  # zero padding stays zero (and a hole in the image)
            for off in range(b0 + 40, b0 + 4096, 256):  # relocation-like: 16 words per block
                data[off : off + 8] = (off * 0x9E3779B1 & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
        stats["relinked"] += s
    elif 24 <= k <= 25 and s > 8192:
        tag = b"snapblk-edit-%08d-" % i
        data[s // 2 : s // 2 + 100] = (tag * 8)[:100]
        stats["edited"] += s
    elif k == 26 and donors:
        dp, _ = donors[i % len(donors)]
        with open(dp, "rb") as f:
            repl = f.read(s)
        data = bytearray(repl[::-1])  # different bytes, similar compressibility
        stats["replaced"] += len(data)
    with open(d, "wb") as f:
        f.write(data)
for p, s in extra:
    shutil.copyfile(p, dst("v2", p))

print(
    f"v1 {tot / 2**20:.1f} MiB in {len(v1)} files; v2 changes (MiB): "
    + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in stats.items()),
    file=sys.stderr,
)

# mke2fs -d copies timestamps into the inodes: pin them so inode tables do not vary by run.
for tree in ("v1", "v2"):
    for root, dirs, names in os.walk(os.path.join(work, tree)):
        for n in names + dirs:
            os.utime(os.path.join(root, n), (1700000000, 1700000000))
    os.utime(os.path.join(work, tree), (1700000000, 1700000000))

env = dict(os.environ, E2FSPROGS_FAKE_TIME="1700000000")
for tree, img in (("v1", "old.img"), ("v2", "new.img")):
    out = os.path.join(work, img)
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0",
         "-U", "6f1c0000-0000-4000-8000-000000000001",
         "-E", "root_owner=0:0,hash_seed=6f1c0000-0000-4000-8000-000000000002",
         "-d", os.path.join(work, tree), out, f"{img_mb}M"],
        check=True, env=env,
    )
    shutil.rmtree(os.path.join(work, tree))
