//! Test scaffolding (feature `test-utils`): a small writer of full payloads (REPLACE,
//! REPLACE_BZ, REPLACE_XZ, REPLACE_ZSTD, ZERO/DISCARD, every op and partition hashed; block
//! ranges left out of the operations, as the dm-verity tree and FEC are), an in-memory
//! [`Output`], and extraction into memory. Tests mutate [`Built::manifest`] (the verity fields,
//! bad values) or the bytes to make bad payloads.

use snapblk_core::MemFile;
use snapblk_core::sync::lock;
use std::io::Write;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::extract::{ExtractOptions, Output};
use crate::payload::{HEADER_LEN, MAGIC, MAJOR_VERSION, Payload};
use crate::proto::{
    DeltaArchiveManifest, Extent, InstallOperation, OpType, PartitionInfo, PartitionUpdate,
};

/// How a chunk with data is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// REPLACE (raw).
    Replace,
    /// REPLACE_BZ.
    Bz,
    /// REPLACE_XZ (xz, CRC32 check, as update_engine's generator writes it).
    Xz,
    /// REPLACE_ZSTD.
    Zstd,
}

/// A partition to write.
#[derive(Clone, Debug)]
struct Part {
    name: String,
    image: Vec<u8>,
    chunk_blocks: u64,
    encodings: Vec<Encoding>,
    /// Block ranges (start, count) no operation writes.
    skip: Vec<(u64, u64)>,
}

/// Builds full payloads. Each partition is cut into chunks of `chunk_blocks` blocks; an
/// all-zero chunk becomes a ZERO op (or DISCARD, or is encoded like the others, see
/// [`PayloadBuilder::zero_ops`]); the other chunks take the encodings in turn.
#[derive(Clone, Debug)]
pub struct PayloadBuilder {
    block_size: u32,
    parts: Vec<Part>,
    zero: Option<OpType>,
}

impl Default for PayloadBuilder {
    fn default() -> Self {
        PayloadBuilder {
            block_size: 4096,
            parts: Vec::new(),
            zero: Some(OpType::Zero),
        }
    }
}

/// A built payload: the manifest and the data area, joined by [`Built::to_bytes`].
#[derive(Clone, Debug)]
pub struct Built {
    /// The manifest (change it to make a bad payload).
    pub manifest: DeltaArchiveManifest,
    /// The data area (op blobs, in op order).
    pub data: Vec<u8>,
}

impl Built {
    /// Header, manifest and data area (no signatures).
    pub fn to_bytes(&self) -> Vec<u8> {
        let m = self.manifest.encode_to_vec();
        let mut out = Vec::with_capacity(HEADER_LEN as usize + m.len() + self.data.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&MAJOR_VERSION.to_be_bytes());
        out.extend_from_slice(&(m.len() as u64).to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&m);
        out.extend_from_slice(&self.data);
        out
    }
}

/// SHA-256 of `b`.
pub fn sha256(b: &[u8]) -> Vec<u8> {
    Sha256::digest(b).to_vec()
}

/// `data` compressed with `e`.
pub fn encode(e: Encoding, data: &[u8]) -> Vec<u8> {
    match e {
        Encoding::Replace => data.to_vec(),
        Encoding::Bz => {
            let mut w = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
            w.write_all(data).expect("bzip2");
            w.finish().expect("bzip2")
        }
        Encoding::Xz => {
            let s = liblzma::stream::Stream::new_easy_encoder(6, liblzma::stream::Check::Crc32)
                .expect("xz encoder");
            let mut w = liblzma::write::XzEncoder::new_stream(Vec::new(), s);
            w.write_all(data).expect("xz");
            w.finish().expect("xz")
        }
        Encoding::Zstd => zstd::encode_all(data, 3).expect("zstd"),
    }
}

impl PayloadBuilder {
    /// A builder with 4096-byte blocks, all-zero chunks as ZERO ops.
    pub fn new() -> PayloadBuilder {
        PayloadBuilder::default()
    }

    /// Block size of the payload.
    pub fn block_size(mut self, bs: u32) -> PayloadBuilder {
        self.block_size = bs;
        self
    }

    /// What all-zero chunks become: `Some(OpType::Zero)` (default), `Some(OpType::Discard)`,
    /// or `None` to encode them like the others.
    pub fn zero_ops(mut self, t: Option<OpType>) -> PayloadBuilder {
        self.zero = t;
        self
    }

    /// Add a partition.
    pub fn partition(
        mut self,
        name: &str,
        image: &[u8],
        chunk_blocks: u64,
        encodings: &[Encoding],
    ) -> PayloadBuilder {
        assert!(chunk_blocks > 0 && !encodings.is_empty());
        self.parts.push(Part {
            name: name.into(),
            image: image.to_vec(),
            chunk_blocks,
            encodings: encodings.to_vec(),
            skip: Vec::new(),
        });
        self
    }

