//! Fault injection: simulated disks that fail, stall and lose power on a seeded schedule.
//!
//! A [`FaultWorld`] holds one or more [`FaultDisk`]s that share a power supply, an operation
//! counter, a virtual clock and one device queue. Every read, write and flush counts as one
//! operation. What goes wrong, and when, comes from a [`FaultPlan`] and its seed, in the manner of
//! TigerBeetle's simulated storage (`src/testing/storage.zig`).
//!
//! # Faults, and why each stays recoverable
//!
//! * **Power loss** ([`FaultWorld::cut_after`]): operation `n` and every later one fail with
//!   `EIO` (the operation at the cut, if a write, may still reach the media in part).
//!   [`FaultWorld::recover`] then computes what each disk holds after the reboot: everything
//!   flushed, plus a random subset — chosen per 4 KiB block, in random order, from the seed — of
//!   the writes that were not flushed. That is the worst a volatile write cache may do: lose, tear
//!   (at block granularity) and reorder unflushed writes. Recoverable because what was flushed is
//!   kept: a writer whose checkpoints are flushes (the merge's are) restarts from the last one.
//! * **Read errors** ([`FaultPlan::read_error_probability`], [`FaultPlan::fail_ops`],
//!   [`FaultPlan::bad_reads`]): the read fails with `EIO` and the disk is unchanged. A latent
//!   sector error ([`BadRange`]) fails every read that touches its range, for as long as the
//!   plan is in force. Recoverable because no data is lost: the caller reports the error and a
//!   retry, once the fault is gone, reads the same bytes.
//! * **Write errors** ([`FaultPlan::write_error_probability`], [`FaultPlan::fail_ops`]): the
//!   write fails with `EIO` after landing on none, some or all of its 4 KiB blocks (seeded), each
//!   block wholly old or wholly new — the state a power cut at that write leaves, except that
//!   the power stays on and every other write stays in place. Recoverable because the caller
//!   learns that the range is undefined and owns its contents: it must not have acknowledged it,
//!   and redoes the write (the merge redoes the window) when it runs again.
//! * **Flush errors** ([`FaultPlan::flush_error_probability`], [`FaultPlan::fail_ops`]): the flush
//!   fails with `EIO` and makes nothing durable; the unflushed writes stay pending (a later flush
//!   or a power cut decides their fate). Recoverable because a writer treats a failed flush as no
//!   checkpoint and stops before it relies on one.
//!
//! Not modelled: misdirected writes and silent corruption (a read returning wrong bytes with no
//! error). Nothing in the snapshot layer could recover from those without checksums; the COW
//! record's digests catch them at read time and have their own tests.
//!
//! # Time
//!
//! The disks never sleep. The world keeps a *virtual* clock in nanoseconds
//! ([`FaultWorld::now_ns`]) and one FIFO device for all its disks: an operation issued at
//! virtual time `t` starts when the device is free (`max(t, end of the previous operation)`),
//! takes a service time drawn from the plan's [`Latency`] (fixed cost, exponential jitter and a
//! per-KiB transfer cost), and the clock moves to its end before the call returns. So a run's
//! virtual duration, and each operation's virtual latency, are functions of the seed alone.
//! [`FaultWorld::on_issue`] runs a callback between an operation's issue and its completion:
//! a single-threaded test uses it to make another request *arrive while that operation is in
//! service* (for instance a foreground read during a merge write), and the newcomer waits in the
//! device queue as it would on a real disk. The world is a [`Clock`], so the snapshot's I/O
//! scheduler can be run on virtual time too ([`crate::Snapshot::open_with_scheduler`]).
//!
//! # Reproducing a run
//!
//! Every random draw — fault coins, torn blocks, jitter — comes from the plan's seed, one draw
//! sequence in operation order. A run whose operations are issued in one order (one thread, or
//! threads a test serialises) is reproduced exactly by its seed; every injected error's
//! message names the operation number and the seed, and so should every test failure message.
//!
//! [`FaultDriver`] exposes a disk as a snapblk-core driver so any consumer of the core API (the
//! merge CLI path, exports, the C ABI through the facade's `fault-injection` feature) can be run
//! on top of it; created by name it is configured by properties (see [`FaultDriver::configurable`]).

