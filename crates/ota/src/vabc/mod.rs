//! The Virtual A/B COW update_engine writes for a partition (notes §2), written on a host.
//!
//! [`write_vabc_cow`] takes a partition of a payload (its operations and `merge_operations`),
//! the manifest's VABC parameters ([`VabcParams::from_manifest`]), a [`DeviceProfile`], the old
//! image and the new one (what `apply` built) and writes the COW into any [`CowSink`]:
//!
//! 1. init: on a device with XOR (and merge sequences) the merge sequence — the destination
//!    blocks of every merge op in payload order, identity copies left out, each op's blocks
//!    ascending or descending as [`MergeOp::sequence_blocks`] says — with the COPY ops
//!    delayed to their SOURCE_COPY; on a device without, every COW_COPY up front in merge
//!    order; then label 0;
//! 2. per install operation, in order, then a label with the next operation's index:
//!    REPLACE*, ZERO/DISCARD → REPLACE / ZERO; SOURCE_COPY → COPY for the destination blocks a
//!    COW_COPY covers, REPLACE of the source block elsewhere, nothing where source =
//!    destination; diff ops (bsdiff, puffdiff, zucchini, lz4diff) → XOR for the blocks a
//!    COW_XOR covers (XOR on), computed against the old image at `src_block × 4096 +
//!    src_offset`, REPLACE elsewhere. Data goes to the writer in calls of at most 1 MiB that
//!    never cross an extent, as update_engine's block extent writer does (v3 cuts its
//!    compression units per call);
//! 3. label `1 << 48` (end of install), then the dm-verity hash tree and FEC the manifest
//!    leaves to the device, as REPLACE data;
//! 4. finalize.
//!
//! With a [`ByteCounter`] as the sink the same code is the COW size estimator
//! ([`estimate_vabc_cow`]), as update_engine's generator runs its writer dry.

mod error;
mod merge;

use snapblk_core::ReadAt;
use snapblk_cow::{Codec, Compression, CowSink, CowWriter, WriteAt, WriterOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use error::VabcError;
pub use merge::MergeOp;
use merge::XorMap;

use crate::proto::{DeltaArchiveManifest, Extent, OpType, PartitionUpdate};

/// The label update_engine writes after the last install operation (`kEndOfInstallLabel`).
pub const END_OF_INSTALL_LABEL: u64 = 1 << 48;

/// Largest write update_engine's block extent writer hands the COW writer at once.
pub const WRITE_CHUNK: u64 = 1 << 20;

/// The device behaviours the COW depends on (`ro.virtual_ab.compression.xor.enabled`,
/// `ro.virtual_ab.userspace.snapshots.enabled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceProfile {
    /// XOR ops and merge sequences (Android 13+ devices that declare XOR support).
    pub xor: bool,
    /// Userspace snapshots (snapuserd without dm-snapshot): ascending non-overlapping merge
    /// ops and multi-block COPY runs.
    pub userspace_snapshots: bool,
}

impl DeviceProfile {
    /// A current device (Android 13 and later with XOR): XOR on, userspace snapshots on.
    pub const CURRENT: DeviceProfile = DeviceProfile {
        xor: true,
        userspace_snapshots: true,
    };
    /// A userspace-snapshot device without XOR support.
    pub const NO_XOR: DeviceProfile = DeviceProfile {
        xor: false,
        userspace_snapshots: true,
    };
    /// An Android 12 style device: dm-snapshot merges, no XOR, no merge sequence.
    pub const LEGACY: DeviceProfile = DeviceProfile {
        xor: false,
        userspace_snapshots: false,
    };
    /// The profile named `current`, `no-xor` or `legacy`.
    pub fn by_name(name: &str) -> Option<DeviceProfile> {
        match name {
            "current" => Some(Self::CURRENT),
            "no-xor" => Some(Self::NO_XOR),
            "legacy" => Some(Self::LEGACY),
            _ => None,
        }
    }
}

impl Default for DeviceProfile {
    fn default() -> Self {
        Self::CURRENT
    }
}

