//! The payload generator behind `snapblk ota generate`: full payloads (REPLACE_XZ or REPLACE
//! chunks) and incremental ones made block by block from an old and a new image — ZERO,
//! SOURCE_COPY for blocks found unchanged or moved in the old image, and for changed runs the
//! smallest of REPLACE, REPLACE_XZ and a bsdiff patch against the old blocks around them
//! (BROTLI_BSDIFF, or SOURCE_BSDIFF with [`BsdiffFormat::Bsdiff40`]) — with Virtual A/B
//! metadata: `merge_operations` (COW_COPY, COW_XOR from the bsdiff control streams, cycles
//! broken), `dynamic_partition_metadata` and COW size estimates from a dry run of the
//! crate's Virtual A/B COW writer ([`estimate_vabc_cow`](crate::estimate_vabc_cow)), as
//! update_engine's generator runs libsnapshot's. Every operation and partition carries its hashes; [`Generated`]
//! writes the payload unsigned or signed with [`SigningKey`]s.
//!
//! The generator is not file-system aware (no puffdiff, zucchini or per-file diffs), so its
//! patches are larger than `delta_generator`'s; its payloads apply with update_engine's rules.

mod diff;
pub(crate) mod merge;
mod sign;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message;
use sha2::{Digest, Sha256};

use crate::payload::{HEADER_LEN, MAGIC, MAJOR_VERSION};
use crate::proto::{
    DeltaArchiveManifest, DynamicPartitionGroup, DynamicPartitionMetadata, Extent,
    InstallOperation, OpType, PartitionInfo, PartitionUpdate, VabcFeatureSet,
};

pub use diff::BsdiffFormat;
pub use sign::{SignError, SigningKey};

pub(crate) use merge::MergeOp;

/// Block size of generated payloads.
pub const GEN_BLOCK_SIZE: u64 = 4096;
/// Blocks per operation of a full partition (2 MiB, update_engine's default chunk).
pub const FULL_CHUNK_BLOCKS: u64 = 512;
/// Most blocks one changed run's operation covers (its bsdiff reads up to three times as
/// many old blocks).
pub const DIFF_CHUNK_BLOCKS: u64 = 256;
/// Minor version of incremental payloads (Android 13's, with Virtual A/B XOR merge
/// operations; SOURCE_BSDIFF is valid at any minor version from 2 on).
pub const DELTA_MINOR_VERSION: u32 = 8;

