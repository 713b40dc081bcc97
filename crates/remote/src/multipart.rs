//! S3 multipart upload of a file larger than one part: `CreateMultipartUpload` (POST
//! `?uploads`), one `UploadPart` per part (PUT `?partNumber=N&uploadId=U`, each signed with its
//! own SHA-256, so the server refuses a part that arrives different), then
//! `CompleteMultipartUpload` (POST `?uploadId=U` listing every part's ETag). Any failure after
//! the upload was created aborts it (DELETE `?uploadId=U`), so no orphaned parts stay billed and
//! listed. The object's ETag is then `"MD5-OF-PART-MD5S-N"`.

use crate::config::Target;
use crate::error::{RemoteError, Result};
use crate::http::{Body, Client};
use crate::sigv4::hex;
use crate::transfer::SHA256_META;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

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

/// Hash `len` bytes of `path` in parts of `part` bytes.
pub(crate) fn hash_parts(path: &Path, len: u64, part: u64) -> std::io::Result<Hashes> {
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
    Ok(Hashes {
        whole: hex(&whole.finalize()),
        parts,
    })
}

/// Upload `len` bytes of `path` to `t` in parts of `part` bytes whose hashes are `h`; the
/// object's ETag if the server gave one.
pub(crate) fn upload(
    client: &Client,
    t: &Target,
    path: &Path,
    len: u64,
    part: u64,
    h: &Hashes,
) -> Result<Option<String>> {
    let resp = client.send_query(
        t,
        "POST",
        &[("uploads", "")],
        &[(SHA256_META, &h.whole)],
        &Body::Empty,
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
    let r = upload_parts(client, t, &id, path, len, part, h);
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

fn upload_parts(
    client: &Client,
    t: &Target,
    id: &str,
    path: &Path,
    len: u64,
    part: u64,
    h: &Hashes,
) -> Result<Option<String>> {
    let mut etags = Vec::with_capacity(h.parts.len());
    for (i, sha) in h.parts.iter().enumerate() {
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
                sha256: sha,
            },
            None,
        )?;
        let Some(etag) = resp.header("etag") else {
            return Err(RemoteError::BadResponse {
                url: t.display.clone(),
                why: format!("part {n} was answered without an ETag"),
            });
        };
        etags.push(etag.to_owned());
    }
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
        let h = hash_parts(&p, 10_000, 4096).unwrap();
        assert_eq!(h.whole, hex(&Sha256::digest(&data)));
        assert_eq!(h.parts.len(), 3);
        assert_eq!(h.parts[2], hex(&Sha256::digest(&data[8192..])));
        assert!(hash_parts(&p, 20_000, 4096).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest::proptest! {
        #[test]
        fn xml_text_never_panics(s in "\\PC{0,80}", t in "[A-Za-z]{1,8}") {
            let _ = xml_text(&s, &t);
        }
    }
}
