//! The *COW record*: a small sidecar file (`NAME.cow.snapblk` beside `NAME.cow`) that says what a
//! COW expects and what it produces, so a wrong base or a corrupt COW is caught before a user's
//! data changes. The COW itself stays byte-for-byte what Android's tools read and write.
//!
//! What it holds (format v1, all integers little-endian; see `docs/safety.md`):
//!
//! | field | bytes |
//! |---|---|
//! | magic `SBLKREC1` | 8 |
//! | version (1), block size | 4 + 4 |
//! | base size, target size (bytes) | 8 + 8 |
//! | SHA-256 of the whole base, of the whole target | 32 + 32 |
//! | SHA-256 of the COW's data ops (type, block, source, payload place and codec, in file order) | 32 |
//! | read-range count R, write-range count W | 4 + 4 |
//! | R read ranges, then W write ranges: `(first block u64, block count u64)` | 16 each |
//! | one XXH3-128 digest per block of the read ranges, then per block of the write ranges | 16 each |
//! | SHA-256 of every byte before it | 32 |
//!
//! *Read ranges* are the base blocks COPY and XOR ops read; *write ranges* are the target blocks
//! the COW produces. Both are derived from the COW, so a record that does not describe the COW it
//! sits beside is detected ([`RecordError::Stale`]). The per-block digests are a fast hash
//! (corruption and identity against accidents); the whole-image SHA-256 values are the identity
//! update_engine's `old_partition_info.hash` / `new_partition_info.hash` carry. The record grows
//! with what the COW changes (16 bytes per changed or read block, 0.4 % of those blocks' bytes),
//! not with the image.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::io::ReadAt;
use crate::reader::CowReader;

/// File-name suffix of a record: `update.cow` → `update.cow.snapblk`.
pub(crate) const SUFFIX: &str = ".snapblk";
const MAGIC: &[u8; 8] = b"SBLKREC1";
const VERSION: u32 = 1;
const FIXED: usize = 8 + 4 + 4 + 8 + 8 + 32 + 32 + 32 + 4 + 4;
/// Largest record accepted: 2^26 digests (256 GiB of changed 4 KiB blocks), ~1 GiB of record.
const MAX_BLOCKS: u64 = 1 << 26;
/// Most ranges of one kind accepted (a COW's block map has at most one run per block).
const MAX_RANGES: u64 = 1 << 26;
/// The largest record file [`Record::load`] reads.
const MAX_LEN: u64 = 64 + 32 * (MAX_BLOCKS + MAX_RANGES);

/// A block digest: XXH3-128 of the block's bytes.
pub type BlockDigest = u128;

/// Digest of one block.
pub fn block_digest(data: &[u8]) -> BlockDigest {
    xxhash_rust::xxh3::xxh3_128(data)
}

/// Where the record of `cow` lives.
pub fn sidecar_path(cow: &Path) -> PathBuf {
    let mut s = cow.as_os_str().to_owned();
    s.push(SUFFIX);
    PathBuf::from(s)
}