/// Why a payload cannot be generated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// No partition given.
    #[error("no partition to write")]
    NoPartitions,
    /// A partition name that cannot name an image file.
    #[error("partition name {name:?}: {reason}")]
    BadName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A partition named twice.
    #[error("partition {0} given twice")]
    Duplicate(String),
    /// An image that is not whole blocks.
    #[error("partition {name}: {which} image of {size} bytes is not a multiple of 4096 bytes")]
    NotBlocks {
        /// The partition.
        name: String,
        /// `old` or `new`.
        which: &'static str,
        /// Its size.
        size: u64,
    },
    /// A minor version this generator cannot write.
    #[error("minor version {version}: {reason}")]
    MinorVersion {
        /// The version asked for.
        version: u32,
        /// Why not.
        reason: &'static str,
    },
    /// Virtual A/B settings that are not valid.
    #[error("Virtual A/B settings: {0}")]
    Vabc(String),
    /// The Virtual A/B compression level is outside its algorithm's range.
    #[error("Virtual A/B settings: compression level")]
    VabcLevel(#[source] snapblk_cow::LevelError),
    /// Compressing or diffing failed.
    #[error("partition {partition}: encoding blocks {start}+{count}")]
    Encode {
        /// The partition.
        partition: String,
        /// First block.
        start: u64,
        /// Blocks.
        count: u64,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The COW dry run failed.
    #[error("partition {partition}: estimating the COW size")]
    Estimate {
        /// The partition.
        partition: String,
        /// The cause.
        #[source]
        source: crate::VabcError,
    },
}

/// Virtual A/B settings of the payload (`dynamic_partition_metadata`) and its estimates.
#[derive(Clone, Debug)]
pub struct VabcOptions {
    /// `vabc_compression_param`: `none`, `gz`, `brotli`, `lz4` or `zstd`, optionally with
    /// `,LEVEL`.
    pub compression: String,
    /// COW major version, 2 or 3.
    pub cow_version: u32,
    /// v3: largest compression unit in bytes (a power of two, 4 KiB to 256 KiB).
    pub compression_factor: u64,
    /// COW_XOR merge operations from bsdiff operations (off when compression is `none`, as
    /// Android's release tools do).
    pub xor: bool,
    /// Name of the dynamic partition group holding every partition.
    pub group: String,
    /// The group's size (default: the new partitions' sizes added up).
    pub group_size: Option<u64>,
}

impl Default for VabcOptions {
    fn default() -> Self {
        VabcOptions {
            compression: "lz4".into(),
            cow_version: 3,
            compression_factor: 65536,
            xor: true,
            group: "snapblk_dynamic_partitions".into(),
            group_size: None,
        }
    }
}

/// Generator settings.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// How bsdiff operations are written.
    pub bsdiff_format: BsdiffFormat,
    /// The manifest's minor version (default: 0 for a full payload, [`DELTA_MINOR_VERSION`]
    /// for an incremental one).
    pub minor_version: Option<u32>,
    /// Virtual A/B metadata, merge operations and estimates; `None` for none.
    pub vabc: Option<VabcOptions>,
    /// Worker threads for diffing and compressing (at least 1).
    pub threads: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            bsdiff_format: BsdiffFormat::Bsdf2,
            minor_version: None,
            vabc: Some(VabcOptions::default()),
            threads: 1,
        }
    }
}

/// One partition: its new image and, for an incremental payload, its old one.
#[derive(Clone, Copy, Debug)]
pub struct PartitionImages<'a> {
    /// Partition name (`system`, `vendor`, ...).
    pub name: &'a str,
    /// The old image (`None`: the partition is written in full).
    pub old: Option<&'a [u8]>,
    /// The new image.
    pub new: &'a [u8],
}

/// What the generator wrote for one partition.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PartitionStats {
    /// Partition name.
    pub name: String,
    /// Operations per type name.
    pub ops: std::collections::BTreeMap<String, u64>,
    /// Bytes of data blobs.
    pub data_bytes: u64,
    /// COW_COPY merge operations written.
    pub cow_copy: u64,
    /// COW_XOR merge operations written.
    pub cow_xor: u64,
    /// Merge operations dropped to break dependency cycles.
    pub dropped: u64,
    /// `estimate_cow_size`, when Virtual A/B is on.
    pub estimate_cow_size: Option<u64>,
}

/// A generated payload: manifest and data area.
#[derive(Clone, Debug)]
pub struct Generated {
    /// The manifest (without signature fields).
    pub manifest: DeltaArchiveManifest,
    /// The data area: every operation's blob, in operation order.
    pub data: Vec<u8>,
    /// Per partition, what was written.
    pub stats: Vec<PartitionStats>,
}

/// An operation made from a run of blocks, before its blob is placed in the data area.
struct Made {
    op: InstallOperation,
    blob: Vec<u8>,
    /// XOR blocks (absolute: new block, old block, offset) of a bsdiff operation.
    xor: Vec<(u64, u64, u32)>,
}

fn extent(start: u64, n: u64) -> Extent {
    Extent {
        start_block: Some(start),
        num_blocks: Some(n),
    }
}

fn sha256(b: &[u8]) -> Vec<u8> {
    Sha256::digest(b).to_vec()
}

