//! The `sync` driver: plain `preadv2`/`pwritev2`/`fallocate`/`fdatasync` on a regular file or
//! block device, executed inside `do_io`. For systems without io_uring, and as a simple
//! reference the io_uring driver is tested against.

use crate::file::{FILE_PROPS, FileConfig, Target, connected, rw_full, unsupported_request};
use snapblk_core::{
    Completion, DeviceInfo, Driver, Engine, Error, Op, PropSpec, PropValue, Queue, QueueCore,
    ReqFlags, Request, Result, State,
};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// The `sync` driver. Properties: `path`, `fd`, `direct` (as io_uring's).
#[derive(Debug)]
pub struct SyncDriver {
    name: &'static str,
    cfg: FileConfig,
    target: Option<Arc<Target>>,
}

impl SyncDriver {
    /// A driver in the created state; set `path` (or `fd`) before connect. Hand it to
    /// [`snapblk_core::Blkio::new`].
    pub fn new() -> Self {
        SyncDriver {
            name: "sync",
            cfg: FileConfig::new(),
            target: None,
        }
    }
}

impl Default for SyncDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver for SyncDriver {
    fn name(&self) -> &str {
        self.name
    }
    fn props(&self) -> &'static [PropSpec] {
        FILE_PROPS
    }
    fn get_prop(&self, name: &str, _state: State) -> Result<PropValue> {
        self.cfg.get(name, self.target.as_deref())
    }
    fn set_prop(&mut self, name: &str, value: PropValue, state: State) -> Result<()> {
        self.cfg.set(name, &value, state)
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        let (t, info) = self.cfg.open(read_only)?;
        self.target = Some(Arc::new(t));
        Ok(info)
    }
    fn capacity(&self) -> Result<u64> {
        connected(&self.target)?.capacity()
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        let t = connected(&self.target)?;
        if poll {
            return Err(Error::inval("Poll queues not supported"));
        }
        Ok(Box::new(SyncQueue {
            core: QueueCore::new(false)?,
            eng: SyncEngine {
                t: t.clone(),
                pending: VecDeque::new(),
                ready: VecDeque::new(),
            },
        }))
    }
}

struct SyncEngine {
    t: Arc<Target>,
    pending: VecDeque<Request>,
    ready: VecDeque<Completion>,
}

/// Execute one (already validated) request synchronously.
///
/// # Safety
/// The request's buffers must be valid (the `Queue::enqueue` contract).
pub(crate) unsafe fn execute(t: &Target, req: &Request) -> Completion {
    let ud = req.user_data;
    let r = match req.op {
        Op::Read { offset, buf, len } => {
            let iov = [libc::iovec {
                iov_base: buf.cast(),
                iov_len: len,
            }];
            // SAFETY: per the contract.
            unsafe { rw_full(t, &iov, offset, false, 0) }
        }
        Op::Write { offset, buf, len } => {
            let iov = [libc::iovec {
                iov_base: buf as *mut libc::c_void,
                iov_len: len,
            }];
            // SAFETY: per the contract.
            unsafe { rw_full(t, &iov, offset, true, rwf(req.flags)) }
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
            let v = if iovcnt <= 0 || iov.is_null() {
                &[][..]
            } else {
                // SAFETY: per the contract, `iov` points to `iovcnt` iovecs.
                unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) }
            };
            let write = matches!(req.op, Op::Writev { .. });
            // SAFETY: per the contract.
            unsafe { rw_full(t, v, offset, write, if write { rwf(req.flags) } else { 0 }) }
        }
        Op::Flush => t.fdatasync(),
        Op::Discard { offset, len } => t.discard(offset, len),
        Op::WriteZeroes { offset, len } => match t.write_zeroes_mode(req.flags) {
            Err(m) => return Completion::err(ud, libc::ENOTSUP, m),
            Ok(mode) => t.fallocate(mode, offset, len).and_then(|()| {
                if req.flags.contains(ReqFlags::FUA) {
                    t.fdatasync()
                } else {
                    Ok(())
                }
            }),
        },
        Op::Zone(_) => return unsupported_request(ud),
    };
    match r {
        Ok(()) => Completion::ok(ud),
        Err(e) => Completion::os_err(ud, e),
    }
}

fn rwf(flags: ReqFlags) -> i32 {
    if flags.contains(ReqFlags::FUA) {
        libc::RWF_DSYNC
    } else {
        0
    }
}

impl Engine for SyncEngine {
    fn in_flight(&self) -> usize {
        self.pending.len() + self.ready.len()
    }
    fn submit(&mut self, _: usize, _: Option<Duration>, _: Option<&libc::sigset_t>) -> Result<()> {
        while let Some(req) = self.pending.pop_front() {
            // SAFETY: the request came through `Queue::enqueue`, whose caller keeps its buffers
            // valid until the completion is reaped.
            let c = unsafe { execute(&self.t, &req) };
            self.ready.push_back(c);
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

struct SyncQueue {
    core: QueueCore,
    eng: SyncEngine,
}

impl Queue for SyncQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        if let Err(m) = req.validate() {
            return self
                .core
                .complete(Completion::err(req.user_data, libc::EINVAL, m));
        }
        if self.eng.pending.is_empty() {
            // Work for do_io: tell an event loop waiting on the completion fd.
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
        self.core.completion_fd()
    }
    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.core.set_completion_fd_enabled(enabled)
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len() + self.eng.in_flight()
    }
}
