//! The `io_uring` driver: regular files and block devices through one io_uring per queue.
//!
//! Hot-path choices (why it is fast):
//! * the target is registered as fixed file 0 of every ring (no fd lookup per request);
//! * memory regions mapped with `map_mem_region` are registered as fixed buffers of every ring,
//!   and reads/writes that fall inside one use `READ_FIXED`/`WRITE_FIXED` (no page pinning per
//!   request);
//! * request state lives in a reusable slot table indexed by the CQE's `user_data`: no
//!   allocation per request;
//! * `do_io` submits and waits in one `io_uring_enter`;
//! * on targets without NOWAIT (tmpfs, zram: io_uring would hand every request to an io-wq
//!   worker thread), requests that `do_io` waits for anyway run in the calling thread
//!   (`inline-qd1`, see `UringEngine::run_inline`); the connect-time probe is the `nowait`
//!   property.
//!
//! Semantics follow libblkio's io_uring driver (short transfers resubmitted, zero-fill past EOF
//! of a regular file, EIO past the end of a block device, FUA = `RWF_DSYNC`, flush =
//! `fdatasync`, unbounded backlog when the SQ is full), with its bugs fixed: discard works
//! (punch-hole on files, BLKDISCARD on block devices), `do_io_interruptible` passes the kernel's
//! 8-byte sigmask size, the completion-fd enable flag is honoured, and the poll-queue probe
//! issues a real read so that devices without poll support report `supports-poll-queues=false`.

use crate::file::{FILE_PROPS, FileConfig, Target, advance, connected, prw, zero_iov};
use io_uring::{IoUring, opcode, squeue, types};
use snapblk_core::props::{Access, PropSpec, PropType, PropValue};
use snapblk_core::queue::{Engine, QueueCore};
use snapblk_core::request::ReqFlags;
use snapblk_core::{
    Completion, DeviceInfo, Driver, Error, MemRegion, Op, Queue, Request, Result, State,
};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Fixed-buffer slots per ring (regions beyond this are used unregistered).
const BUF_SLOTS: u32 = 64;
const IORING_REGISTER_BUFFERS_UPDATE: libc::c_uint = 16;
const IORING_ENTER_GETEVENTS: u32 = 1;
const IORING_ENTER_EXT_ARG: u32 = 8;
/// The kernel's `sigset_t` is 8 bytes (`_NSIG / 8`), not glibc's 128: passing glibc's size is
/// what made libblkio's `do_io_interruptible` fail with EINVAL.
const KERNEL_SIGSET_SIZE: u32 = 8;

const PROPS: &[PropSpec] = &[
    FILE_PROPS[0],
    FILE_PROPS[1],
    FILE_PROPS[2],
    PropSpec::new("num-entries", PropType::Int, Access::RwConnected, false),
    // Whether the target accepts RWF_NOWAIT (see `probe_nowait`); read-only, after connect.
    PropSpec::new("nowait", PropType::Bool, Access::ReadOnly, true),
    // Whether QD1 requests on a target without NOWAIT run in the calling thread (see
    // `UringEngine::submit`).
    PropSpec::new("inline-qd1", PropType::Bool, Access::RwCreated, false),
];

/// Registered-buffer table shared by the driver (which maps/unmaps) and its queues (which look
/// buffers up per request).
#[derive(Debug, Default)]
struct Buffers {
    /// Bumped after every change; queues refresh their local copy when it moves.
    generation: AtomicU64,
    inner: Mutex<BufInner>,
}

#[derive(Debug, Default)]
struct BufInner {
    /// (addr, len) per fixed-buffer index.
    slots: Vec<Option<(usize, usize)>>,
    /// Ring fds of live queues. A queue removes its fd here before closing the ring, under the
    /// lock, so an fd in this list is always the live ring.
    rings: Vec<RawFd>,
}

#[repr(C)]
struct RsrcUpdate2 {
    offset: u32,
    resv: u32,
    data: u64,
    tags: u64,
    nr: u32,
    resv2: u32,
}

/// `struct io_uring_getevents_arg`.
#[repr(C)]
struct GeteventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

fn update_buffer(ring: RawFd, index: u32, iov: &libc::iovec) -> std::result::Result<(), i32> {
    let up = RsrcUpdate2 {
        offset: index,
        resv: 0,
        data: iov as *const libc::iovec as u64,
        tags: 0,
        nr: 1,
        resv2: 0,
    };
    // SAFETY: `up` and the iovec it points to are live for the call; the kernel copies them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring,
            IORING_REGISTER_BUFFERS_UPDATE,
            &up as *const RsrcUpdate2,
            std::mem::size_of::<RsrcUpdate2>(),
        )
    };
    if r < 0 {
        Err(crate::file::errno())
    } else {
        Ok(())
    }
}

impl Buffers {
    /// Register `(addr, len)` in every ring; `false` if it could not be (table full, pinning
    /// refused): the region then simply works unregistered.
    fn register(&self, addr: usize, len: usize) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        if len == 0 || len > u32::MAX as usize {
            return false;
        }
        let idx = match g.slots.iter().position(|s| s.is_none()) {
            Some(i) => i,
            None if g.slots.len() < BUF_SLOTS as usize => {
                g.slots.push(None);
                g.slots.len() - 1
            }
            None => return false,
        };
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for (i, &ring) in g.rings.iter().enumerate() {
            if update_buffer(ring, idx as u32, &iov).is_err() {
                for &r in &g.rings[..i] {
                    let _ = update_buffer(r, idx as u32, &empty);
                }
                return false;
            }
        }
        g.slots[idx] = Some((addr, len));
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    fn unregister(&self, addr: usize, len: usize) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Some(idx) = g.slots.iter().position(|s| *s == Some((addr, len))) else {
            return;
        };
        g.slots[idx] = None;
        self.generation.fetch_add(1, Ordering::Release);
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        for &ring in &g.rings {
            let _ = update_buffer(ring, idx as u32, &empty);
        }
    }
}

