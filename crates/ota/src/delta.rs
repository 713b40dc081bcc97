//! The operations that read the old partition: SOURCE_COPY (its source blocks, in order, to its
//! destination blocks), the bsdiff types (SOURCE_BSDIFF with BSDIFF40 patches,
//! BROTLI_BSDIFF with BSDF2 patches; `bspatch.rs` applies them) and PUFFDIFF (puffin patches,
//! whose inner bsdiff patch `bspatch.rs` applies too; `puffin/` does the rest). The old bytes
//! an operation reads are its source extents, concatenated; they are checked against
//! `src_sha256_hash` before they are used.
//!
//! Memory: SOURCE_COPY streams (one pass to hash, one to copy, in the worker's 1 MiB buffer);
//! a bsdiff operation holds its source bytes and its patch, each at most [`MAX_PATCH_INPUT`]
//! (the plan refuses larger ones), and streams its output. A PUFFDIFF operation also holds its
//! destination (at most [`MAX_PATCH_INPUT`] too) and both puff streams. Across workers, these
//! operations share one memory budget ([`reserve`]).

use sha2::{Digest, Sha256};

use crate::error::OpError;
use crate::ops::{ExtentWriter, Src};
use crate::proto::{InstallOperation, OpType};

/// Largest source (the bytes of its source extents) and largest patch a bsdiff or PUFFDIFF
/// operation may have, and largest destination of a PUFFDIFF: they are held in memory while it
/// is applied (update_engine's generator makes bsdiff operations of at most 200 MiB).
pub const MAX_PATCH_INPUT: u64 = 1 << 30;

/// Bytes that bsdiff and PUFFDIFF operations may hold at once across all workers (their
/// sources, patches and PUFFDIFF destinations): half the memory available when the first one
/// starts, at least 256 MiB. An operation that needs more than the budget waits until it runs
/// alone, so each worker's 1 GiB caps never add up to more than the machine has.
struct Budget {
    held: std::sync::Mutex<u64>,
    freed: std::sync::Condvar,
    limit: u64,
}

fn budget() -> &'static Budget {
    static B: std::sync::OnceLock<Budget> = std::sync::OnceLock::new();
    B.get_or_init(|| Budget {
        held: std::sync::Mutex::new(0),
        freed: std::sync::Condvar::new(),
        limit: (mem_available() / 2).max(256 << 20),
    })
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (1 GiB when it cannot be read).
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(1 << 30, |kib| kib * 1024)
}

/// A share of [`budget`], given back on drop.
pub(crate) struct Grant(u64);

/// Wait for `bytes` of the memory budget: until they fit beside what other operations hold, or
/// until nothing else is held.
pub(crate) fn reserve(bytes: u64) -> Grant {
    let b = budget();
    let mut held = snapblk_core::sync::lock(&b.held);
    while *held > 0 && *held + bytes > b.limit {
        held = snapblk_core::sync::wait(&b.freed, held);
    }
    *held += bytes;
    Grant(bytes)
}

impl Drop for Grant {
    fn drop(&mut self) {
        let b = budget();
        let mut held = snapblk_core::sync::lock(&b.held);
        *held -= self.0;
        b.freed.notify_all();
    }
}

/// The memory a bsdiff (`puffdiff` false) or PUFFDIFF operation holds: its source, its patch
/// and, for PUFFDIFF, its destination and the puff streams (bounded by twice the source and
/// destination).
pub(crate) fn op_memory(op: &InstallOperation, bs: u64, puffdiff: bool) -> u64 {
    let src: u64 = source_extents(op, bs).map(|(_, n)| n).sum();
    let dst: u64 = op.dst_extents.iter().map(|e| e.num_blocks() * bs).sum();
    let patch = op.data_length();
    let base = src.saturating_add(patch);
    if puffdiff {
        base.saturating_add(dst.saturating_mul(3))
            .saturating_add(src.saturating_mul(2))
    } else {
        base
    }
}

/// An empty vector with room for `n` bytes, or an error instead of an abort when there is no
/// memory.
pub(crate) fn alloc(n: u64) -> Result<Vec<u8>, OpError> {
    let mut v = Vec::new();
    match usize::try_from(n) {
        Ok(k) if v.try_reserve_exact(k).is_ok() => Ok(v),
        _ => Err(OpError::NoMemory { bytes: n }),
    }
}

/// (byte offset, bytes) of each source extent of `op` (the plan checked that they lie inside
/// the old partition, so nothing overflows).
fn source_extents(op: &InstallOperation, bs: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    op.src_extents
        .iter()
        .map(move |e| (e.start_block() * bs, e.num_blocks() * bs))
}

/// Fill `buf` from byte `at` of the old partition; bytes past its end read as zeros (its last
/// block may be partial).
fn read_old(src: Src<'_>, at: u64, buf: &mut [u8]) -> Result<(), OpError> {
    let have = src.len.saturating_sub(at).min(buf.len() as u64) as usize;
    let (data, tail) = buf.split_at_mut(have);
    src.image
        .read_exact_at(at, data)
        .map_err(|source| OpError::SourceRead { offset: at, source })?;
    tail.fill(0);
    Ok(())
}

