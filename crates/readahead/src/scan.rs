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
    #[serde(serialize_with = "ser_path")]
    pub path: PathBuf,
    pub size: u64,
    pub pages: u64,
    pub residency: Residency,
    /// Per-bucket residency in percent (for terminal bars), empty unless requested.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<u8>,
}

/// Totals over a report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub files: u64,
    pub bytes: u64,
    pub pages: u64,
    /// Resident pages among files whose residency is known.
    pub resident_pages: u64,
    /// Pages of files whose residency is known.
    pub known_pages: u64,
    pub unknown_files: u64,
    pub unknown_pages: u64,
    pub dirty_pages: u64,
    pub writeback_pages: u64,
    pub recently_evicted_pages: u64,
    pub errors: u64,
    /// `resident_pages / known_pages`; `None` (JSON null) when no page could be measured.
    pub resident_fraction: Option<f64>,
}

/// A residency report.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub page_size: u64,
    pub files: Vec<FileReport>,
    pub errors: Vec<WalkError>,
}

impl Report {
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

/// Residency in percent of `n` equal slices of the file (one cachestat each); empty when
/// residency is unknown.
pub fn buckets(f: &std::fs::File, path: &Path, meta: &std::fs::Metadata, n: u64) -> Vec<u8> {
    let ps = sys::page_size();
    let pages = meta.len().div_ceil(ps);
    if pages == 0 || n == 0 {
        return Vec::new();
    }
    let n = n.min(pages);
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (a, b) = (i * pages / n, (i + 1) * pages / n);
        let Some(r) = crate::ranges::Range::new(a * ps, (b - a) * ps) else {
            continue;
        };
        match residency::measure(f, path, meta, Some(r)) {
            Residency::Known { resident_pages, .. } => {
                out.push((resident_pages.min(b - a) * 100 / (b - a)) as u8)
            }
            Residency::Unknown { .. } => return Vec::new(),
        }
    }
    out
}

/// Measures every regular file under `roots`. Files are sorted by path. With `bar_buckets > 0`
/// each file also gets a residency map of that many slices.
pub fn scan(roots: &[PathBuf], opts: &WalkOptions, bar_buckets: u64) -> Report {
    let ps = sys::page_size();
    let files = Mutex::new(Vec::new());
    let extra_errors = Mutex::new(Vec::new());
    let dedup = LinkDedup::default();
    let errors = walk::walk(roots, opts, |p| {
        let f = match residency::open_quiet(p) {
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
