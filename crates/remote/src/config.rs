//! Where an object is and how to reach it: the URL forms, the endpoint, region, credentials and
//! the cache and retry settings, from the environment and/or explicit values.

use crate::error::{RemoteError, Result};
use crate::sigv4::{Credentials, uri_encode};
use std::time::Duration;

/// Default block size of the cache: one ranged GET fetches whole blocks.
pub const DEFAULT_BLOCK_SIZE: u64 = 256 << 10;
/// Default cache size.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;
/// Default blocks fetched past a sequential read.
pub const DEFAULT_READAHEAD_BLOCKS: u64 = 4;
/// Default per-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default retries after a failed attempt (transport errors and HTTP 5xx/429 only).
pub const DEFAULT_RETRIES: u32 = 3;
/// Default part size of uploads: a larger file goes up as a multipart upload.
pub const DEFAULT_PART_SIZE: u64 = 64 << 20;
/// Default parts of a multipart upload in flight at once.
pub const DEFAULT_PUT_JOBS: usize = 4;
/// Most parts of a multipart upload in flight at once.
pub const MAX_PUT_JOBS: usize = 64;
/// Reads one `s3` / `http` device has in flight at once: the threads of its worker pool, each
/// with its own connection (all queues of the device share them; cache hits need none).
pub const READ_WORKERS: usize = 8;

/// How to reach remote objects and how to cache them.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Endpoint of `s3://` URLs (`http(s)://HOST[:PORT]`); AWS's regional endpoint when `None`.
    pub endpoint: Option<String>,
    /// SigV4 region.
    pub region: String,
    /// Credentials for `s3://` URLs; requests are anonymous (unsigned) when `None`.
    pub credentials: Option<Credentials>,
    /// Per-request connect/read/write timeout.
    pub timeout: Duration,
    /// Retries after a transport error or HTTP 5xx/429, with backoff.
    pub retries: u32,
    /// Bytes of blocks kept in memory (0: no cache; every read fetches).
    pub cache_bytes: u64,
    /// Block size of the cache and of fetches (a power of two, 4 KiB to 64 MiB).
    pub block_size: u64,
    /// Blocks fetched ahead of a read that continues the previous one.
    pub readahead_blocks: u64,
    /// Part size of uploads (5 MiB to 5 GiB, S3's limits): a file larger than this is sent as
    /// a multipart upload in parts of this size (larger when it would take more than 10,000).
    pub part_size: u64,
    /// Parts of a multipart upload sent at once (1 to [`MAX_PUT_JOBS`]), each on its own
    /// connection. Each part streams from the file, so memory stays a few small buffers per
    /// job whatever the part size.
    pub put_jobs: usize,
    /// Read an object whose server gives neither an ETag nor a Last-Modified date, though a
    /// change between two reads could then go unnoticed (`SNAPBLK_REMOTE_ALLOW_UNPINNED=1`).
    /// Without it, opening such an object fails with [`RemoteError::Unpinned`].
    pub allow_unpinned: bool,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            endpoint: None,
            region: "us-east-1".into(),
            credentials: None,
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            block_size: DEFAULT_BLOCK_SIZE,
            readahead_blocks: DEFAULT_READAHEAD_BLOCKS,
            part_size: DEFAULT_PART_SIZE,
            put_jobs: DEFAULT_PUT_JOBS,
            allow_unpinned: false,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl RemoteConfig {
    /// Defaults plus the AWS environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`, `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, `AWS_REGION` or
    /// `AWS_DEFAULT_REGION`, and `SNAPBLK_REMOTE_ALLOW_UNPINNED=1`
    /// ([`RemoteConfig::allow_unpinned`]). A key id without a secret (or the other way round)
    /// is refused.
    pub fn from_env() -> Result<Self> {
        let mut c = RemoteConfig {
            endpoint: env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL")),
            allow_unpinned: env("SNAPBLK_REMOTE_ALLOW_UNPINNED").is_some_and(|v| v == "1"),
            ..RemoteConfig::default()
        };
        if let Some(r) = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")) {
            c.region = r;
        }
        c.credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key), Some(secret_key)) => Some(Credentials {
                access_key,
                secret_key,
                session_token: env("AWS_SESSION_TOKEN"),
            }),
            (None, None) => None,
            (a, _) => {
                return Err(RemoteError::BadConfig {
                    what: if a.is_some() {
                        "AWS_SECRET_ACCESS_KEY"
                    } else {
                        "AWS_ACCESS_KEY_ID"
                    }
                    .into(),
                    why: "not set, but the other half of the key pair is".into(),
                });
            }
        };
        Ok(c)
    }

    /// Checks the cache geometry.
    pub fn validate(&self) -> Result<()> {
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(4096..=64 << 20).contains(&bs) {
            return Err(RemoteError::BadConfig {
                what: "block-size".into(),
                why: format!("{bs} is not a power of two from 4 KiB to 64 MiB"),
            });
        }
        let ps = self.part_size;
        if !(crate::multipart::MIN_PART_SIZE..=crate::multipart::MAX_PART_SIZE).contains(&ps) {
            return Err(RemoteError::BadConfig {
                what: "part-size".into(),
                why: format!("{ps} is not from 5 MiB to 5 GiB (S3's part sizes)"),
            });
        }
        if !(1..=MAX_PUT_JOBS).contains(&self.put_jobs) {
            return Err(RemoteError::BadConfig {
                what: "jobs".into(),
                why: format!("{} is not from 1 to {MAX_PUT_JOBS}", self.put_jobs),
            });
        }
        if self.timeout.is_zero() {
            return Err(RemoteError::BadConfig {
                what: "timeout".into(),
                why: "must be at least 1 second".into(),
            });
        }
        Ok(())
    }
}

