//! One queue of the rbd driver. Every queue of a device shares the one image handle; each
//! request goes to librbd as an aio call at enqueue, and librbd's completion callback (on one of
//! its own threads) puts the result on the queue's [`DoneList`], which wakes `do_io` when it
//! waits and the caller's completion fd when that is enabled. A poll queue has no fds: `do_io`
//! spins on the list.

use super::ffi::{Handle, Image, WRITE_ZEROES_THICK};
use super::lease::Lost;
use snapblk_core::sys::EventFd;
use snapblk_core::{Completion, DoneList, Engine, Op, Queue, QueueCore, ReqFlags, Request, Result};
use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Finished requests with librbd's return value, in completion order, and the queue's
/// wake-ups: what the callback side of a queue shares with the queue.
type Shared = DoneList<(Box<Pending>, isize)>;

/// One request in librbd's hands; boxed, its address is the callback argument.
struct Pending {
    shared: Arc<Shared>,
    user_data: usize,
    /// A write or write-zeroes with FUA: a flush follows before it completes.
    fua: bool,
    /// The one iovec of a plain read or write (readv/writev use the caller's array).
    iov: libc::iovec,
}

// SAFETY: the iovec points into the caller's buffer, which stays valid until the request's
// completion is returned, whichever thread (librbd's callback, the queue's) holds the request.
unsafe impl Send for Pending {}

/// librbd's completion callback.
///
/// # Safety
/// `arg` is the `Box<Pending>` leaked for this completion, and `c` the completion.
unsafe extern "C" fn on_complete(c: Handle, arg: *mut c_void) {
    // SAFETY: the argument was made by `Box::into_raw` in `RbdEngine::submit_op` for exactly
    // one completion, and librbd calls back once.
    let p = unsafe { Box::from_raw(arg.cast::<Pending>()) };
    let Ok(lib) = super::ffi::lib() else { return };
    // SAFETY: `c` is the completion this callback is for; it is released exactly once here.
    let ret = unsafe { (lib.rbd_aio_get_return_value)(c) };
    // SAFETY: as above.
    unsafe { (lib.rbd_aio_release)(c) };
    let sh = p.shared.clone();
    sh.push((p, ret));
}

pub(super) struct RbdEngine {
    image: Arc<Image>,
    shared: Arc<Shared>,
    /// Submitted to librbd and not yet reaped.
    in_flight: usize,
    poll: bool,
}

// SAFETY: the raw pointers inside pending requests are the caller's buffers, valid until their
// completion wherever the queue is driven from; the image handle is thread-safe.
unsafe impl Send for RbdEngine {}

/// An aio call of librbd, given the completion to finish.
enum Call {
    Readv(*const libc::iovec, i32, u64),
    Writev(*const libc::iovec, i32, u64),
    Flush,
    Discard(u64, u64),
    WriteZeroes(u64, u64, i32),
}

