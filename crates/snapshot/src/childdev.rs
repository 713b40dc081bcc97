//! A snapshot base given as a device spec (`base.driver=rbd,base.pool=p,base.image=i`): the
//! driver is opened through the registry's opener and read through a pool of its queues.

use snapblk_core::sync::lock;
use snapblk_core::{Blkio, Error, Queue, QueueExt, ReadAt, WriteAt};
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Opens a started device from a driver name and its properties (`(name, value)` pairs in
/// order, as a device spec gives them), read-write when `writable` and read-only otherwise.
/// The registry (`snapblk::create`) hands one to the snapshot driver, which cannot name the
/// other drivers itself.
pub type DeviceOpener =
    fn(driver: &str, props: &[(String, String)], writable: bool) -> snapblk_core::Result<Blkio>;

/// How many queues of the base device the snapshot reads through at most: its readers (client
/// queues, merge, readahead) take whichever is free.
pub const BASE_QUEUES: i32 = 4;

/// A started device used as a [`crate::BlockDev`]: every queue of it behind its own mutex, a
/// request on the first free one (the device itself kept alive alongside, and with it whatever
/// the driver holds, such as an RBD image's lock). `sync_data` is a flush of the device, so a
/// merge's durable checkpoints are the device's.
pub struct BlkioDev {
    queues: Vec<Mutex<Box<dyn Queue>>>,
    next: AtomicUsize,
    capacity: AtomicU64,
    max_transfer: usize,
    dev: Mutex<Blkio>,
}

impl BlkioDev {
    /// Take every queue of the started instance `b`.
    pub fn new(mut b: Blkio) -> snapblk_core::Result<Self> {
        let capacity = b.get_u64("capacity")?;
        let max_transfer = usize::try_from(b.get_int("max-transfer")?).unwrap_or(0);
        let n = usize::try_from(b.get_int("num-queues")?).unwrap_or(0);
        let queues: Vec<_> = (0..n)
            .filter_map(|i| b.take_queue(i, false))
            .map(Mutex::new)
            .collect();
        if queues.is_empty() {
            return Err(Error::new(libc::ENODEV, "base device has no queue"));
        }
        Ok(BlkioDev {
            queues,
            next: AtomicUsize::new(0),
            capacity: AtomicU64::new(capacity),
            max_transfer,
            dev: Mutex::new(b),
        })
    }

    /// Resize the device to `size` bytes ([`Blkio::resize`]: a driver that can, such as `rbd`;
    /// `ENOTSUP` otherwise). Requests in flight on other threads see the old or the new size.
    pub fn resize(&self, size: u64) -> io::Result<()> {
        let mut dev = lock(&self.dev);
        let r = dev.resize(size);
        let now = dev.get_u64("capacity");
        if let Ok(n) = now {
            self.capacity.store(n, Ordering::Relaxed);
        }
        r?;
        Ok(())
    }

    /// Whether [`BlkioDev::resize`] could change the size, were the device open read-write
    /// ([`Blkio::can_resize`]).
    pub fn can_resize(&self) -> bool {
        lock(&self.dev).can_resize()
    }

    /// Run `f` on a free queue (or wait for the next one in turn when all are busy).
    fn with_queue<T>(
        &self,
        f: impl FnOnce(&mut Box<dyn Queue>) -> snapblk_core::Result<T>,
    ) -> io::Result<T> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.queues.len();
        for i in 0..n {
            if let Ok(mut q) = self.queues[(start + i) % n].try_lock() {
                return Ok(f(&mut q)?);
            }
        }
        Ok(f(&mut lock(&self.queues[start % n]))?)
    }

    /// `len` split into pieces of at most the device's `max-transfer`.
    fn pieces(&self, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let step = if self.max_transfer == 0 {
            len.max(1)
        } else {
            self.max_transfer
        };
        (0..len)
            .step_by(step)
            .map(move |at| (at, step.min(len - at)))
    }
}

impl ReadAt for BlkioDev {
    /// Reads what lies before the device's end.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let n = self
            .capacity
            .load(Ordering::Relaxed)
            .checked_sub(off)
            .map_or(0, |left| {
                buf.len().min(usize::try_from(left).unwrap_or(usize::MAX))
            });
        self.read_exact_at(off, &mut buf[..n])?;
        Ok(n)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.capacity.load(Ordering::Relaxed))
    }
    fn read_exact_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if off.saturating_add(buf.len() as u64) > self.capacity.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        for (at, len) in self.pieces(buf.len()) {
            let piece = &mut buf[at..at + len];
            self.with_queue(|q| q.read_at(off + at as u64, piece))?;
        }
        Ok(())
    }
}

impl WriteAt for BlkioDev {
    fn write_all_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        for (at, len) in self.pieces(buf.len()) {
            let piece = &buf[at..at + len];
            self.with_queue(|q| q.write_at(off + at as u64, piece, false))?;
        }
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        // A flush on one queue covers the writes completed on every queue of the device.
        self.with_queue(|q| q.flush())
    }
}

#[cfg(all(test, feature = "test-utils"))]
mod tests {
    use super::*;
    use crate::fault::{FaultDriver, FaultWorld};

    #[test]
    fn every_queue_serves_and_reads_stop_at_the_end() {
        let world = FaultWorld::new(vec![vec![0u8; 16384]]);
        let mut b = Blkio::new(Box::new(FaultDriver::new(world.disk(0))));
        b.connect().unwrap();
        b.set_int("num-queues", 3).unwrap();
        b.start().unwrap();
        let d = BlkioDev::new(b).unwrap();
        assert_eq!(d.queues.len(), 3);
        assert_eq!(d.size().unwrap(), 16384);
        d.write_all_at(8192, &[9u8; 4096]).unwrap();
        d.sync_data().unwrap();
        let mut buf = [0u8; 8192];
        assert_eq!(d.read_at(8192, &mut buf).unwrap(), 8192);
        assert_eq!(buf[..4096], [9u8; 4096]);
        assert_eq!(d.read_at(16384, &mut buf).unwrap(), 0);
        assert!(d.read_exact_at(12288, &mut buf).is_err());
    }
}
