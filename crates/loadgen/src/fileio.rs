//! File-level tests in the style of IOzone (write, rewrite, read, reread, random read, random
//! write over a file-size × record-size sweep, with or without fsync, buffered or O_DIRECT), and
//! the ext2-over-flash micro-benchmark: create an N MiB file, then overwrite it in 1 KiB units,
//! with and without fsync.

use crate::hist::LatHist;
use crate::pattern::Permutation;
use crate::report::text_table;
use crate::spec::fmt_size;
use crate::{Error, Result};
use serde::Serialize;
use snapblk_core::{MemRegion, ReadAt, WriteAt};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A test cut short by the caller's stop flag (e.g. SIGINT); never leaves this module.
struct Stopped;

fn stopped(stop: Option<&AtomicBool>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::Relaxed))
}

/// IOzone's test names (`-i 0` write/rewrite, `-i 1` read/reread, `-i 2` random read/write).
pub const TESTS: [&str; 6] = [
    "write",
    "rewrite",
    "read",
    "reread",
    "randread",
    "randwrite",
];

/// Parameters of a file-test sweep.
#[derive(Debug, Clone, Serialize)]
pub struct FileTestSpec {
    /// The directory the test file is created in (and removed from).
    pub dir: PathBuf,
    /// File sizes to test, bytes.
    pub file_sizes: Vec<u64>,
    /// Record (I/O) sizes to test, bytes; records larger than a file are skipped.
    pub record_sizes: Vec<u64>,
    /// Tests to run, in order, each one of [`TESTS`].
    pub tests: Vec<String>,
    /// Include an fsync at the end of every write test in its time (IOzone `-e`).
    pub fsync: bool,
    /// O_DIRECT (IOzone `-I`).
    pub direct: bool,
    /// Drop the file's pages (fadvise DONTNEED) before `read` and `randread`.
    pub drop_cache: bool,
    /// Seed of the buffer contents and of the random tests' offset order.
    pub seed: u64,
}

/// One (file size, record size, test) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The file's size, bytes.
    pub file_size: u64,
    /// The record size, bytes.
    pub record_size: u64,
    /// The test, one of [`TESTS`].
    pub test: String,
    /// Bytes read or written.
    pub bytes: u64,
    /// The test's time, seconds.
    pub seconds: f64,
    /// Throughput, MiB/s.
    pub mib_s: f64,
    /// Records read or written.
    pub ops: u64,
    /// Mean time of one record's read or write, µs.
    pub op_mean_us: f64,
    /// 99th percentile of the same, µs.
    pub op_p99_us: f64,
    /// The time includes an fsync of the file (write tests with `fsync`).
    pub fsync: bool,
}

/// The file-test results.
#[derive(Debug, Clone, Serialize)]
pub struct FileTestReport {
    /// The sweep that ran.
    pub spec: FileTestSpec,
    /// Every cell, in the order run.
    pub cells: Vec<Cell>,
}

struct AlignedBuf(MemRegion);

impl AlignedBuf {
    fn new(len: usize, seed: u64) -> Result<AlignedBuf> {
        let r = MemRegion::alloc_private(len.div_ceil(4096) * 4096)?;
        // SAFETY: freshly allocated, exclusively ours.
        let s = unsafe { r.as_mut_slice() };
        let mut rng = snapblk_core::rng::Rng::new(seed);
        for c in s.chunks_mut(8) {
            let v = rng.next_u64().to_le_bytes();
            let l = c.len();
            c.copy_from_slice(&v[..l]);
        }
        Ok(AlignedBuf(r))
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: the region is live and only used through this &mut borrow.
        unsafe { &mut self.0.as_mut_slice()[..len] }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by MemRegion::alloc_private, freed once, no I/O outstanding.
        unsafe { self.0.free() };
    }
}

/// The operations the file tests and the overwrite test make on their file: exact reads,
/// writes and fdatasync(2) of the positional I/O family ([`ReadAt::read_exact_at`],
/// [`WriteAt::write_all_at`], [`WriteAt::sync_data`]), plus these two. [`RealIo`] does them on
/// the file itself; a test substitutes a recording layer to check the I/O pattern (offsets,
/// order, syncs, evictions) of every test.
pub trait TestFile: ReadAt + WriteAt {
    /// fsync(2).
    fn sync_all(&self) -> std::io::Result<()>;
    /// Drop the file's clean pages from the page cache.
    fn evict(&self);
}

