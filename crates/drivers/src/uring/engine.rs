//! The engine behind a queue: requests from enqueue to completion. It holds requests in
//! [`SlotTable`] slots, turns them into SQEs (with fixed buffers from [`FixedBufCache`] where
//! the memory is registered) or runs them in the calling thread ([`UringEngine::run_inline`]),
//! and turns CQEs back into completions (short transfers resubmitted, zero-fill past EOF).

use super::bufs::FixedBufCache;
use super::ring::{IN_OTHER_THREADS_RING, Ring, make_ring, thread_token};
use super::slots::{SlotTable, Stage, zero_rest};
use crate::file::{Target, advance, prw};
use io_uring::{opcode, squeue, types};
use snapblk_core::{Completion, Engine, Error, Op, ReqFlags, Request, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

pub(super) struct UringEngine {
    pub(super) ring: Ring,
    pub(super) t: Arc<Target>,
    pub(super) bufs: FixedBufCache,
    pub(super) slots: SlotTable,
    /// The target lacks NOWAIT and `inline-qd1` is on: while nothing is in the kernel, new
    /// requests are held in `waiting` (not pushed to the SQ) so that `submit` can still choose
    /// to run them in this thread (see [`UringEngine::run_inline`]).
    pub(super) inline: bool,
    /// Completions of requests run inline, returned by `reap` before any CQE.
    pub(super) inline_done: VecDeque<Completion>,
    /// Slots waiting for SQ space (or for CQ headroom).
    pub(super) waiting: VecDeque<u32>,
    /// Slots the kernel knows about (pushed to the SQ, CQE not reaped yet).
    pub(super) in_kernel: usize,
}

impl UringEngine {
    /// The common case in one go: a plain read or write from a registered buffer with nothing
    /// waiting for SQ room goes from request to SQE without the general checks. Returns false
    /// (having done nothing) for anything else.
    #[inline]
    pub(super) fn try_fast_rw(&mut self, req: Request) -> bool {
        let (write, offset, p, len) = match req.op {
            Op::Read { offset, buf, len } => (false, offset, buf, len),
            Op::Write { offset, buf, len } => (true, offset, buf.cast_mut(), len),
            _ => return false,
        };
        // No flags and an offset the kernel takes as one are valid for both (so `validate`
        // has nothing to say).
        if req.flags != ReqFlags::NONE
            || len == 0
            || len > u32::MAX as usize
            || offset > i64::MAX as u64
        {
            return false;
        }
        if self.inline && self.in_kernel == 0 {
            // Held back: `submit` decides between this thread and the ring.
            let i = self.slots.alloc(req);
            self.waiting.push_back(i);
            return true;
        }
        if !self.ring.fixed_file || !self.waiting.is_empty() || self.in_kernel >= self.ring.cq_cap {
            return false;
        }
        let Some(bi) = self.bufs.index(p as usize, len) else {
            return false;
        };
        let i = self.slots.alloc(req);
        let e = if write {
            opcode::WriteFixed::new(types::Fixed(0), p, len as u32, bi)
                .offset(offset)
                .build()
        } else {
            opcode::ReadFixed::new(types::Fixed(0), p, len as u32, bi)
                .offset(offset)
                .build()
        }
        .user_data(u64::from(i));
        // SAFETY: as in `fill_sq`: the buffer stays valid until the completion is reaped.
        if unsafe { self.ring.io.submission().push(&e) }.is_ok() {
            self.in_kernel += 1;
        } else {
            self.waiting.push_back(i);
        }
        true
    }

    /// Build the SQE for slot `i` in its current stage and progress.
    pub(super) fn sqe(&mut self, i: u32) -> squeue::Entry {
        let s = &self.slots[i];
        let (req, done, stage) = (s.req, s.done, s.stage);
        let fua = if req.flags.contains(ReqFlags::FUA) {
            libc::RWF_DSYNC
        } else {
            0
        };
        macro_rules! fd {
            ($op:ident, $($a:expr),*) => {
                if self.ring.fixed_file {
                    opcode::$op::new(types::Fixed(0), $($a),*)
                } else {
                    opcode::$op::new(types::Fd(self.t.raw()), $($a),*)
                }
            };
        }
        let e = match (req.op, stage) {
            (_, Stage::FuaFlush) | (Op::Flush, _) => {
                fd!(Fsync,).flags(types::FsyncFlags::DATASYNC).build()
            }
            (Op::Read { offset, buf, len }, _) => {
                // SAFETY: `done < len` while the request is in flight.
                let p = unsafe { buf.add(done) };
                let l = (len - done) as u32;
                let off = offset + done as u64;
                match self.bufs.index(p as usize, l as usize) {
                    Some(bi) => fd!(ReadFixed, p, l, bi).offset(off).build(),
                    None => fd!(Read, p, l).offset(off).build(),
                }
            }
            (Op::Write { offset, buf, len }, _) => {
                // SAFETY: as above.
                let p = unsafe { buf.add(done) };
                let l = (len - done) as u32;
                let off = offset + done as u64;
                match self.bufs.index(p as usize, l as usize) {
                    Some(bi) => fd!(WriteFixed, p, l, bi).offset(off).rw_flags(fua).build(),
                    None => fd!(Write, p, l).offset(off).rw_flags(fua).build(),
                }
            }
            (
                Op::Readv {
                    offset,
                    iov,
                    iovcnt,
                },
                _,
            ) => {
                let (p, n) = self.cur_iov(i, iov, iovcnt);
                fd!(Readv, p, n).offset(offset + done as u64).build()
            }
            (
                Op::Writev {
                    offset,
                    iov,
                    iovcnt,
                },
                _,
            ) => {
                let (p, n) = self.cur_iov(i, iov, iovcnt);
                fd!(Writev, p, n)
                    .offset(offset + done as u64)
                    .rw_flags(fua)
                    .build()
            }
            (Op::WriteZeroes { offset, len }, _) => {
                // The mode was validated at enqueue time.
                let mode = self.t.write_zeroes_mode(req.flags).unwrap_or(0);
                fd!(Fallocate, len).offset(offset).mode(mode).build()
            }
            (Op::Discard { offset, len }, _) => fd!(Fallocate, len)
                .offset(offset)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            // Rejected at enqueue time; never reaches the ring.
            (Op::Zone(_), _) => opcode::Nop::new().build(),
        };
        e.user_data(i as u64)
    }

    fn cur_iov(&self, i: u32, iov: *const libc::iovec, iovcnt: i32) -> (*const libc::iovec, u32) {
        let s = &self.slots[i];
        if s.done > 0 {
            (s.iov_rest.as_ptr(), s.iov_rest.len().min(1024) as u32)
        } else {
            (iov, iovcnt as u32)
        }
    }

    /// What the ring would do with slot `i` in its current stage and progress (the same
    /// operation [`Self::sqe`] builds), done with the equivalent system call in this thread.
    /// Returns what the CQE would say: bytes transferred or -errno. Feeding it to
    /// [`Self::complete`] gives the ring's semantics (short transfers, EOF, FUA flush stage).
    ///
    /// # Safety
    /// The slot's buffers must be valid (the enqueue contract).
    unsafe fn exec_sync(&self, i: u32) -> i32 {
        let s = &self.slots[i];
        let (req, done, stage) = (s.req, s.done, s.stage);
        let fd = self.t.raw();
        let fua = if req.flags.contains(ReqFlags::FUA) {
            libc::RWF_DSYNC
        } else {
            0
        };
        let one = |p: *mut u8, len: usize| libc::iovec {
            iov_base: p.cast(),
            iov_len: len,
        };
        // SAFETY: (all arms) plain system calls on our fd; the buffers and iovec arrays are the
        // request's (valid per the contract) or the slot's `iov_rest`; `done < len` while the
        // request is unfinished, so the pointer arithmetic stays inside the buffer.
        let r: isize = unsafe {
            match (req.op, stage) {
                (_, Stage::FuaFlush) | (Op::Flush, _) => libc::fdatasync(fd) as isize,
                (Op::Read { offset, buf, len }, _) => {
                    let v = one(buf.add(done), len - done);
                    prw(fd, &v, 1, (offset + done as u64) as i64, false, 0)
                }
                (Op::Write { offset, buf, len }, _) => {
                    let v = one(buf.cast_mut().add(done), len - done);
                    prw(fd, &v, 1, (offset + done as u64) as i64, true, fua)
                }
                (
                    Op::Readv {
                        offset,
                        iov,
                        iovcnt,
                    },
                    _,
                ) => {
                    let (p, n) = self.cur_iov(i, iov, iovcnt);
                    prw(fd, p, n as i32, (offset + done as u64) as i64, false, 0)
                }
                (
                    Op::Writev {
                        offset,
                        iov,
                        iovcnt,
                    },
                    _,
                ) => {
                    let (p, n) = self.cur_iov(i, iov, iovcnt);
                    prw(fd, p, n as i32, (offset + done as u64) as i64, true, fua)
                }
                (Op::WriteZeroes { offset, len }, _) => {
                    let mode = self.t.write_zeroes_mode(req.flags).unwrap_or(0);
                    libc::fallocate(fd, mode, offset as i64, len as i64) as isize
                }
                (Op::Discard { offset, len }, _) => libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as i64,
                    len as i64,
                ) as isize,
                (Op::Zone(_), _) => 0,
            }
        };
        if r < 0 {
            -crate::file::errno()
        } else {
            r.min(i32::MAX as isize) as i32
        }
    }

    /// Run every waiting request to completion in this thread, never entering the ring.
    ///
    /// Why: on a target without NOWAIT (tmpfs, zram) io_uring hands every request to an io-wq
    /// worker thread, and a caller that waits for all its requests pays a thread hand-off and
    /// wake-up per request (~40 us at QD1 in a VM) for an operation that takes ~1 us when done
    /// directly. The completions are those the ring would have produced, in submission order;
    /// the completion fd is signalled as the kernel would (once per completion, when enabled
    /// and handed out).
    fn run_inline(&mut self) {
        let mut n = 0u64;
        while let Some(i) = self.waiting.pop_front() {
            // SAFETY: the request came through `Queue::enqueue`, whose caller keeps its buffers
            // valid until the completion is reaped.
            let res = unsafe { self.exec_sync(i) };
            // A short transfer (or EINTR/EAGAIN, or the flush after a FUA write-zeroes) puts
            // the slot back at the end of `waiting`, as on the ring.
            if let Some(c) = self.complete(i, res) {
                self.inline_done.push_back(c);
                n += 1;
            }
        }
        if n > 0
            && self.ring.efd_on.get()
            && let Some(efd) = self.ring.efd
        {
            // SAFETY: writes 8 bytes from a live u64 to the queue's eventfd (which outlives the
            // engine: both belong to the queue). A full counter still leaves it readable.
            unsafe { libc::write(efd, (&n as *const u64).cast(), 8) };
        }
    }

    /// Push waiting slots into the SQ while there is room (SQ space, and CQ headroom so the
    /// kernel never has to buffer overflowing completions).
    fn fill_sq(&mut self) {
        while let Some(&i) = self.waiting.front() {
            if self.in_kernel >= self.ring.cq_cap {
                break;
            }
            let e = self.sqe(i);
            // SAFETY: the SQE's buffers are the request's, valid until its completion (the
            // enqueue contract); `iov_rest` lives in the slot, which is not reused before the
            // CQE is reaped.
            if unsafe { self.ring.io.submission().push(&e) }.is_err() {
                break;
            }
            self.waiting.pop_front();
            self.in_kernel += 1;
        }
    }

    fn enter(
        &mut self,
        to_submit: u32,
        want: u32,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> std::result::Result<usize, i32> {
        let mut to_submit = to_submit;
        if self.ring.needs_claim() {
            self.claim()?;
            // A new ring holds the SQEs of the old one.
            to_submit = to_submit.max(self.ring.io.submission().len() as u32);
        }
        match self.ring.enter_now(to_submit, want, timeout, sigmask) {
            // A new thread can reuse a dead owner's thread-local address, so the token can
            // match while the kernel knows better: claim again (nothing was submitted).
            Err(libc::EEXIST) if self.ring.defer => {
                self.ring.owner = usize::MAX;
                self.claim()?;
                let to_submit = to_submit.max(self.ring.io.submission().len() as u32);
                self.ring.enter_now(to_submit, want, timeout, sigmask)
            }
            r => r,
        }
    }

    /// Make the calling thread the owner of a `SINGLE_ISSUER` ring: enable it if nobody has
    /// yet; if another thread owns it and nothing has reached the kernel, replace the ring by
    /// one owned by this thread (requests sitting in the SQ go back to `waiting`). With
    /// requests in flight in another thread's ring this fails with EBUSY: their completions
    /// can only be collected by that thread.
    ///
    /// Also where a queue whose completion fd was handed out moves to a plain ring (once
    /// nothing of its own is in flight; until then the eventfd works, with spurious wakeups).
    fn claim(&mut self) -> std::result::Result<(), i32> {
        let me = thread_token();
        let plain = self.ring.want_plain.get();
        if self.ring.owner == 0 && !plain {
            return self.ring.enable(me);
        }
        let unsubmitted = self.ring.io.submission().len();
        if self.in_kernel > unsubmitted {
            if self.ring.owner == me {
                return Ok(());
            }
            return Err(IN_OTHER_THREADS_RING);
        }
        let new = make_ring(
            &self.t,
            self.bufs.shared(),
            self.ring.efd,
            self.ring.entries,
            self.ring.poll,
            !plain,
        )
        .map_err(|e| e.errno)?;
        // Everything live that is not waiting sat in the old SQ: queue it again.
        let queued: std::collections::HashSet<u32> = self.waiting.iter().copied().collect();
        for i in self.slots.in_use() {
            if !queued.contains(&i) {
                self.waiting.push_front(i);
            }
        }
        self.in_kernel = 0;
        self.bufs.enabled = new.fixed_bufs;
        self.ring.replace(new, self.bufs.shared(), me)?;
        self.fill_sq();
        Ok(())
    }

    /// Handle one CQE; returns the final completion when the request is finished.
    fn complete(&mut self, i: u32, res: i32) -> Option<Completion> {
        let slot = &mut self.slots[i];
        let req = slot.req;
        let ud = req.user_data;
        if slot.stage == Stage::FuaFlush {
            self.slots.release(i);
            return Some(if res < 0 {
                Completion::os_err(ud, -res)
            } else {
                Completion::ok(ud)
            });
        }
        if res < 0 {
            if res == -libc::EAGAIN || res == -libc::EINTR {
                self.waiting.push_back(i);
                return None;
            }
            self.slots.release(i);
            return Some(Completion::os_err(ud, -res));
        }
        match req.op {
            Op::Read { .. } | Op::Write { .. } | Op::Readv { .. } | Op::Writev { .. } => {
                // SAFETY: the iovec array is valid until completion (enqueue contract).
                let total = unsafe { req.data_len() } as usize;
                let write = matches!(req.op, Op::Write { .. } | Op::Writev { .. });
                let n = res as usize;
                slot.done += n;
                if slot.done >= total {
                    self.slots.release(i);
                    return Some(Completion::ok(ud));
                }
                if n == 0 {
                    // End of file / device before the full length.
                    if write || self.t.is_blk {
                        self.slots.release(i);
                        return Some(Completion::os_err(ud, libc::EIO));
                    }
                    // SAFETY: the rest of the read buffers are valid and ours until completion.
                    unsafe { zero_rest(slot) };
                    self.slots.release(i);
                    return Some(Completion::ok(ud));
                }
                if let Op::Readv { iov, iovcnt, .. } | Op::Writev { iov, iovcnt, .. } = req.op {
                    // SAFETY: as above.
                    let all = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
                    slot.iov_rest = advance(all, slot.done);
                }
                // Short transfer: go again for the rest.
                self.waiting.push_back(i);
                None
            }
            Op::WriteZeroes { .. } if req.flags.contains(ReqFlags::FUA) => {
                slot.stage = Stage::FuaFlush;
                self.waiting.push_back(i);
                None
            }
            _ => {
                self.slots.release(i);
                Some(Completion::ok(ud))
            }
        }
    }
}

impl Engine for UringEngine {
    fn in_flight(&self) -> usize {
        self.slots.live() + self.inline_done.len()
    }

    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()> {
        // Inline when the caller blocks until every request is done anyway and nothing is in
        // the kernel (so no completion can overtake or be stuck behind): not for interruptible
        // waits (the sleep must be interruptible) nor zero timeouts (the caller must not block).
        if self.inline
            && self.in_kernel == 0
            && self.slots.live() > 0
            && wait >= self.slots.live()
            && sigmask.is_none()
            && timeout != Some(Duration::ZERO)
        {
            self.run_inline();
            return Ok(());
        }
        self.fill_sq();
        let to_submit = self.ring.io.submission().len() as u32;
        // Never wait for more than the kernel has: the rest may still sit in `waiting`.
        let want = wait.min(self.in_kernel) as u32;
        // In defer mode, requests in the kernel may have completions waiting to be posted,
        // which only an enter does.
        let deferred = self.ring.defer && self.in_kernel > to_submit as usize;
        if to_submit == 0 && want == 0 && !self.ring.poll && !deferred {
            return Ok(());
        }
        let res = if sigmask.is_some() && to_submit > 0 && want > 0 {
            // Submit first, then sleep with the mask: an enter that submitted reports success
            // even if its wait was interrupted, which would hide the EINTR.
            self.enter(to_submit, 0, None, None)
                .and_then(|_| self.enter(0, want, timeout, sigmask))
        } else {
            self.enter(to_submit, want, timeout, sigmask)
        };
        match res {
            Ok(_) => Ok(()),
            // Not an errno: only the thread that owns the ring can collect those completions,
            // so waiting here would spin until the timeout (or forever).
            Err(IN_OTHER_THREADS_RING) => Err(Error::new(
                libc::EBUSY,
                "requests of this queue are in flight in another thread's ring: reap them from that thread first",
            )),
            // CQ full / out of memory for now: reaping makes progress.
            Err(libc::EBUSY) | Err(libc::EAGAIN) => Ok(()),
            Err(e) => Err(Error::from_errno(e)),
        }
    }

    fn needs_submit(&mut self) -> bool {
        self.ring.poll || !self.waiting.is_empty() || !self.ring.io.submission().is_empty()
    }

    fn reap(&mut self, out: &mut [Completion]) -> usize {
        // CQEs are copied out in batches so the CQ head is published once per batch rather
        // than once per CQE. Never take more CQEs than `out` has room for: each one may be a
        // final completion.
        const BATCH: usize = 32;
        let mut got = [std::mem::MaybeUninit::<(u64, i32)>::uninit(); BATCH];
        let mut n = 0;
        if !self.inline_done.is_empty() {
            while n < out.len() {
                let Some(c) = self.inline_done.pop_front() else {
                    break;
                };
                out[n] = c;
                n += 1;
            }
        }
        while n < out.len() {
            let lim = (out.len() - n).min(BATCH);
            let k = {
                let mut cq = self.ring.io.completion();
                let mut k = 0;
                while k < lim {
                    let Some(cqe) = cq.next() else { break };
                    got[k].write((cqe.user_data(), cqe.result()));
                    k += 1;
                }
                k
            };
            if k == 0 {
                break;
            }
            self.in_kernel -= k;
            for g in &got[..k] {
                // SAFETY: the first `k` entries were written just above.
                let (ud, res) = unsafe { g.assume_init() };
                let i = ud as u32;
                // Fast path: a plain read/write that transferred everything at once.
                let s = &self.slots[i];
                if let (Stage::Main, 0, Op::Read { len, .. } | Op::Write { len, .. }) =
                    (s.stage, s.done, s.req.op)
                    && res >= 0
                    && res as usize == len
                {
                    let ud = s.req.user_data;
                    self.slots.release(i);
                    out[n] = Completion::ok(ud);
                    n += 1;
                    continue;
                }
                if let Some(c) = self.complete(i, res) {
                    out[n] = c;
                    n += 1;
                }
            }
        }
        n
    }
}
