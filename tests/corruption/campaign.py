#!/usr/bin/env python3
"""Corruption campaign: random single-bit flips and truncations of COW files (and of their
records) through `snapblk cow verify`, `cow apply`, `merge` and `serve` (NBD, read by nbdcopy).

Fixtures: COWs that `snapblk cow create` makes from an ext4 image pair (v2 and v3, every codec,
with and without scratch, 64 KiB units), each with its record, and the AOSP golden COWs (made by
Android's own tools) with a record written by `snapblk cow record`. Every unmodified fixture must
pass every command (controls): a campaign cannot pass by refusing everything.

For each mutant, each command's outcome is one of
  rejected  non-zero exit with a one-line `snapblk:` message, nothing changed
  correct   exit 0 and the exact new image (apply output, merged base, served bytes)
  harmless  (verify) exit 0 on a mutant whose decoded result is still the new image
  WRONG     exit 0 and bytes that are not the new image (silent wrong output)
  PANIC     a Rust panic or a death by signal
  HANG      no answer within the time limit
  OVERSIZE  an output larger than the new image
  BASE-CHANGED  a merge that failed but modified the base
The run fails on any PANIC, HANG, OVERSIZE or BASE-CHANGED, on any WRONG when the record is in
use, and on any control that is not correct. WRONG without a record (--no-record runs) is counted
and reported: that is what the format alone cannot detect.

Usage: campaign.py --bin target/release/snapblk [--flips 300] [--truncations 30] [--seed 1]
                   [--json out.json] [--no-record-share 0.2]
"""

import argparse
import collections
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TIMEOUT = 60

CONFIGS = [
    ("v3", "lz4", []),
    ("v3", "none", []),
    ("v3", "zstd", []),
    ("v3", "gz", []),
    ("v3", "brotli", ["--level", "5"]),
    # Without scratch, XOR ops that read their own destination cannot be merged crash-safely
    # (merge refuses them before writing), so this one has no XOR.
    ("v3", "lz4", ["--no-scratch", "--no-xor"]),
    ("v3", "zstd", ["--unit", "65536"]),
    ("v2", "lz4", []),
    ("v2", "gz", []),
    ("v2", "none", ["--no-scratch"]),
    ("v2", "zstd", []),
]


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Runner:
    def __init__(self, binary, work):
        self.bin = binary
        self.work = work

    def run(self, args, limit_bytes=None, timeout=TIMEOUT):
        def pre():
            if limit_bytes is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
        try:
            p = subprocess.run([self.bin] + args, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=timeout, preexec_fn=pre)
        except subprocess.TimeoutExpired:
            return None, b"", b""
        return p.returncode, p.stdout, p.stderr


def crashed(rc, err):
    return rc is not None and (rc < 0 or rc == 101 or b"panicked" in err)


class Fixture:
    def __init__(self, name, base, target, cow, record):
        self.name = name
        self.base = base
        self.target = target
        self.cow = cow
        self.record = record  # path of the record, or None
        self.base_sha = sha(base)
        self.target_sha = sha(target)
        self.target_len = os.path.getsize(target)


def make_ext4_pair(work, rnd):
    v1, v2 = os.path.join(work, "v1"), os.path.join(work, "v2")
    os.makedirs(v1)
    os.makedirs(v2)
    for i in range(30):
        data = rnd.randbytes(rnd.randrange(1, 60000))
        with open(os.path.join(v1, f"f{i}"), "wb") as f:
            f.write(data)
        if i % 4 == 0:
            continue  # deleted in v2
        if i % 3 == 0:
            data = data[: len(data) // 2] + rnd.randbytes(5000) + data[len(data) // 2:]
        with open(os.path.join(v2, f"f{i}"), "wb") as f:
            f.write(data)
    for i in range(8):
        with open(os.path.join(v2, f"g{i}"), "wb") as f:
            f.write(bytes(rnd.randrange(4)) * rnd.randrange(1, 40000))
    uuid = "0f0e0d0c-0b0a-4908-8706-050403020100"
    old, new = os.path.join(work, "old.img"), os.path.join(work, "new.img")
    for d, img in ((v1, old), (v2, new)):
        subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-U", uuid,
                        "-E", "hash_seed=" + uuid, "-d", d, img, "8M"],
                       check=True, env=dict(os.environ, E2FSPROGS_FAKE_TIME="1700000000"))
    return old, new


