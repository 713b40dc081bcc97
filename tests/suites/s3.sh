#!/usr/bin/env bash
# The S3/HTTP source (crates/remote) against a real S3 server: Ceph's radosgw on a throw-away
# single-node cluster (scripts/ceph-cluster.sh, loopback only), plus a TLS proxy (socat) with a
# private CA for HTTPS. Objects are put and checked by curl (an independent SigV4 client).
# Checks: range reads through the cache match the object cold and warm, a replaced object, wrong
# credentials, missing objects and a dead endpoint give clear errors, HTTPS with the private CA
# (and refused without it), put/get round trips, a remote OTA's partition extracts to the same
# bytes as the local one while fetching less than the whole zip (and from its bare payload.bin,
# with ota info), a COW and its record put, fetched back byte for byte, verified with its base
# and merged into the target image, a remote COW's record fetched and checked against the base
# it is served over, multipart uploads (read back
# whole and by range, S3's multipart ETag, an interrupted one aborted), and a snapshot served over NBD
# from a base and COW in the bucket reads as the AOSP golden target; and the same drivers from C
# through libblkio.so.1 (tests/c/remote_test.c). Every daemon is stopped by
# pid, also on failure. Fails (never skips) when a tool is missing. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
passed=0; failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
finish() { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit; }
work=$(mktemp -d /tmp/snapblk-s3.XXXXXX)
cluster=$work/ceph
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  bash "$root/scripts/ceph-cluster.sh" down "$cluster" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
for t in curl socat openssl nbdcopy python3 radosgw gcc; do
  command -v "$t" >/dev/null || { bad "$t not found (scripts/install-deps.sh installs it)"; finish; }
done
cargo build -q -p snapblk-cli -p snapblk-conformance || { bad "cargo build -p snapblk-cli -p snapblk-conformance"; finish; }
tgt=${CARGO_TARGET_DIR:-$root/target}
snapblk=$tgt/debug/snapblk

mon_port=${S3_TEST_MON_PORT:-13357}
rgw_port=${S3_TEST_RGW_PORT:-17557}
tls_port=${S3_TEST_TLS_PORT:-17558}
if CEPH_MON_PORT=$mon_port CEPH_RGW_PORT=$rgw_port CEPH_POOL= \
     bash scripts/ceph-cluster.sh up "$cluster" > "$work/up.log" 2>&1; then
  ok "ceph-cluster.sh up (monitor, memstore OSD, radosgw)"
else
  tail -20 "$work/up.log"; bad "ceph-cluster.sh up"; finish
