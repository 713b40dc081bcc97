//! One HTTP exchange with retries: signing, status → error, and the parsers of what comes back
//! (`Content-Range`, S3 error bodies), which take untrusted text and never panic.

use crate::config::{RemoteConfig, Target};
use crate::error::{RemoteError, Result};
use crate::sigv4::{self, EMPTY_SHA256, Scope, SignRequest};
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest error body read for its S3 error code.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// A request body.
pub(crate) enum Body<'a> {
    /// No body.
    Empty,
    /// No body, and no further attempt once `halted` turns true (the request then fails with
    /// [`RemoteError::Stopped`]); one in flight is not cut, since a request whose answer is lost
    /// (a `CreateMultipartUpload`) could leave something behind that nobody can name.
    EmptyUntil {
        halted: &'a (dyn Fn() -> bool + Sync),
    },
    /// `len` bytes of a local file from `offset`: reopened for every attempt; `sha256` is
    /// their payload hash. When `halted` turns true the body stops mid-stream (the server sees
    /// a cut connection and stores nothing) and the request fails with
    /// [`RemoteError::Stopped`] instead of being retried.
    File {
        path: &'a std::path::Path,
        offset: u64,
        len: u64,
        sha256: &'a str,
        halted: Option<&'a (dyn Fn() -> bool + Sync)>,
    },
    /// Bytes in memory and their payload hash.
    Bytes { data: &'a [u8], sha256: &'a str },
}

impl Body<'_> {
    fn halted(&self) -> bool {
        match self {
            Body::File {
                halted: Some(h), ..
            }
            | Body::EmptyUntil { halted: h } => h(),
            _ => false,
        }
    }
}

/// A request body that ends in an error as soon as its `halted` turns true while it still has
/// bytes to send. Once every byte was read (and so sent: ureq writes as it reads), the server
/// has the whole request, so the end of the body is no longer cut: the request goes on and
/// its answer says what happened.
struct Haltable<'a, R> {
    inner: std::io::Take<R>,
    halted: Option<&'a (dyn Fn() -> bool + Sync)>,
}

impl<R: Read> Read for Haltable<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.inner.limit() > 0 && self.halted.is_some_and(|h| h()) {
            return Err(std::io::Error::other("upload stopped"));
        }
        self.inner.read(buf)
    }
}

/// The slowest body a bounded request ([`Client::get_range`]) allows for, in bytes per second,
/// on top of the `timeout`: 256 KiB/s, so a 1 MiB block may take 4 s more and the largest
/// (64 MiB) 256 s more.
const MIN_BODY_RATE: u64 = 256 * 1024;

/// The HTTP side of a [`RemoteConfig`].
pub(crate) struct Client {
    agent: ureq::Agent,
    /// For requests with a body (uploads): a new connection each, never a pooled one. ureq
    /// 2.12 clears a pooled connection's read and write timeouts and sets them again only on
    /// a new connection, so a body sent on a reused connection to a peer that stops reading
    /// would block its write for good (and no halt could stop it).
    upload: ureq::Agent,
    cfg: RemoteConfig,
}

/// What one attempt came to.
enum Attempt {
    Ok(ureq::Response),
    /// Worth another try (transport error, 5xx, 429).
    Retry(RemoteError),
    Fail(RemoteError),
}

impl Client {
    pub(crate) fn new(cfg: &RemoteConfig) -> Client {
        // A signed request must not be replayed elsewhere, and an object read by offset must
        // not silently become another one: no redirects on either agent.
        let builder = || {
            ureq::AgentBuilder::new()
                .timeout_connect(cfg.timeout)
                .timeout_read(cfg.timeout)
                .timeout_write(cfg.timeout)
                .redirects(0)
        };
        // Keep a connection for each read worker (ureq keeps one per host by default, so the
        // others would reconnect for every request).
        let agent = builder()
            .max_idle_connections_per_host(cfg.put_jobs.max(crate::config::READ_WORKERS))
            .build();
        let upload = builder().max_idle_connections(0).build();
        Client {
            agent,
            upload,
            cfg: cfg.clone(),
        }
    }

    pub(crate) fn config(&self) -> &RemoteConfig {
        &self.cfg
    }

    /// Send `method` to `t` with `headers`, retrying transport errors and 5xx/429 up to
    /// `retries` times with doubling backoff; any other HTTP error fails at once with its
    /// one-line error ([`status_error`]). `pin` is the ETag the object was opened at, for the
    /// message of a 412.
    pub(crate) fn send(
        &self,
        t: &Target,
        method: &str,
        headers: &[(&str, &str)],
        body: &Body<'_>,
        pin: Option<&str>,
    ) -> Result<ureq::Response> {
        self.send_inner(t, method, &[], headers, body, pin, None)
    }

