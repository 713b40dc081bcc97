//! The v1/v2 op stream (format §5): fixed 20-byte records ([`OP_V2_SIZE`]), optionally in
//! clusters of `cluster_ops` records followed by their payloads, ended by a footer that counts
//! them. One record at a time: [`V2Walk::check_record`] checks the fields every op type shares,
//! [`CowReader::v2_kind`] turns the type into an [`OpKind`] with that type's rules,
//! [`CowReader::v2_check_payload`] places the payload, [`V2Walk::advance`] moves to the next
//! record, and [`V2Walk::footer`] checks the footer. [`CowReader::v2_payload_codecs`] then
//! decides per payload whether it is compressed.

use super::{CowReader, Footer, Op, OpKind, OpenOptions, Payload, Window, read_vec};
use crate::codec::Compression;
use crate::error::{CowError, Result};
use crate::format::*;
use crate::io::ReadAt;

/// [`OP_V2_SIZE`] as an offset.
const REC: u64 = OP_V2_SIZE as u64;

/// Where the walk over a v2 op stream is, and what it has seen so far.
struct V2Walk {
    bs: u64,
    /// Ops per cluster (0: unclustered).
    k: u64,
    ops_start: u64,
    op_pos: u64,
    data_pos: u64,
    index: u64,
    seen_data: bool,
    file_algo: Option<Compression>,
    /// End of the previous SEQUENCE payload (they must not overlap: memory stays bounded by
    /// the file size).
    seq_end: u64,
    /// (end, index, offset, len) of the payload reaching furthest; the footer must follow it.
    last_payload: Option<(u64, u64, u64, u64)>,
}

impl V2Walk {
    fn new(h: &Header) -> V2Walk {
        let k = u64::from(h.cluster_ops);
        let ops_start = h.ops_start();
        V2Walk {
            bs: u64::from(h.block_size),
            k,
            ops_start,
            op_pos: ops_start,
            data_pos: if k > 0 {
                ops_start + REC * k
            } else {
                ops_start + REC
            },
            index: 0,
            seen_data: false,
            file_algo: None,
            seq_end: 0,
            last_payload: None,
        }
    }

    /// The error for the record being parsed.
    fn bad(&self, reason: &'static str) -> CowError {
        CowError::BadOp {
            index: self.index,
            offset: self.op_pos,
            reason,
        }
    }

