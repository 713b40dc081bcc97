#!/usr/bin/env python3
"""pin-split.py PID SUBMIT_CPU WORKER_CPU [FAST_SECS]

While process PID lives, pin every thread of it and of its descendants: io_uring's io-wq
workers (threads named iou-wrk-*) to WORKER_CPU, every other thread to SUBMIT_CPU. Used by
fio-agreement.sh PLACE=split so that both tools run with the same, fixed placement instead of
the scheduler's choice (which differs from run to run and is the largest share of the noise on
2 vCPUs). New threads are picked up by polling /proc: every 10 ms for FAST_SECS (default 0.8,
the ramp, when the rings and their first workers are made), then every 0.5 s.
"""
import os
import sys
import time


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass  # the process ended between listing and reading
    return out


def main():
    root, scpu, wcpu = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    fast = float(sys.argv[4]) if len(sys.argv) > 4 else 0.8
    pinned = set()
    t0 = time.monotonic()
    while os.path.exists(f"/proc/{root}"):
        stack = [root]
        while stack:
            pid = stack.pop()
            stack += children(pid)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in map(int, tids):
                if tid in pinned:
                    continue
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                    os.sched_setaffinity(tid, {wcpu} if comm.startswith("iou-wrk") else {scpu})
                    pinned.add(tid)
                except OSError:
                    pass  # gone already
        time.sleep(0.01 if time.monotonic() - t0 < fast else 0.5)


if __name__ == "__main__":
    main()
