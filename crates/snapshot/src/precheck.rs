//! The pre-merge check: everything a merge could fail on because of what the COW or the base
//! holds, proven before the merge's first write (issue 19, item 4).
//!
//! [`merge`](crate::merge::merge) runs it itself, so `snapblk merge`, `serve --merge` and the
//! driver's `merge=true` all get it; `snapblk merge --check` runs the same function. Over the ops
//! the merge has still to carry out (all of them for a merge that has not started; for a resumed
//! one, those after `num_merge_ops` and after a window staged in scratch, which is redone from
//! its staged copy):
//!
//! * **bounds**: every op's destination lies inside the device, every COPY/XOR source inside the
//!   base, every payload inside the COW, and every payload's unit covers its op's blocks;
//! * **payloads**: every compressed payload is read and decoded, on up to [`MAX_THREADS`]
//!   threads; raw payloads need no decoding (their bounds are checked). The units decoded are
//!   discarded, except that for a merge up to [`MergeOptions::keep_decoded`] bytes of them, the
//!   first in merge order, are kept for the merge ([`KeptUnits`]), which then does not decode
//!   them again;
//! * **order**: the merge order follows format §9.2 rules 1 and 2 ([`validate_order`]);
//! * **windows**: for a COW without scratch, the windows the merge will use are computed exactly
//!   as it will compute them; an XOR/COPY op that reads its own destination cannot be made part
//!   of a self-safe window and is refused (a crash in the middle of its write would leave a
//!   block that can be neither redone nor served).
//!
//! What it cannot prove: that the base is the right one, that a payload decodes to the *right*
//! bytes (the COW format has no checksums), and that the devices take the writes (I/O errors).

use crate::error::{Result, SnapError};
use crate::io::Dev;
use crate::map::{Codec, OpKind, Payload};
use crate::merge::{
    Keep, MergeOptions, Prefetched, batch_end, compute_batch, compute_window, validate_order,
    window_end,
};
use crate::sched::IoClass;
use crate::snapshot::{Snapshot, check_payload_len};
use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;
use snapblk_core::sync::{into_inner, lock};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Most decoding threads the check uses.
pub(crate) const MAX_THREADS: usize = 4;
/// Payloads per unit of work handed to a decoding thread.
const CHUNK: usize = 256;
/// Ordered ops per unit of work of the record check (a 2 MiB window's worth of 4 KiB blocks).
const ORDERED_CHUNK: usize = 512;
/// Largest single read of back-to-back payloads.
const RUN_BYTES: u64 = 4 << 20;

/// What the pre-merge check looked at.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PrecheckReport {
    /// First op of the merge order still to merge (ops before it are in the base already).
    pub from_op: usize,
    /// Ops of the merge order.
    pub total_ops: usize,
    /// Ops still to merge, each bounds-checked.
    pub ops_checked: usize,
    /// Device size in blocks (destinations are checked against it).
    pub device_blocks: u64,
    /// Base size in bytes (sources are checked against it).
    pub base_bytes: u64,
    /// Compressed payloads read and decoded.
    pub payloads_decoded: u64,
    /// Their stored bytes.
    pub payload_bytes: u64,
    /// Bytes they decoded to.
    pub decoded_bytes: u64,
    /// Raw payloads (bounds-checked; nothing to decode).
    pub raw_payloads: u64,
    /// Whether the merge order follows rules 1 and 2 (always true in a successful report).
    pub order_valid: bool,
    /// Whether the COW has a scratch area.
    pub scratch: bool,
    /// Ordered windows computed for a COW without scratch (0 with scratch).
    pub self_safe_windows: usize,
    /// Decoding threads used.
    pub threads: usize,
    /// Decoded units kept for the merge's first windows and batches
    /// ([`MergeOptions::keep_decoded`]; 0 for `snapblk merge --check`).
    pub kept_units: u64,
    /// Their bytes (at most [`MergeOptions::keep_decoded`]).
    pub kept_bytes: u64,
    /// With a COW record: what the base is (see `snapblk_cow::record::MergeVerdict`).
    pub record: Option<snapblk_cow::record::MergeVerdict>,
    /// Base blocks checked against the record's digests.
    pub record_base_blocks: u64,
    /// Blocks of the new image still to merge, read and checked against the record.
    pub record_new_blocks: u64,
    /// Time the check took.
    pub seconds: f64,
}

