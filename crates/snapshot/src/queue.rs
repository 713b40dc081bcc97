//! A synchronous [`Queue`] shared by this crate's drivers: requests are executed, one after the
//! other, inside `do_io` by a [`Backend`]. The snapshot driver's work per request is a block-map
//! lookup plus one or a few `pread`s, so handing requests to another thread would cost more than
//! it saves; parallelism comes from using several queues. The queue is generic over its backend
//! so the backend's read is inlined into the request dispatch (no virtual call per request).
//!
//! [`Backend`] is the request layer, kept apart from the positional I/O family
//! ([`snapblk_core::ReadAt`], [`snapblk_core::WriteAt`]) on purpose: it speaks in requests (FUA
//! writes, write-zeroes, discard) and fails with the [`snapblk_core::Error`] a C caller receives
//! (a snapshot's read can fail with a range, corruption or merge error that is no I/O error of a
//! byte source). Where a backend is just bytes at offsets, it is built on the family:
//! [`DevBackend`] serves requests from any [`BlockDev`] (reads are exact reads, a FUA write is a
//! write then `sync_data`).

#[cfg(feature = "test-utils")]
use crate::dev::BlockDev;
#[cfg(feature = "test-utils")]
use snapblk_core::read_error;
use snapblk_core::sys::EventFd;
use snapblk_core::{Completion, Error, Op, Queue, Request, check_do_io_args};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// What a queue executes requests against.
pub(crate) trait Backend: Send + Sync {
    /// Read `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> snapblk_core::Result<()>;
    /// Write `buf` at `offset`; durable on return when `fua`.
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> snapblk_core::Result<()>;
    /// Make completed writes durable.
    fn flush(&self) -> snapblk_core::Result<()>;
    /// Zero a range (default: write zero buffers).
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> snapblk_core::Result<()> {
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write(offset + done, &zeros[..n], false)?;
            done += n as u64;
        }
        if fua { self.flush() } else { Ok(()) }
    }
    /// Discard a range (default: unsupported).
    fn discard(&self, _offset: u64, _len: u64) -> snapblk_core::Result<()> {
        Err(Error::new(libc::ENOTSUP, "discard not supported"))
    }
}

impl<T: Backend + ?Sized> Backend for Arc<T> {
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        (**self).read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> snapblk_core::Result<()> {
        (**self).write(offset, buf, fua)
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        (**self).flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> snapblk_core::Result<()> {
        (**self).write_zeroes(offset, len, fua)
    }
    fn discard(&self, offset: u64, len: u64) -> snapblk_core::Result<()> {
        (**self).discard(offset, len)
    }
}

/// Any device of the positional I/O family as a request [`Backend`] (the fault-injection
/// driver's disks).
#[cfg(feature = "test-utils")]
pub(crate) struct DevBackend<D>(pub(crate) D);

#[cfg(feature = "test-utils")]
impl<D: BlockDev> Backend for DevBackend<D> {
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        self.0
            .read_exact_at(offset, buf)
            .map_err(|e| read_error(offset, e))
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> snapblk_core::Result<()> {
        self.0.write_all_at(offset, buf)?;
        if fua { self.flush() } else { Ok(()) }
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        Ok(self.0.sync_data()?)
    }
}

/// The synchronous queue.
pub(crate) struct SyncQueue<B: Backend> {
    backend: B,
    pending: Vec<Request>,
    /// The previous batch's vector, reused so that steady-state `do_io` never allocates.
    spare: Vec<Request>,
    ready: VecDeque<Completion>,
    efd: EventFd,
    efd_enabled: bool,
}

impl<B: Backend> SyncQueue<B> {
    /// A queue over `backend`, with its own eventfd.
    pub(crate) fn new(backend: B) -> snapblk_core::Result<Self> {
        let efd = EventFd::new()?;
        Ok(SyncQueue {
            backend,
            pending: Vec::new(),
            spare: Vec::new(),
            ready: VecDeque::new(),
            efd,
            efd_enabled: true,
        })
    }

