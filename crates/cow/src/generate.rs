//! COW generator: old image + new image → COW ops (+ a safe merge order) → file.
//!
//! 1. Hash every old block (xxh3, in parallel) into an index.
//! 2. Classify every new block (in parallel): unchanged (same bytes at the same offset, no op),
//!    ZERO, COPY (same bytes anywhere in the old image, verified byte by byte), or changed.
//! 3. For changed blocks, try XOR against candidates (the same offset, and the block a nearby
//!    COPY run suggests); keep the XOR if its encoded payload is smaller than REPLACE's.
//! 4. Order COPY/XOR ops so no op reads a block already overwritten (Kahn's algorithm by
//!    ascending destination); break cycles by turning one op of the cycle into a REPLACE.
//! 5. Encode REPLACE units (v3: multi-block units like AOSP) on all cores, write the file.

use snapblk_core::sync::{lock, wait};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::codec::PayloadBuf;
use crate::codec::{Codec, Compression};
use crate::error::{CowError, Result};
use crate::writer::{BatchOp, CowSink, CowWriter, WriterOptions, encode_unit_into};

/// A generator stage whose progress is reported (see [`GenerateOptions::progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Planning: comparing every new block with the old image (counts new-image bytes).
    Diffing,
    /// Encoding the REPLACE and XOR payloads (counts input bytes).
    Compressing,
}

impl Stage {
    /// A short lower-case name (`diffing`, `compressing`).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Diffing => "diffing",
            Stage::Compressing => "compressing",
        }
    }
}

/// One progress event of the generator. A stage sends `Start`, any number of `Advance` (from
/// worker threads, in any order) and `Done`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerateProgress {
    /// The stage starts; `total` bytes will be counted.
    Start {
        /// The stage starting.
        stage: Stage,
        /// Bytes the stage will count in all (see [`Stage`] for which bytes).
        total: u64,
    },
    /// `bytes` more bytes of the stage are done.
    Advance {
        /// The stage advancing.
        stage: Stage,
        /// Bytes done since the previous event of this stage.
        bytes: u64,
    },
    /// The stage is over.
    Done {
        /// The stage that ended.
        stage: Stage,
    },
}

/// Generator settings.
#[derive(Clone, Copy)]
pub struct GenerateOptions<'a> {
    /// Writer settings (version, codec, scratch, units). `op_count_max` is filled in if 0.
    pub writer: WriterOptions,
    /// Try XOR ops.
    pub xor: bool,
    /// Write sequence data (merge order) into the file (update_engine's shape).
    pub sequence: bool,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Called with the progress of the long stages (the CLI draws it as bars).
    pub progress: Option<&'a (dyn Fn(GenerateProgress) + Sync)>,
}

impl std::fmt::Debug for GenerateOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerateOptions")
            .field("writer", &self.writer)
            .field("xor", &self.xor)
            .field("sequence", &self.sequence)
            .field("threads", &self.threads)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl GenerateOptions<'_> {
    /// The worker threads the generator starts for [`threads`](Self::threads): that number, or
    /// all cores for 0, at most 256.
    pub fn worker_threads(&self) -> usize {
        threads(self.threads)
    }
}

impl Default for GenerateOptions<'_> {
    fn default() -> Self {
        GenerateOptions {
            writer: WriterOptions::default(),
            xor: true,
            sequence: true,
            threads: 0,
            progress: None,
        }
    }
}

/// What the generator decided for one new block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Same bytes as the old image's block at the same offset: no op.
    Unchanged,
    /// All zeros: a ZERO op.
    Zero,
    /// Same bytes as this old block (checked byte by byte): a COPY op.
    Copy(u64),
    /// XOR against the old image's bytes from this byte offset (any alignment: data that moved
    /// by a non-block amount reads two old blocks); payload encoded later.
    Xor(u64),
    /// The block's data is stored: part of a REPLACE unit.
    Replace,
}

/// Counts and sizes of what was generated, and where the time went.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GenerateStats {
    /// Blocks of the new image (its length divided by the block size).
    pub new_blocks: u64,
    /// New blocks equal to the old image's block at the same offset: no op.
    pub unchanged: u64,
    /// COPY ops written (one per block).
    pub copy: u64,
    /// ZERO ops written (one per block).
    pub zero: u64,
    /// XOR ops written (one per block).
    pub xor: u64,
    /// New blocks stored by REPLACE ops.
    pub replace_blocks: u64,
    /// REPLACE ops written; fewer than `replace_blocks` when v3 multi-block units are used.
    pub replace_ops: u64,
    /// XOR/COPY ops turned into REPLACE to break merge-order cycles.
    pub cycle_breaks: u64,
    /// Stored bytes of all XOR payloads.
    pub xor_payload_bytes: u64,
    /// Stored bytes of all REPLACE payloads.
    pub replace_payload_bytes: u64,
    /// Bytes handed to the compressor: (REPLACE + XOR blocks) × block size.
    pub compressed_input_bytes: u64,
    /// Length in bytes of the finished COW file.
    pub cow_bytes: u64,
    /// Wall-clock seconds planning: hashing the old image, classifying new blocks, choosing
    /// XOR sources.
    pub seconds_plan: f64,
    /// Wall-clock seconds ordering: merge order and cycle breaking.
    pub seconds_order: f64,
    /// Wall-clock seconds writing, given the op list: XOR payloads, compression, writing,
    /// finalize.
    pub seconds_write: f64,
    /// CPU seconds (all threads of the process) spent planning.
    pub cpu_seconds_plan: f64,
    /// CPU seconds (all threads of the process) spent ordering.
    pub cpu_seconds_order: f64,
    /// CPU seconds (all threads of the process) spent writing.
    pub cpu_seconds_write: f64,
}

