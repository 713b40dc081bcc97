//! Test scaffolding (feature `test-utils`): a small payload writer — full partitions (REPLACE,
//! REPLACE_BZ, REPLACE_XZ, REPLACE_ZSTD, ZERO/DISCARD; block ranges can be left out of the
//! operations, as the dm-verity tree and FEC are) and incremental ones (SOURCE_COPY,
//! SOURCE_BSDIFF, BROTLI_BSDIFF with patches from a caller-given differ, any op with a given
//! blob), every op and partition hashed, signed in delta_generator's two passes
//! ([`Built::unsigned`], then [`Unsigned::fill`] with signatures made elsewhere) — an
//! in-memory [`Output`], and extraction and `apply` into memory. Tests mutate
//! [`Built::manifest`] (the verity fields, bad values) or the bytes to make bad payloads.

pub mod vabc;

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
    body: Body,
}

/// How a partition's operations are made.
#[derive(Clone, Debug)]
enum Body {
    /// Chunks of the image, encoded in turn.
    Full {
        chunk_blocks: u64,
        encodings: Vec<Encoding>,
        /// Block ranges (start, count) no operation writes.
        skip: Vec<(u64, u64)>,
    },
    /// From an old image: the operations (without their data fields) and their blobs.
    Delta {
        old: Vec<u8>,
        ops: Vec<(InstallOperation, Vec<u8>)>,
    },
}

/// Makes a BSDIFF40 patch: `differ(old bytes, new bytes)`.
pub type Differ = dyn Fn(&[u8], &[u8]) -> Vec<u8>;

/// Block ranges: (first block, blocks).
pub type Blocks = Vec<(u64, u64)>;

/// One operation of an incremental partition ([`PayloadBuilder::delta`]).
#[derive(Clone, Debug)]
pub enum DeltaOp {
    /// SOURCE_COPY: the old blocks `src`, in order, to the new blocks `dst`.
    Copy {
        /// Old blocks.
        src: Blocks,
        /// New blocks.
        dst: Blocks,
    },
    /// SOURCE_BSDIFF: the differ's BSDIFF40 patch from the old blocks `src` to the new blocks
    /// `dst`.
    Bsdiff {
        /// Old blocks.
        src: Blocks,
        /// New blocks.
        dst: Blocks,
    },
    /// BROTLI_BSDIFF: the differ's patch repacked as BSDF2 ([`bsdf2_from_bsdiff40`]) with
    /// these compressors of the control, diff and extra streams (0 none, 1 bzip2, 2 brotli).
    Bsdf2 {
        /// Old blocks.
        src: Blocks,
        /// New blocks.
        dst: Blocks,
        /// Compressor codes.
        codecs: [u8; 3],
    },
    /// REPLACE, REPLACE_BZ, REPLACE_XZ or REPLACE_ZSTD of the new blocks `dst`.
    Replace {
        /// New blocks.
        dst: Blocks,
        /// How they are stored.
        encoding: Encoding,
    },
    /// ZERO of the new blocks `dst`.
    Zero {
        /// New blocks.
        dst: Blocks,
    },
    /// Any type number with the given blob (hashed; none when empty) and extents, with
    /// `src_sha256_hash` of the old blocks when `src` is not empty.
    Raw {
        /// `InstallOperation.type`.
        op_type: i32,
        /// Old blocks.
        src: Blocks,
        /// New blocks.
        dst: Blocks,
        /// The data blob.
        blob: Vec<u8>,
    },
}

/// Builds full payloads. Each partition is cut into chunks of `chunk_blocks` blocks; an
/// all-zero chunk becomes a ZERO op (or DISCARD, or is encoded like the others, see
/// [`PayloadBuilder::zero_ops`]); the other chunks take the encodings in turn.
#[derive(Clone, Debug)]
pub struct PayloadBuilder {
    block_size: u32,
    parts: Vec<Part>,
    zero: Option<OpType>,
    minor: Option<u32>,
}

