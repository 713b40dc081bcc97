//! The workload engine: one thread and one queue per job, `iodepth` requests kept in flight with
//! `enqueue` + `do_io`, latencies recorded in HDR histograms and per-second buckets.
//!
//! Three latencies per I/O, as fio defines them: `lat` from the moment the request is made
//! (offset chosen, before it is queued) to the reap that handles its completion; `slat`
//! (submission) from then until the call that submitted it returned; `clat` (completion) from
//! there to the reap. `slat + clat = lat` for every request.

use crate::hist::LatHist;
use crate::pattern::{Dir, OffsetGen};
use crate::spec::JobSpec;
use crate::target::Target;
use crate::verify;
use crate::{Error, Result};
use quanta::Instant;
use snapblk_core::{Completion, MemRegion, Op, Queue, ReqFlags, Request};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// Largest region (in blocks) a verify job tracks (2 bytes of state per block).
const MAX_VERIFY_BLOCKS: u64 = 1 << 28;

/// Per-direction statistics.
#[derive(Debug, Clone, Default)]
pub struct DirStats {
    /// Completed I/Os.
    pub ios: u64,
    /// Bytes they moved.
    pub bytes: u64,
    /// Total latency (fio's `lat`).
    pub lat: LatHist,
    /// Submission latency (fio's `slat`).
    pub slat: LatHist,
    /// Completion latency (fio's `clat`).
    pub clat: LatHist,
}

impl DirStats {
    /// Adds `o`'s counts and histograms to these.
    pub fn merge(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.lat.merge(&o.lat);
        self.slat.merge(&o.slat);
        self.clat.merge(&o.clat);
    }
}

/// One second of one job (or of all jobs once merged).
#[derive(Debug, Clone, Default)]
pub struct Second {
    /// Reads completed in the second.
    pub read_ios: u64,
    /// Writes completed in the second.
    pub write_ios: u64,
    /// Bytes read in the second.
    pub read_bytes: u64,
    /// Bytes written in the second.
    pub write_bytes: u64,
    /// Sparse 2-digit latency histogram `(ns, count)`.
    pub lat: Vec<(u64, u64)>,
}

/// What one job measured.
#[derive(Debug, Clone, Default)]
pub struct JobResult {
    /// The job's index (0-based) among the configuration's `numjobs`.
    pub job: u32,
    /// The job's region of the target, `(start, len)` in bytes.
    pub region: (u64, u64),
    /// The job's reads.
    pub read: DirStats,
    /// The job's writes.
    pub write: DirStats,
    /// Measured seconds (runtime, or first-to-last completion for size-based jobs).
    pub seconds: f64,
    /// The job's per-second series, from its first measured second.
    pub series: Vec<Second>,
    /// Blocks whose content was checked (verify mode).
    pub verified_blocks: u64,
}

/// A whole configuration's result (all jobs).
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The configuration that ran.
    pub spec: JobSpec,
    /// The target's capacity in bytes.
    pub capacity: u64,
    /// Each job's result.
    pub jobs: Vec<JobResult>,
    /// All jobs' reads.
    pub read: DirStats,
    /// All jobs' writes.
    pub write: DirStats,
    /// Measured seconds: the longest job's.
    pub seconds: f64,
    /// All jobs' per-second series, summed second by second.
    pub series: Vec<Second>,
}

impl RunResult {
    /// Completed I/Os, reads and writes.
    pub fn ios(&self) -> u64 {
        self.read.ios + self.write.ios
    }
    /// I/Os per second over [`RunResult::seconds`] (0 for a run that measured no time).
    pub fn iops(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ios() as f64 / self.seconds
        } else {
            0.0
        }
    }
    /// Bytes (read and written) per second over [`RunResult::seconds`].
    pub fn bw_bytes(&self) -> f64 {
        if self.seconds > 0.0 {
            (self.read.bytes + self.write.bytes) as f64 / self.seconds
        } else {
            0.0
        }
    }
    /// Latency of both directions together.
    pub fn lat(&self) -> LatHist {
        let mut h = self.read.lat.clone();
        h.merge(&self.write.lat);
        h
    }
}

