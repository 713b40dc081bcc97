#!/usr/bin/env bash
# A throw-away single-node Ceph for tests and benchmarks, from Debian's packages (no cephadm, no
# containers, no systemd): one monitor, one memstore OSD, cephx authentication, loopback only,
# optionally Ceph's S3 gateway (radosgw) with one S3 user. Everything lives in DIR.
#
#   scripts/ceph-cluster.sh up DIR      start; on any failure everything started is stopped again
#   scripts/ceph-cluster.sh down DIR    stop every daemon by its pid file, then remove DIR
#
# Environment (all optional):
#   CEPH_MON_PORT  monitor port on 127.0.0.1 (default 13300)
#   CEPH_RGW_PORT  radosgw port on 127.0.0.1 (default 17480); 0 = no radosgw
#   CEPH_POOL      RBD pool created and initialised (default rbd); empty = none
#
# After `up`, DIR holds:
#   ceph.conf                  cluster configuration (export CEPH_CONF=DIR/ceph.conf for ceph/rbd)
#   client.admin.keyring       the admin key (cephx); `ceph`/`rbd` find it through ceph.conf
#   env                        shell variables: CEPH_CONF, CEPH_KEYRING, CEPH_MON_HOST, CEPH_POOL,
#                              and with radosgw S3_ENDPOINT, S3_REGION, AWS_ACCESS_KEY_ID,
#                              AWS_SECRET_ACCESS_KEY (also printed at the end of `up`)
#   s3.env                     the S3 lines alone (with radosgw)
#   run/*.pid, log/            daemons' pid files and logs
# Packages: ceph-mon ceph-osd ceph-common (radosgw for S3), see scripts/install-deps.sh.
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
D=$2

# Every ceph CLI call is bounded: a wrong configuration must fail, never hang for 300 s.
c() { timeout 60 ceph --connect-timeout 20 "$@"; }

