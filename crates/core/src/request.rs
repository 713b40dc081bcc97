//! Requests and completions.

use std::ffi::{CStr, c_char};

/// Request flags (libblkio `BLKIO_REQ_*`).
///
/// The inner value is the raw bit mask as the C ABI passes it; bits outside the three named flags
/// are rejected by [`Request::validate`], as are flags that do not apply to the request's [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReqFlags(pub u32);

impl ReqFlags {
    /// No flag set: the default for every request.
    pub const NONE: ReqFlags = ReqFlags(0);
    /// Force Unit Access: the write is durable when it completes.
    pub const FUA: ReqFlags = ReqFlags(1 << 0);
    /// Write-zeroes must not deallocate.
    pub const NO_UNMAP: ReqFlags = ReqFlags(1 << 1);
    /// Write-zeroes must fail rather than fall back to writing zero buffers.
    pub const NO_FALLBACK: ReqFlags = ReqFlags(1 << 2);
    const ALL: u32 = 0b111;

    /// Whether every bit of `f` is set in `self` (true for `f` = [`ReqFlags::NONE`]).
    pub fn contains(self, f: ReqFlags) -> bool {
        self.0 & f.0 == f.0
    }
}

impl std::ops::BitOr for ReqFlags {
    type Output = ReqFlags;
    fn bitor(self, r: ReqFlags) -> ReqFlags {
        ReqFlags(self.0 | r.0)
    }
}

/// What a request does. Buffers are raw pointers because requests cross the C ABI and outlive the
/// call that enqueued them; [`crate::Queue::enqueue`] is `unsafe` for that reason.
#[derive(Debug, Clone, Copy)]
///
/// Offsets and lengths are in bytes from the start of the device and must be multiples of the
/// device's `request-alignment` property (buffers: of `buf-alignment`); offsets above
/// `i64::MAX` are rejected by [`Request::validate`].
pub enum Op {
    /// Read `len` bytes at `offset` into `buf` (libblkio `blkioq_read`).
    Read {
        /// Byte offset on the device.
        offset: u64,
        /// Destination, writable for `len` bytes until the completion is returned.
        buf: *mut u8,
        /// Number of bytes to read.
        len: usize,
    },
    /// Write `len` bytes from `buf` at `offset` (libblkio `blkioq_write`); honours
    /// [`ReqFlags::FUA`].
    Write {
        /// Byte offset on the device.
        offset: u64,
        /// Source, readable for `len` bytes until the completion is returned.
        buf: *const u8,
        /// Number of bytes to write.
        len: usize,
    },
    /// Scatter read into `iovcnt` buffers, filled in order from `offset` (libblkio
    /// `blkioq_readv`). `iov` must stay valid until completion, like the buffers it points to.
    Readv {
        /// Byte offset on the device of the first byte of `iov[0]`.
        offset: u64,
        /// Array of `iovcnt` iovecs.
        iov: *const libc::iovec,
        /// Number of iovecs; negative values fail validation.
        iovcnt: i32,
    },
    /// Gather write from `iovcnt` buffers, written in order from `offset` (libblkio
    /// `blkioq_writev`); honours [`ReqFlags::FUA`]. The same validity rule as [`Op::Readv`].
    Writev {
        /// Byte offset on the device of the first byte of `iov[0]`.
        offset: u64,
        /// Array of `iovcnt` iovecs.
        iov: *const libc::iovec,
        /// Number of iovecs; negative values fail validation.
        iovcnt: i32,
    },
    /// Make every write completed before it durable (libblkio `blkioq_flush`).
    Flush,
    /// Tell the device that a range is no longer needed (libblkio `blkioq_discard`); its contents
    /// are unspecified afterwards (on a regular file the file drivers punch a hole, so it reads
    /// back as zeroes).
    Discard {
        /// Byte offset of the range.
        offset: u64,
        /// Length of the range in bytes.
        len: u64,
    },
    /// Make a range read back as zeroes (libblkio `blkioq_write_zeroes`); honours
    /// [`ReqFlags::FUA`], [`ReqFlags::NO_UNMAP`] and [`ReqFlags::NO_FALLBACK`].
    WriteZeroes {
        /// Byte offset of the range.
        offset: u64,
        /// Length of the range in bytes.
        len: u64,
    },
    /// A zoned-storage request: report zones or a zone management action. Only the
    /// `nvme-io_uring` driver on a zoned namespace carries these out; every other driver fails
    /// them.
    Zone(crate::ZoneOp),
}

