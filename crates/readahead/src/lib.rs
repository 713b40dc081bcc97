//! snapblk-readahead: honest page-cache residency, readahead lists, record, replay and evict.
//!
//! * Residency: [`measure`] tells how much of a file is in the page cache ([`Residency`]) with
//!   cachestat(2), falls back to mincore(2) only where its answer can be trusted, and otherwise
//!   says "unknown" — mincore reports every page of a file the caller neither owns nor may
//!   write as resident.
//! * Lists: [`ListEntry`] is an entry of the readahead list format (text, JSON Lines, classic
//!   block lists, read by [`parse_reader`], written by [`write_text`] and [`write_jsonl`]) with
//!   a [`FileIdentity`] so stale entries are detected; the parser is hardened for untrusted
//!   input.
//! * [`record()`] diffs residency snapshots taken before and after a command or time window,
//!   and adds the page-cache insertions the kernel's filemap tracepoint saw in it.
//! * [`replay_watched`] brings a list into the cache in chunks at idle priority, backs off under
//!   I/O pressure ([`BackOff`]), and verifies the result ([`ReplayReport`]); [`evict()`] drops
//!   files from the cache, and [`lock()`] holds their pages in memory with mlock(2).
//! * Block devices: the format ([`BlockList`], [`BlockFile`]) lives in `snapblk-blocklist`, which
//!   the snapshot driver uses without this crate.
//! * [`scan()`] and [`walk()`] produce residency reports of whole trees in parallel.
//! * `fake` (with the `test-utils` feature) stands in for the kernel files the pressure
//!   back-off reads, for tests.
//!
//! Modules are private and everything public is re-exported here, except `fake`: test
//! scaffolding, public only with the `test-utils` feature and kept in its own namespace so it
//! never reads as part of the API.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod evict;
#[cfg(any(test, feature = "test-utils"))]
pub mod fake;
mod list;
mod lock;
mod ownstall;
mod record;
mod replay;
mod residency;
mod scan;
mod sys;
mod sysstat;
mod trace;
mod uring;
mod walk;

pub use evict::{EvictReport, Remaining, evict};
pub use list::{
    Extent, FileIdentity, ListEntry, escape_path, parse_bytes, parse_reader, write_jsonl,
    write_text,
};
pub use lock::{LockError, Locked, lock};
pub use record::{
    RecordError, RecordPhase, Recording, TraceSummary, Trigger, WrittenFile, record, record_with,
};
pub use replay::{
    BackOff, BackOffWatch, Method, Progress, ReplayOptions, ReplayReport, StaleEntry,
    replay_watched, warm_tree_watched,
};
pub use residency::{Residency, Source, measure, open_quiet};
pub use scan::{FileReport, Report, Totals, render_bar, scan};
pub use sys::{CacheStat, IoPrio, cachestat, fadvise, pageout};
pub use sysstat::{
    DiskCounters, DiskDelta, DiskStat, DiskStatsChange, IoTotals, PSI_IO, diskstats_change,
    parse_diskstats,
};
pub use trace::TraceError;
pub use walk::{Found, WalkError, WalkOptions, walk};

/// The block list format and parse bounds, from `snapblk-blocklist` (block lists and file lists
/// share them).
pub use snapblk_blocklist::{
    BLOCK_HEADER, BlockFile, BlockList, Limits, ParseError, ParseErrorKind, Range, RangeSet,
};

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::PathBuf;

    /// A directory on a real (evictable) filesystem: the temp dir unless it is tmpfs, else
    /// /var/tmp. Panics if neither is on disk, since eviction tests cannot work on tmpfs.
    pub(crate) fn disk_dir() -> PathBuf {
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
