//! `snapblk serve`: export a device over ublk, FUSE or NBD until SIGINT/SIGTERM.
//!
//! For the snapshot device, `--record LIST` records the block ranges served during the first
//! `--record-secs` seconds and `--readahead LIST` replays such a list inside the device at start
//! (see snapblk_snapshot::Activity), and `--merge` merges the COW into the base while serving
//! (snapblk_snapshot::MergeTask); their counters go into the JSON lines.

use crate::serve_ops::{self, Observed, Ops};
use crate::serve_ublk;
use anyhow::{Context, bail};
use clap::{ArgGroup, Args};
use snapblk_core::sync::lock;
use snapblk_nbd::TermSignals;
use snapblk_snapshot::{Activity, MergeState, ReadaheadStats, ReplayState};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
#[command(group(ArgGroup::new("export").required(true).multiple(false).args(["ublk", "fuse", "nbd"])))]
pub struct ServeArgs {
    /// Device spec: a file or block device (io_uring driver) or DRIVER:key=value,...
    /// (e.g. null:size=1G, sync:path=disk.img). Omit it when giving --base/--cow.
    #[arg(required_unless_present = "base", conflicts_with = "base")]
    device: Option<String>,
    /// Snapshot base image (with --cow): serves snapshot:base=B,cow=C.
    #[arg(long, requires = "cow", value_name = "B")]
    base: Option<PathBuf>,
    /// Snapshot COW file (with --base).
    #[arg(long, requires = "base", value_name = "C")]
    cow: Option<PathBuf>,
    /// Make the snapshot writable (writes go to an overlay, the base is never modified).
    #[arg(long, requires = "base", conflicts_with = "read_only")]
    writable: bool,
    /// Snapshot device: merge the COW into the base while serving, as snapuserd does after an
    /// update's first boot. Clients keep reading the new image (read-only); stopping the server
    /// stops the merge at a durable step, and the next --merge (or `snapblk merge`) resumes it.
    /// It writes the base and the COW, so it cannot be combined with --read-only.
    #[arg(long, conflicts_with_all = ["writable", "read_only"])]
    merge: bool,
    /// Open the device read-only and export it read-only.
    #[arg(long)]
    read_only: bool,
    /// Snapshot (--base/--cow): the COW record to check served blocks against (default:
    /// COW.snapblk beside the COW, when present). A block that differs is an I/O error.
    #[arg(
        long,
        requires = "base",
        value_name = "FILE",
        conflicts_with = "no_record"
    )]
    cow_record: Option<PathBuf>,
    /// Snapshot (--base/--cow): ignore the COW record; blocks are served unchecked.
    #[arg(long, requires = "base")]
    no_record: bool,
    /// Snapshot (--base/--cow): check the base against the COW record before serving (every
    /// block the COW reads and the SHA-256 of the whole base); by default blocks are checked
    /// lazily, as they are served, so serving starts at once.
    #[arg(long, requires = "base", conflicts_with = "no_record")]
    verify_base: bool,
    /// Queues opened with the device (at least 1; more are added per NBD connection / FUSE
    /// thread when the driver allows it).
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(i32).range(1..))]
    queues: i32,
    /// Print one JSON line on stdout when clients may connect, and one when stopped.
    #[arg(long)]
    json: bool,

    /// Snapshot device: record the block ranges served to clients during the first
    /// --record-secs seconds into LIST (written at the window end, or at exit if earlier).
    #[arg(long, value_name = "LIST")]
    record: Option<PathBuf>,
    /// Recording window in seconds (0: until the server stops).
    #[arg(long, requires = "record", value_name = "N",
          default_value_t = snapblk_snapshot::DEFAULT_RECORD_SECS)]
    record_secs: u64,
    /// Snapshot device: replay a list recorded with --record as in-device readahead at start
    /// (background, behind client I/O).
    #[arg(long, value_name = "LIST")]
    readahead: Option<PathBuf>,

    /// Export through ublk as /dev/ublkbN.
    #[arg(long)]
    ublk: bool,
    /// Export through FUSE: mount DIR holding one file that is the device.
    #[arg(long, value_name = "DIR")]
    fuse: Option<PathBuf>,
    /// Export over NBD on ADDR: PORT or :PORT (loopback), HOST:PORT, or unix:/path.
    #[arg(long, value_name = "ADDR")]
    nbd: Option<String>,

    // The --nbd-*, --fuse-* and --ublk-* options are refused without their export (see
    // `check_combinations`); their defaults are applied in code so that a given option can be
    // told from a default one (clap's `requires` cannot point into the `export` group).
    /// NBD export name (the empty name always selects it too) [default: ""].
    #[arg(long, value_name = "NAME")]
    nbd_name: Option<String>,
    /// NBD: maximum concurrent connections, at least 1 [default: 64]. A client beyond it gets
    /// an NBD error reply "server at its connection limit (N)" and is disconnected.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    nbd_max_connections: Option<usize>,
    /// NBD: seconds a client has for its whole negotiation, from connecting to choosing the
    /// export; fractions allowed (0.5), more than 0, no "unlimited" [default: 10]. A client
    /// still negotiating then is dropped.
    #[arg(long, value_name = "SECS", value_parser = handshake_secs)]
    nbd_handshake_timeout: Option<Duration>,
    /// NBD: never advertise multi-conn (by default it is advertised for read-only exports and
    /// for file, null and snapshot drivers, whose flush covers every connection).
    #[arg(long)]
    nbd_no_multi_conn: bool,

    /// FUSE: name of the device file in DIR [default: disk.img].
    #[arg(long, value_name = "NAME")]
    fuse_file: Option<String>,
    /// FUSE: bypass the page cache (direct_io) on every open.
    #[arg(long)]
    fuse_direct_io: bool,
    /// FUSE: worker threads, at least 1 [default: 4].
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    fuse_threads: Option<usize>,
    /// FUSE: allow other users to access the file (allow_other).
    #[arg(long)]
    fuse_allow_other: bool,
    /// FUSE: mount over DIR even if it is not empty (hiding its files while mounted); by
    /// default such a DIR is refused, as fusermount does.
    #[arg(long)]
    fuse_nonempty: bool,

    #[command(flatten)]
    ublk_args: serve_ublk::UblkArgs,

    #[command(flatten)]
    ops: serve_ops::OpsArgs,
}

