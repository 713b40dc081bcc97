//! Honest page-cache residency of one file.
//!
//! cachestat(2) is used first. It returns EPERM exactly when mincore(2) would lie: since Linux 5.2
//! mincore reports *every* page of a file as resident to a caller that neither owns the file nor
//! may write it. So mincore is only used when cachestat is missing (ENOSYS, old kernels) or
//! unsupported (EOPNOTSUPP) *and* the caller is root, the owner, or may write the file; in every
//! other case the answer is "unknown" with the reason.

use crate::sys;
use crate::{Range, RangeSet};
use serde::Serialize;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Where a residency figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Measured with cachestat(2) (Linux 6.5+), which also counts dirty, writeback and evicted
    /// pages.
    Cachestat,
    /// Measured with mincore(2) on a mapping of the file: used only where its answer can be
    /// trusted, since for a file the caller neither owns nor may write it reports every page
    /// resident.
    Mincore,
}

/// Residency of a byte range of a file, in pages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Residency {
    /// The residency was measured.
    Known {
        /// Which system call measured it.
        source: Source,
        /// Pages (of the system page size) of the range in the page cache.
        resident_pages: u64,
        /// cachestat extras (0 when measured with mincore).
        dirty_pages: u64,
        /// Pages under writeback (cachestat; 0 with mincore).
        writeback_pages: u64,
        /// Pages evicted from the range whose shadow entries remain (cachestat `nr_evicted`; 0 with
        /// mincore).
        evicted_pages: u64,
        /// Of the evicted pages, those evicted recently enough that reading them again counts as a
        /// refault (cachestat `nr_recently_evicted`; 0 with mincore).
        recently_evicted_pages: u64,
    },
    /// The residency could not be measured honestly: cachestat refused or failed, and mincore
    /// was unavailable or untrustworthy.
    Unknown {
        /// Why, for the user: cachestat's EPERM, mincore untrusted, or the failing call's error.
        reason: String,
    },
}

impl Residency {
    /// The resident page count when known, `None` when the residency is unknown.
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

/// Which system call measures residency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Backend {
    /// cachestat(2), falling back to a trusted mincore(2) only where cachestat is missing
    /// (ENOSYS) or unsupported (EOPNOTSUPP). What every command uses.
    #[default]
    Auto,
    /// Behave as on a kernel without cachestat (< 6.5): the mincore fallback with its trust
    /// check. For tests, which cannot otherwise reach that path on a new kernel.
    #[cfg(test)]
    NoCachestat,
}

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
    measure_with(Backend::Auto, file, path, meta, range)
}

