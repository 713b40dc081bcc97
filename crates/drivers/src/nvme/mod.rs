//! `nvme-io_uring`: an NVMe namespace through its generic character device (`/dev/ngXnY`),
//! with NVMe commands passed through io_uring (`IORING_OP_URING_CMD`, 128-byte SQEs and 32-byte
//! CQEs), as libblkio 1.5's driver of that name.
//!
//! * connect: `NVME_IOCTL_ID`, then Identify through `NVME_IOCTL_ADMIN_CMD`: the namespace
//!   (CNS 0: size, LBA format), the controller (CNS 1: MDTS, ONCS, VWC), the namespace's command
//!   set (CNS 3), the NVM command set's controller limits (CNS 6, CSI 0: write-zeroes and
//!   discard sizes) and, for a zoned namespace, its zone layout (CNS 5 and 6, CSI 2); a
//!   volatile write cache (VWC) makes `flush-needed`;
//! * I/O (`queue`): read, write (FUA native), flush, write-zeroes (deallocating unless
//!   `NO_UNMAP`) and discard (Dataset Management, deallocate) as NVM commands, on regular
//!   queues or on poll queues (`IORING_SETUP_IOPOLL` rings: every command is polled);
//! * `zns`: zone management of a zoned namespace (report zones, open, close, finish, reset,
//!   one zone or all of them);
//! * `sys`: the ioctls and the command layout (`struct nvme_uring_cmd`); `id`: parsing the
//!   Identify data and the errors of probing.
//!
//! Beyond libblkio: `max-transfer` respects the controller's MDTS (libblkio advertises 65536
//! blocks whatever the controller takes, and larger requests fail in the kernel), namespaces of
//! other command sets than NVM and zoned are refused at connect, `zone-append-max-bytes` follows
//! ZASL = 0 meaning "as MDTS", `flush` completes at once without a volatile write cache, and the
//! device is opened read-write unless `read-only` is set (libblkio opens it read-only, so only a
//! privileged caller can write), mapped memory regions are registered as fixed buffers of
//! every queue's ring (plain reads and writes inside one use them), and poll queues work (`supports-poll-queues` is probed at
//! connect with one polled read; libblkio has none).

mod id;
mod queue;
mod sys;
mod zns;

use crate::uring::bufs::Buffers;
use id::{CSI_NVM, CSI_ZNS, NvmeError};
use queue::NvmeQueue;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, MemRegion, PropSpec, PropType, PropValue, Queue, Result,
    State,
};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::sync::Arc;

/// The driver's name.
pub(crate) const NAME: &str = "nvme-io_uring";

const PROPS: &[PropSpec] = &[
    PropSpec::new("path", PropType::Str, Access::RwCreated, false),
    PropSpec::new("fd", PropType::Int, Access::RwCreated, false),
    PropSpec::new("num-entries", PropType::Int, Access::RwConnected, false),
    PropSpec::new("zoned", PropType::Int, Access::ReadOnly, false),
    PropSpec::new("zone-size", PropType::U64, Access::ReadOnly, false),
    PropSpec::new("nr-zones", PropType::U64, Access::ReadOnly, false),
    PropSpec::new("max-open-zones", PropType::Int, Access::ReadOnly, false),
    PropSpec::new("max-active-zones", PropType::Int, Access::ReadOnly, false),
    PropSpec::new("append-support", PropType::Bool, Access::ReadOnly, false),
    PropSpec::new(
        "zone-append-max-bytes",
        PropType::U64,
        Access::ReadOnly,
        false,
    ),
];

/// `max-segments`: IOV_MAX, as libblkio.
const MAX_SEGMENTS: i32 = 1024;
/// NLB of read, write and write-zeroes is a 16-bit, 0-based count.
const MAX_NLB_16: u64 = 1 << 16;
/// Admin opcode: Identify.
const ADMIN_IDENTIFY: u8 = 0x06;

/// The namespace a connected driver talks to, shared by its queues.
#[derive(Debug)]
pub(crate) struct Ns {
    fd: OwnedFd,
    nsid: u32,
    lba_shift: u32,
    read_only: bool,
    max_transfer: u64,
    max_write_zeroes: u64,
    max_discard: u64,
    max_segments: i32,
    flush_needed: bool,
    write_zeroes: bool,
    dsm: bool,
    /// The zone layout of a zoned namespace, `None` for a conventional one.
    zones: Option<id::Zones>,
    /// Commands may use fixed buffers (see `queue::probe_fixed`).
    fixed_bufs: bool,
}

