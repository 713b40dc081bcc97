//! The v3 layout: payloads in a data stream after the op area, records kept in memory and
//! written with the resume points at commit, and the durable append mode.

use super::{BatchOp, CowSink, CowWriter, State, Stream, WriterOptions, inval};
use crate::ReadAt;
use crate::codec::Codec;
use crate::error::{CowError, Result, io_at};
use crate::format::*;
use crate::reader::CowReader;

impl<W: CowSink> CowWriter<W> {
    /// Reopen an existing v3 COW for appending (e.g. a writable overlay). New ops go after the
    /// committed ones; nothing becomes visible to readers until [`commit`](Self::commit) (or
    /// `finalize`) has written payloads and records, synced, and then updated `op_count` in the
    /// header and synced again — so a crash leaves either the old or the new op set.
    ///
    /// Readers of a file with rewritten blocks must open it with
    /// [`DuplicatePolicy::LastWins`](crate::DuplicatePolicy::LastWins).
    pub fn append_v3<R: ReadAt>(sink: W, existing: &CowReader<R>, codec: Codec) -> Result<Self> {
        codec.checked()?;
        let h = existing.header().clone();
        if h.major != 3 {
            return Err(inval(
                "append is supported for v3 files only (v2 has no commit point other than the footer)",
            ));
        }
        if codec.algo != existing.compression() {
            return Err(inval("append must use the file's compression algorithm"));
        }
        let mut ops = Vec::with_capacity(existing.ops().len());
        for op in existing.ops() {
            let mut rec = [0u8; 16];
            existing
                .source()
                .read_exact_at(op.record_offset, &mut rec)
                .map_err(io_at(op.record_offset))?;
            ops.push(rec);
        }
        let data_end = existing.data_end().max(h.v3_data_offset());
        let opts = WriterOptions {
            version: 3,
            block_size: h.block_size,
            codec,
            cluster_ops: 1024,
            scratch_size: h.buffer_size,
            op_count_max: h.op_count_max,
            max_compression_size: h.max_compression_size,
            batch_size: 1024,
        };
        let n = ops.len();
        Ok(CowWriter {
            sink,
            opts,
            end: existing.file_len(),
            header: h.clone(),
            state: State::V3 {
                ops,
                ops_flushed: n,
                data: Stream::new(data_end),
                resume: existing.resume_points().to_vec(),
                resume_count: h.resume_point_count,
                sequence_written: true,
                frozen: true,
            },
            seen_data: true,
            finalized: false,
            unit: super::PayloadBuf::default(),
            threads: 1,
            shares: Vec::new(),
            defer_labels: false,
            resume_shadow: Vec::new(),
        })
    }

    pub(super) fn v3_freeze(&mut self) {
        let data_off = self.header.v3_data_offset();
        if let State::V3 { frozen, data, .. } = &mut self.state
            && !*frozen
        {
            *frozen = true;
            *data = Stream::new(data_off);
        }
    }

    pub(super) fn v3_emit(
        &mut self,
        rec_type: u8,
        bits: u8,
        new_block: u64,
        source: u64,
        payload: &[u8],
    ) -> Result<()> {
        self.v3_freeze();
        let max = self.header.op_count_max;
        let nb = u32::try_from(new_block).map_err(|_| inval("v3 new_block must fit in 32 bits"))?;
        let State::V3 { ops, data, .. } = &mut self.state else {
            return Err(inval("not a v3 writer"));
        };
        if ops.len() as u64 >= max {
            return Err(CowError::TooManyOps { max });
        }
        let pos = data.pos();
        let src = if rec_type == op_type::REPLACE {
            pos
        } else {
            source
        };
        if src > SOURCE_MASK {
            return Err(inval("source does not fit in 48 bits"));
        }
        ops.push(encode_op_v3(rec_type, bits, payload.len() as u32, nb, src));
        if !payload.is_empty() {
            data.push(&self.sink, payload)?;
            self.end = self.end.max(data.pos());
        }
        Ok(())
    }

