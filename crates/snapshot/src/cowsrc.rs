//! Building a [`Snapshot`] from an Android COW file parsed by snapblk-cow.

use crate::dev::{BlockDev, FileDev, Hold};
use crate::error::{Result, SnapError};
use crate::map::{Codec, MapOp, OpKind, Payload, SnapshotMap};
use crate::snapshot::{CowLayout, Decoder, Snapshot, SnapshotConfig, SnapshotParts};
use snapblk_core::read_error;
use snapblk_cow::{Compression, CowReader, DuplicatePolicy, OpenOptions, ReadAt};
use std::path::Path;
use std::sync::Arc;

/// Payload decoding through snapblk-cow's codecs.
pub struct CowDecoder;

fn compression(c: Codec) -> Compression {
    match c {
        Codec::None => Compression::None,
        Codec::Gz => Compression::Gz,
        Codec::Brotli => Compression::Brotli,
        Codec::Lz4 => Compression::Lz4,
        Codec::Zstd => Compression::Zstd,
    }
}

fn codec(c: Compression) -> Codec {
    match c {
        Compression::None => Codec::None,
        Compression::Gz => Codec::Gz,
        Compression::Brotli => Codec::Brotli,
        Compression::Lz4 => Codec::Lz4,
        Compression::Zstd => Codec::Zstd,
    }
}

impl Decoder for CowDecoder {
    fn decode(
        &self,
        c: Codec,
        src: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), snapblk_cow::DecodeError> {
        snapblk_cow::decompress(compression(c), src, out)
    }
}

fn payload(p: &snapblk_cow::Payload, bs: u32) -> Payload {
    Payload {
        offset: p.offset,
        stored_len: p.len,
        codec: codec(p.codec),
        unit_len: p.unit_blocks.max(1) * bs,
    }
}

/// Parse a COW (first-wins duplicates, as snapuserd boots) and build the block map in merge
/// order plus the merge-state layout. `capacity` is the device size in bytes.
pub(crate) fn load<R: ReadAt>(
    src: R,
    capacity: u64,
) -> Result<(SnapshotMap, CowLayout, CowReader<R>)> {
    // Parsed without bounds, so a base shorter than the COW's blocks is reported as a base
    // problem (naming both sizes) rather than as an invalid COW; the map checks them again.
    // Parsed before the size check, so a file that is no COW at all (arguments swapped) is
    // reported as such, not as a block size of 0.
    let opts = OpenOptions {
        device_blocks: None,
        base_blocks: None,
        label: None,
        duplicates: DuplicatePolicy::FirstWins,
    };
    let cow = CowReader::open_with(src, opts)?;
    let bs = cow.block_size();
    if bs == 0 || !capacity.is_multiple_of(u64::from(bs)) {
        return Err(SnapError::Format(format!(
            "device size {capacity} is not a multiple of the COW block size {bs}"
        )));
    }
    let blocks = capacity / u64::from(bs);
    check_extent(&cow, blocks)?;
    let mut ops = Vec::with_capacity(cow.merge_len() as usize);
    for op in cow.merge_order() {
        let rank = u32::try_from(op.index)
            .map_err(|_| SnapError::Format("op index beyond 2^32".into()))?;
        let kind = match op.kind {
            snapblk_cow::OpKind::Copy { source_block } => OpKind::Copy { src: source_block },
            snapblk_cow::OpKind::Xor {
                source_offset,
                payload: p,
            } => OpKind::Xor {
                src_byte: source_offset,
                payload: payload(&p, bs),
            },
            snapblk_cow::OpKind::Replace { payload: p } => OpKind::Replace {
                payload: payload(&p, bs),
                blocks: p.unit_blocks.max(1),
            },
            snapblk_cow::OpKind::Zero => OpKind::Zero,
            _ => continue,
        };
        ops.push(MapOp {
            new_block: op.new_block,
            file_rank: rank,
            kind,
        });
    }
    let h = cow.header();
    let layout = CowLayout {
        block_size: bs,
        header_size: h.header_size as u32,
        scratch_size: h.buffer_size,
        data_end: cow.data_end(),
    };
    let map = SnapshotMap::new(bs, capacity, ops)?;
    Ok((map, layout, cow))
}

