//! Every `unsafe` of the vfio-pci driver: the VFIO ioctls (`linux/vfio.h`, legacy container
//! with the type1v2 IOMMU), region reads and writes on the device descriptor, and BARs mapped
//! into the process, accessed with volatile loads and stores.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `_IO(';', 100 + n)`: VFIO's ioctl numbers carry no size.
const fn vfio_io(n: u64) -> u64 {
    ((b';' as u64) << 8) | (100 + n)
}
const GET_API_VERSION: u64 = vfio_io(0);
const CHECK_EXTENSION: u64 = vfio_io(1);
const SET_IOMMU: u64 = vfio_io(2);
const GROUP_GET_STATUS: u64 = vfio_io(3);
const GROUP_SET_CONTAINER: u64 = vfio_io(4);
const GROUP_GET_DEVICE_FD: u64 = vfio_io(6);
const DEVICE_GET_INFO: u64 = vfio_io(7);
const DEVICE_GET_REGION_INFO: u64 = vfio_io(8);
const DEVICE_GET_IRQ_INFO: u64 = vfio_io(9);
const DEVICE_SET_IRQS: u64 = vfio_io(10);
const IOMMU_GET_INFO: u64 = vfio_io(12);
const IOMMU_MAP_DMA: u64 = vfio_io(13);
const IOMMU_UNMAP_DMA: u64 = vfio_io(14);

/// `VFIO_API_VERSION`.
const API_VERSION: i32 = 0;
/// `VFIO_TYPE1v2_IOMMU`.
pub(crate) const TYPE1V2_IOMMU: u64 = 3;
const GROUP_FLAGS_VIABLE: u32 = 1;
const DEVICE_FLAGS_PCI: u32 = 1 << 1;
const IOMMU_INFO_CAPS: u32 = 1 << 1;
const CAP_IOVA_RANGE: u16 = 1;
const CAP_DMA_AVAIL: u16 = 3;
/// `VFIO_REGION_INFO_FLAG_MMAP`.
const REGION_MMAP: u32 = 1 << 2;
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const DMA_READ_WRITE: u32 = 3;
/// `VFIO_PCI_CONFIG_REGION_INDEX`.
pub(crate) const CONFIG_REGION: u32 = 7;
/// `VFIO_PCI_MSIX_IRQ_INDEX`.
pub(crate) const MSIX_IRQ: u32 = 2;
/// `VFIO_PCI_REQ_IRQ_INDEX`: the kernel asks the user to release the device (hot unplug).
pub(crate) const REQ_IRQ: u32 = 4;

