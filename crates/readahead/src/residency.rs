//! Honest page-cache residency of one file.
//!
//! cachestat(2) is used first. It returns EPERM exactly when mincore(2) would lie: since Linux 5.2
//! mincore reports *every* page of a file as resident to a caller that neither owns the file nor
//! may write it. So mincore is only used when cachestat is missing (ENOSYS, old kernels) or
//! unsupported (EOPNOTSUPP) *and* the caller is root, the owner, or may write the file; in every
//! other case the answer is "unknown" with the reason.

use crate::ranges::{Range, RangeSet};
use crate::sys;
use serde::Serialize;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Where a residency figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Cachestat,
    Mincore,
}

/// Residency of a byte range of a file, in pages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Residency {
    Known {
        source: Source,
        resident_pages: u64,
        /// cachestat extras (0 when measured with mincore).
        dirty_pages: u64,
        writeback_pages: u64,
        evicted_pages: u64,
        recently_evicted_pages: u64,
    },
    Unknown {
        reason: String,
    },
}

impl Residency {
    pub fn resident_pages(&self) -> Option<u64> {
        match self {
            Residency::Known { resident_pages, .. } => Some(*resident_pages),
            Residency::Unknown { .. } => None,
        }
    }
}

const EPERM_REASON: &str = "cachestat: EPERM (caller neither owns nor may write the file; \
                            mincore would report every page resident)";
const UNTRUSTED_REASON: &str = "cachestat unavailable and mincore untrusted (caller neither \
                                owns nor may write the file; Linux >= 5.2 reports every page resident)";

/// Whether mincore's answer can be trusted for this file by this process.
fn mincore_trusted(path: &Path, meta: &std::fs::Metadata) -> bool {
    let euid = sys::euid();
    euid == 0 || meta.uid() == euid || sys::may_write(path)
}

/// Measures the residency of `[range]` (or the whole file) of an open file.
pub fn measure(
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
    range: Option<Range>,
) -> Residency {
    let (off, len) = range.map(|r| (r.offset, r.len)).unwrap_or((0, 0));
    match sys::cachestat(file.as_fd(), off, len) {
        Ok(cs) => Residency::Known {
            source: Source::Cachestat,
            resident_pages: cs.cache,
            dirty_pages: cs.dirty,
            writeback_pages: cs.writeback,
            evicted_pages: cs.evicted,
            recently_evicted_pages: cs.recently_evicted,
        },
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Residency::Unknown {
            reason: EPERM_REASON.into(),
        },
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
            ) =>
        {
            if !mincore_trusted(path, meta) {
                return Residency::Unknown {
                    reason: UNTRUSTED_REASON.into(),
                };
            }
            let ps = sys::page_size();
            let size = meta.len();
            let (first, last) = match range {
                Some(r) => (r.offset / ps, r.end().min(size).div_ceil(ps)),
                None => (0, size.div_ceil(ps)),
            };
            let mut n = 0u64;
            match sys::mincore_pages(file.as_fd(), size, |p, res| {
                if res && p >= first && p < last {
                    n += 1
                }
            }) {
                Ok(()) => Residency::Known {
                    source: Source::Mincore,
                    resident_pages: n,
                    dirty_pages: 0,
                    writeback_pages: 0,
                    evicted_pages: 0,
                    recently_evicted_pages: 0,
                },
                Err(e) => Residency::Unknown {
                    reason: format!("mincore: {e}"),
                },
            }
        }
        Err(e) => Residency::Unknown {
            reason: format!("cachestat: {e}"),
        },
    }
}

/// The resident byte ranges (page granular, clipped to the file size) of a whole file, or the
/// reason they cannot be known.
pub fn resident_ranges(
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<RangeSet, String> {
    let size = meta.len();
    let ps = sys::page_size();
    let pages = size.div_ceil(ps);
    if pages == 0 {
        return Ok(RangeSet::new());
    }
    // Fast paths from the counts; they also settle whether the caller may see residency at all.
    match measure(file, path, meta, None) {
        Residency::Unknown { reason } => return Err(reason),
        Residency::Known {
            resident_pages: 0, ..
        } => return Ok(RangeSet::new()),
        Residency::Known { resident_pages, .. } if resident_pages >= pages => {
            return Ok(RangeSet::from_ranges(vec![Range {
                offset: 0,
                len: size,
            }]));
        }
        Residency::Known { .. } => {}
    }
    // Partial: a page bitmap is needed. Trust was established above (cachestat succeeded, or
    // mincore_trusted held), so mincore tells the truth here.
    let mut set = RangeSet::new();
    sys::mincore_pages(file.as_fd(), size, |p, res| {
        if res {
            let off = p * ps;
            set.push_sorted(Range {
                offset: off,
                len: ps.min(size - off),
            });
        }
    })
    .map_err(|e| format!("mincore: {e}"))?;
    Ok(set)
}

/// Opens a file for residency work: read-only, without updating atime where permitted.
pub fn open_quiet(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME | libc::O_CLOEXEC)
        .open(path);
    match r {
        // O_NOATIME needs ownership or CAP_FOWNER; retry plainly.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => std::fs::File::open(path),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn resident_ranges_of_partially_evicted_file() {
        let p =
            crate::test_support::disk_dir().join(format!("snapblk-ra-res-{}", std::process::id()));
        let ps = sys::page_size();
        {
            let mut f = File::create(&p).unwrap();
            f.write_all(&vec![1u8; (8 * ps + 100) as usize]).unwrap();
            f.sync_all().unwrap();
        }
        let f = open_quiet(&p).unwrap();
        let meta = f.metadata().unwrap();
        // Written pages may sit in large folios that a partial DONTNEED cannot split, so evict
        // everything and read back single pages with readahead disabled (FADV_RANDOM).
        sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_DONTNEED).unwrap();
        assert_eq!(measure(&f, &p, &meta, None).resident_pages(), Some(0));
        sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_RANDOM).unwrap();
        for page in [0u64, 1, 5, 6, 7, 8] {
            use std::os::unix::fs::FileExt;
            let mut b = [0u8; 1];
            f.read_at(&mut b, page * ps).unwrap();
        }
        let rs = resident_ranges(&f, &p, &meta).unwrap();
        assert_eq!(
            rs.ranges(),
            &[
                Range {
                    offset: 0,
                    len: 2 * ps
                },
                Range {
                    offset: 5 * ps,
                    len: 3 * ps + 100
                }
            ]
        );
        assert_eq!(measure(&f, &p, &meta, None).resident_pages(), Some(6));
        std::fs::remove_file(&p).unwrap();
    }
}
