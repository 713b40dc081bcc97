//! Queues: where requests go in and completions come out.

use crate::request::{Completion, Op, ReqFlags, Request};
use crate::{Error, Result};
use std::os::fd::RawFd;
use std::time::Duration;

/// A request queue. One thread at a time uses a queue (it is `Send`, not `Sync`); different
/// queues of one device may be used from different threads at once.
///
/// Semantics follow libblkio: enqueueing never fails synchronously (a rejected request becomes a
/// failed completion); every request produces exactly one completion; `do_io` is what guarantees
/// submission.
pub trait Queue: Send {
    /// Queue a request.
    ///
    /// # Safety
    /// Every buffer (and iovec array) the request points to must stay valid until its completion
    /// has been returned by [`Queue::do_io`]; a read's buffers must not be accessed by anyone else
    /// in the meantime, a write's must not be modified.
    unsafe fn enqueue(&mut self, req: Request);

    /// Submit everything queued, then reap completions into `out` (at most `out.len()`), waiting
    /// until at least `min` have been reaped. `timeout` bounds the wait (`None`: forever) and is
    /// updated with the time left; on expiry returns `ETIME` and keeps reaped completions for the
    /// next call. `sigmask`, when given, is installed atomically while sleeping and a signal makes
    /// the call fail with `EINTR` (without it, EINTR is retried internally).
    ///
    /// Errors: `EINVAL` when `min > out.len()` or `min` exceeds the outstanding requests.
    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        timeout: Option<&mut Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<usize>;

    /// The eventfd that becomes readable when `do_io` has work (`None` for poll queues).
    fn completion_fd(&self) -> Option<RawFd>;

    /// Hint whether the completion fd should be signalled.
    fn set_completion_fd_enabled(&mut self, enabled: bool);

    /// Whether this is a poll (busy-polling) queue.
    fn is_poll(&self) -> bool {
        false
    }

    /// Requests enqueued or in flight whose completion has not been returned yet.
    fn outstanding(&self) -> usize;
}

/// Synchronous conveniences for Rust callers (the snapshot driver, exports, tools). Each one
/// submits a single request and waits for it, so they must not be mixed with other in-flight
/// requests on the same queue.
pub trait QueueExt: Queue {
    /// Run one request to completion.
    ///
    /// # Safety
    /// As for [`Queue::enqueue`]; the buffers only need to outlive this call.
    unsafe fn run(&mut self, req: Request) -> Result<()> {
        if self.outstanding() != 0 {
            return Err(Error::new(libc::EBUSY, "queue has requests in flight"));
        }
        // SAFETY: forwarded from the caller; we wait for the completion before returning.
        unsafe { self.enqueue(req) };
        let mut c = [Completion::default()];
        loop {
            match self.do_io(&mut c, 1, None, None) {
                Ok(1) => return c[0].result(),
                Ok(_) => continue,
                Err(e) if e.errno == libc::EINTR => continue,
                Err(e) => return Err(e),
            }
        }
    }
    /// Read `buf.len()` bytes at `offset`.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let req = Request::new(Op::Read { offset, buf: buf.as_mut_ptr(), len: buf.len() }, 0, ReqFlags::NONE);
        // SAFETY: `buf` is exclusively borrowed for the whole call, which waits for completion.
        unsafe { self.run(req) }
    }
    /// Write `buf` at `offset` (with FUA when `fua`).
    fn write_at(&mut self, offset: u64, buf: &[u8], fua: bool) -> Result<()> {
        let flags = if fua { ReqFlags::FUA } else { ReqFlags::NONE };
        let req = Request::new(Op::Write { offset, buf: buf.as_ptr(), len: buf.len() }, 0, flags);
        // SAFETY: `buf` is borrowed for the whole call, which waits for completion.
        unsafe { self.run(req) }
    }
    /// Make completed writes durable.
    fn flush(&mut self) -> Result<()> {
        // SAFETY: no buffers.
        unsafe { self.run(Request::new(Op::Flush, 0, ReqFlags::NONE)) }
    }
    /// Zero a range.
    fn write_zeroes(&mut self, offset: u64, len: u64, flags: ReqFlags) -> Result<()> {
        // SAFETY: no buffers.
        unsafe { self.run(Request::new(Op::WriteZeroes { offset, len }, 0, flags)) }
    }
    /// Discard a range.
    fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        // SAFETY: no buffers.
        unsafe { self.run(Request::new(Op::Discard { offset, len }, 0, ReqFlags::NONE)) }
    }
}

impl<Q: Queue + ?Sized> QueueExt for Q {}

/// Validate `do_io` arguments that do not depend on the driver (libblkio's checks and messages).
pub fn check_do_io_args(max: usize, min: usize, outstanding_plus_ready: usize) -> Result<()> {
    if min > max {
        return Err(Error::inval("min_completions must be less than or equal to max_completions"));
    }
    if min > outstanding_plus_ready {
        return Err(Error::inval("min_completions is larger than total outstanding requests"));
    }
    Ok(())
}
