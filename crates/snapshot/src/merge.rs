//! The merge engine: writes the new image into the base in place, crash-safely.
//!
//! It follows the COW's merge order (format §9.2) and keeps its durable state exactly where
//! Android does (format §10): `num_merge_ops` at header offset 26 and, when the file has a scratch
//! area, the staged window (state byte at `header_size`, entries at `header_size + 1`, data after
//! the metadata). Each step is a durable checkpoint:
//!
//! 1. **stage** a window of ordered (COPY/XOR) ops: read their sources (coalesced runs) and apply
//!    XOR payloads, into memory; with scratch, write entries + data to scratch, flush the COW, then
//!    set the state byte to 2 ("done") and flush again;
//! 2. **publish** the window to readers: after in-flight source reads drain, reads of its blocks
//!    are served from the staged copy;
//! 3. **write** the window's destinations (coalesced runs), flush the base;
//! 4. **commit**: `num_merge_ops += window`, state byte 1, in one write inside the first 4 KiB of
//!    the COW, flush; then readers read those blocks from their own place in the base.
//!
//! A crash before (1) completes leaves all sources intact; after it, restart finds state 2 and
//! redoes the window from scratch without touching sources; after (4), the next window starts.
//! A window that is *self-safe* (no op of it writes a block any op of it reads) skips the scratch
//! copy and its two flushes even when the file has scratch: the state byte stays 1 ("in
//! progress", as the previous commit left it), so a restart — ours or Android's snapuserd —
//! redoes the window by reading its sources from the base, which the window never overwrites
//! (and later windows do not either before this one's commit is durable).
//! COWs without a scratch area (AOSP only makes them for tests, and they are not crash-safe in
//! AOSP) are merged in *self-safe* windows instead: a window ends before any op whose destination
//! is a source of an op already in the window, so replaying a window reads only untouched sources.
//! REPLACE/ZERO ops are idempotent and committed every 256 ops / 1 MiB. Writes from the writable
//! overlay are folded in last (also idempotent). With [`MergeOptions::pipeline`] a second thread
//! computes the next window (its sources and XOR payloads, nothing written) or batch (its
//! payloads decoded) while the current one goes through steps 1–4: no op reads a block an
//! earlier op writes (format §9.2 rule 2, checked before the merge), so those reads never meet
//! the writes, and payloads are never written.

use crate::error::{Result, SnapError};
use crate::io::Dev;
use crate::map::{MergeView, OpKind, Payload, StagedWindow};
use crate::precheck::{KeptUnits, PrecheckReport, precheck_keeping};
use crate::sched::IoClass;
use crate::snapshot::{Snapshot, scratch_state};
use crate::stash::{Stash, Stashed, old_or_new, reads_own_destination};
use rustc_hash::FxHashSet as HashSet;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// Largest window without a scratch area (bounded memory).
const NO_SCRATCH_WINDOW: usize = 512;
/// REPLACE/ZERO commit granularity (ops, bytes), as snapuserd.
const BATCH_OPS: usize = 256;
const BATCH_BYTES: u64 = 1 << 20;
/// The cap `snapblk merge` puts on the decoded units the pre-merge check keeps for the merge
/// ([`MergeOptions::keep_decoded`]): 64 MiB, a 256 MiB image's compressed ops in the realistic
/// benchmark (`bench/realistic-bench.sh`), or the first 16,384 blocks' worth of a larger one.
pub const KEEP_DECODED: u64 = 64 << 20;

/// A durable step of the merge, reported to [`MergeOptions::hook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeStep {
    /// Ops `[start, end)` are staged (in scratch when the file has one) and published to readers.
    Staged {
        /// Merge index of the window's first op.
        start: usize,
        /// Merge index one past its last op.
        end: usize,
    },
    /// Destinations of `[start, end)` are written and flushed, not yet committed.
    Written {
        /// Merge index of the first op written.
        start: usize,
        /// Merge index one past the last op written.
        end: usize,
    },
    /// `num_merge_ops` is now `merged`.
    Committed {
        /// The new `num_merge_ops` value in the COW header: ops `[0, merged)` are in the base.
        merged: usize,
    },
}

/// Progress report.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MergeProgress {
    /// Ops committed so far (the COW header's `num_merge_ops`).
    pub merged: usize,
    /// Ops in the merge order.
    pub total: usize,
}