/// The COW writer's options for one partition, as libsnapshot derives them from the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VabcParams {
    /// Block size (the manifest's, 4096 on every device).
    pub block_size: u32,
    /// COW major version: 2 or 3 (`cow_version`; absent means 2).
    pub cow_version: u16,
    /// Compression and level (`vabc_compression_param`, `algo[,level]`; empty means gz).
    pub codec: Codec,
    /// v3 compression unit in bytes (`compression_factor`; absent means one block).
    pub compression_factor: u32,
    /// `vabc_feature_set.batch_writes` (how the device schedules writes; no effect on the
    /// file's content).
    pub batch_writes: bool,
    /// Threads the COW writer compresses on: 2 when `vabc_feature_set.threaded`, else 1, as
    /// on a device; a host may set its own (0: one per core). No effect on the file's content.
    pub threads: u32,
    /// v3 op slots: `estimate_op_count_max`, or the new partition's blocks without one.
    pub op_count_max: u64,
}

impl VabcParams {
    /// The parameters of `partition` in `manifest`.
    pub fn from_manifest(
        manifest: &DeltaArchiveManifest,
        partition: &PartitionUpdate,
    ) -> Result<VabcParams, VabcError> {
        let bad = VabcError::Params;
        let block_size = manifest.block_size.unwrap_or(4096);
        if !(512..=32768).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(bad(format!("block size {block_size}")));
        }
        let dpm = manifest.dynamic_partition_metadata.as_ref();
        let cow_version = match dpm.and_then(|d| d.cow_version).unwrap_or(2) {
            v @ (2 | 3) => v as u16,
            v => return Err(bad(format!("COW version {v} (2 or 3 can be written)"))),
        };
        let codec = parse_compression(
            dpm.and_then(|d| d.vabc_compression_param.as_deref())
                .unwrap_or(""),
        )?;
        let factor = dpm.and_then(|d| d.compression_factor).unwrap_or(0);
        let compression_factor = match factor {
            0 => block_size,
            f if f.is_power_of_two() && f >= u64::from(block_size) && f <= 256 * 1024 => f as u32,
            f => {
                return Err(bad(format!(
                    "compression factor {f} (a power of two from the block size to 256 KiB)"
                )));
            }
        };
        let fs = dpm.and_then(|d| d.vabc_feature_set.as_ref());
        let new_blocks = partition
            .new_partition_info
            .as_ref()
            .and_then(|i| i.size)
            .unwrap_or(0)
            / u64::from(block_size);
        Ok(VabcParams {
            block_size,
            cow_version,
            codec,
            compression_factor,
            batch_writes: fs.and_then(|f| f.batch_writes).unwrap_or(false),
            threads: if fs.and_then(|f| f.threaded).unwrap_or(false) {
                2
            } else {
                1
            },
            op_count_max: partition
                .estimate_op_count_max
                .filter(|&n| n > 0)
                .unwrap_or(new_blocks.max(1)),
        })
    }

    /// The COW writer options these parameters give.
    pub fn writer_options(&self) -> WriterOptions {
        WriterOptions {
            version: self.cow_version,
            block_size: self.block_size,
            codec: self.codec,
            op_count_max: self.op_count_max,
            max_compression_size: self.compression_factor,
            ..WriterOptions::default()
        }
    }
}

/// `vabc_compression_param` → codec: `algo[,level]`, empty = gz (old OTAs).
pub fn parse_compression(param: &str) -> Result<Codec, VabcError> {
    let (name, level) = match param.split_once(',') {
        Some((n, l)) => {
            let level = l
                .trim()
                .parse::<i32>()
                .map_err(|_| VabcError::Params(format!("compression level {l:?}")))?;
            (n.trim(), Some(level))
        }
        None => (param.trim(), None),
    };
    let algo: Compression = if name.is_empty() {
        Compression::Gz
    } else {
        name.parse()
            .map_err(|_| VabcError::Params(format!("compression {name:?}")))?
    };
    let mut codec = Codec::new(algo);
    if level.is_some() {
        codec.level = level;
    }
    let codec = codec.checked().map_err(VabcError::Level)?;
    Ok(codec)
}

