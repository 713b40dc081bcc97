//! Queues: where requests go in and completions come out.

use crate::request::{Completion, Op, ReqFlags, Request};
use crate::sys::EventFd;
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

    /// Run one request to completion; what [`QueueExt::run`] (and so `read_at`, `write_at`, ...)
    /// does. Fails with `EBUSY` when requests are outstanding; otherwise returns what the
    /// request's completion says (`Completion::result`). The default enqueues the request and
    /// calls [`Queue::do_io`] until its completion comes back. A queue that completes requests
    /// synchronously inside `do_io` may execute it directly instead: no queueing, no completion
    /// array, one call.
    ///
    /// # Safety
    /// As for [`Queue::enqueue`]; the buffers only need to outlive this call.
    unsafe fn run_one(&mut self, req: Request) -> Result<()> {
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
}

/// Synchronous conveniences for Rust callers (the snapshot driver, exports, tools). Each one
/// submits a single request and waits for it, so they must not be mixed with other in-flight
/// requests on the same queue.
pub trait QueueExt: Queue {
    /// Run one request to completion.
    ///
    /// # Safety
    /// As for [`Queue::enqueue`]; the buffers only need to outlive this call.
    #[inline]
    unsafe fn run(&mut self, req: Request) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_one(req) }
    }
    /// Read `buf.len()` bytes at `offset`.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let req = Request::new(
            Op::Read {
                offset,
                buf: buf.as_mut_ptr(),
                len: buf.len(),
            },
            0,
            ReqFlags::NONE,
        );
        // SAFETY: `buf` is exclusively borrowed for the whole call, which waits for completion.
        unsafe { self.run(req) }
    }
    /// Write `buf` at `offset` (with FUA when `fua`).
    fn write_at(&mut self, offset: u64, buf: &[u8], fua: bool) -> Result<()> {
        let flags = if fua { ReqFlags::FUA } else { ReqFlags::NONE };
        let req = Request::new(
            Op::Write {
                offset,
                buf: buf.as_ptr(),
                len: buf.len(),
            },
            0,
            flags,
        );
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
        return Err(Error::inval(
            "min_completions must be less than or equal to max_completions",
        ));
    }
    if min > outstanding_plus_ready {
        return Err(Error::inval(
            "min_completions is larger than total outstanding requests",
        ));
    }
    Ok(())
}

/// The device-specific half of `do_io`, driven by [`QueueCore::do_io`] so that every driver has
/// the same argument checks, ordering, timeout, EINTR and backlog semantics.
pub trait Engine {
    /// Requests handed to the engine whose completion has not been reaped yet.
    fn in_flight(&self) -> usize;
    /// Submit everything pending. When `wait > 0`, also block until at least `wait` completions
    /// are ready to reap, bounded by `timeout` (`ETIME` on expiry). With `sigmask`, install it
    /// while sleeping and fail with `EINTR` on a signal; without it, an `EINTR` may be returned
    /// and is retried by the caller.
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()>;
    /// Move ready completions into `out` without blocking; returns how many were written.
    fn reap(&mut self, out: &mut [Completion]) -> usize;
    /// Whether [`submit`](Self::submit) has requests to hand to the device (or must run to
    /// make progress, as on a poll queue). When it has none and `do_io` already holds what its
    /// caller asked for, the `submit` call is skipped: on an io_uring with deferred task work it
    /// would only be a system call to post more completions, which the caller did not need
    /// (fio does not make it either). The default keeps `submit` always called.
    fn needs_submit(&mut self) -> bool {
        true
    }
}

/// The driver-independent part of a queue: the backlog of completions that are ready without
/// the device (requests rejected at enqueue time, or completions a failed `do_io` gathered and
/// must hand back), the completion eventfd, and the generic `do_io` algorithm.
#[derive(Debug)]
pub struct QueueCore {
    backlog: std::collections::VecDeque<Completion>,
    efd: Option<EventFd>,
    efd_enabled: bool,
    poll: bool,
}