/// The highest blocks the COW's ops write and read, past `blocks` (the device size): a base too
/// short for the blocks the COW reads (truncated, empty, the wrong file), or a new image larger
/// than the base (only writes past its end). The errors name "the base"; [`open_files`] puts the
/// path in.
fn check_extent<R: ReadAt>(cow: &CowReader<R>, blocks: u64) -> Result<()> {
    let bs = u64::from(cow.block_size());
    let (mut write_end, mut read_end) = (0u64, 0u64);
    for op in cow.merge_order() {
        let n = match op.kind {
            snapblk_cow::OpKind::Replace { payload } => u64::from(payload.unit_blocks.max(1)),
            snapblk_cow::OpKind::Copy { .. }
            | snapblk_cow::OpKind::Xor { .. }
            | snapblk_cow::OpKind::Zero => 1,
            _ => continue,
        };
        write_end = write_end.max(op.new_block.saturating_add(n));
        if let Some((s, c)) = op.source_blocks(bs) {
            read_end = read_end.max(s.saturating_add(c));
        }
    }
    if write_end <= blocks && read_end <= blocks {
        return Ok(());
    }
    let size = blocks * bs;
    let last = write_end.max(read_end) - 1;
    let needed = last.saturating_add(1).saturating_mul(bs);
    if read_end > blocks {
        return Err(SnapError::BaseTooShort {
            base: "the base".into(),
            size,
            block: last,
            needed,
        });
    }
    Err(SnapError::BaseSmallerThanNewImage {
        base: "the base".into(),
        size,
        block: last,
        needed,
        how: "grow the device or file first".into(),
    })
}

/// Put the base's path (and, for a regular file, the command that grows it) into a base error.
fn name_base(e: SnapError, path: &Path, actual: u64) -> SnapError {
    let name = format!("base {}", path.display());
    match e {
        SnapError::BaseTooShort { block, needed, .. } => SnapError::BaseTooShort {
            base: name,
            size: actual,
            block,
            needed,
        },
        SnapError::BaseSmallerThanNewImage {
            block, needed, how, ..
        } => {
            let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
            let how = if regular {
                format!("truncate -s {needed} {}", path.display())
            } else {
                format!("{how}; snapblk never grows a block device")
            };
            SnapError::BaseSmallerThanNewImage {
                base: name,
                size: actual,
                block,
                needed,
                how,
            }
        }
        e => e,
    }
}

/// How to open the backing files.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenMode {
    /// Open the base read-write (needed to merge).
    pub base_writable: bool,
    /// Open the COW read-write (needed to merge and for the writable overlay).
    pub cow_writable: bool,
}

/// Open a snapshot of `base` + `cow` files. The device size is the base size (rounded down to
/// the block size), as the COW does not record it.
///
/// Each file is held (a BSD `flock`) for as long as the snapshot is open: shared when it is only
/// read, exclusive when it is written (the base by a merge, the COW by a merge or the writable
/// overlay). So a `snapblk merge` refuses to start under a running `snapblk serve` of the same
/// files, which would otherwise go on serving blocks the merge has overwritten, and the
/// other way round; read-only servers of one snapshot run side by side. A conflict fails at
/// once with EBUSY.
pub fn open_files(
    base: &Path,
    cow: &Path,
    cfg: SnapshotConfig,
    mode: OpenMode,
) -> Result<Snapshot> {
    open_files_sized(base, cow, cfg, mode, None)
}

