//! Against a real S3 server (Ceph's radosgw started by tests/suites/s3.sh): objects are put by
//! curl (an independent SigV4 client) and read back through [`RemoteObject`]. Ignored by
//! default; the suite runs them with `AWS_*`, `S3_TEST_BUCKET` and, for HTTPS,
//! `S3_TEST_HTTPS_ENDPOINT` + `SSL_CERT_FILE` set.

use snapblk_core::ReadAt;
use snapblk_core::rng::Rng;
use snapblk_remote::{RemoteConfig, RemoteError, RemoteObject};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set (tests/suites/s3.sh)"))
}

fn bucket() -> String {
    env("S3_TEST_BUCKET")
}

/// Put `data` at `s3://BUCKET/key` with curl.
fn curl_put(key: &str, data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("snapblk-rgw-{}-{key}", std::process::id()));
    std::fs::write(&dir, data).unwrap();
    let url = format!(
        "{}/{}/{key}",
        env("AWS_ENDPOINT_URL").trim_end_matches('/'),
        bucket()
    );
    let st = Command::new("curl")
        .args(["-sS", "-f", "--aws-sigv4"])
        .arg(format!("aws:amz:{}:s3", env("AWS_REGION")))
        .arg("--user")
        .arg(format!(
            "{}:{}",
            env("AWS_ACCESS_KEY_ID"),
            env("AWS_SECRET_ACCESS_KEY")
        ))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T"])
        .arg(&dir)
        .arg(&url)
        .status()
        .unwrap();
    std::fs::remove_file(&dir).unwrap();
    assert!(st.success(), "curl PUT {url}");
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

fn cfg(block: u64, cache: u64) -> RemoteConfig {
    RemoteConfig {
        block_size: block,
        cache_bytes: cache,
        ..RemoteConfig::from_env().unwrap()
    }
}

fn url(key: &str) -> String {
    format!("s3://{}/{key}", bucket())
}

/// Random reads (offsets and lengths) compared with the bytes; returns nothing, panics on a
/// difference.
fn random_reads(o: &RemoteObject, data: &[u8], seed: u64, n: usize) {
    let mut r = Rng::new(seed);
    for _ in 0..n {
        let off = r.next_u64() % data.len() as u64;
        let len = (r.next_u64() % (200 << 10)) as usize + 1;
        let mut buf = vec![0u8; len];
        let got = o.read_at(off, &mut buf).unwrap();
        let want = &data[off as usize..(off as usize + len).min(data.len())];
        assert_eq!(got, want.len());
        assert!(&buf[..got] == want, "bytes differ at {off}+{len}");
    }
}

#[test]
#[ignore = "needs radosgw: tests/suites/s3.sh"]
fn range_reads_through_the_cache_match_the_object_cold_and_warm() {
    let data = random_bytes((3 << 20) + 12_345, 1);
    curl_put("ranges.bin", &data);
    // A cache smaller than the object: evictions on the way.
    let small = RemoteObject::open(&url("ranges.bin"), &cfg(64 << 10, 1 << 20)).unwrap();
    assert_eq!(small.len(), data.len() as u64);
    assert!(small.etag().is_some(), "radosgw gives ETags");
    random_reads(&small, &data, 2, 300);
    // The end of the object: a short read, then nothing.
    let mut b = vec![0u8; 100];
    assert_eq!(small.read_at(data.len() as u64 - 10, &mut b).unwrap(), 10);
    assert_eq!(&b[..10], &data[data.len() - 10..]);
    assert_eq!(small.read_at(data.len() as u64, &mut b).unwrap(), 0);
    let e = small
        .read_exact_remote(data.len() as u64 - 10, &mut b)
        .unwrap_err();
    assert!(matches!(e, RemoteError::OutOfRange { .. }), "{e}");
    let e = small.read_exact_remote(u64::MAX, &mut b).unwrap_err();
    assert!(matches!(e, RemoteError::OutOfRange { .. }), "{e}");
    // A cache that holds it all: the warm pass fetches nothing and hits every block.
    let big = RemoteObject::open(&url("ranges.bin"), &cfg(64 << 10, 8 << 20)).unwrap();
    random_reads(&big, &data, 3, 200);
    let cold = big.stats();
    assert!(cold.bytes_fetched > 0 && cold.misses > 0);
    random_reads(&big, &data, 3, 200);
    let warm = big.stats();
    assert_eq!(warm.bytes_fetched, cold.bytes_fetched, "warm reads fetched");
    assert_eq!(warm.requests, cold.requests);
    assert!(warm.hits > cold.hits);
    // Sequential reads of the whole object, 4 KiB at a time, with readahead: few GETs.
    let seq = RemoteObject::open(&url("ranges.bin"), &cfg(256 << 10, 4 << 20)).unwrap();
    let mut all = vec![0u8; data.len()];
    for (i, c) in all.chunks_mut(4096).enumerate() {
        seq.read_exact_at(i as u64 * 4096, c).unwrap();
    }
    assert!(all == data);
    let s = seq.stats();
    assert!(s.requests <= data.len() as u64 / (256 << 10) + 2, "{s:?}");
    assert_eq!(s.bytes_fetched, data.len() as u64, "{s:?}");
}