/// Pass-through hasher for keys that already are good hashes.
#[derive(Default)]
struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// Most worker threads the generator starts, whatever it is asked for.
pub(crate) const MAX_THREADS: usize = 256;

/// Worker count for a `threads` setting (0 = all cores), at most [`MAX_THREADS`].
pub(crate) fn threads(n: usize) -> usize {
    if n > 0 {
        n.min(MAX_THREADS)
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)
    }
}

/// Run `f(state, i)` for i in 0..n on `t` threads, chunked dynamically, with one `init()`
/// state per thread (scratch buffers); results in index order.
fn par_map_with<S, T: Send, I: Fn() -> S + Sync, F: Fn(&mut S, usize) -> T + Sync>(
    n: usize,
    t: usize,
    chunk: usize,
    init: I,
    f: F,
    tick: &(dyn Fn(u64) + Sync),
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let work = || {
        let mut st = init();
        let mut mine = Vec::new();
        loop {
            let start = next.fetch_add(chunk, Ordering::Relaxed);
            if start >= n {
                break;
            }
            let end = (start + chunk).min(n);
            mine.push((
                start,
                (start..end).map(|i| f(&mut st, i)).collect::<Vec<T>>(),
            ));
            tick((end - start) as u64);
        }
        mine
    };
    let mut parts: Vec<(usize, Vec<T>)> = if t <= 1 || n <= chunk {
        work()
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = (1..t).map(|_| s.spawn(work)).collect();
            // The calling thread works too instead of waiting.
            let mut all = work();
            for h in hs {
                all.extend(h.join().unwrap_or_default());
            }
            all
        })
    };
    parts.sort_by_key(|p| p.0);
    let mut out = Vec::with_capacity(n);
    for p in parts {
        out.extend(p.1);
    }
    out
}

/// [`par_map_with`] without per-thread state.
fn par_map<T: Send, F: Fn(usize) -> T + Sync>(
    n: usize,
    t: usize,
    chunk: usize,
    f: F,
    tick: &(dyn Fn(u64) + Sync),
) -> Vec<T> {
    par_map_with(n, t, chunk, || (), |_, i| f(i), tick)
}

fn blk_of(img: &[u8], bs: usize, i: usize) -> &[u8] {
    &img[i * bs..(i + 1) * bs]
}

#[inline(always)]
fn word(c: &[u8]) -> u64 {
    u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
}

fn is_zero(b: &[u8]) -> bool {
    // Compare in u64 words for speed; block sizes are multiples of 8.
    b.chunks_exact(8).all(|c| word(c) == 0)
}

/// How many byte positions hold the same value in `a` and `b` (equal lengths, multiples of
/// 64 — block sizes are powers of two ≥ 512).
fn equal_bytes(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0usize;
    for (x, y) in a.chunks_exact(64).zip(b.chunks_exact(64)) {
        // Fixed 64-byte chunks: no bounds checks, a u8 sum cannot overflow, and the loop
        // compiles to vector compares.
        let mut s = 0u8;
        for k in 0..64 {
            s += u8::from(x[k] == y[k]);
        }
        n += usize::from(s);
    }
    n
}

/// Where a changed block's bytes may come from when its data moved by a non-block amount:
/// look for a 32-byte sample of `nb` in the old image around byte offset `around`
/// (± one block). Returns the source byte offset of the whole block.
fn find_shifted(old: &[u8], nb: &[u8], around: usize) -> Option<usize> {
    let bs = nb.len();
    let mid = bs / 2;
    let needle = &nb[mid..mid + 32];
    if needle.iter().all(|&b| b == needle[0]) {
        return None; // runs of one byte match everywhere
    }
    let lo = around.saturating_sub(bs) + mid;
    let hi = (around + 2 * bs).min(old.len());
    if lo + 32 > hi {
        return None;
    }
    let pos = memchr::memmem::find(&old[lo..hi], needle)?;
    let src = lo + pos - mid;
    (src + bs <= old.len()).then_some(src)
}

/// Payloads encoded while choosing XOR sources, reused by the writer stage when the trial
/// codec is the file's codec (lz4, one-block units): `(is_xor, bytes)` per new block.
type Cache = Vec<Option<(bool, Vec<u8>)>>;

