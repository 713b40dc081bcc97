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
//!
//! The pieces (private): `run` sets a replay up, lets its caller issue (pass 1:
//! `Shared::pass1` per entry on `parallel_for`'s submitters, or a tree walk's threads),
//! verifies (`verify::final_pass`) and writes the report (`Shared::report`). The back-off is
//! in `replay/pressure.rs`, the verification in `replay/verify.rs`.

mod pressure;
#[cfg(test)]
mod tests;
mod verify;

pub use pressure::{BackOff, BackOffWatch};

use crate::list::{Extent, FileIdentity, ListEntry};
use crate::ownstall;
use crate::residency::{self, Residency};
use crate::sys::{self, IoPrio};
use crate::sysstat::{self, DiskStat, DiskStatsChange, PsiSampler};
use crate::walk::{self, Found, LinkDedup, WalkError, WalkOptions};
use crate::{Range, RangeSet};
use pressure::{Pressure, StopMonitor};
use serde::Serialize;
use snapblk_core::sync::lock;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};
use verify::{FileCheck, FinalCheck, check_open, debug_absent};

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
    /// How chunks are brought into the cache (readahead(2), posix_fadvise(2), pread(2) or
    /// io_uring).
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
    /// Skip ranges already resident (measured before issuing) instead of requesting them again;
    /// default on.
    pub skip_resident: bool,
    /// I/O priority the submitter threads set with ioprio_set(2); default idle, `None` leaves the
    /// caller's.
    pub ioprio: Option<IoPrio>,
    /// nice(2) value the submitter threads set (-20..19); default 10, `None` leaves the caller's.
    pub nice: Option<i32>,
    /// Pause while the "some" I/O stall fraction exceeds this (0..1); `None` disables.
    pub psi_threshold: Option<f64>,
    /// The pressure file sampled for `psi_threshold` (default /proc/pressure/io; tests use a
    /// fake one).
    pub psi_path: PathBuf,
    /// Where the back-off reads device and own read counters to tell others' I/O from the
    /// replay's (default /proc/diskstats and /proc/self/io; tests use fakes).
    pub diskstats_path: PathBuf,
    /// The /proc/self/io read counters used with `diskstats_path` (tests use a fake).
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
    /// The entry's file, escaped like list paths in JSON.
    #[serde(serialize_with = "ser_path")]
    pub path: PathBuf,
    /// Why it was left out or flagged: what changed since recording, "missing: file not found",
    /// or the error text.
    pub reason: String,
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::list::escape_path(p))
}

/// The verified outcome of a replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    /// The method used, by name ("readahead", "fadvise", "pread", "uring").
    pub method: String,
    /// Bytes per request, as in [`ReplayOptions::chunk`].
    pub chunk: u64,
    /// Requests issued at once, as in [`ReplayOptions::queue_depth`].
    pub queue_depth: usize,
    /// Entries in the list, including duplicates, stale and missing ones.
    pub entries: u64,
    /// Files whose requested ranges were handled: issued, or found resident already.
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
    /// Entries that failed for another reason, with the error text (see `entries_failed`).
    pub errors: Vec<StaleEntry>,
    /// Bytes the list asks for (ranges clipped to the files' sizes).
    pub bytes_requested: u64,
    /// Of those, already resident before the replay.
    pub bytes_resident_before: u64,
    /// Bytes for which a request was issued (all passes).
    pub bytes_issued: u64,
    /// Requests (chunks of at most `chunk` bytes) issued over all passes.
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
    /// Passes over the files: 1, plus one per re-issue of pages found absent at verification.
    pub passes: u32,
    /// Times the replay paused because I/O pressure from others (PSI "some" of `psi_path`, less the
    /// replay's own share) exceeded `psi_threshold`.
    pub psi_pauses: u64,
    /// Seconds spent paused for I/O pressure.
    pub psi_paused_secs: f64,
    /// Seconds from start to the end of issuing the first pass.
    pub issue_secs: f64,
    /// From the end of issuing (pass 1) to the end of verification, including waiting for the
    /// last reads to arrive and any re-issue passes.
    pub settle_secs: f64,
    /// Every page present was up to date within `settle_timeout`, in every pass; `false` means
    /// verification may have run before the last reads arrived.
    pub settled: bool,
    /// Files verified by their submitter on the still-open fd while later files were issued.
    pub verified_inline: u64,
    /// Files left for the final verification (reopened and checked after issuing ended).
    pub final_checked: u64,
    /// Files whose absent pages were re-issued right after their check (counted per re-issue),
    /// rather than in a later pass.
    pub reissued_inline: u64,
    /// Seconds from start to the end of verification: the replay's whole wall-clock time.
    pub total_secs: f64,
    /// With `diskstats`: per device holding a replayed file, /proc/diskstats before and after
    /// the replay and the difference.
    pub diskstats: Option<Vec<DiskStatsChange>>,
    /// With `diskstats`: the differences alone (as in `diskstats[].delta`, except that
    /// `in_flight` here is the value after the replay); kept for readers of earlier reports.
    pub diskstats_delta: Option<Vec<DiskStat>>,
    /// Submitter threads actually used.
    pub threads: usize,
    /// Informational messages about how the replay ran (pressure monitor not started, priority not
    /// set, ...).
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

