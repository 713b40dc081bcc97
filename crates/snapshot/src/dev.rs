//! Byte-addressed backing devices for the snapshot layer.
//!
//! A device is any member of snapblk-core's positional I/O family ([`ReadAt`], [`WriteAt`]) that
//! can be shared between threads: [`BlockDev`] is `ReadAt + WriteAt + Send + Sync`, implemented
//! for every such type, so a [`File`], an in-memory [`MemFile`](snapblk_core::MemFile) or a
//! network client is a device as it is.
//!
//! The snapshot device reads its base and COW from many threads at once (every client queue plus
//! the merge thread), synchronously, one segment at a time. [`FileDev`] does exactly that with
//! `pread`/`pwrite` on a shared file descriptor: no per-queue ring, no extra completion hop, which
//! keeps a COPY-op read within a few percent of a raw read of the base. It offers its file
//! ([`ReadAt::as_file`]), and the read path `pread`s a duplicate of it directly; a device without
//! a descriptor is read through [`ReadAt::read_exact_at`]. Any other source (memory, the
//! fault-injection disks, a network client) is a device as it is. `QueueDev`, a snapblk-core
//! driver's queue behind a mutex, exists only for the unit tests.
//!
//! Errors are `io::Error`s (an OS errno, or a [`snapblk_core::Error`] inside); the layer above
//! turns them into [`snapblk_core::Error`] with [`snapblk_core::read_error`] (reads) or
//! `From` (the rest), keeping the errno.

#[cfg(test)]
use snapblk_core::sync::lock;
use snapblk_core::{Error, ReadAt, WriteAt};
#[cfg(test)]
use snapblk_core::{Queue, QueueExt};
use std::fs::File;
use std::io;
#[cfg(test)]
use std::sync::Mutex;

/// A synchronous, thread-safe, byte-addressed device: any member of the positional I/O family
/// that can be shared between threads.
pub trait BlockDev: ReadAt + WriteAt + Send + Sync {}

impl<T: ReadAt + WriteAt + Send + Sync + ?Sized> BlockDev for T {}

/// A regular file or block device accessed with `pread`/`pwrite`/`fdatasync`.
pub struct FileDev {
    file: File,
}

impl FileDev {
    /// Wrap an open file.
    pub fn new(file: File) -> Self {
        FileDev { file }
    }
    /// Open `path` read-only or read-write.
    pub fn open(path: &std::path::Path, writable: bool) -> snapblk_core::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| {
                Error::new(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("{}: {e}", path.display()),
                )
            })?;
        Ok(FileDev { file })
    }
}

/// How an opened [`FileDev`] shares its file with other openers, through a BSD `flock` on it.
/// The lock goes with the open file: closing it, or the process dying (SIGKILL, a crash), drops
/// it, so there is never a stale lock to clean up. Advisory: it keeps snapblk processes (and
/// tools that follow the same convention for block devices, as udev and mkfs do) apart, not
/// other writers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Others may read alongside (a served snapshot's base and COW).
    Shared,
    /// Nobody else may have it open through a `Hold` (a merge's base and COW, a writable
    /// snapshot's COW).
    Exclusive,
}

impl FileDev {
    /// Open `path` like [`FileDev::open`] and take `hold` on it without waiting. A file held
    /// in a conflicting way fails with EBUSY and says why; a file system without `flock`
    /// (ENOLCK, EOPNOTSUPP) is opened without the lock rather than refused.
    pub(crate) fn open_held(
        path: &std::path::Path,
        writable: bool,
        hold: Hold,
    ) -> snapblk_core::Result<Self> {
        let dev = Self::open(path, writable)?;
        let r = match hold {
            Hold::Shared => dev.file.try_lock_shared(),
            Hold::Exclusive => dev.file.try_lock(),
        };
        match r {
            Ok(()) => Ok(dev),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(
                libc::EBUSY,
                match hold {
                    Hold::Exclusive => format!(
                        "{}: in use by another process (a snapblk serving or merging it); \
                         a merge or a writable snapshot needs it to itself",
                        path.display()
                    ),
                    Hold::Shared => format!(
                        "{}: in use by another process that is writing it (a snapblk merge \
                         or writable snapshot of it)",
                        path.display()
                    ),
                },
            )),
            Err(std::fs::TryLockError::Error(e))
                if matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP)) =>
            {
                Ok(dev)
            }
            Err(std::fs::TryLockError::Error(e)) => Err(Error::new(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("{}: locking: {e}", path.display()),
            )),
        }
    }

    /// The general read: retries short reads and EINTR until `buf` is full or end of file.
    #[cold]
    #[inline(never)]
    fn read_all_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, off)
    }
}

impl ReadAt for FileDev {
    #[inline]
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.file, buf, off)
    }
    fn size(&self) -> io::Result<u64> {
        self.file.size()
    }
    #[inline]
    fn read_exact_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        // One pread fills the buffer in all but rare cases (signals, end of file).
        match std::os::unix::fs::FileExt::read_at(&self.file, buf, off) {
            Ok(n) if n == buf.len() => Ok(()),
            _ => self.read_all_at(off, buf),
        }
    }
    #[inline]
    fn as_file(&self) -> Option<&File> {
        Some(&self.file)
    }
}

