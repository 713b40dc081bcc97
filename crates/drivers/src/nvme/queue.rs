//! A queue: one io_uring with 128-byte SQEs and 32-byte CQEs, the namespace registered as
//! fixed file 0, requests turned into NVMe commands (`IORING_OP_URING_CMD` with
//! `NVME_URING_CMD_IO`/`_IO_VEC`) and completions back into libblkio completions.

use super::Ns;
use super::sys::{Cmd, NVME_URING_CMD_IO, NVME_URING_CMD_IO_VEC};
use super::zns;
use crate::uring::bufs::{BUF_SLOTS, Buffers, FixedBufCache};
use crate::uring::ring::Canary;
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use snapblk_core::{
    Completion, Engine, Error, MemRegion, Op, Queue, QueueCore, ReqFlags, Request, Result, ZoneOp,
};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// NVM command set opcodes.
const OP_FLUSH: u8 = 0x00;
const OP_WRITE: u8 = 0x01;
const OP_READ: u8 = 0x02;
const OP_WRITE_ZEROES: u8 = 0x08;
const OP_DSM: u8 = 0x09;
/// CDW12 bits of read/write/write-zeroes.
const CDW12_FUA: u32 = 1 << 30;
const CDW12_DEAC: u32 = 1 << 25;
/// DSM CDW11: Attribute – Deallocate.
const DSM_AD: u32 = 1 << 2;

type Ring = IoUring<squeue::Entry128, cqueue::Entry32>;

/// A request between enqueue and completion; `buf` is the library's own data buffer of the
/// command (the DSM range of a discard, the Report Zones data of a zone report), boxed so its
/// address is stable while the command is in flight.
struct Pending {
    req: Request,
    buf: Option<Box<[u8]>>,
}

pub(super) struct NvmeEngine {
    ring: Ring,
    /// Says when the kernel has freed `ring` and every command with it (see [`Canary`]);
    /// declared after `ring` and before `slots` (the boxed DSM ranges), so dropped between.
    canary: Option<Canary>,
    ns: Arc<Ns>,
    /// The mapped memory regions, registered as fixed buffers of the ring (io_uring driver's
    /// table, shared by every queue of the device).
    bufs: FixedBufCache,
    slots: Vec<Option<Pending>>,
    free: Vec<u32>,
    /// Slots not yet in the SQ (SQ full, or the CQ would overflow).
    waiting: VecDeque<u32>,
    /// Slots pushed to the SQ whose CQE is not reaped yet.
    in_kernel: usize,
    cq_cap: usize,
    poll: bool,
}

/// The status of an NVMe completion as a message (NVMe base spec §4.2.3, ZNS spec §4.1.1.2).
fn status_msg(status: i32) -> &'static CStr {
    let sct = (status >> 8) & 7;
    let sc = status & 0xff;
    match (sct, sc) {
        (0, 0x80) => c"NVMe error: LBA out of range",
        (0, 0x02) => c"NVMe error: invalid field in command",
        (0, 0x0b) => c"NVMe error: invalid namespace or format",
        (1, 0xb8) => c"NVMe error: zone boundary error",
        (1, 0xb9) => c"NVMe error: zone is full",
        (1, 0xba) => c"NVMe error: zone is read only",
        (1, 0xbb) => c"NVMe error: zone is offline",
        (1, 0xbc) => c"NVMe error: zone invalid write (not at the write pointer)",
        (1, 0xbd) => c"NVMe error: too many active zones",
        (1, 0xbe) => c"NVMe error: too many open zones",
        (1, 0xbf) => c"NVMe error: invalid zone state transition",
        (2, _) => c"NVMe error: media or data integrity error",
        _ => c"NVMe error",
    }
}

