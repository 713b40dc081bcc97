//! The dm-verity hash tree and Reed–Solomon FEC of a partition, recomputed the way Android's
//! update_engine does it after the operations of a payload that leaves them out (incremental
//! payloads of minor version ≥ 6 name them in `hash_tree_*` and `fec_*` instead of carrying
//! their blocks).
//!
//! * **Hash tree** (update_engine's `HashTreeBuilder`, the layout dm-verity reads, without a
//!   superblock): every `block_size` block of `hash_tree_data_extent` is hashed as
//!   `H(salt ‖ block)`; each digest takes a slot of the next power of two bytes (SHA-1's 20
//!   bytes take 32), zero-padded; the slots of a level fill blocks, the last one zero-padded;
//!   the next level hashes the blocks of the one below the same way, until a level is one
//!   block. The levels are stored top level first in `hash_tree_extent`, whose size must be
//!   exactly the tree's. The root digest (the hash of the top block) is what vbmeta holds.
//! * **FEC** (update_engine's `EncodeFEC`, the same bytes as libfec's `fec --encode`):
//!   RS(255, 255 − roots) codewords over `fec_data_extent` (which includes the hash tree, so it
//!   is computed second). With `n` = 255 − roots and `rounds` = ⌈data blocks / n⌉, codeword `c`
//!   takes its `n` symbols from bytes `c + j·rounds·4096` (j < n; bytes past the data read as
//!   zero): each byte position of a block belongs to a different codeword, and the blocks of a
//!   codeword are `rounds` blocks apart. Codeword `c`'s `roots` parity bytes are stored at
//!   `c·roots` in `fec_extent`, whose size must be exactly `rounds·roots·4096`.
//!
//! Everything is checked by [`Verity::from_partition`] before anything is written (extents
//! inside the partition, each output after its data as update_engine requires, no output
//! overlapping another's input, a known hash algorithm, sizes that match, 2..=24 roots).
//! Memory is bounded whatever the partition's size: the tree is built level by level, each
//! level read back from the image to build the next (per worker 1 MiB of blocks and their
//! digests); the FEC is computed in batches of 64 rounds (per worker 64 blocks = 256 KiB of
//! data and 256 KiB × roots of parity registers).

mod fec;
mod rs;
#[cfg(test)]
mod tests;
mod tree;

use snapblk_core::sync::lock;
use snapblk_core::{ReadAt, WriteAt};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::VerityError;
use crate::proto::{Extent, PartitionUpdate};

/// Block size the FEC interleave is defined for (libfec's `FEC_BLOCKSIZE`).
pub const FEC_BLOCK_SIZE: u32 = 4096;
/// Fewest Reed–Solomon parity bytes per codeword update_engine and libfec accept.
pub const FEC_MIN_ROOTS: u32 = 2;
/// Most Reed–Solomon parity bytes per codeword (libfec: at least 231 data symbols).
pub const FEC_MAX_ROOTS: u32 = 24;
/// Symbols per Reed–Solomon codeword.
const RS_SYMBOLS: u64 = 255;

/// The hash of a dm-verity tree (`hash_tree_algorithm`, matched without regard to case as
/// update_engine does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HashAlgorithm {
    /// SHA-1: 20-byte digests in 32-byte slots.
    Sha1,
    /// SHA-256, what Android uses.
    Sha256,
    /// SHA-512.
    Sha512,
}

impl HashAlgorithm {
    /// The algorithm named `name` (`sha1`, `sha256`, `sha512`, any case), as update_engine's
    /// `HashTreeBuilder::HashFunction` accepts them.
    pub fn parse(name: &str) -> Option<HashAlgorithm> {
        [
            HashAlgorithm::Sha1,
            HashAlgorithm::Sha256,
            HashAlgorithm::Sha512,
        ]
        .into_iter()
        .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Sha1 => "sha1",
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Sha512 => "sha512",
        }
    }

    /// Bytes of a digest.
    pub fn digest_len(self) -> usize {
        match self {
            HashAlgorithm::Sha1 => 20,
            HashAlgorithm::Sha256 => 32,
            HashAlgorithm::Sha512 => 64,
        }
    }

    /// Bytes a digest takes in the tree: the digest length rounded up to a power of two.
    pub fn slot_len(self) -> usize {
        self.digest_len().next_power_of_two()
    }
}