/// What connect learned beyond [`Ns`].
#[derive(Debug, Default, Clone, Copy)]
struct Facts {
    capacity: u64,
    zones: Option<id::Zones>,
}

/// The `nvme-io_uring` driver.
#[derive(Debug)]
pub struct NvmeDriver {
    path: String,
    fd: RawFd,
    num_entries: i32,
    ns: Option<Arc<Ns>>,
    facts: Facts,
    bufs: Arc<Buffers>,
}

impl NvmeDriver {
    /// A driver in the created state (`num-entries` 128); set `path` (or `fd`) to the
    /// namespace's character device before connect.
    pub fn new() -> Self {
        NvmeDriver {
            path: String::new(),
            fd: -1,
            num_entries: 128,
            ns: None,
            facts: Facts::default(),
            bufs: Arc::default(),
        }
    }
}

impl Default for NvmeDriver {
    fn default() -> Self {
        Self::new()
    }
}

fn nv(e: NvmeError) -> Error {
    Error::from_chain(e.errno(), &e)
}

/// An Identify command (`cns`, `nsid`, `csi`) into a 4 KiB page.
fn identify(fd: RawFd, cns: u8, nsid: u32, csi: u8) -> std::result::Result<Vec<u8>, NvmeError> {
    let mut page = vec![0u8; 4096];
    let cmd = sys::Cmd {
        opcode: ADMIN_IDENTIFY,
        nsid,
        cdw10: u32::from(cns),
        cdw11: u32::from(csi) << 24,
        ..sys::Cmd::default()
    };
    match sys::admin(fd, cmd, &mut page) {
        Ok((0, _)) => Ok(page),
        Ok((status, _)) => Err(NvmeError::IdentifyStatus { cns, status }),
        Err(source) => Err(NvmeError::Identify { cns, source }),
    }
}