down() {
  local d=$1 pids p
  [ -d "$d" ] || return 0
  # Read every pid first: daemons remove their own pid file as they exit.
  pids=$(cat "$d"/run/*.pid 2>/dev/null || true)
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -CONT $pids 2>/dev/null || true # a test may have stopped one with SIGSTOP
    # shellcheck disable=SC2086
    kill $pids 2>/dev/null || true
    for p in $pids; do
      for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null || true
    done
  fi
  rm -rf "$d"
}

if [ "$cmd" = down ]; then
  down "$D"
  exit 0
fi
[ "$cmd" = up ] || usage

for t in ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd uuidgen; do
  command -v "$t" >/dev/null || { echo "ceph-cluster: $t not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
MON_PORT=${CEPH_MON_PORT:-13300}
RGW_PORT=${CEPH_RGW_PORT:-17480}
POOL=${CEPH_POOL-rbd}
if [ "$RGW_PORT" != 0 ]; then
  command -v radosgw >/dev/null || { echo "ceph-cluster: radosgw not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
fi
[ -e "$D" ] && [ -n "$(ls -A "$D" 2>/dev/null)" ] && { echo "ceph-cluster: $D exists and is not empty" >&2; exit 1; }

mkdir -p "$D"
D=$(cd "$D" && pwd)
trap 'rc=$?; if [ $rc -ne 0 ]; then echo "ceph-cluster: up failed, stopping what was started" >&2; tail -n 5 "$D"/log/*.log >&2 2>/dev/null || true; down "$D"; fi' EXIT
mkdir -p "$D"/{log,run,mon,osd0}
export CEPH_CONF=$D/ceph.conf
FSID=$(uuidgen)
cat >"$CEPH_CONF" <<CONF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
public network = 127.0.0.0/8
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $D/\$name.keyring
client mount timeout = 20
rados mon op timeout = 20
rados osd op timeout = 20
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
mon cluster log file = $D/log/\$cluster.\$channel.log
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
auth allow insecure global id reclaim = false
mon data avail crit = 0
mon data avail warn = 0
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
[mon.a]
mon data = $D/mon
public addrv = [v2:127.0.0.1:$MON_PORT]
[osd]
osd data = $D/osd\$id
osd objectstore = memstore
memstore device bytes = 1073741824
osd class load list = *
osd class default list = *
[client.rgw.gw]
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT
rgw data = $D/rgw
rgw enable usage log = false
rgw dns name = localhost
CONF

# cephx keys: the monitors' shared key, and client.admin with every capability.
ceph-authtool --create-keyring "$D/mon.a.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$D/client.admin.keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$D/mon.a.keyring" --import-keyring "$D/client.admin.keyring" >/dev/null
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$D/monmap" >/dev/null
ceph-mon --id a --mkfs --monmap "$D/monmap" --keyring "$D/mon.a.keyring" >>"$D/log/mkfs.log" 2>&1
ceph-mon --id a 2>>"$D/log/start.log" # daemonizes; pid in run/mon.a.pid

# One OSD with its own key, registered with the monitor.
id=$(c osd create)
[ "$id" = 0 ] || { echo "ceph-cluster: unexpected OSD id $id" >&2; exit 1; }
ceph-authtool --create-keyring "$D/osd.0.keyring" --gen-key -n osd.0 >/dev/null
c auth add osd.0 osd 'allow *' mon 'allow profile osd' -i "$D/osd.0.keyring" >/dev/null 2>&1
c osd crush add osd.0 1 root=default >/dev/null 2>&1
ceph-osd --id 0 --mkfs >>"$D/log/mkfs.log" 2>&1
ceph-osd --id 0 2>>"$D/log/start.log"
up=0
for _ in $(seq 120); do
  n=$(c osd stat -f json 2>/dev/null | python3 -c 'import json,sys;print(json.load(sys.stdin)["num_up_osds"])' 2>/dev/null || true)
  [ "$n" = 1 ] && { up=1; break; }
  sleep 0.5
done
[ $up = 1 ] || { echo "ceph-cluster: the OSD did not come up" >&2; exit 1; }

if [ -n "$POOL" ]; then
  c osd pool create "$POOL" >/dev/null 2>&1
  timeout 60 rbd pool init "$POOL"
fi

{
  echo "CEPH_CONF=$D/ceph.conf"
  echo "CEPH_KEYRING=$D/client.admin.keyring"
  echo "CEPH_MON_HOST=127.0.0.1:$MON_PORT"
  echo "CEPH_POOL=$POOL"
} >"$D/env"

if [ "$RGW_PORT" != 0 ]; then
  mkdir -p "$D/rgw"
  c auth get-or-create client.rgw.gw mon 'allow rw' osd 'allow rwx' -o "$D/client.rgw.gw.keyring" 2>/dev/null
  radosgw -n client.rgw.gw 2>>"$D/log/start.log" # daemonizes; pid in run/client.rgw.gw.pid
  ok=0
  for _ in $(seq 120); do
    if timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$RGW_PORT" 2>/dev/null; then ok=1; break; fi
    sleep 0.5
  done
  [ $ok = 1 ] || { echo "ceph-cluster: radosgw did not listen on 127.0.0.1:$RGW_PORT" >&2; exit 1; }
  ak=$(python3 -c 'import secrets,string;print("".join(secrets.choice(string.ascii_uppercase+string.digits) for _ in range(20)))')
  sk=$(python3 -c 'import secrets;print(secrets.token_urlsafe(30)[:40])')
  timeout 60 radosgw-admin -n client.admin user create --uid=snapblk --display-name=snapblk \
    --access-key="$ak" --secret-key="$sk" >/dev/null
  {
    echo "S3_ENDPOINT=http://127.0.0.1:$RGW_PORT"
    echo "S3_REGION=default"
    echo "AWS_ACCESS_KEY_ID=$ak"
    echo "AWS_SECRET_ACCESS_KEY=$sk"
  } >"$D/s3.env"
  cat "$D/s3.env" >>"$D/env"
fi
cat "$D/env"