use crate::queue::{DevBackend, SyncQueue};
use crate::sched::Clock;
use snapblk_core::rng::Rng;
use snapblk_core::sync::lock;
use snapblk_core::{
    Access, DeviceInfo, Driver, Error, PropSpec, PropType, PropValue, Queue, ReadAt, State, WriteAt,
};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// Granularity at which unflushed writes are torn.
pub const TEAR_BLOCK: u64 = 4096;

/// The service time of one kind of operation: `min_ns`, plus an exponentially distributed extra
/// of mean `jitter_mean_ns`, plus `ns_per_kib` per KiB transferred. All zero (the default) is an
/// infinitely fast disk: the clock does not move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    /// Fixed cost of every operation.
    pub min_ns: u64,
    /// Mean of the random extra cost (0: none).
    pub jitter_mean_ns: u64,
    /// Transfer cost per KiB: what makes large requests slow.
    pub ns_per_kib: u64,
}

impl Latency {
    fn draw(&self, rng: &mut Rng, bytes: u64) -> u64 {
        let jitter = if self.jitter_mean_ns == 0 {
            0
        } else {
            // Inverse transform of a uniform draw in (0, 1].
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            (-(1.0 - u).max(f64::MIN_POSITIVE).ln() * self.jitter_mean_ns as f64) as u64
        };
        self.min_ns
            .saturating_add(jitter)
            .saturating_add(bytes.saturating_mul(self.ns_per_kib) / 1024)
    }
}

/// A latent sector error: reads of disk `disk` that touch `[offset, offset + len)` fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRange {
    /// Index of the disk in its world.
    pub disk: usize,
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// What goes wrong, and how slow the disks are. The default injects nothing and takes no time.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Seed of every random draw (fault coins, torn blocks, jitter).
    pub seed: u64,
    /// Chance that a read fails with `EIO`.
    pub read_error_probability: f64,
    /// Chance that a write fails with `EIO` (landing in part, see the module doc).
    pub write_error_probability: f64,
    /// Chance that a flush fails with `EIO` (making nothing durable).
    pub flush_error_probability: f64,
    /// Operation numbers (as [`FaultWorld::ops`] counts them) that fail with `EIO`, whatever
    /// their kind.
    pub fail_ops: Vec<u64>,
    /// Latent sector errors.
    pub bad_reads: Vec<BadRange>,
    /// Service time of reads.
    pub read_latency: Latency,
    /// Service time of writes.
    pub write_latency: Latency,
    /// Service time of flushes.
    pub flush_latency: Latency,
}

/// What an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A read.
    Read,
    /// A write.
    Write,
    /// A flush.
    Flush,
}

/// One operation as [`FaultWorld::on_issue`] sees it, between its issue and its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    /// Operation number.
    pub op: u64,
    /// Disk index.
    pub disk: usize,
    /// Kind.
    pub kind: OpKind,
    /// Byte offset (0 for a flush).
    pub offset: u64,
    /// Bytes transferred (0 for a flush).
    pub len: u64,
    /// Virtual time at which it was issued.
    pub issued_ns: u64,
    /// Virtual time at which it completes.
    pub done_ns: u64,
    /// Whether it fails with an injected error.
    pub failed: bool,
}

/// Injected errors so far, by kind (power loss not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Injected {
    /// Reads failed.
    pub reads: u64,
    /// Writes failed.
    pub writes: u64,
    /// Flushes failed.
    pub flushes: u64,
}

/// A callback run between an operation's issue and its completion ([`FaultWorld::on_issue`]).
pub type IssueHook = Arc<dyn Fn(&OpInfo) + Send + Sync>;

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
    plan: FaultPlan,
    rng: Rng,
    injected: Injected,
    /// Virtual clock and the end of the last operation queued on the device.
    now: u64,
    busy_until: u64,
    hook: Option<IssueHook>,
    in_hook: bool,
}

/// Disks sharing one power supply, one operation counter, one virtual clock and one device.
pub struct FaultWorld {
    w: Mutex<World>,
}

impl FaultWorld {
    /// A world with one disk per image (each image is the disk's durable content), no faults
    /// planned and no latency.
    pub fn new(images: Vec<Vec<u8>>) -> Arc<Self> {
        Self::with_plan(images, FaultPlan::default())
    }

    /// A world with one disk per image, run under `plan`.
    pub fn with_plan(images: Vec<Vec<u8>>, plan: FaultPlan) -> Arc<Self> {
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
                rng: Rng::new(plan.seed),
                plan,
                injected: Injected::default(),
                now: 0,
                busy_until: 0,
                hook: None,
                in_hook: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        lock(&self.w)
    }