#[repr(C)]
#[derive(Default)]
struct GroupStatus {
    argsz: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct DeviceInfo {
    argsz: u32,
    flags: u32,
    num_regions: u32,
    num_irqs: u32,
    cap_offset: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct RegionInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    cap_offset: u32,
    size: u64,
    offset: u64,
}

#[repr(C)]
#[derive(Default)]
struct IrqInfo {
    argsz: u32,
    flags: u32,
    index: u32,
    count: u32,
}

#[repr(C)]
struct DmaMap {
    argsz: u32,
    flags: u32,
    vaddr: u64,
    iova: u64,
    size: u64,
}

#[repr(C)]
struct DmaUnmap {
    argsz: u32,
    flags: u32,
    iova: u64,
    size: u64,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `ioctl(fd, req, arg)` with a pointer argument.
///
/// # Safety
/// `arg` must point to the structure `req` expects, valid for the kernel to read and write.
unsafe fn ioctl_ptr<T>(fd: RawFd, req: u64, arg: *mut T) -> io::Result<libc::c_int> {
    // SAFETY: guaranteed by the caller.
    cvt(unsafe { libc::ioctl(fd, req as _, arg) })
}

fn ioctl_val(fd: RawFd, req: u64, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: these requests take an integer argument, not a pointer.
    cvt(unsafe { libc::ioctl(fd, req as _, arg) })
}

/// Open a file read-write, close-on-exec.
pub(crate) fn open_rw(path: &str) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid C string.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Add 1 to the counter of eventfd `fd` (a signal; a full counter still leaves it readable).
pub(crate) fn signal_fd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64; `fd` is an eventfd the caller keeps open.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// A connected pair of Unix stream sockets (close-on-exec): shutting one end down makes the
/// other (and its duplicates) report a hang-up to `poll`.
pub(crate) fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors; the result is checked.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: two fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `shutdown(SHUT_RDWR)` of socket `fd`.
pub(crate) fn shutdown(fd: &OwnedFd) {
    // SAFETY: plain syscall on an open socket.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
}

/// Put the file open at `/dev/null` in place of descriptor `fd`: the file `fd` referred to is
/// released (if nothing else holds it), and later uses of `fd` reach /dev/null.
pub(crate) fn replace_with_null(fd: RawFd) -> io::Result<()> {
    let null = open_rw("/dev/null")?;
    // SAFETY: both descriptors are open; dup2 atomically swaps the file behind `fd`.
    cvt(unsafe { libc::dup3(null.as_raw_fd(), fd, libc::O_CLOEXEC) })?;
    Ok(())
}

/// The container: API version 0 and the type1v2 IOMMU.
pub(crate) fn container_check(c: &OwnedFd) -> io::Result<(bool, bool)> {
    let v = ioctl_val(c.as_raw_fd(), GET_API_VERSION, 0)?;
    let t = ioctl_val(c.as_raw_fd(), CHECK_EXTENSION, TYPE1V2_IOMMU as _)?;
    Ok((v == API_VERSION, t > 0))
}

/// `VFIO_GROUP_GET_STATUS`: whether the group is viable (every device bound to vfio).
pub(crate) fn group_viable(g: &OwnedFd) -> io::Result<bool> {
    let mut s = GroupStatus {
        argsz: size_of::<GroupStatus>() as u32,
        ..GroupStatus::default()
    };
    // SAFETY: `s` is a `vfio_group_status`.
    unsafe { ioctl_ptr(g.as_raw_fd(), GROUP_GET_STATUS, &mut s) }?;
    Ok(s.flags & GROUP_FLAGS_VIABLE != 0)
}

/// `VFIO_GROUP_SET_CONTAINER` then `VFIO_SET_IOMMU(TYPE1v2)`.
pub(crate) fn group_attach(g: &OwnedFd, c: &OwnedFd) -> io::Result<()> {
    let mut cfd: i32 = c.as_raw_fd();
    // SAFETY: the argument is a pointer to the container's descriptor.
    unsafe { ioctl_ptr(g.as_raw_fd(), GROUP_SET_CONTAINER, &mut cfd) }?;
    ioctl_val(c.as_raw_fd(), SET_IOMMU, TYPE1V2_IOMMU as _)?;
    Ok(())
}

/// What `VFIO_IOMMU_GET_INFO` says about the container's IOMMU.
#[derive(Debug, Clone, Default)]
pub(crate) struct IommuInfo {
    /// Supported page sizes, a bitmap.
    pub(crate) pgsizes: u64,
    /// Usable IOVA ranges, inclusive ends; empty if the kernel did not say.
    pub(crate) ranges: Vec<(u64, u64)>,
    /// How many more DMA mappings the container allows, if the kernel said.
    pub(crate) dma_avail: Option<u32>,
}

fn rd<const N: usize>(b: &[u8], o: usize) -> Option<[u8; N]> {
    b.get(o..o.checked_add(N)?)?.try_into().ok()
}

/// Parse `vfio_iommu_type1_info` and its capability chain from the bytes the kernel filled.
pub(crate) fn parse_iommu_info(b: &[u8]) -> IommuInfo {
    let u32_at = |o| rd::<4>(b, o).map(u32::from_le_bytes);
    let u64_at = |o| rd::<8>(b, o).map(u64::from_le_bytes);
    let mut info = IommuInfo {
        pgsizes: u64_at(8).unwrap_or(0),
        ..IommuInfo::default()
    };
    let flags = u32_at(4).unwrap_or(0);
    let mut off = if flags & IOMMU_INFO_CAPS != 0 {
        u32_at(16).unwrap_or(0) as usize
    } else {
        0
    };
    // Each capability header: id (u16), version (u16), next (u32, 0 ends the chain). A chain
    // is at most as long as the buffer, which bounds the walk on a malformed one.
    let mut hops = 0;
    while off != 0 && hops < 64 {
        hops += 1;
        let Some(id) = rd::<2>(b, off).map(u16::from_le_bytes) else {
            break;
        };
        match id {
            CAP_IOVA_RANGE => {
                let n = u32_at(off + 8).unwrap_or(0) as usize;
                for i in 0..n.min(1024) {
                    let o = off + 16 + 16 * i;
                    if let (Some(s), Some(e)) = (u64_at(o), u64_at(o + 8)) {
                        info.ranges.push((s, e));
                    }
                }
            }
            CAP_DMA_AVAIL => info.dma_avail = u32_at(off + 8),
            _ => {}
        }
        off = u32_at(off + 4).unwrap_or(0) as usize;
    }
    info
}

/// `VFIO_IOMMU_GET_INFO` with its capability chain.
pub(crate) fn iommu_info(c: &OwnedFd) -> io::Result<IommuInfo> {
    let mut buf = vec![0u64; 3];
    buf[0] = 24;
    // SAFETY: a 24-byte, 8-aligned `vfio_iommu_type1_info` with argsz 24.
    unsafe { ioctl_ptr(c.as_raw_fd(), IOMMU_GET_INFO, buf.as_mut_ptr()) }?;
    let need = (buf[0] & 0xffff_ffff) as usize;
    if need > 24 && need < 1 << 20 {
        buf = vec![0u64; need.div_ceil(8)];
        buf[0] = need as u64;
        // SAFETY: the buffer holds `need` bytes, as argsz says.
        unsafe { ioctl_ptr(c.as_raw_fd(), IOMMU_GET_INFO, buf.as_mut_ptr()) }?;
    }
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(parse_iommu_info(&bytes))
}

/// `VFIO_GROUP_GET_DEVICE_FD` for the device named `name` (its PCI address).
pub(crate) fn group_device(g: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the argument is a C string naming the device.
    let fd = unsafe { ioctl_ptr(g.as_raw_fd(), GROUP_GET_DEVICE_FD, c.as_ptr().cast_mut()) }?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `VFIO_DEVICE_GET_INFO`: whether it is a PCI device.
pub(crate) fn device_is_pci(d: &OwnedFd) -> io::Result<bool> {
    let mut i = DeviceInfo {
        argsz: size_of::<DeviceInfo>() as u32,
        ..DeviceInfo::default()
    };
    // SAFETY: `i` is a `vfio_device_info`.
    unsafe { ioctl_ptr(d.as_raw_fd(), DEVICE_GET_INFO, &mut i) }?;
    Ok(i.flags & DEVICE_FLAGS_PCI != 0 && i.num_regions > CONFIG_REGION)
}

/// A region of the device: where it lies in the device descriptor's offsets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) size: u64,
    pub(crate) offset: u64,
    pub(crate) mmap: bool,
}

/// `VFIO_DEVICE_GET_REGION_INFO`.
pub(crate) fn region_info(d: &OwnedFd, index: u32) -> io::Result<Region> {
    let mut r = RegionInfo {
        argsz: size_of::<RegionInfo>() as u32,
        index,
        ..RegionInfo::default()
    };
    // SAFETY: `r` is a `vfio_region_info`.
    unsafe { ioctl_ptr(d.as_raw_fd(), DEVICE_GET_REGION_INFO, &mut r) }?;
    Ok(Region {
        size: r.size,
        offset: r.offset,
        mmap: r.flags & REGION_MMAP != 0,
    })
}

/// `VFIO_DEVICE_GET_IRQ_INFO`: how many interrupts of type `index` the device has.
pub(crate) fn irq_count(d: &OwnedFd, index: u32) -> io::Result<u32> {
    let mut i = IrqInfo {
        argsz: size_of::<IrqInfo>() as u32,
        index,
        ..IrqInfo::default()
    };
    // SAFETY: `i` is a `vfio_irq_info`.
    unsafe { ioctl_ptr(d.as_raw_fd(), DEVICE_GET_IRQ_INFO, &mut i) }?;
    Ok(i.count)
}

/// `VFIO_DEVICE_SET_IRQS`: interrupts `start..start+fds.len()` of type `index` signal `fds`
/// (-1: none).
pub(crate) fn set_irq_eventfds(
    d: &OwnedFd,
    index: u32,
    start: u32,
    fds: &[RawFd],
) -> io::Result<()> {
    let mut buf: Vec<u32> = vec![
        (20 + 4 * fds.len()) as u32,
        IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER,
        index,
        start,
        fds.len() as u32,
    ];
    buf.extend(fds.iter().map(|&f| f as u32));
    // SAFETY: a `vfio_irq_set` header followed by `count` s32 eventfds, argsz bytes in all.
    unsafe { ioctl_ptr(d.as_raw_fd(), DEVICE_SET_IRQS, buf.as_mut_ptr()) }?;
    Ok(())
}

/// `VFIO_IOMMU_MAP_DMA` of `len` bytes at process address `vaddr` to `iova`, read-write.
pub(crate) fn map_dma(c: &OwnedFd, vaddr: u64, iova: u64, len: u64) -> io::Result<()> {
    let mut m = DmaMap {
        argsz: size_of::<DmaMap>() as u32,
        flags: DMA_READ_WRITE,
        vaddr,
        iova,
        size: len,
    };
    // SAFETY: `m` is a `vfio_iommu_type1_dma_map`; the kernel pins the pages itself and fails
    // for addresses not mapped in this process.
    unsafe { ioctl_ptr(c.as_raw_fd(), IOMMU_MAP_DMA, &mut m) }?;
    Ok(())
}

/// `VFIO_IOMMU_UNMAP_DMA`.
pub(crate) fn unmap_dma(c: &OwnedFd, iova: u64, len: u64) -> io::Result<()> {
    let mut m = DmaUnmap {
        argsz: size_of::<DmaUnmap>() as u32,
        flags: 0,
        iova,
        size: len,
    };
    // SAFETY: `m` is a `vfio_iommu_type1_dma_unmap` without a dirty bitmap.
    unsafe { ioctl_ptr(c.as_raw_fd(), IOMMU_UNMAP_DMA, &mut m) }?;
    Ok(())
}

/// `pread` of `buf.len()` bytes at `off`, all or an error.
pub(crate) fn pread_exact(fd: RawFd, buf: &mut [u8], off: u64) -> io::Result<()> {
    // SAFETY: writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as libc::off_t) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(())
}

/// `pwrite` of `buf` at `off`, all or an error.
pub(crate) fn pwrite_all(fd: RawFd, buf: &[u8], off: u64) -> io::Result<()> {
    // SAFETY: reads `buf.len()` bytes from `buf`.
    let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(())
}

/// A BAR: mapped into the process when VFIO allows it, else read and written through the
/// device descriptor. Accesses out of bounds or misaligned are ignored (reads give all ones,
/// as a PCI master abort would).
#[derive(Debug)]
pub(crate) struct Bar {
    fd: RawFd,
    region: Region,
    map: Option<*mut u8>,
}

// SAFETY: the mapping is device memory accessed only with volatile loads and stores of whole
// registers; the device serializes them.
unsafe impl Send for Bar {}
// SAFETY: as above.
unsafe impl Sync for Bar {}

impl Bar {
    /// `fd` is the device descriptor, which must outlive the `Bar`.
    pub(crate) fn new(fd: RawFd, region: Region) -> Bar {
        let map = if region.mmap && region.size > 0 && region.size <= usize::MAX as u64 {
            // SAFETY: maps `size` bytes of the device's region at its VFIO offset; the result is
            // checked below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    region.size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    region.offset as libc::off_t,
                )
            };
            (p != libc::MAP_FAILED).then_some(p.cast::<u8>())
        } else {
            None
        };
        Bar { fd, region, map }
    }
    /// Replace the mapping of the device (if any) by anonymous memory at the same address, so
    /// that the device file is no longer referenced and accesses racing with it stay harmless.
    pub(crate) fn detach(&self) {
        if let Some(p) = self.map {
            // SAFETY: replaces our own mapping of `size` bytes at `p` in one step (MAP_FIXED),
            // so the address range stays valid for concurrent volatile accesses.
            let r = unsafe {
                libc::mmap(
                    p.cast(),
                    self.region.size as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if r == libc::MAP_FAILED {
                log::warn!(
                    "vfio-pci: replacing a BAR mapping: {}",
                    io::Error::last_os_error()
                );
            }
        }
    }
    /// Whether the BAR is mapped into the process.
    pub(crate) fn mapped(&self) -> bool {
        self.map.is_some()
    }
    fn ok(&self, off: u64, size: u64) -> bool {
        off.checked_add(size).is_some_and(|e| e <= self.region.size) && off.is_multiple_of(size)
    }
    /// Read a `N`-byte little-endian register (`N` is 1, 2 or 4).
    pub(crate) fn read<const N: usize>(&self, off: u64) -> u32 {
        if !self.ok(off, N as u64) {
            return u32::MAX;
        }
        match self.map {
            Some(p) => {
                // SAFETY: in bounds and aligned (checked above), inside our live mapping.
                let a = unsafe { p.add(off as usize) };
                // SAFETY: as above; device registers need volatile accesses of their width.
                unsafe {
                    match N {
                        1 => u32::from(a.read_volatile()),
                        2 => u32::from(u16::from_le(a.cast::<u16>().read_volatile())),
                        _ => u32::from_le(a.cast::<u32>().read_volatile()),
                    }
                }
            }
            None => {
                let mut b = [0u8; 4];
                match pread_exact(self.fd, &mut b[..N], self.region.offset + off) {
                    Ok(()) => u32::from_le_bytes(b),
                    Err(_) => u32::MAX,
                }
            }
        }
    }
    /// Write a `N`-byte little-endian register (`N` is 1, 2 or 4).
    pub(crate) fn write<const N: usize>(&self, off: u64, v: u32) {
        if !self.ok(off, N as u64) {
            return;
        }
        match self.map {
            Some(p) => {
                // SAFETY: in bounds and aligned (checked above), inside our live mapping.
                let a = unsafe { p.add(off as usize) };
                // SAFETY: as above; device registers need volatile accesses of their width.
                unsafe {
                    match N {
                        1 => a.write_volatile(v as u8),
                        2 => a.cast::<u16>().write_volatile((v as u16).to_le()),
                        _ => a.cast::<u32>().write_volatile(v.to_le()),
                    }
                }
            }
            None => {
                let b = v.to_le_bytes();
                // A failed write is seen by the caller in the device's state (status reads).
                let _ = pwrite_all(self.fd, &b[..N], self.region.offset + off);
            }
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(p) = self.map {
            // SAFETY: our own mapping of `size` bytes, no longer used.
            unsafe { libc::munmap(p.cast(), self.region.size as usize) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_iommu_info;

    fn le(v: &mut Vec<u8>, at: usize, b: &[u8]) {
        if v.len() < at + b.len() {
            v.resize(at + b.len(), 0);
        }
        v[at..at + b.len()].copy_from_slice(b);
    }

    #[test]
    fn iommu_info_capabilities_are_read() {
        // Header: argsz, flags (PGSIZES | CAPS), pgsizes 4K|2M|1G, cap_offset 24.
        let mut b = Vec::new();
        le(&mut b, 0, &88u32.to_le_bytes());
        le(&mut b, 4, &3u32.to_le_bytes());
        le(
            &mut b,
            8,
            &(0x1000u64 | 0x20_0000 | 0x4000_0000).to_le_bytes(),
        );
        le(&mut b, 16, &24u32.to_le_bytes());
        // IOVA ranges at 24: id 1, version 1, next 72; 2 ranges.
        le(&mut b, 24, &[1, 0, 1, 0]);
        le(&mut b, 28, &72u32.to_le_bytes());
        le(&mut b, 32, &2u32.to_le_bytes());
        le(&mut b, 40, &0u64.to_le_bytes());
        le(&mut b, 48, &0xfedf_ffffu64.to_le_bytes());
        le(&mut b, 56, &0xfef0_0000u64.to_le_bytes());
        le(&mut b, 64, &0x7f_ffff_ffffu64.to_le_bytes());
        // DMA available at 72: id 3, next 0, avail 65535.
        le(&mut b, 72, &[3, 0, 1, 0]);
        le(&mut b, 76, &0u32.to_le_bytes());
        le(&mut b, 80, &65535u32.to_le_bytes());
        let i = parse_iommu_info(&b);
        assert_eq!(i.pgsizes.trailing_zeros(), 12);
        assert_eq!(
            i.ranges,
            vec![(0, 0xfedf_ffff), (0xfef0_0000, 0x7f_ffff_ffff)]
        );
        assert_eq!(i.dma_avail, Some(65535));
        // Truncated, or a chain that loops: what was read so far, no panic, no hang.
        let t = parse_iommu_info(&b[..60]);
        assert_eq!(t.dma_avail, None);
        let mut looped = b.clone();
        le(&mut looped, 76, &24u32.to_le_bytes());
        assert_eq!(parse_iommu_info(&looped).dma_avail, Some(65535));
        // Without the CAPS flag the chain is not read.
        le(&mut b, 4, &1u32.to_le_bytes());
        assert!(parse_iommu_info(&b).ranges.is_empty());
    }
}
