//! S3 multipart upload of a file larger than one part: `CreateMultipartUpload` (POST
//! `?uploads`), one `UploadPart` per part (PUT `?partNumber=N&uploadId=U`, each signed with its
//! own SHA-256, so the server refuses a part that arrives different), up to
//! [`RemoteConfig::put_jobs`](crate::RemoteConfig::put_jobs) of them at once, then
//! `CompleteMultipartUpload` (POST `?uploadId=U` listing every part's ETag in part order, once
//! every part is stored). Any failure after the upload was created, and a stop asked for by the
//! caller, aborts it (DELETE `?uploadId=U`), so no orphaned parts stay billed and listed and no
//! object appears. The object's ETag is then `"MD5-OF-PART-MD5S-N"`.
use crate::config::Target;
use crate::error::{RemoteError, Result};
use crate::http::{Body, Client};
use crate::sigv4::hex;
use crate::transfer::SHA256_META;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Smallest part S3 accepts (every part but the last).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// Largest part S3 accepts.
pub const MAX_PART_SIZE: u64 = 5 << 30;
/// Most parts one upload may have.
pub const MAX_PARTS: u64 = 10_000;
/// Largest response body read for its XML.
const MAX_XML: u64 = 1 << 20;

/// The part size used for a `len`-byte file when `part_size` is asked for: `part_size`, or
/// larger (whole MiB) when the file would need more than [`MAX_PARTS`] parts. `None` when even
/// [`MAX_PART_SIZE`] parts cannot hold it (more than about 48.8 TiB).
pub(crate) fn part_size_for(len: u64, part_size: u64) -> Option<u64> {
    let min = len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20);
    let ps = part_size.max(min);
    (ps <= MAX_PART_SIZE).then_some(ps)
}

/// The text of the first `<tag>…</tag>` in `xml` (untrusted: never panics).
pub(crate) fn xml_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let rest = xml.get(start..)?;
    rest.get(..rest.find(&close)?)
}

/// `&quot;` and the other XML entities S3 uses in an ETag, decoded.
fn xml_unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#34;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The `CompleteMultipartUpload` body for the parts' ETags (part numbers from 1).
pub(crate) fn complete_body(etags: &[String]) -> String {
    let mut s = String::from("<CompleteMultipartUpload>");
    for (i, e) in etags.iter().enumerate() {
        let e = e.replace('&', "&amp;").replace('<', "&lt;");
        s.push_str(&format!(
            "<Part><PartNumber>{}</PartNumber><ETag>{e}</ETag></Part>",
            i + 1
        ));
    }
    s.push_str("</CompleteMultipartUpload>");
    s
}

fn read_xml(t: &Target, resp: ureq::Response) -> Result<String> {
    let mut text = String::new();
    resp.into_reader()
        .take(MAX_XML)
        .read_to_string(&mut text)
        .map_err(|source| RemoteError::Body {
            url: t.display.clone(),
            source,
        })?;
    Ok(text)
}

/// The hashes a multipart upload signs: the whole file's and each part's.
pub(crate) struct Hashes {
    pub(crate) whole: String,
    pub(crate) parts: Vec<String>,
}

/// Hash `len` bytes of `path` in parts of `part` bytes; `None` when `stop` was raised first.
pub(crate) fn hash_parts(
    path: &Path,
    len: u64,
    part: u64,
    stop: &AtomicBool,
) -> std::io::Result<Option<Hashes>> {
    let mut f = std::fs::File::open(path)?.take(len);
    let mut whole = Sha256::new();
    let mut parts = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let want = part.min(len - done);
        let mut ph = Sha256::new();
        let mut got = 0u64;
        while got < want {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let n = usize::try_from((want - got).min(buf.len() as u64)).unwrap_or(buf.len());
            let n = f.read(&mut buf[..n])?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} bytes read of {len}: the file shrank while it was read",
                        done + got
                    ),
                ));
            }
            ph.update(&buf[..n]);
            whole.update(&buf[..n]);
            got += n as u64;
        }
        parts.push(hex(&ph.finalize()));
        done += want;
    }
    Ok(Some(Hashes {
        whole: hex(&whole.finalize()),
        parts,
    }))
}

