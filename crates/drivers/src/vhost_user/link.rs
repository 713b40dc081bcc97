//! The control connection shared by the driver and its queues, and reconnecting it.
//!
//! With the `reconnect` property, a queue that sees the backend hang up calls
//! [`Link::revive`]: the first queue to notice connects again to the same `path` (every
//! [`RETRY`], for at most [`LIMIT`]), redoes the negotiation with the saved features and adds
//! every saved memory region again (the caller's regions and the queues' ring memfds, the same
//! fds); each queue then resets its own ring and sets its vring up again on the new
//! connection. A queue set up on an older connection notices through its own duplicate of that
//! connection's socket, which hangs up too.
//!
//! Requests that were on the ring are sent again from the start: reads are idempotent, and a
//! write sent twice writes the same data (a virtio-blk device after a reset expects the driver
//! to resubmit). The reconnecting queue's `do_io` blocks while it retries (other threads using
//! the link wait for the lock); if [`LIMIT`] passes without a working connection, every request
//! of every queue fails with `EIO`, now and later.

use super::proto::{self, Frontend, Req, VuError};
use super::sys::dup_fd;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often connecting is tried again while reconnecting.
pub(crate) const RETRY: Duration = Duration::from_millis(100);
/// How long reconnecting is tried before every request fails with `EIO`.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// A memory region the backend must know, kept to be added again after a reconnect.
#[derive(Debug)]
struct Saved {
    addr: u64,
    len: u64,
    fd: OwnedFd,
    offset: u64,
}

/// The connection and what a reconnect needs to redo.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) fe: Frontend,
    path: String,
    /// Protocol features sent with `SET_PROTOCOL_FEATURES`.
    protocol: u64,
    /// Features sent with `SET_FEATURES`, once sent.
    features: Option<u64>,
    regions: Vec<Saved>,
    /// Bumped by every successful reconnect.
    epoch: u64,
    /// Reconnecting failed: the device is gone for good.
    lost: bool,
}

/// [`Link`] behind a lock, shared by the driver and its queues.
pub(crate) type Shared = Arc<Mutex<Link>>;

/// Lock the link (a panic elsewhere does not make its state unusable).
pub(crate) fn lock(l: &Shared) -> MutexGuard<'_, Link> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// One vring, as a queue sets it up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vring {
    pub(crate) index: u32,
    pub(crate) num: u32,
    pub(crate) desc: u64,
    pub(crate) used: u64,
    pub(crate) avail: u64,
    pub(crate) kick: RawFd,
    pub(crate) call: RawFd,
}

impl Link {
    pub(crate) fn new(fe: Frontend, path: &str, protocol: u64) -> Shared {
        Arc::new(Mutex::new(Link {
            fe,
            path: path.to_owned(),
            protocol,
            features: None,
            regions: Vec::new(),
            epoch: 0,
            lost: false,
        }))
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(crate) fn set_features(&mut self, features: u64) -> Result<(), VuError> {
        self.fe.set_u64(Req::SetFeatures, features)?;
        self.features = Some(features);
        Ok(())
    }

    /// Add a region to the backend and remember it (with a duplicate of `fd`).
    pub(crate) fn add_region(
        &mut self,
        addr: u64,
        len: u64,
        fd: RawFd,
        offset: u64,
    ) -> Result<(), VuError> {
        let kept = dup_fd(fd).map_err(|source| VuError::Io {
            req: Req::AddMemReg,
            source,
        })?;
        self.fe.mem_reg(Req::AddMemReg, addr, len, fd, offset)?;
        self.regions.push(Saved {
            addr,
            len,
            fd: kept,
            offset,
        });
        Ok(())
    }

    /// Remove a region from the backend (if it is still there) and forget it.
    pub(crate) fn remove_region(&mut self, addr: u64, len: u64, fd: RawFd, offset: u64) {
        self.regions.retain(|r| (r.addr, r.len) != (addr, len));
        // A backend that is gone has nothing left to unmap.
        let _ = self.fe.mem_reg(Req::RemMemReg, addr, len, fd, offset);
    }

    /// Set up and enable one vring, starting at index 0.
    pub(crate) fn setup_vring(&mut self, v: Vring) -> Result<(), VuError> {
        let fe = &mut self.fe;
        fe.vring_state(Req::SetVringNum, v.index, v.num)?;
        fe.vring_state(Req::SetVringBase, v.index, 0)?;
        fe.vring_addr(v.index, v.desc, v.used, v.avail)?;
        fe.vring_fd(Req::SetVringKick, v.index, v.kick)?;
        fe.vring_fd(Req::SetVringCall, v.index, v.call)?;
        fe.vring_state(Req::SetVringEnable, v.index, 1)
    }

    /// A duplicate of the control socket, to watch for a hang-up.
    pub(crate) fn sock_dup(&self) -> std::io::Result<OwnedFd> {
        dup_fd(self.fe.sock().as_raw_fd())
    }

    /// Make sure the connection is newer than `seen` (the generation a queue's vring was set
    /// up on, which hung up): reconnect unless another queue already did. Returns the current
    /// generation, or `None` once reconnecting has failed.
    pub(crate) fn renew(&mut self, seen: u64) -> Option<u64> {
        if self.lost {
            return None;
        }
        if self.epoch != seen {
            return Some(self.epoch);
        }
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Ok(fe) = self.handshake() {
                self.fe = fe;
                self.epoch += 1;
                return Some(self.epoch);
            }
            if Instant::now() + RETRY > deadline {
                self.lost = true;
                return None;
            }
            std::thread::sleep(RETRY);
        }
    }

    /// Connect again and redo the negotiation and the memory table.
    fn handshake(&self) -> Result<Frontend, VuError> {
        let mut fe = Frontend::connect(&self.path)?;
        fe.call(Req::SetOwner, &[], &[])?;
        let offered = fe.get_u64(Req::GetFeatures)?;
        let want = self.features.unwrap_or(proto::F_PROTOCOL_FEATURES);
        if offered & want != want {
            return Err(VuError::Unsupported(
                "the restarted backend offers fewer features",
            ));
        }
        let pf = fe.get_u64(Req::GetProtocolFeatures)?;
        if pf & self.protocol != self.protocol {
            return Err(VuError::Unsupported(
                "the restarted backend offers fewer protocol features",
            ));
        }
        fe.set_u64(Req::SetProtocolFeatures, self.protocol)?;
        fe.set_reply_ack(true);
        if let Some(f) = self.features {
            fe.set_u64(Req::SetFeatures, f)?;
        }
        for r in &self.regions {
            fe.mem_reg(Req::AddMemReg, r.addr, r.len, r.fd.as_raw_fd(), r.offset)?;
        }
        Ok(fe)
    }
}
