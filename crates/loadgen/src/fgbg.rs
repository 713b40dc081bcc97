//! Foreground under background: start N background streams (sequential readers or writers on
//! files/devices, or shell commands such as `snapblk merge …` or `snapblk readahead replay …`),
//! then time a foreground task (a shell command, a replayed read list, or a workload) against
//! the same task on an idle device — optionally once per kernel I/O scheduler.

use crate::context;
use crate::engine::{RunOpts, run_workload};
use crate::hist::LatHist;
use crate::report::{fmt_ns, text_table};
use crate::spec::JobSpec;
use crate::target::Target;
use crate::{Error, Result};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Process groups of the commands running now (background and foreground), so that an
/// emergency exit can still kill them ([`kill_children`]).
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// What to put back on a device while [`run_fgbg`] has switched its scheduler, for
/// [`emergency_cleanup`] too.
static RESTORE_SCHED: Mutex<Option<SchedState>> = Mutex::new(None);

/// A device's scheduler as found: switching schedulers resets the tunables to the new one's
/// defaults, and switching back does not bring the old values back, so they are kept too.
#[derive(Debug, Clone)]
struct SchedState {
    /// The sysfs block directory.
    dir: PathBuf,
    name: String,
    tunables: std::collections::BTreeMap<String, String>,
}

impl SchedState {
    fn capture(dir: &Path) -> Option<SchedState> {
        Some(SchedState {
            dir: dir.to_owned(),
            name: context::scheduler(dir).0?,
            tunables: context::scheduler_tunables(dir),
        })
    }

    /// Put the scheduler and every tunable back (best effort: some are read-only).
    fn restore(&self) -> std::io::Result<()> {
        context::set_scheduler(&self.dir, &self.name)?;
        let now = context::scheduler_tunables(&self.dir);
        for (k, v) in &self.tunables {
            if now.get(k) != Some(v) {
                let _ = std::fs::write(self.dir.join("queue/iosched").join(k), v);
            }
        }
        Ok(())
    }
}

/// Kill every command process group this module started and has not reaped yet, and reap the
/// group leaders (our children). For a caller about to exit without unwinding (e.g. on a
/// second SIGINT); normal and interrupted runs kill and reap their commands themselves.
pub(crate) fn kill_children() {
    let groups = LIVE_GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
    for &g in &groups {
        // SAFETY: signalling a process group we created (pgid = the child's pid).
        unsafe { libc::kill(-g, libc::SIGKILL) };
    }
    for g in groups {
        // SAFETY: waiting for our own child; a null status pointer is allowed. If the main
        // thread reaped it meanwhile, this fails with ECHILD, which is fine.
        unsafe { libc::waitpid(g, std::ptr::null_mut(), 0) };
    }
}

/// Everything a process exiting mid-test must undo: kill and reap the commands
/// and restore the scheduler [`run_fgbg`] switched, if any.
pub fn emergency_cleanup() {
    kill_children();
    let restore = RESTORE_SCHED.lock().ok().and_then(|r| r.clone());
    if let Some(st) = restore {
        let _ = st.restore();
    }
}

/// `sh -c cmd` started in its own process group and registered in [`LIVE_GROUPS`].
fn spawn_cmd(cmd: &str) -> Result<Child> {
    let mut live = LIVE_GROUPS
        .lock()
        .map_err(|_| Error::Other("command registry poisoned".into()))?;
    let c = shell(cmd).spawn().map_err(|source| Error::IoOn {
        what: format!("start `{cmd}`"),
        source,
    })?;
    live.push(c.id() as i32);
    Ok(c)
}

/// Kill the whole process group of `c` and reap the child.
fn kill_cmd(c: &mut Child) {
    let pgid = c.id() as i32;
    // SAFETY: signalling the process group we created for this child; it is not reaped yet, so
    // the id cannot have been reused.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = c.wait();
    if let Ok(mut live) = LIVE_GROUPS.lock() {
        live.retain(|&g| g != pgid);
    }
}

