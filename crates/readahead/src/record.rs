//! Recording: residency snapshots of a set of trees before and after a command (or a time
//! window); pages that became resident in between form the readahead list. No tracing and no
//! kernel patches are needed (`--trace` adds the kernel's page-cache tracepoint where it is
//! available, for the pages a diff cannot see, see [`diff`]). Pages that were already
//! resident before cannot be seen being used, which is why `evict_first` exists; kernel
//! readahead done on behalf of the command is recorded too, because it is what the command
//! caused to be read. Files written during the window (created, changed identity, dirty at the
//! end) are left out and reported apart: their pages came from the writes, and their entries
//! would be stale at the next replay.

use crate::RangeSet;
use crate::evict;
use crate::list::{Extent, FileIdentity, ListEntry};
use crate::residency;
use crate::walk::{self, LinkDedup, WalkOptions};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One file of a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileState {
    /// The file's device, inode, size and mtime at the snapshot, to notice files changed between
    /// two snapshots.
    pub identity: FileIdentity,
    /// Byte ranges of the file resident in the page cache, at page granularity.
    pub resident: RangeSet,
    /// Pages dirty or under writeback (cachestat; 0 where only mincore could measure).
    pub dirty_pages: u64,
    /// Pages under writeback (cachestat; 0 where only mincore could measure).
    pub writeback_pages: u64,
    /// Pages cached and then reclaimed (shadow entries; empty where only mincore could
    /// measure, or where finding them failed).
    pub shadows: RangeSet,
}

/// Resident ranges of every file under some trees at one moment.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// Every regular file measured under the roots, by absolute path.
    pub files: HashMap<PathBuf, FileState>,
    /// Files whose residency could not be known, with the reason.
    pub unknown: Vec<(PathBuf, String)>,
}

/// Takes a residency snapshot of `roots`.
pub(crate) fn snapshot(roots: &[PathBuf], opts: &WalkOptions) -> Snapshot {
    let snap = Mutex::new(Snapshot::default());
    let dedup = LinkDedup::default();
    walk::walk(roots, opts, |found| {
        let p = found.path();
        let Ok(f) = found.open_quiet() else {
            return;
        };
        let Ok(meta) = f.metadata() else { return };
        if !meta.is_file() || !dedup.first_visit(&meta) {
            return;
        }
        // Only files that have shadows pay for locating them (outside the lock).
        let r = residency::resident_state(&f, p, &meta).map(|st| {
            let shadows = if st.evicted_pages > 0 {
                residency::shadow_ranges(&f, meta.len()).unwrap_or_default()
            } else {
                RangeSet::new()
            };
            (st, shadows)
        });
        if let Ok(mut s) = snap.lock() {
            match r {
                Ok((st, shadows)) => {
                    s.files.insert(
                        p.to_path_buf(),
                        FileState {
                            identity: FileIdentity::of(&meta),
                            resident: st.ranges,
                            dirty_pages: st.dirty_pages,
                            writeback_pages: st.writeback_pages,
                            shadows,
                        },
                    );
                }
                Err(reason) => s.unknown.push((p.to_path_buf(), reason)),
            }
        }
    });
    snap.into_inner().unwrap_or_default()
}

/// A file left out of a recording because it was written during it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WrittenFile {
    /// The file left out, as an absolute path.
    pub path: PathBuf,
    /// "created", "changed: size, mtime", "dirty: 3 pages", ... (joined with "; ").
    pub reason: String,
}

/// What a recording found: the list, and the files left out of it.
#[derive(Debug, Default)]
pub(crate) struct Diff {
    /// Bytes of `entries` that only the page-cache trace saw (neither resident nor a new
    /// shadow at the end): read in the window, then reclaimed where a shadow already was.
    pub traced_only_bytes: u64,
    /// Pages resident in `after` but not in `before`, sorted by path.
    pub entries: Vec<ListEntry>,
    /// Files written during the window, sorted by path.
    pub written: Vec<WrittenFile>,
    /// Bytes of `entries` found as new shadow entries, not resident: read during the window
    /// and reclaimed before its end.
    pub reclaimed_bytes: u64,
}

