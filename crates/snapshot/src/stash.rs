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
//! | binding: CRC-32 of the COW's merge order (each op's kind, new block and source) and its op count | 4 + 4 |
//! | merge index of the stashed op | 8 |
//! | its destination block | 8 |
//! | the destination's old contents | block size |
//! | its new contents | block size |
//! | CRC-32 of every byte before it | 4 |
//!
//! A torn or partial stash fails its checksum and counts as empty: it was not synced, so the
//! base was not written either. A stash for another COW is refused. On a restart the
//! destination must hold either its old or its new contents (anything else is another file or
//! another merge: refused). The stash is removed when the merge completes.

use crate::error::{Result, SnapError};
use crate::map::{MapOp, OpKind};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"SBLKSTSH";
const VERSION: u32 = 1;
/// Bytes before the two blocks.
const HEAD: usize = 8 + 4 + 4 + 4 + 4 + 8 + 8;

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
}

impl Stash {
    /// The stash at `path` (created when the merge first needs it).
    pub fn new(path: &Path) -> Stash {
        Stash {
            path: path.to_owned(),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, what: String) -> SnapError {
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

    /// The window the stash holds for this merge order, if any. A stash for another COW or
    /// block size is an error; a torn or empty one is `None`.
    pub(crate) fn load(&self, ops: &[MapOp], block_size: u64) -> Result<Option<Stashed>> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io_err("reading the merge stash", e)),
        };
        let bs = block_size as usize;
        let want = HEAD + 2 * bs + 4;
        if bytes.len() >= 8 && &bytes[..8] != MAGIC {
            return Err(self.err("is not a merge stash (bad magic)".into()));
        }
        if bytes.len() != want {
            return Ok(None);
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
        if crc32fast::hash(&bytes[..want - 4]) != u32_at(want - 4) {
            return Ok(None);
        }
        if u32_at(8) != VERSION || u32_at(12) as u64 != block_size {
            return Err(self.err(format!(
                "has version {} and block size {}, not {VERSION} and {block_size}",
                u32_at(8),
                u32_at(12)
            )));
        }
        let (crc, count) = binding(ops);
        if u32_at(16) != crc || u32_at(20) != count {
            return Err(
                self.err("belongs to the merge of another COW (its merge order differs)".into())
            );
        }
        let index = u64_at(24);
        let new_block = u64_at(32);
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

    /// Write `w` and make it durable (file and, when it was created, its directory) before the
    /// merge writes the base.
    pub(crate) fn save(&self, ops: &[MapOp], block_size: u64, w: &Stashed) -> Result<()> {
        let mut b = Vec::with_capacity(HEAD + w.old.len() + w.new.len() + 4);
        let (crc, count) = binding(ops);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(block_size as u32).to_le_bytes());
        b.extend_from_slice(&crc.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&(w.index as u64).to_le_bytes());
        b.extend_from_slice(&w.new_block.to_le_bytes());
        b.extend_from_slice(&w.old);
        b.extend_from_slice(&w.new);
        b.extend_from_slice(&crc32fast::hash(&b).to_le_bytes());
        let created = !self.path.exists();
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|e| self.io_err("creating the merge stash", e))?;
        f.write_all_at(&b, 0)
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

fn sync_dir(p: &Path) -> std::io::Result<()> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    File::open(dir)?.sync_all()
}

/// CRC-32 of the merge order (each op's kind, new block and source) and the op count.
fn binding(ops: &[MapOp]) -> (u32, u32) {
    let mut h = crc32fast::Hasher::new();
    for op in ops {
        let (tag, src) = match op.kind {
            OpKind::Copy { src } => (1u8, src),
            OpKind::Xor { src_byte, .. } => (2, src_byte),
            OpKind::Replace { .. } => (3, 0),
            OpKind::Zero => (4, 0),
        };
        h.update(&[tag]);
        h.update(&op.new_block.to_le_bytes());
        h.update(&src.to_le_bytes());
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
