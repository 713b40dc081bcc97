//! Whole-object transfers: publish a local file ([`put_file`]) and fetch an object
//! ([`get_to`]), each checked end to end by SHA-256. A PUT signs the file's SHA-256 as its
//! payload hash, so the server refuses bytes that arrive different; the digest is also stored as
//! the object's `x-amz-meta-sha256`, which [`get_to`] checks the received bytes against. A file
//! larger than the part size goes up as a multipart upload (`crate::multipart`), each part
//! signed with its own SHA-256.

use crate::config::{RemoteConfig, Target};
use crate::error::{RemoteError, Result};
use crate::http::{Body, Client};
use crate::sigv4::hex;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Metadata header holding the object's SHA-256 (hex).
pub const SHA256_META: &str = "x-amz-meta-sha256";

/// What a transfer moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferReport {
    /// Bytes sent or received.
    pub bytes: u64,
    /// Hex SHA-256 of those bytes.
    pub sha256: String,
    /// On a get: whether the object carried a recorded digest that was compared (it always
    /// matched, or the get failed).
    pub checked: bool,
    /// The object's ETag, if the server gave one.
    pub etag: Option<String>,
    /// On a put: the parts it was sent in (1: one PUT; more: a multipart upload).
    pub parts: u64,
}

fn local(path: &Path) -> impl FnOnce(std::io::Error) -> RemoteError + '_ {
    move |source| RemoteError::Local {
        path: path.to_owned(),
        source,
    }
}

/// Upload `path` to `url`: with one PUT up to [`RemoteConfig::part_size`], as a multipart
/// upload in parts of that size above it, [`RemoteConfig::put_jobs`] parts at once (aborted if
/// any step fails, so no parts are left).
pub fn put_file(cfg: &RemoteConfig, url: &str, path: &Path) -> Result<TransferReport> {
    put_file_until(cfg, url, path, &AtomicBool::new(false))
}

/// [`put_file`] that gives up when `stop` is raised (from a signal handler's thread, say):
/// hashing ends, the bodies being sent are cut short, no further part starts, a multipart
/// upload is aborted and the result is [`RemoteError::Stopped`]; the object is never
/// completed from part of the file. A stop raised once every part is stored comes too late:
/// the upload completes and the result is `Ok`.
pub fn put_file_until(
    cfg: &RemoteConfig,
    url: &str,
    path: &Path,
    stop: &AtomicBool,
) -> Result<TransferReport> {
    cfg.validate()?;
    let stopped = || RemoteError::Stopped {
        url: url.to_owned(),
    };
    let target = Target::parse(url, cfg)?;
    let f = std::fs::File::open(path).map_err(local(path))?;
    let meta = f.metadata().map_err(local(path))?;
    // Only a regular file has the length the PUT announces (`/dev/zero` would be hashed for
    // ever), and only its first `len` bytes are hashed and sent.
    if !meta.is_file() {
        return Err(local(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file; remote put uploads files",
        )));
    }
    let len = meta.len();
    if len > cfg.part_size {
        let Some(part) = crate::multipart::part_size_for(len, cfg.part_size) else {
            return Err(RemoteError::BadConfig {
                what: path.display().to_string(),
                why: format!("{len} bytes is more than 10,000 parts of 5 GiB"),
            });
        };
        let h = crate::multipart::hash_parts(path, len, part, stop)
            .map_err(local(path))?
            .ok_or_else(stopped)?;
        let client = Client::new(cfg);
        let upload = crate::multipart::Upload {
            path,
            len,
            part,
            hashes: &h,
            jobs: cfg.put_jobs,
            stop,
        };
        let etag = crate::multipart::upload(&client, &target, &upload)?;
        return Ok(TransferReport {
            bytes: len,
            sha256: h.whole,
            checked: true,
            etag,
            parts: h.parts.len() as u64,
        });
    }
    let mut f = f.take(len);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut hashed = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(stopped());
        }
        let n = f.read(&mut buf).map_err(local(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        hashed += n as u64;
    }
    if hashed != len {
        return Err(local(path)(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{hashed} bytes read of {len}: the file shrank while it was read"),
        )));
    }
    let sha = hex(&h.finalize());
    let client = Client::new(cfg);
    let halted = || stop.load(Ordering::Relaxed);
    let resp = client.send(
        &target,
        "PUT",
        &[(SHA256_META, &sha)],
        &Body::File {
            path,
            offset: 0,
            len,
            sha256: &sha,
            halted: Some(&halted),
        },
        None,
    )?;
    Ok(TransferReport {
        bytes: len,
        sha256: sha,
        checked: true,
        etag: resp.header("etag").map(str::to_owned),
        parts: 1,
    })
}

/// Download `url` into `out`; when the object records its SHA-256 ([`SHA256_META`]) the bytes
/// must match it ([`RemoteError::Checksum`] otherwise — the caller discards `out`).
pub fn get_to(cfg: &RemoteConfig, url: &str, out: &mut dyn Write) -> Result<TransferReport> {
    cfg.validate()?;
    let target = Target::parse(url, cfg)?;
    let client = Client::new(cfg);
    let resp = client.send(&target, "GET", &[], &Body::Empty, None)?;
    let want = resp
        .header(SHA256_META)
        .map(|s| s.trim().to_ascii_lowercase());
    let etag = resp.header("etag").map(str::to_owned);
    let expect_len = resp
        .header("content-length")
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut r = resp.into_reader();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    let body = |source| RemoteError::Body {
        url: target.display.clone(),
        source,
    };
    loop {
        let n = r.read(&mut buf).map_err(body)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|source| RemoteError::Local {
                path: "output".into(),
                source,
            })?;
        bytes += n as u64;
    }
    if expect_len.is_some_and(|l| l != bytes) {
        return Err(RemoteError::BadResponse {
            url: target.display.clone(),
            why: format!("{bytes} bytes received, Content-Length said {expect_len:?}"),
        });
    }
    let got = hex(&h.finalize());
    if let Some(w) = &want
        && *w != got
    {
        return Err(RemoteError::Checksum {
            url: target.display,
            want: w.clone(),
            got,
        });
    }
    Ok(TransferReport {
        bytes,
        sha256: got,
        checked: want.is_some(),
        etag,
        parts: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/dev/zero` never ends: it is refused, not hashed for ever.
    #[test]
    fn put_refuses_what_is_not_a_regular_file() {
        let cfg = RemoteConfig {
            endpoint: Some("http://127.0.0.1:1".into()),
            ..RemoteConfig::default()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(put_file(&cfg, "s3://b/k", Path::new("/dev/zero")).map(|_| ()));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("put_file of /dev/zero did not return within 60 s");
        let e = r.expect_err("/dev/zero was uploaded");
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("not a regular file"), "{chain}");
    }
}
