//! The snapshot: block map + merge progress + backing devices; serves reads (and overlay writes).

use crate::dev::BlockDev;
use crate::error::{Result, SnapError};
use crate::io::CacheStats;
use crate::io::{Dev, Io, UnitCache};
use crate::map::{Codec, MergeView, OpKind, Payload, Quick, Segment, SnapshotMap, StagedWindow};
use crate::overlay::Overlay;
use crate::sched::{FgLane, IoClass, SchedConfig, SchedStats, Scheduler};
use snapblk_core::sync::{lock, read, write};
use snapblk_cow::record::Verifier;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};

/// Offset of `num_merge_ops` (u64) in every COW header version (the format's constant).
pub(crate) use snapblk_cow::NUM_MERGE_OPS_OFFSET;

/// Largest scratch area used: snapuserd maps `header_size + 2 MiB` whatever `buffer_size` says
/// (format §10), i.e. windows of at most 510 blocks.
pub const MAX_SCRATCH_SIZE: u64 = 2 << 20;

/// Decodes compressed payloads (supplied by the COW format layer).
pub trait Decoder: Send + Sync {
    /// Decode `src` (encoded with `codec`) into exactly `out.len()` bytes: on `Ok`, every
    /// byte of `out` is written (`out` may be a reused buffer holding another unit's bytes).
    fn decode(
        &self,
        codec: Codec,
        src: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), snapblk_cow::DecodeError>;
}

/// Where merge state lives in the COW file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CowLayout {
    /// `block_size` from the COW header: bytes per block of the new image (a power of two).
    pub block_size: u32,
    /// `header_size` from the header (38 for v2, 78 for v3).
    pub header_size: u32,
    /// `buffer_size`: bytes of scratch right after the header (0 = none).
    pub scratch_size: u32,
    /// End of the data the COW format describes (the overlay journal starts after it).
    pub data_end: u64,
}

/// The scratch area's geometry (format §10.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scratch {
    /// File offset of the state byte (= header_size).
    pub base: u64,
    /// Bytes reserved for metadata (`len * 16 / 4096`); data starts at `base + meta_len`.
    pub meta_len: u64,
    /// Blocks one window can stage.
    pub slots: usize,
    /// Bytes of the area in use: `buffer_size`, at most [`MAX_SCRATCH_SIZE`].
    pub len: u64,
}

impl CowLayout {
    /// The scratch geometry, if the file has a usable scratch area.
    pub fn scratch(&self) -> Option<Scratch> {
        // `buffer_size` comes from the file: beyond Android's 2 MiB it would only make windows
        // (and the memory staging them) as large as a hostile header asks.
        let size = u64::from(self.scratch_size).min(MAX_SCRATCH_SIZE);
        let bs = self.block_size as u64;
        let meta_len = size * 16 / 4096;
        // Entries start at base + 1 and need a terminator, all before the data at base + meta_len
        // (2 MiB: 510 slots, as Android).
        let slots = (size.saturating_sub(meta_len) / bs.max(1))
            .min((meta_len.saturating_sub(1) / 16).saturating_sub(1));
        (slots > 0).then_some(Scratch {
            base: self.header_size as u64,
            meta_len,
            slots: slots as usize,
            len: size,
        })
    }
}

/// Scratch state byte values (format §10.2).
pub(crate) mod scratch_state {
    /// No merge has begun (`num_merge_ops` is 0); written when merge progress is reset.
    pub(crate) const NOT_STARTED: u8 = 0;
    /// The merge is under way and no window is staged: the last commit sets it, and a restart
    /// redoes the window after `num_merge_ops` by reading its sources from the base.
    pub(crate) const IN_PROGRESS: u8 = 1;
    /// A window is fully staged in scratch (entries and data flushed): a restart redoes it from
    /// the scratch copy, not from the base.
    pub(crate) const DONE: u8 = 2;
}

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotConfig {
    /// Bytes of decoded compressed units to keep.
    pub cache_bytes: u64,
    /// Accept writes (into the overlay journal).
    pub writable: bool,
    /// The I/O scheduler's settings (budgets, idle time, or off).
    pub sched: SchedConfig,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            cache_bytes: 32 << 20,
            writable: false,
            sched: SchedConfig::default(),
        }
    }
}

/// Everything a [`Snapshot`] is made of.
pub struct SnapshotParts {
    /// The base device: the old image the COW applies to, and the merge's target.
    pub base: Arc<dyn BlockDev>,
    /// The device holding the COW file.
    pub cow: Arc<dyn BlockDev>,
    /// The COW's ops in merge order, indexed by new block.
    pub map: SnapshotMap,
    /// Where the header, scratch area and data end lie in the COW file.
    pub layout: CowLayout,
    /// Decompresses payloads (supplied by the caller, so this crate needs no codecs).
    pub decoder: Arc<dyn Decoder>,
    /// Cache size, writability and scheduler settings.
    pub config: SnapshotConfig,
}

/// Merge progress as persisted in the COW.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Persisted {
    /// `num_merge_ops` from the COW header: ops `[0, num_merge_ops)` of the merge order are in
    /// the base.
    pub num_merge_ops: u64,
    /// The scratch state byte (`None` without scratch).
    pub state: Option<u8>,
}

