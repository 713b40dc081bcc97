//! Building the hash tree level by level: each level's blocks are read (the data for the bottom
//! level, the level below from the image for the others) in chunks of about 1 MiB, hashed by
//! the workers, and their digests written straight to the level's place in the tree; nothing
//! larger than a chunk is held in memory.

use snapblk_core::{ReadAt, WriteAt};

use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use super::{HashAlgorithm, TreePlan, read_exact, run_parallel, write_all};
use crate::error::VerityError;

/// Bytes of blocks a worker reads and hashes at a time (at least one block).
const CHUNK_BYTES: u64 = 1 << 20;

/// A hash whose state has already absorbed the salt: each block's digest clones it.
#[derive(Clone)]
enum Salted {
    Sha1(Sha1),
    Sha256(Sha256),
    Sha512(Sha512),
}

impl Salted {
    fn new(algorithm: HashAlgorithm, salt: &[u8]) -> Salted {
        match algorithm {
            HashAlgorithm::Sha1 => Salted::Sha1(Sha1::new_with_prefix(salt)),
            HashAlgorithm::Sha256 => Salted::Sha256(Sha256::new_with_prefix(salt)),
            HashAlgorithm::Sha512 => Salted::Sha512(Sha512::new_with_prefix(salt)),
        }
    }

    /// `H(salt ‖ block)` into `slot`, zero-padded to its length.
    fn hash(&self, block: &[u8], slot: &mut [u8]) {
        let n = match self {
            Salted::Sha1(h) => put(slot, &h.clone().chain_update(block).finalize()),
            Salted::Sha256(h) => put(slot, &h.clone().chain_update(block).finalize()),
            Salted::Sha512(h) => put(slot, &h.clone().chain_update(block).finalize()),
        };
        slot[n..].fill(0);
    }
}

fn put(slot: &mut [u8], digest: &[u8]) -> usize {
    let n = digest.len().min(slot.len());
    slot[..n].copy_from_slice(&digest[..n]);
    n
}

/// Whether `b` is all zeros (looks at the first bytes before scanning all of it).
fn is_zero(b: &[u8]) -> bool {
    b.iter().take(16).all(|&x| x == 0) && b.iter().fold(0u8, |a, &x| a | x) == 0
}

/// Buffers of one worker.
struct Bufs {
    blocks: Vec<u8>,
    digests: Vec<u8>,
}

/// Build the tree `t` over the image's data and write it; returns the root digest. `progress`
/// gets the bytes of each chunk of a level's input once its digests are written.
pub(super) fn write<I: ReadAt + WriteAt + Sync + ?Sized>(
    t: &TreePlan,
    block_size: u32,
    image: &I,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<u8>, VerityError> {
    let bs = u64::from(block_size);
    let bsz = block_size as usize;
    let slot = t.algorithm.slot_len();
    let salted = Salted::new(t.algorithm, &t.salt);
    let mut zero_hash = vec![0u8; slot];
    salted.hash(&vec![0u8; bsz], &mut zero_hash);
    // Byte offset of each level in the image; the top level comes first.
    let mut offsets = vec![0u64; t.levels.len()];
    let mut at = t.tree.offset;
    for (k, &n) in t.levels.iter().enumerate().rev() {
        offsets[k] = at;
        at += n * bs;
    }
    let chunk = (CHUNK_BYTES / bs).max(1);
    for (k, &out_blocks) in t.levels.iter().enumerate() {
        let (input, in_blocks, doing) = if k == 0 {
            (t.data.offset, t.data.blocks, "reading the hash tree's data")
        } else {
            (
                offsets[k - 1],
                t.levels[k - 1],
                "reading back the hash tree",
            )
        };
        let out = offsets[k];
        run_parallel(
            in_blocks.div_ceil(chunk),
            threads,
            || Bufs {
                blocks: vec![0; (chunk * bs) as usize],
                digests: vec![0; chunk as usize * slot],
            },
            |b, j| {
                let first = j * chunk;
                let n = (in_blocks - first).min(chunk);
                let blocks = &mut b.blocks[..(n * bs) as usize];
                read_exact(image, input + first * bs, blocks, doing)?;
                let digests = &mut b.digests[..n as usize * slot];
                for (block, d) in blocks.chunks_exact(bsz).zip(digests.chunks_exact_mut(slot)) {
                    if is_zero(block) {
                        d.copy_from_slice(&zero_hash);
                    } else {
                        salted.hash(block, d);
                    }
                }
                let at = out + first * slot as u64;
                write_all(image, at, digests, "writing the hash tree")?;
                progress(n * bs);
                Ok(())
            },
        )?;
        // Zeros after the last digest, to the end of the level's last block.
        let used = in_blocks * slot as u64;
        let pad = vec![0u8; (out_blocks * bs - used) as usize];
        write_all(image, out + used, &pad, "writing the hash tree")?;
    }
    // The top level is one block; the root digest is its hash.
    let mut top = vec![0u8; bsz];
    read_exact(image, t.tree.offset, &mut top, "reading back the hash tree")?;
    let mut root = vec![0u8; slot];
    salted.hash(&top, &mut root);
    root.truncate(t.algorithm.digest_len());
    Ok(root)
}