/// Knobs that are not part of the workload description.
#[derive(Debug, Clone, Default)]
pub struct RunOpts {
    /// Completed I/Os of the current run, for progress displays.
    pub progress: Option<Arc<AtomicU64>>,
    /// Set to stop early (e.g. on Ctrl-C or when a foreground test ends).
    pub stop: Option<Arc<AtomicBool>>,
}

/// Open `target` with one queue per job and run `spec` on it.
pub fn run_workload(target: &mut dyn Target, spec: &JobSpec, opts: &RunOpts) -> Result<RunResult> {
    spec.validate()?;
    let n = spec.numjobs as usize;
    let mut dev = target.open(n, spec.direct)?;
    spec.check_writable(dev.read_only())?;
    let align = dev.alignment();
    spec.check_alignment(&align)?;
    // Each request's buffer starts on a `buf-alignment` boundary.
    let stride = spec.bs.next_multiple_of(align.buf) as usize;
    let capacity = dev.capacity();
    let regions = spec.regions(capacity)?;
    if spec.verify && JobSpec::regions_overlap(&regions) {
        return Err(Error::Spec(
            "verify with numjobs > 1 needs disjoint regions: set offset_increment to at least \
             size"
                .into(),
        ));
    }
    if spec.invalidate
        && matches!(target.driver().as_str(), "io_uring" | "sync")
        && let Some(p) = target.path()
    {
        crate::fileio::invalidate(&p, &regions);
    }
    let queues = dev.take_queues();
    if queues.len() < n {
        return Err(Error::Other(format!(
            "target gave {} queues, {n} needed",
            queues.len()
        )));
    }
    let mut bufs = Vec::with_capacity(n);
    for _ in 0..n {
        // Regions are only page aligned (mem-region-alignment): room to move the first slot
        // up to a larger buf-alignment.
        let slack = if align.buf > 4096 {
            align.buf as usize
        } else {
            0
        };
        bufs.push(dev.alloc_buf(stride * spec.iodepth as usize + slack, spec.iomem)?);
    }
    let barrier = Arc::new(Barrier::new(n));
    let failed = Arc::new(AtomicBool::new(false));
    let results: Vec<Result<JobResult>> = std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .into_iter()
            .zip(bufs)
            .zip(&regions)
            .enumerate()
            .map(|(j, ((q, buf), &region))| {
                let ctx = JobCtx {
                    spec,
                    job: j as u32,
                    region,
                    buf,
                    stride,
                    buf_align: align.buf as usize,
                    barrier: barrier.clone(),
                    progress: opts.progress.clone(),
                    stop: opts.stop.clone(),
                    failed: failed.clone(),
                };
                s.spawn(move || {
                    let mut q = q;
                    let r = run_job(&mut *q, ctx);
                    drop(q);
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Other("job thread panicked".into())))
            })
            .collect()
    });
    // The device (and its buffers) outlive every queue and job thread.
    drop(dev);
    let mut jobs = Vec::with_capacity(n);
    for r in results {
        jobs.push(r?);
    }
    Ok(merge_jobs(spec.clone(), capacity, jobs))
}

/// Combine per-job results: sums, merged histograms, per-second series aligned by index.
pub(crate) fn merge_jobs(spec: JobSpec, capacity: u64, jobs: Vec<JobResult>) -> RunResult {
    let mut read = DirStats::default();
    let mut write = DirStats::default();
    let mut seconds: f64 = 0.0;
    let len = jobs.iter().map(|j| j.series.len()).max().unwrap_or(0);
    let mut acc: Vec<(Second, LatHist)> = (0..len)
        .map(|_| (Second::default(), LatHist::with_sigfig(2)))
        .collect();
    for j in &jobs {
        read.merge(&j.read);
        write.merge(&j.write);
        seconds = seconds.max(j.seconds);
        for (i, s) in j.series.iter().enumerate() {
            let (a, h) = &mut acc[i];
            a.read_ios += s.read_ios;
            a.write_ios += s.write_ios;
            a.read_bytes += s.read_bytes;
            a.write_bytes += s.write_bytes;
            for &(v, c) in &s.lat {
                h.record_n(v, c);
            }
        }
    }
    let series = acc
        .into_iter()
        .map(|(mut s, h)| {
            s.lat = h.sparse();
            s
        })
        .collect();
    RunResult {
        spec,
        capacity,
        jobs,
        read,
        write,
        seconds,
        series,
    }
}