fn xz(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let s = liblzma::stream::Stream::new_easy_encoder(6, liblzma::stream::Check::Crc32)
        .map_err(std::io::Error::other)?;
    let mut w = liblzma::write::XzEncoder::new_stream(Vec::new(), s);
    w.write_all(data)?;
    w.finish()
}

/// The smaller of REPLACE_XZ and REPLACE for `data` (REPLACE_XZ on a tie).
fn replace(data: &[u8], dst: u64) -> std::io::Result<Made> {
    let x = xz(data)?;
    let (t, blob) = if x.len() <= data.len() {
        (OpType::ReplaceXz, x)
    } else {
        (OpType::Replace, data.to_vec())
    };
    Ok(Made {
        op: InstallOperation {
            r#type: t as i32,
            dst_extents: vec![extent(dst, (data.len() as u64) / GEN_BLOCK_SIZE)],
            ..Default::default()
        },
        blob,
        xor: Vec::new(),
    })
}

/// What a new block is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Zero,
    Copy(u64),
    Changed,
}

fn blk(img: &[u8], b: u64) -> &[u8] {
    let bs = GEN_BLOCK_SIZE as usize;
    &img[b as usize * bs..(b as usize + 1) * bs]
}

/// Each new block's kind: all zero, found in the old image (the same block, the block after
/// the previous copy's source, or any block with these bytes), or changed.
fn classify(old: &[u8], new: &[u8]) -> Vec<Kind> {
    let bs = GEN_BLOCK_SIZE as usize;
    let (nold, nnew) = ((old.len() / bs) as u64, (new.len() / bs) as u64);
    let mut index: HashMap<&[u8], u64> = HashMap::new();
    for b in (0..nold).rev() {
        let d = blk(old, b);
        if d.iter().any(|&x| x != 0) {
            index.insert(d, b);
        }
    }
    let mut kinds = Vec::with_capacity(nnew as usize);
    for t in 0..nnew {
        let d = blk(new, t);
        let k = if d.iter().all(|&x| x == 0) {
            Kind::Zero
        } else if t < nold && blk(old, t) == d {
            Kind::Copy(t)
        } else if let Some(Kind::Copy(p)) = kinds.last().copied()
            && p + 1 < nold
            && blk(old, p + 1) == d
        {
            Kind::Copy(p + 1)
        } else if let Some(&s) = index.get(d) {
            Kind::Copy(s)
        } else {
            Kind::Changed
        };
        kinds.push(k);
    }
    kinds
}

/// A run of new blocks to turn into one operation.
#[derive(Clone, Copy, Debug)]
enum Run {
    Zero { dst: u64, n: u64 },
    Copy { src: u64, dst: u64, n: u64 },
    Data { dst: u64, n: u64 },
}

fn runs(kinds: &[Kind], data_chunk: u64) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (t, k) in kinds.iter().enumerate() {
        let t = t as u64;
        match (out.last_mut(), *k) {
            (Some(Run::Zero { dst, n }), Kind::Zero) if *dst + *n == t => *n += 1,
            (Some(Run::Copy { src, dst, n }), Kind::Copy(s))
                if *dst + *n == t && *src + *n == s =>
            {
                *n += 1
            }
            (Some(Run::Data { dst, n }), Kind::Changed) if *dst + *n == t && *n < data_chunk => {
                *n += 1
            }
            (_, Kind::Zero) => out.push(Run::Zero { dst: t, n: 1 }),
            (_, Kind::Copy(s)) => out.push(Run::Copy {
                src: s,
                dst: t,
                n: 1,
            }),
            (_, Kind::Changed) => out.push(Run::Data { dst: t, n: 1 }),
        }
    }
    out
}

