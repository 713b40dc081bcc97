//! The writable overlay: client writes appended to the COW file as a checksummed, hash-chained
//! journal of REPLACE records, after the data the Android COW format describes (so Android tools
//! still read the file: v2 readers stop at the footer, v3 readers at the last payload).
//!
//! Record = one 4 KiB header block + `nblocks` raw data blocks, at 4 KiB-aligned offsets starting
//! at `align_up(end of COW data, 4096)`. Header fields (little-endian):
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `SNAPBLKO` |
//! | 8 | 8 | sequence number (first record 1) |
//! | 16 | 8 | first new block |
//! | 24 | 4 | number of blocks (≤ 1024) |
//! | 28 | 4 | CRC-32 of the data blocks |
//! | 32 | 4 | CRC-32 of the previous record's header (0 for the first) |
//! | 36 | 4 | header CRC: CRC-32 of bytes 0..36, continued over bytes 40..48 if those are not zero |
//! | 40 | 8 | nonce of the open that wrote the record (random, non-zero; 0 in older journals) |
//!
//! The journal is the durable index: opening replays records while magic, sequence, chain and
//! both CRCs check out, and stops at the first that does not (a torn or never-flushed tail). The
//! chain makes a stale record left behind by an earlier, longer tail unreachable once new records
//! are written over the torn part. The nonce makes that hold even when a new record repeats the
//! torn one byte for byte (same block, same data, same sequence number and predecessor): without
//! it the rewrite would have the torn record's header CRC and re-link the stale records after it.
//! Writes are durable after FLUSH (or with FUA).

use crate::error::{Result, SnapError};
use crate::io::{Dev, Io};
use crate::sched::IoClass;
use snapblk_core::sync::{lock, read, write};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

const MAGIC: &[u8; 8] = b"SNAPBLKO";
const HDR: u64 = 4096;
/// Largest record, in blocks.
pub(crate) const MAX_RECORD_BLOCKS: u64 = 1024;

/// The header CRC of a record header (`h` holds at least 48 bytes). Journals written before the
/// nonce have zeros at 40..48 and a CRC of bytes 0..36 only, which this still matches.
pub(crate) fn header_crc(h: &[u8]) -> u32 {
    let mut c = crc32fast::Hasher::new();
    c.update(&h[..36]);
    if h[40..48].iter().any(|&b| b != 0) {
        c.update(&h[40..48]);
    }
    c.finalize()
}

/// A nonce no earlier open is expected to have used: `RandomState` keys come from the OS and
/// never repeat within a process; time and pid only add to that.
fn session_nonce() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    RandomState::new().hash_one((t, std::process::id())).max(1)
}

struct Tail {
    pos: u64,
    seq: u64,
    prev_crc: u32,
}

/// The overlay journal and its in-memory index.
pub(crate) struct Overlay {
    block_size: u64,
    /// Written into every record this open appends (see the module docs).
    nonce: u64,
    tail: Mutex<Tail>,
    index: RwLock<HashMap<u64, u64>>,
    nonempty: AtomicBool,
}