/// Why a file that is in `after` must be left out as written, if it must: created (not in
/// `before`), identity changed (size, mtime, inode, device), or pages dirty or under writeback
/// at the end. A file that was already dirty before, kept its identity and gained no resident
/// pages is not reported: there is nothing of it to leave out, and nothing shows that it was
/// written during the window.
fn written_reason(before: Option<&FileState>, after: &FileState, gained: bool) -> Option<String> {
    let mut why = Vec::new();
    match before {
        None => why.push("created".to_string()),
        Some(b) => {
            let d = b.identity.diff(&after.identity);
            if !d.is_empty() {
                why.push(format!("changed: {}", d.join(", ")));
            }
        }
    }
    let dirty_before = before.is_some_and(|b| b.dirty_pages + b.writeback_pages > 0);
    if why.is_empty() && !gained && dirty_before {
        return None;
    }
    if after.dirty_pages > 0 {
        why.push(format!("dirty: {} pages", after.dirty_pages));
    }
    if after.writeback_pages > 0 {
        why.push(format!("writeback: {} pages", after.writeback_pages));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The recording of a window from the snapshots before and after it: pages that became
/// resident form the list, and so do pages that became shadow entries (read during the window,
/// then reclaimed by memory pressure before its end: without them a recording on a busy or
/// small-memory device silently loses pages). A page that was a shadow before, was read and was
/// reclaimed again cannot be told from one left alone, and is missed. Files written during the
/// window are left out entirely and reported instead, even if they were also read (a log the
/// command reads and appends to): their pages came from the writes, not from the disk, and the
/// entry's identity (size, mtime) would be stale at the next replay, failing that replay's
/// `--require`.
///
/// `traced`: pages the kernel added to each file's page cache during the window
/// ([`crate::trace`]), which close that gap: they are listed whatever became of them.
pub(crate) fn diff(
    before: &Snapshot,
    after: &Snapshot,
    traced: Option<&HashMap<crate::trace::FileKey, RangeSet>>,
) -> Diff {
    let mut out = Diff::default();
    for (path, st) in &after.files {
        let prev = before.files.get(path);
        let (resident, shadows) = match prev {
            Some(b) => (
                st.resident.difference(&b.resident),
                st.shadows.difference(&b.shadows).difference(&b.resident),
            ),
            None => (st.resident.clone(), st.shadows.clone()),
        };
        let reclaimed = shadows.difference(&resident).total_bytes();
        let mut new = resident.union(shadows);
        let id = &st.identity;
        let mut traced_only = 0;
        if let Some(t) = traced.and_then(|t| t.get(&(id.dev_major, id.dev_minor, id.ino))) {
            // Page granular events: the last page is clipped to the file, as residency is.
            let t = t.clip(id.size);
            traced_only = t.difference(&new).total_bytes();
            new = new.union(t);
        }
        if let Some(reason) = written_reason(prev, st, !new.is_empty()) {
            out.written.push(WrittenFile {
                path: path.clone(),
                reason,
            });
        } else if !new.is_empty() {
            out.reclaimed_bytes += reclaimed;
            out.traced_only_bytes += traced_only;
            out.entries.push(ListEntry {
                path: path.clone(),
                identity: Some(st.identity),
                extent: Extent::Ranges(new),
            });
        }
    }
    out.entries.sort_by(|a, b| a.path.cmp(&b.path));
    out.written.sort();
    out
}

/// What to record.
pub enum Trigger<'a> {
    /// Run this command and wait for it.
    Command(&'a mut std::process::Command),
    /// Just wait this long (something else does the reading).
    Duration(Duration),
}

/// Outcome of a recording.
#[derive(Debug)]
pub struct Recording {
    /// The readahead list: files (and their byte ranges) that became resident during the window, or
    /// that the trace saw inserted; sorted by path.
    pub entries: Vec<ListEntry>,
    /// Files written during the window (created, changed, or dirty at the end), left out of
    /// `entries`; sorted by path.
    pub written: Vec<WrittenFile>,
    /// Exit status of the command, if one was run.
    pub status: Option<std::process::ExitStatus>,
    /// Files under the roots whose residency could not be known in the final snapshot, with the
    /// reason; sorted by path.
    pub unknown: Vec<(PathBuf, String)>,
    /// Files measured in the final snapshot.
    pub files_scanned: usize,
    /// With eviction before the window: pages (of the system page size) that stayed resident
    /// despite it (mapped, mlocked), which the recording therefore cannot see being read; 0 without
    /// eviction.
    pub evicted_remaining_pages: u64,
    /// Bytes of `entries` that were read and then reclaimed during the window (found as
    /// shadow entries by the residency diff).
    pub reclaimed_bytes: u64,
    /// The page-cache trace, when asked for (the kernel's filemap tracepoint).
    pub trace: Option<TraceSummary>,
    /// Wall-clock length of the window: the command's run or the wait, not the snapshots.
    pub elapsed: Duration,
}

/// What the page-cache trace of a recording contributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceSummary {
    /// Page-cache insertions seen (all files, in scope or not).
    pub events: u64,
    /// Insertions the kernel dropped (reader behind): the trace is then incomplete.
    pub lost_events: u64,
    /// Bytes of the list only the trace saw.
    pub traced_only_bytes: u64,
    /// Files in scope on a file system the trace cannot name by device and inode (btrfs,
    /// overlayfs); their entries come from the residency diff alone.
    pub untraceable_files: u64,
}

/// Errors of a recording.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The recorded command could not be started (the cause is the `source`).
    #[error("cannot run the command {program:?}")]
    Spawn {
        /// The program that could not be started, as given.
        program: String,
        /// The error from spawning it (e.g. `NotFound`, `PermissionDenied`).
        #[source]
        source: std::io::Error,
    },
    /// A scope that does not exist or cannot be resolved: recording it would silently record
    /// nothing.
    #[error("scope {}", crate::list::escape_path(.path))]
    Scope {
        /// The scope root as given.
        path: PathBuf,
        /// Why it could not be resolved (canonicalize or stat failure).
        #[source]
        source: std::io::Error,
    },
    #[error("--trace")]
    /// The page-cache trace (`--trace`) could not be set up or read.
    Trace(#[from] crate::trace::TraceError),
}

/// Makes every root absolute and free of symlinks and `..`, so the list does not depend on
/// the working directory of the recording (a relative list replayed elsewhere is all
/// "missing").
pub(crate) fn canonical_roots(roots: &[PathBuf]) -> Result<Vec<PathBuf>, RecordError> {
    roots
        .iter()
        .map(|r| {
            std::fs::canonicalize(r).map_err(|source| RecordError::Scope {
                path: r.clone(),
                source,
            })
        })
        .collect()
}

/// Optionally evicts `roots`, snapshots, runs the trigger (traced with the kernel's filemap
/// tracepoint when `trace`), snapshots again and diffs. The roots are made absolute and free of
/// symlinks first; a missing root is an error, and so is a trace that cannot start.
pub fn record(
    roots: &[PathBuf],
    opts: &WalkOptions,
    evict_first: bool,
    trace: bool,
    trigger: Trigger<'_>,
) -> Result<Recording, RecordError> {
    record_with(roots, opts, evict_first, trace, trigger, &mut |_| {})
}

/// Where [`record_with`] is: each phase is announced as it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordPhase {
    /// Evicting the scope's pages (`evict_first`).
    Evicting,
    /// Snapshotting the scope's residency before the window.
    ScanningBefore,
    /// The window: the command runs, or the time passes.
    Window,
    /// Snapshotting the scope's residency after the window (and diffing).
    ScanningAfter,
}

