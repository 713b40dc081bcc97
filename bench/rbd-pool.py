#!/usr/bin/env python3
"""Pool the paired ratios of several bench/rbd-bench.sh outputs.

One run's 9 paired rounds leave a cell's median a few percent either way of where it sits (fio
against itself spreads as much), so a verdict on a cell uses every round of runs made with the
same code: this reads each run's per-round IOPS, pairs every side's round with its reference's
same round (the reference a line names: "x fio-nc"), and prints per cell and side the median
(the lower middle one for an even count, as rbd-bench.sh takes it) and range of all those
ratios, their count, and how many are below 1. `-x FILE:WORKLOAD:QD` leaves one cell of one
file out (say, a cell that ran beside other work); the first line of the output repeats the
command.

Usage: bench/rbd-pool.py [-x FILE:WORKLOAD:QD]... RBD-BENCH-OUTPUT.txt...
"""

import argparse
import re
import shlex
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


def main(argv):
    ap = argparse.ArgumentParser(usage=__doc__.strip().splitlines()[-1].removeprefix("Usage: "))
    ap.add_argument("-x", action="append", default=[], metavar="FILE:WORKLOAD:QD")
    ap.add_argument("paths", nargs="+")
    a = ap.parse_args(argv)
    paths = a.paths
    skip = set()
    for x in a.x:
        f, sep, rest = x.partition(":")
        rw, sep2, qd = rest.partition(":")
        if not (sep and sep2 and qd.isdigit()) or f not in paths:
            print(f"-x {x}: not FILE:WORKLOAD:QD of a file given", file=sys.stderr)
            return 2
        skip.add((f, rw, f"qd{qd}"))
    pooled = {}  # (rw, qd, side, ref) -> [ratios]
    order = []
    for p in paths:
        cells = runs(p)
        if not cells:
            print(f"{p}: no rbd-bench.sh result lines", file=sys.stderr)
            return 1
        for (rw, qd), sides in cells.items():
            if (p, rw, qd) in skip:
                skip.discard((p, rw, qd))
                continue
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
    if skip:
        print(f"-x {sorted(skip)}: no such cell", file=sys.stderr)
        return 2
    print("$ bench/rbd-pool.py " + shlex.join(argv))
    print(f"paired ratios pooled over {len(paths)} runs: median [range] (rounds, below 1)")
    for key in order:
        rw, qd, side, ref = key
        if side == ref:
            continue
        r = sorted(pooled[key])
        below = sum(1 for x in r if x < 1)
        print(
            f"{rw:<10} {qd:<4} {side:<8} {statistics.median_low(r):.2f} "
            f"[{r[0]:.2f}-{r[-1]:.2f}] ({len(r)}, {below} below) x {ref}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
