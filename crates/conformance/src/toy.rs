//! `toy-mem`: an in-memory driver that *requires* memory regions, as the virtio-blk drivers do
//! (`needs-mem-regions = true`, `needs-mem-region-fd = true`), used only to test the suite.
//!
//! It is not registered in the `snapblk` facade nor in `libblkio.so`. Its rules follow what
//! libblkio's virtio-blk layer gives (shared notes on libblkio drivers, §1.2 and §1.3), with the
//! improvement those notes recommend for buffers:
//! * a start offset or length that is not a multiple of 512 (`request-alignment`) fails with
//!   EINVAL (`invalid start offset`; libblkio passes a bad length to the device, which fails it
//!   with EIO: here it is refused up front);
//! * a buffer (or iovec) outside every mapped memory region fails with EFAULT at once, where
//!   libblkio's vhost-user driver hands it to the backend, which stops serving the device;
//! * mapping a region without a file descriptor fails with EIO `Bad file descriptor (os error
//!   9)`, as vhost-user's does;
//! * writes, write-zeroes and discards on a read-only instance fail with EBADF `device is
//!   read-only`; a range past the capacity fails with EIO;
//! * at most `max-segments` (8) iovecs and `max-queues` (2) queues; queues cannot be added.
//!
//! A [`Flaw`] turns it into a broken driver, for tests that prove the suite can fail.

use snapblk_core::sync::lock;
use snapblk_core::{
    Access, Completion, DeviceInfo, Driver, Engine, Error, MemRegion, Op, PropSpec, PropType,
    PropValue, Queue, QueueCore, Request, Result, State,
};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The driver's name.
pub const NAME: &str = "toy-mem";
/// `request-alignment` (and the unit of `size`).
pub const ALIGN: u64 = 512;
/// `max-segments`.
pub const MAX_SEGMENTS: i32 = 8;
/// `max-queues`.
pub const MAX_QUEUES: i32 = 2;
/// `max-write-zeroes-len` and `max-discard-len`.
pub const MAX_ZEROES: u64 = 1 << 20;
/// The default `size`: 4 MiB.
pub const DEFAULT_SIZE: u64 = 4 << 20;

const PROPS: &[PropSpec] = &[PropSpec::new(
    "size",
    PropType::U64,
    Access::RwCreated,
    false,
)];

/// A deliberate bug, so that tests can show the suite catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// A correct driver.
    None,
    /// Every read and write goes to offset 0.
    IgnoresOffset,
    /// Buffers outside the mapped regions are used as if they were inside.
    AcceptsUnmappedBuffers,
    /// Unaligned offsets are not refused but rounded down to a sector (the remainder dropped).
    RoundsUnalignedOffsets,
    /// A request with a buffer outside the mapped regions never completes (what libblkio's
    /// vhost-user driver does, with the backend stopping).
    HangsOnUnmappedBuffers,
    /// Every queue reports the completion fd of the first queue created, while its own
    /// completions signal its own (one eventfd handed out for all, completions routed per queue).
    SharesFirstCompletionFd,
}

/// Mapped regions as `(start, end)` addresses.
type Regions = Arc<Mutex<Vec<(usize, usize)>>>;

/// The `toy-mem` driver.
#[derive(Debug)]
pub struct ToyDriver {
    size: u64,
    flaw: Flaw,
    read_only: bool,
    data: Arc<Mutex<Vec<u8>>>,
    regions: Regions,
    /// The first queue's completion fd ([`Flaw::SharesFirstCompletionFd`]).
    first_fd: Option<RawFd>,
}

impl ToyDriver {
    /// A correct driver.
    pub fn new() -> Self {
        Self::with_flaw(Flaw::None)
    }
    /// A driver with `flaw`.
    pub fn with_flaw(flaw: Flaw) -> Self {
        ToyDriver {
            size: DEFAULT_SIZE,
            flaw,
            read_only: false,
            data: Arc::default(),
            regions: Arc::default(),
            first_fd: None,
        }
    }
}