/// What the submitters, the pressure monitor and the final check of one run share.
struct Shared<'a> {
    opts: &'a ReplayOptions,
    /// The pressure back-off (see [`pressure`]).
    pressure: Pressure<'a>,
    /// Counts for the report.
    counts: Counters,
    /// Entries found changed or missing, and entries that failed.
    stale: Mutex<Vec<StaleEntry>>,
    errors: Mutex<Vec<StaleEntry>>,
    /// Files issued and not yet settled (see [`Prepared`]).
    prepared: Mutex<Vec<Prepared>>,
    lag: Lag,
    /// Tree warm-ups handle each multiply linked inode once.
    dedup: Option<LinkDedup>,
    t0: Instant,
}

/// When a submitter verifies a file it issued (see [`Shared::verify_aged`]).
struct Lag {
    /// Files a thread keeps open for deferred verification (bounded by RLIMIT_NOFILE).
    files: usize,
    /// Bytes issued behind a file before it is checked.
    bytes: u64,
}

/// The counts of a run that end up in its report.
#[derive(Default)]
struct Counters {
    issued_bytes: AtomicU64,
    requests: AtomicU64,
    /// Files pass 1 found wholly resident and issued nothing for, and their bytes: counted,
    /// not kept in `prepared`, since nothing about them is left to check. A resident tree of
    /// 60k files would otherwise hold 60k paths and range sets until the end (a tenth of a
    /// re-warm's time went to faulting in that memory).
    settled_files: AtomicU64,
    settled_bytes: AtomicU64,
    requested: AtomicU64,
    resident_before: AtomicU64,
    /// Entries pass 1 is done with.
    done: AtomicU64,
    changed: AtomicU64,
    missing: AtomicU64,
    duplicates: AtomicU64,
    verified_inline: AtomicU64,
    reissued_inline: AtomicU64,
    requeued: AtomicU64,
    /// Microseconds after `t0` at which the last submitter finished issuing pass 1.
    issue_end_us: AtomicU64,
}

impl<'a> Shared<'a> {
    fn new(
        opts: &'a ReplayOptions,
        tree: bool,
        lag_files: usize,
        watch: Option<BackOffWatch<'a>>,
        t0: Instant,
    ) -> Self {
        Shared {
            opts,
            pressure: Pressure::new(watch),
            counts: Counters::default(),
            stale: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            prepared: Mutex::new(Vec::new()),
            lag: Lag {
                files: lag_files,
                // About what the device queue can hold in small-file requests: by the time
                // this much more has been issued behind a file, its own reads are normally
                // done.
                bytes: (32 << 20).max(4 * opts.chunk),
            },
            dedup: tree.then(LinkDedup::default),
            t0,
        }
    }
}