/// The operation for a changed run: the smallest of REPLACE, REPLACE_XZ and a bsdiff patch
/// against the old blocks from `n` before to `n` after the run.
fn encode_changed(
    old: &[u8],
    new: &[u8],
    dst: u64,
    n: u64,
    format: BsdiffFormat,
) -> std::io::Result<Made> {
    let bs = GEN_BLOCK_SIZE;
    let data = &new[(dst * bs) as usize..((dst + n) * bs) as usize];
    let mut best = replace(data, dst)?;
    let nold = old.len() as u64 / bs;
    let margin = n.max(16);
    let (ws, we) = (dst.saturating_sub(margin), (dst + n + margin).min(nold));
    if ws >= we {
        return Ok(best);
    }
    let src = &old[(ws * bs) as usize..(we * bs) as usize];
    let patch = diff::make_patch(src, data)?;
    let blob = diff::encode(&patch, format)?;
    if blob.len() < best.blob.len() {
        let xor = diff::xor_blocks(&patch, bs, we - ws, n)
            .into_iter()
            .map(|x| (dst + x.dst, ws + x.src, x.offset))
            .collect();
        let t = match format {
            BsdiffFormat::Bsdf2 => OpType::BrotliBsdiff,
            BsdiffFormat::Bsdiff40 => OpType::SourceBsdiff,
        };
        best = Made {
            op: InstallOperation {
                r#type: t as i32,
                src_extents: vec![extent(ws, we - ws)],
                dst_extents: vec![extent(dst, n)],
                src_sha256_hash: Some(sha256(src)),
                ..Default::default()
            },
            blob,
            xor,
        };
    }
    Ok(best)
}

/// Runs `jobs` on `threads` workers; results in job order.
fn parallel<T: Send, J: Sync>(jobs: &[J], threads: usize, f: &(dyn Fn(&J) -> T + Sync)) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(j) = jobs.get(i) else { break };
                    let r = f(j);
                    snapblk_core::sync::lock(&out)[i] = Some(r);
                }
            });
        }
    });
    snapblk_core::sync::lock(&out).drain(..).flatten().collect()
}

/// The operations of one partition.
fn partition_ops(
    p: &PartitionImages<'_>,
    full_payload: bool,
    opts: &GenerateOptions,
) -> Result<Vec<Made>, GenerateError> {
    let bs = GEN_BLOCK_SIZE;
    let nnew = p.new.len() as u64 / bs;
    let runs = match p.old {
        Some(old) => runs(&classify(old, p.new), DIFF_CHUNK_BLOCKS),
        None => {
            let mut v = Vec::new();
            let mut b = 0;
            while b < nnew {
                let n = FULL_CHUNK_BLOCKS.min(nnew - b);
                let zero = p.new[(b * bs) as usize..((b + n) * bs) as usize]
                    .iter()
                    .all(|&x| x == 0);
                v.push(if zero && !full_payload {
                    Run::Zero { dst: b, n }
                } else {
                    Run::Data { dst: b, n }
                });
                b += n;
            }
            v
        }
    };
    let old = p.old.unwrap_or(&[]);
    let made = parallel(
        &runs,
        opts.threads,
        &|r: &Run| -> Result<Made, GenerateError> {
            match *r {
                Run::Zero { dst, n } => Ok(Made {
                    op: InstallOperation {
                        r#type: OpType::Zero as i32,
                        dst_extents: vec![extent(dst, n)],
                        ..Default::default()
                    },
                    blob: Vec::new(),
                    xor: Vec::new(),
                }),
                Run::Copy { src, dst, n } => Ok(Made {
                    op: InstallOperation {
                        r#type: OpType::SourceCopy as i32,
                        src_extents: vec![extent(src, n)],
                        dst_extents: vec![extent(dst, n)],
                        src_sha256_hash: Some(sha256(
                            &old[(src * bs) as usize..((src + n) * bs) as usize],
                        )),
                        ..Default::default()
                    },
                    blob: Vec::new(),
                    xor: Vec::new(),
                }),
                Run::Data { dst, n } => {
                    let r = if p.old.is_some() {
                        encode_changed(old, p.new, dst, n, opts.bsdiff_format)
                    } else {
                        replace(&p.new[(dst * bs) as usize..((dst + n) * bs) as usize], dst)
                    };
                    r.map_err(|source| GenerateError::Encode {
                        partition: p.name.to_string(),
                        start: dst,
                        count: n,
                        source,
                    })
                }
            }
        },
    );
    made.into_iter().collect()
}