/// [`measure`] with an explicit [`Backend`].
pub(crate) fn measure_with(
    backend: Backend,
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
    range: Option<Range>,
) -> Residency {
    let (off, len) = range.map(|r| (r.offset, r.len)).unwrap_or((0, 0));
    let cs = match backend {
        Backend::Auto if !sys::cachestat_truthful(file.as_fd()) => {
            Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        }
        Backend::Auto => sys::cachestat(file.as_fd(), off, len),
        #[cfg(test)]
        Backend::NoCachestat => Err(std::io::Error::from_raw_os_error(libc::ENOSYS)),
    };
    match cs {
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
#[cfg(test)]
pub(crate) fn resident_ranges(
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<RangeSet, String> {
    resident_ranges_with(Backend::Auto, file, path, meta)
}

/// [`resident_ranges`] with an explicit [`Backend`].
#[cfg(test)]
pub(crate) fn resident_ranges_with(
    backend: Backend,
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<RangeSet, String> {
    resident_state_with(backend, file, path, meta).map(|s| s.ranges)
}

/// The resident ranges of a file and how many of its pages are being written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResidentState {
    /// As [`resident_ranges`].
    pub ranges: RangeSet,
    /// Dirty pages (cachestat; 0 when measured with mincore, which cannot tell).
    pub dirty_pages: u64,
    /// Pages under writeback (cachestat; 0 with mincore).
    pub writeback_pages: u64,
    /// Shadow entries: pages that were cached and then reclaimed (cachestat; 0 with mincore).
    /// Eviction by DONTNEED or drop_caches leaves none.
    pub evicted_pages: u64,
}

/// [`resident_ranges`] plus the dirty and writeback page counts from the same measurement.
pub(crate) fn resident_state(
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<ResidentState, String> {
    resident_state_with(Backend::Auto, file, path, meta)
}

/// [`resident_state`] with an explicit [`Backend`].
pub(crate) fn resident_state_with(
    backend: Backend,
    file: &File,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<ResidentState, String> {
    let size = meta.len();
    let ps = sys::page_size();
    let pages = size.div_ceil(ps);
    if pages == 0 {
        return Ok(ResidentState::default());
    }
    // Fast paths from the counts; they also settle whether the caller may see residency at all.
    let (resident, dirty_pages, writeback_pages, evicted_pages) =
        match measure_with(backend, file, path, meta, None) {
            Residency::Unknown { reason } => return Err(reason),
            Residency::Known {
                resident_pages,
                dirty_pages,
                writeback_pages,
                evicted_pages,
                ..
            } => (resident_pages, dirty_pages, writeback_pages, evicted_pages),
        };
    let state = |ranges| ResidentState {
        ranges,
        dirty_pages,
        writeback_pages,
        evicted_pages,
    };
    if resident == 0 {
        return Ok(state(RangeSet::new()));
    }
    if resident >= pages {
        return Ok(state(RangeSet::from_ranges(vec![Range {
            offset: 0,
            len: size,
        }])));
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
    Ok(state(set))
}

/// The pages of a file that were cached and then reclaimed (shadow entries), as byte ranges
/// clipped to `size`. cachestat counts shadows per range exactly (a large folio's entry is
/// clipped to the range), so halving the ranges that hold some finds them in O(runs x log
/// pages) calls; a range that is all shadows is taken whole. Needs cachestat (Linux >= 6.5).
pub(crate) fn shadow_ranges(file: &File, size: u64) -> std::io::Result<RangeSet> {
    if !sys::cachestat_truthful(file.as_fd()) {
        return Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    let ps = sys::page_size();
    let mut set = RangeSet::new();
    // Depth-first from the left, so ranges come out sorted.
    let mut stack = vec![(0u64, size.div_ceil(ps))];
    while let Some((first, last)) = stack.pop() {
        let n = last - first;
        if n == 0 {
            continue; // (a length of 0 would ask cachestat for the whole file)
        }
        let ev = sys::cachestat(file.as_fd(), first * ps, n * ps)?.evicted;
        if ev == 0 {
            continue;
        }
        if ev >= n {
            let off = first * ps;
            set.push_sorted(Range {
                offset: off,
                len: (n * ps).min(size - off),
            });
            continue;
        }
        let mid = first + n / 2;
        stack.push((mid, last));
        stack.push((first, mid));
    }
    Ok(set)
}

/// Opens a file for residency work: read-only, without updating atime where permitted.
pub fn open_quiet(path: &Path) -> std::io::Result<File> {
    open_quiet_at(rustix::fs::CWD, path)
}

/// [`open_quiet`] for `name` relative to the directory `dir` (a walk's open directory: the
/// kernel then looks up one name instead of a whole path).
pub(crate) fn open_quiet_at<P: rustix::path::Arg + Copy>(
    dir: BorrowedFd<'_>,
    name: P,
) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name, flags | OFlags::NOATIME, Mode::empty()) {
        // O_NOATIME needs ownership or CAP_FOWNER; retry plainly.
        Err(rustix::io::Errno::PERM) => rustix::fs::openat(dir, name, flags, Mode::empty()),
        r => r,
    }?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Set when this test binary is re-executed as `nobody` by
    /// `mincore_fallback_is_unknown_for_an_untrusted_caller`: the file to measure.
    const UNTRUSTED_ENV: &str = "SNAPBLK_RA_TEST_UNTRUSTED_FILE";
    /// Printed by the unprivileged helper once all its checks passed.
    const UNTRUSTED_OK: &str = "untrusted-helper: ok";

    fn write_synced(p: &Path, len: u64) {
        let mut f = File::create(p).unwrap();
        f.write_all(&vec![3u8; len as usize]).unwrap();
        f.sync_all().unwrap();
    }

    fn dontneed(f: &File, off: u64, len: u64) {
        sys::fadvise(f.as_fd(), off, len, libc::POSIX_FADV_DONTNEED).unwrap();
    }

    fn known(r: &Residency, want: Source) -> u64 {
        match r {
            Residency::Known {
                source,
                resident_pages,
                ..
            } if *source == want => *resident_pages,
            r => panic!("expected a {want:?} figure, got {r:?}"),
        }
    }

    #[test]
    fn mincore_fallback_agrees_with_cachestat_when_trusted() {
        let p = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-fallback-{}", std::process::id()));
        let ps = sys::page_size();
        let size = 8 << 20;
        write_synced(&p, size);
        let f = open_quiet(&p).unwrap();
        let meta = f.metadata().unwrap();
        // Read it all back cold, then drop the second half. Large folios are naturally aligned
        // and at most 2 MiB, so none straddles the 4 MiB boundary and the DONTNEED is exact.
        dontneed(&f, 0, 0);
        std::io::copy(&mut &f, &mut std::io::sink()).unwrap();
        dontneed(&f, size / 2, size / 2);
        let pages = size / ps;
        let cs = known(&measure(&f, &p, &meta, None), Source::Cachestat);
        assert!(cs > 0 && cs < pages, "not partially resident: {cs}/{pages}");
        let mc = known(
            &measure_with(Backend::NoCachestat, &f, &p, &meta, None),
            Source::Mincore,
        );
        assert_eq!(mc, cs, "whole file");
        for (off, len) in [
            (0, size / 2),
            (size / 2, size / 2),
            (3 << 20, 2 << 20),
            (ps + 100, 5 * ps),
            ((size / 2) - 1, 2),
            (size - 1, 1 << 30), // past EOF
        ] {
            let r = Some(Range { offset: off, len });
            let cs = known(&measure(&f, &p, &meta, r), Source::Cachestat);
            let mc = known(
                &measure_with(Backend::NoCachestat, &f, &p, &meta, r),
                Source::Mincore,
            );
            assert_eq!(mc, cs, "range {off}+{len}");
        }
        let a = resident_ranges(&f, &p, &meta).unwrap();
        let b = resident_ranges_with(Backend::NoCachestat, &f, &p, &meta).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.total_bytes(), cs * ps);
        std::fs::remove_file(&p).unwrap();
    }

    /// The checks run as `nobody` on a root-owned 0644 file that was evicted: the fallback must
    /// say "unknown" (mincore itself claims every page is resident there).
    fn untrusted_checks(p: &Path) {
        assert_ne!(sys::euid(), 0, "the helper must run unprivileged");
        let f = open_quiet(p).unwrap();
        let meta = f.metadata().unwrap();
        let pages = meta.len().div_ceil(sys::page_size());
        // The lie this guards against, seen directly.
        let mut lie = 0;
        sys::mincore_pages(f.as_fd(), meta.len(), |_, r| lie += r as u64).unwrap();
        assert_eq!(
            lie, pages,
            "mincore no longer lies to unprivileged callers?"
        );
        let whole = Some(Range {
            offset: 0,
            len: meta.len(),
        });
        for range in [None, whole] {
            match measure_with(Backend::NoCachestat, &f, p, &meta, range) {
                Residency::Unknown { reason } => assert_eq!(reason, UNTRUSTED_REASON),
                r => panic!("untrusted mincore fallback gave a figure: {r:?}"),
            }
            // With cachestat (this kernel): unknown too, for the EPERM reason.
            match measure(&f, p, &meta, range) {
                Residency::Unknown { reason } => assert_eq!(reason, EPERM_REASON),
                r => panic!("cachestat gave a figure to an untrusted caller: {r:?}"),
            }
        }
        assert_eq!(
            resident_ranges_with(Backend::NoCachestat, &f, p, &meta),
            Err(UNTRUSTED_REASON.to_string())
        );
        println!("{UNTRUSTED_OK}");
    }

    #[test]
    fn mincore_fallback_is_unknown_for_an_untrusted_caller() {
        if let Some(p) = std::env::var_os(UNTRUSTED_ENV) {
            return untrusted_checks(Path::new(&p));
        }
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        assert_eq!(
            sys::euid(),
            0,
            "this test drops privileges and must run as root"
        );
        let p = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-untrusted-{}", std::process::id()));
        write_synced(&p, 1 << 20);
        // Root-owned, 0644: nobody neither owns nor may write it (the mincore lie condition).
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let f = open_quiet(&p).unwrap();
        let meta = f.metadata().unwrap();
        dontneed(&f, 0, 0);
        // As root the fallback is trusted and truthful: nothing resident.
        let mc = measure_with(Backend::NoCachestat, &f, &p, &meta, None);
        assert_eq!(known(&mc, Source::Mincore), 0);
        let exe = std::env::current_exe().unwrap();
        let o = std::process::Command::new(&exe)
            .args([
                "--exact",
                "residency::tests::mincore_fallback_is_unknown_for_an_untrusted_caller",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(UNTRUSTED_ENV, &p)
            .uid(65534)
            .gid(65534)
            .output()
            // (A test binary rebuilt while it runs shows up here as "... (deleted)".)
            .unwrap_or_else(|e| panic!("cannot run {} as nobody: {e}", exe.display()));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains(UNTRUSTED_OK),
            "unprivileged helper failed: {out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn resident_state_counts_dirty_pages_until_written_back() {
        let p = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-dirty-{}", std::process::id()));
        let ps = sys::page_size();
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; (4 * ps) as usize]).unwrap();
        let meta = f.metadata().unwrap();
        let st = resident_state(&f, &p, &meta).unwrap();
        assert_eq!(st.ranges.total_bytes(), 4 * ps, "{st:?}");
        // Just written, not synced: dirty (or already under writeback).
        assert!(st.dirty_pages + st.writeback_pages > 0, "{st:?}");
        f.sync_all().unwrap();
        let st = resident_state(&f, &p, &meta).unwrap();
        assert_eq!((st.dirty_pages, st.writeback_pages), (0, 0), "{st:?}");
        assert_eq!(st.ranges, resident_ranges(&f, &p, &meta).unwrap());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn shadow_ranges_find_exactly_the_reclaimed_pages() {
        let p = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-shadow-{}", std::process::id()));
        let ps = sys::page_size();
        let size = 64 * ps + 100;
        write_synced(&p, size);
        let f = open_quiet(&p).unwrap();
        let meta = f.metadata().unwrap();
        dontneed(&f, 0, 0);
        // Page by page with readahead off, so every page is its own folio: reclaim takes part
        // of a large folio only if it can split it, and then not always.
        sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_RANDOM).unwrap();
        for page in 0..size.div_ceil(ps) {
            use std::os::unix::fs::FileExt;
            f.read_at(&mut [0u8; 1], page * ps).unwrap();
        }
        assert!(shadow_ranges(&f, size).unwrap().is_empty());
        // Reclaimed as memory pressure would: pages 3-4, 20 and the partial last page.
        for (first, n) in [(3, 2), (20, 1), (64, 1)] {
            sys::pageout(f.as_fd(), first * ps, n * ps).unwrap();
        }
        let want = RangeSet::from_ranges(vec![
            Range::new(3 * ps, 2 * ps).unwrap(),
            Range::new(20 * ps, ps).unwrap(),
            Range::new(64 * ps, 100).unwrap(),
        ]);
        // The host's own reclaim (DAMON pageout here) may take more pages at any moment, so
        // the bisection is compared with a page-by-page scan, and both with the counts, in a
        // quiet moment: the same answer before and after the scan.
        let pages_of =
            |set: &RangeSet| set.ranges().iter().map(|r| r.len.div_ceil(ps)).sum::<u64>();
        let consistent = (0..5).find_map(|_| {
            let got = shadow_ranges(&f, size).unwrap();
            let mut scan = RangeSet::new();
            for page in 0..size.div_ceil(ps) {
                if sys::cachestat(f.as_fd(), page * ps, ps).unwrap().evicted > 0 {
                    let off = page * ps;
                    scan.push_sorted(Range::new(off, ps.min(size - off)).unwrap());
                }
            }
            let st = resident_state(&f, &p, &meta).unwrap();
            let again = shadow_ranges(&f, size).unwrap();
            (got == scan && got == again).then_some((got, st))
        });
        let (got, st) = consistent.expect("page cache never quiet for 5 tries");
        assert!(
            want.difference(&got).is_empty(),
            "{got:?} misses some of {want:?}"
        );
        assert_eq!(st.evicted_pages, pages_of(&got));
        // Resident and shadow pages partition the file.
        assert_eq!(
            st.ranges.union(got),
            RangeSet::from_ranges(vec![Range::new(0, size).unwrap()])
        );
        // Reading the pages back replaces their shadows.
        std::io::copy(&mut &f, &mut std::io::sink()).unwrap();
        assert!(shadow_ranges(&f, size).unwrap().is_empty());
        assert_eq!(
            resident_state(&f, &p, &meta).unwrap().ranges,
            RangeSet::from_ranges(vec![Range::new(0, size).unwrap()])
        );
        std::fs::remove_file(&p).unwrap();
    }

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