/// The `io_uring` driver. Properties: `path`, `fd`, `direct`, `num-entries`, `nowait`
/// (read-only), `inline-qd1`.
#[derive(Debug)]
pub struct UringDriver {
    cfg: FileConfig,
    num_entries: i32,
    /// `inline-qd1`: run requests in the calling thread when the ring would only punt them to
    /// a kernel worker and the caller waits for all of them anyway.
    inline_qd1: bool,
    /// `nowait`: the probe's verdict at connect (meaningless before).
    nowait: bool,
    target: Option<Arc<Target>>,
    bufs: Arc<Buffers>,
}

impl UringDriver {
    pub fn new() -> Self {
        UringDriver {
            cfg: FileConfig::new(),
            num_entries: 128,
            inline_qd1: true,
            nowait: true,
            target: None,
            bufs: Arc::default(),
        }
    }
}

impl UringDriver {
    /// Whether a new queue may run requests inline: `inline-qd1` on, a target without NOWAIT,
    /// and not a poll queue (polling needs the ring).
    fn inline_for(&self, poll: bool) -> bool {
        self.inline_qd1 && !self.nowait && !poll
    }

    fn create_queue_inner(&self, poll: bool) -> Result<UringQueue> {
        let t = connected(&self.target)?;
        UringQueue::new(
            t.clone(),
            self.bufs.clone(),
            self.num_entries as u32,
            poll,
            self.inline_for(poll),
        )
    }
}

impl Default for UringDriver {
    fn default() -> Self {
        Self::new()
    }
}

/// Does an IOPOLL read of one block really work? (libblkio probed with a zero-length read,
/// which succeeds even where the device has no poll queues.)
fn probe_poll(t: &Target, align: usize) -> bool {
    let Ok(cap) = t.capacity() else { return false };
    let len = align.max(512);
    if !t.direct || cap < len as u64 {
        return false;
    }
    let Ok(mut ring) = IoUring::<squeue::Entry>::builder().setup_iopoll().build(2) else {
        return false;
    };
    let Ok(buf) = MemRegion::alloc(len.max(4096)) else {
        return false;
    };
    let sqe = opcode::Read::new(types::Fd(t.raw()), buf.addr, len as u32)
        .offset(0)
        .build();
    let mut ok = false;
    // SAFETY: `buf` stays alive until the completion is reaped below (or the ring is dropped,
    // which waits for IOPOLL requests).
    if unsafe { ring.submission().push(&sqe) }.is_ok()
        && ring.submit_and_wait(1).is_ok()
        && let Some(c) = ring.completion().next()
    {
        ok = c.result() >= 0;
    }
    drop(ring);
    // SAFETY: the ring is gone, nothing references the buffer any more.
    unsafe { buf.free() };
    ok
}

/// Can io_uring issue reads of this target inline, or will it punt every request to an io-wq
/// worker thread? io_uring first tries a request with `IOCB_NOWAIT` only on files that support
/// it (`FMODE_NOWAIT`: not tmpfs/shmem, not block devices whose queue lacks nowait support
/// such as zram); everything else goes to a worker, a thread hand-off and wake-up per request.
/// `preadv2(RWF_NOWAIT)` asks the same question of the same file: EOPNOTSUPP means no NOWAIT.
/// For an O_DIRECT block device an EAGAIN from the bio layer (queue without nowait support)
/// means the same; for buffered I/O EAGAIN only says "not in the page cache", so the target
/// is NOWAIT-capable. Anything else (e.g. EBADF on a write-only fd) leaves the answer at
/// "capable", i.e. the plain ring path.
fn probe_nowait(t: &Target, align: usize) -> bool {
    let len = if t.direct { align.max(512) } else { 4096 };
    let Ok(buf) = MemRegion::alloc(len.max(4096)) else {
        return true;
    };
    let iov = libc::iovec {
        iov_base: buf.addr.cast(),
        iov_len: len,
    };
    // SAFETY: one iovec pointing into `buf`, which is live and ours; offset 0 of the target
    // (an empty file just returns 0: the NOWAIT check comes before the read).
    let r = unsafe { libc::preadv2(t.raw(), &iov, 1, 0, libc::RWF_NOWAIT) };
    let e = if r < 0 { crate::file::errno() } else { 0 };
    // SAFETY: the read is over; nothing references the buffer.
    unsafe { buf.free() };
    match e {
        libc::EOPNOTSUPP => false,
        libc::EAGAIN => !(t.direct && t.is_blk),
        _ => true,
    }
}

