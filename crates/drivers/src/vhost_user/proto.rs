//! The vhost-user frontend: the control messages snapblk sends to a backend over its unix
//! socket (vhost-user specification, "Front-end message types"), with their wire layout.

use super::sys;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Message types (the specification's numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Req {
    GetFeatures = 1,
    SetFeatures = 2,
    SetOwner = 3,
    SetVringNum = 8,
    SetVringAddr = 9,
    SetVringBase = 10,
    SetVringKick = 12,
    SetVringCall = 13,
    GetProtocolFeatures = 15,
    SetProtocolFeatures = 16,
    GetQueueNum = 17,
    SetVringEnable = 18,
    GetConfig = 24,
    GetMaxMemSlots = 36,
    AddMemReg = 37,
    RemMemReg = 38,
}

/// `VHOST_USER_F_PROTOCOL_FEATURES`, a virtio feature bit.
pub(crate) const F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// Protocol feature bits.
pub(crate) const PF_MQ: u64 = 1 << 0;
pub(crate) const PF_REPLY_ACK: u64 = 1 << 3;
pub(crate) const PF_CONFIG: u64 = 1 << 9;
pub(crate) const PF_CONFIGURE_MEM_SLOTS: u64 = 1 << 15;

const VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
/// The longest reply we accept (a config space is the largest one we ask for).
const MAX_REPLY: u32 = 4096;
/// How long a backend may take to answer one message before the connection is given up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong talking to the backend.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VuError {
    /// The socket could not be connected.
    #[error("connecting to vhost-user socket {path}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Sending or receiving a message failed (the backend closed the socket, or never
    /// answered).
    #[error("vhost-user message {req:?}: the backend did not answer (is it a vhost-user backend?)")]
    Io {
        req: Req,
        #[source]
        source: std::io::Error,
    },
    /// The backend answered something that is not a reply to our message.
    #[error(
        "vhost-user message {req:?}: the backend's reply is not vhost-user (request {got}, flags {flags:#x}, size {size})"
    )]
    BadReply {
        req: Req,
        got: u32,
        flags: u32,
        size: u32,
    },
    /// The backend refused a message (a nonzero REPLY_ACK).
    #[error("vhost-user message {req:?}: the backend refused it ({code})")]
    Refused { req: Req, code: u64 },
    /// The backend lacks something this frontend needs.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// One connection to a backend.
#[derive(Debug)]
pub(crate) struct Frontend {
    sock: UnixStream,
    reply_ack: bool,
}

impl Frontend {
    pub(crate) fn connect(path: &str) -> Result<Frontend, VuError> {
        let sock = UnixStream::connect(path).map_err(|source| VuError::Connect {
            path: path.to_owned(),
            source,
        })?;
        let io = |source| VuError::Io {
            req: Req::SetOwner,
            source,
        };
        sock.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        sock.set_write_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        Ok(Frontend {
            sock,
            reply_ack: false,
        })
    }

    /// The socket, for watching it for a hang-up.
    pub(crate) fn sock(&self) -> &UnixStream {
        &self.sock
    }

    pub(crate) fn set_reply_ack(&mut self, on: bool) {
        self.reply_ack = on;
    }