struct JobCtx<'a> {
    spec: &'a JobSpec,
    job: u32,
    region: (u64, u64),
    buf: MemRegion,
    /// Bytes between the buffers of consecutive slots (`bs` rounded up to `buf-alignment`).
    stride: usize,
    /// `buf-alignment`: where the first slot starts in `buf`.
    buf_align: usize,
    barrier: Arc<Barrier>,
    progress: Option<Arc<AtomicU64>>,
    stop: Option<Arc<AtomicBool>>,
    failed: Arc<AtomicBool>,
}

#[derive(Clone, Copy)]
struct Slot {
    dir: Dir,
    offset: u64,
    generation: u32,
    /// When the request was made (start of `lat` and `slat`).
    submitted: Instant,
    /// When the call that submitted it returned (end of `slat`, start of `clat`).
    issued: Instant,
    measure: bool,
}

/// Collects completions into totals and per-second buckets, from `start` on.
struct Collector {
    start: Instant,
    read: DirStats,
    write: DirStats,
    series: Vec<Second>,
    cur: LatHist,
    cur_idx: usize,
    last: Option<Instant>,
}

impl Collector {
    fn new(start: Instant) -> Collector {
        Collector {
            start,
            read: DirStats::default(),
            write: DirStats::default(),
            series: Vec::new(),
            cur: LatHist::with_sigfig(2),
            cur_idx: 0,
            last: None,
        }
    }
    fn flush_second(&mut self) {
        while self.series.len() <= self.cur_idx {
            self.series.push(Second::default());
        }
        self.series[self.cur_idx].lat = self.cur.sparse();
        self.cur = LatHist::with_sigfig(2);
    }
    #[inline]
    fn record(&mut self, now: Instant, slot: &Slot, bytes: u64) {
        let ns = |d: Duration| d.as_nanos() as u64;
        let lat_ns = ns(now.saturating_duration_since(slot.submitted));
        let slat_ns = ns(slot.issued.saturating_duration_since(slot.submitted));
        let clat_ns = ns(now.saturating_duration_since(slot.issued));
        let dir = slot.dir;
        let idx = now.saturating_duration_since(self.start).as_secs() as usize;
        if idx != self.cur_idx {
            self.flush_second();
            self.cur_idx = idx;
        }
        while self.series.len() <= idx {
            self.series.push(Second::default());
        }
        let s = &mut self.series[idx];
        let d = match dir {
            Dir::Read => {
                s.read_ios += 1;
                s.read_bytes += bytes;
                &mut self.read
            }
            Dir::Write => {
                s.write_ios += 1;
                s.write_bytes += bytes;
                &mut self.write
            }
        };
        d.ios += 1;
        d.bytes += bytes;
        d.lat.record(lat_ns);
        d.slat.record(slat_ns);
        d.clat.record(clat_ns);
        self.cur.record(lat_ns);
        self.last = Some(now);
    }
}

/// Verify bookkeeping: the generation last written to each block (0: unknown) and whether I/O
/// is in flight on it.
struct VerifyState {
    seed: u64,
    generation: Vec<u16>,
    busy: Vec<u8>,
    checked: u64,
    errors: Vec<String>,
    bad: u64,
}

