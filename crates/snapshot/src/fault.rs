//! Fault injection: disks that remember which writes are durable and can lose power.
//!
//! A [`FaultWorld`] holds one or more [`FaultDisk`]s that share a power supply and an operation
//! counter. Every read, write and flush counts as one operation; [`FaultWorld::cut_after`] arms a
//! power cut at operation `n`: that operation and every later one fail with `EIO` (the operation at
//! the cut, if a write, may still reach the media in part). [`FaultWorld::recover`] then computes
//! what each disk holds after the reboot: everything flushed, plus a random subset — chosen per
//! 4 KiB block, in random order, from the seed — of the writes that were not flushed. That is the
//! worst a volatile write cache may do: lose, tear (at block granularity) and reorder unflushed
//! writes.
//!
//! [`FaultDriver`] exposes a disk as a snapblk-core driver so any consumer of the core API (the
//! merge CLI path, exports) can be run on top of it.

use crate::dev::BlockDev;
use crate::queue::{Backend, SyncQueue};
use crate::rng::Rng;
use snapblk_core::props::{PropSpec, PropValue};
use snapblk_core::{DeviceInfo, Driver, Error, Queue, State};
use std::sync::{Arc, Mutex, MutexGuard};

/// Granularity at which unflushed writes are torn.
pub const TEAR_BLOCK: u64 = 4096;

#[derive(Default, Clone)]
struct Disk {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// Unflushed writes, in issue order.
    pending: Vec<(u64, Vec<u8>)>,
    writes: u64,
    flushes: u64,
}

struct World {
    disks: Vec<Disk>,
    ops: u64,
    cut_at: Option<u64>,
    dead: bool,
}

/// Disks sharing one power supply.
pub struct FaultWorld {
    w: Mutex<World>,
}