impl Shared<'_> {
    fn issue(&self, f: &File, r: Range, ctx: &mut Ctx) -> std::io::Result<()> {
        let buf = &mut ctx.buf;
        self.pressure.wait();
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
        self.counts.issued_bytes.fetch_add(r.len, Relaxed);
        self.counts.requests.fetch_add(1, Relaxed);
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
        self.pressure.own.enroll();
        self.pressure.note_dev(meta.dev());
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
            self.counts.missing.fetch_add(1, Relaxed);
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
        self.pressure.own.enroll();
        if let Err(err) = self.pass1_inner(e, found, ctx) {
            self.record_problem(e.path, err);
        }
        let d = self.counts.done.fetch_add(1, Relaxed) + 1;
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
            self.counts.duplicates.fetch_add(1, Relaxed);
            return Ok(());
        }
        let now = FileIdentity::of(&meta);
        if let Some(id) = e.identity {
            let d = id.diff(&now);
            if !d.is_empty() {
                self.counts.changed.fetch_add(1, Relaxed);
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
        self.counts.requested.fetch_add(bytes, Relaxed);
        let (before, issued) = self.warm(&f, e.path, &meta, &ranges, ctx)?;
        if let Some(b) = before {
            self.counts.resident_before.fetch_add(b, Relaxed);
        }
        // Nothing issued because every range was found resident: that measurement is the
        // verification. Anything else is checked once its reads are done (inline on the open
        // fd, or in the final check).
        if !issued && before.is_some_and(|b| b >= bytes) {
            self.counts.settled_files.fetch_add(1, Relaxed);
            self.counts.settled_bytes.fetch_add(bytes, Relaxed);
            return Ok(());
        }
        // Deferred verification needs a measurable file (cachestat worked, so mincore is
        // trusted) and room for one more open fd.
        let defer = issued && before.is_some() && self.lag.files > 0;
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
            .is_some_and(|(_, behind)| *behind >= self.lag.bytes);
        if !(ready || ctx.recent.len() > self.lag.files) {
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
                self.counts.requeued.fetch_add(1, Relaxed);
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
            self.counts.reissued_inline.fetch_add(1, Relaxed);
            return Some(Issued {
                reissues: it.reissues + 1,
                ..it
            });
        }
        self.counts.verified_inline.fetch_add(1, Relaxed);
        None
    }

    /// End of a submitter thread: waits (bounded) for its deferred files on their open fds;
    /// what is still incomplete is left to the final verification.
    fn drain(&self, ctx: &mut Ctx) {
        let end = self.t0.elapsed().as_micros() as u64;
        self.counts.issue_end_us.fetch_max(end, Relaxed);
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
pub(crate) fn apply_priority(opts: &ReplayOptions) {
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
pub(crate) fn merge_duplicates(entries: &[ListEntry]) -> (Vec<ListEntry>, u64) {
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
#[cfg(test)]
pub(crate) fn replay(
    entries: &[ListEntry],
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
) -> ReplayReport {
    replay_watched(entries, opts, progress, None)
}

/// Replays `entries` (duplicates merged first) and returns the verified report, reporting the
/// pressure back-off to `watch` while issuing (see [`BackOff`]).
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
        shared.counts.duplicates.fetch_add(merged, Relaxed);
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

/// Warms every regular file under `roots` (whole files) while walking them: the walker threads
/// are the submitters, so issuing starts with the first file found instead of after the whole
/// walk, and directory reading overlaps the I/O. Returns the verified report and the paths
/// that could not be walked.
#[cfg(test)]
pub(crate) fn warm_tree(
    roots: &[PathBuf],
    walk_opts: &WalkOptions,
    opts: &ReplayOptions,
    progress: Option<Progress<'_>>,
) -> (ReplayReport, Vec<WalkError>) {
    warm_tree_watched(roots, walk_opts, opts, progress, None)
}

/// Warms every regular file under `roots` (whole files) while walking them: the walker threads
/// are the submitters, so issuing starts with the first file found instead of after the whole
/// walk, and directory reading overlaps the I/O. Returns the verified report and the paths
/// that could not be walked, and reports the pressure back-off to `watch` while issuing.
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
        (shared.counts.done.load(Relaxed), Vec::new())
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
    let fallback = uring_fallback(opts, &mut notes);
    let opts = fallback.as_ref().unwrap_or(opts);
    apply_priority(opts);
    let psi = open_psi(opts, &mut notes);
    let shared = Shared::new(opts, tree, lag_files, watch.filter(|_| psi.is_some()), t0);
    // The calling thread mostly waits for the submitters; its waits are not I/O stalls.
    shared.pressure.own.ignore_current();
    let disk_before = opts.diskstats.then(sysstat::diskstats);
    let stop_monitor = AtomicBool::new(false);

    std::thread::scope(|s| {
        // Pressure monitor: flips the back-off every 50 ms and tells the watch. Stopped by
        // `stop_guard`, also if anything below panics (the scope would wait for it forever).
        let mut stop_guard = StopMonitor(&stop_monitor, None);
        if let Some((th, psi)) = psi {
            match pressure::spawn_monitor(s, &shared.pressure, &stop_monitor, th, psi, opts) {
                Ok(t) => stop_guard.1 = Some(t),
                Err(e) => {
                    shared.pressure.forget_watch();
                    notes.push(format!("pressure monitor not started ({e}): no back-off"));
                }
            }
        }
        let (entries, feed_notes) = feed(&shared);
        // Issuing has ended: the watch hears `paused: false` and nothing more.
        shared.pressure.report(true);
        notes.extend(feed_notes);
        let issue_end =
            Duration::from_micros(shared.counts.issue_end_us.load(Relaxed)).min(t0.elapsed());
        let drained_at = t0.elapsed();
        let prepared = std::mem::take(&mut *lock(&shared.prepared));
        let checks = verify::final_pass(&shared, &prepared);
        drop(stop_guard);
        shared.report(RunEnd {
            entries,
            notes,
            prepared,
            checks,
            issue_end,
            drained_at,
            disk_before,
            tree,
        })
    })
}

/// With [`Method::Uring`] where io_uring cannot be set up: the options with readahead(2)
/// instead, and a note saying so.
fn uring_fallback(opts: &ReplayOptions, notes: &mut Vec<String>) -> Option<ReplayOptions> {
    if opts.method != Method::Uring {
        return None;
    }
    let e = crate::uring::Reader::new(1, 4096).err()?;
    notes.push(format!(
        "io_uring unavailable ({e}); used readahead(2) instead"
    ));
    Some(ReplayOptions {
        method: Method::Readahead,
        threads: None,
        ..opts.clone()
    })
}

/// The back-off threshold and the PSI file to sample, when the back-off is on and the file
/// readable (else a note says there is no back-off).
fn open_psi(opts: &ReplayOptions, notes: &mut Vec<String>) -> Option<(f64, PsiSampler)> {
    let psi = opts
        .psi_threshold
        .and_then(|th| Some((th, PsiSampler::open(&opts.psi_path)?)));
    if psi.is_none() && opts.psi_threshold.is_some() {
        notes.push(format!(
            "I/O pressure unavailable ({} unreadable): no back-off",
            opts.psi_path.display()
        ));
    }
    psi
}

/// What [`run`] hands to [`Shared::report`] once issuing and verification have ended.
struct RunEnd {
    /// Entries listed (or files a tree walk found).
    entries: u64,
    notes: Vec<String>,
    prepared: Vec<Prepared>,
    checks: FinalCheck,
    /// When the last submitter finished issuing pass 1, and when all had drained (after
    /// `t0`).
    issue_end: Duration,
    drained_at: Duration,
    disk_before: Option<Vec<DiskStat>>,
    tree: bool,
}

impl Shared<'_> {
    /// The report of a run that has ended.
    fn report(&self, end: RunEnd) -> ReplayReport {
        let RunEnd {
            entries,
            mut notes,
            prepared,
            checks,
            issue_end,
            drained_at,
            disk_before,
            tree,
        } = end;
        let (opts, c, t0) = (self.opts, &self.counts, self.t0);
        let (mut res_after, mut unverifiable) = (c.settled_bytes.load(Relaxed), 0u64);
        for (i, check) in checks.state.iter().enumerate() {
            match check {
                Some(check) if check.known => res_after += check.uptodate,
                _ => unverifiable += prepared[i].ranges.total_bytes(),
            }
        }
        let (diskstats, diskstats_delta) = match disk_before {
            Some(before) => {
                let (change, delta) = disk_report(&before, &self.pressure.devices(), &mut notes);
                (Some(change), Some(delta))
            }
            None => (None, None),
        };
        let req = c.requested.load(Relaxed);
        let verifiable = req.saturating_sub(unverifiable);
        let verified_inline = c.verified_inline.load(Relaxed);
        log::debug!(
            "verify: {verified_inline} files checked inline, {} re-queued while in flight, \
             {} left for the final check; submitters drained {:.3} s after issuing ended",
            c.requeued.load(Relaxed),
            checks.checked,
            (drained_at.saturating_sub(issue_end)).as_secs_f64()
        );
        let stale = std::mem::take(&mut *lock(&self.stale));
        let errors = std::mem::take(&mut *lock(&self.errors));
        let replayed = prepared.len() as u64 + c.settled_files.load(Relaxed);
        let duplicates = c.duplicates.load(Relaxed);
        let mut rep = ReplayReport {
            method: format!("{:?}", opts.method).to_lowercase(),
            chunk: opts.chunk,
            queue_depth: opts.queue_depth,
            threads: opts.submitters(),
            notes,
            entries,
            files_replayed: replayed,
            entries_stale: c.changed.load(Relaxed),
            entries_missing: c.missing.load(Relaxed),
            entries_failed: errors.len() as u64,
            entries_duplicate: duplicates,
            entries_not_replayed: entries.saturating_sub(replayed + duplicates),
            stale,
            errors,
            bytes_requested: req,
            bytes_resident_before: c.resident_before.load(Relaxed),
            bytes_issued: c.issued_bytes.load(Relaxed),
            requests_issued: c.requests.load(Relaxed),
            bytes_resident_after: res_after,
            bytes_unverifiable: unverifiable,
            resident_fraction: (verifiable > 0).then(|| res_after as f64 / verifiable as f64),
            warnings: Vec::new(),
            passes: checks.passes,
            psi_pauses: self.pressure.pauses.load(Relaxed),
            psi_paused_secs: self.pressure.paused_us.load(Relaxed) as f64 / 1e6,
            issue_secs: issue_end.as_secs_f64(),
            settle_secs: (t0.elapsed().saturating_sub(issue_end))
                .as_secs_f64()
                .max(checks.settle_secs),
            settled: checks.settled,
            verified_inline,
            final_checked: checks.checked,
            reissued_inline: c.reissued_inline.load(Relaxed),
            total_secs: t0.elapsed().as_secs_f64(),
            diskstats,
            diskstats_delta,
        };
        rep.warnings = shortfalls(&rep, tree, opts.allow_stale);
        rep
    }
}

/// /proc/diskstats now against `before`, for the devices `devs` that held replayed files
/// (change and delta); a note for each device that has no line there.
fn disk_report(
    before: &[DiskStat],
    devs: &[(u32, u32)],
    notes: &mut Vec<String>,
) -> (Vec<DiskStatsChange>, Vec<DiskStat>) {
    let after = sysstat::diskstats();
    let d = sysstat::diskstats_delta(before, &after, devs);
    let change = sysstat::diskstats_change(before, &after, devs);
    for (ma, mi) in devs {
        if !d.iter().any(|s| (s.major, s.minor) == (*ma, *mi)) {
            notes.push(format!(
                "diskstats: device {ma}:{mi} has no /proc/diskstats line \
                 (e.g. btrfs, overlayfs, tmpfs): its reads are not shown"
            ));
        }
    }
    (change, d)
}
