//! The v1/v2 op stream (format §5): fixed 20-byte records, optionally in clusters of
//! `cluster_ops` records followed by their payloads, ended by a footer that counts them.

use super::{CowReader, Footer, Op, OpKind, OpenOptions, Payload, Window, read_vec};
use crate::codec::Compression;
use crate::error::{CowError, Result};
use crate::format::*;
use crate::io::ReadAt;

impl<R: ReadAt> CowReader<R> {
    pub(super) fn parse_v2(&mut self, opts: &OpenOptions) -> Result<()> {
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
}