/// Opens the test file: `create` creates or truncates it, `direct` means O_DIRECT.
pub trait FileIo {
    /// Opens `path` read-write.
    fn open(&self, path: &Path, create: bool, direct: bool) -> Result<Box<dyn TestFile>>;
}

/// The real thing: a read-write [`File`].
pub struct RealIo;

impl TestFile for File {
    fn sync_all(&self) -> std::io::Result<()> {
        File::sync_all(self)
    }
    fn evict(&self) {
        evict(self)
    }
}

impl FileIo for RealIo {
    fn open(&self, path: &Path, create: bool, direct: bool) -> Result<Box<dyn TestFile>> {
        Ok(Box::new(open(path, create, direct)?))
    }
}

/// Open the test file read-write (created or truncated with `create`).
pub fn open(path: &Path, create: bool, direct: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if create {
        o.create(true).truncate(true);
    }
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map_err(|source| Error::IoOn {
        what: path.display().to_string(),
        source,
    })
}

/// The directory the tests write in must exist: say so with its name before anything runs.
fn check_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::Spec(format!("{}: not a directory", dir.display()))),
        Err(source) => Err(Error::IoOn {
            what: format!("directory {}", dir.display()),
            source,
        }),
    }
}

/// The O_DIRECT alignment of files in `dir`, derived as snapblk's file driver does: the
/// logical block size of the block device under it, else (tmpfs, …) the page size.
pub(crate) fn direct_alignment(dir: &Path) -> u64 {
    crate::context::block_dir_for(dir)
        .and_then(|d| std::fs::read_to_string(d.join("queue/logical_block_size")).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or_else(|| snapblk_core::sys::page_size().max(512) as u64)
}

/// Drop a file's clean pages from the page cache.
pub(crate) fn evict(f: &File) {
    // SAFETY: valid fd; fadvise only gives advice.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// fio's `invalidate=1`: before a run, drop the page cache of the byte ranges `regions` of
/// `path` — `posix_fadvise(DONTNEED)` for files, `BLKFLSBUF` for block devices (which needs
/// root; like fio, refusal is not an error). Best effort: a target that cannot be opened here
/// fails later, when the driver opens it. Tmpfs ignores the advice (its pages are the data).
pub(crate) fn invalidate(path: &Path, regions: &[(u64, u64)]) {
    use std::os::unix::fs::FileTypeExt;
    /// `_IO(0x12, 97)` from linux/fs.h (not in the libc crate).
    const BLKFLSBUF: libc::Ioctl = 0x1261;
    let Ok(f) = File::open(path) else { return };
    let Ok(m) = f.metadata() else { return };
    if m.file_type().is_block_device() {
        // SAFETY: valid fd; BLKFLSBUF takes no argument and only writes back and drops the
        // device's cached pages.
        unsafe { libc::ioctl(f.as_raw_fd(), BLKFLSBUF) };
    } else if m.is_file() {
        for &(off, len) in regions {
            let (Ok(off), Ok(len)) = (i64::try_from(off), i64::try_from(len)) else {
                continue;
            };
            // SAFETY: valid fd; fadvise only gives advice.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

fn cell(fs: u64, rs: u64, test: &str, bytes: u64, secs: f64, h: &LatHist, fsync: bool) -> Cell {
    Cell {
        file_size: fs,
        record_size: rs,
        test: test.into(),
        bytes,
        seconds: secs,
        mib_s: if secs > 0.0 {
            bytes as f64 / secs / 1048576.0
        } else {
            0.0
        },
        ops: h.count(),
        op_mean_us: h.mean() / 1e3,
        op_p99_us: h.percentile(99.0) as f64 / 1e3,
        fsync,
    }
}

/// Run one test over a file of `fs` bytes with records of `rs` bytes.
#[allow(clippy::too_many_arguments)]
fn run_test(
    spec: &FileTestSpec,
    io: &dyn FileIo,
    path: &Path,
    fs: u64,
    rs: u64,
    test: &str,
    buf: &mut AlignedBuf,
    stop: Option<&AtomicBool>,
) -> Result<std::result::Result<Cell, Stopped>> {
    let n = fs / rs;
    let write = matches!(test, "write" | "rewrite" | "randwrite");
    let random = test.starts_with("rand");
    let f = io.open(path, test == "write", spec.direct)?;
    if spec.drop_cache && matches!(test, "read" | "randread") {
        // Dirty pages cannot be dropped: write them back first.
        f.sync_all()?;
        f.evict();
    }
    let mut perm = Permutation::new(n, spec.seed);
    let mut h = LatHist::default();
    let t0 = Instant::now();
    for i in 0..n {
        if stopped(stop) {
            return Ok(Err(Stopped));
        }
        let rec = if random {
            perm.next_index().unwrap_or(i)
        } else {
            i
        };
        let off = rec * rs;
        let b = buf.get(rs as usize);
        let s = Instant::now();
        if write {
            f.write_all_at(off, b)?;
        } else {
            f.read_exact_at(off, b)?;
        }
        h.record(s.elapsed().as_nanos() as u64);
    }
    let fsync = write && spec.fsync;
    if fsync {
        f.sync_all()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(Ok(cell(fs, rs, test, n * rs, secs, &h, fsync)))
}

/// Run the sweep. The test file is created in `spec.dir` and removed afterwards.
///
/// Setting `stop` (e.g. on SIGINT) ends the sweep early: the cells completed so far are
/// returned (the one in progress is dropped, it measured only part of its file), and the test
/// file is removed as usual.
pub fn run_file_tests(
    spec: &FileTestSpec,
    stop: Option<&AtomicBool>,
    progress: impl FnMut(&Cell),
) -> Result<FileTestReport> {
    run_file_tests_with(spec, &RealIo, stop, progress)
}

/// [`run_file_tests`] with the file operations done through `io`. `progress` is called after
/// each cell, before the next one makes any I/O.
pub fn run_file_tests_with(
    spec: &FileTestSpec,
    io: &dyn FileIo,
    stop: Option<&AtomicBool>,
    mut progress: impl FnMut(&Cell),
) -> Result<FileTestReport> {
    for t in &spec.tests {
        if !TESTS.contains(&t.as_str()) {
            return Err(Error::Spec(format!(
                "unknown file test {t:?} (one of {})",
                TESTS.join(", ")
            )));
        }
    }
    let maxrec = spec.record_sizes.iter().copied().max().unwrap_or(0);
    if spec.record_sizes.is_empty() || spec.file_sizes.is_empty() {
        return Err(Error::Spec("need file sizes and record sizes".into()));
    }
    if spec.file_sizes.contains(&0) || spec.record_sizes.contains(&0) {
        return Err(Error::Spec("file and record sizes must be above 0".into()));
    }
    let minrec = spec.record_sizes.iter().copied().min().unwrap_or(0);
    let maxfile = spec.file_sizes.iter().copied().max().unwrap_or(0);
    if minrec > maxfile {
        return Err(Error::Spec(format!(
            "nothing to run: every record size is larger than every file size (largest file {}, \
             smallest record {})",
            fmt_size(maxfile),
            fmt_size(minrec)
        )));
    }
    if maxrec > 64 << 20 {
        return Err(Error::Spec("record size above 64 MiB".into()));
    }
    check_dir(&spec.dir)?;
    if spec.direct {
        let a = direct_alignment(&spec.dir);
        if let Some(r) = spec.record_sizes.iter().find(|r| !r.is_multiple_of(a)) {
            return Err(Error::Spec(format!(
                "--record-size {r} is not a multiple of {}'s {a}-byte direct I/O alignment",
                spec.dir.display()
            )));
        }
    }
    let path = spec
        .dir
        .join(format!("snapblk-loadgen-file.{}.tmp", std::process::id()));
    let mut buf = AlignedBuf::new(maxrec as usize, spec.seed)?;
    let mut cells = Vec::new();
    let res = (|| -> Result<()> {
        for &fs in &spec.file_sizes {
            for &rs in &spec.record_sizes {
                if rs > fs {
                    continue;
                }
                // Reads need the file: write it first if the sweep does not include "write".
                if !spec.tests.iter().any(|t| t == "write")
                    && run_test(spec, io, &path, fs, rs, "write", &mut buf, stop)?.is_err()
                {
                    return Ok(());
                }
                for t in &spec.tests {
                    let Ok(c) = run_test(spec, io, &path, fs, rs, t, &mut buf, stop)? else {
                        return Ok(());
                    };
                    progress(&c);
                    cells.push(c);
                }
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    res?;
    Ok(FileTestReport {
        spec: spec.clone(),
        cells,
    })
}

/// IOzone-style table: one row per (file size, record size), MiB/s per test.
pub fn file_table(r: &FileTestReport) -> String {
    let mut rows = vec![
        ["file", "record"]
            .iter()
            .map(|s| s.to_string())
            .chain(r.spec.tests.iter().cloned())
            .collect(),
    ];
    let mut keys: Vec<(u64, u64)> = r
        .cells
        .iter()
        .map(|c| (c.file_size, c.record_size))
        .collect();
    keys.dedup();
    for (fs, rs) in keys {
        let mut row = vec![fmt_size(fs), fmt_size(rs)];
        for t in &r.spec.tests {
            let v = r
                .cells
                .iter()
                .find(|c| c.file_size == fs && c.record_size == rs && &c.test == t);
            row.push(v.map_or("-".into(), |c| format!("{:.1}", c.mib_s)));
        }
        rows.push(row);
    }
    let mode = if r.spec.fsync {
        "write tests include fsync"
    } else {
        "no fsync"
    };
    format!("MiB/s ({mode})\n{}", text_table(&rows))
}

/// The ext2-over-flash micro-benchmark result.
#[derive(Debug, Clone, Serialize)]
pub struct OverwriteReport {
    /// The file's size, bytes.
    pub size: u64,
    /// The size of one overwrite, bytes.
    pub unit: u64,
    /// Whether every overwrite was followed by fsync.
    pub fsync: bool,
    /// Throughput of creating the file, MiB/s.
    pub create_mib_s: f64,
    /// Throughput of the overwrite pass, MiB/s.
    pub overwrite_mib_s: f64,
    /// Overwrites made (`size / unit`).
    pub overwrite_ops: u64,
    /// Mean time of one overwrite (with its fsync), µs.
    pub op_mean_us: f64,
    /// 99th percentile of the same, µs.
    pub op_p99_us: f64,
}

/// Create a `size`-byte file in `dir`, then overwrite it sequentially in `unit`-byte writes;
/// with `fsync`, every write is followed by fsync (as a synchronous writer would).
///
/// Setting `stop` ends the test early with `Ok(None)` (a partial pass is no measurement); the
/// file is removed either way.
pub fn overwrite_test(
    dir: &Path,
    size: u64,
    unit: u64,
    fsync: bool,
    stop: Option<&AtomicBool>,
) -> Result<Option<OverwriteReport>> {
    overwrite_test_with(dir, &RealIo, size, unit, fsync, stop, &mut |_, _, _| {})
}

/// The two passes of the overwrite test, as reported to a progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverwritePhase {
    /// Writing the file in 1 MiB chunks (and syncing it).
    Create,
    /// Overwriting it in `unit`-byte writes.
    Overwrite,
}

impl std::fmt::Display for OverwritePhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OverwritePhase::Create => "create",
            OverwritePhase::Overwrite => "overwrite",
        })
    }
}

/// Bytes between two progress reports of the overwrite test: often enough for a display
/// (1 KiB units with fdatasync can take minutes for a large file), rare enough that reporting
/// costs nothing next to 64 writes.
pub const OVERWRITE_PROGRESS_STEP: u64 = 64 << 10;

/// [`overwrite_test`] with the file operations done through `io`, reporting its progress:
/// `progress(phase, done, total)` bytes,
/// with `done` = 0 when a phase starts, then after every [`OVERWRITE_PROGRESS_STEP`] bytes
/// written (a write in progress is not counted), and `done == total` once the phase's bytes
/// are all written (before the closing sync). Reports are made between writes, outside the
/// per-write latencies.
pub fn overwrite_test_with(
    dir: &Path,
    io: &dyn FileIo,
    size: u64,
    unit: u64,
    fsync: bool,
    stop: Option<&AtomicBool>,
    progress: &mut dyn FnMut(OverwritePhase, u64, u64),
) -> Result<Option<OverwriteReport>> {
    if unit == 0 || size < unit {
        return Err(Error::Spec(
            "overwrite: size must be at least one unit".into(),
        ));
    }
    check_dir(dir)?;
    let path = dir.join(format!(
        "snapblk-loadgen-overwrite.{}.tmp",
        std::process::id()
    ));
    let res = (|| -> Result<Option<OverwriteReport>> {
        let chunk = (1u64 << 20).min(size) as usize;
        let mut big = AlignedBuf::new(chunk, 7)?;
        let f = io.open(&path, true, false)?;
        let t0 = Instant::now();
        let mut off = 0;
        progress(OverwritePhase::Create, 0, size);
        while off < size {
            if stopped(stop) {
                return Ok(None);
            }
            let l = chunk.min((size - off) as usize);
            f.write_all_at(off, big.get(l))?;
            off += l as u64;
            // 1 MiB chunks: each is at least a step.
            progress(OverwritePhase::Create, off, size);
        }
        f.sync_all()?;
        let create = t0.elapsed().as_secs_f64();
        let mut small = AlignedBuf::new(unit as usize, 9)?;
        let mut h = LatHist::default();
        let n = size / unit;
        let total = n * unit;
        let mut reported = 0;
        let t1 = Instant::now();
        progress(OverwritePhase::Overwrite, 0, total);
        for i in 0..n {
            if stopped(stop) {
                return Ok(None);
            }
            let s = Instant::now();
            f.write_all_at(i * unit, small.get(unit as usize))?;
            if fsync {
                f.sync_data()?;
            }
            h.record(s.elapsed().as_nanos() as u64);
            let done = (i + 1) * unit;
            if done - reported >= OVERWRITE_PROGRESS_STEP || done == total {
                progress(OverwritePhase::Overwrite, done, total);
                reported = done;
            }
        }
        f.sync_all()?;
        let over = t1.elapsed().as_secs_f64();
        let mib = |b: u64, s: f64| {
            if s > 0.0 {
                b as f64 / s / 1048576.0
            } else {
                0.0
            }
        };
        Ok(Some(OverwriteReport {
            size,
            unit,
            fsync,
            create_mib_s: mib(size, create),
            overwrite_mib_s: mib(n * unit, over),
            overwrite_ops: n,
            op_mean_us: h.mean() / 1e3,
            op_p99_us: h.percentile(99.0) as f64 / 1e3,
        }))
    })();
    let _ = std::fs::remove_file(&path);
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_testsupport::errors::{assert_cause_is_source, chain};

    #[test]
    fn sweep_produces_every_cell() {
        let dir = std::env::temp_dir();
        let spec = FileTestSpec {
            dir: dir.clone(),
            file_sizes: vec![64 << 10, 256 << 10],
            record_sizes: vec![4096, 65536],
            tests: TESTS.iter().map(|s| s.to_string()).collect(),
            fsync: true,
            direct: false,
            drop_cache: true,
            seed: 1,
        };
        let r = run_file_tests(&spec, None, |_| {}).unwrap();
        assert_eq!(r.cells.len(), 2 * 2 * 6);
        let c = r
            .cells
            .iter()
            .find(|c| c.test == "randread" && c.file_size == 256 << 10 && c.record_size == 4096)
            .unwrap();
        assert_eq!(c.ops, 64);
        assert_eq!(c.bytes, 256 << 10);
        let t = file_table(&r);
        assert!(t.contains("randwrite"));
        // The fsync mode is marked in the table and on every cell: write tests only.
        assert!(t.starts_with("MiB/s (write tests include fsync)\n"), "{t}");
        for c in &r.cells {
            let w = matches!(c.test.as_str(), "write" | "rewrite" | "randwrite");
            assert_eq!(c.fsync, w, "{c:?}");
        }
        let nosync = FileTestSpec {
            fsync: false,
            file_sizes: vec![64 << 10],
            record_sizes: vec![4096],
            ..spec.clone()
        };
        let r = run_file_tests(&nosync, None, |_| {}).unwrap();
        assert!(r.cells.iter().all(|c| !c.fsync));
        assert!(file_table(&r).starts_with("MiB/s (no fsync)\n"));
        let o = overwrite_test(&dir, 64 << 10, 1024, true, None)
            .unwrap()
            .unwrap();
        assert_eq!(o.overwrite_ops, 64);
        assert!(o.overwrite_mib_s > 0.0);
        let bad = FileTestSpec {
            tests: vec!["nope".into()],
            ..spec.clone()
        };
        assert!(run_file_tests(&bad, None, |_| {}).is_err());
        // Sweeps that would run nothing, or divide by zero, are rejected with a reason.
        // The one-line report of the chain, as the CLI prints it.
        let err = |s: FileTestSpec| chain(&run_file_tests(&s, None, |_| {}).unwrap_err());
        let e = err(FileTestSpec {
            file_sizes: vec![1 << 20],
            record_sizes: vec![2 << 20],
            ..spec.clone()
        });
        assert!(e.contains("every record size is larger"), "{e}");
        for (fs, rs) in [(0, 4096), (1 << 20, 0)] {
            let e = err(FileTestSpec {
                file_sizes: vec![fs],
                record_sizes: vec![rs, 4096],
                ..spec.clone()
            });
            assert!(e.contains("must be above 0"), "{e}");
        }
        // O_DIRECT record sizes must suit the file system (checked before anything runs).
        let a = direct_alignment(&dir);
        let e = err(FileTestSpec {
            direct: true,
            record_sizes: vec![4096, a + 100],
            ..spec.clone()
        });
        assert_eq!(
            e,
            format!(
                "invalid job: --record-size {} is not a multiple of {}'s {a}-byte direct I/O \
                 alignment",
                a + 100,
                dir.display()
            )
        );
        // A missing directory is named, once.
        let e = err(FileTestSpec {
            dir: "/nonexistent/snapblk-dir".into(),
            ..spec
        });
        assert_eq!(
            e,
            "directory /nonexistent/snapblk-dir: No such file or directory (os error 2)"
        );
        let e = overwrite_test(
            Path::new("/nonexistent/snapblk-dir"),
            4096,
            1024,
            false,
            None,
        )
        .unwrap_err();
        let line = assert_cause_is_source(&e, None);
        assert!(
            line.starts_with("directory /nonexistent/snapblk-dir: "),
            "{line}"
        );
    }

    /// What the in-memory layer saw, with the progress reports in between.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Write(u64),
        Sync,
        Progress(OverwritePhase, u64, u64),
    }

    type Log = std::sync::Arc<std::sync::Mutex<Vec<Seen>>>;

    /// A file layer that keeps nothing and logs the length of every write and each sync.
    struct MemIo(Log);

    struct MemFile(Log);

    /// Reads as endless zeros.
    impl ReadAt for MemFile {
        fn read_at(&self, _: u64, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            Ok(buf.len())
        }
        fn size(&self) -> std::io::Result<u64> {
            Ok(u64::MAX)
        }
    }

    impl WriteAt for MemFile {
        fn write_all_at(&self, _: u64, buf: &[u8]) -> std::io::Result<()> {
            self.0.lock().unwrap().push(Seen::Write(buf.len() as u64));
            Ok(())
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.sync_all()
        }
    }

    impl TestFile for MemFile {
        fn sync_all(&self) -> std::io::Result<()> {
            self.0.lock().unwrap().push(Seen::Sync);
            Ok(())
        }
        fn evict(&self) {}
    }

    impl FileIo for MemIo {
        fn open(&self, _: &Path, _: bool, _: bool) -> Result<Box<dyn TestFile>> {
            Ok(Box::new(MemFile(self.0.clone())))
        }
    }

    /// Run the overwrite test on the in-memory layer; `stop_after` sets the stop flag at that
    /// many progress reports.
    fn observed_overwrite(
        size: u64,
        unit: u64,
        stop_after: Option<usize>,
    ) -> (Option<OverwriteReport>, Vec<Seen>) {
        let log: Log = Default::default();
        let stop = AtomicBool::new(false);
        let mut reports = 0;
        let r = overwrite_test_with(
            &std::env::temp_dir(),
            &MemIo(log.clone()),
            size,
            unit,
            true,
            Some(&stop),
            &mut |phase, done, total| {
                log.lock().unwrap().push(Seen::Progress(phase, done, total));
                reports += 1;
                if Some(reports) == stop_after {
                    stop.store(true, Ordering::Relaxed);
                }
            },
        )
        .unwrap();
        let seen = log.lock().unwrap().clone();
        (r, seen)
    }

    #[test]
    fn overwrite_progress_counts_written_bytes_up_to_the_total() {
        // 1 MiB + 512 bytes: two create chunks; 1024 whole 1 KiB units to overwrite.
        let size = (1 << 20) + 512;
        let (r, seen) = observed_overwrite(size, 1024, None);
        assert_eq!(r.unwrap().overwrite_ops, 1024);
        for (phase, total) in [
            (OverwritePhase::Create, size),
            (OverwritePhase::Overwrite, 1 << 20),
        ] {
            // The reports of this phase, each with the bytes written in the phase before it.
            let mut written = None;
            let mut got = Vec::new();
            for s in &seen {
                match *s {
                    Seen::Progress(p, done, t) if p == phase => {
                        assert_eq!(t, total, "{phase}");
                        if done == 0 && written.is_none() {
                            written = Some(0);
                        }
                        assert_eq!(Some(done), written, "{phase}: report ahead of the writes");
                        got.push(done);
                    }
                    Seen::Progress(..) => written = None,
                    Seen::Write(n) => {
                        if let Some(w) = written.as_mut() {
                            *w += n;
                        }
                    }
                    Seen::Sync => {}
                }
            }
            assert_eq!(got.first(), Some(&0), "{phase}: {got:?}");
            assert_eq!(got.last(), Some(&total), "{phase}: {got:?}");
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{phase}: {got:?}");
            if phase == OverwritePhase::Overwrite {
                // Every 64 KiB of 1 KiB writes: 16 reports after the first.
                let want: Vec<u64> = (0..=16).map(|i| i * OVERWRITE_PROGRESS_STEP).collect();
                assert_eq!(got, want);
            } else {
                assert_eq!(got, [0, 1 << 20, size]);
            }
        }
        // The overwrite pass is reported after the file was created and synced.
        let first_over = seen
            .iter()
            .position(|s| matches!(s, Seen::Progress(OverwritePhase::Overwrite, ..)))
            .unwrap();
        assert_eq!(seen[first_over - 1], Seen::Sync);
    }

    #[test]
    fn overwrite_progress_stops_short_of_the_total_when_stopped() {
        // Stopped at the 4th report (the first 64 KiB of the overwrite pass): no more reports,
        // and nothing claims the pass complete.
        let (r, seen) = observed_overwrite(1 << 20, 1024, Some(4));
        assert!(r.is_none());
        let reports: Vec<&Seen> = seen
            .iter()
            .filter(|s| matches!(s, Seen::Progress(..)))
            .collect();
        assert_eq!(
            reports.last(),
            Some(&&Seen::Progress(
                OverwritePhase::Overwrite,
                OVERWRITE_PROGRESS_STEP,
                1 << 20
            ))
        );
        assert_eq!(reports.len(), 4);
    }

    #[test]
    fn stop_flag_ends_the_tests_and_removes_their_files() {
        let dir = std::env::temp_dir().join(format!("snapblk-fileio-stop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = FileTestSpec {
            dir: dir.clone(),
            file_sizes: vec![64 << 10],
            record_sizes: vec![4096],
            tests: TESTS.iter().map(|s| s.to_string()).collect(),
            fsync: false,
            direct: false,
            drop_cache: false,
            seed: 1,
        };
        // Stopped after the first cell: that cell is kept, nothing after it runs.
        let stop = AtomicBool::new(false);
        let r =
            run_file_tests(&spec, Some(&stop), |_| stop.store(true, Ordering::Relaxed)).unwrap();
        assert_eq!(r.cells.len(), 1);
        assert_eq!(r.cells[0].test, "write");
        assert_eq!(r.cells[0].ops, 16);
        // Stopped before anything: no cells, no error.
        let r = run_file_tests(&spec, Some(&stop), |_| {}).unwrap();
        assert!(r.cells.is_empty());
        let o = overwrite_test(&dir, 64 << 10, 1024, true, Some(&stop)).unwrap();
        assert!(o.is_none());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "files left");
        std::fs::remove_dir(&dir).unwrap();
    }
}
