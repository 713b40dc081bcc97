//! COW writer for v2 and v3, laid out exactly like AOSP's writer (so uncompressed files are
//! byte-identical given the same calls), plus a durable append mode for v3 files.
//!
//! The call surface mirrors AOSP's `ICowWriter`: [`add_copy`](CowWriter::add_copy),
//! [`add_raw_blocks`](CowWriter::add_raw_blocks), [`add_xor_blocks`](CowWriter::add_xor_blocks),
//! [`add_zero_blocks`](CowWriter::add_zero_blocks), [`add_label`](CowWriter::add_label),
//! [`add_sequence_data`](CowWriter::add_sequence_data), [`finalize`](CowWriter::finalize).
//! A caller that compresses units itself hands each [`EncodedUnit`] to
//! [`add_encoded_replace`](CowWriter::add_encoded_replace); the crate's generator encodes units
//! in parallel ([`encode_unit_into`]) and stores them in batches ([`CowWriter::add_batch`]).
//!
//! One [`CowWriter`] serves both format families: the calls, checks and op bookkeeping are
//! shared (this file); how ops are laid out on disk is per family, in `writer/v2.rs` (records
//! and payloads interleaved or clustered) and `writer/v3.rs` (data stream, records and resume
//! points written at commit, append mode).

mod par;
mod v2;
mod v3;

use crate::codec::{self, Codec, Compression, PayloadBuf};
use crate::error::{CowError, Result, io_at};
use crate::format::*;
use crate::io::WriteAt;
use snapblk_core::sync::lock;

/// A positional-write target that can also be truncated (files, [`crate::MemFile`]).
pub trait CowSink: WriteAt {
    /// Set the file length (truncate or extend with zeros).
    fn set_len(&self, len: u64) -> std::io::Result<()>;
}

impl CowSink for std::fs::File {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        std::fs::File::set_len(self, len)
    }
}

impl CowSink for crate::io::MemFile {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut v = lock(&self.0);
        v.resize(len as usize, 0);
        Ok(())
    }
}

impl<T: CowSink + ?Sized> CowSink for &T {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        (**self).set_len(len)
    }
}

/// Writer settings. Defaults match AOSP's writer defaults for a device: v3, 4 KiB blocks,
/// 2 MiB scratch, no compression, 4 KiB units, batch 1024.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// Major version of the file written: 2 or 3.
    pub version: u16,
    /// Block size in bytes: a power of two in 512..=32768 (Android's files use 4096).
    pub block_size: u32,
    /// Compression of REPLACE and XOR payloads. v3 records its algorithm once in the header,
    /// v2 in each payload op.
    pub codec: Codec,
    /// v2: ops per cluster (0 = unclustered, else ≥ 2; AOSP default 1024). v3: 0 makes every
    /// REPLACE single-block (AOSP quirk, format §6.4); any other value is ignored.
    pub cluster_ops: u32,
    /// Scratch area size (`buffer_size`); 2 MiB on devices, 0 for none.
    pub scratch_size: u32,
    /// v3: number of op slots (fixed at creation; AOSP uses the device size in blocks).
    pub op_count_max: u64,
    /// v3: largest REPLACE unit in bytes (4 KiB .. 256 KiB, power of two).
    pub max_compression_size: u32,
    /// v3: how many blocks of one `add_raw_blocks` call are cut into units together.
    pub batch_size: u32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            version: 3,
            block_size: 4096,
            codec: Codec::new(Compression::None),
            cluster_ops: 1024,
            scratch_size: DEFAULT_SCRATCH_SIZE,
            op_count_max: 0,
            max_compression_size: 4096,
            batch_size: 1024,
        }
    }
}

/// A payload ready to store: either compressed bytes or the raw unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedUnit {
    /// The payload as stored in the file: the compressed stream, or the unit itself when
    /// compression did not shrink it (always in v3; in v2 for lz4 and zstd only).
    pub bytes: Vec<u8>,
    /// Number of blocks the unit covers.
    pub unit_blocks: u32,
}