impl NvmeEngine {
    fn alloc(&mut self, p: Pending) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(p);
                i
            }
            None => {
                self.slots.push(Some(p));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// The command of slot `i`.
    fn sqe(&mut self, i: u32) -> squeue::Entry128 {
        let ns = &self.ns;
        let mut c = Cmd {
            nsid: ns.nsid,
            ..Cmd::default()
        };
        let mut op = NVME_URING_CMD_IO;
        let mut fixed = None;
        // A no-op for a slot without a request: its completion is then dropped by `reap`.
        let nop = || squeue::Entry128::from(opcode::Nop::new().build()).user_data(u64::from(i));
        let Some(p) = self.slots.get_mut(i as usize).and_then(Option::as_mut) else {
            return nop();
        };
        let fua = if p.req.flags.contains(ReqFlags::FUA) {
            CDW12_FUA
        } else {
            0
        };
        let lba = |c: &mut Cmd, offset: u64, len: u64| {
            let slba = offset >> ns.lba_shift;
            c.cdw10 = slba as u32;
            c.cdw11 = (slba >> 32) as u32;
            // NLB is 0-based; lengths were checked against the 16-bit limit at enqueue.
            c.cdw12 = ((len >> ns.lba_shift).saturating_sub(1)) as u32 & 0xffff;
        };
        match p.req.op {
            Op::Read { offset, buf, len } => {
                fixed = self.bufs.index(buf as usize, len);
                c.opcode = OP_READ;
                c.addr = buf as u64;
                c.data_len = len as u32;
                lba(&mut c, offset, len as u64);
            }
            Op::Write { offset, buf, len } => {
                fixed = self.bufs.index(buf as usize, len);
                c.opcode = OP_WRITE;
                c.addr = buf as u64;
                c.data_len = len as u32;
                lba(&mut c, offset, len as u64);
                c.cdw12 |= fua;
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
                op = NVME_URING_CMD_IO_VEC;
                c.opcode = if matches!(p.req.op, Op::Writev { .. }) {
                    OP_WRITE
                } else {
                    OP_READ
                };
                c.addr = iov as u64;
                c.data_len = iovcnt as u32;
                // SAFETY: the enqueue caller keeps `iov` valid until completion (checked
                // non-negative at enqueue).
                let len = unsafe { p.req.data_len() };
                lba(&mut c, offset, len);
                c.cdw12 |= fua;
            }
            Op::Flush => c.opcode = OP_FLUSH,
            Op::WriteZeroes { offset, len } => {
                c.opcode = OP_WRITE_ZEROES;
                lba(&mut c, offset, len);
                c.cdw12 |= fua;
                if !p.req.flags.contains(ReqFlags::NO_UNMAP) {
                    c.cdw12 |= CDW12_DEAC;
                }
            }
            Op::Discard { .. } => {
                c.opcode = OP_DSM;
                c.addr = p.buf.as_ref().map_or(0, |r| r.as_ptr() as u64);
                c.data_len = 16;
                c.cdw10 = 0; // one range (0-based)
                c.cdw11 = DSM_AD;
            }
            Op::Zone(ZoneOp::Report { offset, .. }) => {
                let Some(b) = p.buf.as_mut() else {
                    return nop();
                };
                zns::report(&mut c, offset >> ns.lba_shift, b);
            }
            Op::Zone(ZoneOp::Manage { action, offset }) => {
                zns::send(&mut c, action, offset.map(|o| o >> ns.lba_shift));
            }
        }
        // A fixed buffer: the kernel takes `addr` inside the registered buffer, with no page
        // pinning per command.
        opcode::UringCmd80::new(types::Fixed(0), op)
            .cmd(c.to_sqe_bytes())
            .buf_index(fixed)
            .build()
            .user_data(u64::from(i))
    }

    /// Move waiting slots to the SQ while it and the CQ have room.
    fn fill_sq(&mut self) {
        while self.in_kernel < self.cq_cap {
            let Some(&i) = self.waiting.front() else {
                break;
            };
            let e = self.sqe(i);
            // SAFETY: the buffers the command points at (the caller's, or the slot's boxed DSM
            // range) stay valid until its completion is reaped, or, for a queue dropped with
            // commands in flight, until the canary says the kernel has freed the ring
            // (`NvmeQueue::drop`; the slots are dropped after the canary).
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                break;
            }
            self.waiting.pop_front();
            self.in_kernel += 1;
        }
    }

    fn enter(
        &mut self,
        want: u32,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> std::result::Result<usize, i32> {
        let to_submit = self.ring.submission().len() as u32;
        let getevents = want > 0 || self.poll;
        crate::uring::ring::enter(
            &self.ring.submitter(),
            to_submit,
            want,
            getevents,
            timeout,
            sigmask,
        )
    }
}