    /// Disk `i` of this world.
    pub fn disk(self: &Arc<Self>, i: usize) -> FaultDisk {
        FaultDisk {
            world: self.clone(),
            id: i,
        }
    }

    /// Put `plan` in force from the next operation on (its seed restarts the draws); a default
    /// plan turns every fault and all latency off. Power loss is not part of a plan.
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut w = self.lock();
        w.rng = Rng::new(plan.seed);
        w.plan = plan;
    }

    /// The seed of the plan in force.
    pub fn seed(&self) -> u64 {
        self.lock().plan.seed
    }

    /// Errors injected so far (power loss not counted).
    pub fn injected(&self) -> Injected {
        self.lock().injected
    }

    /// Call `hook` for every operation between its issue and its completion (see the module
    /// doc), or stop calling it (`None`). The hook runs on the issuing thread with the world
    /// unlocked and may issue operations itself; those, and operations other threads issue
    /// meanwhile, do not call it again.
    pub fn on_issue(&self, hook: Option<IssueHook>) {
        self.lock().hook = hook;
    }

    /// The virtual clock, in ns since the world was made.
    pub fn now_ns(&self) -> u64 {
        self.lock().now
    }

    /// Move the virtual clock forward to `t` (never back): time that passes with no I/O, such
    /// as a client's think time.
    pub fn advance_to(&self, t: u64) {
        let mut w = self.lock();
        w.now = w.now.max(t);
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
                    for (abs, piece) in tear(*off, data) {
                        pieces.push((abs, piece));
                    }
                }
                // Fisher-Yates: a random persistence order.
                for i in (1..pieces.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    pieces.swap(i, j);
                }
                for (abs, piece) in pieces {
                    if rng.coin() {
                        put(&mut img, abs, piece);
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

    /// The operation just counted by [`FaultWorld::tick`]: decide whether it fails and queue it
    /// on the device.
    fn issue(w: &mut World, disk: usize, kind: OpKind, offset: u64, len: u64) -> OpInfo {
        let op = w.ops - 1;
        let (p, latency) = match kind {
            OpKind::Read => (w.plan.read_error_probability, w.plan.read_latency),
            OpKind::Write => (w.plan.write_error_probability, w.plan.write_latency),
            OpKind::Flush => (w.plan.flush_error_probability, w.plan.flush_latency),
        };
        let bad = kind == OpKind::Read
            && w.plan.bad_reads.iter().any(|b| {
                b.disk == disk
                    && offset < b.offset.saturating_add(b.len)
                    && b.offset < offset.saturating_add(len)
            });
        // A coin is drawn only when the probability is not zero, so a plan without random
        // faults keeps the same jitter draws as one with them.
        let coin = p > 0.0 && ((w.rng.next_u64() >> 11) as f64) < p * (1u64 << 53) as f64;
        let failed = coin || bad || w.plan.fail_ops.contains(&op);
        if failed {
            match kind {
                OpKind::Read => w.injected.reads += 1,
                OpKind::Write => w.injected.writes += 1,
                OpKind::Flush => w.injected.flushes += 1,
            }
        }
        let start = w.now.max(w.busy_until);
        let done = start.saturating_add(latency.draw(&mut w.rng, len));
        w.busy_until = done;
        OpInfo {
            op,
            disk,
            kind,
            offset,
            len,
            issued_ns: w.now,
            done_ns: done,
            failed,
        }
    }

    /// Run the issue hook for `info` (unless one is running), then move the clock to its end.
    fn complete(&self, info: &OpInfo) {
        let hook = {
            let mut w = self.lock();
            match (&w.hook, w.in_hook) {
                (Some(h), false) => {
                    let h = h.clone();
                    w.in_hook = true;
                    Some(h)
                }
                _ => None,
            }
        };
        if let Some(h) = hook {
            h(info);
            self.lock().in_hook = false;
        }
        let mut w = self.lock();
        w.now = w.now.max(info.done_ns);
    }
}

/// The error of an operation that failed by plan.
fn injected_error(info: &OpInfo, seed: u64) -> Error {
    let what = match info.kind {
        OpKind::Read => "read",
        OpKind::Write => "write",
        OpKind::Flush => "flush",
    };
    Error::new(
        libc::EIO,
        format!(
            "injected {what} error at operation {} (fault seed {seed})",
            info.op
        ),
    )
}

impl Clock for FaultWorld {
    fn now_ns(&self) -> u64 {
        FaultWorld::now_ns(self)
    }
}

/// `data` written at `off`, cut at [`TEAR_BLOCK`] boundaries.
fn tear(off: u64, data: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= data.len() {
            return None;
        }
        let abs = off + pos as u64;
        let n = ((TEAR_BLOCK - abs % TEAR_BLOCK) as usize).min(data.len() - pos);
        let piece = (abs, &data[pos..pos + n]);
        pos += n;
        Some(piece)
    })
}

