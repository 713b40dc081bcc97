//! `snapblk serve --metrics` and `--control`, end to end: a real Prometheus server (the Debian
//! package) scrapes an NBD export while qemu-io and nbdcopy drive I/O, and its query API finds
//! the metrics; a FUSE export's counters follow cmp's reads; the control socket is owner-only,
//! pauses a merge at a durable step (base and COW unchanged on disk while paused, by
//! sha256sum), resumes it to a base equal to the target (cmp), survives a kill while paused, and
//! answers bad requests with one error line. Slow, idle and surplus clients of either server
//! hold only themselves, and only for a bounded time.

#[path = "serve_common.rs"]
mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One HTTP GET on loopback; returns the body of a 200 reply.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_owned()
}

/// A free loopback port (bound and released: Prometheus binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Prometheus server scraping one target every second; killed by pid on drop (a failing
/// test too).
struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn start(dir: &Path, target: &str) -> Prometheus {
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: snapblk\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus is required (scripts/install-deps.sh)");
        Prometheus { child, addr }
    }

    /// The value of an instant query returning one sample, once it exists and `ok(value)`
    /// holds (polled for up to 90 s).
    fn query_until(&mut self, q: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let end = Instant::now() + Duration::from_secs(90);
        let mut last = String::new();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("prometheus exited: {st}");
            }
            if let Some(v) = self.query(q, &mut last)
                && ok(v)
            {
                return v;
            }
            assert!(Instant::now() < end, "query {q}: last answer {last}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn query(&self, q: &str, last: &mut String) -> Option<f64> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let mut s = std::net::TcpStream::connect(&self.addr).ok()?;
        write!(
            s,
            "GET /api/v1/query?query={enc} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut r = String::new();
        s.read_to_string(&mut r).ok()?;
        let body = r.split_once("\r\n\r\n")?.1;
        *last = body.to_owned();
        let v: serde_json::Value = serde_json::from_str(body).ok()?;
        let res = v["data"]["result"].as_array()?;
        if res.len() != 1 {
            return None;
        }
        res[0]["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_an_nbd_export() {
    let case = golden::case("v3_multiblock_lz4_64k");
    let d = TempDir::new("ops-prom");
    let (base, cow) = case.copy_inputs(d.path());
    let target = case.read("target.img");
    let s = Serve::start(&[
        "--base",
        path_str(&base),
        "--cow",
        path_str(&cow),
        "--writable",
        "--nbd",
        "0",
        "--metrics",
        "0",
    ]);
    let metrics = s.ready_str("metrics");
    assert!(metrics.starts_with("127.0.0.1:"), "{metrics}");
    let mut prom = Prometheus::start(d.path(), &metrics);
    let u = s.ready_str("uri");
    // Reads by nbdcopy (the whole device), writes and a flush by qemu-io.
    let out = d.join("copy.img");
    nbd::copy(&u, path_str(&out));
    assert_file_eq(&out, &target, "nbdcopy through the export");
    nbd::qemu_io_ok(
        &u,
        &["write -P 0x5a 0 64k", "write -P 0x5b 128k 4k", "flush"],
    );
    let size = target.len() as f64;
    prom.query_until("up{job=\"snapblk\"}", |v| v == 1.0);
    let read = prom.query_until("snapblk_bytes_total{export=\"nbd\",dir=\"read\"}", |v| {
        v >= size
    });
    assert!(
        read < size * 4.0,
        "read bytes {read} for a {size}-byte device"
    );
    let written = prom.query_until("snapblk_bytes_total{export=\"nbd\",dir=\"write\"}", |v| {
        v >= 65536.0 + 4096.0
    });
    assert_eq!(written, 65536.0 + 4096.0);
    prom.query_until("snapblk_requests_total{dir=\"write\"}", |v| v == 2.0);
    prom.query_until("snapblk_requests_total{dir=\"flush\"}", |v| v >= 1.0);
    prom.query_until("snapblk_request_errors_total{dir=\"read\"}", |v| v == 0.0);
    // The histogram agrees with the counters, and Prometheus can take a quantile of it.
    let reads = prom.query_until("snapblk_requests_total{dir=\"read\"}", |v| v > 0.0);
    prom.query_until(
        "snapblk_request_duration_seconds_count{dir=\"read\"}",
        |v| v == reads,
    );
    let p99 = prom.query_until(
        "histogram_quantile(0.99, snapblk_request_duration_seconds_bucket{dir=\"read\"})",
        |v| v > 0.0,
    );
    assert!(p99 < 60.0, "p99 read latency {p99} s");
    // nbdcopy and two qemu-io connections, all closed again.
    prom.query_until("snapblk_connections_total", |v| v >= 2.0);
    prom.query_until("snapblk_connections_active", |v| v == 0.0);
    // The snapshot's own counters: an LZ4 COW goes through the decoded-unit cache.
    prom.query_until("snapblk_cache_misses_total", |v| v > 0.0);
    prom.query_until("snapblk_sched_requests_total{class=\"foreground\"}", |v| {
        v > 0.0
    });
    prom.query_until("snapblk_merge_state{state=\"off\"}", |v| v == 1.0);
    // The default scheduler's budget lies between its minimum and maximum (64 KiB, 2 MiB).
    prom.query_until("snapblk_sched_budget_bytes", |v| {
        (65536.0..=2097152.0).contains(&v)
    });
    drop(prom);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn metrics_refuse_other_addresses_unless_allowed() {
    let d = TempDir::new("ops-remote");
    let (img, _) = write_image(d.path(), "a.img", 1 << 20, 3);
    let o = Command::new(bin())
        .args([
            "serve",
            path_str(&img),
            "--nbd",
            "0",
            "--metrics",
            "0.0.0.0:0",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a loopback address"), "{err}");
    let s = Serve::start(&[
        path_str(&img),
        "--nbd",
        "0",
        "--metrics",
        "0.0.0.0:0",
        "--metrics-allow-remote",
    ]);
    assert!(s.ready_str("metrics").starts_with("0.0.0.0:"));
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn fuse_export_counts_what_cmp_reads() {
    let d = TempDir::new("ops-fuse");
    let (img, data) = write_image(d.path(), "a.img", 3 << 20, 9);
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let s = Serve::start(&[
        path_str(&img),
        "--read-only",
        "--fuse",
        path_str(&mnt),
        "--fuse-direct-io",
        "--metrics",
        "0",
    ]);
    let file = s.ready_str("path");
    tool_ok("cmp", &[&file, path_str(&img)]);
    let text = http_get(&s.ready_str("metrics"), "/metrics");
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let read = value("snapblk_bytes_total{export=\"fuse\",dir=\"read\"}");
    assert!(
        read >= data.len() as f64,
        "read {read} of {} bytes",
        data.len()
    );
    assert!(value("snapblk_connections_total{export=\"fuse\"}") >= 1.0);
    assert_eq!(
        value("snapblk_bytes_total{export=\"fuse\",dir=\"write\"}"),
        0.0
    );
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

/// A generated snapshot whose merge takes a while: base.img, snapshot.cow, and the new image.
fn big_snapshot(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use snapblk_snapshot::synth::{SynthSpec, generate};
    let spec = SynthSpec {
        blocks: 16384,
        scratch_size: 2 << 20,
        chain_len: 2048,
        chains: 4,
        random_ordered: 4096,
        replaces: 2048,
        zeros: 16,
        ..SynthSpec::default()
    };
    let case = generate(&spec, 7);
    let (base, cow) = case.write_files(dir, Default::default()).unwrap();
    let target = dir.join("target.img");
    std::fs::write(&target, &case.target).unwrap();
    (base, cow, target)
}

/// `snapblk ctl SOCK CMD --json`: the reply, and whether the command succeeded.
fn ctl(sock: &Path, cmd: &str) -> (bool, serde_json::Value, String) {
    let o = Command::new(bin())
        .args(["ctl", path_str(sock), cmd, "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o.status.success(), v, err)
}

fn ctl_ok(sock: &Path, cmd: &str) -> serde_json::Value {
    let (ok, v, err) = ctl(sock, cmd);
    assert!(ok, "ctl {cmd}: {err}");
    assert_eq!(v["ok"], true, "{v}");
    v
}

/// sha256sum of the files (an independent view of what is on disk).
fn sha256(files: &[&Path]) -> String {
    let args: Vec<&str> = files.iter().map(|f| path_str(f)).collect();
    tool_ok("sha256sum", &args)
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn control_socket_pauses_and_resumes_a_merge() {
    let d = TempDir::new("ops-ctl");
    let (base, cow, target) = big_snapshot(d.path());
    let sock = d.join("ctl.sock");
    let mut s = Serve::start(&[
        "--base",
        path_str(&base),
        "--cow",
        path_str(&cow),
        "--merge",
        "--merge-wait",
        "--control",
        path_str(&sock),
        "--nbd",
        "0",
        "--metrics",
        "0",
    ]);
    assert_eq!(s.ready_str("control"), path_str(&sock));
    assert_eq!(mode_of(&sock), 0o600, "the control socket is owner-only");
    // Waiting for its start: nothing written yet.
    let before = sha256(&[&base, &cow]);
    let st = ctl_ok(&sock, "status");
    assert_eq!(st["merge"]["state"], "paused", "{st}");
    assert_eq!(st["merge"]["started"], false, "{st}");
    assert_eq!(st["merge"]["merged"], 0);
    let (ok, _, err) = ctl(&sock, "merge-resume");
    assert!(!ok && err.contains("paused"), "resume before start: {err}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sha256(&[&base, &cow]), before, "written before merge-start");
    ctl_ok(&sock, "merge-start");
    let (p, _) = s
        .wait_event("merge-progress", Duration::from_secs(120))
        .unwrap();
    assert!(p["merged"].as_u64().unwrap() > 0);
    let paused = ctl_ok(&sock, "merge-pause");
    let m = &paused["merge"];
    assert_eq!(m["state"], "paused", "{paused}");
    let at = m["merged"].as_u64().unwrap();
    assert!(
        at < m["total"].as_u64().unwrap(),
        "merge ended before the pause"
    );
    // Paused: the files do not change, and the clients still read the new image.
    let on_disk = sha256(&[&base, &cow]);
    let out = d.join("paused.img");
    nbd::copy(&s.ready_str("uri"), path_str(&out));
    tool_ok("cmp", &[path_str(&out), path_str(&target)]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        sha256(&[&base, &cow]),
        on_disk,
        "the merge moved while paused"
    );
    assert_eq!(ctl_ok(&sock, "stats")["merge"]["merged"], at);
    // The metrics say the same.
    let text = http_get(&s.ready_str("metrics"), "/metrics");
    for want in [
        format!("snapblk_merge_ops_merged {at}\n"),
        format!("snapblk_merge_ops_total {}\n", m["total"]),
        "snapblk_merge_state{state=\"paused\"} 1\n".to_owned(),
        "snapblk_merge_state{state=\"running\"} 0\n".to_owned(),
    ] {
        assert!(text.contains(&want), "no {want:?} in\n{text}");
    }
    let rate = text
        .lines()
        .find_map(|l| l.strip_prefix("snapblk_merge_ops_per_second "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no merge rate in\n{text}"));
    assert!(rate > 0.0, "merge rate {rate}");
    ctl_ok(&sock, "merge-resume");
    let (done, _) = s.wait_event("merge", Duration::from_secs(300)).unwrap();
    assert_eq!(done["merge"]["state"], "done", "{done}");
    assert_eq!(done["merge"]["merged"], done["merge"]["total"]);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert!(!sock.exists(), "the socket is removed at exit");
    tool_ok("cmp", &[path_str(&base), path_str(&target)]);
}

#[test]
fn a_merge_killed_while_paused_resumes_after_a_restart() {
    let d = TempDir::new("ops-ctl-kill");
    let (base, cow, target) = big_snapshot(d.path());
    let sock = d.join("ctl.sock");
    let args = [
        "--base",
        path_str(&base),
        "--cow",
        path_str(&cow),
        "--merge",
        "--control",
        path_str(&sock),
        "--nbd",
        "0",
    ];
    let mut s = Serve::start(&args);
    s.wait_event("merge-progress", Duration::from_secs(120))
        .unwrap();
    let m = ctl_ok(&sock, "merge-pause")["merge"].clone();
    assert_eq!(m["state"], "paused", "{m}");
    let at = m["merged"].as_u64().unwrap();
    s.signal("KILL");
    let _ = s.wait();
    // The stale socket is replaced by the next server.
    let s = Serve::start(&args);
    let (st, rest, err) = {
        let mut s = s;
        let (done, _) = s.wait_event("merge", Duration::from_secs(300)).unwrap();
        assert_eq!(done["merge"]["state"], "done", "{done}");
        assert_eq!(
            done["merge"]["resumed_at"], at,
            "resumed where it was paused"
        );
        s.stop()
    };
    assert!(st.success(), "{err} {rest:?}");
    tool_ok("cmp", &[path_str(&base), path_str(&target)]);
}

/// A control client that sends requests and never reads the replies (nor closes) does not
/// keep the server from stopping: its replies stop being written, and SIGTERM ends the server.
#[test]
fn a_client_that_never_reads_does_not_hold_the_server() {
    let d = TempDir::new("ops-ctl-noread");
    let (img, _) = write_image(d.path(), "a.img", 1 << 20, 5);
    let sock = d.join("c.sock");
    let s = Serve::start(&[path_str(&img), "--nbd", "0", "--control", path_str(&sock)]);
    let mut c = UnixStream::connect(&sock).unwrap();
    c.set_nonblocking(true).unwrap();
    let reqs = b"{\"v\":1,\"cmd\":\"status\"}\n".repeat(1000);
    // Until the server no longer reads: its replies fill the socket and ours fill behind them.
    let mut stalled = 0;
    while stalled < 40 {
        match c.write(&reqs) {
            Ok(_) => stalled = 0,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                stalled += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
    // `stop` fails the test when the server has not exited within 60 s.
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    drop(c);
}

/// `snapblk ctl` pointed at a socket that answers with an endless line (not a snapblk control
/// socket) stops reading at a bound and says so, rather than buffering all of it.
#[test]
fn ctl_bounds_the_reply_it_reads() {
    let d = TempDir::new("ops-ctl-endless");
    let sock = d.join("junk.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let junk = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let chunk = vec![b'x'; 1 << 20];
        // 64 MiB at most, so that a client without a bound ends too (with another error).
        for _ in 0..64 {
            if c.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let o = Command::new(bin())
        .args(["ctl", path_str(&sock), "status"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("reply longer than"), "{err}");
    junk.join().unwrap();
}

#[test]
fn bad_control_requests_get_one_error_line() {
    let d = TempDir::new("ops-ctl-bad");
    let (img, _) = write_image(d.path(), "a.img", 1 << 20, 5);
    let sock = d.join("c.sock");
    let s = Serve::start(&[path_str(&img), "--nbd", "0", "--control", path_str(&sock)]);
    let c = UnixStream::connect(&sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    let mut ask = |req: &[u8]| -> serde_json::Value {
        w.write_all(req).unwrap();
        w.write_all(b"\n").unwrap();
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"))
    };
    for bad in [
        &b"not json"[..],
        b"{\"v\":1,\"cmd\":\"format-disk\"}",
        b"{\"v\":9,\"cmd\":\"status\"}",
        b"\xff\xfe",
        b"{\"v\":1,\"cmd\":\"merge-start\"}",
    ] {
        let v = ask(bad);
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["v"], 1);
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
    // The same connection still works, and so does the server.
    let v = ask(b"{\"v\":1,\"cmd\":\"status\"}");
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["export"], "nbd");
    // A line over the limit ends that connection with an error line, not the server.
    let c2 = UnixStream::connect(&sock).unwrap();
    let mut w2 = c2.try_clone().unwrap();
    let big = vec![b'x'; 100 << 10];
    let _ = w2.write_all(&big);
    let mut l = String::new();
    BufReader::new(c2).read_line(&mut l).unwrap();
    assert!(l.contains("longer than"), "{l}");
    let st = ctl_ok(&sock, "status");
    assert!(st["merge"].is_null(), "{st}");
    // Without --json, ctl prints a summary; a refusal is exit status 1 with the reason.
    let o = Command::new(bin())
        .args(["ctl", path_str(&sock), "stats"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.starts_with("read: ") && text.contains("merge: none"),
        "{text}"
    );
    let o = Command::new(bin())
        .args(["ctl", path_str(&sock), "merge-pause"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("merge-pause: no merge"), "{err}");
    // A second server cannot take a live socket.
    let (other, _) = write_image(d.path(), "b.img", 1 << 20, 6);
    let o = Command::new(bin())
        .args([
            "serve",
            path_str(&other),
            "--read-only",
            "--nbd",
            "0",
            "--control",
            path_str(&sock),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("a server listens on it"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

/// A metrics client that trickles its request a byte at a time holds only its own connection:
/// other scrapes are answered meanwhile, and the trickler is cut off at the scrape deadline
/// (10 s) rather than served for as long as it keeps sending.
#[test]
fn a_slow_metrics_client_does_not_hold_the_others() {
    let d = TempDir::new("ops-metrics-slow");
    let (img, _) = write_image(d.path(), "a.img", 1 << 20, 5);
    let s = Serve::start(&[path_str(&img), "--nbd", "0", "--metrics", "0"]);
    let addr = s.ready_str("metrics");
    let slow = std::net::TcpStream::connect(&addr).unwrap();
    let mut w = slow.try_clone().unwrap();
    w.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    // One header byte every 300 ms for up to 120 s, until the server closes the connection.
    let trickle = std::thread::spawn(move || {
        for _ in 0..400 {
            if w.write_all(b"X").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    for _ in 0..3 {
        assert!(http_get(&addr, "/metrics").contains("snapblk_up_seconds"));
    }
    // Cut off: end of stream (or a reset), not a read that waits until our own timeout.
    slow.set_read_timeout(Some(Duration::from_secs(90)))
        .unwrap();
    let mut buf = Vec::new();
    match (&slow).read_to_end(&mut buf) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    drop(slow);
    trickle.join().unwrap();
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

/// The metrics server serves a bounded number of scrapes at once (8): with 8 idle connections
/// open, the next client gets `503 Service Unavailable` at once; once they close, scrapes are
/// served again.
#[test]
fn metrics_connections_are_bounded() {
    let d = TempDir::new("ops-metrics-bound");
    let (img, _) = write_image(d.path(), "a.img", 1 << 20, 5);
    let s = Serve::start(&[path_str(&img), "--nbd", "0", "--metrics", "0"]);
    let addr = s.ready_str("metrics");
    let idle: Vec<_> = (0..8)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = String::new();
    c.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 503 "), "{r:?}");
    drop(idle);
    // Their handlers end as the idle clients' connections close.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut r = String::new();
        let _ = c.read_to_string(&mut r);
        if r.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < end, "still refused: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

/// The control socket serves at most 16 clients at once: the 17th gets one error line saying
/// so and is closed, while the 16 still work; a client that sends nothing for 30 s gets an
/// error line and is closed.
#[test]
fn control_clients_are_bounded_and_idle_ones_closed() {
    let d = TempDir::new("ops-ctl-bound");
    let (img, _) = write_image(d.path(), "a.img", 1 << 20, 5);
    let sock = d.join("c.sock");
    let s = Serve::start(&[path_str(&img), "--nbd", "0", "--control", path_str(&sock)]);
    let held: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    let extra = UnixStream::connect(&sock).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut l = String::new();
    BufReader::new(&extra).read_line(&mut l).unwrap();
    let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
    assert_eq!(v["ok"], false, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("too many control clients"),
        "{v}"
    );
    let mut rest = String::new();
    assert_eq!(BufReader::new(&extra).read_line(&mut rest).unwrap(), 0);
    // A held client is served.
    let c = &held[0];
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    (&*c).write_all(b"{\"v\":1,\"cmd\":\"status\"}\n").unwrap();
    let mut r = BufReader::new(c);
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    assert!(l.contains("\"ok\":true"), "{l}");
    // The others have been idle since they connected: closed with an error line.
    let c = &held[1];
    c.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let mut l = String::new();
    BufReader::new(c).read_line(&mut l).unwrap();
    assert!(l.contains("no request for 30 s"), "{l:?}");
    drop(held);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}