/// Everything that can be wrong with a record or with what it is checked against.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The record's bytes are not a valid record (damaged or not a record): never a COW problem.
    #[error("record is damaged: {0}")]
    Damaged(String),
    /// The record's version field (after the magic) is not 1, the only version this crate
    /// reads; the record was written by another snapblk.
    #[error("record version {0} is not supported (this snapblk reads version 1)")]
    Version(u32),
    /// The record describes another COW (its block sets differ from this COW's).
    #[error("record does not describe this COW ({0}); it belongs to another COW or is stale")]
    Stale(String),
    /// Reading the base (or the file being merged) to check it against the record failed.
    #[error("reading base block {block}")]
    Io {
        /// Base block being read (for a run of blocks read at once, its first).
        block: u64,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// Reading the target (new) image to build a record failed.
    #[error("reading target block {block}")]
    TargetIo {
        /// Target block being read (for a run of blocks read at once, its first).
        block: u64,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// Reading the record file itself failed (for a reason other than its absence).
    #[error("reading {}", path.display())]
    Read {
        /// Path of the record file.
        path: PathBuf,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
}

/// A `(first block, count)` run of blocks.
pub type Range = (u64, u64);

/// A parsed (or freshly built) record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Block size in bytes, the COW's; all ranges count blocks of this size.
    pub block_size: u32,
    /// Length in bytes of the base (old) image the COW was made from.
    pub base_size: u64,
    /// Length in bytes of the target (new) image the COW produces.
    pub target_size: u64,
    /// SHA-256 of the whole base image.
    pub base_sha256: [u8; 32],
    /// SHA-256 of the whole target image.
    pub target_sha256: [u8; 32],
    /// SHA-256 of what the data ops of the COW the record describes say (type, new block,
    /// source, payload offset, length, codec and unit, in file order).
    pub cow_ops_sha256: [u8; 32],
    /// Base blocks the COW's COPY and XOR ops read: sorted, merged runs.
    pub read: Vec<Range>,
    /// One [`block_digest`] per block of `read`, in run order: the base content the COW
    /// expects.
    pub read_digests: Vec<BlockDigest>,
    /// Target blocks the COW produces: sorted, merged runs.
    pub write: Vec<Range>,
    /// One [`block_digest`] per block of `write`, in run order: the content the COW must
    /// produce.
    pub write_digests: Vec<BlockDigest>,
}

/// Base blocks the COW's COPY and XOR ops read, as sorted, merged runs.
pub(crate) fn read_set<R: ReadAt>(cow: &CowReader<R>) -> Vec<Range> {
    let bs = u64::from(cow.block_size());
    let mut v: Vec<Range> = cow
        .data_ops()
        .filter_map(|op| op.source_blocks(bs))
        .collect();
    v.sort_unstable();
    merge_runs(v)
}

/// SHA-256 of what the COW's data ops say (type, new block, source, payload offset, length,
/// codec and unit, in file order): binds a record to one COW, whatever its block sets. Merge
/// progress and the scratch area are not part of it (a merge changes them).
pub(crate) fn ops_digest<R: ReadAt>(cow: &CowReader<R>) -> [u8; 32] {
    use crate::reader::OpKind;
    let mut h = Sha256::new();
    for op in cow.data_ops() {
        let (tag, src) = match op.kind {
            OpKind::Copy { source_block } => (1u8, source_block),
            OpKind::Replace { .. } => (2, 0),
            OpKind::Zero => (3, 0),
            OpKind::Xor { source_offset, .. } => (4, source_offset),
            _ => (0, 0),
        };
        h.update([tag]);
        h.update(op.new_block.to_le_bytes());
        h.update(src.to_le_bytes());
        if let Some(p) = op.payload() {
            h.update(p.offset.to_le_bytes());
            h.update(p.len.to_le_bytes());
            h.update(p.unit_blocks.to_le_bytes());
            h.update(p.codec.name().as_bytes());
        }
    }
    h.finalize().into()
}

/// Target blocks the COW produces, as sorted, merged runs.
pub(crate) fn write_set<R: ReadAt>(cow: &CowReader<R>) -> Vec<Range> {
    merge_runs(cow.block_map().map(|(b, n, _)| (b, u64::from(n))).collect())
}

/// Block ranges `(first, count)`, sorted by first block, merged where they touch or overlap.
pub fn merge_runs(sorted: Vec<Range>) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::with_capacity(sorted.len().min(1 << 16));
    for (s, n) in sorted {
        match out.last_mut() {
            Some((ps, pn)) if *ps + *pn >= s => {
                let end = (*ps + *pn).max(s + n);
                *pn = end - *ps;
            }
            _ => out.push((s, n)),
        }
    }
    out
}

fn count(ranges: &[Range]) -> u64 {
    ranges.iter().map(|r| r.1).sum()
}

/// Blocks of `ranges`, in order.
pub fn blocks(ranges: &[Range]) -> impl Iterator<Item = u64> + '_ {
    ranges.iter().flat_map(|&(s, n)| s..s + n)
}

/// Index of `block` among the blocks of `ranges` (sorted, disjoint), if it is one of them.
fn index_in(ranges: &[Range], prefix: &[u64], block: u64) -> Option<usize> {
    let i = ranges
        .partition_point(|&(s, _)| s <= block)
        .checked_sub(1)?;
    let (s, n) = ranges[i];
    (block < s + n).then(|| (prefix[i] + block - s) as usize)
}

fn prefix_sums(ranges: &[Range]) -> Vec<u64> {
    let mut acc = 0;
    ranges
        .iter()
        .map(|r| {
            let p = acc;
            acc += r.1;
            p
        })
        .collect()
}

/// Fixed-size block `b` of `img`, zero-padded past its end.
fn block_of<'a>(img: &'a [u8], b: u64, bs: usize, pad: &'a mut Vec<u8>) -> &'a [u8] {
    let start = (b as usize).saturating_mul(bs);
    if start.saturating_add(bs) <= img.len() {
        return &img[start..start + bs];
    }
    pad.clear();
    pad.resize(bs, 0);
    if start < img.len() {
        pad[..img.len() - start].copy_from_slice(&img[start..]);
    }
    pad
}

/// Largest read [`Record::build_from`] makes.
pub const STREAM_CHUNK: usize = 1 << 20;

/// Bytes `offset..offset + buf.len()` of a source of `size` bytes into `buf`, zeros past its
/// end. The error carries the failed read's offset.
fn read_padded<S: ReadAt + ?Sized>(
    src: &S,
    size: u64,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), (u64, std::io::Error)> {
    let have = size.saturating_sub(offset).min(buf.len() as u64) as usize;
    src.read_exact_at(offset, &mut buf[..have])
        .map_err(|e| (offset, e))?;
    buf[have..].fill(0);
    Ok(())
}

/// SHA-256 of the `size` bytes of `src`, read in [`STREAM_CHUNK`] pieces. The error carries
/// the failed read's byte offset.
fn sha256_stream<S: ReadAt + ?Sized>(
    src: &S,
    size: u64,
) -> Result<[u8; 32], (u64, std::io::Error)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; STREAM_CHUNK];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(STREAM_CHUNK as u64) as usize;
        read_padded(src, size, off, &mut buf[..n])?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finalize().into())
}

