//! Page-cache insertions seen through the kernel's `filemap:mm_filemap_add_to_page_cache`
//! tracepoint (tracefs), for `record --trace`.
//!
//! Why: a residency diff cannot see a page that was already a shadow entry before the window,
//! was read in it and was reclaimed again before its end — it looks untouched. The tracepoint
//! fires for every folio added to a file's page cache, whatever happens to it afterwards; it is
//! what Android's iorap and `prefetch record` use. The trace runs in a private tracefs
//! instance (`instances/snapblk-record-PID-N`), so the global tracer and other users of tracefs
//! are left alone, and the instance is removed afterwards (also on error paths, via `Drop`).
//! Needs root (or tracefs access) and a kernel with the event.

use crate::{Range, RangeSet};
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

const EVENT: &str = "events/filemap/mm_filemap_add_to_page_cache";

/// A file as the tracepoint names it: its superblock's device (major, minor) and inode.
pub(crate) type FileKey = (u32, u32, u64);

/// Errors of starting or stopping a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "no tracefs found at /sys/kernel/tracing or /sys/kernel/debug/tracing, and mounting it \
         there failed (as root: `mount -t tracefs nodev /sys/kernel/tracing`)"
    )]
    /// tracefs is not mounted and could not be mounted (needs root).
    NoTracefs,
    #[error("this kernel has no filemap:mm_filemap_add_to_page_cache trace event")]
    /// The kernel lacks the `filemap:mm_filemap_add_to_page_cache` event the trace relies on.
    NoEvent,
    #[error("tracefs {}", .path.display())]
    /// Reading or writing a tracefs control or data file failed.
    Io {
        /// The tracefs file involved.
        path: PathBuf,
        /// The error from it (e.g. `PermissionDenied` when not root).
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> TraceError + '_ {
    move |source| TraceError::Io {
        path: path.to_owned(),
        source,
    }
}

/// File systems whose files the trace cannot name by their `stat` device and inode: btrfs
/// reports each subvolume's own device in `st_dev` (the event has the superblock's, and inode
/// numbers repeat across subvolumes, so a translation could pick another subvolume's file);
/// overlayfs caches pages in the underlying file's inode, on another device. Their lists come
/// from the residency diff alone.
pub(crate) fn blind_to(fs_magic: u64) -> bool {
    const BTRFS_SUPER_MAGIC: u64 = 0x9123_683e;
    matches!(fs_magic, BTRFS_SUPER_MAGIC | crate::sys::OVERLAYFS_MAGIC)
}

/// Of `files` (path, `st_dev` as major and minor), how many live on a file system the trace is
/// [`blind_to`]. One statfs per device; a device whose statfs fails counts as traceable.
pub(crate) fn untraceable_files<'a>(files: impl Iterator<Item = (&'a Path, (u32, u32))>) -> u64 {
    let mut blind: HashMap<(u32, u32), bool> = HashMap::new();
    let mut n = 0;
    for (path, dev) in files {
        let b = *blind
            .entry(dev)
            .or_insert_with(|| crate::sys::fs_magic(path).is_ok_and(blind_to));
        n += u64::from(b);
    }
    n
}

/// What a trace saw.
#[derive(Debug, Default)]
pub(crate) struct Traced {
    /// Byte ranges added to each file's page cache (page granular, not clipped to the file).
    pub pages: HashMap<FileKey, RangeSet>,
    /// Events parsed.
    pub events: u64,
    /// Events the kernel dropped because the reader fell behind (per-CPU `overrun`); when not
    /// 0 the trace is incomplete (the residency diff still covers what it can).
    pub lost_events: u64,
}

/// One event: `(file, byte offset, bytes)`, from a `trace_pipe` line such as
/// `cat-2040 [000] ..... 189.351234: mm_filemap_add_to_page_cache: dev 254:1 ino 60a
/// pfn=0x10f31c ofs=40960 order=2` (`ino` is hex, `ofs` bytes; `order` is absent before
/// Linux 6.x, where every event is one page).
pub(crate) fn parse_line(line: &str, page_size: u64) -> Option<(FileKey, u64, u64)> {
    let (_, rest) = line.split_once("mm_filemap_add_to_page_cache: ")?;
    let mut it = rest.split_ascii_whitespace();
    if it.next()? != "dev" {
        return None;
    }
    let (ma, mi) = it.next()?.split_once(':')?;
    let (major, minor) = (ma.parse().ok()?, mi.parse().ok()?);
    if it.next()? != "ino" {
        return None;
    }
    let ino = u64::from_str_radix(it.next()?, 16).ok()?;
    let (mut ofs, mut order) = (None, 0u32);
    for tok in it {
        if let Some(v) = tok.strip_prefix("ofs=") {
            ofs = v.parse().ok();
        } else if let Some(v) = tok.strip_prefix("order=") {
            order = v.parse().ok()?;
        }
    }
    let len = page_size.checked_shl(order.min(31))?;
    Some(((major, minor, ino), ofs?, len))
}

