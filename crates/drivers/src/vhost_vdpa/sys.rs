//! Every `unsafe` of the vhost-vdpa driver: the ioctls of `linux/vhost.h` on a
//! `/dev/vhost-vdpa-N` descriptor, and the IOTLB messages `write()` to it
//! (`struct vhost_msg_v2` of `linux/vhost_types.h`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

const VHOST_VIRTIO: u64 = 0xAF;

/// `_IOC(dir, 0xAF, nr, size)` as `asm-generic/ioctl.h` builds it.
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (VHOST_VIRTIO << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    ioc(2, nr, size)
}
const fn iow(nr: u64, size: u64) -> u64 {
    ioc(1, nr, size)
}

pub(crate) const GET_FEATURES: u64 = ior(0x00, 8);
pub(crate) const SET_FEATURES: u64 = iow(0x00, 8);
pub(crate) const SET_OWNER: u64 = ioc(0, 0x01, 0);
pub(crate) const SET_VRING_NUM: u64 = iow(0x10, 8);
pub(crate) const SET_VRING_ADDR: u64 = iow(0x11, 40);
pub(crate) const SET_VRING_BASE: u64 = iow(0x12, 8);
pub(crate) const GET_VRING_BASE: u64 = ioc(3, 0x12, 8);
pub(crate) const SET_VRING_KICK: u64 = iow(0x20, 8);
pub(crate) const SET_VRING_CALL: u64 = iow(0x21, 8);
pub(crate) const SET_BACKEND_FEATURES: u64 = iow(0x25, 8);
pub(crate) const GET_BACKEND_FEATURES: u64 = ior(0x26, 8);
pub(crate) const GET_DEVICE_ID: u64 = ior(0x70, 4);
pub(crate) const GET_STATUS: u64 = ior(0x71, 1);
pub(crate) const SET_STATUS: u64 = iow(0x72, 1);
pub(crate) const GET_CONFIG: u64 = ior(0x73, 8);
pub(crate) const SET_VRING_ENABLE: u64 = iow(0x75, 8);
pub(crate) const GET_VRING_NUM: u64 = ior(0x76, 2);
pub(crate) const GET_IOVA_RANGE: u64 = ior(0x78, 16);
pub(crate) const GET_CONFIG_SIZE: u64 = ior(0x79, 4);
pub(crate) const GET_VQS_COUNT: u64 = ior(0x80, 4);

/// `VHOST_BACKEND_F_IOTLB_MSG_V2` (a bit number).
pub(crate) const BACKEND_F_IOTLB_MSG_V2: u64 = 1 << 1;
const IOTLB_MSG: u32 = 1;
const IOTLB_MSG_V2: u32 = 2;
const IOTLB_UPDATE: u8 = 2;
const IOTLB_INVALIDATE: u8 = 3;
const ACCESS_RW: u8 = 3;

/// An open vhost-vdpa character device.
#[derive(Debug)]
pub(crate) struct Vdpa {
    fd: OwnedFd,
    /// `VHOST_BACKEND_F_IOTLB_MSG_V2` negotiated: IOTLB messages are `vhost_msg_v2`.
    v2: bool,
}

impl Vdpa {
    /// Open `path` read-write, close-on-exec.
    pub(crate) fn open(path: &str) -> io::Result<Vdpa> {
        let c =
            std::ffi::CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `c` is a valid C string; the result is checked.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor this process owns.
        Ok(Vdpa::from_fd(unsafe { OwnedFd::from_raw_fd(raw) }))
    }

    /// Use `fd`, an open vhost-vdpa descriptor (the `fd` property).
    pub(crate) fn from_fd(fd: OwnedFd) -> Vdpa {
        Vdpa { fd, v2: false }
    }