/// One request, as handed to [`crate::Queue::enqueue`]: an operation, the caller's tag and flags.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// What to do, with its buffers.
    pub op: Op,
    /// Opaque to the library: returned verbatim in the request's [`Completion::user_data`] so the
    /// caller can match completions (which may arrive in any order) to requests.
    pub user_data: usize,
    /// `BLKIO_REQ_*` flags; which are valid depends on `op` (see [`Request::validate`]).
    pub flags: ReqFlags,
}

// SAFETY: the raw pointers are plain addresses handed over by the caller of the unsafe
// `Queue::enqueue`, who guarantees they stay valid and unaliased until completion; moving the
// request to another thread with its queue does not change that.
unsafe impl Send for Request {}

impl Request {
    /// A request from its parts; nothing is checked until [`Request::validate`].
    pub fn new(op: Op, user_data: usize, flags: ReqFlags) -> Self {
        Request {
            op,
            user_data,
            flags,
        }
    }

    /// The enqueue-time checks every driver applies first (flags, iovcnt), with libblkio's
    /// messages. `Err` is the static message for the failed completion, always with `EINVAL`.
    pub fn validate(&self) -> std::result::Result<(), &'static CStr> {
        if self.flags.0 & !ReqFlags::ALL != 0 {
            return Err(c"unsupported bits in request flags");
        }
        let allowed = match self.op {
            Op::Write { .. } | Op::Writev { .. } => ReqFlags::FUA.0,
            Op::WriteZeroes { .. } => ReqFlags::ALL,
            _ => 0,
        };
        let bad = self.flags.0 & !allowed;
        if bad != 0 {
            return Err(match bad & bad.wrapping_neg() {
                1 => c"BLKIO_REQ_FUA is invalid for this request type",
                2 => c"BLKIO_REQ_NO_UNMAP is invalid for this request type",
                _ => c"BLKIO_REQ_NO_FALLBACK is invalid for this request type",
            });
        }
        if let Op::Read { offset, .. }
        | Op::Write { offset, .. }
        | Op::Readv { offset, .. }
        | Op::Writev { offset, .. }
        | Op::Discard { offset, .. }
        | Op::WriteZeroes { offset, .. } = self.op
            && offset > i64::MAX as u64
        {
            // The kernel's offsets are signed: io_uring takes -1 (2^64 - 1) as "the file
            // position", which would read or write wherever that is (usually offset 0).
            return Err(c"offset must fit in a signed 64-bit integer");
        }
        if let Op::Zone(z) = self.op
            && z.offset().is_some_and(|o| o > i64::MAX as u64)
        {
            return Err(c"offset must fit in a signed 64-bit integer");
        }
        if let Op::Readv { iovcnt, .. } | Op::Writev { iovcnt, .. } = self.op
            && iovcnt < 0
        {
            return Err(c"iovcnt must be non-negative and fit in a signed 32-bit integer");
        }
        Ok(())
    }

    /// Total data length of a read/write request, 0 for others; `u64::MAX` when the iovec
    /// lengths add up to more than that.
    ///
    /// # Safety
    /// For readv/writev, `iov` must point to `iovcnt` valid iovecs.
    pub unsafe fn data_len(&self) -> u64 {
        match self.op {
            Op::Read { len, .. } | Op::Write { len, .. } => len as u64,
            Op::Readv { iov, iovcnt, .. } | Op::Writev { iov, iovcnt, .. } => {
                if iov.is_null() || iovcnt <= 0 {
                    return 0;
                }
                // SAFETY: guaranteed by the caller.
                let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
                // Saturating: a sum beyond u64 (a hostile iovec array) exceeds every limit
                // and is refused with EINVAL instead of wrapping.
                v.iter()
                    .try_fold(0u64, |a, i| a.checked_add(i.iov_len as u64))
                    .unwrap_or(u64::MAX)
            }
            _ => 0,
        }
    }
}

/// A completion, laid out exactly as `struct blkio_completion` (32 bytes) so the C ABI hands the
/// caller's array straight to [`crate::Queue::do_io`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// The [`Request::user_data`] of the request this completes.
    pub user_data: usize,
    error_msg: *const c_char,
    /// 0 on success, negative errno on failure.
    pub ret: i32,
    reserved: [u8; 12],
}

// SAFETY: `error_msg` is either null or points to a `'static` NUL-terminated string.
unsafe impl Send for Completion {}
// SAFETY: as above; the struct is immutable plain data.
unsafe impl Sync for Completion {}

impl Default for Completion {
    fn default() -> Self {
        Completion::ok(0)
    }
}