/// Merge options.
#[derive(Default, Clone, Copy)]
pub struct MergeOptions<'a> {
    /// Checked between steps; when set, the merge stops at the next safe point with
    /// [`SnapError::Interrupted`].
    pub stop: Option<&'a AtomicBool>,
    /// Called after every commit.
    pub progress: Option<&'a (dyn Fn(MergeProgress) + Sync)>,
    /// Called after every durable step (tests use it to read through the device mid-merge).
    pub hook: Option<&'a (dyn Fn(MergeStep) + Sync)>,
    /// Cap on ordered ops per window (default: what the scratch area holds, or 512).
    pub max_window: Option<usize>,
    /// For a COW without scratch: the stash that makes ops reading their own destination
    /// crash-safe (see [`Stash`]); without it such ops are refused.
    pub stash: Option<&'a Stash>,
    /// Compute the next ordered window (read its sources, apply its XOR payloads) on a second
    /// thread while the current one is staged, written and committed. The durable steps and
    /// their order are the same; the merge then keeps up to two background requests in flight
    /// and its I/O order is no longer deterministic, so `snapblk merge` turns it on and a merge
    /// beside a served device (`merge=true`) leaves it off.
    pub pipeline: bool,
    /// Bytes of decoded units the pre-merge check keeps for the merge's first windows and
    /// batches, so that those payloads are decoded once instead of twice (the check must decode
    /// every payload before the first write, and the merge needs the same units again). The
    /// units are kept in merge order until the next would pass this cap, and each is freed when
    /// the merge takes it. 0 (the default) keeps none; `snapblk merge` sets
    /// [`KEEP_DECODED`]. A merge beside a served device leaves it at 0.
    pub keep_decoded: u64,
}

/// What a merge run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MergeReport {
    /// Ops in the merge order.
    pub total_ops: usize,
    /// `num_merge_ops` found at start.
    pub resumed_at: usize,
    /// Whether a window staged in scratch by an interrupted run was redone from scratch.
    pub resumed_from_scratch: bool,
    /// Whether an op stashed by an interrupted run was redone from the merge stash.
    pub resumed_from_stash: bool,
    /// Ops that read their own destination, merged through the stash.
    pub stashed_ops: usize,
    /// Windows of ordered (COPY/XOR) ops this run merged.
    pub ordered_windows: usize,
    /// Batches of REPLACE/ZERO ops this run committed (up to 256 ops or 1 MiB each).
    pub replace_batches: usize,
    /// New-image blocks this run wrote to the base for COW ops (overlay blocks not included).
    pub blocks_written: u64,
    /// Blocks written through the writable overlay that this run folded into the base.
    pub overlay_blocks: u64,
    /// Whether the COW file has a scratch area for staging ordered windows.
    pub scratch: bool,
    /// Ordered windows staged through the scratch area.
    pub scratch_windows: usize,
    /// Ordered windows merged without scratch because they are self-safe.
    pub self_safe_windows: usize,
    /// Ordered windows and REPLACE/ZERO batches computed on a second thread (sources or payloads
    /// read, decoded) while the one before them was written ([`MergeOptions::pipeline`]).
    pub computed_ahead: usize,
    /// Decoded units of compressed payloads this run took from the pre-merge check instead of
    /// decoding them again ([`MergeOptions::keep_decoded`]).
    pub units_from_check: u64,
    /// What the pre-merge check looked at, and its time.
    pub precheck: PrecheckReport,
}

/// Check the merge order is one an in-place merge can follow (format §9.2 rules 1 and 2).
pub(crate) fn validate_order(snap: &Snapshot) -> Result<()> {
    let map = &snap.map;
    if let Some(e) = map.order_error() {
        return Err(SnapError::MergeOrder(e.to_owned()));
    }
    let bs = map.block_size();
    let mut written: HashSet<u64> = HashSet::default();
    for (i, op) in map.ops()[..map.ordered_len()].iter().enumerate() {
        if let Some((s, c)) = op.source_blocks(bs) {
            for b in s..s + c {
                if written.contains(&b) {
                    return Err(SnapError::MergeOrder(format!(
                        "op {i} (new block {}) reads base block {b}, which an earlier op overwrites (format §9.2 rule 2)",
                        op.new_block
                    )));
                }
            }
        }
        if map.is_winner(i) {
            written.insert(op.new_block);
        }
    }
    Ok(())
}

/// End of the next ordered window starting at `n` (exclusive), at most `p`, for a merge with
/// window cap `max_window`. Without scratch a window ends before an op whose destination is a
/// source of the window or that reads a destination of it (a self-safe window); an op that reads
/// its own destination cannot be made self-safe and is refused. The pre-merge check runs this
/// over every window to come.
pub(crate) fn window_end(
    snap: &Snapshot,
    max_window: Option<usize>,
    stash: bool,
    n: usize,
    p: usize,
) -> Result<usize> {
    let ops = snap.map.ops();
    if let Some(sc) = snap.layout.scratch() {
        let cap = max_window.unwrap_or(sc.slots).clamp(1, sc.slots);
        return Ok(p.min(n + cap));
    }
    let cap = max_window.unwrap_or(NO_SCRATCH_WINDOW).max(1);
    let bs = snap.map.block_size();
    let mut srcs: HashSet<u64> = HashSet::default();
    let mut dsts: HashSet<u64> = HashSet::default();
    let mut j = n;
    while j < p && j - n < cap {
        let op = &ops[j];
        let (s, c) = op.source_blocks(bs).unwrap_or((op.new_block, 0));
        let d = op.new_block;
        if reads_own_destination(op, bs) {
            if j > n {
                break;
            }
            if stash {
                // A window of its own, journaled in the stash.
                return Ok(n + 1);
            }
            return Err(SnapError::MergeOrder(format!(
                "op {j} (XOR into block {d}) reads its own destination; merging it crash-safely needs a scratch area, which this COW does not have (give a stash file: merge --stash FILE)"
            )));
        }
        if srcs.contains(&d) || (s..s + c).any(|b| dsts.contains(&b)) {
            break;
        }
        srcs.extend(s..s + c);
        dsts.insert(d);
        j += 1;
    }
    Ok(j)
}

