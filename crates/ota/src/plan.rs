//! Everything extraction (and `apply`) checks before its first write: which partitions, their
//! names (they become file names), their size and hash, and every operation: a type this build
//! applies, a data blob inside the payload, destination extents inside the partition and written
//! once; for `apply`, also source extents inside the old partition and the sizes a patch
//! operation holds in memory.

use std::collections::HashMap;

use crate::delta::MAX_PATCH_INPUT;
use crate::error::{OpError, OtaError, Result};
use crate::payload::Payload;
use crate::proto::{OpType, PartitionUpdate};
use crate::verity::Verity;

/// Longest partition name accepted as a file name (`NAME.img` must fit in 255 bytes, with room
/// for the hidden temporary name beside it).
pub const MAX_NAME: usize = 200;

/// Why `name` cannot be a file name, if it cannot. Partition names come from the payload and
/// are untrusted: empty names, `/`, `..`, NUL and control characters are refused, as are names
/// starting with `.` (hidden files, and the temporary names outputs are written under).
pub fn check_partition_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > MAX_NAME {
        return Err("name longer than 200 bytes");
    }
    if name.contains('/') {
        return Err("name contains '/'");
    }
    if name.contains("..") {
        return Err("name contains '..'");
    }
    if name.contains('\0') {
        return Err("name contains NUL");
    }
    if name.chars().any(char::is_control) {
        return Err("name contains a control character");
    }
    if name.starts_with('.') {
        return Err("name starts with '.'");
    }
    Ok(())
}

/// Largest partition size accepted (1 PiB; a real one is at most a few GiB), so that no block
/// arithmetic can overflow.
pub const MAX_PARTITION: u64 = 1 << 50;

/// A partition extraction will write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPartition {
    /// The partition's name (checked by [`check_partition_name`]).
    pub name: String,
    /// Index in the manifest.
    pub index: usize,
    /// Size of the image in bytes (`new_partition_info.size`).
    pub size: u64,
    /// SHA-256 the image must have (`new_partition_info.hash`).
    pub sha256: [u8; 32],
    /// Number of operations.
    pub ops: usize,
    /// Bytes the operations write (their destination extents).
    pub dst_bytes: u64,
    /// The old image it is built from (`apply` of an incremental payload), if any.
    pub source: Option<PlannedSource>,
    /// The dm-verity hash tree and FEC to compute after the operations, if the manifest
    /// leaves them to the device.
    pub verity: Option<Verity>,
}

/// The old image a partition of an incremental payload is built from: the partition has
/// `old_partition_info`, or operations that read the old partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedSource {
    /// `old_partition_info.size`, when the manifest has it: the old image must be this long.
    pub size: Option<u64>,
    /// `old_partition_info.hash`, when the manifest has it: the old image's SHA-256.
    pub sha256: Option<[u8; 32]>,
    /// End, in bytes, of the furthest source extent: the least the old image must hold.
    pub reach: u64,
    /// Whether any operation reads the old image (SOURCE_COPY, the bsdiff types).
    pub read: bool,
}

/// `old_partition_info`'s size and hash, each when present.
type OldInfo = (Option<u64>, Option<[u8; 32]>);

/// Which command a plan is for: it decides the operation types accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `extract`: full-payload types only, no old image.
    Extract,
    /// `apply`: also the types that read the old image.
    Apply,
}

/// The checked plan of an extraction: made by [`Payload::plan_extract`], run by
/// [`ExtractPlan::run`](crate::ExtractPlan::run).
#[derive(Debug)]
pub struct ExtractPlan<'p> {
    pub(crate) payload: &'p Payload,
    pub(crate) parts: Vec<PlannedPartition>,
}

impl ExtractPlan<'_> {
    /// The partitions, in manifest order.
    pub fn partitions(&self) -> &[PlannedPartition] {
        &self.parts
    }

    /// Bytes all operations write.
    pub fn dst_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.dst_bytes).sum()
    }

    /// What [`ExtractPlan::run`]'s progress events add up to: the bytes all operations write,
    /// and those the dm-verity hash tree and FEC step processes
    /// ([`Verity::work_bytes`](crate::Verity::work_bytes)).
    pub fn progress_bytes(&self) -> u64 {
        self.parts.iter().fold(0u64, |a, p| {
            let v = p.verity.as_ref().map_or(0, Verity::work_bytes);
            a.saturating_add(p.dst_bytes).saturating_add(v)
        })
    }
}

