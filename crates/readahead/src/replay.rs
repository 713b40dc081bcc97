//! Replay: bring the ranges of a list into the page cache, then prove it.
//!
//! Each range is split into chunks (2 MiB by default) because the kernel silently clips one
//! readahead(2)/WILLNEED call to the readahead window (`max(read_ahead_kb, max I/O size)`), so a
//! whole-file call leaves big files partly cold. Chunks already resident (cachestat) are skipped.
//! `queue_depth` submitter threads issue the chunks, so metadata reads (opens, extent lookups)
//! of different files overlap. The threads run at idle I/O priority and nice 10 by default and
//! pause while the system's I/O stall fraction (PSI) is above a threshold. When everything is
//! issued, the engine waits for the devices' in-flight reads to drain, re-measures what is
//! resident with cachestat, re-issues what is missing (up to `retries` times) and reports
//! requested vs resident bytes.

use crate::list::{FileIdentity, ListEntry};
use crate::ranges::{Range, RangeSet};
use crate::residency::{self, Residency};
use crate::sys::{self, IoPrio};
use crate::sysstat::{self, DiskStat, PsiSampler};
use serde::Serialize;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How a chunk is brought in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// readahead(2) per chunk.
    Readahead,
    /// posix_fadvise(POSIX_FADV_WILLNEED) per chunk.
    Fadvise,
    /// pread(2) into a scratch buffer per chunk: synchronous, so completion is known exactly.
    Pread,
    /// io_uring buffered reads, `queue_depth` in flight per submitter thread.
    Uring,
}

/// Replay options; `Default` gives the recommended background-friendly settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub method: Method,
    /// Bytes per request; must stay below the kernel's readahead clip (8 MiB here).
    pub chunk: u64,
    /// Requests issued at once: submitter threads for readahead/fadvise/pread, reads in flight
    /// per thread for io_uring.
    pub queue_depth: usize,
    /// Submitter threads; `None`: `queue_depth` (syscall methods) or 2 (io_uring).
    pub threads: Option<usize>,
    /// readahead/fadvise: at most this many chunks per thread may be outstanding (not yet up to
    /// date); `None` leaves it to the kernel (fastest, but floods the device queue).
    pub max_inflight: Option<usize>,
    pub skip_resident: bool,
    pub ioprio: Option<IoPrio>,
    pub nice: Option<i32>,
    /// Pause while the "some" I/O stall fraction exceeds this (0..1); `None` disables.
    pub psi_threshold: Option<f64>,
    /// Longest wait for in-flight reads to drain before verifying.
    pub settle_timeout: Duration,
    /// Passes re-issuing ranges found missing at verification.
    pub retries: u32,
    /// Replay entries whose identity changed (they are reported either way).
    pub allow_stale: bool,
    /// Collect /proc/diskstats before and after.
    pub diskstats: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            method: Method::Readahead,
            chunk: 2 << 20,
            queue_depth: 4,
            threads: None,
            max_inflight: None,
            skip_resident: true,
            ioprio: Some(IoPrio::Idle),
            nice: Some(10),
            psi_threshold: Some(0.6),
            settle_timeout: Duration::from_secs(10),
            retries: 2,
            allow_stale: false,
            diskstats: false,
        }
    }
}

/// An entry that was not replayed (or replayed with `allow_stale`) because the file changed.
#[derive(Debug, Clone, Serialize)]
pub struct StaleEntry {
    #[serde(serialize_with = "ser_path")]
    pub path: PathBuf,
    pub reason: String,
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::list::escape_path(p))
}

/// The verified outcome of a replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub method: String,
    pub chunk: u64,
    pub queue_depth: usize,
    pub entries: u64,
    pub files_replayed: u64,
    pub stale: Vec<StaleEntry>,
    pub errors: Vec<StaleEntry>,
    /// Bytes the list asks for (ranges clipped to the files' sizes).
    pub bytes_requested: u64,
    /// Of those, already resident before the replay.
    pub bytes_resident_before: u64,
    /// Bytes for which a request was issued (all passes).
    pub bytes_issued: u64,
    pub requests_issued: u64,
    /// Of the requested bytes, resident at the end (re-measured).
    pub bytes_resident_after: u64,
    /// Requested bytes whose residency could not be measured (e.g. unprivileged caller).
    pub bytes_unverifiable: u64,
    pub resident_fraction: f64,
    pub passes: u32,
    pub psi_pauses: u64,
    pub psi_paused_secs: f64,
    pub issue_secs: f64,
    pub settle_secs: f64,
    pub settled: bool,
    pub total_secs: f64,
    pub diskstats_delta: Option<Vec<DiskStat>>,
    pub threads: usize,
    pub notes: Vec<String>,
}