/// A snapshot device's state, shared by its queues and the merge engine.
pub struct Snapshot {
    pub(crate) map: SnapshotMap,
    pub(crate) io: Io,
    pub(crate) layout: CowLayout,
    /// Merge progress as reads see it. Change it only through [`Snapshot::set_view`], which
    /// keeps the lock-free readers' copy (`view_gen`, `view_word`) in step.
    pub(crate) view: RwLock<MergeView>,
    /// Bumped to odd before and to even after every change of `view` (a sequence lock): a read
    /// that served a COPY block without the view's lock is redone under it when this moved.
    view_gen: AtomicU64,
    /// `view` for lock-free readers ([`view_word`]).
    view_word: AtomicU64,
    cache: UnitCache,
    pub(crate) decoder: Arc<dyn Decoder>,
    pub(crate) overlay: Option<Overlay>,
    writable: bool,
    write_lock: Mutex<()>,
    /// Header bytes `[0, header_size + 1)` as last read or written (progress fields included).
    pub(crate) header: Mutex<Vec<u8>>,
    /// The COW record's digests of the new image, when one is attached: every block with a
    /// digest is checked once before it is served (a mismatch is [`SnapError::Corrupt`]).
    verifier: OnceLock<Arc<Verifier>>,
    /// The device size when it is smaller than the map's (a shrinking update, from the COW
    /// record): reads and writes past it are out of range; COPY/XOR sources may still lie past it
    /// in the base.
    size_limit: OnceLock<u64>,
    /// Payload offset of the XOR op at `num_merge_ops` when the COW has no scratch area, the
    /// merge has started and that op reads its own destination: a stashed merge may have
    /// written the block before it stopped, and only its stash knows ([`Snapshot::attach_stash`]
    /// clears this). Until then the block is not served unchecked. `u64::MAX`: none.
    pub(crate) in_flight: std::sync::atomic::AtomicU64,
}

impl Snapshot {
    /// Open: read merge progress from the COW and, if a window was staged in scratch when the last
    /// run stopped, load it so reads of that window are served from it.
    pub fn open(p: SnapshotParts) -> Result<Self> {
        let sched = Scheduler::new(p.config.sched);
        Self::open_with_scheduler(p, sched)
    }

    /// Like [`Snapshot::open`], with a scheduler the caller made (one on a simulation's virtual
    /// clock, [`Scheduler::with_clock`]); `p.config.sched` is not used.
    pub fn open_with_scheduler(p: SnapshotParts, sched: Scheduler) -> Result<Self> {
        let io = Io::new(p.base, p.cow, Arc::new(sched));
        let bs = p.map.block_size();
        if p.layout.block_size as u64 != bs {
            return Err(SnapError::Format(
                "layout and map disagree on block size".into(),
            ));
        }
        if p.layout.header_size < 34 || p.layout.header_size > 4095 {
            return Err(SnapError::Format(format!(
                "header size {}",
                p.layout.header_size
            )));
        }
        let base_len = io.base.size().map_err(SnapError::io("sizing base"))?;
        if base_len < p.map.capacity() {
            return Err(SnapError::BaseTooShort {
                base: "the base".into(),
                size: base_len,
                block: (p.map.capacity() / bs).saturating_sub(1),
                needed: p.map.capacity(),
            });
        }
        let mut header = vec![0u8; p.layout.header_size as usize + 1];
        let hlen = if p.layout.scratch().is_some() {
            header.len()
        } else {
            header.len() - 1
        };
        io.read(IoClass::Foreground, Dev::Cow, 0, &mut header[..hlen])?;
        // The overlay journal is replayed even when read-only, so earlier writes stay visible.
        let overlay = if bs == 4096 {
            let start = p.layout.data_end.div_ceil(4096) * 4096;
            // Where older versions put the journal of a v3 COW without payloads.
            let legacy = snapblk_cow::Header::parse(&header[..hlen])
                .ok()
                .filter(|h| h.major == 3)
                .and_then(|h| {
                    let used = h.op_count.checked_mul(16)?;
                    h.v3_op_offset()
                        .checked_add(used)?
                        .checked_next_multiple_of(4096)
                });
            let nblocks = p.map.capacity() / bs;
            Some(Overlay::open_or_legacy(&io, start, legacy, bs, nblocks)?)
        } else if p.config.writable {
            return Err(SnapError::Config(
                "the writable overlay needs 4096-byte blocks".into(),
            ));
        } else {
            None
        };
        let s = Snapshot {
            map: p.map,
            io,
            layout: p.layout,
            view: RwLock::new(MergeView::default()),
            view_gen: AtomicU64::new(0),
            view_word: AtomicU64::new(view_word(&MergeView::default())),
            cache: UnitCache::new(p.config.cache_bytes),
            decoder: p.decoder,
            overlay,
            writable: p.config.writable,
            write_lock: Mutex::new(()),
            header: Mutex::new(header),
            verifier: OnceLock::new(),
            size_limit: OnceLock::new(),
            in_flight: std::sync::atomic::AtomicU64::new(u64::MAX),
        };
        let pers = s.persisted();
        if pers.num_merge_ops > s.map.ops().len() as u64 {
            return Err(SnapError::Format(format!(
                "num_merge_ops {} exceeds the {} ops of the merge order",
                pers.num_merge_ops,
                s.map.ops().len()
            )));
        }
        let mut view = MergeView {
            merged: pers.num_merge_ops as usize,
            staged: None,
        };
        // A "done" state byte means the window at num_merge_ops may be half written: its sources
        // can no longer be trusted, whatever the counter says (format §10.3 observation).
        // Unless the window staged there is the one that *ends* at num_merge_ops: the commit
        // (counter += window, state byte := 1, one msync of the first page in snapuserd) reached
        // the disk only in part, the counter store without the state byte store. That window is
        // durably in the base, and the sources of the next one are untouched.
        if pers.state == Some(scratch_state::DONE) {
            match s.load_scratch_window(view.merged) {
                Ok(w) => view.staged = Some(w),
                Err(e) if !s.scratch_is_committed_window(view.merged)? => return Err(e),
                Err(_) => {}
            }
        }
        if s.layout.scratch().is_none()
            && view.merged > 0
            && let Some(op) = s.map.ops().get(view.merged)
            && crate::stash::reads_own_destination(op, bs)
            && let OpKind::Xor { payload, .. } = op.kind
        {
            s.in_flight.store(payload.offset, Ordering::Relaxed);
        }
        s.set_view(|v| *v = view);
        Ok(s)
    }