impl RbdEngine {
    /// Hand `call` to librbd with `p` as its callback argument; the errno if librbd refuses.
    fn submit_op(&mut self, p: Box<Pending>, call: Call) -> std::result::Result<(), i32> {
        let lib = self.image.lib;
        let img = self.image.image;
        let mut c: Handle = std::ptr::null_mut();
        let fua_iov = &p.iov as *const libc::iovec;
        let arg = Box::into_raw(p);
        // SAFETY: a valid out pointer; the callback takes `arg` back exactly once.
        let r = unsafe { (lib.rbd_aio_create_completion)(arg.cast(), on_complete, &mut c) };
        if r < 0 {
            // SAFETY: librbd did not take `arg`: reclaim it.
            drop(unsafe { Box::from_raw(arg) });
            return Err(-r);
        }
        // SAFETY: an open image and a fresh completion; buffers and iovec arrays stay valid
        // until the completion (the caller's promise to `enqueue`, or the boxed iovec, which
        // lives until the callback).
        let r = unsafe {
            match call {
                Call::Readv(iov, n, off) => {
                    let iov = if iov.is_null() { fua_iov } else { iov };
                    (lib.rbd_aio_readv)(img, iov, n, off, c)
                }
                Call::Writev(iov, n, off) => {
                    let iov = if iov.is_null() { fua_iov } else { iov };
                    (lib.rbd_aio_writev)(img, iov, n, off, c)
                }
                Call::Flush => (lib.rbd_aio_flush)(img, c),
                Call::Discard(off, len) => (lib.rbd_aio_discard)(img, off, len, c),
                Call::WriteZeroes(off, len, fl) => {
                    (lib.rbd_aio_write_zeroes)(img, off, len as usize, c, fl, 0)
                }
            }
        };
        if r < 0 {
            // SAFETY: the call failed, so librbd will not call back: release the completion
            // and reclaim the argument.
            unsafe { (lib.rbd_aio_release)(c) };
            // SAFETY: as above.
            drop(unsafe { Box::from_raw(arg) });
            return Err(-r);
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Whether this handle lost its exclusive lock: then no write, discard or flush may go
    /// out any more ([`super::lease`]).
    fn lock_lost(&self) -> bool {
        self.image
            .lease()
            .is_some_and(|l| l.check(Instant::now()).is_err())
    }

    fn pending(&self, user_data: usize, fua: bool) -> Box<Pending> {
        Box::new(Pending {
            shared: self.shared.clone(),
            user_data,
            fua,
            iov: libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
        })
    }
}

/// The completion of a request that failed with ESHUTDOWN (librados's EBLOCKLISTED): the
/// cluster has blocklisted this client, so the exclusive lock is lost (marked at once, without
/// waiting for the next renewal to find out) and the request fails with EIO. ESHUTDOWN itself
/// would read as "the server is shutting down" to an NBD client, and a flush of librbd's
/// write-back cache must not look like anything but a lost write.
fn blocklisted(image: &Image, user_data: usize) -> Completion {
    if let Some(l) = image.lease() {
        l.lose(Lost::Blocklisted);
    }
    Completion::err(
        user_data,
        libc::EIO,
        c"rbd: this client is blocklisted by the cluster; the image's lock is lost",
    )
}

/// The completion of a write, discard or flush after the lock was lost.
fn lock_lost(user_data: usize) -> Completion {
    Completion::err(
        user_data,
        libc::EIO,
        c"rbd: the image's exclusive lock was lost; writes are refused",
    )
}

impl Engine for RbdEngine {
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()> {
        // Everything went to librbd at enqueue; only the wait is left.
        if wait == 0 {
            return Ok(());
        }
        self.shared.wait(wait, timeout, sigmask, self.poll)
    }
    fn reap(&mut self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        let mut flushes = Vec::new();
        let image = &self.image;
        let taken = self.shared.take(out.len(), |(mut p, ret)| {
            if p.fua && ret >= 0 {
                // The write is done; its FUA flush is next, under the same user data.
                p.fua = false;
                flushes.push(p);
                return;
            }
            out[n] = if ret == -(libc::ESHUTDOWN as isize) {
                blocklisted(image, p.user_data)
            } else if ret < 0 {
                Completion::os_err(p.user_data, (-ret) as i32)
            } else {
                Completion::ok(p.user_data)
            };
            n += 1;
        });
        self.in_flight -= taken - flushes.len();
        for p in flushes {
            self.in_flight -= 1;
            let ud = p.user_data;
            // Every drained entry took at most one slot of `out`: there is room.
            if self.lock_lost() {
                if n < out.len() {
                    out[n] = lock_lost(ud);
                    n += 1;
                }
                continue;
            }
            if let Err(e) = self.submit_op(p, Call::Flush)
                && n < out.len()
            {
                out[n] = Completion::os_err(ud, e);
                n += 1;
            }
        }
        n
    }
}

pub(super) struct RbdQueue {
    core: QueueCore,
    eng: RbdEngine,
    /// The image's size, shared with the driver (which changes it on a resize).
    capacity: Arc<AtomicU64>,
    read_only: bool,
}

impl RbdQueue {
    pub(super) fn new(
        image: Arc<Image>,
        capacity: Arc<AtomicU64>,
        read_only: bool,
        poll: bool,
    ) -> Result<RbdQueue> {
        let (core, user) = if poll {
            (QueueCore::new(true)?, None)
        } else {
            let efd = EventFd::new()?;
            let user = efd.try_clone()?;
            (QueueCore::with_eventfd(efd, true), Some(user))
        };
        let shared = Arc::new(Shared::new(user)?);
        Ok(RbdQueue {
            core,
            eng: RbdEngine {
                image,
                shared,
                in_flight: 0,
                poll,
            },
            capacity,
            read_only,
        })
    }

    fn beyond_end(&self, off: u64, len: u64) -> bool {
        off.checked_add(len)
            .is_none_or(|end| end > self.capacity.load(Ordering::Relaxed))
    }
}

impl Drop for RbdQueue {
    fn drop(&mut self) {
        // Requests in librbd's hands may still write into caller buffers: wait for them,
        // bounded (the op timeouts make librbd fail them in time).
        let deadline = Instant::now() + Duration::from_secs(120);
        let eng = &self.eng;
        while eng.in_flight > eng.shared.len() && Instant::now() < deadline {
            let _ = eng
                .shared
                .wait(eng.in_flight, Some(Duration::from_secs(1)), None, eng.poll);
        }
        // Each finished request holds the list it is on: drop them, or the list, its eventfds
        // and they would never be freed.
        eng.shared.take(usize::MAX, drop);
    }
}

/// Total bytes of an iovec array (`None` if it overflows).
///
/// # Safety
/// `iov` points to `n` valid iovecs.
unsafe fn iov_len(iov: *const libc::iovec, n: i32) -> Option<u64> {
    // SAFETY: the caller's promise.
    let v = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    v.iter()
        .try_fold(0u64, |acc, i| acc.checked_add(i.iov_len as u64))
}

impl Queue for RbdQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let ud = req.user_data;
        if let Err(m) = req.validate() {
            return self.core.complete(Completion::err(ud, libc::EINVAL, m));
        }
        let fua = req.flags.contains(ReqFlags::FUA);
        let mut p = self.eng.pending(ud, false);
        let (call, off, len) = match req.op {
            Op::Read { offset, buf, len } => {
                p.iov = libc::iovec {
                    iov_base: buf.cast(),
                    iov_len: len,
                };
                (Call::Readv(std::ptr::null(), 1, offset), offset, len as u64)
            }
            Op::Write { offset, buf, len } => {
                p.iov = libc::iovec {
                    iov_base: buf.cast_mut().cast(),
                    iov_len: len,
                };
                p.fua = fua;
                (
                    Call::Writev(std::ptr::null(), 1, offset),
                    offset,
                    len as u64,
                )
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
                // SAFETY: validate() checked iovcnt >= 0; the array is the caller's, valid
                // until completion.
                let Some(len) = (unsafe { iov_len(iov, iovcnt) }) else {
                    return self.core.complete(Completion::err(
                        ud,
                        libc::EINVAL,
                        c"iovec lengths overflow",
                    ));
                };
                if matches!(req.op, Op::Writev { .. }) {
                    p.fua = fua;
                    (Call::Writev(iov, iovcnt, offset), offset, len)
                } else {
                    (Call::Readv(iov, iovcnt, offset), offset, len)
                }
            }
            Op::Flush => (Call::Flush, 0, 0),
            Op::Discard { offset, len } => (Call::Discard(offset, len), offset, len),
            Op::WriteZeroes { offset, len } => {
                p.fua = fua;
                let fl = if req.flags.contains(ReqFlags::NO_UNMAP) {
                    WRITE_ZEROES_THICK
                } else {
                    0
                };
                (Call::WriteZeroes(offset, len, fl), offset, len)
            }
            Op::Zone(_) => {
                return self.core.complete(Completion::err(
                    ud,
                    libc::ENOTSUP,
                    c"request not supported for this driver",
                ));
            }
        };
        if self.beyond_end(off, len) {
            return self.core.complete(Completion::err(
                ud,
                libc::EIO,
                c"request beyond the end of the image",
            ));
        }
        if self.read_only && !matches!(call, Call::Readv(..) | Call::Flush) {
            // As a file opened read-only answers (librbd would say EROFS).
            return self.core.complete(Completion::os_err(ud, libc::EBADF));
        }
        if !matches!(call, Call::Readv(..)) && self.eng.lock_lost() {
            return self.core.complete(lock_lost(ud));
        }
        if len == 0 && !matches!(call, Call::Flush) {
            return self.core.complete(Completion::ok(ud));
        }
        if let Call::WriteZeroes(_, l, _) = call
            && usize::try_from(l).is_err()
        {
            return self
                .core
                .complete(Completion::err(ud, libc::EINVAL, c"length too large"));
        }
        if let Err(e) = self.eng.submit_op(p, call) {
            self.core.complete(Completion::os_err(ud, e));
        }
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
        self.eng.shared.set_user_on(enabled);
        if enabled && !self.eng.shared.is_empty() {
            self.core.notify();
        }
    }
    fn is_poll(&self) -> bool {
        self.eng.poll
    }
    fn outstanding(&self) -> usize {
        self.eng.in_flight + self.core.backlog_len()
    }
}
