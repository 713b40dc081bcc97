//! `virtio-blk-vhost-vdpa`: a virtio-blk device behind the kernel's vhost-vdpa bus
//! (`/dev/vhost-vdpa-N`: a hardware vDPA device, or a VDUSE device served by a user-space
//! daemon such as `qemu-storage-daemon --export type=vduse-blk`).
//!
//! * `sys`: every `unsafe` (the vhost ioctls and the IOTLB messages);
//! * `iova`: IOVAs allocated inside the device's IOVA range;
//! * the virtqueues and the virtio-blk request layer are the vhost-user driver's
//!   (`vhost_user::virtq`), fed IOVAs instead of process addresses.
//!
//! Connect: `VHOST_SET_OWNER`, the backend features (`IOTLB_MSG_V2`), the device status reset
//! and `ACKNOWLEDGE | DRIVER`, features (libblkio's virtio-blk set plus `ACCESS_PLATFORM`),
//! `FEATURES_OK`, then the config space, the IOVA range and the queue count. Start: each queue's
//! ring memory (a memfd, as VDUSE needs file-backed memory) is mapped at an IOVA with an
//! `IOTLB_UPDATE` message, its vring set up and enabled; once all exist, `DRIVER_OK`. Memory
//! regions are mapped the same way and unmapped with `IOTLB_INVALIDATE`.

mod sys;

use crate::iova::IovaSpace;
use crate::vhost_user::virtq::{Caps, Layout, Regions, Ring, STALL, VuQueue, completion_wiring};
use crate::vhost_user::{
    CONFIG_LEN, F_EVENT_IDX, F_RO, F_VERSION_1, MAX_QUEUE_SIZE, WANTED, blk_info, check_queue_size,
    created, sat,
};
use snapblk_core::sys::EventFd;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, MemRegion, PropSpec, PropType, PropValue, Queue, Result,
    State,
};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use sys::Vdpa;

/// Mapping granule and alignment (`VHOST_PAGE_SIZE`, libblkio's `mem-region-alignment`).
const PAGE: u64 = 4096;

/// The driver's name.
pub(crate) const NAME: &str = "virtio-blk-vhost-vdpa";

const PROPS: &[PropSpec] = &[
    PropSpec::new("path", PropType::Str, Access::RwCreated, false),
    PropSpec::new("fd", PropType::Int, Access::RwCreated, false),
    PropSpec::new("queue-size", PropType::Int, Access::RwConnected, false),
    PropSpec::new("max-queue-size", PropType::Int, Access::ReadOnly, false),
];

/// `VIRTIO_F_ACCESS_PLATFORM`: the device accesses memory through an IOMMU (here: IOVAs).
const F_ACCESS_PLATFORM: u64 = 1 << 33;
/// `VIRTIO_ID_BLOCK`.
const DEVICE_ID_BLOCK: u32 = 2;

/// Device status bits (virtio 1.x §2.1).
const S_ACKNOWLEDGE: u8 = 1;
const S_DRIVER: u8 = 2;
const S_DRIVER_OK: u8 = 4;
const S_FEATURES_OK: u8 = 8;
const S_NEEDS_RESET: u8 = 0x40;
const S_FAILED: u8 = 0x80;

