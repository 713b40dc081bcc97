//! On-disk structures: header, op records, footer, resume points, scratch layout.
//!
//! All integers are little-endian and structures are byte-packed (see the format spec).

use crate::codec::Compression;
use crate::error::{CowError, Result};

/// File magic (`"!!WOcwoC"` on disk).
pub(crate) const MAGIC: u64 = 0x436f_7763_4f57_2121;
/// Size of the version-independent header prefix.
pub(crate) const PREFIX_SIZE: usize = 14;
/// v1 header size.
pub(crate) const HEADER_V1_SIZE: u16 = 34;
/// v2 header size.
pub(crate) const HEADER_V2_SIZE: u16 = 38;
/// v3 header size (also the largest header any reader accepts).
pub(crate) const HEADER_V3_SIZE: u16 = 78;
/// v1/v2 op record size.
pub(crate) const OP_V2_SIZE: u16 = 20;
/// v3 op record size.
pub(crate) const OP_V3_SIZE: u16 = 16;
/// v2 footer: one op-shaped record plus 64 reserved (zero) bytes.
pub(crate) const FOOTER_V2_SIZE: u16 = 84;
/// v3 resume point size (`u64 label, u64 op_index`).
pub(crate) const RESUME_POINT_SIZE: u64 = 16;
/// Default number of v3 resume slots.
pub(crate) const RESUME_POINT_MAX: u32 = 4;
/// Default scratch (read-ahead) area size on devices.
pub const DEFAULT_SCRATCH_SIZE: u32 = 2 * 1024 * 1024;
/// Byte offset of `num_merge_ops` (u64) in every header version. The merge updates it in place.
pub const NUM_MERGE_OPS_OFFSET: u64 = 26;
/// Largest v3 unit (`block_size << 6` at 4 KiB, AOSP's limit of 256 KiB).
pub(crate) const MAX_UNIT_BYTES: u64 = 256 * 1024;
/// Largest v3 compression-bits value.
pub(crate) const MAX_COMPRESSION_BITS: u8 = 6;

/// Op type codes: byte 0 of a v2 record, bits 60..63 of a v3 record's `source_info` (format
/// §4.3). The names in each item are libsnapshot's constants.
pub(crate) mod op_type {
    /// `kCowCopyOp`: the new block is base block `source`. No payload.
    pub(crate) const COPY: u8 = 1;
    /// `kCowReplaceOp`: the new block (v3: the `2^compression bits` blocks from it) is the
    /// decoded payload; `source` is the payload's absolute file offset.
    pub(crate) const REPLACE: u8 = 2;
    /// `kCowZeroOp`: the new block is all zeros. No payload; `source` is 0.
    pub(crate) const ZERO: u8 = 3;
    /// `kCowLabelOp` (v2 only): a metadata record marking a point a writer can resume from;
    /// `source` is the label value. v3 keeps labels as resume points instead.
    pub(crate) const LABEL: u8 = 4;
    /// `kCowClusterOp` (clustered v2 only): closes a cluster; `source` is the number of bytes
    /// from the end of this record to the next cluster.
    pub(crate) const CLUSTER: u8 = 5;
    /// `kCowXorOp`: the new block is the decoded payload XOR `block_size` base bytes starting
    /// at byte offset `source` (any alignment). The payload position is not stored.
    pub(crate) const XOR: u8 = 6;
    /// `kCowSequenceOp` (v2 only): the payload at file offset `source` is an array of u32 new
    /// blocks giving the merge order of the COPY/XOR ops; these ops precede every data op.
    pub(crate) const SEQUENCE: u8 = 7;
    /// `kCowFooterOp` (v2 only): the end-of-stream record, [`FOOTER_V2_SIZE`](super::FOOTER_V2_SIZE)
    /// bytes with its trailer.
    pub(crate) const FOOTER: u8 = 255;
}

