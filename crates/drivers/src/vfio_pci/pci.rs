//! The device behind VFIO and its virtio-pci modern transport (virtio 1.2 §4.1): opening the
//! container, group and device, the vendor capabilities (common, notify and device
//! configuration), status, features, queues, DMA mappings and MSI-X.

use super::sys::{self, Bar};
use crate::iova::IovaSpace;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Why the device could not be opened or set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PciError {
    /// The path is not a PCI device directory in sysfs.
    #[error(
        "{path} is not a PCI device (expected a directory like /sys/bus/pci/devices/0000:00:02.0)"
    )]
    NotPci {
        /// The `path` property.
        path: String,
        /// Reading its `subsystem` link.
        #[source]
        source: io::Error,
    },
    /// The path is a PCI device, but not in an IOMMU group.
    #[error("{0} has no IOMMU group (is the IOMMU on? boot with intel_iommu=on or amd_iommu=on)")]
    NoGroup(String),
    /// Not a virtio block device.
    #[error("{path} is not a virtio-blk device (vendor:device {vendor:04x}:{device:04x})")]
    NotVirtioBlk {
        /// The `path` property.
        path: String,
        /// PCI vendor ID.
        vendor: u16,
        /// PCI device ID.
        device: u16,
    },
    /// A file under sysfs or /dev/vfio could not be opened or read.
    #[error("opening {0}")]
    Open(String, #[source] io::Error),
    /// A VFIO ioctl failed.
    #[error("{0}")]
    Ioctl(&'static str, #[source] io::Error),
    /// The kernel's VFIO is not the legacy container API with the type1v2 IOMMU.
    #[error("/dev/vfio/vfio offers no VFIO_TYPE1v2_IOMMU (API version 0 with type1v2 is required)")]
    NoType1v2,
    /// Some device of the group is bound to another driver.
    #[error(
        "IOMMU group {0} is not viable: bind every device of the group to vfio-pci (driver_override)"
    )]
    NotViable(String),
    /// The device lacks the virtio-pci modern capabilities.
    #[error("the device has no virtio-pci {0} capability (is this a legacy device?)")]
    Legacy(&'static str),
    /// The device did not come back from a reset.
    #[error("the device did not complete its reset within 5 s")]
    ResetTimeout,
    /// The device refused the features.
    #[error("the device did not accept the negotiated features (FEATURES_OK not set)")]
    FeaturesRefused,
    /// A queue could not be set up.
    #[error("{0}")]
    Queue(String),
}

impl PciError {
    /// The errno the C API reports.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            PciError::NotPci { source, .. } | PciError::Open(_, source) => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            PciError::Ioctl(_, source) => source.raw_os_error().unwrap_or(libc::EIO),
            PciError::NoGroup(_) | PciError::NoType1v2 => libc::ENODEV,
            PciError::NotVirtioBlk { .. } => libc::ENOTSUP,
            // libblkio 1.5's errno for these two.
            PciError::Legacy(_) | PciError::NotViable(_) => libc::EIO,
            PciError::ResetTimeout | PciError::FeaturesRefused => libc::EIO,
            PciError::Queue(_) => libc::EINVAL,
        }
    }
}

const CAP_VENDOR: u8 = 0x09;
const CFG_COMMON: u8 = 1;
const CFG_NOTIFY: u8 = 2;
const CFG_DEVICE: u8 = 4;
/// `VIRTIO_MSI_NO_VECTOR`.
pub(crate) const NO_VECTOR: u16 = 0xffff;

/// Device status bits (virtio 1.2 §2.1).
pub(crate) const S_ACKNOWLEDGE: u8 = 1;
pub(crate) const S_DRIVER: u8 = 2;
pub(crate) const S_DRIVER_OK: u8 = 4;
pub(crate) const S_FEATURES_OK: u8 = 8;

