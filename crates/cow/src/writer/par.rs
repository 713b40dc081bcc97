//! How [`add_raw_blocks`](CowWriter::add_raw_blocks) and
//! [`add_xor_blocks`](CowWriter::add_xor_blocks) encode and store a call's units: one by one on
//! the calling thread, or, with [`CowWriter::set_threads`] above one and a call large enough,
//! in contiguous shares, one per thread, each encoded into a buffer the writer keeps and stored
//! in order through `add_batch`. So the file is byte for byte the one a single thread writes,
//! and the memory is bounded by the call's input.

use super::{BatchOp, CowSink, CowWriter, encode_unit_into};
use crate::codec::{Codec, PayloadBuf};
use crate::error::Result;
use crate::format::op_type;

/// Units a thread must get for a call to be split at all: starting a thread costs about as
/// much as encoding a few 4 KiB blocks.
const MIN_UNITS_PER_THREAD: usize = 8;

/// One thread's share of a call: its encoded payloads, back to back, and their lengths.
#[derive(Default, Debug)]
pub(super) struct Share {
    payloads: PayloadBuf,
    lens: Vec<u32>,
}

/// One unit of a call: its op (payload length not yet known) and the bytes to encode.
pub(super) type Job<'a> = (BatchOp, &'a [u8]);

/// How a unit is encoded: the writer's codec, COW major version, block size and largest unit.
#[derive(Clone, Copy)]
struct Enc {
    codec: Codec,
    version: u16,
    block_size: u32,
    max_unit: u32,
}

impl Enc {
    fn share(self, jobs: &[Job<'_>], share: &mut Share) {
        share.payloads.clear();
        share.lens.clear();
        for &(_, data) in jobs {
            let n = encode_unit_into(
                self.codec,
                self.version,
                self.block_size,
                self.max_unit,
                data,
                &mut share.payloads,
            );
            share.lens.push(n as u32);
        }
    }
}

fn with_len(op: BatchOp, len: u32) -> BatchOp {
    match op {
        BatchOp::Replace {
            new_block,
            unit_blocks,
            ..
        } => BatchOp::Replace {
            new_block,
            unit_blocks,
            len,
        },
        BatchOp::Xor {
            new_block,
            source_offset,
            ..
        } => BatchOp::Xor {
            new_block,
            source_offset,
            len,
        },
        other => other,
    }
}

impl<W: CowSink> CowWriter<W> {
    /// Encode the units of each [`add_raw_blocks`](Self::add_raw_blocks) and
    /// [`add_xor_blocks`](Self::add_xor_blocks) call on up to `n` threads (0: one per core;
    /// the default is 1). The file is the same for any count.
    pub fn set_threads(&mut self, n: usize) {
        self.threads = crate::generate::threads(n);
    }

    /// Threads for a call of `units` units: 1 means the calling thread alone.
    pub(super) fn threads_for(&self, units: usize) -> usize {
        self.threads.min(units / MIN_UNITS_PER_THREAD).max(1)
    }