/// What [`write_vabc_cow`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VabcReport {
    /// Length of the COW file in bytes.
    pub cow_size: u64,
    /// Op records (v3: op slots used).
    pub op_records: u64,
    /// Blocks written as COPY.
    pub copy_blocks: u64,
    /// Blocks written as XOR.
    pub xor_blocks: u64,
    /// Blocks written as REPLACE by install operations.
    pub replace_blocks: u64,
    /// Blocks written as ZERO.
    pub zero_blocks: u64,
    /// dm-verity hash tree and FEC blocks written after the end label (REPLACE).
    pub verity_blocks: u64,
    /// Entries of the merge sequence (0 when none was written).
    pub sequence_blocks: u64,
    /// Whether XOR was on for the partition (profile with XOR and a COW_XOR merge op).
    pub xor_enabled: bool,
    /// Where the call's time went (not part of the file's description: left out of the
    /// serialized report).
    #[serde(skip)]
    pub timing: VabcTiming,
}

/// Where [`write_vabc_cow`]'s wall-clock time went, measured inside it: the writer's share of
/// a command that also builds the images (`ota cow`), comparable with a COW writer timed alone
/// from an op list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VabcTiming {
    /// The whole call: merge sequence, every operation, the dm-verity blocks and finalize.
    pub total: Duration,
    /// Of `total`: reading the old and new images (the writer's input, not its work).
    pub read: Duration,
    /// Of `total`: the dm-verity hash tree and FEC blocks written after the end label
    /// (their reads included).
    pub verity: Duration,
}

/// A [`CowSink`] that stores nothing and remembers the file length: the dry run's sink.
#[derive(Debug, Default)]
pub struct ByteCounter {
    len: AtomicU64,
}

impl ByteCounter {
    /// Bytes the file would have.
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }
    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl WriteAt for ByteCounter {
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.len
            .fetch_max(offset + buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CowSink for ByteCounter {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.len.store(len, Ordering::Relaxed);
        Ok(())
    }
}

/// A dry run's result: the COW's size and op count, and the manifest fields update_engine's
/// generator fills from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CowEstimate {
    /// The COW's exact length (v3: with an op area of exactly the ops used).
    pub cow_size: u64,
    /// Op records the COW needs.
    pub op_count: u64,
    /// `estimate_cow_size` as the generator writes it: `cow_size` plus 1 %.
    pub estimate_cow_size: u64,
    /// `estimate_op_count_max` as the generator writes it (v3: at least 25; v2: 0, unused).
    pub estimate_op_count_max: u64,
    /// The dry run's counts.
    pub report: VabcReport,
}

/// The size the COW of `partition` will have, by running [`write_vabc_cow`] into a
/// [`ByteCounter`] (the op area of a v3 file sized to the ops it needs; `params.op_count_max`
/// is ignored).
pub fn estimate_vabc_cow<O: ReadAt + ?Sized, N: ReadAt + ?Sized>(
    partition: &PartitionUpdate,
    params: &VabcParams,
    profile: DeviceProfile,
    old: Option<&O>,
    new: &N,
) -> Result<CowEstimate, VabcError> {
    const SLOTS: u64 = 1 << 40;
    let mut p = *params;
    p.op_count_max = SLOTS;
    let report = write_vabc_cow(partition, &p, profile, old, new, ByteCounter::default())?;
    let (cow_size, op_max) = if p.cow_version >= 3 {
        let op_max = report.op_records.max(25);
        let unused = (SLOTS - op_max) * 16;
        // With no data after the op area (only COPY and ZERO ops) the file ends at its last
        // op record, whatever the number of slots.
        (
            report
                .cow_size
                .checked_sub(unused)
                .unwrap_or(report.cow_size),
            op_max,
        )
    } else {
        (report.cow_size, 0)
    };
    Ok(CowEstimate {
        cow_size,
        op_count: report.op_records,
        estimate_cow_size: cow_size + cow_size / 100,
        estimate_op_count_max: op_max,
        report: VabcReport { cow_size, ..report },
    })
}

