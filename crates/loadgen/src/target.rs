//! What a benchmark runs against: anything that yields started snapblk queues.
//!
//! A [`Target`] is opened afresh for every configuration (so a sweep over `numjobs` gets exactly
//! one queue per job). Implementations: [`SpecTarget`] (a snapblk device spec or a path, through
//! the `snapblk` registry), [`crate::capi::LibblkioTarget`] (any libblkio shared library), and
//! [`BlkioTarget`] (a caller-supplied constructor, used by tests with recording drivers).

use crate::spec::Iomem;
use crate::{Error, Result};
use snapblk_core::{Blkio, MemRegion, Queue};
use std::path::PathBuf;

/// What a device requires of requests (libblkio's `request-alignment`: offsets and lengths)
/// and of buffer addresses (`buf-alignment`), in bytes; 1 means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alignment {
    /// Offsets and lengths must be multiples of this.
    pub request: u64,
    /// Buffer addresses must be multiples of this.
    pub buf: u64,
}

impl Default for Alignment {
    fn default() -> Self {
        Alignment { request: 1, buf: 1 }
    }
}

impl Alignment {
    /// From the two libblkio properties (non-positive values mean no requirement).
    pub fn of(request: i64, buf: i64) -> Alignment {
        Alignment {
            request: request.max(1) as u64,
            buf: buf.max(1) as u64,
        }
    }
}

/// An opened device: its queues, capacity and I/O buffers. Dropping it closes everything;
/// buffers stay valid until then.
pub trait Device: Send {
    /// The device's size in bytes.
    fn capacity(&self) -> u64;
    /// The alignment the opened device requires (with O_DIRECT, typically its logical block
    /// size); checked before any I/O, see [`crate::spec::JobSpec::check_alignment`].
    fn alignment(&self) -> Alignment;
    /// Move the queues out (one per job).
    fn take_queues(&mut self) -> Vec<Box<dyn Queue>>;
    /// A buffer usable for I/O on this device (aligned to a page and to `buf-alignment`),
    /// of the kind `iomem` asks for, registered with the driver when it takes registrations;
    /// valid until the device is dropped.
    fn alloc_buf(&mut self, len: usize, iomem: Iomem) -> Result<MemRegion>;
    /// The device was opened read-only (its `read-only` property): a job that writes is
    /// refused before any I/O instead of failing at its first write (EBADF on a file).
    fn read_only(&self) -> bool {
        false
    }
}

/// Private buffers ([`MemRegion::alloc_private`]) of a device, unmapped when dropped. A device
/// declares this field after its instance, so the instance (which unregisters them and owns
/// the queues that may use them) goes first.
#[derive(Default)]
pub(crate) struct PrivateBufs(Vec<MemRegion>);

impl PrivateBufs {
    /// A new private region of `len` bytes, unless the driver needs regions with an fd.
    pub(crate) fn alloc(&mut self, len: usize, needs_fd: bool) -> Result<MemRegion> {
        if needs_fd {
            return Err(Error::Spec(
                "--iomem malloc: this driver needs memory regions with a file descriptor \
                 (needs-mem-region-fd); use --iomem memfd"
                    .into(),
            ));
        }
        let r = MemRegion::alloc_private(len)?;
        self.0.push(r);
        Ok(r)
    }
}

impl Drop for PrivateBufs {
    fn drop(&mut self) {
        for r in self.0.drain(..) {
            // SAFETY: allocated by `alloc_private` in `alloc`, freed once; the owning device's
            // instance and queues are gone (field order), so no request uses it.
            unsafe { r.free() };
        }
    }
}

/// Something that can be opened with `num_queues` queues.
pub trait Target: Send {
    /// Opens the target with `num_queues` queues, with O_DIRECT when `direct` (where the target
    /// can: see [`Target::direct_supported`]).
    fn open(&mut self, num_queues: usize, direct: bool) -> Result<Box<dyn Device>>;
    /// Human description (spec string, path, library).
    fn describe(&self) -> String;
    /// The driver name, for reports.
    fn driver(&self) -> String;
    /// The file or block device behind the target, if any (for context capture).
    fn path(&self) -> Option<PathBuf> {
        None
    }
    /// Whether `open(…, direct = true)` really gives O_DIRECT I/O. False for device specs
    /// without a `path` (`null:`, `snapshot:`), whose drivers have no such switch: a job's
    /// `direct` is then ignored, see [`crate::effective_direct`].
    fn direct_supported(&self) -> bool {
        true
    }
    /// Every job will only read: targets with a file open it read-only from now on, so a user
    /// with read access alone can benchmark reads. See [`crate::jobs_read_only`].
    fn set_read_only(&mut self, _read_only: bool) {}
}