/// A child that exited on its own (already reaped by `try_wait`): its group leaves the
/// registry. It is not signalled: once reaped, its id may belong to someone else.
fn forget_cmd(c: &Child) {
    let pgid = c.id() as i32;
    if let Ok(mut live) = LIVE_GROUPS.lock() {
        live.retain(|&g| g != pgid);
    }
}

fn is_stopped(stop: Option<&AtomicBool>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::Relaxed))
}

/// Sleep `secs`, waking early when `stop` is set; returns whether it was.
fn sleep_or_stop(secs: f64, stop: Option<&AtomicBool>) -> bool {
    // Saturating: a huge (finite) pause is "until stopped", not a panic.
    let end =
        Instant::now() + Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX / 4);
    loop {
        if is_stopped(stop) {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(10)));
    }
}

/// A background stream.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Background {
    /// Sequential 1 MiB reads over a file or device, wrapping at the end.
    Read {
        /// The file or device read.
        path: PathBuf,
    },
    /// Sequential 1 MiB writes over `size` bytes of a file, fdatasync every 64 MiB.
    Write {
        /// The file written (created if missing).
        path: PathBuf,
        /// Bytes written before wrapping to the start.
        size: u64,
    },
    /// A shell command run for the duration of the cell (killed at the end).
    Cmd {
        /// The command line, run by `sh -c`.
        cmd: String,
    },
}

/// The foreground task whose start-up time is measured.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Foreground {
    /// A shell command (e.g. `python3 -c 'import json'`); time = its wall time.
    Cmd {
        /// The command line, run by `sh -c`.
        cmd: String,
    },
    /// A snapblk readahead list replayed as plain reads (files evicted first); time = all reads.
    ReadList {
        /// The list file.
        list: PathBuf,
    },
    /// A workload on the benchmark target; time = its wall time, latency from its histogram.
    Workload {
        /// The workload.
        job: JobSpec,
    },
}

/// The test description.
#[derive(Debug, Clone, Serialize)]
pub struct FgBgSpec {
    /// The streams of a loaded cell (all at once).
    pub background: Vec<Background>,
    /// The task timed in every cell.
    pub foreground: Foreground,
    /// Foreground runs per cell.
    pub iterations: u32,
    /// Seconds the background runs before the first foreground run.
    pub warmup: f64,
    /// Pause between foreground runs, seconds.
    pub pause: f64,
    /// O_DIRECT for background readers/writers.
    pub bg_direct: bool,
    /// `echo 3 > /proc/sys/vm/drop_caches` before every foreground run (root).
    pub drop_caches: bool,
    /// Schedulers to try (empty: leave the current one).
    pub schedulers: Vec<String>,
    /// The block device whose scheduler is switched.
    pub device: Option<PathBuf>,
    /// Give up on a foreground command after this many seconds: the run fails (a killed
    /// command's time is no sample). Workload and read-list foregrounds are not bounded.
    pub fg_timeout: f64,
}

/// One (scheduler, load) cell.
#[derive(Debug, Clone, Serialize)]
pub struct FgBgCell {
    /// The scheduler active during the cell (read back from sysfs when a device is known).
    pub scheduler: Option<String>,
    /// That scheduler's tunables (`queue/iosched/*`) as read while the cell ran; empty for a
    /// scheduler without any (`none`), null without a device.
    pub scheduler_tunables: Option<std::collections::BTreeMap<String, String>>,
    /// "idle" or "loaded".
    pub load: String,
    /// Each foreground run's time, seconds.
    pub fg_seconds: Vec<f64>,
    /// Median of `fg_seconds`.
    pub fg_median: f64,
    /// Shortest of `fg_seconds`.
    pub fg_min: f64,
    /// Longest of `fg_seconds`.
    pub fg_max: f64,
    /// Per-read latency of the foreground (read lists and workloads): the median, ns.
    pub fg_lat_p50_ns: Option<u64>,
    /// The 99th percentile of the same, ns.
    pub fg_lat_p99_ns: Option<u64>,
    /// Background throughput during the cell (readers/writers only).
    pub bg_bytes_per_s: Option<f64>,
    /// Foreground median relative to the idle median of the same scheduler.
    pub slowdown: Option<f64>,
}

