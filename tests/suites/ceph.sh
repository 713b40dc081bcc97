#!/usr/bin/env bash
# The rbd driver against a real Ceph: brings up one single-node cluster with cephx
# (scripts/ceph-cluster.sh, no radosgw), runs every Ceph test against it, and stops every daemon
# by pid at the end, also on failure. Independent clients are the oracles: `rbd export/import`,
# `qemu-img`/`qemu-io` with `rbd:` (qemu-block-extra), nbdcopy. Covers: data written through
# snapblk (NBD export of an RBD image, also with cache=true) read back by rbd export and qemu-img,
# and the other way;
# the FUSE export; a read-only RBD snapshot refusing writes; the driver conformance suite; discard and write-zeroes reading
# back as zeroes; 4 queues x QD32 random writes verified, through the Rust API and through
# libblkio.so.1 (the C ABI, also with a nested snapshot spec); a stopped monitor and a stopped
# OSD giving errors within the timeouts; the right key, a wrong key and a missing keyring; users
# other than client.admin, one with read-only caps; the lock modes named explicitly; a FUA write
# through cache=true reaching the image before a plain one; the
# snapshot device over an RBD base reading exactly as over the local base for every AOSP golden
# case; a merge and a server of one RBD image keeping each other out; a merge over an RBD base
# giving AOSP's target image (read back by rbd export); a server whose exclusive lock is taken
# away (broken and taken by another client, or the client blocklisted) writing nothing more;
# with cache=true, a write held in librbd's cache when the client is blocklisted never reaching
# the image, its flush failing with EIO; `snapblk merge --base rbd:...` (a COW made with
# `cow create --old rbd:...`): the new image in RBD, resumed after SIGKILL, kept apart from a
# server both ways, a wrong base refused; `cow apply --base rbd:...` into files and into another
# RBD image, an output naming the base's image refused; shrinking and growing updates merged into
# RBD ending at the new size (rbd info, rbd export), also after a SIGKILL before the resize.
# Needs: ceph-mon ceph-osd ceph-common qemu-block-extra libnbd-bin fuse3 (install-deps.sh).
# Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
passed=0; failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit $?; }
for t in ceph-mon ceph-osd rbd qemu-img qemu-io nbdcopy fusermount3; do
  command -v "$t" >/dev/null || { bad "$t not found (scripts/install-deps.sh installs it)"; finish; }
done
tgt=${CARGO_TARGET_DIR:-$root/target}
# SNAPBLK_PROFILE=debug runs the debug build (for development); CI builds release.
profile=${SNAPBLK_PROFILE:-release}
if [ "$profile" = release ]; then
  cargo build -q --release -p snapblk-cli -p snapblk-capi || { bad "cargo build"; finish; }
fi
cargo build -q -p snapblk-conformance || { bad "cargo build -p snapblk-conformance"; finish; }
conformance=$tgt/debug/snapblk-conformance
snapblk=$tgt/$profile/snapblk
libblkio=$tgt/$profile/libblkio.so
work=$(mktemp -d /tmp/snapblk-ceph.XXXXXX)
cluster=$work/cluster
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for m in "$work"/mnt*; do mountpoint -q "$m" 2>/dev/null && fusermount3 -u "$m"; done
  bash scripts/ceph-cluster.sh down "$cluster"
  rm -rf "$work"
}
trap cleanup EXIT

export CEPH_MON_PORT=${CEPH_MON_PORT:-13300} CEPH_RGW_PORT=0
if bash scripts/ceph-cluster.sh up "$cluster" >"$work/up.log" 2>&1; then
  ok "single-node cluster up (cephx, memstore OSD)"
else
  tail -30 "$work/up.log"; bad "cluster up"; finish
fi
export CEPH_CONF=$cluster/ceph.conf
keyring=$cluster/client.admin.keyring
mon=127.0.0.1:$CEPH_MON_PORT
r() { timeout 60 rbd "$@"; }
# Every spec names the cluster without a conf file: mon-host and keyring only.
base="pool=rbd,conf=,mon-host=$mon,keyring=$keyring"
spec() { echo "rbd:$base,image=$1${2:+,$2}"; }
qrbd() { echo "rbd:rbd/$1:conf=$CEPH_CONF"; }

# serve SPEC ARGS...: start `snapblk serve` in the background, wait for its ready line; sets
# $srv (pid), $serr (its stderr) and $ready (the JSON line). Returns 1 if it exits first.
serve() {
  local out=$work/serve.$RANDOM
  "$snapblk" serve "$@" --json >"$out" 2>"$out.err" &
  srv=$!; pids+=("$srv"); serr=$out.err
  for _ in $(seq 300); do
    ready=$(grep -m1 '"ready"' "$out" 2>/dev/null) && return 0
    kill -0 "$srv" 2>/dev/null || { cat "$out.err"; return 1; }
    sleep 0.1
  done
  cat "$out.err"; return 1
}
stop() { kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; }
nbd_uri() { echo "nbd+unix:///?socket=$1"; }
# copy_nbd SPEC SRC DST [SERVE ARGS...]: serve SPEC over NBD, nbdcopy SRC to DST (either may be
# the word NBD: the export), stop the server; fails if serving or copying does.
copy_nbd() {
  local spec=$1 src=$2 dst=$3 sock=$work/copy.$RANDOM.sock rc
  shift 3
  [ "$src" = NBD ] && src=$(nbd_uri "$sock")
  [ "$dst" = NBD ] && dst=$(nbd_uri "$sock")
  serve "$spec" "$@" --nbd "unix:$sock" || { stop; return 1; }
  nbdcopy "$src" "$dst"; rc=$?
  stop
  return $rc
}
# refused PATTERN WHAT CMD...: CMD must fail within 60 s, saying PATTERN (grep -E).
refused() {
  local pat=$1 what=$2 out
  shift 2
  if out=$(timeout 60 "$@" 2>&1); then
    bad "$what: it succeeded"
  elif echo "$out" | grep -qE -- "$pat"; then
    ok "$what: ${out##*: rbd: }"
  else
    echo "$out"; bad "$what: not the expected message"
  fi
}

head -c 16M /dev/urandom >"$work/pattern.img"

# 1. snapblk writes (NBD export of an RBD image), rbd export and qemu-img read.
r create --size 16M rbd/a
if copy_nbd "$(spec a)" "$work/pattern.img" NBD; then
  r export rbd/a "$work/a.out" >/dev/null 2>&1
  if cmp -s "$work/pattern.img" "$work/a.out" \
     && qemu-img compare -q -f raw -F raw "$work/pattern.img" "$(qrbd a)"; then
    ok "written through snapblk's NBD export of rbd:, read back by rbd export and qemu-img"
  else
    bad "rbd export / qemu-img read of what snapblk wrote differs"
  fi
else
  bad "serve rbd: --nbd + nbdcopy into it"
fi