impl NvmeEngine {
    /// For a successful zone report: its descriptors turned into the caller's array, and the
    /// number filled.
    fn report_done(&self, p: &Pending) -> Option<i32> {
        let Op::Zone(ZoneOp::Report {
            zones, nr_zones, ..
        }) = p.req.op
        else {
            return None;
        };
        let (b, z) = (p.buf.as_deref()?, self.ns.zones?);
        if zones.is_null() {
            return None;
        }
        // SAFETY: the enqueue caller keeps `zones` writable for `nr_zones` entries until this
        // completion (libblkio API); checked non-null.
        let out = unsafe { std::slice::from_raw_parts_mut(zones, nr_zones as usize) };
        let k = zns::translate(b, self.ns.lba_shift, z.zone_size, out);
        Some(i32::try_from(k).unwrap_or(i32::MAX))
    }
}

impl Engine for NvmeEngine {
    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<()> {
        self.fill_sq();
        // Never wait for more than the kernel holds: the rest is still waiting for room.
        let want = wait.min(self.in_kernel) as u32;
        match self.enter(want, timeout, sigmask) {
            Ok(_) => Ok(()),
            // The CQ is full: reaping makes room, the caller comes back.
            Err(libc::EBUSY) | Err(libc::EAGAIN) => Ok(()),
            Err(e) => Err(Error::from_errno(e)),
        }
    }
    fn reap(&mut self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            self.in_kernel = self.in_kernel.saturating_sub(1);
            let i = cqe.user_data() as u32;
            let Some(p) = self.slots.get_mut(i as usize).and_then(Option::take) else {
                continue;
            };
            self.free.push(i);
            let ud = p.req.user_data;
            let res = cqe.result();
            out[n] = match res {
                0 => match self.report_done(&p) {
                    // As libblkio: a report's `ret` is the number of zones it filled.
                    Some(k) => Completion::count(ud, k),
                    None => Completion::ok(ud),
                },
                r if r < 0 => Completion::os_err(ud, -r),
                s => Completion::err(ud, libc::EIO, status_msg(s)),
            };
            n += 1;
        }
        if n > 0 {
            self.fill_sq();
        }
        n
    }
}

/// Does a polled (`IORING_SETUP_IOPOLL`) passthrough read of block 0 work? Kernels whose
/// namespace device has no `uring_cmd_iopoll` refuse it; where the controller has no poll
/// queue (`nvme.poll_queues=0`) the command completes by interrupt and is reaped by the same
/// loop, so a poll queue still works, just without the benefit.
pub(super) fn probe_poll(ns: &Ns) -> bool {
    probe_read(ns, true, false) == Some(0)
}

/// May commands use fixed buffers (`IORING_URING_CMD_FIXED`, Linux 6.1)? Linux 5.19 and 6.0
/// have passthrough but refuse the flag with EINVAL; a fixed-buffer read of block 0 tells.
/// Anything but EINVAL (a ring or buffer that cannot be set up included) leaves them on:
/// a queue that cannot register its buffers does without them anyway.
pub(super) fn probe_fixed(ns: &Ns) -> bool {
    probe_read(ns, false, true) != Some(-libc::EINVAL)
}

