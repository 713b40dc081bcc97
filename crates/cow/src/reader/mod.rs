//! COW reader: parses v1/v2/v3 files, builds the block map and the merge order, decodes
//! payloads and reads blocks of the new image given a base.
//!
//! The op streams of the two format families are parsed in `reader/v2.rs` (v1/v2: 20-byte
//! records, clusters, footer) and `reader/v3.rs` (sequence area, resume points, v3 records);
//! everything after (map, merge order, reads) is shared and lives here.

mod v2;
mod v3;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::codec::{self, Compression, DecodeError};
use crate::error::{CowError, Result, io_at};
use crate::format::*;
use crate::io::{ReadAt, WriteAt};

/// Where an op's payload lives and how to decode it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Payload {
    /// Absolute file offset.
    pub offset: u64,
    /// Stored length in bytes (`data_length`).
    pub len: u32,
    /// Codec to decode with; `None` when the payload is stored raw (including lz4/zstd units that
    /// did not shrink).
    pub codec: Compression,
    /// The algorithm recorded for this op (v2: the op's byte; v3: the file's algorithm).
    pub recorded: Compression,
    /// Number of blocks the payload decodes to (the unit; >1 only for v3 multi-block REPLACE).
    pub unit_blocks: u32,
}

/// What an op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum OpKind {
    /// New block = base block `source_block`.
    Copy {
        /// Block number in the base (pre-merge old image), in blocks of `block_size`.
        source_block: u64,
    },
    /// New block(s) = decoded payload (one unit, `payload.unit_blocks` blocks).
    Replace {
        /// Where the new data is stored and how to decode it.
        payload: Payload,
    },
    /// New block = zeros.
    Zero,
    /// New block = decoded payload XOR `block_size` base bytes at byte offset `source_offset`.
    Xor {
        /// Byte offset in the base: old block × `block_size` + an offset below `block_size`.
        /// When not block-aligned the bytes span two base blocks.
        source_offset: u64,
        /// The stored XOR difference (always a single-block unit).
        payload: Payload,
    },
    /// v2 in-stream label (v3 labels are resume points, see [`CowReader::resume_points`]).
    Label {
        /// The label value the writer chose (update_engine: the number of install operations
        /// complete).
        label: u64,
    },
    /// v2 SEQUENCE op: payload is an array of u32 new blocks.
    Sequence {
        /// The uncompressed array of little-endian u32 new blocks (at most two blocks' worth).
        payload: Payload,
    },
    /// v2 CLUSTER op: bytes skipped to the next cluster.
    Cluster {
        /// Bytes from the end of this record to the next cluster: unused record slots after
        /// it plus the cluster's payload bytes.
        skip: u64,
    },
}

/// One op record, in file order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Op {
    /// Index of the record in the file's op stream (v2: counting metadata records; v3: array slot).
    pub index: u64,
    /// Absolute file offset of the record.
    pub record_offset: u64,
    /// Target block (first block of the unit for multi-block REPLACE; 0 for metadata ops).
    pub new_block: u64,
    /// The op's type with its source and payload.
    pub kind: OpKind,
}

impl Op {
    /// True for COPY, REPLACE, ZERO, XOR.
    pub fn is_data(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Copy { .. } | OpKind::Replace { .. } | OpKind::Zero | OpKind::Xor { .. }
        )
    }
    /// True for COPY and XOR (ops whose result depends on the base; they need merge ordering).
    pub fn is_ordered(&self) -> bool {
        matches!(self.kind, OpKind::Copy { .. } | OpKind::Xor { .. })
    }
    /// Number of new blocks this op produces (0 for metadata ops).
    pub fn block_count(&self) -> u64 {
        match self.kind {
            OpKind::Replace { payload } => payload.unit_blocks.into(),
            OpKind::Copy { .. } | OpKind::Zero | OpKind::Xor { .. } => 1,
            _ => 0,
        }
    }
    /// Base blocks this op reads: `(first, count)`; XOR at a non-zero byte offset spans two.
    pub fn source_blocks(&self, block_size: u64) -> Option<(u64, u64)> {
        match self.kind {
            OpKind::Copy { source_block } => Some((source_block, 1)),
            OpKind::Xor { source_offset, .. } => Some((
                source_offset / block_size,
                if source_offset % block_size == 0 {
                    1
                } else {
                    2
                },
            )),
            _ => None,
        }
    }
    /// The op's payload, if any.
    pub fn payload(&self) -> Option<Payload> {
        match self.kind {
            OpKind::Replace { payload }
            | OpKind::Xor { payload, .. }
            | OpKind::Sequence { payload } => Some(payload),
            _ => None,
        }
    }
    /// Short type name (`copy`, `replace`, ...).
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            OpKind::Copy { .. } => "copy",
            OpKind::Replace { .. } => "replace",
            OpKind::Zero => "zero",
            OpKind::Xor { .. } => "xor",
            OpKind::Label { .. } => "label",
            OpKind::Sequence { .. } => "sequence",
            OpKind::Cluster { .. } => "cluster",
        }
    }
}

