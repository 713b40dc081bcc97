//! snapblk-readahead: honest page-cache residency, readahead lists, record, replay and evict.
//!
//! * [`residency`] measures how much of a file is in the page cache with cachestat(2), falls
//!   back to mincore(2) only where its answer can be trusted, and otherwise says "unknown" —
//!   mincore reports every page of a file the caller neither owns nor may write as resident.
//! * [`list`] is the readahead list format (text, JSON Lines, classic block lists) with file
//!   identities so stale entries are detected; the parser is hardened for untrusted input.
//! * [`record`] diffs residency snapshots taken before and after a command or time window;
//!   [`trace`] adds the page-cache insertions the kernel's filemap tracepoint saw in it.
//! * [`replay`] brings a list into the cache in chunks at idle priority, backs off under I/O
//!   pressure, and verifies the result; [`evict`] drops files from the cache.
//! * [`blocks`] is the block-device flavour (record served ranges, replay into a device); its
//!   format lives in `snapblk-blocklist`, which the snapshot driver uses without this crate.
//! * [`scan`] and [`walk`] produce residency reports of whole trees in parallel.
//! * `fake` (with the `test-utils` feature) stands in for the kernel files the pressure back-off
//!   reads, for tests.

#![warn(missing_docs)]

pub mod blocks;
pub mod evict;
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
pub mod list;
pub mod ownstall;
pub mod record;
pub mod replay;
pub mod residency;
pub mod scan;
pub mod sys;
pub mod sysstat;
pub mod trace;
pub mod uring;
pub mod walk;

pub use list::{Extent, FileIdentity, ListEntry};
pub use replay::{Method, ReplayOptions, ReplayReport};
pub use residency::{Residency, Source};
/// Byte ranges, from `snapblk-blocklist` (block lists and file lists share them).
pub use snapblk_blocklist::{Range, RangeSet};

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::PathBuf;

    /// A directory on a real (evictable) filesystem: the temp dir unless it is tmpfs, else
    /// /var/tmp. Panics if neither is on disk, since eviction tests cannot work on tmpfs.
    pub fn disk_dir() -> PathBuf {
        for d in [std::env::temp_dir(), PathBuf::from("/var/tmp")] {
            if let Ok(f) = std::fs::File::open(&d)
                && crate::sys::fs_type(std::os::fd::AsFd::as_fd(&f)).is_ok_and(|t| t != 0x0102_1994)
            {
                return d;
            }
        }
        panic!("no disk-backed temp directory (TMPDIR and /var/tmp are tmpfs)");
    }
}