/// End of the REPLACE/ZERO batch starting at op `n`: up to [`BATCH_OPS`] ops or
/// [`BATCH_BYTES`] bytes, at most `total`.
pub(crate) fn batch_end(snap: &Snapshot, n: usize, total: usize) -> usize {
    let ops = snap.map.ops();
    let bs = snap.map.block_size();
    let mut end = n;
    let mut bytes = 0u64;
    while end < total && end - n < BATCH_OPS && bytes < BATCH_BYTES {
        bytes += ops[end].blocks() * bs;
        end += 1;
    }
    end
}

/// The new contents of the REPLACE/ZERO ops `[n, end)`: `(block, offset in buf)` for every
/// block these ops own (the map's last op for it), in op order, and the data in `buf`.
pub(crate) fn compute_batch(
    snap: &Snapshot,
    n: usize,
    end: usize,
    payloads: &mut Prefetched,
    blocks: &mut Vec<(u64, usize)>,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let ops = snap.map.ops();
    let bs = snap.map.block_size();
    let bsu = bs as usize;
    payloads.load(
        snap,
        ops[n..end].iter().filter_map(|o| match o.kind {
            OpKind::Replace { payload, .. } => Some(payload),
            _ => None,
        }),
    )?;
    blocks.clear();
    buf.clear();
    let mut unit = Vec::new();
    for (i, op) in ops.iter().enumerate().take(end).skip(n) {
        let owned: Vec<u64> = (op.new_block..op.new_block + op.blocks())
            .filter(|&b| snap.map.lookup(b) == Some(i))
            .collect();
        if owned.is_empty() {
            continue;
        }
        match op.kind {
            OpKind::Zero => {
                for b in owned {
                    blocks.push((b, buf.len()));
                    buf.resize(buf.len() + bsu, 0);
                }
            }
            OpKind::Replace { payload, .. } => {
                // Decoded straight from the prefetched bytes (or taken from the pre-merge
                // check); the merge reads each unit once, so it keeps no cache copy.
                let u = payloads.decode_unit(snap, i, &payload, &mut unit)?;
                let u = u.bytes();
                for b in owned {
                    let at = ((b - op.new_block) * bs) as usize;
                    let src = u.get(at..at + bsu).ok_or(SnapError::PayloadShort {
                        offset: payload.offset,
                        len: u.len() as u32,
                        unit: (at + bsu) as u32,
                    })?;
                    blocks.push((b, buf.len()));
                    buf.extend_from_slice(src);
                }
            }
            // Rule 1 was checked: no ordered op after the prefix.
            OpKind::Copy { .. } | OpKind::Xor { .. } => {
                return Err(SnapError::MergeOrder(
                    "ordered op after the ordered prefix".into(),
                ));
            }
        }
    }
    Ok(())
}

struct Merger<'a> {
    snap: &'a Snapshot,
    opts: MergeOptions<'a>,
    report: MergeReport,
    /// The previous window's buffer, reused when no reader holds it any more (saves allocating
    /// and zeroing a window's worth of memory per window).
    spare: Vec<u8>,
    /// Stored payload bytes of the current window or batch, read with one I/O
    /// ([`Prefetched::load`]).
    payloads: Prefetched,
    /// Decoded units the pre-merge check kept for this merge.
    kept: Option<Arc<KeptUnits>>,
}

/// Stored bytes of the COW from `start`, holding the payloads of a window or batch.
#[derive(Default)]
pub(crate) struct Prefetched {
    start: u64,
    data: Vec<u8>,
    /// Decoded units shared between the pre-merge check and the merge ([`KeptUnits`]): the
    /// check fills them, the merge takes them.
    kept: Option<(Arc<KeptUnits>, Keep)>,
}

/// What [`Prefetched::decode_unit`] does with [`KeptUnits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Keep a copy of each unit decoded (the pre-merge check).
    Fill,
    /// Take a kept unit instead of decoding it (the merge).
    Take,
}