/// How to treat two data ops naming the same new block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DuplicatePolicy {
    /// Reject the file (strict; the default).
    #[default]
    Reject,
    /// First op in file order wins (what snapuserd boots).
    FirstWins,
    /// Last op wins (update_engine's reader; also what an append-only overlay needs).
    LastWins,
}

/// Options for [`CowReader::open_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Device size in blocks; data ops past it are rejected.
    pub device_blocks: Option<u64>,
    /// Base size in blocks; COPY/XOR sources past it are rejected.
    pub base_blocks: Option<u64>,
    /// Open "at label": keep only ops written before this label (v2 LABEL op / v3 resume point).
    pub label: Option<u64>,
    /// What to do when two data ops write the same new block (default: reject the file).
    pub duplicates: DuplicatePolicy,
}

/// Parsed footer of a v2 file (format §5.3): an 84-byte record after the last op record and
/// payload. The reader checks both counts against the stream it walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Footer {
    /// Absolute file offset of the footer; a finalized file ends 84 bytes later.
    pub offset: u64,
    /// Number of op records before the footer, LABEL, CLUSTER and SEQUENCE records included.
    pub num_ops: u64,
    /// Bytes of those records: `num_ops × 20`.
    pub ops_size: u64,
}

/// A parsed COW file.
///
/// ```no_run
/// # use snapblk_cow::{CowReader, ReadAt};
/// let cow = CowReader::open(std::fs::File::open("snapshot.cow")?)?;
/// let base = std::fs::File::open("base.img")?;
/// let mut block = vec![0u8; cow.block_size() as usize];
/// cow.read_block(7, &base, &mut block)?;
/// for op in cow.merge_order() { println!("{} -> {}", op.type_name(), op.new_block); }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CowReader<R> {
    src: R,
    file_len: u64,
    header: Header,
    compression: Compression,
    ops: Vec<Op>,
    /// Sorted `(first block, block count, index into ops)` for the winning data ops.
    map: Vec<(u64, u32, u32)>,
    merge_order: Vec<u32>,
    sequence: Vec<u32>,
    resume_points: Vec<(u64, u64)>,
    footer: Option<Footer>,
    data_end: u64,
}

/// Reads records through a window so walking a large op stream is not one syscall per record.
struct Window<'a, R: ReadAt> {
    src: &'a R,
    file_len: u64,
    start: u64,
    buf: Vec<u8>,
}

impl<'a, R: ReadAt> Window<'a, R> {
    const SIZE: u64 = 64 * 1024;
    fn new(src: &'a R, file_len: u64) -> Self {
        Window {
            src,
            file_len,
            start: 0,
            buf: Vec::new(),
        }
    }
    fn get(&mut self, off: u64, n: usize, what: &'static str) -> Result<&[u8]> {
        let end = off.checked_add(n as u64).filter(|&e| e <= self.file_len);
        let Some(end) = end else {
            return Err(CowError::Truncated {
                what,
                offset: off,
                need: n as u64,
                len: self.file_len,
            });
        };
        if off < self.start || end > self.start + self.buf.len() as u64 {
            let want = Self::SIZE.max(n as u64).min(self.file_len - off);
            self.buf.resize(want as usize, 0);
            self.src
                .read_exact_at(off, &mut self.buf)
                .map_err(io_at(off))?;
            self.start = off;
        }
        let s = (off - self.start) as usize;
        Ok(&self.buf[s..s + n])
    }
}