struct Prepared {
    path: PathBuf,
    identity: FileIdentity,
    ranges: RangeSet,
    /// Set when pass 1 found every range resident and issued nothing: that measurement is the
    /// verification, so the file is not reopened.
    verified_resident: Option<u64>,
}

/// Progress callback: (entries done, entries total).
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

struct Shared<'a> {
    opts: &'a ReplayOptions,
    paused: AtomicBool,
    psi_pauses: AtomicU64,
    psi_paused_us: AtomicU64,
    issued_bytes: AtomicU64,
    requests: AtomicU64,
}

impl Shared<'_> {
    fn wait_pressure(&self) {
        if !self.paused.load(Relaxed) {
            return;
        }
        let t = Instant::now();
        self.psi_pauses.fetch_add(1, Relaxed);
        // Bounded so a permanently busy system still gets its warm-up eventually.
        while self.paused.load(Relaxed) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.psi_paused_us
            .fetch_add(t.elapsed().as_micros() as u64, Relaxed);
    }

    fn issue(&self, f: &File, r: Range, ctx: &mut Ctx) -> std::io::Result<()> {
        let buf = &mut ctx.buf;
        self.wait_pressure();
        match self.opts.method {
            Method::Readahead | Method::Fadvise => {
                if let Some(limit) = self.opts.max_inflight {
                    while ctx.window.len() >= limit.max(1) {
                        ctx.retire_oldest();
                    }
                }
                if self.opts.method == Method::Readahead {
                    sys::readahead(f.as_fd(), r.offset, r.len)?
                } else {
                    sys::fadvise(f.as_fd(), r.offset, r.len, libc::POSIX_FADV_WILLNEED)?
                }
                if self.opts.max_inflight.is_some() {
                    ctx.window.push_back((f.try_clone()?, r));
                }
            }
            Method::Uring => match &mut ctx.uring {
                Some(u) => u.read(f, r.offset, r.len)?,
                None => return Err(std::io::Error::other("io_uring unavailable")),
            },
            Method::Pread => {
                use std::os::unix::fs::FileExt;
                buf.resize(r.len as usize, 0);
                let mut done = 0usize;
                while done < buf.len() {
                    match f.read_at(&mut buf[done..], r.offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        self.issued_bytes.fetch_add(r.len, Relaxed);
        self.requests.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Issues the non-resident chunks of `ranges`; returns bytes found resident beforehand
    /// (`None` when residency is unknown).
    fn warm(
        &self,
        f: &File,
        path: &Path,
        meta: &std::fs::Metadata,
        ranges: &RangeSet,
        buf: &mut Ctx,
    ) -> std::io::Result<(Option<u64>, bool)> {
        // Measure everything first, then issue: a read of one chunk may trigger kernel
        // readahead into the next, which must not count as "resident before".
        let ps = sys::page_size();
        let mut resident = Some(0u64);
        let mut todo = Vec::new();
        for r in ranges.ranges() {
            let pages = r.len.div_ceil(ps);
            match residency::measure(f, path, meta, Some(*r)) {
                Residency::Known { resident_pages, .. } if resident_pages >= pages => {
                    resident = resident.map(|x| x + r.len);
                    if !self.opts.skip_resident {
                        todo.extend(r.chunks(self.opts.chunk));
                    }
                }
                Residency::Known {
                    resident_pages: 0, ..
                } => todo.extend(r.chunks(self.opts.chunk)),
                Residency::Known { .. } => {
                    for c in r.chunks(self.opts.chunk) {
                        let full = matches!(residency::measure(f, path, meta, Some(c)),
                            Residency::Known { resident_pages, .. } if resident_pages >= c.len.div_ceil(ps));
                        if full {
                            resident = resident.map(|x| x + c.len);
                        }
                        if !full || !self.opts.skip_resident {
                            todo.push(c);
                        }
                    }
                }
                Residency::Unknown { .. } => {
                    resident = None;
                    todo.extend(r.chunks(self.opts.chunk));
                }
            }
        }
        if !todo.is_empty() && matches!(self.opts.method, Method::Pread | Method::Uring) {
            // Reads would otherwise trigger kernel readahead beyond the listed ranges.
            let _ = sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
        let issued = !todo.is_empty();
        for c in todo {
            self.issue(f, c, buf)?;
        }
        Ok((resident, issued))
    }
}

/// Per-thread state of the submitters.
struct Ctx {
    buf: Vec<u8>,
    uring: Option<crate::uring::Reader>,
    /// Chunks issued with readahead/fadvise whose pages may still be in flight (oldest first).
    window: std::collections::VecDeque<(File, Range)>,
}

impl Ctx {
    /// Waits (bounded) until the oldest outstanding chunk is up to date. readahead(2) returns
    /// before the I/O completes; this is what turns the thread count into a real bound on the
    /// bytes in flight, so a background replay cannot flood the device queue.
    fn retire_oldest(&mut self) {
        let Some((f, r)) = self.window.pop_front() else {
            return;
        };
        let ps = sys::page_size();
        let want = r.len.div_ceil(ps);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            match sys::mincore_count(f.as_fd(), r.offset, r.len) {
                Ok(n) if n < want => std::thread::sleep(Duration::from_micros(200)),
                _ => break,
            }
        }
    }
}

impl ReplayOptions {
    fn submitters(&self) -> usize {
        self.threads.unwrap_or(if self.method == Method::Uring {
            2
        } else {
            self.queue_depth
        })
    }
}

fn apply_priority(opts: &ReplayOptions) {
    // Best effort: an unprivileged caller may not lower nice back or pick RT; replay still works.
    if let Some(p) = opts.ioprio {
        let _ = sys::set_ioprio(p);
    }
    if let Some(n) = opts.nice {
        let _ = sys::set_nice(n);
    }
}

/// Runs `f(i)` for i in 0..n on `threads` threads (dynamic distribution).
fn parallel_for(
    n: usize,
    threads: usize,
    opts: &ReplayOptions,
    f: impl Fn(usize, &mut Ctx) + Sync,
) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 256) {
            s.spawn(|| {
                apply_priority(opts);
                let mut buf = Ctx {
                    window: Default::default(),
                    buf: Vec::new(),
                    uring: (opts.method == Method::Uring)
                        .then(|| crate::uring::Reader::new(opts.queue_depth, opts.chunk).ok())
                        .flatten(),
                };
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= n {
                        break;
                    }
                    f(i, &mut buf);
                }
                if let Some(u) = &mut buf.uring {
                    let _ = u.drain();
                }
            });
        }
    });
}