impl Prefetched {
    /// No payloads read yet; decoded units go to or come from `kept` as `mode` says.
    pub(crate) fn with_kept(kept: Option<Arc<KeptUnits>>, mode: Keep) -> Self {
        Prefetched {
            kept: kept.map(|k| (k, mode)),
            ..Default::default()
        }
    }

    /// The stored bytes of `p`, if they were prefetched.
    fn get(&self, p: &Payload) -> Option<&[u8]> {
        let at = usize::try_from(p.offset.checked_sub(self.start)?).ok()?;
        self.data.get(at..at.checked_add(p.stored_len as usize)?)
    }

    /// Read the stored bytes of `pays` with one I/O when they lie close together in the COW (a
    /// writer stores an op range's payloads back to back): one read instead of one per op. The
    /// merge skips the payloads whose units the pre-merge check kept.
    fn load(&mut self, snap: &Snapshot, pays: impl Iterator<Item = Payload>) -> Result<()> {
        let (mut lo, mut hi, mut sum) = (u64::MAX, 0u64, 0u64);
        for p in pays {
            if let Some((k, Keep::Take)) = &self.kept
                && k.holds(&p)
            {
                continue;
            }
            lo = lo.min(p.offset);
            hi = hi.max(p.offset.saturating_add(p.stored_len as u64));
            sum += p.stored_len as u64;
        }
        self.data.clear();
        if lo >= hi || hi - lo > PREFETCH_MAX || hi - lo > 2 * sum + (64 << 10) {
            return Ok(());
        }
        self.start = lo;
        self.data.resize((hi - lo) as usize, 0);
        snap.io.read(IoClass::Merge, Dev::Cow, lo, &mut self.data)
    }

    /// The unit of payload `p` of op `op` (merge index), decoded from the prefetched bytes when
    /// they are there, else read from the COW: into `out` (resized to one unit), or, for a unit
    /// the check keeps, into a buffer of its own shared with the kept units (no copy); for the
    /// merge, the unit the pre-merge check kept.
    fn decode_unit<'b>(
        &self,
        snap: &Snapshot,
        op: usize,
        p: &Payload,
        out: &'b mut Vec<u8>,
    ) -> Result<Unit<'b>> {
        match &self.kept {
            Some((k, Keep::Take)) => {
                if let Some(u) = k.take(op, p) {
                    return Ok(Unit::Kept(u));
                }
            }
            Some((k, Keep::Fill)) if k.wants(op, p) => {
                let mut u = vec![0u8; p.unit_len as usize];
                self.decode_raw(snap, p, &mut u)?;
                let u = Arc::new(u);
                k.put(p, u.clone());
                return Ok(Unit::Kept(u));
            }
            _ => {}
        }
        out.resize(p.unit_len as usize, 0);
        self.decode_raw(snap, p, out)?;
        Ok(Unit::Buf(out))
    }

    /// Decode payload `p` into `out` (one unit), from the prefetched bytes when they are there.
    fn decode_raw(&self, snap: &Snapshot, p: &Payload, out: &mut [u8]) -> Result<()> {
        match self.get(p) {
            Some(src) => snap.decode_stored(p, src, out),
            None => snap.decode_into(IoClass::Merge, p, out),
        }
    }
}

/// A decoded unit ([`Prefetched::decode_unit`]): in the caller's buffer, or shared with the
/// units the pre-merge check keeps.
enum Unit<'b> {
    Buf(&'b [u8]),
    Kept(Arc<Vec<u8>>),
}

impl Unit<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Unit::Buf(b) => b,
            Unit::Kept(u) => u,
        }
    }
}

/// The new contents of a unit of work: an ordered window (`data`, one block per op) or a
/// REPLACE/ZERO batch (`blocks`: block and its offset in `data`).
struct Computed {
    data: Vec<u8>,
    blocks: Vec<(u64, usize)>,
}

impl Computed {
    /// Compute the ops `[a, e)`: a window when they are ordered ops, else a batch.
    fn compute(
        &mut self,
        snap: &Snapshot,
        a: usize,
        e: usize,
        pays: &mut Prefetched,
    ) -> Result<()> {
        if a < snap.map.ordered_len() {
            self.blocks.clear();
            compute_window(snap, a, e, &mut self.data, pays)
        } else {
            compute_batch(snap, a, e, pays, &mut self.blocks, &mut self.data)
        }
    }
}

/// Whether the unit `[a, e)` is worth computing on the second thread: a REPLACE/ZERO batch or a
/// window with an XOR op has decoding to overlap with the writes before it; a window of COPY ops
/// only is a memory copy, which measured faster on the merging thread itself (the worst-case
/// merge of bench/snapshot-bench.sh, every window through scratch: 0.70x of a sequential copy
/// computed ahead, 0.84-0.93x here).
fn worth_computing_ahead(snap: &Snapshot, a: usize, e: usize) -> bool {
    a >= snap.map.ordered_len()
        || snap.map.ops()[a..e]
            .iter()
            .any(|o| !matches!(o.kind, OpKind::Copy { .. }))
}