impl Payload {
    /// Check everything extraction of `names` (all partitions when `None`) needs, before
    /// anything is written: partition names usable as file names and unique, a 32-byte
    /// `new_partition_info` hash and a size, and for every operation a type extraction applies,
    /// a data blob inside the payload (and before the payload signature blob, when there is
    /// one), destination extents inside the partition that no other extent of the partition
    /// overlaps, and a raw blob no larger than its destination.
    pub fn plan_extract(&self, names: Option<&[String]>) -> Result<ExtractPlan<'_>> {
        let chosen = self.select(names)?;
        let mut planned = Vec::new();
        for (index, p) in self.manifest().partitions.iter().enumerate() {
            if chosen[index] {
                planned.push(self.plan_partition(index, p, Mode::Extract)?);
            }
        }
        Ok(ExtractPlan {
            payload: self,
            parts: planned,
        })
    }

    /// Which partitions `names` selects (all when `None`), by manifest index; refuses
    /// duplicate names in the manifest and names it does not have.
    pub(crate) fn select(&self, names: Option<&[String]>) -> Result<Vec<bool>> {
        let parts = &self.manifest().partitions;
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, p) in parts.iter().enumerate() {
            if let Some(&first) = seen.get(p.partition_name.as_str()) {
                return Err(OtaError::DuplicatePartition {
                    name: p.partition_name.clone(),
                    first,
                    second: i,
                });
            }
            seen.insert(&p.partition_name, i);
        }
        let mut chosen = vec![names.is_none(); parts.len()];
        for n in names.unwrap_or_default() {
            match seen.get(n.as_str()) {
                Some(&i) => chosen[i] = true,
                None => {
                    return Err(OtaError::UnknownPartition {
                        name: n.clone(),
                        available: parts
                            .iter()
                            .map(|p| p.partition_name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            }
        }
        Ok(chosen)
    }

    /// Check partition `index` for `mode` (see [`Payload::plan_extract`]).
    pub(crate) fn plan_partition(
        &self,
        index: usize,
        p: &PartitionUpdate,
        mode: Mode,
    ) -> Result<PlannedPartition> {
        let name = &p.partition_name;
        check_partition_name(name).map_err(|problem| OtaError::BadPartitionName {
            name: name.clone(),
            index,
            problem,
        })?;
        let missing = |missing| OtaError::NoPartitionInfo {
            partition: name.clone(),
            missing,
        };
        let info = p.new_partition_info.as_ref().ok_or(missing("size"))?;
        let size = info.size.ok_or(missing("size"))?;
        if size > MAX_PARTITION {
            return Err(OtaError::PartitionTooLarge {
                partition: name.clone(),
                size,
                limit: MAX_PARTITION,
            });
        }
        let sha256: [u8; 32] = info
            .hash
            .as_deref()
            .and_then(|h| h.try_into().ok())
            .ok_or(missing("32-byte hash"))?;
        let bs = u64::from(self.block_size());
        let blocks = size.div_ceil(bs);
        let old = match mode {
            Mode::Extract => None,
            Mode::Apply => self.old_info(name, p)?,
        };
        let mut source = PlannedSource {
            size: old.and_then(|o| o.0),
            sha256: old.and_then(|o| o.1),
            reach: 0,
            read: false,
        };
        let area = self.data_len();
        // With a payload signature, every blob lies before it, inside the signed bytes.
        let signed_end = self
            .manifest()
            .signatures_offset
            .or(self.manifest().signatures_size.map(|_| 0));
        let op_err = |i: usize, source: OpError| OtaError::Op {
            partition: name.clone(),
            index: i,
            source,
        };
        // (start block, end block, op, extent) of every destination extent.
        let mut spans: Vec<(u64, u64, usize, usize)> = Vec::new();
        let mut dst_bytes = 0u64;
        for (i, op) in p.operations.iter().enumerate() {
            let t = match mode {
                Mode::Extract => crate::ops::extract_type(op),
                Mode::Apply => crate::ops::apply_type(op),
            }
            .map_err(|e| op_err(i, e))?;
            if crate::ops::reads_source(t) {
                source.read = true;
                self.check_source_extents(op, t, source.size, &mut source.reach)
                    .map_err(|e| op_err(i, e))?;
            }
            let (offset, length) = (op.data_offset(), op.data_length());
            if offset.checked_add(length).is_none_or(|e| e > area) {
                return Err(op_err(
                    i,
                    OpError::BlobPastEnd {
                        offset,
                        length,
                        area,
                    },
                ));
            }
            if let Some(sig) = signed_end
                && length > 0
                && offset + length > sig
            {
                return Err(op_err(
                    i,
                    OpError::BlobPastSignature {
                        offset,
                        length,
                        signatures_offset: sig,
                    },
                ));
            }
            if let Some(h) = op.data_sha256_hash.as_deref()
                && h.len() != 32
            {
                return Err(op_err(i, OpError::BadHashLength(h.len())));
            }
            let mut op_bytes = 0u64;
            for (x, e) in op.dst_extents.iter().enumerate() {
                let (start, count) = (e.start_block(), e.num_blocks());
                let end = start.checked_add(count).filter(|&e| e <= blocks);
                let Some(end) = end else {
                    return Err(op_err(
                        i,
                        OpError::ExtentPastPartition {
                            extent: x,
                            start,
                            count,
                            blocks,
                        },
                    ));
                };
                if count > 0 {
                    spans.push((start, end, i, x));
                }
                op_bytes = op_bytes.saturating_add(count * bs);
            }
            if op.op_type() == Ok(crate::proto::OpType::Replace) && length > op_bytes {
                return Err(op_err(
                    i,
                    OpError::TooMuchData {
                        what: "is",
                        limit: op_bytes,
                    },
                ));
            }
            dst_bytes = dst_bytes.saturating_add(op_bytes);
        }
        spans.sort_unstable();
        // The extent reaching furthest so far, and whose it is.
        let mut reach: Option<(u64, usize)> = None;
        for &(start, end, op, extent) in &spans {
            if let Some((r, other)) = reach
                && start < r
            {
                // Name the op that comes later in apply order, and the other one.
                let (later, earlier, x) = if op >= other {
                    (op, other, extent)
                } else {
                    (other, op, self.first_overlapping_extent(p, other, start))
                };
                return Err(op_err(
                    later,
                    OpError::Overlap {
                        extent: x,
                        other: earlier,
                        block: start,
                    },
                ));
            }
            if reach.is_none_or(|(r, _)| end > r) {
                reach = Some((end, op));
            }
        }
        let verity = Verity::from_partition(p, self.block_size(), size).map_err(|source| {
            OtaError::Verity {
                partition: name.clone(),
                source,
            }
        })?;
        Ok(PlannedPartition {
            name: name.clone(),
            index,
            size,
            sha256,
            ops: p.operations.len(),
            dst_bytes,
            source: (old.is_some() || source.read).then_some(source),
            verity,
        })
    }

    /// `old_partition_info` (size, hash), checked, when the partition has it.
    fn old_info(&self, name: &str, p: &PartitionUpdate) -> Result<Option<OldInfo>> {
        let Some(info) = &p.old_partition_info else {
            return Ok(None);
        };
        let bad = |problem| OtaError::OldPartitionInfo {
            partition: name.to_string(),
            problem,
        };
        if info.size.is_some_and(|s| s > MAX_PARTITION) {
            return Err(bad("size is larger than 1 PiB"));
        }
        let hash = match info.hash.as_deref() {
            None => None,
            Some(h) => Some(<[u8; 32]>::try_from(h).map_err(|_| bad("hash is not 32 bytes"))?),
        };
        Ok(Some((info.size, hash)))
    }

    /// Check the source side of an operation that reads the old image: its extents inside the
    /// old partition (of `old_size` bytes, when known), `src_sha256_hash`, and for its type the
    /// source's size; `reach` grows to the end of its furthest source extent.
    fn check_source_extents(
        &self,
        op: &crate::proto::InstallOperation,
        t: OpType,
        old_size: Option<u64>,
        reach: &mut u64,
    ) -> Result<(), OpError> {
        let bs = u64::from(self.block_size());
        let blocks = old_size.map_or(MAX_PARTITION / bs, |s| s.div_ceil(bs));
        let mut src_bytes = 0u64;
        for (x, e) in op.src_extents.iter().enumerate() {
            let (start, count) = (e.start_block(), e.num_blocks());
            let Some(end) = start.checked_add(count).filter(|&e| e <= blocks) else {
                return Err(OpError::SourceExtentPastPartition {
                    extent: x,
                    start,
                    count,
                    blocks,
                });
            };
            *reach = (*reach).max(end * bs);
            src_bytes = src_bytes.saturating_add(count * bs);
        }
        if let Some(h) = op.src_sha256_hash.as_deref()
            && h.len() != 32
        {
            return Err(OpError::BadSourceHashLength(h.len()));
        }
        match t {
            OpType::SourceCopy => {
                let dst: u64 = op
                    .dst_extents
                    .iter()
                    .map(|e| e.num_blocks().saturating_mul(bs))
                    .fold(0, u64::saturating_add);
                if dst != src_bytes {
                    return Err(OpError::CopyLength {
                        src: src_bytes,
                        dst,
                    });
                }
            }
            _ => {
                // A PUFFDIFF also holds its destination in memory.
                let dst = match t {
                    OpType::Puffdiff => op
                        .dst_extents
                        .iter()
                        .map(|e| e.num_blocks().saturating_mul(bs))
                        .fold(0, u64::saturating_add),
                    _ => 0,
                };
                for (what, bytes) in [
                    ("the source", src_bytes),
                    ("the patch", op.data_length()),
                    ("the destination", dst),
                ] {
                    if bytes > MAX_PATCH_INPUT {
                        return Err(OpError::TooLarge {
                            what,
                            bytes,
                            limit: MAX_PATCH_INPUT,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The extent of op `op` containing `block`.
    fn first_overlapping_extent(&self, p: &PartitionUpdate, op: usize, block: u64) -> usize {
        p.operations[op]
            .dst_extents
            .iter()
            .position(|e| {
                e.start_block() <= block && block < e.start_block().saturating_add(e.num_blocks())
            })
            .unwrap_or(0)
    }
}
