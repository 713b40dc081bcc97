//! Whole-file operations used by the CLI: inspect (summary), verify, apply.

use std::collections::BTreeMap;
use std::io::Write;

use crate::error::{CowError, Result};
use crate::format::Header;
use crate::io::ReadAt;
use crate::reader::{CowReader, OpKind};

/// Per-type op statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TypeStats {
    /// Ops of this type.
    pub ops: u64,
    /// Blocks produced (multi-block REPLACE counts each block).
    pub blocks: u64,
    /// Payload bytes stored in the file.
    pub payload_bytes: u64,
}

/// A summary of a COW file (what `snapblk cow inspect --json` prints).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Format version, `"major.minor"` (`"2.0"`, `"3.0"`).
    pub version: String,
    /// Length of the COW file in bytes.
    pub file_bytes: u64,
    /// The parsed header.
    pub header: Header,
    /// Name of the file-wide compression (`none`, `gz`, `brotli`, `lz4`, `zstd`).
    pub compression: String,
    /// File offset of the scratch area (`header_size`), `None` when the file has none.
    pub scratch_offset: Option<u64>,
    /// Size of the scratch area in bytes (`buffer_size`; 0 for none).
    pub scratch_size: u64,
    /// File offset of the `num_merge_ops` counter the merge updates (always 26).
    pub num_merge_ops_offset: u64,
    /// Op records parsed, metadata records (v2 LABEL, CLUSTER, SEQUENCE) included, the v2
    /// footer not.
    pub records: u64,
    /// Data ops (COPY, REPLACE, ZERO, XOR).
    pub data_ops: u64,
    /// Records per type: `copy`, `replace`, `zero`, `xor`, `label`, `sequence`, `cluster`.
    pub op_counts: BTreeMap<&'static str, u64>,
    /// Data op statistics per type (`copy`, `replace`, `zero`, `xor`).
    pub by_type: BTreeMap<&'static str, TypeStats>,
    /// Payload ops by the codec actually needed to decode them (`none` = stored raw).
    pub payload_codecs: BTreeMap<String, u64>,
    /// Labels in file order (v2 LABEL ops, v3 resume points).
    pub labels: Vec<u64>,
    /// v3 resume points `(label, number of ops valid at that label)`; empty for v2.
    pub resume_points: Vec<(u64, u64)>,
    /// Entries of the sequence data (the stored merge order of COPY/XOR ops); 0 for none.
    pub sequence_len: u64,
    /// The v2 footer, `None` for v3.
    pub footer: Option<crate::reader::Footer>,
    /// The merge order and whether it is safe.
    pub merge: MergeSummary,
}

/// Merge order summary.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MergeSummary {
    /// `sequence` (from sequence data), `file-order` (v3 without sequence), or
    /// `ordered-then-ascending` (v2 without sequence).
    pub source: &'static str,
    /// Data ops in the merge order (what `num_merge_ops` counts towards).
    pub total: u64,
    /// Length of the COPY/XOR prefix.
    pub ordered_prefix: u64,
    /// Entries already merged: the header's `num_merge_ops`.
    pub merged: u64,
    /// First entries (new blocks) of the merge order.
    pub first: Vec<u64>,
    /// `None` when the order is valid, else why not.
    pub error: Option<String>,
}

