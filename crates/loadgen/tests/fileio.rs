//! The I/O pattern of the IOzone-style file tests and of the overwrite test, seen through a
//! recording layer over the real file: which offsets each test touches and in what order,
//! where fsync/fdatasync and evictions happen, and whether `drop_cache` really leaves the file
//! out of the page cache when a read test starts (measured with cachestat/mincore).

use snapblk_core::{ReadAt, WriteAt};
use snapblk_loadgen::fileio::{
    self, Cell, FileIo, FileTestSpec, RealIo, TESTS, TestFile, run_file_tests_with,
};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Open {
        create: bool,
    },
    Read {
        off: u64,
        len: usize,
    },
    Write {
        off: u64,
        len: usize,
    },
    Fsync,
    Fdatasync,
    Evict,
    /// Pages of the file in the page cache just before the first read after an open, and
    /// pages reclaimed from it (shadow entries).
    ResidentBeforeRead(u64, u64),
}

type Log = Arc<Mutex<Vec<Op>>>;

struct Recorder(Log);

struct RecFile {
    f: File,
    path: PathBuf,
    log: Log,
    read_yet: std::cell::Cell<bool>,
}

impl RecFile {
    fn push(&self, op: Op) {
        self.log.lock().unwrap().push(op);
    }

    /// Log a read of `len` bytes at `off`, after the page-cache residency before the first one.
    fn log_read(&self, off: u64, len: usize) -> std::io::Result<()> {
        if !self.read_yet.replace(true) {
            let meta = self.f.metadata()?;
            let r = snapblk_readahead::measure(&self.f, &self.path, &meta, None);
            let snapblk_readahead::Residency::Known {
                resident_pages,
                evicted_pages,
                ..
            } = r
            else {
                panic!("residency not measurable as root/owner: {r:?}");
            };
            self.push(Op::ResidentBeforeRead(resident_pages, evicted_pages));
        }
        self.push(Op::Read { off, len });
        Ok(())
    }
}

impl ReadAt for RecFile {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        self.log_read(off, buf.len())?;
        self.f.read_at(off, buf)
    }
    fn size(&self) -> std::io::Result<u64> {
        self.f.size()
    }
    fn read_exact_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.log_read(off, buf.len())?;
        self.f.read_exact_at(off, buf)
    }
}

impl WriteAt for RecFile {
    fn write_all_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        self.push(Op::Write {
            off,
            len: buf.len(),
        });
        self.f.write_all_at(off, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.push(Op::Fdatasync);
        self.f.sync_data()
    }
}

impl TestFile for RecFile {
    fn sync_all(&self) -> std::io::Result<()> {
        self.push(Op::Fsync);
        TestFile::sync_all(&self.f)
    }
    fn evict(&self) {
        self.push(Op::Evict);
        TestFile::evict(&self.f)
    }
}

impl FileIo for Recorder {
    fn open(
        &self,
        path: &Path,
        create: bool,
        direct: bool,
    ) -> snapblk_loadgen::Result<Box<dyn TestFile>> {
        self.0.lock().unwrap().push(Op::Open { create });
        Ok(Box::new(RecFile {
            f: fileio::open(path, create, direct)?,
            path: path.to_path_buf(),
            log: self.0.clone(),
            read_yet: std::cell::Cell::new(false),
        }))
    }
}

/// A scratch directory on a disk-backed file system (the target dir): tmpfs cannot evict,
/// its pages are the data.
fn disk_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-fileio-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // SAFETY: statfs is plain data; all zeros is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(d.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path and an exclusively borrowed struct.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
    assert_ne!(
        st.f_type,
        libc::TMPFS_MAGIC,
        "{}: need a disk-backed file system to test eviction",
        d.display()
    );
    d
}

/// Run a sweep through the recorder: every cell with the operations it made.
fn recorded(spec: &FileTestSpec) -> Vec<(Cell, Vec<Op>)> {
    let log: Log = Arc::default();
    let mut out = Vec::new();
    run_file_tests_with(spec, &Recorder(log.clone()), None, |c| {
        out.push((c.clone(), std::mem::take(&mut *log.lock().unwrap())));
    })
    .unwrap();
    assert!(log.lock().unwrap().is_empty(), "I/O after the last cell");
    out
}

fn spec(dir: &Path, fsync: bool, drop_cache: bool) -> FileTestSpec {
    FileTestSpec {
        dir: dir.to_path_buf(),
        file_sizes: vec![256 << 10],
        record_sizes: vec![4096],
        tests: TESTS.iter().map(|s| s.to_string()).collect(),
        fsync,
        direct: false,
        drop_cache,
        seed: 7,
    }
}

