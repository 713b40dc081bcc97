//! `virtio-blk-vfio-pci`: a virtio-blk PCI device driven from user space through VFIO.
//!
//! * `sys`: every `unsafe` (the VFIO ioctls of the legacy container API with the type1v2
//!   IOMMU, region reads and writes, BARs mapped into the process);
//! * `pci`: the device and its virtio-pci modern transport (capabilities, status, features,
//!   queues, MSI-X, DMA mappings);
//! * `watch`: a thread per open device that fans a shared MSI-X vector out to the queues
//!   sharing it and releases the device when the kernel asks for it back (removal).
//!
//! The queues are the split virtqueues of the vhost-user driver (`vhost_user::virtq`), with
//! their memory and the caller's regions mapped for the device at allocated IOVAs, doorbells
//! written to the notify BAR and one MSI-X vector per (non-poll) queue signalling its
//! completion eventfd while vectors last; the remaining queues share the last one.
//!
//! Beyond libblkio: a device that does not offer `VIRTIO_F_ACCESS_PLATFORM` is refused (it
//! would bypass the IOMMU and read process addresses as guest-physical ones); a buffer outside
//! every mapped region fails with `EFAULT` at enqueue; a length that is not a multiple of 512
//! fails with `EINVAL`; a device with fewer MSI-X vectors than queues shares one (libblkio
//! needs one per queue); a removed device fails its requests with EIO and is released.

mod pci;
mod sys;
mod watch;

use crate::vhost_user::sys::Shm;
use crate::vhost_user::virtq::{Caps, Doorbell, Layout, Regions, Ring, VuQueue, completion_wiring};
use crate::vhost_user::{
    CONFIG_LEN, F_EVENT_IDX, F_RO, F_VERSION_1, MAX_QUEUE_SIZE, WANTED as BLK_WANTED, blk_info,
    check_queue_size, created,
};
use pci::{Dev, NO_VECTOR, PciError, S_ACKNOWLEDGE, S_DRIVER};
use snapblk_core::sys::EventFd;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, MemRegion, PropSpec, PropType, PropValue, Queue, Result,
    State,
};
use std::sync::Arc;
use watch::Watcher;

/// The driver's name.
pub(crate) const NAME: &str = "virtio-blk-vfio-pci";

const PROPS: &[PropSpec] = &[
    PropSpec::new("path", PropType::Str, Access::RwCreated, false),
    PropSpec::new("fd", PropType::Int, Access::RwCreated, false),
    PropSpec::new("queue-size", PropType::Int, Access::RwConnected, false),
    PropSpec::new("max-queue-size", PropType::Int, Access::ReadOnly, false),
];

/// The bits the PCI transport asks for beyond the virtio-blk ones (virtio 1.2 §6): the
/// platform bits and packed rings.
const F_ACCESS_PLATFORM: u64 = 1 << 33;
const F_RING_PACKED: u64 = 1 << 34;
const F_ORDER_PLATFORM: u64 = 1 << 36;
/// What libblkio asks every virtio-blk device for, plus what its PCI transport adds.
const WANTED: u64 = BLK_WANTED | F_ACCESS_PLATFORM | F_RING_PACKED | F_ORDER_PLATFORM;

/// The open device and what was negotiated.
#[derive(Debug)]
struct Conn {
    dev: Arc<Dev>,
    features: u64,
    capacity: u64,
    max_queues: usize,
    seg_max: usize,
    next_queue: usize,
    next_vector: u32,
    /// Mapped regions: `(start, len, iova)`.
    mapped: Vec<(usize, usize, u64)>,
    /// Whether the last vector is shared (wired to the watcher's hub).
    sharing: bool,
    /// Fans the shared vector out and answers removal; stopped and joined when dropped.
    watch: Watcher,
}

/// The `virtio-blk-vfio-pci` driver.
#[derive(Debug)]
pub struct VfioPciDriver {
    path: String,
    queue_size: i32,
    read_only: bool,
    conn: Option<Conn>,
    regions: Regions,
}