/// The stored payload for a trial encoding of `n` bytes in `buf` (raw when not smaller).
fn encoded_bytes(buf: &[u8], n: usize, raw: &[u8]) -> Vec<u8> {
    if n < raw.len() {
        buf[..n].to_vec()
    } else {
        raw.to_vec()
    }
}

/// Compressed size of one block with lz4 (the XOR trial codec), raw size if not smaller.
fn lz4_size(buf: &mut Vec<u8>, data: &[u8]) -> usize {
    buf.resize(lz4_flex::block::get_maximum_output_size(data.len()), 0);
    match lz4_flex::block::compress_into(data, buf) {
        Ok(n) => n.min(data.len()),
        Err(_) => data.len(),
    }
}

/// XOR source candidate for changed block `i` from the displacement `last` of the nearest
/// COPY run (≤ 16 blocks back) or of a shifted match found for an earlier changed block.
fn locality_candidate(
    old: &[u8],
    new: &[u8],
    bs: usize,
    i: usize,
    last: &mut Option<(usize, isize)>,
) -> Option<(usize, usize)> {
    let (j, d) = (*last)?;
    if i - j > 16 {
        return None;
    }
    let nb = blk_of(new, bs, i);
    let at = (i * bs) as isize + d;
    if at < 0 {
        return None;
    }
    let at = at as usize;
    if at + bs <= old.len() && at != i * bs {
        let e = equal_bytes(nb, &old[at..at + bs]);
        if e * 4 >= bs {
            *last = Some((i, d));
            return Some((at, e));
        }
    }
    let src = find_shifted(old, nb, at)?;
    let e = equal_bytes(nb, &old[src..src + bs]);
    if src != i * bs && e * 2 >= bs {
        *last = Some((i, src as isize - (i * bs) as isize));
        return Some((src, e));
    }
    None
}