impl Completion {
    /// A success (`ret` 0) for the request tagged `user_data`.
    pub fn ok(user_data: usize) -> Self {
        Completion {
            user_data,
            error_msg: std::ptr::null(),
            ret: 0,
            reserved: [0; 12],
        }
    }
    /// A success carrying a count in `ret` (a zone report's number of zones filled).
    pub fn count(user_data: usize, n: i32) -> Self {
        Completion {
            ret: n.max(0),
            ..Completion::ok(user_data)
        }
    }
    /// A failure with the kernel's errno (`errno` positive) and no message.
    pub fn os_err(user_data: usize, errno: i32) -> Self {
        Completion {
            user_data,
            error_msg: std::ptr::null(),
            ret: -errno.abs(),
            reserved: [0; 12],
        }
    }
    /// A failure detected by the library, with a static message.
    pub fn err(user_data: usize, errno: i32, msg: &'static CStr) -> Self {
        Completion {
            user_data,
            error_msg: msg.as_ptr(),
            ret: -errno.abs(),
            reserved: [0; 12],
        }
    }
    /// The library's message for this completion, if any.
    pub fn error_msg(&self) -> Option<&'static CStr> {
        if self.error_msg.is_null() {
            None
        } else {
            // SAFETY: only set from `&'static CStr` in `Completion::err`.
            Some(unsafe { CStr::from_ptr(self.error_msg) })
        }
    }
    /// `Ok(())` or the failure as an [`crate::Error`].
    pub fn result(&self) -> crate::Result<()> {
        if self.ret >= 0 {
            return Ok(());
        }
        match self.error_msg() {
            Some(m) => Err(crate::Error::new(
                -self.ret,
                m.to_string_lossy().into_owned(),
            )),
            None => Err(crate::Error::from_errno(-self.ret)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_matches_c_layout() {
        assert_eq!(std::mem::size_of::<Completion>(), 32);
        assert_eq!(std::mem::align_of::<Completion>(), 8);
        assert_eq!(std::mem::offset_of!(Completion, error_msg), 8);
        assert_eq!(std::mem::offset_of!(Completion, ret), 16);
    }

    #[test]
    fn data_len_saturates_instead_of_wrapping() {
        let iov = |len| libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: len,
        };
        let v = [iov(usize::MAX), iov(2), iov(3)];
        let r = |n| {
            Request::new(
                Op::Readv {
                    offset: 0,
                    iov: v.as_ptr(),
                    iovcnt: n,
                },
                0,
                ReqFlags::NONE,
            )
        };
        // SAFETY: `v` holds the iovecs the requests name.
        unsafe {
            assert_eq!(r(1).data_len(), usize::MAX as u64);
            // usize::MAX + 2 wraps to 1 unchecked.
            assert_eq!(r(2).data_len(), u64::MAX);
            assert_eq!(r(3).data_len(), u64::MAX);
        }
    }

    #[test]
    fn flag_validation_names_lowest_bad_bit() {
        let rd = |f| {
            Request::new(
                Op::Read {
                    offset: 0,
                    buf: std::ptr::null_mut(),
                    len: 0,
                },
                0,
                ReqFlags(f),
            )
        };
        assert_eq!(
            rd(8).validate().unwrap_err(),
            c"unsupported bits in request flags"
        );
        assert_eq!(
            rd(6).validate().unwrap_err(),
            c"BLKIO_REQ_NO_UNMAP is invalid for this request type"
        );
        assert!(rd(0).validate().is_ok());
        let wz = Request::new(Op::WriteZeroes { offset: 0, len: 1 }, 0, ReqFlags(7));
        assert!(wz.validate().is_ok());
        let wv = Request::new(
            Op::Writev {
                offset: 0,
                iov: std::ptr::null(),
                iovcnt: -1,
            },
            0,
            ReqFlags::FUA,
        );
        assert!(wv.validate().is_err());
    }

    #[test]
    fn zone_requests_take_no_flags_and_signed_offsets() {
        use crate::{ZoneAction, ZoneOp};
        let z = |offset, f| {
            Request::new(
                Op::Zone(ZoneOp::Manage {
                    action: ZoneAction::Reset,
                    offset,
                }),
                0,
                ReqFlags(f),
            )
        };
        assert!(z(Some(0), 0).validate().is_ok());
        assert!(z(None, 0).validate().is_ok());
        assert_eq!(
            z(Some(0), 1).validate().unwrap_err(),
            c"BLKIO_REQ_FUA is invalid for this request type"
        );
        assert_eq!(
            z(Some(1 << 63), 0).validate().unwrap_err(),
            c"offset must fit in a signed 64-bit integer"
        );
        let r = Request::new(
            Op::Zone(ZoneOp::Report {
                offset: u64::MAX,
                zones: std::ptr::null_mut(),
                nr_zones: 1,
            }),
            0,
            ReqFlags::NONE,
        );
        assert!(r.validate().is_err());
        assert_eq!(Completion::count(3, 16).ret, 16);
        assert!(Completion::count(3, 16).result().is_ok());
    }
}