/// Decoded units of compressed payloads that the pre-merge check decodes anyway, kept for the
/// merge's first windows and batches (the ops before [`KeptUnits::until`], whose units fit in
/// [`MergeOptions::keep_decoded`]) so that the merge does not decode them a second time. Keyed by
/// payload offset, each unit beside the whole payload it was decoded from: two ops may name the
/// same offset with different payloads (a v2 REPLACE gives its offset itself), and a unit goes
/// only to its own payload. The merge takes each unit out when it needs it, which frees it.
pub(crate) struct KeptUnits {
    /// Ops of the merge order before this index have their compressed payload's unit kept.
    until: usize,
    units: Mutex<HashMap<u64, (Payload, KeptUnit)>>,
    /// Units the merge took.
    taken: AtomicU64,
}

/// One kept unit, shared with the computation that decoded it.
type KeptUnit = Arc<Vec<u8>>;

impl KeptUnits {
    /// Whether the unit of payload `p` of op `op` is one to keep (the check decodes it into a
    /// buffer of its own and [`put`](Self::put)s it).
    pub(crate) fn wants(&self, op: usize, p: &Payload) -> bool {
        op < self.until && p.codec != Codec::None
    }

    /// Keep `unit`, payload `p` decoded (one the check [`wants`](Self::wants)).
    pub(crate) fn put(&self, p: &Payload, unit: Arc<Vec<u8>>) {
        lock(&self.units).entry(p.offset).or_insert((*p, unit));
    }

    /// The kept unit of payload `p` of op `op`, taken out (the merge needs each once).
    pub(crate) fn take(&self, op: usize, p: &Payload) -> Option<Arc<Vec<u8>>> {
        if op >= self.until {
            return None;
        }
        let u = {
            let mut units = lock(&self.units);
            if units.get(&p.offset).is_none_or(|(q, _)| q != p) {
                return None;
            }
            units.remove(&p.offset)?.1
        };
        if u.len() != p.unit_len as usize {
            return None;
        }
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(u)
    }

    /// Whether the unit of payload `p` is kept (and not taken yet).
    pub(crate) fn holds(&self, p: &Payload) -> bool {
        lock(&self.units)
            .get(&p.offset)
            .is_some_and(|(q, _)| q == p)
    }

    /// Units the merge took so far.
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
}

/// Run the pre-merge check for a merge of `snap` with `opts` (only `max_window` matters).
pub fn precheck(snap: &Snapshot, opts: &MergeOptions<'_>) -> Result<PrecheckReport> {
    precheck_keeping(snap, opts, 0).map(|(rep, _)| rep)
}

