//! The v3 op stream (format §5.3): a header with a sequence area and resume points, then
//! fixed-size records whose payloads follow the op area in order.

use super::{CowReader, Op, OpKind, OpenOptions, Payload, Window, read_vec};
use crate::codec::Compression;
use crate::error::{CowError, Result};
use crate::format::*;
use crate::io::ReadAt;

impl<R: ReadAt> CowReader<R> {
    pub(super) fn parse_v3(&mut self, opts: &OpenOptions) -> Result<()> {
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
        // The payload area starts after every op slot, used or not: a file without payloads
        // (only COPY/ZERO ops) ends its data there too, not inside the free slots.
        let mut end = data_off.max(op_off + op_count * 16);
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
}