impl Default for PayloadBuilder {
    fn default() -> Self {
        PayloadBuilder {
            block_size: 4096,
            parts: Vec::new(),
            zero: Some(OpType::Zero),
            minor: None,
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

/// A payload laid out for signing, as update_engine's `delta_generator` signs in two passes:
/// the manifest already names the payload signature blob (`signatures_offset`,
/// `signatures_size`) and the header the metadata signature's size, both blobs filled with
/// zero signatures of their final (padded) sizes, so the signed bytes do not change when
/// [`Unsigned::fill`] puts the real signatures in.
#[derive(Clone, Debug)]
pub struct Unsigned {
    /// The payload with placeholder signatures.
    pub bytes: Vec<u8>,
    /// Padded size of each signature (one per signing key).
    pub sizes: Vec<usize>,
    /// Whether the payload has a metadata signature.
    pub metadata_signed: bool,
}

/// A `Signatures` message: each signature zero-padded to its size in `sizes`, with
/// `unpadded_signature_size` its own length (as the generator writes RSA and EC alike).
pub fn signature_set(sigs: &[Vec<u8>], sizes: &[usize]) -> Vec<u8> {
    assert_eq!(sigs.len(), sizes.len(), "one signature per size");
    let signatures = sigs
        .iter()
        .zip(sizes)
        .map(|(s, &n)| {
            assert!(s.len() <= n, "signature of {} bytes, room for {n}", s.len());
            let mut data = s.clone();
            data.resize(n, 0);
            crate::proto::Signature {
                version: None,
                data: Some(data),
                unpadded_signature_size: Some(s.len() as u32),
            }
        })
        .collect();
    crate::proto::Signatures { signatures }.encode_to_vec()
}

impl Unsigned {
    /// Header, manifest and metadata signature bytes: where the data area starts.
    pub fn data_start(&self) -> usize {
        let m = u64::from_be_bytes(self.bytes[12..20].try_into().unwrap()) as usize;
        let s = u32::from_be_bytes(self.bytes[20..24].try_into().unwrap()) as usize;
        HEADER_LEN as usize + m + s
    }

    /// What the two signatures sign, cut from the placeholder payload as update_engine's
    /// format says: the metadata signature the header and manifest, `[0, 24 + M)`; the
    /// payload signature those bytes followed by the data area up to the payload signature
    /// blob (the metadata signature left out).
    pub fn messages(&self) -> (Vec<u8>, Vec<u8>) {
        let m = u64::from_be_bytes(self.bytes[12..20].try_into().unwrap()) as usize;
        let metadata = self.bytes[..HEADER_LEN as usize + m].to_vec();
        let zero: Vec<Vec<u8>> = self.sizes.iter().map(|&n| vec![0; n]).collect();
        let blob = signature_set(&zero, &self.sizes).len();
        let mut payload = metadata.clone();
        payload.extend_from_slice(&self.bytes[self.data_start()..self.bytes.len() - blob]);
        (metadata, payload)
    }

    /// Pass two: sign [`Unsigned::messages`] with each key, `sign(key index, message)`
    /// giving the signature (of the message, which the signer hashes), and
    /// [`fill`](Unsigned::fill) them in.
    pub fn sign(&self, sign: &dyn Fn(usize, &[u8]) -> Vec<u8>) -> Vec<u8> {
        let (meta, payload) = self.messages();
        let n = self.sizes.len();
        let metadata: Vec<Vec<u8>> = (0..n).map(|k| sign(k, &meta)).collect();
        let payload: Vec<Vec<u8>> = (0..n).map(|k| sign(k, &payload)).collect();
        self.fill(&metadata, &payload)
    }

    /// The payload with `metadata` and `payload` signatures (one per size, each at most its
    /// size) in place of the placeholders.
    pub fn fill(&self, metadata: &[Vec<u8>], payload: &[Vec<u8>]) -> Vec<u8> {
        let zero: Vec<Vec<u8>> = self.sizes.iter().map(|&n| vec![0; n]).collect();
        let blob = signature_set(payload, &self.sizes);
        assert_eq!(blob.len(), signature_set(&zero, &self.sizes).len());
        let mut out = self.bytes.clone();
        let at = out.len() - blob.len();
        out[at..].copy_from_slice(&blob);
        if self.metadata_signed {
            let meta = signature_set(metadata, &self.sizes);
            let m = u64::from_be_bytes(out[12..20].try_into().unwrap()) as usize;
            let from = HEADER_LEN as usize + m;
            assert_eq!(self.data_start() - from, meta.len());
            out[from..from + meta.len()].copy_from_slice(&meta);
        }
        out
    }
}

impl Built {
    /// Pass one of signing: the payload with room for one signature per key of the padded
    /// `sizes` (RSA: the modulus' bytes; ECDSA P-256: 72, its largest DER signature), in a
    /// payload signature blob after the data area and, with `metadata_signed`, a metadata
    /// signature.
    pub fn unsigned(&self, sizes: &[usize], metadata_signed: bool) -> Unsigned {
        let zero: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
        let blob = signature_set(&zero, sizes);
        let mut manifest = self.manifest.clone();
        manifest.signatures_offset = Some(self.data.len() as u64);
        manifest.signatures_size = Some(blob.len() as u64);
        let m = manifest.encode_to_vec();
        let meta: &[u8] = if metadata_signed { &blob } else { &[] };
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&MAJOR_VERSION.to_be_bytes());
        out.extend_from_slice(&(m.len() as u64).to_be_bytes());
        out.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        out.extend_from_slice(&m);
        out.extend_from_slice(meta);
        out.extend_from_slice(&self.data);
        out.extend_from_slice(&blob);
        Unsigned {
            bytes: out,
            sizes: sizes.to_vec(),
            metadata_signed,
        }
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
            body: Body::Full {
                chunk_blocks,
                encodings: encodings.to_vec(),
                skip: Vec::new(),
            },
        });
        self
    }