/// The result of one passthrough read of block 0 on a new ring (`iopoll`: polled), into a
/// buffer registered as fixed buffer 0 if `fixed`; `None` if it could not be issued.
fn probe_read(ns: &Ns, iopoll: bool, fixed: bool) -> Option<i32> {
    let len = (1usize << ns.lba_shift).max(4096);
    let mut b = Ring::builder();
    if iopoll {
        b.setup_iopoll();
    }
    let mut ring = b.build(2).ok()?;
    let buf = MemRegion::alloc(len).ok()?;
    let iov = libc::iovec {
        iov_base: buf.addr.cast(),
        iov_len: len,
    };
    // SAFETY: the buffer stays alive while registered: the ring is dropped before it is freed.
    if fixed && unsafe { ring.submitter().register_buffers(&[iov]) }.is_err() {
        drop(ring);
        // SAFETY: nothing was submitted: nothing references the buffer.
        unsafe { buf.free() };
        return None;
    }
    let c = Cmd {
        opcode: OP_READ,
        nsid: ns.nsid,
        addr: buf.addr as u64,
        data_len: 1 << ns.lba_shift,
        ..Cmd::default()
    };
    let sqe = opcode::UringCmd80::new(types::Fd(ns.fd.as_raw_fd()), NVME_URING_CMD_IO)
        .cmd(c.to_sqe_bytes())
        .buf_index(fixed.then_some(0))
        .build();
    // SAFETY: `buf` stays alive until the read's completion is reaped below; when it cannot
    // be, `buf` is leaked, never freed.
    if unsafe { ring.submission().push(&sqe) }.is_err() {
        drop(ring);
        // SAFETY: nothing was submitted: nothing references the buffer.
        unsafe { buf.free() };
        return None;
    }
    let res = loop {
        if let Some(c) = ring.completion().next() {
            break c.result();
        }
        match ring.submit_and_wait(1) {
            // EINTR comes only when nothing was submitted by this call: call again.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(_) => {
                // The read may still be in flight: leak the buffer rather than free it under
                // the device. A connect-time error path only.
                drop(ring);
                let _leaked = buf;
                return None;
            }
            Ok(_) => {}
        }
    };
    drop(ring);
    // SAFETY: the read's completion was reaped: nothing references the buffer any more.
    unsafe { buf.free() };
    Some(res)
}

/// A queue of the `nvme-io_uring` driver.
pub(super) struct NvmeQueue {
    core: QueueCore,
    eng: NvmeEngine,
}

impl NvmeQueue {
    pub(super) fn new(
        ns: Arc<Ns>,
        bufs: Arc<Buffers>,
        entries: u32,
        poll: bool,
    ) -> Result<NvmeQueue> {
        let core = QueueCore::new(poll)?;
        let mut b = Ring::builder();
        if poll {
            b.setup_iopoll();
        }
        let ring = b.build(entries).map_err(Error::from_io)?;
        let sub = ring.submitter();
        // The namespace as fixed file 0, a canary as fixed file 1.
        let (registered, canary) = Canary::register(&sub, ns.fd.as_raw_fd());
        if !registered {
            return Err(Error::new(
                libc::ENOMEM,
                "could not register the namespace with the ring",
            ));
        }
        if let Some(e) = core.eventfd() {
            sub.register_eventfd(e.raw()).map_err(Error::from_io)?;
        }
        // Fixed buffers: a sparse table holding the regions mapped so far, then following
        // map/unmap; a ring that cannot hold them all (RLIMIT_MEMLOCK) uses none.
        let fixed = ns.fixed_bufs
            && sub.register_buffers_sparse(BUF_SLOTS).is_ok()
            && bufs.attach(ring.as_raw_fd());
        let cq_cap = ring.params().cq_entries() as usize;
        Ok(NvmeQueue {
            core,
            eng: NvmeEngine {
                ring,
                canary,
                ns,
                bufs: FixedBufCache::new(bufs, fixed),
                slots: Vec::new(),
                free: Vec::new(),
                waiting: VecDeque::new(),
                in_kernel: 0,
                cq_cap,
                poll,
            },
        })
    }