/// Offsets of the reads or writes of one cell, checking every one is a whole record.
fn offsets(ops: &[Op], rs: u64) -> Vec<u64> {
    ops.iter()
        .filter_map(|o| match o {
            Op::Read { off, len } | Op::Write { off, len } => {
                assert_eq!(*len as u64, rs, "{o:?}");
                assert_eq!(off % rs, 0, "{o:?}");
                Some(*off)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn sequential_tests_are_sequential_and_random_tests_random() {
    let d = disk_dir("pattern");
    let rs = 4096u64;
    let n = (256 << 10) / rs;
    let cells = recorded(&spec(&d, false, false));
    let names: Vec<&str> = cells.iter().map(|(c, _)| c.test.as_str()).collect();
    assert_eq!(names, TESTS);
    let in_order: Vec<u64> = (0..n).map(|i| i * rs).collect();
    for (c, ops) in &cells {
        let write = matches!(c.test.as_str(), "write" | "rewrite" | "randwrite");
        // One open per test, creating the file only for `write`.
        assert_eq!(
            ops[0],
            Op::Open {
                create: c.test == "write"
            },
            "{}",
            c.test
        );
        assert!(
            ops.iter().all(|o| match o {
                Op::Read { .. } => !write,
                Op::Write { .. } => write,
                _ => true,
            }),
            "{}: {ops:?}",
            c.test
        );
        let offs = offsets(ops, rs);
        assert_eq!(offs.len() as u64, c.ops, "{}", c.test);
        if c.test.starts_with("rand") {
            // Every record exactly once, in an order far from sequential.
            let mut sorted = offs.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, in_order, "{}", c.test);
            let next = offs.windows(2).filter(|w| w[1] == w[0] + rs).count();
            assert!(next < offs.len() / 8, "{}: {next} sequential steps", c.test);
        } else {
            assert_eq!(offs, in_order, "{}", c.test);
        }
    }
    // Two random tests draw the same permutation (same seed), as IOzone's do.
    let perm = |t: &str| offsets(&cells.iter().find(|(c, _)| c.test == t).unwrap().1, rs);
    assert_eq!(perm("randread"), perm("randwrite"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn fsync_is_part_of_the_write_tests_only_when_asked() {
    let d = disk_dir("fsync");
    for fsync in [true, false] {
        for (c, ops) in recorded(&spec(&d, fsync, false)) {
            let write = matches!(c.test.as_str(), "write" | "rewrite" | "randwrite");
            let syncs = ops.iter().filter(|o| **o == Op::Fsync).count();
            assert!(!ops.contains(&Op::Fdatasync), "{}: {ops:?}", c.test);
            if fsync && write {
                // Once, after the last write (inside the timed part, IOzone -e).
                assert_eq!(syncs, 1, "{}: {ops:?}", c.test);
                assert_eq!(ops.last(), Some(&Op::Fsync), "{}", c.test);
            } else {
                assert_eq!(syncs, 0, "{} (fsync {fsync}): {ops:?}", c.test);
            }
            assert_eq!(c.fsync, fsync && write);
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn drop_cache_evicts_the_file_before_each_cold_read_test() {
    let d = disk_dir("evict");
    let pages = (256 << 10) / 4096;
    for drop_cache in [false, true] {
        for (c, ops) in recorded(&spec(&d, false, drop_cache)) {
            let cold = drop_cache && matches!(c.test.as_str(), "read" | "randread");
            let resident = ops.iter().find_map(|o| match o {
                Op::ResidentBeforeRead(p, e) => Some((*p, *e)),
                _ => None,
            });
            if cold {
                // Written back, then dropped, before the first read.
                assert_eq!(
                    ops[..3],
                    [Op::Open { create: false }, Op::Fsync, Op::Evict],
                    "{}",
                    c.test
                );
                assert_eq!(
                    resident.map(|r| r.0),
                    Some(0),
                    "{}: pages left in the cache",
                    c.test
                );
            } else {
                assert!(!ops.contains(&Op::Evict), "{}: {ops:?}", c.test);
                if c.test.contains("read") {
                    // The file was just written: without eviction it is all cached (or, for
                    // a page or two, already taken by the host's proactive reclaim, which
                    // leaves a shadow entry), so the check above measures something.
                    let (r, e) = resident.expect("measured before the first read");
                    assert_eq!(r + e, pages, "{} (drop {drop_cache})", c.test);
                    assert!(r > pages / 2, "{} (drop {drop_cache}): {r}", c.test);
                }
            }
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn overwrite_is_sequential_units_with_fdatasync_after_each_when_asked() {
    let d = disk_dir("overwrite");
    for fsync in [false, true] {
        let log: Log = Arc::default();
        let r = fileio::overwrite_test_with(
            &d,
            &Recorder(log.clone()),
            64 << 10,
            1024,
            fsync,
            None,
            &mut |_, _, _| {},
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.overwrite_ops, 64);
        let ops = log.lock().unwrap().clone();
        assert_eq!(ops[0], Op::Open { create: true });
        // The file is created in one write (64 KiB < the 1 MiB chunk) and synced.
        assert_eq!(
            ops[1],
            Op::Write {
                off: 0,
                len: 64 << 10
            }
        );
        assert_eq!(ops[2], Op::Fsync);
        let mut want = Vec::new();
        for i in 0..64 {
            want.push(Op::Write {
                off: i * 1024,
                len: 1024,
            });
            if fsync {
                want.push(Op::Fdatasync);
            }
        }
        want.push(Op::Fsync);
        assert_eq!(ops[3..], want[..], "fsync {fsync}");
    }
    // The real layer leaves nothing behind.
    assert!(
        fileio::overwrite_test_with(&d, &RealIo, 4096, 1024, true, None, &mut |_, _, _| {})
            .unwrap()
            .is_some()
    );
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}
