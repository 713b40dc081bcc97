//! COW size estimates (`estimate_cow_size`, `estimate_op_count_max`) by a dry run of
//! snapblk-cow's writer over the target image, as update_engine's generator does with
//! libsnapshot's estimator: the merge sequence, then per install operation the COW operations
//! a Virtual A/B device with XOR and userspace snapshots writes (COPY for the blocks of
//! COW_COPY merge operations, XOR for those of COW_XOR ones, ZERO, raw data for everything
//! else), a label after each, into a sink that only counts bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use snapblk_cow::{Codec, Compression, CowSink, CowWriter, WriterOptions};

use super::merge::{MergeOp, merge_blocks};
use crate::proto::{InstallOperation, OpType};

/// A sink that keeps only the file's length.
#[derive(Default)]
struct Counter(AtomicU64);

impl snapblk_core::WriteAt for Counter {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0
            .fetch_max(offset + buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CowSink for Counter {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.store(len, Ordering::Relaxed);
        Ok(())
    }
}

/// The COW parameters the manifest announces.
#[derive(Clone, Debug)]
pub(crate) struct CowParams {
    pub(crate) version: u16,
    pub(crate) compression: Compression,
    pub(crate) level: Option<i32>,
    pub(crate) compression_factor: u32,
}

/// Most bytes one raw write carries (update_engine's `BlockExtentWriter`: 1 MiB).
const CHUNK: usize = 1 << 20;

/// (estimate_cow_size, estimate_op_count_max) of a partition: the dry run's file length plus
/// 1 %, and the partition's block count (an upper bound: at most one COW operation per block).
pub(crate) fn estimate(
    p: &CowParams,
    old: Option<&[u8]>,
    new: &[u8],
    ops: &[InstallOperation],
    merge: &[MergeOp],
) -> snapblk_cow::Result<(u64, u64)> {
    let bs = 4096usize;
    let blocks = (new.len() / bs) as u64;
    let op_count_max = blocks.max(25);
    let opts = WriterOptions {
        version: p.version,
        block_size: bs as u32,
        codec: Codec {
            algo: p.compression,
            level: p.level,
        },
        op_count_max,
        max_compression_size: p.compression_factor,
        ..WriterOptions::default()
    };
    let sink = Counter::default();
    let mut w = CowWriter::new(&sink, opts)?;
    let mut seq = Vec::new();
    let mut copy = HashMap::new();
    let mut xor = HashMap::new();
    for m in merge {
        if !m.xor && m.src == m.dst {
            continue;
        }
        seq.extend(merge_blocks(m).into_iter().map(|b| b as u32));
        for i in 0..m.dst.1 {
            if m.xor {
                xor.insert(m.dst.0 + i, (m.src.0 + i, m.offset));
            } else {
                copy.insert(m.dst.0 + i, m.src.0 + i);
            }
        }
    }
    if !seq.is_empty() {
        w.add_sequence_data(&seq)?;
    }
    let block = |img: &[u8], b: u64| -> Vec<u8> {
        let at = b as usize * bs;
        let mut v = img.get(at..at + bs).unwrap_or(&[]).to_vec();
        v.resize(bs, 0);
        v
    };
    let old = old.unwrap_or(&[]);
    for op in ops {
        let t = op.op_type().ok();
        let dsts: Vec<u64> = op
            .dst_extents
            .iter()
            .flat_map(|e| {
                let s = e.start_block.unwrap_or(0);
                s..s + e.num_blocks.unwrap_or(0)
            })
            .collect();
        match t {
            Some(OpType::Zero | OpType::Discard) => {
                for e in &op.dst_extents {
                    w.add_zero_blocks(e.start_block.unwrap_or(0), e.num_blocks.unwrap_or(0))?;
                }
            }
            _ => {
                let mut raw: Vec<(u64, Vec<u8>)> = Vec::new();
                let srcs: Vec<u64> = op
                    .src_extents
                    .iter()
                    .flat_map(|e| {
                        let s = e.start_block.unwrap_or(0);
                        s..s + e.num_blocks.unwrap_or(0)
                    })
                    .collect();
                for (i, &d) in dsts.iter().enumerate() {
                    if t == Some(OpType::SourceCopy) {
                        if srcs.get(i) == Some(&d) {
                            continue;
                        }
                        if let Some(&s) = copy.get(&d) {
                            flush(&mut w, &mut raw)?;
                            w.add_copy(d, s, 1)?;
                            continue;
                        }
                    } else if let Some(&(s, off)) = xor.get(&d) {
                        flush(&mut w, &mut raw)?;
                        let from = s as usize * bs + off as usize;
                        let mut src = old.get(from..from + bs).unwrap_or(&[]).to_vec();
                        src.resize(bs, 0);
                        let x: Vec<u8> =
                            block(new, d).iter().zip(&src).map(|(a, b)| a ^ b).collect();
                        w.add_xor_blocks(d, &x, s, off as u16)?;
                        continue;
                    }
                    let data = block(new, d);
                    match raw.last_mut() {
                        Some((start, buf))
                            if *start + (buf.len() / bs) as u64 == d && buf.len() < CHUNK =>
                        {
                            buf.extend(data)
                        }
                        _ => {
                            flush(&mut w, &mut raw)?;
                            raw.push((d, data));
                        }
                    }
                }
                flush(&mut w, &mut raw)?;
            }
        }
        w.add_label(0)?;
    }
    w.finalize()?;
    let size = sink.0.load(Ordering::Relaxed);
    Ok((size + size / 100, op_count_max))
}

fn flush(w: &mut CowWriter<&Counter>, raw: &mut Vec<(u64, Vec<u8>)>) -> snapblk_cow::Result<()> {
    for (start, data) in raw.drain(..) {
        w.add_raw_blocks(start, &data)?;
    }
    Ok(())
}
