//! `apply`: the partitions of an incremental payload, built from their old images.
//!
//! [`Payload::plan_apply`] checks everything extraction checks, and for every partition its
//! `old_partition_info` and every operation that reads the old image (source extents inside
//! it, `src_sha256_hash`, a patch operation's sizes); partitions this build cannot build
//! (ZUCCHINI, LZ4DIFF_*, unknown types) are an error, or are left out when asked.
//! [`ApplyPlan::check_sources`] then checks each old image against `old_partition_info` (size,
//! SHA-256) before anything is written, and [`ApplyPlan::run`] runs the operations on
//! extraction's worker pool, each source-reading operation checking its own source bytes
//! against `src_sha256_hash` before using them; a partition whose manifest leaves its dm-verity
//! hash tree and FEC to the device gets them recomputed in the finish step extraction shares
//! (`crate::finish`) before its hash is checked.

use std::fmt;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};
use snapblk_core::ReadAt;
use snapblk_core::sync::{into_inner, lock};

use crate::error::{OpError, OtaError, Result};
use crate::extract::{ExtractOptions, ExtractReport, MAX_THREADS, Output};
use crate::ops::{Src, apply_supports};
use crate::payload::Payload;
use crate::plan::{ExtractPlan, Mode, PlannedPartition};
use crate::proto::PartitionUpdate;

/// Why `apply` cannot build a partition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Blocker {
    /// The partition's first operation of a type `apply` does not apply.
    Operation {
        /// Index of the operation in the partition.
        index: usize,
        /// Its type's name (`UNKNOWN(n)` for a number update_engine does not define).
        op_type: String,
    },
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::Operation { index, op_type } => {
                write!(f, "op {index}: {op_type} is not supported by apply")
            }
        }
    }
}

/// What stops `apply` from building `p`, with the error it is when not skipped.
pub(crate) fn blocker(p: &PartitionUpdate) -> Option<(Blocker, OtaError)> {
    for (index, op) in p.operations.iter().enumerate() {
        let (op_type, source) = match op.op_type() {
            Ok(t) if apply_supports(t) => continue,
            Ok(t) => (
                t.name().to_string(),
                OpError::Unsupported {
                    op_type: t,
                    what: "apply",
                },
            ),
            Err(n) => (format!("UNKNOWN({n})"), OpError::UnknownType(n)),
        };
        let e = OtaError::Op {
            partition: p.partition_name.clone(),
            index,
            source,
        };
        return Some((Blocker::Operation { index, op_type }, e));
    }
    None
}

/// A partition [`Payload::plan_apply`] left out (asked to skip what it cannot build).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SkippedPartition {
    /// Name, as the manifest has it (untrusted: not checked as a file name, never used as one).
    pub name: String,
    /// Index in the manifest.
    pub index: usize,
    /// Why.
    pub blocker: Blocker,
}

/// The checked plan of an `apply`: made by [`Payload::plan_apply`]; its old images are checked
/// by [`ApplyPlan::check_sources`], and it is run by [`ApplyPlan::run`].
#[derive(Debug)]
pub struct ApplyPlan<'p> {
    inner: ExtractPlan<'p>,
    skipped: Vec<SkippedPartition>,
}

/// The old images of an [`ApplyPlan`]'s partitions, checked by [`ApplyPlan::check_sources`].
pub struct CheckedSources<'s> {
    list: Vec<Option<Src<'s>>>,
}

impl fmt::Debug for CheckedSources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lens: Vec<Option<u64>> = self.list.iter().map(|s| s.map(|s| s.len)).collect();
        f.debug_struct("CheckedSources")
            .field("lens", &lens)
            .finish()
    }
}