/// The merge sequence [`write_vabc_cow`] writes for `partition` (empty without merge
/// operations or without XOR in `profile`).
pub fn vabc_merge_sequence(
    partition: &PartitionUpdate,
    block_size: u32,
    old_blocks: u64,
    profile: DeviceProfile,
) -> Result<Vec<u32>, VabcError> {
    let new_blocks = new_size(partition) / u64::from(block_size);
    let ops = merge::check(
        &partition.merge_operations,
        block_size,
        old_blocks,
        new_blocks,
    )?;
    if !profile.xor || ops.is_empty() {
        return Ok(Vec::new());
    }
    merge::sequence(&ops, profile.userspace_snapshots)
}

fn new_size(p: &PartitionUpdate) -> u64 {
    p.new_partition_info
        .as_ref()
        .and_then(|i| i.size)
        .unwrap_or(0)
}

fn ext(e: &Extent) -> (u64, u64) {
    (e.start_block.unwrap_or(0), e.num_blocks.unwrap_or(0))
}

/// Write the COW update_engine would write for `partition` (see the module docs) into `sink`.
/// `old` is the old image (needed when an operation reads it); `new` is the new image with
/// its dm-verity tree and FEC in place (what `apply` or extraction built). The file's bytes
/// are update_engine's, but its labels reach `sink` only at the end
/// ([`CowWriter::defer_labels`]): a COW cut short has no resume point.
pub fn write_vabc_cow<S: CowSink, O: ReadAt + ?Sized, N: ReadAt + ?Sized>(
    partition: &PartitionUpdate,
    params: &VabcParams,
    profile: DeviceProfile,
    old: Option<&O>,
    new: &N,
    sink: S,
) -> Result<VabcReport, VabcError> {
    let t0 = Instant::now();
    let bs = u64::from(params.block_size);
    let new_blocks = new_size(partition) / bs;
    let old_size = match old {
        Some(o) => o
            .size()
            .map_err(|source| VabcError::ReadSource { offset: 0, source })?,
        None => 0,
    };
    let merge_ops = merge::check(
        &partition.merge_operations,
        params.block_size,
        old_size / bs,
        new_blocks,
    )?;
    let xor_map = if profile.xor {
        XorMap::new(&merge_ops)?
    } else {
        XorMap::default()
    };
    let copy_blocks = merge::BlockRanges::new(
        merge_ops
            .iter()
            .filter(|m| m.kind == crate::proto::CowMergeOpType::CowCopy)
            .map(|m| (m.dst_start, m.dst_blocks))
            .collect(),
    );
    let mut writer = CowWriter::new(sink, params.writer_options())?;
    writer.set_threads(params.threads as usize);
    // The COW is written whole and read only once finished (this writer does not resume a
    // half-written one), so its labels need not reach the file one by one.
    writer.defer_labels();
    let mut w = Vabc {
        w: writer,
        bs,
        profile,
        old,
        old_size,
        new,
        new_blocks,
        xor_map,
        copy_blocks,
        report: VabcReport::default(),
        buf: Vec::new(),
        src: Vec::new(),
        xored: Vec::new(),
    };
    w.report.xor_enabled = !w.xor_map.is_empty();
    w.init(&merge_ops)?;
    for (index, op) in partition.operations.iter().enumerate() {
        w.operation(index, op)?;
        w.w.add_label(index as u64 + 1)?;
    }
    w.w.add_label(END_OF_INSTALL_LABEL)?;
    let t_verity = Instant::now();
    let verity = [&partition.hash_tree_extent, &partition.fec_extent];
    for e in verity.into_iter().flatten() {
        let (s, n) = ext(e);
        if s.checked_add(n).is_none_or(|e| e > new_blocks) {
            return Err(VabcError::Verity {
                start: s,
                blocks: n,
                new_blocks,
            });
        }
        w.raw_from_new(s, n, partition.operations.len(), false)?;
        w.report.verity_blocks += n;
        w.report.replace_blocks -= n;
    }
    w.report.timing.verity = t_verity.elapsed();
    w.report.op_records = w.w.op_records();
    let mut report = w.report;
    report.cow_size = w.w.finalize()?;
    report.timing.total = t0.elapsed();
    Ok(report)
}