/// [`precheck`], keeping up to `keep` bytes of the units it decodes for the merge's first
/// windows and batches ([`KeptUnits`]; `None` when it keeps none).
pub(crate) fn precheck_keeping(
    snap: &Snapshot,
    opts: &MergeOptions<'_>,
    keep: u64,
) -> Result<(PrecheckReport, Option<Arc<KeptUnits>>)> {
    let t0 = Instant::now();
    let map = &snap.map;
    let bs = map.block_size();
    let total = map.ops().len();
    let from = {
        let v = snap.lock_view();
        v.staged.as_ref().map_or(v.merged, |w| w.end.max(v.merged))
    };
    let base_bytes = snap.io.base.size().map_err(SnapError::io("sizing base"))?;
    let cow_bytes = snap.io.cow.size().map_err(SnapError::io("sizing COW"))?;
    let device_blocks = map.capacity() / bs;
    let mut rep = PrecheckReport {
        from_op: from.min(total),
        total_ops: total,
        device_blocks,
        base_bytes,
        scratch: snap.layout.scratch().is_some(),
        ..Default::default()
    };
    // Rules 1 and 2 first: an order error is the most basic refusal.
    validate_order(snap)?;
    rep.order_valid = true;

    // Bounds of every op still to merge; the compressed payloads are collected for decoding.
    let base_blocks = base_bytes / bs;
    let mut compressed: Vec<(usize, Payload)> = Vec::new();
    for (i, op) in map.ops().iter().enumerate().skip(from) {
        let oob = |reason: String| SnapError::OpOutOfBounds {
            op: i,
            block: op.new_block,
            reason,
        };
        let end = op.new_block.checked_add(op.blocks());
        if end.is_none_or(|e| e > device_blocks) {
            return Err(oob(format!(
                "writes past the device end ({device_blocks} blocks)"
            )));
        }
        if let Some((s, c)) = op.source_blocks(bs)
            && s.checked_add(c).is_none_or(|e| e > base_blocks)
        {
            return Err(oob(format!(
                "reads base block {} past the base end ({base_blocks} blocks)",
                s.saturating_add(c - 1)
            )));
        }
        if let OpKind::Xor { src_byte, .. } = op.kind
            && src_byte.checked_add(bs).is_none_or(|e| e > base_bytes)
        {
            return Err(oob(format!(
                "reads base bytes at {src_byte} past the base end ({base_bytes} bytes)"
            )));
        }
        let (payload, need) = match op.kind {
            OpKind::Xor { payload, .. } => (payload, bs),
            OpKind::Replace { payload, .. } => (payload, op.blocks() * bs),
            _ => continue,
        };
        if u64::from(payload.unit_len) < need {
            return Err(oob(format!(
                "its payload decodes to {} bytes, the op needs {need}",
                payload.unit_len
            )));
        }
        if payload
            .offset
            .checked_add(u64::from(payload.stored_len))
            .is_none_or(|e| e > cow_bytes)
        {
            return Err(oob(format!(
                "payload at COW offset {} ({} bytes) runs past the COW end ({cow_bytes} bytes)",
                payload.offset, payload.stored_len
            )));
        }
        check_payload_len(&payload)?;
        if payload.codec == Codec::None {
            rep.raw_payloads += 1;
        } else {
            compressed.push((i, payload));
        }
    }
    rep.ops_checked = total.saturating_sub(from);

    // The compressed payloads, in merge order, whose units fit in `keep`.
    let mut left = keep;
    let mut until = from;
    for (i, p) in &compressed {
        let Some(l) = left.checked_sub(u64::from(p.unit_len)) else {
            break;
        };
        left = l;
        until = i + 1;
    }
    let kept = (until > from).then(|| {
        Arc::new(KeptUnits {
            until,
            units: Mutex::new(HashMap::default()),
            taken: AtomicU64::new(0),
        })
    });

    // The windows a merge without scratch will use, exactly as it computes them.
    if snap.layout.scratch().is_none() {
        let p = map.ordered_len();
        let mut n = from;
        while n < p {
            n = window_end(snap, opts.max_window, opts.stash.is_some(), n, p)?;
            rep.self_safe_windows += 1;
        }
    }

    // With a COW record, the content check below decodes every payload still to merge through
    // the device (and checks what it decodes to): decoding them here too would double the work.
    // Each decodes to its unit, as counted here.
    let (decoded, threads) = if snap.verifier().is_some() {
        let units = compressed.iter().map(|(_, p)| u64::from(p.unit_len)).sum();
        (units, 0)
    } else {
        decode_all(snap, &compressed, kept.as_deref())?
    };
    rep.payloads_decoded = compressed.len() as u64;
    rep.payload_bytes = compressed.iter().map(|(_, p)| p.stored_len as u64).sum();
    rep.decoded_bytes = decoded;
    rep.threads = threads;

    // With a COW record: the base is the file this merge belongs to, and every block still to
    // merge comes out exactly as the record says (a payload that decodes to the wrong bytes, a
    // COPY source pointing at another block of the base).
    if snap.verifier().is_some() {
        let (merged, staged) = {
            let v = snap.lock_view();
            (v.merged, v.staged.is_some())
        };
        // A merge that has not started: every block it will write comes out as recorded only
        // if every base block it reads holds its old data, so the content check below proves
        // the base too; the base is read block by block only to explain a failure. A merge in
        // progress must first prove that the blocks it already wrote hold the new data.
        let fresh = merged == 0 && !staged;
        let explain = |e: SnapError| -> Result<SnapError> {
            if let Some(b) = snap.check_merge_base()?
                && let Some(refusal) = crate::cowrecord::merge_refusal(&b, merged)
            {
                return Ok(refusal);
            }
            Ok(e)
        };
        if !fresh && let Some(b) = snap.check_merge_base()? {
            if let Some(e) = crate::cowrecord::merge_refusal(&b, merged) {
                return Err(e);
            }
            rep.record = Some(b.verdict);
            rep.record_base_blocks = b.source_blocks_checked + b.merged_blocks_checked;
        }
        let checked =
            verify_staged(snap).and_then(|n| Ok(n + verify_new_blocks(snap, from, kept.as_ref())?));
        rep.record_new_blocks = match checked {
            Ok(n) => n,
            Err(e @ SnapError::Corrupt { .. }) if fresh => return Err(explain(e)?),
            Err(e) => return Err(e),
        };
        if fresh {
            rep.record = Some(snapblk_cow::record::MergeVerdict::NotStarted);
        }
    }
    if let Some(k) = &kept {
        let units = lock(&k.units);
        rep.kept_units = units.len() as u64;
        rep.kept_bytes = units.values().map(|(_, u)| u.len() as u64).sum();
    }
    rep.seconds = t0.elapsed().as_secs_f64();
    Ok((rep, kept))
}

