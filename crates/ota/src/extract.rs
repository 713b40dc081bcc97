//! Running an [`ExtractPlan`]: a bounded pool of workers takes the operations of all planned
//! partitions from one queue (parallel across operations and partitions), each streaming its
//! blob through the decoder into the partition's output; the worker that finishes a
//! partition's last operation finishes the partition (`crate::finish`: its dm-verity hash tree
//! and FEC when the manifest leaves them to the device, then the check of
//! `new_partition_info.hash`). That hash is read back ahead, while the other operations run:
//! once every operation that can write below an offset is done (the operations before it in
//! the queue, and none after it starts lower: `Tally::safe`), a worker hashes the output up
//! to there, so the last operation leaves only the partition's tail to hash instead of the
//! whole image on one thread (partitions with dm-verity work are hashed after it, as before).
//! Memory: each worker holds a 256 KiB read buffer, a 1 MiB write buffer and one decoder's
//! state (xz: its dictionary, at most 64 MiB for the largest preset), whatever the payload's
//! size.

use snapblk_core::sync::{into_inner, lock};
use snapblk_core::{ReadAt, WriteAt};
use std::fs::File;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::error::{OtaError, Result};
use crate::finish::{Finished, HashedPrefix, finish_partition};
use crate::ops::{Buffers, Src, apply};
use crate::plan::{ExtractPlan, PlannedPartition};
use crate::verity::VerityReport;

/// Most worker threads an extraction uses, whatever it is asked.
pub const MAX_THREADS: usize = 256;

/// Where one partition is written: positional writes, and reads for the final hash (the
/// project's positional I/O family), plus a length. It must read as zeros wherever nothing was
/// written (a new, empty file): zero blocks are skipped, so the output stays sparse.
pub trait Output: ReadAt + WriteAt + Sync {
    /// Make the output `size` bytes long (called once, before any write).
    fn set_len(&self, size: u64) -> io::Result<()>;
}

impl Output for File {
    fn set_len(&self, size: u64) -> io::Result<()> {
        File::set_len(self, size)
    }
}

/// Progress of an extraction, reported through [`ExtractOptions::progress`] (from the worker
/// threads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtractProgress {
    /// The run starts; `bytes` is what the [`ExtractProgress::Advance`] events add up to
    /// ([`ExtractPlan::progress_bytes`]).
    Start {
        /// Destination bytes of all operations, plus what the dm-verity step processes.
        bytes: u64,
    },
    /// An operation was applied, or a piece of a partition's dm-verity hash tree or FEC was
    /// computed.
    Advance {
        /// Its destination bytes, or the bytes the piece processed
        /// ([`Verity::work_bytes`](crate::Verity::work_bytes) in all).
        bytes: u64,
    },
    /// The partition at this index of [`ExtractPlan::partitions`] has its manifest hash.
    Verified {
        /// Index in the plan.
        index: usize,
    },
    /// Every partition is written and verified.
    Done,
}

/// How to run an extraction.
#[derive(Clone, Copy, Default)]
pub struct ExtractOptions<'a> {
    /// Worker threads (0: one per CPU), at most [`MAX_THREADS`].
    pub threads: usize,
    /// Called with each [`ExtractProgress`] event.
    pub progress: Option<&'a (dyn Fn(ExtractProgress) + Sync)>,
}

/// What was extracted, per partition.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PartitionReport {
    /// Partition name.
    pub name: String,
    /// Image size in bytes.
    pub size: u64,
    /// SHA-256 of the image, hex (equal to `new_partition_info.hash`).
    pub sha256: String,
    /// Operations applied.
    pub ops: usize,
    /// Operations without `data_sha256_hash` (their data is covered by the partition hash).
    pub ops_without_data_hash: usize,
    /// Operations that read the old image without a `src_sha256_hash` (`apply`; their source
    /// is covered by `old_partition_info.hash`, when present, and the partition hash).
    pub ops_without_source_hash: usize,
    /// Bytes written to the output (the rest is holes).
    pub written_bytes: u64,
    /// The dm-verity hash tree and FEC recomputed after the operations, when the manifest
    /// leaves them to the device.
    pub verity: Option<VerityReport>,
}