struct Vabc<'a, S: CowSink, O: ?Sized, N: ?Sized> {
    w: CowWriter<S>,
    bs: u64,
    profile: DeviceProfile,
    old: Option<&'a O>,
    old_size: u64,
    new: &'a N,
    new_blocks: u64,
    xor_map: XorMap,
    copy_blocks: merge::BlockRanges,
    report: VabcReport,
    buf: Vec<u8>,
    src: Vec<u8>,
    /// XOR payloads (new ⊕ source) on their way to the writer.
    xored: Vec<u8>,
}

/// What a SOURCE_COPY block pair becomes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyKind {
    Skip,
    Copy,
    Raw,
}

impl<S: CowSink, O: ReadAt + ?Sized, N: ReadAt + ?Sized> Vabc<'_, S, O, N> {
    fn init(&mut self, merge_ops: &[MergeOp]) -> Result<(), VabcError> {
        if !merge_ops.is_empty() {
            if self.profile.xor {
                let seq = merge::sequence(merge_ops, self.profile.userspace_snapshots)?;
                self.w.add_sequence_data(&seq)?;
                self.report.sequence_blocks = seq.len() as u64;
            } else {
                for m in merge_ops {
                    if m.kind != crate::proto::CowMergeOpType::CowCopy || m.is_identity_copy() {
                        continue;
                    }
                    self.copy_run(m.dst_start, m.src_start, m.dst_blocks)?;
                }
            }
        }
        self.w.add_label(0)?;
        Ok(())
    }

    /// COPY of `n` blocks: one multi-block call with userspace snapshots, else block by
    /// block from the last.
    fn copy_run(&mut self, dst: u64, src: u64, n: u64) -> Result<(), VabcError> {
        if self.profile.userspace_snapshots {
            self.w.add_copy(dst, src, n)?;
        } else {
            for i in (0..n).rev() {
                self.w.add_copy(dst + i, src + i, 1)?;
            }
        }
        self.report.copy_blocks += n;
        Ok(())
    }

    fn check_dst(&self, index: usize, s: u64, n: u64) -> Result<(), VabcError> {
        if s.checked_add(n).is_none_or(|e| e > self.new_blocks) {
            return Err(VabcError::Operation {
                index,
                reason: format!(
                    "destination {s}+{n} outside the new partition ({} blocks)",
                    self.new_blocks
                ),
            });
        }
        Ok(())
    }

    fn operation(
        &mut self,
        index: usize,
        op: &crate::proto::InstallOperation,
    ) -> Result<(), VabcError> {
        for e in &op.dst_extents {
            let (s, n) = ext(e);
            self.check_dst(index, s, n)?;
        }
        let t = op.op_type().map_err(|n| VabcError::Operation {
            index,
            reason: format!("unknown operation type {n}"),
        })?;
        match t {
            OpType::Zero | OpType::Discard => {
                for e in &op.dst_extents {
                    let (s, n) = ext(e);
                    self.w.add_zero_blocks(s, n)?;
                    self.report.zero_blocks += n;
                }
                Ok(())
            }
            OpType::SourceCopy => self.source_copy(index, op),
            OpType::Replace | OpType::ReplaceBz | OpType::ReplaceXz | OpType::ReplaceZstd => {
                for e in &op.dst_extents {
                    let (s, n) = ext(e);
                    self.raw_from_new(s, n, index, false)?;
                }
                Ok(())
            }
            _ => {
                let xor = !self.xor_map.is_empty();
                for e in &op.dst_extents {
                    let (s, n) = ext(e);
                    self.raw_from_new(s, n, index, xor)?;
                }
                Ok(())
            }
        }
    }

    fn read_new(&mut self, block: u64, n: u64) -> Result<(), VabcError> {
        let t = Instant::now();
        let off = block * self.bs;
        self.buf.resize((n * self.bs) as usize, 0);
        let r = self
            .new
            .read_exact_at(off, &mut self.buf)
            .map_err(|source| VabcError::ReadTarget {
                offset: off,
                source,
            });
        self.report.timing.read += t.elapsed();
        r
    }

    fn read_old(&mut self, index: usize, off: u64, len: u64) -> Result<(), VabcError> {
        let old = self.old.ok_or(VabcError::NoSource { index })?;
        let t = Instant::now();
        self.src.resize(len as usize, 0);
        let r = old
            .read_exact_at(off, &mut self.src)
            .map_err(|source| VabcError::ReadSource {
                offset: off,
                source,
            });
        self.report.timing.read += t.elapsed();
        r
    }

    /// Blocks `[s, s+n)` of the new image to the writer in calls of at most [`WRITE_CHUNK`],
    /// through the XOR writer when `xor`.
    fn raw_from_new(&mut self, s: u64, n: u64, index: usize, xor: bool) -> Result<(), VabcError> {
        let per = WRITE_CHUNK / self.bs;
        let mut b = s;
        while b < s + n {
            let k = per.min(s + n - b);
            self.read_new(b, k)?;
            if xor {
                self.xor_chunk(index, b, k)?;
            } else {
                self.w.add_raw_blocks(b, &self.buf)?;
                self.report.replace_blocks += k;
            }
            b += k;
        }
        Ok(())
    }

    /// update_engine's XOR extent writer on one chunk (new bytes in `buf`): XOR ops for the
    /// parts a COW_XOR covers, then REPLACE for the rest.
    fn xor_chunk(&mut self, index: usize, start: u64, n: u64) -> Result<(), VabcError> {
        let bs = self.bs;
        let parts = self.xor_map.intersect(start, n);
        for &(s, k, m) in &parts {
            let src_block = m.src_start + (s - m.dst_start);
            let off = src_block * bs + u64::from(m.src_offset);
            let i = ((s - start) * bs) as usize;
            let len = k * bs;
            let end = off + len;
            // A read past the source's end by less than a block: the last block is XOR-ed
            // with its aligned source block instead (update_engine's edge case).
            let (normal, aligned_last) = if end > self.old_size {
                if end - self.old_size >= bs {
                    return Err(VabcError::Operation {
                        index,
                        reason: format!(
                            "XOR of blocks {s}+{k} reads source bytes {off}..{end}, past the old image's end ({})",
                            self.old_size
                        ),
                    });
                }
                (k - 1, true)
            } else {
                (k, false)
            };
            if normal > 0 {
                self.read_old(index, off, normal * bs)?;
                self.xor_into(i, (normal * bs) as usize);
                self.w
                    .add_xor_blocks(s, &self.xored, src_block, m.src_offset as u16)?;
            }
            if aligned_last {
                let last_src = src_block + k - 1;
                self.read_old(index, last_src * bs, bs)?;
                self.xor_into(i + ((k - 1) * bs) as usize, bs as usize);
                self.w.add_xor_blocks(s + k - 1, &self.xored, last_src, 0)?;
            }
            self.report.xor_blocks += k;
        }
        // The parts no COW_XOR covers, as REPLACE.
        let mut b = start;
        let mut gaps = Vec::new();
        for &(s, k, _) in &parts {
            if s > b {
                gaps.push((b, s - b));
            }
            b = s + k;
        }
        if b < start + n {
            gaps.push((b, start + n - b));
        }
        for (g, k) in gaps {
            let i = ((g - start) * bs) as usize;
            self.w
                .add_raw_blocks(g, &self.buf[i..i + (k * bs) as usize])?;
            self.report.replace_blocks += k;
        }
        Ok(())
    }

    /// `xored` = `len` bytes of `buf` from `at`, XOR-ed with the start of `src`.
    fn xor_into(&mut self, at: usize, len: usize) {
        self.xored.clear();
        self.xored.extend(
            self.buf[at..at + len]
                .iter()
                .zip(&self.src)
                .map(|(a, b)| a ^ b),
        );
    }

    fn source_copy(
        &mut self,
        index: usize,
        op: &crate::proto::InstallOperation,
    ) -> Result<(), VabcError> {
        let bad = |reason: String| VabcError::Operation { index, reason };
        let old_blocks = self.old_size / self.bs;
        let mut src_total = 0u64;
        for e in &op.src_extents {
            let (s, n) = ext(e);
            if s.checked_add(n).is_none_or(|e| e > old_blocks) {
                return Err(bad(format!(
                    "source {s}+{n} outside the old image ({old_blocks} blocks)"
                )));
            }
            src_total += n;
        }
        let dst_total: u64 = op.dst_extents.iter().map(|e| ext(e).1).sum();
        if src_total != dst_total {
            return Err(bad(format!(
                "SOURCE_COPY of {src_total} source blocks to {dst_total} destination blocks"
            )));
        }
        if src_total > 0 && self.old.is_none() {
            return Err(VabcError::NoSource { index });
        }
        // Walk both extent lists pairwise, merging consecutive pairs of one kind into runs.
        let blocks = |es: &[Extent]| -> Vec<(u64, u64)> { es.iter().map(ext).collect() };
        let (srcs, dsts) = (blocks(&op.src_extents), blocks(&op.dst_extents));
        let mut si = PairWalk::new(&srcs);
        let mut di = PairWalk::new(&dsts);
        let mut run: Option<(CopyKind, u64, u64, u64)> = None; // kind, dst, src, n
        while let (Some(src), Some(dst)) = (si.next(), di.next()) {
            let kind = if src == dst {
                CopyKind::Skip
            } else if self.copy_blocks.contains(dst) {
                if self.profile.xor {
                    CopyKind::Copy
                } else {
                    CopyKind::Skip // written in init on a device without merge sequences
                }
            } else {
                CopyKind::Raw
            };
            match &mut run {
                Some((k, d, s, n)) if *k == kind && *d + *n == dst && *s + *n == src => *n += 1,
                _ => {
                    if let Some(r) = run.take() {
                        self.copy_pair_run(index, r)?;
                    }
                    run = Some((kind, dst, src, 1));
                }
            }
        }
        if let Some(r) = run {
            self.copy_pair_run(index, r)?;
        }
        Ok(())
    }

    fn copy_pair_run(
        &mut self,
        index: usize,
        (kind, dst, src, n): (CopyKind, u64, u64, u64),
    ) -> Result<(), VabcError> {
        match kind {
            CopyKind::Skip => Ok(()),
            CopyKind::Copy => self.copy_run(dst, src, n),
            CopyKind::Raw => {
                let per = WRITE_CHUNK / self.bs;
                let mut i = 0;
                while i < n {
                    let k = per.min(n - i);
                    self.read_old(index, (src + i) * self.bs, k * self.bs)?;
                    let data = std::mem::take(&mut self.src);
                    let r = self.w.add_raw_blocks(dst + i, &data);
                    self.src = data;
                    r?;
                    self.report.replace_blocks += k;
                    i += k;
                }
                Ok(())
            }
        }
    }
}

/// The blocks of an extent list, one by one.
struct PairWalk<'a> {
    extents: &'a [(u64, u64)],
    i: usize,
    j: u64,
}

impl<'a> PairWalk<'a> {
    fn new(extents: &'a [(u64, u64)]) -> Self {
        PairWalk {
            extents,
            i: 0,
            j: 0,
        }
    }
}

impl Iterator for PairWalk<'_> {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        while let Some(&(s, n)) = self.extents.get(self.i) {
            if self.j < n {
                self.j += 1;
                return Some(s + self.j - 1);
            }
            self.i += 1;
            self.j = 0;
        }
        None
    }
}