    fn send(
        &mut self,
        req: Req,
        payload: &[u8],
        fds: &[RawFd],
        need_reply: bool,
    ) -> Result<(), VuError> {
        let mut m = Vec::with_capacity(12 + payload.len());
        let flags = VERSION | if need_reply { FLAG_NEED_REPLY } else { 0 };
        m.extend_from_slice(&(req as u32).to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(payload);
        let r = if fds.is_empty() {
            self.sock.write_all(&m)
        } else {
            sys::send_with_fds(self.sock.as_raw_fd(), &m, fds)
        };
        r.map_err(|source| VuError::Io { req, source })
    }

    fn recv(&mut self, req: Req) -> Result<Vec<u8>, VuError> {
        let mut h = [0u8; 12];
        self.sock
            .read_exact(&mut h)
            .map_err(|source| VuError::Io { req, source })?;
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let (got, flags, size) = (word(0), word(4), word(8));
        if got != req as u32
            || flags & FLAG_REPLY == 0
            || flags & 0x3 != VERSION
            || size > MAX_REPLY
        {
            return Err(VuError::BadReply {
                req,
                got,
                flags,
                size,
            });
        }
        let mut p = vec![0u8; size as usize];
        self.sock
            .read_exact(&mut p)
            .map_err(|source| VuError::Io { req, source })?;
        Ok(p)
    }

    /// Send a message that has no reply of its own; with REPLY_ACK negotiated, wait for the
    /// acknowledgement and fail if it is nonzero.
    pub(crate) fn call(&mut self, req: Req, payload: &[u8], fds: &[RawFd]) -> Result<(), VuError> {
        self.send(req, payload, fds, self.reply_ack)?;
        if self.reply_ack {
            let code = u64_of(req, &self.recv(req)?)?;
            if code != 0 {
                return Err(VuError::Refused { req, code });
            }
        }
        Ok(())
    }

    /// Send a message whose reply is a u64 (GET_FEATURES, GET_QUEUE_NUM, ...).
    pub(crate) fn get_u64(&mut self, req: Req) -> Result<u64, VuError> {
        self.send(req, &[], &[], false)?;
        u64_of(req, &self.recv(req)?)
    }

    pub(crate) fn set_u64(&mut self, req: Req, v: u64) -> Result<(), VuError> {
        self.call(req, &v.to_le_bytes(), &[])
    }

    /// Vring state messages (`SET_VRING_NUM`, `_BASE`, `_ENABLE`): index and value.
    pub(crate) fn vring_state(&mut self, req: Req, index: u32, num: u32) -> Result<(), VuError> {
        let mut p = [0u8; 8];
        p[..4].copy_from_slice(&index.to_le_bytes());
        p[4..].copy_from_slice(&num.to_le_bytes());
        self.call(req, &p, &[])
    }

    /// `SET_VRING_ADDR`: the ring's three parts as process (= backend user) addresses.
    pub(crate) fn vring_addr(
        &mut self,
        index: u32,
        desc: u64,
        used: u64,
        avail: u64,
    ) -> Result<(), VuError> {
        let mut p = Vec::with_capacity(40);
        p.extend_from_slice(&index.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        for a in [desc, used, avail, 0] {
            p.extend_from_slice(&a.to_le_bytes());
        }
        self.call(Req::SetVringAddr, &p, &[])
    }

    /// `SET_VRING_KICK` / `SET_VRING_CALL` with an eventfd.
    pub(crate) fn vring_fd(&mut self, req: Req, index: u32, fd: RawFd) -> Result<(), VuError> {
        self.call(req, &u64::from(index).to_le_bytes(), &[fd])
    }

    /// `ADD_MEM_REG` / `REM_MEM_REG` of one fd-backed region, at its process address (guest
    /// and user addresses are both the process address: the IOVA is the identity).
    pub(crate) fn mem_reg(
        &mut self,
        req: Req,
        addr: u64,
        len: u64,
        fd: RawFd,
        fd_offset: u64,
    ) -> Result<(), VuError> {
        let mut p = Vec::with_capacity(40);
        for v in [0, addr, len, addr, fd_offset] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        // libvhost-user (QEMU 7.2) wants the fd with REM_MEM_REG too, as QEMU sends it.
        self.call(req, &p, &[fd])
    }

    /// `GET_CONFIG` of `len` bytes of the device's config space from offset 0.
    pub(crate) fn get_config(&mut self, len: u32) -> Result<Vec<u8>, VuError> {
        let mut p = Vec::with_capacity(12 + len as usize);
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&len.to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.resize(12 + len as usize, 0);
        self.send(Req::GetConfig, &p, &[], false)?;
        let r = self.recv(Req::GetConfig)?;
        if r.len() < 12 + len as usize {
            return Err(VuError::Unsupported(
                "the backend's GET_CONFIG reply is too short",
            ));
        }
        Ok(r[12..12 + len as usize].to_vec())
    }
}

fn u64_of(req: Req, p: &[u8]) -> Result<u64, VuError> {
    match p.get(..8) {
        Some(b) => Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))),
        None => Err(VuError::BadReply {
            req,
            got: req as u32,
            flags: FLAG_REPLY,
            size: p.len() as u32,
        }),
    }
}