impl FaultWorld {
    /// A world with one disk per image (each image is the disk's durable content).
    pub fn new(images: Vec<Vec<u8>>) -> Arc<Self> {
        let disks = images
            .into_iter()
            .map(|d| Disk {
                durable: d.clone(),
                current: d,
                ..Default::default()
            })
            .collect();
        Arc::new(FaultWorld {
            w: Mutex::new(World {
                disks,
                ops: 0,
                cut_at: None,
                dead: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        self.w.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Disk `i` of this world.
    pub fn disk(self: &Arc<Self>, i: usize) -> FaultDisk {
        FaultDisk {
            world: self.clone(),
            id: i,
        }
    }

    /// Arm a power cut: operation number `n` (0-based, counted from now on all disks) fails, and
    /// so does everything after it.
    pub fn cut_after(&self, n: u64) {
        let mut w = self.lock();
        w.cut_at = Some(w.ops + n);
    }

    /// Operations performed so far (to size a random cut point from a dry run).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Whether the power is off.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// (writes, flushes) seen by disk `i`.
    pub fn counters(&self, i: usize) -> (u64, u64) {
        let w = self.lock();
        w.disks.get(i).map_or((0, 0), |d| (d.writes, d.flushes))
    }

    /// What the disks hold as the running system sees them (no crash).
    pub fn current(&self) -> Vec<Vec<u8>> {
        self.lock()
            .disks
            .iter()
            .map(|d| d.current.clone())
            .collect()
    }

    /// The contents after a power loss now: durable data plus, per 4 KiB block of each unflushed
    /// write, a coin flip from `seed` (applied in a random order, so later writes may be lost while
    /// earlier ones survive).
    pub fn recover(&self, seed: u64) -> Vec<Vec<u8>> {
        let w = self.lock();
        let mut rng = Rng::new(seed);
        w.disks
            .iter()
            .map(|d| {
                let mut img = d.durable.clone();
                let mut pieces: Vec<(u64, &[u8])> = Vec::new();
                for (off, data) in &d.pending {
                    let mut pos = 0usize;
                    while pos < data.len() {
                        let abs = off + pos as u64;
                        let n = ((TEAR_BLOCK - abs % TEAR_BLOCK) as usize).min(data.len() - pos);
                        pieces.push((abs, &data[pos..pos + n]));
                        pos += n;
                    }
                }
                // Fisher-Yates: a random persistence order.
                for i in (1..pieces.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    pieces.swap(i, j);
                }
                for (abs, piece) in pieces {
                    if rng.coin() {
                        let end = abs as usize + piece.len();
                        if img.len() < end {
                            img.resize(end, 0);
                        }
                        img[abs as usize..end].copy_from_slice(piece);
                    }
                }
                img
            })
            .collect()
    }

    /// Count one operation; `Err` if the power is (now) off. Returns whether this op is the cut.
    fn tick(w: &mut World) -> Result<(), ()> {
        if w.dead {
            return Err(());
        }
        let n = w.ops;
        w.ops += 1;
        if w.cut_at.is_some_and(|c| n >= c) {
            w.dead = true;
            return Err(());
        }
        Ok(())
    }
}

fn power_off() -> Error {
    Error::new(libc::EIO, "power cut (fault injection)")
}

/// One disk of a [`FaultWorld`].
#[derive(Clone)]
pub struct FaultDisk {
    world: Arc<FaultWorld>,
    id: usize,
}

impl FaultDisk {
    fn with<R>(&self, f: impl FnOnce(&mut Disk) -> R) -> snapblk_core::Result<R> {
        let mut w = self.world.lock();
        let id = self.id;
        match w.disks.get_mut(id) {
            Some(d) => Ok(f(d)),
            None => Err(Error::new(libc::ENODEV, "no such fault disk")),
        }
    }
}

impl BlockDev for FaultDisk {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        {
            let mut w = self.world.lock();
            FaultWorld::tick(&mut w).map_err(|_| power_off())?;
        }
        self.with(|d| {
            let end = off as usize + buf.len();
            if end > d.current.len() {
                return Err(Error::new(libc::EIO, "read past end"));
            }
            buf.copy_from_slice(&d.current[off as usize..end]);
            Ok(())
        })?
    }

    fn write_at(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()> {
        let mut w = self.world.lock();
        if w.dead {
            // Already dead before this write: nothing reaches the disk.
            return Err(power_off());
        }
        let cut = FaultWorld::tick(&mut w).is_err();
        let d = w
            .disks
            .get_mut(self.id)
            .ok_or_else(|| Error::new(libc::ENODEV, "no such fault disk"))?;
        // The write at the cut instant is "in flight": it may land in part (see recover()).
        d.pending.push((off, buf.to_vec()));
        if cut {
            return Err(power_off());
        }
        let end = off as usize + buf.len();
        if d.current.len() < end {
            d.current.resize(end, 0);
        }
        d.current[off as usize..end].copy_from_slice(buf);
        d.writes += 1;
        Ok(())
    }

    fn flush(&self) -> snapblk_core::Result<()> {
        let mut w = self.world.lock();
        FaultWorld::tick(&mut w).map_err(|_| power_off())?;
        let d = w
            .disks
            .get_mut(self.id)
            .ok_or_else(|| Error::new(libc::ENODEV, "no such fault disk"))?;
        d.durable = d.current.clone();
        d.pending.clear();
        d.flushes += 1;
        Ok(())
    }

    fn size(&self) -> snapblk_core::Result<u64> {
        self.with(|d| d.current.len() as u64)
    }
}

impl Backend for FaultDisk {
    fn read(&self, offset: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        self.read_at(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> snapblk_core::Result<()> {
        self.write_at(offset, buf)?;
        if fua { BlockDev::flush(self) } else { Ok(()) }
    }
    fn flush(&self) -> snapblk_core::Result<()> {
        BlockDev::flush(self)
    }
}

/// A [`FaultDisk`] as a snapblk-core driver (name `fault`).
pub struct FaultDriver {
    disk: FaultDisk,
}

impl FaultDriver {
    /// Wrap a disk.
    pub fn new(disk: FaultDisk) -> Self {
        FaultDriver { disk }
    }
}

impl Driver for FaultDriver {
    fn name(&self) -> &str {
        "fault"
    }
    fn props(&self) -> &'static [PropSpec] {
        &[]
    }
    fn get_prop(&self, name: &str, _state: State) -> snapblk_core::Result<PropValue> {
        Err(Error::new(libc::ENOENT, format!("unknown property {name}")))
    }
    fn set_prop(
        &mut self,
        name: &str,
        _value: PropValue,
        _state: State,
    ) -> snapblk_core::Result<()> {
        Err(Error::new(libc::ENOENT, format!("unknown property {name}")))
    }
    fn connect(&mut self, read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        Ok(DeviceInfo {
            read_only,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        self.disk.size()
    }
    fn create_queue(&mut self, _poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        Ok(Box::new(SyncQueue::new(self.disk.clone())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::{Blkio, QueueExt};

    #[test]
    fn flushed_writes_survive_unflushed_may_not() {
        let world = FaultWorld::new(vec![vec![0u8; 4 * 4096]]);
        let d = world.disk(0);
        d.write_at(0, &[1u8; 4096]).unwrap();
        BlockDev::flush(&d).unwrap();
        d.write_at(4096, &[2u8; 8192]).unwrap();
        world.cut_after(0);
        assert_eq!(d.write_at(0, &[3u8; 4096]).unwrap_err().errno, libc::EIO);
        assert!(world.is_dead());
        let mut saw = [false; 2];
        for seed in 0..64 {
            let img = &world.recover(seed)[0];
            assert!(img[..4096].iter().all(|&b| b == 1 || b == 3));
            for blk in 1..3 {
                let b = &img[blk * 4096..(blk + 1) * 4096];
                // Torn at block granularity: each block is wholly old or wholly new.
                assert!(b.iter().all(|&x| x == 0) || b.iter().all(|&x| x == 2));
                saw[(b[0] == 2) as usize] = true;
            }
        }
        assert!(saw[0] && saw[1], "both outcomes occur across seeds");
        assert_eq!(world.recover(7), world.recover(7), "deterministic per seed");
    }

    #[test]
    fn driver_records_writes_and_flushes() {
        let world = FaultWorld::new(vec![vec![0u8; 8192]]);
        let mut b = Blkio::new(Box::new(FaultDriver::new(world.disk(0))));
        b.connect().unwrap();
        b.start().unwrap();
        let q = b.queue(0, false).unwrap();
        q.write_at(4096, &[9u8; 4096], false).unwrap();
        q.flush().unwrap();
        q.write_at(0, &[5u8; 4096], true).unwrap();
        let mut buf = [0u8; 4096];
        q.read_at(4096, &mut buf).unwrap();
        assert_eq!(buf, [9u8; 4096]);
        assert_eq!(world.counters(0), (2, 2));
        world.cut_after(0);
        assert!(q.read_at(0, &mut buf).is_err());
        let img = &world.recover(1)[0];
        assert_eq!(&img[..4096], &[5u8; 4096][..], "FUA write is durable");
    }
}
