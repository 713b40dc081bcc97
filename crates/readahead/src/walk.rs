//! Parallel directory walk: a few threads share a stack of directories, so cold metadata reads
//! overlap. Symlinks inside trees are followed only with [`WalkOptions::follow_symlinks`]
//! (vmtouch's `-f`; each directory is then entered once, so link loops end); command-line
//! roots always are. Pseudo filesystems
//! (proc, sysfs, tmpfs, ...) are skipped when crossed, since their pages cannot be evicted or
//! read ahead.

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use std::collections::HashSet;
use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// A regular file found by a walk: its path (for reports) and, when the walk found it inside
/// a directory it is reading, that directory's fd and the file's name in it.
pub struct Found<'a> {
    path: &'a Path,
    at: Option<(BorrowedFd<'a>, &'a CStr)>,
}

impl<'a> Found<'a> {
    /// A file named by its path alone (a command-line root, a list entry).
    pub fn by_path(path: &'a Path) -> Found<'a> {
        Found { path, at: None }
    }

    /// The file's path (under the root it was found from).
    pub fn path(&self) -> &'a Path {
        self.path
    }

    /// Opens the file as [`crate::residency::open_quiet`] does, relative to its directory when
    /// the walk has that open: the kernel then looks up one name instead of the whole path
    /// (path lookup was the largest cost left in re-warming a resident tree).
    pub fn open_quiet(&self) -> std::io::Result<File> {
        match self.at {
            Some((dir, name)) => crate::residency::open_quiet_at(dir, name),
            None => crate::residency::open_quiet(self.path),
        }
    }
}

/// Options of a walk.
#[derive(Debug, Clone)]
pub struct WalkOptions {
    /// Walk directories given as roots, all the way down; otherwise a directory root is reported
    /// as an error ("is a directory (use -r)") and only file roots are visited.
    pub recursive: bool,
    /// Do not descend into other filesystems than the root's.
    pub one_file_system: bool,
    /// Worker threads walking and measuring in parallel; default twice the CPUs, 2..=16.
    pub threads: usize,
    /// Follow symlinks met inside directories (vmtouch's `-f`) to files and directories; a
    /// dangling link is skipped. Every directory is entered at most once.
    pub follow_symlinks: bool,
}

impl Default for WalkOptions {
    fn default() -> Self {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get());
        WalkOptions {
            recursive: false,
            one_file_system: false,
            threads: (2 * n).clamp(2, 16),
            follow_symlinks: false,
        }
    }
}