/// Parsed COW header (all versions; v3-only fields are zero for v1/v2).
///
/// Fields are in on-disk order, little-endian and byte-packed after the 8-byte magic; each
/// names its byte offset in the file (format §3).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// `major_version` (offset 8): 1, 2 or 3.
    pub major: u16,
    /// `minor_version` (offset 10): always 0.
    pub minor: u16,
    /// Size of the header in bytes (offset 12): 34 for v1 (38 also accepted), 38 for v2, 78
    /// for v3. The scratch area follows it.
    pub header_size: u16,
    /// Size of the footer in bytes (offset 14): 84 for v1/v2, 0 for v3, which has none.
    pub footer_size: u16,
    /// Size of one op record in bytes (offset 16): 20 for v1/v2, 16 for v3.
    pub op_size: u16,
    /// Block size in bytes (offset 18): a power of two in 512..=32768 here; 4096 in every
    /// file Android writes, and the only size snapuserd serves.
    pub block_size: u32,
    /// v2 op records per cluster (offset 22): 0 for an unclustered stream (each record
    /// followed by its payload), otherwise at least 2 (AOSP's default is 1024). Always 0 in
    /// v3.
    pub cluster_ops: u32,
    /// Merge progress (offset 26): number of merge-order entries already merged into the base;
    /// 0 when written, then updated in place by the merge.
    pub num_merge_ops: u64,
    /// Size in bytes of the scratch area (offset 34, v2/v3; 0 for v1), which starts at
    /// `header_size`: 2 MiB ([`DEFAULT_SCRATCH_SIZE`]) on devices, 0 for none.
    pub buffer_size: u32,
    /// v3 (offset 38): number of u32 entries in the sequence area, the merge order of the
    /// COPY/XOR ops; 0 when the file has no sequence.
    pub sequence_data_count: u64,
    /// v3 (offset 46): number of labels written. libsnapshot never lowers it when it evicts
    /// a resume point, so it can exceed `resume_point_max`; only
    /// `min(resume_point_count, resume_point_max)` points are valid.
    pub resume_point_count: u32,
    /// v3 (offset 50): number of 16-byte resume-point slots reserved after the sequence area
    /// (4 in files AOSP writes).
    pub resume_point_max: u32,
    /// v3 (offset 54): number of valid records at the start of the op array.
    pub op_count: u64,
    /// v3 (offset 62): number of 16-byte op slots reserved when the file was created;
    /// payloads start after them. AOSP usually sizes it to the device's block count.
    pub op_count_max: u64,
    /// v3 (offset 70): the file-wide [`Compression`] id (0..=4) of every payload.
    pub compression_algorithm: u32,
    /// v3 (offset 74): the largest unit a REPLACE payload decodes to, in bytes: a power of two
    /// from `block_size` to 256 KiB.
    pub max_compression_size: u32,
}

fn le_u16(b: &[u8], o: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[o..o + 2]);
    u16::from_le_bytes(a)
}
fn le_u32(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}
fn le_u64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

fn bad(field: &'static str, value: u64, reason: &'static str) -> CowError {
    CowError::BadHeader {
        field,
        value,
        reason,
    }
}

impl Header {
    /// A v2 header as AOSP's writer emits it.
    pub fn new_v2(block_size: u32, cluster_ops: u32, buffer_size: u32) -> Self {
        Header {
            major: 2,
            minor: 0,
            header_size: HEADER_V2_SIZE,
            footer_size: FOOTER_V2_SIZE,
            op_size: OP_V2_SIZE,
            block_size,
            cluster_ops,
            num_merge_ops: 0,
            buffer_size,
            sequence_data_count: 0,
            resume_point_count: 0,
            resume_point_max: 0,
            op_count: 0,
            op_count_max: 0,
            compression_algorithm: 0,
            max_compression_size: 0,
        }
    }

    /// A v3 header as AOSP's writer emits it (counts filled in as the file is written).
    pub(crate) fn new_v3(
        block_size: u32,
        buffer_size: u32,
        op_count_max: u64,
        compression: Compression,
        max_compression_size: u32,
    ) -> Self {
        Header {
            major: 3,
            minor: 0,
            header_size: HEADER_V3_SIZE,
            footer_size: 0,
            op_size: OP_V3_SIZE,
            block_size,
            cluster_ops: 0,
            num_merge_ops: 0,
            buffer_size,
            sequence_data_count: 0,
            resume_point_count: 0,
            resume_point_max: RESUME_POINT_MAX,
            op_count: 0,
            op_count_max,
            compression_algorithm: compression.id() as u32,
            max_compression_size,
        }
    }

