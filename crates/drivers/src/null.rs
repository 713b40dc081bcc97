//! The `null` driver: a device of `size` bytes (default 1 GiB) whose requests complete at once;
//! reads return zeros and writes are dropped. It measures the stack's own overhead and gives the
//! tests a device with poll queues.

use crate::file::{unknown_property, unsupported_request, zero_iov};
use snapblk_core::{
    Access, Completion, DeviceInfo, Driver, Engine, Op, PropSpec, PropType, PropValue, Queue,
    QueueCore, Request, Result, State,
};
use std::os::fd::RawFd;
use std::time::Duration;

/// Default size: 1 GiB.
const DEFAULT_SIZE: u64 = 1 << 30;

const PROPS: &[PropSpec] = &[PropSpec::new(
    "size",
    PropType::U64,
    Access::RwCreated,
    false,
)];

/// The `null` driver.
#[derive(Debug)]
pub struct NullDriver {
    size: u64,
    read_only: bool,
}

impl NullDriver {
    /// A driver in the created state, 1 GiB until the `size` property is set;
    /// hand it to [`snapblk_core::Blkio::new`].
    pub fn new() -> Self {
        NullDriver {
            size: DEFAULT_SIZE,
            read_only: false,
        }
    }
}

impl Default for NullDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver for NullDriver {
    fn name(&self) -> &str {
        "null"
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _state: State) -> Result<PropValue> {
        match name {
            "size" => Ok(PropValue::U64(self.size)),
            _ => Err(unknown_property()),
        }
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _state: State) -> Result<()> {
        match (name, value) {
            ("size", PropValue::U64(v)) => {
                self.size = v;
                Ok(())
            }
            _ => Err(unknown_property()),
        }
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        self.read_only = read_only;
        Ok(DeviceInfo {
            read_only,
            supports_poll_queues: true,
            flush_needed: false,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> Result<u64> {
        Ok(self.size)
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        Ok(Box::new(NullQueue {
            core: QueueCore::new(poll)?,
            size: self.size,
            read_only: self.read_only,
        }))
    }
}

struct NullQueue {
    core: QueueCore,
    size: u64,
    read_only: bool,
}

/// Nothing is ever in flight: every request is finished in `enqueue`.
struct NoEngine;

impl Engine for NoEngine {
    fn in_flight(&self) -> usize {
        0
    }
    fn submit(&mut self, _: usize, _: Option<Duration>, _: Option<&libc::sigset_t>) -> Result<()> {
        Ok(())
    }
    fn reap(&mut self, _: &mut [Completion]) -> usize {
        0
    }
}

impl Queue for NullQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        let ud = req.user_data;
        if let Err(m) = req.validate() {
            return self.core.complete(Completion::err(ud, libc::EINVAL, m));
        }
        if self.core.is_poll()
            && !matches!(
                req.op,
                Op::Read { .. } | Op::Write { .. } | Op::Readv { .. } | Op::Writev { .. }
            )
        {
            return self.core.complete(Completion::err(
                ud,
                libc::ENOTSUP,
                c"request not supported on poll queues for this driver",
            ));
        }
        let (offset, len) = match req.op {
            Op::Read { offset, .. }
            | Op::Write { offset, .. }
            | Op::Readv { offset, .. }
            | Op::Writev { offset, .. } => {
                // SAFETY: the caller of `enqueue` guarantees the iovec array is valid.
                (offset, unsafe { req.data_len() })
            }
            Op::Discard { offset, len } | Op::WriteZeroes { offset, len } => (offset, len),
            Op::Flush => (0, 0),
            Op::Zone(_) => return self.core.complete(unsupported_request(ud)),
        };
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return self.core.complete(Completion::os_err(ud, libc::EIO));
        }
        let writes = matches!(
            req.op,
            Op::Write { .. } | Op::Writev { .. } | Op::WriteZeroes { .. } | Op::Discard { .. }
        );
        if self.read_only && writes {
            return self.core.complete(Completion::os_err(ud, libc::EBADF));
        }
        match req.op {
            Op::Read { buf, len, .. } => {
                // SAFETY: the caller guarantees `buf` is valid for `len` bytes until completion.
                unsafe {
                    zero_iov(&[libc::iovec {
                        iov_base: buf.cast(),
                        iov_len: len,
                    }])
                };
            }
            Op::Readv { iov, iovcnt, .. } if iovcnt > 0 && !iov.is_null() => {
                // SAFETY: as above, for the iovec array and its buffers.
                unsafe { zero_iov(std::slice::from_raw_parts(iov, iovcnt as usize)) };
            }
            _ => {}
        }
        self.core.complete(Completion::ok(ud));
    }

    fn do_io(
        &mut self,
        out: &mut [Completion],
        min: usize,
        timeout: Option<&mut Duration>,
        sigmask: Option<&libc::sigset_t>,
    ) -> Result<usize> {
        self.core.do_io(&mut NoEngine, out, min, timeout, sigmask)
    }
    fn completion_fd(&self) -> Option<RawFd> {
        self.core.completion_fd()
    }
    fn set_completion_fd_enabled(&mut self, enabled: bool) {
        self.core.set_completion_fd_enabled(enabled)
    }
    fn is_poll(&self) -> bool {
        self.core.is_poll()
    }
    fn outstanding(&self) -> usize {
        self.core.backlog_len()
    }
}
