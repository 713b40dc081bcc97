//! Replay: bring the ranges of a list into the page cache, then prove it.
//!
//! Each range is split into chunks (2 MiB by default) because the kernel silently clips one
//! readahead(2)/WILLNEED call to the readahead window (`max(read_ahead_kb, max I/O size)`), so a
//! whole-file call leaves big files partly cold. Chunks already resident (cachestat) are skipped.
//! `queue_depth` submitter threads issue the chunks, so metadata reads (opens, extent lookups)
//! of different files overlap. The threads run at idle I/O priority and nice 10 by default and
//! pause while other tasks' I/O stall fraction (PSI minus their own, see [`crate::ownstall`]) is
//! above a threshold. Each submitter keeps
//! the files it issued open and verifies them (mincore, cachestat where incomplete) once more
//! I/O is queued behind them, re-issuing pages found absent at once; at the end it waits for its
//! last files on their fds. Only files that could not be checked that way are reopened and
//! verified after issuing; missing ranges are re-issued (up to `retries` passes) and the report
//! gives requested vs resident bytes. [`warm_tree`] does the same for whole trees, issuing
//! while walking.

use crate::list::{Extent, FileIdentity, ListEntry};
use crate::ownstall::{self, OwnStall};
use crate::ranges::{Range, RangeSet};
use crate::residency::{self, Residency};
use crate::sys::{self, IoPrio};
use crate::sysstat::{self, DiskStat, DiskStatsChange, PsiSampler};
use crate::walk::{self, Found, LinkDedup, WalkError, WalkOptions};
use serde::Serialize;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
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
    /// The pressure file sampled for `psi_threshold` (default /proc/pressure/io; tests use a
    /// fake one).
    pub psi_path: PathBuf,
    /// Where the back-off reads device and own read counters to tell others' I/O from the
    /// replay's (default /proc/diskstats and /proc/self/io; tests use fakes). See
    /// [`crate::ownstall::others`].
    pub diskstats_path: PathBuf,
    pub self_io_path: PathBuf,
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
            psi_path: PathBuf::from(sysstat::PSI_IO),
            diskstats_path: PathBuf::from("/proc/diskstats"),
            self_io_path: PathBuf::from("/proc/self/io"),
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
    /// Entries whose file identity changed since recording (replayed only with `allow_stale`).
    pub entries_stale: u64,
    /// Entries whose file no longer exists.
    pub entries_missing: u64,
    /// Entries that failed for another reason (unreadable, not a regular file, ...).
    pub entries_failed: u64,
    /// Entries that named a file already handled (hard links in trees, repeated list lines).
    pub entries_duplicate: u64,
    /// Entries neither replayed nor duplicates: stale (without `allow_stale`), missing, failed.
    pub entries_not_replayed: u64,
    /// Stale and missing entries (`reason` says which).
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
    /// `bytes_resident_after / (bytes_requested - bytes_unverifiable)`; `None` (JSON null)
    /// when no requested byte could be measured, e.g. nothing was requested because every
    /// entry was stale or missing. Never 1.0 for an empty replay.
    pub resident_fraction: Option<f64>,
    /// Why this replay may not have done what was asked (empty list, entries not replayed,
    /// nothing verifiable); empty when it did.
    pub warnings: Vec<String>,
    pub passes: u32,
    pub psi_pauses: u64,
    pub psi_paused_secs: f64,
    pub issue_secs: f64,
    /// From the end of issuing (pass 1) to the end of verification, including waiting for the
    /// last reads to arrive and any re-issue passes.
    pub settle_secs: f64,
    pub settled: bool,
    /// Files verified by their submitter on the still-open fd while later files were issued.
    pub verified_inline: u64,
    /// Files left for the final verification (reopened and checked after issuing ended).
    pub final_checked: u64,
    /// Files whose absent pages were re-issued right after their check (counted per re-issue),
    /// rather than in a later pass.
    pub reissued_inline: u64,
    pub total_secs: f64,
    /// With `diskstats`: per device holding a replayed file, /proc/diskstats before and after
    /// the replay and the difference.
    pub diskstats: Option<Vec<DiskStatsChange>>,
    /// With `diskstats`: the differences alone (as in `diskstats[].delta`, except that
    /// `in_flight` here is the value after the replay); kept for readers of earlier reports.
    pub diskstats_delta: Option<Vec<DiskStat>>,
    pub threads: usize,
    pub notes: Vec<String>,
}

impl ReplayReport {
    /// Entries that should have been replayed: all but repeats of a file already handled.
    pub fn entries_wanted(&self) -> u64 {
        self.entries.saturating_sub(self.entries_duplicate)
    }

    /// `Ok` if at least `pct` percent of the requested bytes are verified resident *and* at
    /// least `pct` percent of the entries were replayed. A replay with nothing measurable
    /// (nothing requested, or residency unknown) never passes: a list that is entirely stale
    /// or missing must not look like a successful warm-up.
    pub fn check_require(&self, pct: f64) -> Result<(), String> {
        let Some(f) = self.resident_fraction else {
            // Name every shortfall, the cause first: with bytes requested, that is their
            // unknown residency (an unprivileged caller), not entries that were not replayed;
            // with none, it is the entries (the warnings' own order).
            let mut why: Vec<String> = Vec::new();
            if self.bytes_requested > 0 {
                why.push(unknown_residency(self.bytes_requested));
            }
            for w in &self.warnings {
                if !why.contains(w) {
                    why.push(w.clone());
                }
            }
            if why.is_empty() {
                why.push("no requested byte is measurable".into());
            }
            return Err(format!(
                "required {pct}% resident, but nothing could be verified: {}",
                why.join("; ")
            ));
        };
        if f * 100.0 < pct {
            return Err(format!(
                "only {:.3}% of the requested bytes are resident (required {pct}%)",
                f * 100.0
            ));
        }
        let wanted = self.entries_wanted();
        if wanted > 0 {
            let share = self.files_replayed.min(wanted) as f64 * 100.0 / wanted as f64;
            if share < pct {
                return Err(format!(
                    "only {} of {wanted} entries were replayed ({share:.3}%, required {pct}%): \
                     {} stale, {} missing, {} failed",
                    self.files_replayed,
                    self.entries_stale,
                    self.entries_missing,
                    self.entries_failed
                ));
            }
        }
        Ok(())
    }
}

/// What a finished replay did not do, in words (see [`ReplayReport::warnings`]).
fn shortfalls(r: &ReplayReport, tree: bool, allow_stale: bool) -> Vec<String> {
    let mut w = Vec::new();
    let wanted = r.entries_wanted();
    if wanted == 0 {
        w.push(if tree {
            "no files found: nothing was warmed".to_string()
        } else {
            "the list has no entries: nothing was replayed".to_string()
        });
        return w;
    }
    if r.entries_not_replayed > 0 {
        let mut why = Vec::new();
        if r.entries_stale > 0 && !allow_stale {
            why.push(format!("{} stale", r.entries_stale));
        }
        if r.entries_missing > 0 {
            why.push(format!("{} missing", r.entries_missing));
        }
        if r.entries_failed > 0 {
            why.push(format!("{} failed", r.entries_failed));
        }
        w.push(format!(
            "{}{} of {wanted} entries were not replayed ({})",
            if r.files_replayed == 0 { "all " } else { "" },
            r.entries_not_replayed,
            why.join(", ")
        ));
    }
    if r.resident_fraction.is_none() {
        w.push(if r.bytes_requested == 0 {
            "0 bytes requested: nothing to verify".to_string()
        } else {
            unknown_residency(r.bytes_requested)
        });
    }
    w
}

/// The shortfall of a replay none of whose `requested` bytes could be measured.
fn unknown_residency(requested: u64) -> String {
    format!(
        "residency of all {requested} requested bytes is unknown (cannot be verified; \
         e.g. an unprivileged caller that neither owns nor may write the files)"
    )
}

