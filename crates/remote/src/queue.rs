//! One queue of the `s3` / `http` driver. A read whose blocks are all cached completes at
//! enqueue, in the caller's thread; any other read goes to the device's worker pool
//! ([`crate::pool`]) at enqueue, so `blkioq_do_io` never waits for HTTP unless asked to
//! (`min_completions > 0`). A worker fetches into its own buffer, copies into the caller's and
//! puts the completion on the queue's [`DoneList`], which wakes `do_io` when it waits and the
//! caller's completion fd when that is enabled (as the rbd driver's queues do). Dropping the
//! queue cancels what it has in flight without waiting for the server: a worker copies into a
//! caller's buffer only while the queue is alive (under a read lock the drop takes for
//! writing), and a cancelled read makes no further HTTP attempt.

use crate::object::RemoteObject;
use crate::pool::Pool;
use snapblk_core::sync::{read, write};
use snapblk_core::sys::EventFd;
use snapblk_core::{Completion, DoneList, Engine, Error, Op, Queue, QueueCore, Request, Result};
use std::os::fd::RawFd;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// What the workers share with a queue.
struct Shared {
    /// Finished requests, in completion order, and the queue's wake-ups.
    done: DoneList<Completion>,
    /// False once the queue is dropped: no worker touches its buffers any more.
    alive: RwLock<bool>,
}

/// Where a read's bytes go: the caller's buffer or iovecs.
struct Dest {
    segs: Vec<(*mut u8, usize)>,
    len: u64,
}

// SAFETY: the pointers are the caller's buffers, valid until the request's completion is
// returned or the queue is dropped (the `Queue::enqueue` contract); a worker writes them only
// while holding the queue's `alive` read lock and seeing it true, and the drop takes that lock
// for writing before the queue is gone.
unsafe impl Send for Dest {}

impl Dest {
    /// Copy `data` to bytes `[at, at + data.len())` of the destination.
    ///
    /// # Safety
    /// The segments must be valid for writes (see the `Send` impl).
    unsafe fn put(&self, at: u64, mut data: &[u8]) {
        // A read has few segments: walk them all.
        let mut start = 0u64;
        let mut at = at;
        for &(p, l) in &self.segs {
            let end = start + l as u64;
            if !data.is_empty() && at < end && at >= start {
                let off = (at - start) as usize;
                let n = data.len().min(l - off);
                // SAFETY: `p` is valid for `l` bytes (the caller's), `off + n <= l`; `data` is
                // our own memory, so the two do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(off), n) };
                data = &data[n..];
                at += n as u64;
            }
            start = end;
        }
    }
}

/// One read handed to a worker.
struct Job {
    obj: Arc<RemoteObject>,
    shared: Arc<Shared>,
    user_data: usize,
    offset: u64,
    dest: Dest,
}

impl Job {
    fn run(self) {
        if !*read(&self.shared.alive) {
            return;
        }
        let mut data = vec![0u8; self.dest.len as usize];
        let gone = || !*read(&self.shared.alive);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.obj
                .read_exact_until(self.offset, &mut data, Some(&gone))
        }));
        let alive = read(&self.shared.alive);
        if !*alive {
            return;
        }
        let c = match r {
            Ok(Ok(())) => {
                // SAFETY: the queue is alive (and stays so while `alive` is held), so the
                // caller's buffers are valid.
                unsafe { self.dest.put(0, &data) };
                Completion::ok(self.user_data)
            }
            Ok(Err(e)) => {
                log_error(&e);
                Completion::os_err(self.user_data, e.errno())
            }
            Err(_) => Completion::err(self.user_data, libc::EIO, c"s3/http driver: read failed"),
        };
        self.shared.done.push(c);
        drop(alive);
    }
}

/// A completion carries only an errno: the one-line cause is logged (at `error`) once per
/// failure, so `serve` and `bench` users see why (denied, changed, unreachable) and a C host of
/// `libblkio.so.1` decides itself whether anything is printed.
pub(crate) fn log_error(e: &crate::error::RemoteError) {
    log::error!("{}", snapblk_core::Chain(e));
}

struct RemoteEngine {
    shared: Arc<Shared>,
    /// Handed to the workers and not yet reaped.
    in_flight: usize,
}

impl Engine for RemoteEngine {
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()> {
        // Everything went to the workers at enqueue; only the wait is left.
        if wait == 0 {
            return Ok(());
        }
        self.shared.done.wait(wait, timeout, sigmask, false)
    }
    fn reap(&mut self, out: &mut [Completion]) -> usize {
        let mut slots = out.iter_mut();
        let n = self.shared.done.take(slots.len(), |c| {
            if let Some(s) = slots.next() {
                *s = c;
            }
        });
        self.in_flight -= n;
        n
    }
}

/// A queue of the `s3` / `http` driver.
pub(crate) struct RemoteQueue {
    core: QueueCore,
    eng: RemoteEngine,
    obj: Arc<RemoteObject>,
    pool: Arc<Pool>,
}

impl RemoteQueue {
    pub(crate) fn new(obj: Arc<RemoteObject>, pool: Arc<Pool>) -> Result<RemoteQueue> {
        let efd = EventFd::new()?;
        let user = efd.try_clone()?;
        let shared = Arc::new(Shared {
            done: DoneList::new(Some(user))?,
            alive: RwLock::new(true),
        });
        Ok(RemoteQueue {
            core: QueueCore::with_eventfd(efd, true),
            eng: RemoteEngine {
                shared,
                in_flight: 0,
            },
            obj,
            pool,
        })
    }