/// A byte range of the partition that came from a manifest extent, with the extent for
/// messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Area {
    field: &'static str,
    start_block: u64,
    blocks: u64,
    offset: u64,
    len: u64,
}

impl Area {
    fn end(&self) -> u64 {
        self.offset + self.len
    }
    fn overlaps(&self, other: &Area) -> bool {
        self.offset < other.end() && other.offset < self.end()
    }
}

/// The checked hash-tree settings.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TreePlan {
    data: Area,
    tree: Area,
    algorithm: HashAlgorithm,
    salt: Vec<u8>,
    /// Blocks of each level, bottom (data hashes) first.
    levels: Vec<u64>,
}

/// The checked FEC settings.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FecPlan {
    data: Area,
    fec: Area,
    roots: u32,
    rounds: u64,
}

/// The dm-verity hash tree and FEC a partition's manifest entry asks for, checked against the
/// partition: made by [`Verity::from_partition`], written by [`Verity::write`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verity {
    block_size: u32,
    tree: Option<TreePlan>,
    fec: Option<FecPlan>,
}

/// What [`Verity::write`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VerityReport {
    /// The hash algorithm of the tree, if one was written.
    pub hash_algorithm: Option<HashAlgorithm>,
    /// Hex root digest of the tree (what vbmeta's hashtree descriptor holds), if one was
    /// written.
    pub root_digest: Option<String>,
    /// Bytes of hash tree written.
    pub hash_tree_bytes: u64,
    /// Reed–Solomon parity bytes per codeword, if FEC was written.
    pub fec_roots: Option<u32>,
    /// Bytes of FEC written.
    pub fec_bytes: u64,
}

/// Blocks of each level of a hash tree over `data_blocks` blocks, bottom level first, as
/// update_engine's `HashTreeBuilder::CalculateSize` counts them: levels are added until one
/// fits in a block (so one data block still has a one-block level).
pub fn hash_tree_levels(data_blocks: u64, block_size: u32, algorithm: HashAlgorithm) -> Vec<u64> {
    let per_block = (u64::from(block_size) / algorithm.slot_len() as u64).max(2);
    let mut levels = vec![data_blocks.div_ceil(per_block)];
    while let Some(&n) = levels.last()
        && n > 1
    {
        levels.push(n.div_ceil(per_block));
    }
    levels
}

/// Bytes of FEC for `data_size` bytes with `roots` parity bytes per codeword:
/// ⌈blocks / (255 − roots)⌉ · roots · 4096.
pub fn fec_size(data_size: u64, roots: u32) -> u64 {
    let n = RS_SYMBOLS - u64::from(roots.min(254));
    data_size
        .div_ceil(u64::from(FEC_BLOCK_SIZE))
        .div_ceil(n)
        .saturating_mul(u64::from(roots) * u64::from(FEC_BLOCK_SIZE))
}