/// The tracefs mount. When there is none but the kernel has tracefs (its mount point
/// `/sys/kernel/tracing` exists), mount it there, as perf and trace-cmd do: systemd mounts it at
/// boot, but minimal systems (containers, initramfs environments, fresh VMs) often have not.
/// Tried once per process; without the right to mount, there is no tracefs.
fn tracefs_root() -> Option<PathBuf> {
    static MOUNTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let find = || {
        ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("instances").is_dir())
    };
    if let Some(r) = find() {
        return Some(r);
    }
    let dir = Path::new("/sys/kernel/tracing");
    if *MOUNTED.get_or_init(|| dir.is_dir() && crate::sys::mount_tracefs(dir).is_ok()) {
        find()
    } else {
        None
    }
}

/// Whether `record --trace` can work here (tracefs with the event, and the right to create an
/// instance is only known by trying).
#[cfg(test)]
pub(crate) fn available() -> bool {
    tracefs_root().is_some_and(|r| r.join(EVENT).is_dir())
}

/// A running trace. [`PageTrace::stop`] ends it and returns what it saw; dropping it without
/// stopping removes the instance all the same.
pub(crate) struct PageTrace {
    dir: PathBuf,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<io::Result<Traced>>>,
}

static INSTANCE: AtomicU32 = AtomicU32::new(0);