// Offsets in `struct virtio_pci_common_cfg`.
const C_DFSELECT: u64 = 0;
const C_DF: u64 = 4;
const C_GFSELECT: u64 = 8;
const C_GF: u64 = 12;
const C_MSIX: u64 = 16;
const C_NUMQ: u64 = 18;
const C_STATUS: u64 = 20;
const C_GENERATION: u64 = 21;
const C_Q_SELECT: u64 = 22;
const C_Q_SIZE: u64 = 24;
const C_Q_MSIX: u64 = 26;
const C_Q_ENABLE: u64 = 28;
const C_Q_NOFF: u64 = 30;
const C_Q_DESC: u64 = 32;
const C_Q_DRIVER: u64 = 40;
const C_Q_DEVICE: u64 = 48;

/// Where a capability's structure lives: BAR and offset in it.
#[derive(Debug, Clone, Copy)]
struct Loc {
    bar: usize,
    off: u64,
}

/// What the capability walk finds in configuration space.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Caps {
    /// `(bar, offset)` of the common, notify and device configuration.
    pub(crate) common: Option<(u8, u32)>,
    pub(crate) notify: Option<(u8, u32)>,
    pub(crate) device: Option<(u8, u32)>,
    pub(crate) notify_mult: u32,
}

/// Walk the capability list of a 256-byte configuration space.
pub(crate) fn parse_caps(cfg: &[u8]) -> Caps {
    let mut caps = Caps::default();
    let b = |o: usize| cfg.get(o).copied().unwrap_or(0);
    let le32 = |o: usize| u32::from_le_bytes([b(o), b(o + 1), b(o + 2), b(o + 3)]);
    // Status register bit 4: a capability list is present.
    if b(6) & 0x10 == 0 {
        return caps;
    }
    let mut p = usize::from(b(0x34) & 0xfc);
    let mut hops = 0;
    while p >= 0x40 && hops < 48 {
        hops += 1;
        if b(p) == CAP_VENDOR {
            let (ty, bar, off) = (b(p + 3), b(p + 4), le32(p + 8));
            let slot = match ty {
                CFG_COMMON => Some(&mut caps.common),
                CFG_NOTIFY => Some(&mut caps.notify),
                CFG_DEVICE => Some(&mut caps.device),
                _ => None,
            };
            // The first usable one of each type counts (§4.1.4); BARs are 0..=5.
            if let Some(s) = slot
                && s.is_none()
                && bar <= 5
            {
                *s = Some((bar, off));
                if ty == CFG_NOTIFY {
                    caps.notify_mult = le32(p + 16);
                }
            }
        }
        p = usize::from(b(p + 1) & 0xfc);
    }
    caps
}

/// An open virtio-pci device behind VFIO.
///
/// Field order is drop order: the BAR mappings go before the device descriptor, which goes
/// before the group and the container (closing the container drops every DMA mapping).
#[derive(Debug)]
pub(crate) struct Dev {
    bars: Vec<Option<Bar>>,
    common: Loc,
    notify: Loc,
    notify_mult: u32,
    device_cfg: Loc,
    /// MSI-X vectors the device has.
    pub(crate) msix: u32,
    msix_on: Mutex<bool>,
    live: Once,
    /// The kernel asked for the device back (hot unplug) and [`Dev::release`] gave it.
    released: AtomicBool,
    /// IOVAs of the container.
    iova: Mutex<IovaSpace>,
    device: OwnedFd,
    _group: OwnedFd,
    container: OwnedFd,
}

/// Facts about the container found at open.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) dev: Dev,
    /// The smallest IOMMU page: `mem-region-alignment`.
    pub(crate) page: u64,
    /// `max-mem-regions`: the DMA mappings the container allows.
    pub(crate) dma_avail: u64,
}

fn sysfs_hex(dir: &Path, name: &str) -> Result<u16, PciError> {
    let p = dir.join(name);
    let s = std::fs::read_to_string(&p).map_err(|e| PciError::Open(p.display().to_string(), e))?;
    let t = s.trim().trim_start_matches("0x");
    u16::from_str_radix(t, 16).map_err(|_| {
        PciError::Open(
            p.display().to_string(),
            io::Error::from_raw_os_error(libc::EINVAL),
        )
    })
}