struct Job<'a> {
    q: &'a mut dyn Queue,
    start: u64,
    bs: u64,
    buf: *mut u8,
    /// See [`JobCtx::stride`].
    stride: usize,
    slots: Vec<Slot>,
    free: Vec<usize>,
    comps: Vec<Completion>,
    /// Completions returned by the driver but not handled yet (see `reap_upto`).
    ready: std::collections::VecDeque<Completion>,
    /// Slots of the requests enqueued since the last `do_io` (not submitted yet).
    queued: Vec<usize>,
    /// Submit only with a wait (see [`crate::spec::BatchOpts::submit_with_wait`]).
    submit_with_wait: bool,
    inflight: usize,
    verify: Option<VerifyState>,
    collector: Option<Collector>,
    measure_end: Option<Instant>,
    progress: Option<Arc<AtomicU64>>,
    /// The first failed request: read or write, its offset, and the device's error.
    io_error: Option<(&'static str, u64, snapblk_core::Error)>,
    /// Write-buffer handling outside verify mode.
    data: DataGen,
    /// Set by the caller to stop early (see [`RunOpts::stop`]).
    stop: Option<Arc<AtomicBool>>,
}

/// Refills or scrambles write buffers per write (see [`crate::buffer`]).
struct DataGen {
    opts: crate::buffer::BufferOpts,
    rng: snapblk_core::rng::Rng,
    t0: Instant,
}