/// [`encode_unit_into`] into a new buffer (tests).
#[cfg(test)]
pub(crate) fn encode_unit(
    codec: Codec,
    version: u16,
    block_size: u32,
    max_unit: u32,
    data: &[u8],
) -> EncodedUnit {
    let mut out = PayloadBuf::default();
    encode_unit_into(codec, version, block_size, max_unit, data, &mut out);
    EncodedUnit {
        bytes: out.as_slice().to_vec(),
        unit_blocks: (data.len() / block_size as usize) as u32,
    }
}

/// Encode one unit the way AOSP's writer stores it for `version` (format §6.3), appending
/// the payload to `out` (no allocation once `out` has grown): v3 stores the raw unit whenever
/// compression does not shrink it, v2 does so for lz4/zstd only. Returns the
/// payload length. Sparse units use cheaper settings ([`Codec::for_unit`]).
pub(crate) fn encode_unit_into(
    codec: Codec,
    version: u16,
    block_size: u32,
    max_unit: u32,
    data: &[u8],
    out: &mut PayloadBuf,
) -> usize {
    if codec.algo == Compression::None {
        out.extend(data);
        return data.len();
    }
    let window_log = max_unit.max(block_size).trailing_zeros().max(10);
    let start = out.len();
    let n = codec::compress_into(codec.for_unit(data), data, window_log, out);
    let raw_if_not_smaller =
        version >= 3 || matches!(codec.algo, Compression::Lz4 | Compression::Zstd);
    if raw_if_not_smaller && n >= data.len() {
        out.clear_to(start);
        out.extend(data);
        return data.len();
    }
    n
}

/// One op of a batch for [`CowWriter::add_batch`]; payload ops take their `len` bytes from
/// the batch's payload buffer, in op order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchOp {
    /// A COPY op (as [`CowWriter::add_copy`] writes for one block).
    Copy {
        /// Block of the new image it produces.
        new_block: u64,
        /// Base block it copies.
        old_block: u64,
    },
    /// A ZERO op.
    Zero {
        /// Block of the new image it zeroes.
        new_block: u64,
    },
    /// An encoded REPLACE unit (as [`encode_unit_into`] makes it with this writer's codec).
    Replace {
        /// First block of the new image the unit covers.
        new_block: u64,
        /// Blocks the unit covers: a power of two, 1 in v2, at most
        /// `max_compression_size / block_size` in v3.
        unit_blocks: u32,
        /// Stored payload bytes taken from the batch's payload buffer.
        len: u32,
    },
    /// An encoded single-block XOR payload; base bytes start at `source_offset`.
    Xor {
        /// Block of the new image it produces.
        new_block: u64,
        /// Byte offset in the base of the `block_size` bytes the payload is XOR-ed with.
        source_offset: u64,
        /// Stored payload bytes taken from the batch's payload buffer.
        len: u32,
    },
}

/// Buffers sequential appends and writes them with large positional writes.
struct Stream {
    start: u64,
    buf: Vec<u8>,
}

