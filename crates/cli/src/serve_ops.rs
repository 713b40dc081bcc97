//! `snapblk serve --metrics ADDR` and `--control PATH`: what an operator watches and steers.
//!
//! Both read one [`Observed`]: the export's [`IoStats`] (kept by the NBD connections, the FUSE
//! handlers or the ublk queues) and, for a snapshot device, its [`Activity`] (merge, scheduler,
//! decoded-unit cache). `--metrics` serves them as Prometheus text on `GET /metrics`
//! (loopback only unless `--metrics-allow-remote`); `--control` is a Unix socket (mode 0600)
//! speaking one JSON object per line, see [`control_reply`]. The protocol and the metrics are
//! documented in docs/serve.md.

use anyhow::{Context, bail};
use clap::Args;
use snapblk_core::{IoDir, IoStats, LATENCY_BOUNDS_NS};
use snapblk_snapshot::{Activity, MergeState, MergeStats};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Version of the control protocol (the `v` of requests and replies).
pub const CONTROL_VERSION: u64 = 1;
/// Longest request line the control socket reads.
const MAX_LINE: usize = 64 << 10;
/// Scrapes served at once; a client beyond them gets HTTP 503 at once.
const METRICS_MAX_CONNS: usize = 8;
/// Time a scrape has, from its connection to the last byte of the reply.
const METRICS_DEADLINE: Duration = Duration::from_secs(10);
/// Control clients connected at once; one beyond them gets an error line and is closed.
const CONTROL_MAX_CLIENTS: usize = 16;
/// A control client that sends nothing for this long is closed (with an error line).
const CONTROL_IDLE: Duration = Duration::from_secs(30);

/// Options for watching and steering a server.
#[derive(Args, Debug, Default)]
pub struct OpsArgs {
    /// Serve Prometheus metrics over HTTP on ADDR (`GET /metrics`): PORT or HOST:PORT; a bare
    /// port (0: any free one) binds 127.0.0.1. Only loopback addresses without
    /// --metrics-allow-remote.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Allow --metrics on an address that is not loopback (the metrics are not authenticated).
    #[arg(long, requires = "metrics")]
    pub metrics_allow_remote: bool,
    /// A Unix control socket at PATH (mode 0600, owner only): one JSON request per line
    /// (status, stats, merge-start/pause/resume); `snapblk ctl PATH ...` is its client.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// With --merge and --control: open the snapshot to merge but wait for `merge-start` on
    /// the control socket before the first write.
    #[arg(long, requires_all = ["merge", "control"])]
    pub merge_wait: bool,
}

/// What the metrics and the control socket report about one running export.
#[derive(Clone)]
pub struct Observed {
    /// `nbd`, `fuse` or `ublk`.
    pub export: &'static str,
    pub io: Arc<IoStats>,
    pub act: Option<Arc<Activity>>,
    pub size: u64,
    pub started: Instant,
}

/// The address --metrics binds: loopback unless allowed otherwise.
fn metrics_addr(a: &OpsArgs) -> anyhow::Result<Option<SocketAddr>> {
    let Some(s) = &a.metrics else { return Ok(None) };
    let addr: SocketAddr = match s.parse::<u16>() {
        Ok(port) => SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => s
            .parse()
            .with_context(|| format!("--metrics {s}: expected PORT or HOST:PORT"))?,
    };
    if !addr.ip().is_loopback() && !a.metrics_allow_remote {
        bail!(
            "--metrics {s}: not a loopback address; the metrics are not authenticated (add \
             --metrics-allow-remote to serve them there anyway)"
        );
    }
    Ok(Some(addr))
}

/// The running metrics and control servers; dropping it stops them and removes the socket.
pub struct Ops {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Where the metrics are served (for the "ready" line).
    pub metrics: Option<SocketAddr>,
    control: Option<PathBuf>,
}

/// Checks the options before anything is opened.
pub fn check(a: &OpsArgs) -> anyhow::Result<()> {
    metrics_addr(a)?;
    if let Some(p) = &a.control {
        refuse_taken(p)?;
    }
    Ok(())
}