    /// The manifest's minor version (default: 0 for a full payload, 6 when a partition is
    /// incremental).
    pub fn minor_version(mut self, v: u32) -> PayloadBuilder {
        self.minor = Some(v);
        self
    }

    /// Add an incremental partition: `new` built from `old` by `ops`, in order (their
    /// destinations should cover `new`); `differ(old bytes, new bytes)` makes the BSDIFF40
    /// patches. The partition gets `old_partition_info` and every source-reading op its
    /// `src_sha256_hash`.
    pub fn delta(
        mut self,
        name: &str,
        old: &[u8],
        new: &[u8],
        ops: &[DeltaOp],
        differ: &Differ,
    ) -> PayloadBuilder {
        let bs = u64::from(self.block_size);
        let bytes = |img: &[u8], blocks: &Blocks| {
            let mut v = Vec::new();
            for &(s, n) in blocks {
                let (a, b) = ((s * bs) as usize, ((s + n) * bs) as usize);
                let mut piece = img
                    .get(a.min(img.len())..b.min(img.len()))
                    .unwrap_or(&[])
                    .to_vec();
                piece.resize(b - a, 0);
                v.extend(piece);
            }
            v
        };
        let extents = |blocks: &Blocks| {
            blocks
                .iter()
                .map(|&(s, n)| Extent {
                    start_block: Some(s),
                    num_blocks: Some(n),
                })
                .collect::<Vec<_>>()
        };
        let mut made = Vec::new();
        for d in ops {
            let (t, src, dst, blob) = match d {
                DeltaOp::Copy { src, dst } => (OpType::SourceCopy as i32, src, dst, Vec::new()),
                DeltaOp::Bsdiff { src, dst } => (
                    OpType::SourceBsdiff as i32,
                    src,
                    dst,
                    differ(&bytes(old, src), &bytes(new, dst)),
                ),
                DeltaOp::Bsdf2 { src, dst, codecs } => {
                    let p = differ(&bytes(old, src), &bytes(new, dst));
                    (
                        OpType::BrotliBsdiff as i32,
                        src,
                        dst,
                        bsdf2_from_bsdiff40(&p, *codecs),
                    )
                }
                DeltaOp::Replace { dst, encoding } => {
                    let t = match encoding {
                        Encoding::Replace => OpType::Replace,
                        Encoding::Bz => OpType::ReplaceBz,
                        Encoding::Xz => OpType::ReplaceXz,
                        Encoding::Zstd => OpType::ReplaceZstd,
                    };
                    (
                        t as i32,
                        &Vec::new(),
                        dst,
                        encode(*encoding, &bytes(new, dst)),
                    )
                }
                DeltaOp::Zero { dst } => (OpType::Zero as i32, &Vec::new(), dst, Vec::new()),
                DeltaOp::Raw {
                    op_type,
                    src,
                    dst,
                    blob,
                } => (*op_type, src, dst, blob.clone()),
            };
            let op = InstallOperation {
                r#type: t,
                src_extents: extents(src),
                dst_extents: extents(dst),
                src_sha256_hash: (!src.is_empty()).then(|| sha256(&bytes(old, src))),
                ..Default::default()
            };
            made.push((op, blob));
        }
        self.parts.push(Part {
            name: name.into(),
            image: new.to_vec(),
            body: Body::Delta {
                old: old.to_vec(),
                ops: made,
            },
        });
        self
    }