impl Driver for UringDriver {
    fn name(&self) -> &str {
        "io_uring"
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _state: State) -> Result<PropValue> {
        match name {
            "num-entries" => Ok(PropValue::Int(self.num_entries)),
            "inline-qd1" => Ok(PropValue::Bool(self.inline_qd1)),
            "nowait" => {
                connected(&self.target)?;
                Ok(PropValue::Bool(self.nowait))
            }
            _ => self.cfg.get(name, self.target.as_deref()),
        }
    }
    fn set_prop(&mut self, name: &str, value: PropValue, state: State) -> Result<()> {
        if let ("num-entries", PropValue::Int(n)) = (name, &value) {
            if *n <= 0 {
                return Err(Error::inval("num-entries must be greater than 0"));
            }
            self.num_entries = *n;
            return Ok(());
        }
        if let ("inline-qd1", PropValue::Bool(b)) = (name, &value) {
            self.inline_qd1 = *b;
            return Ok(());
        }
        self.cfg.set(name, &value, state)
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        let (t, mut info) = self.cfg.open(read_only)?;
        info.supports_poll_queues = probe_poll(&t, info.request_alignment.max(1) as usize);
        self.nowait = probe_nowait(&t, info.request_alignment.max(1) as usize);
        self.target = Some(Arc::new(t));
        Ok(info)
    }
    fn capacity(&self) -> Result<u64> {
        connected(&self.target)?.capacity()
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        Ok(Box::new(self.create_queue_inner(poll)?))
    }
    fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        // Registration is an optimisation: a region that cannot be registered still works.
        self.bufs.register(region.addr as usize, region.len);
        Ok(())
    }
    fn unmap_mem_region(&mut self, region: &MemRegion) {
        self.bufs.unregister(region.addr as usize, region.len);
    }
}

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Free,
    /// The request's main operation.
    Main,
    /// The flush that follows a FUA write-zeroes.
    FuaFlush,
}

#[derive(Debug)]
struct Slot {
    req: Request,
    stage: Stage,
    /// Bytes transferred so far (reads/writes).
    done: usize,
    /// Remaining iovecs after a short vectored transfer.
    iov_rest: Vec<libc::iovec>,
}

struct UringEngine {
    ring: IoUring,
    t: Arc<Target>,
    fixed_file: bool,
    /// This ring holds every mapped region in the shared fixed-buffer table (see [`make_ring`]);
    /// when it could not (e.g. RLIMIT_MEMLOCK, charged per ring), it uses none of them.
    fixed_bufs: bool,
    poll: bool,
    /// The target lacks NOWAIT and `inline-qd1` is on: while nothing is in the kernel, new
    /// requests are held in `waiting` (not pushed to the SQ) so that `submit` can still choose
    /// to run them in this thread (see [`UringEngine::run_inline`]).
    inline: bool,
    /// Completions of requests run inline, returned by `reap` before any CQE.
    inline_done: VecDeque<Completion>,
    /// The ring is `SINGLE_ISSUER | DEFER_TASKRUN`, created disabled (see [`make_ring`]).
    defer: bool,
    /// [`thread_token`] of the thread that enabled the ring (0: not enabled yet).
    owner: usize,
    /// For rebuilding the ring in another thread: its size, the eventfd, and whether the
    /// eventfd is currently signalled.
    entries: u32,
    efd: Option<RawFd>,
    efd_on: std::cell::Cell<bool>,
    /// The completion fd was handed out: move to a plain ring at the next chance.
    want_plain: std::cell::Cell<bool>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slots waiting for SQ space (or for CQ headroom).
    waiting: VecDeque<u32>,
    /// Slots the kernel knows about (pushed to the SQ, CQE not reaped yet).
    in_kernel: usize,
    /// Slots allocated (waiting + in the kernel).
    live: usize,
    cq_cap: usize,
    bufs: Arc<Buffers>,
    buf_gen: u64,
    /// Local copy of the registered buffers: (start, end, index).
    local_bufs: Vec<(usize, usize, u16)>,
    /// The last registered buffer a request fell into (empty range: none).
    last_hit: (usize, usize, u16),
}

impl UringEngine {
    fn refresh_bufs(&mut self) {
        let g = self.bufs.generation.load(Ordering::Acquire);
        if g == self.buf_gen {
            return;
        }
        if let Ok(inner) = self.bufs.inner.lock() {
            self.last_hit = (0, 0, 0);
            self.local_bufs.clear();
            for (i, s) in inner.slots.iter().enumerate() {
                if let Some((a, l)) = *s {
                    self.local_bufs.push((a, a + l, i as u16));
                }
            }
            self.buf_gen = g;
        }
    }

    /// The registered buffer holding `addr..addr+len`, if any.
    #[inline(always)]
    fn fixed_index(&mut self, addr: usize, len: usize) -> Option<u16> {
        if !self.fixed_bufs {
            return None;
        }
        // Requests of one client nearly always come from the same region: try the last hit
        // (valid while the table has not changed) before anything else.
        let (lo, hi, bi) = self.last_hit;
        if addr >= lo
            && addr <= hi
            && len <= hi - addr
            && self.bufs.generation.load(Ordering::Acquire) == self.buf_gen
        {
            return Some(bi);
        }
        self.fixed_index_slow(addr, len)
    }

    #[inline(never)]
    fn fixed_index_slow(&mut self, addr: usize, len: usize) -> Option<u16> {
        self.refresh_bufs();
        let end = addr.checked_add(len)?;
        let hit = *self
            .local_bufs
            .iter()
            .find(|(s, e, _)| addr >= *s && end <= *e)?;
        self.last_hit = hit;
        Some(hit.2)
    }