/// One [`block_digest`] per block of `ranges` of `src` (`size` bytes; blocks past its end
/// zero-padded), read in pieces of at most [`STREAM_CHUNK`]. The error carries the block.
fn range_digests<S: ReadAt + ?Sized>(
    src: &S,
    size: u64,
    ranges: &[Range],
    bs: u64,
) -> Result<Vec<BlockDigest>, (u64, std::io::Error)> {
    let per = (STREAM_CHUNK as u64 / bs).max(1);
    let mut out = Vec::with_capacity(count(ranges).min(MAX_BLOCKS) as usize);
    let mut buf = Vec::new();
    for &(s, n) in ranges {
        let mut b = s;
        while b < s + n {
            let k = per.min(s + n - b);
            buf.resize((k * bs) as usize, 0);
            let off = b.saturating_mul(bs);
            read_padded(src, size, off, &mut buf).map_err(|(_, e)| (b, e))?;
            out.extend(buf.chunks_exact(bs as usize).map(block_digest));
            b += k;
        }
    }
    Ok(out)
}

/// An image's SHA-256 ([`sha256_stream`]) and the [`range_digests`] of its blocks in
/// `ranges`. The error carries the block of the failed read.
fn image_digests<S: ReadAt + ?Sized>(
    src: &S,
    size: u64,
    ranges: &[Range],
    bs: u64,
) -> Result<([u8; 32], Vec<BlockDigest>), (u64, std::io::Error)> {
    let sha = sha256_stream(src, size).map_err(|(at, e)| (at / bs, e))?;
    Ok((sha, range_digests(src, size, ranges, bs)?))
}