/// A started [`Blkio`] as a [`Device`].
pub(crate) struct BlkioDevice {
    blkio: Blkio,
    capacity: u64,
    alignment: Alignment,
    /// After `blkio`: dropped once it is gone.
    private: PrivateBufs,
}

impl BlkioDevice {
    /// Wrap a started instance.
    pub(crate) fn new(blkio: Blkio) -> Result<BlkioDevice> {
        let capacity = blkio.get_u64("capacity")?;
        let alignment = Alignment::of(
            blkio.get_int("request-alignment")?.into(),
            blkio.get_int("buf-alignment")?.into(),
        );
        Ok(BlkioDevice {
            blkio,
            capacity,
            alignment,
            private: PrivateBufs::default(),
        })
    }
}

impl Device for BlkioDevice {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn read_only(&self) -> bool {
        self.blkio.get_bool("read-only").unwrap_or(false)
    }
    fn alignment(&self) -> Alignment {
        self.alignment
    }
    fn take_queues(&mut self) -> Vec<Box<dyn Queue>> {
        let n = self.blkio.get_int("num-queues").unwrap_or(0).max(0) as usize;
        (0..n)
            .filter_map(|i| self.blkio.take_queue(i, false))
            .collect()
    }
    fn alloc_buf(&mut self, len: usize, iomem: Iomem) -> Result<MemRegion> {
        let align = self
            .blkio
            .get_u64("mem-region-alignment")
            .unwrap_or(1)
            .max(self.alignment.buf)
            .max(4096) as usize;
        let len = len.div_ceil(align) * align;
        let r = match iomem {
            Iomem::Memfd => self.blkio.alloc_mem_region(len)?,
            Iomem::Malloc => {
                let needs_fd = self.blkio.get_bool("needs-mem-region-fd").unwrap_or(false);
                self.private.alloc(len, needs_fd)?
            }
        };
        // Registering lets drivers use fixed buffers; a driver that cannot is still usable.
        let _ = self.blkio.map_mem_region(&r);
        Ok(r)
    }
}

type Ctor = Box<dyn FnMut(usize, bool) -> Result<Blkio> + Send>;

/// A target built by a closure returning a started [`Blkio`] with the given queue count.
pub struct BlkioTarget {
    name: String,
    ctor: Ctor,
}

impl BlkioTarget {
    /// A target named `name` whose every open calls `ctor(num_queues, direct)`.
    pub fn new(
        name: impl Into<String>,
        ctor: impl FnMut(usize, bool) -> Result<Blkio> + Send + 'static,
    ) -> Self {
        BlkioTarget {
            name: name.into(),
            ctor: Box::new(ctor),
        }
    }
}

impl Target for BlkioTarget {
    fn open(&mut self, num_queues: usize, direct: bool) -> Result<Box<dyn Device>> {
        let b = (self.ctor)(num_queues, direct)?;
        Ok(Box::new(BlkioDevice::new(b)?))
    }
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn driver(&self) -> String {
        self.name.clone()
    }
}

/// A snapblk device spec (`null:size=1G`, `sync:path=F`, …) or a plain path (io_uring driver),
/// opened through the `snapblk` registry. `direct` adds `direct=true` for path targets, and
/// read-only jobs add `read-only=true` ([`Target::set_read_only`]).
pub struct SpecTarget {
    spec: String,
    read_only: bool,
}

impl SpecTarget {
    /// The target of a device spec or path.
    pub fn new(spec: impl Into<String>) -> SpecTarget {
        SpecTarget {
            spec: spec.into(),
            read_only: false,
        }
    }