def fixtures(r, work, golden_dir, rnd):
    old, new = make_ext4_pair(work, rnd)
    out = []
    for fmt, comp, extra in CONFIGS:
        name = f"{fmt}-{comp}" + "".join(x.replace("--", "-") for x in extra if x.startswith("--"))
        cow = os.path.join(work, name + ".cow")
        rc, _, err = r.run(["cow", "create", "--old", old, "--new", new, "-o", cow,
                            "--format", fmt, "--compression", comp] + extra)
        if rc != 0:
            sys.exit(f"cow create {name} failed: {err.decode()}")
        out.append(Fixture(name, old, new, cow, cow + ".snapblk"))
    if golden_dir and os.path.isdir(golden_dir):
        for case in sorted(os.listdir(golden_dir)):
            d = os.path.join(golden_dir, case)
            if not os.path.isfile(os.path.join(d, "snapshot.cow")):
                continue
            cow = os.path.join(work, f"golden-{case}.cow")
            shutil.copy(os.path.join(d, "snapshot.cow"), cow)
            rc, _, err = r.run(["cow", "record", cow, "--old", os.path.join(d, "base.img"),
                                "--new", os.path.join(d, "target.img")])
            # Golden cases whose merge order is invalid on purpose cannot get a record.
            if rc != 0:
                continue
            out.append(Fixture("golden-" + case, os.path.join(d, "base.img"),
                               os.path.join(d, "target.img"), cow, cow + ".snapblk"))
    return out


def regions(r, fx):
    """(name, start, end) byte ranges of the COW, from `cow inspect --json --ops`."""
    rc, outb, err = r.run(["cow", "inspect", "--json", "--ops", fx.cow])
    if rc != 0:
        sys.exit(f"inspect {fx.name}: {err.decode()}")
    j = json.loads(outb)
    h = j["header"]
    size = os.path.getsize(fx.cow)
    op_size = h["op_size"]
    regs = [("header", 0, h["header_size"])]
    if j["scratch_offset"] is not None and j["scratch_size"]:
        regs.append(("scratch", j["scratch_offset"], j["scratch_offset"] + j["scratch_size"]))
    ops, payloads, seq = [], [], []
    for op in j["ops"]:
        ops.append((op["record_offset"], op["record_offset"] + op_size))
        p = op["kind"].get("payload")
        if p:
            (seq if op["kind"]["type"] == "sequence" else payloads).append(
                (p["offset"], p["offset"] + p["len"]))
    return regs, ops, payloads, seq, size


def classify(pos, regs, ops, payloads, seq):
    for name, a, b in regs:
        if a <= pos < b:
            return name
    for name, spans in (("op", ops), ("payload", payloads), ("sequence", seq)):
        for a, b in spans:
            if a <= pos < b:
                return name
    return "other"


def pick_position(rnd, regs, ops, payloads, seq, size, rec_size):
    """A flip position weighted over the regions present: (region, file, byte offset)."""
    choices = [("header", None), ("op", None), ("payload", None), ("other", None)]
    if seq:
        choices.append(("sequence", None))
    if any(n == "scratch" for n, _, _ in regs):
        choices.append(("scratch", None))
    if rec_size:
        choices.append(("record", None))
    region = rnd.choice(choices)[0]
    if region == "record":
        return "record", "record", rnd.randrange(rec_size)
    if region == "header":
        return "header", "cow", rnd.randrange(regs[0][2])
    if region == "scratch":
        a, b = [(a, b) for n, a, b in regs if n == "scratch"][0]
        return "scratch", "cow", rnd.randrange(a, min(b, size))
    spans = {"op": ops, "payload": payloads, "sequence": seq}.get(region)
    if spans:
        a, b = rnd.choice(spans)
        if b > a:
            pos = rnd.randrange(a, min(b, size))
            return region, "cow", pos
    # "other": anywhere, classified afterwards.
    pos = rnd.randrange(size)
    return classify(pos, regs, ops, payloads, seq), "cow", pos


