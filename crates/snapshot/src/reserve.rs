//! Space for a merge, reserved before its first write: the blocks of a regular-file base that
//! the ops still to merge and the writable overlay's fold write, and the COW file's scratch
//! area. On a full file system or over a quota the merge then fails before it starts, with base
//! and COW as they were (what the reservation allocated in their holes is punched out again),
//! instead of part-way (which a later run resumes, but only once space is freed).
//!
//! `fallocate` with `FALLOC_FL_KEEP_SIZE` allocates what is not allocated yet and changes
//! neither size nor data. A file system without it, or a base that is a block device or has no
//! descriptor, is merged as before. It cannot promise the space on a copy-on-write file system
//! (btrfs, or XFS with extents shared by reflink or dedupe): there an overwrite of an allocated
//! block needs new space too, which `fallocate` does not reserve. The merge stash (a few blocks)
//! is not reserved.

use crate::error::{Result, SnapError};
use crate::io::Dev;
use crate::snapshot::Snapshot;
use std::fs::File;
use std::os::fd::AsRawFd;

/// Reserve what the merge from op `from` on writes (see the module docs).
pub(crate) fn reserve_for_merge(snap: &Snapshot, from: usize) -> Result<()> {
    let bs = snap.map.block_size();
    if let Some(f) = regular(snap, Dev::Base) {
        let ops = snap.map.ops().iter().skip(from);
        let ops = ops.map(|o| (o.new_block, o.blocks()));
        let overlay = snap.overlay.iter().flat_map(|ov| ov.blocks());
        let overlay = overlay.map(|(b, _)| (b, 1));
        let ranges: Vec<(u64, u64)> = runs(ops.chain(overlay))
            .into_iter()
            .map(|(s, n)| (s * bs, n * bs))
            .collect();
        reserve(
            f,
            &ranges,
            "reserving the base's space for the merge (nothing written)",
        )?;
    }
    if let (Some(f), Some(s)) = (regular(snap, Dev::Cow), snap.layout.scratch()) {
        reserve(
            f,
            &[(s.base, s.len)],
            "reserving the COW's scratch area for the merge (nothing written)",
        )?;
    }
    Ok(())
}

/// The device's file, if it is a regular file.
fn regular(snap: &Snapshot, d: Dev) -> Option<&File> {
    snap.device(d)
        .as_file()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
}

/// Block ranges `(first, count)` sorted and merged where they touch or overlap.
fn runs(it: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = it.filter(|&(_, n)| n > 0).collect();
    v.sort_unstable();
    snapblk_cow::record::merge_runs(v)
}

/// Allocate the holes of `f` inside the byte ranges (`ranges` sorted, not overlapping). On
/// failure the holes this allocated are punched out again, so a refused merge leaves the
/// file's space as it was; a file system without `fallocate` (EOPNOTSUPP, or ENOSYS under a
/// seccomp filter) reserves nothing and is no error. A file with as many blocks allocated as
/// its size needs has no hole and is left alone without a look (the usual base, a full copy of
/// an image); otherwise the holes are found in one pass over the file.
fn reserve(f: &File, ranges: &[(u64, u64)], what: &'static str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let io = |e: std::io::Error| SnapError::Io {
        what,
        source: snapblk_core::Error::from_io(e),
    };
    let m = f.metadata().map_err(io)?;
    if m.blocks().saturating_mul(512) >= m.len() {
        return Ok(());
    }
    let fd = f.as_raw_fd();
    let holes = holes(fd, 0, m.len()).map_err(io)?;
    let mut filled: Vec<(u64, u64)> = Vec::new();
    for (o, l) in overlap(&holes, ranges) {
        // Given back on failure, this call's too: a failed call may have allocated part of it.
        filled.push((o, l));
        match fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, o, l) {
            Ok(()) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                return Ok(());
            }
            Err(e) => {
                // Best effort: the error returned is the reservation's.
                let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                for &(o, l) in &filled {
                    let _ = fallocate(fd, punch, o, l);
                }
                return Err(io(e));
            }
        }
    }
    Ok(())
}

/// The pieces common to two sorted lists of disjoint byte ranges `(offset, length)`.
fn overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (ae, be) = (a[i].0 + a[i].1, b[j].0 + b[j].1);
        let (s, e) = (a[i].0.max(b[j].0), ae.min(be));
        if s < e {
            out.push((s, e - s));
        }
        if ae <= be {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `fallocate(fd, mode, off, len)`, retried while a signal interrupts it (tmpfs returns EINTR
/// whenever one is pending).
fn fallocate(fd: i32, mode: i32, off: u64, len: u64) -> std::io::Result<()> {
    let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    };
    loop {
        // SAFETY: fallocate reads only its integer arguments; `fd` is an open file's.
        if unsafe { libc::fallocate(fd, mode, o, l) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// The holes of `[off, off + len)` of `fd` (`SEEK_HOLE`/`SEEK_DATA`; a file system without
/// them reports the whole file as data, so no hole).
fn holes(fd: i32, off: u64, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let end = off.saturating_add(len);
    let mut out = Vec::new();
    let mut at = off;
    while at < end {
        let Some(h) = seek(fd, at, libc::SEEK_HOLE)? else {
            break;
        };
        if h >= end {
            break;
        }
        let d = seek(fd, h, libc::SEEK_DATA)?.unwrap_or(end).min(end);
        if d > h {
            out.push((h, d - h));
        }
        at = d.max(h + 1);
    }
    Ok(out)
}

/// `lseek(fd, at, whence)`: `None` past the end (ENXIO).
fn seek(fd: i32, at: u64, whence: i32) -> std::io::Result<Option<u64>> {
    let Ok(a) = libc::off_t::try_from(at) else {
        return Ok(None);
    };
    // SAFETY: lseek reads only its integer arguments.
    let r = unsafe { libc::lseek(fd, a, whence) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(r as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_touching_and_overlapping_ranges() {
        let r = runs([(10, 2), (0, 1), (12, 1), (1, 1), (11, 5), (20, 0), (30, 1)].into_iter());
        assert_eq!(r, [(0, 2), (10, 6), (30, 1)]);
    }

    #[test]
    fn overlap_keeps_the_common_pieces() {
        let a = [(0, 10), (20, 10), (40, 5)];
        let b = [(5, 20), (28, 14)];
        assert_eq!(overlap(&a, &b), [(5, 5), (20, 5), (28, 2), (40, 2)]);
        assert_eq!(overlap(&a, &[]), []);
    }

    #[test]
    fn holes_are_found_past_the_data_and_up_to_the_range_end() {
        let dir = std::env::temp_dir().join(format!("snapblk-holes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        f.set_len(1 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[1u8; 4096], 64 << 10).unwrap();
        let fd = f.as_raw_fd();
        let h = holes(fd, 0, 1 << 20).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // File systems round holes to their own block size: the data block is never in one,
        // and everything far from it is.
        assert!(
            h.iter().all(|&(o, l)| o + l <= 64 << 10 || o >= 68 << 10),
            "{h:?}"
        );
        assert!(h.iter().any(|&(o, _)| o == 0), "{h:?}");
        assert!(h.iter().any(|&(o, l)| o + l == 1 << 20), "{h:?}");
    }
}