fn read_vec<R: ReadAt>(
    src: &R,
    off: u64,
    len: u64,
    file_len: u64,
    what: &'static str,
) -> Result<Vec<u8>> {
    if off.checked_add(len).is_none_or(|e| e > file_len) {
        return Err(CowError::Truncated {
            what,
            offset: off,
            need: len,
            len: file_len,
        });
    }
    let mut v = vec![0u8; len as usize];
    src.read_exact_at(off, &mut v).map_err(io_at(off))?;
    Ok(v)
}

impl<R: ReadAt> CowReader<R> {
    /// Open and fully validate a COW file with default options (duplicates rejected, no device
    /// size check).
    pub fn open(src: R) -> Result<Self> {
        Self::open_with(src, OpenOptions::default())
    }

    /// Open with options.
    pub fn open_with(src: R, opts: OpenOptions) -> Result<Self> {
        let file_len = src.size().map_err(io_at(0))?;
        let mut pre = [0u8; HEADER_V3_SIZE as usize];
        let n = (file_len.min(HEADER_V3_SIZE.into())) as usize;
        src.read_exact_at(0, &mut pre[..n]).map_err(io_at(0))?;
        let header = Header::parse(&pre[..n])?;
        let ops_start = header.ops_start();
        if ops_start > file_len {
            return Err(CowError::Truncated {
                what: "scratch area",
                offset: header.header_size.into(),
                need: header.buffer_size.into(),
                len: file_len,
            });
        }
        let mut r = CowReader {
            src,
            file_len,
            compression: Compression::None,
            header,
            ops: Vec::new(),
            map: Vec::new(),
            merge_order: Vec::new(),
            sequence: Vec::new(),
            resume_points: Vec::new(),
            footer: None,
            data_end: ops_start,
        };
        if r.header.major >= 3 {
            r.parse_v3(&opts)?;
        } else {
            r.parse_v2(&opts)?;
        }
        r.build_map(&opts)?;
        r.build_merge_order()?;
        Ok(r)
    }

    fn check_new_block(
        &self,
        opts: &OpenOptions,
        index: u64,
        block: u64,
        count: u64,
    ) -> Result<()> {
        if let Some(dev) = opts.device_blocks
            && block.checked_add(count).is_none_or(|e| e > dev)
        {
            return Err(CowError::OpPastDevice {
                index,
                block: block.saturating_add(count.saturating_sub(1)),
                device_blocks: dev,
            });
        }
        Ok(())
    }

    fn check_source(&self, opts: &OpenOptions, op: &Op) -> Result<()> {
        let bs = u64::from(self.header.block_size);
        if let (Some(base), Some((first, n))) = (opts.base_blocks, op.source_blocks(bs))
            && first.checked_add(n).is_none_or(|e| e > base)
        {
            return Err(CowError::OpPastDevice {
                index: op.index,
                block: first + n - 1,
                device_blocks: base,
            });
        }
        Ok(())
    }

