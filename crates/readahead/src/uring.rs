//! io_uring buffered reads with a bounded number in flight: a read's completion means its pages
//! are in the page cache and up to date, so no "settle" wait is needed. The data itself is
//! discarded (each slot reuses one scratch buffer).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

struct Slot {
    buf: Vec<u8>,
    /// Keeps the fd open until the kernel is done with it.
    file: Option<File>,
    /// What is still to be read: buffered io_uring reads may complete short.
    off: u64,
    len: usize,
}

/// A ring with `depth` read slots of `chunk` bytes.
pub(crate) struct Reader {
    ring: io_uring::IoUring,
    slots: Vec<Slot>,
    free: Vec<usize>,
    in_flight: usize,
    /// Reads that ended in an error (negative CQE result) since the ring was created; the error is
    /// only counted, and the rest of that chunk stays unread.
    pub errors: u64,
}

impl Reader {
    /// A ring of `depth` read slots (clamped to 1..=256) with `chunk`-byte buffers each; fails
    /// where io_uring is unavailable or forbidden.
    pub(crate) fn new(depth: usize, chunk: u64) -> io::Result<Reader> {
        let depth = depth.clamp(1, 256);
        let ring = io_uring::IoUring::new(depth.next_power_of_two() as u32)?;
        let slots = (0..depth)
            .map(|_| Slot {
                buf: vec![0u8; chunk as usize],
                file: None,
                off: 0,
                len: 0,
            })
            .collect();
        Ok(Reader {
            ring,
            slots,
            free: (0..depth).rev().collect(),
            in_flight: 0,
            errors: 0,
        })
    }

    /// Queues a read of `[off, off+len)` (len <= chunk) of `file`, waiting for a free slot first.
    pub(crate) fn read(&mut self, file: &File, off: u64, len: u64) -> io::Result<()> {
        if self.free.is_empty() {
            self.reap(1)?;
        }
        let Some(i) = self.free.pop() else {
            return Err(io::Error::other("io_uring: no free slot"));
        };
        let f = file.try_clone()?;
        let slot = &mut self.slots[i];
        slot.len = (len as usize).min(slot.buf.len());
        slot.off = off;
        slot.file = Some(f);
        self.in_flight += 1;
        self.submit_slot(i)
    }

    fn submit_slot(&mut self, i: usize) -> io::Result<()> {
        let slot = &mut self.slots[i];
        let Some(f) = &slot.file else {
            return Err(io::Error::other("io_uring: slot without file"));
        };
        let sqe = io_uring::opcode::Read::new(
            io_uring::types::Fd(f.as_raw_fd()),
            slot.buf.as_mut_ptr(),
            slot.len as u32,
        )
        .offset(slot.off)
        .build()
        .user_data(i as u64);
        // SAFETY: the buffer and the fd belong to slot i, which is not reused or dropped until
        // its completion has been reaped (slots leave `free` in `read` and return only in
        // `reap`; `Drop` waits for every read in flight). slot.len <= buf.len().
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            self.ring.submit()?;
            // SAFETY: as above; the queue was just flushed, so there is room.
            unsafe { self.ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("io_uring: queue full"))?;
        }
        self.ring.submit()?;
        Ok(())
    }

    /// Waits for at least `want` completions and recycles their slots.
    fn reap(&mut self, want: usize) -> io::Result<()> {
        let want = want.min(self.in_flight);
        if want > 0 {
            loop {
                match self.ring.submit_and_wait(want) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => {
                        r?;
                        break;
                    }
                }
            }
        }
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            let i = ud as usize;
            let Some(s) = self.slots.get_mut(i) else {
                continue;
            };
            // Continue short reads (0 means end of file) and retry EAGAIN.
            let again = if res == -libc::EAGAIN {
                true
            } else if res > 0 && (res as usize) < s.len {
                s.off += res as u64;
                s.len -= res as usize;
                true
            } else {
                false
            };
            if again && self.submit_slot(i).is_ok() {
                continue;
            }
            if res < 0 {
                self.errors += 1;
            }
            if let Some(s) = self.slots.get_mut(i) {
                s.file = None;
            }
            self.free.push(i);
            self.in_flight -= 1;
        }
        Ok(())
    }

    /// Waits until every queued read has completed.
    pub(crate) fn drain(&mut self) -> io::Result<()> {
        while self.in_flight > 0 {
            self.reap(self.in_flight)?;
        }
        Ok(())
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Buffers must outlive the kernel's use of them.
        while self.in_flight > 0 {
            if self.reap(self.in_flight).is_err() {
                // Cannot wait any more; leak the buffers rather than free memory the kernel
                // may still write to.
                for s in self.slots.drain(..) {
                    std::mem::forget(s.buf);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn reads_make_pages_resident() {
        let p = crate::test_support::disk_dir()
            .join(format!("snapblk-ra-uring-{}", std::process::id()));
        {
            let mut f = File::create(&p).unwrap();
            f.write_all(&vec![3u8; 1 << 20]).unwrap();
            f.sync_all().unwrap();
        }
        let f = File::open(&p).unwrap();
        crate::sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_DONTNEED).unwrap();
        assert_eq!(crate::sys::cachestat(f.as_fd(), 0, 0).unwrap().cache, 0);
        let mut r = Reader::new(4, 128 << 10).unwrap();
        for i in 0..8u64 {
            r.read(&f, i * (128 << 10), 128 << 10).unwrap();
        }
        r.drain().unwrap();
        assert_eq!(r.errors, 0);
        assert_eq!(crate::sys::cachestat(f.as_fd(), 0, 0).unwrap().cache, 256);
        std::fs::remove_file(&p).unwrap();
    }
}