/// The compression of `v`, its other settings checked.
fn cow_compression(v: &VabcOptions) -> Result<snapblk_cow::Compression, GenerateError> {
    let bad = |m: String| GenerateError::Vabc(m);
    let codec = crate::parse_compression(&v.compression).map_err(|e| match e {
        crate::VabcError::Level(e) => GenerateError::VabcLevel(e),
        _ => bad(format!(
            "compression {:?}: none, gz, brotli, lz4 or zstd, with an optional ,LEVEL",
            v.compression
        )),
    })?;
    if !(2..=3).contains(&v.cow_version) {
        return Err(bad(format!("COW version {} (2 or 3)", v.cow_version)));
    }
    let f = v.compression_factor;
    if !f.is_power_of_two() || !(4096..=256 * 1024).contains(&f) {
        return Err(bad(format!(
            "compression factor {f}: a power of two from 4096 to 262144"
        )));
    }
    Ok(codec.algo)
}

/// Generate a payload: a full one when no partition has an old image, else an incremental
/// one (partitions without an old image written in full). Checks names, sizes and settings
/// before any work.
pub fn generate(
    parts: &[PartitionImages<'_>],
    opts: &GenerateOptions,
) -> Result<Generated, GenerateError> {
    if parts.is_empty() {
        return Err(GenerateError::NoPartitions);
    }
    for (i, p) in parts.iter().enumerate() {
        crate::plan::check_partition_name(p.name).map_err(|reason| GenerateError::BadName {
            name: p.name.to_string(),
            reason,
        })?;
        if parts[..i].iter().any(|q| q.name == p.name) {
            return Err(GenerateError::Duplicate(p.name.to_string()));
        }
        for (which, img) in [("new", Some(p.new)), ("old", p.old)] {
            if let Some(img) = img
                && !(img.len() as u64).is_multiple_of(GEN_BLOCK_SIZE)
            {
                return Err(GenerateError::NotBlocks {
                    name: p.name.to_string(),
                    which,
                    size: img.len() as u64,
                });
            }
        }
    }
    let full = parts.iter().all(|p| p.old.is_none());
    let minor = match (full, opts.minor_version) {
        (true, None | Some(0)) => 0,
        (true, Some(v)) => {
            return Err(GenerateError::MinorVersion {
                version: v,
                reason: "a full payload (no old images) has minor version 0",
            });
        }
        (false, None) => DELTA_MINOR_VERSION,
        (false, Some(v)) if (4..=9).contains(&v) => v,
        (false, Some(v)) => {
            return Err(GenerateError::MinorVersion {
                version: v,
                reason: "incremental payloads are written with minor versions 4 to 9 (ZERO and BROTLI_BSDIFF need 4)",
            });
        }
    };
    let compression = opts.vabc.as_ref().map(cow_compression).transpose()?;
    let xor_on = opts.vabc.as_ref().is_some_and(|v| v.xor)
        && compression.is_some_and(|c| c != snapblk_cow::Compression::None);
    let dynamic = opts.vabc.as_ref().map(|v| dynamic_metadata(v, parts));
    let mut data = Vec::new();
    let mut partitions = Vec::new();
    let mut stats = Vec::new();
    for p in parts {
        let made = partition_ops(p, full, opts)?;
        let mut st = PartitionStats {
            name: p.name.to_string(),
            ..Default::default()
        };
        let mut merge_in = Vec::new();
        let mut ops = Vec::with_capacity(made.len());
        for m in made {
            let mut op = m.op;
            if let Ok(t) = op.op_type() {
                *st.ops.entry(t.name().to_string()).or_default() += 1;
            }
            if opts.vabc.is_some() && p.old.is_some() {
                if op.r#type == OpType::SourceCopy as i32 {
                    let (s, d) = (&op.src_extents[0], &op.dst_extents[0]);
                    merge::copies(
                        s.start_block.unwrap_or(0),
                        d.start_block.unwrap_or(0),
                        d.num_blocks.unwrap_or(0),
                        &mut merge_in,
                    );
                } else if xor_on {
                    push_xor(&m.xor, &mut merge_in);
                }
            }
            if !m.blob.is_empty() {
                op.data_offset = Some(data.len() as u64);
                op.data_length = Some(m.blob.len() as u64);
                op.data_sha256_hash = Some(sha256(&m.blob));
                st.data_bytes += m.blob.len() as u64;
                data.extend_from_slice(&m.blob);
            }
            ops.push(op);
        }
        let ordered = merge::order(merge_in);
        st.cow_copy = ordered.ops.iter().filter(|o| !o.xor).count() as u64;
        st.cow_xor = ordered.ops.iter().filter(|o| o.xor).count() as u64;
        st.dropped = ordered.dropped.len() as u64;
        let mut update = PartitionUpdate {
            partition_name: p.name.to_string(),
            old_partition_info: p.old.map(|o| PartitionInfo {
                size: Some(o.len() as u64),
                hash: Some(sha256(o)),
            }),
            new_partition_info: Some(PartitionInfo {
                size: Some(p.new.len() as u64),
                hash: Some(sha256(p.new)),
            }),
            merge_operations: ordered.ops.iter().map(|o| o.to_proto()).collect(),
            ..Default::default()
        };
        update.operations = ops;
        if let Some(dm) = &dynamic {
            let e = estimate(dm, &update, p).map_err(|source| GenerateError::Estimate {
                partition: p.name.to_string(),
                source,
            })?;
            update.estimate_cow_size = Some(e.estimate_cow_size);
            update.estimate_op_count_max = Some(e.estimate_op_count_max);
            st.estimate_cow_size = Some(e.estimate_cow_size);
        }
        partitions.push(update);
        stats.push(st);
    }
    Ok(Generated {
        manifest: DeltaArchiveManifest {
            block_size: Some(GEN_BLOCK_SIZE as u32),
            minor_version: Some(minor),
            partitions,
            dynamic_partition_metadata: dynamic,
            ..Default::default()
        },
        data,
        stats,
    })
}