fn page_ranges(rs: &RangeSet, size: u64) -> RangeSet {
    let ps = sys::page_size();
    let limit = size.next_multiple_of(ps);
    RangeSet::from_ranges(
        rs.ranges()
            .iter()
            .filter_map(|r| r.page_align(ps).clip(limit))
            .collect(),
    )
}

/// Replays `entries` and returns the verified report.
pub fn replay(
    entries: &[ListEntry],
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
) -> ReplayReport {
    let t0 = Instant::now();
    let mut notes = Vec::new();
    let fallback;
    let opts = if opts.method == Method::Uring
        && let Err(e) = crate::uring::Reader::new(1, 4096)
    {
        notes.push(format!(
            "io_uring unavailable ({e}); used readahead(2) instead"
        ));
        fallback = ReplayOptions {
            method: Method::Readahead,
            threads: None,
            ..opts.clone()
        };
        &fallback
    } else {
        opts
    };
    apply_priority(opts);
    let ps = sys::page_size();
    let shared = Shared {
        opts,
        paused: AtomicBool::new(false),
        psi_pauses: AtomicU64::new(0),
        psi_paused_us: AtomicU64::new(0),
        issued_bytes: AtomicU64::new(0),
        requests: AtomicU64::new(0),
    };
    let disk_before = opts.diskstats.then(sysstat::diskstats);
    let stale = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    let prepared = Mutex::new(Vec::<Prepared>::new());
    let requested = AtomicU64::new(0);
    let resident_before = AtomicU64::new(0);
    let unverifiable_before = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let stop_monitor = AtomicBool::new(false);
    let total = entries.len() as u64;

    std::thread::scope(|s| {
        // Pressure monitor: flips `paused` every 50 ms.
        if let Some(th) = opts.psi_threshold
            && let Some(mut psi) = PsiSampler::new()
        {
            let shared = &shared;
            let stop = &stop_monitor;
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    if let Some(f) = psi.sample() {
                        shared.paused.store(f > th, Relaxed);
                    }
                }
                shared.paused.store(false, Relaxed);
            });
        }
        parallel_for(entries.len(), opts.submitters(), opts, |i, buf| {
            let e = &entries[i];
            let res = (|| -> std::io::Result<()> {
                let f = residency::open_quiet(&e.path)?;
                let meta = f.metadata()?;
                if !meta.is_file() {
                    return Err(std::io::Error::other("not a regular file"));
                }
                let now = FileIdentity::of(&meta);
                if let Some(id) = &e.identity {
                    let d = id.diff(&now);
                    if !d.is_empty() {
                        if let Ok(mut v) = stale.lock() {
                            v.push(StaleEntry {
                                path: e.path.clone(),
                                reason: format!("changed: {}", d.join(", ")),
                            });
                        }
                        if !opts.allow_stale {
                            return Ok(());
                        }
                    }
                }
                let ranges = page_ranges(&e.extent.resolve(meta.len()), meta.len());
                let bytes = ranges.clip(meta.len()).total_bytes();
                requested.fetch_add(bytes, Relaxed);
                let clipped = ranges.clip(meta.len());
                let (before, issued) = shared.warm(&f, &e.path, &meta, &clipped, buf)?;
                match before {
                    Some(b) => {
                        resident_before.fetch_add(b, Relaxed);
                    }
                    None => {
                        unverifiable_before.fetch_add(bytes, Relaxed);
                    }
                }
                if let Ok(mut v) = prepared.lock() {
                    v.push(Prepared {
                        path: e.path.clone(),
                        identity: now,
                        ranges: clipped,
                        verified_resident: before.filter(|_| !issued),
                    });
                }
                Ok(())
            })();
            if let Err(err) = res {
                let reason = if err.kind() == std::io::ErrorKind::NotFound {
                    "missing: file not found".to_string()
                } else {
                    err.to_string()
                };
                let target = if err.kind() == std::io::ErrorKind::NotFound {
                    &stale
                } else {
                    &errors
                };
                if let Ok(mut v) = target.lock() {
                    v.push(StaleEntry {
                        path: e.path.clone(),
                        reason,
                    });
                }
            }
            let d = done.fetch_add(1, Relaxed) + 1;
            if let Some(p) = progress {
                p(d, total);
            }
        });
        let issue_secs = t0.elapsed().as_secs_f64();

        let prepared = prepared.into_inner().unwrap_or_default();
        let devs: Vec<(u32, u32)> = {
            let mut v: Vec<_> = prepared
                .iter()
                .map(|p| (p.identity.dev_major, p.identity.dev_minor))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        // Verification. cachestat counts pages that are merely present (a readahead in flight
        // inserts them before the data arrives); mincore counts only up-to-date pages. So:
        // re-check until every present page is up to date (or the settle timeout), then
        // re-issue what is absent, up to `retries` times.
        let mut state: Vec<Option<FileCheck>> = prepared
            .iter()
            .map(|p| {
                p.verified_resident.map(|b| FileCheck {
                    uptodate: b,
                    present: b,
                    total: p.ranges.total_bytes(),
                    known: true,
                })
            })
            .collect();
        let mut pending: Vec<usize> = (0..prepared.len())
            .filter(|&i| state[i].is_none())
            .collect();
        let mut settle_total = 0.0;
        let mut settled = true;
        let mut passes = 1;
        loop {
            let t = Instant::now();
            loop {
                for (i, c) in check_files(&prepared, &pending, ps, opts.queue_depth) {
                    state[i] = Some(c);
                }
                pending.retain(|&i| state[i].is_some_and(|c| c.known && c.uptodate < c.present));
                if pending.is_empty() {
                    break;
                }
                if t.elapsed() >= opts.settle_timeout {
                    settled = false;
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            settle_total += t.elapsed().as_secs_f64();
            let absent: Vec<usize> = (0..prepared.len())
                .filter(|&i| state[i].is_some_and(|c| c.known && c.present < c.total))
                .collect();
            if debug_enabled() {
                for &i in &absent {
                    if let Some(c) = state[i] {
                        eprintln!(
                            "pass {passes}: {} of {} bytes absent: {}",
                            c.total - c.present,
                            c.total,
                            prepared[i].path.display()
                        );
                    }
                }
            }
            if absent.is_empty() || passes > opts.retries {
                break;
            }
            passes += 1;
            parallel_for(absent.len(), opts.submitters(), opts, |k, buf| {
                let p = &prepared[absent[k]];
                if let Ok(f) = residency::open_quiet(&p.path)
                    && let Ok(meta) = f.metadata()
                {
                    let _ = shared.warm(&f, &p.path, &meta, &p.ranges, buf);
                }
            });
            pending = absent;
        }
        let (mut res_after, mut unverifiable) = (0u64, 0u64);
        for (i, c) in state.iter().enumerate() {
            match c {
                Some(c) if c.known => res_after += c.uptodate,
                _ => unverifiable += prepared[i].ranges.total_bytes(),
            }
        }
        stop_monitor.store(true, Relaxed);

        let disk_after = opts.diskstats.then(sysstat::diskstats);
        let req = requested.load(Relaxed);
        let verifiable = req.saturating_sub(unverifiable);
        ReplayReport {
            method: format!("{:?}", opts.method).to_lowercase(),
            chunk: opts.chunk,
            queue_depth: opts.queue_depth,
            threads: opts.submitters(),
            notes,
            entries: total,
            files_replayed: prepared.len() as u64,
            stale: stale.into_inner().unwrap_or_default(),
            errors: errors.into_inner().unwrap_or_default(),
            bytes_requested: req,
            bytes_resident_before: resident_before.load(Relaxed),
            bytes_issued: shared.issued_bytes.load(Relaxed),
            requests_issued: shared.requests.load(Relaxed),
            bytes_resident_after: res_after,
            bytes_unverifiable: unverifiable,
            resident_fraction: if verifiable == 0 {
                if req == 0 { 1.0 } else { 0.0 }
            } else {
                res_after as f64 / verifiable as f64
            },
            passes,
            psi_pauses: shared.psi_pauses.load(Relaxed),
            psi_paused_secs: shared.psi_paused_us.load(Relaxed) as f64 / 1e6,
            issue_secs,
            settle_secs: settle_total,
            settled,
            total_secs: t0.elapsed().as_secs_f64(),
            diskstats_delta: match (disk_before, disk_after) {
                (Some(b), Some(a)) => Some(sysstat::diskstats_delta(&b, &a, &devs)),
                _ => None,
            },
        }
    })
}