/// SHA-256 of `data`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Lower-case hex of a digest.
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parse a 64-digit hex SHA-256.
pub fn parse_sha256(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Record {
    /// Build the record of `cow` made from `old` (the base) and `new` (the target), both in
    /// memory as the generator holds them.
    pub fn build<R: ReadAt>(cow: &CowReader<R>, old: &[u8], new: &[u8]) -> Record {
        let bs = cow.block_size() as usize;
        let read = read_set(cow);
        let write = write_set(cow);
        let mut pad = Vec::new();
        let read_digests = blocks(&read)
            .map(|b| block_digest(block_of(old, b, bs, &mut pad)))
            .collect();
        let write_digests = blocks(&write)
            .map(|b| block_digest(block_of(new, b, bs, &mut pad)))
            .collect();
        let (base_sha256, target_sha256) = std::thread::scope(|s| {
            let h = s.spawn(|| sha256(old));
            let t = sha256(new);
            (h.join().unwrap_or_else(|_| sha256(old)), t)
        });
        Record {
            block_size: cow.block_size(),
            base_size: old.len() as u64,
            target_size: new.len() as u64,
            base_sha256,
            target_sha256,
            cow_ops_sha256: ops_digest(cow),
            read,
            read_digests,
            write,
            write_digests,
        }
    }

    /// [`Record::build`] over images read through [`ReadAt`] (files), never held in memory:
    /// whole-image SHA-256 values and block digests are computed from reads of at most
    /// [`STREAM_CHUNK`] bytes, so memory is a few chunks plus the record itself, whatever the
    /// images' sizes. Blocks past an image's end are digested zero-padded, as `build` does.
    /// Gives the same record as `build` over the same bytes.
    pub fn build_from<R, O, N>(cow: &CowReader<R>, old: &O, new: &N) -> Result<Record, RecordError>
    where
        R: ReadAt,
        O: ReadAt + Sync + ?Sized,
        N: ReadAt + ?Sized,
    {
        let bs = u64::from(cow.block_size());
        let read = read_set(cow);
        let write = write_set(cow);
        let base_size = old
            .size()
            .map_err(|source| RecordError::Io { block: 0, source })?;
        let target_size = new
            .size()
            .map_err(|source| RecordError::TargetIo { block: 0, source })?;
        // Each image on a thread of its own: its SHA-256, then its block digests.
        let (base, target) = std::thread::scope(|s| {
            let h = s.spawn(|| image_digests(old, base_size, &read, bs));
            let t = image_digests(new, target_size, &write, bs);
            (h.join(), t)
        });
        let (base_sha256, read_digests) = base
            .unwrap_or_else(|_| image_digests(old, base_size, &read, bs))
            .map_err(|(block, source)| RecordError::Io { block, source })?;
        let (target_sha256, write_digests) =
            target.map_err(|(block, source)| RecordError::TargetIo { block, source })?;
        Ok(Record {
            block_size: cow.block_size(),
            base_size,
            target_size,
            base_sha256,
            target_sha256,
            cow_ops_sha256: ops_digest(cow),
            read,
            read_digests,
            write,
            write_digests,
        })
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(
            FIXED
                + 16 * (self.read.len() + self.write.len())
                + 16 * (self.read_digests.len() + self.write_digests.len())
                + 32,
        );
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.extend_from_slice(&self.block_size.to_le_bytes());
        v.extend_from_slice(&self.base_size.to_le_bytes());
        v.extend_from_slice(&self.target_size.to_le_bytes());
        v.extend_from_slice(&self.base_sha256);
        v.extend_from_slice(&self.target_sha256);
        v.extend_from_slice(&self.cow_ops_sha256);
        v.extend_from_slice(&(self.read.len() as u32).to_le_bytes());
        v.extend_from_slice(&(self.write.len() as u32).to_le_bytes());
        for (s, n) in self.read.iter().chain(&self.write) {
            v.extend_from_slice(&s.to_le_bytes());
            v.extend_from_slice(&n.to_le_bytes());
        }
        for d in self.read_digests.iter().chain(&self.write_digests) {
            v.extend_from_slice(&d.to_le_bytes());
        }
        let sum = sha256(&v);
        v.extend_from_slice(&sum);
        v
    }

    /// Parse a record. Every count is checked against the bytes present before anything is
    /// allocated for it.
    pub fn decode(data: &[u8]) -> Result<Record, RecordError> {
        let dmg = |m: &str| RecordError::Damaged(m.to_owned());
        if data.len() < 8 || &data[..8] != MAGIC {
            return Err(dmg("not a snapblk COW record (bad magic)"));
        }
        if data.len() < FIXED + 32 {
            return Err(dmg("truncated header"));
        }
        let (body, sum) = data.split_at(data.len() - 32);
        let u32_at =
            |o: usize| u32::from_le_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let version = u32_at(8);
        if version != VERSION {
            return Err(RecordError::Version(version));
        }
        if sha256(body) != sum {
            return Err(dmg("checksum mismatch"));
        }
        let block_size = u32_at(12);
        if !block_size.is_power_of_two() || !(512..=1 << 20).contains(&block_size) {
            return Err(dmg("bad block size"));
        }
        let base_size = u64_at(16);
        let target_size = u64_at(24);
        if base_size > i64::MAX as u64 || target_size > i64::MAX as u64 {
            return Err(dmg("image size out of range"));
        }
        let mut base_sha256 = [0u8; 32];
        base_sha256.copy_from_slice(&body[32..64]);
        let mut target_sha256 = [0u8; 32];
        target_sha256.copy_from_slice(&body[64..96]);
        let mut cow_ops_sha256 = [0u8; 32];
        cow_ops_sha256.copy_from_slice(&body[96..128]);
        let nr = u64::from(u32_at(128));
        let nw = u64::from(u32_at(132));
        if nr > MAX_RANGES || nw > MAX_RANGES {
            return Err(dmg("too many ranges"));
        }
        let ranges_end = FIXED as u64 + 16 * (nr + nw);
        if ranges_end > body.len() as u64 {
            return Err(dmg("truncated range list"));
        }
        let bs = u64::from(block_size);
        let limit = |size: u64| size.div_ceil(bs);
        let mut off = FIXED;
        let mut parse = |n: u64, end_blocks: u64| -> Result<Vec<Range>, RecordError> {
            let mut v = Vec::with_capacity(n as usize);
            let mut prev_end = 0u64;
            for k in 0..n {
                let (s, c) = (u64_at(off), u64_at(off + 8));
                off += 16;
                let e = s.checked_add(c).ok_or_else(|| dmg("range overflows"))?;
                if c == 0 || (k > 0 && s < prev_end) || e > end_blocks {
                    return Err(dmg("ranges unsorted, empty or past the image"));
                }
                prev_end = e;
                v.push((s, c));
            }
            Ok(v)
        };
        let read = parse(nr, limit(base_size))?;
        let write = parse(nw, limit(target_size))?;
        let (cr, cw) = (count(&read), count(&write));
        if cr + cw > MAX_BLOCKS {
            return Err(dmg("too many blocks"));
        }
        if ranges_end + 16 * (cr + cw) != body.len() as u64 {
            return Err(dmg("digest list length does not match the ranges"));
        }
        let mut off = ranges_end as usize;
        let mut digests = |n: u64| -> Vec<BlockDigest> {
            (0..n)
                .map(|_| {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(&body[off..off + 16]);
                    off += 16;
                    u128::from_le_bytes(b)
                })
                .collect()
        };
        let read_digests = digests(cr);
        let write_digests = digests(cw);
        Ok(Record {
            block_size,
            base_size,
            target_size,
            base_sha256,
            target_sha256,
            cow_ops_sha256,
            read,
            read_digests,
            write,
            write_digests,
        })
    }

    /// Read and parse the record at `path`; `Ok(None)` when there is no file there.
    pub fn load(path: &Path) -> Result<Option<Record>, RecordError> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Ok(m) if m.len() > MAX_LEN => {
                return Err(RecordError::Damaged("file too large".into()));
            }
            _ => {}
        }
        let data = std::fs::read(path).map_err(|e| RecordError::Read {
            path: path.to_owned(),
            source: e,
        })?;
        Record::decode(&data).map(Some)
    }

    /// Check that the record describes `cow` (same block size, read set and write set).
    pub fn check_binding<R: ReadAt>(&self, cow: &CowReader<R>) -> Result<(), RecordError> {
        if self.block_size != cow.block_size() {
            return Err(RecordError::Stale(format!(
                "block size {} vs the COW's {}",
                self.block_size,
                cow.block_size()
            )));
        }
        if self.write != write_set(cow) {
            return Err(RecordError::Stale(
                "the blocks it writes differ from the record's".into(),
            ));
        }
        if self.read != read_set(cow) {
            return Err(RecordError::Stale(
                "the base blocks it reads differ from the record's".into(),
            ));
        }
        if self.cow_ops_sha256 != ops_digest(cow) {
            return Err(RecordError::Stale(
                "its ops differ from the record's".into(),
            ));
        }
        Ok(())
    }

    /// A lookup index over the record's digests.
    pub fn index(&self) -> RecordIndex<'_> {
        RecordIndex {
            rec: self,
            read_prefix: prefix_sums(&self.read),
            write_prefix: prefix_sums(&self.write),
        }
    }

    /// Blocks of the target image.
    pub fn target_blocks(&self) -> u64 {
        self.target_size.div_ceil(u64::from(self.block_size))
    }
}