class Campaign:
    def __init__(self, r, work):
        self.r = r
        self.work = work
        self.table = collections.defaultdict(collections.Counter)
        self.failures = []
        self.mutants = 0
        self.port_sock = 0

    def note(self, key, cmd, outcome, detail):
        self.table[key][f"{cmd}:{outcome}"] += 1
        if outcome in ("WRONG", "PANIC", "HANG", "OVERSIZE", "BASE-CHANGED", "CONTROL-FAILED"):
            self.failures.append({"case": key, "command": cmd, "outcome": outcome, **detail})

    def judge(self, rc, err, produced, fx, result_ok):
        if rc is None:
            return "HANG"
        if crashed(rc, err):
            return "PANIC"
        if rc == 0:
            return "correct" if result_ok else "WRONG"
        lines = [l for l in err.decode(errors="replace").splitlines() if l.strip()]
        if not lines or not lines[-1].startswith("snapblk: "):
            return "PANIC"
        return "rejected"

    def run_mutant(self, fx, cow, use_record, key, control, detail):
        """Run verify, apply, merge and serve on (fx.base, cow); record outcomes."""
        r = self.r
        w = self.work
        rec_args = [] if use_record else ["--no-record"]
        # Ground truth for this mutant: the decoders' own result (no record).
        ref = os.path.join(w, "ref.img")
        if os.path.exists(ref):
            os.remove(ref)
        rc_ref, _, _ = r.run(["cow", "apply", cow, "--base", fx.base, "-o", ref, "--no-record",
                              "--size", str(fx.target_len)], limit_bytes=2 * fx.target_len + (1 << 20))
        mutant_good = rc_ref == 0 and sha(ref) == fx.target_sha
        outcomes = {}
        # verify
        rc, _, err = r.run(["cow", "verify", cow, "--base", fx.base] + rec_args)
        o = self.judge(rc, err, None, fx, mutant_good)
        if o == "WRONG" and not use_record:
            o = "wrong-no-record"
        if o == "correct" and not control and mutant_good:
            o = "harmless"
        outcomes["verify"] = o
        # apply
        out = os.path.join(w, "out.img")
        if os.path.exists(out):
            os.remove(out)
        limit = 2 * fx.target_len + (1 << 20)
        rc, _, err = r.run(["cow", "apply", cow, "--base", fx.base, "-o", out] + rec_args,
                           limit_bytes=limit)
        if rc == -signal.SIGXFSZ or (os.path.exists(out) and os.path.getsize(out) > fx.target_len):
            o = "OVERSIZE"
        else:
            ok = rc == 0 and os.path.getsize(out) == fx.target_len and sha(out) == fx.target_sha
            o = self.judge(rc, err, out, fx, ok)
            if rc != 0 and os.path.exists(out):
                o = "PARTIAL-OUTPUT"
                self.failures.append({"case": key, "command": "apply", "outcome": o, **detail})
        outcomes["apply"] = o
        # merge, on copies
        mb, mc = os.path.join(w, "m.img"), os.path.join(w, "m.cow")
        shutil.copy(fx.base, mb)
        shutil.copy(cow, mc)
        if use_record and os.path.exists(cow + ".snapblk"):
            shutil.copy(cow + ".snapblk", mc + ".snapblk")
        elif os.path.exists(mc + ".snapblk"):
            os.remove(mc + ".snapblk")
        rc, _, err = r.run(["merge", mc, "--base", mb] + rec_args)
        if os.environ.get("CAMPAIGN_DEBUG") and rc != 0:
            print("merge", key, detail, err.decode(errors="replace").strip()[-300:])
        merged_sha = sha(mb)
        if rc is not None and rc != 0 and not crashed(rc, err) and merged_sha != fx.base_sha:
            o = "BASE-CHANGED"
        else:
            # The merged base must be the new image, sized as the base (a merge never grows or
            # shrinks here: the fixtures keep their size).
            o = self.judge(rc, err, mb, fx, merged_sha == fx.target_sha)
        outcomes["merge"] = o
        # serve over NBD, read by nbdcopy
        outcomes["serve"] = self.serve(fx, cow, rec_args)
        for cmd, o in outcomes.items():
            if o == "WRONG" and not use_record:
                o = "wrong-no-record"
            if control and o not in ("correct",):
                self.note(key, cmd, "CONTROL-FAILED", {**detail, "got": o})
            else:
                self.note(key, cmd, o, detail)
        return outcomes

    def serve(self, fx, cow, rec_args):
        self.port_sock += 1
        sock = os.path.join(self.work, f"nbd{self.port_sock}.sock")
        p = subprocess.Popen([self.r.bin, "serve", "--base", fx.base, "--cow", cow, "--json",
                              "--nbd", "unix:" + sock] + rec_args,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            line = p.stdout.readline()
            if not line:
                rc = p.wait(timeout=TIMEOUT)
                err = p.stderr.read()
                return self.judge(rc, err, None, fx, False)
            out = os.path.join(self.work, "served.img")
            if os.path.exists(out):
                os.remove(out)
            try:
                c = subprocess.run(["nbdcopy", f"nbd+unix:///?socket={sock}", out],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                return "HANG"
            if c.returncode != 0:
                return "rejected"  # the export answered EIO
            if os.path.getsize(out) != fx.target_len:
                return "WRONG"
            return "correct" if sha(out) == fx.target_sha else "WRONG"
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    rc = p.wait(timeout=TIMEOUT)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    self.failures.append({"case": fx.name, "command": "serve", "outcome": "HANG"})
            err = p.stderr.read()
            if crashed(p.returncode, err):
                self.failures.append({"case": fx.name, "command": "serve", "outcome": "PANIC",
                                      "stderr": err.decode(errors="replace")[-400:]})
            if os.path.exists(sock):
                os.remove(sock)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--flips", type=int, default=300)
    ap.add_argument("--truncations", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-record-share", type=float, default=0.2,
                    help="share of mutants also run with --no-record (format-only detection)")
    ap.add_argument("--golden", default=os.path.join(os.path.dirname(__file__), "..", "data", "aosp-cow"))
    ap.add_argument("--json")
    a = ap.parse_args()
    for tool in ("mke2fs", "nbdcopy"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (scripts/install-deps.sh installs it)")
    rnd = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="snapblk-corruption-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    t0 = time.time()
    try:
        r = Runner(os.path.abspath(a.bin), work)
        fxs = fixtures(r, work, a.golden, rnd)
        camp = Campaign(r, work)
        meta = {}
        for fx in fxs:
            meta[fx.name] = regions(r, fx)
            camp.run_mutant(fx, fx.cow, True, (fx.name, "control"), True, {"fixture": fx.name})
        mut = os.path.join(work, "mut.cow")
        for i in range(a.flips + a.truncations):
            fx = fxs[i % len(fxs)]
            regs, ops, payloads, seq, size = meta[fx.name]
            data = bytearray(open(fx.cow, "rb").read())
            rec = bytearray(open(fx.record, "rb").read()) if fx.record else bytearray()
            if i < a.flips:
                region, which, pos = pick_position(rnd, regs, ops, payloads, seq, size, len(rec))
                bit = rnd.randrange(8)
                (rec if which == "record" else data)[pos] ^= 1 << bit
                detail = {"fixture": fx.name, "region": region, "offset": pos, "bit": bit}
            else:
                cut = rnd.randrange(size)
                region = "truncation:" + classify(cut, regs, ops, payloads, seq)
                del data[cut:]
                detail = {"fixture": fx.name, "region": region, "cut": cut}
            with open(mut, "wb") as f:
                f.write(data)
            with open(mut + ".snapblk", "wb") as f:
                f.write(rec)
            camp.mutants += 1
            kind = "golden" if fx.name.startswith("golden-") else "created"
            camp.run_mutant(fx, mut, True, (kind, region), False, detail)
            if rnd.random() < a.no_record_share:
                camp.run_mutant(fx, mut, False, (kind + " --no-record", region), False, detail)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    secs = time.time() - t0
    cmds = ["verify", "apply", "merge", "serve"]
    print(f"corruption campaign: {len(fxs)} fixtures, {camp.mutants} mutants "
          f"({a.flips} flips, {a.truncations} truncations), seed {a.seed}, {secs:.0f} s")
    for (kind, region), c in sorted(camp.table.items()):
        row = "  ".join(
            f"{cmd}: " + ",".join(f"{k.split(':', 1)[1]} {n}" for k, n in sorted(c.items())
                                  if k.startswith(cmd + ":"))
            for cmd in cmds)
        print(f"{kind:22} {region:22} {row}")
    bad = [f for f in camp.failures]
    for f in bad[:40]:
        print("FAILURE", json.dumps(f))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "snapblk.corruption-campaign.v1", "seed": a.seed,
                       "fixtures": len(fxs), "mutants": camp.mutants, "seconds": secs,
                       "table": {f"{k[0]}|{k[1]}": dict(v) for k, v in camp.table.items()},
                       "failures": bad}, f, indent=1)
    total = sum(sum(c.values()) for c in camp.table.values())
    print(f"{total - len(bad)} passed, {len(bad)} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