/// Refuses a control path that holds anything but a stale socket.
fn refuse_taken(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        let live = UnixStream::connect(path).is_ok();
        if !m.file_type().is_socket() || live {
            bail!(
                "--control {}: the path exists{}",
                path.display(),
                if live {
                    " and a server listens on it"
                } else {
                    " and is not a socket"
                }
            );
        }
    }
    Ok(())
}

impl Ops {
    /// Start what `a` asks for, reading `obs`.
    pub fn start(a: &OpsArgs, obs: &Observed) -> anyhow::Result<Ops> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut ops = Ops {
            stop: stop.clone(),
            threads: Vec::new(),
            metrics: None,
            control: None,
        };
        if let Some(addr) = metrics_addr(a)? {
            let l = TcpListener::bind(addr)
                .with_context(|| format!("binding the metrics address {addr}"))?;
            ops.metrics = Some(l.local_addr()?);
            l.set_nonblocking(true)?;
            let (obs, stop) = (obs.clone(), stop.clone());
            ops.threads.push(
                std::thread::Builder::new()
                    .name("metrics".into())
                    .spawn(move || serve_metrics(&l, &obs, &stop))?,
            );
        }
        if let Some(path) = &a.control {
            let l = bind_private(path)?;
            ops.control = Some(path.clone());
            let (obs, stop) = (obs.clone(), stop.clone());
            ops.threads.push(
                std::thread::Builder::new()
                    .name("control".into())
                    .spawn(move || serve_control(&l, &obs, &stop))?,
            );
        }
        // Best effort, as the other serve lines on stderr (a closed stderr is no reason to stop).
        let mut e = std::io::stderr().lock();
        if let Some(a) = ops.metrics {
            let _ = writeln!(e, "snapblk: metrics at http://{a}/metrics");
        }
        if let Some(p) = &ops.control {
            let _ = writeln!(e, "snapblk: control socket {}", p.display());
        }
        Ok(ops)
    }

    /// Fields for the "ready" line.
    pub fn ready_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        if let Some(a) = self.metrics {
            m.insert("metrics".into(), a.to_string().into());
        }
        if let Some(p) = &self.control {
            m.insert("control".into(), p.display().to_string().into());
        }
        m
    }
}

impl Drop for Ops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(p) = &self.control {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Bind a Unix socket at `path` that only its owner can connect to: it is bound in a new
/// directory of mode 0700 beside `path`, made 0600, and renamed into place, so it never exists
/// at `path` with a wider mode. A stale socket (nobody listening) at `path` is replaced;
/// anything else there is refused.
fn bind_private(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    refuse_taken(path)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".snapblk-control-")
        .tempdir_in(dir)
        .with_context(|| format!("--control: creating a directory in {}", dir.display()))?;
    let p = tmp.path().join("s");
    let l = UnixListener::bind(&p).with_context(|| format!("binding {}", p.display()))?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&p, path).with_context(|| format!("--control {}", path.display()))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Accept loop shared by both servers: poll `accept` until `stop`.