/// Digest lookups by block number.
pub struct RecordIndex<'a> {
    rec: &'a Record,
    read_prefix: Vec<u64>,
    write_prefix: Vec<u64>,
}

impl RecordIndex<'_> {
    /// Expected digest of base block `b`, if the COW reads it.
    pub(crate) fn base_digest(&self, b: u64) -> Option<BlockDigest> {
        index_in(&self.rec.read, &self.read_prefix, b).map(|i| self.rec.read_digests[i])
    }
    /// Expected digest of target block `b`, if the COW writes it.
    pub fn target_digest(&self, b: u64) -> Option<BlockDigest> {
        index_in(&self.rec.write, &self.write_prefix, b).map(|i| self.rec.write_digests[i])
    }
}

/// Outcome of checking a base and a COW against a record.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RecordCheck {
    /// Base blocks the COW reads that differ from what it was made for.
    pub base_mismatches: Vec<u64>,
    /// Target blocks the COW produces whose content differs from the recorded digest.
    pub corrupt_blocks: Vec<u64>,
    /// Base blocks checked by [`check_base`].
    pub base_blocks_checked: u64,
    /// Target blocks checked by [`check_target`].
    pub target_blocks_checked: u64,
}

impl RecordCheck {
    /// True when no base block mismatched and no target block is corrupt.
    pub fn ok(&self) -> bool {
        self.base_mismatches.is_empty() && self.corrupt_blocks.is_empty()
    }
}

/// Check every base block the COW reads against the record (fills `base_mismatches`).
pub fn check_base<B: ReadAt + ?Sized>(
    rec: &Record,
    base: &B,
    out: &mut RecordCheck,
) -> Result<(), RecordError> {
    let bs = rec.block_size as usize;
    let mut buf = vec![0u8; bs];
    let base_len = base.size().map_err(|e| RecordError::Io {
        block: 0,
        source: e,
    })?;
    // (a base whose size cannot be read fails at its first block)
    for (b, want) in blocks(&rec.read).zip(&rec.read_digests) {
        let pos = b * bs as u64;
        buf.fill(0);
        if pos < base_len {
            let n = (base_len - pos).min(bs as u64) as usize;
            base.read_exact_at(pos, &mut buf[..n])
                .map_err(|e| RecordError::Io {
                    block: b,
                    source: e,
                })?;
        }
        out.base_blocks_checked += 1;
        if pos >= base_len || block_digest(&buf) != *want {
            out.base_mismatches.push(b);
        }
    }
    Ok(())
}

/// Compute every target block the COW produces from `base` and check it against the record
/// (fills `corrupt_blocks`; a payload that does not decode counts as corrupt).
pub fn check_target<R: ReadAt, B: ReadAt + ?Sized>(
    rec: &Record,
    cow: &CowReader<R>,
    base: &B,
    out: &mut RecordCheck,
) {
    let bs = rec.block_size as usize;
    let mut buf = vec![0u8; bs];
    for (b, want) in blocks(&rec.write).zip(&rec.write_digests) {
        out.target_blocks_checked += 1;
        match cow.read_block(b, base, &mut buf) {
            Ok(()) if block_digest(&buf) == *want => {}
            _ => out.corrupt_blocks.push(b),
        }
    }
}

/// Checks blocks of the new image against the record as they are served, remembering every
/// block that passed (each is hashed once per open). Thread-safe.
pub struct Verifier {
    rec: Record,
    write_prefix: Vec<u64>,
    verified: Vec<std::sync::atomic::AtomicU64>,
}

impl Verifier {
    /// A verifier for `rec` with no block verified yet.
    pub fn new(rec: Record) -> Verifier {
        let n = rec.write_digests.len().div_ceil(64);
        Verifier {
            write_prefix: prefix_sums(&rec.write),
            verified: (0..n)
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
            rec,
        }
    }
    /// The record.
    pub fn record(&self) -> &Record {
        &self.rec
    }
    /// Whether target block `b` has a digest and has not passed a check yet.
    #[inline]
    pub fn pending(&self, b: u64) -> bool {
        match index_in(&self.rec.write, &self.write_prefix, b) {
            Some(i) => {
                self.verified[i / 64].load(std::sync::atomic::Ordering::Relaxed) & (1 << (i % 64))
                    == 0
            }
            None => false,
        }
    }
    /// Check `data` (one whole block) as target block `b`: true when it matches the record (or
    /// the record has no digest for `b`). A match is remembered.
    pub fn check(&self, b: u64, data: &[u8]) -> bool {
        let Some(i) = index_in(&self.rec.write, &self.write_prefix, b) else {
            return true;
        };
        let bit = 1u64 << (i % 64);
        let word = &self.verified[i / 64];
        if word.load(std::sync::atomic::Ordering::Relaxed) & bit != 0 {
            return true;
        }
        if block_digest(data) != self.rec.write_digests[i] {
            return false;
        }
        word.fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
        true
    }
}

