#!/usr/bin/env python3
"""Pool the paired ratios of several bench/rbd-bench.sh outputs.

One run's 9 paired rounds leave a cell's median a few percent either way of where it sits (fio
against itself spreads as much), so a verdict on a cell uses every round of runs made with the
same code: this reads each run's per-round IOPS, pairs every side's round with its reference's
same round (the reference a line names: "x fio-nc"), and prints per cell and side the median
and range of all those ratios, their count, and how many are below 1.

Usage: bench/rbd-pool.py RBD-BENCH-OUTPUT.txt...
"""

import re
import statistics
import sys

LINE = re.compile(
    r"^(\S+)\s+(qd\d+)\s+(\S+)\s+([\d ]+?)\s+median \d+\s+\(.* x (\S+)\)$"
)


def runs(path):
    """{(workload, qd): {side: ([iops per round], reference)}} of one output file."""
    cells = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if m:
                rw, qd, side, iops, ref = m.groups()
                cells.setdefault((rw, qd), {})[side] = ([int(x) for x in iops.split()], ref)
    return cells


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    pooled = {}  # (rw, qd, side, ref) -> [ratios]
    order = []
    for p in paths:
        cells = runs(p)
        if not cells:
            print(f"{p}: no rbd-bench.sh result lines", file=sys.stderr)
            return 1
        for (rw, qd), sides in cells.items():
            for side, (mine, ref) in sides.items():
                if ref not in sides:
                    print(f"{p}: {rw} {qd}: no {ref} line for {side}", file=sys.stderr)
                    return 1
                theirs = sides[ref][0]
                key = (rw, qd, side, ref)
                if key not in pooled:
                    order.append(key)
                pooled.setdefault(key, []).extend(
                    a / b for a, b in zip(mine, theirs, strict=True) if b > 0
                )
    print(f"paired ratios pooled over {len(paths)} runs: median [range] (rounds, below 1)")
    for key in order:
        rw, qd, side, ref = key
        if side == ref:
            continue
        r = sorted(pooled[key])
        below = sum(1 for x in r if x < 1)
        print(
            f"{rw:<10} {qd:<4} {side:<8} {statistics.median(r):.2f} "
            f"[{r[0]:.2f}-{r[-1]:.2f}] ({len(r)}, {below} below) x {ref}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
