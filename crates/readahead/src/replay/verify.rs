//! Verification: is what a replay issued now in the page cache? A submitter checks its files on
//! the fds it still holds ([`check_open`]); what it could not settle is reopened and checked at
//! the end ([`check_files`]), and [`final_pass`] waits for reads still in flight and re-issues
//! what is absent, up to `retries` times.

use super::{Issued, Prepared, Shared, parallel_for};
use crate::list::FileIdentity;
use crate::residency::{self, Residency};
use crate::sys;
use crate::{Range, RangeSet};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Verification of a file on its open fd (trust in mincore was settled when pass 1 measured
/// it with cachestat): mincore gives the up-to-date pages; cachestat is asked only for ranges
/// mincore finds incomplete, to tell "still being read" from "absent". `None` if a call fails.
pub(super) fn check_open(f: &File, ranges: &RangeSet) -> Option<FileCheck> {
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
pub(super) fn debug_absent(path: &Path, it: &Issued, c: &FileCheck) {
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
pub(super) struct FileCheck {
    /// Up to date in the page cache (mincore).
    pub uptodate: u64,
    /// Present, possibly still being read (cachestat).
    pub present: u64,
    pub total: u64,
    /// False when residency cannot be measured (or the file changed/vanished).
    pub known: bool,
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

/// What the final verification found.
pub(super) struct FinalCheck {
    /// The last check of each prepared file (`None`: it could not be checked).
    pub state: Vec<Option<FileCheck>>,
    /// Files left for the final check (not settled by their submitter).
    pub checked: u64,
    /// Passes over the files (1, plus one per re-issue of absent pages).
    pub passes: u32,
    /// Every present page was up to date before the settle timeout, in every pass.
    pub settled: bool,
    /// Time spent waiting for reads in flight.
    pub settle_secs: f64,
}

/// Final verification of what the submitters could not settle. cachestat counts pages that
/// are merely present (a readahead in flight inserts them before the data arrives); mincore
/// counts only up-to-date pages. So: re-check until every present page is up to date (or the
/// settle timeout), then re-issue what is absent, up to `retries` times.
pub(super) fn final_pass(shared: &Shared<'_>, prepared: &[Prepared]) -> FinalCheck {
    let opts = shared.opts;
    let mut state: Vec<Option<FileCheck>> = prepared.iter().map(|p| p.check).collect();
    let mut pending: Vec<usize> = (0..prepared.len())
        .filter(|&i| state[i].is_none_or(|c| c.known && c.uptodate < c.present))
        .collect();
    let checked = pending.len() as u64;
    let mut settle_secs = 0.0;
    let mut settled = true;
    let mut passes = 1;
    loop {
        let t = Instant::now();
        settled &= settle(prepared, &mut pending, &mut state, shared);
        settle_secs += t.elapsed().as_secs_f64();
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
        reissue(shared, prepared, &absent);
        pending = absent;
    }
    FinalCheck {
        state,
        checked,
        passes,
        settled,
        settle_secs,
    }
}

/// Re-checks the `pending` files until none has present pages that are not up to date yet;
/// false if the settle timeout ended the wait first.
fn settle(
    prepared: &[Prepared],
    pending: &mut Vec<usize>,
    state: &mut [Option<FileCheck>],
    shared: &Shared<'_>,
) -> bool {
    let opts = shared.opts;
    let ps = sys::page_size();
    let t = Instant::now();
    loop {
        for (i, c) in check_files(prepared, pending, ps, opts.submitters()) {
            state[i] = Some(c);
        }
        pending.retain(|&i| state[i].is_some_and(|c| c.known && c.uptodate < c.present));
        if pending.is_empty() {
            return true;
        }
        if t.elapsed() >= opts.settle_timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Re-issues the `absent` files (reopened) on the submitters, and waits for their reads.
fn reissue(shared: &Shared<'_>, prepared: &[Prepared], absent: &[usize]) {
    let opts = shared.opts;
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
}