fn accept_loop<S>(
    stop: &AtomicBool,
    mut accept: impl FnMut() -> std::io::Result<S>,
    mut on: impl FnMut(S),
) {
    while !stop.load(Ordering::Relaxed) {
        match accept() {
            Ok(s) => on(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                log::warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// A stream a bounded server accepts: it sets the stream's blocking mode.
trait Conn: Send {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()>;
}

impl Conn for std::net::TcpStream {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        std::net::TcpStream::set_nonblocking(self, on)
    }
}

impl Conn for UnixStream {
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        UnixStream::set_nonblocking(self, on)
    }
}

/// How many connections a server serves at once, and what one beyond them gets.
struct Limit<S> {
    /// Connections served at once.
    max: usize,
    /// Name of the threads serving them.
    thread: &'static str,
    /// Writes the refusal to a connection beyond `max`, which is then closed. The stream is
    /// non-blocking, so it never waits: a fresh socket's buffer takes a short reply.
    refuse: fn(&S),
}

/// Decrements a server's count of active connections when its thread ends (or is never
/// started: a failed spawn drops the closure that holds it).
struct Active<'a>(&'a AtomicUsize);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serve what `accept` gives until `stop`: each connection on its own thread, in blocking
/// mode, at most `limit.max` at once, so a slow or stuck client holds only its own
/// connection; one beyond them gets `limit.refuse` at once. Returns when `stop` is set and
/// every connection's thread has ended.
fn serve_bounded<S: Conn>(
    stop: &AtomicBool,
    accept: impl FnMut() -> std::io::Result<S>,
    limit: Limit<S>,
    serve: impl Fn(S) -> std::io::Result<()> + Sync,
) {
    let active = AtomicUsize::new(0);
    let serve = &serve;
    std::thread::scope(|scope| {
        accept_loop(stop, accept, |s| {
            if active.load(Ordering::Relaxed) >= limit.max {
                let _ = s.set_nonblocking(true);
                (limit.refuse)(&s);
                return;
            }
            active.fetch_add(1, Ordering::Relaxed);
            let held = Active(&active);
            let spawned = std::thread::Builder::new()
                .name(limit.thread.into())
                .spawn_scoped(scope, move || {
                    let _held = held;
                    if let Err(e) = s.set_nonblocking(false).and_then(|()| serve(s)) {
                        log::debug!("{}: {e}", limit.thread);
                    }
                });
            if let Err(e) = spawned {
                log::warn!("{}: {e}", limit.thread);
            }
        });
    });
}

fn serve_metrics(l: &TcpListener, obs: &Observed, stop: &AtomicBool) {
    // Each scrape also has a deadline, so a client that trickles holds its slot only a while.
    let limit = Limit {
        max: METRICS_MAX_CONNS,
        thread: "metrics-conn",
        refuse: |s: &std::net::TcpStream| {
            let _ = (&*s).write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
                  Content-Length: 0\r\nConnection: close\r\n\r\n",
            );
        },
    };
    serve_bounded(
        stop,
        || l.accept().map(|(s, _)| s),
        limit,
        |s| {
            let until = Instant::now() + METRICS_DEADLINE;
            answer_http(Deadline { s, until, stop }, obs)
        },
    );
}

/// A metrics connection whose reads and writes fail with `TimedOut` past `until` (or once the
/// server stops), however slowly the client trickles its bytes.
struct Deadline<'a> {
    s: std::net::TcpStream,
    until: Instant,
    stop: &'a AtomicBool,
}

impl Deadline<'_> {
    /// Time left, at most 200 ms (to notice a stop), or `TimedOut`.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() || self.stop.load(Ordering::Relaxed) {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        Ok(left.min(Duration::from_millis(200)))
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.s.set_read_timeout(Some(self.left()?))?;
            match self.s.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                r => return r,
            }
        }
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            self.s.set_write_timeout(Some(self.left()?))?;
            match self.s.write(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                r => return r,
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

/// Answer one HTTP/1.x request: `GET /metrics` (or `/`) gets the exposition.
fn answer_http(mut s: Deadline<'_>, obs: &Observed) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut r = BufReader::new((&mut s).take(16 << 10));
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let end = line.iter().all(|b| matches!(b, b'\r' | b'\n'));
        if head.is_empty() {
            head = line;
        } else if end {
            break;
        }
    }
    drop(r);
    let head = String::from_utf8_lossy(&head);
    let mut parts = head.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics" | "/") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render_metrics(obs),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        ),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

/// A metric family drawn from a counter struct: name, type, help, and the value.
type Family<T, V> = (&'static str, &'static str, &'static str, fn(&T) -> V);

/// A metric family's header.
fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        o,
        "# HELP snapblk_{name} {help}\n# TYPE snapblk_{name} {kind}"
    );
}