/// Store `data` at `off` in `img`, growing it as needed.
fn put(img: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if img.len() < end {
        img.resize(end, 0);
    }
    img[off as usize..end].copy_from_slice(data);
}

fn power_off() -> Error {
    Error::new(libc::EIO, "power cut (fault injection)")
}

fn no_disk() -> Error {
    Error::new(libc::ENODEV, "no such fault disk")
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
            None => Err(no_disk()),
        }
    }

    /// The world this disk belongs to.
    pub fn world(&self) -> &Arc<FaultWorld> {
        &self.world
    }
}

/// The disk's operations: each is one operation of the plan, reads and writes exact.
impl FaultDisk {
    fn read_op(&self, off: u64, buf: &mut [u8]) -> snapblk_core::Result<()> {
        let (info, r) = {
            let mut w = self.world.lock();
            FaultWorld::tick(&mut w).map_err(|_| power_off())?;
            let info = FaultWorld::issue(&mut w, self.id, OpKind::Read, off, buf.len() as u64);
            let d = w.disks.get(self.id).ok_or_else(no_disk)?;
            let end = off.checked_add(buf.len() as u64);
            let r = match end {
                _ if info.failed => Err(injected_error(&info, w.plan.seed)),
                Some(end) if end <= d.current.len() as u64 => {
                    buf.copy_from_slice(&d.current[off as usize..end as usize]);
                    Ok(())
                }
                _ => Err(Error::new(libc::EIO, "read past end")),
            };
            (info, r)
        };
        self.world.complete(&info);
        r
    }

    fn write_op(&self, off: u64, buf: &[u8]) -> snapblk_core::Result<()> {
        let (info, seed) = {
            let mut w = self.world.lock();
            if w.dead {
                // Already dead before this write: nothing reaches the disk.
                return Err(power_off());
            }
            let cut = FaultWorld::tick(&mut w).is_err();
            let d = w.disks.get_mut(self.id).ok_or_else(no_disk)?;
            if cut {
                // The write at the cut instant is "in flight": it may land in part (see recover()).
                d.pending.push((off, buf.to_vec()));
                return Err(power_off());
            }
            let info = FaultWorld::issue(&mut w, self.id, OpKind::Write, off, buf.len() as u64);
            let w = &mut *w;
            let d = w.disks.get_mut(self.id).ok_or_else(no_disk)?;
            if info.failed {
                // A failed write lands on a seeded subset of its blocks.
                for (abs, piece) in tear(off, buf) {
                    if w.rng.coin() {
                        put(&mut d.current, abs, piece);
                        d.pending.push((abs, piece.to_vec()));
                    }
                }
            } else {
                d.pending.push((off, buf.to_vec()));
                put(&mut d.current, off, buf);
                d.writes += 1;
            }
            (info, w.plan.seed)
        };
        self.world.complete(&info);
        if info.failed {
            return Err(injected_error(&info, seed));
        }
        Ok(())
    }

    fn flush_op(&self) -> snapblk_core::Result<()> {
        let (info, seed) = {
            let mut w = self.world.lock();
            FaultWorld::tick(&mut w).map_err(|_| power_off())?;
            let info = FaultWorld::issue(&mut w, self.id, OpKind::Flush, 0, 0);
            let d = w.disks.get_mut(self.id).ok_or_else(no_disk)?;
            if !info.failed {
                d.durable = d.current.clone();
                d.pending.clear();
                d.flushes += 1;
            }
            (info, w.plan.seed)
        };
        self.world.complete(&info);
        if info.failed {
            return Err(injected_error(&info, seed));
        }
        Ok(())
    }
}