    /// The footer at the current position: its counts must match the ops walked, and it must
    /// follow every payload.
    fn footer<R: ReadAt>(&self, win: &mut Window<'_, R>) -> Result<Footer> {
        let (index, op_pos) = (self.index, self.op_pos);
        let f = win.get(op_pos, FOOTER_V2_SIZE as usize, "footer")?;
        let mut fb = [0u8; OP_V2_SIZE as usize];
        fb.copy_from_slice(&f[..OP_V2_SIZE as usize]);
        let fr = decode_op_v2(&fb);
        if fr.data_length != FOOTER_V2_SIZE - OP_V2_SIZE {
            return Err(self.bad("footer data_length must be 64"));
        }
        // Payloads precede the footer: one past it would lie where an appender (the
        // snapshot's overlay journal) writes.
        if let Some((end, i, off, plen)) = self.last_payload
            && end > op_pos
        {
            return Err(CowError::PayloadOutsideData {
                index: i,
                offset: off,
                len: plen,
                start: self.ops_start,
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
        if ops_size != index * REC {
            return Err(CowError::FooterMismatch {
                offset: op_pos,
                field: "ops_size",
                found: ops_size,
                expected: index * REC,
            });
        }
        Ok(Footer {
            offset: op_pos,
            num_ops,
            ops_size,
        })
    }

    /// Checks every op type shares: a known compression, no payload fields on types without
    /// one, block numbers in range, one compression per file. Returns the payload length and
    /// the recorded compression.
    fn check_record(&mut self, raw: &RawOpV2) -> Result<(u64, Compression)> {
        let len = u64::from(raw.data_length);
        let algo =
            Compression::from_id(raw.compression.into()).ok_or(CowError::UnknownCompression {
                index: self.index,
                offset: self.op_pos,
                id: raw.compression.into(),
            })?;
        let has_payload = matches!(
            raw.op_type,
            op_type::REPLACE | op_type::XOR | op_type::SEQUENCE
        );
        if !has_payload && len != 0 {
            return Err(self.bad("op type carries no payload but data_length is non-zero"));
        }
        if !has_payload && algo != Compression::None {
            return Err(self.bad("op type carries no payload but has a compression id"));
        }
        if raw.op_type != op_type::LABEL {
            if raw.new_block >= 1 << 32 {
                return Err(self.bad("new_block must be below 2^32"));
            }
            if raw.source >= 1 << 48 {
                return Err(self.bad("source must be below 2^48"));
            }
        }
        if algo != Compression::None && raw.op_type != op_type::SEQUENCE {
            match self.file_algo {
                None => self.file_algo = Some(algo),
                Some(f) if f != algo => {
                    return Err(CowError::MixedCompression {
                        index: self.index,
                        file: f,
                        found: algo,
                    });
                }
                _ => {}
            }
        }
        Ok((len, algo))
    }

    /// Move past the op just parsed, per format §5.1 (clustered) / §5.2 (unclustered).
    fn advance(&mut self, kind: &OpKind, op_type: u8, len: u64) -> Result<()> {
        let k = self.k;
        let (op_adv, data_adv) = if k > 0 {
            match *kind {
                OpKind::Cluster { skip } => (REC.checked_add(skip), len.checked_add(REC * k)),
                _ => (Some(REC), Some(len)),
            }
        } else {
            let skip = if matches!(op_type, op_type::REPLACE | op_type::XOR) {
                len
            } else {
                0
            };
            (Some(REC + skip), Some(len + REC))
        };
        // `index` already counts the op just parsed; errors name it and its record.
        let (index, offset) = (self.index - 1, self.op_pos);
        let bad = move |reason| CowError::BadOp {
            index,
            offset,
            reason,
        };
        self.op_pos = op_adv
            .and_then(|a| self.op_pos.checked_add(a))
            .ok_or(bad("op stream position overflows"))?;
        self.data_pos = data_adv
            .and_then(|a| self.data_pos.checked_add(a))
            .ok_or(bad("data position overflows"))?;
        Ok(())
    }
}

impl<R: ReadAt> CowReader<R> {
    pub(super) fn parse_v2(&mut self, opts: &OpenOptions) -> Result<()> {
        let h = self.header.clone();
        let mut w = V2Walk::new(&h);
        let mut win = Window::new(&self.src, self.file_len);
        let mut found_label = false;
        loop {
            let op_pos = w.op_pos;
            if op_pos.checked_add(REC).is_none_or(|e| e > self.file_len) {
                if opts.label.is_some() {
                    break;
                }
                return Err(CowError::MissingFooter {
                    offset: op_pos,
                    len: self.file_len,
                });
            }
            let mut rec = [0u8; OP_V2_SIZE as usize];
            rec.copy_from_slice(win.get(op_pos, OP_V2_SIZE as usize, "op record")?);
            let raw = decode_op_v2(&rec);
            if raw.op_type == op_type::FOOTER {
                if opts.label.is_some() {
                    break;
                }
                let footer = w.footer(&mut win)?;
                self.footer = Some(footer);
                self.data_end = self.data_end.max(op_pos + u64::from(FOOTER_V2_SIZE));
                break;
            }
            let (len, algo) = w.check_record(&raw)?;
            let kind = self.v2_kind(&mut w, &raw, algo, len)?;
            let index = w.index;
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
            if let Some(end) = self.v2_check_payload(&mut w, &op)? {
                self.data_end = self.data_end.max(end);
            }
            if op.is_data() {
                w.seen_data = true;
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
            w.index += 1;
            w.advance(&op.kind, raw.op_type, len)?;
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
        if let Some(a) = w.file_algo {
            self.compression = a;
        }
        self.v2_payload_codecs(w.bs)
    }

    /// The op a record describes, with the rules of its type (CLUSTER and SEQUENCE only in
    /// clustered files; SEQUENCE payloads uncompressed, bounded and before any data op).
    fn v2_kind(
        &self,
        w: &mut V2Walk,
        raw: &RawOpV2,
        algo: Compression,
        len: u64,
    ) -> Result<OpKind> {
        let (index, op_pos, k, bs) = (w.index, w.op_pos, w.k, w.bs);
        let payload_at = |offset: u64, codec: Compression| Payload {
            offset,
            len: raw.data_length.into(),
            codec,
            recorded: algo,
            unit_blocks: 1,
        };
        Ok(match raw.op_type {
            op_type::COPY => OpKind::Copy {
                source_block: raw.source,
            },
            op_type::ZERO => OpKind::Zero,
            op_type::REPLACE => OpKind::Replace {
                payload: payload_at(raw.source, algo),
            },
            op_type::XOR => OpKind::Xor {
                source_offset: raw.source,
                payload: payload_at(w.data_pos, algo),
            },
            op_type::LABEL => OpKind::Label { label: raw.source },
            op_type::CLUSTER => {
                if k == 0 {
                    return Err(w.bad("CLUSTER op in an unclustered file"));
                }
                OpKind::Cluster { skip: raw.source }
            }
            op_type::SEQUENCE => {
                if k == 0 {
                    return Err(w.bad(
                        "SEQUENCE op in an unclustered v2 file (AOSP writes such files corrupt)",
                    ));
                }
                if w.seen_data {
                    return Err(w.bad("SEQUENCE op after a data op"));
                }
                if algo != Compression::None {
                    return Err(w.bad("SEQUENCE payload must be uncompressed"));
                }
                if !len.is_multiple_of(4) {
                    return Err(w.bad("SEQUENCE payload length is not a multiple of 4"));
                }
                // Format §11: at most 2 blocks of entries per SEQUENCE op.
                if len > 2 * bs {
                    return Err(CowError::PayloadTooLarge {
                        index,
                        len,
                        limit: 2 * bs,
                    });
                }
                if raw.source < w.seq_end {
                    return Err(CowError::SequenceOverlap {
                        index,
                        offset: raw.source,
                        prev_end: w.seq_end,
                    });
                }
                // Every entry must name a distinct data op, and those records (20 bytes
                // each) all follow this one: more entries than that cannot be valid.
                let entries = self.sequence.len() as u64 + len / 4;
                let limit = self.file_len.saturating_sub(op_pos + REC) / REC;
                if entries > limit {
                    return Err(CowError::SequenceTooLong {
                        index,
                        entries,
                        limit,
                    });
                }
                w.seq_end = raw.source.saturating_add(len);
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
        })
    }

    /// An op's payload must lie in the file, after the header and scratch area, and a data
    /// op's must not be empty. Returns where it ends (`None`: the op has no payload).
    fn v2_check_payload(&self, w: &mut V2Walk, op: &Op) -> Result<Option<u64>> {
        let Some(p) = op.payload() else {
            return Ok(None);
        };
        let index = op.index;
        let plen = u64::from(p.len);
        self.payload_in_file(index, p.offset, plen)?;
        // Not in the header or the scratch area (the merge overwrites scratch).
        if p.offset < w.ops_start {
            return Err(CowError::PayloadOutsideData {
                index,
                offset: p.offset,
                len: plen,
                start: w.ops_start,
                end: self.file_len,
            });
        }
        if op.is_data() && p.len == 0 {
            return Err(w.bad("data payload is empty"));
        }
        let end = p.offset + plen;
        if w.last_payload.is_none_or(|l| end > l.0) {
            w.last_payload = Some((end, index, p.offset, plen));
        }
        Ok(Some(end))
    }

    /// Raw-vs-compressed decision (format §6.3, v2): decode with the file-wide algorithm
    /// unless the file is uncompressed, or lz4/zstd payloads are exactly one block.
    fn v2_payload_codecs(&mut self, bs: u64) -> Result<()> {
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
}