/// A path that could not be walked.
#[derive(Debug, Clone)]
pub struct WalkError {
    /// The path that failed.
    pub path: PathBuf,
    /// Why, as text: an I/O error, "is a directory (use -r)", "not a regular file or directory".
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
pub(crate) struct LinkDedup(Mutex<HashSet<(u64, u64)>>);

impl LinkDedup {
    /// True the first time a given file is seen (always true for singly linked files).
    pub(crate) fn first_visit(&self, m: &std::fs::Metadata) -> bool {
        m.nlink() <= 1
            || self
                .0
                .lock()
                .map(|mut s| s.insert((m.dev(), m.ino())))
                .unwrap_or(true)
    }
}

/// Opens a directory for reading its entries. Its fd (`Dir::fd`) stays open while the
/// entries are handled, so files and subdirectories are opened and stat'ed relative to it.
fn read_dir_at(dir: &Path) -> std::io::Result<Dir> {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(Dir::new(fd)?)
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

/// Walks `roots`, calling `on_file(found)` for every regular file (from several threads, in no
/// particular order). Callers de-duplicate hard links after their own fstat.
pub fn walk<F>(roots: &[PathBuf], opts: &WalkOptions, on_file: F) -> Vec<WalkError>
where
    F: Fn(&Found<'_>) + Sync,
{
    walk_with(roots, opts, || (), |f, _| on_file(f), |_| ())
}

/// [`walk`] with per-thread state: each walker thread calls `init` once, passes its state to
/// every `on_file` call it makes, and hands it to `finish` when the walk is over (root files
/// given on the command line are handled on the calling thread, with their own state). Lets
/// callers do per-file work inside the walk (overlapping it with directory reading) and
/// clean up per thread.
pub(crate) fn walk_with<S, I, F, D>(
    roots: &[PathBuf],
    opts: &WalkOptions,
    init: I,
    on_file: F,
    finish: D,
) -> Vec<WalkError>
where
    I: Fn() -> S + Sync,
    F: Fn(&Found<'_>, &mut S) + Sync,
    D: Fn(S) + Sync,
{
    let errors = Mutex::new(Vec::new());
    let queue = Mutex::new(Queue {
        dirs: Vec::new(),
        active: 0,
    });
    let cv = Condvar::new();
    // With follow_symlinks: the directories queued so far, so that a link back up the tree
    // (or two links to one directory) does not walk it again.
    let seen_dirs: Mutex<HashSet<(u64, u64)>> = Mutex::new(HashSet::new());
    let first_dir = |dev: u64, ino: u64| {
        !opts.follow_symlinks
            || seen_dirs
                .lock()
                .map(|mut s| s.insert((dev, ino)))
                .unwrap_or(true)
    };
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
            Ok(m) if m.is_file() => {
                on_file(&Found::by_path(root), root_state.get_or_insert_with(&init))
            }
            Ok(m) if m.is_dir() => {
                if opts.recursive {
                    if first_dir(m.dev(), m.ino())
                        && let Ok(mut q) = queue.lock()
                    {
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
                    match read_dir_at(&dir) {
                        Err(e) => err(&dir, e.to_string()),
                        Ok(mut rd) => {
                            while let Some(ent) = rd.read() {
                                let (ent, dirfd) = match (ent, rd.fd()) {
                                    (Ok(e), Ok(fd)) => (e, fd),
                                    (Err(e), _) | (_, Err(e)) => {
                                        err(&dir, std::io::Error::from(e).to_string());
                                        break;
                                    }
                                };
                                let name = ent.file_name();
                                if name == c"." || name == c".." {
                                    continue;
                                }
                                let p = dir.join(OsStr::from_bytes(name.to_bytes()));
                                // d_type, or a stat where the filesystem does not fill it in.
                                let mut stat = None;
                                let mut ft = ent.file_type();
                                if ft == FileType::Symlink && opts.follow_symlinks {
                                    // What the link points to; a dangling one is skipped.
                                    match rustix::fs::statat(dirfd, name, AtFlags::empty()) {
                                        Ok(st) => {
                                            ft = FileType::from_raw_mode(st.st_mode);
                                            stat = Some(st);
                                        }
                                        Err(_) => continue,
                                    }
                                } else if ft == FileType::Unknown {
                                    match rustix::fs::statat(dirfd, name, AtFlags::SYMLINK_NOFOLLOW)
                                    {
                                        Ok(st) => {
                                            ft = FileType::from_raw_mode(st.st_mode);
                                            stat = Some(st);
                                        }
                                        Err(e) => {
                                            err(&p, std::io::Error::from(e).to_string());
                                            continue;
                                        }
                                    }
                                }
                                if ft == FileType::RegularFile {
                                    let found = Found {
                                        path: &p,
                                        at: Some((dirfd, name)),
                                    };
                                    on_file(&found, &mut state);
                                } else if ft == FileType::Directory {
                                    let st = match stat {
                                        Some(st) => Ok(st),
                                        None => rustix::fs::statat(
                                            dirfd,
                                            name,
                                            AtFlags::SYMLINK_NOFOLLOW,
                                        ),
                                    };
                                    match st {
                                        Ok(st) => {
                                            #[allow(clippy::unnecessary_cast)]
                                            // u32 on some targets
                                            let dev = st.st_dev as u64;
                                            if dev != root_dev
                                                && (opts.one_file_system || is_pseudo(&p))
                                            {
                                                continue;
                                            }
                                            #[allow(clippy::unnecessary_cast)]
                                            if !first_dir(dev, st.st_ino as u64) {
                                                continue;
                                            }
                                            busy.subdirs.push((p, dev));
                                        }
                                        Err(e) => err(&p, std::io::Error::from(e).to_string()),
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
            follow_symlinks: false,
        }
    }

    #[test]
    fn symlinks_are_followed_only_when_asked_and_loops_end() {
        let d = tree("walk-links");
        let out = snapblk_testsupport::TempDir::new("walk-links-out");
        std::fs::write(out.join("outside"), b"y").unwrap();
        let root = d.path();
        std::os::unix::fs::symlink(out.join("outside"), root.join("d0/to-file")).unwrap();
        std::os::unix::fs::symlink(out.path(), root.join("d1/to-dir")).unwrap();
        // A loop: d2/e0/up -> d2, and a dangling link.
        std::os::unix::fs::symlink(root.join("d2"), root.join("d2/e0/up")).unwrap();
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("d3/dangling")).unwrap();
        for (follow, want) in [(false, 64), (true, 64 + 2)] {
            for threads in [1, 4] {
                let seen = Mutex::new(Vec::new());
                let o = WalkOptions {
                    follow_symlinks: follow,
                    ..opts(threads)
                };
                let errors = walk(&[root.to_path_buf()], &o, |f| {
                    seen.lock().unwrap().push(f.path().to_path_buf())
                });
                assert!(errors.is_empty(), "{errors:?}");
                let seen = seen.into_inner().unwrap();
                assert_eq!(
                    seen.len(),
                    want,
                    "follow {follow}, threads {threads}: {seen:?}"
                );
                if follow {
                    assert!(seen.iter().any(|p| p.ends_with("d0/to-file")));
                    assert!(seen.iter().any(|p| p.ends_with("d1/to-dir/outside")));
                }
            }
        }
    }

    #[test]
    fn every_file_once_with_any_number_of_threads() {
        let d = tree("walk-all");
        for threads in [1, 2, 7] {
            let seen = Mutex::new(Vec::new());
            let errors = walk(&[d.path().to_path_buf()], &opts(threads), |f| {
                seen.lock().unwrap().push(f.path().to_path_buf())
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
                walk(&[root], &opts(4), |f| {
                    if f.path().ends_with("d2/e1/f3") {
                        panic!("callback failed on {}", f.path().display());
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
