#!/usr/bin/env bash
# S3 source benchmark (not CI): sequential throughput and 4 KiB random-read latency through the
# block cache (crates/remote), cold and warm, against radosgw on a throw-away single-node Ceph
# (scripts/ceph-cluster.sh) on loopback; side by side in the same run, curl as the reference:
# one whole-object GET (throughput) and N ranged 4 KiB GETs on one kept-alive connection
# (latency). Usage: bench/s3-bench.sh [SIZE_MIB=64] [READS=2000]. Writes
# bench/results/scratch/s3-bench-<time>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
size_mib=${1:-64}
reads=${2:-2000}
work=$(mktemp -d /tmp/snapblk-s3-bench.XXXXXX)
cluster=$work/ceph
trap 'bash "$root/scripts/ceph-cluster.sh" down "$cluster" >/dev/null 2>&1; rm -rf "$work"' EXIT
out=bench/results/scratch/s3-bench-$(date -u +%Y%m%dT%H%M%S).txt
mkdir -p bench/results/scratch
cargo build -q --release -p snapblk-remote --example s3_bench
bin=${CARGO_TARGET_DIR:-$root/target}/release/examples/s3_bench
CEPH_MON_PORT=${S3_BENCH_MON_PORT:-13367} CEPH_RGW_PORT=${S3_BENCH_RGW_PORT:-17567} CEPH_POOL= \
  bash scripts/ceph-cluster.sh up "$cluster" > "$work/up.log"
set -a; . "$cluster/s3.env"; set +a
export AWS_ENDPOINT_URL=$S3_ENDPOINT AWS_REGION=$S3_REGION
s3curl() { curl -sS -f --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
  -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"; }
s3curl -X PUT "$AWS_ENDPOINT_URL/bench"
head -c $((size_mib << 20)) /dev/urandom > "$work/obj.bin"
s3curl -T "$work/obj.bin" "$AWS_ENDPOINT_URL/bench/obj.bin"
{
  echo "# s3-bench $(date -u +%FT%TZ) $(git rev-parse --short HEAD) object ${size_mib} MiB, $reads random reads, radosgw memstore on loopback"
  "$bin" "s3://bench/obj.bin" "$reads"
  t0=$(date +%s.%N)
  s3curl -o /dev/null "$AWS_ENDPOINT_URL/bench/obj.bin"
  t1=$(date +%s.%N)
  echo "curl_seq $(python3 -c "print(f'{$size_mib/($t1-$t0):.1f}')") MiB/s"
  n=$((reads < 500 ? reads : 500))
  python3 - "$n" "$size_mib" "$AWS_ENDPOINT_URL/bench/obj.bin" > "$work/curl.cfg" <<'PY'
import random, sys
n, mib, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(42)
for i in range(n):
    off = random.randrange(mib * 256) * 4096
    if i:
        print("next")
    print(f'url = "{url}"\nrange = "{off}-{off + 4095}"\noutput = "/dev/null"')
    print('aws-sigv4 = "aws:amz:' + __import__("os").environ["AWS_REGION"] + ':s3"')
    print('user = "' + __import__("os").environ["AWS_ACCESS_KEY_ID"] + ':' + __import__("os").environ["AWS_SECRET_ACCESS_KEY"] + '"')
    print('header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"')
PY
  t0=$(date +%s.%N)
  curl -sS -f -K "$work/curl.cfg"
  t1=$(date +%s.%N)
  echo "curl_rand4k_mean $(python3 -c "print(f'{($t1-$t0)/$n*1e6:.1f}')") us (no cache: every read a GET)"
} | tee "$out"
echo "written: $out"