    /// Leave blocks `start..start + count` of the full partition added last out of its
    /// operations, as update_engine's generator leaves out the dm-verity hash tree and FEC that
    /// the device computes (set the manifest's `hash_tree_*` and `fec_*` fields on
    /// [`Built::manifest`]). The partition's hash stays that of the whole image. (An
    /// incremental partition's [`DeltaOp`]s name their own destinations: leave the blocks out
    /// of them.)
    pub fn skip_blocks(mut self, start: u64, count: u64) -> PayloadBuilder {
        let p = self.parts.last_mut().expect("skip_blocks after partition");
        let Body::Full { skip, .. } = &mut p.body else {
            panic!("skip_blocks after a full partition");
        };
        skip.push((start, count));
        self
    }

    /// The manifest and data area.
    pub fn build(&self) -> Built {
        let mut data = Vec::new();
        let mut partitions = Vec::new();
        for p in &self.parts {
            let mut ops = Vec::new();
            let mut old_info = None;
            match &p.body {
                Body::Full {
                    chunk_blocks,
                    encodings,
                    skip,
                } => self.full_ops(
                    &p.image,
                    *chunk_blocks,
                    encodings,
                    skip,
                    &mut ops,
                    &mut data,
                ),
                Body::Delta { old, ops: made } => {
                    old_info = Some(PartitionInfo {
                        size: Some(old.len() as u64),
                        hash: Some(sha256(old)),
                    });
                    for (op, blob) in made {
                        let mut op = op.clone();
                        if !blob.is_empty() {
                            op.data_offset = Some(data.len() as u64);
                            op.data_length = Some(blob.len() as u64);
                            op.data_sha256_hash = Some(sha256(blob));
                            data.extend_from_slice(blob);
                        }
                        ops.push(op);
                    }
                }
            }
            partitions.push(PartitionUpdate {
                partition_name: p.name.clone(),
                old_partition_info: old_info,
                new_partition_info: Some(PartitionInfo {
                    size: Some(p.image.len() as u64),
                    hash: Some(sha256(&p.image)),
                }),
                operations: ops,
                ..Default::default()
            });
        }
        let delta = self
            .parts
            .iter()
            .any(|p| matches!(p.body, Body::Delta { .. }));
        Built {
            manifest: DeltaArchiveManifest {
                block_size: Some(self.block_size),
                minor_version: Some(self.minor.unwrap_or(if delta { 6 } else { 0 })),
                partitions,
                ..Default::default()
            },
            data,
        }
    }

    /// The operations of a full partition: chunks of `chunk_blocks` blocks of each run of
    /// blocks not in `skip`.
    fn full_ops(
        &self,
        image: &[u8],
        chunk_blocks: u64,
        encodings: &[Encoding],
        skip: &[(u64, u64)],
        ops: &mut Vec<InstallOperation>,
        data: &mut Vec<u8>,
    ) {
        let bs = self.block_size as usize;
        let mut turn = 0;
        let blocks = image.len().div_ceil(bs) as u64;
        let mut skips = skip.to_vec();
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
                chunks.push((b, (b + chunk_blocks).min(end)));
                b += chunk_blocks;
            }
        }
        for (first, end) in chunks {
            let (from, to) = (first as usize * bs, (end as usize * bs).min(image.len()));
            let mut c = image[from..to].to_vec();
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
                    let e = encodings[turn % encodings.len()];
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
    }

    /// The payload's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.build().to_bytes()
    }
}