impl Verity {
    /// The hash tree and FEC `p` names, checked against a partition of `size` bytes in blocks
    /// of `block_size` (the manifest's): `None` when it names neither (an empty
    /// `hash_tree_extent` or `fec_extent` counts as absent, as update_engine skips a zero-size
    /// tree or FEC). Checks, before anything is written: each extent ends inside the
    /// partition; the tree starts at or after the end of its data and the FEC at or after the
    /// end of its data (update_engine's rule); the FEC overlaps neither the tree nor the tree's
    /// data; the algorithm is one update_engine knows; the tree's and the FEC's extents have
    /// exactly the size their data needs; `fec_roots` is in 2..=24; FEC blocks are 4096 bytes.
    pub fn from_partition(
        p: &PartitionUpdate,
        block_size: u32,
        size: u64,
    ) -> Result<Option<Verity>, VerityError> {
        let nonempty = |e: &Option<Extent>| e.as_ref().is_some_and(|e| e.num_blocks() > 0);
        let want_tree = nonempty(&p.hash_tree_extent);
        let want_fec = nonempty(&p.fec_extent);
        if !want_tree && !want_fec {
            return Ok(None);
        }
        if !block_size.is_power_of_two() || block_size < 512 {
            return Err(VerityError::BlockSize(block_size));
        }
        let bs = u64::from(block_size);
        let area = |field: &'static str, e: &Option<Extent>| -> Result<Area, VerityError> {
            let e = e
                .as_ref()
                .filter(|e| e.num_blocks() > 0)
                .ok_or(VerityError::Missing { field })?;
            let (start_block, blocks) = (e.start_block(), e.num_blocks());
            let offset = start_block.checked_mul(bs);
            let len = blocks.checked_mul(bs);
            match (offset, len) {
                (Some(offset), Some(len)) if offset.checked_add(len).is_some_and(|e| e <= size) => {
                    Ok(Area {
                        field,
                        start_block,
                        blocks,
                        offset,
                        len,
                    })
                }
                _ => Err(VerityError::ExtentPastPartition {
                    field,
                    start: start_block,
                    count: blocks,
                    size,
                }),
            }
        };
        let after = |out: &Area, data: &Area| {
            if out.offset < data.end() {
                return Err(VerityError::BeforeData {
                    field: out.field,
                    start: out.start_block,
                    data_field: data.field,
                    data_end: data.start_block + data.blocks,
                });
            }
            Ok(())
        };
        let tree = if want_tree {
            let data = area("hash_tree_data_extent", &p.hash_tree_data_extent)?;
            let tree = area("hash_tree_extent", &p.hash_tree_extent)?;
            after(&tree, &data)?;
            let name = p
                .hash_tree_algorithm
                .as_deref()
                .ok_or(VerityError::Missing {
                    field: "hash_tree_algorithm",
                })?;
            let algorithm = HashAlgorithm::parse(name)
                .ok_or_else(|| VerityError::UnknownAlgorithm(name.to_string()))?;
            let levels = hash_tree_levels(data.blocks, block_size, algorithm);
            let need: u64 = levels.iter().sum();
            if need != tree.blocks {
                return Err(VerityError::TreeSize {
                    blocks: tree.blocks,
                    need,
                    data_blocks: data.blocks,
                    algorithm: algorithm.name(),
                });
            }
            Some(TreePlan {
                data,
                tree,
                algorithm,
                salt: p.hash_tree_salt.clone().unwrap_or_default(),
                levels,
            })
        } else {
            None
        };
        let fec = if want_fec {
            let data = area("fec_data_extent", &p.fec_data_extent)?;
            let fec = area("fec_extent", &p.fec_extent)?;
            after(&fec, &data)?;
            if let Some(t) = &tree {
                for other in [&t.data, &t.tree] {
                    if fec.overlaps(other) {
                        return Err(VerityError::Overlap {
                            field: fec.field,
                            other: other.field,
                        });
                    }
                }
            }
            let roots = p.fec_roots();
            if !(FEC_MIN_ROOTS..=FEC_MAX_ROOTS).contains(&roots) {
                return Err(VerityError::FecRoots(roots));
            }
            if block_size != FEC_BLOCK_SIZE {
                return Err(VerityError::FecBlockSize(block_size));
            }
            let need = fec_size(data.len, roots);
            if need != fec.len {
                return Err(VerityError::FecSize {
                    blocks: fec.blocks,
                    need: need / bs,
                    data_blocks: data.blocks,
                    roots,
                });
            }
            let rounds = data.blocks.div_ceil(RS_SYMBOLS - u64::from(roots));
            Some(FecPlan {
                data,
                fec,
                roots,
                rounds,
            })
        } else {
            None
        };
        Ok(Some(Verity {
            block_size,
            tree,
            fec,
        }))
    }

    /// Whether a hash tree is written.
    pub fn has_hash_tree(&self) -> bool {
        self.tree.is_some()
    }

    /// Whether FEC is written.
    pub fn has_fec(&self) -> bool {
        self.fec.is_some()
    }

    /// Bytes [`Verity::write_with_progress`] reports as it goes: the input of every tree level
    /// but the top one (the data, then each level read back), then the FEC's data padded to
    /// whole rounds (`rounds` · (255 − roots) · 4096).
    pub fn work_bytes(&self) -> u64 {
        let bs = u64::from(self.block_size);
        let tree = self.tree.as_ref().map_or(0, |t| {
            std::iter::once(t.data.blocks)
                .chain(t.levels.iter().copied())
                .take(t.levels.len())
                .fold(0u64, |a, b| a.saturating_add(b.saturating_mul(bs)))
        });
        let fec = self.fec.as_ref().map_or(0, |f| {
            let n = RS_SYMBOLS - u64::from(f.roots);
            f.rounds
                .saturating_mul(n)
                .saturating_mul(u64::from(FEC_BLOCK_SIZE))
        });
        tree.saturating_add(fec)
    }

    /// Compute the hash tree from the image's data and write it, then the FEC over its data
    /// (which includes the tree), with up to `threads` threads (0 or 1: the calling thread
    /// only). `image` is the partition, its data complete.
    pub fn write<I: ReadAt + WriteAt + Sync + ?Sized>(
        &self,
        image: &I,
        threads: usize,
    ) -> Result<VerityReport, VerityError> {
        self.write_with_progress(image, threads, &|_| {})
    }

    /// [`Verity::write`], calling `progress` (from the worker threads) with the bytes each
    /// piece of work processed; they add up to [`Verity::work_bytes`].
    pub fn write_with_progress<I: ReadAt + WriteAt + Sync + ?Sized>(
        &self,
        image: &I,
        threads: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<VerityReport, VerityError> {
        let mut report = VerityReport {
            hash_algorithm: None,
            root_digest: None,
            hash_tree_bytes: 0,
            fec_roots: None,
            fec_bytes: 0,
        };
        if let Some(t) = &self.tree {
            let root = tree::write(t, self.block_size, image, threads, progress)?;
            report.hash_algorithm = Some(t.algorithm);
            report.root_digest = Some(crate::hex(&root));
            report.hash_tree_bytes = t.tree.len;
        }
        if let Some(f) = &self.fec {
            fec::write(f, image, threads, progress)?;
            report.fec_roots = Some(f.roots);
            report.fec_bytes = f.fec.len;
        }
        Ok(report)
    }
}