/// What [`run_fgbg`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct FgBgReport {
    /// The test that ran.
    pub spec: FgBgSpec,
    /// Every cell: per scheduler, idle then loaded.
    pub cells: Vec<FgBgCell>,
    /// Problems with the inputs that did not stop the test (e.g. missing files of a read
    /// list); the caller reports them (the document's `warnings`).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

struct BgRunning {
    stop: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    /// Stream threads and the path each works on.
    threads: Vec<(PathBuf, std::thread::JoinHandle<Result<()>>)>,
    /// Commands and the command line each runs.
    children: Vec<(String, Child)>,
    start: Instant,
}

impl BgRunning {
    /// Fail when a background stream or command has ended: the loaded cell would otherwise
    /// measure an idle device and report a plausible slowdown. Streams only end on an error;
    /// commands are meant to run for the whole cell, so any exit, even status 0, is an error.
    fn check(&mut self) -> Result<()> {
        let secs = self.start.elapsed().as_secs_f64();
        for i in 0..self.children.len() {
            let (cmd, c) = &mut self.children[i];
            let st = match c.try_wait() {
                Ok(None) => continue,
                Ok(Some(st)) => st,
                Err(source) => {
                    return Err(Error::IoOn {
                        what: format!("background command `{cmd}`"),
                        source,
                    });
                }
            };
            forget_cmd(c);
            let cmd = cmd.clone();
            // Reaped: not to be killed (its id may be reused) when the rest are stopped.
            self.children.remove(i);
            return Err(Error::Other(format!(
                "background command `{cmd}` ended during the loaded cell ({st}, after {secs:.2} s): \
                 the foreground would have run without that load"
            )));
        }
        if let Some(i) = self.threads.iter().position(|(_, t)| t.is_finished()) {
            let (path, t) = self.threads.remove(i);
            let (how, source) = match t.join() {
                Ok(Err(e)) => ("failed", Some(Box::new(e))),
                Ok(Ok(())) => ("stopped", None),
                Err(_) => ("panicked", None),
            };
            return Err(Error::BackgroundEnded {
                path,
                after_secs: secs,
                how,
                source,
            });
        }
        Ok(())
    }
}

/// Start every background stream; on failure, whatever was started is stopped again.
fn start_background(spec: &FgBgSpec) -> Result<BgRunning> {
    let mut bg = BgRunning {
        stop: Arc::new(AtomicBool::new(false)),
        bytes: Arc::new(AtomicU64::new(0)),
        threads: Vec::new(),
        children: Vec::new(),
        start: Instant::now(),
    };
    match start_streams(spec, &mut bg) {
        Ok(()) => {
            bg.start = Instant::now();
            Ok(bg)
        }
        Err(e) => {
            let _ = stop_background(bg);
            Err(e)
        }
    }
}

fn start_streams(spec: &FgBgSpec, bg: &mut BgRunning) -> Result<()> {
    for b in &spec.background {
        match b {
            Background::Cmd { cmd } => {
                bg.children.push((cmd.clone(), spawn_cmd(cmd)?));
            }
            Background::Read { path } | Background::Write { path, .. } => {
                let write = matches!(b, Background::Write { .. });
                let size = if let Background::Write { size, .. } = b {
                    *size
                } else {
                    0
                };
                let mut o = OpenOptions::new();
                o.read(true);
                if write {
                    o.write(true).create(true);
                }
                if spec.bg_direct {
                    o.custom_flags(libc::O_DIRECT);
                }
                let f = o.open(path).map_err(|source| Error::IoOn {
                    what: format!("background {}", path.display()),
                    source,
                })?;
                let len = if write { size } else { file_len(&f)? };
                if len < (1 << 20) {
                    return Err(Error::Spec(format!(
                        "background {}: needs at least 1 MiB",
                        path.display()
                    )));
                }
                let (stop, bytes) = (bg.stop.clone(), bg.bytes.clone());
                bg.threads.push((
                    path.clone(),
                    std::thread::spawn(move || stream(f, len, write, &stop, &bytes)),
                ));
            }
        }
    }
    Ok(())
}

