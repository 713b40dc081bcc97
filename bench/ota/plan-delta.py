#!/usr/bin/env python3
"""Plan an incremental OTA between two ext4 images, file by file as delta_generator does (not a test).

For bench/ota-bench.sh: lists both images' files and directories (path -> data blocks, from
debugfs `ncheck` and `blocks`) and appends to PLAN what crates/ota/examples/ota_bench_payload.rs
(`delta` mode) turns into operations:

  - a path in both images: `copy` (SOURCE_COPY, one per destination extent) of the old blocks
    to the new ones if the bytes are the same, else `diff` (SOURCE_BSDIFF from the old file to the new one, or REPLACE_* when
    smaller);
  - a path only in the new image: `replace` (REPLACE_*, 2 MiB per operation);
  - every other block (superblock copies, group descriptors, bitmaps, inode tables, extent
    tree blocks): `zero` when all zeros, else `copy` of an old block with the same bytes (the
    one at the same place first), else `diff` against the old blocks at the same place, in
    runs of at most 2 MiB.

Usage: plan-delta.py NAME OLD NEW >> PLAN
"""

import hashlib
import mmap
import re
import subprocess
import sys

BS = 4096
CHUNK = 512


def debugfs(img, cmds):
    r = subprocess.run(["debugfs", "-f", "-", img], input="\n".join(cmds) + "\n",
                       capture_output=True, text=True, check=True)
    return r.stdout


def files(img):
    """path -> list of physical data blocks, in file order."""
    head = subprocess.run(["dumpe2fs", "-h", img], capture_output=True, text=True, check=True).stdout
    icount = int(re.search(r"Inode count:\s+(\d+)", head).group(1))
    cmds = ["ncheck " + " ".join(map(str, range(a, min(a + 500, icount + 1))))
            for a in range(12, icount + 1, 500)]
    names = {2: "/"}
    for line in debugfs(img, cmds).splitlines():
        m = re.match(r"(\d+)\t(.+)$", line)
        if m:
            names.setdefault(int(m.group(1)), "/" + m.group(2).lstrip("/"))
    inos = sorted(names)
    blocks, cur = {}, None
    for line in debugfs(img, [f"blocks <{i}>" for i in inos]).splitlines():
        m = re.match(r"debugfs: blocks <(\d+)>", line)
        if m:
            cur = int(m.group(1))
        elif cur is not None and re.fullmatch(r"[\d ]+", line.strip() or "x"):
            blocks[names[cur]] = [int(b) for b in line.split()]
            cur = None
    return blocks


def extents(bl):
    out = []
    for b in bl:
        if out and out[-1][0] + out[-1][1] == b:
            out[-1][1] += 1
        else:
            out.append([b, 1])
    return ",".join(f"{s}+{n}" for s, n in out)


name, old_img, new_img = sys.argv[1:4]
with open(old_img, "rb") as fo, open(new_img, "rb") as fn:
    old = mmap.mmap(fo.fileno(), 0, prot=mmap.PROT_READ)
    new = mmap.mmap(fn.fileno(), 0, prot=mmap.PROT_READ)
old_files, new_files = files(old_img), files(new_img)
nold, nnew = len(old) // BS, len(new) // BS
taken = bytearray(nnew)
ops = []  # (first destination block, line)
stats = dict(copy=0, diff=0, replace=0, zero=0)


def data(m, bl):
    return b"".join(m[b * BS:(b + 1) * BS] for b in bl)


for path, nb in new_files.items():
    if not nb:
        continue
    for b in nb:
        if taken[b]:
            sys.exit(f"{new_img}: block {b} of {path} is claimed twice")
        taken[b] = 1
    ob = old_files.get(path)
    if ob and len(ob) == len(nb) and data(old, ob) == data(new, nb):
        # One operation per destination extent: PyPI payload-dumper 0.3.0 writes a
        # SOURCE_COPY's bytes from its first destination block on.
        i = 0
        for ext in extents(nb).split(","):
            s, n = map(int, ext.split("+"))
            ops.append((s, f"copy {extents(ob[i:i + n])} {ext}"))
            i += n
        stats["copy"] += len(nb)
    elif ob:
        ops.append((nb[0], f"diff {extents(ob)} {extents(nb)}"))
        stats["diff"] += len(nb)
    else:
        ops.append((nb[0], f"replace {extents(nb)}"))
        stats["replace"] += len(nb)

# The blocks no file names.
zero = bytes(BS)
h = lambda m, b: hashlib.blake2b(m[b * BS:(b + 1) * BS], digest_size=16).digest()
old_at = {}
for b in range(nold):
    old_at.setdefault(h(old, b), b)
run = []  # changed blocks to diff against the same place


def flush():
    if run:
        if run[-1] < nold:
            ops.append((run[0], f"diff {extents(run)} {extents(run)}"))
            stats["diff"] += len(run)
        else:
            ops.append((run[0], f"replace {extents(run)}"))
            stats["replace"] += len(run)
        run.clear()


copies = []  # (src, dst) runs
for b in range(nnew):
    if taken[b]:
        flush()
        continue
    blk = new[b * BS:(b + 1) * BS]
    if blk == zero:
        flush()
        ops.append((b, f"zero {b}+1"))
        stats["zero"] += 1
        continue
    if b < nold and old[b * BS:(b + 1) * BS] == blk:
        src = b
    else:
        src = old_at.get(h(new, b))
    if src is not None:
        flush()
        ops.append((b, f"copy {src}+1 {b}+1"))
        stats["copy"] += 1
        continue
    if run and (run[-1] != b - 1 or len(run) >= CHUNK):
        flush()
    run.append(b)
flush()

# Merge one-block zero and copy operations that continue each other (up to 2 MiB).
ops.sort()
merged = []
for first, line in ops:
    w = line.split()
    if merged and w[0] in ("zero", "copy") and merged[-1][0] == w[0]:
        m = merged[-1]
        if w[0] == "zero" and m[2] == first and m[3] < CHUNK:
            m[2], m[3] = first + 1, m[3] + 1
            continue
        if w[0] == "copy" and len(w[1].split(",")) == 1 and "," not in m[1] \
                and m[2] == first and m[3] < CHUNK and w[2] == f"{first}+1":
            s, n = map(int, m[1].split("+"))
            if w[1] == f"{s + n}+1":
                m[1], m[2], m[3] = f"{s}+{n + 1}", first + 1, m[3] + 1
                continue
    if w[0] == "zero" and w[1] == f"{first}+1":
        merged.append(["zero", None, first + 1, 1, first])
    elif w[0] == "copy" and w[2] == f"{first}+1" and "," not in w[1]:
        merged.append(["copy", w[1], first + 1, 1, first])
    else:
        merged.append([line, None, -1, 0, first])
print(f"partition {name} {old_img} {new_img}")
for m in merged:
    if m[0] == "zero":
        print(f"zero {m[4]}+{m[3]}")
    elif m[0] == "copy":
        print(f"copy {m[1]} {m[4]}+{m[3]}")
    else:
        print(m[0])
print(f"{name}: blocks by plan: " + ", ".join(f"{k} {v}" for k, v in stats.items())
      + f"; {len(old_files)} old and {len(new_files)} new paths", file=sys.stderr)