# 1b. The same with librbd's write-back cache (cache=true: connect flushes once, so writes are
# cached from the first one): the data is in RBD once nbdcopy's flush and the server's stop return.
r create --size 16M rbd/ac
if copy_nbd "$(spec ac cache=true)" "$work/pattern.img" NBD; then
  r export rbd/ac "$work/ac.out" >/dev/null 2>&1
  cmp -s "$work/pattern.img" "$work/ac.out" && ok "written through cache=true (write-back), read back by rbd export" \
    || bad "rbd export of what snapblk wrote with cache=true differs"
  rm -f "$work/ac.out"
else
  bad "serve rbd:...,cache=true --nbd + nbdcopy into it"
fi

# 1c. A real RBD namespace: snapblk writes rbd/ns1/n through `namespace=ns1`; `rbd export`
# reads it there, and the image of the same name in the default namespace keeps its zeroes.
head -c 4M "$work/pattern.img" >"$work/ns.ref"
if r namespace create --pool rbd --namespace ns1 && r create --size 4M rbd/ns1/n && r create --size 4M rbd/n \
   && copy_nbd "$(spec n namespace=ns1)" "$work/ns.ref" NBD; then
  r export rbd/ns1/n "$work/ns.out" >/dev/null 2>&1; r export rbd/n "$work/n0.out" >/dev/null 2>&1
  if cmp -s "$work/ns.ref" "$work/ns.out" && cmp -s "$work/n0.out" <(head -c 4M /dev/zero); then
    ok "namespace=ns1: written into rbd/ns1/n (rbd export), rbd/n of the default namespace untouched"
  else
    bad "namespace=ns1: rbd export of rbd/ns1/n differs, or rbd/n changed"
  fi
  rm -f "$work/ns.out" "$work/n0.out"
else
  bad "namespace create / serve rbd:...,namespace=ns1 --nbd + nbdcopy into it"
fi

# 2. qemu-io writes, snapblk reads (NBD to nbdcopy and qemu-img, and FUSE).
r create --size 16M rbd/b
qemu-io -f raw -c "write -P 0x5a 0 1M" -c "write -P 0xc3 5M 3M" "$(qrbd b)" >/dev/null
qemu-img convert -f raw -O raw "$(qrbd b)" "$work/b.ref"
sock=$work/b.sock
if serve "$(spec b)" --read-only --nbd "unix:$sock" \
   && nbdcopy "$(nbd_uri "$sock")" "$work/b.nbd" \
   && qemu-img compare -q -f raw -F raw "$work/b.ref" "$(nbd_uri "$sock")"; then
  stop
  cmp -s "$work/b.ref" "$work/b.nbd" && ok "written by qemu-io rbd:, read through snapblk's NBD export (nbdcopy, qemu-img)" \
    || bad "NBD read of rbd:b differs from qemu-img's"
else
  stop; bad "serve rbd:b --read-only --nbd"
fi
mkdir -p "$work/mnt1"
if serve "$(spec b)" --read-only --fuse "$work/mnt1" && cmp -s "$work/b.ref" "$work/mnt1/disk.img"; then
  ok "FUSE export of an RBD image reads as qemu-img reads it"
else
  bad "FUSE export of rbd:b"
fi
stop

# 3. A read-only RBD snapshot: reads its data, refuses writes.
r snap create rbd/a@s1 >/dev/null 2>&1
qemu-io -f raw -c "write -P 0x11 0 64k" "$(qrbd a)" >/dev/null
out=$("$snapblk" info "$(spec a snapshot=s1)" 2>&1)
if echo "$out" | grep -q '^read-only *true' \
   && ! "$snapblk" bench "$(spec a snapshot=s1)" --rw write --bs 4k --size 64k >"$work/ro.txt" 2>&1 \
   && grep -qi 'read-only' "$work/ro.txt"; then
  ok "an RBD snapshot opens read-only, and snapblk bench refuses to write it"
else
  cat "$work/ro.txt"; bad "snapshot= must open read-only and refuse writes"
fi
sock=$work/s1.sock
if serve "$(spec a snapshot=s1)" --nbd "unix:$sock" && nbdcopy "$(nbd_uri "$sock")" "$work/s1.out" \
   && cmp -s "$work/pattern.img" "$work/s1.out"; then
  ok "the snapshot reads the data of its time, not later writes"
else
  bad "reading rbd:a@s1"
fi
stop

# The driver conformance suite (crates/conformance) on a writable image and on a snapshot; on
# the image also 30 instances dropped with reads not reaped (a queue's finished requests used
# to keep its done list and two eventfds alive: 48a25e7), checked by the open files. Its
# completion-fd check runs on 4 queues: librbd's callbacks must wake each queue's own eventfd.
r create --size 64M rbd/c
if "$conformance" "$(spec c)" --allow-destructive --drop-unreaped 30 >"$work/conf.txt" 2>&1 \
     && grep -q '^PASS drop-unreaped' "$work/conf.txt" \
     && grep -q '^PASS completion-fd: each of 4 queues wakes its own' "$work/conf.txt"; then
  ok "conformance suite, writable image: $(tail -1 "$work/conf.txt"); $(grep -m1 '^PASS drop-unreaped' "$work/conf.txt"); $(grep -m1 '^PASS completion-fd' "$work/conf.txt")"
else
  grep -E '^FAIL' "$work/conf.txt"; bad "conformance suite on rbd:c"
fi
if "$conformance" "$(spec a snapshot=s1)" >"$work/confs.txt" 2>&1 && grep -q '^PASS write-refusal' "$work/confs.txt"; then
  ok "conformance suite, snapshot (writes refused with EBADF): $(tail -1 "$work/confs.txt")"
else
  grep -E '^FAIL' "$work/confs.txt"; bad "conformance suite on rbd:a@s1"
fi

# 4. Discard and write-zeroes through snapblk read back as zeroes (qemu-io drives NBD).
r create --size 16M rbd/z
qemu-img convert -n -f raw -O raw "$work/pattern.img" "$(qrbd z)"
sock=$work/z.sock
if serve "$(spec z)" --nbd "unix:$sock" \
   && qemu-io -f raw -c "write -z 1M 1M" -c "write -z -u 3M 64k" -c "discard 4M 4M" "$(nbd_uri "$sock")" >"$work/z.log" 2>&1; then
  stop
  cp "$work/pattern.img" "$work/z.ref"
  python3 - "$work/z.ref" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    for off, n in ((1 << 20, 1 << 20), (3 << 20, 65536), (4 << 20, 4 << 20)):
        f.seek(off); f.write(bytes(n))
EOF
  if qemu-img compare -q -f raw -F raw "$work/z.ref" "$(qrbd z)"; then
    ok "write-zeroes (with and without unmap) and an object-aligned discard read back as zeroes"
  else
    bad "zeroed/discarded ranges of rbd:z are not zeroes (or other bytes changed)"
  fi
else
  cat "$work/z.log"; stop; bad "qemu-io write -z / discard through NBD on rbd:z"
fi

# 5. 4 queues x QD32 random writes, verified: Rust API, then libblkio.so.1 (C ABI).
r create --size 64M rbd/q
if "$snapblk" bench "$(spec q)" --rw randwrite --bs 4k --iodepth 32 --numjobs 4 --verify --size 16M \
     --offset_increment 16M >"$work/q.txt" 2>&1; then
  ok "4 queues x QD32 random 4 KiB writes verified ($(grep -m1 'randwrite' "$work/q.txt" | awk '{print $6}') IOPS)"