struct Prepared {
    path: PathBuf,
    identity: FileIdentity,
    ranges: RangeSet,
    /// Verification result so far: set by the issuing thread on the still-open fd once the
    /// file's reads have completed, else by the final check. (Files that pass 1 found wholly
    /// resident are not kept at all: see `Shared::settled_files`.)
    check: Option<FileCheck>,
}

/// Progress callback: (entries done, entries total; 0 while a tree walk is still counting).
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// A file whose chunks were issued and whose verification is deferred until more I/O has been
/// queued behind it (by then its own reads have normally completed), so it is checked on the
/// fd that is still open: no second open/stat, and the check overlaps the issuing of later
/// files instead of forming a separate sweep at the end.
struct Issued {
    file: File,
    idx: usize,
    ranges: RangeSet,
    /// Times absent pages of this file were re-issued inline.
    reissues: u32,
}

struct Shared<'a> {
    opts: &'a ReplayOptions,
    paused: AtomicBool,
    /// Where the pressure monitor reports the back-off (see [`Shared::report_backoff`]).
    watch: Mutex<Watch<'a>>,
    /// The submitters, whose own I/O stalls the pressure back-off discounts.
    own: OwnStall,
    /// Devices (major, minor) holding the files issued so far, for the back-off's view of
    /// other readers; `last_dev` skips the lock while the device does not change.
    devs: Mutex<Vec<(u32, u32)>>,
    last_dev: AtomicU64,
    psi_pauses: AtomicU64,
    psi_paused_us: AtomicU64,
    issued_bytes: AtomicU64,
    requests: AtomicU64,
    stale: Mutex<Vec<StaleEntry>>,
    errors: Mutex<Vec<StaleEntry>>,
    prepared: Mutex<Vec<Prepared>>,
    /// Files pass 1 found wholly resident and issued nothing for, and their bytes: counted,
    /// not kept in `prepared`, since nothing about them is left to check. A resident tree of
    /// 60k files would otherwise hold 60k paths and range sets until the end (a tenth of a
    /// re-warm's time went to faulting in that memory).
    settled_files: AtomicU64,
    settled_bytes: AtomicU64,
    requested: AtomicU64,
    resident_before: AtomicU64,
    done: AtomicU64,
    changed: AtomicU64,
    missing: AtomicU64,
    duplicates: AtomicU64,
    /// Files a thread keeps open for deferred verification (bounded by RLIMIT_NOFILE).
    lag_files: usize,
    /// Bytes issued behind a file before it is checked.
    lag_bytes: u64,
    verified_inline: AtomicU64,
    reissued_inline: AtomicU64,
    requeued: AtomicU64,
    /// Tree warm-ups handle each multiply linked inode once.
    dedup: Option<LinkDedup>,
    t0: Instant,
    /// Microseconds after `t0` at which the last submitter finished issuing pass 1.
    issue_end_us: AtomicU64,
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
            ownstall::nap(Duration::from_millis(10));
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
        ctx.issued_since += r.len;
        self.issued_bytes.fetch_add(r.len, Relaxed);
        self.requests.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Issues the non-resident chunks of `ranges`; returns bytes found resident beforehand
    /// (`None` when residency is unknown) and whether anything was issued.
    fn warm(
        &self,
        f: &File,
        path: &Path,
        meta: &std::fs::Metadata,
        ranges: &RangeSet,
        buf: &mut Ctx,
    ) -> std::io::Result<(Option<u64>, bool)> {
        self.own.enroll();
        let dev = meta.dev();
        if self.last_dev.swap(dev, Relaxed) != dev
            && let Ok(mut v) = self.devs.lock()
        {
            let d = (libc::major(dev), libc::minor(dev));
            if !v.contains(&d) {
                v.push(d);
            }
        }
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

    fn record_problem(&self, path: &Path, err: std::io::Error) {
        let (reason, target) = if err.kind() == std::io::ErrorKind::NotFound {
            self.missing.fetch_add(1, Relaxed);
            ("missing: file not found".to_string(), &self.stale)
        } else {
            (err.to_string(), &self.errors)
        };
        if let Ok(mut v) = target.lock() {
            v.push(StaleEntry {
                path: path.to_path_buf(),
                reason,
            });
        }
    }

    /// Pass 1 for one entry: identity check, measure, issue, and queue the file for deferred
    /// verification.
    fn pass1(&self, e: &ListEntry, ctx: &mut Ctx, progress: Option<Progress<'_>>, total: u64) {
        self.pass1_found(e.into(), &Found::by_path(&e.path), ctx, progress, total);
    }

    /// [`Shared::pass1`] for a file a walk found: opened through `found` (relative to its
    /// directory when the walk has that open).
    fn pass1_found(
        &self,
        e: EntryRef<'_>,
        found: &Found<'_>,
        ctx: &mut Ctx,
        progress: Option<Progress<'_>>,
        total: u64,
    ) {
        self.own.enroll();
        if let Err(err) = self.pass1_inner(e, found, ctx) {
            self.record_problem(e.path, err);
        }
        let d = self.done.fetch_add(1, Relaxed) + 1;
        if let Some(p) = progress {
            p(d, total);
        }
    }

    fn pass1_inner(
        &self,
        e: EntryRef<'_>,
        found: &Found<'_>,
        ctx: &mut Ctx,
    ) -> std::io::Result<()> {
        let f = found.open_quiet()?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if meta.nlink() > 1
            && let Some(d) = &self.dedup
            && !d.first_visit(&meta)
        {
            self.duplicates.fetch_add(1, Relaxed);
            return Ok(());
        }
        let now = FileIdentity::of(&meta);
        if let Some(id) = e.identity {
            let d = id.diff(&now);
            if !d.is_empty() {
                self.changed.fetch_add(1, Relaxed);
                if let Ok(mut v) = self.stale.lock() {
                    v.push(StaleEntry {
                        path: e.path.to_path_buf(),
                        reason: format!("changed: {}", d.join(", ")),
                    });
                }
                if !self.opts.allow_stale {
                    return Ok(());
                }
            }
        }
        let ranges = page_ranges(&e.extent.resolve(meta.len()), meta.len()).clip(meta.len());
        let bytes = ranges.total_bytes();
        self.requested.fetch_add(bytes, Relaxed);
        let (before, issued) = self.warm(&f, e.path, &meta, &ranges, ctx)?;
        if let Some(b) = before {
            self.resident_before.fetch_add(b, Relaxed);
        }
        // Nothing issued because every range was found resident: that measurement is the
        // verification. Anything else is checked once its reads are done (inline on the open
        // fd, or in the final check).
        if !issued && before.is_some_and(|b| b >= bytes) {
            self.settled_files.fetch_add(1, Relaxed);
            self.settled_bytes.fetch_add(bytes, Relaxed);
            return Ok(());
        }
        // Deferred verification needs a measurable file (cachestat worked, so mincore is
        // trusted) and room for one more open fd.
        let defer = issued && before.is_some() && self.lag_files > 0;
        let keep = defer.then(|| ranges.clone());
        let idx = {
            let Ok(mut v) = self.prepared.lock() else {
                return Ok(());
            };
            v.push(Prepared {
                path: e.path.to_path_buf(),
                identity: now,
                ranges,
                check: None,
            });
            v.len() - 1
        };
        if let Some(ranges) = keep {
            ctx.issued_since = 0;
            ctx.recent.push_back((
                Issued {
                    file: f,
                    idx,
                    ranges,
                    reissues: 0,
                },
                0,
            ));
            self.verify_aged(ctx);
        }
        Ok(())
    }

    /// Checks the oldest deferred file once enough I/O is queued behind it (or the thread holds
    /// too many fds). A file still being read goes to the back for another round.
    fn verify_aged(&self, ctx: &mut Ctx) {
        for (_, behind) in ctx.recent.iter_mut() {
            *behind += ctx.issued_since;
        }
        ctx.issued_since = 0;
        let ready = ctx
            .recent
            .front()
            .is_some_and(|(_, behind)| *behind >= self.lag_bytes);
        if !(ready || ctx.recent.len() > self.lag_files) {
            return;
        }
        let Some((it, _)) = ctx.recent.pop_front() else {
            return;
        };
        match check_open(&it.file, &it.ranges) {
            Some(c) if c.uptodate >= c.present => {
                if let Some(it) = self.settle_one(it, c, ctx) {
                    ctx.recent.push_back((it, 0));
                }
            }
            Some(_) => {
                // Still in flight: look again after another lag's worth of I/O.
                self.requeued.fetch_add(1, Relaxed);
                ctx.recent.push_back((it, 0));
            }
            None => {} // left for the final verification
        }
    }

    /// Records a completed check. Pages found absent although their reads completed (seen
    /// under heavy load: the kernel's readahead is best effort and may skip or drop pages) are
    /// re-issued at once on the open fd, up to `retries` times per file; the file is then
    /// returned to be checked again.
    fn settle_one(&self, it: Issued, c: FileCheck, ctx: &mut Ctx) -> Option<Issued> {
        let mut path = None;
        if let Ok(mut v) = self.prepared.lock()
            && let Some(p) = v.get_mut(it.idx)
        {
            p.check = Some(c);
            if c.present < c.total {
                if log::log_enabled!(log::Level::Debug) {
                    debug_absent(&p.path, &it, &c);
                }
                path = Some(p.path.clone());
            }
        }
        if let Some(path) = path
            && it.reissues < self.opts.retries
            && let Ok(meta) = it.file.metadata()
            && self.warm(&it.file, &path, &meta, &it.ranges, ctx).is_ok()
        {
            self.reissued_inline.fetch_add(1, Relaxed);
            return Some(Issued {
                reissues: it.reissues + 1,
                ..it
            });
        }
        self.verified_inline.fetch_add(1, Relaxed);
        None
    }

    /// End of a submitter thread: waits (bounded) for its deferred files on their open fds;
    /// what is still incomplete is left to the final verification.
    fn drain(&self, ctx: &mut Ctx) {
        let end = self.t0.elapsed().as_micros() as u64;
        self.issue_end_us.fetch_max(end, Relaxed);
        if let Some(u) = &mut ctx.uring {
            let _ = u.drain();
        }
        while !ctx.window.is_empty() {
            ctx.retire_oldest();
        }
        let t = Instant::now();
        while let Some((it, _)) = ctx.recent.pop_front() {
            loop {
                match check_open(&it.file, &it.ranges) {
                    Some(c) if c.uptodate >= c.present => {
                        if let Some(it) = self.settle_one(it, c, ctx) {
                            ctx.recent.push_back((it, 0));
                        }
                        break;
                    }
                    Some(_) if t.elapsed() < self.opts.settle_timeout => {
                        ownstall::nap(Duration::from_millis(2))
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Per-thread state of the submitters.
struct Ctx {
    buf: Vec<u8>,
    uring: Option<crate::uring::Reader>,
    /// Chunks issued with readahead/fadvise whose pages may still be in flight (oldest first).
    window: std::collections::VecDeque<(File, Range)>,
    /// Files awaiting deferred verification, with the bytes issued after them.
    recent: std::collections::VecDeque<(Issued, u64)>,
    issued_since: u64,
}

impl Ctx {
    fn new(opts: &ReplayOptions) -> Ctx {
        Ctx {
            window: Default::default(),
            recent: Default::default(),
            issued_since: 0,
            buf: Vec::new(),
            uring: (opts.method == Method::Uring)
                .then(|| crate::uring::Reader::new(opts.queue_depth, opts.chunk).ok())
                .flatten(),
        }
    }

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
                Ok(n) if n < want => ownstall::nap(Duration::from_micros(500)),
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

/// Applies the replay's I/O priority and nice value to the calling thread (threads it creates
/// afterwards inherit them). Best effort: an unprivileged caller may not lower nice back or
/// pick RT; replay still works. Callers that do other work before replaying (a tree walk)
/// call it first so that work runs at the same low priority.
pub fn apply_priority(opts: &ReplayOptions) {
    if let Some(p) = opts.ioprio {
        let _ = sys::set_ioprio(p);
    }
    if let Some(n) = opts.nice {
        let _ = sys::set_nice(n);
    }
}

/// Runs `f(i)` for i in 0..n on `threads` threads (dynamic distribution), then `finish` on each
/// thread's context.
fn parallel_for(
    n: usize,
    threads: usize,
    opts: &ReplayOptions,
    f: impl Fn(usize, &mut Ctx) + Sync,
    finish: impl Fn(&mut Ctx) + Sync,
) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 256) {
            s.spawn(|| {
                apply_priority(opts);
                let mut buf = Ctx::new(opts);
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= n {
                        break;
                    }
                    f(i, &mut buf);
                }
                finish(&mut buf);
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

/// Open fds each submitter may keep for deferred verification: a share of RLIMIT_NOFILE
/// (leaving room for everything else), at most 1024.
fn lag_files(threads: usize) -> usize {
    let soft = sys::nofile_limit().unwrap_or(1024);
    (soft.saturating_sub(256) / (2 * threads.max(1) as u64)).min(1024) as usize
}

/// Merges entries that name the same path into one (union of their ranges; a whole-file
/// entry absorbs ranges), keeping the order of first appearance, so repeated lines are
/// requested, issued and counted once. Entries of one path with *different* identities are
/// kept apart (at most one of them can match the file). Returns the merged list and how many
/// entries were folded into an earlier one.
pub fn merge_duplicates(entries: &[ListEntry]) -> (Vec<ListEntry>, u64) {
    let mut out: Vec<ListEntry> = Vec::with_capacity(entries.len());
    let mut by_path: std::collections::HashMap<&Path, Vec<usize>> = Default::default();
    let mut merged = 0;
    'entries: for e in entries {
        if let Some(seen) = by_path.get(e.path.as_path()) {
            for &i in seen {
                let Some(o) = out.get_mut(i) else { continue };
                if o.identity.is_some() && e.identity.is_some() && o.identity != e.identity {
                    continue;
                }
                o.identity = o.identity.or(e.identity);
                o.extent = match (&o.extent, &e.extent) {
                    (Extent::Ranges(a), Extent::Ranges(b)) => {
                        Extent::Ranges(RangeSet::from_ranges(
                            a.ranges().iter().chain(b.ranges()).copied().collect(),
                        ))
                    }
                    _ => Extent::Whole,
                };
                merged += 1;
                continue 'entries;
            }
        }
        by_path.entry(e.path.as_path()).or_default().push(out.len());
        out.push(e.clone());
    }
    (out, merged)
}

/// Replays `entries` (duplicates merged first, see [`merge_duplicates`]) and returns the
/// verified report.
pub fn replay(
    entries: &[ListEntry],
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
) -> ReplayReport {
    replay_watched(entries, opts, progress, None)
}

/// [`replay`], reporting the pressure back-off to `watch` while issuing (see [`BackOff`]).
pub fn replay_watched(
    entries: &[ListEntry],
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
    watch: Option<BackOffWatch<'_>>,
) -> ReplayReport {
    let listed = entries.len() as u64;
    let (entries, merged) = merge_duplicates(entries);
    let entries = &entries;
    let total = entries.len() as u64;
    run(opts, false, lag_files(opts.submitters()), watch, |shared| {
        shared.duplicates.fetch_add(merged, Relaxed);
        parallel_for(
            entries.len(),
            shared.opts.submitters(),
            shared.opts,
            |i, ctx| shared.pass1(&entries[i], ctx, progress, total),
            |ctx| shared.drain(ctx),
        );
        (listed, Vec::new())
    })
}

/// The pressure back-off of a running replay, as reported to a [`BackOffWatch`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BackOff {
    /// Other tasks' I/O stall is above the threshold now: submitters are pausing (each pause
    /// lasts until it drops, at most 5 s, then one request goes out before the next check).
    pub paused: bool,
    /// Pauses begun so far.
    pub pauses: u64,
    /// Time spent in pauses that have ended.
    pub paused_secs: f64,
}

/// Called with the [`BackOff`] state whenever it changes, by the pressure monitor at its 50 ms
/// samples while issuing, plus a last call with `paused: false` when issuing ends (if that is a
/// change). Never called when the back-off is disabled or I/O pressure is unavailable. For
/// progress displays: under sustained outside pressure a replay crawls, and this is how a
/// terminal can say why.
pub type BackOffWatch<'a> = &'a (dyn Fn(BackOff) + Sync);

/// The watch of a running replay and the state it was last told; `to` is `None` without a
/// watch and once issuing has ended.
struct Watch<'a> {
    to: Option<BackOffWatch<'a>>,
    last: Option<BackOff>,
}

impl Shared<'_> {
    /// Tells the watch the back-off state if it changed since the last call. `end`: issuing
    /// has ended, so this is the last call (`paused: false`; later verification passes are
    /// not reported). The lock keeps the calls in order and none after the last.
    fn report_backoff(&self, end: bool) {
        let Ok(mut w) = self.watch.lock() else {
            return;
        };
        let Some(to) = w.to else {
            return;
        };
        let st = BackOff {
            paused: !end && self.paused.load(Relaxed),
            pauses: self.psi_pauses.load(Relaxed),
            paused_secs: self.psi_paused_us.load(Relaxed) as f64 / 1e6,
        };
        if w.last != Some(st) {
            to(st);
            w.last = Some(st);
        }
        if end {
            w.to = None;
        }
    }
}

/// Warms every regular file under `roots` (whole files) while walking them: the walker threads
/// are the submitters, so issuing starts with the first file found instead of after the whole
/// walk, and directory reading overlaps the I/O. Returns the verified report and the paths
/// that could not be walked.
pub fn warm_tree(
    roots: &[PathBuf],
    walk_opts: &WalkOptions,
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
) -> (ReplayReport, Vec<WalkError>) {
    warm_tree_watched(roots, walk_opts, opts, progress, None)
}

/// [`warm_tree`], reporting the pressure back-off to `watch` while issuing.
pub fn warm_tree_watched(
    roots: &[PathBuf],
    walk_opts: &WalkOptions,
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
    watch: Option<BackOffWatch<'_>>,
) -> (ReplayReport, Vec<WalkError>) {
    let mut walk_errors = Vec::new();
    let report = run(opts, true, lag_files(opts.submitters()), watch, |shared| {
        let w = WalkOptions {
            threads: shared.opts.submitters().clamp(1, 256),
            ..walk_opts.clone()
        };
        walk_errors = walk::walk_with(
            roots,
            &w,
            || {
                apply_priority(shared.opts);
                Ctx::new(shared.opts)
            },
            |found, ctx| {
                // Borrowed: most files of a resident tree are only counted, and need no copy
                // of their path.
                let e = EntryRef {
                    path: found.path(),
                    identity: None,
                    extent: &Extent::Whole,
                };
                shared.pass1_found(e, found, ctx, progress, 0);
            },
            |mut ctx| shared.drain(&mut ctx),
        );
        (shared.done.load(Relaxed), Vec::new())
    });
    (report, walk_errors)
}

/// What pass 1 needs of a list entry, borrowed: a tree walk's files have no entry of their own.
#[derive(Clone, Copy)]
struct EntryRef<'a> {
    path: &'a Path,
    identity: Option<&'a FileIdentity>,
    extent: &'a Extent,
}

impl<'a> From<&'a ListEntry> for EntryRef<'a> {
    fn from(e: &'a ListEntry) -> Self {
        EntryRef {
            path: &e.path,
            identity: e.identity.as_ref(),
            extent: &e.extent,
        }
    }
}

/// The engine shared by [`replay`] and [`warm_tree`]: `feed` runs pass 1 (issue + deferred
/// verification) and returns the number of entries; then whatever is unverified is checked
/// (waiting for reads in flight), absent ranges are re-issued up to `retries` times, and the
/// report is assembled.
/// The back-off's state changes go to `watch` while `feed` runs (see [`BackOffWatch`]).
fn run(
    opts: &ReplayOptions,
    tree: bool,
    lag_files: usize,
    watch: Option<BackOffWatch<'_>>,
    feed: impl FnOnce(&Shared<'_>) -> (u64, Vec<String>),
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
    let psi = opts
        .psi_threshold
        .and_then(|th| Some((th, PsiSampler::open(&opts.psi_path)?)));
    if psi.is_none() && opts.psi_threshold.is_some() {
        notes.push(format!(
            "I/O pressure unavailable ({} unreadable): no back-off",
            opts.psi_path.display()
        ));
    }
    let shared = Shared {
        opts,
        paused: AtomicBool::new(false),
        watch: Mutex::new(Watch {
            to: watch.filter(|_| psi.is_some()),
            last: None,
        }),
        own: OwnStall::default(),
        devs: Mutex::new(Vec::new()),
        last_dev: AtomicU64::new(u64::MAX),
        psi_pauses: AtomicU64::new(0),
        psi_paused_us: AtomicU64::new(0),
        issued_bytes: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        stale: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
        prepared: Mutex::new(Vec::new()),
        settled_files: AtomicU64::new(0),
        settled_bytes: AtomicU64::new(0),
        requested: AtomicU64::new(0),
        resident_before: AtomicU64::new(0),
        done: AtomicU64::new(0),
        changed: AtomicU64::new(0),
        missing: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
        lag_files,
        // About what the device queue can hold in small-file requests: by the time this much
        // more has been issued behind a file, its own reads are normally done.
        lag_bytes: (32 << 20).max(4 * opts.chunk),
        verified_inline: AtomicU64::new(0),
        reissued_inline: AtomicU64::new(0),
        requeued: AtomicU64::new(0),
        dedup: tree.then(LinkDedup::default),
        t0,
        issue_end_us: AtomicU64::new(0),
    };
    // The calling thread mostly waits for the submitters; its waits are not I/O stalls.
    shared.own.ignore_current();
    let disk_before = opts.diskstats.then(sysstat::diskstats);
    let stop_monitor = AtomicBool::new(false);

    std::thread::scope(|s| {
        // Pressure monitor: flips `paused` every 50 ms and tells the watch. Stopped by
        // `stop_guard`, also if anything below panics (the scope would wait for it forever).
        let mut stop_guard = StopMonitor(&stop_monitor, None);
        if let Some((th, mut psi)) = psi {
            let shared = &shared;
            let stop = &stop_monitor;
            // Baseline before anything is issued (see ForeignReads).
            let mut foreign = ownstall::ForeignReads::new(&opts.diskstats_path, &opts.self_io_path);
            let monitor = std::thread::Builder::new()
                .name(MONITOR_THREAD.into())
                .spawn_scoped(s, move || {
                    // The submitters' own stalls are discounted (see `ownstall`): a cold warm-up
                    // stalls on its own metadata reads and must not back off from itself.
                    let mut own = ownstall::Sampler::default();
                    // The first period only sets the samplers' baselines: deciding on it would
                    // take the whole figure as others' (one needless pause per thread at start).
                    let mut primed = false;
                    while !stop.load(Relaxed) {
                        // Parked, not asleep: the end of the replay wakes it at once instead of
                        // waiting out the period (up to 50 ms added to every run).
                        std::thread::park_timeout(Duration::from_millis(50));
                        let mine = own.sample(&shared.own);
                        let devs = shared.devs.lock().map(|v| v.clone()).unwrap_or_default();
                        let theirs = foreign.sample(&devs);
                        if let Some(f) = psi.sample() {
                            let o = ownstall::others(f, mine.as_deref(), theirs);
                            log::debug!(
                                "pressure {f:.3} own {mine:.3?} foreign {theirs:?} -> {o:.3}"
                            );
                            if primed {
                                shared.paused.store(o > th, Relaxed);
                            }
                            primed = true;
                        }
                        shared.report_backoff(false);
                    }
                    shared.paused.store(false, Relaxed);
                });
            match monitor {
                Ok(m) => stop_guard.1 = Some(m.thread().clone()),
                Err(e) => {
                    if let Ok(mut w) = shared.watch.lock() {
                        w.to = None;
                    }
                    notes.push(format!("pressure monitor not started ({e}): no back-off"));
                }
            }
        }
        let (total, feed_notes) = feed(&shared);
        // Issuing has ended: the watch hears `paused: false` and nothing more.
        shared.report_backoff(true);
        notes.extend(feed_notes);
        let issue_end = Duration::from_micros(shared.issue_end_us.load(Relaxed)).min(t0.elapsed());
        let issue_secs = issue_end.as_secs_f64();
        let drained_at = t0.elapsed();

        let prepared =
            std::mem::take(&mut *shared.prepared.lock().unwrap_or_else(|e| e.into_inner()));
        // Every file that reached the residency check registered its device there.
        let devs: Vec<(u32, u32)> = {
            let mut v = shared.devs.lock().map(|v| v.clone()).unwrap_or_default();
            v.sort_unstable();
            v
        };
        // Final verification of what the submitters could not settle. cachestat counts pages
        // that are merely present (a readahead in flight inserts them before the data
        // arrives); mincore counts only up-to-date pages. So: re-check until every present
        // page is up to date (or the settle timeout), then re-issue what is absent, up to
        // `retries` times.
        let mut state: Vec<Option<FileCheck>> = prepared.iter().map(|p| p.check).collect();
        let mut pending: Vec<usize> = (0..prepared.len())
            .filter(|&i| state[i].is_none_or(|c| c.known && c.uptodate < c.present))
            .collect();
        let final_checked = pending.len() as u64;
        let mut settle_total = 0.0;
        let mut settled = true;
        let mut passes = 1;
        loop {
            let t = Instant::now();
            loop {
                for (i, c) in check_files(&prepared, &pending, ps, opts.submitters()) {
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
            if log::log_enabled!(log::Level::Debug) {
                for &i in &absent {
                    if let Some(c) = state[i] {
                        log::debug!(
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
            parallel_for(
                absent.len(),
                opts.submitters(),
                opts,
                |k, buf| {
                    let p = &prepared[absent[k]];
                    if let Ok(f) = residency::open_quiet(&p.path)
                        && let Ok(meta) = f.metadata()
                    {
                        let _ = shared.warm(&f, &p.path, &meta, &p.ranges, buf);
                    }
                },
                |ctx| {
                    while !ctx.window.is_empty() {
                        ctx.retire_oldest();
                    }
                    if let Some(u) = &mut ctx.uring {
                        let _ = u.drain();
                    }
                },
            );
            pending = absent;
        }
        let (mut res_after, mut unverifiable) = (shared.settled_bytes.load(Relaxed), 0u64);
        for (i, c) in state.iter().enumerate() {
            match c {
                Some(c) if c.known => res_after += c.uptodate,
                _ => unverifiable += prepared[i].ranges.total_bytes(),
            }
        }
        drop(stop_guard);

        let disk_after = opts.diskstats.then(sysstat::diskstats);
        let req = shared.requested.load(Relaxed);
        let verifiable = req.saturating_sub(unverifiable);
        let verified_inline = shared.verified_inline.load(Relaxed);
        log::debug!(
            "verify: {verified_inline} files checked inline, {} re-queued while in flight, \
             {final_checked} left for the final check; submitters drained {:.3} s after \
             issuing ended",
            shared.requeued.load(Relaxed),
            (drained_at.saturating_sub(issue_end)).as_secs_f64()
        );
        let (diskstats, diskstats_delta) = match (disk_before, disk_after) {
            (Some(b), Some(a)) => {
                let d = sysstat::diskstats_delta(&b, &a, &devs);
                let change = sysstat::diskstats_change(&b, &a, &devs);
                for (ma, mi) in &devs {
                    if !d.iter().any(|s| (s.major, s.minor) == (*ma, *mi)) {
                        notes.push(format!(
                            "diskstats: device {ma}:{mi} has no /proc/diskstats line \
                             (e.g. btrfs, overlayfs, tmpfs): its reads are not shown"
                        ));
                    }
                }
                (Some(change), Some(d))
            }
            _ => (None, None),
        };
        let stale = std::mem::take(&mut *shared.stale.lock().unwrap_or_else(|e| e.into_inner()));
        let errors = std::mem::take(&mut *shared.errors.lock().unwrap_or_else(|e| e.into_inner()));
        let replayed = prepared.len() as u64 + shared.settled_files.load(Relaxed);
        let duplicates = shared.duplicates.load(Relaxed);
        let mut rep = ReplayReport {
            method: format!("{:?}", opts.method).to_lowercase(),
            chunk: opts.chunk,
            queue_depth: opts.queue_depth,
            threads: opts.submitters(),
            notes,
            entries: total,
            files_replayed: replayed,
            entries_stale: shared.changed.load(Relaxed),
            entries_missing: shared.missing.load(Relaxed),
            entries_failed: errors.len() as u64,
            entries_duplicate: duplicates,
            entries_not_replayed: total.saturating_sub(replayed + duplicates),
            stale,
            errors,
            bytes_requested: req,
            bytes_resident_before: shared.resident_before.load(Relaxed),
            bytes_issued: shared.issued_bytes.load(Relaxed),
            requests_issued: shared.requests.load(Relaxed),
            bytes_resident_after: res_after,
            bytes_unverifiable: unverifiable,
            resident_fraction: (verifiable > 0).then(|| res_after as f64 / verifiable as f64),
            warnings: Vec::new(),
            passes,
            psi_pauses: shared.psi_pauses.load(Relaxed),
            psi_paused_secs: shared.psi_paused_us.load(Relaxed) as f64 / 1e6,
            issue_secs,
            settle_secs: (t0.elapsed().saturating_sub(issue_end))
                .as_secs_f64()
                .max(settle_total),
            settled,
            verified_inline,
            final_checked,
            reissued_inline: shared.reissued_inline.load(Relaxed),
            total_secs: t0.elapsed().as_secs_f64(),
            diskstats,
            diskstats_delta,
        };
        rep.warnings = shortfalls(&rep, tree, opts.allow_stale);
        rep
    })
}

/// Name of the pressure monitor thread (the one that calls a [`BackOffWatch`] while issuing).
const MONITOR_THREAD: &str = "ra-pressure";

/// Stops the pressure monitor (if started) when dropped.
struct StopMonitor<'a>(&'a AtomicBool, Option<std::thread::Thread>);

impl Drop for StopMonitor<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
        if let Some(t) = &self.1 {
            // Wakes it from its 50 ms park at once.
            t.unpark();
        }
    }
}

/// Verification of a file on its open fd (trust in mincore was settled when pass 1 measured
/// it with cachestat): mincore gives the up-to-date pages; cachestat is asked only for ranges
/// mincore finds incomplete, to tell "still being read" from "absent". `None` if a call fails.
fn check_open(f: &File, ranges: &RangeSet) -> Option<FileCheck> {
    let ps = sys::page_size();
    let (mut uptodate, mut present) = (0, 0);
    for r in ranges.ranges() {
        let want = r.len.div_ceil(ps);
        let n = sys::mincore_count(f.as_fd(), r.offset, r.len).ok()?;
        uptodate += range_bytes(r, n, ps);
        if n >= want {
            present += r.len;
        } else {
            let cs = sys::cachestat(f.as_fd(), r.offset, r.len).ok()?;
            present += range_bytes(r, cs.cache.max(n), ps);
        }
    }
    Some(FileCheck {
        uptodate,
        present,
        total: ranges.total_bytes(),
        known: true,
    })
}

/// Bytes of `r` covered by `pages` resident pages (the last page may be partial).
fn range_bytes(r: &Range, pages: u64, ps: u64) -> u64 {
    if pages >= r.len.div_ceil(ps) {
        r.len
    } else {
        pages * ps
    }
}

/// Debug log: which pages of a file were found absent after its reads completed (mincore and
/// cachestat calls, so only when debug logging is on).
fn debug_absent(path: &Path, it: &Issued, c: &FileCheck) {
    let ps = sys::page_size();
    let size = it.file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut absent = Vec::new();
    let _ = sys::mincore_pages(it.file.as_fd(), size, |p, res| {
        if !res && absent.len() < 8 {
            absent.push(p * ps);
        }
    });
    // Evicted (shadow) entries tell "read, then reclaimed" from "never read".
    let cs = sys::cachestat(it.file.as_fd(), 0, 0).unwrap_or_default();
    log::debug!(
        "inline: {} of {} bytes absent after reads completed: {} (size {size}, first absent \
         offsets {absent:?}, ranges {:?}, cachestat {cs:?})",
        c.total - c.present,
        c.total,
        path.display(),
        it.ranges.ranges()
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakePressure;
    use std::io::Write;

    fn make_tree(tag: &str) -> PathBuf {
        let dir = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-tree-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        // Small files, one bigger than a chunk, an empty one and a hard link.
        for (name, len) in [
            ("a/one", 3000usize),
            ("a/b/two", 70_000),
            ("big", 5 << 20),
            ("empty", 0),
        ] {
            let mut f = File::create(dir.join(name)).unwrap();
            f.write_all(&vec![0x5a; len]).unwrap();
            f.sync_all().unwrap();
        }
        std::fs::hard_link(dir.join("a/one"), dir.join("a/b/link")).unwrap();
        dir
    }

    fn evict(dir: &Path) {
        let w = WalkOptions {
            recursive: true,
            ..Default::default()
        };
        walk::walk(&[dir.to_path_buf()], &w, |found| {
            if let Ok(f) = found.open_quiet() {
                let _ = sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        });
    }

    #[test]
    fn warm_tree_makes_everything_resident_and_verifies_inline() {
        let dir = make_tree("warm");
        evict(&dir);
        let w = WalkOptions {
            recursive: true,
            ..Default::default()
        };
        let opts = ReplayOptions {
            chunk: 1 << 20,
            psi_threshold: None,
            ..Default::default()
        };
        let (rep, errors) = warm_tree(std::slice::from_ref(&dir), &w, &opts, None);
        assert!(errors.is_empty(), "{errors:?}");
        // The hard link is the same inode as a/one: warmed once.
        assert_eq!(rep.files_replayed, 4);
        assert_eq!(rep.bytes_requested, 3000 + 70_000 + (5 << 20));
        assert_eq!(rep.bytes_resident_after, rep.bytes_requested);
        assert_eq!(rep.resident_fraction, Some(1.0));
        // Every issued file was checked by its submitter on the open fd, none reopened.
        assert_eq!(rep.final_checked, 0);
        assert_eq!(rep.verified_inline, 3);
        // Independent check with mincore on fresh fds, plus the pages the kernel may have
        // reclaimed since (shadow entries; the eviction above left none).
        for name in ["a/one", "a/b/two", "big"] {
            let f = File::open(dir.join(name)).unwrap();
            let len = f.metadata().unwrap().len();
            let pages = len.div_ceil(sys::page_size());
            let reclaimed = sys::cachestat(f.as_fd(), 0, 0).unwrap().evicted;
            assert_eq!(
                sys::mincore_count(f.as_fd(), 0, len).unwrap() + reclaimed,
                pages,
                "{name}"
            );
        }
        // A second warm-up finds everything resident and issues nothing but what the kernel
        // reclaimed meanwhile (a few pages at most).
        let (again, _) = warm_tree(std::slice::from_ref(&dir), &w, &opts, None);
        let ps = sys::page_size();
        assert!(again.bytes_resident_before + 64 * ps >= again.bytes_requested);
        assert_eq!(
            again.bytes_issued == 0,
            again.bytes_resident_before == again.bytes_requested
        );
        assert_eq!(again.resident_fraction, Some(1.0));
        // Files found resident are counted, not kept for the final check, and still reported.
        assert_eq!(again.files_replayed, 4);
        assert_eq!(again.bytes_requested, rep.bytes_requested);
        assert_eq!(again.bytes_resident_after, again.bytes_requested);
        assert_eq!(again.final_checked, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn deferred_check_with_no_spare_fds_falls_back_to_the_final_check() {
        // lag_files = 0 (as when RLIMIT_NOFILE leaves no room): nothing is checked inline, the
        // final verification reopens every file and still proves residency.
        let dir = make_tree("nofd");
        evict(&dir);
        let entries: Vec<ListEntry> = ["a/one", "a/b/two", "big"]
            .iter()
            .map(|n| ListEntry {
                path: dir.join(n),
                identity: None,
                extent: Extent::Whole,
            })
            .collect();
        let opts = ReplayOptions {
            psi_threshold: None,
            ..Default::default()
        };
        let rep = run(&opts, false, 0, None, |shared| {
            parallel_for(
                entries.len(),
                1,
                shared.opts,
                |i, ctx| shared.pass1(&entries[i], ctx, None, 3),
                |ctx| shared.drain(ctx),
            );
            (3, Vec::new())
        });
        assert_eq!(rep.verified_inline, 0);
        assert_eq!(rep.final_checked, 3);
        assert_eq!(rep.resident_fraction, Some(1.0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn entry(path: PathBuf, identity: Option<FileIdentity>) -> ListEntry {
        ListEntry {
            path,
            identity,
            extent: Extent::Whole,
        }
    }

    fn quiet() -> ReplayOptions {
        ReplayOptions {
            psi_threshold: None,
            ..Default::default()
        }
    }

    #[test]
    fn nothing_replayed_is_not_success() {
        let dir = make_tree("g1");
        // An empty list: n/a, a warning, --require fails.
        let rep = replay(&[], &quiet(), None);
        assert_eq!(rep.entries, 0);
        assert_eq!(rep.resident_fraction, None);
        assert!(
            rep.warnings.iter().any(|w| w.contains("no entries")),
            "{:?}",
            rep.warnings
        );
        assert!(rep.check_require(0.0).is_err());

        // After an "OTA": every entry is missing or changed.
        let f = File::open(dir.join("a/one")).unwrap();
        let mut id = FileIdentity::of(&f.metadata().unwrap());
        id.size += 1;
        let list = vec![
            entry(dir.join("gone1"), None),
            entry(dir.join("gone2"), None),
            entry(dir.join("a/one"), Some(id)),
        ];
        let rep = replay(&list, &quiet(), None);
        assert_eq!(rep.files_replayed, 0);
        assert_eq!(rep.entries_missing, 2);
        assert_eq!(rep.entries_stale, 1);
        assert_eq!(rep.entries_not_replayed, 3);
        assert_eq!(rep.bytes_requested, 0);
        assert_eq!(rep.resident_fraction, None);
        assert!(
            rep.warnings
                .iter()
                .any(|w| w.contains("all 3 of 3 entries were not replayed")
                    && w.contains("1 stale")
                    && w.contains("2 missing")),
            "{:?}",
            rep.warnings
        );
        let err = rep.check_require(99.5).unwrap_err();
        assert!(err.contains("nothing could be verified"), "{err}");

        // Half the list replayed: the bytes are all resident, but not every entry was
        // replayed, so a 99.5 % requirement fails while 50 % passes.
        let list = vec![
            entry(dir.join("a/b/two"), None),
            entry(dir.join("gone"), None),
        ];
        let rep = replay(&list, &quiet(), None);
        assert_eq!(rep.files_replayed, 1);
        assert_eq!(rep.resident_fraction, Some(1.0));
        assert_eq!(rep.entries_not_replayed, 1);
        assert!(!rep.warnings.is_empty());
        let err = rep.check_require(99.5).unwrap_err();
        assert!(err.contains("1 of 2 entries"), "{err}");
        assert!(rep.check_require(50.0).is_ok());

        // A complete replay has no warnings and passes.
        let rep = replay(&[entry(dir.join("big"), None)], &quiet(), None);
        assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
        assert!(rep.check_require(99.5).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Fake pressure inputs (see [`crate::fake`]) for the device holding `dir`'s files.
    fn fake_pressure(dir: &Path) -> FakePressure {
        FakePressure::start(dir, std::fs::metadata(dir.join("big")).unwrap().dev()).unwrap()
    }

    /// One submitter, no skipping, and the back-off at `threshold` reading `fake`.
    fn fake_options(fake: &FakePressure, threshold: Option<f64>) -> ReplayOptions {
        fake.options(ReplayOptions {
            threads: Some(1),
            skip_resident: false,
            psi_threshold: threshold,
            ..Default::default()
        })
    }

    /// The three non-empty files of [`make_tree`] as a whole-file list.
    fn tree_list(dir: &Path) -> Vec<ListEntry> {
        ["a/one", "a/b/two", "big"]
            .iter()
            .map(|n| entry(dir.join(n), None))
            .collect()
    }

    #[test]
    fn back_off_is_reported_to_the_watch_by_the_pressure_monitor() {
        let dir = make_tree("watch");
        let fake = fake_pressure(&dir);
        let list = tree_list(&dir);
        // Each call with the name of the thread that made it.
        let seen = Mutex::new(Vec::<(BackOff, Option<String>)>::new());
        let watch = |b: BackOff| {
            let name = std::thread::current().name().map(String::from);
            seen.lock().unwrap().push((b, name));
        };
        let stall = fake.staller();
        let progress = |done: u64, _: u64| {
            if done == 1 {
                // Other tasks stall 100 % of the time for 600 ms; idle (not an own stall)
                // for 300 ms so the monitor sees it before the next entry is issued.
                stall(Duration::from_millis(600));
                crate::ownstall::nap(Duration::from_millis(300));
            }
        };
        let caller = std::thread::current().name().map(String::from);
        let rep = replay_watched(
            &list,
            &fake_options(&fake, Some(0.6)),
            Some(&progress),
            Some(&watch),
        );
        let seen = seen.into_inner().unwrap();
        assert_eq!(rep.files_replayed, 3);
        assert!(rep.psi_pauses >= 1, "{rep:?}");
        let first_paused = seen.iter().position(|(b, _)| b.paused);
        assert!(first_paused.is_some(), "never reported paused: {seen:?}");
        // paused: true first, paused: false last, with the report's pause count and time
        // (all pauses happen while issuing unless a re-issue pass was needed).
        let (last, last_thread) = seen.last().cloned().unwrap_or_default();
        assert!(first_paused < Some(seen.len() - 1), "{seen:?}");
        assert!(!last.paused, "{seen:?}");
        if rep.passes == 1 {
            assert_eq!(last.pauses, rep.psi_pauses, "{seen:?} {rep:?}");
            assert_eq!(last.paused_secs, rep.psi_paused_secs, "{seen:?} {rep:?}");
        } else {
            assert!(
                last.pauses >= 1 && last.pauses <= rep.psi_pauses,
                "{seen:?}"
            );
        }
        assert!(last.paused_secs > 0.0, "{seen:?}");
        // Consecutive reports differ (sent on change only).
        assert!(seen.windows(2).all(|w| w[0].0 != w[1].0), "{seen:?}");
        // One polling thread: every call comes from the pressure monitor, except possibly
        // the final one, made by the replay's caller when issuing ends.
        let (body, _) = seen.split_at(seen.len() - 1);
        assert!(
            body.iter()
                .all(|(_, t)| t.as_deref() == Some(MONITOR_THREAD)),
            "{seen:?}"
        );
        assert!(
            last_thread.as_deref() == Some(MONITOR_THREAD) || last_thread == caller,
            "{last_thread:?} {seen:?}"
        );
        // No calls with the back-off disabled, or when the pressure file cannot be read.
        let calls = AtomicU64::new(0);
        let count = |_: BackOff| {
            calls.fetch_add(1, Relaxed);
        };
        let quiet_rep = replay_watched(&list, &quiet(), None, Some(&count));
        assert_eq!(quiet_rep.files_replayed, 3);
        let no_psi = ReplayOptions {
            psi_path: dir.join("nosuch"),
            ..fake_options(&fake, Some(0.6))
        };
        assert_eq!(
            replay_watched(&list, &no_psi, None, Some(&count)).files_replayed,
            3
        );
        assert_eq!(calls.load(Relaxed), 0);
        drop(fake);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn require_failure_names_the_real_shortfalls_cause_first() {
        // As an unprivileged caller: one entry missing, the other replayed but its residency
        // unknown. The failure is about the unknown residency; the missing entry comes second.
        let mut r = ReplayReport {
            entries: 2,
            files_replayed: 1,
            entries_missing: 1,
            entries_not_replayed: 1,
            bytes_requested: 8192,
            bytes_unverifiable: 8192,
            resident_fraction: None,
            ..Default::default()
        };
        r.warnings = shortfalls(&r, false, false);
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(r.warnings[0].contains("1 of 2 entries were not replayed"));
        let err = r.check_require(50.0).unwrap_err();
        let unknown = err.find("residency of all 8192 requested bytes is unknown");
        let missing = err.find("1 of 2 entries were not replayed (1 missing)");
        assert!(
            unknown.is_some() && missing.is_some() && unknown < missing,
            "{err}"
        );
        // Everything replayed, residency unknown: that alone is named.
        let mut r = ReplayReport {
            entries: 1,
            files_replayed: 1,
            bytes_requested: 4096,
            bytes_unverifiable: 4096,
            ..Default::default()
        };
        r.warnings = shortfalls(&r, false, false);
        let err = r.check_require(99.5).unwrap_err();
        assert!(err.contains("residency of all 4096"), "{err}");
        assert!(!err.contains("not replayed"), "{err}");
        // Nothing requested because nothing was replayed: the entries are the cause.
        let mut r = ReplayReport {
            entries: 3,
            entries_missing: 2,
            entries_stale: 1,
            entries_not_replayed: 3,
            ..Default::default()
        };
        r.warnings = shortfalls(&r, false, false);
        let err = r.check_require(99.5).unwrap_err();
        let entries = err.find("all 3 of 3 entries were not replayed (1 stale, 2 missing)");
        let nothing = err.find("0 bytes requested");
        assert!(
            entries.is_some() && nothing.is_some() && entries < nothing,
            "{err}"
        );
    }

    #[test]
    fn duplicate_entries_are_merged_and_counted_once() {
        let r = |o, l| Range::new(o, l).unwrap();
        let ranges = |v: Vec<Range>| Extent::Ranges(RangeSet::from_ranges(v));
        let id = |size| FileIdentity {
            dev_major: 1,
            dev_minor: 2,
            ino: 3,
            size,
            mtime_sec: 4,
            mtime_nsec: 5,
        };
        let e = |p: &str, identity, extent| ListEntry {
            path: PathBuf::from(p),
            identity,
            extent,
        };
        let list = vec![
            e("/a", None, ranges(vec![r(0, 4096)])),
            e("/b", Some(id(10)), ranges(vec![r(0, 10)])),
            e(
                "/a",
                Some(id(7)),
                ranges(vec![r(2048, 8192), r(65536, 4096)]),
            ),
            e("/b", Some(id(11)), ranges(vec![r(0, 11)])), // another identity: kept apart
            e("/a", None, ranges(vec![r(0, 4096)])),
            e("/c", None, Extent::Whole),
            e("/c", None, ranges(vec![r(0, 1)])),
        ];
        let (m, merged) = merge_duplicates(&list);
        assert_eq!(merged, 3);
        assert_eq!(
            m,
            vec![
                e("/a", Some(id(7)), ranges(vec![r(0, 10240), r(65536, 4096)])),
                e("/b", Some(id(10)), ranges(vec![r(0, 10)])),
                e("/b", Some(id(11)), ranges(vec![r(0, 11)])),
                e("/c", None, Extent::Whole),
            ]
        );

        // Replaying a file listed three times requests its bytes once.
        let dir = make_tree("dup");
        let two = dir.join("a/b/two");
        let list = vec![entry(two.clone(), None); 3];
        let rep = replay(&list, &quiet(), None);
        assert_eq!(rep.entries, 3);
        assert_eq!(rep.entries_duplicate, 2);
        assert_eq!(rep.files_replayed, 1);
        assert_eq!(rep.bytes_requested, 70_000);
        assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
        assert!(rep.check_require(99.5).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `replay` on a fresh thread (priorities are per thread and inherited, so the test
    /// harness thread is left alone) and returns the report.
    fn replay_on_new_thread(
        list: Vec<ListEntry>,
        opts: ReplayOptions,
        progress: impl Fn(u64, u64) + Sync + Send + 'static,
    ) -> ReplayReport {
        std::thread::spawn(move || replay(&list, &opts, Some(&progress)))
            .join()
            .unwrap()
    }

    #[test]
    fn submitters_run_at_idle_ioprio_and_nice_10_by_default() {
        let dir = make_tree("prio");
        let list: Vec<ListEntry> = ["a/one", "a/b/two", "big"]
            .iter()
            .map(|n| entry(dir.join(n), None))
            .collect();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let record = |seen: std::sync::Arc<Mutex<Vec<(i32, i32)>>>| {
            move |_: u64, _: u64| {
                // Called on the submitter thread right after it handled an entry.
                let p = (sys::get_ioprio().unwrap(), sys::get_nice().unwrap());
                seen.lock().unwrap().push(p);
            }
        };
        let opts = ReplayOptions {
            skip_resident: false,
            ..quiet()
        };
        let rep = replay_on_new_thread(list.clone(), opts.clone(), record(seen.clone()));
        assert_eq!(rep.files_replayed, 3);
        let got = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(got, vec![(IoPrio::Idle.raw(), 10); 3]);

        // Explicit settings are applied as given; `None` leaves the inherited values.
        let opts = ReplayOptions {
            ioprio: Some(IoPrio::BestEffort(2)),
            nice: None,
            ..opts
        };
        let inherited = std::thread::spawn(|| sys::get_nice().unwrap())
            .join()
            .unwrap();
        replay_on_new_thread(list, opts, record(seen.clone()));
        let got = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(got, vec![(IoPrio::BestEffort(2).raw(), inherited); 3]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn thread_count_follows_queue_depth_and_threads() {
        let dir = make_tree("threads");
        // Distinct paths (copies of a/one), so the list is not merged.
        let list: Vec<ListEntry> = (0..8)
            .map(|i| {
                let p = dir.join(format!("copy{i}"));
                std::fs::copy(dir.join("a/one"), &p).unwrap();
                entry(p, None)
            })
            .collect();
        for (queue_depth, threads, want) in [(3, None, 3usize), (5, Some(2), 2), (1, None, 1)] {
            let ids = std::sync::Arc::new(Mutex::new(std::collections::HashSet::new()));
            let seen = ids.clone();
            let progress = move |_: u64, _: u64| {
                seen.lock().unwrap().insert(std::thread::current().id());
                // Hold this entry until `want` submitters are busy at once (bounded), so a
                // fast thread cannot take every entry and hide the others.
                let t = Instant::now();
                while seen.lock().unwrap().len() < want && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            };
            let opts = ReplayOptions {
                queue_depth,
                threads,
                skip_resident: false,
                ..quiet()
            };
            let rep = replay_on_new_thread(list.clone(), opts, progress);
            assert_eq!(rep.threads, want);
            assert_eq!(
                ids.lock().unwrap().len(),
                want,
                "q {queue_depth} threads {threads:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replay_pauses_while_io_pressure_is_high() {
        let dir = make_tree("psi");
        let fake = fake_pressure(&dir);
        let list = tree_list(&dir);
        // `own_stall`: whether the submitter itself is blocked while the system stalls (as a
        // cold warm-up is on its metadata reads) or idle (the stall is someone else's).
        // `others_read`: whether someone else reads the tree's disk meanwhile.
        let run_with = |threshold: Option<f64>, own_stall: bool, others_read: bool| {
            fake.set_foreign(others_read);
            let stall = fake.staller();
            // After the first entry: the system stalls for 600 ms; stay on this entry for
            // 300 ms so the monitor (50 ms samples) sees it before the next entry issues.
            let progress = move |done: u64, _: u64| {
                if done == 1 {
                    stall(Duration::from_millis(600));
                    if own_stall {
                        // Blocked without saying so: to the sampler, like a stalled syscall.
                        std::thread::sleep(Duration::from_millis(300));
                    } else {
                        crate::ownstall::nap(Duration::from_millis(300));
                    }
                }
            };
            replay_on_new_thread(list.clone(), fake_options(&fake, threshold), progress)
        };
        let paused = run_with(Some(0.6), false, false);
        let ungated = run_with(None, false, false);
        let self_inflicted = run_with(Some(0.6), true, false);
        let shared_disk = run_with(Some(0.6), true, true);
        drop(fake);
        assert!(paused.psi_pauses >= 1, "{paused:?}");
        assert!(paused.psi_paused_secs > 0.0, "{paused:?}");
        assert_eq!(paused.files_replayed, 3);
        assert_eq!(ungated.psi_pauses, 0, "{ungated:?}");
        // The stall was the submitter's own: no back-off from itself.
        assert_eq!(self_inflicted.psi_pauses, 0, "{self_inflicted:?}");
        assert_eq!(self_inflicted.files_replayed, 3);
        // The submitter is blocked too, but someone else reads the same disk: their stall
        // cannot be told from ours, so the replay backs off.
        assert!(shared_disk.psi_pauses >= 1, "{shared_disk:?}");
        assert_eq!(shared_disk.files_replayed, 3);
        // A pressure file that cannot be read is reported, not silently ignored.
        let opts = ReplayOptions {
            psi_path: dir.join("nosuch"),
            ..Default::default()
        };
        let rep = replay_on_new_thread(list, opts, |_, _| {});
        assert!(
            rep.notes
                .iter()
                .any(|n| n.contains("I/O pressure unavailable")),
            "{:?}",
            rep.notes
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
