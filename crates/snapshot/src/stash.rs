//! The merge stash (`snapblk merge --stash FILE`): a journal in a separate file that makes a
//! merge of a COW *without a scratch area* crash-safe where the COW alone cannot be.
//!
//! Such a COW can hold XOR ops whose source includes their own destination block (an
//! unaligned XOR that reads two blocks, one of them its target). Merging one in place destroys
//! its source: after a crash between the write and the commit of `num_merge_ops`, a restart
//! would compute the block from the already new data. Android's snapuserd merges them anyway
//! and is not crash-safe for them. With a stash, the merge gives each such op a window of its
//! own and, before it writes the base, saves in the stash the op's new block and the block's old
//! contents, and syncs it. A restart finds the window (the one at `num_merge_ops`) in the stash
//! and writes it from there, never from the overwritten source.
//!
//! Format (little-endian), rewritten whole for each stashed window:
//!
//! | field | bytes |
//! |---|---|
//! | magic `SBLKSTSH` | 8 |
//! | version (1), block size | 4 + 4 |
//! | binding: CRC-32 of the COW's merge order (each op's kind, new block, source and payload place) and its op count | 4 + 4 |
//! | merge index of the stashed op | 8 |
//! | its destination block | 8 |
//! | the destination's old contents | block size |
//! | its new contents | block size |
//! | CRC-32 of every byte before it | 4 |
//!
//! The merge creates the stash (its first 24 bytes) before it writes the base, so a later run
//! can tell "this merge has a stash" from "the stash is gone". A torn or partial stash fails its
//! checksum and counts as empty: it was not synced, so the base was not written either. A stash
//! for another COW is refused, as is one on tmpfs or ramfs (a crash empties them). On a restart
//! the destination must hold, in every 512-byte sector, either its old or its new contents
//! (anything else is another file or another merge: refused). The stash is removed when the
//! merge completes.

use crate::error::{Result, SnapError};
use crate::map::{MapOp, OpKind};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SBLKSTSH";
const VERSION: u32 = 1;
/// Bytes of the header every stash starts with (magic, version, block size, binding).
const HEADER: usize = 8 + 4 + 4 + 4 + 4;
/// Bytes before the two blocks of a stashed op.
const HEAD: usize = HEADER + 8 + 8;

/// One stashed window: the op at merge index `index`, its destination's old and new contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stashed {
    pub(crate) index: usize,
    pub(crate) new_block: u64,
    pub(crate) old: Vec<u8>,
    pub(crate) new: Vec<u8>,
}

/// The stash file of a merge (see the module docs).
#[derive(Debug)]
pub struct Stash {
    path: PathBuf,
    view_verified: bool,
}

impl Stash {
    /// The stash at `path` (created by the merge before it first writes the base).
    pub fn new(path: &Path) -> Stash {
        Stash {
            path: path.to_owned(),
            view_verified: false,
        }
    }

    /// Say that the caller has checked the whole new image the merge will produce (for
    /// example against its SHA-256): a merge whose stash is gone may then resume, since a wrong
    /// block would have failed that check.
    pub fn with_verified_view(mut self) -> Stash {
        self.view_verified = true;
        self
    }

    /// Whether [`Stash::with_verified_view`] was called.
    pub(crate) fn view_verified(&self) -> bool {
        self.view_verified
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn err(&self, what: String) -> SnapError {
        SnapError::Stash {
            path: self.path.clone(),
            what,
        }
    }

    fn io_err(&self, what: &'static str, e: std::io::Error) -> SnapError {
        SnapError::StashIo {
            path: self.path.clone(),
            what,
            source: e,
        }
    }

    /// Whether the stash file exists.
    pub(crate) fn exists(&self) -> Result<bool> {
        match std::fs::symlink_metadata(&self.path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io_err("checking the merge stash", e)),
        }
    }

    /// Refuse a stash that is not a regular file (or absent), or that lives on a file system
    /// whose contents do not survive a crash (tmpfs, ramfs).
    pub(crate) fn check_place(&self) -> Result<()> {
        if let Ok(m) = std::fs::metadata(&self.path)
            && !m.is_file()
        {
            return Err(self.err("is not a regular file".into()));
        }
        let dir = parent(&self.path);
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
            .map_err(|_| self.err("has a NUL byte in its directory's name".into()))?;
        // SAFETY: `c` is a valid NUL-terminated path and `st` a zeroed, properly sized statfs
        // buffer that outlives the call; statfs only writes into it.
        let (rc, st) = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            (libc::statfs(c.as_ptr(), &mut st), st)
        };
        if rc != 0 {
            return Err(self.io_err(
                "checking the file system of the merge stash",
                std::io::Error::last_os_error(),
            ));
        }
        const TMPFS: i64 = 0x0102_1994;
        const RAMFS: i64 = 0x8584_58f6;
        #[allow(clippy::unnecessary_cast)]
        let t = st.f_type as i64;
        if t == TMPFS || t == RAMFS {
            return Err(self.err(
                "is on tmpfs or ramfs, which a crash or reboot empties: the stash must survive one"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The window the stash holds for this merge order, if any. A stash for another COW or
    /// block size, or a file that is not a stash, is an error; one that holds only its header,
    /// or a torn save, is `None`.
    pub(crate) fn load(&self, ops: &[MapOp], block_size: u64) -> Result<Option<Stashed>> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io_err("reading the merge stash", e)),
        };
        let n = bytes.len().min(8);
        if bytes[..n] != MAGIC[..n] {
            return Err(self.err("is not a merge stash (bad magic)".into()));
        }
        let u32_at = |o: usize| {
            bytes
                .get(o..o + 4)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_le_bytes)
        };
        let u64_at = |o: usize| {
            bytes
                .get(o..o + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        };
        let bs = block_size as usize;
        let want = HEAD + 2 * bs + 4;
        if bytes.len() == HEADER {
            // Only the header the merge wrote first: it must be this merge's.
            self.check_binding(
                ops,
                block_size,
                [u32_at(8), u32_at(12), u32_at(16), u32_at(20)],
            )?;
            return Ok(None);
        }
        if bytes.len() != want || crc32fast::hash(&bytes[..want - 4]) != u32_at(want - 4) {
            // A save that never completed: it was not synced, so the base was not written for
            // it either.
            return Ok(None);
        }
        self.check_binding(
            ops,
            block_size,
            [u32_at(8), u32_at(12), u32_at(16), u32_at(20)],
        )?;
        let index = u64_at(HEADER);
        let new_block = u64_at(HEADER + 8);
        let index = usize::try_from(index)
            .ok()
            .filter(|&i| ops.get(i).is_some_and(|o| o.new_block == new_block))
            .ok_or_else(|| {
                self.err(format!(
                    "names op {index} writing block {new_block}, which this COW does not have"
                ))
            })?;
        Ok(Some(Stashed {
            index,
            new_block,
            old: bytes[HEAD..HEAD + bs].to_vec(),
            new: bytes[HEAD + bs..HEAD + 2 * bs].to_vec(),
        }))
    }