else
  tail -5 "$work/q.txt"; bad "snapblk bench rbd: 4x32 randwrite --verify"
fi
props=(--prop pool=rbd --prop image=q --prop conf= --prop "mon-host=$mon" --prop "keyring=$keyring")
if "$snapblk" bench --libblkio "$libblkio" --driver rbd "${props[@]}" --rw randwrite --bs 4k --iodepth 32 --numjobs 4 \
     --verify --size 16M --offset_increment 16M >"$work/qc.txt" 2>&1; then
  ok "the same through libblkio.so.1 (blkio_create(\"rbd\"), C ABI)"
else
  tail -5 "$work/qc.txt"; bad "bench --libblkio --driver rbd"
fi

# 6. Authentication: the right key, a wrong key, a missing keyring.
if "$snapblk" info "$(spec a)" >/dev/null 2>&1; then ok "right key connects"; else bad "right key"; fi
ceph-authtool --create-keyring "$work/wrong.keyring" --gen-key -n client.admin >/dev/null
if out=$(timeout 60 "$snapblk" info "rbd:pool=rbd,image=a,conf=,mon-host=$mon,keyring=$work/wrong.keyring,client-mount-timeout=5" 2>&1); then
  bad "a wrong key connected"
else
  # The monitor answers, so the error must say it did not let the client in (not "no monitor").
  echo "$out" | grep -q "the monitor at $mon answers but did not let client.admin in within client-mount-timeout (5 s)" \
    && ok "a wrong key is refused: ${out##*client.admin: }" || { echo "$out"; bad "wrong key message"; }
fi
if out=$(timeout 60 "$snapblk" info "rbd:pool=rbd,image=a,conf=,mon-host=$mon,keyring=$work/none.keyring" 2>&1); then
  bad "a missing keyring connected"
else
  echo "$out" | grep -q 'none.keyring: no such file' && ok "a missing keyring is refused: ${out##*: rbd: }" || { echo "$out"; bad "missing keyring message"; }
fi

# 6b. Users other than client.admin (id=): client.snapblk-rw (`profile rbd`) writes through an
# NBD export, read back by rbd export; client.snapblk-ro (`profile rbd-read-only`) may not take
# even the shared lock, is told so and how to read anyway, reads with read-only=true,lock=none,
# and still cannot write.
timeout 60 ceph auth get-or-create client.snapblk-rw mon 'profile rbd' osd 'profile rbd pool=rbd' \
  -o "$work/rw.keyring" && timeout 60 ceph auth get-or-create client.snapblk-ro mon 'profile rbd' \
  osd 'profile rbd-read-only pool=rbd' -o "$work/ro.keyring" || bad "ceph auth get-or-create"
user_spec() { echo "rbd:pool=rbd,conf=,mon-host=$mon,id=snapblk-$1,keyring=$work/$1.keyring,image=$2${3:+,$3}"; }
r create --size 4M rbd/u
head -c 4M /dev/urandom >"$work/u.img"
if copy_nbd "$(user_spec rw u)" "$work/u.img" NBD; then
  r export rbd/u "$work/u.out" >/dev/null 2>&1
  cmp -s "$work/u.img" "$work/u.out" && ok "client.snapblk-rw (profile rbd, id=) writes, rbd export reads it" \
    || bad "what client.snapblk-rw wrote differs"
else
  bad "serve as client.snapblk-rw"
fi
refused "may not take snapblk's shared lock.*lock=none" "a read-only user is told it may not lock the image" \
  "$snapblk" info "$(user_spec ro u)"
if copy_nbd "$(user_spec ro u lock=none)" NBD "$work/ro.out" --read-only; then
  cmp -s "$work/u.img" "$work/ro.out" && ok "the read-only user reads the image with lock=none and --read-only" \
    || bad "the read-only user read other bytes"
else
  bad "serve as client.snapblk-ro with lock=none"
fi
refused 'not permitted.*\(opening it writable needs write caps' "the read-only user cannot open it writable" \
  "$snapblk" info "$(user_spec ro u read-only=false,lock=none)"

