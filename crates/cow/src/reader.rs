//! COW reader: parses v1/v2/v3 files, builds the block map and the merge order, decodes
//! payloads and reads blocks of the new image given a base.

use std::collections::{HashMap, HashSet};

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
    Copy { source_block: u64 },
    /// New block(s) = decoded payload (one unit, `payload.unit_blocks` blocks).
    Replace { payload: Payload },
    /// New block = zeros.
    Zero,
    /// New block = decoded payload XOR `block_size` base bytes at byte offset `source_offset`.
    Xor {
        source_offset: u64,
        payload: Payload,
    },
    /// v2 in-stream label (v3 labels are resume points, see [`CowReader::resume_points`]).
    Label { label: u64 },
    /// v2 SEQUENCE op: payload is an array of u32 new blocks.
    Sequence { payload: Payload },
    /// v2 CLUSTER op: bytes skipped to the next cluster.
    Cluster { skip: u64 },
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
    pub duplicates: DuplicatePolicy,
}

/// Parsed footer of a v2 file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Footer {
    pub offset: u64,
    pub num_ops: u64,
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

    fn parse_v2(&mut self, opts: &OpenOptions) -> Result<()> {
        let h = self.header.clone();
        let bs = u64::from(h.block_size);
        let k = u64::from(h.cluster_ops);
        let ops_start = h.ops_start();
        let mut op_pos = ops_start;
        let mut data_pos = if k > 0 {
            ops_start + 20 * k
        } else {
            ops_start + 20
        };
        let mut index: u64 = 0;
        let mut seen_data = false;
        let mut file_algo: Option<Compression> = None;
        let mut win = Window::new(&self.src, self.file_len);
        let mut found_label = false;
        // End of the previous SEQUENCE payload (they must not overlap: memory stays bounded by
        // the file size).
        let mut seq_end = 0u64;
        // (end, index, offset, len) of the payload reaching furthest; the footer must follow it.
        let mut last_payload: Option<(u64, u64, u64, u64)> = None;
        loop {
            if op_pos.checked_add(20).is_none_or(|e| e > self.file_len) {
                if opts.label.is_some() {
                    break;
                }
                return Err(CowError::MissingFooter {
                    offset: op_pos,
                    len: self.file_len,
                });
            }
            let mut rec = [0u8; 20];
            rec.copy_from_slice(win.get(op_pos, 20, "op record")?);
            let raw = decode_op_v2(&rec);
            let bad = move |reason| CowError::BadOp {
                index,
                offset: op_pos,
                reason,
            };
            if raw.op_type == op_type::FOOTER {
                if opts.label.is_some() {
                    break;
                }
                let f = win.get(op_pos, FOOTER_V2_SIZE as usize, "footer")?;
                let mut fb = [0u8; 20];
                fb.copy_from_slice(&f[..20]);
                let fr = decode_op_v2(&fb);
                if fr.data_length != 64 {
                    return Err(bad("footer data_length must be 64"));
                }
                // Payloads precede the footer: one past it would lie where an appender (the
                // snapshot's overlay journal) writes.
                if let Some((end, i, off, plen)) = last_payload
                    && end > op_pos
                {
                    return Err(CowError::PayloadOutsideData {
                        index: i,
                        offset: off,
                        len: plen,
                        start: ops_start,
                        end: op_pos,
                    });
                }
                let (num_ops, ops_size) = (fr.source, fr.new_block);
                if num_ops != index {
                    return Err(CowError::FooterMismatch {
                        offset: op_pos,
                        field: "num_ops",
                        found: num_ops,
                        expected: index,
                    });
                }
                if ops_size != index * 20 {
                    return Err(CowError::FooterMismatch {
                        offset: op_pos,
                        field: "ops_size",
                        found: ops_size,
                        expected: index * 20,
                    });
                }
                self.footer = Some(Footer {
                    offset: op_pos,
                    num_ops,
                    ops_size,
                });
                self.data_end = self.data_end.max(op_pos + u64::from(FOOTER_V2_SIZE));
                break;
            }
            let len = u64::from(raw.data_length);
            let algo = Compression::from_id(raw.compression.into()).ok_or(
                CowError::UnknownCompression {
                    index,
                    offset: op_pos,
                    id: raw.compression.into(),
                },
            )?;
            let has_payload = matches!(
                raw.op_type,
                op_type::REPLACE | op_type::XOR | op_type::SEQUENCE
            );
            if !has_payload && len != 0 {
                return Err(bad(
                    "op type carries no payload but data_length is non-zero",
                ));
            }
            if !has_payload && algo != Compression::None {
                return Err(bad("op type carries no payload but has a compression id"));
            }
            if raw.op_type != op_type::LABEL {
                if raw.new_block >= 1 << 32 {
                    return Err(bad("new_block must be below 2^32"));
                }
                if raw.source >= 1 << 48 {
                    return Err(bad("source must be below 2^48"));
                }
            }
            if algo != Compression::None && raw.op_type != op_type::SEQUENCE {
                match file_algo {
                    None => file_algo = Some(algo),
                    Some(f) if f != algo => {
                        return Err(CowError::MixedCompression {
                            index,
                            file: f,
                            found: algo,
                        });
                    }
                    _ => {}
                }
            }
            let payload_at = |offset: u64, codec: Compression| Payload {
                offset,
                len: raw.data_length.into(),
                codec,
                recorded: algo,
                unit_blocks: 1,
            };
            let kind = match raw.op_type {
                op_type::COPY => OpKind::Copy {
                    source_block: raw.source,
                },
                op_type::ZERO => OpKind::Zero,
                op_type::REPLACE => OpKind::Replace {
                    payload: payload_at(raw.source, algo),
                },
                op_type::XOR => OpKind::Xor {
                    source_offset: raw.source,
                    payload: payload_at(data_pos, algo),
                },
                op_type::LABEL => OpKind::Label { label: raw.source },
                op_type::CLUSTER => {
                    if k == 0 {
                        return Err(bad("CLUSTER op in an unclustered file"));
                    }
                    OpKind::Cluster { skip: raw.source }
                }
                op_type::SEQUENCE => {
                    if k == 0 {
                        return Err(bad(
                            "SEQUENCE op in an unclustered v2 file (AOSP writes such files corrupt)",
                        ));
                    }
                    if seen_data {
                        return Err(bad("SEQUENCE op after a data op"));
                    }
                    if algo != Compression::None {
                        return Err(bad("SEQUENCE payload must be uncompressed"));
                    }
                    if len % 4 != 0 {
                        return Err(bad("SEQUENCE payload length is not a multiple of 4"));
                    }
                    // Format §11: at most 2 blocks of entries per SEQUENCE op.
                    if len > 2 * bs {
                        return Err(CowError::PayloadTooLarge {
                            index,
                            len,
                            limit: 2 * bs,
                        });
                    }
                    if raw.source < seq_end {
                        return Err(CowError::SequenceOverlap {
                            index,
                            offset: raw.source,
                            prev_end: seq_end,
                        });
                    }
                    // Every entry must name a distinct data op, and those records (20 bytes
                    // each) all follow this one: more entries than that cannot be valid.
                    let entries = self.sequence.len() as u64 + len / 4;
                    let limit = self.file_len.saturating_sub(op_pos + 20) / 20;
                    if entries > limit {
                        return Err(CowError::SequenceTooLong {
                            index,
                            entries,
                            limit,
                        });
                    }
                    seq_end = raw.source.saturating_add(len);
                    OpKind::Sequence {
                        payload: payload_at(raw.source, Compression::None),
                    }
                }
                t => {
                    return Err(CowError::UnknownOpType {
                        index,
                        offset: op_pos,
                        op_type: t,
                    });
                }
            };
            let op = Op {
                index,
                record_offset: op_pos,
                new_block: if matches!(
                    raw.op_type,
                    op_type::COPY | op_type::ZERO | op_type::REPLACE | op_type::XOR
                ) {
                    raw.new_block
                } else {
                    0
                },
                kind,
            };
            if let Some(p) = op.payload() {
                let plen = u64::from(p.len);
                self.payload_in_file(index, p.offset, plen)?;
                // Not in the header or the scratch area (the merge overwrites scratch).
                if p.offset < ops_start {
                    return Err(CowError::PayloadOutsideData {
                        index,
                        offset: p.offset,
                        len: plen,
                        start: ops_start,
                        end: self.file_len,
                    });
                }
                if op.is_data() && p.len == 0 {
                    return Err(bad("data payload is empty"));
                }
                let end = p.offset + plen;
                if last_payload.is_none_or(|l| end > l.0) {
                    last_payload = Some((end, index, p.offset, plen));
                }
                self.data_end = self.data_end.max(end);
            }
            if op.is_data() {
                seen_data = true;
                self.check_new_block(opts, index, op.new_block, 1)?;
                self.check_source(opts, &op)?;
            }
            if let OpKind::Sequence { payload } = op.kind {
                let bytes = read_vec(
                    &self.src,
                    payload.offset,
                    payload.len.into(),
                    self.file_len,
                    "sequence payload",
                )?;
                self.sequence.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            let is_label_stop =
                matches!(op.kind, OpKind::Label { label } if Some(label) == opts.label);
            self.ops.push(op);
            index += 1;
            // Advance per format §5.1 / §5.2.
            let (op_adv, data_adv) = if k > 0 {
                match op.kind {
                    OpKind::Cluster { skip } => (20u64.checked_add(skip), len.checked_add(20 * k)),
                    _ => (Some(20), Some(len)),
                }
            } else {
                let skip = if matches!(raw.op_type, op_type::REPLACE | op_type::XOR) {
                    len
                } else {
                    0
                };
                (Some(20 + skip), Some(len + 20))
            };
            op_pos = op_adv
                .and_then(|a| op_pos.checked_add(a))
                .ok_or(bad("op stream position overflows"))?;
            data_pos = data_adv
                .and_then(|a| data_pos.checked_add(a))
                .ok_or(bad("data position overflows"))?;
            if is_label_stop {
                found_label = true;
                break;
            }
        }
        if let Some(label) = opts.label
            && !found_label
        {
            return Err(CowError::LabelNotFound { label });
        }
        if let Some(a) = file_algo {
            self.compression = a;
        }
        // Raw-vs-compressed decision (format §6.3, v2): decode with the file-wide algorithm
        // unless the file is uncompressed, or lz4/zstd payloads are exactly one block.
        let fa = self.compression;
        for op in &mut self.ops {
            let p = match &mut op.kind {
                OpKind::Replace { payload } | OpKind::Xor { payload, .. } => payload,
                _ => continue,
            };
            p.codec = if fa == Compression::None
                || (matches!(fa, Compression::Lz4 | Compression::Zstd) && u64::from(p.len) == bs)
            {
                Compression::None
            } else {
                fa
            };
            if p.codec == Compression::None && u64::from(p.len) > bs {
                return Err(CowError::PayloadTooLarge {
                    index: op.index,
                    len: p.len.into(),
                    limit: bs,
                });
            }
            if p.codec == Compression::None && u64::from(p.len) < bs {
                return Err(CowError::RawPayloadTooShort {
                    index: op.index,
                    len: p.len.into(),
                    unit: bs,
                });
            }
        }
        Ok(())
    }

    fn parse_v3(&mut self, opts: &OpenOptions) -> Result<()> {
        let h = self.header.clone();
        let bs = u64::from(h.block_size);
        let algo =
            Compression::from_id(h.compression_algorithm.into()).unwrap_or(Compression::None);
        self.compression = algo;
        // Sequence area.
        let seq_off = h.v3_sequence_offset();
        let seq_len = h
            .sequence_data_count
            .checked_mul(4)
            .ok_or(CowError::BadHeader {
                field: "sequence_data_count",
                value: h.sequence_data_count,
                reason: "too large",
            })?;
        let seq = read_vec(&self.src, seq_off, seq_len, self.file_len, "sequence area")?;
        self.sequence = seq
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // Resume points (read at most min(count, max); see format §8.2).
        let res_off = h.v3_resume_offset();
        let nres = u64::from(h.resume_point_count.min(h.resume_point_max));
        let res_area = u64::from(h.resume_point_max) * RESUME_POINT_SIZE;
        if res_off
            .checked_add(res_area)
            .is_none_or(|e| e > self.file_len)
        {
            return Err(CowError::Truncated {
                what: "resume area",
                offset: res_off,
                need: res_area,
                len: self.file_len,
            });
        }
        let res = read_vec(
            &self.src,
            res_off,
            nres * RESUME_POINT_SIZE,
            self.file_len,
            "resume points",
        )?;
        for c in res.chunks_exact(16) {
            let mut a = [0u8; 16];
            a.copy_from_slice(c);
            self.resume_points.push(decode_resume_point(&a));
        }
        let mut op_count = h.op_count;
        if let Some(label) = opts.label {
            let rp = self
                .resume_points
                .iter()
                .rev()
                .find(|(l, _)| *l == label)
                .ok_or(CowError::LabelNotFound { label })?;
            if rp.1 > op_count {
                return Err(CowError::BadHeader {
                    field: "resume_point.op_index",
                    value: rp.1,
                    reason: "exceeds op_count",
                });
            }
            op_count = rp.1;
        }
        let op_off = h.v3_op_offset();
        let data_off = h.v3_data_offset();
        if op_off
            .checked_add(op_count.saturating_mul(16))
            .is_none_or(|e| e > self.file_len)
        {
            return Err(CowError::Truncated {
                what: "op array",
                offset: op_off,
                need: op_count.saturating_mul(16),
                len: self.file_len,
            });
        }
        let max_bits = (u64::from(h.max_compression_size) / bs).trailing_zeros() as u8;
        let mut data_pos = data_off;
        let mut win = Window::new(&self.src, self.file_len);
        let mut end = op_off + op_count * 16;
        for index in 0..op_count {
            let rec_off = op_off + index * 16;
            let mut rec = [0u8; 16];
            rec.copy_from_slice(win.get(rec_off, 16, "op record")?);
            let raw = decode_op_v3(&rec);
            let bad = move |reason| CowError::BadOp {
                index,
                offset: rec_off,
                reason,
            };
            let bits = raw.compression_bits();
            let t = raw.op_type();
            let len = u64::from(raw.data_length);
            if raw.reserved_bits() != 0 {
                return Err(bad("reserved source_info bits 48..56 are set"));
            }
            if bits != 0 && t != op_type::REPLACE {
                return Err(bad("compression bits on a non-REPLACE op"));
            }
            if bits > max_bits.min(MAX_COMPRESSION_BITS) {
                return Err(bad("compression bits exceed max_compression_size"));
            }
            let unit = bs << bits;
            let payload = |codec_ok: bool| Payload {
                offset: data_pos,
                len: raw.data_length,
                codec: if !codec_ok || algo == Compression::None || len == unit {
                    Compression::None
                } else {
                    algo
                },
                recorded: algo,
                unit_blocks: 1 << bits,
            };
            let kind = match t {
                op_type::COPY | op_type::ZERO => {
                    if len != 0 {
                        return Err(bad("COPY/ZERO op with a non-zero data_length"));
                    }
                    if t == op_type::COPY {
                        OpKind::Copy {
                            source_block: raw.source(),
                        }
                    } else {
                        if raw.source() != 0 {
                            return Err(bad("ZERO op with a non-zero source"));
                        }
                        OpKind::Zero
                    }
                }
                op_type::REPLACE => {
                    if raw.source() != data_pos {
                        return Err(bad(
                            "REPLACE payload offset differs from the running payload position",
                        ));
                    }
                    OpKind::Replace {
                        payload: payload(true),
                    }
                }
                op_type::XOR => OpKind::Xor {
                    source_offset: raw.source(),
                    payload: payload(true),
                },
                op_type::LABEL | op_type::CLUSTER | op_type::SEQUENCE => {
                    return Err(bad("metadata op type in a v3 op array"));
                }
                other => {
                    return Err(CowError::UnknownOpType {
                        index,
                        offset: rec_off,
                        op_type: other,
                    });
                }
            };
            let op = Op {
                index,
                record_offset: rec_off,
                new_block: raw.new_block.into(),
                kind,
            };
            if let Some(p) = op.payload() {
                if p.len == 0 {
                    return Err(bad("data payload is empty"));
                }
                if len > unit {
                    return Err(CowError::PayloadTooLarge {
                        index,
                        len,
                        limit: unit,
                    });
                }
                // A raw payload is served as-is by block reads: a short one would expose the
                // bytes after it.
                if p.codec == Compression::None && len < unit {
                    return Err(CowError::RawPayloadTooShort { index, len, unit });
                }
                self.payload_in_file(index, data_pos, len)?;
                data_pos += len;
                end = end.max(data_pos);
            }
            self.check_new_block(opts, index, op.new_block, op.block_count())?;
            self.check_source(opts, &op)?;
            self.ops.push(op);
        }
        self.data_end = end;
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
        let winners: HashSet<u32> = self.map.iter().map(|e| e.2).collect();
        let mut order: Vec<u32> = Vec::with_capacity(self.map.len());
        if !self.sequence.is_empty() {
            let by_start: HashMap<u64, u32> = self.map.iter().map(|e| (e.0, e.2)).collect();
            let mut used: HashSet<u32> = HashSet::with_capacity(self.sequence.len());
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
    /// End of the last op record / payload / footer (where an appender continues).
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
    pub fn block_map(&self) -> impl Iterator<Item = (u64, u32, &Op)> {
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
        let mut written: HashSet<u64> = HashSet::new();
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
            DecodeError::Corrupt(reason) => CowError::Corrupt {
                index: op.index,
                offset: p.offset,
                codec: p.codec,
                reason,
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
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
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
