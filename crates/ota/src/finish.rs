//! The step after a partition's last operation, shared by every command that writes
//! partitions: recompute its dm-verity hash tree and FEC when its manifest entry leaves them to
//! the device (`hash_tree_*`, `fec_*`), then read the whole partition back and compare it with
//! `new_partition_info.hash` — what update_engine's `FilesystemVerifierAction` does.

use std::io;
use std::time::Instant;

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
    /// When computing and writing them began and ended.
    pub(crate) verity_span: Option<(Instant, Instant)>,
}

/// The partition hash so far: SHA-256 state over the first `at` bytes of the output, read back
/// while later operations still ran (only for partitions without dm-verity work, whose bytes
/// are final once their operations are done).
pub(crate) struct HashedPrefix {
    pub(crate) hash: Sha256,
    pub(crate) at: u64,
}

impl HashedPrefix {
    pub(crate) fn new() -> HashedPrefix {
        HashedPrefix {
            hash: Sha256::new(),
            at: 0,
        }
    }

    /// Read back and hash the output up to byte `end` (nothing if already there), in pieces of
    /// `buf`'s size.
    pub(crate) fn advance(
        &mut self,
        p: &PlannedPartition,
        out: &dyn Output,
        end: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        while self.at < end {
            let n = (end - self.at).min(buf.len() as u64) as usize;
            match out.read_at(self.at, &mut buf[..n]) {
                Ok(0) => {
                    return Err(OtaError::Output {
                        partition: p.name.clone(),
                        doing: "reading back",
                        source: io::ErrorKind::UnexpectedEof.into(),
                    });
                }
                Ok(k) => {
                    self.hash.update(&buf[..k]);
                    self.at += k as u64;
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
        Ok(())
    }
}

/// Finish partition `p`, whose operations are all written to `out`: its hash tree and FEC
/// (with up to `threads` threads, `progress` getting the bytes processed as
/// [`Verity::write_with_progress`](crate::Verity::write_with_progress) reports them), then the
/// check of its hash, going on from `prefix` (which must be empty when `p` has dm-verity work).
pub(crate) fn finish_partition(
    p: &PlannedPartition,
    out: &dyn Output,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
    mut prefix: HashedPrefix,
) -> Result<Finished> {
    let start = Instant::now();
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
    let verity_span = verity.is_some().then(|| (start, Instant::now()));
    let mut buf = vec![0u8; WRITE_CHUNK];
    prefix.advance(p, out, p.size, &mut buf)?;
    let found: [u8; 32] = prefix.hash.finalize().into();
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
        verity_span,
    })
}