    /// Parse and validate a header. `raw` must hold at least `header_size` bytes (fields beyond
    /// `header_size` are treated as zero, as AOSP does).
    pub fn parse(raw: &[u8]) -> Result<Header> {
        if raw.len() < PREFIX_SIZE {
            return Err(CowError::Truncated {
                what: "header prefix",
                offset: 0,
                need: PREFIX_SIZE as u64,
                len: raw.len() as u64,
            });
        }
        let magic = le_u64(raw, 0);
        if magic != MAGIC {
            return Err(CowError::BadMagic { found: magic });
        }
        let major = le_u16(raw, 8);
        let minor = le_u16(raw, 10);
        let header_size = le_u16(raw, 12);
        if !(1..=3).contains(&major) || minor != 0 {
            return Err(CowError::UnsupportedVersion { major, minor });
        }
        let ok_size = match major {
            1 => header_size == HEADER_V1_SIZE || header_size == HEADER_V2_SIZE,
            2 => header_size == HEADER_V2_SIZE,
            _ => header_size == HEADER_V3_SIZE,
        };
        if !ok_size {
            return Err(bad(
                "header_size",
                header_size.into(),
                "does not match the version",
            ));
        }
        if raw.len() < header_size as usize {
            return Err(CowError::Truncated {
                what: "header",
                offset: 0,
                need: header_size.into(),
                len: raw.len() as u64,
            });
        }
        let mut b = [0u8; HEADER_V3_SIZE as usize];
        b[..header_size as usize].copy_from_slice(&raw[..header_size as usize]);
        let h = Header {
            major,
            minor,
            header_size,
            footer_size: le_u16(&b, 14),
            op_size: le_u16(&b, 16),
            block_size: le_u32(&b, 18),
            cluster_ops: le_u32(&b, 22),
            num_merge_ops: le_u64(&b, 26),
            buffer_size: if major == 1 { 0 } else { le_u32(&b, 34) },
            sequence_data_count: le_u64(&b, 38),
            resume_point_count: le_u32(&b, 46),
            resume_point_max: le_u32(&b, 50),
            op_count: le_u64(&b, 54),
            op_count_max: le_u64(&b, 62),
            compression_algorithm: le_u32(&b, 70),
            max_compression_size: le_u32(&b, 74),
        };
        h.validate()?;
        Ok(h)
    }

    fn validate(&self) -> Result<()> {
        let bs = self.block_size;
        if !(512..=32768).contains(&bs) || !bs.is_power_of_two() {
            return Err(bad(
                "block_size",
                bs.into(),
                "must be a power of two in 512..=32768",
            ));
        }
        if self.major <= 2 {
            if self.footer_size != FOOTER_V2_SIZE {
                return Err(bad(
                    "footer_size",
                    self.footer_size.into(),
                    "v2 requires 84",
                ));
            }
            if self.op_size != OP_V2_SIZE {
                return Err(bad("op_size", self.op_size.into(), "v2 requires 20"));
            }
            if self.cluster_ops == 1 {
                return Err(bad("cluster_ops", 1, "must be 0 or at least 2"));
            }
        } else {
            if self.footer_size != 0 {
                return Err(bad("footer_size", self.footer_size.into(), "v3 requires 0"));
            }
            if self.op_size != OP_V3_SIZE {
                return Err(bad("op_size", self.op_size.into(), "v3 requires 16"));
            }
            if self.cluster_ops != 0 {
                return Err(bad("cluster_ops", self.cluster_ops.into(), "v3 requires 0"));
            }
            if Compression::from_id(self.compression_algorithm.into()).is_none() {
                return Err(bad(
                    "compression_algorithm",
                    self.compression_algorithm.into(),
                    "unknown algorithm",
                ));
            }
            let m = self.max_compression_size;
            if !m.is_power_of_two() || m < bs || u64::from(m) > MAX_UNIT_BYTES.max(bs.into()) {
                return Err(bad(
                    "max_compression_size",
                    m.into(),
                    "must be a power of two between block_size and 256 KiB",
                ));
            }
            if self.op_count > self.op_count_max {
                return Err(bad("op_count", self.op_count, "exceeds op_count_max"));
            }
        }
        Ok(())
    }