/// The bsdiff integer encoding of `x` (8 bytes, little-endian magnitude, sign in the top bit).
pub fn bsdiff_int(x: i64) -> [u8; 8] {
    let m = x.unsigned_abs();
    (if x < 0 { m | 1 << 63 } else { m }).to_le_bytes()
}

/// A BSDIFF40 patch (as Debian's `bsdiff` or PyPI `bsdiff4` make it) repacked as BSDF2: the
/// same control, diff and extra bytes, each stream stored with its compressor from `codecs`
/// (0 none, 1 bzip2, 2 brotli). Panics on a patch that is not BSDIFF40.
pub fn bsdf2_from_bsdiff40(patch: &[u8], codecs: [u8; 3]) -> Vec<u8> {
    use std::io::Read;
    assert_eq!(&patch[..8], b"BSDIFF40", "not a BSDIFF40 patch");
    let len = |i: usize| {
        let v = u64::from_le_bytes(patch[i..i + 8].try_into().unwrap());
        assert_eq!(v >> 63, 0, "negative length");
        v as usize
    };
    let (c, d) = (len(8), len(16));
    let streams = [
        &patch[32..32 + c],
        &patch[32 + c..32 + c + d],
        &patch[32 + c + d..],
    ];
    let packed: Vec<Vec<u8>> = streams
        .iter()
        .zip(codecs)
        .map(|(s, code)| {
            let mut raw = Vec::new();
            bzip2::read::BzDecoder::new(*s)
                .read_to_end(&mut raw)
                .expect("a bzip2 stream");
            match code {
                0 => raw,
                1 => encode(Encoding::Bz, &raw),
                2 => {
                    let mut v = Vec::new();
                    let mut w = brotli::CompressorWriter::new(&mut v, 4096, 9, 22);
                    w.write_all(&raw).expect("brotli");
                    drop(w);
                    v
                }
                _ => panic!("compressor {code}"),
            }
        })
        .collect();
    let mut out = b"BSDF2".to_vec();
    out.extend(codecs);
    out.extend(bsdiff_int(packed[0].len() as i64));
    out.extend(bsdiff_int(packed[1].len() as i64));
    out.extend_from_slice(&patch[24..32]);
    for p in packed {
        out.extend(p);
    }
    out
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

/// What [`apply_to_memory`] built: (name, image) per partition, and the partitions skipped.
pub type Applied = (Vec<(String, Vec<u8>)>, Vec<crate::SkippedPartition>);

/// Apply `names` (all when `None`) of `payload` in memory with `threads` workers, reading the
/// old images `old` (name, image; partitions not listed have none): (name, image) per
/// partition built, and the partitions skipped (`skip_unsupported`).
pub fn apply_to_memory(
    payload: &Payload,
    names: Option<&[String]>,
    old: &[(&str, &[u8])],
    skip_unsupported: bool,
    threads: usize,
) -> crate::Result<Applied> {
    let plan = payload.plan_apply(names, skip_unsupported)?;
    let sources: Vec<Option<&(dyn snapblk_core::ReadAt + Sync)>> = plan
        .partitions()
        .iter()
        .map(|p| {
            old.iter()
                .find(|(n, _)| *n == p.name)
                .map(|(_, img)| img as &(dyn snapblk_core::ReadAt + Sync))
        })
        .collect();
    let checked = plan.check_sources(&sources, threads, None)?;
    let outs: Vec<MemOutput> = plan
        .partitions()
        .iter()
        .map(|_| MemOutput::default())
        .collect();
    let refs: Vec<&dyn Output> = outs.iter().map(|o| o as &dyn Output).collect();
    plan.run(
        &checked,
        &refs,
        &ExtractOptions {
            threads,
            progress: None,
        },
    )?;
    let built = plan
        .partitions()
        .iter()
        .map(|p| p.name.clone())
        .zip(outs.into_iter().map(MemOutput::into_inner))
        .collect();
    Ok((built, plan.skipped().to_vec()))
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