/// One op of a merge order, as [`check_merge_binding`] needs it.
#[derive(Clone, Copy, Debug)]
pub struct MergeOp {
    /// First block of the new image it writes.
    pub new_block: u64,
    /// Blocks it writes from `new_block`; 0 for an op that does not decide what its blocks
    /// hold (a duplicate another op overrides).
    pub blocks: u64,
    /// Base blocks it reads `(first, count)`.
    pub source: Option<Range>,
}

/// What the base is, for a merge of a COW with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeVerdict {
    /// Nothing merged yet; every block the COW reads matches.
    NotStarted,
    /// Merged blocks hold the new data, blocks still to read hold the old.
    InProgress,
    /// Everything merged and every block the COW wrote holds the new data.
    Complete,
    /// The COW counts merged ops, but this base is untouched: the progress was made on another
    /// file. `snapblk merge --reset-progress` starts over on this base.
    ProgressOfAnotherFile,
    /// Nothing merged, and this base already holds the new image.
    AlreadyUpdated,
    /// The base is neither the old image, nor the new, nor a merge in progress of this COW.
    WrongBase,
}

/// Outcome of [`check_merge_binding`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct MergeBinding {
    /// What the base is.
    pub verdict: MergeVerdict,
    /// Merged blocks that do not hold the new data.
    pub merged_mismatches: Vec<u64>,
    /// Blocks still to be read that do not hold the old data.
    pub source_mismatches: Vec<u64>,
    /// Merged blocks read and compared with their new digests.
    pub merged_blocks_checked: u64,
    /// Blocks still to be read that were compared with their old digests.
    pub source_blocks_checked: u64,
}

/// Check that `base` is the file a merge of this COW (merge order `ops`, `merged` of them
/// merged, ops before `sources_from` possibly staged in scratch) belongs to: the blocks
/// already merged hold their new digests, the blocks still to read hold their old ones.
/// `read_base(block, buf)` reads one base block.
pub fn check_merge_binding(
    rec: &Record,
    ops: &[MergeOp],
    merged: usize,
    sources_from: usize,
    read_base: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>,
) -> Result<MergeBinding, RecordError> {
    let ix = rec.index();
    let bs = rec.block_size as usize;
    let mut buf = vec![0u8; bs];
    let mut read = |b: u64, buf: &mut [u8]| {
        read_base(b, buf).map_err(|e| RecordError::Io {
            block: b,
            source: e,
        })
    };
    // The last op of the merge order to write each block decides what it holds when merged.
    let mut last = std::collections::HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        for b in op.new_block..op.new_block.saturating_add(op.blocks) {
            last.insert(b, i);
        }
    }
    let mut out = MergeBinding {
        verdict: MergeVerdict::InProgress,
        merged_mismatches: Vec::new(),
        source_mismatches: Vec::new(),
        merged_blocks_checked: 0,
        source_blocks_checked: 0,
    };
    let mut done: Vec<u64> = last
        .iter()
        .filter(|&(&b, &i)| i < merged && ix.target_digest(b).is_some())
        .map(|(&b, _)| b)
        .collect();
    done.sort_unstable();
    check_runs(
        &done,
        bs,
        &|b| ix.target_digest(b),
        &mut read,
        &mut out.merged_mismatches,
        &mut out.merged_blocks_checked,
    )?;
    let mut sources = |from: usize, bad: &mut Vec<u64>, n: &mut u64| -> Result<(), RecordError> {
        let mut v: Vec<u64> = ops[from.min(ops.len())..]
            .iter()
            .filter_map(|o| o.source)
            .flat_map(|(s, c)| s..s + c)
            .filter(|&b| ix.base_digest(b).is_some())
            .collect();
        v.sort_unstable();
        v.dedup();
        check_runs(&v, bs, &|b| ix.base_digest(b), &mut read, bad, n)
    };
    sources(
        sources_from.max(merged),
        &mut out.source_mismatches,
        &mut out.source_blocks_checked,
    )?;
    out.verdict = if out.merged_mismatches.is_empty() && out.source_mismatches.is_empty() {
        if merged == 0 {
            MergeVerdict::NotStarted
        } else if merged >= ops.len() {
            MergeVerdict::Complete
        } else {
            MergeVerdict::InProgress
        }
    } else {
        let (mut bad, mut n) = (Vec::new(), 0);
        if merged > 0 {
            sources(0, &mut bad, &mut n)?;
        }
        if merged > 0 && bad.is_empty() {
            MergeVerdict::ProgressOfAnotherFile
        } else if merged == 0 && all_written_match(rec, &mut read, &mut buf)? {
            MergeVerdict::AlreadyUpdated
        } else {
            MergeVerdict::WrongBase
        }
    };
    Ok(out)
}