    /// Check a request and say where its bytes go: `Ok(None)` for a request that completes
    /// now with success (a flush, an empty read), `Err(completion)` for one that fails now.
    ///
    /// # Safety
    /// The request's iovec array, if any, must be valid (the `Queue::enqueue` contract).
    unsafe fn plan(&self, req: &Request) -> std::result::Result<Option<(u64, Dest)>, Completion> {
        let ud = req.user_data;
        if let Err(m) = req.validate() {
            return Err(Completion::err(ud, libc::EINVAL, m));
        }
        let (offset, segs): (u64, Vec<(*mut u8, usize)>) = match req.op {
            Op::Read { offset, buf, len } => (offset, vec![(buf, len)]),
            Op::Readv {
                offset,
                iov,
                iovcnt,
            } => {
                let v = if iovcnt <= 0 || iov.is_null() {
                    &[][..]
                } else {
                    // SAFETY: per the contract, `iov` points to `iovcnt` iovecs.
                    unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) }
                };
                (
                    offset,
                    v.iter().map(|e| (e.iov_base.cast(), e.iov_len)).collect(),
                )
            }
            Op::Flush => return Ok(None),
            // libblkio's answer to a write on a read-only device.
            Op::Write { .. } | Op::Writev { .. } | Op::Discard { .. } | Op::WriteZeroes { .. } => {
                return Err(Completion::os_err(ud, libc::EBADF));
            }
            Op::Zone(_) => return Err(Completion::os_err(ud, libc::ENOTSUP)),
        };
        let mut len = 0u64;
        for &(p, l) in &segs {
            if l == 0 {
                continue;
            }
            if p.is_null() {
                return Err(Completion::os_err(ud, libc::EFAULT));
            }
            len += l as u64;
        }
        if len == 0 {
            return Ok(None);
        }
        // Past the end: EIO, as a file driver's short read (the conformance suite's bounds
        // check).
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.obj.len())
        {
            return Err(Completion::os_err(ud, libc::EIO));
        }
        let segs = segs.into_iter().filter(|&(_, l)| l > 0).collect();
        Ok(Some((offset, Dest { segs, len })))
    }
}

impl Drop for RemoteQueue {
    fn drop(&mut self) {
        // From here on no worker touches this queue's buffers: one copying now finishes first.
        *write(&self.eng.shared.alive) = false;
    }
}

impl Queue for RemoteQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let ud = req.user_data;
        // SAFETY: forwarded from the caller.
        let (offset, dest) = match unsafe { self.plan(&req) } {
            Ok(Some(p)) => p,
            Ok(None) => return self.core.complete(Completion::ok(ud)),
            Err(c) => return self.core.complete(c),
        };
        let sink = |at, d: &[u8]| {
            // SAFETY: the caller's buffers are valid now, in the caller's thread.
            unsafe { dest.put(at, d) }
        };
        if self.obj.read_cached(offset, dest.len, sink) {
            return self.core.complete(Completion::ok(ud));
        }
        let job = Job {
            obj: self.obj.clone(),
            shared: self.eng.shared.clone(),
            user_data: ud,
            offset,
            dest,
        };
        self.eng.in_flight += 1;
        self.pool.submit(Box::new(move || job.run()));
    }

    /// Runs the request in the calling thread (it waits anyway): no worker, no wakeup.
    unsafe fn run_one(&mut self, req: Request) -> Result<()> {
        if self.outstanding() != 0 {
            return Err(Error::new(libc::EBUSY, "queue has requests in flight"));
        }
        // SAFETY: forwarded from the caller.
        let (offset, dest) = match unsafe { self.plan(&req) } {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(()),
            Err(c) => return c.result(),
        };
        let sink = |at, d: &[u8]| {
            // SAFETY: the caller's buffers are valid for this call.
            unsafe { dest.put(at, d) }
        };
        if self.obj.read_cached(offset, dest.len, sink) {
            return Ok(());
        }
        let r = match dest.segs[..] {
            [(p, l)] => {
                // SAFETY: one valid buffer of `l` bytes, the caller's for this call.
                let b = unsafe { std::slice::from_raw_parts_mut(p, l) };
                self.obj.read_exact_remote(offset, b)
            }
            _ => {
                let mut data = vec![0u8; dest.len as usize];
                let r = self.obj.read_exact_remote(offset, &mut data);
                if r.is_ok() {
                    // SAFETY: the caller's buffers, valid for this call.
                    unsafe { dest.put(0, &data) };
                }
                r
            }
        };
        r.map_err(|e| {
            log_error(&e);
            Error::from_errno(e.errno())
        })
    }

    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        timeout: Option<&mut Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<usize> {
        self.core.do_io(&mut self.eng, out, min, timeout, sigmask)
    }
    fn completion_fd(&self) -> Option<RawFd> {
        self.core.completion_fd()
    }
    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.core.set_completion_fd_enabled(enabled);
        self.eng.shared.done.set_user_on(enabled);
        if enabled && !self.eng.shared.done.is_empty() {
            self.core.notify();
        }
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight
    }
}

#[cfg(test)]
mod tests;