    /// [`Client::send`] of a ranged GET of `len` bytes, each attempt bounded as a whole: by
    /// the `timeout` plus the time the body takes at [`MIN_BODY_RATE`]. ureq bounds the wait
    /// for a reply's head only on a new connection (it clears a pooled connection's read
    /// timeout), so without this bound a server that takes a read on a kept-alive connection
    /// and never answers would hold the read for as long as it keeps the connection open.
    pub(crate) fn get_range(
        &self,
        t: &Target,
        headers: &[(&str, &str)],
        body: &Body<'_>,
        pin: Option<&str>,
        len: u64,
    ) -> Result<ureq::Response> {
        let body_time = Duration::from_secs(len.div_ceil(MIN_BODY_RATE));
        let limit = self.cfg.timeout.saturating_add(body_time);
        self.send_inner(t, "GET", &[], headers, body, pin, Some(limit))
    }

    /// [`Client::send`] with query parameters (not encoded; `("uploads", "")` for a bare
    /// `?uploads`).
    pub(crate) fn send_query(
        &self,
        t: &Target,
        method: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &Body<'_>,
        pin: Option<&str>,
    ) -> Result<ureq::Response> {
        self.send_inner(t, method, query, headers, body, pin, None)
    }

    /// [`Client::send_query`], each attempt bounded as a whole by `limit` if given.
    #[allow(clippy::too_many_arguments)] // one HTTP request's parts
    fn send_inner(
        &self,
        t: &Target,
        method: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &Body<'_>,
        pin: Option<&str>,
        limit: Option<Duration>,
    ) -> Result<ureq::Response> {
        let with_query;
        let t = if query.is_empty() {
            t
        } else {
            let q: Vec<String> = query
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        sigv4::uri_encode(k, false),
                        sigv4::uri_encode(v, false)
                    )
                })
                .collect();
            with_query = Target {
                url: format!("{}?{}", t.url, q.join("&")),
                ..t.clone()
            };
            &with_query
        };
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 0u32;
        let stopped = || RemoteError::Stopped {
            url: t.display.clone(),
        };
        loop {
            if body.halted() {
                return Err(stopped());
            }
            attempt += 1;
            let e = match self.once(t, method, query, headers, body, pin, limit, attempt) {
                Attempt::Ok(r) => return Ok(r),
                // The error of a body cut short by a halt is the halt's.
                Attempt::Fail(_) | Attempt::Retry(_) if body.halted() => return Err(stopped()),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(e) => e,
            };
            if attempt > self.cfg.retries {
                return Err(e);
            }
            // In short naps, so that a halt is not kept waiting by a long backoff.
            let until = std::time::Instant::now() + backoff;
            while !body.halted() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50).min(backoff));
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    #[allow(clippy::too_many_arguments)] // one HTTP request's parts
    fn once(
        &self,
        t: &Target,
        method: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &Body<'_>,
        pin: Option<&str>,
        limit: Option<Duration>,
        attempt: u32,
    ) -> Attempt {
        let agent = match body {
            Body::Empty | Body::EmptyUntil { .. } => &self.agent,
            Body::File { .. } | Body::Bytes { .. } => &self.upload,
        };
        let mut req = agent.request(method, &t.url);
        if let Some(limit) = limit {
            req = req.timeout(limit);
        }
        for (k, v) in headers {
            req = req.set(k, v);
        }
        if t.signed
            && let Some(creds) = &self.cfg.credentials
        {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let date = sigv4::amz_datetime(now);
            let payload = match body {
                Body::Empty | Body::EmptyUntil { .. } => EMPTY_SHA256,
                Body::File { sha256, .. } | Body::Bytes { sha256, .. } => sha256,
            };
            let mut signed: Vec<(&str, &str)> = vec![
                ("host", &t.host),
                ("x-amz-content-sha256", payload),
                ("x-amz-date", &date),
            ];
            if let Some(tok) = &creds.session_token {
                signed.push(("x-amz-security-token", tok));
            }
            signed.extend(headers.iter().copied());
            let auth = sigv4::authorization(
                creds,
                Scope {
                    datetime: &date,
                    region: &self.cfg.region,
                    service: "s3",
                },
                &SignRequest {
                    method,
                    path: &t.path,
                    query,
                    headers: &signed,
                    payload_hash: payload,
                },
            );
            req = req
                .set("x-amz-content-sha256", payload)
                .set("x-amz-date", &date)
                .set("authorization", &auth);
            if let Some(tok) = &creds.session_token {
                req = req.set("x-amz-security-token", tok);
            }
        }
        let r = match body {
            Body::Empty | Body::EmptyUntil { .. } => req.call(),
            Body::File {
                path,
                offset,
                len,
                halted,
                ..
            } => {
                let opened = std::fs::File::open(path).and_then(|mut f| {
                    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(*offset))?;
                    Ok(f)
                });
                match opened {
                    Ok(f) => req.set("content-length", &len.to_string()).send(Haltable {
                        inner: f.take(*len),
                        halted: *halted,
                    }),
                    Err(source) => {
                        return Attempt::Fail(RemoteError::Local {
                            path: path.to_path_buf(),
                            source,
                        });
                    }
                }
            }
            Body::Bytes { data, .. } => req.send_bytes(data),
        };
        match r {
            Ok(resp) => Attempt::Ok(resp),
            Err(ureq::Error::Status(status, resp)) => {
                let mut text = String::new();
                // The error body is only read for its code: a failure to read it changes nothing.
                let _ = resp
                    .into_reader()
                    .take(MAX_ERROR_BODY)
                    .read_to_string(&mut text);
                let e = status_error(&t.display, status, &text, pin);
                if status >= 500 || status == 429 {
                    Attempt::Retry(e)
                } else {
                    Attempt::Fail(e)
                }
            }
            Err(ureq::Error::Transport(tr)) => {
                let text = tr.to_string();
                // A URL the client cannot use, or a server certificate it refuses, will not
                // change on a second try.
                let permanent = matches!(
                    tr.kind(),
                    ureq::ErrorKind::InvalidUrl | ureq::ErrorKind::UnknownScheme
                ) || text.contains("invalid peer certificate");
                let e = RemoteError::Unreachable {
                    url: t.display.clone(),
                    attempts: attempt,
                    timeout_secs: self.cfg.timeout.as_secs(),
                    source: crate::error::TransportError(text),
                };
                if permanent {
                    Attempt::Fail(e)
                } else {
                    Attempt::Retry(e)
                }
            }
        }
    }
}

