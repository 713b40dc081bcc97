//! The `rbd` driver: a Ceph RBD image through librbd's C API, loaded with `dlopen` at connect
//! (`librbd.so.1`, `librados.so.2`; a machine without them gets a clear error at connect and
//! nothing else changes).
//!
//! Properties (set before connect), named after QEMU's `rbd` block driver where it has them:
//! `pool` and `image` (required), `namespace`, `snapshot` (opens the image at that snapshot,
//! read-only), `conf` (a ceph.conf path; unset = Ceph's default search, silently skipped when
//! absent; empty = none), `mon-host`, `keyring`, `id` (the client name without `client.`,
//! default `admin`), `cache` (librbd's `rbd_cache`, default false: a completed write is on the
//! OSDs, as with `O_DIRECT`; true: write-back until a flush, from the first write, since connect
//! flushes once to end librbd's write-through start), and the timeouts that keep a dead cluster from hanging a caller
//! for librados's default 300 s, in seconds: `client-mount-timeout` (connect, default 10),
//! `rados-mon-op-timeout` (monitor requests, default 10) and `rados-osd-op-timeout` (every I/O,
//! default 30), each 0 for Ceph's own default. `lock`: `auto` (default: a shared advisory lock
//! when read-only, an exclusive one when writable), `shared`, `exclusive` or `none`; RBD
//! advisory locks keep a merge and a server of the same image apart, as `flock` does for files
//! (the lock lasts 30 s and is renewed every 10 s, so a process that dies frees it by itself).
//! A holder of the exclusive lock whose renewal fails (the lock broken or taken, the client
//! blocklisted) or runs out of time fails every later write, discard, write-zeroes and flush
//! with EIO and logs that once ([`lease`]). A request that fails with ESHUTDOWN (the client
//! blocklisted: with `cache=true`, the flush of writes librbd had accepted) fails with EIO
//! and loses the lock at once. An image opened at a snapshot is never locked (it
//! cannot change).
//!
//! Every queue shares the one image handle (a second handle would fight over RBD's exclusive
//! lock feature); completions come back through librbd's callbacks onto each queue's done list
//! and wake its eventfd ([`queue`]). FUA is a write followed by a flush; write-zeroes with
//! `NO_UNMAP` keeps the extent allocated (`RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`).

mod ffi;
mod lease;
mod monitors;
mod queue;

use crate::file::unknown_property;
use ffi::{Cluster, ConnectArgs, Image, LockMode};
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, PropSpec, PropType, PropValue, Queue, Result, State,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const PROPS: &[PropSpec] = &[
    PropSpec::new("pool", PropType::Str, Access::RwCreated, false),
    PropSpec::new("image", PropType::Str, Access::RwCreated, false),
    PropSpec::new("namespace", PropType::Str, Access::RwCreated, false),
    PropSpec::new("snapshot", PropType::Str, Access::RwCreated, false),
    PropSpec::new("conf", PropType::Str, Access::RwCreated, false),
    PropSpec::new("mon-host", PropType::Str, Access::RwCreated, false),
    PropSpec::new("keyring", PropType::Str, Access::RwCreated, false),
    PropSpec::new("id", PropType::Str, Access::RwCreated, false),
    PropSpec::new("cache", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("lock", PropType::Str, Access::RwCreated, false),
    PropSpec::new(
        "client-mount-timeout",
        PropType::U64,
        Access::RwCreated,
        false,
    ),
    PropSpec::new(
        "rados-mon-op-timeout",
        PropType::U64,
        Access::RwCreated,
        false,
    ),
    PropSpec::new(
        "rados-osd-op-timeout",
        PropType::U64,
        Access::RwCreated,
        false,
    ),
];

/// The most queues a device offers (all share one image handle).
const MAX_QUEUES: i32 = 64;

/// The `rbd` driver.
#[derive(Debug)]
pub struct RbdDriver {
    pool: String,
    image_name: String,
    namespace: String,
    snapshot: String,
    conf: Option<String>,
    mon_host: String,
    keyring: String,
    id: String,
    cache: bool,
    lock: String,
    mount_timeout: u64,
    mon_op_timeout: u64,
    osd_op_timeout: u64,
    image: Option<Arc<Image>>,
    /// The image's size, shared with every queue (a resize changes it for all of them).
    capacity: Arc<AtomicU64>,
    read_only: bool,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Image")
    }
}

