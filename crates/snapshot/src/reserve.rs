//! Space for a merge, reserved before its first write: the blocks of a regular-file base that
//! the ops still to merge write, and the COW file's scratch area. On a full file system or over
//! a quota the merge then fails before it starts, with base and COW as they were, instead of
//! part-way (which a later run resumes, but only once space is freed). `fallocate` with
//! `FALLOC_FL_KEEP_SIZE` allocates what is not yet allocated and changes neither size nor data;
//! a file system without it, or a base that is a block device or has no descriptor, is merged
//! as before.

use crate::error::{Result, SnapError};
use crate::io::Dev;
use crate::snapshot::Snapshot;
use std::fs::File;
use std::os::fd::AsRawFd;

/// Reserve what the merge from op `from` on writes (see the module docs). Returns the bytes
/// asked for (allocated or already so).
pub(crate) fn reserve_for_merge(snap: &Snapshot, from: usize) -> Result<u64> {
    let mut asked = 0;
    if let Some(f) = regular(snap, Dev::Base) {
        let bs = snap.map.block_size();
        for (start, blocks) in runs(
            snap.map
                .ops()
                .iter()
                .skip(from)
                .map(|o| (o.new_block, o.blocks())),
        ) {
            let (off, len) = (start * bs, blocks * bs);
            allocate(
                f,
                off,
                len,
                "reserving the base's space for the merge (nothing written)",
            )?;
            asked += len;
        }
    }
    if let (Some(f), Some(s)) = (regular(snap, Dev::Cow), snap.layout.scratch()) {
        allocate(
            f,
            s.base,
            s.len,
            "reserving the COW's scratch area for the merge (nothing written)",
        )?;
        asked += s.len;
    }
    Ok(asked)
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
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, n) in v {
        let e = s.saturating_add(n);
        match out.last_mut() {
            Some((ls, ln)) if s <= *ls + *ln => *ln = (*ln).max(e - *ls),
            _ => out.push((s, n)),
        }
    }
    out
}

/// `fallocate(KEEP_SIZE)` of `[off, off + len)`; EOPNOTSUPP (a file system without it) is not
/// an error.
fn allocate(f: &File, off: u64, len: u64, what: &'static str) -> Result<()> {
    let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return Err(SnapError::Io {
            what,
            source: snapblk_core::Error::from_errno(libc::EFBIG),
        });
    };
    // SAFETY: fallocate reads only its integer arguments; the descriptor is the open file's.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, o, l) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(SnapError::Io {
        what,
        source: snapblk_core::Error::from_io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_merge_touching_and_overlapping_ranges() {
        let r = runs([(10, 2), (0, 1), (12, 1), (1, 1), (11, 5), (20, 0), (30, 1)].into_iter());
        assert_eq!(r, [(0, 2), (10, 6), (30, 1)]);
    }
}