impl Dev {
    /// Open the PCI device at sysfs directory `path` through VFIO.
    pub(crate) fn open(path: &str) -> Result<Opened, PciError> {
        let dir = Path::new(path);
        let subsys =
            std::fs::read_link(dir.join("subsystem")).map_err(|source| PciError::NotPci {
                path: path.to_string(),
                source,
            })?;
        if subsys.file_name().is_none_or(|n| n != "pci") {
            return Err(PciError::NotPci {
                path: path.to_string(),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        let (vendor, device) = (sysfs_hex(dir, "vendor")?, sysfs_hex(dir, "device")?);
        // virtio-blk: modern 0x1042, transitional 0x1001 (its modern capabilities are checked
        // below).
        if vendor != 0x1af4 || (device != 0x1042 && device != 0x1001) {
            return Err(PciError::NotVirtioBlk {
                path: path.to_string(),
                vendor,
                device,
            });
        }
        let name = std::fs::canonicalize(dir)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let group = std::fs::read_link(dir.join("iommu_group"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .ok_or_else(|| PciError::NoGroup(path.to_string()))?;
        let container = sys::open_rw("/dev/vfio/vfio")
            .map_err(|e| PciError::Open("/dev/vfio/vfio".into(), e))?;
        let (api, t1) = sys::container_check(&container)
            .map_err(|e| PciError::Ioctl("checking the VFIO container", e))?;
        if !api || !t1 {
            return Err(PciError::NoType1v2);
        }
        let gpath = format!("/dev/vfio/{group}");
        let gfd = sys::open_rw(&gpath).map_err(|e| PciError::Open(gpath, e))?;
        if !sys::group_viable(&gfd).map_err(|e| PciError::Ioctl("VFIO_GROUP_GET_STATUS", e))? {
            return Err(PciError::NotViable(group));
        }
        sys::group_attach(&gfd, &container)
            .map_err(|e| PciError::Ioctl("attaching the group to a type1v2 container", e))?;
        let info =
            sys::iommu_info(&container).map_err(|e| PciError::Ioctl("VFIO_IOMMU_GET_INFO", e))?;
        let dfd = sys::group_device(&gfd, &name)
            .map_err(|e| PciError::Ioctl("VFIO_GROUP_GET_DEVICE_FD", e))?;
        if !sys::device_is_pci(&dfd).map_err(|e| PciError::Ioctl("VFIO_DEVICE_GET_INFO", e))? {
            return Err(PciError::NotPci {
                path: path.to_string(),
                source: io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        let cfg_region = sys::region_info(&dfd, sys::CONFIG_REGION)
            .map_err(|e| PciError::Ioctl("reading the config space region", e))?;
        let mut cfg = [0u8; 256];
        sys::pread_exact(dfd.as_raw_fd(), &mut cfg, cfg_region.offset)
            .map_err(|e| PciError::Ioctl("reading the config space", e))?;
        let caps = parse_caps(&cfg);
        let loc = |c: Option<(u8, u32)>, what| {
            c.map(|(bar, off)| Loc {
                bar: usize::from(bar),
                off: u64::from(off),
            })
            .ok_or(PciError::Legacy(what))
        };
        let common = loc(caps.common, "common configuration")?;
        let notify = loc(caps.notify, "notification")?;
        let device_cfg = loc(caps.device, "device configuration")?;
        // Memory decoding and bus mastering on (PCI command register).
        let cmd = u16::from_le_bytes([cfg[4], cfg[5]]) | 0x6;
        sys::pwrite_all(dfd.as_raw_fd(), &cmd.to_le_bytes(), cfg_region.offset + 4)
            .map_err(|e| PciError::Ioctl("enabling bus mastering", e))?;
        let mut bars: Vec<Option<Bar>> = (0..6).map(|_| None).collect();
        for l in [common, notify, device_cfg] {
            if bars[l.bar].is_none() {
                let r = sys::region_info(&dfd, l.bar as u32)
                    .map_err(|e| PciError::Ioctl("VFIO_DEVICE_GET_REGION_INFO of a BAR", e))?;
                bars[l.bar] = Some(Bar::new(dfd.as_raw_fd(), r));
            }
        }
        for (i, b) in bars.iter().enumerate() {
            if let Some(b) = b {
                log::debug!("vfio-pci: BAR {i} mapped: {}", b.mapped());
            }
        }
        let msix = sys::irq_count(&dfd, sys::MSIX_IRQ)
            .map_err(|e| PciError::Ioctl("VFIO_DEVICE_GET_IRQ_INFO", e))?;
        let page = if info.pgsizes == 0 {
            4096
        } else {
            1u64 << info.pgsizes.trailing_zeros()
        };
        let ranges = if info.ranges.is_empty() {
            vec![(0, (1u64 << 39) - 1)]
        } else {
            info.ranges.clone()
        };
        let dev = Dev {
            bars,
            common,
            notify,
            notify_mult: caps.notify_mult,
            device_cfg,
            msix,
            msix_on: Mutex::new(false),
            live: Once::new(),
            released: AtomicBool::new(false),
            iova: Mutex::new(IovaSpace::new(ranges, page)),
            device: dfd,
            _group: gfd,
            container,
        };
        Ok(Opened {
            dev,
            page,
            dma_avail: u64::from(info.dma_avail.unwrap_or(u16::MAX.into())),
        })
    }

    fn bar(&self, i: usize) -> Option<&Bar> {
        self.bars.get(i).and_then(Option::as_ref)
    }
    fn cr<const N: usize>(&self, off: u64) -> u32 {
        self.bar(self.common.bar)
            .map_or(u32::MAX, |b| b.read::<N>(self.common.off + off))
    }
    fn cw<const N: usize>(&self, off: u64, v: u32) {
        if let Some(b) = self.bar(self.common.bar) {
            b.write::<N>(self.common.off + off, v);
        }
    }
    fn cw64(&self, off: u64, v: u64) {
        self.cw::<4>(off, v as u32);
        self.cw::<4>(off + 4, (v >> 32) as u32);
    }

    /// The device status byte.
    pub(crate) fn status(&self) -> u8 {
        self.cr::<1>(C_STATUS) as u8
    }
    /// Set status bits (on top of the current ones).
    pub(crate) fn add_status(&self, bits: u8) {
        let s = self.status();
        self.cw::<1>(C_STATUS, u32::from(s | bits));
    }

    /// Reset the device and wait (5 s at most) until it reads back status 0.
    pub(crate) fn reset(&self) -> Result<(), PciError> {
        self.cw::<1>(C_STATUS, 0);
        let t0 = Instant::now();
        while self.status() != 0 {
            if t0.elapsed() > Duration::from_secs(5) {
                return Err(PciError::ResetTimeout);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The 64 feature bits the device offers.
    pub(crate) fn device_features(&self) -> u64 {
        self.cw::<4>(C_DFSELECT, 0);
        let lo = self.cr::<4>(C_DF);
        self.cw::<4>(C_DFSELECT, 1);
        let hi = self.cr::<4>(C_DF);
        u64::from(lo) | (u64::from(hi) << 32)
    }

    /// Write the driver's features and set FEATURES_OK; fails if the device clears it.
    pub(crate) fn set_features(&self, f: u64) -> Result<(), PciError> {
        self.cw::<4>(C_GFSELECT, 0);
        self.cw::<4>(C_GF, f as u32);
        self.cw::<4>(C_GFSELECT, 1);
        self.cw::<4>(C_GF, (f >> 32) as u32);
        self.add_status(S_FEATURES_OK);
        if self.status() & S_FEATURES_OK == 0 {
            return Err(PciError::FeaturesRefused);
        }
        // No interrupt for configuration changes.
        self.cw::<2>(C_MSIX, u32::from(NO_VECTOR));
        Ok(())
    }

    /// `num_queues` of the common configuration.
    pub(crate) fn num_queues(&self) -> u16 {
        self.cr::<2>(C_NUMQ) as u16
    }

    /// The first `len` bytes of the device configuration, read until the generation is stable
    /// (at most 100 times: a device whose generation never settles gets the last read).
    pub(crate) fn config(&self, len: usize) -> Vec<u8> {
        let Some(b) = self.bar(self.device_cfg.bar) else {
            return vec![0; len];
        };
        let mut v = Vec::new();
        for _ in 0..100 {
            let g = self.cr::<1>(C_GENERATION);
            v = (0..len as u64)
                .map(|i| b.read::<1>(self.device_cfg.off + i) as u8)
                .collect();
            if self.cr::<1>(C_GENERATION) == g {
                break;
            }
        }
        v
    }

    /// Set queue `index` up: `size` entries, MSI-X `vector` (or [`NO_VECTOR`]), ring parts at
    /// the given IOVAs, and enable it. Returns the offset of its doorbell in the notify BAR.
    pub(crate) fn setup_queue(
        &self,
        index: u16,
        size: u16,
        vector: u16,
        (desc, driver, device): (u64, u64, u64),
    ) -> Result<u64, PciError> {
        self.cw::<2>(C_Q_SELECT, u32::from(index));
        let max = self.cr::<2>(C_Q_SIZE);
        if max == 0 {
            return Err(PciError::Queue(format!("the device has no queue {index}")));
        }
        if u32::from(size) > max {
            return Err(PciError::Queue(format!(
                "queue-size {size} is larger than the device's maximum of {max}"
            )));
        }
        self.cw::<2>(C_Q_SIZE, u32::from(size));
        self.cw::<2>(C_Q_MSIX, u32::from(vector));
        if self.cr::<2>(C_Q_MSIX) != u32::from(vector) {
            return Err(PciError::Queue(format!(
                "the device refused MSI-X vector {vector} for queue {index}"
            )));
        }
        self.cw64(C_Q_DESC, desc);
        self.cw64(C_Q_DRIVER, driver);
        self.cw64(C_Q_DEVICE, device);
        let noff = u64::from(self.cr::<2>(C_Q_NOFF) as u16);
        self.cw::<2>(C_Q_ENABLE, 1);
        Ok(self.notify.off + noff * u64::from(self.notify_mult))
    }

    /// Set DRIVER_OK, once: at the first notification, after every queue of `start` is set up.
    pub(crate) fn go_live(&self) {
        self.live.call_once(|| self.add_status(S_DRIVER_OK));
    }

    /// Notify the device of new buffers in queue `index`; `off` from [`Dev::setup_queue`].
    pub(crate) fn notify(&self, off: u64, index: u16) {
        self.go_live();
        if let Some(b) = self.bar(self.notify.bar) {
            b.write::<2>(off, u32::from(index));
        }
    }

    /// Wire MSI-X vector `vector` to eventfd `fd`; enables MSI-X (all vectors, unwired) first.
    pub(crate) fn wire_vector(&self, vector: u32, fd: RawFd) -> Result<(), PciError> {
        let mut on = snapblk_core::sync::lock(&self.msix_on);
        if !*on {
            let none = vec![-1; self.msix as usize];
            sys::set_irq_eventfds(&self.device, sys::MSIX_IRQ, 0, &none)
                .map_err(|e| PciError::Ioctl("enabling MSI-X (VFIO_DEVICE_SET_IRQS)", e))?;
            *on = true;
        }
        sys::set_irq_eventfds(&self.device, sys::MSIX_IRQ, vector, &[fd])
            .map_err(|e| PciError::Ioctl("wiring an MSI-X vector (VFIO_DEVICE_SET_IRQS)", e))
    }

    /// Have the kernel's request to release the device (`VFIO_PCI_REQ_IRQ_INDEX`, sent when the
    /// device is removed or unbound) signal eventfd `fd`. `false` if the device has no such
    /// interrupt.
    pub(crate) fn wire_request(&self, fd: RawFd) -> bool {
        if !matches!(sys::irq_count(&self.device, sys::REQ_IRQ), Ok(n) if n > 0) {
            return false;
        }
        match sys::set_irq_eventfds(&self.device, sys::REQ_IRQ, 0, &[fd]) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("vfio-pci: wiring the request interrupt: {e}");
                false
            }
        }
    }

    /// Give the device back to the kernel, which waits for it to finish a removal: the BAR
    /// mappings become anonymous memory and the device descriptor /dev/null, so concurrent
    /// register accesses stay harmless and reach nothing. The device is unusable afterwards.
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        for b in self.bars.iter().flatten() {
            b.detach();
        }
        if let Err(e) = sys::replace_with_null(self.device.as_raw_fd()) {
            log::warn!("vfio-pci: releasing the device descriptor: {e}");
        }
    }

    /// Whether [`Dev::release`] gave the device back.
    pub(crate) fn released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Map `len` bytes at process address `vaddr` for the device; returns the IOVA.
    pub(crate) fn map(&self, vaddr: u64, len: u64) -> Result<u64, PciError> {
        let mut sp = snapblk_core::sync::lock(&self.iova);
        let iova = sp
            .alloc(len)
            .ok_or_else(|| PciError::Queue("no IOVA space left for the mapping".into()))?;
        if let Err(e) = sys::map_dma(&self.container, vaddr, iova, len) {
            sp.free(iova);
            return Err(PciError::Ioctl("VFIO_IOMMU_MAP_DMA", e));
        }
        Ok(iova)
    }

    /// Undo [`Dev::map`].
    pub(crate) fn unmap(&self, iova: u64, len: u64) {
        let mut sp = snapblk_core::sync::lock(&self.iova);
        if let Err(e) = sys::unmap_dma(&self.container, iova, len) {
            log::warn!("vfio-pci: VFIO_IOMMU_UNMAP_DMA of {len} bytes at IOVA {iova:#x}: {e}");
        }
        sp.free(iova);
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // Stop the device before the ring memory and mappings go away (a released device is
        // gone already).
        if !self.released()
            && let Err(e) = self.reset()
        {
            log::warn!("vfio-pci: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Caps, parse_caps};

    fn cap(cfg: &mut [u8], at: usize, next: u8, ty: u8, bar: u8, off: u32) {
        cfg[at] = 0x09;
        cfg[at + 1] = next;
        cfg[at + 2] = if ty == 2 { 20 } else { 16 };
        cfg[at + 3] = ty;
        cfg[at + 4] = bar;
        cfg[at + 8..at + 12].copy_from_slice(&off.to_le_bytes());
        if ty == 2 {
            cfg[at + 16..at + 20].copy_from_slice(&4u32.to_le_bytes());
        }
    }

    #[test]
    fn the_modern_capabilities_are_found_and_a_loop_ends() {
        let mut cfg = [0u8; 256];
        cfg[6] = 0x10;
        cfg[0x34] = 0x40;
        cap(&mut cfg, 0x40, 0x50, 1, 4, 0);
        cap(&mut cfg, 0x50, 0x60, 4, 4, 0x2000);
        cap(&mut cfg, 0x60, 0x74, 2, 4, 0x3000);
        // A second common capability in another BAR is ignored; its `next` points back.
        cap(&mut cfg, 0x74, 0x40, 1, 2, 0x100);
        let c = parse_caps(&cfg);
        assert_eq!(
            c,
            Caps {
                common: Some((4, 0)),
                notify: Some((4, 0x3000)),
                device: Some((4, 0x2000)),
                notify_mult: 4,
            }
        );
    }

    #[test]
    fn no_capability_list_means_a_legacy_device() {
        let mut cfg = [0u8; 256];
        cfg[0x34] = 0x40;
        cap(&mut cfg, 0x40, 0, 1, 4, 0);
        assert_eq!(parse_caps(&cfg), Caps::default());
        // Truncated configuration space: nothing found, no panic.
        assert_eq!(parse_caps(&cfg[..0x42]), Caps::default());
    }
}