impl Default for ToyDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver for ToyDriver {
    fn name(&self) -> &str {
        NAME
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _: State) -> Result<PropValue> {
        match name {
            "size" => Ok(PropValue::U64(self.size)),
            _ => Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _: State) -> Result<()> {
        match (name, value) {
            ("size", PropValue::U64(v)) if v.is_multiple_of(ALIGN) && v <= 1 << 30 => {
                self.size = v;
                Ok(())
            }
            ("size", _) => Err(Error::inval(
                "size must be a multiple of 512 and at most 1 GiB",
            )),
            _ => Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        self.read_only = read_only;
        *lock(&self.data) = vec![0; self.size as usize];
        Ok(DeviceInfo {
            read_only,
            request_alignment: ALIGN as i32,
            buf_alignment: ALIGN as i32,
            optimal_io_alignment: 4096,
            optimal_buf_alignment: 4096,
            mem_region_alignment: 4096,
            max_transfer: 1 << 20,
            max_segments: MAX_SEGMENTS,
            max_write_zeroes_len: MAX_ZEROES,
            max_discard_len: MAX_ZEROES,
            discard_alignment: ALIGN as i32,
            flush_needed: true,
            max_queues: MAX_QUEUES,
            needs_mem_regions: true,
            needs_mem_region_fd: true,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> Result<u64> {
        Ok(self.size)
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        if poll {
            return Err(Error::inval("Poll queues not supported"));
        }
        let core = QueueCore::new(false)?;
        let first_fd = *self
            .first_fd
            .get_or_insert(core.completion_fd().unwrap_or(-1));
        Ok(Box::new(ToyQueue {
            core,
            reported_fd: (self.flaw == Flaw::SharesFirstCompletionFd).then_some(first_fd),
            eng: ToyEngine {
                data: self.data.clone(),
                flaw: self.flaw,
                pending: VecDeque::new(),
                ready: VecDeque::new(),
                lost: 0,
            },
            regions: self.regions.clone(),
            size: self.size,
            read_only: self.read_only,
            flaw: self.flaw,
        }))
    }
    fn can_add_queues(&self) -> bool {
        false
    }
    fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        if region.fd < 0 {
            return Err(Error::new(libc::EIO, "Bad file descriptor (os error 9)"));
        }
        let start = region.addr as usize;
        lock(&self.regions).push((start, start + region.len));
        Ok(())
    }
    fn unmap_mem_region(&mut self, region: &MemRegion) {
        let start = region.addr as usize;
        lock(&self.regions).retain(|&r| r != (start, start + region.len));
    }
}

struct ToyQueue {
    core: QueueCore,
    /// The fd `completion_fd` reports instead of the core's ([`Flaw::SharesFirstCompletionFd`]).
    reported_fd: Option<RawFd>,
    eng: ToyEngine,
    regions: Regions,
    size: u64,
    read_only: bool,
    flaw: Flaw,
}

impl ToyQueue {
    /// The enqueue-time checks; `Err` is the failed completion's errno and message.
    ///
    /// # Safety
    /// For readv/writev, `iov` must point to `iovcnt` valid iovecs.
    unsafe fn check(&self, req: &Request) -> std::result::Result<(), (i32, &'static CStr)> {
        let (offset, len, bufs): (u64, u64, Vec<(usize, usize)>) = match req.op {
            Op::Read { offset, buf, len } => (offset, len as u64, vec![(buf as usize, len)]),
            Op::Write { offset, buf, len } => (offset, len as u64, vec![(buf as usize, len)]),
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
                if iovcnt > MAX_SEGMENTS {
                    return Err((libc::EINVAL, c"iovcnt exceeds max-segments"));
                }
                let v = if iovcnt <= 0 || iov.is_null() {
                    &[][..]
                } else {
                    // SAFETY: guaranteed by the caller.
                    unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) }
                };
                let bufs = v.iter().map(|i| (i.iov_base as usize, i.iov_len)).collect();
                (offset, v.iter().map(|i| i.iov_len as u64).sum(), bufs)
            }
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len } => {
                if len > MAX_ZEROES {
                    return Err((libc::EINVAL, c"len exceeds max-write-zeroes-len"));
                }
                (offset, len, Vec::new())
            }
            Op::Flush => return Ok(()),
            Op::Zone(_) => {
                return Err((libc::ENOTSUP, c"request not supported for this driver"));
            }
        };
        if !offset.is_multiple_of(ALIGN) && self.flaw != Flaw::RoundsUnalignedOffsets {
            return Err((libc::EINVAL, c"invalid start offset"));
        }
        if !len.is_multiple_of(ALIGN) {
            return Err((libc::EINVAL, c"len must be a multiple of request-alignment"));
        }
        let writes = matches!(
            req.op,
            Op::Write { .. } | Op::Writev { .. } | Op::WriteZeroes { .. } | Op::Discard { .. }
        );
        if self.read_only && writes {
            return Err((libc::EBADF, c"device is read-only"));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err((libc::EIO, c"request beyond the end of the device"));
        }
        if self.flaw != Flaw::AcceptsUnmappedBuffers {
            let regions = lock(&self.regions);
            let inside = |&(b, l): &(usize, usize)| {
                regions
                    .iter()
                    .any(|&(s, e)| b >= s && b.checked_add(l).is_some_and(|end| end <= e))
            };
            if !bufs.iter().all(inside) {
                if self.flaw == Flaw::HangsOnUnmappedBuffers {
                    return Err((0, c"lost"));
                }
                return Err((libc::EFAULT, c"buffer is not inside a mapped memory region"));
            }
        }
        Ok(())
    }
}

