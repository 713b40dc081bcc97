//! The `snapshot` driver: a snapblk-core [`Driver`] serving a [`Snapshot`].
//!
//! Properties (set before connect): `base` and `cow` (paths), `writable` (accept writes into the
//! overlay journal; default false → writes fail with EROFS), `cache-size` (bytes of decoded
//! compressed units, default 32 MiB), `scheduler` (default true). Spec example:
//! `snapshot:base=system.img,cow=system.cow,writable=true`.

use crate::cowsrc::{OpenMode, open_files};
use crate::queue::{Backend, SyncQueue};
use crate::snapshot::{Snapshot, SnapshotConfig};
use snapblk_core::props::{Access, PropSpec, PropType, PropValue};
use snapblk_core::{DeviceInfo, Driver, Error, Queue, State};
use std::path::PathBuf;
use std::sync::Arc;

const PROPS: &[PropSpec] = &[
    PropSpec::new("base", PropType::Str, Access::RwCreated, false),
    PropSpec::new("cow", PropType::Str, Access::RwCreated, false),
    PropSpec::new("writable", PropType::Bool, Access::RwCreated, false),
    PropSpec::new("cache-size", PropType::U64, Access::RwCreated, false),
    PropSpec::new("scheduler", PropType::Bool, Access::RwCreated, false),
];

/// The driver.
#[derive(Default)]
pub struct SnapshotDriver {
    base: Option<PathBuf>,
    cow: Option<PathBuf>,
    cfg: SnapshotConfig,
    snap: Option<Arc<Snapshot>>,
}

impl SnapshotDriver {
    /// A driver with default settings.
    pub fn new() -> Self {
        Self::default()
    }
    /// The snapshot (after connect), for in-process users such as a merge running alongside.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snap.clone()
    }
}

struct SnapBackend(Arc<Snapshot>);

impl Backend for SnapBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        Ok(self.0.read(offset, buf)?)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> snapblk_core::Result<()> {
        Ok(self.0.write(offset, buf, fua)?)
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        Ok(self.0.flush()?)
    }
}

impl Driver for SnapshotDriver {
    fn name(&self) -> &str {
        "snapshot"
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _state: State) -> snapblk_core::Result<PropValue> {
        let path = |p: &Option<PathBuf>| {
            PropValue::Str(
                p.as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            )
        };
        Ok(match name {
            "base" => path(&self.base),
            "cow" => path(&self.cow),
            "writable" => PropValue::Bool(self.cfg.writable),
            "cache-size" => PropValue::U64(self.cfg.cache_bytes),
            "scheduler" => PropValue::Bool(self.cfg.sched.enabled),
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
            ("base", PropValue::Str(s)) => self.base = Some(s.into()),
            ("cow", PropValue::Str(s)) => self.cow = Some(s.into()),
            ("writable", PropValue::Bool(b)) => self.cfg.writable = b,
            ("cache-size", PropValue::U64(n)) => self.cfg.cache_bytes = n,
            ("scheduler", PropValue::Bool(b)) => self.cfg.sched.enabled = b,
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
        Ok(())
    }
    fn connect(&mut self, read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        let (Some(base), Some(cow)) = (&self.base, &self.cow) else {
            return Err(Error::inval(
                "snapshot: properties base and cow must be set",
            ));
        };
        let mut cfg = self.cfg;
        cfg.writable &= !read_only;
        let snap = open_files(base, cow, cfg, OpenMode::default())?;
        let writable = snap.writable();
        self.snap = Some(Arc::new(snap));
        Ok(DeviceInfo {
            read_only: !writable,
            request_alignment: 1,
            optimal_io_alignment: 4096,
            optimal_buf_alignment: 4096,
            flush_needed: writable,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        self.snap
            .as_ref()
            .map(|s| s.capacity())
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))
    }
    fn create_queue(&mut self, _poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        let snap = self
            .snap
            .clone()
            .ok_or_else(|| Error::new(libc::ENODEV, "Device must be connected"))?;
        Ok(Box::new(SyncQueue::new(Arc::new(SnapBackend(snap)))?))
    }
}
