//! bsdiff patches for the generator: the `bsdiff` crate's patch (Colin Percival's algorithm,
//! suffix array by qsufsort), split into its control, diff and extra streams and packed as
//! BSDIFF40 (three bzip2 streams) or BSDF2 (here three brotli streams); and the XOR blocks
//! update_engine's generator derives from the control stream.

use std::io::{self, Write};

/// How bsdiff operations are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BsdiffFormat {
    /// BROTLI_BSDIFF: a BSDF2 patch with brotli streams (what Android's generator writes from
    /// minor version 4 on).
    #[default]
    Bsdf2,
    /// SOURCE_BSDIFF: a BSDIFF40 patch (bzip2 streams), which older readers such as PyPI
    /// `payload-dumper` (through `bsdiff4`) apply.
    Bsdiff40,
}

/// A bsdiff patch, its three streams apart.
#[derive(Clone, Debug, Default)]
pub(crate) struct Patch {
    /// Control entries: (diff length, extra length, seek of the old position).
    pub(crate) ctrl: Vec<(i64, i64, i64)>,
    /// The diff stream (new − old, bytewise).
    pub(crate) diff: Vec<u8>,
    /// The extra stream (new bytes).
    pub(crate) extra: Vec<u8>,
    /// Length of the new file.
    pub(crate) new_len: u64,
}

/// A bsdiff integer (8 bytes, little-endian magnitude, sign in the top bit).
fn int_in(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    let v = u64::from_le_bytes(a);
    let m = (v & !(1 << 63)) as i64;
    if v >> 63 == 1 { -m } else { m }
}

/// The bsdiff integer encoding of `x`.
pub(crate) fn int_out(x: i64) -> [u8; 8] {
    let m = x.unsigned_abs();
    (if x < 0 { m | 1 << 63 } else { m }).to_le_bytes()
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bsdiff output: {what}"))
}

/// The patch from `old` to `new`.
pub(crate) fn make_patch(old: &[u8], new: &[u8]) -> io::Result<Patch> {
    let mut raw = Vec::new();
    bsdiff::diff(old, new, &mut raw)?;
    // The crate writes, per control entry, the three integers, then that many diff bytes and
    // extra bytes.
    let mut p = Patch {
        new_len: new.len() as u64,
        ..Patch::default()
    };
    let mut at = 0usize;
    while at < raw.len() {
        let head = raw
            .get(at..at + 24)
            .ok_or_else(|| bad("cut control entry"))?;
        let (x, y, z) = (int_in(head), int_in(&head[8..]), int_in(&head[16..]));
        at += 24;
        let (xd, yd) = (
            usize::try_from(x).map_err(|_| bad("negative diff length"))?,
            usize::try_from(y).map_err(|_| bad("negative extra length"))?,
        );
        let d = raw.get(at..at + xd).ok_or_else(|| bad("cut diff bytes"))?;
        p.diff.extend_from_slice(d);
        at += xd;
        let e = raw.get(at..at + yd).ok_or_else(|| bad("cut extra bytes"))?;
        p.extra.extend_from_slice(e);
        at += yd;
        p.ctrl.push((x, y, z));
    }
    Ok(p)
}

fn bzip2(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut w = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
    w.write_all(data)?;
    w.finish()
}

fn brotli(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut v, 1 << 16, 9, 22);
        w.write_all(data)?;
        w.flush()?;
    }
    Ok(v)
}

/// The patch's bytes in `format`.
pub(crate) fn encode(p: &Patch, format: BsdiffFormat) -> io::Result<Vec<u8>> {
    let mut ctrl = Vec::with_capacity(p.ctrl.len() * 24);
    for &(x, y, z) in &p.ctrl {
        ctrl.extend(int_out(x));
        ctrl.extend(int_out(y));
        ctrl.extend(int_out(z));
    }
    let (magic, streams): (&[u8], [Vec<u8>; 3]) = match format {
        BsdiffFormat::Bsdiff40 => (
            b"BSDIFF40",
            [bzip2(&ctrl)?, bzip2(&p.diff)?, bzip2(&p.extra)?],
        ),
        BsdiffFormat::Bsdf2 => (
            b"BSDF2\x02\x02\x02",
            [brotli(&ctrl)?, brotli(&p.diff)?, brotli(&p.extra)?],
        ),
    };
    let mut out = magic.to_vec();
    out.extend(int_out(streams[0].len() as i64));
    out.extend(int_out(streams[1].len() as i64));
    out.extend(int_out(p.new_len as i64));
    for s in streams {
        out.extend(s);
    }
    Ok(out)
}

/// One block a COW_XOR merge operation covers: the new block `dst` (index into the
/// operation's destination blocks) is stored XOR-ed with the old bytes at `src * bs + offset`
/// (`src` an index into the operation's source blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XorBlock {
    pub(crate) dst: u64,
    pub(crate) src: u64,
    pub(crate) offset: u32,
}

/// The XOR blocks of a patch whose old file is `src_blocks` blocks and new file `dst_blocks`
/// blocks, as update_engine's generator derives them: for each control entry whose diff part
/// reads the old file, the new position rounded up to a block, the old position moved as
/// much, and the diff length left rounded half up to whole blocks; blocks whose old bytes
/// (with the next block's when the offset is not zero) or new block lie outside the files are
/// left out. Ascending by `dst`; no `dst` twice.
pub(crate) fn xor_blocks(p: &Patch, bs: u64, src_blocks: u64, dst_blocks: u64) -> Vec<XorBlock> {
    let bs_i = bs as i64;
    let (old_len, mut out) = ((src_blocks * bs) as i64, Vec::new());
    let (mut old_pos, mut new_pos) = (0i64, 0i64);
    for &(diff, extra, seek) in &p.ctrl {
        if diff > 0 && old_pos >= 0 {
            let aligned = (new_pos + bs_i - 1) / bs_i * bs_i;
            let skip = aligned - new_pos;
            if skip < diff {
                let len = diff - skip;
                let n = (len + bs_i / 2) / bs_i;
                for i in 0..n {
                    let dst = aligned / bs_i + i;
                    let src_byte = old_pos + skip + i * bs_i;
                    if dst as u64 >= dst_blocks || src_byte < 0 || src_byte + bs_i > old_len {
                        continue;
                    }
                    if out.last().is_some_and(|l: &XorBlock| l.dst >= dst as u64) {
                        continue;
                    }
                    out.push(XorBlock {
                        dst: dst as u64,
                        src: (src_byte / bs_i) as u64,
                        offset: (src_byte % bs_i) as u32,
                    });
                }
            }
        }
        new_pos = new_pos.saturating_add(diff.saturating_add(extra));
        old_pos = old_pos.saturating_add(diff.saturating_add(seek));
    }
    out
}