    fn exec(&self, req: &Request) -> snapblk_core::Result<()> {
        let fua = req.flags.contains(snapblk_core::ReqFlags::FUA);
        match req.op {
            Op::Read { offset, buf, len } => {
                if len == 0 {
                    return Ok(());
                }
                // SAFETY: the enqueue contract keeps `buf..buf+len` valid and exclusively ours
                // until the completion is returned, which happens after this call.
                let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                self.backend.read(offset, b)
            }
            Op::Write { offset, buf, len } => {
                if len == 0 {
                    return if fua { self.backend.flush() } else { Ok(()) };
                }
                // SAFETY: as above; the caller does not modify the buffer until completion.
                let b = unsafe { std::slice::from_raw_parts(buf, len) };
                self.backend.write(offset, b, fua)
            }
            Op::Readv {
                offset,
                iov,
                iovcnt,
            }
            | Op::Writev {
                offset,
                iov,
                iovcnt,
            } => {
                let write = matches!(req.op, Op::Writev { .. });
                if iovcnt <= 0 || iov.is_null() {
                    return Ok(());
                }
                // SAFETY: the enqueue contract keeps the iovec array valid until completion.
                let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
                let mut off = offset;
                for i in v {
                    if i.iov_len == 0 {
                        continue;
                    }
                    if write {
                        // SAFETY: each iovec points to caller memory valid until completion.
                        let b = unsafe {
                            std::slice::from_raw_parts(i.iov_base as *const u8, i.iov_len)
                        };
                        self.backend.write(off, b, false)?;
                    } else {
                        // SAFETY: as above, and not accessed by the caller until completion.
                        let b = unsafe {
                            std::slice::from_raw_parts_mut(i.iov_base as *mut u8, i.iov_len)
                        };
                        self.backend.read(off, b)?;
                    }
                    off += i.iov_len as u64;
                }
                if write && fua {
                    self.backend.flush()
                } else {
                    Ok(())
                }
            }
            Op::Flush => self.backend.flush(),
            Op::Discard { offset, len } => self.backend.discard(offset, len),
            Op::WriteZeroes { offset, len } => self.backend.write_zeroes(offset, len, fua),
            Op::Zone(_) => Err(Error::new(
                libc::ENOTSUP,
                "zoned requests are not supported",
            )),
        }
    }

    /// One request: the 4 KiB random-read case straight to the backend, everything else via
    /// `exec`.
    #[inline]
    fn exec_one(&self, req: &Request) -> snapblk_core::Result<()> {
        match req.op {
            Op::Read { offset, buf, len } if len > 0 => {
                // SAFETY: as in `exec`: the enqueue (or `run_one`) contract keeps `buf..buf+len`
                // valid and exclusively ours until the request completes, after this call.
                let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                self.backend.read(offset, b)
            }
            _ => self.exec(req),
        }
    }

    fn signal(&self) {
        if self.efd_enabled && !self.ready.is_empty() {
            self.efd.signal();
        }
    }
}

impl<B: Backend + 'static> Queue for SyncQueue<B> {
    /// Requests run to completion inside `do_io` anyway, so a lone request (`read_at` and the
    /// other synchronous conveniences) is executed here at once, with the result its completion
    /// would carry: no `Vec` push and pop, no completion array, one virtual call instead of
    /// three (`outstanding`, `enqueue`, `do_io`).
    unsafe fn run_one(&mut self, req: Request) -> snapblk_core::Result<()> {
        if self.outstanding() != 0 {
            return Err(Error::new(libc::EBUSY, "queue has requests in flight"));
        }
        if let Err(msg) = req.validate() {
            return Err(Error::new(libc::EINVAL, msg.to_string_lossy().into_owned()));
        }
        // A completion carries only the errno (`Completion::os_err`); so does this result.
        self.exec_one(&req)
            .map_err(|e| Error::from_errno(e.errno.abs()))
    }

    unsafe fn enqueue(&mut self, req: Request) {
        if let Err(msg) = req.validate() {
            self.ready
                .push_back(Completion::err(req.user_data, libc::EINVAL, msg));
            return;
        }
        self.pending.push(req);
    }

    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        _timeout: Option<&mut Duration>,
        _sigmask: Option<&libc::sigset_t>,
    ) -> snapblk_core::Result<usize> {
        check_do_io_args(out.len(), min, self.pending.len() + self.ready.len())?;
        // QD1 fast path (one request, nothing else ready): complete straight into `out`.
        if self.pending.len() == 1
            && self.ready.is_empty()
            && let Some(slot) = out.first_mut()
            && let Some(req) = self.pending.pop()
        {
            *slot = match self.exec_one(&req) {
                Ok(()) => Completion::ok(req.user_data),
                Err(e) => Completion::os_err(req.user_data, e.errno),
            };
            return Ok(1);
        }
        let mut batch = std::mem::replace(&mut self.pending, std::mem::take(&mut self.spare));
        for req in batch.drain(..) {
            let c = match self.exec(&req) {
                Ok(()) => Completion::ok(req.user_data),
                Err(e) => Completion::os_err(req.user_data, e.errno),
            };
            self.ready.push_back(c);
        }
        self.spare = batch;
        let n = out.len().min(self.ready.len());
        for slot in out.iter_mut().take(n) {
            // `n` is at most ready.len(), so this always yields.
            if let Some(c) = self.ready.pop_front() {
                *slot = c;
            }
        }
        self.signal();
        Ok(n)
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.efd.raw())
    }

    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.efd_enabled = enabled;
    }

    fn outstanding(&self) -> usize {
        self.pending.len() + self.ready.len()
    }
}