    /// Encode `jobs` and store them in order: on the calling thread one by one (one unit
    /// buffer), or, when the call is large enough for several threads, in shares.
    pub(super) fn add_jobs(&mut self, jobs: &[Job<'_>]) -> Result<()> {
        let t = self.threads_for(jobs.len());
        if t > 1 {
            return self.add_shares(jobs, t);
        }
        let mut unit = std::mem::take(&mut self.unit);
        let mut r = Ok(());
        for &(op, data) in jobs {
            let (rec_type, new_block, source) = match op {
                BatchOp::Replace { new_block, .. } => (op_type::REPLACE, new_block, 0),
                BatchOp::Xor {
                    new_block,
                    source_offset,
                    ..
                } => (op_type::XOR, new_block, source_offset),
                BatchOp::Copy { .. } | BatchOp::Zero { .. } => continue,
            };
            r = self.emit_encoded(&mut unit, rec_type, new_block, source, data);
            if r.is_err() {
                break;
            }
        }
        self.unit = unit;
        r
    }

    /// Encode `jobs` on `t` threads (the calling one among them), then store them in order.
    fn add_shares(&mut self, jobs: &[Job<'_>], t: usize) -> Result<()> {
        let enc = Enc {
            codec: self.opts.codec,
            version: self.header.major,
            block_size: self.opts.block_size,
            max_unit: self.opts.max_compression_size,
        };
        let mut shares = std::mem::take(&mut self.shares);
        shares.resize_with(t, Share::default);
        let per = jobs.len().div_ceil(t).max(1);
        std::thread::scope(|s| {
            let mut parts = jobs.chunks(per).zip(shares.iter_mut());
            let first = parts.next();
            for (part, share) in parts {
                s.spawn(move || enc.share(part, share));
            }
            if let Some((part, share)) = first {
                enc.share(part, share);
            }
        });
        let mut ops = Vec::with_capacity(per);
        let mut r = Ok(());
        for (part, share) in jobs.chunks(per).zip(&shares) {
            ops.clear();
            ops.extend(
                part.iter()
                    .zip(&share.lens)
                    .map(|(&(op, _), &len)| with_len(op, len)),
            );
            r = self.add_batch(&ops, share.payloads.as_slice());
            if r.is_err() {
                break;
            }
        }
        self.shares = shares;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::super::WriterOptions;
    use super::*;
    use crate::codec::Compression;
    use crate::io::MemFile;
    use proptest::prelude::*;

    /// A call of the writer: raw blocks, XOR blocks (with a byte offset), a COPY or a label.
    #[derive(Clone, Debug)]
    enum Call {
        Raw { blocks: u64, seed: u8 },
        Xor { blocks: u64, offset: u16, seed: u8 },
        Copy,
        Label,
    }

    fn call() -> impl Strategy<Value = Call> {
        prop_oneof![
            4 => (1u64..80, any::<u8>()).prop_map(|(blocks, seed)| Call::Raw { blocks, seed }),
            2 => (1u64..40, 0u16..4096, any::<u8>())
                .prop_map(|(blocks, offset, seed)| Call::Xor { blocks, offset, seed }),
            1 => Just(Call::Copy),
            1 => Just(Call::Label),
        ]
    }

    /// Blocks that compress some, not all: runs of a repeated byte between noise.
    fn data(blocks: u64, seed: u8) -> Vec<u8> {
        let mut x = u32::from(seed) | 1;
        (0..blocks * 4096)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                if (i / 64) % 3 == 0 { x as u8 } else { seed }
            })
            .collect()
    }

    fn write(opts: WriterOptions, calls: &[Call], threads: usize) -> Vec<u8> {
        let f = MemFile::default();
        let mut w = CowWriter::new(&f, opts).unwrap();
        w.set_threads(threads);
        let mut next = 0u64;
        for c in calls {
            match *c {
                Call::Raw { blocks, seed } => {
                    w.add_raw_blocks(next, &data(blocks, seed)).unwrap();
                    next += blocks;
                }
                Call::Xor {
                    blocks,
                    offset,
                    seed,
                } => {
                    w.add_xor_blocks(next, &data(blocks, seed), next / 2, offset)
                        .unwrap();
                    next += blocks;
                }
                Call::Copy => {
                    w.add_copy(next, next / 3, 1).unwrap();
                    next += 1;
                }
                Call::Label => w.add_label(next).unwrap(),
            }
        }
        w.finalize().unwrap();
        f.into_inner()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// The file does not depend on how many threads encode it.
        #[test]
        fn threads_write_the_same_file_as_one(
            calls in prop::collection::vec(call(), 1..12),
            format in 0usize..5,
            threads in 2usize..5,
        ) {
            let (version, algo, unit) = [
                (2u16, Compression::Lz4, 4096u32),
                (2, Compression::Gz, 4096),
                (3, Compression::Lz4, 4096),
                (3, Compression::Zstd, 16384),
                (3, Compression::None, 8192),
            ][format];
            let opts = WriterOptions {
                version,
                cluster_ops: if version == 2 { 64 } else { 1024 },
                codec: crate::codec::Codec::new(algo),
                max_compression_size: unit,
                op_count_max: 4096,
                ..Default::default()
            };
            prop_assert_eq!(write(opts, &calls, 1), write(opts, &calls, threads));
        }
    }

    #[test]
    fn a_small_call_stays_on_the_calling_thread() {
        let opts = WriterOptions {
            op_count_max: 16,
            ..Default::default()
        };
        let mut w = CowWriter::new(MemFile::default(), opts).unwrap();
        w.set_threads(4);
        assert_eq!(w.threads_for(MIN_UNITS_PER_THREAD * 2 - 1), 1);
        assert_eq!(w.threads_for(MIN_UNITS_PER_THREAD * 2), 2);
        assert_eq!(w.threads_for(10_000), 4);
    }
}