    /// The spec actually opened: when the spec has a `path`, `direct=true` is added when asked,
    /// and `read-only=true` after [`Target::set_read_only`] (unless the spec sets them).
    pub fn effective_spec(&self, direct: bool) -> String {
        let Ok(s) = snapblk::parse_spec(&self.spec) else {
            return self.spec.clone();
        };
        let has = |key: &str| s.props.iter().any(|(k, _)| k == key);
        if !has("path") {
            return self.spec.clone();
        }
        let extra: Vec<&str> = [
            (direct && !has("direct")).then_some("direct=true"),
            (self.read_only && !has("read-only")).then_some("read-only=true"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if extra.is_empty() {
            return self.spec.clone();
        }
        let props: Vec<String> = s
            .props
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .chain(extra.into_iter().map(String::from))
            .collect();
        format!("{}:{}", s.driver, props.join(","))
    }
}

/// The driver name of `spec` if it is clearly meant as a device spec (`name:key=value…`, the
/// name a plain word) but names no driver snapblk knows, and no such path exists; paths that
/// merely contain a colon keep working.
fn unknown_driver(spec: &str) -> Option<&str> {
    let (drv, rest) = spec.split_once(':')?;
    let word = !drv.is_empty()
        && drv
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    (word
        && rest.contains('=')
        && !snapblk::DRIVERS.contains(&drv)
        && !std::path::Path::new(spec).exists())
    .then_some(drv)
}

impl Target for SpecTarget {
    fn open(&mut self, num_queues: usize, direct: bool) -> Result<Box<dyn Device>> {
        if let Some(d) = unknown_driver(&self.spec) {
            return Err(Error::Other(format!(
                "unknown driver {d:?} in device spec {:?} (known: {})",
                self.spec,
                snapblk::DRIVERS.join(", ")
            )));
        }
        let spec = self.effective_spec(direct);
        let n = i32::try_from(num_queues).map_err(|_| Error::Spec("too many queues".into()))?;
        let b = snapblk::open(&spec, n).map_err(|source| Error::Open {
            spec: spec.clone(),
            source,
        })?;
        Ok(Box::new(BlkioDevice::new(b)?))
    }
    fn describe(&self) -> String {
        self.spec.clone()
    }
    fn driver(&self) -> String {
        snapblk::parse_spec(&self.spec)
            .map(|s| s.driver)
            .unwrap_or_default()
    }
    fn set_read_only(&mut self, read_only: bool) {
        self.read_only = read_only;
    }
    fn direct_supported(&self) -> bool {
        // Only a `path` gets `direct=true` added (effective_spec).
        snapblk::parse_spec(&self.spec).is_ok_and(|s| s.props.iter().any(|(k, _)| k == "path"))
    }
    fn path(&self) -> Option<PathBuf> {
        let s = snapblk::parse_spec(&self.spec).ok()?;
        s.props
            .into_iter()
            .find(|(k, _)| k == "path" || k == "base")
            .map(|(_, v)| PathBuf::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_drivers_are_named_and_paths_with_colons_still_open() {
        let e = SpecTarget::new("nosuchdriver:x=1")
            .open(1, false)
            .err()
            .expect("opened an unknown driver")
            .to_string();
        assert_eq!(
            e,
            "unknown driver \"nosuchdriver\" in device spec \"nosuchdriver:x=1\" \
             (known: io_uring, sync, virtio-blk-vhost-user, nvme-io_uring, virtio-blk-vhost-vdpa, virtio-blk-vfio-pci, null, rbd, snapshot, s3, http)"
        );
        assert_eq!(unknown_driver("/tmp/a:b=c"), None);
        assert_eq!(unknown_driver("img:1"), None);
        assert_eq!(unknown_driver("null:size=1M"), None);
        // Only targets with a path can be opened O_DIRECT.
        assert!(SpecTarget::new("/some/file").direct_supported());
        assert!(SpecTarget::new("sync:path=/f").direct_supported());
        assert!(!SpecTarget::new("null:size=1M").direct_supported());
        assert!(!SpecTarget::new("snapshot:base=/a,cow=/b").direct_supported());
        // Read-only jobs open files read-only; specs without a file are left alone.
        let mut t = SpecTarget::new("/f");
        assert_eq!(t.effective_spec(true), "io_uring:path=/f,direct=true");
        t.set_read_only(true);
        assert_eq!(
            t.effective_spec(true),
            "io_uring:path=/f,direct=true,read-only=true"
        );
        assert_eq!(t.effective_spec(false), "io_uring:path=/f,read-only=true");
        let mut t = SpecTarget::new("sync:path=/f,read-only=false");
        t.set_read_only(true);
        assert_eq!(t.effective_spec(false), "sync:path=/f,read-only=false");
        let mut t = SpecTarget::new("null:size=1M");
        t.set_read_only(true);
        assert_eq!(t.effective_spec(true), "null:size=1M");
        // A path whose file name looks like a spec is still a path.
        let dir = std::env::temp_dir().join(format!("snapblk-bench-colon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("disk:a=b");
        std::fs::write(&f, vec![0u8; 1 << 20]).unwrap();
        let dev = SpecTarget::new(f.to_str().unwrap()).open(1, false).unwrap();
        assert_eq!(dev.capacity(), 1 << 20);
        drop(dev);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn private_buffers_are_refused_to_drivers_that_need_an_fd() {
        let mut p = PrivateBufs::default();
        let e = p.alloc(4096, true).unwrap_err().to_string();
        assert!(e.contains("--iomem memfd"), "{e}");
        let r = p.alloc(4096, false).unwrap();
        assert_eq!(r.fd, -1);
        assert_eq!(p.0.len(), 1);
    }
}