/// [`record()`], calling `on_phase` as each [`RecordPhase`] starts (a CLI draws what it is
/// doing; the scans of a large scope take seconds).
pub fn record_with(
    roots: &[PathBuf],
    opts: &WalkOptions,
    evict_first: bool,
    trace: bool,
    trigger: Trigger<'_>,
    on_phase: &mut dyn FnMut(RecordPhase),
) -> Result<Recording, RecordError> {
    let roots = &canonical_roots(roots)?;
    let mut evicted_remaining_pages = 0;
    if evict_first {
        on_phase(RecordPhase::Evicting);
        evicted_remaining_pages = evict::evict(roots, opts).remaining_pages();
    }
    on_phase(RecordPhase::ScanningBefore);
    let before = snapshot(roots, opts);
    // Only the window is traced: the snapshots add no file pages, but need not be seen.
    let tracer = trace.then(crate::trace::PageTrace::start).transpose()?;
    on_phase(RecordPhase::Window);
    let t0 = Instant::now();
    let status = match trigger {
        Trigger::Command(c) => Some(c.status().map_err(|source| RecordError::Spawn {
            program: c.get_program().to_string_lossy().into_owned(),
            source,
        })?),
        Trigger::Duration(d) => {
            std::thread::sleep(d);
            None
        }
    };
    let elapsed = t0.elapsed();
    let traced = tracer.map(|t| t.stop()).transpose()?;
    on_phase(RecordPhase::ScanningAfter);
    let after = snapshot(roots, opts);
    let mut unknown = after.unknown.clone();
    unknown.sort();
    let d = diff(&before, &after, traced.as_ref().map(|t| &t.pages));
    let trace = traced.map(|t| TraceSummary {
        events: t.events,
        lost_events: t.lost_events,
        traced_only_bytes: d.traced_only_bytes,
        untraceable_files: crate::trace::untraceable_files(
            after
                .files
                .iter()
                .map(|(p, st)| (p.as_path(), (st.identity.dev_major, st.identity.dev_minor))),
        ),
    });
    Ok(Recording {
        entries: d.entries,
        written: d.written,
        status,
        unknown,
        files_scanned: after.files.len(),
        evicted_remaining_pages,
        reclaimed_bytes: d.reclaimed_bytes,
        trace,
        elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Range;
    use std::path::Path;

    #[test]
    fn record_with_announces_each_phase_in_order() {
        let dir = std::env::temp_dir().join(format!("snapblk-ra-phases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), [1u8; 8192]).unwrap();
        let w = WalkOptions {
            recursive: true,
            ..Default::default()
        };
        for evict_first in [false, true] {
            let mut seen = Vec::new();
            record_with(
                std::slice::from_ref(&dir),
                &w,
                evict_first,
                false,
                Trigger::Duration(std::time::Duration::ZERO),
                &mut |p| seen.push(p),
            )
            .unwrap();
            let mut want = vec![
                RecordPhase::ScanningBefore,
                RecordPhase::Window,
                RecordPhase::ScanningAfter,
            ];
            if evict_first {
                want.insert(0, RecordPhase::Evicting);
            }
            assert_eq!(seen, want);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trace_error_reads_once_in_a_report_of_the_whole_chain() {
        // What `anyhow`'s `{:#}` prints: each error of the chain, joined by ": ".
        let e = RecordError::from(crate::trace::TraceError::NoEvent);
        assert_eq!(
            snapblk_testsupport::errors::assert_cause_is_source(&e, None),
            "--trace: this kernel has no filemap:mm_filemap_add_to_page_cache trace event"
        );
        let e = RecordError::from(crate::trace::TraceError::Io {
            path: "/sys/kernel/tracing/instances/x".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        assert_eq!(
            snapblk_testsupport::errors::chain(&e),
            "--trace: tracefs /sys/kernel/tracing/instances/x: Permission denied (os error 13)"
        );
    }

    fn state(ino: u64, size: u64, pages: &[(u64, u64)], dirty: u64, wb: u64) -> FileState {
        FileState {
            identity: FileIdentity {
                dev_major: 8,
                dev_minor: 1,
                ino,
                size,
                mtime_sec: 1000,
                mtime_nsec: 5,
            },
            resident: set(pages),
            dirty_pages: dirty,
            writeback_pages: wb,
            shadows: RangeSet::new(),
        }
    }

    fn set(pages: &[(u64, u64)]) -> RangeSet {
        RangeSet::from_ranges(
            pages
                .iter()
                .map(|&(offset, len)| Range { offset, len })
                .collect(),
        )
    }

    #[test]
    fn pages_read_and_reclaimed_in_the_window_are_listed_from_their_shadows() {
        let with_shadows = |mut st: FileState, sh: &[(u64, u64)]| {
            st.shadows = set(sh);
            st
        };
        const SIZE: u64 = 6 * 4096 - 100;
        let before = snap(vec![
            // Page 0 resident, page 2 an old shadow.
            (
                "/t/a",
                with_shadows(state(1, SIZE, &[(0, 4096)], 0, 0), &[(8192, 4096)]),
            ),
            ("/t/b", state(2, 8192, &[], 0, 0)),
        ]);
        let after = snap(vec![
            // Page 0 reclaimed (resident before: not read in the window), page 1 read, page 2
            // still the old shadow, pages 3-4 read and reclaimed, page 5 (partial) read.
            (
                "/t/a",
                with_shadows(
                    state(1, SIZE, &[(4096, 4096), (5 * 4096, 3996)], 0, 0),
                    &[(0, 4096), (8192, 3 * 4096)],
                ),
            ),
            // Only reclaimed pages: still an entry.
            (
                "/t/b",
                with_shadows(state(2, 8192, &[], 0, 0), &[(0, 8192)]),
            ),
        ]);
        let d = diff(&before, &after, None);
        assert!(d.written.is_empty(), "{:?}", d.written);
        assert_eq!(d.entries.len(), 2);
        assert_eq!(
            d.entries[0].extent,
            Extent::Ranges(set(&[(4096, 4096), (3 * 4096, 2 * 4096 + 3996)]))
        );
        assert_eq!(d.entries[1].extent, Extent::Ranges(set(&[(0, 8192)])));
        assert_eq!(d.reclaimed_bytes, 2 * 4096 + 8192);

        // Page 2 (an old shadow, still one) was read and reclaimed again: only the trace
        // shows it. Traced pages of other files and past the end are not listed.
        let mut traced = HashMap::new();
        // state() puts files on device 8:1.
        traced.insert((8, 1, 1), set(&[(4096, 3 * 4096), (5 * 4096, 4096)]));
        traced.insert((8, 1, 99), set(&[(0, 4096)]));
        let d = diff(&before, &after, Some(&traced));
        assert_eq!(
            d.entries[0].extent,
            Extent::Ranges(set(&[(4096, 4 * 4096 + 3996)]))
        );
        assert_eq!(d.traced_only_bytes, 4096);
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.reclaimed_bytes, 2 * 4096 + 8192);
    }

    fn snap(files: Vec<(&str, FileState)>) -> Snapshot {
        Snapshot {
            files: files
                .into_iter()
                .map(|(p, s)| (PathBuf::from(p), s))
                .collect(),
            unknown: Vec::new(),
        }
    }

    #[test]
    fn written_files_are_left_out_and_reported() {
        let mut appended = state(2, 9000, &[(0, 9000)], 0, 0);
        appended.identity.mtime_nsec = 6;
        let before = snap(vec![
            ("/t/read", state(1, 8192, &[(0, 4096)], 0, 0)),
            ("/t/log", state(2, 8000, &[], 0, 0)),
            ("/t/inplace", state(3, 4096, &[], 0, 0)),
            ("/t/old-dirty", state(5, 4096, &[(0, 4096)], 1, 0)),
            ("/t/dirty-read", state(6, 8192, &[(0, 4096)], 1, 0)),
            ("/t/untouched", state(7, 4096, &[], 0, 0)),
        ]);
        let after = snap(vec![
            // Read: the new page is the entry.
            ("/t/read", state(1, 8192, &[(0, 8192)], 0, 0)),
            // Read and appended to (a log): left out although it was read.
            ("/t/log", appended),
            // Created by the command.
            ("/t/new", state(10, 100000, &[(0, 100000)], 0, 25)),
            // Rewritten in place within one mtime tick: only the dirty pages tell.
            ("/t/inplace", state(3, 4096, &[(0, 4096)], 1, 0)),
            // Dirty from before the window, untouched: nothing to leave out, not reported.
            ("/t/old-dirty", state(5, 4096, &[(0, 4096)], 1, 0)),
            // Dirty from before, and more of it became resident: left out.
            ("/t/dirty-read", state(6, 8192, &[(0, 8192)], 0, 2)),
            ("/t/untouched", state(7, 4096, &[], 0, 0)),
        ]);
        let d = diff(&before, &after, None);
        assert_eq!(d.entries.len(), 1, "{:?}", d.entries);
        assert_eq!(d.entries[0].path, Path::new("/t/read"));
        assert_eq!(
            d.entries[0].extent,
            Extent::Ranges(RangeSet::from_ranges(vec![Range {
                offset: 4096,
                len: 4096
            }]))
        );
        let w: Vec<(&str, &str)> = d
            .written
            .iter()
            .map(|w| (w.path.to_str().unwrap(), w.reason.as_str()))
            .collect();
        assert_eq!(
            w,
            [
                ("/t/dirty-read", "writeback: 2 pages"),
                ("/t/inplace", "dirty: 1 pages"),
                ("/t/log", "changed: size, mtime"),
                ("/t/new", "created; writeback: 25 pages"),
            ]
        );
    }

    #[test]
    fn scopes_are_made_absolute_and_missing_ones_refused() {
        let dir = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-scope-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let odd = dir.join("sub/../sub/.");
        let got = canonical_roots(std::slice::from_ref(&odd)).unwrap();
        assert_eq!(got, vec![std::fs::canonicalize(dir.join("sub")).unwrap()]);
        assert!(got[0].is_absolute());
        let missing = dir.join("nosuch");
        let err = record(
            &[dir.clone(), missing.clone()],
            &WalkOptions::default(),
            false,
            false,
            Trigger::Duration(Duration::ZERO),
        )
        .unwrap_err();
        assert!(
            matches!(&err, RecordError::Scope { path, .. } if *path == missing),
            "{err}"
        );
        let line = snapblk_testsupport::errors::assert_cause_is_source(&err, None);
        assert!(line.contains("No such file"), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
