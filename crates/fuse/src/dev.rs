//! Byte-granular I/O on a block device shared by the FUSE worker threads: a pool of queues (one
//! per concurrent request), device-limit splitting, and read-modify-write for requests that are
//! not aligned to the device's request alignment.

use snapblk_core::sync::{lock, read, wait, write};
use snapblk_core::{Blkio, Queue, QueueExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock};

/// Why an I/O failed: the errno for the FUSE reply, and the device's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg} (errno {errno})")]
pub struct IoError {
    /// Positive errno returned to the kernel in the FUSE reply (e.g. `EIO`, `EINVAL`).
    pub errno: i32,
    /// What failed, for logs.
    pub msg: String,
}

impl From<snapblk_core::Error> for IoError {
    fn from(e: snapblk_core::Error) -> Self {
        IoError {
            errno: e.errno,
            msg: e.msg.into_owned(),
        }
    }
}

fn einval(msg: &str) -> IoError {
    IoError {
        errno: libc::EINVAL,
        msg: msg.to_owned(),
    }
}

/// An over-allocated buffer used from its first `align`-aligned byte.
struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> AlignedBuf {
        let v = vec![0u8; len + align];
        let off = v.as_ptr().align_offset(align).min(align);
        AlignedBuf { v, off, len }
    }
    fn as_slice(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

struct Inner {
    // Before `dev`: queues drop before the device that made them.
    pool: Vec<Box<dyn Queue>>,
    dev: Blkio,
}

/// Counts a write in `writes_done` when dropped. Made right after taking `rmw`, so it drops
/// before the lock guard: a write is counted (failed or not: it may have changed blocks) before
/// [`Device::refuse_writes`] can get between it and its reply, and a flush issued after the
/// count covers it.
struct CountWrite<'a>(&'a AtomicU64);

impl Drop for CountWrite<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A started device used by many threads.
pub struct Device {
    inner: Mutex<Inner>,
    returned: Condvar,
    /// Device size in bytes (`capacity` at creation).
    pub size: u64,
    /// Whether the device is read-only (`read-only`): writes fail with `EROFS`.
    pub read_only: bool,
    /// Request alignment (power of two).
    align: u64,
    buf_align: usize,
    max_transfer: usize,
    /// Unaligned writes (read-modify-write) exclude every other write.
    rmw: RwLock<()>,
    /// Writes (and zeroings) finished so far, counted when their I/O has returned.
    writes_done: AtomicU64,
    /// `writes_done` as it was when the last successful flush was issued: every write counted
    /// up to there is durable. The lock also serialises flushes, so an fsync that finds one in
    /// progress waits for it instead of returning before the data it covers is durable.
    flushed: Mutex<u64>,
    /// Set by [`Device::refuse_writes`]: the export is going away with users left.
    closing: AtomicBool,
}