    /// The common case in one go: a plain read or write from a registered buffer with nothing
    /// waiting for SQ room goes from request to SQE without the general checks. Returns false
    /// (having done nothing) for anything else.
    #[inline]
    fn try_fast_rw(&mut self, req: Request) -> bool {
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
            let i = self.alloc_slot(req);
            self.waiting.push_back(i);
            return true;
        }
        if !self.fixed_file || !self.waiting.is_empty() || self.in_kernel >= self.cq_cap {
            return false;
        }
        let Some(bi) = self.fixed_index(p as usize, len) else {
            return false;
        };
        let i = self.alloc_slot(req);
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
        if unsafe { self.ring.submission().push(&e) }.is_ok() {
            self.in_kernel += 1;
        } else {
            self.waiting.push_back(i);
        }
        true
    }

    fn alloc_slot(&mut self, req: Request) -> u32 {
        self.live += 1;
        if let Some(i) = self.free.pop() {
            let s = &mut self.slots[i as usize];
            s.req = req;
            s.stage = Stage::Main;
            s.done = 0;
            s.iov_rest.clear();
            i
        } else {
            self.slots.push(Slot {
                req,
                stage: Stage::Main,
                done: 0,
                iov_rest: Vec::new(),
            });
            (self.slots.len() - 1) as u32
        }
    }

    fn release(&mut self, i: u32) {
        self.slots[i as usize].stage = Stage::Free;
        self.free.push(i);
        self.live -= 1;
    }

    /// Build the SQE for slot `i` in its current stage and progress.
    fn sqe(&mut self, i: u32) -> squeue::Entry {
        let s = &self.slots[i as usize];
        let (req, done, stage) = (s.req, s.done, s.stage);
        let fua = if req.flags.contains(ReqFlags::FUA) {
            libc::RWF_DSYNC
        } else {
            0
        };
        macro_rules! fd {
            ($op:ident, $($a:expr),*) => {
                if self.fixed_file {
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
                match self.fixed_index(p as usize, l as usize) {
                    Some(bi) => fd!(ReadFixed, p, l, bi).offset(off).build(),
                    None => fd!(Read, p, l).offset(off).build(),
                }
            }
            (Op::Write { offset, buf, len }, _) => {
                // SAFETY: as above.
                let p = unsafe { buf.add(done) };
                let l = (len - done) as u32;
                let off = offset + done as u64;
                match self.fixed_index(p as usize, l as usize) {
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
            (Op::Zone, _) => opcode::Nop::new().build(),
        };
        e.user_data(i as u64)
    }

    fn cur_iov(&self, i: u32, iov: *const libc::iovec, iovcnt: i32) -> (*const libc::iovec, u32) {
        let s = &self.slots[i as usize];
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
        let s = &self.slots[i as usize];
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
        // SAFETY (all arms): plain system calls on our fd; the buffers and iovec arrays are the
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
                (Op::Zone, _) => 0,
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
            && self.efd_on.get()
            && let Some(efd) = self.efd
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
            if self.in_kernel >= self.cq_cap {
                break;
            }
            let e = self.sqe(i);
            // SAFETY: the SQE's buffers are the request's, valid until its completion (the
            // enqueue contract); `iov_rest` lives in the slot, which is not reused before the
            // CQE is reaped.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
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
        if self.defer && (self.owner != thread_token() || self.want_plain.get()) {
            self.claim()?;
            // A new ring holds the SQEs of the old one.
            to_submit = to_submit.max(self.ring.submission().len() as u32);
        }
        match self.enter_now(to_submit, want, timeout, sigmask) {
            // A new thread can reuse a dead owner's thread-local address, so the token can
            // match while the kernel knows better: claim again (nothing was submitted).
            Err(libc::EEXIST) if self.defer => {
                self.owner = usize::MAX;
                self.claim()?;
                let to_submit = to_submit.max(self.ring.submission().len() as u32);
                self.enter_now(to_submit, want, timeout, sigmask)
            }
            r => r,
        }
    }

    /// `io_uring_enter` from whatever thread calls (see `enter`).
    fn enter_now(
        &mut self,
        to_submit: u32,
        want: u32,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> std::result::Result<usize, i32> {
        // With DEFER_TASKRUN completions are only posted inside a GETEVENTS enter.
        let mut flags = if want > 0 || self.poll || self.defer {
            IORING_ENTER_GETEVENTS
        } else {
            0
        };
        let ts;
        let arg;
        let r = if want > 0 && (timeout.is_some() || sigmask.is_some()) {
            flags |= IORING_ENTER_EXT_ARG;
            ts = timeout.map(|d| libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            });
            arg = GeteventsArg {
                sigmask: sigmask.map_or(0, |m| m as *const libc::sigset_t as u64),
                sigmask_sz: if sigmask.is_some() {
                    KERNEL_SIGSET_SIZE
                } else {
                    0
                },
                min_wait_usec: 0,
                ts: ts.as_ref().map_or(0, |t| t as *const libc::timespec as u64),
            };
            // SAFETY: `arg` (and the timespec/sigmask it points to) outlive the call; the size
            // passed by `enter` is that of `GeteventsArg`, the kernel's getevents_arg.
            unsafe {
                self.ring
                    .submitter()
                    .enter(to_submit, want, flags, Some(&arg))
            }
        } else {
            // SAFETY: no argument pointer.
            unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(to_submit, want, flags, None)
            }
        };
        r.map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))
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
        let plain = self.want_plain.get();
        if self.owner == 0 && !plain {
            self.ring
                .submitter()
                .register_enable_rings()
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
            self.owner = me;
            return Ok(());
        }
        let unsubmitted = self.ring.submission().len();
        if self.in_kernel > unsubmitted {
            if self.owner == me {
                return Ok(());
            }
            return Err(IN_OTHER_THREADS_RING);
        }
        let (ring, defer, fixed_file, fixed_bufs) = make_ring(
            &self.t,
            &self.bufs,
            self.efd,
            self.entries,
            self.poll,
            !plain,
        )
        .map_err(|e| e.errno)?;
        // Everything live that is not waiting sat in the old SQ: queue it again.
        let queued: std::collections::HashSet<u32> = self.waiting.iter().copied().collect();
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.stage != Stage::Free && !queued.contains(&(i as u32)) {
                self.waiting.push_front(i as u32);
            }
        }
        self.in_kernel = 0;
        let old = std::mem::replace(&mut self.ring, ring);
        if let Ok(mut g) = self.bufs.inner.lock() {
            let fd = old.as_raw_fd();
            g.rings.retain(|&r| r != fd);
        }
        drop(old);
        self.defer = defer;
        self.fixed_file = fixed_file;
        self.fixed_bufs = fixed_bufs;
        self.cq_cap = self.ring.params().cq_entries() as usize;
        if self.efd_on.get() {
            self.ring.completion().enable_eventfd();
        }
        self.owner = 0;
        if self.defer {
            self.ring
                .submitter()
                .register_enable_rings()
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
            self.owner = me;
        }
        self.fill_sq();
        Ok(())
    }

    /// Handle one CQE; returns the final completion when the request is finished.
    fn complete(&mut self, i: u32, res: i32) -> Option<Completion> {
        let slot = &mut self.slots[i as usize];
        let req = slot.req;
        let ud = req.user_data;
        if slot.stage == Stage::FuaFlush {
            self.release(i);
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
            self.release(i);
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
                    self.release(i);
                    return Some(Completion::ok(ud));
                }
                if n == 0 {
                    // End of file / device before the full length.
                    if write || self.t.is_blk {
                        self.release(i);
                        return Some(Completion::os_err(ud, libc::EIO));
                    }
                    // SAFETY: the rest of the read buffers are valid and ours until completion.
                    unsafe { zero_rest(slot) };
                    self.release(i);
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
                self.release(i);
                Some(Completion::ok(ud))
            }
        }
    }
}

