//! Eviction of files from the page cache (to make cold runs reproducible).

use crate::residency::{self, Residency};
use crate::sys;
use crate::walk::{self, LinkDedup, WalkError, WalkOptions};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Mutex;

/// What stayed resident after eviction (mapped, locked or re-read pages), per file.
#[derive(Debug, Clone)]
pub struct Remaining {
    /// The file that kept pages in the cache.
    pub path: PathBuf,
    /// Pages (of the system page size) the file spans (its size rounded up); how many of them
    /// stayed is in `residency`.
    pub pages: u64,
    /// The residency re-measured after the last eviction attempt (cachestat(2) or mincore(2)):
    /// pages that stayed (mapped, mlocked), or why it cannot be known.
    pub residency: Residency,
}

/// Result of an eviction run.
#[derive(Debug, Clone, Default)]
pub struct EvictReport {
    /// Files opened for eviction (fdatasync, then posix_fadvise(2) `POSIX_FADV_DONTNEED`), hard
    /// links counted once.
    pub files: u64,
    /// Pages (of the system page size) those files span, i.e. what was asked to be dropped, not
    /// what actually left the cache (see `remaining`).
    pub pages: u64,
    /// Files that still have resident pages (or unknown residency) after eviction.
    pub remaining: Vec<Remaining>,
    /// Paths that could not be walked, opened, synced or advised, with the error text.
    pub errors: Vec<WalkError>,
}

impl EvictReport {
    /// Pages still resident in the files whose residency could be checked; see
    /// [`EvictReport::unknown_files`] for those that could not.
    pub fn remaining_pages(&self) -> u64 {
        self.remaining
            .iter()
            .filter_map(|r| r.residency.resident_pages())
            .sum()
    }

    /// Evicted files whose residency afterwards cannot be measured (e.g. an unprivileged
    /// caller): [`EvictReport::remaining_pages`] says nothing about them.
    pub fn unknown_files(&self) -> u64 {
        self.remaining
            .iter()
            .filter(|r| r.residency.resident_pages().is_none())
            .count() as u64
    }
}

/// How often a file with pages left after DONTNEED is tried again (after 4, 8, 16 ms).
const EVICT_RETRIES: u32 = 3;

/// Writes back dirty pages (fdatasync) and drops every file's cached pages
/// (POSIX_FADV_DONTNEED), then re-measures, trying again a few times where pages stayed.
pub fn evict(roots: &[PathBuf], opts: &WalkOptions) -> EvictReport {
    let ps = sys::page_size();
    let rep = Mutex::new(EvictReport::default());
    let extra = Mutex::new(Vec::new());
    let dedup = LinkDedup::default();
    let errors = walk::walk(roots, opts, |found| {
        let p = found.path();
        let res = (|| -> std::io::Result<Option<Remaining>> {
            let f = found.open_quiet()?;
            let meta = f.metadata()?;
            if !dedup.first_visit(&meta) {
                return Ok(None);
            }
            let pages = meta.len().div_ceil(ps);
            if let Ok(mut r) = rep.lock() {
                r.files += 1;
                r.pages += pages;
            }
            let mut after;
            let mut attempt = 0;
            loop {
                // DONTNEED skips dirty pages, so write them back first.
                sys::fdatasync(f.as_fd())?;
                sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)?;
                after = residency::measure(&f, p, &meta, None);
                // A page the kernel holds for a moment (isolated by reclaim, e.g. a DAMON
                // pageout pass, or locked for a read) is skipped by DONTNEED; it is free again
                // a few milliseconds later. Pages that stay (mapped, mlocked) are reported.
                if attempt == EVICT_RETRIES || matches!(after.resident_pages(), Some(0) | None) {
                    break;
                }
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(2 << attempt));
            }
            Ok(match after.resident_pages() {
                Some(0) => None,
                _ => Some(Remaining {
                    path: p.to_path_buf(),
                    pages,
                    residency: after,
                }),
            })
        })();
        match res {
            Ok(Some(r)) => {
                if let Ok(mut v) = rep.lock() {
                    v.remaining.push(r)
                }
            }
            Ok(None) => {}
            Err(e) => {
                if let Ok(mut v) = extra.lock() {
                    v.push(WalkError {
                        path: p.to_path_buf(),
                        error: e.to_string(),
                    })
                }
            }
        }
    });
    let mut r = rep.into_inner().unwrap_or_default();
    r.errors = errors;
    r.errors.extend(extra.into_inner().unwrap_or_default());
    r.remaining.sort_by(|a, b| a.path.cmp(&b.path));
    r
}