/// Run `part(i, halted)` for every `i` in `0..n` on up to `jobs` threads, each taking the next
/// index as it finishes one, and return the results in index order (whatever order they
/// finished in). The first error stops the others: no thread takes another index, and
/// `halted()` turns true for the parts in flight (an upload polls it while it streams its
/// body). When `stop` is raised, the same happens and the result is
/// [`RemoteError::Stopped`]. An error caused by the halt itself (`Stopped`) never hides the
/// error that caused it.
pub(crate) fn run_parts<T: Send>(
    n: usize,
    jobs: usize,
    stop: &AtomicBool,
    url: &str,
    part: impl Fn(usize, &(dyn Fn() -> bool + Sync)) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let failed = AtomicBool::new(false);
    let halted = || stop.load(Ordering::Relaxed) || failed.load(Ordering::Relaxed);
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    let first_err: Mutex<Option<RemoteError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, n.max(1)) {
            s.spawn(|| {
                while !halted() {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    match part(i, &halted) {
                        Ok(v) => {
                            if let Some(slot) = snapblk_core::sync::lock(&done).get_mut(i) {
                                *slot = Some(v);
                            }
                        }
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            let mut first = snapblk_core::sync::lock(&first_err);
                            let replace = match &*first {
                                None => true,
                                Some(f) => {
                                    matches!(f, RemoteError::Stopped { .. })
                                        && !matches!(e, RemoteError::Stopped { .. })
                                }
                            };
                            if replace {
                                *first = Some(e);
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
    let stopped = || RemoteError::Stopped {
        url: url.to_owned(),
    };
    match snapblk_core::sync::into_inner(first_err) {
        Some(RemoteError::Stopped { .. }) => return Err(stopped()),
        Some(e) if !stop.load(Ordering::Relaxed) => return Err(e),
        // A part that failed because the caller stopped the upload (its connection was cut).
        Some(_) => return Err(stopped()),
        None => {}
    }
    if stop.load(Ordering::Relaxed) {
        return Err(stopped());
    }
    snapblk_core::sync::into_inner(done)
        .into_iter()
        .collect::<Option<Vec<T>>>()
        .ok_or_else(stopped)
}

/// One file's multipart upload: `len` bytes of `path` in parts of `part` bytes whose hashes are
/// `hashes`, up to `jobs` parts at once, until `stop` is raised.
pub(crate) struct Upload<'a> {
    pub(crate) path: &'a Path,
    pub(crate) len: u64,
    pub(crate) part: u64,
    pub(crate) hashes: &'a Hashes,
    pub(crate) jobs: usize,
    pub(crate) stop: &'a AtomicBool,
}

/// Send `u` to `t`; the object's ETag if the server gave one.
pub(crate) fn upload(client: &Client, t: &Target, u: &Upload<'_>) -> Result<Option<String>> {
    let h = u.hashes;
    // A stop between its retries gives up; nothing was created that could be named.
    let stopped = || u.stop.load(Ordering::Relaxed);
    let resp = client.send_query(
        t,
        "POST",
        &[("uploads", "")],
        &[(SHA256_META, &h.whole)],
        &Body::EmptyUntil { halted: &stopped },
        None,
    )?;
    let xml = read_xml(t, resp)?;
    let Some(id) = xml_text(&xml, "UploadId").filter(|s| !s.is_empty()) else {
        return Err(RemoteError::BadResponse {
            url: t.display.clone(),
            why: "CreateMultipartUpload answered without an UploadId".into(),
        });
    };
    let id = id.to_owned();
    let r = upload_parts(client, t, &id, u);
    if r.is_err() {
        // Leave no parts behind; the upload's own error is what the caller reports.
        if let Err(e) =
            client.send_query(t, "DELETE", &[("uploadId", &id)], &[], &Body::Empty, None)
        {
            log::warn!(
                "{}: aborting multipart upload {id}: {}",
                t.display,
                snapblk_core::Chain(&e)
            );
        }
    }
    r
}

fn upload_parts(client: &Client, t: &Target, id: &str, u: &Upload<'_>) -> Result<Option<String>> {
    let (path, len, part) = (u.path, u.len, u.part);
    let etags = run_parts(
        u.hashes.parts.len(),
        u.jobs,
        u.stop,
        &t.display,
        |i, halted| {
            let offset = i as u64 * part;
            let n = (i + 1).to_string();
            let resp = client.send_query(
                t,
                "PUT",
                &[("partNumber", &n), ("uploadId", id)],
                &[],
                &Body::File {
                    path,
                    offset,
                    len: part.min(len - offset),
                    sha256: u.hashes.parts.get(i).map_or("", String::as_str),
                    halted: Some(halted),
                },
                None,
            )?;
            match resp.header("etag") {
                Some(etag) => Ok(etag.to_owned()),
                None => Err(RemoteError::BadResponse {
                    url: t.display.clone(),
                    why: format!("part {n} was answered without an ETag"),
                }),
            }
        },
    )?;
    // Every part is stored: completing now cannot publish half an object. A stop that arrives
    // from here on is too late to matter; the caller learns the object is whole.
    let body = complete_body(&etags);
    let sha = hex(&Sha256::digest(body.as_bytes()));
    let resp = client.send_query(
        t,
        "POST",
        &[("uploadId", id)],
        &[],
        &Body::Bytes {
            data: body.as_bytes(),
            sha256: &sha,
        },
        None,
    )?;
    // S3 may answer 200 and still fail the completion in the body.
    let xml = read_xml(t, resp)?;
    if xml.contains("<Error>") {
        return Err(crate::http::status_error(&t.display, 500, &xml, None));
    }
    match xml_text(&xml, "ETag").map(xml_unescape) {
        Some(e) if !e.is_empty() => Ok(Some(e)),
        // Ceph RGW answers with an empty ETag: ask for it.
        _ => {
            let resp = client.send(t, "HEAD", &[], &Body::Empty, None)?;
            Ok(resp.header("etag").map(str::to_owned))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_sizes_grow_to_stay_within_ten_thousand_parts() {
        assert_eq!(part_size_for(20 << 20, 5 << 20), Some(5 << 20));
        assert_eq!(part_size_for(MAX_PARTS * (5 << 20), 5 << 20), Some(5 << 20));
        // One byte more needs a sixth MiB per part.
        assert_eq!(
            part_size_for(MAX_PARTS * (5 << 20) + 1, 5 << 20),
            Some(6 << 20)
        );
        assert_eq!(
            part_size_for(MAX_PARTS * MAX_PART_SIZE, 5 << 20),
            Some(MAX_PART_SIZE)
        );
        assert_eq!(part_size_for(MAX_PARTS * MAX_PART_SIZE + 1, 5 << 20), None);
    }

    #[test]
    fn xml_fields_and_the_completion_body() {
        let x = "<InitiateMultipartUploadResult><Bucket>b</Bucket><UploadId>2~abc</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(xml_text(x, "UploadId"), Some("2~abc"));
        assert_eq!(xml_text(x, "Key"), None);
        assert_eq!(xml_text("<UploadId>x", "UploadId"), None);
        assert_eq!(xml_unescape("&quot;d41d-2&quot;"), "\"d41d-2\"");
        assert_eq!(
            complete_body(&["\"a\"".into(), "\"b\"".into()]),
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"a\"</ETag></Part>\
             <Part><PartNumber>2</PartNumber><ETag>\"b\"</ETag></Part></CompleteMultipartUpload>"
        );
    }

    #[test]
    fn parts_are_hashed_apart_and_together() {
        let dir = std::env::temp_dir().join(format!("snapblk-mp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let go = AtomicBool::new(false);
        let h = hash_parts(&p, 10_000, 4096, &go).unwrap().unwrap();
        assert_eq!(h.whole, hex(&Sha256::digest(&data)));
        assert_eq!(h.parts.len(), 3);
        assert_eq!(h.parts[2], hex(&Sha256::digest(&data[8192..])));
        assert!(hash_parts(&p, 20_000, 4096, &go).is_err());
        assert!(
            hash_parts(&p, 10_000, 4096, &AtomicBool::new(true))
                .unwrap()
                .is_none()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn denied(i: usize) -> RemoteError {
        RemoteError::Denied {
            url: format!("part {i}"),
            status: 403,
            code: String::new(),
        }
    }

    /// Parts finish in reverse order (each waits for the next one to finish, which needs all
    /// four in flight at once); the results still come back in part order.
    #[test]
    fn results_keep_part_order_whatever_order_parts_finish_in() {
        let finished = Mutex::new(Vec::new());
        let cv = std::sync::Condvar::new();
        let r = run_parts(4, 4, &AtomicBool::new(false), "u", |i, _| {
            let mut f = snapblk_core::sync::lock(&finished);
            while i < 3 && !f.contains(&(i + 1)) {
                f = snapblk_core::sync::wait(&cv, f);
            }
            f.push(i);
            cv.notify_all();
            Ok(format!("etag{i}"))
        })
        .unwrap();
        assert_eq!(r, ["etag0", "etag1", "etag2", "etag3"]);
        assert_eq!(*snapblk_core::sync::lock(&finished), [3, 2, 1, 0]);
    }

    /// Never more than `jobs` parts in flight, and every part sent exactly once.
    #[test]
    fn at_most_jobs_parts_in_flight() {
        for jobs in [1, 3, 8] {
            let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let calls = Mutex::new(vec![0u32; 50]);
            let r = run_parts(50, jobs, &AtomicBool::new(false), "u", |i, _| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                snapblk_core::sync::lock(&calls)[i] += 1;
                std::thread::yield_now();
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(i)
            })
            .unwrap();
            assert_eq!(r, (0..50).collect::<Vec<_>>());
            assert!(most.load(Ordering::SeqCst) <= jobs, "jobs {jobs}");
            assert!(snapblk_core::sync::lock(&calls).iter().all(|&c| c == 1));
        }
    }

    /// Part 5 fails: the parts in flight see `halted()` (they fail with `Stopped`, as a cut
    /// body does), no part past them starts, and the error reported is part 5's.
    #[test]
    fn the_first_failure_stops_the_rest_and_is_the_one_reported() {
        let started = Mutex::new(Vec::new());
        let r: Result<Vec<()>> = run_parts(100, 4, &AtomicBool::new(false), "u", |i, halted| {
            snapblk_core::sync::lock(&started).push(i);
            match i {
                0..5 => Ok(()),
                5 => Err(denied(i)),
                _ => {
                    while !halted() {
                        std::thread::yield_now();
                    }
                    Err(RemoteError::Stopped { url: "u".into() })
                }
            }
        });
        match r {
            Err(RemoteError::Denied { url, .. }) => assert_eq!(url, "part 5"),
            other => panic!("{other:?}"),
        }
        let started = snapblk_core::sync::lock(&started);
        // 0..=5, plus at most the three other threads' parts in flight when 5 failed.
        assert!(started.len() <= 9, "{started:?}");
        assert!(started.iter().all(|&i| i < 9), "{started:?}");
    }

    /// The caller's stop (a signal): the parts in flight are halted, none starts after, and
    /// the result is `Stopped` even though the halted parts failed; raised before the first
    /// part, nothing is sent at all.
    #[test]
    fn a_stop_halts_the_parts_and_reports_stopped() {
        let stop = AtomicBool::new(false);
        let started = AtomicUsize::new(0);
        let r: Result<Vec<()>> = run_parts(100, 4, &stop, "s3://b/k", |i, halted| {
            started.fetch_add(1, Ordering::SeqCst);
            if i == 2 {
                stop.store(true, Ordering::SeqCst);
            }
            while !halted() {
                std::thread::yield_now();
            }
            Err(denied(i))
        });
        match r {
            Err(RemoteError::Stopped { url }) => assert_eq!(url, "s3://b/k"),
            other => panic!("{other:?}"),
        }
        assert!(started.load(Ordering::SeqCst) <= 6);
        let r: Result<Vec<()>> = run_parts(3, 2, &AtomicBool::new(true), "u", |_, _| {
            panic!("a part started after the stop")
        });
        assert!(matches!(r, Err(RemoteError::Stopped { .. })));
    }

    proptest::proptest! {
        #[test]
        fn xml_text_never_panics(s in "\\PC{0,80}", t in "[A-Za-z]{1,8}") {
            let _ = xml_text(&s, &t);
        }
    }
}