    fn payload_in_file(&self, index: u64, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.file_len) {
            return Err(CowError::PayloadPastEnd {
                index,
                offset,
                len,
                file_len: self.file_len,
            });
        }
        Ok(())
    }

    fn build_map(&mut self, opts: &OpenOptions) -> Result<()> {
        let mut map: Vec<(u64, u32, u32)> = Vec::with_capacity(self.ops.len());
        for (i, op) in self.ops.iter().enumerate() {
            if op.is_data() {
                map.push((op.new_block, op.block_count() as u32, i as u32));
            }
        }
        // Stable sort keeps file order among equal start blocks.
        map.sort_by_key(|e| e.0);
        let mut out: Vec<(u64, u32, u32)> = Vec::with_capacity(map.len());
        for e in map {
            if let Some(last) = out.last_mut()
                && e.0 < last.0 + u64::from(last.1)
            {
                let (first, dup) = (
                    self.ops[last.2 as usize].index,
                    self.ops[e.2 as usize].index,
                );
                let same_shape = e.0 == last.0 && e.1 == last.1;
                match opts.duplicates {
                    DuplicatePolicy::FirstWins if same_shape => continue,
                    DuplicatePolicy::LastWins if same_shape => {
                        *last = e;
                        continue;
                    }
                    _ => {
                        return Err(CowError::DuplicateTarget {
                            index: dup.max(first),
                            block: e.0,
                            first: dup.min(first),
                        });
                    }
                }
            }
            out.push(e);
        }
        self.map = out;
        Ok(())
    }

    fn map_index(&self, block: u64) -> Option<usize> {
        let pos = self.map.partition_point(|e| e.0 <= block);
        let e = self.map.get(pos.checked_sub(1)?)?;
        (block < e.0 + u64::from(e.1)).then_some(e.2 as usize)
    }

    fn build_merge_order(&mut self) -> Result<()> {
        let winners: FxHashSet<u32> = self.map.iter().map(|e| e.2).collect();
        let mut order: Vec<u32> = Vec::with_capacity(self.map.len());
        if !self.sequence.is_empty() {
            let by_start: FxHashMap<u64, u32> = self.map.iter().map(|e| (e.0, e.2)).collect();
            let mut used: FxHashSet<u32> =
                FxHashSet::with_capacity_and_hasher(self.sequence.len(), Default::default());
            for (i, &b) in self.sequence.iter().enumerate() {
                let Some(&oi) = by_start.get(&u64::from(b)) else {
                    return Err(CowError::BadSequence {
                        entry: i as u64,
                        block: b.into(),
                        reason: "no data op starts at this block",
                    });
                };
                if !used.insert(oi) {
                    return Err(CowError::BadSequence {
                        entry: i as u64,
                        block: b.into(),
                        reason: "block listed twice",
                    });
                }
                order.push(oi);
            }
            let mut rest: Vec<u32> = self
                .map
                .iter()
                .filter(|e| !used.contains(&e.2))
                .map(|e| e.2)
                .collect();
            rest.sort_by_key(|&i| self.ops[i as usize].new_block);
            order.extend(rest);
        } else if self.header.major >= 3 {
            order.extend((0..self.ops.len() as u32).filter(|i| winners.contains(i)));
        } else {
            order.extend(
                (0..self.ops.len() as u32)
                    .filter(|&i| winners.contains(&i) && self.ops[i as usize].is_ordered()),
            );
            let mut rest: Vec<u32> = self
                .map
                .iter()
                .filter(|e| !self.ops[e.2 as usize].is_ordered())
                .map(|e| e.2)
                .collect();
            rest.sort_by_key(|&i| self.ops[i as usize].new_block);
            order.extend(rest);
        }
        self.merge_order = order;
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Accessors

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.header.block_size
    }
    /// File-wide compression algorithm (v2: derived from the first compressed op).
    pub fn compression(&self) -> Compression {
        self.compression
    }
    /// Size of the COW file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }
    /// End of the last op record / payload / footer (where an appender continues); v3: never
    /// before the payload area, which follows every op slot.
    pub fn data_end(&self) -> u64 {
        self.data_end
    }
    /// Every op record in file order (v2 includes LABEL/CLUSTER/SEQUENCE; the footer is in
    /// [`footer`](Self::footer)).
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }
    /// Data ops (COPY/REPLACE/ZERO/XOR) in file order.
    pub fn data_ops(&self) -> impl Iterator<Item = &Op> {
        self.ops.iter().filter(|o| o.is_data())
    }
    /// The v2 footer (None for v3 or when opened at a label).
    pub fn footer(&self) -> Option<Footer> {
        self.footer
    }
    /// Sequence data (merge order of ordered ops), empty if the file has none.
    pub fn sequence(&self) -> &[u32] {
        &self.sequence
    }
    /// v3 resume points `(label, op_index)`.
    pub fn resume_points(&self) -> &[(u64, u64)] {
        &self.resume_points
    }
    /// Labels in order: v2 LABEL ops / v3 resume points.
    pub fn labels(&self) -> Vec<u64> {
        if self.header.major >= 3 {
            self.resume_points.iter().map(|r| r.0).collect()
        } else {
            self.ops
                .iter()
                .filter_map(|o| match o.kind {
                    OpKind::Label { label } => Some(label),
                    _ => None,
                })
                .collect()
        }
    }
    /// The op that produces `new_block` (for a multi-block REPLACE, any block of its unit).
    pub fn lookup(&self, new_block: u64) -> Option<&Op> {
        self.map_index(new_block).map(|i| &self.ops[i])
    }
    /// Block map entries `(first block, block count, &op)` sorted by block.
    pub(crate) fn block_map(&self) -> impl Iterator<Item = (u64, u32, &Op)> {
        self.map.iter().map(|e| (e.0, e.1, &self.ops[e.2 as usize]))
    }
    /// Number of data ops in the merge order (what `num_merge_ops` counts towards).
    pub fn merge_len(&self) -> u64 {
        self.merge_order.len() as u64
    }
    /// Data ops in the order Android merges them (format §9.2), including already-merged ones;
    /// skip `header().num_merge_ops` entries to resume.
    pub fn merge_order(&self) -> impl ExactSizeIterator<Item = &Op> + '_ {
        self.merge_order.iter().map(|&i| &self.ops[i as usize])
    }
    /// The underlying source.
    pub fn source(&self) -> &R {
        &self.src
    }

    // ----------------------------------------------------------------------------------------
    // Validation

    /// Check the merge order rules (format §9.2): every ordered op precedes every non-ordered
    /// op, and no ordered op reads a block written by an earlier ordered op.
    pub fn verify_merge_order(&self) -> Result<()> {
        let bs = u64::from(self.header.block_size);
        let mut written: FxHashSet<u64> = FxHashSet::default();
        let mut seen_unordered: Option<u64> = None;
        for (pos, op) in self.merge_order().enumerate() {
            if op.is_ordered() {
                if let Some(first) = seen_unordered {
                    return Err(CowError::MergeOrder {
                        position: pos as u64,
                        index: op.index,
                        block: op.new_block,
                        reason: format!(
                            "{} op follows a non-ordered op (merge position {first}); COPY/XOR ops must come first (write sequence data or put them first)",
                            op.type_name().to_uppercase()
                        ),
                    });
                }
                if let Some((first, n)) = op.source_blocks(bs) {
                    for s in first..first + n {
                        if written.contains(&s) {
                            return Err(CowError::MergeOrder {
                                position: pos as u64,
                                index: op.index,
                                block: op.new_block,
                                reason: format!(
                                    "reads base block {s}, which an earlier op in the merge order has already overwritten"
                                ),
                            });
                        }
                    }
                }
                written.insert(op.new_block);
            } else if seen_unordered.is_none() {
                seen_unordered = Some(pos as u64);
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Data

    /// Decode `op`'s payload into `out`, which must be exactly one unit
    /// (`payload.unit_blocks * block_size` bytes).
    pub fn decode_payload(&self, op: &Op, out: &mut [u8]) -> Result<()> {
        let p = match op.kind {
            OpKind::Replace { payload } | OpKind::Xor { payload, .. } => payload,
            _ => {
                return Err(CowError::InvalidArgument(format!(
                    "op {} ({}) has no block payload",
                    op.index,
                    op.type_name()
                )));
            }
        };
        let unit = u64::from(p.unit_blocks) * u64::from(self.header.block_size);
        if out.len() as u64 != unit {
            return Err(CowError::InvalidArgument(format!(
                "output buffer is {} bytes, op {} decodes to {unit}",
                out.len(),
                op.index
            )));
        }
        let mut buf = Vec::new();
        let input: &[u8] = if p.codec == Compression::None {
            if u64::from(p.len) != unit {
                return Err(CowError::DecodedTooShort {
                    index: op.index,
                    offset: p.offset,
                    got: p.len.into(),
                    unit,
                });
            }
            self.src
                .read_exact_at(p.offset, out)
                .map_err(io_at(p.offset))?;
            return Ok(());
        } else {
            buf.resize(p.len as usize, 0);
            self.src
                .read_exact_at(p.offset, &mut buf)
                .map_err(io_at(p.offset))?;
            &buf
        };
        codec::decompress(p.codec, input, out).map_err(|e| match e {
            DecodeError::Corrupt(source) => CowError::Corrupt {
                index: op.index,
                offset: p.offset,
                codec: p.codec,
                source,
            },
            DecodeError::TooLong => CowError::DecodedTooLong {
                index: op.index,
                offset: p.offset,
                unit,
            },
            DecodeError::TooShort(got) => CowError::DecodedTooShort {
                index: op.index,
                offset: p.offset,
                got: got as u64,
                unit,
            },
        })
    }

    /// Read one block of the new image. `base` is the pre-merge old image.
    pub fn read_block<B: ReadAt + ?Sized>(
        &self,
        new_block: u64,
        base: &B,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = u64::from(self.header.block_size);
        if out.len() as u64 != bs {
            return Err(CowError::InvalidArgument(format!(
                "block buffer is {} bytes, block size is {bs}",
                out.len()
            )));
        }
        match self.lookup(new_block) {
            None => read_base(base, new_block.saturating_mul(bs), out),
            Some(op) => self.resolve(op, new_block, base, out, &mut Vec::new()),
        }
    }

    fn resolve<B: ReadAt + ?Sized>(
        &self,
        op: &Op,
        new_block: u64,
        base: &B,
        out: &mut [u8],
        unit_buf: &mut Vec<u8>,
    ) -> Result<()> {
        let bs = u64::from(self.header.block_size);
        match op.kind {
            OpKind::Zero => {
                out.fill(0);
                Ok(())
            }
            OpKind::Copy { source_block } => read_base(base, source_block.saturating_mul(bs), out),
            OpKind::Replace { payload } if payload.unit_blocks == 1 => self.decode_payload(op, out),
            OpKind::Replace { payload } => {
                unit_buf.resize((u64::from(payload.unit_blocks) * bs) as usize, 0);
                self.decode_payload(op, unit_buf)?;
                let s = ((new_block - op.new_block) * bs) as usize;
                out.copy_from_slice(&unit_buf[s..s + bs as usize]);
                Ok(())
            }
            OpKind::Xor { source_offset, .. } => {
                read_base(base, source_offset, out)?;
                unit_buf.resize(bs as usize, 0);
                self.decode_payload(op, unit_buf)?;
                xor_into(out, unit_buf);
                Ok(())
            }
            _ => Err(CowError::InvalidArgument(format!(
                "op {} is not a data op",
                op.index
            ))),
        }
    }

    /// Read `buf.len()` bytes of the new image at byte `offset` (any alignment).
    pub fn read_at_new<B: ReadAt + ?Sized>(
        &self,
        offset: u64,
        buf: &mut [u8],
        base: &B,
    ) -> Result<()> {
        let bs = u64::from(self.header.block_size);
        let mut block = vec![0u8; bs as usize];
        let mut unit_buf = Vec::new();
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let b = pos / bs;
            let within = (pos % bs) as usize;
            let n = (bs as usize - within).min(buf.len() - done);
            match self.lookup(b) {
                None => read_base(base, pos, &mut buf[done..done + n])?,
                Some(op) => {
                    self.resolve(op, b, base, &mut block, &mut unit_buf)?;
                    buf[done..done + n].copy_from_slice(&block[within..within + n]);
                }
            }
            done += n;
        }
        Ok(())
    }
}

/// XOR `src` into `dst` (equal lengths).
pub(crate) fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= *s;
    }
}