/// Run `job(state, i)` for every i in 0..jobs on up to `threads` scoped threads (each with its
/// own `init()` state); the first error by job index wins, and the others stop taking jobs.
fn run_parallel<S>(
    jobs: u64,
    threads: usize,
    init: impl Fn() -> S + Sync,
    job: impl Fn(&mut S, u64) -> Result<(), VerityError> + Sync,
) -> Result<(), VerityError> {
    let threads = threads.clamp(1, crate::MAX_THREADS);
    let threads = usize::try_from(jobs).map_or(threads, |j| threads.min(j.max(1)));
    if threads == 1 {
        let mut s = init();
        return (0..jobs).try_for_each(|i| job(&mut s, i));
    }
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let first: Mutex<Option<(u64, VerityError)>> = Mutex::new(None);
    let worker = || {
        let mut s = init();
        while !stop.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= jobs {
                return;
            }
            if let Err(e) = job(&mut s, i) {
                let mut g = lock(&first);
                if g.as_ref().is_none_or(|(j, _)| i < *j) {
                    *g = Some((i, e));
                }
                stop.store(true, Ordering::Relaxed);
                return;
            }
        }
    };
    let panicked = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
        hs.into_iter()
            .map(|h| h.join().is_err())
            .fold(false, |a, b| a | b)
    });
    if let Some((_, e)) = snapblk_core::sync::into_inner(first) {
        return Err(e);
    }
    if panicked {
        return Err(VerityError::WorkerPanic);
    }
    Ok(())
}

/// Read exactly `buf.len()` bytes at `offset`.
fn read_exact<I: ReadAt + ?Sized>(
    image: &I,
    offset: u64,
    buf: &mut [u8],
    doing: &'static str,
) -> Result<(), VerityError> {
    image
        .read_exact_at(offset, buf)
        .map_err(|source| VerityError::Io {
            doing,
            offset,
            source,
        })
}

/// Write all of `buf` at `offset`.
fn write_all<I: WriteAt + ?Sized>(
    image: &I,
    offset: u64,
    buf: &[u8],
    doing: &'static str,
) -> Result<(), VerityError> {
    image
        .write_all_at(offset, buf)
        .map_err(|source| VerityError::Io {
            doing,
            offset,
            source,
        })
}