# 7. The snapshot device over an RBD base reads exactly as over the local base (AOSP golden).
n=0; bad_cases=()
for d in tests/data/aosp-cow/*/; do
  [ -f "$d/snapshot.cow" ] || continue
  c=$(basename "$d"); n=$((n + 1))
  r import "$d/base.img" "rbd/g-$c" >/dev/null 2>&1
  rc_l=0; rc_r=0
  serve "snapshot:base=$d/base.img,cow=$d/snapshot.cow" --nbd "unix:$work/l.sock" || rc_l=1
  [ $rc_l = 0 ] && { nbdcopy "$(nbd_uri "$work/l.sock")" "$work/l.img" || rc_l=1; stop; }
  serve "snapshot:cow=$d/snapshot.cow,base.driver=rbd,base.pool=rbd,base.image=g-$c,base.conf=,base.mon-host=$mon,base.keyring=$keyring" \
    --nbd "unix:$work/r.sock" >/dev/null || rc_r=1
  [ $rc_r = 0 ] && { nbdcopy "$(nbd_uri "$work/r.sock")" "$work/r.img" || rc_r=1; stop; }
  # Every case serves on both sides, alike, and as AOSP's target image of the case.
  if [ $rc_l != 0 ] || [ $rc_r != 0 ] || ! cmp -s "$work/l.img" "$work/r.img" || ! cmp -s "$work/r.img" "$d/target.img"; then
    bad_cases+=("$c")
  fi
  rm -f "$work/l.img" "$work/r.img"
done
if [ "$n" -eq 16 ] && [ ${#bad_cases[@]} -eq 0 ]; then
  ok "snapshot over an RBD base (base.driver=rbd) serves what it serves over the local base, AOSP's target image: $n golden cases"
else
  bad "golden cases over RBD: $n cases, differing: ${bad_cases[*]}"
fi
c=v2_basic_none; d=tests/data/aosp-cow/$c
if "$snapblk" bench --libblkio "$libblkio" --driver snapshot --prop "cow=$d/snapshot.cow" --prop base.driver=rbd \
     --prop base.pool=rbd --prop "base.image=g-$c" --prop base.conf= --prop "base.mon-host=$mon" \
     --prop "base.keyring=$keyring" --rw read --bs 4k >"$work/nc.txt" 2>&1; then
  ok "a nested spec through the C ABI: blkio_set_str(\"base.driver\", \"rbd\") and base.* properties"
else
  tail -5 "$work/nc.txt"; bad "bench --libblkio --driver snapshot --prop base.driver=rbd"
fi

# 8. A merge and a server of one RBD base keep each other out (snapblk's lock on the image).
d=tests/data/aosp-cow/v2_basic_none
cp "$d/snapshot.cow" "$work/m.cow"
snap_rbd="snapshot:base.driver=rbd,base.pool=rbd,base.image=g-v2_basic_none,base.conf=,base.mon-host=$mon,base.keyring=$keyring"
if serve "$snap_rbd,cow=$d/snapshot.cow" --nbd "unix:$work/m1.sock"; then
  if out=$(timeout 60 "$snapblk" serve "$snap_rbd,cow=$work/m.cow,merge=true" --nbd "unix:$work/m2.sock" 2>&1); then
    bad "a merge started while a server reads the base"
  else
    echo "$out" | grep -q 'in use by another client' && ok "a merge is refused while a server reads the RBD base: ${out##*: }" \
      || { echo "$out"; bad "merge refusal message"; }
  fi
  stop
else
  bad "serve the snapshot over rbd"
fi
if serve "$(spec q)" --nbd "unix:$work/w.sock"; then
  if out=$(timeout 60 "$snapblk" info "$(spec q)" 2>&1); then
    bad "a reader opened an image a writable server holds"
  else
    echo "$out" | grep -q 'in use by another client' && ok "a reader is refused while a writable server holds the image" || { echo "$out"; bad "reader refusal"; }
  fi
  stop
  "$snapblk" info "$(spec q)" >/dev/null 2>&1 && ok "the lock is released when the server stops" || bad "lock left after the server stopped"
else
  bad "serve rbd:q"
fi

# 8a. The lock modes named explicitly: two writable opens with lock=shared share the image
# (servers of one image with a cluster file system on it); a writable open with the default
# lock (exclusive) is refused while they hold it; lock=exclusive on a read-only open keeps
# readers out too; lock=none ignores every lock; an unknown mode is refused by name.
if serve "$(spec q lock=shared)" --nbd "unix:$work/s1.sock"; then
  s1=$srv
  if serve "$(spec q lock=shared)" --nbd "unix:$work/s2.sock"; then
    ok "two writable opens with lock=shared hold the image together"
    refused 'in use by another client' "a writable open with the default lock is refused beside them" \
      "$snapblk" info "$(spec q read-only=false)"
    "$snapblk" info "$(spec q lock=none)" >/dev/null 2>&1 && ok "lock=none opens beside them" || bad "lock=none beside lock=shared"
    stop
  else
    stop; bad "a second lock=shared server"
  fi
  srv=$s1; stop
else
  bad "serve with lock=shared"
fi
if serve "$(spec q lock=exclusive)" --read-only --nbd "unix:$work/x.sock"; then
  refused 'in use by another client' "lock=exclusive on a read-only open keeps readers out" \
    "$snapblk" info "$(spec q)"
  stop
else
  bad "serve --read-only with lock=exclusive"
fi
refused 'lock must be auto, shared, exclusive or none, not "sometimes"' "an unknown lock mode is refused by name" \
  "$snapblk" info "$(spec q lock=sometimes)"

# 8b. A merge over an RBD base writes the new image into RBD: `rbd import` the old image, serve
# the snapshot with --merge until it reports done, `rbd export` and cmp with AOSP's target.img.
# A COW whose merge order cannot be followed in place is refused before anything is written.
n=0; bad_cases=()
for d in tests/data/aosp-cow/*/; do
  [ -f "$d/snapshot.cow" ] || continue
  c=$(basename "$d"); n=$((n + 1))
  r import "$d/base.img" "rbd/m-$c" >/dev/null 2>&1 || { bad_cases+=("$c:import"); continue; }
  cp "$d/snapshot.cow" "$work/mg.cow"
  if "$snapblk" merge --check "$work/mg.cow" --base "$d/base.img" >/dev/null 2>&1; then want=target; else want=base; fi
  spec_m="snapshot:cow=$work/mg.cow,base.driver=rbd,base.pool=rbd,base.image=m-$c,base.conf=,base.mon-host=$mon,base.keyring=$keyring"
  st=""; rm -f "$work"/serve.*
  if serve "$spec_m" --merge --nbd "unix:$work/mg.sock" >/dev/null 2>&1; then
    for _ in $(seq 600); do
      st=$(grep -m1 '"event":"merge"' "$work"/serve.* 2>/dev/null | grep -o '"state":"[a-z]*"' | head -1)
      [ -n "$st" ] && break
      sleep 0.1
    done
    stop
  fi
  rm -f "$work"/serve.*
  r export "rbd/m-$c" "$work/mg.img" >/dev/null 2>&1
  if [ $want = target ] && [ "$st" = '"state":"done"' ] && cmp -s "$work/mg.img" "$d/target.img"; then :
  elif [ $want = base ] && [ "$st" != '"state":"done"' ] && cmp -s "$work/mg.img" "$d/base.img"; then :
  else bad_cases+=("$c:$want:${st:-no-merge-line}"); fi
  rm -f "$work/mg.img"
  r rm "rbd/m-$c" >/dev/null 2>&1
