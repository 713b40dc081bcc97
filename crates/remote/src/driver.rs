//! The read-only `s3` / `http` driver: a [`RemoteObject`] behind snapblk-core's queues, so a
//! remote object can be served, benchmarked and used wherever a device spec is taken.
//!
//! Properties (before connect): `url` (`s3://BUCKET/KEY` or `http(s)://…`), `cache-size`
//! (bytes, default 64 MiB), `block-size` (default 256 KiB), `readahead` (blocks, default 4),
//! `timeout` (seconds, default 10), `retries` (default 3), `endpoint` and `region` (override
//! `AWS_ENDPOINT_URL` / `AWS_REGION`). Credentials come from the environment only, never a
//! spec (which shows in process lists). Connected, read-only: `stats` (JSON counters).
//!
//! Reads are asynchronous, as libblkio's drivers are: a read the block cache holds completes
//! at enqueue; any other goes to the device's pool of up to `READ_WORKERS` threads (started as
//! work arrives, shared by all its queues), so `blkioq_do_io(min_completions = 0)` returns
//! without waiting for HTTP and the completion arrives on the queue's completion fd
//! (`crate::queue`). Dropping a queue or the device with reads in flight returns at once.

use crate::config::{READ_WORKERS, RemoteConfig};
use crate::object::RemoteObject;
use crate::pool::Pool;
use crate::queue::RemoteQueue;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, PropSpec, PropType, PropValue, Queue, State,
};
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
    /// The read workers all queues share, made with the first queue.
    pool: Option<Arc<Pool>>,
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
            pool: None,
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

#[cfg(test)]
impl RemoteDriver {
    /// The worker pool's thread count, watchable after the driver is gone.
    pub(crate) fn pool_watch(&self) -> Option<crate::pool::PoolWatch> {
        self.pool.as_ref().map(|p| p.watch())
    }
    /// Reads that waited for another read's GET of the same block.
    pub(crate) fn waited(&self) -> u64 {
        self.obj
            .as_ref()
            .map_or(0, |o| o.waited.load(std::sync::atomic::Ordering::Relaxed))
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
        let pool = self
            .pool
            .get_or_insert_with(|| Arc::new(Pool::new(READ_WORKERS)));
        Ok(Box::new(RemoteQueue::new(obj, pool.clone())?))
    }
}
