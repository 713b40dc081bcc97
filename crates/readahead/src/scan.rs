//! Residency report of files and trees (the `residency` command).

use crate::list::escape_path;
use crate::residency::{self, Residency};
use crate::sys;
use crate::walk::{self, LinkDedup, WalkError, WalkOptions};
use serde::{Serialize, Serializer};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

fn ser_path<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&escape_path(p))
}

/// Residency of one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileReport {
    /// The file as given or found by the walk, escaped in JSON.
    #[serde(serialize_with = "ser_path")]
    pub path: PathBuf,
    /// File size in bytes.
    pub size: u64,
    /// Pages the file spans at the system page size (size rounded up).
    pub pages: u64,
    /// How many of those pages are in the page cache, or why that is unknown.
    pub residency: Residency,
    /// Per-bucket residency in percent (for terminal bars), empty unless requested.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<u8>,
}

/// Totals over a report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    /// Files reported.
    pub files: u64,
    /// Sum of their sizes in bytes.
    pub bytes: u64,
    /// Sum of the pages they span (system page size).
    pub pages: u64,
    /// Resident pages among files whose residency is known.
    pub resident_pages: u64,
    /// Pages of files whose residency is known.
    pub known_pages: u64,
    /// Files whose residency is unknown.
    pub unknown_files: u64,
    /// Pages of those files.
    pub unknown_pages: u64,
    /// Dirty pages among known files (cachestat only).
    pub dirty_pages: u64,
    /// Pages under writeback among known files (cachestat only).
    pub writeback_pages: u64,
    /// Recently evicted pages among known files (cachestat `nr_recently_evicted`).
    pub recently_evicted_pages: u64,
    /// Paths that could not be walked or opened.
    pub errors: u64,
    /// `resident_pages / known_pages`; `None` (JSON null) when no page could be measured.
    pub resident_fraction: Option<f64>,
}

/// A residency report.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The system page size in bytes that page counts refer to (sysconf `_SC_PAGESIZE`).
    pub page_size: u64,
    /// One report per file, sorted by path.
    pub files: Vec<FileReport>,
    /// Paths that could not be walked or opened, with the reason.
    pub errors: Vec<WalkError>,
}

impl Report {
    /// Sums the per-file figures into [`Totals`], computing the resident fraction over known pages.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            errors: self.errors.len() as u64,
            ..Default::default()
        };
        for f in &self.files {
            t.files += 1;
            t.bytes += f.size;
            t.pages += f.pages;
            match &f.residency {
                Residency::Known {
                    resident_pages,
                    dirty_pages,
                    writeback_pages,
                    recently_evicted_pages,
                    ..
                } => {
                    t.known_pages += f.pages;
                    t.resident_pages += (*resident_pages).min(f.pages);
                    t.dirty_pages += dirty_pages;
                    t.writeback_pages += writeback_pages;
                    t.recently_evicted_pages += recently_evicted_pages;
                }
                Residency::Unknown { .. } => {
                    t.unknown_files += 1;
                    t.unknown_pages += f.pages;
                }
            }
        }
        t.resident_fraction =
            (t.known_pages > 0).then(|| t.resident_pages as f64 / t.known_pages as f64);
        t
    }
}

/// Residency of `n` slices spanning the whole file (one cachestat each), as a percentage
/// that is 0 only when no page of the slice is resident and 100 only when all are (so one
/// resident page in a large slice still shows). A file with fewer than `n` pages gets `n`
/// slices too, each page covering several, so a bar always spans the full width. Empty when
/// residency is unknown or the file is empty.
pub(crate) fn buckets(f: &std::fs::File, path: &Path, meta: &std::fs::Metadata, n: u64) -> Vec<u8> {
    let ps = sys::page_size();
    let pages = meta.len().div_ceil(ps);
    if pages == 0 || n == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let a = (i * pages / n).min(pages - 1);
        let b = ((i + 1) * pages / n).clamp(a + 1, pages);
        let Some(r) = crate::Range::new(a * ps, (b - a) * ps) else {
            return Vec::new();
        };
        match residency::measure(f, path, meta, Some(r)) {
            Residency::Known { resident_pages, .. } => {
                out.push(slice_percent(resident_pages, b - a))
            }
            Residency::Unknown { .. } => return Vec::new(),
        }
    }
    out
}

/// `resident` of `len` pages in percent, rounded into 1..=99 unless none or all are resident.
fn slice_percent(resident: u64, len: u64) -> u8 {
    match resident.min(len) {
        0 => 0,
        r if r >= len => 100,
        r => (r * 100 / len).clamp(1, 99) as u8,
    }
}