impl Default for RbdDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl RbdDriver {
    /// A driver in the created state; hand it to [`snapblk_core::Blkio::new`].
    pub fn new() -> Self {
        RbdDriver {
            pool: String::new(),
            image_name: String::new(),
            namespace: String::new(),
            snapshot: String::new(),
            conf: None,
            mon_host: String::new(),
            keyring: String::new(),
            id: "admin".into(),
            cache: false,
            lock: "auto".into(),
            mount_timeout: 10,
            mon_op_timeout: 10,
            osd_op_timeout: 30,
            image: None,
            capacity: Arc::new(AtomicU64::new(0)),
            read_only: false,
        }
    }

    /// The librados settings the properties make (before a keyring): the cache, the three
    /// timeouts (a timeout of 0 leaves librados's own default, 300 s or none) and `mon_host`.
    fn rados_settings(&self) -> Vec<(&'static str, String)> {
        let mut settings: Vec<(&'static str, String)> = vec![
            ("rbd_cache", self.cache.to_string()),
            ("client_mount_timeout", self.mount_timeout.to_string()),
            ("rados_mon_op_timeout", self.mon_op_timeout.to_string()),
            ("rados_osd_op_timeout", self.osd_op_timeout.to_string()),
        ];
        settings.retain(|(k, v)| *k == "rbd_cache" || v != "0");
        if !self.mon_host.is_empty() {
            settings.push(("mon_host", self.mon_host.clone()));
        }
        settings
    }

    fn lock_mode(&self, read_only: bool) -> Result<LockMode> {
        Ok(match self.lock.as_str() {
            _ if !self.snapshot.is_empty() => LockMode::None,
            "auto" if read_only => LockMode::Shared,
            "auto" => LockMode::Exclusive,
            "shared" => LockMode::Shared,
            "exclusive" => LockMode::Exclusive,
            "none" => LockMode::None,
            other => {
                return Err(Error::inval(format!(
                    "rbd: lock must be auto, shared, exclusive or none, not {other:?}"
                )));
            }
        })
    }
}