impl ReadAt for FaultDisk {
    /// Reads what lies before the disk's end, as one operation.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.size()?.checked_sub(off).map_or(0, |left| {
            buf.len().min(usize::try_from(left).unwrap_or(usize::MAX))
        });
        self.read_exact_at(off, &mut buf[..n])?;
        Ok(n)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.with(|d| d.current.len() as u64)?)
    }
    fn read_exact_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        Ok(self.read_op(off, buf)?)
    }
}

impl WriteAt for FaultDisk {
    fn write_all_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        Ok(self.write_op(off, buf)?)
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(self.flush_op()?)
    }
}

/// Properties of a [`FaultDriver::configurable`] driver.
const PROPS: &[PropSpec] = &[
    PropSpec::new("size", PropType::U64, Access::RwCreated, false),
    PropSpec::new("seed", PropType::U64, Access::RwCreated, false),
    PropSpec::new("read-error-ppm", PropType::U64, Access::RwCreated, false),
    PropSpec::new("write-error-ppm", PropType::U64, Access::RwCreated, false),
    PropSpec::new("bad-offset", PropType::U64, Access::RwCreated, false),
    PropSpec::new("bad-length", PropType::U64, Access::RwCreated, false),
];

/// Settings of a driver configured by properties (error rates in parts per million).
#[derive(Debug, Clone, Copy, Default)]
struct Settings {
    size: u64,
    seed: u64,
    read_error_ppm: u64,
    write_error_ppm: u64,
    bad_offset: u64,
    bad_length: u64,
}

impl Settings {
    fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "size" => self.size,
            "seed" => self.seed,
            "read-error-ppm" => self.read_error_ppm,
            "write-error-ppm" => self.write_error_ppm,
            "bad-offset" => self.bad_offset,
            "bad-length" => self.bad_length,
            _ => return None,
        })
    }

    fn field(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "size" => &mut self.size,
            "seed" => &mut self.seed,
            "read-error-ppm" => &mut self.read_error_ppm,
            "write-error-ppm" => &mut self.write_error_ppm,
            "bad-offset" => &mut self.bad_offset,
            "bad-length" => &mut self.bad_length,
            _ => return None,
        })
    }

    fn plan(&self) -> FaultPlan {
        FaultPlan {
            seed: self.seed,
            read_error_probability: self.read_error_ppm as f64 / 1e6,
            write_error_probability: self.write_error_ppm as f64 / 1e6,
            bad_reads: (self.bad_length > 0)
                .then_some(BadRange {
                    disk: 0,
                    offset: self.bad_offset,
                    len: self.bad_length,
                })
                .into_iter()
                .collect(),
            ..FaultPlan::default()
        }
    }
}

fn unknown_property() -> Error {
    Error::new(libc::ENOENT, "Unknown property name")
}

/// A [`FaultDisk`] as a snapblk-core driver (name `fault`).
pub struct FaultDriver {
    disk: Option<FaultDisk>,
    /// `Some` for a driver configured by properties.
    settings: Option<Settings>,
}

impl FaultDriver {
    /// Wrap a disk (the driver has no properties).
    pub fn new(disk: FaultDisk) -> Self {
        FaultDriver {
            disk: Some(disk),
            settings: None,
        }
    }

    /// A driver that makes its own one-disk world at connect, from properties set before:
    /// `size` (bytes, zero-filled, required), `seed`, `read-error-ppm` and `write-error-ppm`
    /// (chances per million that a read / write fails with `EIO`), and `bad-offset` with
    /// `bad-length` (a latent sector error: every read touching that range fails with `EIO`).
    /// This is what the facade's `fault` driver is, so exports and C programs can be tested
    /// against failing reads.
    pub fn configurable() -> Self {
        FaultDriver {
            disk: None,
            settings: Some(Settings::default()),
        }
    }
}