/// The Prometheus text exposition (format 0.0.4) of `obs`.
pub fn render_metrics(obs: &Observed) -> String {
    let mut o = String::new();
    let ex = obs.export;
    let io = obs.io.snapshot();
    family(
        &mut o,
        "up_seconds",
        "gauge",
        "Seconds since the export started.",
    );
    let _ = writeln!(
        o,
        "snapblk_up_seconds{{export=\"{ex}\"}} {:.3}",
        obs.started.elapsed().as_secs_f64()
    );
    family(
        &mut o,
        "device_size_bytes",
        "gauge",
        "Size of the exported device.",
    );
    let _ = writeln!(
        o,
        "snapblk_device_size_bytes{{export=\"{ex}\"}} {}",
        obs.size
    );
    let per_dir: [Family<snapblk_core::DirSnapshot, u64>; 3] = [
        (
            "requests_total",
            "counter",
            "Requests completed, by direction.",
            |d| d.requests,
        ),
        (
            "bytes_total",
            "counter",
            "Bytes moved by completed requests, by direction.",
            |d| d.bytes,
        ),
        (
            "request_errors_total",
            "counter",
            "Requests that completed with an error.",
            |d| d.errors,
        ),
    ];
    for (name, kind, help, get) in per_dir {
        family(&mut o, name, kind, help);
        for d in IoDir::ALL {
            let _ = writeln!(
                o,
                "snapblk_{name}{{export=\"{ex}\",dir=\"{}\"}} {}",
                d.name(),
                get(io.dir(d))
            );
        }
    }
    family(
        &mut o,
        "request_duration_seconds",
        "histogram",
        "Request latency from arrival at the export to completion, by direction.",
    );
    for d in IoDir::ALL {
        let s = io.dir(d);
        let l = format!("export=\"{ex}\",dir=\"{}\"", d.name());
        for (b, n) in LATENCY_BOUNDS_NS.iter().zip(s.buckets) {
            let _ = writeln!(
                o,
                "snapblk_request_duration_seconds_bucket{{{l},le=\"{}\"}} {n}",
                *b as f64 / 1e9
            );
        }
        let _ = writeln!(
            o,
            "snapblk_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}\n\
             snapblk_request_duration_seconds_sum{{{l}}} {}\n\
             snapblk_request_duration_seconds_count{{{l}}} {}",
            s.requests,
            s.latency_sum_ns as f64 / 1e9,
            s.requests
        );
    }
    if ex != "ublk" {
        family(
            &mut o,
            "connections_total",
            "counter",
            "Client connections accepted (FUSE: opens of the file).",
        );
        let _ = writeln!(
            o,
            "snapblk_connections_total{{export=\"{ex}\"}} {}",
            io.connections_total
        );
        family(
            &mut o,
            "connections_active",
            "gauge",
            "Client connections open now (FUSE: open files).",
        );
        let _ = writeln!(
            o,
            "snapblk_connections_active{{export=\"{ex}\"}} {}",
            io.connections_active
        );
    }
    if let Some(act) = &obs.act {
        render_snapshot(&mut o, act);
    }
    o
}

/// Ops per second of the merge so far (0 before it has run a measurable time).
fn merge_rate(m: &MergeStats) -> f64 {
    let done = m.merged.saturating_sub(m.resumed_at) as f64;
    if m.elapsed_us == 0 {
        0.0
    } else {
        done / (m.elapsed_us as f64 / 1e6)
    }
}

