//! The read-only `s3` / `http` driver: a [`RemoteObject`] behind snapblk-core's queues, so a
//! remote object can be served, benchmarked and used wherever a device spec is taken.
//!
//! Properties (before connect): `url` (`s3://BUCKET/KEY` or `http(s)://…`), `cache-size`
//! (bytes, default 64 MiB), `block-size` (default 256 KiB), `readahead` (blocks, default 4),
//! `timeout` (seconds, default 10), `retries` (default 3), `endpoint` and `region` (override
//! `AWS_ENDPOINT_URL` / `AWS_REGION`). Credentials come from the environment only, never a
//! spec (which shows in process lists). Connected, read-only: `stats` (JSON counters).

use crate::config::RemoteConfig;
use crate::object::RemoteObject;
use snapblk_core::{
    Access, Completion, DeviceInfo, Driver, Engine, Error, Op, PropSpec, PropType, PropValue,
    Queue, QueueCore, Request, State,
};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

const PROPS: &[PropSpec] = &[
    PropSpec::new("url", PropType::Str, Access::RwCreated, false),
    PropSpec::new("cache-size", PropType::U64, Access::RwCreated, false),
    PropSpec::new("block-size", PropType::U64, Access::RwCreated, false),
    PropSpec::new("readahead", PropType::U64, Access::RwCreated, false),
    PropSpec::new("timeout", PropType::U64, Access::RwCreated, false),
    PropSpec::new("retries", PropType::U64, Access::RwCreated, false),
    PropSpec::new("endpoint", PropType::Str, Access::RwCreated, false),
    PropSpec::new("region", PropType::Str, Access::RwCreated, false),
    PropSpec::new("stats", PropType::Str, Access::ReadOnly, true),
];

/// The driver (registered as `s3` and as `http`).
pub struct RemoteDriver {
    name: &'static str,
    url: String,
    cache_size: Option<u64>,
    block_size: Option<u64>,
    readahead: Option<u64>,
    timeout: Option<u64>,
    retries: Option<u64>,
    endpoint: Option<String>,
    region: Option<String>,
    obj: Option<Arc<RemoteObject>>,
}

impl RemoteDriver {
    /// A driver in the created state, named `name` (`s3` or `http`).
    pub fn new(name: &'static str) -> Self {
        RemoteDriver {
            name,
            url: String::new(),
            cache_size: None,
            block_size: None,
            readahead: None,
            timeout: None,
            retries: None,
            endpoint: None,
            region: None,
            obj: None,
        }
    }

    /// The configuration connect uses: the environment, then the properties set.
    pub fn config(&self) -> snapblk_core::Result<RemoteConfig> {
        let mut c = RemoteConfig::from_env()?;
        if let Some(v) = self.cache_size {
            c.cache_bytes = v;
        }
        if let Some(v) = self.block_size {
            c.block_size = v;
        }
        if let Some(v) = self.readahead {
            c.readahead_blocks = v;
        }
        if let Some(v) = self.timeout {
            c.timeout = Duration::from_secs(v);
        }
        if let Some(v) = self.retries {
            c.retries = u32::try_from(v).unwrap_or(u32::MAX);
        }
        if let Some(v) = &self.endpoint {
            c.endpoint = Some(v.clone());
        }
        if let Some(v) = &self.region {
            c.region = v.clone();
        }
        Ok(c)
    }
}