/// The new contents of the ordered ops `[n, end)` (one block each, in op order) into `data`:
/// their sources read from the base (coalesced runs) and XOR payloads applied. Reads only base
/// blocks no earlier op writes (format §9.2 rule 2, checked before the merge), so it may run
/// while the previous window's destinations are being written.
pub(crate) fn compute_window(
    snap: &Snapshot,
    n: usize,
    end: usize,
    data: &mut Vec<u8>,
    payloads: &mut Prefetched,
) -> Result<()> {
    let ops = snap.map.ops();
    let bs = snap.map.block_size();
    let bsu = bs as usize;
    // Every byte is overwritten below (sources are read over the whole window).
    data.resize((end - n) * bsu, 0);
    let src_of = |k: usize| match ops[k].kind {
        OpKind::Copy { src } => src * bs,
        OpKind::Xor { src_byte, .. } => src_byte,
        _ => u64::MAX,
    };
    let mut k = n;
    while k < end {
        let mut j = k + 1;
        while j < end && src_of(j) == src_of(j - 1).wrapping_add(bs) {
            j += 1;
        }
        let slot = (k - n) * bsu;
        snap.io.read(
            IoClass::Merge,
            Dev::Base,
            src_of(k),
            &mut data[slot..slot + (j - k) * bsu],
        )?;
        k = j;
    }
    payloads.load(
        snap,
        ops[n..end].iter().filter_map(|o| match o.kind {
            OpKind::Xor { payload, .. } => Some(payload),
            _ => None,
        }),
    )?;
    let mut delta = Vec::new();
    for (i, op) in ops[n..end].iter().enumerate() {
        if let OpKind::Xor { payload, .. } = op.kind {
            let slot = i * bsu;
            let u = payloads.decode_unit(snap, n + i, &payload, &mut delta)?;
            for (d, x) in data[slot..slot + bsu].iter_mut().zip(u.bytes()) {
                *d ^= x;
            }
        }
    }
    Ok(())
}

/// Largest read that prefetches a window's or batch's payloads.
const PREFETCH_MAX: u64 = 4 << 20;

/// Merge `snap`'s COW into its base, resuming from the persisted progress.
///
/// Before its first write (of this run) it runs the pre-merge check ([`precheck`](crate::precheck()))
/// over the ops still to merge: bounds, every payload decoded, the merge order, the windows of a
/// COW without scratch. A refusal leaves base and COW as they were. Up to
/// [`MergeOptions::keep_decoded`] bytes of the units the check decodes are kept for the merge.
pub fn merge(snap: &Snapshot, opts: MergeOptions<'_>) -> Result<MergeReport> {
    if let Some(stash) = opts.stash {
        snap.attach_stash(stash)?;
    }
    let (pre, kept) = precheck_keeping(snap, &opts, opts.keep_decoded)?;
    let (merged, staged) = {
        let v = snap.lock_view();
        (v.merged, v.staged.clone())
    };
    crate::reserve::reserve_for_merge(snap, merged)?;
    if let Some(stash) = opts.stash
        && snap.layout.scratch().is_none()
    {
        // Before the first write: a later run can then tell a lost stash from none.
        stash.create(snap.map.ops(), snap.map.block_size())?;
    }
    let mut m = Merger {
        snap,
        opts,
        report: MergeReport {
            total_ops: snap.map.ops().len(),
            resumed_at: merged,
            scratch: snap.layout.scratch().is_some(),
            precheck: pre,
            ..Default::default()
        },
        spare: Vec::new(),
        payloads: Prefetched::with_kept(kept.clone(), Keep::Take),
        kept,
    };
    let mut n = merged;
    if staged.is_none() && snap.persisted().state == Some(scratch_state::DONE) {
        // A commit whose state byte store was lost (see Snapshot::open): finish it first, or
        // a self-safe next window (which leaves the state byte alone) would leave a "done"
        // byte over entries whose data was never written.
        m.write_progress(merged, Some(scratch_state::IN_PROGRESS))?;
    }
    if let Some(w) = staged {
        // Interrupted after staging (in scratch, or in the stash for a COW without scratch):
        // redo the window from the staged copy (sources may be gone).
        if m.report.scratch {
            m.report.resumed_from_scratch = true;
        } else {
            m.report.resumed_from_stash = true;
        }
        m.write_window(&w)?;
        m.commit(w.end)?;
        n = w.end;
    }
    m.merge_ops(n)?;
    m.report.units_from_check = m.kept.as_ref().map_or(0, |k| k.taken());
    m.fold_overlay()?;
    Ok(m.report)
}