impl Queue for ToyQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let ud = req.user_data;
        if let Err(m) = req.validate() {
            return self.core.complete(Completion::err(ud, libc::EINVAL, m));
        }
        // SAFETY: the caller of `enqueue` guarantees the iovec array.
        match unsafe { self.check(&req) } {
            Ok(()) => {}
            // Taken, and never completed.
            Err((0, _)) => {
                self.eng.lost += 1;
                return;
            }
            Err((errno, m)) => return self.core.complete(Completion::err(ud, errno, m)),
        }
        if self.eng.pending.is_empty() {
            self.core.notify();
        }
        self.eng.pending.push_back(req);
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
        self.reported_fd.or_else(|| self.core.completion_fd())
    }
    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.core.set_completion_fd_enabled(enabled)
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight()
    }
}

/// Executes the checked requests in `submit`, as a device would.
struct ToyEngine {
    data: Arc<Mutex<Vec<u8>>>,
    flaw: Flaw,
    pending: VecDeque<Request>,
    ready: VecDeque<Completion>,
    /// Requests taken that will never complete ([`Flaw::HangsOnUnmappedBuffers`]).
    lost: usize,
}

impl ToyEngine {
    /// Where a request's bytes go, after the flaw has had its say.
    fn place(&self, offset: u64) -> usize {
        match self.flaw {
            Flaw::IgnoresOffset => 0,
            Flaw::RoundsUnalignedOffsets => (offset / ALIGN * ALIGN) as usize,
            _ => offset as usize,
        }
    }

    /// Copy between the device and the iovecs of a checked request.
    ///
    /// # Safety
    /// The buffers must be valid (writable for reads) until this returns.
    unsafe fn copy(&self, offset: u64, iov: &[libc::iovec], write: bool) {
        let mut data = lock(&self.data);
        let mut at = self.place(offset);
        for v in iov {
            let dev = &mut data[at..at + v.iov_len];
            if write {
                // SAFETY: per the contract, the buffer is valid for `iov_len` bytes.
                dev.copy_from_slice(unsafe {
                    std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
                });
            } else {
                // SAFETY: as above, and writable.
                unsafe { std::slice::from_raw_parts_mut(v.iov_base as *mut u8, v.iov_len) }
                    .copy_from_slice(dev);
            }
            at += v.iov_len;
        }
    }

    /// Run one request that passed [`ToyQueue::check`].
    ///
    /// # Safety
    /// The request's buffers must be valid (the `Queue::enqueue` contract).
    unsafe fn execute(&self, req: &Request) {
        match req.op {
            Op::Read { offset, buf, len } => {
                let iov = [libc::iovec {
                    iov_base: buf.cast(),
                    iov_len: len,
                }];
                // SAFETY: per the contract.
                unsafe { self.copy(offset, &iov, false) }
            }
            Op::Write { offset, buf, len } => {
                let iov = [libc::iovec {
                    iov_base: buf as *mut libc::c_void,
                    iov_len: len,
                }];
                // SAFETY: per the contract (the buffer is only read).
                unsafe { self.copy(offset, &iov, true) }
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
            } if iovcnt > 0 && !iov.is_null() => {
                // SAFETY: per the contract, `iov` points to `iovcnt` iovecs.
                let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
                // SAFETY: per the contract.
                unsafe { self.copy(offset, v, matches!(req.op, Op::Writev { .. })) }
            }
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len } => {
                let at = self.place(offset);
                lock(&self.data)[at..at + len as usize].fill(0);
            }
            _ => {}
        }
    }
}

impl Engine for ToyEngine {
    fn in_flight(&self) -> usize {
        self.pending.len() + self.ready.len() + self.lost
    }
    fn submit(
        &mut self,
        wait: usize,
        timeout: Option<Duration>,
        _: Option<&libc::sigset_t>,
    ) -> Result<()> {
        while let Some(req) = self.pending.pop_front() {
            // Memory is durable once written, so FUA and flush need nothing more.
            // SAFETY: the request came through `Queue::enqueue`, whose caller keeps its buffers
            // valid until the completion is reaped.
            unsafe { self.execute(&req) };
            self.ready.push_back(Completion::ok(req.user_data));
        }
        if wait > self.ready.len() {
            // Only lost requests can be waited for: wait in vain.
            std::thread::sleep(timeout.unwrap_or(Duration::from_secs(1)));
            if timeout.is_some() {
                return Err(Error::from_errno(libc::ETIME));
            }
        }
        Ok(())
    }
    fn reap(&mut self, out: &mut [Completion]) -> usize {
        let n = out.len().min(self.ready.len());
        for (slot, c) in out.iter_mut().zip(self.ready.drain(..n)) {
            *slot = c;
        }
        n
    }
}