/// Before the idle cell: every background reader's file can be opened and is large enough,
/// and every writer's directory exists, so a typo fails at once rather than after the idle
/// cell was measured.
fn check_background_inputs(spec: &FgBgSpec) -> Result<()> {
    for b in &spec.background {
        match b {
            Background::Read { path } => {
                let f = File::open(path).map_err(|source| Error::IoOn {
                    what: format!("background {}", path.display()),
                    source,
                })?;
                if file_len(&f)? < 1 << 20 {
                    return Err(Error::Spec(format!(
                        "background {}: needs at least 1 MiB",
                        path.display()
                    )));
                }
            }
            Background::Write { path, size } => {
                let dir = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                std::fs::metadata(dir).map_err(|source| Error::IoOn {
                    what: format!("background {}", path.display()),
                    source,
                })?;
                if *size < 1 << 20 {
                    return Err(Error::Spec(format!(
                        "background {}: needs at least 1 MiB",
                        path.display()
                    )));
                }
            }
            Background::Cmd { .. } => {}
        }
    }
    Ok(())
}

/// `sh -c cmd` in its own process group (so the whole group can be killed), with its stdout
/// sent to our stderr: our stdout carries only the table or the JSON document, and commands
/// such as `snapblk merge` print progress there.
fn shell(cmd: &str) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()));
    c
}

fn file_len(f: &File) -> Result<u64> {
    use std::io::Seek;
    let mut g = f;
    Ok(g.seek(std::io::SeekFrom::End(0))?)
}

fn stream(f: File, len: u64, write: bool, stop: &AtomicBool, bytes: &AtomicU64) -> Result<()> {
    const CHUNK: usize = 1 << 20;
    let region = snapblk_core::MemRegion::alloc_private(CHUNK)?;
    // SAFETY: freshly allocated region used only by this thread.
    let buf = unsafe { region.as_mut_slice() };
    buf.fill(0x5a);
    let mut off = 0u64;
    let mut since_sync = 0u64;
    let res = (|| -> Result<()> {
        while !stop.load(Ordering::Relaxed) {
            if off + CHUNK as u64 > len {
                off = 0;
            }
            if write {
                f.write_all_at(buf, off)?;
                since_sync += CHUNK as u64;
                if since_sync >= 64 << 20 {
                    f.sync_data()?;
                    since_sync = 0;
                }
            } else {
                f.read_exact_at(buf, off)?;
            }
            off += CHUNK as u64;
            bytes.fetch_add(CHUNK as u64, Ordering::Relaxed);
        }
        Ok(())
    })();
    // SAFETY: allocated above; the slice is not used past this point.
    unsafe { region.free() };
    res
}

fn stop_background(mut bg: BgRunning) -> Result<Option<f64>> {
    bg.stop.store(true, Ordering::Relaxed);
    let secs = bg.start.elapsed().as_secs_f64();
    for (_, c) in &mut bg.children {
        kill_cmd(c);
    }
    let mut err = None;
    let had_streams = !bg.threads.is_empty();
    for (_, t) in bg.threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => err = Some(e),
            Err(_) => err = Some(Error::Other("background thread panicked".into())),
        }
    }
    if let Some(e) = err {
        return Err(e);
    }
    Ok(had_streams.then(|| bg.bytes.load(Ordering::Relaxed) as f64 / secs.max(1e-9)))
}

fn drop_caches() -> Result<()> {
    // SAFETY: sync(2) has no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|source| Error::IoOn {
        what: "drop_caches (needs root)".into(),
        source,
    })
}

/// The entries of a readahead list; errors name the list.
fn load_list(list: &Path) -> Result<Vec<snapblk_readahead::ListEntry>> {
    let text = std::fs::read(list).map_err(|source| Error::IoOn {
        what: format!("--fg-list {}", list.display()),
        source,
    })?;
    snapblk_readahead::parse_bytes(&text, Default::default()).map_err(|source| Error::List {
        path: list.to_owned(),
        source,
    })
}