impl Device {
    /// Take over a started device; its existing queues become the initial pool, and more are
    /// added on demand where the driver allows it.
    pub fn new(mut dev: Blkio) -> Result<Device, IoError> {
        let size = dev.get_u64("capacity")?;
        let read_only = dev.get_bool("read-only")?;
        let align = (dev.get_int("request-alignment")?.max(1) as u64).next_power_of_two();
        let buf_align = (dev.get_int("buf-alignment")?.max(1) as usize).next_power_of_two();
        let mt = dev.get_int("max-transfer")?;
        // Keep chunks aligned; 0 means no limit.
        let max_transfer = if mt <= 0 {
            usize::MAX
        } else {
            (mt as usize / align as usize).max(1) * align as usize
        };
        let mut pool = Vec::new();
        for i in 0..dev.get_int("num-queues").unwrap_or(0).max(0) as usize {
            if let Some(q) = dev.take_queue(i, false) {
                pool.push(q);
            }
        }
        Ok(Device {
            inner: Mutex::new(Inner { pool, dev }),
            returned: Condvar::new(),
            size,
            read_only,
            align,
            buf_align,
            max_transfer,
            rmw: RwLock::new(()),
            writes_done: AtomicU64::new(0),
            flushed: Mutex::new(0),
            closing: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Run `f` on a queue of our own (pooled, or added on demand; when the driver cannot add
    /// queues, wait for a pooled one).
    fn with_queue<R>(
        &self,
        f: impl FnOnce(&mut dyn Queue) -> Result<R, IoError>,
    ) -> Result<R, IoError> {
        let mut q = {
            let mut g = self.lock();
            loop {
                if let Some(q) = g.pool.pop() {
                    break q;
                }
                if g.dev.driver().can_add_queues() {
                    let idx = g.dev.add_queue(false)?;
                    match g.dev.take_queue(idx, false) {
                        Some(q) => break q,
                        None => return Err(einval("device queue vanished")),
                    }
                }
                // Fixed queue count: wait for another thread to return one.
                g = wait(&self.returned, g);
            }
        };
        let r = f(&mut *q);
        // A queue whose request is still in flight (its wait failed) may write into a buffer we
        // are about to free; never reuse or drop it.
        if q.outstanding() == 0 {
            self.lock().pool.push(q);
            self.returned.notify_one();
        } else {
            std::mem::forget(q);
        }
        r
    }

    /// Read up to `len` bytes at `off` (short at the end of the device).
    pub fn read(&self, off: u64, len: usize, out: &mut Vec<u8>) -> Result<(), IoError> {
        out.clear();
        if off >= self.size || len == 0 {
            return Ok(());
        }
        let end = (off + len as u64).min(self.size);
        let a = self.align;
        let astart = off / a * a;
        // A device whose size is not a multiple of its alignment (a file opened O_DIRECT) has
        // its partial last block read whole, as O_DIRECT requires: the file drivers zero-fill
        // past the end of a file, and only the bytes up to `end` are returned.
        let aend = end.div_ceil(a) * a;
        let mut buf = AlignedBuf::new((aend - astart) as usize, self.buf_align);
        self.with_queue(|q| self.read_aligned(q, astart, buf.as_mut_slice()))?;
        let s = (off - astart) as usize;
        out.extend_from_slice(&buf.as_slice()[s..s + (end - off) as usize]);
        Ok(())
    }

    fn read_aligned(&self, q: &mut dyn Queue, off: u64, buf: &mut [u8]) -> Result<(), IoError> {
        for (i, c) in buf.chunks_mut(self.max_transfer).enumerate() {
            q.read_at(off + (i * self.max_transfer) as u64, c)?;
        }
        Ok(())
    }

    fn write_aligned(&self, q: &mut dyn Queue, off: u64, buf: &[u8]) -> Result<(), IoError> {
        for (i, c) in buf.chunks(self.max_transfer).enumerate() {
            q.write_at(off + (i * self.max_transfer) as u64, c, false)?;
        }
        Ok(())
    }

    /// Write `data` at `off`; returns bytes written (short when it runs past the end).
    pub fn write(&self, off: u64, data: &[u8]) -> Result<usize, IoError> {
        if self.read_only {
            return Err(IoError {
                errno: libc::EROFS,
                msg: "read-only device".into(),
            });
        }
        if off >= self.size {
            return Err(IoError {
                errno: libc::ENOSPC,
                msg: "write past the end of the device".into(),
            });
        }
        let n = data.len().min((self.size - off) as usize);
        let data = &data[..n];
        if n == 0 {
            return Ok(0);
        }
        let a = self.align;
        if off.is_multiple_of(a) && (n as u64).is_multiple_of(a) {
            let _shared = read(&self.rmw);
            let _counted = CountWrite(&self.writes_done);
            self.check_open()?;
            if self.buf_align <= 1 || (data.as_ptr() as usize).is_multiple_of(self.buf_align) {
                self.with_queue(|q| self.write_aligned(q, off, data))?;
            } else {
                let mut b = AlignedBuf::new(n, self.buf_align);
                b.as_mut_slice().copy_from_slice(data);
                self.with_queue(|q| self.write_aligned(q, off, b.as_slice()))?;
            }
            return Ok(n);
        }
        let _excl = write(&self.rmw);
        let _counted = CountWrite(&self.writes_done);
        self.check_open()?;
        let end = off + n as u64;
        let (astart, aend) = (off / a * a, end.div_ceil(a) * a);
        // The last block of a device whose size is not a multiple of its alignment cannot be
        // read-modify-written: the aligned write would run past the end (and grow a file).
        if aend > self.size {
            return Err(einval(
                "the device's last block is partial (size not a multiple of its alignment)",
            ));
        }
        let mut b = AlignedBuf::new((aend - astart) as usize, self.buf_align);
        self.with_queue(|q| {
            // Only the partial head and tail blocks need their old contents.
            let head = astart;
            let tail = aend - a;
            self.read_aligned(q, head, &mut b.as_mut_slice()[..a as usize])?;
            if tail != head {
                let t = (tail - astart) as usize;
                self.read_aligned(q, tail, &mut b.as_mut_slice()[t..t + a as usize])?;
            }
            let s = (off - astart) as usize;
            b.as_mut_slice()[s..s + n].copy_from_slice(data);
            self.write_aligned(q, astart, b.as_slice())
        })?;
        Ok(n)
    }

    /// Zero a range (`punch`: may deallocate). Unaligned edges are written as zero buffers.
    pub fn zero(&self, off: u64, len: u64, punch: bool) -> Result<(), IoError> {
        if self.read_only {
            return Err(IoError {
                errno: libc::EROFS,
                msg: "read-only device".into(),
            });
        }
        let end = off
            .checked_add(len)
            .ok_or_else(|| einval("range overflows"))?
            .min(self.size);
        if off >= end {
            return Ok(());
        }
        let a = self.align;
        let (istart, iend) = (off.div_ceil(a) * a, end / a * a);
        if istart >= iend {
            let z = vec![0u8; (end - off) as usize];
            return self.write(off, &z).map(|_| ());
        }
        if off < istart {
            self.write(off, &vec![0u8; (istart - off) as usize])?;
        }
        if iend < end {
            self.write(iend, &vec![0u8; (end - iend) as usize])?;
        }
        let shared = read(&self.rmw);
        let counted = CountWrite(&self.writes_done);
        self.check_open()?;
        let flags = if punch {
            snapblk_core::ReqFlags::NONE
        } else {
            snapblk_core::ReqFlags::NO_UNMAP
        };
        match self.with_queue(|q| Ok(q.write_zeroes(istart, iend - istart, flags)?)) {
            Err(e) if e.errno == libc::ENOTSUP || e.errno == libc::EOPNOTSUPP => {
                drop(counted);
                drop(shared);
                // The driver cannot zero natively: write zero buffers.
                let chunk = vec![0u8; (1 << 20).min((iend - istart) as usize)];
                let mut o = istart;
                while o < iend {
                    let k = chunk.len().min((iend - o) as usize);
                    self.write(o, &chunk[..k])?;
                    o += k as u64;
                }
                Ok(())
            }
            r => r,
        }
    }

    /// From now on every write fails (EIO); returns once no write is in progress, so a flush
    /// after it covers every write that was ever acknowledged.
    pub fn refuse_writes(&self) {
        // Every write holds `rmw` (shared or exclusive) while it runs.
        let _all = write(&self.rmw);
        self.closing.store(true, Ordering::Release);
    }

    fn check_open(&self) -> Result<(), IoError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(IoError {
                errno: libc::EIO,
                msg: "the export is shutting down".into(),
            });
        }
        Ok(())
    }

    /// Make every write that finished before this call durable. Skipped when a flush issued
    /// after the last of them has already succeeded; waits for a flush in progress.
    pub fn flush(&self) -> Result<(), IoError> {
        let target = self.writes_done.load(Ordering::Acquire);
        let mut flushed = lock(&self.flushed);
        if *flushed >= target {
            return Ok(());
        }
        // Writes finishing from here on may or may not be covered: count only those before.
        let covers = self.writes_done.load(Ordering::Acquire);
        self.with_queue(|q| Ok(q.flush()?))?;
        *flushed = covers;
        Ok(())
    }
}