/// Summarise `cow`.
pub fn summarize<R: ReadAt>(cow: &CowReader<R>) -> Summary {
    let h = cow.header().clone();
    let mut op_counts = BTreeMap::new();
    let mut by_type: BTreeMap<&'static str, TypeStats> = BTreeMap::new();
    let mut payload_codecs = BTreeMap::new();
    for t in ["copy", "replace", "zero", "xor"] {
        op_counts.insert(t, 0);
        by_type.insert(t, TypeStats::default());
    }
    for op in cow.ops() {
        *op_counts.entry(op.type_name()).or_insert(0) += 1;
        if op.is_data() {
            let s = by_type.entry(op.type_name()).or_default();
            s.ops += 1;
            s.blocks += op.block_count();
            if let Some(p) = op.payload() {
                s.payload_bytes += u64::from(p.len);
                *payload_codecs
                    .entry(p.codec.name().to_string())
                    .or_insert(0) += 1;
            }
        }
    }
    let ordered_prefix = cow.merge_order().take_while(|o| o.is_ordered()).count() as u64;
    let source = if !cow.sequence().is_empty() {
        "sequence"
    } else if h.major >= 3 {
        "file-order"
    } else {
        "ordered-then-ascending"
    };
    Summary {
        version: format!("{}.{}", h.major, h.minor),
        file_bytes: cow.file_len(),
        compression: cow.compression().name().to_string(),
        scratch_offset: h.scratch().map(|s| s.offset),
        scratch_size: h.buffer_size.into(),
        num_merge_ops_offset: crate::format::NUM_MERGE_OPS_OFFSET,
        records: cow.ops().len() as u64,
        data_ops: cow.data_ops().count() as u64,
        op_counts,
        by_type,
        payload_codecs,
        labels: cow.labels(),
        resume_points: cow.resume_points().to_vec(),
        sequence_len: cow.sequence().len() as u64,
        footer: cow.footer(),
        merge: MergeSummary {
            source,
            total: cow.merge_len(),
            ordered_prefix,
            merged: h.num_merge_ops,
            first: cow.merge_order().take(16).map(|o| o.new_block).collect(),
            error: cow.verify_merge_order().err().map(|e| e.to_string()),
        },
        header: h,
    }
}

/// How far a COW reaches: the end (bytes) of the base bytes its COPY/XOR ops read and the end
/// (blocks) of the new-image blocks it writes, each with the op that reaches furthest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extent {
    /// End in bytes (exclusive) of the base bytes COPY/XOR ops read; 0 when none does.
    pub source_end: u64,
    /// Index of the op that reads up to `source_end`; `None` without COPY/XOR ops.
    pub source_op: Option<u64>,
    /// End in blocks (exclusive) of the new-image blocks data ops write; 0 without data ops.
    pub write_end_blocks: u64,
    /// Index of the op that writes up to `write_end_blocks`; `None` without data ops.
    pub write_op: Option<u64>,
}

/// See [`Extent`].
pub fn extent<R: ReadAt>(cow: &CowReader<R>) -> Extent {
    let bs = u64::from(cow.block_size());
    let mut e = Extent::default();
    for op in cow.data_ops() {
        let src_end = match op.kind {
            OpKind::Xor { source_offset, .. } => Some(source_offset.saturating_add(bs)),
            OpKind::Copy { source_block } => {
                Some(source_block.saturating_add(1).saturating_mul(bs))
            }
            _ => None,
        };
        if let Some(end) = src_end
            && end > e.source_end
        {
            e.source_end = end;
            e.source_op = Some(op.index);
        }
        let w = op.new_block.saturating_add(op.block_count());
        if w > e.write_end_blocks {
            e.write_end_blocks = w;
            e.write_op = Some(op.index);
        }
    }
    e
}

/// Materialise the new image into `out` (`len` bytes). `progress` is called with bytes done.
pub fn apply<R: ReadAt, B: ReadAt + ?Sized>(
    cow: &CowReader<R>,
    base: &B,
    len: u64,
    out: &mut dyn Write,
    progress: &dyn Fn(u64),
) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let base_len = base.size().map_err(crate::error::io_at(0))?;
    let mut off = 0;
    while off < len {
        let n = CHUNK.min(len - off) as usize;
        let b = &mut buf[..n];
        // Past the end of a shorter base, untouched blocks read as zeros.
        if off + n as u64 > base_len {
            read_padded(cow, base, base_len, off, b)?;
        } else {
            cow.read_at_new(off, b, base)?;
        }
        out.write_all(b).map_err(crate::error::io_at(off))?;
        off += n as u64;
        progress(n as u64);
    }
    Ok(())
}