impl PageTrace {
    /// Creates a private instance, enables the event and starts reading it.
    pub(crate) fn start() -> Result<PageTrace, TraceError> {
        let root = tracefs_root().ok_or(TraceError::NoTracefs)?;
        if !root.join(EVENT).is_dir() {
            return Err(TraceError::NoEvent);
        }
        remove_stale_instances(&root.join("instances"));
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let dir = root
            .join("instances")
            .join(format!("snapblk-record-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(io_err(&dir))?;
        // From here on, Drop removes the instance.
        let mut t = PageTrace {
            dir,
            stop: Arc::new(AtomicBool::new(false)),
            reader: None,
        };
        // A larger per-CPU buffer makes overruns rarer during bursts (a cold app start adds
        // tens of thousands of folios per second); refused sizes keep the default.
        let _ = std::fs::write(t.dir.join("buffer_size_kb"), "16384");
        let pipe_path = t.dir.join("trace_pipe");
        let pipe = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&pipe_path)
            .map_err(io_err(&pipe_path))?;
        let enable = t.dir.join(EVENT).join("enable");
        std::fs::write(&enable, "1").map_err(io_err(&enable))?;
        let stop = t.stop.clone();
        t.reader = Some(std::thread::spawn(move || read_events(pipe, &stop)));
        Ok(t)
    }

    /// Disables the event, drains what is buffered and removes the instance.
    pub(crate) fn stop(mut self) -> Result<Traced, TraceError> {
        let (disabled, joined) = self.halt();
        let enable = self.dir.join(EVENT).join("enable");
        disabled.map_err(io_err(&enable))?;
        let pipe = self.dir.join("trace_pipe");
        let mut traced = match joined {
            Some(Ok(r)) => r.map_err(io_err(&pipe))?,
            Some(Err(_)) | None => {
                return Err(TraceError::Io {
                    path: pipe,
                    source: io::Error::other("trace reader thread panicked"),
                });
            }
        };
        traced.lost_events = overruns(&self.dir);
        Ok(traced)
    }

    /// Disables the event, tells the reader to finish once the pipe is empty and joins it: the
    /// result of disabling and the reader's outcome (`None` if it was joined already).
    fn halt(
        &mut self,
    ) -> (
        io::Result<()>,
        Option<std::thread::Result<io::Result<Traced>>>,
    ) {
        let disabled = std::fs::write(self.dir.join(EVENT).join("enable"), "0");
        self.stop.store(true, Ordering::Release);
        (disabled, self.reader.take().map(|h| h.join()))
    }
}

impl Drop for PageTrace {
    fn drop(&mut self) {
        // Not stopped (an error path): halt it first.
        if self.reader.is_some() {
            let _ = self.halt();
        }
        // The pipe is closed (the reader owned it), so the instance can go.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Removes the instances of recorders that died without cleaning up (killed mid-window):
/// a leftover instance keeps tracing into its buffer for nothing.
fn remove_stale_instances(instances: &Path) {
    let Ok(dir) = std::fs::read_dir(instances) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("snapblk-record-"))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Reads `trace_pipe` until `stop` is set and the pipe is empty.
fn read_events(mut pipe: std::fs::File, stop: &AtomicBool) -> io::Result<Traced> {
    let page = crate::sys::page_size();
    let mut out = Traced::default();
    let mut raw: HashMap<FileKey, Vec<Range>> = HashMap::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                let end = pending
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                for line in pending[..end].split(|&b| b == b'\n') {
                    let Ok(line) = std::str::from_utf8(line) else {
                        continue;
                    };
                    if let Some((key, ofs, len)) = parse_line(line, page) {
                        out.events += 1;
                        raw.entry(key).or_default().push(Range { offset: ofs, len });
                    }
                }
                pending.drain(..end);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Empty: done once stopped (the event is disabled before `stop` is set, so
                // nothing new arrives after this read).
                if stop.load(Ordering::Acquire) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.pages = raw
        .into_iter()
        .map(|(k, v)| (k, RangeSet::from_ranges(v)))
        .collect();
    Ok(out)
}

/// Sum of the per-CPU `overrun` counters of an instance: events lost to a full buffer.
fn overruns(dir: &Path) -> u64 {
    let Ok(cpus) = std::fs::read_dir(dir.join("per_cpu")) else {
        return 0;
    };
    cpus.flatten()
        .filter_map(|c| std::fs::read_to_string(c.path().join("stats")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.strip_prefix("overrun: ")?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_current_and_older_kernels_parse() {
        let l = "             cat-2040    [000] ..... 18934.351234: mm_filemap_add_to_page_cache: \
                 dev 254:1 ino 60a pfn=0x10f31c ofs=40960 order=2";
        assert_eq!(parse_line(l, 4096), Some(((254, 1, 0x60a), 40960, 16384)));
        // Before order= (5.x): one page per event, and a page= pointer field.
        let l = "  cat-1 [001] .... 5.1: mm_filemap_add_to_page_cache: dev 8:3 ino 1f \
                 page=000000001234abcd pfn=0x1234 ofs=8192";
        assert_eq!(parse_line(l, 4096), Some(((8, 3, 0x1f), 8192, 4096)));
        for bad in [
            "",
            "cat-1 [000] ..... 1.0: mm_filemap_delete_from_page_cache: dev 8:3 ino 1f ofs=0",
            "x: mm_filemap_add_to_page_cache: dev 8 ino 1f ofs=0",
            "x: mm_filemap_add_to_page_cache: dev 8:3 ino zz ofs=0",
            "x: mm_filemap_add_to_page_cache: dev 8:3 ino 1f pfn=0x1",
            "x: mm_filemap_add_to_page_cache: dev 8:3 ino 1f ofs=0 order=x",
        ] {
            assert_eq!(parse_line(bad, 4096), None, "{bad}");
        }
    }

    #[test]
    fn btrfs_and_overlayfs_are_the_blind_spots() {
        assert!(blind_to(0x9123_683e)); // btrfs
        assert!(blind_to(0x794c_7630)); // overlayfs
        assert!(!blind_to(0xef53)); // ext4
        assert!(!blind_to(0x0102_1994)); // tmpfs
        // A file on an ordinary file system is traceable; the count is per file, one statfs
        // per device.
        let d = crate::test_support::disk_dir();
        let dev = |p: &Path| {
            let m = std::fs::metadata(p).unwrap();
            let id = crate::list::FileIdentity::of(&m);
            (id.dev_major, id.dev_minor)
        };
        let files = [d.as_path(), d.as_path()];
        assert_eq!(untraceable_files(files.iter().map(|p| (*p, dev(p)))), 0);
    }

    /// Runs as root with tracefs, like the suite (CI is root): a missing tracefs fails here.
    #[test]
    fn a_trace_sees_pages_read_into_the_cache_and_cleans_up() {
        assert!(available(), "tracefs with the filemap event is needed");
        let d = crate::test_support::disk_dir().join(format!("trace-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("f");
        std::fs::write(&p, vec![7u8; 64 << 10]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        f.sync_all().unwrap();
        crate::sys::fadvise(
            std::os::fd::AsFd::as_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
        .unwrap();
        let t = PageTrace::start().unwrap();
        let dir = t.dir.clone();
        assert!(dir.is_dir());
        let mut b = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 32768).unwrap();
        let traced = t.stop().unwrap();
        assert!(!dir.exists(), "instance {} left behind", dir.display());
        let id = crate::list::FileIdentity::of(&f.metadata().unwrap());
        let got = traced
            .pages
            .get(&(id.dev_major, id.dev_minor, id.ino))
            .cloned()
            .unwrap_or_default();
        let want = RangeSet::from_ranges(vec![Range {
            offset: 32768,
            len: 4096,
        }]);
        assert_eq!(want.difference(&got).total_bytes(), 0, "traced: {got:?}");
        assert!(traced.events > 0);
        // A trace dropped without stop() removes its instance too.
        let t = PageTrace::start().unwrap();
        let dir = t.dir.clone();
        drop(t);
        assert!(!dir.exists(), "instance {} left behind", dir.display());
        // An instance left by a recorder that died (a pid with no process) is removed by the
        // next start; a live one is not.
        let instances = dir.parent().unwrap().to_path_buf();
        let dead = (1u32 << 22..).find(|p| !Path::new(&format!("/proc/{p}")).exists());
        let stale = instances.join(format!("snapblk-record-{}-0", dead.unwrap()));
        std::fs::create_dir(&stale).unwrap();
        let live = instances.join(format!("snapblk-record-{}-999", std::process::id()));
        std::fs::create_dir(&live).unwrap();
        let t = PageTrace::start().unwrap();
        assert!(!stale.exists(), "{} not removed", stale.display());
        assert!(live.exists());
        drop(t);
        std::fs::remove_dir(&live).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