fn render_snapshot(o: &mut String, act: &Activity) {
    let m = act.merge().stats();
    family(
        o,
        "merge_ops_merged",
        "gauge",
        "Merge ops durably in the base (the COW's num_merge_ops).",
    );
    let _ = writeln!(o, "snapblk_merge_ops_merged {}", m.merged);
    family(
        o,
        "merge_ops_total",
        "gauge",
        "Ops in the COW's merge order.",
    );
    let _ = writeln!(o, "snapblk_merge_ops_total {}", m.total);
    family(
        o,
        "merge_ops_per_second",
        "gauge",
        "Ops merged per second by this run, pauses included.",
    );
    let _ = writeln!(o, "snapblk_merge_ops_per_second {:.3}", merge_rate(&m));
    family(
        o,
        "merge_state",
        "gauge",
        "1 for the merge's current state, 0 for the others.",
    );
    for st in [
        MergeState::Off,
        MergeState::Running,
        MergeState::Paused,
        MergeState::Done,
        MergeState::Stopped,
        MergeState::Failed,
    ] {
        let _ = writeln!(
            o,
            "snapblk_merge_state{{state=\"{}\"}} {}",
            st.name(),
            u8::from(st == m.state)
        );
    }
    if let Some(s) = act.sched_stats() {
        let classes = [
            ("foreground", s.foreground),
            ("merge", s.merge),
            ("readahead", s.readahead),
        ];
        let per_class: [Family<snapblk_snapshot::ClassStats, f64>; 5] = [
            (
                "sched_requests_total",
                "counter",
                "Base/COW requests admitted by the I/O scheduler, by class.",
                |c| c.requests as f64,
            ),
            (
                "sched_bytes_total",
                "counter",
                "Bytes of those requests, by class.",
                |c| c.bytes as f64,
            ),
            (
                "sched_wait_seconds_total",
                "counter",
                "Time requests waited for admission (their budget), by class.",
                |c| c.wait_ns as f64 / 1e9,
            ),
            (
                "sched_wait_max_seconds",
                "gauge",
                "The longest single wait for admission, by class.",
                |c| c.max_wait_ns as f64 / 1e9,
            ),
            (
                "sched_throttled_total",
                "counter",
                "Requests that could not be admitted at once, by class.",
                |c| c.throttled as f64,
            ),
        ];
        for (name, kind, help, get) in per_class {
            family(o, name, kind, help);
            for (c, st) in &classes {
                let _ = writeln!(o, "snapblk_{name}{{class=\"{c}\"}} {}", get(st));
            }
        }
        family(
            o,
            "sched_budget_shrinks_total",
            "counter",
            "Times the background budget was cut for foreground I/O.",
        );
        let _ = writeln!(o, "snapblk_sched_budget_shrinks_total {}", s.budget_shrinks);
        family(
            o,
            "sched_budget_grows_total",
            "counter",
            "Times the background budget grew back in a quiet period.",
        );
        let _ = writeln!(o, "snapblk_sched_budget_grows_total {}", s.budget_grows);
    }
    if let Some(b) = act.sched_budget() {
        family(
            o,
            "sched_budget_bytes",
            "gauge",
            "Background (merge, readahead) bytes the scheduler lets in flight now.",
        );
        let _ = writeln!(o, "snapblk_sched_budget_bytes {b}");
    }
    if let Some(c) = act.cache_stats() {
        family(
            o,
            "cache_hits_total",
            "counter",
            "Decoded-unit cache lookups that hit.",
        );
        let _ = writeln!(o, "snapblk_cache_hits_total {}", c.hits);
        family(
            o,
            "cache_misses_total",
            "counter",
            "Decoded-unit cache lookups that missed (payload read and decoded).",
        );
        let _ = writeln!(o, "snapblk_cache_misses_total {}", c.misses);
        family(
            o,
            "cache_bytes",
            "gauge",
            "Decoded bytes held in the cache.",
        );
        let _ = writeln!(o, "snapblk_cache_bytes {}", c.bytes);
        family(
            o,
            "cache_capacity_bytes",
            "gauge",
            "The cache's byte limit (0: disabled).",
        );
        let _ = writeln!(o, "snapblk_cache_capacity_bytes {}", c.capacity);
    }
}

fn serve_control(l: &UnixListener, obs: &Observed, stop: &AtomicBool) {
    let limit = Limit {
        max: CONTROL_MAX_CLIENTS,
        thread: "control-conn",
        refuse: |s: &UnixStream| {
            let msg = format!(
                "too many control clients ({CONTROL_MAX_CLIENTS} connected); try again later"
            );
            let _ = writeln!(&*s, "{}", error_reply(&msg));
        },
    };
    serve_bounded(
        stop,
        || l.accept().map(|(s, _)| s),
        limit,
        |s| control_conn(s, obs, stop),
    );
}