fn plan_cached(
    old: &[u8],
    new: &[u8],
    opts: &GenerateOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(Vec<Plan>, Cache)> {
    let bs = opts.writer.block_size as usize;
    if !new.len().is_multiple_of(bs) || !old.len().is_multiple_of(bs) {
        return Err(CowError::InvalidArgument(format!(
            "image sizes ({} and {}) must be multiples of the block size {bs}",
            old.len(),
            new.len()
        )));
    }
    let t = threads(opts.threads);
    let old_blocks = old.len() / bs;
    let new_blocks = new.len() / bs;
    let noop = |_| {};
    let old_hash = par_map(
        old_blocks,
        t,
        4096,
        |i| xxhash_rust::xxh3::xxh3_64(&old[i * bs..(i + 1) * bs]),
        &noop,
    );
    let mut index: IdMap<u64> = IdMap::default();
    index.reserve(old_blocks);
    for (i, h) in old_hash.iter().enumerate() {
        index.entry(*h).or_insert(i as u64);
    }
    drop(old_hash);
    let mut plans = par_map(
        new_blocks,
        t,
        4096,
        |i| {
            let nb = blk_of(new, bs, i);
            if i < old_blocks && nb == blk_of(old, bs, i) {
                return Plan::Unchanged;
            }
            if is_zero(nb) {
                return Plan::Zero;
            }
            let h = xxhash_rust::xxh3::xxh3_64(nb);
            if let Some(&s) = index.get(&h)
                && blk_of(old, bs, s as usize) == nb
            {
                return Plan::Copy(s);
            }
            Plan::Replace
        },
        progress,
    );
    drop(index);
    let mut cache: Cache = Vec::new();
    if opts.xor && opts.writer.codec.algo != Compression::None {
        // Candidate from locality: the displacement (in bytes, any alignment) of the nearest
        // COPY run before the block, or of a shifted match found for an earlier changed block.
        // Chunks are scanned in parallel; a chain of shifted matches restarts at a chunk edge.
        const SPAN: usize = 4096;
        let plans_ref = &plans;
        let cand: Vec<Option<(usize, usize)>> = par_map(
            new_blocks.div_ceil(SPAN),
            t,
            1,
            |c| {
                let (start, end) = (c * SPAN, ((c + 1) * SPAN).min(new_blocks));
                let mut out = vec![None; end - start];
                let mut last: Option<(usize, isize)> = None;
                for i in start.saturating_sub(16)..end {
                    match plans_ref[i] {
                        Plan::Copy(s) => last = Some((i, (s as isize - i as isize) * bs as isize)),
                        Plan::Unchanged => last = Some((i, 0)),
                        Plan::Replace if i >= start => {
                            out[i - start] = locality_candidate(old, new, bs, i, &mut last);
                        }
                        _ => {}
                    }
                }
                out
            },
            &noop,
        )
        .into_iter()
        .flatten()
        .collect();
        let codec = opts.writer.codec;
        let w = &opts.writer;
        // With lz4 and one-block units the trial encodings are the real payloads: keep them.
        let reuse = codec.algo == Compression::Lz4
            && (w.version < 3 || w.max_compression_size == w.block_size || w.cluster_ops == 0);
        let zeros = vec![0u8; bs];
        let no_scratch = w.scratch_size == 0;
        let decided = par_map_with(
            new_blocks,
            t,
            1024,
            || (vec![0u8; bs], Vec::new(), Vec::new()),
            |(x, buf, best_buf), i| {
                if plans[i] != Plan::Replace {
                    return (None, None);
                }
                let nb = blk_of(new, bs, i);
                // (source byte offset, equal bytes) of up to two candidates.
                let mut cands: [Option<(usize, usize)>; 2] = [None, None];
                if i < old_blocks {
                    let e = equal_bytes(nb, blk_of(old, bs, i));
                    if e * 4 >= bs {
                        cands[0] = Some((i * bs, e));
                    }
                }
                if cand[i].map(|c| c.0) != cands[0].map(|c| c.0) {
                    cands[1] = cand[i];
                }
                if no_scratch {
                    // An XOR that reads its own destination block cannot be merged crash-safely
                    // without a scratch area to stage it (a restart would read the new block as
                    // its source), and snapblk's merge refuses such a COW: REPLACE instead.
                    for c in &mut cands {
                        if c.is_some_and(|(off, _)| xor_reads_block(off, bs, i)) {
                            *c = None;
                        }
                    }
                }
                let Some(&top) = cands.iter().flatten().max_by_key(|c| c.1) else {
                    return (None, None);
                };
                let xor_into = |x: &mut [u8], c: usize| {
                    for ((d, a), b) in x.iter_mut().zip(nb).zip(&old[c..c + bs]) {
                        *d = a ^ b;
                    }
                };
                // The XOR payload has bs - top.1 non-zero bytes; when that is under an eighth of
                // the new block's non-zero bytes it beats REPLACE for any real data (lz4 and
                // friends do not shrink real data 8x), so skip the trial compression.
                if (bs - top.1) * 8 <= bs - equal_bytes(nb, &zeros[..bs]) {
                    let payload = reuse.then(|| {
                        xor_into(x, top.0);
                        let n = lz4_size(buf, x);
                        (true, encoded_bytes(buf, n, x))
                    });
                    return (Some(top.0), payload);
                }
                let rep = lz4_size(buf, nb);
                let keep_rep = reuse.then(|| encoded_bytes(buf, rep, nb));
                let mut best: Option<(usize, usize)> = None;
                for (c, _) in cands.into_iter().flatten() {
                    xor_into(x, c);
                    let n = lz4_size(buf, x);
                    if n < rep && best.is_none_or(|b| n < b.0) {
                        best = Some((n, c));
                        if reuse {
                            std::mem::swap(buf, best_buf);
                        }
                    }
                }
                match best {
                    // n < rep <= block size, so the XOR trial output is compressed bytes.
                    Some((n, c)) => (Some(c), reuse.then(|| (true, best_buf[..n].to_vec()))),
                    None => (None, keep_rep.map(|b| (false, b))),
                }
            },
            &noop,
        );
        if reuse {
            cache = vec![None; new_blocks];
        }
        for (i, (d, e)) in decided.into_iter().enumerate() {
            if let Some(c) = d {
                plans[i] = Plan::Xor(c as u64);
            }
            if reuse {
                cache[i] = e;
            }
        }
    }
    Ok((plans, cache))
}
/// Whether an XOR whose source is the old image's bytes at `off` reads old block `block`
/// (an unaligned source spans two blocks).
fn xor_reads_block(off: usize, bs: usize, block: usize) -> bool {
    off / bs == block || (!off.is_multiple_of(bs) && off / bs + 1 == block)
}

/// Order COPY/XOR ops for a safe in-place merge. Returns the merge sequence (new blocks) and
/// turns ops that sit on dependency cycles into `Plan::Replace`. Returns the number of ops
/// converted. `block_size` is needed because XOR sources are byte offsets: an XOR whose source
/// is not block-aligned reads two old blocks, and must merge before either is overwritten.
pub(crate) fn order(plans: &mut [Plan], block_size: u32) -> (Vec<u32>, u64) {
    const NONE: u32 = u32::MAX;
    let bs = u64::from(block_size.max(1));
    // Nodes: ordered ops. Edge A -> B ("A before B") when B's destination is one of A's sources.
    let nodes: Vec<usize> = plans
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, Plan::Copy(_) | Plan::Xor(_)))
        .map(|(i, _)| i)
        .collect();
    let mut node_of = vec![NONE; plans.len()];
    for (n, &b) in nodes.iter().enumerate() {
        node_of[b] = n as u32;
    }
    let node_at = |blk: u64| -> u32 {
        usize::try_from(blk)
            .ok()
            .and_then(|b| node_of.get(b).copied())
            .unwrap_or(NONE)
    };
    // Source blocks of an op: (first, second or u64::MAX).
    let srcs = |p: Plan| match p {
        Plan::Copy(s) => (s, u64::MAX),
        Plan::Xor(off) if off % bs == 0 => (off / bs, u64::MAX),
        Plan::Xor(off) => (off / bs, off / bs + 1),
        _ => (u64::MAX, u64::MAX),
    };
    let mut indeg = vec![0u32; nodes.len()];
    // succ[a]: the (at most two) ops that overwrite a's sources.
    let mut succ: Vec<[u32; 2]> = vec![[NONE; 2]; nodes.len()];
    // preds[b] = ops reading block b (must merge before b).
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    for (a, &blk) in nodes.iter().enumerate() {
        let (s0, s1) = srcs(plans[blk]);
        for (k, s) in [s0, s1].into_iter().enumerate() {
            if s == blk as u64 || s == u64::MAX {
                continue; // reading one's own destination is fine: read happens first
            }
            let b = node_at(s);
            if b != NONE {
                succ[a][k] = b;
                indeg[b as usize] += 1;
                preds[b as usize].push(a as u32);
            }
        }
    }
    let mut removed = vec![false; nodes.len()];
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<u32>> = (0..nodes.len() as u32)
        .filter(|&n| indeg[n as usize] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut seq = Vec::with_capacity(nodes.len());
    let mut breaks = 0;
    let mut scan = 0usize;
    let release = |n: u32,
                   indeg: &mut Vec<u32>,
                   heap: &mut std::collections::BinaryHeap<std::cmp::Reverse<u32>>,
                   succ: &Vec<[u32; 2]>| {
        for b in succ[n as usize] {
            if b != NONE {
                indeg[b as usize] -= 1;
                if indeg[b as usize] == 0 {
                    heap.push(std::cmp::Reverse(b));
                }
            }
        }
    };
    let mut seen = vec![0u32; nodes.len()];
    let mut walk = 0u32;
    while seq.len() as u64 + breaks < nodes.len() as u64 {
        if let Some(std::cmp::Reverse(n)) = heap.pop() {
            if removed[n as usize] {
                continue;
            }
            removed[n as usize] = true;
            seq.push(nodes[n as usize] as u32);
            release(n, &mut indeg, &mut heap, &succ);
            continue;
        }
        // Stuck: every remaining node waits on another, so walking predecessors from any
        // remaining node must revisit one — that node is on a cycle. Convert it to REPLACE.
        while removed[scan] {
            scan += 1;
        }
        walk += 1;
        let mut v = scan as u32;
        while seen[v as usize] != walk {
            seen[v as usize] = walk;
            let next = preds[v as usize]
                .iter()
                .copied()
                .find(|&p| !removed[p as usize]);
            match next {
                Some(p) => v = p,
                None => break,
            }
        }
        removed[v as usize] = true;
        plans[nodes[v as usize]] = Plan::Replace;
        breaks += 1;
        release(v, &mut indeg, &mut heap, &succ);
    }
    (seq, breaks)
}