done
if [ "$n" -eq 16 ] && [ ${#bad_cases[@]} -eq 0 ]; then
  ok "serve --merge over an RBD base: rbd export equals AOSP's target.img ($n golden cases; unmergeable ones refused, base unchanged)"
else
  bad "merge over RBD: $n cases, wrong: ${bad_cases[*]}"
fi

# 8c. A writable server that loses its exclusive lock never writes again: once another client
# breaks and takes the lock (`rados lock break` + `rados lock get`), or once the client is
# blocklisted (`ceph osd blocklist add`), its next writes fail with EIO (qemu-io through NBD),
# and so does its final flush at stop; it says so once in its log, and `rbd export` shows the
# image with the write made before the loss and none after.
lock_holder() { # IMAGE -> "LOCKER COOKIE ADDR" of snapblk's lock on the image's header
  local id
  id=$(r info "rbd/$1" --format json | python3 -c 'import json,sys;print(json.load(sys.stdin)["id"])')
  timeout 60 rados -p rbd lock info "rbd_header.$id" snapblk --format json | python3 -c '
import json,sys
l = json.load(sys.stdin)["lockers"][0]
print(l["name"], l["cookie"], l["addr"])'
}
header() { echo "rbd_header.$(r info "rbd/$1" --format json | python3 -c 'import json,sys;print(json.load(sys.stdin)["id"])')"; }
wait_lost() { # wait (bounded) for the server's one log line about the lost lock
  for _ in $(seq 600); do grep -q 'lost the exclusive lock' "$serr" && return 0; sleep 0.1; done
  return 1
}
lock_case() { # NAME HOW: serve rbd/NAME, write once, lose the lock by HOW, write again
  local name=$1 how=$2 holder out n
  r create --size 16M "rbd/$name"
  qemu-img convert -n -f raw -O raw "$work/pattern.img" "$(qrbd "$name")"
  cp "$work/pattern.img" "$work/$name.ref"
  python3 -c 'import sys
with open(sys.argv[1], "r+b") as f: f.write(b"\x33" * 65536)' "$work/$name.ref"
  serve "$(spec "$name")" --nbd "unix:$work/$name.sock" || { bad "$how: serve rbd/$name"; return; }
  if ! qemu-io -f raw -c "write -P 0x33 0 64k" -c flush "$(nbd_uri "$work/$name.sock")" >"$work/$name.w1" 2>&1 \
     || grep -q 'failed' "$work/$name.w1"; then
    cat "$work/$name.w1"; stop; bad "$how: a write while the lock is held"; return
  fi
  read -r holder cookie addr < <(lock_holder "$name")
  case $how in
    taken)
      timeout 60 rados -p rbd lock break "$(header "$name")" snapblk "$holder" --lock-cookie "$cookie" \
        && timeout 60 rados -p rbd lock get "$(header "$name")" snapblk --lock-cookie intruder \
             --lock-type exclusive --lock-duration 300 ;;
    blocklisted)
      timeout 60 ceph osd blocklist add "$addr" >/dev/null 2>&1 ;;
  esac || { stop; bad "$how: could not take the lock away ($holder $cookie $addr)"; return; }
  if ! wait_lost; then
    cat "$serr"; stop; bad "$how: the server did not notice it lost the lock within 60 s"; return
  fi
  out=$(timeout 120 qemu-io -f raw -c "write -P 0x44 1M 64k" -c "write -P 0x55 0 4k" \
        "$(nbd_uri "$work/$name.sock")" 2>&1)
  stop # its final flush must be refused too
  n=$(grep -c 'lost the exclusive lock' "$serr")
  [ "$how" = blocklisted ] && timeout 60 ceph osd blocklist rm "$addr" >/dev/null 2>&1
  [ "$how" = taken ] && timeout 60 rados -p rbd lock break "$(header "$name")" snapblk "$(lock_holder "$name" | cut -d' ' -f1)" --lock-cookie intruder
  r export "rbd/$name" "$work/$name.out" >/dev/null 2>&1
  if [ "$(echo "$out" | grep -c 'write failed: Input/output error')" = 2 ] && [ "$n" = 1 ] \
     && grep -q 'final flush: .*exclusive lock was lost' "$serr" \
     && cmp -s "$work/$name.ref" "$work/$name.out"; then
    ok "lock $how: later writes and the final flush fail with EIO, logged once, the image holds no write after the loss"
  else
    echo "$out"; grep 'lost' "$serr"; cmp "$work/$name.ref" "$work/$name.out"
    bad "lock $how: writes after the loss (log lines: $n)"
  fi
  rm -f "$work/$name".*
}
lock_case lk1 taken
lock_case lk2 blocklisted

# 8e. cache=true: a write librbd accepted into its write-back cache before the client was
# blocklisted never reaches the image, and nothing reports it durable: the next flush (here the
# FUA of qemu-io's write-through write, then a plain flush) fails with EIO, not ESHUTDOWN (which
# an NBD client reads as "server shutting down"), the lock is marked lost at that first failed
# I/O (logged once, before any renewal finds out), and `rbd export` shows neither write. A
# conf file makes the cache hold dirty data (write-back policy, 60 s dirty age).
printf '[client]\nrbd cache policy = writeback\nrbd cache max dirty age = 60\n' >"$work/wb.conf"
r create --size 16M rbd/lkc
qemu-img convert -n -f raw -O raw "$work/pattern.img" "$(qrbd lkc)"
wb_spec="rbd:pool=rbd,image=lkc,conf=$work/wb.conf,mon-host=$mon,keyring=$keyring,cache=true"
if serve "$wb_spec" --nbd "unix:$work/lkc.sock"; then
  rm -f "$work/lkc.fifo"; mkfifo "$work/lkc.fifo"
  qemu-io -t writeback -f raw "$(nbd_uri "$work/lkc.sock")" <"$work/lkc.fifo" >"$work/lkc.qio" 2>&1 &
  qp=$!; pids+=("$qp")
  exec 4>"$work/lkc.fifo"
  echo "write -P 0x33 0 64k" >&4
  for _ in $(seq 100); do grep -q 'wrote 65536' "$work/lkc.qio" && break; sleep 0.1; done
  r export rbd/lkc "$work/lkc.held" >/dev/null 2>&1
  read -r _ _ addr < <(lock_holder lkc)
  timeout 60 ceph osd blocklist add "$addr" >/dev/null 2>&1
  out=$(timeout 120 qemu-io -f raw -c "write -P 0x44 1M 64k" "$(nbd_uri "$work/lkc.sock")" 2>&1)
  timeout 120 qemu-io -f raw -c flush "$(nbd_uri "$work/lkc.sock")" >/dev/null 2>&1; frc=$?
  echo quit >&4; exec 4>&-; wait "$qp"
  stop
  timeout 60 ceph osd blocklist rm "$addr" >/dev/null 2>&1
  r export rbd/lkc "$work/lkc.out" >/dev/null 2>&1
  n=$(grep -c 'lost the exclusive lock' "$serr")
  if grep -q 'wrote 65536' "$work/lkc.qio" && cmp -s "$work/pattern.img" "$work/lkc.held" \
     && [ "$out" = "write failed: Input/output error" ] && [ $frc -ne 0 ] && [ "$n" = 1 ] \
     && grep -q 'this client blocklisted' "$serr" && cmp -s "$work/pattern.img" "$work/lkc.out"; then
    ok "cache=true, client blocklisted: the cached write never reaches the image; flushes fail with EIO"
  else
    cat "$work/lkc.qio"; echo "$out (flush rc $frc, log lines $n)"; cat "$serr"
    cmp "$work/pattern.img" "$work/lkc.held"; cmp "$work/pattern.img" "$work/lkc.out"
    bad "cache=true: a write cached before the blocklist"
  fi
else
  bad "serve $wb_spec"
fi
rm -f "$work"/lkc.*

# 8g. FUA is a write and a flush. With librbd's cache in write-back mode (its default policy,
# write-around, sends every write to the OSDs at once) and its age-based write-back held off
# (rbd cache max dirty age = 600 s), qemu-io (-t writeback: by default it opens
# write-through, which makes every write FUA) writes through the NBD export a FUA write, then a
# plain write, and stays connected: rbd export (another client) must see the FUA write at
# once and not the plain one, which is still in the server's cache; once the server stops (its
# final flush), the plain write is there too.
r create --size 4M rbd/f
printf '[client]\nrbd cache policy = writeback\nrbd cache max dirty age = 600\n' >"$work/fua.conf"
# is4k FILE OFFSET BYTE: the 4 KiB of FILE at OFFSET are all BYTE (a tr(1) character).
is4k() { cmp -s -n 4096 -i "$2:0" "$1" <(head -c 4096 /dev/zero | tr '\0' "$3"); }
if serve "rbd:pool=rbd,image=f,conf=$work/fua.conf,mon-host=$mon,keyring=$keyring,cache=true" --nbd "unix:$work/f.sock"; then
  stdbuf -oL qemu-io -f raw -t writeback -c "write -f -P 0xa5 1M 4k" -c "write -P 0x5a 0 4k" -c "sleep 60000" \
    "$(nbd_uri "$work/f.sock")" >"$work/f.qio" 2>&1 &
  qio=$!; pids+=("$qio")
  for _ in $(seq 100); do [ "$(grep -c '^wrote' "$work/f.qio")" = 2 ] && break; sleep 0.2; done
  r export rbd/f "$work/f.mid" >/dev/null 2>&1
  kill "$qio" 2>/dev/null; wait "$qio" 2>/dev/null
  stop
  r export rbd/f "$work/f.end" >/dev/null 2>&1
  if [ "$(grep -c '^wrote' "$work/f.qio")" = 2 ] \
     && is4k "$work/f.mid" 1M '\245' && is4k "$work/f.mid" 0 '\0' \
     && is4k "$work/f.end" 0 'Z' && is4k "$work/f.end" 1M '\245'; then
    ok "a FUA write through cache=true is on the image at once, a plain one only after the final flush"
  else
    cat "$work/f.qio"; od -A d -t x1 -j 1048576 -N 16 "$work/f.mid"; od -A d -t x1 -N 16 "$work/f.mid"
    od -A d -t x1 -N 16 "$work/f.end"; bad "FUA through cache=true"
  fi