/// Reads base blocks from the first one into a buffer of whole blocks.
type BlockRead<'a> = dyn FnMut(u64, &mut [u8]) -> Result<(), RecordError> + 'a;

/// Most blocks read at once by [`check_runs`].
const RUN_BLOCKS: usize = 256;

/// Read the sorted, distinct `blocks` in runs of consecutive blocks (at most [`RUN_BLOCKS`]),
/// compare each with `want(block)`, and collect the blocks that differ.
fn check_runs(
    blocks: &[u64],
    bs: usize,
    want: &dyn Fn(u64) -> Option<BlockDigest>,
    read: &mut BlockRead<'_>,
    bad: &mut Vec<u64>,
    checked: &mut u64,
) -> Result<(), RecordError> {
    let mut buf = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let mut j = i + 1;
        while j < blocks.len() && blocks[j] == blocks[j - 1] + 1 && j - i < RUN_BLOCKS {
            j += 1;
        }
        buf.resize((j - i) * bs, 0);
        read(blocks[i], &mut buf)?;
        for (k, chunk) in buf.chunks_exact(bs).enumerate() {
            let b = blocks[i + k];
            *checked += 1;
            if want(b) != Some(block_digest(chunk)) {
                bad.push(b);
            }
        }
        i = j;
    }
    Ok(())
}