/// Reports the progress of one stage to `opts.progress`, if any: `Start` when made, `Done`
/// when dropped (so an error return ends the stage too).
struct StageReport<'o, 'a> {
    opts: &'o GenerateOptions<'a>,
    stage: Stage,
}

impl<'o, 'a> StageReport<'o, 'a> {
    fn start(opts: &'o GenerateOptions<'a>, stage: Stage, total: u64) -> Self {
        if let Some(p) = opts.progress {
            p(GenerateProgress::Start { stage, total });
        }
        StageReport { opts, stage }
    }

    fn advance(&self, bytes: u64) {
        if let Some(p) = self.opts.progress {
            p(GenerateProgress::Advance {
                stage: self.stage,
                bytes,
            });
        }
    }
}

impl Drop for StageReport<'_, '_> {
    fn drop(&mut self) {
        if let Some(p) = self.opts.progress {
            p(GenerateProgress::Done { stage: self.stage });
        }
    }
}

/// The generator's decisions before anything is written: one planned op per new block and the
/// merge sequence of the ordered (COPY/XOR) ops. Produced by [`compute_ops`], consumed by
/// [`write_ops`] (which is the writer stage alone — what AOSP's writer does given an op list).
pub struct OpList {
    pub(crate) plans: Vec<Plan>,
    /// New blocks of the COPY/XOR ops in merge order.
    pub(crate) sequence: Vec<u32>,
    pub(crate) cycle_breaks: u64,
    pub(crate) seconds_plan: f64,
    pub(crate) seconds_order: f64,
    pub(crate) cpu_seconds_plan: f64,
    pub(crate) cpu_seconds_order: f64,
    /// Payloads encoded while choosing XOR sources (reused when they are the real payloads).
    cache: Cache,
}