/// Check a foreground read list before any cell runs: one warning per file that cannot be
/// opened (it is skipped), and an error when nothing in it can be read at all.
fn check_list(list: &Path) -> Result<Vec<String>> {
    let entries = load_list(list)?;
    let mut warnings = Vec::new();
    let mut readable = 0usize;
    for e in &entries {
        match File::open(&e.path).and_then(|f| f.metadata()) {
            Ok(m) if m.len() > 0 => readable += 1,
            Ok(_) => warnings.push(format!(
                "--fg-list {}: {} is empty (nothing to read)",
                list.display(),
                e.path.display()
            )),
            Err(err) => warnings.push(format!(
                "--fg-list {}: {}: {err} (skipped)",
                list.display(),
                e.path.display()
            )),
        }
    }
    if readable == 0 {
        return Err(Error::Spec(format!(
            "--fg-list {}: nothing to replay: none of its {} files can be read",
            list.display(),
            entries.len()
        )));
    }
    Ok(warnings)
}

/// Replay a readahead list as plain reads, recording per-read latencies; returns the bytes
/// read, or None when `stop` cut it short. Files that cannot be opened are skipped
/// ([`check_list`] warned about them), but a replay that reads nothing fails: its time would
/// be a measurement of nothing.
fn replay_list(list: &Path, h: &mut LatHist, stop: Option<&AtomicBool>) -> Result<Option<u64>> {
    let entries = load_list(list)?;
    let mut buf = vec![0u8; 128 << 10];
    let mut total = 0u64;
    for e in &entries {
        let Ok(f) = File::open(&e.path) else { continue };
        let size = f
            .metadata()
            .map_err(|source| Error::IoOn {
                what: e.path.display().to_string(),
                source,
            })?
            .len();
        for r in e.extent.resolve(size).ranges() {
            let mut off = r.offset;
            let end = r.offset + r.len;
            while off < end {
                if is_stopped(stop) {
                    return Ok(None);
                }
                let l = ((end - off) as usize).min(buf.len());
                let s = Instant::now();
                let n = f
                    .read_at(&mut buf[..l], off)
                    .map_err(|source| Error::IoOn {
                        what: format!("read {}", e.path.display()),
                        source,
                    })?;
                h.record(s.elapsed().as_nanos() as u64);
                if n == 0 {
                    break;
                }
                off += n as u64;
                total += n as u64;
            }
        }
    }
    if total == 0 {
        return Err(Error::Other(format!(
            "--fg-list {}: the replay read 0 bytes (its files are missing, empty or shorter \
             than its ranges)",
            list.display()
        )));
    }
    Ok(Some(total))
}

fn evict_list(list: &Path) -> Result<()> {
    for e in load_list(list)? {
        if let Ok(f) = File::open(&e.path) {
            crate::fileio::evict(&f);
        }
    }
    Ok(())
}