fn all_written_match(
    rec: &Record,
    read: &mut BlockRead<'_>,
    buf: &mut [u8],
) -> Result<bool, RecordError> {
    for (b, want) in blocks(&rec.write).zip(&rec.write_digests) {
        read(b, buf)?;
        if block_digest(buf) != *want {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Streaming SHA-256 (for whole images).
#[derive(Clone, Default)]
pub struct Sha256Stream(Sha256);

impl Sha256Stream {
    /// Hash `data` next.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    /// The SHA-256 of everything passed to [`update`](Self::update).
    pub fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// SHA-256 of everything `r` holds.
pub fn sha256_of<R: ReadAt + ?Sized>(r: &R) -> std::io::Result<[u8; 32]> {
    sha256_of_first(r, r.size()?)
}

/// SHA-256 of the first `len` bytes of `r` (an error if it holds fewer): the old image inside
/// a base grown for a growing update before its merge.
pub fn sha256_of_first<R: ReadAt + ?Sized>(r: &R, len: u64) -> std::io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        r.read_exact_at(off, &mut buf[..n])?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            block_size: 4096,
            base_size: 10 * 4096,
            target_size: 12 * 4096,
            base_sha256: [1; 32],
            target_sha256: [2; 32],
            cow_ops_sha256: [3; 32],
            read: vec![(0, 2), (5, 1)],
            read_digests: vec![1, 2, 3],
            write: vec![(3, 4), (11, 1)],
            write_digests: vec![4, 5, 6, 7, 8],
        }
    }

    /// Old image of 8 blocks (block i filled with i+1); the COW copies old block 5 to block 1
    /// and replaces block 6 with 0xEE.
    fn merge_case() -> (Record, Vec<MergeOp>, Vec<u8>, Vec<u8>) {
        let bs = 4096;
        let old: Vec<u8> = (0..8 * bs).map(|i| (i / bs) as u8 + 1).collect();
        let mut new = old.clone();
        new.copy_within(5 * bs..6 * bs, bs);
        new[6 * bs..7 * bs].fill(0xEE);
        let blk = |img: &[u8], b: usize| block_digest(&img[b * bs..(b + 1) * bs]);
        let rec = Record {
            block_size: bs as u32,
            base_size: old.len() as u64,
            target_size: new.len() as u64,
            base_sha256: sha256(&old),
            target_sha256: sha256(&new),
            cow_ops_sha256: [0; 32],
            read: vec![(5, 1)],
            read_digests: vec![blk(&old, 5)],
            write: vec![(1, 1), (6, 1)],
            write_digests: vec![blk(&new, 1), blk(&new, 6)],
        };
        let ops = vec![
            MergeOp {
                new_block: 1,
                blocks: 1,
                source: Some((5, 1)),
            },
            MergeOp {
                new_block: 6,
                blocks: 1,
                source: None,
            },
        ];
        (rec, ops, old, new)
    }

    fn verdict(rec: &Record, ops: &[MergeOp], disk: &[u8], merged: usize) -> MergeVerdict {
        let mut rd = |b: u64, buf: &mut [u8]| {
            let o = b as usize * buf.len();
            buf.copy_from_slice(&disk[o..o + buf.len()]);
            Ok(())
        };
        check_merge_binding(rec, ops, merged, merged, &mut rd)
            .unwrap()
            .verdict
    }

    #[test]
    fn merge_binding_verdicts() {
        let (rec, ops, old, new) = merge_case();
        let bs = 4096;
        assert_eq!(verdict(&rec, &ops, &old, 0), MergeVerdict::NotStarted);
        let mut half = old.clone();
        half[bs..2 * bs].copy_from_slice(&new[bs..2 * bs]);
        assert_eq!(verdict(&rec, &ops, &half, 1), MergeVerdict::InProgress);
        assert_eq!(verdict(&rec, &ops, &new, 2), MergeVerdict::Complete);
        // The COW says two ops are merged, but this base is the untouched old image.
        assert_eq!(
            verdict(&rec, &ops, &old, 2),
            MergeVerdict::ProgressOfAnotherFile
        );
        // Another image entirely.
        let other = vec![0x55u8; 8 * bs];
        assert_eq!(verdict(&rec, &ops, &other, 0), MergeVerdict::WrongBase);
        assert_eq!(verdict(&rec, &ops, &other, 1), MergeVerdict::WrongBase);
        // A base that holds the new image except the block the COW reads.
        let mut updated = new.clone();
        updated[5 * bs] ^= 1;
        assert_eq!(
            verdict(&rec, &ops, &updated, 0),
            MergeVerdict::AlreadyUpdated
        );
    }

    #[test]
    fn verifier_remembers_passes_only() {
        let (rec, _, _, new) = merge_case();
        let v = Verifier::new(rec);
        let b1 = &new[4096..8192];
        assert!(v.pending(1) && !v.pending(0));
        assert!(!v.check(1, &new[..4096]), "wrong data fails");
        assert!(v.pending(1), "a failure is not remembered");
        assert!(v.check(1, b1));
        assert!(!v.pending(1));
        assert!(v.check(0, &new[..4096]), "blocks without a digest pass");
    }

    /// A COW over an old image of 700 blocks (copies, XOR reading the last, partial block,
    /// replaces reaching past the old image's end) whose record `build_from` makes from files
    /// exactly as `build` does from memory, and whose read errors name the block.
    #[test]
    fn build_from_files_equals_build_in_memory() {
        use crate::io::MemFile;
        use crate::writer::{CowWriter, WriterOptions};
        let bs = 4096usize;
        // The old image ends 100 bytes into block 699; the new one has 900 blocks.
        let old: Vec<u8> = (0..699 * bs + 100).map(|i| (i * 7 % 251) as u8).collect();
        let new: Vec<u8> = (0..900 * bs).map(|i| (i * 13 % 241) as u8).collect();
        for version in [2u16, 3] {
            let sink = MemFile::new(Vec::new());
            let opts = WriterOptions {
                version,
                op_count_max: 4096,
                ..WriterOptions::default()
            };
            let mut w = CowWriter::new(&sink, opts).unwrap();
            w.add_copy(0, 10, 300).unwrap();
            w.add_xor_blocks(400, &new[400 * bs..402 * bs], 698, 50)
                .unwrap();
            w.add_raw_blocks(500, &new[500 * bs..900 * bs]).unwrap();
            w.finalize().unwrap();
            let bytes = sink.0.into_inner().unwrap();
            let cow = CowReader::open(bytes.as_slice()).unwrap();
            let mem = Record::build(&cow, &old, &new);
            // The XOR at offset 50 reads old blocks 698..701: 700 lies past the end.
            assert_eq!(mem.read_digests.len(), 303, "v{version}");
            assert_eq!(mem.write_digests.len(), 702, "v{version}");
            let files = Record::build_from(&cow, old.as_slice(), new.as_slice()).unwrap();
            assert_eq!(files, mem, "v{version}");
            struct Failing;
            impl ReadAt for Failing {
                fn read_at(&self, o: u64, _: &mut [u8]) -> std::io::Result<usize> {
                    Err(std::io::Error::other(format!("at {o}")))
                }
                fn size(&self) -> std::io::Result<u64> {
                    Ok(900 * 4096)
                }
            }
            let e = Record::build_from(&cow, old.as_slice(), &Failing).unwrap_err();
            assert!(matches!(e, RecordError::TargetIo { block: 0, .. }), "{e:?}");
            let e = Record::build_from(&cow, &Failing, new.as_slice()).unwrap_err();
            assert!(matches!(e, RecordError::Io { block: 0, .. }), "{e:?}");
        }
    }

    #[test]
    fn round_trip() {
        let r = sample();
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = sample().encode();
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(Record::decode(&b).is_err(), "flip of bit {i} accepted");
        }
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(Record::decode(&bytes[..n]).is_err(), "cut at {n} accepted");
        }
    }

    #[test]
    fn index_finds_digests() {
        let r = sample();
        let ix = r.index();
        assert_eq!(ix.base_digest(1), Some(2));
        assert_eq!(ix.base_digest(5), Some(3));
        assert_eq!(ix.base_digest(2), None);
        assert_eq!(ix.target_digest(6), Some(7));
        assert_eq!(ix.target_digest(11), Some(8));
        assert_eq!(ix.target_digest(7), None);
    }

    #[test]
    fn runs_merge_overlaps() {
        assert_eq!(
            merge_runs(vec![(0, 2), (1, 2), (3, 1), (7, 1)]),
            vec![(0, 4), (7, 1)]
        );
    }

    #[test]
    fn sha256_hex_round_trip() {
        let d = sha256(b"abc");
        assert_eq!(
            hex(&d),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_sha256(&hex(&d)), Some(d));
        assert_eq!(parse_sha256("zz"), None);
    }
}