/// Plan and order: decide an op for every new block and a safe merge order.
pub fn compute_ops(old: &[u8], new: &[u8], opts: &GenerateOptions) -> Result<OpList> {
    // Trial payloads are encoded while planning, before any writer exists.
    opts.writer.codec.checked()?;
    let bs = opts.writer.block_size as usize;
    let t0 = std::time::Instant::now();
    let c0 = crate::tools::process_cpu_seconds();
    let pb = StageReport::start(opts, Stage::Diffing, new.len() as u64);
    let tick = |n: u64| pb.advance(n * bs as u64);
    let (mut plans, cache) = plan_cached(old, new, opts, &tick)?;
    drop(pb);
    let t1 = std::time::Instant::now();
    let c1 = crate::tools::process_cpu_seconds();
    let (sequence, cycle_breaks) = order(&mut plans, opts.writer.block_size);
    Ok(OpList {
        plans,
        sequence,
        cycle_breaks,
        seconds_plan: (t1 - t0).as_secs_f64(),
        seconds_order: t1.elapsed().as_secs_f64(),
        cpu_seconds_plan: c1 - c0,
        cpu_seconds_order: crate::tools::process_cpu_seconds() - c1,
        cache,
    })
}

/// Write a COW for a computed op list. With `reuse_trials` false every payload is encoded
/// here (the writer's full work, for benchmarks); the file is the same either way.
pub fn write_ops<W: CowSink>(
    old: &[u8],
    new: &[u8],
    ops: &OpList,
    sink: W,
    opts: &GenerateOptions,
    reuse_trials: bool,
) -> Result<GenerateStats> {
    let t = std::time::Instant::now();
    let c = crate::tools::process_cpu_seconds();
    let empty = Cache::new();
    let cache = if reuse_trials { &ops.cache } else { &empty };
    let mut stats = write_plans(old, new, &ops.plans, &ops.sequence, cache, sink, opts)?;
    stats.cycle_breaks = ops.cycle_breaks;
    stats.seconds_plan = ops.seconds_plan;
    stats.seconds_order = ops.seconds_order;
    stats.seconds_write = t.elapsed().as_secs_f64();
    stats.cpu_seconds_plan = ops.cpu_seconds_plan;
    stats.cpu_seconds_order = ops.cpu_seconds_order;
    stats.cpu_seconds_write = crate::tools::process_cpu_seconds() - c;
    Ok(stats)
}

/// Generate a COW for `old` → `new` into `sink`. Returns statistics.
pub fn generate<W: CowSink>(
    old: &[u8],
    new: &[u8],
    sink: W,
    opts: &GenerateOptions,
) -> Result<GenerateStats> {
    let ops = compute_ops(old, new, opts)?;
    write_ops(old, new, &ops, sink, opts, true)
}

/// A payload from the trial cache if it was made for this kind of op.
fn cached(cache: &Cache, block: usize, xor: bool, unit_blocks: u32) -> Option<&[u8]> {
    match cache.get(block) {
        Some(Some((x, bytes))) if *x == xor && unit_blocks == 1 => Some(bytes),
        _ => None,
    }
}

/// One op in the order the writer stage emits them.
#[derive(Clone, Copy)]
enum Item {
    Copy(u32, u64),
    /// New block, source byte offset.
    Xor(u32, u64),
    Zero(u32),
    /// First block, blocks in the unit.
    Replace(u32, u32),
}

/// A batch of items encoded by one thread: payloads back to back, their lengths, and a
/// scratch block for XOR data. Reused from batch to batch (no allocation, no fresh pages).
#[derive(Default)]
struct Batch {
    payloads: PayloadBuf,
    lens: Vec<u32>,
    scratch: Vec<u8>,
}