    /// The library-side checks of a request (libblkio's messages where it has them); `Err`
    /// is the completion to return at once, `Ok(None)` a request completed without the device.
    fn check(&self, req: &Request) -> std::result::Result<Option<Box<[u8]>>, Completion> {
        let ud = req.user_data;
        let inval = |m: &'static CStr| Err(Completion::err(ud, libc::EINVAL, m));
        if let Err(m) = req.validate() {
            return inval(m);
        }
        let ns = &self.eng.ns;
        let writes = matches!(
            req.op,
            Op::Write { .. }
                | Op::Writev { .. }
                | Op::WriteZeroes { .. }
                | Op::Discard { .. }
                | Op::Zone(ZoneOp::Manage { .. })
        );
        if writes && ns.read_only {
            return Err(Completion::err(
                ud,
                libc::EBADF,
                c"driver is in read-only mode",
            ));
        }
        let (offset, len, max) = match req.op {
            Op::Zone(z) => return self.check_zone(ud, z),
            Op::Flush => return Ok(None),
            Op::Read { offset, len, .. } | Op::Write { offset, len, .. } => {
                (offset, len as u64, ns.max_transfer)
            }
            Op::Readv { offset, iovcnt, .. } | Op::Writev { offset, iovcnt, .. } => {
                if iovcnt > ns.max_segments {
                    return inval(c"iovcnt must not exceed property \"max-segments\"");
                }
                // SAFETY: the enqueue caller guarantees `iov` points to `iovcnt` iovecs.
                (offset, unsafe { req.data_len() }, ns.max_transfer)
            }
            Op::WriteZeroes { offset, len } => {
                if !ns.write_zeroes {
                    return Err(Completion::err(
                        ud,
                        libc::ENOTSUP,
                        c"the controller does not support Write Zeroes",
                    ));
                }
                (offset, len, ns.max_write_zeroes)
            }
            Op::Discard { offset, len } => {
                if !ns.dsm {
                    return Err(Completion::err(
                        ud,
                        libc::ENOTSUP,
                        c"the controller does not support Dataset Management (discard)",
                    ));
                }
                (offset, len, ns.max_discard)
            }
        };
        let mask = (1u64 << ns.lba_shift) - 1;
        if offset & mask != 0 || len & mask != 0 {
            return inval(c"start and len must be multiples of property \"request-alignment\"");
        }
        if len == 0 {
            return inval(c"len must be positive");
        }
        if len > max {
            return inval(match req.op {
                Op::WriteZeroes { .. } => c"len must not exceed property \"max-write-zeroes-len\"",
                Op::Discard { .. } => c"len must not exceed property \"max-discard-len\"",
                _ => c"len must not exceed property \"max-transfer\"",
            });
        }
        if let Op::Discard { offset, len } = req.op {
            // struct nvme_dsm_range: context attributes, length in blocks, starting LBA.
            let mut r: Box<[u8]> = Box::new([0u8; 16]);
            r[4..8].copy_from_slice(&((len >> ns.lba_shift) as u32).to_le_bytes());
            r[8..16].copy_from_slice(&(offset >> ns.lba_shift).to_le_bytes());
            return Ok(Some(r));
        }
        Ok(None)
    }
}

impl NvmeQueue {
    /// The checks of a zone request; `Ok` holds the report's data buffer.
    fn check_zone(
        &self,
        ud: usize,
        z: ZoneOp,
    ) -> std::result::Result<Option<Box<[u8]>>, Completion> {
        let ns = &self.eng.ns;
        let Some(zones) = ns.zones else {
            // libblkio: EOPNOTSUPP on a conventional namespace.
            return Err(Completion::err(
                ud,
                libc::EOPNOTSUPP,
                c"Operation not supported",
            ));
        };
        let inval = |m: &'static CStr| Err(Completion::err(ud, libc::EINVAL, m));
        let end = zones.nr_zones.saturating_mul(zones.zone_size);
        match z {
            ZoneOp::Report {
                offset,
                zones: arr,
                nr_zones,
            } => {
                if offset >= end {
                    return inval(c"offset must be less than the device capacity");
                }
                if nr_zones == 0 {
                    return Err(Completion::ok(ud));
                }
                if arr.is_null() {
                    return inval(c"zones must be non-NULL");
                }
                let len = zns::report_len(nr_zones, ns.max_transfer);
                Ok(Some(vec![0u8; len].into_boxed_slice()))
            }
            ZoneOp::Manage { offset: None, .. } => Ok(None),
            ZoneOp::Manage {
                offset: Some(o), ..
            } => {
                if o % zones.zone_size != 0 {
                    // libblkio's errno (from the device's Invalid Field status).
                    return Err(Completion::err(
                        ud,
                        libc::EOPNOTSUPP,
                        c"offset must be the start of a zone",
                    ));
                }
                if o >= end {
                    return inval(c"offset must be less than the device capacity");
                }
                Ok(None)
            }
        }
    }
}