    /// Whether a merge window is staged (in scratch, or from a merge stash): the merge has
    /// written, or may have written, the base although `num_merge_ops` has not moved.
    pub fn merge_staged(&self) -> bool {
        self.lock_view().staged.is_some()
    }

    /// The block map.
    pub fn map(&self) -> &SnapshotMap {
        &self.map
    }
    /// The COW layout.
    pub fn layout(&self) -> CowLayout {
        self.layout
    }
    /// Check every block the COW record has a digest for before serving it (once per block:
    /// the verifier remembers passes, and may be shared with other opens of the same files).
    /// Fails when the record is for another block size or a larger device, or one is attached.
    pub fn attach_verifier(&self, v: Arc<Verifier>) -> Result<()> {
        let rec = v.record();
        let bs = self.map.block_size();
        if u64::from(rec.block_size) != bs {
            return Err(SnapError::Config(format!(
                "the COW record is for {}-byte blocks, the COW has {bs}",
                rec.block_size
            )));
        }
        if rec.target_blocks() * bs > self.capacity() {
            return Err(SnapError::Config(format!(
                "the COW record's new image is {} bytes, the device {}",
                rec.target_size,
                self.capacity()
            )));
        }
        self.verifier
            .set(v)
            .map_err(|_| SnapError::Config("a COW record is already attached".into()))
    }

    /// With a COW record attached: whether the base is the file this COW's merge belongs to
    /// (blocks already merged hold their new digests, blocks still to read their old ones).
    /// `None` without a record. Reads only the blocks named, through the merge I/O class.
    pub fn check_merge_base(&self) -> Result<Option<snapblk_cow::record::MergeBinding>> {
        use snapblk_cow::record::{MergeOp, check_merge_binding};
        let Some(v) = self.verifier.get() else {
            return Ok(None);
        };
        let (merged, sources_from) = {
            let view = self.lock_view();
            (
                view.merged,
                view.staged.as_ref().map_or(view.merged, |w| w.end),
            )
        };
        let bs = self.map.block_size();
        let ops: Vec<MergeOp> = self
            .map
            .ops()
            .iter()
            .enumerate()
            .map(|(i, o)| MergeOp {
                new_block: o.new_block,
                // A shadowed duplicate does not decide what its block holds.
                blocks: if self.map.is_winner(i) { o.blocks() } else { 0 },
                source: o.source_blocks(bs),
            })
            .collect();
        let mut rd = |b: u64, buf: &mut [u8]| -> std::io::Result<()> {
            self.io
                .read(IoClass::Merge, Dev::Base, b * bs, buf)
                // Carried whole through the record check and taken back out below.
                .map_err(std::io::Error::other)
        };
        check_merge_binding(v.record(), &ops, merged, sources_from, &mut rd)
            .map(Some)
            .map_err(|e| match e {
                snapblk_cow::record::RecordError::Io { source, .. } => SnapError::Io {
                    what: "reading the base for the COW record check",
                    // The read's own error (and errno), with its chain, for the C ABI.
                    source: match source.downcast::<SnapError>() {
                        Ok(e) => e.into(),
                        Err(io) => io.into(),
                    },
                },
                other => SnapError::RecordCheck(other),
            })
    }

    /// Set the merge progress back to "not started" (num_merge_ops 0, scratch state byte 0),
    /// durably. For a COW whose progress belongs to another file: the caller has proven it with
    /// [`Snapshot::check_merge_base`]. Needs the COW open for writing.
    pub fn reset_merge_progress(&self) -> Result<()> {
        self.write_merge_progress(0, Some(scratch_state::NOT_STARTED))?;
        self.set_view(|v| *v = MergeView::default());
        Ok(())
    }

    /// Persist `num_merge_ops = n` (and the scratch state byte, when the file has scratch) in one
    /// write inside the COW's first page, then flush.
    pub(crate) fn write_merge_progress(&self, n: usize, state: Option<u8>) -> Result<()> {
        let h = self.layout.header_size as usize;
        let bytes = {
            let mut hdr = lock(&self.header);
            hdr[26..34].copy_from_slice(&(n as u64).to_le_bytes());
            match (state, self.layout.scratch()) {
                (Some(s), Some(_)) => {
                    hdr[h] = s;
                    hdr[26..=h].to_vec()
                }
                _ => hdr[26..34].to_vec(),
            }
        };
        self.io
            .write(IoClass::Merge, Dev::Cow, NUM_MERGE_OPS_OFFSET, &bytes)?;
        self.io.flush(IoClass::Merge, Dev::Cow)
    }

    /// The attached verifier.
    pub fn verifier(&self) -> Option<&Arc<Verifier>> {
        self.verifier.get()
    }

    /// Whether a read of `[offset, offset + len)` would check a block against the COW record
    /// first (exports that execute plans themselves, such as ublk zero copy, must then let the
    /// snapshot serve it).
    pub fn needs_verification(&self, offset: u64, len: u64) -> bool {
        let Some(v) = self.verifier.get() else {
            return false;
        };
        let bs = self.map.block_size();
        let first = offset / bs;
        let end = offset.saturating_add(len).div_ceil(bs);
        let ov = self.overlay.as_ref().filter(|o| !o.is_empty());
        (first..end).any(|b| v.pending(b) && ov.is_none_or(|o| o.lookup(b).is_none()))
    }