/// One control connection: a reply line for every request line, until EOF or stop.
fn control_conn(s: UnixStream, obs: &Observed, stop: &AtomicBool) -> std::io::Result<()> {
    // Woken now and then to notice a stop.
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    // A client that stops reading its replies loses the connection rather than holding this
    // thread (and the server's exit, which joins it) for ever.
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut line = Vec::new();
    let mut heard = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let before = line.len();
        let n = match (&mut r)
            .take((MAX_LINE + 1 - line.len()) as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                // read_until keeps what it read before the timeout.
                if line.len() > before {
                    heard = Instant::now();
                } else if heard.elapsed() >= CONTROL_IDLE {
                    let msg = format!(
                        "no request for {} s: closing the connection",
                        CONTROL_IDLE.as_secs()
                    );
                    writeln!(w, "{}", error_reply(&msg))?;
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        heard = Instant::now();
        let complete = line.last() == Some(&b'\n');
        if !complete && line.len() <= MAX_LINE && n != 0 {
            continue;
        }
        if line.len() > MAX_LINE {
            writeln!(
                w,
                "{}",
                error_reply(&format!("request longer than {MAX_LINE} bytes"))
            )?;
            return Ok(());
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            if n == 0 {
                return Ok(());
            }
            line.clear();
            continue;
        }
        let reply = control_reply(&line, obs);
        writeln!(w, "{reply}")?;
        w.flush()?;
        line.clear();
        if n == 0 {
            return Ok(());
        }
    }
    Ok(())
}

fn error_reply(msg: &str) -> serde_json::Value {
    serde_json::json!({"v": CONTROL_VERSION, "ok": false, "error": msg})
}

/// The reply to one request line. Requests: `{"v":1,"cmd":C}` with C one of `status`,
/// `stats`, `merge-start`, `merge-pause`, `merge-resume`. Replies: `{"v":1,"ok":true,...}`, or
/// `{"v":1,"ok":false,"error":"..."}` for anything malformed or refused.
pub fn control_reply(line: &[u8], obs: &Observed) -> serde_json::Value {
    let req: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return error_reply(&format!("not JSON: {e}")),
    };
    let Some(req) = req.as_object() else {
        return error_reply("a request is a JSON object");
    };
    match req.get("v").and_then(|v| v.as_u64()) {
        Some(CONTROL_VERSION) => {}
        Some(v) => return error_reply(&format!("protocol version {v} is not supported (1 is)")),
        None => return error_reply("missing \"v\" (the protocol version, 1)"),
    }
    let Some(cmd) = req.get("cmd").and_then(|c| c.as_str()) else {
        return error_reply("missing \"cmd\"");
    };
    let merge = || obs.act.as_ref().map(|a| a.merge().clone());
    let merge_reply = |r: Result<MergeStats, snapblk_snapshot::MergeControlError>| match r {
        Ok(_) => {
            let st = merge().map(|m| m.stats()).unwrap_or_default();
            serde_json::json!({"v": CONTROL_VERSION, "ok": true, "merge": st})
        }
        Err(e) => error_reply(&e.to_string()),
    };
    let no_merge = || error_reply(&snapblk_snapshot::MergeControlError::NoMerge.to_string());
    match cmd {
        "status" => {
            let m = merge().map(|m| m.stats());
            let io = obs.io.snapshot();
            serde_json::json!({
                "v": CONTROL_VERSION, "ok": true,
                "export": obs.export,
                "size": obs.size,
                "uptime_ms": obs.started.elapsed().as_millis() as u64,
                "connections_active": io.connections_active,
                "merge": m,
            })
        }
        "stats" => stats_reply(obs),
        "merge-start" => merge().map_or_else(no_merge, |m| merge_reply(m.start_merge())),
        "merge-resume" => merge().map_or_else(no_merge, |m| merge_reply(m.resume())),
        "merge-pause" => {
            merge().map_or_else(no_merge, |m| match m.pause(Duration::from_secs(600)) {
                Ok(st) if st.state == MergeState::Running => {
                    error_reply("the merge did not reach a durable step within 600 s")
                }
                r => merge_reply(r),
            })
        }
        other => error_reply(&format!(
            "unknown cmd {other:?} (status, stats, merge-start, merge-pause, merge-resume)"
        )),
    }
}