    /// Leave blocks `start..start + count` of the partition added last out of its operations,
    /// as update_engine's generator leaves out the dm-verity hash tree and FEC that the device
    /// computes (set the manifest's `hash_tree_*` and `fec_*` fields on [`Built::manifest`]).
    /// The partition's hash stays that of the whole image.
    pub fn skip_blocks(mut self, start: u64, count: u64) -> PayloadBuilder {
        let p = self.parts.last_mut().expect("skip_blocks after partition");
        p.skip.push((start, count));
        self
    }

    /// The manifest and data area.
    pub fn build(&self) -> Built {
        let bs = self.block_size as usize;
        let mut data = Vec::new();
        let mut partitions = Vec::new();
        for p in &self.parts {
            let mut ops = Vec::new();
            let mut turn = 0;
            // Chunks of chunk_blocks blocks of each run of blocks not skipped.
            let blocks = p.image.len().div_ceil(bs) as u64;
            let mut skips = p.skip.clone();
            skips.sort_unstable();
            let (mut runs, mut at) = (Vec::new(), 0u64);
            for (start, count) in skips {
                if start > at {
                    runs.push((at, start.min(blocks)));
                }
                at = at.max(start + count);
            }
            if at < blocks {
                runs.push((at, blocks));
            }
            let mut chunks = Vec::new();
            for (mut b, end) in runs {
                while b < end {
                    chunks.push((b, (b + p.chunk_blocks).min(end)));
                    b += p.chunk_blocks;
                }
            }
            for (first, end) in chunks {
                let (from, to) = (first as usize * bs, (end as usize * bs).min(p.image.len()));
                let mut c = p.image[from..to].to_vec();
                c.resize(c.len().div_ceil(bs) * bs, 0);
                let dst = Extent {
                    start_block: Some(first),
                    num_blocks: Some((c.len() / bs) as u64),
                };
                let zero = c.iter().all(|&b| b == 0);
                let mut op = InstallOperation {
                    dst_extents: vec![dst],
                    ..Default::default()
                };
                match (zero, self.zero) {
                    (true, Some(t)) => op.r#type = t as i32,
                    _ => {
                        let e = p.encodings[turn % p.encodings.len()];
                        turn += 1;
                        let blob = encode(e, &c);
                        op.r#type = match e {
                            Encoding::Replace => OpType::Replace,
                            Encoding::Bz => OpType::ReplaceBz,
                            Encoding::Xz => OpType::ReplaceXz,
                            Encoding::Zstd => OpType::ReplaceZstd,
                        } as i32;
                        op.data_offset = Some(data.len() as u64);
                        op.data_length = Some(blob.len() as u64);
                        op.data_sha256_hash = Some(sha256(&blob));
                        data.extend_from_slice(&blob);
                    }
                }
                ops.push(op);
            }
            partitions.push(PartitionUpdate {
                partition_name: p.name.clone(),
                new_partition_info: Some(PartitionInfo {
                    size: Some(p.image.len() as u64),
                    hash: Some(sha256(&p.image)),
                }),
                operations: ops,
                ..Default::default()
            });
        }
        Built {
            manifest: DeltaArchiveManifest {
                block_size: Some(self.block_size),
                minor_version: Some(0),
                partitions,
                ..Default::default()
            },
            data,
        }
    }

    /// The payload's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.build().to_bytes()
    }
}

/// An [`Output`] in memory: `snapblk_core`'s growable [`MemFile`].
pub type MemOutput = MemFile;

impl Output for MemFile {
    fn set_len(&self, size: u64) -> std::io::Result<()> {
        let n = usize::try_from(size).map_err(|_| std::io::ErrorKind::OutOfMemory)?;
        lock(&self.0).resize(n, 0);
        Ok(())
    }
}

/// Extract `names` (all when `None`) of `payload` into memory with `threads` workers:
/// (name, image) per partition.
pub fn extract_to_memory(
    payload: &Payload,
    names: Option<&[String]>,
    threads: usize,
) -> crate::Result<Vec<(String, Vec<u8>)>> {
    let plan = payload.plan_extract(names)?;
    let outs: Vec<MemOutput> = plan
        .partitions()
        .iter()
        .map(|_| MemOutput::default())
        .collect();
    let refs: Vec<&dyn Output> = outs.iter().map(|o| o as &dyn Output).collect();
    plan.run(
        &refs,
        &ExtractOptions {
            threads,
            progress: None,
        },
    )?;
    Ok(plan
        .partitions()
        .iter()
        .map(|p| p.name.clone())
        .zip(outs.into_iter().map(MemOutput::into_inner))
        .collect())
}