impl Driver for RbdDriver {
    fn name(&self) -> &str {
        "rbd"
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _state: State) -> Result<PropValue> {
        let s = |v: &str| PropValue::Str(v.to_owned());
        Ok(match name {
            "pool" => s(&self.pool),
            "image" => s(&self.image_name),
            "namespace" => s(&self.namespace),
            "snapshot" => s(&self.snapshot),
            "conf" => s(self.conf.as_deref().unwrap_or("")),
            "mon-host" => s(&self.mon_host),
            "keyring" => s(&self.keyring),
            "id" => s(&self.id),
            "cache" => PropValue::Bool(self.cache),
            "lock" => s(&self.lock),
            "client-mount-timeout" => PropValue::U64(self.mount_timeout),
            "rados-mon-op-timeout" => PropValue::U64(self.mon_op_timeout),
            "rados-osd-op-timeout" => PropValue::U64(self.osd_op_timeout),
            _ => return Err(unknown_property()),
        })
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _state: State) -> Result<()> {
        match (name, value) {
            ("pool", PropValue::Str(v)) => self.pool = v,
            ("image", PropValue::Str(v)) => self.image_name = v,
            ("namespace", PropValue::Str(v)) => self.namespace = v,
            ("snapshot", PropValue::Str(v)) => self.snapshot = v,
            ("conf", PropValue::Str(v)) => self.conf = Some(v),
            ("mon-host", PropValue::Str(v)) => self.mon_host = v,
            ("keyring", PropValue::Str(v)) => self.keyring = v,
            ("id", PropValue::Str(v)) => {
                if v.is_empty() {
                    return Err(Error::inval("rbd: id must not be empty"));
                }
                self.id = v.strip_prefix("client.").unwrap_or(&v).to_owned();
            }
            ("cache", PropValue::Bool(b)) => self.cache = b,
            ("lock", PropValue::Str(v)) => self.lock = v,
            ("client-mount-timeout", PropValue::U64(n)) => self.mount_timeout = n,
            ("rados-mon-op-timeout", PropValue::U64(n)) => self.mon_op_timeout = n,
            ("rados-osd-op-timeout", PropValue::U64(n)) => self.osd_op_timeout = n,
            _ => return Err(unknown_property()),
        }
        Ok(())
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        if self.pool.is_empty() || self.image_name.is_empty() {
            return Err(Error::inval("rbd: properties pool and image must be set"));
        }
        let read_only = read_only || !self.snapshot.is_empty();
        let lock = self.lock_mode(read_only)?;
        let mut settings = self.rados_settings();
        if !self.keyring.is_empty() {
            // librados would only time out over a keyring that is not there.
            if !self.keyring.contains(',') && !std::path::Path::new(&self.keyring).exists() {
                return Err(Error::new(
                    libc::ENOENT,
                    format!("rbd: keyring {}: no such file", self.keyring),
                ));
            }
            settings.push(("keyring", self.keyring.clone()));
        }
        let cluster = Cluster::connect(&ConnectArgs {
            id: &self.id,
            conf: self.conf.as_deref(),
            settings,
            pool: &self.pool,
            namespace: &self.namespace,
        })?;
        let snap = (!self.snapshot.is_empty()).then_some(self.snapshot.as_str());
        let mut image = Image::open(cluster, &self.image_name, snap, read_only)?;
        let what = format!("{}/{}", self.pool, self.image_name);
        image.lock(lock, &what)?;
        if self.cache && !read_only {
            // librbd keeps its cache write-through until the client's first flush
            // (`rbd_cache_writethrough_until_flush`, for guests that never flush). This device
            // tells its users to flush (`flush_needed`), so it is that client: without this
            // flush `cache=true` wrote exactly as `cache=false`. fio's rbd engine does the same.
            image.flush()?;
        }
        self.capacity.store(image.size()?, Ordering::Relaxed);
        let obj = image.object_size()?;
        self.image = Some(Arc::new(image));
        self.read_only = read_only;
        Ok(DeviceInfo {
            read_only,
            request_alignment: 1,
            buf_alignment: 1,
            optimal_io_alignment: 4096,
            optimal_io_size: i32::try_from(obj).unwrap_or(0),
            optimal_buf_alignment: 4096,
            supports_fua_natively: false,
            supports_poll_queues: true,
            // Without librbd's cache a completed write is on the OSDs already.
            flush_needed: self.cache,
            max_queues: MAX_QUEUES,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> Result<u64> {
        match &self.image {
            Some(_) => Ok(self.capacity.load(Ordering::Relaxed)),
            None => Err(Error::new(libc::ENODEV, "Device must be connected")),
        }
    }
    fn resize(&mut self, size: u64) -> Result<()> {
        let image = self
            .image
            .as_ref()
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))?;
        if self.read_only {
            return Err(Error::new(libc::EROFS, "rbd: the image is open read-only"));
        }
        // Queues stop taking requests past a shrinking image's new end before librbd drops
        // the data there; a growing image takes them once it has grown.
        let old = self.capacity.load(Ordering::Relaxed);
        if size < old {
            self.capacity.store(size, Ordering::Relaxed);
        }
        let r = image.resize(size);
        let now = image.size().unwrap_or(if r.is_ok() { size } else { old });
        self.capacity.store(now, Ordering::Relaxed);
        r
    }
    /// An image, not a snapshot of one (which is read-only for good).
    fn can_resize(&self) -> bool {
        self.snapshot.is_empty()
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        let image = self
            .image
            .clone()
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))?;
        Ok(Box::new(queue::RbdQueue::new(
            image,
            self.capacity.clone(),
            self.read_only,
            poll,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(d: &RbdDriver, key: &str) -> Option<String> {
        d.rados_settings()
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    #[test]
    fn defaults_bound_every_wait_in_seconds() {
        // librados waits 300 s to connect and forever for an op: the defaults must not.
        let d = RbdDriver::new();
        assert_eq!(setting(&d, "client_mount_timeout").as_deref(), Some("10"));
        assert_eq!(setting(&d, "rados_mon_op_timeout").as_deref(), Some("10"));
        assert_eq!(setting(&d, "rados_osd_op_timeout").as_deref(), Some("30"));
        assert_eq!(setting(&d, "rbd_cache").as_deref(), Some("false"));
        assert_eq!(setting(&d, "mon_host"), None);
    }

    #[test]
    fn properties_reach_the_settings() {
        let mut d = RbdDriver::new();
        let st = State::Created;
        d.set_prop("client-mount-timeout", PropValue::U64(3), st)
            .unwrap();
        d.set_prop("rados-osd-op-timeout", PropValue::U64(0), st)
            .unwrap();
        d.set_prop("cache", PropValue::Bool(true), st).unwrap();
        d.set_prop("mon-host", PropValue::Str("127.0.0.1:6789".into()), st)
            .unwrap();
        assert_eq!(setting(&d, "client_mount_timeout").as_deref(), Some("3"));
        // 0 leaves librados's own default: the key is not set at all.
        assert_eq!(setting(&d, "rados_osd_op_timeout"), None);
        assert_eq!(setting(&d, "rados_mon_op_timeout").as_deref(), Some("10"));
        assert_eq!(setting(&d, "rbd_cache").as_deref(), Some("true"));
        assert_eq!(setting(&d, "mon_host").as_deref(), Some("127.0.0.1:6789"));
        assert_eq!(
            d.get_prop("client-mount-timeout", st).unwrap(),
            PropValue::U64(3)
        );
    }
}