/// Run the foreground once: (seconds, latency histogram if any), or None when `stop` cut it
/// short (a foreground command is then killed and reaped).
fn run_foreground(
    spec: &FgBgSpec,
    target: &mut Option<&mut dyn Target>,
    stop: Option<&Arc<AtomicBool>>,
) -> Result<Option<(f64, Option<LatHist>)>> {
    if spec.drop_caches {
        drop_caches()?;
    }
    let stopped = || is_stopped(stop.map(|s| &**s));
    match &spec.foreground {
        Foreground::Cmd { cmd } => {
            let t0 = Instant::now();
            let mut c = spawn_cmd(cmd)?;
            loop {
                let st = match c.try_wait() {
                    Ok(st) => st,
                    Err(e) => {
                        kill_cmd(&mut c);
                        return Err(e.into());
                    }
                };
                if let Some(st) = st {
                    forget_cmd(&c);
                    if !st.success() {
                        return Err(Error::Other(format!("foreground command failed: {st}")));
                    }
                    break;
                }
                if stopped() {
                    kill_cmd(&mut c);
                    return Ok(None);
                }
                if t0.elapsed().as_secs_f64() > spec.fg_timeout {
                    kill_cmd(&mut c);
                    // Not a sample: its time would only be the timeout.
                    return Err(Error::Other(format!(
                        "foreground command `{cmd}` did not finish within --fg-timeout {} s",
                        spec.fg_timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(Some((t0.elapsed().as_secs_f64(), None)))
        }
        Foreground::ReadList { list } => {
            evict_list(list)?;
            let mut h = LatHist::default();
            let t0 = Instant::now();
            if replay_list(list, &mut h, stop.map(|s| &**s))?.is_none() {
                return Ok(None);
            }
            Ok(Some((t0.elapsed().as_secs_f64(), Some(h))))
        }
        Foreground::Workload { job } => {
            let t = target
                .as_deref_mut()
                .ok_or_else(|| Error::Spec("foreground workload needs a target".into()))?;
            let t0 = Instant::now();
            let opts = RunOpts {
                stop: stop.cloned(),
                ..RunOpts::default()
            };
            let r = run_workload(t, job, &opts)?;
            if stopped() {
                return Ok(None);
            }
            Ok(Some((t0.elapsed().as_secs_f64(), Some(r.lat()))))
        }
    }
}

/// One cell. When `stop` is set it ends early with the foreground runs completed so far (the
/// background is stopped and its commands reaped either way).
fn run_cell(
    spec: &FgBgSpec,
    dir: Option<&Path>,
    sched: Option<&String>,
    loaded: bool,
    target: &mut Option<&mut dyn Target>,
    stop: Option<&Arc<AtomicBool>>,
) -> Result<FgBgCell> {
    let stop_flag = stop.map(|s| &**s);
    let mut bg = if loaded {
        Some(start_background(spec)?)
    } else {
        None
    };
    // What the device runs with now, not what was asked for.
    let (active, tunables) = match dir {
        Some(d) => (
            context::scheduler(d).0,
            Some(context::scheduler_tunables(d)),
        ),
        None => (None, None),
    };
    let mut secs = Vec::new();
    let mut lat: Option<LatHist> = None;
    let mut res = Ok(());
    for i in 0..spec.iterations {
        let wait = if i == 0 {
            if loaded { spec.warmup } else { 0.0 }
        } else {
            spec.pause
        };
        if sleep_or_stop(wait, stop_flag) {
            break;
        }
        // Before and after every foreground run: the load must have been there all along.
        if let Some(Err(e)) = bg.as_mut().map(BgRunning::check) {
            res = Err(e);
            break;
        }
        let run = run_foreground(spec, target, stop);
        if let (Ok(Some(_)), Some(Err(e))) = (&run, bg.as_mut().map(BgRunning::check)) {
            res = Err(e);
            break;
        }
        match run {
            Ok(None) => break,
            Ok(Some((s, h))) => {
                secs.push(s);
                if let Some(h) = h {
                    lat.get_or_insert_with(LatHist::default).merge(&h);
                }
            }
            Err(e) => {
                res = Err(e);
                break;
            }
        }
    }
    let bg_rate = match bg {
        Some(b) => stop_background(b),
        None => Ok(None),
    };
    res?;
    let bg_rate = bg_rate?;
    Ok(FgBgCell {
        scheduler: active.or_else(|| sched.cloned()),
        scheduler_tunables: tunables,
        load: if loaded { "loaded" } else { "idle" }.into(),
        fg_median: crate::report::median(&secs).unwrap_or(0.0),
        fg_min: secs.iter().cloned().fold(f64::INFINITY, f64::min),
        fg_max: secs.iter().cloned().fold(0.0, f64::max),
        fg_seconds: secs,
        fg_lat_p50_ns: lat.as_ref().map(|h| h.percentile(50.0)),
        fg_lat_p99_ns: lat.as_ref().map(|h| h.percentile(99.0)),
        bg_bytes_per_s: bg_rate,
        slowdown: None,
    })
}

/// Run every (scheduler × {idle, loaded}) cell, interleaved per scheduler. The original
/// scheduler is restored afterwards.
///
/// Setting `stop` (e.g. on SIGINT) ends the test early: the running foreground command and
/// every background stream and command are killed and reaped, the scheduler is restored, and
/// the cells measured so far are returned (the one in progress only if it completed at least
/// one foreground run).
pub fn run_fgbg(
    spec: &FgBgSpec,
    mut target: Option<&mut dyn Target>,
    stop: Option<Arc<AtomicBool>>,
    mut log: impl FnMut(&str),
) -> Result<FgBgReport> {
    if spec.iterations == 0 {
        return Err(Error::Spec("iterations must be >= 1".into()));
    }
    let warnings = match &spec.foreground {
        Foreground::ReadList { list } => check_list(list)?,
        _ => Vec::new(),
    };
    check_background_inputs(spec)?;
    // Without --schedulers a device is optional: it only tells which scheduler the cells ran.
    let dir = match (&spec.device, spec.schedulers.is_empty()) {
        (Some(d), true) => context::block_dir_for(d),
        (None, true) => None,
        (Some(d), false) => Some(
            context::block_dir_for(d)
                .ok_or_else(|| Error::Spec(format!("{}: no block device queue", d.display())))?,
        ),
        (None, false) => return Err(Error::Spec("--schedulers needs --device".into())),
    };
    let switching = !spec.schedulers.is_empty();
    let original = dir
        .as_deref()
        .filter(|_| switching)
        .and_then(SchedState::capture);
    if let Some(o) = &original
        && let Ok(mut r) = RESTORE_SCHED.lock()
    {
        *r = Some(o.clone());
    }
    let scheds: Vec<Option<&String>> = if spec.schedulers.is_empty() {
        vec![None]
    } else {
        spec.schedulers.iter().map(Some).collect()
    };
    let stopped = || is_stopped(stop.as_deref());
    let mut cells: Vec<FgBgCell> = Vec::new();
    let res = (|| -> Result<()> {
        for s in scheds {
            if stopped() {
                break;
            }
            if let (Some(d), Some(name)) = (&dir, s) {
                context::set_scheduler(d, name).map_err(|source| Error::IoOn {
                    what: format!("set scheduler {name}"),
                    source,
                })?;
            }
            let mut idle_median = None;
            for loaded in [false, true] {
                let mut c = run_cell(spec, dir.as_deref(), s, loaded, &mut target, stop.as_ref())?;
                if c.fg_seconds.is_empty() {
                    break; // stopped before one foreground run completed
                }
                c.slowdown = match idle_median {
                    None => Some(1.0),
                    Some(i) => (i > 0.0).then(|| c.fg_median / i),
                };
                idle_median.get_or_insert(c.fg_median);
                log(&format!(
                    "{} {}: {:.3}s",
                    s.map_or("-", |v| v),
                    c.load,
                    c.fg_median
                ));
                cells.push(c);
                if stopped() {
                    break;
                }
            }
        }
        Ok(())
    })();
    if let Some(o) = &original {
        let _ = o.restore();
        if let Ok(mut r) = RESTORE_SCHED.lock() {
            *r = None;
        }
    }
    res?;
    Ok(FgBgReport {
        spec: spec.clone(),
        cells,
        warnings,
    })
}

/// Table: scheduler, load, foreground median [min–max], slowdown, latency, background rate.
pub fn fgbg_table(r: &FgBgReport) -> String {
    let mut rows = vec![
        [
            "scheduler",
            "load",
            "fg median",
            "[min-max]",
            "vs idle",
            "fg p50",
            "fg p99",
            "bg MiB/s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>(),
    ];
    for c in &r.cells {
        rows.push(vec![
            c.scheduler.clone().unwrap_or_else(|| "(current)".into()),
            c.load.clone(),
            format!("{:.3}s", c.fg_median),
            format!("[{:.3}-{:.3}]", c.fg_min, c.fg_max),
            c.slowdown.map_or("-".into(), |s| format!("{s:.2}x")),
            c.fg_lat_p50_ns.map_or("-".into(), |v| fmt_ns(v as f64)),
            c.fg_lat_p99_ns.map_or("-".into(), |v| fmt_ns(v as f64)),
            c.bg_bytes_per_s
                .map_or("-".into(), |b| format!("{:.0}", b / 1048576.0)),
        ]);
    }
    text_table(&rows)
}