    /// Encode the header (exactly `header_size` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_V3_SIZE as usize);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&self.major.to_le_bytes());
        b.extend_from_slice(&self.minor.to_le_bytes());
        b.extend_from_slice(&self.header_size.to_le_bytes());
        b.extend_from_slice(&self.footer_size.to_le_bytes());
        b.extend_from_slice(&self.op_size.to_le_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.cluster_ops.to_le_bytes());
        b.extend_from_slice(&self.num_merge_ops.to_le_bytes());
        b.extend_from_slice(&self.buffer_size.to_le_bytes());
        b.extend_from_slice(&self.sequence_data_count.to_le_bytes());
        b.extend_from_slice(&self.resume_point_count.to_le_bytes());
        b.extend_from_slice(&self.resume_point_max.to_le_bytes());
        b.extend_from_slice(&self.op_count.to_le_bytes());
        b.extend_from_slice(&self.op_count_max.to_le_bytes());
        b.extend_from_slice(&self.compression_algorithm.to_le_bytes());
        b.extend_from_slice(&self.max_compression_size.to_le_bytes());
        b.truncate(self.header_size as usize);
        b
    }

    /// Where op records (v2) / the sequence area (v3) begin: after header and scratch.
    pub fn ops_start(&self) -> u64 {
        if self.major >= 2 && self.buffer_size > 0 {
            u64::from(self.header_size) + u64::from(self.buffer_size)
        } else {
            u64::from(self.header_size)
        }
    }

    /// Scratch area location, if the file has one.
    pub fn scratch(&self) -> Option<ScratchLayout> {
        (self.major >= 2 && self.buffer_size > 0).then(|| ScratchLayout {
            offset: self.header_size.into(),
            size: self.buffer_size.into(),
            block_size: self.block_size.into(),
        })
    }

    /// v3: offset of the sequence area.
    pub(crate) fn v3_sequence_offset(&self) -> u64 {
        self.ops_start()
    }
    /// v3: offset of the resume-point area.
    pub(crate) fn v3_resume_offset(&self) -> u64 {
        self.ops_start()
            .saturating_add(self.sequence_data_count.saturating_mul(4))
    }
    /// v3: offset of the op array.
    pub fn v3_op_offset(&self) -> u64 {
        self.v3_resume_offset()
            .saturating_add(u64::from(self.resume_point_max).saturating_mul(RESUME_POINT_SIZE))
    }
    /// v3: offset of the payload area.
    pub fn v3_data_offset(&self) -> u64 {
        self.v3_op_offset()
            .saturating_add(self.op_count_max.saturating_mul(OP_V3_SIZE.into()))
    }
}

/// The scratch ("read-ahead") area used by an in-place merge of ordered ops (format §10.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ScratchLayout {
    /// Absolute file offset (= header_size).
    pub offset: u64,
    /// Size in bytes (= buffer_size).
    pub size: u64,
    /// The file's block size in bytes: the size of each staged data block.
    pub block_size: u64,
}

impl ScratchLayout {
    /// Offset of the read-ahead state byte.
    pub fn state_offset(&self) -> u64 {
        self.offset
    }
    /// Offset of the metadata entries (`{u64 new_block, u64 file_offset}`, zero-terminated).
    pub fn metadata_offset(&self) -> u64 {
        self.offset + 1
    }
    /// Offset of the staged data blocks.
    pub fn data_offset(&self) -> u64 {
        self.offset + 8192
    }
    /// Number of data blocks per window (510 for a 2 MiB area at 4 KiB).
    pub fn window_blocks(&self) -> u64 {
        // metadata capacity is size*16/block_size bytes; one 16-byte entry per block, minus the
        // terminator, and the data region must also hold them.
        // snapuserd maps only 2 MiB of scratch whatever `buffer_size` says (format §10), so a
        // larger (or hostile) size does not make windows larger.
        let size = self.size.min(DEFAULT_SCRATCH_SIZE.into());
        let meta_cap = size.saturating_mul(16) / self.block_size.max(1) / 16;
        let data_cap = size.saturating_sub(8192) / self.block_size.max(1);
        meta_cap.saturating_sub(2).min(data_cap)
    }
}

/// Encode a v2 op record (format §4.1): `op_type` is one of [`op_type`](mod@op_type),
/// `compression` a [`Compression`] id (0 for ops without payload), `data_length` the payload's
/// stored bytes, `new_block` and `source` as the type defines them.
pub(crate) fn encode_op_v2(
    op_type: u8,
    compression: u8,
    data_length: u16,
    new_block: u64,
    source: u64,
) -> [u8; 20] {
    let mut r = [0u8; 20];
    r[0] = op_type;
    r[1] = compression;
    r[2..4].copy_from_slice(&data_length.to_le_bytes());
    r[4..12].copy_from_slice(&new_block.to_le_bytes());
    r[12..20].copy_from_slice(&source.to_le_bytes());
    r
}

/// Raw fields of a v2 record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawOpV2 {
    pub op_type: u8,
    pub compression: u8,
    pub data_length: u16,
    pub new_block: u64,
    pub source: u64,
}