impl Driver for RemoteDriver {
    fn name(&self) -> &str {
        self.name
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _state: State) -> snapblk_core::Result<PropValue> {
        let u = |v: Option<u64>| PropValue::U64(v.unwrap_or(0));
        let s = |v: &Option<String>| PropValue::Str(v.clone().unwrap_or_default());
        Ok(match name {
            "url" => PropValue::Str(self.url.clone()),
            "cache-size" => u(self.cache_size),
            "block-size" => u(self.block_size),
            "readahead" => u(self.readahead),
            "timeout" => u(self.timeout),
            "retries" => u(self.retries),
            "endpoint" => s(&self.endpoint),
            "region" => s(&self.region),
            "stats" => PropValue::Str(
                self.obj
                    .as_ref()
                    .map(|o| o.stats().to_json())
                    .unwrap_or_default(),
            ),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        })
    }
    fn set_prop(
        &mut self,
        name: &str,
        value: PropValue,
        _state: State,
    ) -> snapblk_core::Result<()> {
        match (name, value) {
            ("url", PropValue::Str(v)) => self.url = v,
            ("cache-size", PropValue::U64(v)) => self.cache_size = Some(v),
            ("block-size", PropValue::U64(v)) => self.block_size = Some(v),
            ("readahead", PropValue::U64(v)) => self.readahead = Some(v),
            ("timeout", PropValue::U64(v)) => self.timeout = Some(v),
            ("retries", PropValue::U64(v)) => self.retries = Some(v),
            ("endpoint", PropValue::Str(v)) => self.endpoint = (!v.is_empty()).then_some(v),
            ("region", PropValue::Str(v)) => self.region = (!v.is_empty()).then_some(v),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
        Ok(())
    }
    fn connect(&mut self, _read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        if self.url.is_empty() {
            return Err(Error::inval(format!(
                "{}: property url must be set",
                self.name
            )));
        }
        let obj = RemoteObject::open(&self.url, &self.config()?)?;
        self.obj = Some(Arc::new(obj));
        Ok(DeviceInfo {
            read_only: true,
            flush_needed: false,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        self.obj
            .as_ref()
            .map(|o| o.len())
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))
    }
    fn create_queue(&mut self, poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        let obj = self
            .obj
            .clone()
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))?;
        if poll {
            return Err(Error::inval("Poll queues not supported"));
        }
        Ok(Box::new(RemoteQueue {
            core: QueueCore::new(false)?,
            eng: RemoteEngine {
                obj,
                pending: VecDeque::new(),
                ready: VecDeque::new(),
            },
        }))
    }
}

struct RemoteEngine {
    obj: Arc<RemoteObject>,
    pending: VecDeque<Request>,
    ready: VecDeque<Completion>,
}

impl RemoteEngine {
    /// Read into `len` bytes at `buf` from `offset`.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes (the `Queue::enqueue` contract).
    unsafe fn read(&self, offset: u64, buf: *mut u8, len: usize) -> Result<(), i32> {
        if len == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per this function's contract.
        let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        // Past the end: EIO, as a file driver's short read (the conformance suite's bounds check).
        let end = offset.checked_add(len as u64).ok_or(libc::EIO)?;
        if end > self.obj.len() {
            return Err(libc::EIO);
        }
        self.obj.read_exact_remote(offset, b).map_err(|e| {
            log_error(&e);
            e.errno()
        })
    }

    /// # Safety
    /// The request's buffers must be valid (the `Queue::enqueue` contract).
    unsafe fn execute(&self, req: &Request) -> Completion {
        let ud = req.user_data;
        let r = match req.op {
            // SAFETY: per the contract.
            Op::Read { offset, buf, len } => unsafe { self.read(offset, buf, len) },
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
                let mut at = offset;
                let mut r = Ok(());
                for e in v {
                    // SAFETY: per the contract, each iovec's buffer is valid for its length.
                    r = unsafe { self.read(at, e.iov_base.cast(), e.iov_len) };
                    if r.is_err() {
                        break;
                    }
                    at += e.iov_len as u64;
                }
                r
            }
            Op::Flush => Ok(()),
            // libblkio's answer to a write on a read-only device.
            Op::Write { .. } | Op::Writev { .. } | Op::Discard { .. } | Op::WriteZeroes { .. } => {
                Err(libc::EBADF)
            }
            Op::Zone(_) => Err(libc::ENOTSUP),
        };
        match r {
            Ok(()) => Completion::ok(ud),
            Err(errno) => Completion::os_err(ud, errno),
        }
    }
}

/// A completion carries only an errno: the one-line cause is logged (at `error`) once per
/// failure, so `serve` and `bench` users see why (denied, changed, unreachable) and a C host of
/// `libblkio.so.1` decides itself whether anything is printed.
fn log_error(e: &crate::error::RemoteError) {
    log::error!("{}", snapblk_core::Chain(e));
}

impl Engine for RemoteEngine {
    fn in_flight(&self) -> usize {
        self.pending.len() + self.ready.len()
    }
    fn submit(
        &mut self,
        _: usize,
        _: Option<Duration>,
        _: Option<&libc::sigset_t>,
    ) -> snapblk_core::Result<()> {
        while let Some(req) = self.pending.pop_front() {
            // SAFETY: the request came through `Queue::enqueue`, whose caller keeps its buffers
            // valid until the completion is reaped.
            let c = unsafe { self.execute(&req) };
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

struct RemoteQueue {
    core: QueueCore,
    eng: RemoteEngine,
}

impl Queue for RemoteQueue {
    unsafe fn enqueue(&mut self, req: Request) {
        if let Err(m) = req.validate() {
            return self
                .core
                .complete(Completion::err(req.user_data, libc::EINVAL, m));
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
    ) -> snapblk_core::Result<usize> {
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