/// The error for an HTTP error `status` with body `body` (an S3 XML error or anything else).
pub fn status_error(url: &str, status: u16, body: &str, pin: Option<&str>) -> RemoteError {
    let code = s3_error_code(body)
        .map(|c| format!(", {c}"))
        .unwrap_or_default();
    let url = url.to_owned();
    match status {
        401 | 403 => RemoteError::Denied { url, status, code },
        404 => RemoteError::NotFound { url, code },
        412 => RemoteError::Changed {
            url,
            etag: pin.unwrap_or("unknown").to_owned(),
        },
        _ => RemoteError::Status { url, status, code },
    }
}

/// The `<Code>` of an S3 XML error body, if it has a plausible one (letters and digits, at
/// most 64).
pub fn s3_error_code(body: &str) -> Option<&str> {
    let start = body.find("<Code>")? + "<Code>".len();
    let rest = body.get(start..)?;
    let code = rest.get(..rest.find("</Code>")?)?;
    (!code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then_some(code)
}

/// A `Content-Range: bytes FIRST-LAST/TOTAL` value (`TOTAL` may be `*`): `(first, last,
/// total)`, with `first <= last` and `last < total`; `None` for anything else.
pub fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let v = v.trim();
    let rest = v.strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.trim().split_once('-')?;
    let num = |s: &str| -> Option<u64> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (first, last) = (num(a)?, num(b)?);
    let total = match total.trim() {
        "*" => None,
        t => Some(num(t)?),
    };
    if first > last || total.is_some_and(|t| last >= t) {
        return None;
    }
    Some((first, last, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn content_range_values() {
        assert_eq!(
            parse_content_range("bytes 0-9/100"),
            Some((0, 9, Some(100)))
        );
        assert_eq!(parse_content_range(" bytes 5-5/*"), Some((5, 5, None)));
        for bad in [
            "",
            "bytes",
            "bytes 9-0/100",
            "bytes 0-100/100",
            "bytes -1-2/3",
            "bytes 1-2",
            "items 0-1/2",
            "bytes +1-2/3",
            "bytes 0-99999999999999999999999/1",
            "bytes */100",
        ] {
            assert_eq!(parse_content_range(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn s3_error_bodies() {
        let b =
            "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message/></Error>";
        assert_eq!(s3_error_code(b), Some("SignatureDoesNotMatch"));
        assert_eq!(s3_error_code("<Code></Code>"), None);
        assert_eq!(s3_error_code("<Code>a b</Code>"), None);
        assert_eq!(s3_error_code("<Code>x"), None);
        let e = status_error("s3://b/k", 403, b, None).to_string();
        assert!(
            e.contains("access denied (HTTP 403, SignatureDoesNotMatch)"),
            "{e}"
        );
        let e = status_error("s3://b/k", 412, "", Some("\"abc\"")).to_string();
        assert!(e.contains("changed since it was opened"), "{e}");
        assert!(matches!(
            status_error("u", 404, "junk", None),
            RemoteError::NotFound { .. }
        ));
    }

    /// A halt cuts a body that still has bytes to send, but not one whose every byte was
    /// read: ureq copies the body to the socket as it reads it, so after the last byte the
    /// server holds the whole request and stores the object, and failing the end-of-body read
    /// would report a PUT as stopped whose object was written.
    #[test]
    fn a_halt_after_the_last_byte_does_not_cut_the_body() {
        let halt = AtomicBool::new(false);
        let halted = || halt.load(Ordering::Relaxed);
        let data = [7u8; 10];
        let mut b = Haltable {
            inner: (&data[..]).take(10),
            halted: Some(&halted),
        };
        let mut buf = [0u8; 4];
        assert_eq!(b.read(&mut buf).unwrap(), 4);
        let mut rest = [0u8; 6];
        assert_eq!(b.read(&mut rest).unwrap(), 6);
        halt.store(true, Ordering::Relaxed);
        assert_eq!(b.read(&mut buf).unwrap(), 0, "the end of a whole body");
        let mut b = Haltable {
            inner: (&data[..]).take(10),
            halted: Some(&halted),
        };
        assert!(
            b.read(&mut buf).is_err(),
            "a halt with bytes left cuts the body"
        );
    }

    /// A halted request is not sent (a dead endpoint would otherwise give `Unreachable`
    /// after its retries), and a live one is unaffected by a halt that never comes.
    #[test]
    fn a_halted_request_gives_up_before_sending() {
        let cfg = RemoteConfig {
            endpoint: Some("http://127.0.0.1:1".into()),
            retries: 0,
            ..RemoteConfig::default()
        };
        let t = Target::parse("s3://b/k", &cfg).unwrap();
        let c = Client::new(&cfg);
        let yes = || true;
        let r = c.send_query(
            &t,
            "POST",
            &[],
            &[],
            &Body::EmptyUntil { halted: &yes },
            None,
        );
        assert!(matches!(r, Err(RemoteError::Stopped { .. })), "{r:?}");
        let no = || false;
        let r = c.send_query(
            &t,
            "POST",
            &[],
            &[],
            &Body::EmptyUntil { halted: &no },
            None,
        );
        assert!(matches!(r, Err(RemoteError::Unreachable { .. })), "{r:?}");
    }

    proptest! {
        // Whatever a server sends, the parsers return (no panic), and what they accept is
        // consistent.
        #[test]
        fn content_range_never_panics(s in "\\PC{0,40}", a in any::<u64>(), b in any::<u64>(), t in any::<u64>()) {
            let _ = parse_content_range(&s);
            let v = format!("bytes {a}-{b}/{t}");
            match parse_content_range(&v) {
                Some((x, y, Some(z))) => prop_assert!(x == a && y == b && z == t && a <= b && b < t),
                Some(_) => prop_assert!(false),
                None => prop_assert!(a > b || b >= t),
            }
        }

        #[test]
        fn error_code_never_panics(s in "\\PC{0,80}", code in "[A-Za-z0-9]{1,64}") {
            let _ = s3_error_code(&s);
            let body = format!("<Error><Code>{code}</Code>{s}</Error>");
            prop_assert_eq!(s3_error_code(&body), Some(code.as_str()));
        }
    }

    /// A body is never sent on a pooled connection, where ureq leaves the socket without a
    /// write timeout: a server that answers a HEAD (its connection goes back to the pool) and
    /// then stops reading a PUT's body makes the PUT fail after its `timeout`, not hang.
    #[test]
    fn an_upload_to_a_server_that_stops_reading_times_out() {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (keep, held) = std::sync::mpsc::channel::<std::net::TcpStream>();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let keep = keep.clone();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(c.try_clone().unwrap());
                    let mut w = c;
                    loop {
                        let mut head = Vec::new();
                        loop {
                            let mut line = String::new();
                            if r.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                            head.push(line);
                        }
                        if head[0].starts_with("PUT") {
                            // Never read the body; keep the connection open until the test ends.
                            let _ = keep.send(w);
                            return;
                        }
                        let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
                    }
                });
            }
        });
        let cfg = RemoteConfig {
            timeout: Duration::from_secs(1),
            retries: 0,
            ..RemoteConfig::default()
        };
        let t = Target::parse(&format!("http://127.0.0.1:{port}/k"), &cfg).unwrap();
        let c = Client::new(&cfg);
        c.send(&t, "HEAD", &[], &Body::Empty, None).unwrap();
        let data = vec![0u8; 64 << 20];
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = c.send(
                &t,
                "PUT",
                &[],
                &Body::Bytes {
                    data: &data,
                    sha256: EMPTY_SHA256,
                },
                None,
            );
            let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
        });
        // A minute is only this test's guard against a hang.
        let r = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the PUT to a server that stops reading never returned");
        let e = r.unwrap_err();
        assert!(e.contains("cannot reach the endpoint"), "{e}");
        drop(held);
    }
}
