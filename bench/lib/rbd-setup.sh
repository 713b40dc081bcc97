# Sourced by bench/rbd-bench.sh and bench/rbd-cost.sh: what both need before their runs.
#
#   rbd_setup NAME   check fio's rbd engine; find (or build) the release snapblk and
#                    libblkio.so; start scripts/ceph-cluster.sh's cluster (no radosgw, monitor
#                    on CEPH_MON_PORT, default 13300) in a new /tmp/NAME.XXXXXX, stopped and
#                    removed at exit; create the 256 MiB image rbd/bench and fill it, so reads
#                    hit stored objects rather than holes.
#
# Sets SNAPBLK, LIB, WORK, CEPH_CONF (exported: the cluster's ceph.conf) and NOCACHE_CONF (the
# same with `rbd cache = false`). Call it from the repository's root.
rbd_setup() {
  fio --enghelp=rbd >/dev/null 2>&1 || { echo "fio lacks the rbd engine" >&2; exit 1; }
  local tgt=${CARGO_TARGET_DIR:-$PWD/target}
  [ -x "$tgt/release/snapblk" ] && [ -e "$tgt/release/libblkio.so" ] \
    || cargo build --release -p snapblk-cli -p snapblk-capi
  SNAPBLK=$tgt/release/snapblk
  LIB=$tgt/release/libblkio.so
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  trap 'bash scripts/ceph-cluster.sh down "$WORK/cluster"; rm -rf "$WORK"' EXIT
  CEPH_RGW_PORT=0 CEPH_MON_PORT=${CEPH_MON_PORT:-13300} bash scripts/ceph-cluster.sh up "$WORK/cluster" \
    >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
  export CEPH_CONF=$WORK/cluster/ceph.conf
  NOCACHE_CONF=$WORK/nocache.conf
  sed 's/^\[global\]$/[global]\nrbd cache = false/' "$CEPH_CONF" >"$NOCACHE_CONF"
  timeout 60 rbd create --size 256M rbd/bench
  timeout 300 rbd bench --io-type write --io-size 4M --io-total 256M rbd/bench >/dev/null
}

# The IOPS of a `snapblk bench --json` run (stdin): the sum over its jobs' mean IOPS.
snapblk_iops() {
  python3 -c 'import json,sys
d=json.load(sys.stdin); print(round(sum(r["summary"]["iops"]["mean"] for r in d["results"])))'
}

# The IOPS of a `fio --output-format=json` run (stdin): reads plus writes of its first job.
fio_iops() {
  python3 -c 'import json,sys
j=json.load(sys.stdin)["jobs"][0]; print(round(j["read"]["iops"] + j["write"]["iops"]))'
}