#[cfg(all(test, feature = "test-utils"))]
mod tests {
    use super::*;
    use snapblk_core::{MemFile, QueueExt, ReqFlags};

    fn queue() -> SyncQueue<DevBackend<MemFile>> {
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        SyncQueue::new(DevBackend(MemFile::new(data))).unwrap()
    }

    /// The result and buffer of `req` (built over `buf`) on a fresh queue, run directly
    /// (`run_one`) or queued (`enqueue`, `do_io`, the completion's result).
    fn outcome(
        direct: bool,
        make: impl Fn(&mut [u8]) -> Request,
    ) -> (Result<(), (i32, String)>, Vec<u8>) {
        let mut q = queue();
        let mut buf = vec![0xeeu8; 4096];
        let req = make(&mut buf);
        let r = if direct {
            // SAFETY: `buf` outlives the call, which completes the request.
            unsafe { q.run_one(req) }
        } else {
            // SAFETY: as above; `do_io` returns the completion before `buf` is touched.
            unsafe { q.enqueue(req) };
            let mut c = [Completion::default()];
            assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
            c[0].result()
        };
        assert_eq!(q.outstanding(), 0);
        (r.map_err(|e| (e.errno, e.to_string())), buf)
    }

    #[test]
    fn run_one_gives_what_the_completion_gives() {
        let read = |offset: u64, len: usize, flags: ReqFlags| {
            move |b: &mut [u8]| {
                Request::new(
                    Op::Read {
                        offset,
                        buf: b.as_mut_ptr(),
                        len: len.min(b.len()),
                    },
                    7,
                    flags,
                )
            }
        };
        type Make = Box<dyn Fn(&mut [u8]) -> Request>;
        let cases: Vec<(&str, Make)> = vec![
            ("4 KiB read", Box::new(read(1000, 4096, ReqFlags::NONE))),
            ("partial read", Box::new(read(8000, 100, ReqFlags::NONE))),
            ("past the end", Box::new(read(6000, 4096, ReqFlags::NONE))),
            ("empty read", Box::new(read(0, 0, ReqFlags::NONE))),
            ("FUA on a read", Box::new(read(0, 4096, ReqFlags::FUA))),
            (
                "offset over i64",
                Box::new(read(u64::MAX, 4096, ReqFlags::NONE)),
            ),
            (
                "flush",
                Box::new(|_: &mut [u8]| Request::new(Op::Flush, 1, ReqFlags::NONE)),
            ),
        ];
        for (name, make) in &cases {
            let direct = outcome(true, make);
            let queued = outcome(false, make);
            assert_eq!(direct, queued, "{name}");
        }
        // The cases above do reach both outcomes.
        assert!(outcome(true, &cases[0].1).0.is_ok());
        let (errs, _) = outcome(true, &cases[2].1);
        assert_eq!(errs.unwrap_err().0, libc::EIO);
        let (errs, _) = outcome(true, &cases[4].1);
        assert_eq!(
            errs.unwrap_err(),
            (
                libc::EINVAL,
                "BLKIO_REQ_FUA is invalid for this request type".to_string()
            )
        );
    }

    #[test]
    fn run_one_refuses_a_busy_queue_and_leaves_its_request() {
        let mut q = queue();
        let mut a = vec![0u8; 512];
        // SAFETY: `a` outlives the completion reaped below.
        unsafe {
            q.enqueue(Request::new(
                Op::Read {
                    offset: 512,
                    buf: a.as_mut_ptr(),
                    len: a.len(),
                },
                3,
                ReqFlags::NONE,
            ))
        };
        let mut b = vec![0u8; 512];
        assert_eq!(q.read_at(0, &mut b).unwrap_err().errno, libc::EBUSY);
        let mut c = [Completion::default()];
        assert_eq!(q.do_io(&mut c, 1, None, None).unwrap(), 1);
        assert_eq!((c[0].user_data, c[0].ret), (3, 0));
        assert_eq!(a[0], (512 % 251) as u8);
        q.read_at(0, &mut b).unwrap();
        assert_eq!(b[1], 1);
    }
}