/// Run `encode(batch, k)` for k in 0..n on `t` threads (the calling thread included) and
/// `consume(k, batch)` on the calling thread in order k = 0, 1, ..., as soon as batch k is
/// ready. At most a few batches per thread are in flight, and their buffers are recycled, so
/// memory stays bounded and warm however large the COW is.
fn ordered_pipeline<B: Default + Send>(
    n: usize,
    t: usize,
    encode: &(dyn Fn(&mut B, usize) + Sync),
    mut consume: impl FnMut(usize, &B) -> Result<()>,
) -> Result<()> {
    use std::collections::BTreeMap;
    use std::sync::{Condvar, Mutex, MutexGuard};
    if t <= 1 || n <= 1 {
        let mut b = B::default();
        for k in 0..n {
            encode(&mut b, k);
            consume(k, &b)?;
        }
        return Ok(());
    }
    struct State<B> {
        /// Next batch to claim.
        next: usize,
        /// Batches consumed so far.
        consumed: usize,
        ready: BTreeMap<usize, B>,
        pool: Vec<B>,
        stop: bool,
    }
    let window = 4 * t;
    let st = Mutex::new(State {
        next: 0,
        consumed: 0,
        ready: BTreeMap::new(),
        pool: Vec::new(),
        stop: false,
    });
    let cv = Condvar::new();
    let lock = || lock(&st);
    let stop_all = |mut g: MutexGuard<'_, State<B>>| {
        g.stop = true;
        drop(g);
        cv.notify_all();
    };
    // Sets `stop` if a worker unwinds, so the consumer does not wait for its batch forever.
    struct OnUnwind<'a, F: Fn()>(&'a F);
    impl<F: Fn()> Drop for OnUnwind<'_, F> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                (self.0)();
            }
        }
    }
    let abort = || stop_all(lock());
    // Claim the next batch, encode it without the lock, publish it as ready; hands the lock back.
    let encode_next = |mut g: MutexGuard<'_, State<B>>| {
        let k = g.next;
        g.next += 1;
        let mut b = g.pool.pop().unwrap_or_default();
        drop(g);
        encode(&mut b, k);
        let mut g = lock();
        g.ready.insert(k, b);
        g
    };
    std::thread::scope(|s| {
        for _ in 1..t {
            s.spawn(|| {
                let _guard = OnUnwind(&abort);
                let mut g = lock();
                loop {
                    if g.stop || g.next >= n {
                        return;
                    }
                    if g.next >= g.consumed + window {
                        g = wait(&cv, g);
                        continue;
                    }
                    g = encode_next(g);
                    cv.notify_all();
                }
            });
        }
        let mut want = 0;
        let mut g = lock();
        let r = loop {
            if want == n {
                break Ok(());
            }
            if let Some(b) = g.ready.remove(&want) {
                drop(g);
                let r = consume(want, &b);
                g = lock();
                g.pool.push(b);
                g.consumed = want + 1;
                cv.notify_all();
                if r.is_err() {
                    break r;
                }
                want += 1;
                continue;
            }
            if g.stop {
                break Err(CowError::InvalidArgument(
                    "internal: a compression worker failed".into(),
                ));
            }
            if g.next < n && g.next < g.consumed + window {
                // The calling thread compresses too instead of waiting.
                g = encode_next(g);
                continue;
            }
            g = wait(&cv, g);
        };
        stop_all(g);
        r
    })
}