/// True when `s` names a remote object (`s3://`, `http://` or `https://`), not a local path.
pub fn is_remote(s: &str) -> bool {
    ["s3://", "http://", "https://"]
        .iter()
        .any(|p| s.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p)))
}

/// One object, resolved to what a request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as the user wrote it (for messages).
    pub display: String,
    /// The URL requests go to.
    pub url: String,
    /// `Host` header value (the port only when not the scheme's default).
    pub host: String,
    /// The encoded path (canonical URI of SigV4).
    pub path: String,
    /// Requests are SigV4-signed (an `s3://` URL with credentials).
    pub signed: bool,
}

/// `(scheme, authority, rest)` of an `http(s)://` URL; the authority without a default port.
fn split_http(url: &str) -> Result<(&'static str, String, &str)> {
    let bad = |why| RemoteError::BadUrl {
        url: url.to_owned(),
        why,
    };
    let (scheme, rest) = if url.len() >= 7 && url[..7].eq_ignore_ascii_case("http://") {
        ("http", &url[7..])
    } else if url.len() >= 8 && url[..8].eq_ignore_ascii_case("https://") {
        ("https", &url[8..])
    } else {
        return Err(bad("it does not start with s3://, http:// or https://"));
    };
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if auth.is_empty() {
        return Err(bad("no host"));
    }
    if auth.contains('@') {
        return Err(bad(
            "user:password@ in a URL is not supported; use the AWS_* variables",
        ));
    }
    if auth
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(bad("the host has spaces or control characters"));
    }
    let default = if scheme == "http" { ":80" } else { ":443" };
    let host = auth
        .strip_suffix(default)
        .unwrap_or(auth)
        .to_ascii_lowercase();
    Ok((scheme, host, path))
}