/// The payload's `dynamic_partition_metadata`: one group holding every partition.
fn dynamic_metadata(v: &VabcOptions, parts: &[PartitionImages<'_>]) -> DynamicPartitionMetadata {
    DynamicPartitionMetadata {
        groups: vec![DynamicPartitionGroup {
            name: v.group.clone(),
            size: Some(
                v.group_size
                    .unwrap_or_else(|| parts.iter().map(|p| p.new.len() as u64).sum()),
            ),
            partition_names: parts.iter().map(|p| p.name.to_string()).collect(),
        }],
        snapshot_enabled: Some(true),
        vabc_enabled: Some(true),
        vabc_compression_param: Some(v.compression.clone()),
        cow_version: Some(v.cow_version),
        vabc_feature_set: Some(VabcFeatureSet {
            threaded: Some(true),
            batch_writes: Some(true),
        }),
        compression_factor: Some(v.compression_factor),
        disable_ublk: None,
    }
}

/// The COW estimate of a finished partition: a dry run of the Virtual A/B writer a current
/// device runs (XOR, userspace snapshots) over the target image.
fn estimate(
    dm: &DynamicPartitionMetadata,
    update: &PartitionUpdate,
    p: &PartitionImages<'_>,
) -> Result<crate::CowEstimate, crate::VabcError> {
    let m = DeltaArchiveManifest {
        block_size: Some(GEN_BLOCK_SIZE as u32),
        dynamic_partition_metadata: Some(dm.clone()),
        ..Default::default()
    };
    let params = crate::VabcParams::from_manifest(&m, update)?;
    crate::estimate_vabc_cow(update, &params, crate::DeviceProfile::CURRENT, p.old, p.new)
}

/// COW_XOR merge operations from single XOR blocks (ascending new blocks): consecutive blocks
/// with consecutive old blocks and the same offset become one operation, whose source is one
/// block longer when the offset is not zero.
fn push_xor(blocks: &[(u64, u64, u32)], out: &mut Vec<MergeOp>) {
    let mut cur: Option<(u64, u64, u64, u32)> = None; // (dst, src, n, offset)
    let mut emit = |c: (u64, u64, u64, u32)| {
        out.push(MergeOp {
            xor: true,
            src: (c.1, c.2 + u64::from(c.3 != 0)),
            dst: (c.0, c.2),
            offset: c.3,
        })
    };
    for &(d, s, off) in blocks {
        match cur.as_mut() {
            Some(c) if c.0 + c.2 == d && c.1 + c.2 == s && c.3 == off => c.2 += 1,
            _ => {
                if let Some(c) = cur.take() {
                    emit(c);
                }
                cur = Some((d, s, 1, off));
            }
        }
    }
    if let Some(c) = cur {
        emit(c);
    }
}

impl Generated {
    fn assemble(&self, manifest: &DeltaArchiveManifest, meta_sig: &[u8], tail: &[u8]) -> Vec<u8> {
        let m = manifest.encode_to_vec();
        let mut out = Vec::with_capacity(
            HEADER_LEN as usize + m.len() + meta_sig.len() + self.data.len() + tail.len(),
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&MAJOR_VERSION.to_be_bytes());
        out.extend_from_slice(&(m.len() as u64).to_be_bytes());
        out.extend_from_slice(&(meta_sig.len() as u32).to_be_bytes());
        out.extend_from_slice(&m);
        out.extend_from_slice(meta_sig);
        out.extend_from_slice(&self.data);
        out.extend_from_slice(tail);
        out
    }

    /// The payload, unsigned.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.assemble(&self.manifest, &[], &[])
    }

    /// The payload signed with `keys` (metadata and payload signature, one signature per key),
    /// in update_engine's two passes: room for padded signatures first, then the digests of the
    /// final layout signed.
    pub fn signed(&self, keys: &[SigningKey]) -> Result<Vec<u8>, SignError> {
        let sizes: Vec<usize> = keys.iter().map(|k| k.padded_size()).collect();
        let zero: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        let blob_len = sign::signature_set(&zero, &sizes).len();
        let mut manifest = self.manifest.clone();
        manifest.signatures_offset = Some(self.data.len() as u64);
        manifest.signatures_size = Some(blob_len as u64);
        let placeholder = sign::signature_set(&zero, &sizes);
        let unsigned = self.assemble(&manifest, &placeholder, &placeholder);
        let m = manifest.encoded_len();
        let meta_end = HEADER_LEN as usize + m;
        let meta_digest: [u8; 32] = Sha256::digest(&unsigned[..meta_end]).into();
        let mut h = Sha256::new();
        h.update(&unsigned[..meta_end]);
        h.update(&unsigned[meta_end + blob_len..unsigned.len() - blob_len]);
        let payload_digest: [u8; 32] = h.finalize().into();
        let mut meta_sigs = Vec::new();
        let mut payload_sigs = Vec::new();
        for k in keys {
            meta_sigs.push(k.sign_digest(&meta_digest)?);
            payload_sigs.push(k.sign_digest(&payload_digest)?);
        }
        let meta = sign::signature_set(&meta_sigs, &sizes);
        let tail = sign::signature_set(&payload_sigs, &sizes);
        Ok(self.assemble(&manifest, &meta, &tail))
    }
}
