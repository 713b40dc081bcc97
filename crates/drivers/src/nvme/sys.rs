//! Every `unsafe` of the driver's control path: the NVMe passthrough ioctls of
//! `linux/nvme_ioctl.h` (`NVME_IOCTL_ID`, `NVME_IOCTL_ADMIN_CMD`) and the layout of
//! `struct nvme_uring_cmd` that the queues put in their 128-byte SQEs.

use std::io;
use std::os::fd::RawFd;

/// `struct nvme_passthru_cmd` (the ioctl) and `struct nvme_uring_cmd` (io_uring) share this
/// 72-byte layout; the last word is `result` in the first and reserved in the second.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cmd {
    pub(crate) opcode: u8,
    pub(crate) flags: u8,
    pub(crate) rsvd1: u16,
    pub(crate) nsid: u32,
    pub(crate) cdw2: u32,
    pub(crate) cdw3: u32,
    pub(crate) metadata: u64,
    pub(crate) addr: u64,
    pub(crate) metadata_len: u32,
    pub(crate) data_len: u32,
    pub(crate) cdw10: u32,
    pub(crate) cdw11: u32,
    pub(crate) cdw12: u32,
    pub(crate) cdw13: u32,
    pub(crate) cdw14: u32,
    pub(crate) cdw15: u32,
    pub(crate) timeout_ms: u32,
    pub(crate) result: u32,
}

const _: () = assert!(std::mem::size_of::<Cmd>() == 72);

/// `_IOWR(type, nr, size)` / `_IO(type, nr)` of `asm-generic/ioctl.h`.
const fn iowr(ty: u8, nr: u8, size: usize) -> u32 {
    (3 << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}
/// `NVME_IOCTL_ID`: the namespace id of a namespace device.
const NVME_IOCTL_ID: u32 = ((b'N' as u32) << 8) | 0x40;
/// `NVME_IOCTL_ADMIN_CMD`.
const NVME_IOCTL_ADMIN_CMD: u32 = iowr(b'N', 0x41, 72);
/// `NVME_URING_CMD_IO`: an I/O command on one data buffer.
pub(crate) const NVME_URING_CMD_IO: u32 = iowr(b'N', 0x80, 72);
/// `NVME_URING_CMD_IO_VEC`: an I/O command whose `addr`/`data_len` are an iovec array.
pub(crate) const NVME_URING_CMD_IO_VEC: u32 = iowr(b'N', 0x81, 72);

impl Cmd {
    /// The 80 command bytes of an `IORING_OP_URING_CMD` SQE128.
    pub(crate) fn to_sqe_bytes(self) -> [u8; 80] {
        let mut out = [0u8; 80];
        // SAFETY: `Cmd` is `repr(C)` plain data of 72 bytes without padding (every field is
        // naturally aligned and the size is asserted above); 72 <= 80.
        let bytes = unsafe {
            std::slice::from_raw_parts((&self as *const Cmd).cast::<u8>(), size_of::<Cmd>())
        };
        out[..bytes.len()].copy_from_slice(bytes);
        out
    }
}

/// The namespace id of the namespace device `fd` (`NVME_IOCTL_ID`).
pub(crate) fn ns_id(fd: RawFd) -> io::Result<u32> {
    // SAFETY: NVME_IOCTL_ID takes no argument (an explicit 0 fills the variadic slot); any
    // fd is safe to ask.
    let r = unsafe { libc::ioctl(fd, NVME_IOCTL_ID as _, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u32)
}

/// An admin command through `NVME_IOCTL_ADMIN_CMD` reading up to `buf.len()` bytes into `buf`.
/// `Ok((status, result))`: the NVMe status (0 = success) and completion dword 0.
pub(crate) fn admin(fd: RawFd, mut cmd: Cmd, buf: &mut [u8]) -> io::Result<(u32, u32)> {
    cmd.addr = buf.as_mut_ptr() as u64;
    cmd.data_len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    // SAFETY: `cmd` is a valid `struct nvme_passthru_cmd` whose data pointer and length
    // describe `buf`, which is exclusively borrowed for the (synchronous) call.
    let r = unsafe { libc::ioctl(fd, NVME_IOCTL_ADMIN_CMD as _, &mut cmd as *mut Cmd) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r as u32, cmd.result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        // linux/nvme_ioctl.h values as the kernel computes them.
        assert_eq!(NVME_IOCTL_ID, 0x4e40);
        assert_eq!(NVME_IOCTL_ADMIN_CMD, 0xc048_4e41);
        assert_eq!(NVME_URING_CMD_IO, 0xc048_4e80);
        assert_eq!(NVME_URING_CMD_IO_VEC, 0xc048_4e81);
    }

    #[test]
    fn command_bytes_follow_the_struct_layout() {
        let c = Cmd {
            opcode: 2,
            nsid: 1,
            addr: 0x1122_3344_5566_7788,
            data_len: 4096,
            cdw10: 7,
            cdw12: 0x4000_0007,
            ..Cmd::default()
        };
        let b = c.to_sqe_bytes();
        assert_eq!(b[0], 2);
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 1);
        assert_eq!(
            u64::from_le_bytes(b[24..32].try_into().unwrap()),
            0x1122_3344_5566_7788
        );
        assert_eq!(u32::from_le_bytes(b[36..40].try_into().unwrap()), 4096);
        assert_eq!(u32::from_le_bytes(b[40..44].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_le_bytes(b[48..52].try_into().unwrap()),
            0x4000_0007
        );
        assert!(b[72..].iter().all(|&x| x == 0));
    }
}