else
  bad "serve rbd:f with cache=true"
fi

# 8d. `snapblk merge COW --base rbd:...`: the standalone merge into an RBD image. The COW and its
# record are made against the image itself (`cow create --old rbd:...`, read through the driver)
# after `rbd import` of the old image; `rbd export` is the oracle (sha256 of the new image).
python3 - "$work" <<'EOF'
import random, sys
r = random.Random(7); bs = 4096; n = 4096          # 16 MiB, about 2000 ops
old = bytearray(r.randbytes(bs * n)); new = bytearray(old)
for i in range(0, n, 3):                            # moved blocks: COPY
    j = r.randrange(n); new[i*bs:(i+1)*bs] = old[j*bs:(j+1)*bs]
for i in range(1, n, 7):                            # small changes: XOR
    k = r.randrange(bs - 16); new[i*bs+k:i*bs+k+16] = r.randbytes(16)
for i in range(2, n, 11):                           # new data: REPLACE
    new[i*bs:(i+1)*bs] = r.randbytes(bs)
wrong = bytearray(old)
for i in range(0, n, 4): wrong[i*bs:i*bs+8] = b"WRONGBAS"
d = sys.argv[1]
open(d + "/mo.img", "wb").write(old); open(d + "/mn.img", "wb").write(new)
open(d + "/mw.img", "wb").write(wrong)
EOF
sha() { sha256sum "$1" | cut -d' ' -f1; }
exported() { r export "rbd/$1" "$work/x.img" >/dev/null 2>&1 && sha "$work/x.img"; rm -f "$work/x.img"; }
merged_ops() { python3 -c 'import struct,sys;print(struct.unpack_from("<Q",open(sys.argv[1],"rb").read(34),26)[0])' "$1"; }
new_sha=$(sha "$work/mn.img"); old_sha=$(sha "$work/mo.img"); wrong_sha=$(sha "$work/mw.img")
for i in mo mw k1 k2 k3; do
  case $i in mw) f=mw ;; *) f=mo ;; esac
  r import "$work/$f.img" "rbd/$i" >/dev/null 2>&1 || bad "rbd import $i"
done
if "$snapblk" cow create --old "$(spec mo)" --new "$work/mn.img" -o "$work/k.cow" >"$work/kc.txt" 2>&1 \
   && "$snapblk" cow verify "$work/k.cow" --base "$(spec mo)" >>"$work/kc.txt" 2>&1 \
   && grep -q 'base matches the record' "$work/kc.txt"; then
  ok "cow create --old rbd:... and cow verify --base rbd:... (the base read through the driver)"
else
  cat "$work/kc.txt"; bad "cow create / cow verify against an RBD image"
fi
total=$("$snapblk" cow inspect --json "$work/k.cow" | python3 -c 'import json,sys;print(json.load(sys.stdin)["merge"]["total"])')
kcow() { cp "$work/k.cow" "$work/$1.cow"; cp "$work/k.cow.snapblk" "$work/$1.cow.snapblk"; }

# A merge into the image the COW was made against gives the new image.
kcow k1
if "$snapblk" merge "$work/k1.cow" --base "$(spec k1)" --verify-base >"$work/k1.txt" 2>&1 \
   && [ "$(exported k1)" = "$new_sha" ]; then
  ok "snapblk merge --base rbd:... --verify-base: rbd export equals the new image ($(grep -o 'merged [0-9]* ops' "$work/k1.txt"))"
else
  cat "$work/k1.txt"; bad "snapblk merge into rbd/k1"
fi

# A merge stopped midway (SIGSTOP at the first commits): a reader of the image is refused while
# the merge holds it; then SIGKILL. A resume is refused while the dead merge's lock lasts (up
# to 30 s), goes on once the lock is broken, and ends with the new image.
kcow k2
"$snapblk" merge "$work/k2.cow" --base "$(spec k2)" >"$work/k2.txt" 2>&1 &
mp=$!; pids+=("$mp"); n=0
for _ in $(seq 600); do
  n=$(merged_ops "$work/k2.cow"); [ "$n" -gt 0 ] && { kill -STOP "$mp"; break; }
  kill -0 "$mp" 2>/dev/null || break; sleep 0.02
done
n=$(merged_ops "$work/k2.cow")
if out=$(timeout 60 "$snapblk" info "$(spec k2)" 2>&1); then
  bad "a reader opened an image a merge is writing"
else
  echo "$out" | grep -q 'in use by another client' && ok "a server (reader) of the image is refused while snapblk merge holds it" \
    || { echo "$out"; bad "reader refusal during a merge"; }
fi
kill -KILL "$mp"; wait "$mp" 2>/dev/null
if [ "$n" -gt 0 ] && [ "$n" -lt "${total:-0}" ]; then
  if out=$(timeout 60 "$snapblk" merge "$work/k2.cow" --base "$(spec k2)" 2>&1); then
    bad "a resume went on while the killed merge's lock was on the image"
  else
    echo "$out" | grep -q 'in use by another client' || { echo "$out"; bad "resume under the dead merge's lock: message"; }
  fi
  read -r holder cookie _ < <(lock_holder k2)
  timeout 60 rados -p rbd lock break "$(header k2)" snapblk "$holder" --lock-cookie "$cookie"
  if "$snapblk" merge "$work/k2.cow" --base "$(spec k2)" >"$work/k2.txt" 2>&1 \
     && grep -q "resumed at op $n" "$work/k2.txt" && [ "$(exported k2)" = "$new_sha" ]; then
    ok "a merge into RBD killed (SIGKILL) at op $n of $total resumes there and gives the new image"
  else
    cat "$work/k2.txt"; bad "resume of the killed merge into rbd/k2"
  fi
else
  cat "$work/k2.txt"; bad "the merge was not stopped midway ($n of $total ops)"
fi