impl Payload {
    /// Check everything `apply` of `names` (all partitions when `None`) needs, before anything
    /// is read from the old images or written: what [`Payload::plan_extract`] checks, and
    /// `old_partition_info` and the source side of every operation that reads the old image.
    /// The dm-verity fields are checked as `plan_extract` checks them (an error naming the
    /// partition and the field, never skipped). A partition with an operation type `apply`
    /// does not apply is an error naming the type and the operation's index, or, with
    /// `skip_unsupported`, is left out and listed in [`ApplyPlan::skipped`].
    pub fn plan_apply(
        &self,
        names: Option<&[String]>,
        skip_unsupported: bool,
    ) -> Result<ApplyPlan<'_>> {
        let chosen = self.select(names)?;
        let mut parts = Vec::new();
        let mut skipped = Vec::new();
        for (index, p) in self.manifest().partitions.iter().enumerate() {
            if !chosen[index] {
                continue;
            }
            if let Some((blocker, e)) = blocker(p) {
                if !skip_unsupported {
                    return Err(e);
                }
                skipped.push(SkippedPartition {
                    name: p.partition_name.clone(),
                    index,
                    blocker,
                });
                continue;
            }
            parts.push(self.plan_partition(index, p, Mode::Apply)?);
        }
        Ok(ApplyPlan {
            inner: ExtractPlan {
                payload: self,
                parts,
            },
            skipped,
        })
    }
}

/// Sparse image magic (`0xed26ff3a`, little-endian), to explain an old image of the wrong size.
const SPARSE_MAGIC: [u8; 4] = 0xed26_ff3a_u32.to_le_bytes();

impl<'p> ApplyPlan<'p> {
    /// The partitions to build, in manifest order.
    pub fn partitions(&self) -> &[PlannedPartition] {
        self.inner.partitions()
    }

    /// The partitions left out, in manifest order.
    pub fn skipped(&self) -> &[SkippedPartition] {
        &self.skipped
    }

    /// Bytes all operations write.
    pub fn dst_bytes(&self) -> u64 {
        self.inner.dst_bytes()
    }

    /// What [`ApplyPlan::run`]'s progress events add up to (see
    /// [`ExtractPlan::progress_bytes`]).
    pub fn progress_bytes(&self) -> u64 {
        self.inner.progress_bytes()
    }

    /// Bytes [`ApplyPlan::check_sources`] hashes: the old images with an
    /// `old_partition_info.hash`.
    pub fn source_hash_bytes(&self) -> u64 {
        self.partitions()
            .iter()
            .filter_map(|p| p.source.as_ref())
            .filter(|s| s.sha256.is_some())
            .filter_map(|s| s.size)
            .sum()
    }