/// The writer stage, given the op list: XOR payloads and REPLACE units compressed on all
/// cores in batches, records and payloads written in merge order as batches complete.
fn write_plans<W: CowSink>(
    old: &[u8],
    new: &[u8],
    plans: &[Plan],
    seq: &[u32],
    cache: &Cache,
    sink: W,
    opts: &GenerateOptions,
) -> Result<GenerateStats> {
    let bs = opts.writer.block_size as usize;
    let new_blocks = new.len() / bs;
    let mut wopts = opts.writer;
    if wopts.op_count_max == 0 {
        wopts.op_count_max = (new_blocks as u64).max(1);
    }
    let mut stats = GenerateStats {
        new_blocks: new_blocks as u64,
        ..Default::default()
    };
    let mut w = CowWriter::new(sink, wopts)?;
    let t = threads(opts.threads);

    // Emission order: ordered ops (merge sequence), label 0, then REPLACE units (the writer's
    // cut rule) and ZERO ops by ascending block.
    let mut items: Vec<Item> = Vec::with_capacity(new_blocks);
    for &b in seq {
        match plans[b as usize] {
            Plan::Copy(s) => items.push(Item::Copy(b, s)),
            Plan::Xor(s) => items.push(Item::Xor(b, s)),
            _ => {}
        }
    }
    let label_at = items.len();
    let mut i = 0;
    while i < new_blocks {
        match plans[i] {
            Plan::Replace => {
                let mut j = i;
                while j < new_blocks && plans[j] == Plan::Replace {
                    j += 1;
                }
                for (b, n) in w.replace_units(i as u64, (j - i) as u64) {
                    items.push(Item::Replace(b as u32, n));
                }
                i = j;
            }
            Plan::Zero => {
                items.push(Item::Zero(i as u32));
                i += 1;
            }
            Plan::Unchanged => {
                stats.unchanged += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    // Batches of about 1 MiB of input (or 8192 ops), split at the label.
    const BATCH_BYTES: usize = 1 << 20;
    let mut batches: Vec<(usize, usize)> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (k, it) in items.iter().enumerate() {
        if k == label_at && k > start {
            batches.push((start, k));
            (start, bytes) = (k, 0);
        }
        bytes += match *it {
            Item::Xor(..) => bs,
            Item::Replace(_, n) => n as usize * bs,
            _ => 0,
        };
        if bytes >= BATCH_BYTES || k + 1 - start >= 8192 {
            batches.push((start, k + 1));
            (start, bytes) = (k + 1, 0);
        }
    }
    if start < items.len() {
        batches.push((start, items.len()));
    }
    let to_compress: u64 = items
        .iter()
        .map(|it| match *it {
            Item::Xor(..) => bs as u64,
            Item::Replace(_, n) => u64::from(n) * bs as u64,
            _ => 0,
        })
        .sum();
    let pb = StageReport::start(opts, Stage::Compressing, to_compress);

    let codec: Codec = wopts.codec;
    let encode = |b: &mut Batch, k: usize| {
        let (lo, hi) = batches[k];
        b.payloads.clear();
        b.lens.clear();
        for it in &items[lo..hi] {
            let start = b.payloads.len();
            match *it {
                Item::Xor(nb, s) => {
                    if let Some(p) = cached(cache, nb as usize, true, 1) {
                        b.payloads.extend(p);
                    } else {
                        b.scratch.resize(bs, 0);
                        let nbs = &new[nb as usize * bs..(nb as usize + 1) * bs];
                        let ob = &old[s as usize..s as usize + bs];
                        for ((d, x), y) in b.scratch.iter_mut().zip(nbs).zip(ob) {
                            *d = x ^ y;
                        }
                        encode_unit_into(
                            codec,
                            wopts.version,
                            wopts.block_size,
                            wopts.max_compression_size,
                            &b.scratch,
                            &mut b.payloads,
                        );
                    }
                }
                Item::Replace(first, n) => {
                    if let Some(p) = cached(cache, first as usize, false, n) {
                        b.payloads.extend(p);
                    } else {
                        let s = first as usize * bs;
                        encode_unit_into(
                            codec,
                            wopts.version,
                            wopts.block_size,
                            wopts.max_compression_size,
                            &new[s..s + n as usize * bs],
                            &mut b.payloads,
                        );
                    }
                }
                _ => continue,
            }
            b.lens.push((b.payloads.len() - start) as u32);
        }
    };
    if opts.sequence && !seq.is_empty() && (wopts.version == 3 || wopts.cluster_ops >= 2) {
        w.add_sequence_data(seq)?;
    }
    let mut ops: Vec<BatchOp> = Vec::new();
    let mut labelled = false;
    ordered_pipeline(batches.len(), t, &encode, |k, b| {
        let (lo, hi) = batches[k];
        if lo >= label_at && !labelled {
            w.add_label(0)?;
            labelled = true;
        }
        ops.clear();
        let mut lens = b.lens.iter();
        let mut next_len = || {
            lens.next().copied().ok_or_else(|| {
                CowError::InvalidArgument("internal: missing payload in a batch".into())
            })
        };
        let mut input = 0u64;
        for it in &items[lo..hi] {
            ops.push(match *it {
                Item::Copy(nb, s) => {
                    stats.copy += 1;
                    BatchOp::Copy {
                        new_block: nb.into(),
                        old_block: s,
                    }
                }
                Item::Xor(nb, s) => {
                    let len = next_len()?;
                    stats.xor += 1;
                    stats.xor_payload_bytes += u64::from(len);
                    input += bs as u64;
                    BatchOp::Xor {
                        new_block: nb.into(),
                        source_offset: s,
                        len,
                    }
                }
                Item::Zero(nb) => {
                    stats.zero += 1;
                    BatchOp::Zero {
                        new_block: nb.into(),
                    }
                }
                Item::Replace(nb, n) => {
                    let len = next_len()?;
                    stats.replace_ops += 1;
                    stats.replace_blocks += u64::from(n);
                    stats.replace_payload_bytes += u64::from(len);
                    input += u64::from(n) * bs as u64;
                    BatchOp::Replace {
                        new_block: nb.into(),
                        unit_blocks: n,
                        len,
                    }
                }
            });
        }
        pb.advance(input);
        w.add_batch(&ops, b.payloads.as_slice())
    })?;
    if !labelled {
        w.add_label(0)?;
    }
    drop(pb);
    stats.cow_bytes = w.finalize()?;
    stats.compressed_input_bytes = (stats.replace_blocks + stats.xor) * bs as u64;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_pipeline_consumes_in_order_and_recycles_buffers() {
        for t in [1, 2, 3, 8] {
            let encode = |b: &mut Vec<usize>, k: usize| {
                // Uneven work so batches finish out of order.
                if k.is_multiple_of(3) {
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
                b.clear();
                b.extend([k, k * k]);
            };
            let mut seen = Vec::new();
            ordered_pipeline(50, t, &encode, |k, b| {
                assert_eq!(b, &vec![k, k * k]);
                seen.push(k);
                Ok(())
            })
            .unwrap();
            assert_eq!(seen, (0..50).collect::<Vec<_>>(), "t={t}");
        }
    }

    #[test]
    fn ordered_pipeline_stops_at_the_first_consumer_error() {
        for t in [1, 3] {
            let encoded = AtomicUsize::new(0);
            let encode = |_: &mut (), _| {
                encoded.fetch_add(1, Ordering::Relaxed);
            };
            let mut consumed = 0;
            let r = ordered_pipeline(10_000, t, &encode, |k, _| {
                consumed += 1;
                if k == 5 {
                    return Err(CowError::InvalidArgument("stop".into()));
                }
                Ok(())
            });
            assert!(matches!(r, Err(CowError::InvalidArgument(m)) if m == "stop"));
            assert_eq!(consumed, 6);
            // Workers run at most a window ahead of the consumer.
            assert!(encoded.load(Ordering::Relaxed) <= 6 + 4 * t, "t={t}");
        }
    }
}
