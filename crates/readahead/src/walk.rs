//! Parallel directory walk: a few threads share a stack of directories, so cold metadata reads
//! overlap. Symlinks inside trees are not followed; command-line roots are. Pseudo filesystems
//! (proc, sysfs, tmpfs, ...) are skipped when crossed, since their pages cannot be evicted or
//! read ahead.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// Options of a walk.
#[derive(Debug, Clone)]
pub struct WalkOptions {
    pub recursive: bool,
    /// Do not descend into other filesystems than the root's.
    pub one_file_system: bool,
    pub threads: usize,
}

impl Default for WalkOptions {
    fn default() -> Self {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get());
        WalkOptions {
            recursive: false,
            one_file_system: false,
            threads: (2 * n).clamp(2, 16),
        }
    }
}

/// A path that could not be walked.
#[derive(Debug, Clone)]
pub struct WalkError {
    pub path: PathBuf,
    pub error: String,
}

// statfs magic numbers of filesystems whose pages are not evictable/readable-ahead file data.
const PSEUDO_FS: &[i64] = &[
    0x9fa0,      // proc
    0x6265_6572, // sysfs
    0x0102_1994, // tmpfs
    0x1cd1,      // devpts
    0x6367_7270, // cgroup2
    0x0027_e0eb, // cgroup
    0x6462_6720, // debugfs
    0x7472_6163, // tracefs
    0x7363_6673, // securityfs
    0xcafe_4a11, // bpf
    0x4249_4e4d, // binfmt_misc
    0x6e73_6673, // nsfs
    0x5053_4f50, // pstore
    0x6573_5546, // fusectl
    0x8584_58f6, // ramfs
    0x9584_58f6, // hugetlbfs
    0x1980_0202, // mqueue
];

/// Remembers (device, inode) of multiply linked files so each is handled once.
#[derive(Default)]
pub struct LinkDedup(Mutex<HashSet<(u64, u64)>>);

impl LinkDedup {
    /// True the first time a given file is seen (always true for singly linked files).
    pub fn first_visit(&self, m: &std::fs::Metadata) -> bool {
        m.nlink() <= 1
            || self
                .0
                .lock()
                .map(|mut s| s.insert((m.dev(), m.ino())))
                .unwrap_or(true)
    }
}

fn is_pseudo(path: &Path) -> bool {
    match std::fs::File::open(path) {
        Ok(f) => crate::sys::fs_type(std::os::fd::AsFd::as_fd(&f))
            .map(|t| PSEUDO_FS.contains(&t))
            .unwrap_or(false),
        Err(_) => false,
    }
}

struct Queue {
    dirs: Vec<(PathBuf, u64)>,
    active: usize,
}

/// One directory being read by a walker. Dropping it hands the subdirectories found to the
/// queue and wakes the waiting walkers, also when `on_file` panics: the other walkers then
/// finish and `thread::scope` passes the panic on, instead of everyone waiting forever for a
/// directory that will never be done.
struct InProgress<'a> {
    queue: &'a Mutex<Queue>,
    cv: &'a Condvar,
    subdirs: Vec<(PathBuf, u64)>,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        if let Ok(mut q) = self.queue.lock() {
            q.dirs.append(&mut self.subdirs);
            q.active -= 1;
        }
        self.cv.notify_all();
    }
}

/// Walks `roots`, calling `on_file(path)` for every regular file (from several threads, in no
/// particular order). Callers de-duplicate hard links with [`LinkDedup`] after their own fstat.
pub fn walk<F>(roots: &[PathBuf], opts: &WalkOptions, on_file: F) -> Vec<WalkError>
where
    F: Fn(&Path) + Sync,
{
    walk_with(roots, opts, || (), |p, _| on_file(p), |_| ())
}