# A server of the image keeps the merge out, and nothing is written.
kcow k3
if serve "$(spec k3)" --read-only --nbd "unix:$work/k3.sock"; then
  if out=$(timeout 60 "$snapblk" merge "$work/k3.cow" --base "$(spec k3)" 2>&1); then
    bad "a merge ran while a server reads the image"
  else
    stop
    echo "$out" | grep -q 'in use by another client' && [ "$(merged_ops "$work/k3.cow")" = 0 ] \
      && [ "$(exported k3)" = "$old_sha" ] && ok "snapblk merge is refused while a server reads the RBD image; nothing written" \
      || { echo "$out"; bad "merge refusal under a server"; }
  fi
  stop
else
  bad "serve rbd/k3"
fi

# The wrong base is refused before anything is written: by the record (blocks the COW reads),
# by --verify-base, and, without a record, by --base-sha256.
kcow kw
wrong_ok=1
for how in record verify-base base-sha256; do
  case $how in
    record) args=(); want="not the file this COW's merge belongs to" ;;
    verify-base) args=(--verify-base); want="is not the image this COW was made for" ;;
    base-sha256) args=(--no-record --base-sha256 "$old_sha"); want="not the --base-sha256 given" ;;
  esac
  if out=$(timeout 120 "$snapblk" merge "$work/kw.cow" --base "$(spec mw)" "${args[@]}" 2>&1); then
    wrong_ok=0; echo "$how: merged into the wrong base"
  elif ! echo "$out" | grep -qF "$want"; then
    wrong_ok=0; echo "$how: $out"
  fi
done
if [ $wrong_ok = 1 ] && [ "$(merged_ops "$work/kw.cow")" = 0 ] && [ "$(exported mw)" = "$wrong_sha" ]; then
  ok "a wrong base in RBD is refused (record, --verify-base, --base-sha256); rbd export unchanged"
else
  bad "wrong base in RBD"
fi
for i in mo mw k1 k2 k3; do r rm "rbd/$i" >/dev/null 2>&1; done
rm -f "$work"/m[onw].img "$work"/k*.cow "$work"/k*.cow.snapblk

# 8f. `cow apply --base rbd:...` and updates that change the size, merged into RBD. A 4 MiB old
# image; a shrinking update (3 MiB) and a growing one (5 MiB), their COWs and records made from
# the local files by `cow create`. Oracles: sha256 of the new images, `rbd info` (size) and
# `rbd export` (content) of the images snapblk wrote.
python3 - "$work" <<'EOF'
import random, sys
r = random.Random(11); bs = 4096; n = 1024
old = bytearray(r.randbytes(bs * n))
def update(m):
    new = bytearray(old[:m * bs]) + bytearray(r.randbytes(max(0, m - n) * bs))
    for i in range(0, min(m, n), 5):                # moved blocks: COPY
        j = r.randrange(n); new[i*bs:(i+1)*bs] = old[j*bs:(j+1)*bs]
    for i in range(2, m, 9):                        # new data: REPLACE
        new[i*bs:(i+1)*bs] = r.randbytes(bs)
    return new
d = sys.argv[1]
open(d + "/ro.img", "wb").write(old)
open(d + "/rs.img", "wb").write(update(768))
open(d + "/rg.img", "wb").write(update(1280))
EOF
rsize() { r info "rbd/$1" --format json | python3 -c 'import json,sys;print(json.load(sys.stdin)["size"])'; }
s_sha=$(sha "$work/rs.img"); g_sha=$(sha "$work/rg.img"); o_sha=$(sha "$work/ro.img")
for i in ra s1 s2 g1 g2; do r import "$work/ro.img" "rbd/$i" >/dev/null 2>&1 || bad "rbd import $i"; done
r create --size 1M rbd/ab >/dev/null 2>&1 || bad "rbd create ab"
for u in s g; do
  "$snapblk" cow create --old "$work/ro.img" --new "$work/r$u.img" -o "$work/$u.cow" >/dev/null 2>&1 \
    || bad "cow create $u.cow"
done

# cow apply reads the base from RBD into a new file, for both updates.
if "$snapblk" cow apply "$work/s.cow" --base "$(spec ra)" -o "$work/as.img" >"$work/a.txt" 2>&1 \
   && "$snapblk" cow apply "$work/g.cow" --base "$(spec ra)" -o "$work/ag.img" >>"$work/a.txt" 2>&1 \
   && [ "$(sha "$work/as.img")" = "$s_sha" ] && [ "$(sha "$work/ag.img")" = "$g_sha" ]; then
  ok "cow apply --base rbd:...: the shrinking and the growing update's files equal the new images"
else
  cat "$work/a.txt"; bad "cow apply with an RBD base"
fi
# ... and writes into another RBD image in place (grown from 1 MiB, then shrunk to the image).
if "$snapblk" cow apply "$work/g.cow" --base "$(spec ra)" -o "$(spec ab)" --in-place >"$work/a.txt" 2>&1 \
   && [ "$(rsize ab)" = 5242880 ] && [ "$(exported ab)" = "$g_sha" ] \
   && "$snapblk" cow apply "$work/s.cow" --base "$(spec ra)" -o "$(spec ab)" --in-place >>"$work/a.txt" 2>&1 \
   && [ "$(rsize ab)" = 3145728 ] && [ "$(exported ab)" = "$s_sha" ]; then
  ok "cow apply -o rbd:... --in-place: rbd info size and rbd export equal the new image (grown, then shrunk)"
else
  cat "$work/a.txt"; bad "cow apply into an RBD image"
fi
# An output naming the base's image (also spelled differently) or a device without --in-place
# is refused before anything is opened for writing.
refusals=1
for o in "$(spec ra)" "rbd:image=ra,pool=rbd,namespace=,mon-host=$mon,keyring=$keyring,conf=,cache=true"; do
  if out=$("$snapblk" cow apply "$work/g.cow" --base "$(spec ra)" -o "$o" --in-place 2>&1) \
     || ! echo "$out" | grep -q 'name the same RBD image'; then
    refusals=0; echo "$out"
  fi
done
if out=$("$snapblk" cow apply "$work/g.cow" --base "$work/ro.img" -o "$(spec ab)" 2>&1) \
   || ! echo "$out" | grep -q 'give --in-place'; then
  refusals=0; echo "$out"
fi
if [ $refusals = 1 ] && [ "$(rsize ra)" = 4194304 ] && [ "$(exported ra)" = "$o_sha" ] \
   && [ "$(exported ab)" = "$s_sha" ]; then
  ok "cow apply refuses -o naming the base's RBD image, and a device output without --in-place; nothing written"
else
  bad "cow apply output refusals"
fi

# Merges into RBD end at the new image's size: the shrink resizes the image after the last op,
# the grow before the first write.
for u in s g; do cp "$work/$u.cow" "$work/${u}1.cow"; cp "$work/$u.cow.snapblk" "$work/${u}1.cow.snapblk"; done
if "$snapblk" merge "$work/s1.cow" --base "$(spec s1)" --verify-base >"$work/m.txt" 2>&1 \
   && grep -q 'truncated to .*(3145728 bytes)' "$work/m.txt" \
   && [ "$(rsize s1)" = 3145728 ] && [ "$(exported s1)" = "$s_sha" ]; then
  ok "a shrinking update merged into RBD: rbd info size and rbd export equal the new image"