impl Target {
    /// Resolve `url` with `cfg`: `s3://BUCKET/KEY` goes to the endpoint path-style
    /// (`ENDPOINT/BUCKET/KEY`, signed when there are credentials); `http(s)://…` is fetched as
    /// written, unsigned (a public object or a presigned URL).
    pub fn parse(url: &str, cfg: &RemoteConfig) -> Result<Target> {
        let bad = |why| RemoteError::BadUrl {
            url: url.to_owned(),
            why,
        };
        if url.len() >= 5 && url[..5].eq_ignore_ascii_case("s3://") {
            let rest = &url[5..];
            let (bucket, key) = rest
                .split_once('/')
                .ok_or_else(|| bad("no key after the bucket"))?;
            if bucket.is_empty() || key.is_empty() {
                return Err(bad("empty bucket or key"));
            }
            if !bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            {
                return Err(bad("a bucket name has only a-z, 0-9, '-' and '.'"));
            }
            if key.bytes().any(|b| b.is_ascii_control()) {
                return Err(bad("the key has control characters"));
            }
            let endpoint = cfg
                .endpoint
                .clone()
                .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", cfg.region));
            let (scheme, host, base) =
                split_http(endpoint.trim_end_matches('/')).map_err(|_| RemoteError::BadConfig {
                    what: "endpoint".into(),
                    why: format!("{endpoint:?} is not an http(s)://HOST[:PORT] URL"),
                })?;
            if base.contains('?') {
                return Err(RemoteError::BadConfig {
                    what: "endpoint".into(),
                    why: format!("{endpoint:?} has a query"),
                });
            }
            let path = format!("{base}/{bucket}/{}", uri_encode(key, true));
            return Ok(Target {
                display: url.to_owned(),
                url: format!("{scheme}://{host}{path}"),
                host,
                path,
                signed: cfg.credentials.is_some(),
            });
        }
        let (scheme, host, path) = split_http(url)?;
        if path
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(bad(
                "the path has spaces or control characters (percent-encode them)",
            ));
        }
        let path = if path.is_empty() { "/" } else { path };
        Ok(Target {
            display: url.to_owned(),
            url: format!("{scheme}://{host}{path}"),
            host,
            path: path.to_owned(),
            signed: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(endpoint: Option<&str>, creds: bool) -> RemoteConfig {
        RemoteConfig {
            endpoint: endpoint.map(str::to_owned),
            credentials: creds.then(|| Credentials {
                access_key: "a".into(),
                secret_key: "b".into(),
                session_token: None,
            }),
            ..RemoteConfig::default()
        }
    }

    #[test]
    fn s3_urls_go_path_style_to_the_endpoint() {
        let t = Target::parse(
            "s3://bkt/dir/a b.img",
            &cfg(Some("http://127.0.0.1:7480/"), true),
        )
        .unwrap();
        assert_eq!(t.url, "http://127.0.0.1:7480/bkt/dir/a%20b.img");
        assert_eq!(t.host, "127.0.0.1:7480");
        assert_eq!(t.path, "/bkt/dir/a%20b.img");
        assert!(t.signed);
        let t = Target::parse("s3://bkt/k", &cfg(None, false)).unwrap();
        assert_eq!(t.url, "https://s3.us-east-1.amazonaws.com/bkt/k");
        assert!(!t.signed);
        let t = Target::parse("s3://bkt/k", &cfg(Some("https://h:443"), true)).unwrap();
        assert_eq!((t.host.as_str(), t.url.as_str()), ("h", "https://h/bkt/k"));
    }

    #[test]
    fn http_urls_are_fetched_as_written() {
        let t = Target::parse("HTTP://Example.com:80/p/q?x=1", &cfg(None, true)).unwrap();
        assert_eq!(t.url, "http://example.com/p/q?x=1");
        assert!(!t.signed);
        assert_eq!(
            Target::parse("https://h", &cfg(None, false)).unwrap().path,
            "/"
        );
    }

    #[test]
    fn bad_urls_are_refused() {
        for u in [
            "s3://bkt",
            "s3:///k",
            "s3://Bad_Bucket/k",
            "ftp://h/x",
            "http://",
            "http://u:p@h/x",
            "https://h/a b",
        ] {
            assert!(Target::parse(u, &cfg(None, false)).is_err(), "{u}");
        }
        assert!(is_remote("S3://b/k") && is_remote("https://x") && !is_remote("/tmp/s3:/x"));
    }

    #[test]
    fn a_url_with_a_mistyped_scheme_says_so() {
        for u in ["s3:/b/k", "ftp://h/x", "https:/h/x"] {
            let e = Target::parse(u, &cfg(None, false)).unwrap_err().to_string();
            assert!(
                e.ends_with("it does not start with s3://, http:// or https://"),
                "{u}: {e}"
            );
        }
    }
}