impl Drop for NvmeQueue {
    fn drop(&mut self) {
        self.eng.bufs.shared().detach(self.eng.ring.as_raw_fd());
        // Commands still in the kernel may reference caller buffers: wait for them.
        let sq = self.eng.ring.submission().len();
        self.eng.in_kernel = self.eng.in_kernel.saturating_sub(sq);
        let mut idle = 0;
        // Without a canary nothing else can tell when the commands are finished: wait for all.
        while self.eng.in_kernel > 0 && (idle < 30 || self.eng.canary.is_none()) {
            let _ = self.eng.enter(1, Some(Duration::from_secs(1)), None);
            let mut n = 0;
            while self.eng.ring.completion().next().is_some() {
                n += 1;
            }
            idle = if n == 0 { idle + 1 } else { 0 };
            self.eng.in_kernel = self.eng.in_kernel.saturating_sub(n);
        }
        // Commands silent for 30 s: passthrough commands cannot be cancelled, so closing the
        // ring leaves them to finish on their own, still writing into caller buffers and the
        // boxed DSM ranges. The canary, dropped after the ring, waits until the kernel has
        // freed the ring and so every command with it.
        if self.eng.in_kernel > 0
            && let Some(c) = &mut self.eng.canary
        {
            c.wait = true;
        }
    }
}