fn read_base<B: ReadAt + ?Sized>(base: &B, offset: u64, out: &mut [u8]) -> Result<()> {
    base.read_exact_at(offset, out).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CowError::BaseShort {
                offset,
                need: out.len() as u64,
            }
        } else {
            CowError::Io { offset, source: e }
        }
    })
}

// --------------------------------------------------------------------------------------------
// Merge progress (format §10)

/// Persist `num_merge_ops` in place (header offset 26) and make it durable, as snapuserd does
/// after the corresponding base writes have been flushed.
pub fn write_num_merge_ops<W: WriteAt + ?Sized>(cow: &W, value: u64) -> Result<()> {
    cow.write_all_at(NUM_MERGE_OPS_OFFSET, &value.to_le_bytes())
        .map_err(io_at(NUM_MERGE_OPS_OFFSET))?;
    cow.sync_data().map_err(io_at(NUM_MERGE_OPS_OFFSET))
}

/// Read the current `num_merge_ops` straight from the file (no full parse).
pub fn read_num_merge_ops<R: ReadAt + ?Sized>(cow: &R) -> Result<u64> {
    let mut b = [0u8; 8];
    cow.read_exact_at(NUM_MERGE_OPS_OFFSET, &mut b)
        .map_err(io_at(NUM_MERGE_OPS_OFFSET))?;
    Ok(u64::from_le_bytes(b))
}