impl Merger<'_> {
    fn check_stop(&self) -> Result<()> {
        if self.opts.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(SnapError::Interrupted);
        }
        Ok(())
    }

    fn hook(&self, s: MergeStep) {
        if let Some(h) = self.opts.hook {
            h(s);
        }
    }

    fn bs(&self) -> u64 {
        self.snap.map.block_size()
    }

    fn window_end(&self, n: usize, p: usize) -> Result<usize> {
        window_end(
            self.snap,
            self.opts.max_window,
            self.opts.stash.is_some(),
            n,
            p,
        )
    }

    /// The ordered windows, then the REPLACE/ZERO batches, from op `n` on; returns the number
    /// of ops. While a window or batch is staged, written and committed, a second thread
    /// computes the next one ([`compute_window`]: reads of its sources and XOR decoding;
    /// [`compute_batch`]: reads and decoding of its payloads; nothing written), so reading and
    /// writing use both cores. The durable steps keep their order; only reads move earlier.
    fn merge_ops(&mut self, mut n: usize) -> Result<usize> {
        let snap = self.snap;
        let p = snap.map.ordered_len();
        let total = snap.map.ops().len();
        if n >= total {
            return Ok(n);
        }
        // The unit of work at op `a`: an ordered window or a REPLACE/ZERO batch.
        let unit_end = |m: &Self, a: usize| {
            if a < p {
                m.window_end(a, p)
            } else {
                Ok(batch_end(snap, a, total))
            }
        };
        std::thread::scope(|sc| {
            // One unit computed ahead at most: requests (start, end, buffers), results.
            let (req_tx, req_rx) = mpsc::sync_channel::<(usize, usize, Computed)>(1);
            let (res_tx, res_rx) = mpsc::sync_channel::<(usize, usize, Result<Computed>)>(1);
            let kept = self.kept.clone();
            let worker = move || {
                let mut payloads = Prefetched::with_kept(kept, Keep::Take);
                for (a, e, mut c) in req_rx {
                    let r = c.compute(snap, a, e, &mut payloads).map(|()| c);
                    if res_tx.send((a, e, r)).is_err() {
                        break;
                    }
                }
            };
            let started = self.opts.pipeline
                && std::thread::Builder::new()
                    .name("snap-merge-read".into())
                    .spawn_scoped(sc, worker)
                    .is_ok();
            // Without a second thread, every unit is computed here.
            let req_tx = started.then_some(req_tx);
            let mut ahead: Option<(usize, usize)> = None;
            while n < total {
                self.check_stop()?;
                let got = ahead
                    .take()
                    .and_then(|at| res_rx.recv().ok().filter(|(a, e, _)| (*a, *e) == at));
                let (end, c) = match got {
                    Some((_, e, r)) => (e, r?),
                    // Not handed out, or the second thread is gone: compute it here.
                    None => {
                        let end = unit_end(self, n)?;
                        let mut c = Computed {
                            data: std::mem::take(&mut self.spare),
                            blocks: Vec::new(),
                        };
                        c.compute(snap, n, end, &mut self.payloads)?;
                        (end, c)
                    }
                };
                // Hand the next unit to the second thread before writing this one. An op that
                // reads its own destination (a stash window) is computed when its turn comes,
                // after this window's commit.
                if let Some(tx) = &req_tx
                    && end < total
                    && !(end < p && self.stashed_window(end))
                    && let e = unit_end(self, end)?
                    && worth_computing_ahead(snap, end, e)
                {
                    let next = Computed {
                        data: std::mem::take(&mut self.spare),
                        blocks: Vec::new(),
                    };
                    if tx.send((end, e, next)).is_ok() {
                        ahead = Some((end, e));
                        self.report.computed_ahead += 1;
                    }
                }
                if n < p {
                    let w = self.stage(n, end, c.data)?;
                    self.publish_staged(&w);
                    self.write_window(&w)?;
                    self.commit(w.end)?;
                    self.report.ordered_windows += 1;
                    if let Ok(buf) = Arc::try_unwrap(w.data) {
                        self.spare = buf;
                    }
                } else {
                    self.write_runs(&c.blocks, &c.data)?;
                    self.snap.io.flush(IoClass::Merge, Dev::Base)?;
                    self.hook(MergeStep::Written { start: n, end });
                    self.commit(end)?;
                    self.report.replace_batches += 1;
                    self.spare = c.data;
                }
                n = end;
            }
            Ok(n)
        })
    }

    /// Whether the window at op `n` is one op journaled in the stash (it reads its own
    /// destination; [`window_end`]).
    fn stashed_window(&self, n: usize) -> bool {
        self.opts.stash.is_some()
            && self.snap.layout.scratch().is_none()
            && reads_own_destination(&self.snap.map.ops()[n], self.bs())
    }

    /// Whether no op of `[n, end)` writes a block that an op of `[n, end)` reads, so the window
    /// can be redone from the base alone after a crash in the middle of its writes.
    fn self_safe(&self, n: usize, end: usize) -> bool {
        let ops = &self.snap.map.ops()[n..end];
        let bs = self.bs();
        let dsts: HashSet<u64> = ops.iter().map(|o| o.new_block).collect();
        ops.iter().all(|o| {
            let (s, c) = o.source_blocks(bs).unwrap_or((0, 0));
            (s..s + c).all(|b| !dsts.contains(&b))
        })
    }

    /// Step 1: persist the computed results `data` of ops `[n, end)` ([`compute_window`]) to
    /// scratch unless the window is self-safe (or, for an op reading its own destination, to
    /// the stash).
    fn stage(&mut self, n: usize, end: usize, data: Vec<u8>) -> Result<StagedWindow> {
        let ops = self.snap.map.ops();
        let bs = self.bs();
        let bsu = bs as usize;
        if let Some(stash) = self.opts.stash
            && self.snap.layout.scratch().is_none()
            && reads_own_destination(&ops[n], bs)
        {
            // A window of one op (window_end): journal the destination's old and new contents
            // before the base is written.
            let mut old = vec![0u8; bsu];
            self.snap
                .io
                .read(IoClass::Merge, Dev::Base, ops[n].new_block * bs, &mut old)?;
            let w = Stashed {
                index: n,
                new_block: ops[n].new_block,
                old,
                new: data[..bsu].to_vec(),
            };
            stash.save(ops, bs, &w)?;
            self.report.stashed_ops += 1;
        }
        if let Some(sc) = self.snap.layout.scratch() {
            let mut meta = vec![0u8; (end - n + 1) * 16];
            for (i, k) in (n..end).enumerate() {
                meta[i * 16..i * 16 + 8].copy_from_slice(&ops[k].new_block.to_le_bytes());
                let off = sc.base + sc.meta_len + i as u64 * bs;
                meta[i * 16 + 8..i * 16 + 16].copy_from_slice(&off.to_le_bytes());
            }
            let io = &self.snap.io;
            // The entries are written either way (a few KiB), so the COW ends up with the same
            // scratch metadata AOSP's snapuserd leaves; for a self-safe window they are never
            // marked valid (the state byte stays 1), so they need no flush.
            io.write(IoClass::Merge, Dev::Cow, sc.base + 1, &meta)?;
            if self.self_safe(n, end) {
                self.report.self_safe_windows += 1;
            } else {
                self.report.scratch_windows += 1;
                io.write(IoClass::Merge, Dev::Cow, sc.base + sc.meta_len, &data)?;
                io.flush(IoClass::Merge, Dev::Cow)?;
                self.write_progress(n, Some(scratch_state::DONE))?;
            }
        }
        Ok(StagedWindow {
            start: n,
            end,
            data: Arc::new(data),
        })
    }

    /// Step 2: readers of the window's blocks switch to the staged copy; taking the write lock
    /// waits for source reads in flight.
    fn publish_staged(&self, w: &StagedWindow) {
        self.snap.set_view(|v| {
            *v = MergeView {
                merged: w.start,
                staged: Some(w.clone()),
            }
        });
        self.hook(MergeStep::Staged {
            start: w.start,
            end: w.end,
        });
    }

    /// Step 3: write the window's destinations (winners only), coalescing consecutive blocks.
    fn write_window(&mut self, w: &StagedWindow) -> Result<()> {
        let ops = self.snap.map.ops();
        let bsu = self.bs() as usize;
        let mut k = w.start;
        while k < w.end {
            if !self.snap.map.is_winner(k) {
                k += 1;
                continue;
            }
            let mut j = k + 1;
            while j < w.end
                && self.snap.map.is_winner(j)
                && ops[j].new_block == ops[j - 1].new_block + 1
            {
                j += 1;
            }
            let slot = (k - w.start) * bsu;
            let buf = &w.data[slot..slot + (j - k) * bsu];
            self.snap
                .io
                .write(IoClass::Merge, Dev::Base, ops[k].new_block * self.bs(), buf)?;
            self.report.blocks_written += (j - k) as u64;
            k = j;
        }
        self.snap.io.flush(IoClass::Merge, Dev::Base)?;
        self.hook(MergeStep::Written {
            start: w.start,
            end: w.end,
        });
        Ok(())
    }

    /// Persist `num_merge_ops = n` (and the state byte) with one write in the first 4 KiB.
    fn write_progress(&self, n: usize, state: Option<u8>) -> Result<()> {
        self.snap.write_merge_progress(n, state)
    }

    /// Step 4: commit and let readers use the base for ops `< merged`.
    fn commit(&mut self, merged: usize) -> Result<()> {
        self.write_progress(merged, Some(scratch_state::IN_PROGRESS))?;
        self.snap.set_view(|v| {
            *v = MergeView {
                merged,
                staged: None,
            }
        });
        self.hook(MergeStep::Committed { merged });
        if let Some(p) = self.opts.progress {
            p(MergeProgress {
                merged,
                total: self.snap.map.ops().len(),
            });
        }
        Ok(())
    }

    /// Write (block, offset-in-buf) pairs, one I/O per run of consecutive blocks and buffer slots.
    fn write_runs(&mut self, blocks: &[(u64, usize)], buf: &[u8]) -> Result<()> {
        let bs = self.bs();
        let bsu = bs as usize;
        let mut k = 0;
        while k < blocks.len() {
            let mut j = k + 1;
            while j < blocks.len()
                && blocks[j].0 == blocks[j - 1].0 + 1
                && blocks[j].1 == blocks[j - 1].1 + bsu
            {
                j += 1;
            }
            let at = blocks[k].1;
            self.snap.io.write(
                IoClass::Merge,
                Dev::Base,
                blocks[k].0 * bs,
                &buf[at..at + (j - k) * bsu],
            )?;
            self.report.blocks_written += (j - k) as u64;
            k = j;
        }
        Ok(())
    }

    /// Apply the writable overlay's blocks to the base (idempotent; done after the COW's ops).
    fn fold_overlay(&mut self) -> Result<()> {
        let Some(ov) = &self.snap.overlay else {
            return Ok(());
        };
        let all = ov.blocks();
        if all.is_empty() {
            return Ok(());
        }
        let bs = self.bs();
        for chunk in all.chunks(256) {
            let mut blocks = Vec::with_capacity(chunk.len());
            let mut buf = vec![0u8; chunk.len() * bs as usize];
            for (i, &(b, off)) in chunk.iter().enumerate() {
                self.snap.io.read(
                    IoClass::Merge,
                    Dev::Cow,
                    off,
                    &mut buf[i * bs as usize..(i + 1) * bs as usize],
                )?;
                blocks.push((b, i * bs as usize));
            }
            self.write_runs(&blocks, &buf)?;
            self.report.overlay_blocks += chunk.len() as u64;
        }
        self.snap.io.flush(IoClass::Merge, Dev::Base)
    }
}

