//! Applying one operation: the op-type dispatch, the data blob streamed from the payload (hashed
//! as it is read), the decoders, and the destination writer that keeps zero blocks as holes. The
//! operations that read the old partition (SOURCE_COPY, the bsdiff types and PUFFDIFF) are in
//! `delta.rs`; the types no applier exists for yet are [`OpError::Unsupported`].

use std::io::{self, BufRead, Read};

use sha2::{Digest, Sha256};

use crate::error::OpError;
use crate::extract::Output;
use crate::payload::Payload;
use crate::proto::{InstallOperation, OpType};
use snapblk_core::ReadAt;

/// Bytes of the data blob read per `pread`.
pub(crate) const READ_CHUNK: usize = 256 << 10;
/// Bytes of decoded data handed to the destination at a time.
pub(crate) const WRITE_CHUNK: usize = 1 << 20;
/// Memory limit of the xz decoder (a 64 MiB dictionary, xz's largest preset, needs ~65 MiB).
const XZ_MEMLIMIT: u64 = 256 << 20;

/// Whether `extract` (full payloads) applies operations of type `t`: the types that need only
/// the payload (REPLACE*, ZERO, DISCARD).
pub fn extract_supports(t: OpType) -> bool {
    matches!(
        t,
        OpType::Replace
            | OpType::ReplaceBz
            | OpType::ReplaceXz
            | OpType::ReplaceZstd
            | OpType::Zero
            | OpType::Discard
    )
}

/// Whether `apply` (incremental payloads, given the old partitions) applies operations of type
/// `t`: what `extract` applies, SOURCE_COPY, SOURCE_BSDIFF (BSDIFF40 patches), BROTLI_BSDIFF
/// (BSDF2 patches) and PUFFDIFF (puffin patches). ZUCCHINI, LZ4DIFF_* and the major-version-1
/// types are not.
pub fn apply_supports(t: OpType) -> bool {
    extract_supports(t)
        || matches!(
            t,
            OpType::SourceCopy | OpType::SourceBsdiff | OpType::BrotliBsdiff | OpType::Puffdiff
        )
}

/// Whether operations of type `t` read the old partition.
pub(crate) fn reads_source(t: OpType) -> bool {
    !extract_supports(t)
}

/// The type of `op`, or why `apply` cannot apply it.
pub(crate) fn apply_type(op: &InstallOperation) -> Result<OpType, OpError> {
    let t = op.op_type().map_err(OpError::UnknownType)?;
    if !apply_supports(t) {
        return Err(OpError::Unsupported {
            op_type: t,
            what: "apply",
        });
    }
    Ok(t)
}

/// The type of `op`, or why extraction cannot apply it.
pub(crate) fn extract_type(op: &InstallOperation) -> Result<OpType, OpError> {
    let t = op.op_type().map_err(OpError::UnknownType)?;
    if !extract_supports(t) {
        return Err(OpError::Unsupported {
            op_type: t,
            what: "extract (an incremental operation: it needs the old partition)",
        });
    }
    Ok(t)
}

/// Per-worker buffers, reused across operations.
pub(crate) struct Buffers {
    read: Vec<u8>,
    write: Vec<u8>,
}

impl Buffers {
    pub(crate) fn new() -> Buffers {
        Buffers {
            read: vec![0; READ_CHUNK],
            write: vec![0; WRITE_CHUNK],
        }
    }

    /// The write buffer, free between operations.
    pub(crate) fn write_buf(&mut self) -> &mut [u8] {
        &mut self.write
    }
}

/// What applying one operation did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpStats {
    /// The op had no `data_sha256_hash` (its data is covered by the partition hash only).
    pub(crate) unhashed: bool,
    /// The op read the old partition without a `src_sha256_hash` to check it against.
    pub(crate) src_unhashed: bool,
    /// Bytes written to the output (zero blocks are skipped).
    pub(crate) written: u64,
}