/// Why connecting or starting failed (the step, then the system error).
#[derive(Debug, thiserror::Error)]
enum VdpaError {
    #[error("Failed to connect to vDPA device path")]
    Path {
        #[source]
        source: Step,
    },
    #[error("Failed to use vDPA device fd")]
    Fd {
        #[source]
        source: Step,
    },
    #[error("{0}")]
    Device(&'static str),
}

/// One step of the setup and its error.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
struct Step {
    what: &'static str,
    #[source]
    source: io::Error,
}

trait Ctx<T> {
    fn at(self, what: &'static str) -> std::result::Result<T, Step>;
}
impl<T> Ctx<T> for io::Result<T> {
    fn at(self, what: &'static str) -> std::result::Result<T, Step> {
        self.map_err(|source| Step { what, source })
    }
}

fn step_err(e: Step) -> Error {
    let errno = e.source.raw_os_error().unwrap_or(libc::EIO);
    Error::from_chain(errno, &e)
}

/// What connect learnt from the device.
struct Negotiated {
    status: u8,
    features: u64,
    /// The virtio-blk config space.
    cfg: Vec<u8>,
    iova_range: (u64, u64),
    vqs: u32,
    vring_max: u16,
}

/// The device and what was negotiated.
#[derive(Debug)]
struct Conn {
    dev: Vdpa,
    status: u8,
    features: u64,
    capacity: u64,
    max_queues: usize,
    seg_max: usize,
    /// `VHOST_VDPA_GET_VRING_NUM`: the largest queue the device takes.
    vring_max: u16,
    iovas: IovaSpace,
    next_queue: usize,
    /// Mapped memory regions: (process address, length, IOVA).
    mapped: Vec<(usize, usize, u64)>,
}

/// The `virtio-blk-vhost-vdpa` driver.
#[derive(Debug)]
pub struct VhostVdpaDriver {
    path: String,
    /// The `fd` property: -1, or a descriptor handed over by the caller (owned by the driver
    /// once `connect` succeeds; a failed connect leaves it to the caller).
    fd: i32,
    queue_size: i32,
    read_only: bool,
    conn: Option<Conn>,
    regions: Regions,
}

impl VhostVdpaDriver {
    /// A driver in the created state.
    pub fn new() -> Self {
        VhostVdpaDriver {
            path: String::new(),
            fd: -1,
            queue_size: 256,
            read_only: false,
            conn: None,
            regions: Regions::default(),
        }
    }