/// [`open_files`] with the size of the new image when it is known (from the COW record) and no
/// larger than the base: a shrinking update's device is exactly the new image.
pub fn open_files_sized(
    base: &Path,
    cow: &Path,
    cfg: SnapshotConfig,
    mode: OpenMode,
    size: Option<u64>,
) -> Result<Snapshot> {
    for (what, p) in [("base", base), ("COW", cow)] {
        if std::fs::metadata(p).is_ok_and(|m| m.is_dir()) {
            return Err(SnapError::IsDirectory {
                what,
                path: p.to_owned(),
            });
        }
    }
    let hold = |writes| {
        if writes {
            Hold::Exclusive
        } else {
            Hold::Shared
        }
    };
    let base_dev = FileDev::open_held(base, mode.base_writable, hold(mode.base_writable))
        .map_err(SnapError::io("opening base"))?;
    let cow_writes = mode.cow_writable || cfg.writable;
    let cow_dev = FileDev::open_held(cow, cow_writes, hold(cow_writes))
        .map_err(SnapError::io("opening COW"))?;
    let base_len = base_dev.size().map_err(SnapError::io("sizing base"))?;
    open_devs_sized(Arc::new(base_dev), Arc::new(cow_dev), cfg, size)
        .map_err(|e| name_base(e, base, base_len))
}

/// Open a snapshot whose base is a device (a nested device spec's, [`crate::DeviceOpener`], or
/// a [`crate::BlkioDev`] a caller opened) and whose COW is the file `cow`, held as
/// [`open_files_sized`] holds it; `size` as there. The base is shared with other users the way
/// its driver allows (the `rbd` driver's image lock: exclusive when opened writable);
/// `mode.base_writable` only says the caller opened it for writing.
pub fn open_dev_base(
    base: Arc<dyn BlockDev>,
    cow: &Path,
    cfg: SnapshotConfig,
    mode: OpenMode,
    size: Option<u64>,
) -> Result<Snapshot> {
    if std::fs::metadata(cow).is_ok_and(|m| m.is_dir()) {
        return Err(SnapError::IsDirectory {
            what: "COW",
            path: cow.to_owned(),
        });
    }
    let cow_writes = mode.cow_writable || cfg.writable;
    let hold = if cow_writes {
        Hold::Exclusive
    } else {
        Hold::Shared
    };
    let cow_dev =
        FileDev::open_held(cow, cow_writes, hold).map_err(SnapError::io("opening COW"))?;
    open_devs_sized(base, Arc::new(cow_dev), cfg, size)
}

/// Open a snapshot over arbitrary devices.
pub fn open_devs(
    base: Arc<dyn BlockDev>,
    cow: Arc<dyn BlockDev>,
    cfg: SnapshotConfig,
) -> Result<Snapshot> {
    open_devs_sized(base, cow, cfg, None)
}

/// [`open_devs`] with a known new-image size (see [`open_files_sized`]).
pub(crate) fn open_devs_sized(
    base: Arc<dyn BlockDev>,
    cow: Arc<dyn BlockDev>,
    cfg: SnapshotConfig,
    size: Option<u64>,
) -> Result<Snapshot> {
    let base_len = base.size().map_err(SnapError::io("sizing base"))?;
    let probe_bs = {
        let mut h = [0u8; 22];
        cow.read_exact_at(0, &mut h)
            .map_err(|e| SnapError::io("reading COW header")(read_error(0, e)))?;
        u32::from_le_bytes([h[18], h[19], h[20], h[21]]).max(1) as u64
    };
    let capacity = base_len / probe_bs * probe_bs;
    let (map, layout, _) = load(cow.clone(), capacity)?;
    let snap = Snapshot::open(SnapshotParts {
        base,
        cow,
        map,
        layout,
        decoder: Arc::new(CowDecoder),
        config: cfg,
    })?;
    // The map keeps the base's size (COPY/XOR sources may lie past the new end); the device is
    // the new image's.
    if let Some(n) = size.filter(|&n| n < capacity && n.is_multiple_of(probe_bs)) {
        snap.limit_capacity(n)?;
    }
    Ok(snap)
}
