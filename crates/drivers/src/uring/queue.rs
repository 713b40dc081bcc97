//! The queue: [`QueueCore`] (backlog, completion fd, `do_io` rules) around a [`UringEngine`],
//! with the enqueue-time checks and the completion-fd handling of this driver.

use super::bufs::{Buffers, FixedBufCache};
use super::engine::UringEngine;
use super::ring::Ring;
use super::slots::SlotTable;
use crate::file::Target;
use snapblk_core::{Completion, Engine, Op, Queue, QueueCore, Request, Result};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

pub(super) struct UringQueue {
    pub(super) core: QueueCore,
    pub(super) eng: UringEngine,
    /// Whether `completion_fd` was ever asked for. Until then nobody can be polling the
    /// eventfd, so the kernel is told not to signal it (saves an eventfd wakeup per
    /// completion batch for clients that only wait in `do_io`).
    fd_handed_out: std::cell::Cell<bool>,
}

impl UringQueue {
    /// Tell the kernel whether to signal the eventfd: only when enabled and handed out.
    fn sync_eventfd_flag(&self) {
        let on = self.core.completion_fd_enabled() && self.fd_handed_out.get();
        self.eng.ring.efd_on.set(on);
        // SAFETY: the queue is used by one thread at a time (`Queue` is not `Sync`) and no
        // other CQ handle is alive during this call, so this is the only access to the CQ.
        let cq = unsafe { self.eng.ring.io.completion_shared() };
        if on {
            cq.enable_eventfd();
        } else {
            cq.disable_eventfd();
        }
    }
}

impl UringQueue {
    pub(super) fn new(
        t: Arc<Target>,
        bufs: Arc<Buffers>,
        entries: u32,
        poll: bool,
        inline: bool,
    ) -> Result<UringQueue> {
        let core = QueueCore::new(poll)?;
        let efd = core.eventfd().map(|e| e.raw());
        let (ring, fixed_bufs) = Ring::new(&t, &bufs, efd, entries, poll)?;
        Ok(UringQueue {
            core,
            fd_handed_out: std::cell::Cell::new(false),
            eng: UringEngine {
                ring,
                t,
                bufs: FixedBufCache::new(bufs, fixed_bufs),
                slots: SlotTable::default(),
                inline,
                inline_done: VecDeque::new(),
                waiting: VecDeque::new(),
                in_kernel: 0,
            },
        })
    }
}

// SAFETY: the raw pointers inside (request buffers, remaining iovecs) belong to requests whose
// buffers the `Queue::enqueue` caller keeps valid until completion regardless of which thread
// drives the queue; the ring itself is a plain fd plus mmapped memory owned by this queue.
unsafe impl Send for UringQueue {}

impl Drop for UringQueue {
    fn drop(&mut self) {
        self.eng.bufs.shared().detach(self.eng.ring.io.as_raw_fd());
        // Requests still in the kernel may reference caller buffers: wait for them so that no
        // DMA/copy lands after the queue is gone.
        // Pushed but never submitted: the kernel never saw them.
        let sq = self.eng.ring.io.submission().len();
        self.eng.in_kernel = self.eng.in_kernel.saturating_sub(sq);
        let mut idle = 0;
        while self.eng.in_kernel > 0 && idle < 30 {
            // Only the owner of a SINGLE_ISSUER ring may wait on it (others get EEXIST).
            if let Err(libc::EEXIST) =
                self.eng
                    .ring
                    .enter_now(0, 1, Some(Duration::from_secs(1)), None)
            {
                break;
            }
            let mut n = 0;
            while self.eng.ring.io.completion().next().is_some() {
                n += 1;
            }
            idle = if n == 0 { idle + 1 } else { 0 };
            self.eng.in_kernel = self.eng.in_kernel.saturating_sub(n);
        }
        // What is left (a queue dropped by a thread that does not own its ring, or requests
        // that stayed silent for 30 s): closing the ring cancels what can be cancelled, but
        // the kernel finishes the rest — a read an io-wq worker is copying — on its own time.
        // The canary, dropped after the ring, waits until the kernel has freed the ring and
        // so every request with it.
        if self.eng.in_kernel > 0
            && let Some(c) = &mut self.eng.ring.canary
        {
            c.wait = true;
        }
    }
}

impl Queue for UringQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        if self.eng.try_fast_rw(req) {
            return;
        }
        let ud = req.user_data;
        if let Err(m) = req.validate() {
            return self.core.complete(Completion::err(ud, libc::EINVAL, m));
        }
        match req.op {
            Op::Zone(_) => {
                return self.core.complete(Completion::err(
                    ud,
                    libc::ENOTSUP,
                    c"request not supported for this driver",
                ));
            }
            Op::Read { len, .. } | Op::Write { len, .. } if len > u32::MAX as usize => {
                return self.core.complete(Completion::err(
                    ud,
                    libc::EINVAL,
                    c"len must fit in an unsigned 32-bit integer",
                ));
            }
            Op::Read { len: 0, .. } | Op::Write { len: 0, .. } => {
                return self.core.complete(Completion::ok(ud));
            }
            Op::Readv { iovcnt: 0, .. } | Op::Writev { iovcnt: 0, .. } => {
                return self.core.complete(Completion::ok(ud));
            }
            Op::Flush | Op::Discard { .. } | Op::WriteZeroes { .. } if self.eng.ring.poll => {
                return self.core.complete(Completion::err(
                    ud,
                    libc::ENOTSUP,
                    c"request not supported on poll queues for this driver",
                ));
            }
            Op::WriteZeroes { .. } => {
                if let Err(m) = self.eng.t.write_zeroes_mode(req.flags) {
                    return self.core.complete(Completion::err(ud, libc::ENOTSUP, m));
                }
            }
            Op::Discard { offset, len } if self.eng.t.is_blk => {
                // No io_uring opcode for a block-device discard on every kernel: do it now.
                let c = match self.eng.t.discard(offset, len) {
                    Ok(()) => Completion::ok(ud),
                    Err(e) => Completion::os_err(ud, e),
                };
                return self.core.complete(c);
            }
            _ => {}
        }
        let i = self.eng.slots.alloc(req);
        // Straight into the SQ unless older requests are still waiting for room, or the
        // request is held for a possible inline run (see `UringEngine::inline`).
        let hold = self.eng.inline && self.eng.in_kernel == 0;
        if !hold && self.eng.waiting.is_empty() && self.eng.in_kernel < self.eng.ring.cq_cap {
            let e = self.eng.sqe(i);
            // SAFETY: as in `fill_sq`: the buffers stay valid until the completion is reaped.
            if unsafe { self.eng.ring.io.submission().push(&e) }.is_ok() {
                self.eng.in_kernel += 1;
                return;
            }
        }
        self.eng.waiting.push_back(i);
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
        let fd = self.core.completion_fd()?;
        if !self.fd_handed_out.replace(true) {
            self.eng.ring.want_plain.set(true);
            self.sync_eventfd_flag();
            // Completions posted while the fd was silent must not be missed by a caller who
            // now polls it: with requests outstanding, make it readable once (a spurious
            // wakeup only costs a do_io).
            if self.core.completion_fd_enabled()
                && self.eng.in_flight() > 0
                && let Some(e) = self.core.eventfd()
            {
                e.signal();
            }
        }
        Some(fd)
    }
    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.core.set_completion_fd_enabled(enabled);
        self.sync_eventfd_flag();
    }
    fn is_poll(&self) -> bool {
        self.eng.ring.poll
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight()
    }
}