#[test]
#[ignore = "needs radosgw: tests/suites/s3.sh"]
fn a_replaced_object_fails_instead_of_mixing_versions() {
    let old = random_bytes(1 << 20, 4);
    curl_put("changing.bin", &old);
    let o = RemoteObject::open(&url("changing.bin"), &cfg(64 << 10, 1 << 20)).unwrap();
    let mut b = vec![0u8; 4096];
    o.read_exact_at(0, &mut b).unwrap();
    assert!(b == old[..4096]);
    curl_put("changing.bin", &random_bytes(1 << 20, 5));
    // Cached bytes are the old version's; the next fetch is refused.
    o.read_exact_at(0, &mut b).unwrap();
    let e = o.read_exact_remote(512 << 10, &mut b).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
    assert!(e.to_string().contains("changed since it was opened"), "{e}");
    let io = o.read_exact_at(700 << 10, &mut b).unwrap_err();
    assert_eq!(snapblk_core::Error::from_io(io).errno, libc::ESTALE);
}

#[test]
#[ignore = "needs radosgw: tests/suites/s3.sh"]
fn wrong_credentials_missing_objects_and_dead_endpoints_give_clear_errors() {
    curl_put("present.bin", b"hello");
    let mut c = cfg(64 << 10, 1 << 20);
    if let Some(k) = c.credentials.as_mut() {
        k.secret_key.push('x');
    }
    let e = RemoteObject::open(&url("present.bin"), &c).unwrap_err();
    assert!(matches!(e, RemoteError::Denied { status: 403, .. }), "{e}");
    assert!(e.to_string().contains("access denied"), "{e}");
    let e = RemoteObject::open(&url("no-such-object"), &cfg(64 << 10, 0)).unwrap_err();
    assert!(matches!(e, RemoteError::NotFound { .. }), "{e}");
    assert_eq!(e.errno(), libc::ENOENT);
    let e = RemoteObject::open(
        &format!("s3://no-such-bucket-{}/k", std::process::id()),
        &cfg(64 << 10, 0),
    )
    .unwrap_err();
    assert!(matches!(e, RemoteError::NotFound { .. }), "{e}");
    // Nobody listens on port 1: refused at once, after the configured retries.
    let dead = RemoteConfig {
        endpoint: Some("http://127.0.0.1:1".into()),
        retries: 1,
        timeout: Duration::from_secs(2),
        ..cfg(64 << 10, 0)
    };
    let e = RemoteObject::open(&url("present.bin"), &dead).unwrap_err();
    assert!(
        matches!(
            e,
            RemoteError::Unreachable {
                attempts: 2,
                timeout_secs: 2,
                ..
            }
        ),
        "{e}"
    );
    // Anonymous reads of a private object are denied.
    let anon = RemoteConfig {
        credentials: None,
        ..cfg(64 << 10, 0)
    };
    let e = RemoteObject::open(&url("present.bin"), &anon).unwrap_err();
    assert!(matches!(e, RemoteError::Denied { .. }), "{e}");
}

#[test]
#[ignore = "needs radosgw: tests/suites/s3.sh"]
fn put_and_get_round_trip_with_the_checksum() {
    let data = random_bytes((1 << 20) + 7, 6);
    let dir = std::env::temp_dir().join(format!("snapblk-rgw-put-{}", std::process::id()));
    std::fs::write(&dir, &data).unwrap();
    let c = cfg(64 << 10, 0);
    let r = snapblk_remote::put_file(&c, &url("put.bin"), Path::new(&dir)).unwrap();
    std::fs::remove_file(&dir).unwrap();
    assert_eq!(r.bytes, data.len() as u64);
    let mut got = Vec::new();
    let g = snapblk_remote::get_to(&c, &url("put.bin"), &mut got).unwrap();
    assert!(got == data);
    assert!(g.checked, "the sha256 metadata came back");
    assert_eq!(g.sha256, r.sha256);
    // An object put by another client has no digest: fetched, said unchecked.
    curl_put("plain.bin", b"plain");
    let mut got = Vec::new();
    assert!(
        !snapblk_remote::get_to(&c, &url("plain.bin"), &mut got)
            .unwrap()
            .checked
    );
}

#[test]
#[ignore = "needs radosgw behind TLS: tests/suites/s3.sh"]
fn https_with_a_private_ca() {
    let data = random_bytes(300_000, 7);
    curl_put("tls.bin", &data);
    let c = RemoteConfig {
        endpoint: Some(env("S3_TEST_HTTPS_ENDPOINT")),
        ..cfg(64 << 10, 1 << 20)
    };
    let o = RemoteObject::open(&url("tls.bin"), &c).unwrap();
    random_reads(&o, &data, 8, 50);
}