fn stats_reply(obs: &Observed) -> serde_json::Value {
    let io = obs.io.snapshot();
    let mut dirs = serde_json::Map::new();
    for d in IoDir::ALL {
        let s = io.dir(d);
        dirs.insert(
            d.name().into(),
            serde_json::json!({
                "requests": s.requests, "bytes": s.bytes, "errors": s.errors,
                "latency_sum_ns": s.latency_sum_ns,
            }),
        );
    }
    let act = obs.act.as_ref();
    serde_json::json!({
        "v": CONTROL_VERSION, "ok": true,
        "export": obs.export,
        "uptime_ms": obs.started.elapsed().as_millis() as u64,
        "io": dirs,
        "connections_total": io.connections_total,
        "connections_active": io.connections_active,
        "merge": act.map(|a| a.merge().stats()),
        "merge_ops_per_second": act.map(|a| merge_rate(&a.merge().stats())),
        "sched": act.and_then(|a| a.sched_stats()),
        "cache": act.and_then(|a| a.cache_stats()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs() -> Observed {
        Observed {
            export: "nbd",
            io: Arc::default(),
            act: None,
            size: 4096,
            started: Instant::now(),
        }
    }

    /// The shared limit: with `max` connections being served, the next one gets the refusal
    /// and is closed; when one ends, its slot is free again; stopping waits for the threads.
    #[test]
    fn bounded_servers_refuse_beyond_the_limit_and_free_slots() {
        let (tx, rx) = std::sync::mpsc::channel::<UnixStream>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let server = std::thread::spawn(move || {
            let limit = Limit {
                max: 2,
                thread: "test-conn",
                refuse: |s: &UnixStream| {
                    let _ = (&*s).write_all(b"busy\n");
                },
            };
            let accept = || {
                rx.try_recv()
                    .map_err(|_| std::io::ErrorKind::WouldBlock.into())
            };
            serve_bounded(&stop2, accept, limit, |mut s: UnixStream| {
                s.write_all(b"served\n")?;
                // Held until the client closes.
                std::io::copy(&mut s, &mut std::io::sink()).map(|_| ())
            });
        });
        let connect = || {
            let (client, server) = UnixStream::pair().unwrap();
            client
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            tx.send(server).unwrap();
            let mut l = String::new();
            BufReader::new(&client).read_line(&mut l).unwrap();
            (client, l)
        };
        let (a, la) = connect();
        let (b, lb) = connect();
        assert_eq!((la.as_str(), lb.as_str()), ("served\n", "served\n"));
        let (c, lc) = connect();
        assert_eq!(lc, "busy\n");
        let mut rest = Vec::new();
        assert_eq!(
            (&c).read_to_end(&mut rest).unwrap(),
            0,
            "closed after refusing"
        );
        drop(a);
        // a's thread ends when it sees the close; then a new client is served.
        let end = Instant::now() + Duration::from_secs(30);
        let d = loop {
            let (d, l) = connect();
            if l == "served\n" {
                break d;
            }
            assert_eq!(l, "busy\n");
            assert!(Instant::now() < end, "the slot was never freed");
            std::thread::sleep(Duration::from_millis(20));
        };
        stop.store(true, Ordering::Relaxed);
        drop((b, d));
        server.join().unwrap();
    }

    #[test]
    fn bad_requests_get_an_error_reply() {
        let o = obs();
        for (req, want) in [
            (&b"{"[..], "not JSON"),
            (b"[1]", "JSON object"),
            (b"{\"cmd\":\"status\"}", "missing \"v\""),
            (b"{\"v\":2,\"cmd\":\"status\"}", "version 2"),
            (b"{\"v\":1}", "missing \"cmd\""),
            (b"{\"v\":1,\"cmd\":\"reboot\"}", "unknown cmd"),
            (b"{\"v\":1,\"cmd\":\"merge-pause\"}", "no merge"),
        ] {
            let r = control_reply(req, &o);
            assert_eq!(r["ok"], false, "{r}");
            assert!(r["error"].as_str().unwrap().contains(want), "{r}");
        }
        let r = control_reply(b"{\"v\":1,\"cmd\":\"status\"}", &o);
        assert_eq!(r["ok"], true);
        assert_eq!(r["export"], "nbd");
    }

    #[test]
    fn metrics_hold_every_family_once() {
        let o = obs();
        o.io.record(IoDir::Read, 4096, Duration::from_micros(50), true);
        let text = render_metrics(&o);
        assert!(text.contains("snapblk_requests_total{export=\"nbd\",dir=\"read\"} 1\n"));
        assert!(text.contains("snapblk_bytes_total{export=\"nbd\",dir=\"read\"} 4096\n"));
        assert!(text.contains(
            "snapblk_request_duration_seconds_bucket{export=\"nbd\",dir=\"read\",le=\"+Inf\"} 1\n"
        ));
        let mut seen = std::collections::HashSet::new();
        for l in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert!(seen.insert(l.to_owned()), "family twice: {l}");
        }
        assert!(
            metrics_addr(&OpsArgs {
                metrics: Some("0.0.0.0:9100".into()),
                ..OpsArgs::default()
            })
            .is_err()
        );
        assert_eq!(
            metrics_addr(&OpsArgs {
                metrics: Some("9100".into()),
                ..OpsArgs::default()
            })
            .unwrap(),
            Some("127.0.0.1:9100".parse().unwrap())
        );
    }
}