    /// Read, then check every block of the range that the COW record has an unchecked digest
    /// for (partly covered blocks are read whole for that).
    #[inline(never)]
    fn read_checked(
        &self,
        class: IoClass,
        view: &MergeView,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        self.read_planned(class, view, offset, buf)?;
        let Some(v) = self.verifier.get() else {
            return Ok(());
        };
        let bs = self.map.block_size();
        let end = offset + buf.len() as u64;
        let ov = self.overlay.as_ref().filter(|o| !o.is_empty());
        let mut whole = Vec::new();
        for b in offset / bs..end.div_ceil(bs) {
            if !v.pending(b) || ov.is_some_and(|o| o.lookup(b).is_some()) {
                continue;
            }
            let (bo, be) = (b * bs, (b + 1) * bs);
            let ok = if bo >= offset && be <= end {
                v.check(b, &buf[(bo - offset) as usize..(be - offset) as usize])
            } else {
                whole.resize(bs as usize, 0);
                self.read_planned(class, view, bo, &mut whole)?;
                v.check(b, &whole)
            };
            if !ok {
                return Err(SnapError::Corrupt { block: b });
            }
        }
        Ok(())
    }

    /// The base or the COW device: for the file behind it ([`ReadAt::as_file`]) on a fast path
    /// that reads it directly (the ublk zero-copy plan).
    ///
    /// [`ReadAt::as_file`]: snapblk_core::ReadAt::as_file
    pub fn device(&self, d: Dev) -> &dyn BlockDev {
        self.io.dev(d)
    }

    /// Device size in bytes.
    pub fn capacity(&self) -> u64 {
        match self.size_limit.get() {
            Some(&n) => n,
            None => self.map.capacity(),
        }
    }

    /// Make the device `size` bytes (a multiple of the block size, no larger than the base): the
    /// new image of a shrinking update. Once, before serving.
    pub(crate) fn limit_capacity(&self, size: u64) -> Result<()> {
        let bs = self.map.block_size();
        if size > self.map.capacity() || !size.is_multiple_of(bs) {
            return Err(SnapError::Config(format!(
                "device size {size} must be a multiple of {bs} no larger than {}",
                self.map.capacity()
            )));
        }
        self.size_limit
            .set(size)
            .map_err(|_| SnapError::Config("the device size is already limited".into()))
    }
    /// Whether writes are accepted.
    pub fn writable(&self) -> bool {
        self.writable && self.overlay.is_some()
    }
    /// The overlay journal, when writable.
    #[cfg(all(test, feature = "test-utils"))]
    pub(crate) fn overlay(&self) -> Option<&Overlay> {
        self.overlay.as_ref()
    }
    /// Scheduler counters.
    pub fn sched_stats(&self) -> SchedStats {
        self.io.sched.stats()
    }
    /// The scheduler's background budget now, in bytes (`u64::MAX` with the scheduler off).
    pub fn sched_budget(&self) -> u64 {
        self.io.sched.budget_now()
    }
    /// Decoded-unit cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
    /// (ops merged, ops in the merge order).
    pub fn merge_progress(&self) -> (usize, usize) {
        (self.lock_view().merged, self.map.ops().len())
    }

