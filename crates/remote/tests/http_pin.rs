//! Pinning an `http://` object whose server gives no ETag, against real local servers:
//! `python3 -m http.server` (Last-Modified, no ETag, ignores `Range` and `If-Unmodified-Since`)
//! and a tiny Python server (`PIN_SERVER` below) that either gives neither header or answers
//! ranged GETs with another version of the object after the first. A changed object fails with
//! `RemoteError::Changed` instead of mixing versions; an object that cannot be pinned is
//! refused unless `allow_unpinned`.

use snapblk_remote::{RemoteConfig, RemoteError, RemoteObject};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

/// Size of every test object (16 blocks of 4 KiB).
const LEN: usize = 65536;

/// A server child, killed by pid on drop (a failing test too).
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawn `python3 ARGS`; its first stdout line holding a number after "port " (http.server) or
/// alone (PIN_SERVER) is the port.
fn spawn(args: &[&str]) -> Server {
    let mut child = Command::new("python3")
        .arg("-u")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 is required (scripts/install-deps.sh)");
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).unwrap();
    let port = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u16>().ok())
        .next()
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    Server { child, port }
}

/// Answers HEAD and GET (with `Range: bytes=A-B`) of any path. argv[1]: `none` gives neither
/// ETag nor Last-Modified; `changing` gives version A (Last-Modified 2020) to the HEAD and the
/// first GET, then version B (same size, Last-Modified 2021). Conditions are ignored.
const PIN_SERVER: &str = r#"
import sys, http.server
mode = sys.argv[1]
A = bytes((i * 7 + 1) % 251 for i in range(65536))
B = bytes((i * 13 + 5) % 251 for i in range(65536))
gets = [0]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def answer(self, body):
        new = mode == "changing" and gets[0] > 1
        data = B if new else A
        start, end, status = 0, len(data) - 1, 200
        r = self.headers.get("Range")
        if body and r and r.startswith("bytes="):
            a, b = r[6:].split("-")
            start, end, status = int(a), min(int(b), len(data) - 1), 206
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, len(data)))
        self.send_header("Content-Length", str(end - start + 1))
        if mode == "changing":
            y = "2021" if new else "2020"
            self.send_header("Last-Modified", "Fri, 01 Jan %s 00:00:00 GMT" % y)
        self.end_headers()
        if body:
            self.wfile.write(data[start:end + 1])
    def do_HEAD(self):
        self.answer(False)
    def do_GET(self):
        gets[0] += 1
        self.answer(True)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1])
s.serve_forever()
"#;

/// The tiny server in `mode`, its script written to `dir`.
fn pin_server(dir: &Path, mode: &str) -> Server {
    let script = dir.join("pin_server.py");
    std::fs::write(&script, PIN_SERVER).unwrap();
    spawn(&[script.to_str().unwrap(), mode])
}

fn bytes(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
        .collect()
}

/// No cache, 4 KiB blocks: every read is a GET.
fn cfg() -> RemoteConfig {
    RemoteConfig {
        cache_bytes: 0,
        block_size: 4096,
        readahead_blocks: 0,
        retries: 0,
        ..RemoteConfig::default()
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("snapblk-http-pin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_file_replaced_under_python_http_server_fails_the_next_read() {
    let d = temp_dir("lm");
    let www = d.join("www");
    std::fs::create_dir(&www).unwrap();
    let file = www.join("obj.img");
    let (a, b) = (bytes(3), bytes(5));
    std::fs::write(&file, &a).unwrap();
    let srv = spawn(&[
        "-m",
        "http.server",
        "0",
        "--bind",
        "127.0.0.1",
        "--directory",
        www.to_str().unwrap(),
    ]);
    let url = format!("http://127.0.0.1:{}/obj.img", srv.port);
    let o = RemoteObject::open(&url, &cfg()).unwrap();
    assert_eq!(o.etag(), None, "http.server sends no ETag");
    let mut buf = vec![0u8; 8192];
    o.read_exact_remote(4096, &mut buf).unwrap();
    assert!(buf == a[4096..12288], "first read");
    // Replaced in place, same size, with a Last-Modified date a minute later.
    std::fs::write(&file, &b).unwrap();
    let later = SystemTime::now() + Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let e = o.read_exact_remote(32768, &mut buf).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
    assert!(e.to_string().contains("changed since it was opened"), "{e}");
    // Grown: its size differs too.
    std::fs::write(&file, [&b[..], &b[..]].concat()).unwrap();
    let e = o.read_exact_remote(0, &mut buf).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
    drop(srv);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_object_changed_between_ranged_gets_fails_instead_of_mixing() {
    let d = temp_dir("changing");
    let srv = pin_server(&d, "changing");
    let url = format!("http://127.0.0.1:{}/obj", srv.port);
    let o = RemoteObject::open(&url, &cfg()).unwrap();
    let mut buf = vec![0u8; 4096];
    o.read_exact_remote(0, &mut buf).unwrap();
    let e = o.read_exact_remote(4096, &mut buf).unwrap_err();
    assert!(matches!(e, RemoteError::Changed { .. }), "{e}");
    assert!(e.to_string().contains("2020"), "{e}");
    drop(srv);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_object_without_etag_or_date_is_refused_unless_allowed() {
    let d = temp_dir("none");
    let srv = pin_server(&d, "none");
    let url = format!("http://127.0.0.1:{}/obj", srv.port);
    let e = RemoteObject::open(&url, &cfg()).unwrap_err();
    assert!(matches!(e, RemoteError::Unpinned { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("neither an ETag nor a Last-Modified")
            && text.contains("SNAPBLK_REMOTE_ALLOW_UNPINNED=1")
            && !text.contains('\n'),
        "{text}"
    );
    let o = RemoteObject::open(
        &url,
        &RemoteConfig {
            allow_unpinned: true,
            ..cfg()
        },
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    o.read_exact_remote(8192, &mut buf).unwrap();
    let want: Vec<u8> = (8192..12288).map(|i| ((i * 7 + 1) % 251) as u8).collect();
    assert!(buf == want);
    drop(srv);
    std::fs::remove_dir_all(&d).unwrap();
}