/// [`walk`] with per-thread state: each walker thread calls `init` once, passes its state to
/// every `on_file` call it makes, and hands it to `finish` when the walk is over (root files
/// given on the command line are handled on the calling thread, with their own state). Lets
/// callers do per-file work inside the walk (overlapping it with directory reading) and
/// clean up per thread.
pub fn walk_with<S, I, F, D>(
    roots: &[PathBuf],
    opts: &WalkOptions,
    init: I,
    on_file: F,
    finish: D,
) -> Vec<WalkError>
where
    I: Fn() -> S + Sync,
    F: Fn(&Path, &mut S) + Sync,
    D: Fn(S) + Sync,
{
    let errors = Mutex::new(Vec::new());
    let queue = Mutex::new(Queue {
        dirs: Vec::new(),
        active: 0,
    });
    let cv = Condvar::new();
    let err = |p: &Path, e: String| {
        if let Ok(mut v) = errors.lock() {
            v.push(WalkError {
                path: p.to_path_buf(),
                error: e,
            });
        }
    };

    let mut root_state = None;
    for root in roots {
        match std::fs::metadata(root) {
            Ok(m) if m.is_file() => on_file(root, root_state.get_or_insert_with(&init)),
            Ok(m) if m.is_dir() => {
                if opts.recursive {
                    if let Ok(mut q) = queue.lock() {
                        q.dirs.push((root.clone(), m.dev()));
                    }
                } else {
                    err(root, "is a directory (use -r)".into());
                }
            }
            Ok(_) => err(root, "not a regular file or directory".into()),
            Err(e) => err(root, e.to_string()),
        }
    }

    if let Some(st) = root_state {
        finish(st);
    }
    let has_dirs = queue.lock().map(|q| !q.dirs.is_empty()).unwrap_or(false);
    std::thread::scope(|s| {
        for _ in 0..if has_dirs { opts.threads.max(1) } else { 0 } {
            s.spawn(|| {
                let mut state = init();
                loop {
                    let (dir, root_dev) = {
                        let Ok(mut q) = queue.lock() else { return };
                        loop {
                            if let Some(d) = q.dirs.pop() {
                                q.active += 1;
                                break d;
                            }
                            if q.active == 0 {
                                cv.notify_all();
                                drop(q);
                                finish(state);
                                return;
                            }
                            // Waiting for work is idle time, not an I/O stall (see ownstall).
                            let idle = crate::ownstall::idle();
                            q = match cv.wait(q) {
                                Ok(q) => q,
                                Err(_) => return,
                            };
                            drop(idle);
                        }
                    };
                    let mut busy = InProgress {
                        queue: &queue,
                        cv: &cv,
                        subdirs: Vec::new(),
                    };
                    match std::fs::read_dir(&dir) {
                        Err(e) => err(&dir, e.to_string()),
                        Ok(rd) => {
                            for ent in rd {
                                let ent = match ent {
                                    Ok(e) => e,
                                    Err(e) => {
                                        err(&dir, e.to_string());
                                        continue;
                                    }
                                };
                                let Ok(ft) = ent.file_type() else { continue };
                                let p = ent.path();
                                if ft.is_file() {
                                    on_file(&p, &mut state);
                                } else if ft.is_dir() {
                                    match std::fs::symlink_metadata(&p) {
                                        Ok(m) => {
                                            let dev = m.dev();
                                            if dev != root_dev
                                                && (opts.one_file_system || is_pseudo(&p))
                                            {
                                                continue;
                                            }
                                            busy.subdirs.push((p, dev));
                                        }
                                        Err(e) => err(&p, e.to_string()),
                                    }
                                }
                            }
                        }
                    }
                    drop(busy);
                }
            });
        }
    });
    errors.into_inner().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// `root/d{0..4}/e{0..4}/f{0..3}`: 64 files in 20 directories below the root.
    fn tree(tag: &str) -> snapblk_testsupport::TempDir {
        let d = snapblk_testsupport::TempDir::new(tag);
        for i in 0..4 {
            for j in 0..4 {
                let dir = d.join(&format!("d{i}/e{j}"));
                std::fs::create_dir_all(&dir).unwrap();
                for k in 0..4 {
                    std::fs::write(dir.join(format!("f{k}")), b"x").unwrap();
                }
            }
        }
        d
    }

    fn opts(threads: usize) -> WalkOptions {
        WalkOptions {
            recursive: true,
            one_file_system: false,
            threads,
        }
    }

    #[test]
    fn every_file_once_with_any_number_of_threads() {
        let d = tree("walk-all");
        for threads in [1, 2, 7] {
            let seen = Mutex::new(Vec::new());
            let errors = walk(&[d.path().to_path_buf()], &opts(threads), |p| {
                seen.lock().unwrap().push(p.to_path_buf())
            });
            assert!(errors.is_empty(), "{errors:?}");
            let seen = seen.into_inner().unwrap();
            let set: BTreeSet<_> = seen.iter().collect();
            assert_eq!((seen.len(), set.len()), (64, 64), "threads {threads}");
        }
    }

    /// A panicking callback reaches the caller; the other walkers do not wait forever for the
    /// directory the panicking one was reading.
    #[test]
    fn a_panic_in_the_callback_reaches_the_caller() {
        let d = tree("walk-panic");
        let root = d.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(|| {
                walk(&[root], &opts(4), |p| {
                    if p.ends_with("d2/e1/f3") {
                        panic!("callback failed on {}", p.display());
                    }
                })
            });
            let _ = tx.send(r.is_err());
        });
        // Generous: the walk itself takes milliseconds; without the fix it never returns.
        let panicked = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("walk hung after its callback panicked");
        assert!(panicked, "the callback's panic was swallowed");
    }
}