impl Snapshot {
    /// For a COW without scratch merged with a stash: publish the op an interrupted run
    /// stashed (the one at `num_merge_ops`, whose source its own write may have destroyed), so
    /// reads see the new image before the merge resumes; the merge then writes it from the
    /// stash. Checks the stash against the base first: the op's destination must hold, sector by
    /// sector, its old or its new contents. A stash that does not exist while the merge stopped
    /// at such an op is refused, unless a COW record is attached or the stash says the caller
    /// checks the whole new image ([`Stash::with_verified_view`]). Returns whether a stashed op
    /// was found. [`merge`] calls this.
    pub fn attach_stash(&self, stash: &Stash) -> Result<bool> {
        let merged = {
            let v = self.lock_view();
            if v.staged.is_some() || self.layout.scratch().is_some() {
                return Ok(false);
            }
            v.merged
        };
        stash.check_place()?;
        let in_flight = self.in_flight.load(Ordering::Relaxed) != u64::MAX;
        if !stash.exists()? {
            // The merge creates its stash before it first writes the base: none here means no
            // merge with this stash has run, or the stash is gone.
            if in_flight && self.verifier().is_none() && !stash.view_verified() {
                return Err(stash.err(format!(
                    "does not exist, but the merge stopped at op {merged}, which reads its own destination: if it was being written, its source is gone and only the stash that merge used has the block (give that stash, or check the result with a COW record or --expect-sha256)"
                )));
            }
            // A record or the caller's digest checks that block before anything is written.
            self.in_flight.store(u64::MAX, Ordering::Relaxed);
            return Ok(false);
        }
        let bs = self.map.block_size();
        let w = match stash.load(self.map.ops(), bs)? {
            // A stash for an op already committed is spent; an empty or torn one was never
            // synced with this op in it: either way the base was not written for the next op.
            Some(w) if w.index == merged => w,
            _ => {
                self.in_flight.store(u64::MAX, Ordering::Relaxed);
                return Ok(false);
            }
        };
        let mut cur = vec![0u8; bs as usize];
        self.io
            .read(IoClass::Merge, Dev::Base, w.new_block * bs, &mut cur)?;
        if !old_or_new(&cur, &w.old, &w.new) {
            return Err(stash.err(format!(
                "block {} of the base holds neither the old nor the new contents the stash recorded for op {merged}: the stash belongs to another base or merge",
                w.new_block
            )));
        }
        self.set_view(|v| {
            if v.merged == merged && v.staged.is_none() {
                *v = MergeView {
                    merged,
                    staged: Some(StagedWindow {
                        start: merged,
                        end: merged + 1,
                        data: Arc::new(w.new),
                    }),
                };
            }
        });
        self.in_flight.store(u64::MAX, Ordering::Relaxed);
        Ok(true)
    }
}