impl Stream {
    const FLUSH_AT: usize = 4 << 20;
    fn new(start: u64) -> Self {
        Stream {
            start,
            buf: Vec::new(),
        }
    }
    fn pos(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
    fn push<W: WriteAt + ?Sized>(&mut self, w: &W, b: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= Self::FLUSH_AT {
            self.flush(w)?;
        }
        Ok(())
    }
    /// Append a large run of bytes: written in place, without copying it into the buffer.
    fn push_large<W: WriteAt + ?Sized>(&mut self, w: &W, b: &[u8]) -> Result<()> {
        if b.len() < Self::FLUSH_AT / 16 {
            return self.push(w, b);
        }
        self.flush(w)?;
        w.write_all_at(self.start, b).map_err(io_at(self.start))?;
        self.start += b.len() as u64;
        Ok(())
    }
    fn flush<W: WriteAt + ?Sized>(&mut self, w: &W) -> Result<()> {
        if !self.buf.is_empty() {
            w.write_all_at(self.start, &self.buf)
                .map_err(io_at(self.start))?;
            self.start += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }
}

enum State {
    V2 {
        /// Unclustered: op records and payloads interleaved.
        stream: Stream,
        /// Clustered: start of the open cluster, its records and payload bytes.
        cluster_start: u64,
        cluster_ops: Vec<[u8; 20]>,
        cluster_data: Vec<u8>,
        num_ops: u64,
    },
    V3 {
        /// Op records written so far (all valid ones, including previously committed ones).
        ops: Vec<[u8; 16]>,
        /// Ops already on disk (committed); records from here on are pending.
        ops_flushed: usize,
        data: Stream,
        resume: Vec<(u64, u64)>,
        resume_count: u32,
        sequence_written: bool,
        frozen: bool,
    },
}

/// Writes a COW file. See the module docs.
pub struct CowWriter<W: CowSink> {
    sink: W,
    opts: WriterOptions,
    header: Header,
    state: State,
    seen_data: bool,
    finalized: bool,
    /// Largest offset written (v3 file length).
    end: u64,
    /// Where `add_raw_blocks` and `add_xor_blocks` encode each unit (kept, so a unit costs no
    /// allocation, zero-fill or copy out).
    unit: PayloadBuf,
    /// Threads `add_raw_blocks` and `add_xor_blocks` encode on ([`CowWriter::set_threads`]).
    threads: usize,
    /// Their shares of a call's units, kept between calls (`par`).
    shares: Vec<par::Share>,
    /// v3 labels only update memory ([`CowWriter::defer_labels`]).
    defer_labels: bool,
    /// With `defer_labels`: the resume area as the labels since the last commit left it (each
    /// wrote the live points from the first slot), written at the next commit.
    resume_shadow: Vec<u8>,
}

fn inval(msg: impl Into<String>) -> CowError {
    CowError::InvalidArgument(msg.into())
}

impl<W: CowSink> CowWriter<W> {
    /// Start a new COW file in `sink` (written from offset 0; existing content is replaced).
    /// A codec level out of its algorithm's range is [`CowError::Level`], before any write.
    pub fn new(sink: W, opts: WriterOptions) -> Result<Self> {
        opts.codec.checked()?;
        let bs = opts.block_size;
        if !(512..=32768).contains(&bs) || !bs.is_power_of_two() {
            return Err(inval("block size must be a power of two in 512..=32768"));
        }
        let header = match opts.version {
            2 => {
                if opts.cluster_ops == 1 {
                    return Err(inval("cluster_ops must be 0 or at least 2"));
                }
                let mut h = Header::new_v2(bs, opts.cluster_ops, opts.scratch_size);
                h.num_merge_ops = 0;
                h
            }
            3 => {
                let m = opts.max_compression_size;
                if !m.is_power_of_two() || m < bs || u64::from(m) > MAX_UNIT_BYTES {
                    return Err(inval(
                        "max_compression_size must be a power of two from block size to 256 KiB",
                    ));
                }
                if opts.op_count_max == 0 {
                    return Err(inval("v3 needs op_count_max > 0"));
                }
                Header::new_v3(bs, opts.scratch_size, opts.op_count_max, opts.codec.algo, m)
            }
            v => return Err(inval(format!("cannot write COW version {v} (2 or 3)"))),
        };
        let ops_start = header.ops_start();
        let state = if header.major == 2 {
            State::V2 {
                stream: Stream::new(ops_start),
                cluster_start: ops_start,
                cluster_ops: Vec::new(),
                cluster_data: Vec::new(),
                num_ops: 0,
            }
        } else {
            State::V3 {
                ops: Vec::new(),
                ops_flushed: 0,
                data: Stream::new(0),
                resume: Vec::new(),
                resume_count: 0,
                sequence_written: false,
                frozen: false,
            }
        };
        let w = CowWriter {
            sink,
            opts,
            header,
            state,
            seen_data: false,
            finalized: false,
            end: ops_start,
            unit: PayloadBuf::default(),
            threads: 1,
            shares: Vec::new(),
            defer_labels: false,
            resume_shadow: Vec::new(),
        };
        w.write_header()?;
        w.write_zeros(w.header.header_size.into(), w.header.buffer_size.into())?;
        Ok(w)
    }

    fn write_header(&self) -> Result<()> {
        self.sink
            .write_all_at(0, &self.header.encode())
            .map_err(io_at(0))
    }

    fn write_zeros(&self, mut off: u64, mut len: u64) -> Result<()> {
        let z = vec![0u8; 64 * 1024.min(len as usize).max(1)];
        while len > 0 {
            let n = len.min(z.len() as u64);
            self.sink
                .write_all_at(off, &z[..n as usize])
                .map_err(io_at(off))?;
            off += n;
            len -= n;
        }
        Ok(())
    }

    fn bs(&self) -> u64 {
        self.opts.block_size.into()
    }

    fn check_open(&self) -> Result<()> {
        if self.finalized {
            return Err(inval("writer already finalized"));
        }
        Ok(())
    }

    /// The header as it will be written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Op records written so far (v2: every record, labels and sequence ops included; v3: the
    /// op slots used, which `op_count_max` bounds). A size estimator sizes the v3 op area
    /// with it.
    pub fn op_records(&self) -> u64 {
        match &self.state {
            State::V2 { num_ops, .. } => *num_ops,
            State::V3 { ops, .. } => ops.len() as u64,
        }
    }

    // ---------------------------------------------------------------------------------------
    // v2 record emission

    // ---------------------------------------------------------------------------------------
    // v3 record emission

    fn emit(
        &mut self,
        rec_type: u8,
        new_block: u64,
        source: u64,
        enc: Option<(u32, &[u8])>,
    ) -> Result<()> {
        self.check_open()?;
        if matches!(
            rec_type,
            op_type::COPY | op_type::REPLACE | op_type::ZERO | op_type::XOR
        ) {
            self.seen_data = true;
        }
        let algo = self.opts.codec.algo;
        match self.header.major {
            2 => {
                let (comp, payload): (u8, &[u8]) = match enc {
                    Some((_, b)) => (algo.id(), b),
                    None => (0, &[]),
                };
                if new_block >= 1 << 32 {
                    return Err(inval("new_block must be below 2^32"));
                }
                self.v2_emit(rec_type, comp, new_block, source, payload)
            }
            _ => {
                let (bits, payload): (u8, &[u8]) = match enc {
                    Some((ub, b)) => (ub.trailing_zeros() as u8, b),
                    None => (0, &[]),
                };
                self.v3_emit(rec_type, bits, new_block, source, payload)
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Public API

    /// `num_blocks` COPY ops: new block `new_block + i` ← base block `old_block + i`.
    pub fn add_copy(&mut self, new_block: u64, old_block: u64, num_blocks: u64) -> Result<()> {
        for i in 0..num_blocks {
            self.emit(op_type::COPY, new_block + i, old_block + i, None)?;
        }
        Ok(())
    }

    /// ZERO ops for `num_blocks` blocks from `new_block`.
    pub fn add_zero_blocks(&mut self, new_block: u64, num_blocks: u64) -> Result<()> {
        for i in 0..num_blocks {
            self.emit(op_type::ZERO, new_block + i, 0, None)?;
        }
        Ok(())
    }

    /// REPLACE ops for whole blocks of `data` starting at `new_block` (compressed with the
    /// writer's codec; v3 cuts runs into multi-block units like AOSP).
    pub fn add_raw_blocks(&mut self, new_block: u64, data: &[u8]) -> Result<()> {
        let bs = self.bs() as usize;
        if !data.len().is_multiple_of(bs) {
            return Err(inval("data is not a whole number of blocks"));
        }
        let nblocks = (data.len() / bs) as u64;
        let jobs: Vec<par::Job<'_>> = self
            .replace_units(new_block, nblocks)
            .into_iter()
            .map(|(unit_start, unit_blocks)| {
                let off = ((unit_start - new_block) as usize) * bs;
                let op = BatchOp::Replace {
                    new_block: unit_start,
                    unit_blocks,
                    len: 0,
                };
                (op, &data[off..off + unit_blocks as usize * bs])
            })
            .collect();
        self.add_jobs(&jobs)
    }

    /// Encode `data` (one unit) into `unit` and emit it as a `rec_type` op.
    fn emit_encoded(
        &mut self,
        unit: &mut PayloadBuf,
        rec_type: u8,
        new_block: u64,
        source: u64,
        data: &[u8],
    ) -> Result<()> {
        unit.clear();
        encode_unit_into(
            self.opts.codec,
            self.header.major,
            self.opts.block_size,
            self.opts.max_compression_size,
            data,
            unit,
        );
        let unit_blocks = (data.len() / self.bs() as usize) as u32;
        self.emit(
            rec_type,
            new_block,
            source,
            Some((unit_blocks, unit.as_slice())),
        )
    }

    /// How `add_raw_blocks(new_block, nblocks)` is cut into units: `(first block, blocks)`.
    pub(crate) fn replace_units(&self, new_block: u64, nblocks: u64) -> Vec<(u64, u32)> {
        let mut units = Vec::new();
        let max_unit = if self.header.major >= 3 && self.opts.cluster_ops != 0 {
            u64::from(self.opts.max_compression_size) / self.bs()
        } else {
            1
        };
        let batch = u64::from(self.opts.batch_size.max(1));
        let mut b = new_block;
        let end = new_block + nblocks;
        while b < end {
            let batch_end = (b + batch).min(end);
            while b < batch_end {
                let rem = batch_end - b;
                let mut u = max_unit.max(1);
                while u > rem {
                    u /= 2;
                }
                units.push((b, u as u32));
                b += u;
            }
        }
        units
    }

    /// Store an already encoded REPLACE unit (encoded with this writer's codec).
    pub fn add_encoded_replace(&mut self, new_block: u64, unit: &EncodedUnit) -> Result<()> {
        self.check_unit(unit.unit_blocks)?;
        self.emit(
            op_type::REPLACE,
            new_block,
            0,
            Some((unit.unit_blocks, &unit.bytes)),
        )
    }

    fn check_unit(&self, ub: u32) -> Result<()> {
        if !ub.is_power_of_two() || (self.header.major < 3 && ub != 1) {
            return Err(inval("invalid unit size"));
        }
        if self.header.major >= 3
            && u64::from(ub) * self.bs() > u64::from(self.header.max_compression_size)
        {
            return Err(inval("unit larger than max_compression_size"));
        }
        Ok(())
    }

    /// Store a batch of ops whose payloads are concatenated in `payloads` (in op order): the
    /// same file as [`add_copy`](Self::add_copy) / [`add_zero_blocks`](Self::add_zero_blocks)
    /// / [`add_encoded_replace`](Self::add_encoded_replace) / `add_encoded_xor` op by op,
    /// without an `EncodedUnit` per payload; v3 writes a large batch's payloads in place
    /// instead of copying them into the writer's buffer. Nothing of the batch is stored if any
    /// op is invalid.
    pub(crate) fn add_batch(&mut self, ops: &[BatchOp], payloads: &[u8]) -> Result<()> {
        self.check_open()?;
        let mut total = 0u64;
        for op in ops {
            match *op {
                BatchOp::Replace {
                    unit_blocks, len, ..
                } => {
                    self.check_unit(unit_blocks)?;
                    total += u64::from(len);
                }
                BatchOp::Xor { len, .. } => total += u64::from(len),
                _ => {}
            }
        }
        if total != payloads.len() as u64 {
            return Err(inval("batch payload length does not match its ops"));
        }
        if self.header.major >= 3 {
            return self.v3_batch(ops, payloads);
        }
        let mut off = 0usize;
        for op in ops {
            let mut take = |len: u32| {
                let p = &payloads[off..off + len as usize];
                off += len as usize;
                p
            };
            match *op {
                BatchOp::Copy {
                    new_block,
                    old_block,
                } => self.emit(op_type::COPY, new_block, old_block, None)?,
                BatchOp::Zero { new_block } => self.emit(op_type::ZERO, new_block, 0, None)?,
                BatchOp::Replace {
                    new_block,
                    unit_blocks,
                    len,
                } => self.emit(
                    op_type::REPLACE,
                    new_block,
                    0,
                    Some((unit_blocks, take(len))),
                )?,
                BatchOp::Xor {
                    new_block,
                    source_offset,
                    len,
                } => self.emit(op_type::XOR, new_block, source_offset, Some((1, take(len))))?,
            }
        }
        Ok(())
    }

    /// Store an already encoded single-block XOR payload; the base bytes start at
    /// `source_offset` (= old block × block size + byte offset).
    #[cfg(test)]
    pub(crate) fn add_encoded_xor(
        &mut self,
        new_block: u64,
        source_offset: u64,
        unit: &EncodedUnit,
    ) -> Result<()> {
        if unit.unit_blocks != 1 {
            return Err(inval("XOR payloads are single-block"));
        }
        self.emit(
            op_type::XOR,
            new_block,
            source_offset,
            Some((1, &unit.bytes)),
        )
    }

    /// XOR ops: `data` is the *new* content (whole blocks); the stored payload is
    /// `data XOR base` — callers pass the XOR-ed bytes, as with AOSP's `AddXorBlocks`.
    pub fn add_xor_blocks(
        &mut self,
        new_block: u64,
        xored: &[u8],
        old_block: u64,
        offset: u16,
    ) -> Result<()> {
        let bs = self.bs() as usize;
        if !xored.len().is_multiple_of(bs) {
            return Err(inval("data is not a whole number of blocks"));
        }
        if u64::from(offset) >= self.bs() {
            return Err(inval("XOR offset must be below the block size"));
        }
        let jobs: Vec<par::Job<'_>> = xored
            .chunks(bs)
            .enumerate()
            .map(|(i, chunk)| {
                let op = BatchOp::Xor {
                    new_block: new_block + i as u64,
                    source_offset: (old_block + i as u64) * self.bs() + u64::from(offset),
                    len: 0,
                };
                (op, chunk)
            })
            .collect();
        self.add_jobs(&jobs)
    }

    /// Record the merge order of the ordered ops. Must come before any data op.
    pub fn add_sequence_data(&mut self, blocks: &[u32]) -> Result<()> {
        self.check_open()?;
        if self.seen_data {
            return Err(inval("sequence data must be added before any op"));
        }
        let bs = self.bs() as usize;
        match &mut self.state {
            State::V2 { .. } => {
                if self.header.cluster_ops == 0 {
                    return Err(inval(
                        "v2 SEQUENCE ops need a clustered file (cluster_ops >= 2)",
                    ));
                }
                // At most 2 blocks of entries per SEQUENCE op.
                for chunk in blocks.chunks(2 * bs / 4) {
                    let bytes: Vec<u8> = chunk.iter().flat_map(|b| b.to_le_bytes()).collect();
                    self.v2_emit(op_type::SEQUENCE, 0, 0, 0, &bytes)?;
                }
                Ok(())
            }
            State::V3 {
                sequence_written,
                frozen,
                ..
            } => {
                if *sequence_written || *frozen {
                    return Err(inval(
                        "v3 sequence data can be written only once, before any op or label",
                    ));
                }
                *sequence_written = true;
                let bytes: Vec<u8> = blocks.iter().flat_map(|b| b.to_le_bytes()).collect();
                self.header.sequence_data_count = blocks.len() as u64;
                let off = self.header.v3_sequence_offset();
                self.sink.write_all_at(off, &bytes).map_err(io_at(off))?;
                self.end = self.end.max(off + bytes.len() as u64);
                self.write_header()
            }
        }
    }

    /// Write a label (v2: LABEL op; v3: resume point, making everything so far durable).
    pub fn add_label(&mut self, label: u64) -> Result<()> {
        self.check_open()?;
        if self.header.major == 2 {
            return self.v2_emit(op_type::LABEL, 0, 0, label, &[]);
        }
        self.v3_freeze();
        let max = self.header.resume_point_max as usize;
        if let State::V3 {
            ops,
            resume,
            resume_count,
            ..
        } = &mut self.state
        {
            resume.retain(|r| r.0 < label);
            resume.push((label, ops.len() as u64));
            if resume.len() > max {
                resume.remove(0);
            }
            *resume_count = resume_count.saturating_add(1);
            if self.defer_labels {
                let live = resume.len() * 16;
                if self.resume_shadow.len() < live {
                    self.resume_shadow.resize(live, 0);
                }
                for (slot, &(l, n)) in self.resume_shadow.chunks_exact_mut(16).zip(resume.iter()) {
                    slot.copy_from_slice(&encode_resume_point(l, n));
                }
                return Ok(());
            }
        }
        self.v3_commit()
    }

    /// v3: from now on a label only records its resume point in memory; the op records,
    /// payloads, resume points and header it would write (and sync) go out at the next
    /// [`commit`](Self::commit) or [`finalize`](Self::finalize). For a file nobody reads before
    /// it is finished: the finished file is byte for byte the same, but a crash before then
    /// leaves no resume point. Saves a header, resume-area and op-area write and two syncs per
    /// label (an OTA writer labels every payload operation).
    pub fn defer_labels(&mut self) {
        self.defer_labels = true;
    }

    /// v3: make all ops so far durable and visible (payloads + records, sync, then header, sync).
    pub fn commit(&mut self) -> Result<()> {
        self.check_open()?;
        if self.header.major == 2 {
            return Err(inval(
                "commit is for v3 append; v2 files become valid at finalize",
            ));
        }
        self.v3_freeze();
        self.v3_commit()
    }

    /// Finish the file (v2: close the cluster and write the footer; v3: write op records and
    /// header), truncate it to its exact length and sync. Returns the file length.
    pub fn finalize(mut self) -> Result<u64> {
        self.check_open()?;
        let k = self.header.cluster_ops as usize;
        let len = match &mut self.state {
            State::V2 {
                stream,
                cluster_start,
                cluster_ops,
                cluster_data,
                num_ops,
            } => {
                let footer_at = if k == 0 {
                    stream.flush(&self.sink)?;
                    stream.pos()
                } else if !cluster_data.is_empty() {
                    let unused = (k - cluster_ops.len() - 1) as u64 * 20;
                    let skip = unused + cluster_data.len() as u64;
                    cluster_ops.push(encode_op_v2(op_type::CLUSTER, 0, 0, 0, skip));
                    *num_ops += 1;
                    Self::v2_flush_cluster(
                        &self.sink,
                        cluster_start,
                        cluster_ops,
                        cluster_data,
                        k,
                    )?;
                    *cluster_start
                } else {
                    let mut buf = Vec::new();
                    for r in cluster_ops.iter() {
                        buf.extend_from_slice(r);
                    }
                    self.sink
                        .write_all_at(*cluster_start, &buf)
                        .map_err(io_at(*cluster_start))?;
                    *cluster_start + buf.len() as u64
                };
                let f = encode_footer_v2(*num_ops);
                self.sink
                    .write_all_at(footer_at, &f)
                    .map_err(io_at(footer_at))?;
                footer_at + f.len() as u64
            }
            State::V3 { .. } => {
                self.v3_freeze();
                self.v3_commit()?;
                self.end
            }
        };
        self.sink.set_len(len).map_err(io_at(len))?;
        self.sink.sync_data().map_err(io_at(0))?;
        self.finalized = true;
        Ok(len)
    }

    /// Give back the sink (e.g. after `commit`).
    pub fn into_inner(self) -> W {
        self.sink
    }
}

#[cfg(test)]
mod tests;