/// Apply `op` (already checked by the plan: supported type, blob and extents in bounds) to
/// `out`, a partition of `size` bytes that reads as zeros where nothing was written, reading
/// the old partition `source` (checked against `old_partition_info`) where the type needs it.
pub(crate) fn apply(
    payload: &Payload,
    op: &InstallOperation,
    size: u64,
    out: &dyn Output,
    source: Option<Src<'_>>,
    bufs: &mut Buffers,
) -> Result<OpStats, OpError> {
    let t = op.op_type().map_err(OpError::UnknownType)?;
    let bs = u64::from(payload.block_size());
    let mut dst = ExtentWriter::new(op, bs, size, out);
    let mut blob = Blob {
        payload,
        at: payload.data_start().saturating_add(op.data_offset()),
        left: op.data_length(),
        buf: &mut bufs.read,
        pos: 0,
        filled: 0,
        hash: Sha256::new(),
        failed: None,
    };
    let limit = dst.capacity;
    let mut src_unhashed = false;
    // The old partition, for the types that read it.
    let need = || {
        source.ok_or(OpError::Unsupported {
            op_type: t,
            what: "extract (an incremental operation: it needs the old partition)",
        })
    };
    match t {
        OpType::Zero | OpType::Discard => {}
        OpType::Replace => {
            if blob.left > limit {
                return Err(OpError::TooMuchData { what: "is", limit });
            }
            copy(&mut blob, &mut bufs.write, &mut dst, t, "is")
                .map_err(|e| blob_error(&mut blob.failed, e))?;
        }
        OpType::ReplaceBz => {
            let mut d = bzip2::bufread::BzDecoder::new(&mut blob);
            copy(&mut d, &mut bufs.write, &mut dst, t, "decompresses to")
                .map_err(|e| blob_error(&mut d.get_mut().failed, e))?;
        }
        OpType::ReplaceXz => {
            let stream =
                liblzma::stream::Stream::new_stream_decoder(XZ_MEMLIMIT, 0).map_err(|e| {
                    OpError::Decode {
                        op_type: t,
                        source: e.into(),
                    }
                })?;
            let mut d = liblzma::bufread::XzDecoder::new_stream(&mut blob, stream);
            copy(&mut d, &mut bufs.write, &mut dst, t, "decompresses to")
                .map_err(|e| blob_error(&mut d.get_mut().failed, e))?;
        }
        OpType::ReplaceZstd => {
            let d = zstd::stream::read::Decoder::with_buffer(&mut blob)
                .map_err(|source| OpError::Decode { op_type: t, source })?;
            let mut d = d.single_frame();
            copy(&mut d, &mut bufs.write, &mut dst, t, "decompresses to")
                .map_err(|e| blob_error(&mut d.get_mut().failed, e))?;
        }
        OpType::SourceCopy => {
            let src = need()?;
            src_unhashed = crate::delta::source_copy(op, bs, src, &mut dst, &mut bufs.write)?;
        }
        OpType::SourceBsdiff | OpType::BrotliBsdiff => {
            let src = need()?;
            // The patch is checked against data_sha256_hash and the old bytes against
            // src_sha256_hash before either is used.
            let _mem = crate::delta::reserve(crate::delta::op_memory(op, bs, false));
            let patch = blob.read_all()?;
            check_data_hash(op, blob.hash.clone().finalize().into())?;
            let old;
            (old, src_unhashed) = crate::delta::read_source(op, bs, src)?;
            crate::delta::bspatch(t, &old, &patch, &mut dst, &mut bufs.write)?;
        }
        OpType::Puffdiff => {
            let src = need()?;
            // As for bsdiff: the patch and the old bytes are checked before either is used.
            let _mem = crate::delta::reserve(crate::delta::op_memory(op, bs, true));
            let patch = blob.read_all()?;
            check_data_hash(op, blob.hash.clone().finalize().into())?;
            let old;
            (old, src_unhashed) = crate::delta::read_source(op, bs, src)?;
            crate::delta::puffpatch(&old, &patch, &mut dst, &mut bufs.write)?;
        }
        // The plan refuses every other type.
        other => {
            return Err(OpError::Unsupported {
                op_type: other,
                what: if source.is_some() { "apply" } else { "extract" },
            });
        }
    }
    // Hash the whole blob, whatever the decoder left unread.
    blob.drain()?;
    let unhashed = check_data_hash(op, blob.hash.finalize().into())?;
    Ok(OpStats {
        unhashed,
        src_unhashed,
        written: dst.written_bytes,
    })
}