impl WriteAt for FileDev {
    fn write_all_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(off, buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Any snapblk-core device used through one of its queues (serialised by a mutex).
#[cfg(test)]
pub(crate) struct QueueDev {
    queue: Mutex<Box<dyn Queue>>,
    capacity: u64,
}

#[cfg(test)]
impl QueueDev {
    /// Take queue 0 of a started instance.
    pub(crate) fn from_blkio(b: &mut snapblk_core::Blkio) -> snapblk_core::Result<Self> {
        let capacity = b.get_u64("capacity")?;
        let queue = b
            .take_queue(0, false)
            .ok_or_else(|| Error::new(libc::ENODEV, "device has no free queue 0"))?;
        Ok(QueueDev {
            queue: Mutex::new(queue),
            capacity,
        })
    }
}

#[cfg(test)]
impl ReadAt for QueueDev {
    /// Reads what lies before the device's end, in one request.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.capacity.checked_sub(off).map_or(0, |left| {
            buf.len().min(usize::try_from(left).unwrap_or(usize::MAX))
        });
        self.read_exact_at(off, &mut buf[..n])?;
        Ok(n)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.capacity)
    }
    fn read_exact_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        Ok(lock(&self.queue).read_at(off, buf)?)
    }
}

#[cfg(test)]
impl WriteAt for QueueDev {
    fn write_all_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        Ok(lock(&self.queue).write_at(off, buf, false)?)
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(lock(&self.queue).flush()?)
    }
}

/// A read-only view of `inner` as if it had been grown to `size` bytes: what lies past its end
/// reads as zeros, as it does once a growable device (an RBD image) is grown. `merge --check`
/// of a growing update checks, through it, the base a merge would grow before its first write.
/// Writes fail with `EROFS`.
pub struct GrownView<D> {
    inner: D,
    size: u64,
}

impl<D: ReadAt> GrownView<D> {
    /// `inner` seen at `size` bytes (its own size if that is larger).
    pub fn new(inner: D, size: u64) -> io::Result<Self> {
        let size = size.max(inner.size()?);
        Ok(GrownView { inner, size })
    }
}

impl<D: ReadAt> ReadAt for GrownView<D> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let end = self.inner.size()?;
        let want = usize::try_from(self.size.saturating_sub(off))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if off < end {
            let n = self.inner.read_at(off, &mut buf[..want])?;
            // Short before the inner end: the caller asks again. Up to it: zeros follow.
            if off + (n as u64) < end || n == want {
                return Ok(n);
            }
            buf[n..want].fill(0);
        } else {
            buf[..want].fill(0);
        }
        Ok(want)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }
}

impl<D> WriteAt for GrownView<D> {
    fn write_all_at(&self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{FaultDriver, FaultWorld};

    #[test]
    fn a_grown_view_reads_zeros_past_the_end_and_refuses_writes() {
        let v = GrownView::new(vec![7u8; 10], 16).unwrap();
        assert_eq!(v.size().unwrap(), 16);
        let mut b = [1u8; 20];
        v.read_exact_at(0, &mut b[..16]).unwrap();
        assert_eq!(&b[..10], &[7; 10]);
        assert_eq!(&b[10..16], &[0; 6]);
        assert_eq!(v.read_at(4, &mut b).unwrap(), 12, "up to the grown end");
        assert_eq!(v.read_at(12, &mut b).unwrap(), 4);
        assert_eq!(&b[..4], &[0; 4]);
        assert_eq!(v.read_at(16, &mut b).unwrap(), 0);
        assert_eq!(
            v.write_all_at(0, &[1]).unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
        let small = GrownView::new(vec![7u8; 10], 4).unwrap();
        assert_eq!(small.size().unwrap(), 10, "never smaller than the device");
    }

    #[test]
    fn a_queue_is_a_device_without_a_descriptor() {
        let world = FaultWorld::new(vec![vec![0u8; 8192]]);
        let mut b = snapblk_core::Blkio::new(Box::new(FaultDriver::new(world.disk(0))));
        b.connect().unwrap();
        b.start().unwrap();
        let d = QueueDev::from_blkio(&mut b).unwrap();
        assert!(d.as_file().is_none());
        assert_eq!(d.size().unwrap(), 8192);
        d.write_all_at(4096, &[7u8; 4096]).unwrap();
        d.sync_data().unwrap();
        let mut buf = [0u8; 8192];
        // A read is clamped to the device's end; an exact read past it fails.
        assert_eq!(d.read_at(4096, &mut buf).unwrap(), 4096);
        assert_eq!(buf[..4096], [7u8; 4096]);
        assert_eq!(d.read_at(8192, &mut buf).unwrap(), 0);
        assert!(d.read_exact_at(4096, &mut buf).is_err());
        assert_eq!(world.counters(0), (1, 1));
    }

    #[test]
    fn a_file_device_offers_its_descriptor_and_sizes_itself() {
        let path = std::env::temp_dir().join(format!("snapblk-dev-{}", std::process::id()));
        std::fs::write(&path, [5u8; 1000]).unwrap();
        let d = FileDev::open(&path, false).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(d.as_file().is_some());
        assert_eq!(d.size().unwrap(), 1000);
        let mut buf = [0u8; 600];
        d.read_exact_at(400, &mut buf).unwrap();
        let e = d.read_exact_at(401, &mut buf).unwrap_err();
        assert_eq!(
            snapblk_core::read_error(401, e).msg,
            "short read at offset 401"
        );
    }
}
