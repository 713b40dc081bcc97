//! `virtio-blk-vhost-user`: a virtio-blk device served by a vhost-user backend (e.g.
//! `qemu-storage-daemon --export type=vhost-user-blk`) over a unix socket.
//!
//! * [`proto`](self): the control messages (features, protocol features, config space, memory
//!   slots, vrings), as libblkio 1.5 sends them: memory regions are added one by one
//!   (`ADD_MEM_REG`, so `CONFIGURE_MEM_SLOTS` is required) at their process address;
//! * `virtq`: split virtqueues in memfd memory shared with the backend, virtio-blk requests,
//!   and the driver's queue;
//! * `sys`: every `unsafe` (the shared memory, `SCM_RIGHTS`, `ppoll`).
//!
//! Beyond libblkio: a buffer outside every mapped region fails with `EFAULT` at enqueue (the
//! backend would otherwise stop serving the device), a length that is not a multiple of 512
//! fails with `EINVAL` (libblkio hands it to the device, which answers `EIO`), and a backend
//! that hangs up fails pending and later requests with `EIO` instead of hanging — or, with the
//! `reconnect` property, is connected to again and gets the requests in flight again (`link`).

mod link;
pub(crate) mod packed;
mod proto;
pub(crate) mod sys;
pub(crate) mod virtq;

use link::{Link, Shared, Vring};
use proto::{Frontend, Req, VuError};
use snapblk_core::sys::EventFd;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, MemRegion, PropSpec, PropType, PropValue, Queue, Result,
    State,
};
use std::os::fd::OwnedFd;
use virtq::{Caps, Layout, Regions, Ring, VuQueue, completion_wiring};

/// The driver's name.
pub(crate) const NAME: &str = "virtio-blk-vhost-user";

const PROPS: &[PropSpec] = &[
    PropSpec::new("path", PropType::Str, Access::RwCreated, false),
    PropSpec::new("fd", PropType::Int, Access::RwCreated, false),
    PropSpec::new("queue-size", PropType::Int, Access::RwConnected, false),
    PropSpec::new("max-queue-size", PropType::Int, Access::ReadOnly, false),
    PropSpec::new("reconnect", PropType::Bool, Access::RwCreated, false),
];

pub(crate) const MAX_QUEUE_SIZE: i32 = 32768;

/// virtio feature bits (virtio 1.x §5.2.3 and §6).
pub(crate) const F_SIZE_MAX: u64 = 1 << 1;
pub(crate) const F_SEG_MAX: u64 = 1 << 2;
pub(crate) const F_RO: u64 = 1 << 5;
pub(crate) const F_BLK_SIZE: u64 = 1 << 6;
pub(crate) const F_FLUSH: u64 = 1 << 9;
pub(crate) const F_TOPOLOGY: u64 = 1 << 10;
pub(crate) const F_CONFIG_WCE: u64 = 1 << 11;
pub(crate) const F_MQ: u64 = 1 << 12;
pub(crate) const F_DISCARD: u64 = 1 << 13;
pub(crate) const F_WRITE_ZEROES: u64 = 1 << 14;
pub(crate) const F_EVENT_IDX: u64 = 1 << 29;
pub(crate) const F_VERSION_1: u64 = 1 << 32;
pub(crate) const WANTED: u64 = F_SIZE_MAX
    | F_SEG_MAX
    | F_RO
    | F_BLK_SIZE
    | F_FLUSH
    | F_TOPOLOGY
    | F_CONFIG_WCE
    | F_MQ
    | F_DISCARD
    | F_WRITE_ZEROES
    | F_EVENT_IDX
    | F_VERSION_1;
/// The part of `struct virtio_blk_config` read (up to `write_zeroes_may_unmap`).
pub(crate) const CONFIG_LEN: u32 = 60;

/// The connection and what was negotiated.
#[derive(Debug)]
struct Conn {
    link: Shared,
    features: u64,
    capacity: u64,
    max_queues: usize,
    /// `max-segments`: the device's `seg_max` (1 without SEG_MAX).
    seg_max: usize,
    started: bool,
    next_queue: usize,
}

/// The `virtio-blk-vhost-user` driver.
#[derive(Debug)]
pub struct VhostUserDriver {
    path: String,
    queue_size: i32,
    read_only: bool,
    reconnect: bool,
    conn: Option<Conn>,
    regions: Regions,
}

impl VhostUserDriver {
    /// A driver in the created state.
    pub fn new() -> Self {
        VhostUserDriver {
            path: String::new(),
            queue_size: 256,
            read_only: false,
            reconnect: false,
            conn: None,
            regions: Regions::default(),
        }
    }
}

impl Default for VhostUserDriver {
    fn default() -> Self {
        Self::new()
    }
}

