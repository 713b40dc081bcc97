#!/usr/bin/env python3
"""Make an ext4 image of a deterministic subset of a directory (not a test).

For bench/ota-bench.sh: the first files of SRC in sorted order (regular, readable, 4 KiB to
16 MiB) up to 68% of the image size in whole blocks, and at most 70% of its inodes, are copied to a tree and written with `mke2fs -d`, with
a fixed UUID, hash seed and time, as bench/cow/make-pair.py does for its pair.

Usage: make-fs.py SRC IMG IMG_MB
"""

import os
import shutil
import subprocess
import sys
import tempfile

src, img, img_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
content = int(img_mb * 0.68 * 2**20)
tree = tempfile.mkdtemp(prefix="make-fs.", dir=os.path.dirname(os.path.abspath(img)))
tot = n = 0
max_files = int(img_mb * 2**20 / 16384 * 0.7)  # mke2fs: one inode per 16 KiB
for root, dirs, names in os.walk(src):
    dirs.sort()
    for name in sorted(names):
        p = os.path.join(root, name)
        try:
            if os.path.islink(p) or not os.path.isfile(p) or not os.access(p, os.R_OK):
                continue
            s = os.path.getsize(p)
        except OSError:
            continue
        if not 4096 <= s < 16 * 2**20 or tot + s > content:
            continue
        if n >= max_files:
            break
        d = os.path.join(tree, os.path.relpath(p, "/"))
        os.makedirs(os.path.dirname(d), exist_ok=True)
        shutil.copyfile(p, d)
        tot += -(-s // 4096) * 4096
        n += 1
for root, dirs, names in os.walk(tree):
    for x in names + dirs:
        os.utime(os.path.join(root, x), (1700000000, 1700000000))
os.utime(tree, (1700000000, 1700000000))
env = dict(os.environ, E2FSPROGS_FAKE_TIME="1700000000")
subprocess.run(
    ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0",
     "-U", "6f1c0000-0000-4000-8000-000000000003",
     "-E", "root_owner=0:0,hash_seed=6f1c0000-0000-4000-8000-000000000004",
     "-d", tree, img, f"{img_mb}M"],
    check=True, env=env,
)
shutil.rmtree(tree)
print(f"{img}: {n} files of {src}, {tot / 2**20:.1f} MiB in whole blocks", file=sys.stderr)