impl VfioPciDriver {
    /// A driver in the created state.
    pub fn new() -> Self {
        VfioPciDriver {
            path: String::new(),
            queue_size: 256,
            read_only: false,
            conn: None,
            regions: Regions::default(),
        }
    }
}

impl Default for VfioPciDriver {
    fn default() -> Self {
        Self::new()
    }
}

fn pe(e: PciError) -> Error {
    Error::from_chain(e.errno(), &e)
}

/// A queue's doorbell: a 16-bit write of its index to its notify address.
struct Bell {
    dev: Arc<Dev>,
    off: u64,
    index: u16,
}

impl Doorbell for Bell {
    fn ring(&self) {
        self.dev.notify(self.off, self.index);
    }
}

impl VfioPciDriver {
    fn open(&mut self, read_only: bool) -> std::result::Result<(Conn, DeviceInfo), PciError> {
        let o = Dev::open(&self.path)?;
        let dev = o.dev;
        dev.reset()?;
        dev.add_status(S_ACKNOWLEDGE);
        dev.add_status(S_DRIVER);
        let offered = dev.device_features();
        if offered & F_VERSION_1 == 0 {
            return Err(PciError::Legacy("VIRTIO_F_VERSION_1"));
        }
        if offered & F_ACCESS_PLATFORM == 0 {
            return Err(PciError::Queue(
                "the device does not offer VIRTIO_F_ACCESS_PLATFORM: it would bypass the IOMMU \
                 (QEMU: iommu_platform=on)"
                    .into(),
            ));
        }
        let features = offered & WANTED;
        dev.set_features(features)?;
        let blk = blk_info(&dev.config(CONFIG_LEN as usize), features, read_only);
        let max_queues = blk.num_queues.min(u64::from(dev.num_queues())).max(1) as usize;
        let info = DeviceInfo {
            max_queues: max_queues as i32,
            max_mem_regions: o.dma_avail,
            mem_region_alignment: o.page,
            needs_mem_region_fd: false,
            ..blk.info
        };
        let dev = Arc::new(dev);
        let watch = Watcher::start(dev.clone())
            .map_err(|e| PciError::Queue(format!("starting the watcher thread: {e}")))?;
        Ok((
            Conn {
                watch,
                sharing: false,
                dev,
                features,
                capacity: blk.capacity,
                max_queues,
                seg_max: blk.seg_max,
                next_queue: 0,
                next_vector: 0,
                mapped: Vec::new(),
            },
            info,
        ))
    }
}