/// A count that must be at least 1 (0 used to become 1 silently).
fn at_least_one(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Seconds, fractions allowed, more than 0 and at most a day (there is no "no limit": a
/// negotiation that never ends would hold a connection slot forever).
fn handshake_secs(v: &str) -> Result<Duration, String> {
    let secs: f64 = v.parse().map_err(|e| format!("{e}"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err("must be more than 0 seconds".into());
    }
    if secs > 86400.0 {
        return Err("must be at most 86400 seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

/// Options that would be accepted and then have no effect: refused, one line each, before
/// anything is opened. (Contradictions clap can see, such as --merge with --read-only, are
/// refused by clap itself.)
fn check_combinations(a: &ServeArgs) -> anyhow::Result<()> {
    let u = &a.ublk_args;
    /// (export flag, whether it was given, its options and whether each was given)
    type PerExport<'a> = (&'a str, bool, &'a [(&'a str, bool)]);
    let per_export: [PerExport; 3] = [
        (
            "--nbd",
            a.nbd.is_some(),
            &[
                ("--nbd-name", a.nbd_name.is_some()),
                ("--nbd-max-connections", a.nbd_max_connections.is_some()),
                ("--nbd-handshake-timeout", a.nbd_handshake_timeout.is_some()),
                ("--nbd-no-multi-conn", a.nbd_no_multi_conn),
            ],
        ),
        (
            "--fuse",
            a.fuse.is_some(),
            &[
                ("--fuse-file", a.fuse_file.is_some()),
                ("--fuse-direct-io", a.fuse_direct_io),
                ("--fuse-threads", a.fuse_threads.is_some()),
                ("--fuse-allow-other", a.fuse_allow_other),
                ("--fuse-nonempty", a.fuse_nonempty),
            ],
        ),
        (
            "--ublk",
            a.ublk,
            &[
                ("--ublk-queues", u.ublk_queues.is_some()),
                ("--ublk-depth", u.ublk_depth.is_some()),
                ("--ublk-mode", u.ublk_mode.is_some()),
                ("--ublk-max-io-kib", u.ublk_max_io_kib.is_some()),
                ("--ublk-id", u.ublk_id.is_some()),
                ("--ublk-no-plan", u.ublk_no_plan),
            ],
        ),
    ];
    for (export, on, opts) in per_export {
        if let Some((opt, _)) = opts.iter().find(|(_, given)| *given)
            && !on
        {
            bail!("{opt} has no effect without {export}");
        }
    }
    if u.ublk_no_plan && !matches!(u.mode(), serve_ublk::UblkMode::ZeroCopy) {
        bail!("--ublk-no-plan has no effect without --ublk-mode zero-copy");
    }
    Ok(())
}

/// `,record=...,readahead=...,merge=true` for the snapshot spec, from --record/--readahead/--merge.
fn record_props(a: &ServeArgs) -> anyhow::Result<String> {
    let mut s = String::new();
    let path = |p: &PathBuf, flag: &str| {
        let p = p.display().to_string();
        if p.contains(',') || p.is_empty() {
            bail!("{flag}: the path cannot be empty or contain ','");
        }
        Ok(p)
    };
    if let Some(r) = &a.record {
        s.push_str(&format!(
            ",record={},record-secs={}",
            path(r, "--record")?,
            a.record_secs
        ));
    }
    if let Some(r) = &a.readahead {
        s.push_str(&format!(",readahead={}", path(r, "--readahead")?));
    }
    if a.merge {
        s.push_str(",merge=true");
    }
    if a.ops.merge_wait {
        s.push_str(",merge-held=true");
    }
    Ok(s)
}

/// The device spec to open, from DEVICE or --base/--cow.
fn spec(a: &ServeArgs) -> anyhow::Result<String> {
    let wants_record = a.record.is_some() || a.readahead.is_some() || a.merge;
    if wants_record && let Some(d) = &a.device {
        let parsed = snapblk::parse_spec(d).map_err(|e| anyhow::anyhow!("{e}"))?;
        if parsed.driver != "snapshot" || !d.starts_with("snapshot:") {
            bail!(
                "--record/--readahead/--merge work on the snapshot device only (--base/--cow or a snapshot: spec), not the {} driver",
                parsed.driver
            );
        }
    }
    let s = spec_base(a)?;
    Ok(if wants_record {
        s + &record_props(a)?
    } else {
        s
    })
}

fn spec_base(a: &ServeArgs) -> anyhow::Result<String> {
    if let (Some(b), Some(c)) = (&a.base, &a.cow) {
        crate::outfile::refuse_same(("--base", b), ("--cow", c))?;
        let (b, c) = (b.display().to_string(), c.display().to_string());
        if b.contains(',') || c.contains(',') {
            bail!("--base/--cow paths cannot contain ','");
        }
        let mut s = format!("snapshot:base={b},cow={c}");
        if a.writable {
            s.push_str(",writable=true");
        }
        if let Some(r) = &a.cow_record {
            let r = r.display().to_string();
            if r.contains(',') || r.is_empty() {
                bail!("--cow-record: the path cannot be empty or contain ','");
            }
            s.push_str(&format!(",cow-record={r}"));
        }
        if a.no_record {
            s.push_str(",verify=false");
        }
        if a.verify_base {
            s.push_str(",verify-base=true");
        }
        return Ok(s);
    }
    let Some(d) = &a.device else {
        bail!("a DEVICE or --base/--cow is required")
    };
    if !a.read_only {
        return Ok(d.clone());
    }
    let parsed = snapblk::parse_spec(d).map_err(|e| anyhow::anyhow!("{e}"))?;
    if d.starts_with(&format!("{}:", parsed.driver)) {
        Ok(format!("{d},read-only=true"))
    } else if d.contains(',') {
        bail!("--read-only with a path containing ',': use io_uring:path=...,read-only=true")
    } else {
        Ok(format!("io_uring:path={d},read-only=true"))
    }
}

/// With --json, writes `v` as one line on stdout, tagged with its schema: every serve event
/// validates against schemas/snapblk.serve-event.v1.json.
pub(crate) fn emit(json: bool, mut v: serde_json::Value) {
    if json {
        if let Some(m) = v.as_object_mut() {
            m.insert("schema".into(), "snapblk.serve-event.v1".into());
        }
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{v}");
        let _ = o.flush();
    }
}

/// Record/replay/merge reporting of a snapshot device served with --record/--readahead/--merge.
#[derive(Clone)]
struct Recording {
    act: Option<Arc<Activity>>,
    /// The snapshot device's activity whatever was asked for (metrics and control read it).
    observed: Option<Arc<Activity>>,
    json: bool,
    /// What has been reported, under one lock: no replay or merge line after "stopped", and the
    /// replay line exactly once, before it.
    lines: Arc<std::sync::Mutex<Lines>>,
}

/// See [`Recording::lines`].
#[derive(Default)]
struct Lines {
    /// The "stopped" line is being written: no replay or merge line after it.
    closed: bool,
    /// The replay's end has been reported (by its watcher, or by [`Recording::finish`] when the
    /// replay ended before the watcher woke).
    replay_reported: bool,
}

/// The replay's end: one JSON line, or a line on stderr.
fn report_replay(json: bool, st: &ReadaheadStats) {
    if json {
        emit(
            true,
            serde_json::json!({"event": "readahead", "readahead": st}),
        );
    } else if st.state == ReplayState::Done {
        eprintln!(
            "snapblk: readahead: {} of {} ranges in {} ms, {} errors{}",
            crate::human::bytes(st.bytes),
            st.ranges,
            st.elapsed_us / 1000,
            st.errors,
            st.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
    }
}

impl Recording {
    fn new(dev: &snapblk::Blkio, a: &ServeArgs) -> Recording {
        let act = (a.record.is_some() || a.readahead.is_some() || a.merge)
            .then(|| Activity::of(dev))
            .flatten();
        if let Some(st) = act.as_ref().map(|a| a.readahead_stats())
            && let Some(why) = &st.refused
        {
            eprintln!(
                "snapblk: warning: readahead list {} not replayed: {why}",
                st.path
            );
        }
        Recording {
            act,
            observed: Activity::of(dev),
            json: a.json,
            lines: Arc::default(),
        }
    }

    /// After the "ready" line: report the replay and the merge (JSON lines, or stderr).
    fn watch(&self) {
        self.watch_replay();
        self.watch_merge();
    }

    /// The replay, when it finishes: one JSON line, or a line on stderr.
    fn watch_replay(&self) {
        let Some(act) = self.act.clone() else { return };
        if act.readahead_stats().state == ReplayState::Off {
            return;
        }
        let (json, lines) = (self.json, self.lines.clone());
        let _ = std::thread::Builder::new()
            .name("readahead-watch".into())
            .spawn(move || {
                loop {
                    let st = act.wait_replay(Duration::from_millis(500));
                    let mut lines = lock(&lines);
                    if lines.closed || lines.replay_reported {
                        return;
                    }
                    if st.state == ReplayState::Running {
                        continue;
                    }
                    report_replay(json, &st);
                    lines.replay_reported = true;
                    return;
                }
            });
    }

    /// The merge: a `merge-progress` JSON line when its first step is durable and then at most
    /// once a second while it moves, and one `merge` line when it ends (or a line on stderr).
    fn watch_merge(&self) {
        let Some(act) = self.act.clone() else { return };
        if act.merge().stats().state == MergeState::Off {
            return;
        }
        let (json, lines) = (self.json, self.lines.clone());
        let _ = std::thread::Builder::new()
            .name("merge-watch".into())
            .spawn(move || {
                let task = act.merge();
                let mut shown = task.stats().merged;
                let mut last_line: Option<Instant> = None;
                loop {
                    if let Some(t) = last_line {
                        // Rate limit; the end is reported at most this late.
                        std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
                    }
                    let st = task.wait_progress(shown, Duration::from_secs(3600));
                    let lines = lock(&lines);
                    if lines.closed {
                        return;
                    }
                    if matches!(st.state, MergeState::Running | MergeState::Paused) {
                        if json && st.merged != shown {
                            emit(
                                true,
                                serde_json::json!({"event": "merge-progress",
                                    "merged": st.merged, "total": st.total}),
                            );
                            last_line = Some(Instant::now());
                        }
                        shown = st.merged;
                        continue;
                    }
                    if json {
                        emit(true, serde_json::json!({"event": "merge", "merge": st}));
                    } else {
                        match &st.error {
                            None => eprintln!(
                                "snapblk: merge {}: {} of {} ops in {} ms",
                                serde_json::json!(st.state).as_str().unwrap_or("?"),
                                st.merged,
                                st.total,
                                st.elapsed_us / 1000
                            ),
                            Some(e) => eprintln!("snapblk: merge failed: {e}"),
                        }
                    }
                    return;
                }
            });
    }

    /// Ends the recording (writes the list now if the window is still open), stops a merge at
    /// its next durable step, and returns the fields for the "stopped" line. No replay or merge
    /// line is printed after this.
    fn finish(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        let Some(act) = &self.act else {
            lock(&self.lines).closed = true;
            return m;
        };
        {
            // A replay that ended before its watcher woke is reported here, before "stopped".
            let mut lines = lock(&self.lines);
            lines.closed = true;
            let st = act.readahead_stats();
            if !lines.replay_reported
                && !matches!(st.state, ReplayState::Off | ReplayState::Running)
            {
                report_replay(self.json, &st);
                lines.replay_reported = true;
            }
        }
        let task = act.merge();
        if task.stats().state != MergeState::Off {
            task.stop();
            // Bounded by one merge window's I/O.
            let st = task.wait(Duration::from_secs(3600));
            if st.state == MergeState::Stopped && !self.json {
                eprintln!(
                    "snapblk: merge stopped at {} of {} ops (run --merge again to resume)",
                    st.merged, st.total
                );
            }
            m.insert("merge".into(), serde_json::json!(st));
        }
        let rec = act.finish_record();
        if !rec.path.is_empty() {
            if let Some(e) = &rec.error {
                eprintln!("snapblk: record list: {e}");
            }
            m.insert("record".into(), serde_json::json!(rec));
        }
        let ra = act.readahead_stats();
        if ra.state != ReplayState::Off {
            m.insert("readahead".into(), serde_json::json!(ra));
        }
        m
    }

    fn stopped(&self, export: &str) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("event".into(), "stopped".into());
        m.insert("export".into(), export.into());
        m.extend(self.finish());
        serde_json::Value::Object(m)
    }
}

/// What the metrics and the control socket read, for `export`.
fn observed(
    export: &'static str,
    io: Arc<snapblk_core::IoStats>,
    rec: &Recording,
    size: u64,
) -> Observed {
    Observed {
        export,
        io,
        act: rec.observed.clone(),
        size,
        started: Instant::now(),
    }
}

/// `fields` added to a JSON object.
fn with(
    mut v: serde_json::Value,
    fields: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.extend(fields);
    }
    v
}

pub fn run(mut a: ServeArgs) -> anyhow::Result<()> {
    check_combinations(&a)?;
    serve_ops::check(&a.ops)?;
    let spec = spec(&a)?;
    if a.ublk {
        // Before the device's threads exist (as for NBD and FUSE below).
        let stop = snapblk_ublk::block_stop_signals()?;
        let dev = snapblk::open(&spec, a.queues.max(1))
            .map_err(|e| anyhow::anyhow!("opening {spec}: {e}"))?;
        let rec = Recording::new(&dev, &a);
        if a.record.is_some() {
            // The zero-copy planner reads base and COW itself, bypassing the device's queues:
            // its reads would not be recorded.
            a.ublk_args.ublk_no_plan = true;
        }
        let watcher = rec.clone();
        let io = Arc::new(snapblk_core::IoStats::new());
        let size = dev.get_u64("capacity").unwrap_or(0);
        let ops = Ops::start(&a.ops, &observed("ublk", io.clone(), &rec, size))?;
        let r = serve_ublk::run(
            dev,
            &a.ublk_args,
            (io, ops.ready_fields()),
            a.json,
            stop,
            move || watcher.watch(),
        );
        let stopped = rec.stopped("ublk");
        r?;
        emit(a.json, stopped);
        return Ok(());
    }
    // Before any thread exists, so every thread inherits the mask and only we see the signals.
    let sigs = TermSignals::block().context("blocking SIGINT/SIGTERM")?;
    let dev = snapblk::open(&spec, a.queues.max(1))
        .map_err(|e| anyhow::anyhow!("opening {spec}: {e}"))?;
    let rec = Recording::new(&dev, &a);
    if let Some(addr) = &a.nbd {
        serve_nbd(dev, addr, &a, sigs, &rec)
    } else if let Some(dir) = &a.fuse {
        serve_fuse(dev, dir, &a, sigs, &rec)
    } else {
        bail!("one of --ublk, --fuse, --nbd is required")
    }
}

fn serve_nbd(
    dev: snapblk::Blkio,
    addr: &str,
    a: &ServeArgs,
    sigs: TermSignals,
    rec: &Recording,
) -> anyhow::Result<()> {
    use snapblk_nbd::{Export, Listener, Server, ServerConfig, SharedDevice};
    let nbd_name = a.nbd_name.as_deref().unwrap_or("");
    let driver = dev.driver_name().to_owned();
    let dev = Arc::new(SharedDevice::new(dev)?);
    let read_only = a.read_only || dev.geometry().read_only;
    // These drivers flush device-wide state (the file, or the snapshot shared by all queues).
    let flush_is_global = matches!(driver.as_str(), "io_uring" | "sync" | "null" | "snapshot");
    let export = Export {
        name: nbd_name.to_owned(),
        description: format!("snapblk {driver} device"),
        device: dev.clone(),
        read_only,
        multi_conn: !a.nbd_no_multi_conn && (read_only || flush_is_global),
    };
    let defaults = ServerConfig::default();
    let cfg = ServerConfig {
        max_connections: a.nbd_max_connections.unwrap_or(defaults.max_connections),
        handshake_timeout: a.nbd_handshake_timeout.or(defaults.handshake_timeout),
        ..defaults
    };
    let json = a.json;
    let server = Server::new(vec![export], cfg)?.on_event(move |e| log_connection(json, e));
    let listener = Listener::bind(addr).with_context(|| format!("binding NBD address {addr}"))?;
    let obs = observed("nbd", dev.stats().clone(), rec, dev.geometry().size);
    let ops = Ops::start(&a.ops, &obs)?;
    let stop = server.stop_handle();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (stop, done) = (stop.clone(), done.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if sigs.wait(Duration::from_millis(200)).is_some() {
                        stop.stop();
                        return;
                    }
                }
            })?
    };
    emit(
        a.json,
        with(
            serde_json::json!({
                "event": "ready",
                "export": "nbd",
                "address": listener.address(),
                "uri": listener.uri(nbd_name),
                "name": nbd_name,
                "size": dev.geometry().size,
                "read_only": read_only,
            }),
            ops.ready_fields(),
        ),
    );
    if !a.json {
        eprintln!(
            "snapblk: serving {} over NBD at {}",
            crate::human::bytes_exact(dev.geometry().size),
            listener.uri(nbd_name)
        );
    }
    rec.watch();
    let r = server.run(&listener);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = watcher.join();
    drop(listener);
    r.context("NBD server")?;
    // Connections flush on close; one more device-wide flush covers anything else.
    let never = std::sync::atomic::AtomicBool::new(false);
    if !read_only {
        dev.flush(&never).context("final flush")?;
    }
    emit(a.json, rec.stopped("nbd"));
    Ok(())
}