else
  cat "$work/m.txt"; echo "size $(rsize s1)"; bad "shrinking merge into RBD"
fi
# merge --check sees the image as the merge will grow it, and changes nothing.
if "$snapblk" merge "$work/g1.cow" --base "$(spec g1)" --check >"$work/m.txt" 2>&1 \
   && grep -q '^mergeable: 0/' "$work/m.txt" \
   && grep -q 'grows base .* from 4194304 to 5242880 bytes' "$work/m.txt" \
   && "$snapblk" merge "$work/g1.cow" --base "$(spec g1)" --check --json >"$work/mj.txt" 2>&1 \
   && grep -q '"base_grown_to":5242880' "$work/mj.txt" \
   && [ "$(rsize g1)" = 4194304 ] && [ "$(exported g1)" = "$o_sha" ]; then
  ok "merge --check of a growing update into RBD: mergeable, says the merge grows the image; nothing changed"
else
  cat "$work/m.txt" "$work/mj.txt"; echo "size $(rsize g1)"; bad "merge --check of a growing update into RBD"
fi
# A growing update whose COW has a corrupt payload is refused by the whole pre-merge check
# before the image is grown: rbd info still says 4 MiB, rbd export the old image.
cp "$work/g.cow" "$work/g2.cow"; cp "$work/g.cow.snapblk" "$work/g2.cow.snapblk"
"$snapblk" cow inspect "$work/g2.cow" --ops --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
p = [o["kind"]["payload"] for o in d["ops"] if o["kind"].get("type") == "replace"][-1]
f = open(sys.argv[1], "r+b"); f.seek(p["offset"] + p["len"] // 2)
b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0xff]))' "$work/g2.cow"
if ! "$snapblk" merge "$work/g2.cow" --base "$(spec g2)" >"$work/m.txt" 2>&1 \
   && [ "$(rsize g2)" = 4194304 ] && [ "$(exported g2)" = "$o_sha" ]; then
  ok "a growing update with a corrupt payload is refused before the RBD image is grown"
else
  cat "$work/m.txt"; echo "size $(rsize g2)"; bad "growing merge with a corrupt payload"
fi
if "$snapblk" merge "$work/g1.cow" --base "$(spec g1)" --verify-base >"$work/m.txt" 2>&1 \
   && [ "$(rsize g1)" = 5242880 ] && [ "$(exported g1)" = "$g_sha" ]; then
  ok "a growing update merged into RBD: the image grown first; rbd info size and rbd export equal the new image"
else
  cat "$work/m.txt"; echo "size $(rsize g1)"; bad "growing merge into RBD"
fi

# A shrinking merge killed after its last op, before the resize: `serve --merge` merges the
# whole COW and is killed with SIGKILL once it reports done (it never resizes, so the image is
# still 4 MiB with the new image in front); `snapblk merge` then resumes, finds every op merged
# and resizes; a run after the resize changes nothing.
cp "$work/s.cow" "$work/s2.cow"; cp "$work/s.cow.snapblk" "$work/s2.cow.snapblk"
spec_s2="snapshot:cow=$work/s2.cow,base.driver=rbd,base.pool=rbd,base.image=s2,base.conf=,base.mon-host=$mon,base.keyring=$keyring"
st=""; rm -f "$work"/serve.*
if serve "$spec_s2" --merge --nbd "unix:$work/s2.sock" >/dev/null 2>&1; then
  for _ in $(seq 600); do
    st=$(grep -m1 '"event":"merge"' "$work"/serve.* 2>/dev/null | grep -o '"state":"[a-z]*"' | head -1)
    [ -n "$st" ] && break
    sleep 0.1
  done
  kill -KILL "$srv"; wait "$srv" 2>/dev/null
fi
rm -f "$work"/serve.*
read -r holder cookie _ < <(lock_holder s2)
[ -n "$holder" ] && timeout 60 rados -p rbd lock break "$(header s2)" snapblk "$holder" --lock-cookie "$cookie"
before=$(rsize s2)
if [ "$st" = '"state":"done"' ] && [ "$before" = 4194304 ] \
   && "$snapblk" merge "$work/s2.cow" --base "$(spec s2)" >"$work/m.txt" 2>&1 \
   && grep -q 'truncated to .*(3145728 bytes)' "$work/m.txt" \
   && [ "$(rsize s2)" = 3145728 ] && [ "$(exported s2)" = "$s_sha" ] \
   && "$snapblk" merge "$work/s2.cow" --base "$(spec s2)" --verify-base >"$work/m2.txt" 2>&1 \
   && ! grep -q 'truncated to' "$work/m2.txt" \
   && [ "$(rsize s2)" = 3145728 ] && [ "$(exported s2)" = "$s_sha" ]; then
  ok "a shrinking merge into RBD killed (SIGKILL) after its last op resumes with the resize; a run after it changes nothing"
else
  cat "$work/m.txt" "$work/m2.txt"; echo "state ${st:-none}, size $before then $(rsize s2)"; bad "resume of a shrinking merge into RBD"
fi
for i in ra ab s1 s2 g1; do r rm "rbd/$i" >/dev/null 2>&1; done
rm -f "$work"/r[osg].img "$work"/a[sg].img "$work"/[sg]*.cow "$work"/[sg]*.cow.snapblk

# 9. Timeouts: an OSD that stops answering mid-I/O, then a monitor that does not answer.
osd=$(cat "$cluster/run/osd.0.pid")
"$snapblk" bench "$(spec q rados-osd-op-timeout=3)" --rw randwrite --bs 4k --iodepth 8 --runtime 60 >"$work/t.txt" 2>&1 &
b=$!; pids+=("$b")
sleep 2; kill -STOP "$osd"
for _ in $(seq 300); do kill -0 "$b" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$b" 2>/dev/null; then
  bad "I/O to a stopped OSD still waiting after 30 s (rados-osd-op-timeout=3)"; kill "$b"
fi
wait "$b"; rc=$?
kill -CONT "$osd"
if [ $rc -ne 0 ] && grep -qi 'timed out' "$work/t.txt"; then
  ok "I/O to an OSD stopped mid-run fails with a timeout, not a hang ($(grep -io '[^:]*timed out' "$work/t.txt" | head -1))"
else
  tail -5 "$work/t.txt"; bad "stopped OSD: rc=$rc"
fi
monpid=$(cat "$cluster/run/mon.a.pid")
kill -STOP "$monpid"
# With the default client-mount-timeout (librados's own is 300 s): the error must come within
# 10 s, the value librados reports back in the message.
out=$(timeout 30 "$snapblk" info "$(spec a)" 2>&1); rc=$?
kill -CONT "$monpid"
# A stopped monitor still accepts TCP connections (the kernel does), but never greets: the
# error must say no monitor answered, not blame the key.
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
   echo "$out" | grep -q 'connecting to the cluster.*no monitor answered at .* within client-mount-timeout (10 s)'; then
  ok "connecting to a cluster whose monitor does not answer fails within the timeout: ${out##*: }"
else
  echo "$out"; bad "stopped monitor: rc=$rc (124 = still waiting after 30 s)"
fi

finish