/// Zero what a read did not fill.
///
/// # Safety
/// The slot's read buffers must be valid and writable.
unsafe fn zero_rest(slot: &Slot) {
    match slot.req.op {
        Op::Read { buf, len, .. } => {
            // SAFETY: `done < len`; the buffer is valid per the contract.
            unsafe { std::ptr::write_bytes(buf.add(slot.done), 0, len - slot.done) };
        }
        Op::Readv { iov, iovcnt, .. } => {
            // SAFETY: per the contract.
            let all = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
            // SAFETY: per the contract.
            unsafe { zero_iov(&advance(all, slot.done)) };
        }
        _ => {}
    }
}

/// `claim`'s refusal to move a queue whose requests are in another thread's ring (negative, so
/// it cannot be mistaken for the kernel's EBUSY, which means "reap, then retry").
const IN_OTHER_THREADS_RING: i32 = -libc::EBUSY;

impl Engine for UringEngine {
    fn in_flight(&self) -> usize {
        self.live + self.inline_done.len()
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
            && self.live > 0
            && wait >= self.live
            && sigmask.is_none()
            && timeout != Some(Duration::ZERO)
        {
            self.run_inline();
            return Ok(());
        }
        self.fill_sq();
        let to_submit = self.ring.submission().len() as u32;
        // Never wait for more than the kernel has: the rest may still sit in `waiting`.
        let want = wait.min(self.in_kernel) as u32;
        // In defer mode, requests in the kernel may have completions waiting to be posted,
        // which only an enter does.
        let deferred = self.defer && self.in_kernel > to_submit as usize;
        if to_submit == 0 && want == 0 && !self.poll && !deferred {
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
        self.poll || !self.waiting.is_empty() || !self.ring.submission().is_empty()
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
                let mut cq = self.ring.completion();
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
                let s = &self.slots[i as usize];
                if let (Stage::Main, 0, Op::Read { len, .. } | Op::Write { len, .. }) =
                    (s.stage, s.done, s.req.op)
                    && res >= 0
                    && res as usize == len
                {
                    let ud = s.req.user_data;
                    self.release(i);
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

struct UringQueue {
    core: QueueCore,
    eng: UringEngine,
    /// Whether `completion_fd` was ever asked for. Until then nobody can be polling the
    /// eventfd, so the kernel is told not to signal it (saves an eventfd wakeup per
    /// completion batch for clients that only wait in `do_io`).
    fd_handed_out: std::cell::Cell<bool>,
}

impl UringQueue {
    /// Tell the kernel whether to signal the eventfd: only when enabled and handed out.
    fn sync_eventfd_flag(&self) {
        let on = self.core.completion_fd_enabled() && self.fd_handed_out.get();
        self.eng.efd_on.set(on);
        // SAFETY: the queue is used by one thread at a time (`Queue` is not `Sync`) and no
        // other CQ handle is alive during this call, so this is the only access to the CQ.
        let cq = unsafe { self.eng.ring.completion_shared() };
        if on {
            cq.enable_eventfd();
        } else {
            cq.disable_eventfd();
        }
    }
}

/// A new ring for `t`, with the target, the regions mapped so far and the eventfd registered.
///
/// Regular queues whose completion fd nobody asked for (`defer_ok`) ask for
/// `SINGLE_ISSUER | DEFER_TASKRUN` (completions are posted when the owning thread enters the
/// kernel, instead of through task work that interrupts it: ~1.5x the IOPS at QD32 on zram and
/// tmpfs) and `R_DISABLED`, so that the thread that first submits — not the one that created
/// the queue — becomes the owner ([`UringEngine::claim`]). Kernels without these flags, poll
/// queues and queues whose completion fd is in use get a plain ring: with DEFER_TASKRUN the
/// kernel signals the eventfd once when a completion is queued and again when it is posted,
/// i.e. a spurious wakeup per batch for eventfd-driven callers. The eventfd is registered but
/// silent until someone asks for it (`completion_fd`).
fn make_ring(
    t: &Target,
    bufs: &Buffers,
    efd: Option<RawFd>,
    entries: u32,
    poll: bool,
    defer_ok: bool,
) -> Result<(IoUring, bool, bool, bool)> {
    let mut defer = !poll && defer_ok;
    let mut ring = None;
    if defer {
        let mut b = IoUring::builder();
        b.setup_single_issuer()
            .setup_defer_taskrun()
            .setup_coop_taskrun()
            .setup_r_disabled();
        ring = b.build(entries).ok();
    }
    let mut ring = match ring {
        Some(r) => r,
        None => {
            defer = false;
            let mut b = IoUring::builder();
            if poll {
                b.setup_iopoll();
            }
            b.build(entries).map_err(Error::from_io)?
        }
    };
    ring.completion().disable_eventfd();
    let sub = ring.submitter();
    if let Some(e) = efd {
        sub.register_eventfd(e)
            .map_err(|e| Error::new(libc::ENOTSUP, e.to_string()))?;
    }
    let fixed_file = sub.register_files(&[t.raw()]).is_ok();
    // Buffers: a sparse table, filled with the regions mapped so far. Registration is an
    // optimisation only, so failures leave the ring without fixed buffers — all of them: the
    // table's indexes are shared by every ring, so a ring missing one of its entries would
    // fail I/O into that region with EFAULT. The kernel charges pinned pages to RLIMIT_MEMLOCK
    // per ring, so a second ring can fail where the first succeeded.
    let mut fixed_bufs = false;
    if sub.register_buffers_sparse(BUF_SLOTS).is_ok()
        && let Ok(mut g) = bufs.inner.lock()
    {
        fixed_bufs = g.slots.iter().enumerate().all(|(i, s)| match *s {
            Some((a, l)) => {
                let iov = libc::iovec {
                    iov_base: a as *mut libc::c_void,
                    iov_len: l,
                };
                update_buffer(ring.as_raw_fd(), i as u32, &iov).is_ok()
            }
            None => true,
        });
        // Only rings with the whole table follow later changes (a region mapped later is
        // registered in all of them or in none).
        if fixed_bufs {
            g.rings.push(ring.as_raw_fd());
        }
    }
    Ok((ring, defer, fixed_file, fixed_bufs))
}

/// Identifies the calling thread cheaply (the address of a thread-local), to notice when a
/// queue is driven from a thread other than its ring's owner.
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

impl UringQueue {
    fn new(
        t: Arc<Target>,
        bufs: Arc<Buffers>,
        entries: u32,
        poll: bool,
        inline: bool,
    ) -> Result<UringQueue> {
        let core = QueueCore::new(poll)?;
        let efd = core.eventfd().map(|e| e.raw());
        let (ring, defer, fixed_file, fixed_bufs) = make_ring(&t, &bufs, efd, entries, poll, true)?;
        let cq_cap = ring.params().cq_entries() as usize;
        Ok(UringQueue {
            core,
            fd_handed_out: std::cell::Cell::new(false),
            eng: UringEngine {
                ring,
                t,
                fixed_file,
                fixed_bufs,
                poll,
                inline,
                inline_done: VecDeque::new(),
                defer,
                owner: 0,
                entries,
                efd,
                efd_on: std::cell::Cell::new(false),
                want_plain: std::cell::Cell::new(false),
                slots: Vec::new(),
                free: Vec::new(),
                waiting: VecDeque::new(),
                in_kernel: 0,
                live: 0,
                cq_cap,
                bufs,
                buf_gen: u64::MAX,
                local_bufs: Vec::new(),
                last_hit: (0, 0, 0),
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
        let fd = self.eng.ring.as_raw_fd();
        if let Ok(mut g) = self.eng.bufs.inner.lock() {
            g.rings.retain(|&r| r != fd);
        }
        // Requests still in the kernel may reference caller buffers: wait for them so that no
        // DMA/copy lands after the queue is gone.
        // Pushed but never submitted: the kernel never saw them.
        let sq = self.eng.ring.submission().len();
        self.eng.in_kernel = self.eng.in_kernel.saturating_sub(sq);
        let mut idle = 0;
        while self.eng.in_kernel > 0 && idle < 30 {
            // Only the owner of a SINGLE_ISSUER ring may wait on it (others get EEXIST);
            // closing the ring then cancels what is left.
            if let Err(libc::EEXIST) = self.eng.enter_now(0, 1, Some(Duration::from_secs(1)), None)
            {
                break;
            }
            let mut n = 0;
            while self.eng.ring.completion().next().is_some() {
                n += 1;
            }
            idle = if n == 0 { idle + 1 } else { 0 };
            self.eng.in_kernel = self.eng.in_kernel.saturating_sub(n);
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
            Op::Zone => {
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
            Op::Flush | Op::Discard { .. } | Op::WriteZeroes { .. } if self.eng.poll => {
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
        let i = self.eng.alloc_slot(req);
        // Straight into the SQ unless older requests are still waiting for room, or the
        // request is held for a possible inline run (see `UringEngine::inline`).
        let hold = self.eng.inline && self.eng.in_kernel == 0;
        if !hold && self.eng.waiting.is_empty() && self.eng.in_kernel < self.eng.cq_cap {
            let e = self.eng.sqe(i);
            // SAFETY: as in `fill_sq`: the buffers stay valid until the completion is reaped.
            if unsafe { self.eng.ring.submission().push(&e) }.is_ok() {
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
            self.eng.want_plain.set(true);
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
        self.eng.poll
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::queue::QueueExt;
    use std::path::{Path, PathBuf};

    /// A file of `len` patterned bytes under `dir`, removed on drop.
    struct TmpFile(PathBuf);
    impl TmpFile {
        fn new(dir: &str, tag: &str, len: usize) -> TmpFile {
            let p = Path::new(dir).join(format!("snapblk-uring-{tag}-{}", std::process::id()));
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            std::fs::write(&p, data).unwrap();
            TmpFile(p)
        }
    }
    impl Drop for TmpFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn driver(f: &TmpFile, direct: bool) -> UringDriver {
        let mut d = UringDriver::new();
        d.set_prop(
            "path",
            PropValue::Str(f.0.to_str().unwrap().into()),
            State::Created,
        )
        .unwrap();
        d.set_prop("direct", PropValue::Bool(direct), State::Created)
            .unwrap();
        d.connect(false).unwrap();
        d
    }

    fn queue(d: &UringDriver, inline: bool) -> UringQueue {
        let q =
            UringQueue::new(d.target.clone().unwrap(), d.bufs.clone(), 8, false, inline).unwrap();
        assert!(q.eng.defer, "these tests need a kernel with DEFER_TASKRUN");
        q
    }

    fn read_req(buf: &mut [u8], offset: u64, ud: usize) -> Request {
        Request::new(
            Op::Read {
                offset,
                buf: buf.as_mut_ptr(),
                len: buf.len(),
            },
            ud,
            ReqFlags::NONE,
        )
    }

    /// Queues start with a disabled `SINGLE_ISSUER` ring, enabled (owner set) by the first
    /// `io_uring_enter` or replaced by a plain ring there (completion fd handed out): a
    /// disabled ring means the kernel never saw a request of this queue.
    fn ring_used(q: &UringQueue) -> bool {
        q.eng.owner != 0 || !q.eng.defer
    }

    /// `got` holds the file's pattern from `off`.
    fn expect(off: usize, got: &[u8]) {
        let want: Vec<u8> = (off..off + got.len()).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(got, &want[..]);
    }

    #[test]
    fn probe_says_tmpfs_has_no_nowait_and_ext4_has() {
        let shm = TmpFile::new("/dev/shm", "probe", 1 << 16);
        // Tests run on ext4 or xfs here (`stat -f /var/tmp`); the probe must say yes there.
        let st = nix_statfs("/var/tmp");
        assert!(
            st == 0xEF53 || st == 0x5846_5342,
            "/var/tmp must be ext4 or xfs for this test (f_type {st:#x})"
        );
        let disk = TmpFile::new("/var/tmp", "probe", 1 << 16);
        for direct in [false, true] {
            assert!(!driver(&shm, direct).nowait, "tmpfs direct={direct}");
            assert!(driver(&disk, direct).nowait, "ext4 direct={direct}");
        }
        // An empty file: the flag is checked before the read.
        let empty = TmpFile::new("/dev/shm", "probe0", 0);
        assert!(!driver(&empty, false).nowait);
    }

    fn nix_statfs(p: &str) -> i64 {
        let c = std::ffi::CString::new(p).unwrap();
        // SAFETY: zeroed statfs is valid; statfs fills it from a valid C string path.
        let mut s: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0);
        s.f_type as i64
    }

    #[test]
    fn nowait_and_inline_properties() {
        let shm = TmpFile::new("/dev/shm", "props", 4096);
        let mut d = UringDriver::new();
        assert_eq!(
            d.get_prop("nowait", State::Created).unwrap_err().errno,
            libc::ENODEV
        );
        assert_eq!(
            d.get_prop("inline-qd1", State::Created).unwrap(),
            PropValue::Bool(true)
        );
        d.set_prop("inline-qd1", PropValue::Bool(false), State::Created)
            .unwrap();
        d.set_prop(
            "path",
            PropValue::Str(shm.0.to_str().unwrap().into()),
            State::Created,
        )
        .unwrap();
        d.connect(false).unwrap();
        assert_eq!(
            d.get_prop("nowait", State::Connected).unwrap(),
            PropValue::Bool(false)
        );
        assert_eq!(
            d.get_prop("inline-qd1", State::Connected).unwrap(),
            PropValue::Bool(false)
        );
    }

    #[test]
    fn qd1_on_tmpfs_runs_inline_and_ring_only_when_disabled() {
        let shm = TmpFile::new("/dev/shm", "qd1", 1 << 16);
        let d = driver(&shm, false);
        for inline in [true, false] {
            let mut q = queue(&d, inline);
            let mut buf = vec![0u8; 4096];
            for off in [0usize, 4096, 12345] {
                q.read_at(off as u64, &mut buf).unwrap();
                expect(off, &buf);
            }
            assert_eq!(ring_used(&q), !inline, "inline={inline}");
        }
        // On ext4 (NOWAIT) the driver never asks for the inline path.
        let disk = TmpFile::new("/var/tmp", "qd1", 1 << 16);
        let d = driver(&disk, false);
        let mut q = d.create_queue_inner(false).unwrap();
        assert!(!q.eng.inline);
        let mut buf = vec![0u8; 4096];
        q.read_at(0, &mut buf).unwrap();
        assert!(ring_used(&q));
    }

    #[test]
    fn inline_only_when_the_caller_waits_for_everything() {
        let shm = TmpFile::new("/dev/shm", "mix", 1 << 16);
        let d = driver(&shm, false);
        let mut bufs = vec![vec![0u8; 4096]; 3];
        let mut cs = [Completion::default(); 3];

        // QD2 waiting for 1: the ring.
        let mut q = queue(&d, true);
        for (i, b) in bufs.iter_mut().enumerate().take(2) {
            // SAFETY: the buffers outlive the requests, reaped below.
            unsafe { q.enqueue(read_req(b, (i * 4096) as u64, i)) };
        }
        let mut got = q.do_io(&mut cs, 1, None, None).unwrap();
        assert!(ring_used(&q));
        while got < 2 {
            got += q.do_io(&mut cs[got..], 1, None, None).unwrap();
        }
        let mut uds: Vec<usize> = cs[..2].iter().map(|c| c.user_data).collect();
        uds.sort();
        assert_eq!(uds, [0, 1]);

        // QD2 waiting for both: inline, in submission order.
        let mut q = queue(&d, true);
        for (i, b) in bufs.iter_mut().enumerate().take(2) {
            // SAFETY: as above.
            unsafe { q.enqueue(read_req(b, (i * 4096) as u64, 10 + i)) };
        }
        assert_eq!(q.do_io(&mut cs, 2, None, None).unwrap(), 2);
        assert!(!ring_used(&q));
        assert_eq!((cs[0].user_data, cs[1].user_data), (10, 11));
        expect(4096, &bufs[1]);

        // A completion fd in use does not matter; a sigmask (interruptible wait) does.
        // SAFETY: an empty, initialised signal set.
        let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer.
        unsafe { libc::sigemptyset(&mut mask) };
        let mut q = queue(&d, true);
        // SAFETY: as above.
        unsafe { q.enqueue(read_req(&mut bufs[0], 0, 1)) };
        assert_eq!(q.do_io(&mut cs, 1, None, Some(&mask)).unwrap(), 1);
        assert!(ring_used(&q));

        // An expired timeout: never inline (the caller must not block), so the request goes to
        // the ring. The kernel may finish it within the submitting enter (io-wq is fast on
        // tmpfs), so either it is reaped at once, or ETIME keeps it outstanding and the next
        // call reaps it; both end with the right completion.
        let mut q = queue(&d, true);
        // SAFETY: as above.
        unsafe { q.enqueue(read_req(&mut bufs[0], 0, 2)) };
        let mut t = Duration::ZERO;
        match q.do_io(&mut cs, 1, Some(&mut t), None) {
            Ok(n) => assert_eq!(n, 1),
            Err(e) => {
                assert_eq!(e.errno, libc::ETIME);
                assert_eq!(q.outstanding(), 1);
                assert_eq!(q.do_io(&mut cs, 1, None, None).unwrap(), 1);
            }
        }
        assert!(ring_used(&q));
        assert_eq!(t, Duration::ZERO);
        assert_eq!((cs[0].user_data, cs[0].ret), (2, 0));
        expect(0, &bufs[0]);

        // A non-zero timeout: inline, and the time left is written back.
        let mut q = queue(&d, true);
        // SAFETY: as above.
        unsafe { q.enqueue(read_req(&mut bufs[0], 0, 3)) };
        let mut t = Duration::from_secs(5);
        assert_eq!(q.do_io(&mut cs, 1, Some(&mut t), None).unwrap(), 1);
        assert!(!ring_used(&q));
        assert!(t <= Duration::from_secs(5) && t > Duration::from_secs(1));
    }

    #[test]
    fn request_in_the_kernel_keeps_later_ones_on_the_ring() {
        let shm = TmpFile::new("/dev/shm", "inflight", 1 << 16);
        let d = driver(&shm, false);
        let mut q = queue(&d, true);
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        // SAFETY: the buffers outlive the requests, reaped below.
        unsafe { q.enqueue(read_req(&mut a, 0, 1)) };
        let mut cs = [Completion::default(); 2];
        // Submit only: the request goes to the kernel; let its CQE arrive.
        assert_eq!(q.do_io(&mut cs, 0, None, None).unwrap(), 0);
        assert_eq!(q.eng.in_kernel, 1);
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: as above.
        unsafe { q.enqueue(read_req(&mut b, 8192, 2)) };
        // Not held back: something is in the kernel, so it goes straight to the SQ.
        assert_eq!(q.eng.in_kernel, 2);
        let mut got = 0;
        while got < 2 {
            got += q.do_io(&mut cs[got..], 2 - got, None, None).unwrap();
        }
        assert_eq!((cs[0].user_data, cs[1].user_data), (1, 2));
        expect(0, &a);
        expect(8192, &b);
        // Idle again: the next QD1 request runs inline (the ring stays as it is).
        let before = q.eng.owner;
        q.read_at(4096, &mut a).unwrap();
        expect(4096, &a);
        assert_eq!(q.eng.owner, before);
        assert_eq!(q.eng.in_kernel, 0);
    }

    fn read_eventfd(fd: RawFd) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        (n == 8).then_some(v)
    }

    #[test]
    fn inline_completions_signal_the_completion_fd_like_the_ring() {
        let shm = TmpFile::new("/dev/shm", "efd", 1 << 16);
        let d = driver(&shm, false);
        let mut counts = Vec::new();
        for inline in [true, false] {
            let mut q = queue(&d, inline);
            let mut buf = vec![0u8; 4096];
            // Not handed out yet: silent on both paths.
            q.read_at(0, &mut buf).unwrap();
            let fd = q.completion_fd().unwrap();
            assert_eq!(read_eventfd(fd), None, "inline={inline}: silent before");
            q.read_at(0, &mut buf).unwrap();
            counts.push(read_eventfd(fd));
            q.set_completion_fd_enabled(false);
            q.read_at(0, &mut buf).unwrap();
            assert_eq!(read_eventfd(fd), None, "inline={inline}: disabled");
            q.set_completion_fd_enabled(true);
            assert_eq!(ring_used(&q), !inline);
        }
        assert_eq!(counts, [Some(1), Some(1)]);
    }

    #[test]
    fn poll_queues_never_run_inline() {
        let shm = TmpFile::new("/dev/shm", "poll", 4096);
        let mut d = driver(&shm, false);
        assert!(d.inline_for(false));
        assert!(!d.inline_for(true));
        d.inline_qd1 = false;
        assert!(!d.inline_for(false));
    }
}