/// A residency bar of exactly `width` columns from [`FileReport::buckets`] (like `vmtouch -v`): `O` fully
/// resident, `o` partly (at least one page), blank none. Buckets are stretched or sampled to
/// the width, so the bar never ends early.
pub fn render_bar(buckets: &[u8], width: usize) -> String {
    if buckets.is_empty() {
        return " ".repeat(width);
    }
    (0..width)
        .map(|i| match buckets.get(i * buckets.len() / width).copied() {
            Some(100) => 'O',
            Some(0) | None => ' ',
            Some(_) => 'o',
        })
        .collect()
}

/// Measures every regular file under `roots`. Files are sorted by path. With `bar_buckets > 0`
/// each file also gets a residency map of that many slices.
pub fn scan(roots: &[PathBuf], opts: &WalkOptions, bar_buckets: u64) -> Report {
    let ps = sys::page_size();
    let files = Mutex::new(Vec::new());
    let extra_errors = Mutex::new(Vec::new());
    let dedup = LinkDedup::default();
    let errors = walk::walk(roots, opts, |found| {
        let p = found.path();
        let f = match found.open_quiet() {
            Ok(f) => f,
            Err(e) => {
                if let Ok(mut v) = extra_errors.lock() {
                    v.push(WalkError {
                        path: p.to_path_buf(),
                        error: e.to_string(),
                    });
                }
                return;
            }
        };
        let Ok(meta) = f.metadata() else { return };
        if !meta.is_file() || !dedup.first_visit(&meta) {
            return;
        }
        let r = residency::measure(&f, p, &meta, None);
        let b = if bar_buckets > 0 {
            buckets(&f, p, &meta, bar_buckets)
        } else {
            Vec::new()
        };
        let rep = FileReport {
            path: p.to_path_buf(),
            size: meta.len(),
            pages: meta.len().div_ceil(ps),
            residency: r,
            buckets: b,
        };
        if let Ok(mut v) = files.lock() {
            v.push(rep);
        }
    });
    let mut files = files.into_inner().unwrap_or_default();
    files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    let mut errors = errors;
    errors.extend(extra_errors.into_inner().unwrap_or_default());
    Report {
        page_size: ps,
        files,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;

    #[test]
    fn bars_span_the_width_and_show_any_resident_page() {
        assert_eq!(render_bar(&[100; 40], 40), "O".repeat(40));
        // Fewer buckets than columns (an older caller, or a tiny file): stretched, not padded.
        assert_eq!(render_bar(&[100; 28], 40), "O".repeat(40));
        assert_eq!(render_bar(&[0, 1, 100, 0], 8), "  ooOO  ");
        assert_eq!(render_bar(&[], 5), "     ");
        assert_eq!(render_bar(&[0; 80], 40), " ".repeat(40));
        assert_eq!(slice_percent(1, 192), 1);
        assert_eq!(slice_percent(191, 192), 99);
        assert_eq!(slice_percent(192, 192), 100);
        assert_eq!(slice_percent(0, 192), 0);
    }

    #[test]
    fn buckets_of_real_files() {
        let dir = crate::test_support::disk_dir();
        let ps = sys::page_size();
        // A fully resident 28-page file: 40 full slices, not 28 and a blank tail.
        let small = dir.join(format!("snapblk-ra-bar-small-{}", std::process::id()));
        std::fs::write(&small, vec![1u8; 28 * ps as usize]).unwrap();
        let f = std::fs::File::open(&small).unwrap();
        let b = buckets(&f, &small, &f.metadata().unwrap(), 40);
        assert_eq!(b, vec![100; 40]);
        assert_eq!(render_bar(&b, 40), "O".repeat(40));
        std::fs::remove_file(&small).unwrap();

        // A sparse 5120-page file (128 pages per slice) with one page read at 10 MiB: that
        // slice shows `o` (it was rounded down to 0 % and drawn blank before).
        let big = dir.join(format!("snapblk-ra-bar-big-{}", std::process::id()));
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(5120 * ps).unwrap();
        drop(f);
        let f = std::fs::File::open(&big).unwrap();
        sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_DONTNEED).unwrap();
        sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_RANDOM).unwrap();
        let mut page = vec![0u8; ps as usize];
        f.read_exact_at(&mut page, 10 << 20).unwrap();
        let b = buckets(&f, &big, &f.metadata().unwrap(), 40);
        assert_eq!(b.len(), 40);
        let col = ((10 << 20) / ps / 128) as usize;
        let bar = render_bar(&b, 40);
        let expect: String = (0..40).map(|i| if i == col { 'o' } else { ' ' }).collect();
        assert_eq!(bar, expect, "{b:?}");
        std::fs::remove_file(&big).unwrap();
    }
}