/// One line on stderr for every connection event, and with --json one JSON line on stdout:
/// `snapblk: nbd: 127.0.0.1:40312 (connection 3) dropped: negotiation not finished within the 10 s
/// deadline`, `{"event":"nbd-connection","action":"dropped","peer":"127.0.0.1:40312","id":3,...}`.
fn log_connection(json: bool, e: &snapblk_nbd::ConnEvent) {
    let reason = e
        .reason
        .as_ref()
        .map(|r| snapblk_core::Chain(r).to_string());
    let mut line = format!(
        "snapblk: nbd: {} (connection {}) {}",
        e.peer, e.id, e.action
    );
    if let Some(x) = &e.export {
        line.push_str(&format!(" export {x:?}"));
    }
    if let Some(r) = &reason {
        line.push_str(&format!(": {r}"));
    }
    // Never a panic on a closed stderr (eprintln! would): the log is best effort.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    emit(
        json,
        serde_json::json!({
            "event": "nbd-connection",
            "action": e.action.as_str(),
            "peer": e.peer,
            "id": e.id,
            "export": e.export,
            "reason": reason,
        }),
    );
}

fn serve_fuse(
    dev: snapblk::Blkio,
    dir: &std::path::Path,
    a: &ServeArgs,
    sigs: TermSignals,
    rec: &Recording,
) -> anyhow::Result<()> {
    let opts = snapblk_fuse::FuseOptions {
        file_name: a.fuse_file.clone().unwrap_or_else(|| "disk.img".into()),
        read_only: a.read_only,
        direct_io: a.fuse_direct_io,
        threads: a.fuse_threads.unwrap_or(4),
        allow_other: a.fuse_allow_other,
        nonempty: a.fuse_nonempty,
    };
    let mut m = snapblk_fuse::mount(dev, dir, &opts)?;
    let ops = Ops::start(&a.ops, &observed("fuse", m.stats().clone(), rec, m.size()))?;
    emit(
        a.json,
        with(
            serde_json::json!({
                "event": "ready",
                "export": "fuse",
                "mountpoint": dir.display().to_string(),
                "path": m.file().display().to_string(),
                "size": m.size(),
                "read_only": m.read_only(),
            }),
            ops.ready_fields(),
        ),
    );
    if !a.json {
        eprintln!(
            "snapblk: serving {} as {}",
            crate::human::bytes_exact(m.size()),
            m.file().display()
        );
    }
    rec.watch();
    let mut signalled = 0;
    let mut detached = false;
    loop {
        if m.is_finished() {
            // Unmounted from outside (`umount DIR`), or the last user of a lazily detached
            // mount let go: nothing left to serve.
            m.try_unmount()?;
            break;
        }
        if sigs.wait(Duration::from_millis(200)).is_none() {
            continue;
        }
        signalled += 1;
        if detached {
            // Third signal: the users left behind lose the export now.
            eprintln!(
                "snapblk: aborting the FUSE connection: writes acknowledged so far are flushed; \
                 the remaining users' I/O fails from now on"
            );
            m.abandon()?;
            break;
        }
        match m.try_unmount() {
            Ok(()) => break,
            Err(snapblk_fuse::FuseError::Busy(p)) if signalled >= 2 => {
                // No waiting for the users here: that would leave the signals unanswered for
                // as long as a loop device stays attached.
                m.detach_lazy();
                detached = true;
                eprintln!(
                    "snapblk: {} still busy at the second signal: detached it lazily; still serving \
                     its remaining users (loop devices, open files) and exiting when they let go; \
                     signal again to abort them",
                    p.display()
                );
            }
            Err(snapblk_fuse::FuseError::Busy(p)) => {
                eprintln!(
                    "snapblk: {} is busy (detach loop devices / close files first); still serving, signal again to detach lazily",
                    p.display()
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The session has ended: no more client reads.
    drop(m);
    emit(a.json, rec.stopped("fuse"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_cow::{CowWriter, WriterOptions};

    /// A replay that ends before its watcher thread wakes (or with no watcher at all) is still
    /// reported once, before the "stopped" line: `finish` reports it itself.
    #[test]
    fn finish_reports_a_replay_its_watcher_missed() {
        let d = snapblk_testsupport::TempDir::new("serve-finish");
        let base = d.join("base.img");
        let cow = d.join("s.cow");
        let list = d.join("l.blocks");
        std::fs::write(&base, vec![7u8; 1 << 20]).unwrap();
        let f = std::fs::File::create(&cow).unwrap();
        let mut w = CowWriter::new(
            &f,
            WriterOptions {
                op_count_max: 256,
                ..WriterOptions::default()
            },
        )
        .unwrap();
        w.add_copy(0, 16, 4).unwrap();
        w.finalize().unwrap();
        std::fs::write(
            &list,
            format!(
                "{}\n#@ capacity={}\n0:8192\n",
                snapblk_readahead::BLOCK_HEADER,
                1 << 20
            ),
        )
        .unwrap();
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: ServeArgs,
        }
        let a = <Cli as clap::Parser>::parse_from([
            "serve",
            "--base",
            base.to_str().unwrap(),
            "--cow",
            cow.to_str().unwrap(),
            "--nbd",
            "unix:/nonexistent",
            "--readahead",
            list.to_str().unwrap(),
        ])
        .a;
        let dev = snapblk::open(&spec(&a).unwrap(), 1).unwrap();
        let rec = Recording::new(&dev, &a);
        let act = rec.act.clone().unwrap();
        let t0 = Instant::now();
        while act.readahead_stats().state == ReplayState::Running {
            assert!(t0.elapsed() < Duration::from_secs(30), "replay never ended");
            act.wait_replay(Duration::from_millis(50));
        }
        assert_eq!(act.readahead_stats().state, ReplayState::Done);
        // No watcher was started: without `finish` reporting it, the replay would go unsaid.
        assert!(!lock(&rec.lines).replay_reported);
        let stopped = rec.stopped("nbd");
        assert!(lock(&rec.lines).replay_reported);
        assert!(lock(&rec.lines).closed);
        assert_eq!(stopped["readahead"]["state"], "done");
        // A watcher started now finds the line already out and says nothing more.
        rec.watch_replay();
    }
}