fn vu(e: VuError) -> Error {
    let errno = match &e {
        VuError::Connect { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        VuError::Unsupported(_) => libc::ENOTSUP,
        _ => libc::EIO,
    };
    Error::from_chain(errno, &e)
}

fn le16(c: &[u8], o: usize) -> u16 {
    c.get(o..o + 2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
}

fn le32(c: &[u8], o: usize) -> u32 {
    c.get(o..o + 4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The common properties in the created state (libblkio's constants, shared notes §1.2).
pub(crate) fn created() -> DeviceInfo {
    DeviceInfo {
        request_alignment: 512,
        buf_alignment: 1,
        optimal_io_alignment: 512,
        optimal_io_size: 0,
        optimal_buf_alignment: 1,
        mem_region_alignment: 1,
        max_transfer: 0,
        max_segments: 1,
        max_segment_len: 0,
        max_write_zeroes_len: 0,
        max_discard_len: 0,
        discard_alignment: 512,
        discard_alignment_offset: 0,
        supports_fua_natively: false,
        supports_poll_queues: true,
        flush_needed: true,
        can_grow: false,
        needs_mem_regions: true,
        needs_mem_region_fd: true,
        may_pin_mem_regions: true,
        ..DeviceInfo::default()
    }
}

/// Validate a `queue-size` value with libblkio's messages.
pub(crate) fn check_queue_size(n: i32) -> Result<i32> {
    if n <= 0 {
        return Err(Error::inval("queue_size must be greater than 0"));
    }
    if !(n as u32).is_power_of_two() {
        return Err(Error::inval("queue_size must be a power of two"));
    }
    if n > MAX_QUEUE_SIZE {
        return Err(Error::inval("queue_size must be smaller than 32768"));
    }
    Ok(n)
}

pub(crate) fn sat(v: u64) -> i32 {
    v.min(i32::MAX as u64) as i32
}

/// What a virtio-blk device's config space and negotiated features say (shared by the virtio-blk
/// drivers): the common properties (libblkio's derivations, shared notes §1.2), except
/// `max-queues` and `max-mem-regions`, which the transport limits too.
#[derive(Debug, Clone)]
pub(crate) struct BlkInfo {
    pub(crate) info: DeviceInfo,
    /// Bytes.
    pub(crate) capacity: u64,
    /// `max-segments`: the device's `seg_max` (1 without SEG_MAX).
    pub(crate) seg_max: usize,
    /// `num_queues` of the config space with MQ, else 1.
    pub(crate) num_queues: u64,
}

/// Read `cfg` (the first [`CONFIG_LEN`] bytes of `struct virtio_blk_config`, shorter if the
/// device has less; missing fields read as 0) under the negotiated `features`.
pub(crate) fn blk_info(cfg: &[u8], features: u64, read_only: bool) -> BlkInfo {
    let has = |f: u64| features & f != 0;
    let capacity = cfg
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let blk = if has(F_BLK_SIZE) {
        le32(cfg, 20).max(512)
    } else {
        512
    } as u64;
    let (pexp, align_off, opt_io) = if has(F_TOPOLOGY) {
        let b = |o: usize| cfg.get(o).copied().unwrap_or(0);
        (
            u32::from(b(24)).min(16),
            u64::from(b(25)),
            u64::from(le32(cfg, 28)),
        )
    } else {
        (0, 0, 0)
    };
    let seg_max = if has(F_SEG_MAX) { le32(cfg, 12) } else { 1 }.max(1);
    let size_max = if has(F_SIZE_MAX) { le32(cfg, 8) } else { 0 };
    let num_queues = if has(F_MQ) {
        u64::from(le16(cfg, 34)).max(1)
    } else {
        1
    };
    let sectors = |o: usize, f: u64| {
        if has(f) {
            512 * u64::from(le32(cfg, o))
        } else {
            0
        }
    };
    let info = DeviceInfo {
        read_only,
        request_alignment: sat(blk),
        optimal_io_alignment: sat(blk << pexp),
        optimal_io_size: sat(blk * opt_io),
        max_segments: sat(u64::from(seg_max)),
        max_segment_len: sat(u64::from(size_max)),
        max_transfer: if has(F_SEG_MAX) && has(F_SIZE_MAX) {
            sat(u64::from(seg_max) * u64::from(size_max))
        } else {
            0
        },
        max_write_zeroes_len: sectors(48, F_WRITE_ZEROES),
        max_discard_len: sectors(36, F_DISCARD),
        discard_alignment: if has(F_DISCARD) {
            sat(512 * u64::from(le32(cfg, 44)).max(1))
        } else {
            512
        },
        discard_alignment_offset: sat(blk * align_off),
        flush_needed: if has(F_CONFIG_WCE) {
            cfg.get(32).is_some_and(|&w| w != 0)
        } else {
            has(F_FLUSH)
        },
        max_queues: sat(num_queues),
        ..created()
    };
    BlkInfo {
        info,
        capacity: capacity.saturating_mul(512),
        seg_max: seg_max as usize,
        num_queues,
    }
}

impl Driver for VhostUserDriver {
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
            "reconnect" => PropValue::Bool(self.reconnect),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        })
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _: State) -> Result<()> {
        match (name, value) {
            ("path", PropValue::Str(s)) => self.path = s,
            ("reconnect", PropValue::Bool(b)) => self.reconnect = b,
            // As libblkio 1.5: only vhost-vdpa takes an fd. QEMU probes the property, and
            // falls back to `path` when setting it fails.
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
        let mut fe = Frontend::connect(&self.path).map_err(vu)?;
        fe.call(Req::SetOwner, &[], &[]).map_err(vu)?;
        let offered = fe.get_u64(Req::GetFeatures).map_err(vu)?;
        if offered & proto::F_PROTOCOL_FEATURES == 0 {
            return Err(vu(VuError::Unsupported(
                "Backend doesn't support PROTOCOL_FEATURES",
            )));
        }
        let pf = fe.get_u64(Req::GetProtocolFeatures).map_err(vu)?;
        let need = proto::PF_REPLY_ACK | proto::PF_CONFIG | proto::PF_CONFIGURE_MEM_SLOTS;
        if pf & need != need {
            return Err(vu(VuError::Unsupported(
                "Backend lacks a protocol feature snapblk needs (REPLY_ACK, CONFIG, CONFIGURE_MEM_SLOTS)",
            )));
        }
        let protocol = pf & (need | proto::PF_MQ);
        fe.set_u64(Req::SetProtocolFeatures, protocol).map_err(vu)?;
        fe.set_reply_ack(true);
        let vq_num = if pf & proto::PF_MQ != 0 {
            fe.get_u64(Req::GetQueueNum).map_err(vu)?
        } else {
            1
        };
        let slots = fe.get_u64(Req::GetMaxMemSlots).map_err(vu)?;
        let cfg = fe.get_config(CONFIG_LEN).map_err(vu)?;
        let features = offered & WANTED;
        if features & F_VERSION_1 == 0 {
            return Err(vu(VuError::Unsupported(
                "the device does not offer VIRTIO_F_VERSION_1",
            )));
        }
        let blk = blk_info(&cfg, features, read_only);
        let max_queues = blk.num_queues.min(vq_num);
        let info = DeviceInfo {
            max_queues: sat(max_queues),
            max_mem_regions: slots,
            ..blk.info
        };
        self.read_only = read_only;
        self.conn = Some(Conn {
            link: Link::new(fe, &self.path, protocol),
            features,
            capacity: blk.capacity,
            max_queues: max_queues as usize,
            seg_max: blk.seg_max,
            started: false,
            next_queue: 0,
        });
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
        if !c.started {
            if c.features & F_RO != 0 && !self.read_only {
                return Err(Error::new(libc::EROFS, "Device is read-only"));
            }
            link::lock(&c.link)
                .set_features(c.features | proto::F_PROTOCOL_FEATURES)
                .map_err(vu)?;
            c.started = true;
        }
        let index = c.next_queue;
        if index >= c.max_queues {
            return Err(Error::inval(format!(
                "num_queues + num_poll_queues must not be greater than {}",
                c.max_queues
            )));
        }
        let lay = Layout::new(self.queue_size as usize);
        let shm = sys::Shm::new(c"virtio-ring", lay.size)?;
        let mut l = link::lock(&c.link);
        l.add_region(shm.addr(), shm.len() as u64, shm.fd(), 0)
            .map_err(vu)?;
        let kick = EventFd::new()?;
        // Poll queues get a call eventfd too, which nobody reads: libvhost-user (QEMU 7.2) stops
        // serving the device when it must notify a vring without one, and with EVENT_IDX it
        // notifies at least once.
        let call = EventFd::new()?;
        let base = shm.addr();
        let vring = Vring {
            index: index as u32,
            num: lay.n as u32,
            desc: base,
            used: base + lay.used as u64,
            avail: base + lay.avail as u64,
            kick: kick.raw(),
            call: call.raw(),
        };
        l.setup_vring(vring).map_err(vu)?;
        c.next_queue += 1;
        let sock: OwnedFd = l
            .sock_dup()
            .map_err(|e| Error::new(e.raw_os_error().unwrap_or(libc::EIO), "dup of the socket"))?;
        let epoch = l.epoch();
        drop(l);
        let (calls, core) = completion_wiring(call, poll)?;
        let f = c.features;
        let caps = Caps::negotiated(f, self.read_only, c.seg_max);
        Ok(Box::new(VuQueue {
            core,
            ring: Ring::new(shm, lay, kick, calls, sock, f & F_EVENT_IDX != 0).with_link(
                vring,
                epoch,
                c.link.clone(),
                self.reconnect,
            ),
            caps,
            regions: self.regions.clone(),
        }))
    }
    fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        if region.fd < 0 {
            return Err(Error::new(libc::EIO, "Bad file descriptor (os error 9)"));
        }
        let Some(c) = self.conn.as_mut() else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        let addr = region.addr as u64;
        link::lock(&c.link)
            .add_region(addr, region.len as u64, region.fd, region.fd_offset as u64)
            .map_err(vu)?;
        let start = region.addr as usize;
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, start + region.len, start as u64));
        Ok(())
    }
    fn unmap_mem_region(&mut self, region: &MemRegion) {
        let start = region.addr as usize;
        self.regions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&(s, e, _)| (s, e) != (start, start + region.len));
        if let Some(c) = self.conn.as_mut() {
            link::lock(&c.link).remove_region(
                region.addr as u64,
                region.len as u64,
                region.fd,
                region.fd_offset as u64,
            );
        }
    }
}