fn le32(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}
fn le64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl Overlay {
    /// Replay the journal at `start` (4 KiB aligned) of the COW. `nblocks` bounds block numbers.
    pub(crate) fn open(io: &Io, start: u64, block_size: u64, nblocks: u64) -> Result<Self> {
        if block_size != HDR {
            return Err(SnapError::Config(
                "the writable overlay needs 4096-byte blocks".into(),
            ));
        }
        let cow_len = io.cow.size().map_err(SnapError::io("sizing COW"))?;
        let mut index = HashMap::new();
        let mut pos = start;
        let mut seq = 0u64;
        let mut prev_crc = 0u32;
        let mut hdr = vec![0u8; HDR as usize];
        let mut data = Vec::new();
        while pos + HDR <= cow_len {
            io.read(IoClass::Foreground, Dev::Cow, pos, &mut hdr)?;
            if &hdr[..8] != MAGIC || le32(&hdr, 36) != header_crc(&hdr) {
                break;
            }
            let (rseq, first, n) = (le64(&hdr, 8), le64(&hdr, 16), le32(&hdr, 24) as u64);
            if rseq != seq + 1
                || le32(&hdr, 32) != prev_crc
                || n == 0
                || n > MAX_RECORD_BLOCKS
                || first.checked_add(n).is_none_or(|e| e > nblocks)
                || pos + HDR + n * block_size > cow_len
            {
                break;
            }
            data.resize((n * block_size) as usize, 0);
            io.read(IoClass::Foreground, Dev::Cow, pos + HDR, &mut data)?;
            if crc32fast::hash(&data) != le32(&hdr, 28) {
                break;
            }
            for i in 0..n {
                index.insert(first + i, pos + HDR + i * block_size);
            }
            seq = rseq;
            prev_crc = le32(&hdr, 36);
            pos += HDR + n * block_size;
        }
        let nonempty = AtomicBool::new(!index.is_empty());
        Ok(Overlay {
            block_size,
            nonce: session_nonce(),
            tail: Mutex::new(Tail { pos, seq, prev_crc }),
            index: RwLock::new(index),
            nonempty,
        })
    }

    /// Replay the journal at `start`, or, when there is none there, at `legacy` if one is
    /// there. Older versions started the journal of a v3 COW without payloads (only COPY and
    /// ZERO ops) right after its used op records, inside the free op slots; such a journal is
    /// still replayed and appended to where it is.
    pub(crate) fn open_or_legacy(
        io: &Io,
        start: u64,
        legacy: Option<u64>,
        block_size: u64,
        nblocks: u64,
    ) -> Result<Self> {
        let ov = Self::open(io, start, block_size, nblocks)?;
        if let Some(old) = legacy.filter(|&o| ov.is_empty() && o < start) {
            let ov_old = Self::open(io, old, block_size, nblocks)?;
            if !ov_old.is_empty() {
                return Ok(ov_old);
            }
        }
        Ok(ov)
    }

    /// COW offset of the overlay data for `block`.
    #[inline]
    pub(crate) fn lookup(&self, block: u64) -> Option<u64> {
        if !self.nonempty.load(Ordering::Acquire) {
            return None;
        }
        read(&self.index).get(&block).copied()
    }

    /// Whether any block is overlaid.
    pub(crate) fn is_empty(&self) -> bool {
        !self.nonempty.load(Ordering::Acquire)
    }

    /// Every overlaid block with its data offset, sorted by block.
    pub(crate) fn blocks(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = read(&self.index).iter().map(|(&b, &o)| (b, o)).collect();
        v.sort_unstable();
        v
    }

    /// Append whole blocks starting at `first` (caller holds no lock; appends are serialised).
    pub(crate) fn append(&self, io: &Io, first: u64, data: &[u8]) -> Result<()> {
        let mut t = lock(&self.tail);
        self.append_locked(io, &mut t, first, data)
    }

    fn append_locked(&self, io: &Io, t: &mut Tail, first: u64, data: &[u8]) -> Result<()> {
        let bs = self.block_size;
        for (k, chunk) in data.chunks((MAX_RECORD_BLOCKS * bs) as usize).enumerate() {
            let first = first + k as u64 * MAX_RECORD_BLOCKS;
            let n = chunk.len() as u64 / bs;
            let mut rec = vec![0u8; (HDR + n * bs) as usize];
            rec[..8].copy_from_slice(MAGIC);
            rec[8..16].copy_from_slice(&(t.seq + 1).to_le_bytes());
            rec[16..24].copy_from_slice(&first.to_le_bytes());
            rec[24..28].copy_from_slice(&(n as u32).to_le_bytes());
            rec[28..32].copy_from_slice(&crc32fast::hash(chunk).to_le_bytes());
            rec[32..36].copy_from_slice(&t.prev_crc.to_le_bytes());
            rec[40..48].copy_from_slice(&self.nonce.to_le_bytes());
            let hcrc = header_crc(&rec);
            rec[36..40].copy_from_slice(&hcrc.to_le_bytes());
            rec[HDR as usize..].copy_from_slice(chunk);
            io.write(IoClass::Foreground, Dev::Cow, t.pos, &rec)?;
            {
                let mut idx = write(&self.index);
                for i in 0..n {
                    idx.insert(first + i, t.pos + HDR + i * bs);
                }
            }
            self.nonempty.store(true, Ordering::Release);
            t.seq += 1;
            t.prev_crc = hcrc;
            t.pos += HDR + n * bs;
        }
        Ok(())
    }
}