    /// Check the old images (`sources[i]` for [`partitions()`](ApplyPlan::partitions)`[i]`,
    /// `None` where there is none) before anything is written: a partition whose operations read
    /// the old image needs one; each given image must have `old_partition_info`'s size and
    /// SHA-256 (when the manifest has them; without a size, it must hold every source extent).
    /// Hashes with up to `threads` threads (0: one per CPU); `progress` gets the bytes hashed.
    pub fn check_sources<'s>(
        &self,
        sources: &[Option<&'s (dyn ReadAt + Sync)>],
        threads: usize,
        progress: Option<&(dyn Fn(u64) + Sync)>,
    ) -> Result<CheckedSources<'s>> {
        let parts = self.partitions();
        if sources.len() != parts.len() {
            return Err(OtaError::SourceCount {
                given: sources.len(),
                planned: parts.len(),
            });
        }
        let bs = u64::from(self.inner.payload.block_size());
        let mut list = Vec::with_capacity(parts.len());
        // (partition, image, size) of the images to hash.
        let mut to_hash = Vec::new();
        for (pi, (p, image)) in parts.iter().zip(sources).enumerate() {
            let (Some(want), Some(image)) = (&p.source, image) else {
                if p.source.as_ref().is_some_and(|s| s.read) {
                    return Err(OtaError::NoSource {
                        partition: p.name.clone(),
                    });
                }
                list.push(None);
                continue;
            };
            let read_err = |doing| {
                move |source| OtaError::SourceRead {
                    partition: p.name.clone(),
                    doing,
                    source,
                }
            };
            let len = image.size().map_err(read_err("sizing"))?;
            match want.size {
                Some(size) if size != len => {
                    let mut magic = [0u8; 4];
                    let sparse =
                        image.read_exact_at(0, &mut magic).is_ok() && magic == SPARSE_MAGIC;
                    return Err(if sparse {
                        OtaError::SourceSparse {
                            partition: p.name.clone(),
                        }
                    } else {
                        OtaError::SourceSize {
                            partition: p.name.clone(),
                            expected: size,
                            found: len,
                        }
                    });
                }
                Some(_) => {}
                None if len.div_ceil(bs).saturating_mul(bs) < want.reach => {
                    return Err(OtaError::SourceTooShort {
                        partition: p.name.clone(),
                        len,
                        need: want.reach,
                    });
                }
                None => {}
            }
            if want.sha256.is_some() {
                to_hash.push(pi);
            }
            list.push(Some(Src { image: *image, len }));
        }
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .clamp(1, MAX_THREADS)
        .min(to_hash.len().max(1));
        let next = AtomicUsize::new(0);
        let first: Mutex<Option<(usize, OtaError)>> = Mutex::new(None);
        let worker = || {
            while let Some(&pi) = to_hash.get(next.fetch_add(1, Ordering::Relaxed)) {
                let p = &parts[pi];
                let (Some(src), Some(want)) = (list[pi], p.source.as_ref()) else {
                    continue;
                };
                let r = hash_image(src, progress)
                    .map_err(|source| OtaError::SourceRead {
                        partition: p.name.clone(),
                        doing: "reading",
                        source,
                    })
                    .and_then(|found| match want.sha256 {
                        Some(expected) if expected != found => Err(OtaError::SourceHash {
                            partition: p.name.clone(),
                            expected: crate::hex(&expected),
                            found: crate::hex(&found),
                        }),
                        _ => Ok(()),
                    });
                if let Err(e) = r {
                    let mut g = lock(&first);
                    if g.as_ref().is_none_or(|(j, _)| pi < *j) {
                        *g = Some((pi, e));
                    }
                }
            }
        };
        let panicked = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
            hs.into_iter()
                .map(|h| h.join().is_err())
                .fold(false, |a, b| a | b)
        });
        if let Some((_, e)) = into_inner(first) {
            return Err(e);
        }
        if panicked {
            return Err(OtaError::WorkerPanic);
        }
        Ok(CheckedSources { list })
    }

    /// Build every planned partition into its output (`outputs[i]` for
    /// [`partitions()`](ApplyPlan::partitions)`[i]`) from its checked old image, then check each
    /// against its `new_partition_info.hash` (after recomputing its dm-verity hash tree and FEC
    /// when the manifest leaves them to the device). On error the outputs hold partial data:
    /// the caller discards them.
    pub fn run(
        &self,
        sources: &CheckedSources<'_>,
        outputs: &[&dyn Output],
        opts: &ExtractOptions<'_>,
    ) -> Result<ExtractReport> {
        if sources.list.len() != self.partitions().len() {
            return Err(OtaError::SourceCount {
                given: sources.list.len(),
                planned: self.partitions().len(),
            });
        }
        self.inner.run_with(&sources.list, outputs, opts)
    }
}

/// SHA-256 of the first `src.len` bytes of the image.
fn hash_image(src: Src<'_>, progress: Option<&(dyn Fn(u64) + Sync)>) -> io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; crate::ops::WRITE_CHUNK];
    let mut at = 0u64;
    while at < src.len {
        let n = (src.len - at).min(buf.len() as u64) as usize;
        src.image.read_exact_at(at, &mut buf[..n])?;
        h.update(&buf[..n]);
        at += n as u64;
        if let Some(f) = progress {
            f(n as u64);
        }
    }
    Ok(h.finalize().into())
}