fn read_padded<R: ReadAt, B: ReadAt + ?Sized>(
    cow: &CowReader<R>,
    base: &B,
    base_len: u64,
    off: u64,
    b: &mut [u8],
) -> Result<()> {
    let bs = u64::from(cow.block_size());
    for (k, chunk) in b.chunks_mut(bs as usize).enumerate() {
        let pos = off + k as u64 * bs;
        let blk = pos / bs;
        if cow.lookup(blk).is_none() && pos + chunk.len() as u64 > base_len {
            chunk.fill(0);
            if pos < base_len {
                let m = (base_len - pos) as usize;
                base.read_exact_at(pos, &mut chunk[..m])
                    .map_err(crate::error::io_at(pos))?;
            }
        } else {
            cow.read_at_new(pos, chunk, base)?;
        }
    }
    Ok(())
}

/// Result of [`verify`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct VerifyReport {
    /// Size of the new image in blocks (its length rounded up to whole blocks).
    pub blocks: u64,
    /// REPLACE and XOR payloads decoded successfully (all of them).
    pub payloads_decoded: u64,
    /// The merge order is safe (always true: an unsafe one is an error).
    pub merge_order_ok: bool,
    /// `Some(true)` when an expected image was given and the result equals it (a difference
    /// is an error); `None` without one.
    pub matches_expected: Option<bool>,
}

/// Verify a COW: structure (already checked at open), every payload decodes, merge order is
/// safe, sources are inside the base, writes inside the `image_len`-byte new image, and
/// (optionally) the result equals `expect`.
pub fn verify<R: ReadAt, B: ReadAt + ?Sized, E: ReadAt + ?Sized>(
    cow: &CowReader<R>,
    base: &B,
    image_len: u64,
    expect: Option<&E>,
) -> Result<VerifyReport> {
    let bs = u64::from(cow.block_size());
    let base_len = base.size().map_err(crate::error::io_at(0))?;
    let base_blocks = base_len / bs;
    for op in cow.data_ops() {
        if let Some((first, n)) = op.source_blocks(bs) {
            let end = match op.kind {
                OpKind::Xor { source_offset, .. } => source_offset + bs,
                _ => (first + n) * bs,
            };
            if end > base_len {
                return Err(CowError::OpPastDevice {
                    index: op.index,
                    block: first + n - 1,
                    device_blocks: base_blocks,
                });
            }
        }
    }
    let image_blocks = image_len.div_ceil(bs);
    for op in cow.data_ops() {
        if op.new_block.saturating_add(op.block_count()) > image_blocks {
            return Err(CowError::OpPastDevice {
                index: op.index,
                block: op.new_block.saturating_add(op.block_count()) - 1,
                device_blocks: image_blocks,
            });
        }
    }
    cow.verify_merge_order()?;
    let mut decoded = 0;
    let mut unit = Vec::new();
    for op in cow.data_ops() {
        if let Some(p) = op.payload() {
            unit.resize((u64::from(p.unit_blocks) * bs) as usize, 0);
            cow.decode_payload(op, &mut unit)?;
            decoded += 1;
        }
    }
    let blocks = image_blocks;
    let mut matches = None;
    if let Some(exp) = expect {
        let exp_len = exp.size().map_err(crate::error::io_at(0))?;
        let len = image_len;
        if exp_len != len {
            return Err(CowError::InvalidArgument(format!(
                "expected image is {exp_len} bytes, the COW produces {len}"
            )));
        }
        let mut a = vec![0u8; 1 << 20];
        let mut b = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < len {
            let n = (1u64 << 20).min(len - off) as usize;
            if off + n as u64 > base_len {
                read_padded(cow, base, base_len, off, &mut a[..n])?;
            } else {
                cow.read_at_new(off, &mut a[..n], base)?;
            }
            exp.read_exact_at(off, &mut b[..n])
                .map_err(crate::error::io_at(off))?;
            if a[..n] != b[..n] {
                let i = a[..n]
                    .iter()
                    .zip(&b[..n])
                    .position(|(x, y)| x != y)
                    .unwrap_or(0);
                return Err(CowError::InvalidArgument(format!(
                    "result differs from the expected image at byte {} (block {})",
                    off + i as u64,
                    (off + i as u64) / bs
                )));
            }
            off += n as u64;
        }
        matches = Some(true);
    }
    Ok(VerifyReport {
        blocks,
        payloads_decoded: decoded,
        merge_order_ok: true,
        matches_expected: matches,
    })
}