/// Decode a v2 record.
pub(crate) fn decode_op_v2(r: &[u8; 20]) -> RawOpV2 {
    RawOpV2 {
        op_type: r[0],
        compression: r[1],
        data_length: le_u16(r, 2),
        new_block: le_u64(r, 4),
        source: le_u64(r, 12),
    }
}

/// Raw fields of a v3 record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawOpV3 {
    pub data_length: u32,
    pub new_block: u32,
    pub source_info: u64,
}

impl RawOpV3 {
    /// Op type (bits 60..63).
    pub(crate) fn op_type(&self) -> u8 {
        (self.source_info >> 60) as u8
    }
    /// Compression bits (57..59).
    pub(crate) fn compression_bits(&self) -> u8 {
        ((self.source_info >> 57) & 7) as u8
    }
    /// Source value (bits 0..47).
    pub(crate) fn source(&self) -> u64 {
        self.source_info & SOURCE_MASK
    }
    /// Unused bits 48..56.
    pub(crate) fn reserved_bits(&self) -> u64 {
        (self.source_info >> 48) & 0x1ff
    }
}

/// Mask of the 48-bit source field.
pub(crate) const SOURCE_MASK: u64 = (1 << 48) - 1;

/// Encode a v3 record (format §4.2): `compression_bits` (0..=6, only REPLACE uses more than
/// 0) and `op_type` are packed above the 48-bit `source` into `source_info`.
pub(crate) fn encode_op_v3(
    op_type: u8,
    compression_bits: u8,
    data_length: u32,
    new_block: u32,
    source: u64,
) -> [u8; 16] {
    let info = (u64::from(op_type) << 60)
        | (u64::from(compression_bits & 7) << 57)
        | (source & SOURCE_MASK);
    let mut r = [0u8; 16];
    r[0..4].copy_from_slice(&data_length.to_le_bytes());
    r[4..8].copy_from_slice(&new_block.to_le_bytes());
    r[8..16].copy_from_slice(&info.to_le_bytes());
    r
}

/// Decode a v3 record.
pub(crate) fn decode_op_v3(r: &[u8; 16]) -> RawOpV3 {
    RawOpV3 {
        data_length: le_u32(r, 0),
        new_block: le_u32(r, 4),
        source_info: le_u64(r, 8),
    }
}

/// Encode the 84-byte v2 footer.
pub(crate) fn encode_footer_v2(num_ops: u64) -> [u8; 84] {
    let mut f = [0u8; 84];
    f[..20].copy_from_slice(&encode_op_v2(op_type::FOOTER, 0, 64, num_ops * 20, num_ops));
    f
}

/// Encode a v3 resume point.
pub(crate) fn encode_resume_point(label: u64, op_index: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&label.to_le_bytes());
    r[8..].copy_from_slice(&op_index.to_le_bytes());
    r
}

/// Decode a v3 resume point into `(label, op_index)`.
pub(crate) fn decode_resume_point(r: &[u8; 16]) -> (u64, u64) {
    (le_u64(r, 0), le_u64(r, 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_source_info_examples_from_spec() {
        let r = encode_op_v3(op_type::COPY, 0, 0, 0, 5);
        assert_eq!(decode_op_v3(&r).source_info, 0x1000000000000005);
        let r = encode_op_v3(op_type::REPLACE, 0, 4096, 3, 270);
        assert_eq!(decode_op_v3(&r).source_info, 0x200000000000010e);
        let r = encode_op_v3(op_type::ZERO, 0, 0, 1, 0);
        assert_eq!(decode_op_v3(&r).source_info, 0x3000000000000000);
    }

    #[test]
    fn header_roundtrip() {
        for h in [
            Header::new_v2(4096, 1024, DEFAULT_SCRATCH_SIZE),
            Header::new_v3(4096, 0, 8, Compression::Zstd, 65536),
        ] {
            let b = h.encode();
            assert_eq!(b.len(), h.header_size as usize);
            assert_eq!(Header::parse(&b).unwrap(), h);
        }
    }

    #[test]
    fn scratch_window_is_510_blocks() {
        let h = Header::new_v2(4096, 1024, DEFAULT_SCRATCH_SIZE);
        let s = h.scratch().unwrap();
        assert_eq!(s.window_blocks(), 510);
        assert_eq!(s.data_offset(), 38 + 8192);
        // A hostile buffer_size does not grow the window past Android's.
        let h = Header::new_v2(4096, 1024, u32::MAX);
        assert_eq!(h.scratch().unwrap().window_blocks(), 510);
    }
}