    pub(crate) fn lock_view(&self) -> RwLockReadGuard<'_, MergeView> {
        read(&self.view)
    }

    /// Change the merge view with `f`. Taking the write lock waits for the reads that hold
    /// the view; the generation moves before and after the change, and the full fence orders
    /// the change before every base write the caller makes next, so a lock-free read that
    /// overlapped the change, or could have seen those writes, finds the generation moved and
    /// is redone under the lock ([`Snapshot::read_class`]).
    pub(crate) fn set_view<R>(&self, f: impl FnOnce(&mut MergeView) -> R) -> R {
        let mut v = write(&self.view);
        let g = self.view_gen.load(Ordering::Relaxed);
        self.view_gen.store(g.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let r = f(&mut v);
        self.view_word.store(view_word(&v), Ordering::Relaxed);
        self.view_gen.store(g.wrapping_add(2), Ordering::Release);
        fence(Ordering::SeqCst);
        r
    }

    /// Progress fields from the header bytes read at open.
    pub(crate) fn persisted(&self) -> Persisted {
        let h = lock(&self.header);
        let mut a = [0u8; 8];
        a.copy_from_slice(&h[26..34]);
        let state = self
            .layout
            .scratch()
            .map(|_| h[self.layout.header_size as usize]);
        Persisted {
            num_merge_ops: u64::from_le_bytes(a),
            state,
        }
    }

    /// The scratch entries `(new_block, file offset)` up to the terminator, reading at most
    /// `cap + 1` of them (a window never has more entries than ops are left, whatever
    /// `buffer_size` claims, so an extra entry is an error the caller sees as `cap + 1` entries).
    fn scratch_entries(&self, sc: &Scratch, cap: usize) -> Result<Vec<(u64, u64)>> {
        let mut meta = vec![0u8; (cap.min(sc.slots) + 1) * 16];
        self.io
            .read(IoClass::Merge, Dev::Cow, sc.base + 1, &mut meta)?;
        let mut entries = Vec::new();
        for e in meta.chunks_exact(16) {
            let (mut nb, mut off) = ([0u8; 8], [0u8; 8]);
            nb.copy_from_slice(&e[..8]);
            off.copy_from_slice(&e[8..]);
            let (nb, off) = (u64::from_le_bytes(nb), u64::from_le_bytes(off));
            if nb == 0 && off == 0 {
                break;
            }
            entries.push((nb, off));
        }
        Ok(entries)
    }

    /// Whether the scratch entries name exactly the ordered ops `[end - k, end)` of the merge
    /// order (the window a commit to `end` finished).
    fn scratch_is_committed_window(&self, end: usize) -> Result<bool> {
        let Some(sc) = self.layout.scratch() else {
            return Ok(false);
        };
        let entries = self.scratch_entries(&sc, end)?;
        let k = entries.len();
        if k == 0 || k > end || k > sc.slots {
            return Ok(false);
        }
        let ops = &self.map.ops()[end - k..end];
        Ok(ops
            .iter()
            .zip(&entries)
            .all(|(op, &(nb, _))| op.is_ordered() && op.new_block == nb))
    }

    /// Read the window staged in scratch; it must describe the ops starting at `start`.
    pub(crate) fn load_scratch_window(&self, start: usize) -> Result<StagedWindow> {
        let sc = self
            .layout
            .scratch()
            .ok_or_else(|| SnapError::Scratch("no scratch area".into()))?;
        let bs = self.map.block_size();
        let entries = self.scratch_entries(&sc, self.map.ops().len().saturating_sub(start))?;
        if entries.is_empty() || entries.len() > sc.slots {
            return Err(SnapError::Scratch(format!(
                "{} staged entries",
                entries.len()
            )));
        }
        let ops = self.map.ops();
        let data_lo = sc.base + sc.meta_len;
        let data_hi = sc.base + sc.len;
        // Every entry is checked before the window's memory is allocated: its size comes from
        // the file (entries, buffer_size), so it is only trusted once it matches the merge order
        // and lies inside the COW.
        let cow_len = self.io.cow.size().map_err(SnapError::io("sizing COW"))?;
        for (k, &(nb, off)) in entries.iter().enumerate() {
            let op = ops
                .get(start + k)
                .ok_or_else(|| SnapError::Scratch("window runs past the merge order".into()))?;
            if !op.is_ordered() || op.new_block != nb {
                return Err(SnapError::Scratch(format!(
                    "entry {k} names block {nb}, merge order has block {} at {}",
                    op.new_block,
                    start + k
                )));
            }
            if off < data_lo || off.saturating_add(bs) > data_hi.min(cow_len) {
                return Err(SnapError::Scratch(format!(
                    "entry {k} data offset {off} outside scratch"
                )));
            }
        }
        let mut data = vec![0u8; entries.len() * bs as usize];
        for (k, &(_, off)) in entries.iter().enumerate() {
            self.io.read(
                IoClass::Merge,
                Dev::Cow,
                off,
                &mut data[k * bs as usize..(k + 1) * bs as usize],
            )?;
        }
        Ok(StagedWindow {
            start,
            end: start + entries.len(),
            data: Arc::new(data),
        })
    }

    /// Plan a read and run `f` on the plan while merge progress cannot change (so base ranges in
    /// the plan stay valid until `f` returns). For exports that execute plans themselves.
    pub fn with_plan<R>(
        &self,
        offset: u64,
        len: u64,
        f: impl FnOnce(&[Segment], &MergeView) -> R,
    ) -> Result<R> {
        let view = self.lock_view();
        let mut segs = Vec::new();
        let ov = |b| self.overlay.as_ref().and_then(|o| o.lookup(b));
        self.map.plan_into(&view, &ov, offset, len, &mut segs)?;
        Ok(f(&segs, &view))
    }

    /// Read through the snapshot (foreground class).
    #[inline]
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_class(IoClass::Foreground, offset, buf)
    }

    /// Read through the snapshot with an explicit I/O class (readahead uses its own).
    #[inline]
    pub(crate) fn read_class(&self, class: IoClass, offset: u64, buf: &mut [u8]) -> Result<()> {
        if class == IoClass::Foreground && self.read_quick(None, offset, buf) {
            return Ok(());
        }
        self.read_locked(class, offset, buf)
    }

    /// A foreground read by a queue, whose lock-free reads count on its own `lane` of the
    /// scheduler.
    #[inline]
    pub(crate) fn read_in(&self, lane: &FgLane, offset: u64, buf: &mut [u8]) -> Result<()> {
        if self.read_quick(Some(lane), offset, buf) {
            return Ok(());
        }
        self.read_locked(IoClass::Foreground, offset, buf)
    }

    /// A foreground lane of this snapshot's scheduler, for a queue ([`Snapshot::read_in`]).
    pub(crate) fn fg_lane(&self) -> FgLane {
        self.io.sched.lane()
    }

    /// A foreground read inside one block that is unchanged or a COPY, with no size limit,
    /// overlay data or pending record check: one `pread` of the base without the merge view's
    /// lock. True when it served the read; false when it is not such
    /// a read, the `pread` failed or came short, or the merge view changed while it ran: the
    /// caller reads under the lock (which also reports any error).
    ///
    /// An unchanged block is never written by the merge (it writes only op destinations), so
    /// its base block is right at any time. A COPY block's source is right until the merge
    /// publishes the window holding its op (rule 2 of the merge order: no earlier op writes a
    /// later op's source), and every base write of the merge follows a change of the view
    /// ([`Snapshot::set_view`]): so the read is kept only when the view's generation is the same
    /// after the `pread` as before it.
    #[inline]
    fn read_quick(&self, lane: Option<&FgLane>, offset: u64, buf: &mut [u8]) -> bool {
        let len = buf.len() as u64;
        let bs = self.map.block_size();
        let skip = offset & (bs - 1);
        if len == 0
            || skip + len > bs
            || offset
                .checked_add(len)
                .is_none_or(|e| e > self.map.capacity())
            || self.size_limit.get().is_some()
            || self.overlay.as_ref().is_some_and(|o| !o.is_empty())
        {
            return false;
        }
        let block = offset >> self.map.block_shift();
        if let Some(v) = self.verifier.get()
            && v.pending(block)
        {
            return false;
        }
        match self.map.quick(block) {
            Quick::Unchanged => self.io.try_read_fg(lane, Dev::Base, offset, buf),
            Quick::Copy { op, src } => {
                let g = self.view_gen.load(Ordering::Acquire);
                let w = self.view_word.load(Ordering::Relaxed);
                let merged = (w & 0xffff_ffff) as usize;
                let staged_end = (w >> 32) as usize;
                if g & 1 != 0 || w & VIEW_LOCKED != 0 || (op >= merged && op < staged_end) {
                    return false;
                }
                let from = if op < merged { block } else { src };
                let at = (from << self.map.block_shift()) + skip;
                if !self.io.try_read_fg(lane, Dev::Base, at, buf) {
                    return false;
                }
                // The pread's loads before the generation's second load (a seqlock's read side).
                fence(Ordering::Acquire);
                self.view_gen.load(Ordering::Relaxed) == g
            }
            Quick::Other => false,
        }
    }

    /// [`Snapshot::read_class`] holding the merge view: every read [`Snapshot::read_quick`]
    /// does not serve.
    #[inline(never)]
    fn read_locked(&self, class: IoClass, offset: u64, buf: &mut [u8]) -> Result<()> {
        let view = self.lock_view();
        let len = buf.len() as u64;
        if let Some(&cap) = self.size_limit.get()
            && offset.checked_add(len).is_none_or(|e| e > cap)
        {
            return Err(SnapError::Range {
                offset,
                len,
                capacity: cap,
            });
        }
        if self.verifier.get().is_some() && self.needs_verification(offset, len) {
            return self.read_checked(class, &view, offset, buf);
        }
        let bs = self.map.block_size();
        let ov = self.overlay.as_ref().filter(|o| !o.is_empty());
        // Reads inside one block (the 4 KiB random-read case) have a one-segment plan: build it
        // on the stack. Block arithmetic by shift and mask (a 64-bit division costs tens of
        // cycles on this path).
        let skip = offset & (bs - 1);
        if len > 0
            && skip + len <= bs
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.capacity())
        {
            let block = offset >> self.map.block_shift();
            let seg = match ov {
                Some(o) => self
                    .map
                    .block_segment(&view, &|b| o.lookup(b), block, skip, len),
                None => self.map.block_segment(&view, &|_| None, block, skip, len),
            };
            // An unchanged block, a COPY op or a raw payload is one read with an offset
            // translation: skip the general plan executor.
            return match seg {
                Segment::Base { base_offset, .. } => {
                    self.io.read(class, Dev::Base, base_offset, buf)
                }
                Segment::Cow { cow_offset, .. } => self.io.read(class, Dev::Cow, cow_offset, buf),
                _ => self.execute(class, &view, std::slice::from_ref(&seg), buf),
            };
        }
        self.read_planned(class, &view, offset, buf)
    }

    /// A background read (readahead) of any length: in pieces no larger than the scheduler's
    /// current budget, each one waiting for room in the budget *before* it takes the merge
    /// view. So a merge commit waiting for the view waits at most for one piece's I/O, never
    /// for a throttled background read, and the client reads queued behind that commit with it.
    pub(crate) fn read_background(
        &self,
        class: IoClass,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let mut pos = 0usize;
        while pos < buf.len() {
            let n = (self.io.sched.chunk() as usize).min(buf.len() - pos);
            self.io.sched.wait_room(class, n as u64);
            self.read_class(class, offset + pos as u64, &mut buf[pos..pos + n])?;
            pos += n;
        }
        Ok(())
    }

    /// Reads spanning blocks: build a plan, then execute it.
    #[inline(never)]
    fn read_planned(
        &self,
        class: IoClass,
        view: &MergeView,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let len = buf.len() as u64;
        let ov = self.overlay.as_ref().filter(|o| !o.is_empty());
        thread_local! {
            // Reused plan buffer: keeps larger reads free of allocations.
            static SEGS: std::cell::RefCell<Vec<Segment>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut run = |segs: &mut Vec<Segment>| {
            segs.clear();
            match ov {
                Some(o) => self
                    .map
                    .plan_into(view, &|b| o.lookup(b), offset, len, segs)?,
                None => self.map.plan_into(view, &|_| None, offset, len, segs)?,
            }
            self.execute(class, view, segs, buf)
        };
        SEGS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut segs) => run(&mut segs),
            // Re-entered (a decoder reading through the snapshot): use a fresh buffer.
            Err(_) => run(&mut Vec::new()),
        })
    }

    /// Execute a plan into `buf` (whose length is the plan's total).
    pub(crate) fn execute(
        &self,
        class: IoClass,
        view: &MergeView,
        segs: &[Segment],
        buf: &mut [u8],
    ) -> Result<()> {
        let mut pos = 0usize;
        let mut i = 0usize;
        while i < segs.len() {
            // Runs of whole compressed units stored back to back (sequential reads of REPLACE
            // data): one read of all their payloads, then decode each straight into the buffer,
            // bypassing the cache (a unit read whole is not read again soon). Readahead wants
            // the cache filled, so it takes the per-unit path.
            let run = self.whole_unit_run(&segs[i..]);
            if run >= 2 && class != IoClass::Readahead {
                pos += self.decode_run(class, &segs[i..i + run], &mut buf[pos..])?;
                i += run;
                continue;
            }
            let seg = &segs[i];
            i += 1;
            let n = seg.len() as usize;
            let dst = buf
                .get_mut(pos..pos + n)
                .ok_or_else(|| SnapError::Config("plan longer than buffer".into()))?;
            match *seg {
                Segment::Base { base_offset, .. } => {
                    self.io.read(class, Dev::Base, base_offset, dst)?
                }
                Segment::Cow { cow_offset, .. } => {
                    self.io.read(class, Dev::Cow, cow_offset, dst)?
                }
                Segment::Zero { .. } => dst.fill(0),
                Segment::Decoded { payload, skip, .. } => {
                    if skip == 0 && n == payload.unit_len as usize {
                        // A whole unit: copy it from the cache if it is there, else decode
                        // straight into the request buffer and keep a copy in the cache (random
                        // reads come back; that copy is the one the cached path always made).
                        match self.cache.get(payload.offset) {
                            Some(u) => {
                                dst.copy_from_slice(u.get(..n).ok_or_else(|| short(&payload))?)
                            }
                            None => {
                                self.decode_into(class, &payload, dst)?;
                                // Readahead fills the cache for the reads it anticipates. A
                                // client's read of a whole unit keeps no copy: the block layer
                                // or file system above caches what it reads again, and copying
                                // every unit cost more than the rare hit saved.
                                if class == IoClass::Readahead && self.cache.accepts(n as u64) {
                                    self.cache.insert(payload.offset, Arc::new(dst.to_vec()));
                                }
                            }
                        }
                    } else {
                        let unit = self.unit(class, &payload)?;
                        let src = unit
                            .get(skip as usize..skip as usize + n)
                            .ok_or_else(|| short(&payload))?;
                        dst.copy_from_slice(src);
                    }
                }
                Segment::Xor {
                    base_offset,
                    payload,
                    skip,
                    ..
                } => {
                    if payload.offset == self.in_flight.load(Ordering::Relaxed)
                        && self.verifier.get().is_none()
                    {
                        return Err(SnapError::InFlight);
                    }
                    // Only the bytes asked for: base bytes straight into the buffer, then XOR
                    // with the (cached) payload.
                    self.io
                        .read(class, Dev::Base, base_offset + skip as u64, dst)?;
                    let whole = skip == 0 && n == payload.unit_len as usize;
                    let cached = if whole && class != IoClass::Readahead {
                        self.cache.get(payload.offset)
                    } else {
                        None
                    };
                    if let Some(u) = cached {
                        xor_into(dst, u.get(..n).ok_or_else(|| short(&payload))?);
                    } else if whole && class != IoClass::Readahead {
                        // A whole block not in the cache (readahead fills it): decode the delta
                        // into a per-thread buffer and keep no copy, as for whole REPLACE units.
                        with_unit_scratch(n, |pl| {
                            self.decode_into(class, &payload, pl)?;
                            xor_into(dst, pl);
                            Ok::<(), SnapError>(())
                        })?;
                    } else {
                        let unit = self.unit(class, &payload)?;
                        let pl = unit
                            .get(skip as usize..skip as usize + n)
                            .ok_or_else(|| short(&payload))?;
                        xor_into(dst, pl);
                    }
                }
                Segment::Staged { slot, skip, .. } => {
                    let w = view.staged.as_ref().ok_or(SnapError::MergeFailed)?;
                    let bs = self.map.block_size() as usize;
                    let at = slot as usize * bs + skip as usize;
                    dst.copy_from_slice(w.data.get(at..at + n).ok_or(SnapError::MergeFailed)?);
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// How many leading segments are whole compressed units with contiguous payloads.
    fn whole_unit_run(&self, segs: &[Segment]) -> usize {
        let mut n = 0;
        let mut next_off = None;
        let mut bytes = 0u64;
        for s in segs {
            match *s {
                Segment::Decoded {
                    payload,
                    skip: 0,
                    len,
                } if len == payload.unit_len
                    && next_off.is_none_or(|o| o == payload.offset)
                    && bytes < (4 << 20) =>
                {
                    next_off = Some(payload.offset + payload.stored_len as u64);
                    bytes += payload.stored_len as u64;
                    n += 1;
                }
                _ => break,
            }
        }
        n
    }

    fn decode_run(&self, class: IoClass, segs: &[Segment], buf: &mut [u8]) -> Result<usize> {
        let (first, last) = match (segs.first(), segs.last()) {
            (
                Some(Segment::Decoded { payload: a, .. }),
                Some(Segment::Decoded { payload: b, .. }),
            ) => (*a, *b),
            _ => return Ok(0),
        };
        let start = first.offset;
        let end = last.offset + last.stored_len as u64;
        with_scratch((end - start) as usize, |src| {
            self.decode_run_from(class, segs, start, src, buf)
        })
    }

    fn decode_run_from(
        &self,
        class: IoClass,
        segs: &[Segment],
        start: u64,
        src: &mut [u8],
        buf: &mut [u8],
    ) -> Result<usize> {
        self.io.read(class, Dev::Cow, start, src)?;
        let mut pos = 0usize;
        for s in segs {
            if let Segment::Decoded {
                payload: p, len, ..
            } = *s
            {
                let at = (p.offset - start) as usize;
                let input = &src[at..at + p.stored_len as usize];
                let out = buf
                    .get_mut(pos..pos + len as usize)
                    .ok_or_else(|| short(&p))?;
                if p.codec == Codec::None {
                    out.copy_from_slice(input.get(..out.len()).ok_or_else(|| short(&p))?);
                } else {
                    self.decoder.decode(p.codec, input, out).map_err(|source| {
                        SnapError::Decode {
                            offset: p.offset,
                            codec: p.codec,
                            source,
                        }
                    })?;
                }
                pos += len as usize;
            }
        }
        Ok(pos)
    }

    /// The decoded unit of a payload (raw payloads are read as is), through the cache.
    pub(crate) fn unit(&self, class: IoClass, p: &Payload) -> Result<Arc<Vec<u8>>> {
        if let Some(u) = self.cache.get(p.offset) {
            return Ok(u);
        }
        let mut out = vec![0u8; p.unit_len as usize];
        self.decode_into(class, p, &mut out)?;
        let u = Arc::new(out);
        self.cache.insert(p.offset, u.clone());
        Ok(u)
    }

    /// Decode a payload into `out` (exactly one unit), bypassing the cache.
    pub(crate) fn decode_into(&self, class: IoClass, p: &Payload, out: &mut [u8]) -> Result<()> {
        if p.codec == Codec::None {
            if p.stored_len as usize != out.len() {
                return Err(short(p));
            }
            return self.io.read(class, Dev::Cow, p.offset, out);
        }
        check_payload_len(p)?;
        with_scratch(p.stored_len as usize, |src| {
            self.io.read(class, Dev::Cow, p.offset, src)?;
            self.decoder
                .decode(p.codec, src, out)
                .map_err(|source| SnapError::Decode {
                    offset: p.offset,
                    codec: p.codec,
                    source,
                })
        })
    }

    /// Decode payload `p` from its stored bytes `src` (already read) into `out` (one unit).
    pub(crate) fn decode_stored(&self, p: &Payload, src: &[u8], out: &mut [u8]) -> Result<()> {
        if p.codec == Codec::None {
            if src.len() != out.len() {
                return Err(short(p));
            }
            out.copy_from_slice(src);
            return Ok(());
        }
        check_payload_len(p)?;
        self.decoder
            .decode(p.codec, src, out)
            .map_err(|source| SnapError::Decode {
                offset: p.offset,
                codec: p.codec,
                source,
            })
    }

    /// Write through the snapshot into the overlay (EROFS when read-only).
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let Some(ov) = self.overlay.as_ref().filter(|_| self.writable) else {
            return Err(SnapError::ReadOnly);
        };
        let len = data.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > self.capacity()) {
            return Err(SnapError::Range {
                offset,
                len,
                capacity: self.capacity(),
            });
        }
        if len == 0 {
            return if fua { self.flush() } else { Ok(()) };
        }
        let bs = self.map.block_size();
        let _w = lock(&self.write_lock);
        let first = offset / bs;
        let last = (offset + len - 1) / bs;
        let mut buf = vec![0u8; ((last - first + 1) * bs) as usize];
        let head = offset % bs;
        if head != 0 {
            self.read(first * bs, &mut buf[..bs as usize])?;
        }
        if !(offset + len).is_multiple_of(bs) && (last != first || head == 0) {
            let at = buf.len() - bs as usize;
            self.read(last * bs, &mut buf[at..])?;
        }
        buf[head as usize..head as usize + data.len()].copy_from_slice(data);
        ov.append(&self.io, first, &buf)?;
        if fua { self.flush() } else { Ok(()) }
    }

    /// Make acknowledged writes durable.
    pub fn flush(&self) -> Result<()> {
        if self.writable() {
            self.io.flush(IoClass::Foreground, Dev::Cow)?;
        }
        Ok(())
    }
}

/// A view word readers may not use: they take the view's lock.
const VIEW_LOCKED: u64 = 1 << 63;

/// The merge view in one word for lock-free readers: `merged` in bits 0..32 and the end of the
/// staged window (`merged` without one) in bits 32..63; [`VIEW_LOCKED`] when it does not fit
/// that (more ops than 2^31, or a staged window that does not start at `merged`, which the
/// merge never makes).
fn view_word(v: &MergeView) -> u64 {
    let end = v.staged.as_ref().map_or(v.merged, |w| w.end);
    let fits =
        v.staged.as_ref().is_none_or(|w| w.start == v.merged) && v.merged <= end && end < 1 << 31;
    if fits {
        v.merged as u64 | (end as u64) << 32
    } else {
        VIEW_LOCKED
    }
}

/// `dst ^= src` over their common length.
fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

type ThreadBuf = std::thread::LocalKey<std::cell::RefCell<Vec<u8>>>;

/// Run `f` on `len` bytes of the per-thread buffer `key`, keeping at most `keep` bytes of it
/// between calls; a re-entered buffer (a decoder reading through the snapshot) or a larger
/// request gets a fresh one.
fn with_buf<R>(
    key: &'static ThreadBuf,
    keep: usize,
    len: usize,
    f: impl FnOnce(&mut [u8]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) if len <= keep => {
            if v.len() < len {
                v.resize(len, 0);
            }
            f(&mut v[..len])
        }
        _ => f(&mut vec![0u8; len]),
    })
}

/// A per-thread buffer for one decoded unit (beside [`with_scratch`]'s, which holds the
/// compressed bytes while it decodes).
fn with_unit_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    with_buf(&BUF, 1 << 20, len, f)
}

/// Run `f` on a per-thread reusable buffer of `len` bytes (compressed payload bytes read from the
/// COW): no allocation or zeroing per request once the buffer has grown.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Keep at most a few MiB per thread (runs are bounded by `whole_unit_run`).
    with_buf(&BUF, 8 << 20, len, f)
}

/// A compressed payload's stored length is at most a u32; bound it by the largest unit a COW can
/// have (256 KiB) plus compressor overhead before allocating for it.
pub(crate) fn check_payload_len(p: &Payload) -> Result<()> {
    if p.codec != Codec::None && p.stored_len > (1 << 20) {
        return Err(SnapError::PayloadTooLarge {
            offset: p.offset,
            len: p.stored_len,
        });
    }
    Ok(())
}

fn short(p: &Payload) -> SnapError {
    SnapError::PayloadShort {
        offset: p.offset,
        len: p.stored_len,
        unit: p.unit_len,
    }
}