/// Apply the merge order op by op *in place* on `disk` (which starts as the base), reading
/// COPY/XOR sources from `disk` itself — exactly what an in-place merge does without a scratch
/// area. If the merge order is unsafe the result differs from the read view. Payloads of
/// REPLACE ops are decoded from the COW.
pub fn simulate_merge<R: ReadAt>(cow: &CowReader<R>, disk: &mut [u8]) -> Result<()> {
    let bs = cow.block_size() as usize;
    let mut unit = Vec::new();
    let mut blk = vec![0u8; bs];
    for op in cow.merge_order() {
        let d = op.new_block as usize * bs;
        let n = op.block_count() as usize * bs;
        if d + n > disk.len() {
            return Err(CowError::OpPastDevice {
                index: op.index,
                block: op.new_block,
                device_blocks: (disk.len() / bs) as u64,
            });
        }
        let src_range = |off: usize| -> Result<std::ops::Range<usize>> {
            (off + bs <= disk.len())
                .then_some(off..off + bs)
                .ok_or(CowError::BaseShort {
                    offset: off as u64,
                    need: bs as u64,
                })
        };
        match op.kind {
            OpKind::Zero => disk[d..d + bs].fill(0),
            OpKind::Copy { source_block } => {
                let r = src_range(source_block as usize * bs)?;
                blk.copy_from_slice(&disk[r]);
                disk[d..d + bs].copy_from_slice(&blk);
            }
            OpKind::Xor { source_offset, .. } => {
                let r = src_range(source_offset as usize)?;
                blk.copy_from_slice(&disk[r]);
                unit.resize(bs, 0);
                cow.decode_payload(op, &mut unit)?;
                crate::reader::xor_into(&mut blk, &unit);
                disk[d..d + bs].copy_from_slice(&blk);
            }
            OpKind::Replace { .. } => {
                unit.resize(n, 0);
                cow.decode_payload(op, &mut unit)?;
                disk[d..d + n].copy_from_slice(&unit);
            }
            _ => {}
        }
    }
    Ok(())
}

/// An image loaded for the generator: memory-mapped (raw files) or expanded (sparse).
pub enum Image {
    /// A raw regular file, mapped read-only.
    Mapped(memmap2::Mmap),
    /// An expanded sparse image, or a block device or other file read into memory.
    Owned(Vec<u8>),
}

impl std::ops::Deref for Image {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Image::Mapped(m) => m,
            Image::Owned(v) => v,
        }
    }
}

/// Load an image (raw, or Android sparse — detected by magic). Raw regular files are mapped
/// read-only (no copy); sparse images are expanded in memory, bounded by `max_len`.
pub fn load_image(path: &std::path::Path, max_len: u64) -> Result<Image> {
    let f = std::fs::File::open(path).map_err(crate::error::io_at(0))?;
    if crate::sparse::is_sparse(&f) {
        return crate::sparse::expand(&f, max_len).map(Image::Owned);
    }
    let len = ReadAt::size(&f).map_err(crate::error::io_at(0))?;
    if len == 0 {
        return Ok(Image::Owned(Vec::new()));
    }
    if f.metadata().map(|m| m.is_file()).unwrap_or(false) {
        // SAFETY: the mapping is read-only and private to this process; the caller's contract
        // (documented on the CLI) is that input images are not modified while a COW is being
        // created — the same assumption any reader of the file makes. A concurrent truncation
        // could raise SIGBUS, never undefined behaviour in safe code that runs afterwards.
        let m = unsafe { memmap2::MmapOptions::new().populate().map(&f) }
            .map_err(crate::error::io_at(0))?;
        return Ok(Image::Mapped(m));
    }
    // Block devices and other files: read into memory.
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(len as usize)
        .map_err(|_| CowError::InvalidArgument(format!("cannot allocate {len} bytes")))?;
    v.resize(len as usize, 0);
    f.read_exact_at(0, &mut v).map_err(crate::error::io_at(0))?;
    Ok(Image::Owned(v))
}

/// CPU time used so far by the whole process (all threads), in seconds; for benchmark output
/// that stays meaningful when other jobs share the cores.
pub(crate) fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass, which lives for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