/// The result of [`ExtractPlan::run`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ExtractReport {
    /// One entry per planned partition, in plan order.
    pub partitions: Vec<PartitionReport>,
    /// Worker threads used.
    pub threads: usize,
    /// Where the run's time went (left out of the serialized report).
    #[serde(skip)]
    pub timing: ExtractTiming,
}

/// Where [`ExtractPlan::run`]'s wall-clock time went, measured inside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtractTiming {
    /// The whole run: sizing the outputs, every operation, the dm-verity steps and the
    /// partitions' hashes.
    pub elapsed: Duration,
    /// Of `elapsed`: the time during which at least one partition's dm-verity hash tree and
    /// FEC were being computed and written (the rest is decoding and writing the operations'
    /// data and hashing the partitions).
    pub verity: Duration,
}

impl ExtractTiming {
    /// `elapsed` less `verity`: decoding, writing and hashing.
    pub fn operations(&self) -> Duration {
        self.elapsed.saturating_sub(self.verity)
    }
}

/// The total length of the union of `spans`.
fn covered(mut spans: Vec<(Instant, Instant)>) -> Duration {
    spans.sort();
    let mut total = Duration::ZERO;
    let mut cur: Option<(Instant, Instant)> = None;
    for (a, b) in spans {
        match &mut cur {
            Some((_, e)) if a <= *e => *e = (*e).max(b),
            _ => {
                if let Some((s, e)) = cur.replace((a, b)) {
                    total += e - s;
                }
            }
        }
    }
    if let Some((s, e)) = cur {
        total += e - s;
    }
    total
}

/// Per-partition counters shared by the workers.
struct Tally {
    remaining: AtomicUsize,
    unhashed: AtomicUsize,
    src_unhashed: AtomicUsize,
    written: AtomicU64,
    done: Mutex<Option<Finished>>,
    /// `lowest[k]`: the lowest byte operations `k..` write (the partition size past the last,
    /// and for all when dm-verity work follows the operations: nothing is hashed ahead).
    lowest: Vec<u64>,
    /// Which operations are done, and how many from the first are.
    order: Mutex<(Vec<bool>, usize)>,
    /// Bytes of the output that no pending operation can write any more:
    /// `lowest[done prefix]`.
    safe: AtomicU64,
    /// The hash of the output's first bytes, read back ahead (taken by the partition's finish).
    prefix: Mutex<Option<HashedPrefix>>,
}

impl Tally {
    /// Note operation `oi` done, moving [`Tally::safe`] on.
    fn op_done(&self, oi: usize) {
        let mut g = lock(&self.order);
        let (done, first) = &mut *g;
        if let Some(d) = done.get_mut(oi) {
            *d = true;
        }
        while done.get(*first).copied().unwrap_or(false) {
            *first += 1;
        }
        if let Some(&l) = self.lowest.get(*first) {
            self.safe.fetch_max(l, Ordering::AcqRel);
        }
    }

    /// Hash the output up to [`Tally::safe`], unless another worker is doing so.
    fn hash_ahead(&self, p: &PlannedPartition, out: &dyn Output, buf: &mut [u8]) -> Result<()> {
        let Ok(mut g) = self.prefix.try_lock() else {
            return Ok(());
        };
        let Some(h) = g.as_mut() else {
            return Ok(());
        };
        loop {
            let end = self.safe.load(Ordering::Acquire);
            if h.at >= end {
                return Ok(());
            }
            // A piece at a time, to take in what other workers finish meanwhile.
            h.advance(p, out, end.min(h.at + 4 * buf.len() as u64), buf)?;
        }
    }
}