/// The namespace's command set from the answer to Identify CNS 3 (`cns3`). Controllers
/// before NVMe 1.3 have no descriptor list and answer with an NVMe status: their namespaces
/// are NVM. Since Linux 6.2 a caller without CAP_SYS_ADMIN may send Identify CNS 0, 1, 5, 6
/// and 8 only, and CNS 3 fails with EACCES (EPERM before): then the namespace is zoned if the
/// ZNS namespace structure (CNS 5, CSI 2, allowed unprivileged: `zns`) has a zone size for its
/// LBA format `format`, NVM otherwise. Any other failure is an error.
fn command_set(
    cns3: std::result::Result<Vec<u8>, NvmeError>,
    format: usize,
    zns: impl FnOnce() -> std::result::Result<Vec<u8>, NvmeError>,
) -> std::result::Result<u8, NvmeError> {
    match cns3 {
        Ok(p) => Ok(id::csi(&p)),
        Err(NvmeError::IdentifyStatus { .. }) => Ok(CSI_NVM),
        Err(NvmeError::Identify { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) =>
        {
            match zns() {
                Ok(p) if id::zone_size_blocks(&p, format) != 0 => Ok(CSI_ZNS),
                Ok(_) | Err(NvmeError::IdentifyStatus { .. }) => Ok(CSI_NVM),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The kernel's limit on one passthrough request for the namespace device `fd`: the
/// `max_hw_sectors_kb` of its block device. The generic device `ngXnY` and the block device
/// `nvmeXnY` share their numbering; `None` when there is no block device (then MDTS rules).
fn kernel_max_transfer(fd: RawFd) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
    kernel_max_transfer_of(std::path::Path::new("/sys"), md.rdev())
}

/// [`kernel_max_transfer`] for the character device number `rdev`, under the sysfs root `sys`.
fn kernel_max_transfer_of(sys: &std::path::Path, rdev: u64) -> Option<u64> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let link = std::fs::read_link(sys.join(format!("dev/char/{major}:{minor}"))).ok()?;
    let name = link.file_name()?.to_str()?;
    let blk = format!("nvme{}", name.strip_prefix("ng")?);
    let kb = std::fs::read_to_string(sys.join(format!("block/{blk}/queue/max_hw_sectors_kb")));
    let kb: u64 = kb.ok()?.trim().parse().ok()?;
    (kb > 0).then(|| kb.saturating_mul(1024))
}

/// Open `path`, or duplicate `fd`, refusing anything that is not a character device.
fn open(path: &str, fd: RawFd, read_only: bool) -> std::result::Result<OwnedFd, NvmeError> {
    let name = if fd >= 0 {
        format!("fd {fd}")
    } else {
        path.to_owned()
    };
    let io = |source| NvmeError::Open {
        path: name.clone(),
        source,
    };
    if fd >= 0 {
        // SAFETY: fcntl on a caller-provided descriptor number; a bad one fails with EBADF.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        // SAFETY: `dup` was just created and is owned here only.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        let f = std::fs::File::from(owned);
        if !f.metadata().map_err(io)?.file_type().is_char_device() {
            return Err(NvmeError::NotCharDevice);
        }
        return Ok(f.into());
    }
    let md = std::fs::metadata(path).map_err(io)?;
    if !md.file_type().is_char_device() {
        return Err(NvmeError::NotCharDevice);
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    Ok(f.into())
}

/// Probe the namespace behind `fd`.
fn probe(fd: OwnedFd, read_only: bool) -> std::result::Result<(Ns, Facts), NvmeError> {
    let raw = fd.as_raw_fd();
    let nsid = sys::ns_id(raw).map_err(NvmeError::NotNamespace)?;
    let n = id::namespace(&identify(raw, 0, nsid, 0)?)?;
    let ctrl = id::controller(&identify(raw, 1, 0, 0)?);
    let csi = command_set(identify(raw, 3, nsid, 0), n.format, || {
        identify(raw, 5, nsid, CSI_ZNS)
    })?;
    if csi != CSI_NVM && csi != CSI_ZNS {
        return Err(NvmeError::CommandSet { csi });
    }
    let lba = 1u64 << n.lba_shift;
    // The NVM command set's controller limits (NVMe 2.0); older controllers have none.
    let nvm_ctrl = identify(raw, 6, 0, CSI_NVM).ok();
    let wzsl = nvm_ctrl.as_deref().and_then(id::nvm_controller_wzsl);
    let dmrsl = nvm_ctrl
        .as_deref()
        .and_then(|p| p.get(4..8))
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let zones = if csi == CSI_ZNS {
        let zns_ns = identify(raw, 5, nsid, CSI_ZNS)?;
        let zns_ctrl = identify(raw, 6, 0, CSI_ZNS)?;
        Some(id::zones(&zns_ns, &zns_ctrl, &n, ctrl.mdts_bytes)?)
    } else {
        None
    };
    let mut max_transfer = MAX_NLB_16 * lba;
    if let Some(m) = ctrl.mdts_bytes {
        max_transfer = max_transfer.min(m);
    }
    // The kernel refuses passthrough requests above the queue's max_hw_sectors (EINVAL), which
    // an IOMMU can make smaller than MDTS.
    if let Some(k) = kernel_max_transfer(raw) {
        // A whole number of blocks, at least one.
        max_transfer = max_transfer.min(k - k % lba).max(lba);
    }
    // Keep the int property exact: a power-of-two multiple of the block size below 2^31.
    max_transfer = max_transfer.min(1 << 30);
    let max_write_zeroes = if ctrl.write_zeroes {
        wzsl.map_or(MAX_NLB_16 * lba, |w| w.min(MAX_NLB_16 * lba))
    } else {
        0
    };
    let max_discard = if ctrl.dsm {
        let blocks = if dmrsl != 0 {
            u64::from(dmrsl)
        } else {
            u64::from(u32::MAX)
        };
        blocks * lba
    } else {
        0
    };
    // Flush whenever a volatile write cache is present: whether it is enabled can change
    // after connect (Set Features, or `nvme set-feature` of another process).
    let flush_needed = ctrl.vwc;
    let ns = Ns {
        fd,
        nsid,
        lba_shift: n.lba_shift,
        read_only,
        max_transfer,
        max_write_zeroes,
        max_discard,
        max_segments: MAX_SEGMENTS,
        flush_needed,
        write_zeroes: ctrl.write_zeroes,
        dsm: ctrl.dsm,
        zones,
        fixed_bufs: true,
    };
    let capacity = n.blocks.saturating_mul(lba);
    Ok((ns, Facts { capacity, zones }))
}

fn int(v: u64) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

impl Driver for NvmeDriver {
    fn name(&self) -> &str {
        NAME
    }
    fn props(&self) -> &'static [PropSpec] {
        PROPS
    }
    fn get_prop(&self, name: &str, _: State) -> Result<PropValue> {
        let z = self.facts.zones;
        Ok(match name {
            "path" => PropValue::Str(self.path.clone()),
            "fd" => PropValue::Int(self.ns.as_ref().map_or(self.fd, |n| n.fd.as_raw_fd())),
            "num-entries" => PropValue::Int(self.num_entries),
            // 2: host-managed, the only zoned model of NVMe.
            "zoned" => PropValue::Int(if z.is_some() { 2 } else { 0 }),
            "zone-size" => PropValue::U64(z.map_or(0, |z| z.zone_size)),
            "nr-zones" => PropValue::U64(z.map_or(0, |z| z.nr_zones)),
            "max-open-zones" => PropValue::Int(z.map_or(0, |z| z.max_open)),
            "max-active-zones" => PropValue::Int(z.map_or(0, |z| z.max_active)),
            "append-support" => PropValue::Bool(z.is_some()),
            "zone-append-max-bytes" => PropValue::U64(z.map_or(0, |z| z.append_max)),
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        })
    }
    fn set_prop(&mut self, name: &str, value: PropValue, _: State) -> Result<()> {
        match (name, value) {
            ("path", PropValue::Str(s)) => self.path = s,
            ("fd", PropValue::Int(n)) => self.fd = n,
            ("num-entries", PropValue::Int(n)) => {
                if n <= 0 {
                    return Err(Error::inval("num-entries must be greater than 0"));
                }
                self.num_entries = n;
            }
            _ => return Err(Error::new(libc::ENOENT, "Unknown property name")),
        }
        Ok(())
    }
    fn connect(&mut self, read_only: bool) -> Result<DeviceInfo> {
        if self.path.is_empty() && self.fd < 0 {
            return Err(Error::inval("One of path and fd must be set"));
        }
        if !self.path.is_empty() && self.fd >= 0 {
            return Err(Error::inval("path and fd cannot be set at the same time"));
        }
        let fd = open(&self.path, self.fd, read_only).map_err(nv)?;
        let (mut ns, facts) = probe(fd, read_only).map_err(nv)?;
        ns.fixed_bufs = queue::probe_fixed(&ns);
        let lba = int(1 << ns.lba_shift);
        let poll = queue::probe_poll(&ns);
        let info = DeviceInfo {
            read_only,
            request_alignment: lba,
            buf_alignment: lba,
            optimal_io_alignment: lba,
            optimal_io_size: 0,
            optimal_buf_alignment: lba.max(snapblk_core::sys::page_size() as i32),
            mem_region_alignment: 1 << ns.lba_shift,
            max_transfer: int(ns.max_transfer),
            max_segments: ns.max_segments,
            max_segment_len: 0,
            max_write_zeroes_len: ns.max_write_zeroes,
            max_discard_len: ns.max_discard,
            discard_alignment: lba,
            discard_alignment_offset: 0,
            supports_fua_natively: true,
            supports_poll_queues: poll,
            flush_needed: ns.flush_needed,
            can_grow: false,
            max_queues: i32::MAX,
            needs_mem_regions: false,
            needs_mem_region_fd: false,
            may_pin_mem_regions: false,
            max_mem_regions: u64::MAX,
        };
        self.ns = Some(Arc::new(ns));
        self.facts = facts;
        Ok(info)
    }
    fn capacity(&self) -> Result<u64> {
        match &self.ns {
            Some(_) => Ok(self.facts.capacity),
            None => Err(Error::new(libc::ENODEV, "Device must be connected")),
        }
    }
    fn create_queue(&mut self, poll: bool) -> Result<Box<dyn Queue>> {
        let Some(ns) = &self.ns else {
            return Err(Error::new(libc::ENODEV, "Device must be connected"));
        };
        Ok(Box::new(NvmeQueue::new(
            ns.clone(),
            self.bufs.clone(),
            self.num_entries as u32,
            poll,
        )?))
    }
    fn map_mem_region(&mut self, region: &MemRegion) -> Result<()> {
        // Registration is an optimisation: a region that cannot be registered still works.
        self.bufs.register(region.addr as usize, region.len);
        Ok(())
    }
    fn unmap_mem_region(&mut self, region: &MemRegion) {
        self.bufs.unregister(region.addr as usize, region.len);
    }
}

#[cfg(test)]
mod tests;