impl Driver for VfioPciDriver {
    fn name(&self) -> &str {
        NAME
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _: State) -> Result<PropValue> {
        Ok(match name {
            "path" => PropValue::Str(self.path.clone()),
            "fd" => PropValue::Int(-1),
            "queue-size" => PropValue::Int(self.queue_size),
            "max-queue-size" => PropValue::Int(MAX_QUEUE_SIZE),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        })
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _: State) -> Result<()> {
        match (name, value) {
            ("path", PropValue::Str(s)) => self.path = s,
            // As libblkio 1.5 (observed in the VM): only vhost-vdpa takes an fd. QEMU probes
            // the property, and falls back to `path` when setting it fails.
            ("fd", _) => return Err(Error::new(libc::ENOENT, "fd property not supported")),
            ("queue-size", PropValue::Int(n)) => self.queue_size = check_queue_size(n)?,
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
        Ok(())
    }
    fn created_info(&self) -> Option<DeviceInfo> {
        Some(created())
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        if self.path.is_empty() {
            return Err(Error::inval("One of path and fd must be set"));
        }
        let (conn, info) = self.open(read_only).map_err(pe)?;
        self.read_only = read_only;
        self.conn = Some(conn);
        Ok(info)
    }
    fn capacity(&self) -> Result<u64> {
        match &self.conn {
            Some(c) => Ok(c.capacity),
            None => Err(Error::new(libc::ENODEV, "Device must be connected")),
        }
    }
    fn can_add_queues(&self) -> bool {
        false
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        if c.features & F_RO != 0 && !self.read_only {
            return Err(Error::new(libc::EROFS, "Device is read-only"));
        }
        let index = c.next_queue;
        if index >= c.max_queues {
            return Err(Error::inval(format!(
                "num_queues + num_poll_queues must not be greater than {}",
                c.max_queues
            )));
        }
        if !poll && c.dev.msix == 0 {
            return Err(Error::inval(
                "the device has no MSI-X vector: only poll queues (num-queues=0) are possible",
            ));
        }
        let packed = c.features & F_RING_PACKED != 0;
        let lay = if packed {
            Layout::packed(self.queue_size as usize)
        } else {
            Layout::new(self.queue_size as usize)
        };
        let shm = Shm::new(c"virtio-ring", lay.size)?;
        let base = c.dev.map(shm.addr(), shm.len() as u64).map_err(pe)?;
        let call = EventFd::new()?;
        // One vector per regular queue while they last; then the last vector is shared, wired
        // to the watcher's hub, which signals every sharing queue's own eventfd.
        let vector = if poll {
            NO_VECTOR
        } else if c.next_vector < c.dev.msix {
            c.dev.wire_vector(c.next_vector, call.raw()).map_err(pe)?;
            c.next_vector as u16
        } else {
            if !c.sharing {
                c.dev
                    .wire_vector(c.dev.msix - 1, c.watch.hub())
                    .map_err(pe)?;
                c.watch.share_last();
                c.sharing = true;
            }
            (c.dev.msix - 1) as u16
        };
        let rings = (base, base + lay.avail as u64, base + lay.used as u64);
        let off = c
            .dev
            .setup_queue(index as u16, lay.n as u16, vector, rings)
            .map_err(pe)?;
        if !poll {
            c.watch.add(call.raw(), c.sharing)?;
            c.next_vector = (c.next_vector + 1).min(c.dev.msix);
        }
        c.next_queue += 1;
        // The ring watches a "socket" for hang-ups: the watcher's `gone` socket, which hangs up
        // once the device was removed.
        let gone = c.watch.gone()?;
        let kick = EventFd::new()?;
        let (calls, core) = completion_wiring(call, poll)?;
        let f = c.features;
        let caps = Caps::negotiated(f, self.read_only, c.seg_max);
        let bell = Bell {
            dev: c.dev.clone(),
            off,
            index: index as u16,
        };
        let mut ring = Ring::new(shm, lay, kick, calls, gone, f & F_EVENT_IDX != 0)
            .with_hangup(c"the device was removed")
            .at(base)
            .with_doorbell(Box::new(bell));
        if packed {
            ring = ring.with_packed();
        }
        Ok(Box::new(VuQueue {
            core,
            ring,
            caps,
            regions: self.regions.clone(),
        }))
    }
    fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        let start = region.addr as usize;
        let iova = c
            .dev
            .map(region.addr as u64, region.len as u64)
            .map_err(pe)?;
        c.mapped.push((start, region.len, iova));
        // The queues translate buffers through the IOVA kept with each region.
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, start + region.len, iova));
        Ok(())
    }
    fn unmap_mem_region(&mut self, region: &MemRegion) {
        let start = region.addr as usize;
        let end = start + region.len;
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&(s, e, _)| (s, e) != (start, end));
        if let Some(c) = self.conn.as_mut()
            && let Some(i) = c
                .mapped
                .iter()
                .position(|&(s, l, _)| (s, l) == (start, region.len))
        {
            let (_, l, iova) = c.mapped.swap_remove(i);
            c.dev.unmap(iova, l as u64);
        }
    }
}

#[cfg(test)]
mod tests;