    /// Whether `fd` is an open descriptor (`F_GETFD`), before it is taken over.
    pub(crate) fn is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD only reads the descriptor flags; an invalid fd yields EBADF.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    /// Give the descriptor up without closing it.
    pub(crate) fn into_raw(self) -> RawFd {
        self.fd.into_raw_fd()
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A duplicate of the descriptor (close-on-exec).
    pub(crate) fn dup(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// `ioctl(fd, req, arg)` with `arg` pointing at a `T` the kernel reads or writes.
    fn ioctl<T>(&self, req: u64, arg: &mut T) -> io::Result<()> {
        // SAFETY: every request used with this helper takes a pointer to exactly `T` (the sizes
        // in the request numbers match the `T`s of the callers below); `arg` is live for the call.
        let r = unsafe { libc::ioctl(self.raw(), req as libc::c_ulong, arg as *mut T) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub(crate) fn set_owner(&self) -> io::Result<()> {
        // SAFETY: VHOST_SET_OWNER takes no argument.
        let r = unsafe { libc::ioctl(self.raw(), SET_OWNER as libc::c_ulong) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub(crate) fn get_u64(&self, req: u64) -> io::Result<u64> {
        let mut v = 0u64;
        self.ioctl(req, &mut v)?;
        Ok(v)
    }

    pub(crate) fn set_u64(&self, req: u64, mut v: u64) -> io::Result<()> {
        self.ioctl(req, &mut v)
    }

    pub(crate) fn get_u32(&self, req: u64) -> io::Result<u32> {
        let mut v = 0u32;
        self.ioctl(req, &mut v)?;
        Ok(v)
    }

    pub(crate) fn vring_num_max(&self) -> io::Result<u16> {
        let mut v = 0u16;
        self.ioctl(GET_VRING_NUM, &mut v)?;
        Ok(v)
    }

    pub(crate) fn status(&self) -> io::Result<u8> {
        let mut v = 0u8;
        self.ioctl(GET_STATUS, &mut v)?;
        Ok(v)
    }

    pub(crate) fn set_status(&self, mut s: u8) -> io::Result<()> {
        self.ioctl(SET_STATUS, &mut s)
    }

    /// `VHOST_VDPA_GET_IOVA_RANGE`: the first and last usable IOVA (inclusive).
    pub(crate) fn iova_range(&self) -> io::Result<(u64, u64)> {
        let mut r = [0u64; 2];
        self.ioctl(GET_IOVA_RANGE, &mut r)?;
        Ok((r[0], r[1]))
    }

    /// `len` bytes of the device's config space from offset 0.
    pub(crate) fn config(&self, len: u32) -> io::Result<Vec<u8>> {
        // struct vhost_vdpa_config { __u32 off; __u32 len; __u8 buf[]; }, as u32 words so that
        // the header is aligned.
        let mut words = vec![0u32; 2 + (len as usize).div_ceil(4)];
        words[1] = len;
        // SAFETY: GET_CONFIG reads the 8-byte header and writes `len` bytes after it, all inside
        // `words`; the pointer is live for the call.
        let r = unsafe { libc::ioctl(self.raw(), GET_CONFIG as libc::c_ulong, words.as_mut_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let bytes: Vec<u8> = words[2..].iter().flat_map(|w| w.to_ne_bytes()).collect();
        Ok(bytes[..len as usize].to_vec())
    }

    /// `struct vhost_vring_state` requests (NUM, BASE, VDPA_SET_VRING_ENABLE).
    pub(crate) fn vring_state(&self, req: u64, index: u32, num: u32) -> io::Result<()> {
        let mut s = [index, num];
        self.ioctl(req, &mut s)
    }

    /// `VHOST_GET_VRING_BASE`: the device's next available index of vring `index` (on VDUSE,
    /// answered by the daemon: an error once it is gone).
    pub(crate) fn vring_base(&self, index: u32) -> io::Result<u32> {
        let mut s = [index, 0];
        self.ioctl(GET_VRING_BASE, &mut s)?;
        Ok(s[1])
    }

    /// `struct vhost_vring_file` requests (KICK, CALL).
    pub(crate) fn vring_fd(&self, req: u64, index: u32, fd: RawFd) -> io::Result<()> {
        let mut s = [index as i32, fd];
        self.ioctl(req, &mut s)
    }

    /// `VHOST_SET_VRING_ADDR` with device addresses (IOVAs).
    pub(crate) fn vring_addr(
        &self,
        index: u32,
        desc: u64,
        used: u64,
        avail: u64,
    ) -> io::Result<()> {
        // struct vhost_vring_addr { u32 index, flags; u64 desc, used, avail, log; }
        let mut a = [u64::from(index), desc, used, avail, 0];
        self.ioctl(SET_VRING_ADDR, &mut a)
    }

    /// Negotiate the backend features: `IOTLB_MSG_V2` if offered.
    pub(crate) fn negotiate_backend(&mut self) -> io::Result<()> {
        let offered = self.get_u64(GET_BACKEND_FEATURES)?;
        let want = offered & BACKEND_F_IOTLB_MSG_V2;
        self.set_u64(SET_BACKEND_FEATURES, want)?;
        self.v2 = want != 0;
        Ok(())
    }

    /// Map `size` bytes at process address `uaddr` to `iova`, read-write.
    pub(crate) fn map(&self, iova: u64, size: u64, uaddr: u64) -> io::Result<()> {
        self.iotlb(IOTLB_UPDATE, iova, size, uaddr, ACCESS_RW)
    }

    /// Remove the mapping of `size` bytes at `iova`.
    pub(crate) fn unmap(&self, iova: u64, size: u64) -> io::Result<()> {
        self.iotlb(IOTLB_INVALIDATE, iova, size, 0, 0)
    }

    fn iotlb(&self, kind: u8, iova: u64, size: u64, uaddr: u64, perm: u8) -> io::Result<()> {
        let msg = iotlb_msg(self.v2, kind, iova, size, uaddr, perm);
        // SAFETY: writes the 72 bytes of a live array to our descriptor.
        let n = unsafe { libc::write(self.raw(), msg.as_ptr().cast(), msg.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != msg.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

/// The bytes of a `struct vhost_msg` / `vhost_msg_v2` carrying one `struct vhost_iotlb_msg`:
/// the type (and, for v2, an ASID of 0) in the first 8 bytes, then iova, size, uaddr (u64 each),
/// perm and type (u8), zero padding to 72 bytes.
pub(crate) fn iotlb_msg(
    v2: bool,
    kind: u8,
    iova: u64,
    size: u64,
    uaddr: u64,
    perm: u8,
) -> [u8; 72] {
    let mut m = [0u8; 72];
    let ty = if v2 { IOTLB_MSG_V2 } else { IOTLB_MSG };
    m[0..4].copy_from_slice(&ty.to_ne_bytes());
    m[8..16].copy_from_slice(&iova.to_ne_bytes());
    m[16..24].copy_from_slice(&size.to_ne_bytes());
    m[24..32].copy_from_slice(&uaddr.to_ne_bytes());
    m[32] = perm;
    m[33] = kind;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request numbers, as `linux/vhost.h` (linux-libc-dev 6.1) defines them: printed by a
    /// C program including the header.
    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        let want: &[(u64, u64)] = &[
            (GET_FEATURES, 0x8008af00),
            (SET_FEATURES, 0x4008af00),
            (SET_OWNER, 0xaf01),
            (SET_VRING_NUM, 0x4008af10),
            (SET_VRING_ADDR, 0x4028af11),
            (SET_VRING_BASE, 0x4008af12),
            (GET_VRING_BASE, 0xc008af12),
            (SET_VRING_KICK, 0x4008af20),
            (SET_VRING_CALL, 0x4008af21),
            (SET_BACKEND_FEATURES, 0x4008af25),
            (GET_BACKEND_FEATURES, 0x8008af26),
            (GET_DEVICE_ID, 0x8004af70),
            (GET_STATUS, 0x8001af71),
            (SET_STATUS, 0x4001af72),
            (GET_CONFIG, 0x8008af73),
            (SET_VRING_ENABLE, 0x4008af75),
            (GET_VRING_NUM, 0x8002af76),
            (GET_IOVA_RANGE, 0x8010af78),
            (GET_CONFIG_SIZE, 0x8004af79),
            (GET_VQS_COUNT, 0x8004af80),
        ];
        for &(got, exp) in want {
            assert_eq!(got, exp, "{got:#x} != {exp:#x}");
        }
    }

    #[test]
    fn iotlb_message_layout() {
        let m = iotlb_msg(
            true,
            IOTLB_UPDATE,
            0x1000,
            0x2000,
            0x7f00_0000_0000,
            ACCESS_RW,
        );
        assert_eq!(&m[0..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(u64::from_ne_bytes(m[8..16].try_into().unwrap()), 0x1000);
        assert_eq!(u64::from_ne_bytes(m[16..24].try_into().unwrap()), 0x2000);
        assert_eq!(
            u64::from_ne_bytes(m[24..32].try_into().unwrap()),
            0x7f00_0000_0000
        );
        assert_eq!((m[32], m[33]), (3, 2));
        assert!(m[34..].iter().all(|&b| b == 0));
        assert_eq!(iotlb_msg(false, IOTLB_INVALIDATE, 0, 1, 0, 0)[0], 1);
    }
}
