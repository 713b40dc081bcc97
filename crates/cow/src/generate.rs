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

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::codec::{Codec, Compression};
use crate::error::{CowError, Result};
use crate::writer::{CowSink, CowWriter, EncodedUnit, WriterOptions, encode_unit};

/// Generator settings.
#[derive(Clone, Copy, Debug)]
pub struct GenerateOptions {
    /// Writer settings (version, codec, scratch, units). `op_count_max` is filled in if 0.
    pub writer: WriterOptions,
    /// Try XOR ops.
    pub xor: bool,
    /// Write sequence data (merge order) into the file (update_engine's shape).
    pub sequence: bool,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Show a progress bar on stderr when it is a terminal.
    pub progress: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            writer: WriterOptions::default(),
            xor: true,
            sequence: true,
            threads: 0,
            progress: false,
        }
    }
}

/// What the generator decided for one new block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    Unchanged,
    Zero,
    Copy(u64),
    /// XOR against old block (aligned); payload encoded later.
    Xor(u64),
    Replace,
}

/// Counts and sizes of what was generated, and where the time went.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GenerateStats {
    pub new_blocks: u64,
    pub unchanged: u64,
    pub copy: u64,
    pub zero: u64,
    pub xor: u64,
    pub replace_blocks: u64,
    pub replace_ops: u64,
    /// XOR/COPY ops turned into REPLACE to break merge-order cycles.
    pub cycle_breaks: u64,
    pub xor_payload_bytes: u64,
    pub replace_payload_bytes: u64,
    /// Bytes handed to the compressor: (REPLACE + XOR blocks) × block size.
    pub compressed_input_bytes: u64,
    pub cow_bytes: u64,
    /// Hashing the old image, classifying new blocks, choosing XOR sources.
    pub seconds_plan: f64,
    /// Merge ordering and cycle breaking.
    pub seconds_order: f64,
    /// The writer's share given the op list: XOR payloads, compression, writing, finalize.
    pub seconds_write: f64,
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