impl QueueCore {
    /// A core for a regular queue (with an eventfd) or a poll queue (without).
    pub fn new(poll: bool) -> Result<QueueCore> {
        Ok(QueueCore {
            backlog: std::collections::VecDeque::new(),
            efd: if poll { None } else { Some(EventFd::new()?) },
            efd_enabled: true,
            poll,
        })
    }
    /// A core for a regular queue whose completion fd is `efd`, made by the driver (e.g. the
    /// eventfd a virtio device signals), with notifications on or off to start with (libblkio's
    /// virtio queues start with them off; `set_completion_fd_enabled` turns them on).
    pub fn with_eventfd(efd: EventFd, enabled: bool) -> QueueCore {
        QueueCore {
            backlog: std::collections::VecDeque::new(),
            efd: Some(efd),
            efd_enabled: enabled,
            poll: false,
        }
    }
    /// Whether this is a poll queue.
    pub fn is_poll(&self) -> bool {
        self.poll
    }
    /// The completion eventfd (`None` for poll queues).
    pub fn completion_fd(&self) -> Option<RawFd> {
        self.efd.as_ref().map(EventFd::raw)
    }
    /// The eventfd object, e.g. for registering it with an io_uring.
    pub fn eventfd(&self) -> Option<&EventFd> {
        self.efd.as_ref()
    }
    /// Whether completion notifications are enabled (default: yes).
    pub fn completion_fd_enabled(&self) -> bool {
        self.efd_enabled
    }
    /// Enable or disable completion notifications.
    pub fn set_completion_fd_enabled(&mut self, on: bool) {
        self.efd_enabled = on;
    }
    /// Signal the completion fd if enabled.
    pub fn notify(&self) {
        if self.efd_enabled
            && let Some(e) = &self.efd
        {
            e.signal();
        }
    }
    /// Queue a completion that is ready now (e.g. a request rejected at enqueue time, or one a
    /// synchronous driver finished). The fd is signalled when the backlog becomes non-empty.
    pub fn complete(&mut self, c: Completion) {
        if self.backlog.is_empty() {
            self.notify();
        }
        self.backlog.push_back(c);
    }
    /// Completions waiting in the backlog.
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    /// The generic `do_io`: returns backlog completions first (oldest first), then the engine's,
    /// submitting everything and waiting for at least `min`. See [`Queue::do_io`].
    pub fn do_io<E: Engine + ?Sized>(
        &mut self,
        engine: &mut E,
        out: &mut [Completion],
        min: usize,
        timeout: Option<&mut Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<usize> {
        if min > out.len() {
            return Err(Error::inval(
                "min_completions must be less than or equal to max_completions",
            ));
        }
        if sigmask.is_some() && self.poll {
            return Err(Error::new(
                libc::ENOTSUP,
                "blkioq_do_io_interruptible() is not supported on poll queues",
            ));
        }
        if min > self.backlog.len() + engine.in_flight() {
            return Err(Error::inval(
                "min_completions is larger than total outstanding requests",
            ));
        }
        let limit = timeout.as_ref().map(|t| **t);
        // The clock is only needed for a timeout (saves a clock read per call otherwise).
        let start = limit.map(|_| std::time::Instant::now());
        let elapsed = || start.map_or(Duration::ZERO, |s| s.elapsed());
        let mut n = 0;
        while n < out.len() {
            match self.backlog.pop_front() {
                Some(c) => {
                    out[n] = c;
                    n += 1;
                }
                None => break,
            }
        }
        let mut first = true;
        let res = loop {
            // Reap before submitting: completions may already sit in the ring.
            n += engine.reap(&mut out[n..]);
            // At least one completion (a `min` of 0 still means "whatever is ready": with
            // nothing ready, `submit` must run to post what the kernel holds back).
            if n >= min && (!first || (n > 0 && !engine.needs_submit())) {
                break Ok(());
            }
            let left = match limit {
                Some(l) => match l.checked_sub(elapsed()) {
                    Some(d) => Some(d),
                    // The first pass submits even when the time is up (a zero timeout): the
                    // timeout bounds the wait, and submission is what do_io guarantees.
                    None if n >= min || first => Some(Duration::ZERO),
                    None => break Err(Error::from_errno(libc::ETIME)),
                },
                None => None,
            };
            let wait = min.saturating_sub(n);
            first = false;
            match engine.submit(wait, left, sigmask) {
                Ok(()) => {}
                Err(e) if e.errno == libc::EINTR && sigmask.is_none() => {}
                Err(e) => {
                    n += engine.reap(&mut out[n..]);
                    if n >= min && e.errno == libc::ETIME {
                        break Ok(());
                    }
                    break Err(e);
                }
            }
        };
        if let Some(t) = timeout {
            *t = match &res {
                Err(e) if e.errno == libc::ETIME => Duration::ZERO,
                _ => limit.unwrap_or_default().saturating_sub(elapsed()),
            };
        }
        match res {
            Ok(()) => {
                if !self.backlog.is_empty() {
                    // Still work left for a later call: keep the fd readable.
                    self.notify();
                }
                Ok(n)
            }
            Err(e) => {
                // Hand the gathered completions back, in order, to the next call.
                for c in out[..n].iter().rev() {
                    self.backlog.push_front(*c);
                }
                if n > 0 {
                    self.notify();
                }
                Err(e)
            }
        }
    }
}