/// The first error by job order, so that the report does not depend on thread timing.
struct FirstError(Mutex<Option<(usize, OtaError)>>);

impl FirstError {
    fn set(&self, job: usize, e: OtaError) {
        let mut g = lock(&self.0);
        if g.as_ref().is_none_or(|(j, _)| job < *j) {
            *g = Some((job, e));
        }
    }
}

impl ExtractPlan<'_> {
    /// Write every planned partition to its output (`outputs[i]` for
    /// [`partitions()`](ExtractPlan::partitions)`[i]`), then check each against its
    /// `new_partition_info.hash`. On error the outputs hold partial data: the caller discards
    /// them (the CLI writes to unnamed temporary files and names them only after success).
    pub fn run(&self, outputs: &[&dyn Output], opts: &ExtractOptions<'_>) -> Result<ExtractReport> {
        self.run_with(&vec![None; self.parts.len()], outputs, opts)
    }

    /// [`ExtractPlan::run`], the partitions reading their old images `sources` (`apply`; the
    /// caller checked them against the plan).
    pub(crate) fn run_with(
        &self,
        sources: &[Option<Src<'_>>],
        outputs: &[&dyn Output],
        opts: &ExtractOptions<'_>,
    ) -> Result<ExtractReport> {
        let t0 = Instant::now();
        if outputs.len() != self.parts.len() {
            return Err(OtaError::OutputCount {
                given: outputs.len(),
                planned: self.parts.len(),
            });
        }
        let report = |e: ExtractProgress| {
            if let Some(f) = opts.progress {
                f(e)
            }
        };
        for (p, out) in self.parts.iter().zip(outputs) {
            out.set_len(p.size).map_err(|source| OtaError::Output {
                partition: p.name.clone(),
                doing: "sizing",
                source,
            })?;
        }
        let manifest = self.payload.manifest();
        let jobs: Vec<(usize, usize)> = self
            .parts
            .iter()
            .enumerate()
            .flat_map(|(pi, p)| (0..p.ops).map(move |oi| (pi, oi)))
            .collect();
        let bs = u64::from(self.payload.block_size());
        let tallies: Vec<Tally> = self
            .parts
            .iter()
            .map(|p| {
                let ops = &manifest.partitions[p.index].operations;
                let mut lowest = vec![p.size; ops.len() + 1];
                if p.verity.is_some() {
                    lowest.fill(0);
                } else {
                    for (k, op) in ops.iter().enumerate().rev() {
                        let start = (op.dst_extents.iter())
                            .filter(|e| e.num_blocks() > 0)
                            .map(|e| e.start_block().saturating_mul(bs))
                            .min();
                        lowest[k] = lowest[k + 1].min(start.unwrap_or(u64::MAX));
                    }
                }
                Tally {
                    remaining: AtomicUsize::new(p.ops),
                    unhashed: AtomicUsize::new(0),
                    src_unhashed: AtomicUsize::new(0),
                    written: AtomicU64::new(0),
                    done: Mutex::new(None),
                    lowest,
                    order: Mutex::new((vec![false; ops.len()], 0)),
                    safe: AtomicU64::new(0),
                    prefix: Mutex::new(Some(HashedPrefix::new())),
                }
            })
            .collect();
        let cores = match opts.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .clamp(1, MAX_THREADS);
        let threads = cores.min(jobs.len().max(1));
        report(ExtractProgress::Start {
            bytes: self.progress_bytes(),
        });
        // Partitions without operations are all zeros: hash them now.
        for (pi, p) in self.parts.iter().enumerate() {
            if p.ops == 0 {
                self.finish(pi, outputs[pi], &tallies[pi], cores, &report)?;
            }
        }
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let first = FirstError(Mutex::new(None));
        let worker = || {
            let mut bufs = Buffers::new();
            loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(pi, oi)) = jobs.get(j) else {
                    return;
                };
                let p = &self.parts[pi];
                let op = &manifest.partitions[p.index].operations[oi];
                let source = sources.get(pi).copied().flatten();
                let r = apply(self.payload, op, p.size, outputs[pi], source, &mut bufs)
                    .map_err(|source| OtaError::Op {
                        partition: p.name.clone(),
                        index: oi,
                        source,
                    })
                    .and_then(|st| {
                        let t = &tallies[pi];
                        t.written.fetch_add(st.written, Ordering::Relaxed);
                        if st.unhashed {
                            t.unhashed.fetch_add(1, Ordering::Relaxed);
                        }
                        if st.src_unhashed {
                            t.src_unhashed.fetch_add(1, Ordering::Relaxed);
                        }
                        let n: u64 = op.dst_extents.iter().map(|e| e.num_blocks() * bs).sum();
                        report(ExtractProgress::Advance { bytes: n });
                        t.op_done(oi);
                        if t.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                            self.finish(pi, outputs[pi], t, cores, &report)?;
                        } else {
                            t.hash_ahead(p, outputs[pi], bufs.write_buf())?;
                        }
                        Ok(())
                    });
                if let Err(e) = r {
                    first.set(j, e);
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
            }
        };
        let panicked = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|_| s.spawn(worker)).collect();
            hs.into_iter()
                .map(|h| h.join().is_err())
                .fold(false, |a, b| a | b)
        });
        if let Some((_, e)) = into_inner(first.0) {
            return Err(e);
        }
        if panicked {
            return Err(OtaError::WorkerPanic);
        }
        let mut parts = Vec::with_capacity(self.parts.len());
        let mut spans = Vec::new();
        for (p, t) in self.parts.iter().zip(&tallies) {
            let done = lock(&t.done);
            spans.extend(done.as_ref().and_then(|d| d.verity_span));
            parts.push(PartitionReport {
                name: p.name.clone(),
                size: p.size,
                sha256: crate::hex(done.as_ref().map_or(&p.sha256, |d| &d.sha256)),
                ops: p.ops,
                ops_without_data_hash: t.unhashed.load(Ordering::Relaxed),
                ops_without_source_hash: t.src_unhashed.load(Ordering::Relaxed),
                written_bytes: t.written.load(Ordering::Relaxed),
                verity: done.as_ref().and_then(|d| d.verity.clone()),
            });
        }
        report(ExtractProgress::Done);
        let verity = covered(spans);
        Ok(ExtractReport {
            partitions: parts,
            threads,
            timing: ExtractTiming {
                elapsed: t0.elapsed().max(verity),
                verity,
            },
        })
    }

    /// Finish partition `pi` (its hash tree and FEC, then its hash: the step shared with
    /// every command that writes partitions) and note the result.
    fn finish(
        &self,
        pi: usize,
        out: &dyn Output,
        t: &Tally,
        threads: usize,
        report: &(dyn Fn(ExtractProgress) + Sync),
    ) -> Result<()> {
        let advance = |bytes| report(ExtractProgress::Advance { bytes });
        // Waits for a worker still hashing ahead, then goes on from where it stopped.
        let prefix = lock(&t.prefix).take().unwrap_or_else(HashedPrefix::new);
        let done = finish_partition(&self.parts[pi], out, threads, &advance, prefix)?;
        *lock(&t.done) = Some(done);
        report(ExtractProgress::Verified { index: pi });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covered_counts_overlapping_spans_once() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let s = |a, b| (t + ms(a), t + ms(b));
        assert_eq!(covered(Vec::new()), Duration::ZERO);
        assert_eq!(covered(vec![s(2, 7)]), ms(5));
        // [0, 3) and [5, 10), overlapping and touching pieces given out of order.
        let spans = vec![s(5, 9), s(0, 2), s(1, 3), s(8, 10), s(6, 7), s(3, 3)];
        assert_eq!(covered(spans), ms(3 + 5));
    }
}
