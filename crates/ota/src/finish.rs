//! The step after a partition's last operation, shared by every command that writes
//! partitions: recompute its dm-verity hash tree and FEC when its manifest entry leaves them to
//! the device (`hash_tree_*`, `fec_*`), then read the whole partition back and compare it with
//! `new_partition_info.hash` — what update_engine's `FilesystemVerifierAction` does.

use std::io;

use sha2::{Digest, Sha256};

use crate::error::{OtaError, Result};
use crate::extract::Output;
use crate::ops::WRITE_CHUNK;
use crate::plan::PlannedPartition;
use crate::verity::VerityReport;

/// A finished, verified partition.
#[derive(Clone, Debug)]
pub(crate) struct Finished {
    /// Its SHA-256 (equal to `new_partition_info.hash`).
    pub(crate) sha256: [u8; 32],
    /// The hash tree and FEC written, if the manifest asked for them.
    pub(crate) verity: Option<VerityReport>,
}

/// Finish partition `p`, whose operations are all written to `out`: its hash tree and FEC
/// (with up to `threads` threads, `progress` getting the bytes processed as
/// [`Verity::write_with_progress`](crate::Verity::write_with_progress) reports them), then the
/// check of its hash.
pub(crate) fn finish_partition(
    p: &PlannedPartition,
    out: &dyn Output,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Finished> {
    let verity = match &p.verity {
        Some(v) => Some(
            v.write_with_progress(out, threads, progress)
                .map_err(|source| OtaError::Verity {
                    partition: p.name.clone(),
                    source,
                })?,
        ),
        None => None,
    };
    let found = hash_output(p, out)?;
    if found != p.sha256 {
        return Err(OtaError::PartitionHash {
            partition: p.name.clone(),
            expected: crate::hex(&p.sha256),
            found: crate::hex(&found),
        });
    }
    Ok(Finished {
        sha256: found,
        verity,
    })
}

/// SHA-256 of the first `p.size` bytes of `out`.
fn hash_output(p: &PlannedPartition, out: &dyn Output) -> Result<[u8; 32]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; WRITE_CHUNK];
    let mut at = 0u64;
    while at < p.size {
        let n = (p.size - at).min(buf.len() as u64) as usize;
        match out.read_at(at, &mut buf[..n]) {
            Ok(0) => {
                return Err(OtaError::Output {
                    partition: p.name.clone(),
                    doing: "reading back",
                    source: io::ErrorKind::UnexpectedEof.into(),
                });
            }
            Ok(k) => {
                h.update(&buf[..k]);
                at += k as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(OtaError::Output {
                    partition: p.name.clone(),
                    doing: "reading back",
                    source,
                });
            }
        }
    }
    Ok(h.finalize().into())
}
