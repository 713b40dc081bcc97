//! A started device shared by many connections: each connection leases a queue of its own
//! (queues are single-threaded), added on demand when the driver allows it.

use snapblk_core::sync::lock;
use snapblk_core::{Blkio, IoStats, Queue, QueueExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Errors of the shared device. The device's error is the `source`, not part of the message.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The device given to [`SharedDevice::new`] is not in the started state.
    #[error("device is not started")]
    NotStarted,
    /// Reading a device property (its name) failed.
    #[error("device property {0}")]
    Prop(&'static str, #[source] snapblk_core::Error),
    /// The device failed: adding a queue or a flush.
    #[error("device error")]
    Io(#[from] snapblk_core::Error),
    /// The server stopped while waiting for a queue to be returned.
    #[error("server is shutting down")]
    Shutdown,
}

/// Facts about the device that the exports advertise, read once at creation.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Device size in bytes (`capacity`), advertised as the export size.
    pub size: u64,
    /// Whether the device is read-only (`read-only`); the export is then read-only too.
    pub read_only: bool,
    /// Smallest I/O unit (request-alignment), a power of two.
    pub min_block: u32,
    /// Preferred I/O size.
    pub preferred_block: u32,
    /// Buffer alignment the driver needs (1 when it does not care).
    pub buf_align: usize,
    /// Largest read/write per request the driver accepts (0 = no limit).
    pub max_transfer: u64,
    /// Largest write-zeroes per request (0 = no limit).
    pub max_write_zeroes: u64,
    /// Largest discard per request (0 = no limit).
    pub max_discard: u64,
}

struct Inner {
    // Declared before `dev` so queues drop before the device that created them.
    pool: Vec<Box<dyn Queue>>,
    dev: Blkio,
}

/// A started [`Blkio`] whose queues are leased out one per user.
pub struct SharedDevice {
    inner: Mutex<Inner>,
    returned: Condvar,
    geometry: Geometry,
    stats: Arc<IoStats>,
}

fn pow2_floor(v: i32) -> u32 {
    let v = v.max(1) as u32;
    1 << (31 - v.leading_zeros())
}

impl SharedDevice {
    /// Take over a started device; its existing queues become the initial pool.
    pub fn new(mut dev: Blkio) -> Result<SharedDevice, DeviceError> {
        if dev.state() != snapblk_core::State::Started {
            return Err(DeviceError::NotStarted);
        }
        let p = |name: &'static str, r: snapblk_core::Result<i32>| {
            r.map_err(|e| DeviceError::Prop(name, e))
        };
        let pu = |name: &'static str, r: snapblk_core::Result<u64>| {
            r.map_err(|e| DeviceError::Prop(name, e))
        };
        let size = pu("capacity", dev.get_u64("capacity"))?;
        let read_only = dev
            .get_bool("read-only")
            .map_err(|e| DeviceError::Prop("read-only", e))?;
        let min_block =
            pow2_floor(p("request-alignment", dev.get_int("request-alignment"))?).min(65536);
        let opt = p("optimal-io-size", dev.get_int("optimal-io-size"))?;
        let preferred_block = pow2_floor(opt.max(4096)).max(min_block);
        let buf_align = p("buf-alignment", dev.get_int("buf-alignment"))?.max(1) as usize;
        let max_transfer = p("max-transfer", dev.get_int("max-transfer"))?.max(0) as u64;
        let max_write_zeroes = pu("max-write-zeroes-len", dev.get_u64("max-write-zeroes-len"))?;
        let max_discard = pu("max-discard-len", dev.get_u64("max-discard-len"))?;
        let mut pool = Vec::new();
        for i in 0..dev.get_int("num-queues").unwrap_or(0).max(0) as usize {
            if let Some(q) = dev.take_queue(i, false) {
                pool.push(q);
            }
        }
        Ok(SharedDevice {
            inner: Mutex::new(Inner { pool, dev }),
            returned: Condvar::new(),
            stats: Arc::default(),
            geometry: Geometry {
                size,
                read_only,
                min_block,
                preferred_block,
                buf_align: buf_align.next_power_of_two(),
                max_transfer,
                max_write_zeroes,
                max_discard,
            },
        })
    }

    /// The facts read at creation (they are not re-read: an export's size is fixed).
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Requests, bytes and latencies served to NBD clients through this device, and their
    /// connections (kept by every connection's I/O thread).
    pub fn stats(&self) -> &Arc<IoStats> {
        &self.stats
    }

    /// The driver's name (e.g. `io_uring`).
    pub fn driver_name(&self) -> String {
        self.lock().dev.driver_name().to_owned()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another connection panicked; the pool itself is consistent.
        lock(&self.inner)
    }

    /// Lease a queue: a pooled one, else a newly added one; if the driver cannot add queues,
    /// wait for one to be returned (until `stop` is set).
    pub(crate) fn lease(&self, stop: &AtomicBool) -> Result<QueueLease<'_>, DeviceError> {
        let mut g = self.lock();
        loop {
            if let Some(q) = g.pool.pop() {
                return Ok(QueueLease {
                    dev: self,
                    q: Some(q),
                });
            }
            if g.dev.driver().can_add_queues() {
                let idx = g.dev.add_queue(false)?;
                let q = g
                    .dev
                    .take_queue(idx, false)
                    .ok_or(DeviceError::NotStarted)?;
                return Ok(QueueLease {
                    dev: self,
                    q: Some(q),
                });
            }
            if stop.load(Ordering::Relaxed) {
                return Err(DeviceError::Shutdown);
            }
            g = self
                .returned
                .wait_timeout(g, Duration::from_millis(200))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Flush the whole device (through any queue).
    pub fn flush(&self, stop: &AtomicBool) -> Result<(), DeviceError> {
        let mut q = self.lease(stop)?;
        q.queue().flush()?;
        Ok(())
    }
}

/// A queue leased from a [`SharedDevice`]; returned to the pool on drop.
pub(crate) struct QueueLease<'a> {
    dev: &'a SharedDevice,
    q: Option<Box<dyn Queue>>,
}

impl QueueLease<'_> {
    /// The leased queue.
    pub(crate) fn queue(&mut self) -> &mut dyn Queue {
        // Invariant: `q` is Some until drop.
        match self.q.as_mut() {
            Some(q) => &mut **q,
            None => unreachable!("queue lease used after drop"),
        }
    }
}

impl Drop for QueueLease<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.q.take() {
            // A queue with requests in flight must not be reused: their buffers belong to the
            // lessee. Lessees drain before dropping; if one did not, leak the queue instead.
            if q.outstanding() != 0 {
                std::mem::forget(q);
                return;
            }
            self.dev.lock().pool.push(q);
            self.dev.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod error_tests {
    use super::DeviceError;
    use crate::events::ConnReason;
    use snapblk_core::Chain;
    use std::error::Error as _;

    #[test]
    fn device_errors_keep_their_cause_as_source_only() {
        let cause = || snapblk_core::Error::new(libc::EIO, "short read");
        for e in [
            DeviceError::Prop("capacity", cause()),
            DeviceError::from(cause()),
        ] {
            let src = e.source().unwrap_or_else(|| panic!("{e:?} has no source"));
            assert_eq!(src.to_string(), "short read");
            assert!(!e.to_string().contains("short read"), "{e}");
        }
        // Through a connection's reason, each cause once.
        let r = ConnReason::Lease(DeviceError::from(cause()));
        assert_eq!(
            Chain(&r).to_string(),
            "no device queue for the connection: device error: short read"
        );
    }
}
