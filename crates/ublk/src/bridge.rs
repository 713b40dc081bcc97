//! Bridge from a snapblk-core [`Queue`] to the async tasks of one ublk queue thread.
//!
//! Each ublk tag has its own task; a task hands a request to the device queue and awaits a
//! [`CoreFuture`] for that tag. The queue thread's loop calls [`CoreQueue::pump`] between executor
//! ticks: one `do_io` submits everything the tasks enqueued and dispatches ready completions.
//! Completions that arrive later are noticed through the queue's completion eventfd, polled by the
//! same io_uring that carries the ublk commands (see `server.rs`).

use snapblk_core::{Completion, Queue, Request};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Slot {
    result: Option<i32>,
    waker: Option<Waker>,
}

/// A device queue shared by the tasks of one ublk queue thread (single-threaded).
pub(crate) struct CoreQueue {
    q: RefCell<Box<dyn Queue>>,
    slots: RefCell<Vec<Slot>>,
    comps: RefCell<Vec<Completion>>,
    unsubmitted: Cell<bool>,
}

impl CoreQueue {
    pub(crate) fn new(q: Box<dyn Queue>, tags: usize) -> Self {
        let mut slots = Vec::with_capacity(tags);
        slots.resize_with(tags, Slot::default);
        CoreQueue {
            q: RefCell::new(q),
            slots: RefCell::new(slots),
            comps: RefCell::new(vec![Completion::default(); tags.max(1)]),
            unsubmitted: Cell::new(false),
        }
    }