impl Queue for NvmeQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let buf = match self.check(&req) {
            Ok(r) => r,
            Err(c) => return self.core.complete(c),
        };
        if matches!(req.op, Op::Flush) && !self.eng.ns.flush_needed {
            // No volatile write cache: every completed write is durable already.
            return self.core.complete(Completion::ok(req.user_data));
        }
        let i = self.eng.alloc(Pending { req, buf });
        self.eng.waiting.push_back(i);
        if self.eng.waiting.len() == 1 {
            self.eng.fill_sq();
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
        if enabled {
            self.eng.ring.completion().enable_eventfd();
        } else {
            self.eng.ring.completion().disable_eventfd();
        }
    }
    fn is_poll(&self) -> bool {
        self.core.is_poll()
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::status_msg;
    use super::{NvmeQueue, Pending};
    use crate::uring::bufs::Buffers;
    use snapblk_core::{MemRegion, Op, ReqFlags, Request};
    use std::os::fd::OwnedFd;
    use std::sync::Arc;

    /// A queue on /dev/null (registration needs an fd, not a device) for a namespace of
    /// 512-byte blocks, the region `reg` mapped (a fixed buffer).
    fn queue(reg: &MemRegion) -> NvmeQueue {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let ns = super::Ns {
            fd,
            nsid: 7,
            lba_shift: 9,
            read_only: false,
            max_transfer: 1 << 19,
            max_write_zeroes: 1 << 25,
            max_discard: 1 << 40,
            max_segments: 1024,
            flush_needed: true,
            write_zeroes: true,
            dsm: true,
            zones: None,
            fixed_bufs: true,
        };
        let bufs = Arc::new(Buffers::default());
        assert!(bufs.register(reg.addr as usize, reg.len));
        NvmeQueue::new(Arc::new(ns), bufs, 8, false).unwrap()
    }

    /// The 128 bytes of the SQE `sqe()` builds for `req` (the command is at 48..128).
    fn sqe_bytes(q: &mut NvmeQueue, req: Request) -> [u8; 128] {
        let buf = q.check(&req).unwrap();
        let i = q.eng.alloc(Pending { req, buf });
        let e = q.eng.sqe(i);
        assert_eq!(size_of::<io_uring::squeue::Entry128>(), 128);
        // SAFETY: `Entry128` is the kernel's 128-byte SQE, `repr(C)` plain data (size checked).
        unsafe { std::mem::transmute::<io_uring::squeue::Entry128, [u8; 128]>(e) }
    }
    fn u16_at(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
    }
    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }
    /// SQE: opcode 0, flags 1, cmd_op 8, uring_cmd_flags 28, buf_index 40, command 48.
    const IORING_OP_URING_CMD: u8 = 46;
    const IOSQE_FIXED_FILE: u8 = 1;
    const IORING_URING_CMD_FIXED: u32 = 1;
    const CMD: usize = 48;

    #[test]
    fn sqe_carries_the_nvme_command() {
        let reg = MemRegion::alloc(1 << 16).unwrap();
        let mut q = queue(&reg);
        let mut plain = vec![0u8; 4096];
        // A read above LBA 2^32, outside any mapped region: a plain buffer.
        let slba = (1u64 << 32) | 5;
        let op = Op::Read {
            offset: slba << 9,
            buf: plain.as_mut_ptr(),
            len: 4096,
        };
        let b = sqe_bytes(&mut q, Request::new(op, 1, ReqFlags::NONE));
        assert_eq!(b[0], IORING_OP_URING_CMD);
        assert_eq!(b[1] & IOSQE_FIXED_FILE, IOSQE_FIXED_FILE);
        assert_eq!(u32_at(&b, 4), 0, "fixed file 0: the namespace");
        assert_eq!(u32_at(&b, 8), super::NVME_URING_CMD_IO);
        assert_eq!(u32_at(&b, 28) & IORING_URING_CMD_FIXED, 0);
        assert_eq!(b[CMD], 0x02);
        assert_eq!(u32_at(&b, CMD + 4), 7);
        assert_eq!(u64_at(&b, CMD + 24), plain.as_ptr() as u64);
        assert_eq!(u32_at(&b, CMD + 36), 4096);
        assert_eq!(u32_at(&b, CMD + 40), 5, "SLBA low");
        assert_eq!(u32_at(&b, CMD + 44), 1, "SLBA high");
        assert_eq!(u32_at(&b, CMD + 48), 7, "NLB 0-based");
        // A FUA write from the mapped region: a fixed buffer.
        let op = Op::Write {
            offset: 4096,
            buf: reg.addr.wrapping_add(8192),
            len: 8192,
        };
        let b = sqe_bytes(&mut q, Request::new(op, 2, ReqFlags::FUA));
        assert_eq!(b[CMD], 0x01);
        assert_eq!(
            u32_at(&b, 28) & IORING_URING_CMD_FIXED,
            IORING_URING_CMD_FIXED
        );
        assert_eq!(u16_at(&b, 40), 0, "the region's slot");
        assert_eq!(u64_at(&b, CMD + 24), reg.addr as u64 + 8192);
        assert_eq!(u32_at(&b, CMD + 40), 8);
        assert_eq!(u32_at(&b, CMD + 48), (1 << 30) | 15, "FUA, NLB 15");
        // Write zeroes deallocates (DEAC, bit 25) unless NO_UNMAP.
        let op = Op::WriteZeroes {
            offset: 1 << 20,
            len: 1 << 16,
        };
        let b = sqe_bytes(&mut q, Request::new(op, 3, ReqFlags::NONE));
        assert_eq!(b[CMD], 0x08);
        assert_eq!(u32_at(&b, CMD + 40), 2048);
        assert_eq!(u32_at(&b, CMD + 48), (1 << 25) | 127);
        let b = sqe_bytes(&mut q, Request::new(op, 4, ReqFlags::NO_UNMAP));
        assert_eq!(u32_at(&b, CMD + 48), 127);
        // Discard: Dataset Management, one range with the deallocate attribute.
        let op = Op::Discard {
            offset: (1u64 << 33) + 512,
            len: 3 << 9,
        };
        let b = sqe_bytes(&mut q, Request::new(op, 5, ReqFlags::NONE));
        assert_eq!(b[CMD], 0x09);
        assert_eq!(u32_at(&b, CMD + 36), 16);
        assert_eq!(u32_at(&b, CMD + 40), 0, "one range");
        assert_eq!(u32_at(&b, CMD + 44), 1 << 2, "AD");
        let range = u64_at(&b, CMD + 24) as *const [u8; 16];
        // SAFETY: the range is the slot's boxed DSM range, alive until the slot is freed.
        let range = unsafe { *range };
        assert_eq!(u32_at(&range, 0), 0, "context attributes");
        assert_eq!(u32_at(&range, 4), 3, "length in blocks");
        assert_eq!(u64_at(&range, 8), (1u64 << 24) + 1, "starting LBA");
        drop(q);
        // SAFETY: no command was submitted: nothing references the region.
        unsafe { reg.free() };
    }

    #[test]
    fn nvme_statuses_are_named() {
        // Status field as the kernel returns it: SC in bits 7:0, SCT in bits 10:8, DNR etc. above.
        assert_eq!(status_msg(0x80), c"NVMe error: LBA out of range");
        assert_eq!(
            status_msg(0x4000 | (1 << 8) | 0xbc),
            c"NVMe error: zone invalid write (not at the write pointer)"
        );
        assert_eq!(status_msg((1 << 8) | 0xb9), c"NVMe error: zone is full");
        assert_eq!(
            status_msg((2 << 8) | 0x81),
            c"NVMe error: media or data integrity error"
        );
        assert_eq!(status_msg(0x1ff), c"NVMe error");
    }
}
