//! FUSE export: a snapblk device as a loop-mountable file.
//!
//! [`mount`] mounts a FUSE file system on a directory; it holds exactly one regular file (by
//! default `disk.img`) whose contents are the device: reads and writes at any offset and size go
//! to the device (read-modify-write below its request alignment), `fsync`/`close` flush it,
//! `fallocate(PUNCH_HOLE|ZERO_RANGE)` zero it. The file is read-only (mode 0444, `EROFS` on write
//! opens) when the device is. That is enough for `losetup` + `mount`, `dd`, `cmp`, qemu, and
//! anything else that wants a file rather than a block device.
//!
//! The kernel's page cache stays on by default (the loop driver and most tools expect buffered
//! semantics; writes are write-through since writeback caching is not enabled), or every open
//! can bypass it with [`FuseOptions::direct_io`]. Several FUSE worker threads serve requests in
//! parallel, each on its own device queue.
//!
//! Modules are private; [`Device`] (the device I/O the file system does, which the tests drive
//! directly) and its error are re-exported here.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod dev;
mod sys;

pub use dev::{Device, IoError};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session, SessionACL,
    SessionUnmounter, TimeOrNow, WriteFlags,
};
use snapblk_core::{IoDir, IoStats};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Errors of the FUSE export. The cause of each is its `source`, not part of its message.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// Opening the device for the export failed (reading its properties).
    #[error("device")]
    Device(#[from] IoError),
    /// The mount point (path) cannot be used: it does not exist or is not a directory.
    #[error("mount point {0}")]
    MountPoint(PathBuf, #[source] std::io::Error),
    /// The kernel refused the FUSE mount on the path (no `/dev/fuse`, no permission, ...).
    #[error("mounting FUSE on {0}")]
    Mount(PathBuf, #[source] std::io::Error),
    /// The mount point (path) is not empty: the mount would hide its files (as fusermount,
    /// refused unless [`FuseOptions::nonempty`]).
    #[error("mount point {0} is not empty (its files would be hidden under the mount)")]
    NotEmpty(PathBuf),
    /// [`FuseOptions::file_name`] is empty, `.`, `..` or contains `/`.
    #[error("file name {0:?} must be a single non-empty path component")]
    BadName(String),
    /// [`Mounted::try_unmount`]: the mount point (path) is still in use; the export goes on
    /// serving.
    #[error("{0} is busy (a loop device or an open file still uses it)")]
    Busy(PathBuf),
    /// `umount` of the path failed for another reason than being busy or already unmounted.
    #[error("unmounting {0}")]
    Unmount(PathBuf, #[source] std::io::Error),
    /// The FUSE session thread could not be started, or ended with an error (or panicked).
    #[error("FUSE session")]
    Session(#[source] std::io::Error),
}

/// Export options.
#[derive(Debug, Clone)]
pub struct FuseOptions {
    /// Name of the device file inside the mount point.
    pub file_name: String,
    /// Export read-only even if the device is writable.
    pub read_only: bool,
    /// Bypass the kernel page cache on every open (`FOPEN_DIRECT_IO`).
    pub direct_io: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// Let users other than the mounting one access the file (`allow_other`).
    pub allow_other: bool,
    /// Mount over a directory that is not empty (fusermount's `nonempty`), hiding its files
    /// while mounted; otherwise such a directory is refused ([`FuseError::NotEmpty`]).
    pub nonempty: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            file_name: "disk.img".into(),
            read_only: false,
            direct_io: false,
            threads: 4,
            allow_other: false,
            nonempty: false,
        }
    }
}

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
/// Attributes never change behind the kernel's back (size is fixed), so cache them for long.
const TTL: Duration = Duration::from_secs(3600);

struct DevFs {
    dev: Arc<Device>,
    stats: Arc<IoStats>,
    name: OsString,
    read_only: bool,
    direct_io: bool,
    dir: FileAttr,
    file: FileAttr,
}

impl DevFs {
    /// A flush, counted in the stats.
    fn timed_flush(&self) -> Result<(), IoError> {
        let t0 = Instant::now();
        let r = self.dev.flush();
        self.stats.record(IoDir::Flush, 0, t0.elapsed(), r.is_ok());
        r
    }
}

fn errno(e: &IoError) -> Errno {
    Errno::from_i32(e.errno)
}

impl Filesystem for DevFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // 1 MiB requests (the kernel's cap for FUSE) keep per-request overhead low.
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        let _ = self.dev.flush();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == self.name {
            reply.entry(&TTL, &self.file, fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            ROOT => reply.attr(&TTL, &self.dir),
            FILE => reply.attr(&TTL, &self.file),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The device has a fixed size; a truncate to that same size (O_TRUNC on a device file
        // is common in tools) is a no-op, anything else is refused. Mode/owner/times are fixed.
        match (ino, size) {
            (FILE, Some(s)) if s != self.file.size => reply.error(Errno::EPERM),
            (FILE, _) => reply.attr(&TTL, &self.file),
            (ROOT, _) => reply.attr(&TTL, &self.dir),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let f = if self.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        };
        self.stats.connection_opened();
        reply.opened(FileHandle(0), f);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if ino == FILE {
            // Every open of the file counted above ends here.
            self.stats.connection_closed();
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        let mut buf = Vec::new();
        let t0 = Instant::now();
        let r = self.dev.read(offset, size as usize, &mut buf);
        self.stats
            .record(IoDir::Read, buf.len() as u64, t0.elapsed(), r.is_ok());
        match r {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        let t0 = Instant::now();
        let r = self.dev.write(offset, data);
        let n = *r.as_ref().unwrap_or(&0) as u64;
        self.stats.record(IoDir::Write, n, t0.elapsed(), r.is_ok());
        match r {
            Ok(n) => {
                // O_SYNC/O_DSYNC writers expect durability when write returns.
                if flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0
                    && let Err(e) = self.dev.flush()
                {
                    return reply.error(errno(&e));
                }
                reply.written(n as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Called on every close(): report write-back errors where the caller can see them.
        match self.timed_flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.timed_flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        let known =
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        if mode & !known != 0 || (punch && mode & libc::FALLOC_FL_KEEP_SIZE == 0) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        if !punch && !zero {
            // Plain allocation: the device is fully allocated already, but it cannot grow.
            return match offset.checked_add(length) {
                Some(end) if end <= self.file.size => reply.ok(),
                _ => reply.error(Errno::EFBIG),
            };
        }
        let t0 = Instant::now();
        let r = self.dev.zero(offset, length, punch);
        let dir = if punch { IoDir::Discard } else { IoDir::Write };
        self.stats.record(dir, length, t0.elapsed(), r.is_ok());
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, OsStr::new(".")),
            (ROOT, FileType::Directory, OsStr::new("..")),
            (FILE, FileType::RegularFile, self.name.as_os_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.file.size.div_ceil(4096);
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }
}

/// A mounted export. Dropping it without [`Mounted::try_unmount`] detaches the mount lazily.
pub struct Mounted {
    mountpoint: PathBuf,
    file: PathBuf,
    size: u64,
    read_only: bool,
    dev: Arc<Device>,
    stats: Arc<IoStats>,
    unmounter: SessionUnmounter,
    session: Option<JoinHandle<std::io::Result<()>>>,
}

/// Mount `dev` (started) on `dir` as `dir/<file_name>`.
pub fn mount(
    dev: snapblk_core::Blkio,
    dir: &Path,
    opts: &FuseOptions,
) -> Result<Mounted, FuseError> {
    if opts.file_name.is_empty()
        || opts.file_name.contains('/')
        || opts.file_name == "."
        || opts.file_name == ".."
    {
        return Err(FuseError::BadName(opts.file_name.clone()));
    }
    let meta = std::fs::metadata(dir).map_err(|e| FuseError::MountPoint(dir.to_owned(), e))?;
    if !meta.is_dir() {
        return Err(FuseError::MountPoint(
            dir.to_owned(),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    if !opts.nonempty {
        let mut entries =
            std::fs::read_dir(dir).map_err(|e| FuseError::MountPoint(dir.to_owned(), e))?;
        if entries.next().is_some() {
            return Err(FuseError::NotEmpty(dir.to_owned()));
        }
    }
    let dev = Arc::new(Device::new(dev)?);
    let read_only = opts.read_only || dev.read_only;
    let now = SystemTime::now();
    let attr = |ino, kind, perm, size: u64, nlink| FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    };
    let stats = Arc::new(IoStats::new());
    let fs = DevFs {
        dev: dev.clone(),
        stats: stats.clone(),
        name: OsString::from(&opts.file_name),
        read_only,
        direct_io: opts.direct_io,
        dir: attr(ROOT, FileType::Directory, 0o755, 0, 2),
        file: attr(
            FILE,
            FileType::RegularFile,
            if read_only { 0o444 } else { 0o644 },
            dev.size,
            1,
        ),
    };
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("snapblk".into()),
        MountOption::Subtype("snapblk".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    cfg.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(opts.threads.max(1));
    let mut session =
        Session::new(fs, dir, &cfg).map_err(|e| FuseError::Mount(dir.to_owned(), e))?;
    let unmounter = session.unmount_callable();
    let handle = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || session.run())
        .map_err(FuseError::Session)?;
    Ok(Mounted {
        mountpoint: dir.to_owned(),
        file: dir.join(&opts.file_name),
        size: dev.size,
        read_only,
        dev,
        stats,
        unmounter,
        session: Some(handle),
    })
}

impl Mounted {
    /// The device file.
    pub fn file(&self) -> &Path {
        &self.file
    }
    /// Size of the device file in bytes (the device's capacity at mount time).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Whether the file is exported read-only (asked for, or the device is read-only).
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    /// Requests, bytes and latencies served through the file, and its opens (each open file
    /// description counts as a connection until it is released).
    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }
    /// Whether the session ended (e.g. someone ran `umount` on the directory).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Unmount if nothing uses the file system; [`FuseError::Busy`] (still mounted, still
    /// serving) while e.g. a loop device is attached to the file.
    pub fn try_unmount(&mut self) -> Result<(), FuseError> {
        if !self.is_finished() {
            match sys::umount(&self.mountpoint, false) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(FuseError::Busy(self.mountpoint.clone()));
                }
                // Already unmounted by someone else: fine.
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL)
                        || e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(FuseError::Unmount(self.mountpoint.clone(), e)),
            }
        }
        self.finish()
    }

    /// Detach the mount point (`umount -l`) without waiting: the file system goes on serving
    /// the users it still has (a loop device, open files) until they let go, and then the
    /// session ends ([`Mounted::is_finished`]).
    pub fn detach_lazy(&mut self) {
        if !self.is_finished() {
            let _ = sys::umount(&self.mountpoint, true);
        }
    }

    /// Stop serving with users left: new writes fail (EIO), every write acknowledged so far
    /// is flushed, and the session is left to end with this process, when the kernel aborts
    /// the connection and the remaining users' I/O fails.
    pub fn abandon(&mut self) -> Result<(), FuseError> {
        self.dev.refuse_writes();
        // Dropping the handle detaches the session thread; joining it would wait for users.
        drop(self.session.take());
        Ok(self.dev.flush()?)
    }

    fn finish(&mut self) -> Result<(), FuseError> {
        let _ = self.unmounter.unmount();
        let r = match self.session.take() {
            Some(h) => match h.join() {
                Ok(r) => r.map_err(FuseError::Session),
                Err(_) => Err(FuseError::Session(std::io::Error::other(
                    "FUSE session thread panicked",
                ))),
            },
            None => Ok(()),
        };
        self.dev.flush()?;
        r
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.session.is_none() {
            return;
        }
        self.detach_lazy();
        // Without users the session ends at once; with users left (a loop device), waiting
        // would block for as long as they stay, so flush and leave it to end with the process.
        for _ in 0..100 {
            if self.is_finished() {
                let _ = self.finish();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn errors_keep_their_cause_as_source_only() {
        let io = || std::io::Error::from_raw_os_error(libc::ENOENT);
        let dev = IoError {
            errno: libc::EIO,
            msg: "short read".into(),
        };
        let cases = [
            FuseError::from(dev.clone()),
            FuseError::MountPoint("/mnt".into(), io()),
            FuseError::Mount("/mnt".into(), io()),
            FuseError::Unmount("/mnt".into(), io()),
            FuseError::Session(io()),
        ];
        for e in cases {
            let cause = e
                .source()
                .unwrap_or_else(|| panic!("{e:?} has no source"))
                .to_string();
            assert!(
                cause == dev.to_string() || cause == io().to_string(),
                "{e:?}: {cause}"
            );
            assert!(!e.to_string().contains(&cause), "{e} repeats {cause}");
        }
        assert_eq!(
            snapblk_core::Chain(&FuseError::MountPoint("/mnt".into(), io())).to_string(),
            "mount point /mnt: No such file or directory (os error 2)"
        );
    }
}