    pub(crate) fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        let mut q = self.q.borrow_mut();
        q.set_completion_fd_enabled(true);
        q.completion_fd()
    }

    /// Queue `req` for tag `tag` (its `user_data` is overwritten) and return the future of its
    /// result (0 or negative errno). One request per tag at a time.
    ///
    /// # Safety
    /// The request's buffers must stay valid and otherwise unused until the device has completed
    /// the request: until the returned future has resolved, or, if the future is dropped before
    /// (a task dropped at queue teardown), until [`CoreQueue::drain`] has returned `true`.
    /// Dropping the device queue is not promised to wait for them; the queue thread drains it
    /// before it drops its tasks and their buffers, and leaks them if the drain times out (see
    /// `server.rs`, `serve_queue`).
    pub(crate) unsafe fn submit(&self, tag: u16, mut req: Request) -> CoreFuture<'_> {
        req.user_data = usize::from(tag);
        if let Some(s) = self.slots.borrow_mut().get_mut(usize::from(tag)) {
            s.result = None;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.q.borrow_mut().enqueue(req) };
        self.unsubmitted.set(true);
        CoreFuture { cq: self, tag }
    }

    /// Submit what was queued and dispatch every completion that is ready, without waiting.
    /// Returns how many completions were dispatched.
    pub(crate) fn pump(&self) -> usize {
        let mut total = 0;
        loop {
            let mut q = self.q.borrow_mut();
            if q.outstanding() == 0 {
                self.unsubmitted.set(false);
                return total;
            }
            let mut comps = self.comps.borrow_mut();
            let n = match q.do_io(&mut comps, 0, None, None) {
                Ok(n) => n,
                Err(_) => return total,
            };
            self.unsubmitted.set(false);
            drop(q);
            let mut slots = self.slots.borrow_mut();
            for c in comps.iter().take(n) {
                if let Some(s) = slots.get_mut(c.user_data) {
                    s.result = Some(c.ret);
                    if let Some(w) = s.waker.take() {
                        w.wake();
                    }
                }
            }
            total += n;
            if n < comps.len() {
                return total;
            }
        }
    }

    /// Requests handed to the device and not yet completed.
    pub(crate) fn outstanding(&self) -> usize {
        self.q.borrow().outstanding()
    }

    /// Pump until the device has completed every request handed to it, for at most `limit`.
    /// Returns whether it did: only then may the buffers of those requests be freed.
    pub(crate) fn drain(&self, limit: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        loop {
            self.pump();
            if self.outstanding() == 0 {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Resolves to the result of the tag's device request.
pub(crate) struct CoreFuture<'a> {
    cq: &'a CoreQueue,
    tag: u16,
}

impl Future for CoreFuture<'_> {
    type Output = i32;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        let mut slots = self.cq.slots.borrow_mut();
        let Some(s) = slots.get_mut(usize::from(self.tag)) else {
            return Poll::Ready(-libc::EINVAL);
        };
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::{Op, ReqFlags};
    use std::time::Duration;

    /// A queue that completes reads by filling the buffer with the low byte of the offset.
    struct Fill {
        pending: Vec<Request>,
    }
    impl Queue for Fill {
        unsafe fn enqueue(&mut self, req: Request) {
            self.pending.push(req);
        }
        fn do_io(
            &mut self,
            out: &mut [Completion],
            _min: usize,
            _t: Option<&mut Duration>,
            _s: Option<&libc::sigset_t>,
        ) -> snapblk_core::Result<usize> {
            let n = out.len().min(self.pending.len());
            for (i, r) in self.pending.drain(..n).enumerate() {
                if let Op::Read { offset, buf, len } = r.op {
                    // SAFETY: the test keeps the buffer alive until the future resolves.
                    unsafe { std::ptr::write_bytes(buf, offset as u8, len) };
                }
                out[i] = Completion::ok(r.user_data);
            }
            Ok(n)
        }
        fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
        fn set_completion_fd_enabled(&mut self, _e: bool) {}
        fn outstanding(&self) -> usize {
            self.pending.len()
        }
    }

    /// A queue that completes a read only on the `after`-th `do_io`, writing its buffer then.
    struct Slow {
        pending: Vec<Request>,
        after: usize,
        calls: usize,
    }
    impl Queue for Slow {
        unsafe fn enqueue(&mut self, req: Request) {
            self.pending.push(req);
        }
        fn do_io(
            &mut self,
            out: &mut [Completion],
            _min: usize,
            _t: Option<&mut Duration>,
            _s: Option<&libc::sigset_t>,
        ) -> snapblk_core::Result<usize> {
            self.calls += 1;
            if self.calls < self.after || self.pending.is_empty() {
                return Ok(0);
            }
            let r = self.pending.remove(0);
            if let Op::Read { buf, len, .. } = r.op {
                // SAFETY: the test keeps the buffer alive until the queue completed the read.
                unsafe { std::ptr::write_bytes(buf, 0xaa, len) };
            }
            out[0] = Completion::ok(r.user_data);
            Ok(1)
        }
        fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
        fn set_completion_fd_enabled(&mut self, _e: bool) {}
        fn outstanding(&self) -> usize {
            self.pending.len()
        }
    }

    #[test]
    fn drain_waits_for_a_dropped_futures_request() {
        // A task dropped at teardown while its read is in flight: the device still writes its
        // buffer later, so the buffer may go only once drain said the device is done.
        let cq = CoreQueue::new(
            Box::new(Slow {
                pending: Vec::new(),
                after: 5,
                calls: 0,
            }),
            2,
        );
        let mut buf = vec![0u8; 64];
        let req = Request::new(
            Op::Read {
                offset: 0,
                buf: buf.as_mut_ptr(),
                len: 64,
            },
            0,
            ReqFlags::NONE,
        );
        {
            // The task's future, dropped before its request completed.
            // SAFETY: `buf` lives until drain returned true below.
            let _dropped = unsafe { cq.submit(0, req) };
        }
        assert_eq!(cq.outstanding(), 1);
        assert!(cq.drain(Duration::from_secs(5)));
        assert_eq!(cq.outstanding(), 0);
        assert_eq!(buf, vec![0xaa; 64]);

        // A device that never completes: drain gives up, and the caller must leak the buffer.
        let never = CoreQueue::new(
            Box::new(Slow {
                pending: Vec::new(),
                after: usize::MAX,
                calls: 0,
            }),
            1,
        );
        let leaked = Box::leak(vec![0u8; 64].into_boxed_slice());
        let req = Request::new(
            Op::Read {
                offset: 0,
                buf: leaked.as_mut_ptr(),
                len: 64,
            },
            0,
            ReqFlags::NONE,
        );
        {
            // SAFETY: the buffer is leaked, so it outlives any write of the device.
            let _dropped = unsafe { never.submit(0, req) };
        }
        assert!(!never.drain(Duration::from_millis(20)));
        assert_eq!(never.outstanding(), 1);
    }

    #[test]
    fn completions_reach_their_tags() {
        let cq = CoreQueue::new(
            Box::new(Fill {
                pending: Vec::new(),
            }),
            4,
        );
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        let ra = Request::new(
            Op::Read {
                offset: 7,
                buf: a.as_mut_ptr(),
                len: 16,
            },
            0,
            ReqFlags::NONE,
        );
        let rb = Request::new(
            Op::Read {
                offset: 9,
                buf: b.as_mut_ptr(),
                len: 16,
            },
            0,
            ReqFlags::NONE,
        );
        let exe = smol::LocalExecutor::new();
        // SAFETY: a and b outlive the futures, which are run to completion below.
        let fa = exe.spawn(unsafe { cq.submit(3, ra) });
        // SAFETY: as above.
        let fb = exe.spawn(unsafe { cq.submit(1, rb) });
        while exe.try_tick() {}
        assert_eq!(cq.pump(), 2);
        while exe.try_tick() {}
        assert_eq!(smol::block_on(fa), 0);
        assert_eq!(smol::block_on(fb), 0);
        assert_eq!(a, [7u8; 16]);
        assert_eq!(b, [9u8; 16]);
        assert_eq!(cq.outstanding(), 0);
    }
}
