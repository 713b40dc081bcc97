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
//!
//! Layout: this file holds the driver (properties, probes, connect); `queue.rs` the `Queue`
//! (enqueue checks, completion fd) around the engine (`engine.rs`: requests to SQEs and CQEs
//! back to completions, or run inline), which keeps requests in a slot table (`slots.rs`), finds
//! registered memory through a fixed-buffer cache (`bufs.rs`) and owns its ring (`ring.rs`).

pub(crate) mod bufs;
mod engine;
mod queue;
pub(crate) mod ring;
mod slots;
#[cfg(test)]
mod tests;

use crate::file::{FILE_PROPS, FileConfig, Target, connected};
use bufs::Buffers;
use io_uring::{IoUring, opcode, squeue, types};
use queue::UringQueue;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, MemRegion, PropSpec, PropType, PropValue, Queue, Result,
    State,
};
use std::sync::Arc;

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
    /// A driver in the created state (`num-entries` 128, `inline-qd1` on); set `path` (or `fd`)
    /// before connect. Hand it to [`snapblk_core::Blkio::new`].
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
    // SAFETY: `buf` stays alive until the read's completion is reaped below; when it cannot be
    // reaped, `buf` is leaked, never freed (see there).
    if unsafe { ring.submission().push(&sqe) }.is_err() {
        drop(ring);
        // SAFETY: nothing was submitted: nothing references the buffer.
        unsafe { buf.free() };
        return false;
    }
    let ok = loop {
        if let Some(c) = ring.completion().next() {
            break c.result() >= 0;
        }
        match ring.submit_and_wait(1) {
            // A signal: io_uring_enter reports EINTR only when this call submitted nothing, so
            // calling again submits what is still pending (nothing twice) and waits on.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(_) => {
                // The read may be in flight, and closing an IOPOLL ring does not wait for it
                // (the kernel reaps it later, from a workqueue): leak the page rather than let
                // a late read land in freed memory. A connect-time error path only.
                drop(ring);
                let _leaked = buf; // not freed: MemRegion frees only through free()
                return false;
            }
            Ok(_) => {}
        }
    };
    drop(ring);
    // SAFETY: the read's completion was reaped: nothing references the buffer any more.
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
