//! Byte-addressed backing devices for the snapshot layer.
//!
//! The snapshot device reads its base and COW from many threads at once (every client queue plus
//! the merge thread), synchronously, one segment at a time. [`FileDev`] does exactly that with
//! `pread`/`pwrite` on a shared file descriptor: no per-queue ring, no extra completion hop, which
//! keeps a COPY-op read within a few percent of a raw read of the base. [`QueueDev`] adapts any
//! snapblk-core driver (io_uring, the fault-injection driver, an NBD client...) when a backend is
//! not a plain file, at the price of a mutex around one queue.

use snapblk_core::sync::lock;
use snapblk_core::{Error, Queue, QueueExt};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

/// A synchronous, thread-safe, byte-addressed device.
pub trait BlockDev: Send + Sync {
    /// Read exactly `buf.len()` bytes at `off` (reads past the end fail with EIO).
    fn read_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()>;
    /// Write all of `buf` at `off`.
    fn write_at(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> snapblk_core::Result<()>;
    /// Current size in bytes.
    fn size(&self) -> snapblk_core::Result<u64>;
    /// The file behind the device when reads are plain `pread`s of it (lets the read path skip
    /// a virtual call per request).
    fn as_file(&self) -> Option<&File> {
        None
    }
}

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
pub enum Hold {
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
    pub fn open_held(
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
    fn read_all_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        self.file.read_exact_at(buf, off).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::new(libc::EIO, format!("short read at offset {off}"))
            } else {
                Error::from_io(e)
            }
        })
    }
}

impl BlockDev for FileDev {
    #[inline]
    fn read_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        // One pread fills the buffer in all but rare cases (signals, end of file).
        match self.file.read_at(buf, off) {
            Ok(n) if n == buf.len() => Ok(()),
            _ => self.read_all_at(off, buf),
        }
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()> {
        self.file.write_all_at(buf, off).map_err(Error::from_io)
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        self.file.sync_data().map_err(Error::from_io)
    }
    fn size(&self) -> snapblk_core::Result<u64> {
        use std::os::unix::fs::FileTypeExt;
        let md = self.file.metadata().map_err(Error::from_io)?;
        if md.file_type().is_block_device() {
            // A block device reports size 0 in metadata; ask the kernel.
            use std::os::fd::AsRawFd;
            snapblk_core::sys::blkgetsize64(self.file.as_raw_fd())
        } else {
            Ok(md.len())
        }
    }
    fn as_file(&self) -> Option<&File> {
        Some(&self.file)
    }
}

/// An in-memory device (tests, benchmarks of the engine itself).
#[derive(Default)]
pub struct MemDev {
    data: Mutex<Vec<u8>>,
}

impl MemDev {
    /// A device holding `data`.
    pub fn new(data: Vec<u8>) -> Self {
        MemDev {
            data: Mutex::new(data),
        }
    }
    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        lock(&self.data).clone()
    }
}

impl BlockDev for MemDev {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        let d = lock(&self.data);
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= d.len() as u64);
        let Some(end) = end else {
            return Err(Error::new(libc::EIO, "read past end"));
        };
        buf.copy_from_slice(&d[off as usize..end as usize]);
        Ok(())
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()> {
        let mut d = lock(&self.data);
        let end = (off as usize).saturating_add(buf.len());
        if d.len() < end {
            d.resize(end, 0);
        }
        d[off as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        Ok(())
    }
    fn size(&self) -> snapblk_core::Result<u64> {
        Ok(lock(&self.data).len() as u64)
    }
}

/// Any snapblk-core device used through one of its queues (serialised by a mutex).
pub struct QueueDev {
    queue: Mutex<Box<dyn Queue>>,
    capacity: u64,
}

impl QueueDev {
    /// Take queue 0 of a started instance.
    pub fn from_blkio(b: &mut snapblk_core::Blkio) -> snapblk_core::Result<Self> {
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

impl BlockDev for QueueDev {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        lock(&self.queue).read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()> {
        lock(&self.queue).write_at(off, buf, false)
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        lock(&self.queue).flush()
    }
    fn size(&self) -> snapblk_core::Result<u64> {
        Ok(self.capacity)
    }
}

impl<T: BlockDev + ?Sized> BlockDev for Arc<T> {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        (**self).read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()> {
        (**self).write_at(off, buf)
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        (**self).flush()
    }
    fn size(&self) -> snapblk_core::Result<u64> {
        (**self).size()
    }
    fn as_file(&self) -> Option<&File> {
        (**self).as_file()
    }
}