/// A window staged in scratch by an interrupted merge is written from its staged copy (its
/// sources may be gone): check each staged block the merge will write against the record.
fn verify_staged(snap: &Snapshot) -> Result<u64> {
    let (Some(v), Some(w)) = (snap.verifier(), snap.lock_view().staged.clone()) else {
        return Ok(0);
    };
    let map = &snap.map;
    let bs = map.block_size() as usize;
    let mut n = 0;
    for k in w.start..w.end {
        let b = map.ops()[k].new_block;
        if map.lookup(b) != Some(k) {
            continue;
        }
        let slot = (k - w.start) * bs;
        let data = w.data.get(slot..slot + bs).ok_or(SnapError::MergeFailed)?;
        n += 1;
        if !v.check(b, data) {
            return Err(SnapError::Corrupt { block: b });
        }
    }
    Ok(n)
}

/// Compute every block the ops from `from` on write (each block the op the map uses for it
/// owns) exactly as the merge will ([`compute_window`]: sources read from the base in coalesced
/// runs, XOR payloads applied; [`compute_batch`]: REPLACE/ZERO decoded), writing nothing, and
/// check each against the COW record (a mismatch is [`SnapError::Corrupt`]). Units of work (up to
/// [`ORDERED_CHUNK`] ordered ops, or one REPLACE/ZERO batch) run on up to [`MAX_THREADS`] threads;
/// the error of the earliest unit in merge order is reported. The payloads decoded go to `kept`
/// (those it keeps). Returns the blocks read.
fn verify_new_blocks(snap: &Snapshot, from: usize, kept: Option<&Arc<KeptUnits>>) -> Result<u64> {
    let Some(v) = snap.verifier() else {
        return Ok(0);
    };
    let map = &snap.map;
    let bsu = map.block_size() as usize;
    let total = map.ops().len();
    let p = map.ordered_len();
    let mut units: Vec<(usize, usize)> = Vec::new();
    let mut n = from.min(total);
    while n < p {
        let e = (n + ORDERED_CHUNK).min(p);
        units.push((n, e));
        n = e;
    }
    while n < total {
        let e = batch_end(snap, n, total);
        units.push((n, e));
        n = e;
    }
    // Blocks the writable overlay holds are served (and merged) from it: not checked.
    let ov = snap.overlay.as_ref().filter(|o| !o.is_empty());
    let check = |b: u64, data: &[u8]| -> Result<()> {
        if ov.is_some_and(|o| o.lookup(b).is_some()) || v.check(b, data) {
            Ok(())
        } else {
            Err(SnapError::Corrupt { block: b })
        }
    };
    let unit = |(a, e): (usize, usize),
                data: &mut Vec<u8>,
                pays: &mut Prefetched,
                blocks: &mut Vec<(u64, usize)>|
     -> Result<u64> {
        let mut read = 0;
        if a < p {
            compute_window(snap, a, e, data, pays)?;
            for k in (a..e).filter(|&k| map.is_winner(k)) {
                let slot = (k - a) * bsu;
                read += 1;
                check(map.ops()[k].new_block, &data[slot..slot + bsu])?;
            }
        } else {
            compute_batch(snap, a, e, pays, blocks, data)?;
            for &(b, at) in blocks.iter() {
                read += 1;
                check(b, &data[at..at + bsu])?;
            }
        }
        Ok(read)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
        .min(units.len().max(1));
    let next = AtomicUsize::new(0);
    let read = AtomicU64::new(0);
    let first_err: Mutex<Option<(usize, SnapError)>> = Mutex::new(None);
    let work = || {
        let mut pays = Prefetched::with_kept(kept.cloned(), Keep::Fill);
        let (mut data, mut blocks) = (Vec::new(), Vec::new());
        loop {
            let r = next.fetch_add(1, Ordering::Relaxed);
            let Some(&u) = units.get(r) else { break };
            match unit(u, &mut data, &mut pays, &mut blocks) {
                Ok(n) => {
                    read.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    let mut f = lock(&first_err);
                    if f.as_ref().is_none_or(|(at, _)| r < *at) {
                        *f = Some((r, e));
                    }
                    // Later units need not be computed.
                    next.store(units.len(), Ordering::Relaxed);
                }
            }
        }
    };
    std::thread::scope(|sc| {
        for _ in 1..threads {
            // A thread that cannot be started leaves its share to the others.
            let _ = std::thread::Builder::new()
                .name("snap-precheck".into())
                .spawn_scoped(sc, work);
        }
        work();
    });
    if let Some((_, e)) = into_inner(first_err) {
        return Err(e);
    }
    Ok(read.into_inner())
}

/// Decode every payload of `list` (op index, payload), in parallel, keeping in `kept` those
/// it keeps; the error of the lowest op index wins. Returns (decoded bytes, threads used).
fn decode_all(
    snap: &Snapshot,
    list: &[(usize, Payload)],
    kept: Option<&KeptUnits>,
) -> Result<(u64, usize)> {
    if list.is_empty() {
        return Ok((0, 0));
    }
    let chunks = list.len().div_ceil(CHUNK);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
        .min(chunks);
    let next = AtomicUsize::new(0);
    // Chunk index of the first failure so far: later chunks need not be decoded.
    let failed_at = AtomicUsize::new(usize::MAX);
    let first_err: Mutex<Option<(usize, SnapError)>> = Mutex::new(None);
    let decoded = AtomicUsize::new(0);
    let work = || {
        let mut run = Vec::new();
        let mut unit = Vec::new();
        loop {
            let c = next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks || c > failed_at.load(Ordering::Relaxed) {
                break;
            }
            let part = &list[c * CHUNK..((c + 1) * CHUNK).min(list.len())];
            match decode_chunk(snap, part, &mut run, &mut unit, kept) {
                Ok(n) => {
                    decoded.fetch_add(n, Ordering::Relaxed);
                }
                Err((op, e)) => {
                    failed_at.fetch_min(c, Ordering::Relaxed);
                    let mut g = lock(&first_err);
                    if g.as_ref().is_none_or(|(o, _)| op < *o) {
                        *g = Some((op, e));
                    }
                }
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 1..threads {
                // A thread that cannot be started leaves its share to the others.
                let _ = std::thread::Builder::new()
                    .name("snap-precheck".into())
                    .spawn_scoped(s, work);
            }
            work();
        });
    }
    if let Some((_, e)) = into_inner(first_err) {
        return Err(e);
    }
    Ok((decoded.into_inner() as u64, threads))
}

/// Decode the payloads of `part` (reading back-to-back payloads with one read). Returns the
/// decoded bytes, or the op index and error of the first failure.
fn decode_chunk(
    snap: &Snapshot,
    part: &[(usize, Payload)],
    run: &mut Vec<u8>,
    unit: &mut Vec<u8>,
    kept: Option<&KeptUnits>,
) -> std::result::Result<usize, (usize, SnapError)> {
    let mut decoded = 0usize;
    let mut k = 0;
    while k < part.len() {
        // A run of payloads stored back to back, at most RUN_BYTES (a single larger payload
        // is read alone).
        let start = part[k].1.offset;
        let mut end = start + part[k].1.stored_len as u64;
        let mut j = k + 1;
        while j < part.len()
            && part[j].1.offset == end
            && end + part[j].1.stored_len as u64 - start <= RUN_BYTES
        {
            end += part[j].1.stored_len as u64;
            j += 1;
        }
        run.resize((end - start) as usize, 0);
        snap.io
            .read(IoClass::Merge, Dev::Cow, start, run)
            .map_err(|e| (part[k].0, e))?;
        for &(op, p) in &part[k..j] {
            let at = (p.offset - start) as usize;
            let src = &run[at..at + p.stored_len as usize];
            // A unit to keep is decoded into a buffer of its own (no copy).
            let keep = kept.filter(|k| k.wants(op, &p));
            let mut own = Vec::new();
            let out = if keep.is_some() { &mut own } else { &mut *unit };
            out.resize(p.unit_len as usize, 0);
            snap.decoder.decode(p.codec, src, out).map_err(|source| {
                let block = snap.map.ops().get(op).map_or(0, |o| o.new_block);
                (
                    op,
                    SnapError::UndecodablePayload {
                        op,
                        block,
                        offset: p.offset,
                        source,
                    },
                )
            })?;
            decoded += out.len();
            if let Some(k) = keep {
                k.put(&p, Arc::new(own));
            }
        }
        k = j;
    }
    Ok(decoded)
}