/// Visit the old bytes `op` reads, in pieces of at most `buf.len()` bytes.
fn each_piece(
    op: &InstallOperation,
    bs: u64,
    src: Src<'_>,
    buf: &mut [u8],
    f: &mut dyn FnMut(&[u8]) -> Result<(), OpError>,
) -> Result<(), OpError> {
    for (start, len) in source_extents(op, bs) {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            read_old(src, start + done, &mut buf[..n])?;
            f(&buf[..n])?;
            done += n as u64;
        }
    }
    Ok(())
}

/// Compare the SHA-256 of the old bytes with `src_sha256_hash`; true when the op has none.
fn check_source_hash(op: &InstallOperation, h: Sha256) -> Result<bool, OpError> {
    let Some(want) = op.src_sha256_hash.as_deref() else {
        return Ok(true);
    };
    let found: [u8; 32] = h.finalize().into();
    if want != found {
        return Err(OpError::SourceHash {
            expected: crate::hex(want),
            found: crate::hex(&found),
        });
    }
    Ok(false)
}

/// SOURCE_COPY: hash the source extents, check `src_sha256_hash`, then copy them to the
/// destination. Returns whether the op had no source hash.
pub(crate) fn source_copy(
    op: &InstallOperation,
    bs: u64,
    src: Src<'_>,
    dst: &mut ExtentWriter<'_>,
    buf: &mut [u8],
) -> Result<bool, OpError> {
    let unhashed = if op.src_sha256_hash.is_some() {
        let mut h = Sha256::new();
        each_piece(op, bs, src, buf, &mut |b| {
            h.update(b);
            Ok(())
        })?;
        check_source_hash(op, h)?
    } else {
        true
    };
    each_piece(op, bs, src, buf, &mut |b| dst.write(b, "is"))?;
    Ok(unhashed)
}

/// The old bytes of a bsdiff op (its source extents, concatenated), checked against
/// `src_sha256_hash`; and whether the op had no source hash.
pub(crate) fn read_source(
    op: &InstallOperation,
    bs: u64,
    src: Src<'_>,
) -> Result<(Vec<u8>, bool), OpError> {
    let total: u64 = source_extents(op, bs).map(|(_, n)| n).sum();
    let mut old = alloc(total)?;
    old.resize(total as usize, 0);
    let mut at = 0usize;
    for (start, len) in source_extents(op, bs) {
        let piece = &mut old[at..at + len as usize];
        read_old(src, start, piece)?;
        at += len as usize;
    }
    let unhashed = check_source_hash(op, Sha256::new_with_prefix(&old))?;
    Ok((old, unhashed))
}

/// Apply the PUFFDIFF `patch` to `old`, writing exactly the destination's bytes to `dst` in
/// pieces of `buf.len()`; the inner bsdiff patch is applied by `bspatch.rs`, into memory.
pub(crate) fn puffpatch(
    old: &[u8],
    patch: &[u8],
    dst: &mut ExtentWriter<'_>,
    buf: &mut [u8],
) -> Result<(), OpError> {
    let new = crate::puffin::apply_puffdiff(old, patch, dst.capacity, |old, inner, n, new| {
        let mut sink = |b: &[u8]| {
            new.extend_from_slice(b);
            Ok::<_, std::convert::Infallible>(())
        };
        match crate::bspatch::apply(old, inner, n, buf, &mut sink) {
            Ok(_) => Ok(()),
            Err(crate::bspatch::Fail::Patch(e)) => Err(e),
            Err(crate::bspatch::Fail::Sink(never)) => match never {},
        }
    })
    .map_err(OpError::Puffdiff)?;
    for piece in new.chunks(buf.len().max(1)) {
        dst.write(piece, "patches to")?;
    }
    Ok(())
}

/// Apply the bsdiff `patch` of an op of type `t` to `old`, writing the new bytes to `dst` in
/// pieces of `buf.len()`. The patch may make at most the destination's bytes; fewer leave the
/// rest of the destination zero.
pub(crate) fn bspatch(
    t: OpType,
    old: &[u8],
    patch: &[u8],
    dst: &mut ExtentWriter<'_>,
    buf: &mut [u8],
) -> Result<(), OpError> {
    let limit = dst.capacity;
    let mut sink = |b: &[u8]| dst.write(b, "patches to");
    match crate::bspatch::apply(old, patch, limit, buf, &mut sink) {
        Ok(_) => Ok(()),
        Err(crate::bspatch::Fail::Sink(e)) => Err(e),
        Err(crate::bspatch::Fail::Patch(source)) => Err(OpError::Patch { op_type: t, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn an_operation_larger_than_the_budget_runs_alone_and_others_wait() {
        let big = reserve(budget().limit + 1);
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _g = reserve(1);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a second operation got memory while the budget was exceeded"
        );
        drop(big);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the waiting operation proceeds once the big one is done");
        t.join().unwrap();
    }
}