    /// Negotiate with the device up to `FEATURES_OK` and read what it is.
    fn negotiate(dev: &mut Vdpa) -> std::result::Result<Negotiated, Step> {
        dev.set_owner().at("VHOST_SET_OWNER")?;
        let id = dev
            .get_u32(sys::GET_DEVICE_ID)
            .at("VHOST_VDPA_GET_DEVICE_ID")?;
        if id != DEVICE_ID_BLOCK {
            return Err(Step {
                what: "not a virtio-blk device",
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        dev.negotiate_backend().at("VHOST_SET_BACKEND_FEATURES")?;
        dev.set_status(0).at("resetting the device")?;
        let mut status = S_ACKNOWLEDGE | S_DRIVER;
        dev.set_status(status).at("VHOST_VDPA_SET_STATUS")?;
        let offered = dev.get_u64(sys::GET_FEATURES).at("VHOST_GET_FEATURES")?;
        let features = offered & (WANTED | F_ACCESS_PLATFORM);
        if features & F_VERSION_1 == 0 {
            return Err(Step {
                what: "the device does not offer VIRTIO_F_VERSION_1",
                source: io::Error::from_raw_os_error(libc::ENOTSUP),
            });
        }
        dev.set_u64(sys::SET_FEATURES, features)
            .at("VHOST_SET_FEATURES")?;
        status |= S_FEATURES_OK;
        dev.set_status(status).at("VHOST_VDPA_SET_STATUS")?;
        if dev.status().at("VHOST_VDPA_GET_STATUS")? & S_FEATURES_OK == 0 {
            return Err(Step {
                what: "the device refused the features (FEATURES_OK)",
                source: io::Error::from_raw_os_error(libc::ENOTSUP),
            });
        }
        let size = dev
            .get_u32(sys::GET_CONFIG_SIZE)
            .at("VHOST_VDPA_GET_CONFIG_SIZE")?;
        let cfg = dev
            .config(CONFIG_LEN.min(size))
            .at("VHOST_VDPA_GET_CONFIG")?;
        let (first, last) = dev.iova_range().at("VHOST_VDPA_GET_IOVA_RANGE")?;
        let vqs = dev
            .get_u32(sys::GET_VQS_COUNT)
            .at("VHOST_VDPA_GET_VQS_COUNT")?;
        let vring_max = dev.vring_num_max().at("VHOST_VDPA_GET_VRING_NUM")?;
        Ok(Negotiated {
            status,
            features,
            cfg,
            iova_range: (first, last),
            vqs,
            vring_max,
        })
    }

    /// Set up vring `next_queue` and its queue.
    fn new_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        if c.features & F_RO != 0 && !self.read_only {
            return Err(Error::new(libc::EROFS, "Device is read-only"));
        }
        if c.status & S_DRIVER_OK != 0 {
            return Err(Error::new(
                libc::ENOTSUP,
                "Driver does not support dynamically adding queues",
            ));
        }
        let index = c.next_queue;
        if index >= c.max_queues {
            return Err(Error::inval(format!(
                "num_queues + num_poll_queues must not be greater than {}",
                c.max_queues
            )));
        }
        if self.queue_size > i32::from(c.vring_max) {
            return Err(Error::inval(format!(
                "queue-size {} is larger than the device's largest queue ({})",
                self.queue_size, c.vring_max
            )));
        }
        let lay = Layout::new(self.queue_size as usize);
        let shm = crate::vhost_user::sys::Shm::new(c"virtio-ring", lay.size)?;
        let len = shm.len() as u64;
        let iova = c
            .iovas
            .alloc(len)
            .ok_or_else(|| Error::new(libc::ENOSPC, "the device's IOVA range is full"))?;
        let mapped = c.dev.map(iova, len, shm.addr()).at("IOTLB_UPDATE");
        if let Err(e) = mapped {
            c.iovas.free(iova);
            return Err(step_err(e));
        }
        let i = index as u32;
        let d = &c.dev;
        let setup = (|| {
            let kick = EventFd::new()?;
            // Poll queues get a call eventfd too, which nobody reads (as the vhost-user driver).
            let call = EventFd::new()?;
            (|| {
                d.vring_state(sys::SET_VRING_NUM, i, lay.n as u32)
                    .at("VHOST_SET_VRING_NUM")?;
                d.vring_state(sys::SET_VRING_BASE, i, 0)
                    .at("VHOST_SET_VRING_BASE")?;
                d.vring_addr(i, iova, iova + lay.used as u64, iova + lay.avail as u64)
                    .at("VHOST_SET_VRING_ADDR")?;
                d.vring_fd(sys::SET_VRING_KICK, i, kick.raw())
                    .at("VHOST_SET_VRING_KICK")?;
                d.vring_fd(sys::SET_VRING_CALL, i, call.raw())
                    .at("VHOST_SET_VRING_CALL")?;
                d.vring_state(sys::SET_VRING_ENABLE, i, 1)
                    .at("VHOST_VDPA_SET_VRING_ENABLE")
            })()
            .map_err(step_err)?;
            let watch = d.dup().map_err(Error::from_io)?;
            let probe_dev = Vdpa::from_fd(d.dup().map_err(Error::from_io)?);
            Ok((kick, call, watch, probe_dev))
        })();
        // On success the ring stays mapped for the life of the device (closing it drops the
        // IOTLB); on failure it is unmapped again.
        let (kick, call, watch, probe_dev) = match setup {
            Ok(fds) => fds,
            Err(e) => {
                if c.dev.unmap(iova, len).is_ok() {
                    c.iovas.free(iova);
                }
                return Err(e);
            }
        };
        // A VDUSE daemon that dies leaves no trace on any descriptor; when requests stall,
        // ask the device for the vring's state, which the daemon must answer.
        let probe = Box::new(move || probe_dev.vring_base(i).is_ok());
        c.next_queue += 1;
        let (calls, core) = completion_wiring(call, poll)?;
        let f = c.features;
        let caps = Caps::negotiated(f, self.read_only, c.seg_max);
        Ok(Box::new(VuQueue {
            core,
            ring: Ring::new(shm, lay, kick, calls, watch, f & F_EVENT_IDX != 0)
                .at(iova)
                .with_probe(probe, c"vhost-vdpa device stopped responding", STALL),
            caps,
            regions: self.regions.clone(),
        }))
    }
}

impl Default for VhostVdpaDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl Driver for VhostVdpaDriver {
    fn name(&self) -> &str {
        NAME
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _: State) -> Result<PropValue> {
        Ok(match name {
            "path" => PropValue::Str(self.path.clone()),
            "fd" => PropValue::Int(self.fd),
            "queue-size" => PropValue::Int(self.queue_size),
            "max-queue-size" => PropValue::Int(MAX_QUEUE_SIZE),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        })
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _: State) -> Result<()> {
        match (name, value) {
            ("path", PropValue::Str(s)) => self.path = s,
            ("fd", PropValue::Int(n)) => self.fd = n,
            ("queue-size", PropValue::Int(n)) => self.queue_size = check_queue_size(n)?,
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
        Ok(())
    }
    fn created_info(&self) -> Option<DeviceInfo> {
        Some(created())
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        let by_fd = self.fd >= 0;
        if by_fd && !self.path.is_empty() {
            return Err(Error::inval("path and fd cannot be set at the same time"));
        }
        if !by_fd && self.path.is_empty() {
            return Err(Error::inval("One of path and fd must be set"));
        }
        let opened = if by_fd {
            if Vdpa::is_open(self.fd) {
                // SAFETY: the caller handed this open descriptor to the driver through the
                // `fd` property (libblkio's contract); if connect fails it is given back
                // unclosed (`into_raw` below), so it is owned exactly once.
                Ok(Vdpa::from_fd(unsafe { OwnedFd::from_raw_fd(self.fd) }))
            } else {
                Err(io::Error::from_raw_os_error(libc::EBADF)).at("the fd is not open")
            }
        } else {
            Vdpa::open(&self.path).at("opening the device")
        };
        let negotiated = opened.and_then(|mut dev| match Self::negotiate(&mut dev) {
            Ok(n) => Ok((dev, n)),
            Err(e) => {
                if by_fd {
                    // The caller keeps its descriptor when connect fails.
                    let _ = dev.into_raw();
                }
                Err(e)
            }
        });
        let (dev, n) = negotiated.map_err(|source| {
            let e = if by_fd {
                VdpaError::Fd { source }
            } else {
                VdpaError::Path { source }
            };
            Error::from_chain(libc::EIO, &e)
        })?;
        let mut conn = Conn {
            dev,
            status: n.status,
            features: n.features,
            capacity: 0,
            max_queues: n.vqs as usize,
            seg_max: 1,
            vring_max: n.vring_max,
            iovas: IovaSpace::new(vec![n.iova_range], PAGE),
            next_queue: 0,
            mapped: Vec::new(),
        };
        let cfg = n.cfg;
        let blk = blk_info(&cfg, conn.features, read_only);
        let max_queues = blk.num_queues.min(conn.max_queues as u64);
        conn.capacity = blk.capacity;
        conn.seg_max = blk.seg_max;
        conn.max_queues = max_queues as usize;
        let info = DeviceInfo {
            max_queues: sat(max_queues),
            max_mem_regions: u64::MAX,
            mem_region_alignment: PAGE,
            ..blk.info
        };
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
        let q = self.new_queue(poll);
        if q.is_err()
            && let Some(c) = self.conn.as_mut()
        {
            // start failed: the next start sets the vrings up again from the first.
            c.next_queue = 0;
        }
        q
    }
    fn queues_created(&mut self) -> Result<()> {
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        let status = c.status | S_DRIVER_OK;
        let live = c
            .dev
            .set_status(status)
            .and_then(|()| c.dev.status())
            .at("VHOST_VDPA_SET_STATUS")
            .map_err(step_err)
            .and_then(|now| {
                if now & (S_NEEDS_RESET | S_FAILED) != 0 || now & S_DRIVER_OK == 0 {
                    return Err(Error::from_chain(
                        libc::EIO,
                        &VdpaError::Device("the device did not accept DRIVER_OK"),
                    ));
                }
                Ok(())
            });
        match live {
            Ok(()) => c.status = status,
            // start failed: the next start sets the vrings up again from the first.
            Err(_) => c.next_queue = 0,
        }
        live
    }
    fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        if region.fd < 0 {
            // VDUSE reaches only file-backed shared memory (vhost-vdpa skips the rest of a
            // range silently); `needs-mem-region-fd` says so.
            return Err(Error::new(
                libc::EBADF,
                "memory region has no file descriptor (needs-mem-region-fd)",
            ));
        }
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        let len = region.len as u64;
        let iova = c
            .iovas
            .alloc(len)
            .ok_or_else(|| Error::new(libc::ENOSPC, "the device's IOVA range is full"))?;
        if let Err(e) = c.dev.map(iova, len, region.addr as u64).at("IOTLB_UPDATE") {
            c.iovas.free(iova);
            return Err(step_err(e));
        }
        let start = region.addr as usize;
        c.mapped.push((start, region.len, iova));
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, start + region.len, iova));
        Ok(())
    }
    fn unmap_mem_region(&mut self, region: &MemRegion) {
        let start = region.addr as usize;
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&(s, e, _)| (s, e) != (start, start + region.len));
        if let Some(c) = self.conn.as_mut()
            && let Some(i) = c
                .mapped
                .iter()
                .position(|&(a, l, _)| (a, l) == (start, region.len))
        {
            let (_, l, iova) = c.mapped.remove(i);
            // A device that fails to unmap is beyond use anyway; the IOVA stays reserved.
            if c.dev.unmap(iova, l as u64).is_ok() {
                c.iovas.free(iova);
            }
        }
    }
}