fi
set -a
# shellcheck disable=SC1091
. "$cluster/s3.env"
set +a
export AWS_ENDPOINT_URL=$S3_ENDPOINT AWS_REGION=$S3_REGION S3_TEST_BUCKET=snapblk-test
s3curl() { curl -sS -f --aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
  -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"; }
s3curl -X PUT "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET" || { bad "create bucket (curl)"; finish; }

# TLS: a private CA, a certificate for 127.0.0.1, socat terminating TLS before radosgw.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=snapblk-test-ca \
  -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$work/srv.key" -out "$work/srv.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' > "$work/ext.cnf"
openssl x509 -req -in "$work/srv.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" -CAcreateserial \
  -days 2 -extfile "$work/ext.cnf" -out "$work/srv.pem" 2>/dev/null
socat "OPENSSL-LISTEN:$tls_port,bind=127.0.0.1,reuseaddr,fork,cert=$work/srv.pem,key=$work/srv.key,verify=0" \
  "TCP:127.0.0.1:$rgw_port" 2> "$work/socat.log" &
pids+=($!)
for _ in $(seq 50); do curl -s --cacert "$work/ca.pem" -o /dev/null "https://127.0.0.1:$tls_port/" && break; sleep 0.1; done
export S3_TEST_HTTPS_ENDPOINT=https://127.0.0.1:$tls_port

# The Rust tests against the server.
rtest() {  # rtest NAME WHAT [ENV...]
  local name=$1 what=$2; shift 2
  if env "$@" cargo test -q -p snapblk-remote --test rgw -- --ignored --exact "$name" > "$work/t.txt" 2>&1 \
     && grep -q '^test result: ok. 1 passed' "$work/t.txt"; then
    ok "$what"
  else
    tail -30 "$work/t.txt"; bad "$what"
  fi
}
rtest range_reads_through_the_cache_match_the_object_cold_and_warm \
  "random range reads through the cache match the object (evicting, cold, warm, sequential)"
rtest a_replaced_object_fails_instead_of_mixing_versions "a replaced object fails with 'changed' (If-Match)"
rtest wrong_credentials_missing_objects_and_dead_endpoints_give_clear_errors \
  "wrong credentials, missing object and bucket, dead endpoint, anonymous: clear errors"
rtest put_and_get_round_trip_with_the_checksum "put/get round trip with the SHA-256 checked"
rtest https_with_a_private_ca "HTTPS through the TLS proxy with the private CA" SSL_CERT_FILE="$work/ca.pem"

# The CLI: errors are one line each.
expect_err() {  # expect_err WHAT PATTERN CMD...
  local what=$1 pat=$2; shift 2
  if "$@" > "$work/o.txt" 2> "$work/e.txt"; then bad "$what: succeeded"; return; fi
  if [ "$(wc -l < "$work/e.txt")" -eq 1 ] && grep -q "$pat" "$work/e.txt"; then ok "$what: $(cat "$work/e.txt")"
  else cat "$work/e.txt"; bad "$what: expected one line with '$pat'"; fi
}
head -c 100000 /dev/urandom > "$work/small.bin"
"$snapblk" remote put "$work/small.bin" "s3://$S3_TEST_BUCKET/small.bin" > /dev/null || bad "remote put"
expect_err "wrong secret" "access denied" env AWS_SECRET_ACCESS_KEY=wrong "$snapblk" remote stat "s3://$S3_TEST_BUCKET/small.bin"
expect_err "missing object" "no such object (HTTP 404" "$snapblk" remote stat "s3://$S3_TEST_BUCKET/missing.bin"
expect_err "HTTPS without the CA (not retried)" "after 1 attempt(s).*UnknownIssuer" env AWS_ENDPOINT_URL="$S3_TEST_HTTPS_ENDPOINT" "$snapblk" remote stat "s3://$S3_TEST_BUCKET/small.bin"
expect_err "dead endpoint" "cannot reach the endpoint" env AWS_ENDPOINT_URL=http://127.0.0.1:1 "$snapblk" remote stat "s3://$S3_TEST_BUCKET/small.bin"
if SSL_CERT_FILE=$work/ca.pem AWS_ENDPOINT_URL=$S3_TEST_HTTPS_ENDPOINT "$snapblk" remote stat "s3://$S3_TEST_BUCKET/small.bin" | grep -q '100000 bytes'; then
  ok "remote stat over HTTPS with SSL_CERT_FILE"
else bad "remote stat over HTTPS with SSL_CERT_FILE"; fi

# put/get: curl reads back what put wrote; get writes what curl put.
s3curl -o "$work/by-curl.bin" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/small.bin" && cmp -s "$work/by-curl.bin" "$work/small.bin" \
  && ok "curl reads back the bytes 'remote put' wrote" || bad "curl read back of 'remote put'"
s3curl -T "$work/small.bin" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/by-curl.bin" || bad "curl put"
"$snapblk" remote get "s3://$S3_TEST_BUCKET/by-curl.bin" "$work/got.bin" > /dev/null && cmp -s "$work/got.bin" "$work/small.bin" \
  && ok "'remote get' fetches what curl put" || bad "'remote get' of curl's object"
expect_err "get of a missing object" "no such object" "$snapblk" remote get "s3://$S3_TEST_BUCKET/missing.bin" "$work/none.bin"
[ ! -e "$work/none.bin" ] && ok "a failed get leaves no output" || bad "a failed get left $work/none.bin"

# Multipart: a 20 MiB + 1000 B file in 5 MiB parts (S3's smallest). curl reads it back whole and
# by range; its ETag is S3's multipart form, MD5(part MD5s)-N, computed here from the file.
head -c $((20 << 20)) /dev/urandom > "$work/big.bin"; head -c 1000 /dev/urandom >> "$work/big.bin"
if "$snapblk" remote put --part-size 5M --jobs 4 "$work/big.bin" "s3://$S3_TEST_BUCKET/big.bin" > "$work/mp.txt" 2>&1 \
   && grep -q 'in 5 parts' "$work/mp.txt"; then
  ok "remote put --jobs 4 of a 20 MiB file in 5 MiB parts (multipart upload)"
else cat "$work/mp.txt"; bad "multipart remote put"; fi
s3curl -o "$work/big.got" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/big.bin" && cmp -s "$work/big.got" "$work/big.bin" \
  && s3curl -r 6291456-16777215 "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/big.bin" | cmp -s - <(tail -c +6291457 "$work/big.bin" | head -c 10485760) \
  && ok "curl reads the multipart object back whole and by range (6 MiB..16 MiB, across parts)" \
  || bad "curl read back of the multipart object"
want=$(python3 - "$work/big.bin" <<'PY'
import hashlib, sys
d = open(sys.argv[1], "rb").read()
parts = [d[i:i + (5 << 20)] for i in range(0, len(d), 5 << 20)]
print('"%s-%d"' % (hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest(), len(parts)))
PY
)
got=$(s3curl -I "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/big.bin" | tr -d '\r' | sed -n 's/^[Ee][Tt][Aa][Gg]: //p')
if [ "$got" = "$want" ] && grep -qF "etag $want" "$work/mp.txt"; then
  ok "the multipart object's ETag is $got, S3's form for its 5 parts"
else cat "$work/mp.txt"; bad "multipart ETag: server '$got', expected '$want'"; fi
# The same file one part at a time: the same bytes, so the same multipart ETag.
if "$snapblk" remote put --part-size 5M --jobs 1 "$work/big.bin" "s3://$S3_TEST_BUCKET/big1.bin" > "$work/mp1.txt" 2>&1 \
   && grep -qF "etag $want" "$work/mp1.txt" && s3curl -o "$work/big1.got" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/big1.bin" \
   && cmp -s "$work/big1.got" "$work/big.bin"; then
  ok "remote put --jobs 1 (one part at a time) reads back the same, ETag $want"
else cat "$work/mp1.txt"; bad "remote put --jobs 1"; fi
"$snapblk" remote get "s3://$S3_TEST_BUCKET/big.bin" "$work/big.get" > "$work/mpg.txt" 2>&1 \
  && grep -q 'matches the recorded sha256' "$work/mpg.txt" && cmp -s "$work/big.get" "$work/big.bin" \
  && ok "remote get checks the multipart object against the sha256 its put recorded" \
  || { cat "$work/mpg.txt"; bad "remote get of the multipart object"; }
# An interrupted upload is aborted: a proxy cuts every connection that sends part 3, the put
# fails after its retries, and radosgw lists no unfinished upload (ListMultipartUploads; the
# listing sees one while an upload is open, the control case).
uploads() { s3curl "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET?uploads="; }
upload_id=$(s3curl -X POST "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/open.bin?uploads=" | sed -n 's/.*<UploadId>\(.*\)<\/UploadId>.*/\1/p')
if uploads | grep -q '<Upload>'; then ok "ListMultipartUploads shows an open upload (control)"; else bad "an open upload is not listed"; fi
s3curl -X DELETE "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/open.bin?uploadId=$upload_id"
cut_port=${S3_TEST_CUT_PORT:-17559}
python3 tests/lib/s3-part-proxy.py "$cut_port" "$rgw_port" cut > "$work/cut.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$cut_port/" && break; sleep 0.1; done
if AWS_ENDPOINT_URL=http://127.0.0.1:$cut_port "$snapblk" remote put --part-size 5M "$work/big.bin" \
     "s3://$S3_TEST_BUCKET/cut.bin" > "$work/cut.txt" 2>&1; then
  bad "a put whose part 3 never arrives succeeded"
elif grep -q 'cannot reach the endpoint' "$work/cut.txt" && ! uploads | grep -q '<Upload>' \
     && ! s3curl -I "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/cut.bin" > /dev/null 2>&1; then
  ok "an interrupted multipart upload is aborted: no object, no upload left ($(cat "$work/cut.txt"))"
else cat "$work/cut.txt"; uploads; bad "interrupted multipart upload left something behind"; fi
# A signal stops a put and aborts its upload. A proxy forwards everything, but the connection
# carrying part 2 only at 160 KiB/s, and logs each part number it sees. The file is 3 parts of
# 16/16/8 MiB; with --jobs 4 part 3 starts while part 2 still crawls (the log shows it: parts
# run at once against the real server). Then, with the upload listed as open (the control),
# SIGTERM: the put exits 128 + 15 with one line, no object appears and radosgw lists no upload.
slow_port=${S3_TEST_SLOW_PORT:-17560}
python3 tests/lib/s3-part-proxy.py "$slow_port" "$rgw_port" slow "$work/slow.parts" > "$work/slow.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$slow_port/" && break; sleep 0.1; done
head -c $((40 << 20)) /dev/urandom > "$work/sig.bin"
signalled_put() {  # signalled_put SIGNAL STATUS KEY: put through the slow proxy, signal it mid-part-2
  local sig=$1 status=$2 key=$3
  rm -f "$work/slow.parts"
  # env --default-signal: a signal ignored when this suite started (nohup, setsid runners) stays
  # ignored in snapblk by design, so the put gets the signal's default disposition here.
  AWS_ENDPOINT_URL=http://127.0.0.1:$slow_port env --default-signal="${sig#SIG}" "$snapblk" remote put \
    --part-size 16M --jobs 4 "$work/sig.bin" "s3://$S3_TEST_BUCKET/$key" > "$work/sig.out" 2> "$work/sig.err" &
  local p=$!
  # Parts 1-3 start together: wait until both part 2 and part 3 have been seen, in either order.
  for _ in $(seq 300); do grep -q 'part 2' "$work/slow.parts" 2>/dev/null && grep -q 'part 3' "$work/slow.parts" && break; sleep 0.1; done
  if grep -q 'part 2' "$work/slow.parts" && grep -q 'part 3' "$work/slow.parts"; then
    ok "$sig case: part 3 started while part 2 was still being sent (--jobs 4 sends parts at once)"
  else cat "$work/slow.parts"; bad "$sig case: parts 2 and 3 were not in flight together"; fi
  if uploads | grep -q '<Upload>'; then ok "$sig case: the upload is listed as open before the signal (control)"
  else bad "$sig case: no open upload listed before the signal"; fi
  kill -s "$sig" $p
  wait $p; local rc=$?
  if [ "$rc" -eq "$status" ] && [ "$(wc -l < "$work/sig.err")" -eq 1 ] && grep -q "snapblk: $sig: .*stopped before the object was written" "$work/sig.err" \
     && [ ! -s "$work/sig.out" ]; then
    ok "$sig stops remote put: exit $rc, one line: $(cat "$work/sig.err")"
  else cat "$work/sig.out" "$work/sig.err"; bad "$sig during remote put: exit $rc, expected $status and one line"; fi
  if ! uploads | grep -q '<Upload>' && ! s3curl -I "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/$key" > /dev/null 2>&1; then
    ok "$sig case: the upload is aborted (ListMultipartUploads lists none) and no object $key exists"
  else uploads; bad "$sig case: an upload or an object was left behind"; fi
}
signalled_put SIGTERM 143 sigterm.bin
signalled_put SIGHUP 129 sighup.bin
expect_err "--jobs 0 is refused" "jobs: 0 is not from 1 to 64" \
  "$snapblk" remote put --jobs 0 "$work/big.bin" "s3://$S3_TEST_BUCKET/no-jobs.bin"
expect_err "a part size under S3's 5 MiB is refused" "part-size: .* is not from 5 MiB to 5 GiB" \
  "$snapblk" remote put --part-size 1M "$work/big.bin" "s3://$S3_TEST_BUCKET/small-parts.bin"

# OTA: one partition of a remote OTA zip, without fetching the whole zip.
tar -xf tests/data/ota/sample_payloads.tar.xz -C "$work"
head -c 4000000 /dev/urandom > "$work/filler.bin"
python3 - "$work" <<'PY'
import sys, zipfile
w = sys.argv[1]
with zipfile.ZipFile(f"{w}/ota.zip", "w") as z:
    z.write(f"{w}/filler.bin", "META-INF/filler", compress_type=zipfile.ZIP_STORED)
    z.write(f"{w}/full_payload.bin", "payload.bin", compress_type=zipfile.ZIP_STORED)
PY
s3curl -T "$work/ota.zip" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/ota.zip" || bad "curl put ota.zip"
"$snapblk" ota extract "$work/ota.zip" -o "$work/ota-local" --partitions root > /dev/null || bad "local ota extract"
if "$snapblk" ota extract "s3://$S3_TEST_BUCKET/ota.zip" -o "$work/ota-remote" --partitions root > /dev/null 2> "$work/ota.err" \
   && cmp -s "$work/ota-local/root.img" "$work/ota-remote/root.img"; then
  ok "a remote OTA's partition extracts to the same bytes as the local one"
else cat "$work/ota.err"; bad "remote ota extract"; fi
fetched=$(sed -n 's/.*fetched \([0-9]*\) of \([0-9]*\) bytes.*/\1/p' "$work/ota.err")
size=$(stat -c %s "$work/ota.zip")
if [ -n "$fetched" ] && [ "$fetched" -lt $((size / 4)) ]; then
  ok "the remote extract fetched $fetched of $size bytes"
else cat "$work/ota.err"; bad "the remote extract fetched '${fetched}' of $size bytes"; fi
"$snapblk" ota info "s3://$S3_TEST_BUCKET/ota.zip" > "$work/info.txt" 2>&1
"$snapblk" ota info "$work/ota.zip" > "$work/info-local.txt" 2>&1
if grep -q 'root:' "$work/info.txt" && diff <(grep -v fetched "$work/info.txt") "$work/info-local.txt" > /dev/null; then
  ok "ota info of a remote OTA says what it says of the local one"
else cat "$work/info.txt"; bad "ota info of a remote OTA"; fi

# The same OTA's payload.bin put bare (no zip around it): info and one partition, read remotely.
python3 - "$work" <<'PY'
import sys, zipfile
w = sys.argv[1]
with zipfile.ZipFile(f"{w}/ota.zip") as z, open(f"{w}/payload.bin", "wb") as f:
    f.write(z.read("payload.bin"))
PY
"$snapblk" remote put "$work/payload.bin" "s3://$S3_TEST_BUCKET/payload.bin" > /dev/null || bad "remote put payload.bin"
if "$snapblk" ota extract "s3://$S3_TEST_BUCKET/payload.bin" -o "$work/payload-remote" --partitions root > /dev/null 2> "$work/payload.err" \
   && cmp -s "$work/ota-local/root.img" "$work/payload-remote/root.img"; then
  ok "a remote bare payload.bin's partition extracts to the same bytes as the local OTA's"
else cat "$work/payload.err"; bad "remote ota extract of a bare payload.bin"; fi
"$snapblk" ota info "s3://$S3_TEST_BUCKET/payload.bin" > "$work/payload-info.txt" 2>&1
"$snapblk" ota info "$work/payload.bin" > "$work/payload-info-local.txt" 2>&1
if grep -q 'bare payload' "$work/payload-info.txt" && grep -q 'root:' "$work/payload-info.txt" \
   && diff <(grep -v fetched "$work/payload-info.txt") "$work/payload-info-local.txt" > /dev/null; then
  ok "ota info of a remote bare payload.bin says what it says of the local one"
else cat "$work/payload-info.txt"; bad "ota info of a remote bare payload.bin"; fi

# A COW and its record (COW.snapblk, by cow record) put together and fetched into a fresh
# directory: the COW comes back byte for byte, verifies with its base against the record found
# beside it, and merges a copy of the base into AOSP's target.img. v2_xor_seq_lz4 has copy, XOR
# and lz4 ops, so the record covers base blocks read as well as blocks written.
x=tests/data/aosp-cow/v2_xor_seq_lz4
mkdir -p "$work/pub" "$work/fetch"
cp "$x/snapshot.cow" "$work/pub/xor.cow"
"$snapblk" cow record "$work/pub/xor.cow" --old "$x/base.img" --new "$x/target.img" > "$work/record.txt" 2>&1 \
  || { cat "$work/record.txt"; bad "cow record of $x"; }
for f in xor.cow xor.cow.snapblk; do
  "$snapblk" remote put "$work/pub/$f" "s3://$S3_TEST_BUCKET/$f" > /dev/null || bad "remote put $f"
  "$snapblk" remote get "s3://$S3_TEST_BUCKET/$f" "$work/fetch/$f" > "$work/get-$f.txt" 2>&1 \
    && grep -q 'matches the recorded sha256' "$work/get-$f.txt" || { cat "$work/get-$f.txt"; bad "remote get $f"; }
done
if cmp -s "$work/fetch/xor.cow" "$x/snapshot.cow" && cmp -s "$work/fetch/xor.cow.snapblk" "$work/pub/xor.cow.snapblk"; then
  ok "a COW and its record come back from the bucket byte for byte"
else bad "the fetched COW or record differs from the one put"; fi
if "$snapblk" cow verify "$work/fetch/xor.cow" --base "$x/base.img" > "$work/verify.txt" 2>&1 \
   && grep -q 'base matches the record' "$work/verify.txt"; then
  ok "cow verify of the fetched COW with its base passes against the fetched record"
else cat "$work/verify.txt"; bad "cow verify of the fetched COW and record"; fi
cp "$x/base.img" "$work/fetch/base.img"
if "$snapblk" merge "$work/fetch/xor.cow" --base "$work/fetch/base.img" > "$work/merge.txt" 2>&1 \
   && cmp -s "$work/fetch/base.img" "$x/target.img"; then
  ok "merge of the fetched COW into a copy of its base gives target.img"
else cat "$work/merge.txt"; bad "merge of the fetched COW"; fi

# A snapshot served over NBD from a base and COW in the bucket reads as the golden target.
g=tests/data/aosp-cow/v3_replace_lz4
s3curl -T "$g/base.img" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/base.img" && s3curl -T "$g/snapshot.cow" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/snap.cow" \
  || bad "curl put of the golden case"
nbd_port=${S3_TEST_NBD_PORT:-10857}
serve_read() {  # serve_read WHAT EXPECTED SERVE-ARGS...: serve over NBD, read all with nbdcopy, compare
  local what=$1 want=$2; shift 2
  "$snapblk" serve --nbd "127.0.0.1:$nbd_port" "$@" > "$work/serve.log" 2>&1 &
  local sp=$!
  for _ in $(seq 100); do grep -q 'serving' "$work/serve.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.1; done
  rm -f "$work/read.img"
  if nbdcopy "nbd://127.0.0.1:$nbd_port" "$work/read.img" 2>> "$work/serve.log" && cmp -s "$work/read.img" "$want"; then ok "$what"
  else cat "$work/serve.log"; bad "$what"; fi
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
}
serve_read "snapshot with base and COW in S3, served over NBD, reads as target.img" "$g/target.img" \
  --base "s3://$S3_TEST_BUCKET/base.img" --cow "s3://$S3_TEST_BUCKET/snap.cow"
serve_read "snapshot with base.driver=s3 and a local COW reads as target.img" "$g/target.img" \
  "snapshot:cow=$g/snapshot.cow,base.driver=s3,base.url=s3://$S3_TEST_BUCKET/base.img"

# A remote COW's record (COW.snapblk, put beside xor.cow above) is fetched and checked as a
# local one is: the right base serves target.img (every block the record has a digest for is
# verified), a base of another size and a same-size base with one byte changed (verify-base)
# are refused at connect, also over a nested base; an explicit cow-record URL that does not
# exist is an error, and so is verify-base with no record to verify against.
serve_read "a remote COW with its record over the right base (verify-base) reads as target.img" "$x/target.img" \
  "snapshot:base=$x/base.img,cow=s3://$S3_TEST_BUCKET/xor.cow,verify-base=true"
head -c 4096 "$x/base.img" > "$work/short.img"
cp "$x/base.img" "$work/flip.img"
printf '\377' | dd of="$work/flip.img" bs=1 seek=100000 conv=notrunc status=none
refused_open() {  # refused_open WHAT PATTERN SPEC: snapblk info SPEC fails, its error matches
  local out
  if out=$("$snapblk" info "$3" 2>&1); then bad "$1: opened"
  elif echo "$out" | grep -q "$2"; then ok "$1: ${out##*: }"
  else echo "$out"; bad "$1: message"; fi
}
refused_open "a remote COW over a base of another size is refused by its record" \
  "this COW was made for a base of $(stat -c %s "$x/base.img") bytes" \
  "snapshot:base=$work/short.img,cow=s3://$S3_TEST_BUCKET/xor.cow"
refused_open "a remote COW over a same-size base with one byte changed is refused (verify-base)" \
  "the COW record expects\|is not the image this COW was made for" \
  "snapshot:base=$work/flip.img,cow=s3://$S3_TEST_BUCKET/xor.cow,verify-base=true"
refused_open "a remote COW over a nested base of another size is refused by its record" \
  "base sync:path=$work/short.img is 4096 bytes; this COW was made for a base of" \
  "snapshot:cow=s3://$S3_TEST_BUCKET/xor.cow,base.driver=sync,base.path=$work/short.img"
refused_open "an explicit cow-record URL that does not exist is an error" \
  "snapshot COW record s3://$S3_TEST_BUCKET/none.snapblk" \
  "snapshot:base=$x/base.img,cow=s3://$S3_TEST_BUCKET/xor.cow,cow-record=s3://$S3_TEST_BUCKET/none.snapblk"
refused_open "a remote COW with a local cow-record over a base of another size is refused by it" \
  "this COW was made for a base of" \
  "snapshot:base=$work/short.img,cow=s3://$S3_TEST_BUCKET/xor.cow,cow-record=$work/pub/xor.cow.snapblk"
refused_open "a local cow-record of another COW is refused for a remote COW" \
  "record does not describe this COW" \
  "snapshot:base=$g/base.img,cow=s3://$S3_TEST_BUCKET/snap.cow,cow-record=$work/pub/xor.cow.snapblk"
refused_open "verify-base over a remote COW with no record beside it is refused, not skipped" \
  "verify-base needs a COW record, and none was found (s3://$S3_TEST_BUCKET/snap.cow.snapblk" \
  "snapshot:base=$g/base.img,cow=s3://$S3_TEST_BUCKET/snap.cow,verify-base=true"
# A local COW over a remote base: its record (beside it, on disk) is checked, the base read by range.
s3curl -T "$work/short.img" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/short.img" || bad "curl put short.img"
refused_open "a local COW over a remote base of another size is refused by its record" \
  "base s3://$S3_TEST_BUCKET/short.img is 4096 bytes; this COW was made for a base of" \
  "snapshot:base=s3://$S3_TEST_BUCKET/short.img,cow=$work/pub/xor.cow"
head -c $(((1 << 20) + 4096)) /dev/urandom > "$work/img.bin"
s3curl -T "$work/img.bin" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/img.bin" || bad "curl put img.bin"
SSL_CERT_FILE=$work/ca.pem serve_read "the s3 driver serves an object over NBD (HTTPS, 256 KiB cache)" "$work/img.bin" \
  "s3:url=s3://$S3_TEST_BUCKET/img.bin,cache-size=256k,block-size=64k,endpoint=$S3_TEST_HTTPS_ENDPOINT"
# The driver conformance suite (read-only: reads, refused writes, properties) on the s3 driver,
# and 10 instances dropped with reads not reaped (open files must not grow).
if "${CARGO_TARGET_DIR:-$root/target}/debug/snapblk-conformance" \
     "s3:url=s3://$S3_TEST_BUCKET/img.bin,cache-size=256k,block-size=64k" --drop-unreaped 10 > "$work/conf.txt" 2>&1 \
     && grep -q '^PASS drop-unreaped' "$work/conf.txt"; then
  ok "snapblk-conformance on the s3 driver ($(tail -1 "$work/conf.txt"))"
else grep -v '^PASS' "$work/conf.txt" | tail -30; bad "snapblk-conformance on the s3 driver"; fi
# snapblk bench reads the s3 driver (4 KiB random reads, verified against nothing: it must run).
if "$snapblk" bench "s3:url=s3://$S3_TEST_BUCKET/img.bin" --rw randread --bs 4k --iodepth 1 --runtime 1 \
     --json > "$work/bench.json" 2> "$work/bench.err" \
   && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["error"] is None and d["results"], d.get("error")' "$work/bench.json" 2>> "$work/bench.err"; then
  ok "snapblk bench on the s3 driver"
else tail -5 "$work/bench.err"; head -c 600 "$work/bench.json"; bad "snapblk bench on the s3 driver"; fi
# A public object by its plain URL (unsigned GETs): the http driver, bare URL spec.
s3curl -H "x-amz-acl: public-read" -T "$work/img.bin" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/public.bin" || bad "curl put public.bin"
serve_read "the http driver serves a public object by URL over NBD" "$work/img.bin" \
  "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/public.bin"

# The drivers through libblkio.so.1's C ABI (tests/c/remote_test.c): the shipped build has them.
# Reads by do_io and by the completion fd (also a batch submitted with min_completions 0 and
# reaped as the fd fires), compared with the bytes curl reads back; writes -EBADF;
# connect failures with their errno and message. An object whose end is not block-aligned.
ctest() {  # ctest WHAT ARGS...: run remote_test, count its PASS/FAIL lines
  local what=$1; shift
  local out rc p f
  out=$(LD_LIBRARY_PATH="$work/lib" "$work/remote_test" "$@" 2>&1); rc=$?
  p=$(echo "$out" | grep -c '^PASS'); f=$(echo "$out" | grep -c '^FAIL')
  if [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$p" -gt 0 ]; then ok "C ABI: $what ($p checks)"
  else echo "$out" | grep -v '^PASS'; bad "C ABI: $what (exit $rc)"; fi
}
mkdir -p "$work/lib"
if cargo build -q --release -p snapblk-capi && ln -sf "$tgt/release/libblkio.so" "$work/lib/libblkio.so.1" \
   && ln -sf "$tgt/release/libblkio.so" "$work/lib/libblkio.so" \
   && gcc -std=gnu11 -Wall -Wextra -Werror -O2 -I include tests/c/remote_test.c -L "$work/lib" -lblkio \
        -o "$work/remote_test"; then
  head -c $(((3 << 20) + 12345)) /dev/urandom > "$work/capi.bin"
  s3curl -T "$work/capi.bin" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/capi.bin" || bad "curl put capi.bin"
  # The reference bytes are what curl reads back from the server.
  s3curl -o "$work/capi.curl" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/capi.bin" || bad "curl get capi.bin"
  curl -sS -f -o "$work/public.curl" "$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/public.bin" || bad "curl get public.bin"
  s3=(url="s3://$S3_TEST_BUCKET/capi.bin" endpoint="$AWS_ENDPOINT_URL" region="$AWS_REGION")
  ctest "s3 driver reads an object (64 KiB blocks, 256 KiB cache)" read s3 "$work/capi.curl" "${s3[@]}" \
    block-size=65536 cache-size=262144
  ctest "s3 driver, default cache" read s3 "$work/capi.curl" "${s3[@]}"
  ctest "http driver reads a public object" read http "$work/public.curl" url="$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/public.bin"
  SSL_CERT_FILE=$work/ca.pem ctest "http driver over HTTPS with SSL_CERT_FILE" read http "$work/public.curl" \
    url="$S3_TEST_HTTPS_ENDPOINT/$S3_TEST_BUCKET/public.bin"
  AWS_SECRET_ACCESS_KEY=wrong ctest "wrong secret: connect fails with -EACCES" \
    fail s3 EACCES "access denied" "${s3[@]}"
  ctest "missing object: connect fails with -ENOENT" fail s3 ENOENT "no such object" \
    url="s3://$S3_TEST_BUCKET/missing.bin" endpoint="$AWS_ENDPOINT_URL" region="$AWS_REGION"
  ctest "dead endpoint: connect fails with -EHOSTUNREACH" fail s3 EHOSTUNREACH "cannot reach the endpoint" \
    url="s3://$S3_TEST_BUCKET/capi.bin" endpoint=http://127.0.0.1:1 retries=0
  ctest "HTTPS without the CA: connect fails" fail http EHOSTUNREACH "UnknownIssuer" \
    url="$S3_TEST_HTTPS_ENDPOINT/$S3_TEST_BUCKET/public.bin"
  ctest "http driver, private object without credentials: -EACCES" fail http EACCES "access denied" \
    url="$AWS_ENDPOINT_URL/$S3_TEST_BUCKET/capi.bin"
  ctest "no url: connect fails with -EINVAL" fail s3 EINVAL "property url must be set"
else
  bad "build of libblkio.so.1 or tests/c/remote_test.c"
fi
finish