/// Compare the blob's SHA-256 `found` with `data_sha256_hash`; true when the op has none.
fn check_data_hash(op: &InstallOperation, found: [u8; 32]) -> Result<bool, OpError> {
    match op.data_sha256_hash.as_deref() {
        None => Ok(true),
        Some(want) if want.len() != 32 => Err(OpError::BadHashLength(want.len())),
        Some(want) if want != found => Err(OpError::DataHash {
            expected: crate::hex(want),
            found: crate::hex(&found),
        }),
        Some(_) => Ok(false),
    }
}

/// A decoder's error: the blob's own read error when that is what failed underneath.
fn blob_error(failed: &mut Option<(u64, io::Error)>, e: OpError) -> OpError {
    match (failed.take(), e) {
        (Some((offset, source)), OpError::Decode { .. }) => OpError::Read { offset, source },
        (_, e) => e,
    }
}

/// Read `r` to its end into `dst`, in [`WRITE_CHUNK`] pieces.
fn copy(
    r: &mut dyn Read,
    buf: &mut [u8],
    dst: &mut ExtentWriter<'_>,
    op_type: OpType,
    what: &'static str,
) -> Result<(), OpError> {
    loop {
        // Fill the buffer, so that every piece but the last is whole blocks.
        let mut n = 0;
        while n < buf.len() {
            match r.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(OpError::Decode { op_type, source }),
            }
        }
        if n == 0 {
            return Ok(());
        }
        dst.write(&buf[..n], what)?;
        if n < buf.len() {
            return Ok(());
        }
    }
}

/// The old partition an operation reads: checked against `old_partition_info` (or, without it,
/// long enough for every source extent), `len` bytes long; blocks past `len` read as zeros.
#[derive(Clone, Copy)]
pub(crate) struct Src<'a> {
    pub(crate) image: &'a (dyn ReadAt + Sync),
    pub(crate) len: u64,
}

/// The op's data blob as a buffered reader over the payload: `pread`s of [`READ_CHUNK`],
/// each hashed as it is read.
struct Blob<'a> {
    payload: &'a Payload,
    /// Payload offset of the next read.
    at: u64,
    /// Blob bytes not read yet.
    left: u64,
    buf: &'a mut [u8],
    pos: usize,
    filled: usize,
    hash: Sha256,
    /// The read error, kept whole for the report (the decoder sees a copy of its kind).
    failed: Option<(u64, io::Error)>,
}

impl Blob<'_> {
    /// Read (and hash) the whole blob into memory (a patch; the plan bounds its size).
    fn read_all(&mut self) -> Result<Vec<u8>, OpError> {
        let mut v = crate::delta::alloc(self.left)?;
        loop {
            match self.fill_buf() {
                Ok([]) => return Ok(v),
                Ok(b) => {
                    let n = b.len();
                    v.extend_from_slice(b);
                    self.consume(n);
                }
                Err(_) => return Err(self.read_error()),
            }
        }
    }

    /// The error of the last failed read.
    fn read_error(&mut self) -> OpError {
        let (offset, source) = self
            .failed
            .take()
            .unwrap_or((self.at, io::ErrorKind::Other.into()));
        OpError::Read { offset, source }
    }

    /// Read and hash the rest of the blob.
    fn drain(&mut self) -> Result<(), OpError> {
        loop {
            match self.fill_buf() {
                Ok([]) => return Ok(()),
                Ok(b) => {
                    let n = b.len();
                    self.consume(n);
                }
                Err(_) => return Err(self.read_error()),
            }
        }
    }
}

impl Read for Blob<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let b = self.fill_buf()?;
        let n = b.len().min(out.len());
        out[..n].copy_from_slice(&b[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Blob<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos == self.filled && self.left > 0 {
            let n = (self.buf.len() as u64).min(self.left) as usize;
            let mut got = 0;
            while got < n {
                match self.payload.read_at(self.at, &mut self.buf[got..n]) {
                    Ok(0) => {
                        let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                        self.failed = Some((self.at, e));
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    Ok(k) => {
                        got += k;
                        self.at += k as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let kind = e.kind();
                        self.failed = Some((self.at, e));
                        return Err(kind.into());
                    }
                }
            }
            self.hash.update(&self.buf[..n]);
            self.left -= n as u64;
            self.pos = 0;
            self.filled = n;
        }
        Ok(&self.buf[self.pos..self.filled])
    }
    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.filled);
    }
}