impl Driver for FaultDriver {
    fn name(&self) -> &str {
        "fault"
    }
    fn props(&self) -> &'static [PropSpec] {
        if self.settings.is_some() { PROPS } else { &[] }
    }
    fn get_prop(&self, name: &str, _state: State) -> snapblk_core::Result<PropValue> {
        self.settings
            .and_then(|s| s.get(name))
            .map(PropValue::U64)
            .ok_or_else(unknown_property)
    }
    fn set_prop(
        &mut self,
        name: &str,
        value: PropValue,
        _state: State,
    ) -> snapblk_core::Result<()> {
        let field = self.settings.as_mut().and_then(|s| s.field(name));
        match (field, value) {
            (Some(f), PropValue::U64(v)) => {
                *f = v;
                Ok(())
            }
            _ => Err(unknown_property()),
        }
    }
    fn connect(&mut self, read_only: bool) -> snapblk_core::Result<DeviceInfo> {
        if let (None, Some(s)) = (&self.disk, &self.settings) {
            if s.size == 0 || s.size % 512 != 0 {
                return Err(Error::new(
                    libc::EINVAL,
                    "the fault driver needs a size that is a positive multiple of 512",
                ));
            }
            let image = usize::try_from(s.size)
                .ok()
                .and_then(|n| {
                    let mut v = Vec::new();
                    v.try_reserve_exact(n).ok()?;
                    v.resize(n, 0u8);
                    Some(v)
                })
                .ok_or_else(|| Error::new(libc::ENOMEM, "fault disk too large for memory"))?;
            self.disk = Some(FaultWorld::with_plan(vec![image], s.plan()).disk(0));
        }
        Ok(DeviceInfo {
            read_only,
            ..DeviceInfo::default()
        })
    }
    fn capacity(&self) -> snapblk_core::Result<u64> {
        match (&self.disk, &self.settings) {
            (Some(d), _) => Ok(d.size()?),
            (None, Some(s)) => Ok(s.size),
            (None, None) => Err(no_disk()),
        }
    }
    fn create_queue(&mut self, _poll: bool) -> snapblk_core::Result<Box<dyn Queue>> {
        let disk = self.disk.clone().ok_or_else(no_disk)?;
        Ok(Box::new(SyncQueue::new(DevBackend(disk))?))
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
        d.write_all_at(0, &[1u8; 4096]).unwrap();
        d.sync_data().unwrap();
        d.write_all_at(4096, &[2u8; 8192]).unwrap();
        world.cut_after(0);
        let e = Error::from(d.write_all_at(0, &[3u8; 4096]).unwrap_err());
        assert_eq!(e.errno, libc::EIO);
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

    #[test]
    fn planned_errors_fail_the_named_operations_and_say_the_seed() {
        let world = FaultWorld::new(vec![vec![7u8; 4 * 4096]]);
        let d = world.disk(0);
        world.set_plan(FaultPlan {
            seed: 42,
            fail_ops: vec![1, 3],
            bad_reads: vec![BadRange {
                disk: 0,
                offset: 3 * 4096 + 100,
                len: 1,
            }],
            ..FaultPlan::default()
        });
        let mut buf = [0u8; 4096];
        d.read_exact_at(0, &mut buf).unwrap();
        let e = Error::from(d.read_exact_at(4096, &mut buf).unwrap_err());
        assert_eq!(e.errno, libc::EIO);
        assert!(
            e.to_string().contains("operation 1") && e.to_string().contains("seed 42"),
            "{e}"
        );
        d.write_all_at(0, &[1u8; 4096]).unwrap();
        assert_eq!(Error::from(d.sync_data().unwrap_err()).errno, libc::EIO);
        // The failed flush made nothing durable.
        assert_eq!(world.recover(0)[0][0], 7);
        // The latent sector error fails every read that touches it, and only those.
        for _ in 0..2 {
            assert!(d.read_exact_at(3 * 4096, &mut buf).is_err());
        }
        d.read_exact_at(2 * 4096, &mut buf).unwrap();
        assert_eq!(
            world.injected(),
            Injected {
                reads: 3,
                writes: 0,
                flushes: 1
            }
        );
        // Faults off: everything works and the data is intact.
        world.set_plan(FaultPlan::default());
        d.read_exact_at(3 * 4096, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 4096]);
    }

    /// A run of random reads and writes under `plan` on a fresh world: per operation, whether
    /// it failed, and the final image and clock.
    fn random_run(plan: FaultPlan) -> (Vec<bool>, Vec<u8>, u64) {
        let world = FaultWorld::with_plan(vec![vec![0u8; 64 * 4096]], plan);
        let d = world.disk(0);
        let mut rng = Rng::new(5);
        let mut outcomes = Vec::new();
        for i in 0..2000u64 {
            let off = rng.below(62) * 4096;
            let len = (1 + rng.below(2) as usize) * 4096;
            let r = if rng.coin() {
                d.write_all_at(off, &vec![i as u8; len])
            } else {
                d.read_exact_at(off, &mut vec![0u8; len])
            };
            outcomes.push(r.is_err());
        }
        (outcomes, world.current().swap_remove(0), world.now_ns())
    }

    #[test]
    fn random_errors_follow_their_probability_and_the_seed() {
        let plan = |seed| FaultPlan {
            seed,
            read_error_probability: 0.1,
            write_error_probability: 0.2,
            read_latency: Latency {
                min_ns: 100,
                jitter_mean_ns: 50,
                ns_per_kib: 10,
            },
            ..FaultPlan::default()
        };
        let a = random_run(plan(1));
        assert_eq!(
            a,
            random_run(plan(1)),
            "seed 1: the same seed gives the same run"
        );
        let b = random_run(plan(2));
        assert_ne!(a.0, b.0, "seeds 1 and 2 fail different operations");
        let failed = a.0.iter().filter(|&&f| f).count();
        assert!(
            (200..=400).contains(&failed),
            "seed 1: {failed} of 2000 operations failed, expected about 300"
        );
        // Reads took at least their fixed and transfer cost; writes take no time in this plan.
        assert!(a.2 >= 800 * 110, "seed 1: clock {} ns", a.2);
    }

    #[test]
    fn a_failed_write_lands_whole_blocks_or_none() {
        let mut saw = [false; 2];
        for seed in 0..32 {
            let world = FaultWorld::with_plan(
                vec![vec![0u8; 4 * 4096]],
                FaultPlan {
                    seed,
                    fail_ops: vec![0],
                    ..FaultPlan::default()
                },
            );
            let d = world.disk(0);
            assert!(d.write_all_at(0, &[9u8; 4 * 4096]).is_err(), "seed {seed}");
            let img = world.current().swap_remove(0);
            for b in img.chunks(4096) {
                assert!(
                    b.iter().all(|&x| x == 0) || b.iter().all(|&x| x == 9),
                    "seed {seed}: a block is torn inside"
                );
                saw[(b[0] == 9) as usize] = true;
            }
        }
        assert!(saw[0] && saw[1], "failed writes both land and vanish");
    }

    #[test]
    fn the_device_serves_one_request_at_a_time_in_virtual_time() {
        let world = FaultWorld::with_plan(
            vec![vec![0u8; 1 << 20]],
            FaultPlan {
                read_latency: Latency {
                    min_ns: 1000,
                    jitter_mean_ns: 0,
                    ns_per_kib: 100,
                },
                ..FaultPlan::default()
            },
        );
        let d = world.disk(0);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (w2, d2, s2) = (world.clone(), d.clone(), seen.clone());
        // A 4 KiB read arrives 500 ns into a 64 KiB read's 7400 ns of service.
        world.on_issue(Some(Arc::new(move |op: &OpInfo| {
            w2.advance_to(op.issued_ns + 500);
            let t = w2.now_ns();
            d2.read_exact_at(0, &mut [0u8; 4096]).unwrap();
            s2.lock().unwrap().push((op.done_ns, w2.now_ns() - t));
        })));
        d.read_exact_at(0, &mut vec![0u8; 64 << 10]).unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "the hook runs once, not for its own read");
        assert_eq!(seen[0].0, 7400);
        // It waits for the rest of the big read (6900 ns), then takes its own 1400 ns.
        assert_eq!(seen[0].1, 6900 + 1400);
        assert_eq!(world.now_ns(), 7400 + 1400);
    }

    #[test]
    fn configurable_driver_fails_reads_of_its_bad_range() {
        let mut b = Blkio::new(Box::new(FaultDriver::configurable()));
        assert!(b.connect().is_err(), "no size");
        let mut b = Blkio::new(Box::new(FaultDriver::configurable()));
        b.set_u64("size", 1 << 20).unwrap();
        b.set_u64("bad-offset", 8192).unwrap();
        b.set_u64("bad-length", 512).unwrap();
        assert_eq!(b.get_u64("bad-offset").unwrap(), 8192);
        b.connect().unwrap();
        b.start().unwrap();
        assert_eq!(b.get_u64("capacity").unwrap(), 1 << 20);
        let q = b.queue(0, false).unwrap();
        q.write_at(0, &[3u8; 4096], false).unwrap();
        let mut buf = [0u8; 4096];
        q.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [3u8; 4096]);
        let e = q.read_at(8192, &mut buf).unwrap_err();
        assert_eq!(e.errno, libc::EIO, "{e}");
        q.read_at(12288, &mut buf).unwrap();
    }
}
