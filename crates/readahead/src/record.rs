//! Recording: residency snapshots of a set of trees before and after a command (or a time
//! window); pages that became resident in between form the readahead list. No tracing and no
//! kernel patches are needed. Pages that were already resident before cannot be seen being
//! used, which is why `evict_first` exists; kernel readahead done on behalf of the command is
//! recorded too, because it is what the command caused to be read.

use crate::evict;
use crate::list::{Extent, FileIdentity, ListEntry};
use crate::ranges::RangeSet;
use crate::residency;
use crate::walk::{self, LinkDedup, WalkOptions};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Resident ranges of every file under some trees at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub files: HashMap<PathBuf, (FileIdentity, RangeSet)>,
    /// Files whose residency could not be known, with the reason.
    pub unknown: Vec<(PathBuf, String)>,
}

/// Takes a residency snapshot of `roots`.
pub fn snapshot(roots: &[PathBuf], opts: &WalkOptions) -> Snapshot {
    let snap = Mutex::new(Snapshot::default());
    let dedup = LinkDedup::default();
    walk::walk(roots, opts, |p| {
        let Ok(f) = residency::open_quiet(p) else {
            return;
        };
        let Ok(meta) = f.metadata() else { return };
        if !meta.is_file() || !dedup.first_visit(&meta) {
            return;
        }
        let r = residency::resident_ranges(&f, p, &meta);
        if let Ok(mut s) = snap.lock() {
            match r {
                Ok(rs) => {
                    s.files
                        .insert(p.to_path_buf(), (FileIdentity::of(&meta), rs));
                }
                Err(reason) => s.unknown.push((p.to_path_buf(), reason)),
            }
        }
    });
    snap.into_inner().unwrap_or_default()
}

/// Pages resident in `after` but not in `before`, as list entries sorted by path. A file whose
/// identity changed in between counts as entirely new.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Vec<ListEntry> {
    let mut out: Vec<ListEntry> = after
        .files
        .iter()
        .filter_map(|(path, (id, rs))| {
            let new = match before.files.get(path) {
                Some((bid, brs)) if bid == id => rs.difference(brs),
                _ => rs.clone(),
            };
            (!new.is_empty()).then(|| ListEntry {
                path: path.clone(),
                identity: Some(*id),
                extent: Extent::Ranges(new),
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
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
    pub entries: Vec<ListEntry>,
    /// Exit status of the command, if one was run.
    pub status: Option<std::process::ExitStatus>,
    pub unknown: Vec<(PathBuf, String)>,
    pub files_scanned: usize,
    pub evicted_remaining_pages: u64,
    pub elapsed: Duration,
}

/// Errors of a recording.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot run the command: {0}")]
    Spawn(std::io::Error),
    /// A scope that does not exist or cannot be resolved: recording it would silently record
    /// nothing.
    #[error("scope {}: {err}", crate::list::escape_path(.path))]
    Scope { path: PathBuf, err: std::io::Error },
}

/// Makes every root absolute and free of symlinks and `..`, so the list does not depend on
/// the working directory of the recording (a relative list replayed elsewhere is all
/// "missing").
pub fn canonical_roots(roots: &[PathBuf]) -> Result<Vec<PathBuf>, RecordError> {
    roots
        .iter()
        .map(|r| {
            std::fs::canonicalize(r).map_err(|err| RecordError::Scope {
                path: r.clone(),
                err,
            })
        })
        .collect()
}

/// Optionally evicts `roots`, snapshots, runs the trigger, snapshots again and diffs. The
/// roots are made absolute first ([`canonical_roots`]); a missing root is an error.
pub fn record(
    roots: &[PathBuf],
    opts: &WalkOptions,
    evict_first: bool,
    trigger: Trigger<'_>,
) -> Result<Recording, RecordError> {
    let roots = &canonical_roots(roots)?;
    let mut evicted_remaining_pages = 0;
    if evict_first {
        evicted_remaining_pages = evict::evict(roots, opts).remaining_pages();
    }
    let before = snapshot(roots, opts);
    let t0 = Instant::now();
    let status = match trigger {
        Trigger::Command(c) => Some(c.status().map_err(RecordError::Spawn)?),
        Trigger::Duration(d) => {
            std::thread::sleep(d);
            None
        }
    };
    let elapsed = t0.elapsed();
    let after = snapshot(roots, opts);
    let mut unknown = after.unknown.clone();
    unknown.sort();
    Ok(Recording {
        entries: diff(&before, &after),
        status,
        unknown,
        files_scanned: after.files.len(),
        evicted_remaining_pages,
        elapsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Trigger::Duration(Duration::ZERO),
        )
        .unwrap_err();
        assert!(
            matches!(&err, RecordError::Scope { path, .. } if *path == missing),
            "{err}"
        );
        assert!(err.to_string().contains("No such file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
