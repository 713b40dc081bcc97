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
}

/// Replay options; `Default` gives the recommended background-friendly settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub method: Method,
    /// Bytes per request; must stay below the kernel's readahead clip (8 MiB here).
    pub chunk: u64,
    /// Submitter threads (requests being issued at once).
    pub queue_depth: usize,
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

    fn issue(&self, f: &File, r: Range, buf: &mut Vec<u8>) -> std::io::Result<()> {
        self.wait_pressure();
        match self.opts.method {
            Method::Readahead => sys::readahead(f.as_fd(), r.offset, r.len)?,
            Method::Fadvise => sys::fadvise(f.as_fd(), r.offset, r.len, libc::POSIX_FADV_WILLNEED)?,
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
        buf: &mut Vec<u8>,
    ) -> std::io::Result<(Option<u64>, bool)> {
        let ps = sys::page_size();
        let mut resident = Some(0u64);
        let mut issued = false;
        for r in ranges.ranges() {
            let skip = self.opts.skip_resident;
            let whole = residency::measure(f, path, meta, Some(*r));
            let pages = r.len.div_ceil(ps);
            match whole {
                Residency::Known { resident_pages, .. } if resident_pages >= pages => {
                    resident = resident.map(|x| x + r.len);
                    if skip {
                        continue;
                    }
                }
                Residency::Known { .. } => {}
                Residency::Unknown { .. } => resident = None,
            }
            for c in r.chunks(self.opts.chunk) {
                if skip
                    && resident.is_some()
                    && let Residency::Known { resident_pages, .. } =
                        residency::measure(f, path, meta, Some(c))
                    && resident_pages >= c.len.div_ceil(ps)
                {
                    resident = resident.map(|x| x + c.len);
                    continue;
                }
                self.issue(f, c, buf)?;
                issued = true;
            }
        }
        Ok((resident, issued))
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
    f: impl Fn(usize, &mut Vec<u8>) + Sync,
) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 256) {
            s.spawn(|| {
                apply_priority(opts);
                let mut buf = Vec::new();
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= n {
                        break;
                    }
                    f(i, &mut buf);
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
        parallel_for(entries.len(), opts.queue_depth, opts, |i, buf| {
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
        let mut settle_total = 0.0;
        let mut settled = true;
        let mut passes = 1;
        let mut last: (u64, u64, Vec<usize>);
        loop {
            let (s_secs, ok) = settle(&devs, opts.settle_timeout, opts.method);
            settle_total += s_secs;
            settled &= ok;
            last = verify(&prepared, ps, opts.queue_depth, true);
            if last.2.is_empty() || passes > opts.retries {
                break;
            }
            // Re-issue what is still missing.
            passes += 1;
            let missing = &last.2;
            parallel_for(missing.len(), opts.queue_depth, opts, |k, buf| {
                let p = &prepared[missing[k]];
                if let Ok(f) = residency::open_quiet(&p.path)
                    && let Ok(meta) = f.metadata()
                {
                    let _ = shared.warm(&f, &p.path, &meta, &p.ranges, buf);
                }
            });
        }
        stop_monitor.store(true, Relaxed);

        let disk_after = opts.diskstats.then(sysstat::diskstats);
        let (res_after, unverifiable, _) = last;
        let req = requested.load(Relaxed);
        let verifiable = req.saturating_sub(unverifiable);
        ReplayReport {
            method: format!("{:?}", opts.method).to_lowercase(),
            chunk: opts.chunk,
            queue_depth: opts.queue_depth,
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

/// Waits until the devices have no reads in flight (readahead completes asynchronously).
/// Returns (seconds waited, drained).
fn settle(devs: &[(u32, u32)], timeout: Duration, method: Method) -> (f64, bool) {
    let t = Instant::now();
    if method == Method::Pread {
        return (0.0, true);
    }
    loop {
        let busy = devs
            .iter()
            .any(|&(ma, mi)| sysstat::reads_in_flight(ma, mi).is_some_and(|n| n > 0));
        if !busy {
            return (t.elapsed().as_secs_f64(), true);
        }
        if t.elapsed() >= timeout {
            return (t.elapsed().as_secs_f64(), false);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Re-measures the prepared ranges. Returns (resident bytes, unverifiable bytes, indices of
/// files with missing pages).
fn verify(
    prepared: &[Prepared],
    ps: u64,
    threads: usize,
    trust_pass1: bool,
) -> (u64, u64, Vec<usize>) {
    let debug = std::env::var_os("SNAPBLK_RA_DEBUG").is_some();
    let resident = AtomicU64::new(0);
    let unverifiable = AtomicU64::new(0);
    let missing = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 64) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(p) = prepared.get(i) else { break };
                    let total = p.ranges.total_bytes();
                    if trust_pass1 && let Some(b) = p.verified_resident {
                        resident.fetch_add(b, Relaxed);
                        continue;
                    }
                    let Ok(f) = residency::open_quiet(&p.path) else {
                        unverifiable.fetch_add(total, Relaxed);
                        continue;
                    };
                    let Ok(meta) = f.metadata() else { continue };
                    if FileIdentity::of(&meta) != p.identity {
                        unverifiable.fetch_add(total, Relaxed);
                        continue;
                    }
                    let mut ok = 0u64;
                    let mut known = true;
                    for r in p.ranges.ranges() {
                        match residency::measure(&f, &p.path, &meta, Some(*r)) {
                            Residency::Known { resident_pages, .. } => {
                                let pages = r.len.div_ceil(ps);
                                ok += if resident_pages >= pages {
                                    r.len
                                } else {
                                    resident_pages * ps
                                };
                            }
                            Residency::Unknown { .. } => known = false,
                        }
                    }
                    if !known {
                        unverifiable.fetch_add(total, Relaxed);
                        continue;
                    }
                    resident.fetch_add(ok, Relaxed);
                    if ok < total
                        && let Ok(mut m) = missing.lock()
                    {
                        if debug {
                            eprintln!(
                                "missing {} of {total} bytes: {}",
                                total - ok,
                                p.path.display()
                            );
                        }
                        m.push(i);
                    }
                }
            });
        }
    });
    let mut m = missing.into_inner().unwrap_or_default();
    m.sort_unstable();
    (resident.load(Relaxed), unverifiable.load(Relaxed), m)
}