    pub(super) fn v3_batch(&mut self, batch: &[BatchOp], payloads: &[u8]) -> Result<()> {
        self.v3_freeze();
        let max = self.header.op_count_max;
        let State::V3 { ops, data, .. } = &mut self.state else {
            return Err(inval("not a v3 writer"));
        };
        if ops.len() as u64 + batch.len() as u64 > max {
            return Err(CowError::TooManyOps { max });
        }
        // Records first (all validated before any is kept), then the payloads in one piece.
        let first = ops.len();
        let mut pos = data.pos();
        for op in batch {
            let (t, bits, len, nb, src) = match *op {
                BatchOp::Copy {
                    new_block,
                    old_block,
                } => (op_type::COPY, 0, 0, new_block, old_block),
                BatchOp::Zero { new_block } => (op_type::ZERO, 0, 0, new_block, 0),
                BatchOp::Replace {
                    new_block,
                    unit_blocks,
                    len,
                } => (
                    op_type::REPLACE,
                    unit_blocks.trailing_zeros() as u8,
                    len,
                    new_block,
                    pos,
                ),
                BatchOp::Xor {
                    new_block,
                    source_offset,
                    len,
                } => (op_type::XOR, 0, len, new_block, source_offset),
            };
            let nb = match u32::try_from(nb) {
                Ok(nb) if src <= SOURCE_MASK => nb,
                _ => {
                    ops.truncate(first);
                    return Err(inval(
                        "v3 new_block must fit in 32 bits and sources in 48 bits",
                    ));
                }
            };
            ops.push(encode_op_v3(t, bits, len, nb, src));
            pos += u64::from(len);
        }
        if !batch.is_empty() {
            self.seen_data = true;
        }
        if !payloads.is_empty() {
            data.push_large(&self.sink, payloads)?;
            self.end = self.end.max(data.pos());
        }
        Ok(())
    }

    pub(super) fn v3_commit(&mut self) -> Result<()> {
        let op_off = self.header.v3_op_offset();
        let res_off = self.header.v3_resume_offset();
        let State::V3 {
            ops,
            ops_flushed,
            data,
            resume,
            resume_count,
            ..
        } = &mut self.state
        else {
            return Ok(());
        };
        data.flush(&self.sink)?;
        // Deferred labels: the resume area as they left it, stale slots included (the live
        // points are written again just below).
        if !self.resume_shadow.is_empty() {
            self.sink
                .write_all_at(res_off, &self.resume_shadow)
                .map_err(io_at(res_off))?;
            self.resume_shadow.clear();
        }
        if *ops_flushed < ops.len() {
            let mut buf = Vec::with_capacity((ops.len() - *ops_flushed) * 16);
            for r in &ops[*ops_flushed..] {
                buf.extend_from_slice(r);
            }
            let off = op_off + *ops_flushed as u64 * 16;
            self.sink.write_all_at(off, &buf).map_err(io_at(off))?;
            self.end = self.end.max(off + buf.len() as u64);
            *ops_flushed = ops.len();
        }
        // Only the live resume points, from the first slot: the slots after them keep what an
        // earlier label wrote there (a label drops the points at or above it), byte for byte as
        // Android's `CowWriterV3::EmitLabel`; `resume_point_count` counts every label.
        if !resume.is_empty() {
            let mut buf = Vec::with_capacity(resume.len() * 16);
            for (l, n) in resume.iter() {
                buf.extend_from_slice(&encode_resume_point(*l, *n));
            }
            self.sink
                .write_all_at(res_off, &buf)
                .map_err(io_at(res_off))?;
            // The file still spans the whole area (readers check it is there).
            let area = u64::from(self.header.resume_point_max) * 16;
            self.end = self.end.max(res_off + area);
        }
        self.sink.sync_data().map_err(io_at(0))?;
        self.header.op_count = ops.len() as u64;
        self.header.resume_point_count = *resume_count;
        self.write_header()?;
        self.sink.sync_data().map_err(io_at(0))
    }
}