fn debug_enabled() -> bool {
    std::env::var_os("SNAPBLK_RA_DEBUG").is_some()
}

/// Verification state of one file, in bytes of its requested ranges.
#[derive(Debug, Clone, Copy)]
struct FileCheck {
    /// Up to date in the page cache (mincore).
    uptodate: u64,
    /// Present, possibly still being read (cachestat).
    present: u64,
    total: u64,
    /// False when residency cannot be measured (or the file changed/vanished).
    known: bool,
}

fn check_file(p: &Prepared, ps: u64) -> FileCheck {
    let total = p.ranges.total_bytes();
    let unknown = FileCheck {
        uptodate: 0,
        present: 0,
        total,
        known: false,
    };
    let Ok(f) = residency::open_quiet(&p.path) else {
        return unknown;
    };
    let Ok(meta) = f.metadata() else {
        return unknown;
    };
    if FileIdentity::of(&meta) != p.identity {
        return unknown;
    }
    let bytes = |r: &Range, pages: u64| {
        if pages >= r.len.div_ceil(ps) {
            r.len
        } else {
            pages * ps
        }
    };
    let (mut uptodate, mut present) = (0, 0);
    for r in p.ranges.ranges() {
        // measure() settles trust: where it succeeds, mincore tells the truth for this file.
        let Residency::Known { resident_pages, .. } =
            residency::measure(&f, &p.path, &meta, Some(*r))
        else {
            return unknown;
        };
        present += bytes(r, resident_pages);
        match sys::mincore_count(f.as_fd(), r.offset, r.len) {
            Ok(n) => uptodate += bytes(r, n),
            Err(_) => return unknown,
        }
    }
    FileCheck {
        uptodate,
        present,
        total,
        known: true,
    }
}

/// Checks the files `idx` of `prepared` on a few threads.
fn check_files(
    prepared: &[Prepared],
    idx: &[usize],
    ps: u64,
    threads: usize,
) -> Vec<(usize, FileCheck)> {
    let out = Mutex::new(Vec::with_capacity(idx.len()));
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 64) {
            s.spawn(|| {
                let mut local = Vec::new();
                loop {
                    let k = next.fetch_add(1, Relaxed);
                    let Some(&i) = idx.get(k) else { break };
                    if let Some(p) = prepared.get(i) {
                        local.push((i, check_file(p, ps)));
                    }
                }
                if let Ok(mut o) = out.lock() {
                    o.extend(local);
                }
            });
        }
    });
    out.into_inner().unwrap_or_default()
}