impl Job<'_> {
    fn block(&self, offset: u64) -> usize {
        ((offset - self.start) / self.bs) as usize
    }

    fn slot_buf(&self, i: usize) -> *mut u8 {
        // SAFETY: `i < iodepth` and the buffer holds iodepth * stride bytes.
        unsafe { self.buf.add(i * self.stride) }
    }

    /// Issue one I/O. In verify mode waits first until no I/O is in flight on the block, so the
    /// expected content of every read is known.
    fn issue(&mut self, dir: Dir, offset: u64, measure: bool, now: Option<Instant>) -> Result<()> {
        let mut waited = false;
        if self.verify.is_some() {
            let b = self.block(offset);
            while self.verify.as_ref().is_some_and(|v| v.busy[b] > 0) {
                self.reap(1)?;
                waited = true;
            }
        }
        while self.free.is_empty() {
            self.reap(1)?;
            waited = true;
        }
        let Some(i) = self.free.pop() else {
            return Err(Error::Other("no free slot".into()));
        };
        let p = self.slot_buf(i);
        let len = self.bs as usize;
        let mut generation = 0u32;
        if let Some(v) = self.verify.as_mut() {
            let b = ((offset - self.start) / self.bs) as usize;
            v.busy[b] += 1;
            if dir == Dir::Write {
                // Generations cycle through 1..=u16::MAX; 0 means "never written by us".
                let g = v.generation[b];
                generation = u32::from(if g == u16::MAX { 1 } else { g + 1 });
                // SAFETY: slot `i` is free, so no request uses its bytes.
                let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
                verify::fill(s, offset, v.seed, generation);
            } else {
                generation = u32::from(v.generation[b]);
            }
        } else if dir == Dir::Write && (self.data.opts.refill || self.data.opts.scramble) {
            // SAFETY: slot `i` is free, so no request uses its bytes.
            let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
            let d = &mut self.data;
            if d.opts.refill {
                crate::buffer::fill(s, &mut d.rng, d.opts.compress_percentage);
            } else {
                let t = now.unwrap_or_else(Instant::now);
                crate::buffer::scramble(s, offset, t.saturating_duration_since(d.t0));
            }
        }
        // Reuse the caller's clock read unless we waited since (one clock read per I/O).
        let submitted = match now {
            Some(t) if !waited => t,
            _ => Instant::now(),
        };
        self.slots[i] = Slot {
            dir,
            offset,
            generation,
            submitted,
            issued: submitted,
            measure,
        };
        let op = match dir {
            Dir::Read => Op::Read {
                offset,
                buf: p,
                len,
            },
            Dir::Write => Op::Write {
                offset,
                buf: p as *const u8,
                len,
            },
        };
        // SAFETY: slot `i`'s bytes stay untouched until its completion is reaped (the slot is
        // only returned to `free` in `reap`), and the buffer outlives the queue.
        unsafe { self.q.enqueue(Request::new(op, i, ReqFlags::NONE)) };
        self.inflight += 1;
        self.queued.push(i);
        Ok(())
    }

    /// Submit what is queued without reaping (fio's `commit`): one `do_io` with no room for
    /// completions, which the driver keeps for the next reap.
    fn commit(&mut self) -> Result<()> {
        loop {
            match self.q.do_io(&mut [], 0, None, None) {
                Ok(_) => break,
                Err(e) if e.errno == libc::EINTR => continue,
                Err(e) => return Err(e.into()),
            }
        }
        // One clock read for the whole batch, as fio's io_uring engine does after its enter.
        self.mark_issued(Instant::now());
        Ok(())
    }

    /// The queued requests were submitted at `t`.
    fn mark_issued(&mut self, t: Instant) {
        for i in self.queued.drain(..) {
            self.slots[i].issued = t;
        }
    }

    /// Reap at least `min` completions (also submitting whatever is queued).
    fn reap(&mut self, min: usize) -> Result<()> {
        self.reap_upto(min, self.comps.len())
    }

    /// Handle at least `min` and at most `max` completions. fio takes at most
    /// `iodepth_batch_complete_max` CQEs off the ring per reap and leaves the rest there, to be
    /// timestamped when a later reap takes them; completions the driver returns beyond `max`
    /// likewise wait in `ready` (as in flight) and get their time when they are handled.
    fn reap_upto(&mut self, min: usize, max: usize) -> Result<()> {
        let min = min.min(self.inflight);
        if self.inflight == 0 {
            return Ok(());
        }
        if self.ready.len() < min.max(1) {
            // Submission and wait are one call here (`submit_with_wait`, or a batch left
            // queued): the requests count as issued when the call starts, so the wait is
            // completion time, not submission time.
            if !self.queued.is_empty() {
                self.mark_issued(Instant::now());
            }
            let want = min.saturating_sub(self.ready.len());
            let n = loop {
                match self.q.do_io(&mut self.comps, want, None, None) {
                    Ok(n) => break n,
                    Err(e) if e.errno == libc::EINTR => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            self.ready.extend(&self.comps[..n]);
        } else if !self.queued.is_empty() && !self.submit_with_wait {
            // fio commits what is queued before every reap, even one served from the ring.
            self.commit()?;
        }
        let now = Instant::now();
        let n = self.ready.len().min(max.max(min));
        for _ in 0..n {
            let Some(c) = self.ready.pop_front() else {
                break;
            };
            let i = c.user_data;
            let Some(slot) = self.slots.get(i).copied() else {
                return Err(Error::Other(format!(
                    "completion with unknown user_data {i}"
                )));
            };
            self.inflight -= 1;
            self.free.push(i);
            if c.ret < 0 {
                if self.io_error.is_none() {
                    let e = c
                        .result()
                        .err()
                        .unwrap_or_else(|| snapblk_core::Error::from_errno(-c.ret));
                    let d = if slot.dir == Dir::Read {
                        "read"
                    } else {
                        "write"
                    };
                    self.io_error = Some((d, slot.offset, e));
                }
                continue;
            }
            if let Some(v) = self.verify.as_mut() {
                let b = ((slot.offset - self.start) / self.bs) as usize;
                v.busy[b] = v.busy[b].saturating_sub(1);
                match slot.dir {
                    Dir::Write => v.generation[b] = slot.generation as u16,
                    Dir::Read if slot.generation != 0 => {
                        // SAFETY: the read completed; nobody else touches this slot's bytes.
                        let s = unsafe {
                            std::slice::from_raw_parts(
                                self.buf.add(i * self.stride),
                                self.bs as usize,
                            )
                        };
                        v.checked += 1;
                        if let Err(m) = verify::check(s, slot.offset, v.seed, slot.generation) {
                            v.bad += 1;
                            if v.errors.len() < 5 {
                                v.errors.push(m);
                            }
                        }
                    }
                    Dir::Read => {}
                }
            }
            if slot.measure
                && let Some(col) = self.collector.as_mut()
                && now >= col.start
                && self.measure_end.is_none_or(|e| now <= e)
            {
                col.record(now, &slot, self.bs);
            }
        }
        if let Some(p) = &self.progress {
            p.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        while self.inflight > 0 {
            self.reap(self.inflight)?;
        }
        Ok(())
    }

    fn check_io_error(&self) -> Result<()> {
        match &self.io_error {
            Some((op, offset, e)) => Err(Error::Request {
                op,
                len: self.bs,
                offset: *offset,
                source: e.clone(),
            }),
            None => Ok(()),
        }
    }

    fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// One unmeasured pass over every block with `dir` (verify prefill and read-back). A stop
    /// request ends it early: blocks never written keep generation 0 and are not checked.
    fn pass(&mut self, dir: Dir, blocks: u64, only_written: bool) -> Result<()> {
        for b in 0..blocks {
            if self.stopped() {
                break;
            }
            if only_written
                && self
                    .verify
                    .as_ref()
                    .is_some_and(|v| v.generation[b as usize] == 0)
            {
                continue;
            }
            self.issue(dir, self.start + b * self.bs, false, None)?;
            self.check_io_error()?;
        }
        self.drain()?;
        self.check_io_error()
    }
}

fn run_job(q: &mut dyn Queue, ctx: JobCtx<'_>) -> Result<JobResult> {
    let spec = ctx.spec;
    let qd = spec.iodepth as usize;
    // The engine waits in do_io and never polls the completion fd: spare drivers the eventfd
    // write per completion batch.
    q.set_completion_fd_enabled(false);
    let new_offsets = || {
        OffsetGen::new(
            spec.rw,
            spec.rwmixread,
            ctx.region,
            spec.bs,
            spec.seed,
            ctx.job,
        )
    };
    let mut offsets = new_offsets();
    let blocks = offsets.blocks();
    let verify = if spec.verify {
        if blocks > MAX_VERIFY_BLOCKS {
            ctx.barrier.wait();
            return Err(Error::Spec(format!(
                "verify supports at most {MAX_VERIFY_BLOCKS} blocks per job"
            )));
        }
        Some(VerifyState {
            seed: verify::run_stamp(spec.seed),
            generation: vec![0; blocks as usize],
            busy: vec![0; blocks as usize],
            checked: 0,
            errors: Vec::new(),
            bad: 0,
        })
    } else {
        None
    };
    let t0_slots = Instant::now();
    let mut job = Job {
        q,
        start: ctx.region.0,
        bs: spec.bs,
        buf: ctx.buf.addr.wrapping_add(
            (ctx.buf.addr as usize).next_multiple_of(ctx.buf_align) - ctx.buf.addr as usize,
        ),
        stride: ctx.stride,
        slots: vec![
            Slot {
                dir: Dir::Read,
                offset: 0,
                generation: 0,
                submitted: t0_slots,
                issued: t0_slots,
                measure: false
            };
            qd
        ],
        free: (0..qd).rev().collect(),
        comps: vec![Completion::default(); qd],
        ready: std::collections::VecDeque::with_capacity(qd),
        queued: Vec::with_capacity(qd),
        submit_with_wait: spec.batch.submit_with_wait,
        inflight: 0,
        verify,
        collector: None,
        measure_end: None,
        progress: ctx.progress.clone(),
        io_error: None,
        data: DataGen {
            opts: spec.buffers,
            rng: snapblk_core::rng::Rng::new(
                spec.seed ^ snapblk_core::rng::mix(u64::from(ctx.job) + 1),
            ),
            t0: Instant::now(),
        },
        stop: ctx.stop.clone(),
    };
    if job.verify.is_none() {
        // Random write data, filled once (fio's default); refilled or scrambled per write.
        for i in 0..qd {
            // SAFETY: no I/O is in flight; slot `i`'s bs bytes lie inside the buffer.
            let b = unsafe { std::slice::from_raw_parts_mut(job.slot_buf(i), spec.bs as usize) };
            crate::buffer::fill(b, &mut job.data.rng, spec.buffers.compress_percentage);
        }
    }
    // Reads in verify mode need known content: write the region first (not measured).
    let prefill = if job.verify.is_some() && spec.rw.read_pct(spec.rwmixread) > 0 {
        job.pass(Dir::Write, blocks, false)
    } else {
        Ok(())
    };
    // Every job passes the barrier exactly once, even on failure, so no thread waits forever.
    ctx.barrier.wait();
    prefill?;
    let t0 = Instant::now();
    let measure_start = t0 + Duration::from_secs_f64(spec.ramp_time);
    let time_based = spec.time_based && spec.runtime.is_some();
    let end = spec
        .runtime
        .map(|r| measure_start + Duration::from_secs_f64(r));
    job.collector = Some(Collector::new(measure_start));
    job.measure_end = end;
    // fio's loop (backend.c do_io): queue one request; submit when `iodepth_batch_submit` are
    // queued; when the queue is full, reap between `iodepth_batch_complete_min` and `_max`
    // (which also submits what is still queued).
    let submit_batch = spec.batch.submit_batch(spec.iodepth);
    // A size-based run with a ramp does as fio does: loop over the region during the ramp, then
    // one full, measured pass from its start (otherwise the ramp could use up the only pass).
    let mut ramping = !time_based && spec.ramp_time > 0.0;
    let result = (|| -> Result<()> {
        loop {
            let mut done = false;
            while job.inflight < qd {
                let now = Instant::now();
                if let Some(e) = end
                    && now >= e
                {
                    done = true;
                    break;
                }
                if job.stopped() || ctx.failed.load(Ordering::Relaxed) {
                    done = true;
                    break;
                }
                if ramping && now >= measure_start {
                    ramping = false;
                    offsets = new_offsets();
                }
                match offsets.next(time_based || ramping) {
                    Some((dir, off)) => job.issue(dir, off, true, Some(now))?,
                    None => {
                        done = true;
                        break;
                    }
                }
                if job.queued.len() >= submit_batch {
                    job.commit()?;
                }
            }
            job.check_io_error()?;
            if done {
                break;
            }
            let (min, max) = spec.batch.reap_range(job.inflight);
            job.reap_upto(min, max)?;
            job.check_io_error()?;
        }
        job.drain()?;
        job.check_io_error()
    })();
    if result.is_err() {
        ctx.failed.store(true, Ordering::Relaxed);
        let _ = job.drain();
        result?;
    }
    let measured_to = match end {
        Some(e) if time_based => e.min(Instant::now()),
        // Size-based (capped by a runtime or not): up to the last completion.
        _ => job
            .collector
            .as_ref()
            .and_then(|c| c.last)
            .unwrap_or(measure_start),
    };
    let seconds = measured_to
        .saturating_duration_since(measure_start)
        .as_secs_f64();
    let mut col = job
        .collector
        .take()
        .unwrap_or_else(|| Collector::new(measure_start));
    if col.last.is_some() {
        col.flush_second();
    }
    // Read everything back (not measured) when the workload wrote.
    if job.verify.is_some() && spec.rw.read_pct(spec.rwmixread) < 100 {
        job.pass(Dir::Read, blocks, true)?;
    }
    let mut verified_blocks = 0;
    if let Some(v) = &job.verify {
        verified_blocks = v.checked;
        if v.bad > 0 {
            ctx.failed.store(true, Ordering::Relaxed);
            return Err(Error::Verify {
                job: ctx.job,
                bad: v.bad,
                checked: v.checked,
                errors: v.errors.clone(),
            });
        }
    }
    Ok(JobResult {
        job: ctx.job,
        region: ctx.region,
        read: col.read,
        write: col.write,
        seconds,
        series: col.series,
        verified_blocks,
    })
}