    /// `[version, block size, binding CRC, op count]` must be this merge's.
    fn check_binding(&self, ops: &[MapOp], block_size: u64, h: [u32; 4]) -> Result<()> {
        let [version, bs, crc, count] = h;
        if version != VERSION || u64::from(bs) != block_size {
            return Err(self.err(format!(
                "has version {version} and block size {bs}, not {VERSION} and {block_size}"
            )));
        }
        if (crc, count) != binding(ops) {
            return Err(
                self.err("belongs to the merge of another COW (its merge order differs)".into())
            );
        }
        Ok(())
    }

    /// Create the stash holding only its header, synced with its directory, unless it exists.
    pub(crate) fn create(&self, ops: &[MapOp], block_size: u64) -> Result<()> {
        if self.exists()? {
            return Ok(());
        }
        self.write(&header(ops, block_size))
    }

    /// Write `w` and make it durable (file and, when it was created, its directory) before the
    /// merge writes the base.
    pub(crate) fn save(&self, ops: &[MapOp], block_size: u64, w: &Stashed) -> Result<()> {
        let mut b = header(ops, block_size);
        b.extend_from_slice(&(w.index as u64).to_le_bytes());
        b.extend_from_slice(&w.new_block.to_le_bytes());
        b.extend_from_slice(&w.old);
        b.extend_from_slice(&w.new);
        b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
        self.write(&b)
    }

    fn write(&self, b: &[u8]) -> Result<()> {
        let created = !self.exists()?;
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.path)
            .map_err(|e| self.io_err("creating the merge stash", e))?;
        f.write_all_at(b, 0)
            .and_then(|()| f.set_len(b.len() as u64))
            .and_then(|()| f.sync_all())
            .map_err(|e| self.io_err("writing the merge stash", e))?;
        if created {
            sync_dir(&self.path).map_err(|e| self.io_err("syncing the stash's directory", e))?;
        }
        Ok(())
    }

    /// Remove the stash once the merge is complete.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                sync_dir(&self.path).map_err(|e| self.io_err("syncing the stash's directory", e))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.io_err("removing the merge stash", e)),
        }
    }
}

/// Magic, version, block size and binding: the first bytes of every stash.
fn header(ops: &[MapOp], block_size: u64) -> Vec<u8> {
    let (crc, count) = binding(ops);
    let mut b = Vec::with_capacity(HEAD + 2 * block_size as usize + 4);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(block_size as u32).to_le_bytes());
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b
}

fn parent(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

fn sync_dir(p: &Path) -> std::io::Result<()> {
    File::open(parent(p))?.sync_all()
}

/// CRC-32 of the merge order (each op's kind, new block, source, payload offset and length) and
/// the op count.
fn binding(ops: &[MapOp]) -> (u32, u32) {
    let mut h = crc32fast::Hasher::new();
    for op in ops {
        let (tag, src, payload) = match op.kind {
            OpKind::Copy { src } => (1u8, src, None),
            OpKind::Xor { src_byte, payload } => (2, src_byte, Some(payload)),
            OpKind::Replace { payload, .. } => (3, 0, Some(payload)),
            OpKind::Zero => (4, 0, None),
        };
        h.update(&[tag]);
        h.update(&op.new_block.to_le_bytes());
        h.update(&src.to_le_bytes());
        if let Some(p) = payload {
            h.update(&p.offset.to_le_bytes());
            h.update(&p.stored_len.to_le_bytes());
        }
    }
    (h.finalize(), ops.len() as u32)
}

/// Whether `op` reads its own destination block (an XOR whose two-block source includes it):
/// merging it in place destroys its source.
pub(crate) fn reads_own_destination(op: &MapOp, block_size: u64) -> bool {
    let (s, c) = op.source_blocks(block_size).unwrap_or((op.new_block, 0));
    (s..s + c).contains(&op.new_block)
        && !matches!(op.kind, OpKind::Copy { src } if src == op.new_block)
}

/// Whether `cur` (a base block) holds, in every 512-byte sector (what a power cut cannot tear),
/// either `old` or `new`: what an interrupted write of `new` over `old` can leave.
pub(crate) fn old_or_new(cur: &[u8], old: &[u8], new: &[u8]) -> bool {
    cur.len() == old.len()
        && cur.len() == new.len()
        && cur
            .chunks(512)
            .zip(old.chunks(512).zip(new.chunks(512)))
            .all(|(c, (o, n))| c == o || c == n)
}