/// Writes a stream of bytes to an op's destination extents, in order, clipped to the partition
/// size, skipping all-zero blocks (the output reads as zeros there already: a sparse file).
pub(crate) struct ExtentWriter<'a> {
    out: &'a dyn Output,
    /// (byte offset, bytes) of each extent, unclipped.
    extents: Vec<(u64, u64)>,
    /// The partition size: bytes past it are dropped.
    size: u64,
    bs: usize,
    /// Current extent and offset in it.
    i: usize,
    off: u64,
    /// Sum of the extents' bytes.
    pub(crate) capacity: u64,
    /// Bytes accepted so far.
    accepted: u64,
    /// Bytes written to the output.
    written_bytes: u64,
}

impl<'a> ExtentWriter<'a> {
    fn new(op: &InstallOperation, bs: u64, size: u64, out: &'a dyn Output) -> ExtentWriter<'a> {
        // The plan checked that every extent ends inside the partition: no overflow here.
        let extents: Vec<(u64, u64)> = op
            .dst_extents
            .iter()
            .map(|e| (e.start_block() * bs, e.num_blocks() * bs))
            .collect();
        let capacity = extents.iter().map(|e| e.1).sum();
        ExtentWriter {
            out,
            extents,
            size,
            bs: bs as usize,
            i: 0,
            off: 0,
            capacity,
            accepted: 0,
            written_bytes: 0,
        }
    }

    /// Write the next `data.len()` bytes of the destination; more than the extents hold is
    /// [`OpError::TooMuchData`] ("data {what} more than ...").
    pub(crate) fn write(&mut self, mut data: &[u8], what: &'static str) -> Result<(), OpError> {
        if self.accepted + data.len() as u64 > self.capacity {
            return Err(OpError::TooMuchData {
                what,
                limit: self.capacity,
            });
        }
        self.accepted += data.len() as u64;
        while !data.is_empty() {
            let (start, len) = self.extents[self.i];
            let n = (len - self.off).min(data.len() as u64) as usize;
            let at = start + self.off;
            // Only what lies inside the partition.
            let keep = self.size.saturating_sub(at).min(n as u64) as usize;
            self.write_nonzero(at, &data[..keep])?;
            self.off += n as u64;
            data = &data[n..];
            if self.off == len {
                self.i += 1;
                self.off = 0;
            }
        }
        Ok(())
    }

    /// Write the runs of `data` (at byte `at`) that are not whole zero blocks.
    fn write_nonzero(&mut self, at: u64, data: &[u8]) -> Result<(), OpError> {
        let mut run: Option<usize> = None;
        let mut i = 0;
        while i < data.len() {
            let j = (i + self.bs).min(data.len());
            let zero = is_zero(&data[i..j]);
            match (zero, run) {
                (true, Some(s)) => {
                    self.put(at + s as u64, &data[s..i])?;
                    run = None;
                }
                (false, None) => run = Some(i),
                _ => {}
            }
            i = j;
        }
        if let Some(s) = run {
            self.put(at + s as u64, &data[s..])?;
        }
        Ok(())
    }

    fn put(&mut self, offset: u64, data: &[u8]) -> Result<(), OpError> {
        self.out
            .write_all_at(offset, data)
            .map_err(|source| OpError::Write { offset, source })?;
        self.written_bytes += data.len() as u64;
        Ok(())
    }
}

/// Whether `b` is all zeros: 64 bytes at a time, each piece OR-ed without a branch per byte
/// (which the compiler turns into vector code; a byte-wise `all` stops it from doing so).
fn is_zero(b: &[u8]) -> bool {
    b.chunks(64).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

#[cfg(test)]
mod tests {
    use super::is_zero;

    #[test]
    fn is_zero_sees_any_nonzero_byte() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 4096]));
        for len in [1, 63, 64, 65, 4096, 4100] {
            for at in [0, len / 2, len - 1] {
                let mut v = vec![0u8; len];
                v[at] = 0x80;
                assert!(!is_zero(&v), "len {len}, byte {at}");
            }
        }
    }
}