/// Worker count for a `threads` setting (0 = all cores).
pub fn threads(n: usize) -> usize {
    if n > 0 {
        n
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// Run `f(i)` for i in 0..n on `t` threads, chunked dynamically; results in index order.
fn par_map<T: Send, F: Fn(usize) -> T + Sync>(
    n: usize,
    t: usize,
    chunk: usize,
    f: F,
    tick: &(dyn Fn(u64) + Sync),
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let mut parts: Vec<(usize, Vec<T>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..t.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let start = next.fetch_add(chunk, Ordering::Relaxed);
                        if start >= n {
                            break;
                        }
                        let end = (start + chunk).min(n);
                        mine.push((start, (start..end).map(&f).collect::<Vec<T>>()));
                        tick((end - start) as u64);
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    parts.sort_by_key(|p| p.0);
    parts.into_iter().flat_map(|p| p.1).collect()
}

fn blk_of(img: &[u8], bs: usize, i: usize) -> &[u8] {
    &img[i * bs..(i + 1) * bs]
}

fn is_zero(b: &[u8]) -> bool {
    // Compare in u64 words for speed; block sizes are multiples of 8.
    b.chunks_exact(8)
        .all(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) == 0)
}

fn similar(a: &[u8], b: &[u8]) -> bool {
    // Cheap pre-filter before trial-compressing an XOR: at least a quarter equal bytes.
    let eq = a.iter().zip(b).filter(|(x, y)| x == y).count();
    eq * 4 >= a.len()
}

/// Decide ops for every new block. `old`/`new` are raw images.
pub fn plan(
    old: &[u8],
    new: &[u8],
    opts: &GenerateOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<Plan>> {
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
    if opts.xor && opts.writer.codec.algo != Compression::None {
        // Candidate from locality: a nearby COPY run that moved data by a fixed distance.
        let mut cand: Vec<Option<u64>> = vec![None; new_blocks];
        let mut last: Option<(usize, u64)> = None;
        for (i, p) in plans.iter().enumerate() {
            match *p {
                Plan::Copy(s) => last = Some((i, s)),
                Plan::Replace => {
                    if let Some((j, s)) = last
                        && i - j <= 16
                    {
                        let c = s + (i - j) as u64;
                        if (c as usize) < old_blocks && c != i as u64 {
                            cand[i] = Some(c);
                        }
                    }
                }
                _ => {}
            }
        }
        let codec = opts.writer.codec;
        let ver = opts.writer.version;
        let bsz = opts.writer.block_size;
        let decided = par_map(
            new_blocks,
            t,
            1024,
            |i| {
                if plans[i] != Plan::Replace {
                    return None;
                }
                let nb = blk_of(new, bs, i);
                let mut cands = Vec::with_capacity(2);
                if i < old_blocks {
                    cands.push(i as u64);
                }
                if let Some(c) = cand[i] {
                    cands.push(c);
                }
                let cands: Vec<u64> = cands
                    .into_iter()
                    .filter(|&c| similar(nb, blk_of(old, bs, c as usize)))
                    .collect();
                if cands.is_empty() {
                    return None;
                }
                let rep = encode_unit(codec, ver, bsz, bsz, nb).bytes.len();
                let mut best: Option<(usize, u64)> = None;
                let mut x = vec![0u8; bs];
                for c in cands {
                    let ob = blk_of(old, bs, c as usize);
                    for k in 0..bs {
                        x[k] = nb[k] ^ ob[k];
                    }
                    let n = encode_unit(codec, ver, bsz, bsz, &x).bytes.len();
                    if n < rep && best.is_none_or(|b| n < b.0) {
                        best = Some((n, c));
                    }
                }
                best.map(|b| b.1)
            },
            &noop,
        );
        for (i, d) in decided.into_iter().enumerate() {
            if let Some(c) = d {
                plans[i] = Plan::Xor(c);
            }
        }
    }
    Ok(plans)
}

/// Order COPY/XOR ops for a safe in-place merge. Returns the merge sequence (new blocks) and
/// turns ops that sit on dependency cycles into `Plan::Replace`. Returns the number of ops
/// converted.
pub fn order(plans: &mut [Plan]) -> (Vec<u32>, u64) {
    // Nodes: ordered ops. Edge A -> B ("A before B") when B's destination is A's source.
    let nodes: Vec<usize> = plans
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, Plan::Copy(_) | Plan::Xor(_)))
        .map(|(i, _)| i)
        .collect();
    let mut node_of: IdMap<u32> = IdMap::default();
    for (n, &b) in nodes.iter().enumerate() {
        node_of.insert(b as u64, n as u32);
    }
    let src = |p: Plan| match p {
        Plan::Copy(s) | Plan::Xor(s) => s,
        _ => u64::MAX,
    };
    let mut indeg = vec![0u32; nodes.len()];
    // succ[a] = b: b overwrites a's source (each op has one aligned source block).
    let mut succ: Vec<Option<u32>> = vec![None; nodes.len()];
    // preds[b] = ops reading block b (must merge before b).
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
    for (a, &blk) in nodes.iter().enumerate() {
        let s = src(plans[blk]);
        if s == blk as u64 {
            continue;
        }
        if let Some(&b) = node_of.get(&s) {
            succ[a] = Some(b);
            indeg[b as usize] += 1;
            preds[b as usize].push(a as u32);
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
                   succ: &Vec<Option<u32>>| {
        if let Some(b) = succ[n as usize] {
            indeg[b as usize] -= 1;
            if indeg[b as usize] == 0 {
                heap.push(std::cmp::Reverse(b));
            }
        }
    };
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
        let mut seen: IdMap<()> = IdMap::default();
        let mut v = scan as u32;
        while seen.insert(v.into(), ()).is_none() {
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

fn bar(opts: &GenerateOptions, len: u64, msg: &'static str) -> indicatif::ProgressBar {
    if opts.progress && std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(len);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_message(msg);
        b
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// Generate a COW for `old` → `new` into `sink`. Returns statistics.
pub fn generate<W: CowSink>(
    old: &[u8],
    new: &[u8],
    sink: W,
    opts: &GenerateOptions,
) -> Result<GenerateStats> {
    let bs = opts.writer.block_size as usize;
    let new_blocks = new.len() / bs;
    let t0 = std::time::Instant::now();
    let pb = bar(opts, new.len() as u64, "diffing");
    let tick = |n: u64| pb.inc(n * bs as u64);
    let mut plans = plan(old, new, opts, &tick)?;
    pb.finish_and_clear();
    let t1 = std::time::Instant::now();
    let (seq, breaks) = order(&mut plans);
    let t2 = std::time::Instant::now();

    let mut wopts = opts.writer;
    if wopts.op_count_max == 0 {
        wopts.op_count_max = (new_blocks as u64).max(1);
    }
    let mut stats = GenerateStats {
        new_blocks: new_blocks as u64,
        cycle_breaks: breaks,
        seconds_plan: (t1 - t0).as_secs_f64(),
        seconds_order: (t2 - t1).as_secs_f64(),
        ..Default::default()
    };
    let mut w = CowWriter::new(sink, wopts)?;
    let t = threads(opts.threads);
    let codec: Codec = wopts.codec;
    let blk = |i: usize| &new[i * bs..(i + 1) * bs];

    // XOR payloads, encoded in parallel, in sequence order.
    let xor_ops: Vec<(u32, u64)> = seq
        .iter()
        .filter_map(|&b| match plans[b as usize] {
            Plan::Xor(s) => Some((b, s)),
            _ => None,
        })
        .collect();
    let xor_payloads: Vec<EncodedUnit> = par_map(
        xor_ops.len(),
        t,
        256,
        |i| {
            let (b, s) = xor_ops[i];
            let ob = &old[s as usize * bs..(s as usize + 1) * bs];
            let x: Vec<u8> = blk(b as usize).iter().zip(ob).map(|(a, c)| a ^ c).collect();
            encode_unit(codec, wopts.version, wopts.block_size, wopts.block_size, &x)
        },
        &|_| {},
    );
    let mut xor_map: IdMap<EncodedUnit> = IdMap::default();
    for ((b, _), e) in xor_ops.iter().zip(xor_payloads) {
        xor_map.insert(u64::from(*b), e);
    }

    if opts.sequence && !seq.is_empty() && (wopts.version == 3 || wopts.cluster_ops >= 2) {
        w.add_sequence_data(&seq)?;
    }
    for &b in &seq {
        match plans[b as usize] {
            Plan::Copy(s) => {
                w.add_copy(b.into(), s, 1)?;
                stats.copy += 1;
            }
            Plan::Xor(s) => {
                let e = xor_map.remove(&u64::from(b)).ok_or_else(|| {
                    CowError::InvalidArgument("internal: missing XOR payload".into())
                })?;
                stats.xor += 1;
                stats.xor_payload_bytes += e.bytes.len() as u64;
                w.add_encoded_xor(b.into(), s * bs as u64, &e)?;
            }
            _ => {}
        }
    }
    w.add_label(0)?;

    // REPLACE runs → units (the writer's cut rule), encoded in parallel.
    let mut units: Vec<(u64, u32)> = Vec::new();
    let mut i = 0;
    while i < new_blocks {
        if plans[i] == Plan::Replace {
            let mut j = i;
            while j < new_blocks && plans[j] == Plan::Replace {
                j += 1;
            }
            units.extend(w.replace_units(i as u64, (j - i) as u64));
            i = j;
        } else {
            i += 1;
        }
    }
    let pb = bar(
        opts,
        units.iter().map(|u| u64::from(u.1) * bs as u64).sum(),
        "compressing",
    );
    let encoded: Vec<EncodedUnit> = par_map(
        units.len(),
        t,
        64,
        |k| {
            let (b, n) = units[k];
            let s = b as usize * bs;
            encode_unit(
                codec,
                wopts.version,
                wopts.block_size,
                wopts.max_compression_size,
                &new[s..s + n as usize * bs],
            )
        },
        &|n| pb.inc(n * bs as u64),
    );
    pb.finish_and_clear();
    // Write REPLACE and ZERO ops in ascending block order.
    let mut u = 0;
    let mut enc = encoded.into_iter();
    let mut b = 0usize;
    while b < new_blocks {
        match plans[b] {
            Plan::Zero => {
                w.add_zero_blocks(b as u64, 1)?;
                stats.zero += 1;
                b += 1;
            }
            Plan::Replace => {
                let (ub, n) = units[u];
                debug_assert_eq!(ub, b as u64);
                let e = enc
                    .next()
                    .ok_or_else(|| CowError::InvalidArgument("internal: missing unit".into()))?;
                stats.replace_payload_bytes += e.bytes.len() as u64;
                stats.replace_ops += 1;
                stats.replace_blocks += u64::from(n);
                w.add_encoded_replace(ub, &e)?;
                u += 1;
                b += n as usize;
            }
            Plan::Unchanged => {
                stats.unchanged += 1;
                b += 1;
            }
            _ => b += 1,
        }
    }
    stats.cow_bytes = w.finalize()?;
    stats.compressed_input_bytes = (stats.replace_blocks + stats.xor) * bs as u64;
    stats.seconds_write = t2.elapsed().as_secs_f64();
    Ok(stats)
}
