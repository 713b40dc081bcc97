//! The ublk queue threads and their life cycle. Each queue thread runs a task per tag that
//! fetches requests from the kernel and serves them through the device queue (generic path) or
//! the read planner (zero-copy path); [`run_device`] starts the threads, starts the device once
//! every thread is set up, waits for a stop request or a failure, and stops everything.

use crate::bridge::CoreQueue;
use crate::plan::{ReadPlanner, Segment, validate};
use crate::{DataPath, Error, ublk_err, ublk_io_error};
use io_uring::{opcode, squeue, types};
use libublk::ctrl::UblkCtrl;
use libublk::helpers::IoBuf;
use libublk::io::{BufDesc, UblkDev, UblkIOCtx, UblkQueue, with_task_io_ring_mut};
use libublk::uring_async::{
    UblkUringOpFuture, ublk_reap_io_events_with_update_queue, ublk_submit_sqe_async,
    ublk_wake_task, uring_poll_io_fn,
};
use libublk::{UblkError, UblkUringData, sys};
use snapblk_core::sync::{lock, wait};
use snapblk_core::sys::EventFd;
use snapblk_core::{Chain, IoDir, IoStats, Op, Queue, ReqFlags, Request};
use std::cell::RefCell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Fixed-file slots in every queue ring: 0 is /dev/ublkcN (libublk), then /dev/zero, then the
/// planner's files.
pub(crate) const ZERO_FILE: u32 = 1;
pub(crate) const FIRST_PLAN_FILE: u32 = 2;

/// Planned reads (READ_FIXED) one request has in flight at most in zero-copy mode: a plan may
/// have a segment per block, so its kernel-side segments are issued in windows of this many.
pub(crate) const READS_IN_FLIGHT: usize = 8;

/// Completion queue entries of the ring of a queue with `depth` tags. A tag has in flight either
/// its ublk command, or up to READS_IN_FLIGHT planned reads plus one that finishes a short read;
/// the completion and quit watchers add one each. libublk's default, `depth`, let a fragmented
/// zero-copy read overflow the completion queue.
pub(crate) fn cq_entries(depth: u16) -> u16 {
    let n = usize::from(depth) * (READS_IN_FLIGHT + 1) + 2;
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// How often the serving thread looks at the stop source and the queue threads.
const POLL: Duration = Duration::from_millis(100);
/// How long a queue thread that leaves waits for the device to complete the requests it still
/// has in flight before it leaks their buffers rather than free memory the device may write.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How long the serving thread waits for a helper thread blocked in a control command (START_DEV
/// after a queue thread failed, STOP_DEV) once the queue threads are gone.
const HELPER_LIMIT: Duration = Duration::from_secs(5);
/// After a second stop request, how long the serving thread waits for the queue threads before
/// it returns anyway ([`Error::ForcedTimeout`]).
pub(crate) const FORCED_STOP_WAIT: Duration = Duration::from_secs(5);

/// Everything a queue thread needs; shared by all queue threads.
pub(crate) struct Shared {
    pub queues: Mutex<Vec<Option<Box<dyn Queue>>>>,
    pub planner: Option<Arc<dyn ReadPlanner>>,
    pub nplan_files: usize,
    pub path: DataPath,
    pub max_io: u32,
    pub stats: Arc<IoStats>,
}

/// Faults the VM tests inject (`tests/suites/ublk-vm.sh`). They are read from the environment
/// variable `SNAPBLK_UBLK_FAULT` (comma-separated words, e.g. `setup-fail=1`) only in a build
/// with the crate's `fault-injection` feature; every other build ignores the variable.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Faults {
    /// `setup-fail=Q`: the setup of ublk queue Q fails (as a failing `UblkQueue::new` would).
    pub setup_fail: Option<u16>,
    /// `reject-commit=N`: from the N-th request of queue 0 on, the kernel rejects every
    /// COMMIT_AND_FETCH of that request's tag (see `Ctx::commit_tag`).
    pub reject_commit: Option<u64>,
    /// `hang-read=S`: a READ starting at sector S never completes (a device that hangs).
    pub hang_read: Option<u64>,
    /// `stop-dev-fail`: STOP_DEV fails (without reaching the kernel).
    pub stop_dev_fail: bool,
}

impl Faults {
    /// The faults of this process: none unless built with `fault-injection`.
    pub(crate) fn from_env() -> Faults {
        #[cfg(feature = "fault-injection")]
        if let Ok(v) = std::env::var("SNAPBLK_UBLK_FAULT") {
            let f = Faults::parse(&v);
            log::warn!("fault injection (SNAPBLK_UBLK_FAULT): {f:?}");
            return f;
        }
        Faults::default()
    }

    /// Parse `SNAPBLK_UBLK_FAULT`; unknown words are logged and ignored.
    #[cfg_attr(not(any(test, feature = "fault-injection")), allow(dead_code))]
    pub(crate) fn parse(s: &str) -> Faults {
        let mut f = Faults::default();
        for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let (k, v) = w.split_once('=').unwrap_or((w, ""));
            match (k, v.parse::<u64>().ok()) {
                ("setup-fail", Some(q)) => f.setup_fail = u16::try_from(q).ok(),
                ("reject-commit", Some(n)) => f.reject_commit = Some(n.max(1)),
                ("hang-read", Some(n)) => f.hang_read = Some(n),
                ("stop-dev-fail", None) if v.is_empty() => f.stop_dev_fail = true,
                _ => log::warn!("SNAPBLK_UBLK_FAULT: unknown fault {w:?}"),
            }
        }
        f
    }
}

/// What the queue threads and the serving thread share to end the run: the first failure, and
/// the request that every queue thread leave its loop.
pub(crate) struct Control {
    quit: AtomicBool,
    /// Readable once `quit` is set; every queue ring polls it, so a sleeping thread wakes up.
    quit_fd: EventFd,
    failure: Mutex<Option<Error>>,
    faults: Faults,
}

impl Control {
    fn new(faults: Faults) -> Result<Control, Error> {
        Ok(Control {
            quit: AtomicBool::new(false),
            quit_fd: EventFd::new().map_err(|e| Error::Io {
                what: "create the queue threads' stop eventfd",
                source: std::io::Error::from_raw_os_error(e.errno),
            })?,
            failure: Mutex::new(None),
            faults,
        })
    }

    /// Ask every queue thread to leave its loop now (in-flight ublk commands are abandoned:
    /// the kernel aborts them when the rings close).
    fn quit(&self) {
        if !self.quit.swap(true, Ordering::SeqCst) {
            self.quit_fd.signal();
        }
    }

    fn quitting(&self) -> bool {
        self.quit.load(Ordering::SeqCst)
    }

    /// Record a failure (the first one is what `serve` returns) and stop the queue threads.
    fn fail(&self, e: Error) {
        log::error!("{}", Chain(&e));
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(e);
        }
        drop(f);
        self.quit();
    }

    fn failed(&self) -> bool {
        lock(&self.failure).is_some()
    }

    fn take_failure(&self) -> Option<Error> {
        lock(&self.failure).take()
    }
}

/// Holds the queue threads after their setup until the serving thread knows whether every queue
/// came up: no thread fetches requests for a device that will not start.
#[derive(Default)]
struct Gate {
    go: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Gate {
    fn set(&self, go: bool) {
        *lock(&self.go) = Some(go);
        self.cv.notify_all();
    }
    fn wait(&self) -> bool {
        let mut g = lock(&self.go);
        loop {
            if let Some(go) = *g {
                return go;
            }
            g = wait(&self.cv, g);
        }
    }
}

struct Ctx<'a> {
    q: &'a UblkQueue<'a>,
    core: &'a CoreQueue,
    shared: &'a Shared,
    cdev: RawFd,
    faults: Faults,
    /// Requests served (counted only for `Faults::reject_commit`).
    served: std::cell::Cell<u64>,
    /// The tag whose commits the kernel is made to reject (`Faults::reject_commit`).
    poisoned: std::cell::Cell<Option<u16>>,
    /// What this queue's zero-copy plans held.
    plans: PlanCounts,
}

/// What the zero-copy read plans of one queue held, logged (at info level) when the queue
/// stops: how many segments the kernel read (file, zeros), how many went through the device.
#[derive(Default)]
struct PlanCounts {
    reads: std::cell::Cell<u64>,
    file: std::cell::Cell<u64>,
    zero: std::cell::Cell<u64>,
    device: std::cell::Cell<u64>,
    device_bytes: std::cell::Cell<u64>,
}

impl PlanCounts {
    fn add(c: &std::cell::Cell<u64>, n: u64) {
        c.set(c.get() + n);
    }
    /// Count one validated plan.
    fn note(&self, plan: &[Segment]) {
        Self::add(&self.reads, 1);
        for s in plan {
            match *s {
                Segment::File { .. } => Self::add(&self.file, 1),
                Segment::Zero { .. } => Self::add(&self.zero, 1),
                Segment::Device { len, .. } => {
                    Self::add(&self.device, 1);
                    Self::add(&self.device_bytes, u64::from(len));
                }
            }
        }
    }
    fn log(&self, qid: u16) {
        if self.reads.get() > 0 {
            log::info!(
                "ublk queue {qid}: {} planned reads: {} file, {} zero and {} device segments \
                 ({} bytes through the device)",
                self.reads.get(),
                self.file.get(),
                self.zero.get(),
                self.device.get(),
                self.device_bytes.get()
            );
        }
    }
}

impl Ctx<'_> {
    /// The tag to name in the COMMIT_AND_FETCH of `tag`'s result: `tag`, except under the
    /// `reject-commit=N` fault, where from queue 0's N-th request on one tag's commits name a
    /// tag past the queue depth, which the kernel rejects (EINVAL) on every kernel.
    fn commit_tag(&self, tag: u16) -> u16 {
        let Some(n) = self.faults.reject_commit else {
            return tag;
        };
        if self.q.get_qid() != 0 {
            return tag;
        }
        let c = self.served.get() + 1;
        self.served.set(c);
        if self.poisoned.get().is_none() && c >= n {
            self.poisoned.set(Some(tag));
        }
        if self.poisoned.get() == Some(tag) {
            log::warn!("fault injection: COMMIT_AND_FETCH of tag {tag} names an invalid tag");
            return u16::try_from(self.q.get_depth()).unwrap_or(u16::MAX);
        }
        tag
    }
}

/// Serve the device: start one thread per ublk queue, start the device (START_DEV, or
/// END_USER_RECOVERY for a recovered one) once every queue thread is set up, run `on_ready`, and
/// serve until `stop` reports a stop request or a queue thread fails. `stop(d)` waits up to `d`
/// and returns whether a stop was requested. The first failure of a queue thread (its setup, a
/// ublk command, its event loop) is the result; no failure is only printed.
///
/// The first stop request sends STOP_DEV (the kernel drains in-flight I/O, then aborts the
/// queues' commands). A second one forces the stop: STOP_DEV if none was sent, the queue threads
/// leave at once, and the result is [`Error::Forced`], or [`Error::ForcedTimeout`] if they are
/// not gone within [`FORCED_STOP_WAIT`]. A failed STOP_DEV is the result too (the queue threads
/// then leave, and the device is deleted without its server).
pub(crate) fn run_device(
    ctrl: UblkCtrl,
    udev: UblkDev,
    shared: Arc<Shared>,
    faults: Faults,
    on_ready: impl FnOnce(&UblkCtrl),
    stop: &mut dyn FnMut(Duration) -> bool,
) -> Result<(), Error> {
    let ctrl = Arc::new(ctrl);
    let udev = Arc::new(udev);
    let ctl = Arc::new(Control::new(faults)?);
    let gate = Arc::new(Gate::default());
    let nq = udev.dev_info.nr_hw_queues;
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for qid in 0..nq {
        let (udev, shared, c, gate, tx) = (
            udev.clone(),
            shared.clone(),
            ctl.clone(),
            gate.clone(),
            tx.clone(),
        );
        let h = std::thread::Builder::new()
            .name(format!("ublk-q{qid}"))
            .spawn(move || queue_thread(qid, &udev, &shared, &c, &gate, tx));
        match h {
            Ok(h) => threads.push((qid, h)),
            Err(source) => {
                ctl.fail(Error::Io {
                    what: "start a queue thread",
                    source,
                });
                break;
            }
        }
    }
    drop(tx);
    // What run_target does with each queue thread: CPU affinity, and the device's JSON once
    // every queue has its thread id.
    for (qid, tid, ok) in rx.iter() {
        ctrl.set_thread_affinity(qid, tid);
        if ok && let Err(e) = ctrl.configure_queue(&udev, qid, tid) {
            log::warn!(
                "ublk queue {qid}: {}",
                Chain(&ublk_err("write the device JSON")(e))
            );
        }
    }
    if ctl.failed() {
        // A queue failed at setup: nobody fetched anything, nothing was started.
        gate.set(false);
        join_queue_threads(threads, &ctl);
        return Err(ctl.take_failure().unwrap_or(Error::Config(
            "a queue thread failed without a reason".into(),
        )));
    }
    gate.set(true);

    // START_DEV waits in the kernel until every tag has fetched; a queue thread that fails
    // before would leave the caller waiting, so it runs on a helper thread.
    let starter = {
        let (ctrl, udev) = (ctrl.clone(), udev.clone());
        std::thread::Builder::new()
            .name("ublk-start".into())
            .spawn(move || init_ctrl_ring().and_then(|_| ctrl.start_dev(&udev)))
            .map_err(|source| Error::Io {
                what: "start the device start thread",
                source,
            })
    };
    let mut starter = match starter {
        Ok(h) => Some(h),
        Err(e) => {
            ctl.fail(e);
            None
        }
    };
    let mut on_ready = Some(on_ready);
    let id = ctrl.dev_info().dev_id;
    let mut stops = 0u32;
    let mut stopper: Option<JoinHandle<Result<(), Error>>> = None;
    let mut stop_err: Option<Error> = None;
    let mut forced: Option<Instant> = None;
    let mut gone_since: Option<Instant> = None;
    loop {
        if let Some(h) = starter.take_if(|h| h.is_finished()) {
            match h.join() {
                Ok(Ok(_)) if !ctl.quitting() && stops == 0 => {
                    if let Some(f) = on_ready.take() {
                        f(&ctrl);
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => ctl.fail(ublk_err("start the device")(e)),
                Err(_) => ctl.fail(Error::Config("the device start thread panicked".into())),
            }
        }
        if let Some(h) = stopper.take_if(|h| h.is_finished()) {
            stop_failed(h.join(), &mut stop_err, &ctl);
        }
        let queues_gone = threads.iter().all(|(_, h)| h.is_finished());
        if queues_gone && starter.is_none() {
            break;
        }
        if queues_gone {
            // Only the start is left, blocked in the kernel: give up on it after a while
            // (process exit ends it).
            let t = *gone_since.get_or_insert_with(Instant::now);
            if t.elapsed() > HELPER_LIMIT {
                log::error!("the device start did not return; leaving it behind");
                break;
            }
        }
        if forced.is_some_and(|t| t.elapsed() > FORCED_STOP_WAIT) {
            break;
        }
        // Every request counts, also while stopping: the second one forces the stop.
        if !stop(POLL) {
            continue;
        }
        stops += 1;
        if stops == 1 {
            if starter.is_some() || ctl.quitting() {
                // Not started (nothing to drain), or already leaving.
                ctl.quit();
            } else {
                // STOP_DEV: the kernel removes the disk after draining in-flight I/O, then the
                // queue threads see their commands aborted and leave. On a helper thread: it
                // waits for requests the server may never complete.
                stopper = start_stopper(id, ctl.faults, &mut stop_err, &ctl);
            }
        } else if forced.is_none() {
            log::warn!(
                "second stop request: forcing the stop (I/O in flight fails; exit within {} s)",
                FORCED_STOP_WAIT.as_secs()
            );
            forced = Some(Instant::now());
            if stopper.is_none() && starter.is_none() && stop_err.is_none() {
                stopper = start_stopper(id, ctl.faults, &mut stop_err, &ctl);
            }
            // The queue threads leave now; once their rings and the char device are closed,
            // the kernel gives back the requests they held, and a waiting STOP_DEV finishes.
            ctl.quit();
        }
    }
    let forced_err = |drained| match drained {
        true => Error::Forced,
        false => Error::ForcedTimeout(FORCED_STOP_WAIT),
    };
    if !threads.iter().all(|(_, h)| h.is_finished()) {
        // Forced and still not done: leave the threads, the device and its control behind
        // (deleting the device would wait for the threads); process exit ends them.
        log::error!("the queue threads did not end in time; leaving them behind");
        std::mem::forget(udev);
        std::mem::forget(ctrl);
        return Err(ctl.take_failure().or(stop_err).unwrap_or(forced_err(false)));
    }
    join_queue_threads(threads, &ctl);
    if let Some(h) = starter {
        // Blocked in START_DEV: it holds the device and its control; both stay with it.
        drop(h);
        std::mem::forget(udev);
        std::mem::forget(ctrl);
        return Err(ctl
            .take_failure()
            .unwrap_or(Error::Config("the device did not start".into())));
    }
    // Closing the char device gives the kernel back the requests the queues held: a STOP_DEV
    // waiting for them finishes.
    drop(udev);
    if let Some(h) = stopper {
        let end = Instant::now() + HELPER_LIMIT;
        while !h.is_finished() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        if h.is_finished() {
            stop_failed(h.join(), &mut stop_err, &ctl);
        } else {
            log::error!("STOP_DEV did not return; leaving it behind");
            std::mem::forget(ctrl);
            return Err(ctl.take_failure().or(stop_err).unwrap_or(forced_err(false)));
        }
    }
    // Removes the device's JSON; the device is already stopped (or never served).
    let _ = ctrl.stop_dev();
    match (ctl.take_failure(), stop_err) {
        (Some(e), _) | (None, Some(e)) => Err(e),
        (None, None) if forced.is_some() => Err(forced_err(true)),
        (None, None) => Ok(()),
    }
}

/// STOP_DEV for device `id` on a helper thread, with its own control (the serving thread's may be
/// held by a START_DEV that never returned). A failure to start the thread is a failed stop.
fn start_stopper(
    id: u32,
    faults: Faults,
    stop_err: &mut Option<Error>,
    ctl: &Control,
) -> Option<JoinHandle<Result<(), Error>>> {
    let h = std::thread::Builder::new()
        .name("ublk-stop".into())
        .spawn(move || {
            if faults.stop_dev_fail {
                log::warn!("fault injection: STOP_DEV fails");
                return Err(Error::Ublk {
                    what: "STOP_DEV (fault injected by SNAPBLK_UBLK_FAULT)",
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                });
            }
            let c = UblkCtrl::new_simple(i32::try_from(id).unwrap_or(i32::MAX))
                .map_err(ublk_err("open the device's control for STOP_DEV"))?;
            c.kill_dev().map(|_| ()).map_err(ublk_err("STOP_DEV"))
        });
    match h {
        Ok(h) => Some(h),
        Err(source) => {
            stop_failed(
                Ok(Err(Error::Io {
                    what: "start the STOP_DEV thread",
                    source,
                })),
                stop_err,
                ctl,
            );
            None
        }
    }
}

/// A STOP_DEV that failed leaves the device live: report it (the run's result is an error) and
/// make the queue threads leave, so the device is deleted without its server.
fn stop_failed(
    r: std::thread::Result<Result<(), Error>>,
    stop_err: &mut Option<Error>,
    ctl: &Control,
) {
    let e = match r {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(_) => Error::Config("the STOP_DEV thread panicked".into()),
    };
    log::error!("{}", Chain(&e));
    stop_err.get_or_insert(e);
    ctl.quit();
}

/// libublk sends control commands through a ring of the calling thread; a helper thread needs
/// its own before it uses a control made on another thread.
fn init_ctrl_ring() -> Result<(), UblkError> {
    libublk::ctrl::ublk_init_ctrl_task_ring(|r| {
        if r.is_none() {
            *r = Some(
                io_uring::IoUring::<squeue::Entry128>::builder()
                    .build(16)
                    .map_err(UblkError::IOError)?,
            );
        }
        Ok(())
    })
}

fn join_queue_threads(threads: Vec<(u16, JoinHandle<()>)>, ctl: &Control) {
    for (qid, h) in threads {
        if h.join().is_err() {
            ctl.fail(Error::Queue {
                qid,
                source: Box::new(Error::Config("the queue thread panicked".into())),
            });
        }
    }
}

/// Body of the queue thread `qid`: set up, report to the serving thread, wait for the go, serve.
/// Every failure goes to `ctl` (and so to `serve`'s caller), tagged with the queue.
fn queue_thread(
    qid: u16,
    dev: &UblkDev,
    shared: &Shared,
    ctl: &Control,
    gate: &Gate,
    report: mpsc::Sender<(u16, libc::pid_t, bool)>,
) {
    let tid = UblkCtrl::init_queue_thread();
    let setup = setup_queue(qid, dev, shared, ctl.faults);
    let queue_err = |e| Error::Queue {
        qid,
        source: Box::new(e),
    };
    let (core, q) = match setup {
        Ok(s) => s,
        Err(e) => {
            // Recorded before the report, so the serving thread sees it once all reported.
            ctl.fail(queue_err(e));
            let _ = report.send((qid, tid, false));
            return;
        }
    };
    let _ = report.send((qid, tid, true));
    drop(report);
    if !gate.wait() {
        return;
    }
    if let Err(e) = serve_queue(qid, dev, shared, ctl, &core, &q) {
        ctl.fail(queue_err(e));
    }
}

fn setup_queue<'a>(
    qid: u16,
    dev: &'a UblkDev,
    shared: &Shared,
    faults: Faults,
) -> Result<(CoreQueue, UblkQueue<'a>), Error> {
    let devq = lock(&shared.queues)
        .get_mut(usize::from(qid))
        .and_then(Option::take)
        .ok_or_else(|| Error::Config("no device queue for this ublk queue".into()))?;
    if faults.setup_fail == Some(qid) {
        return Err(Error::Io {
            what: "set up the queue (fault injected by SNAPBLK_UBLK_FAULT)",
            source: std::io::Error::from_raw_os_error(libc::EIO),
        });
    }
    let core = CoreQueue::new(devq, usize::from(dev.dev_info.queue_depth));
    let q = UblkQueue::new(qid, dev).map_err(ublk_err("set up the queue ring"))?;
    Ok((core, q))
}

/// Serve queue `q` until the kernel aborts its commands (device stopped) or `ctl` says quit.
fn serve_queue(
    qid: u16,
    dev: &UblkDev,
    shared: &Shared,
    ctl: &Control,
    core: &CoreQueue,
    q: &UblkQueue<'_>,
) -> Result<(), Error> {
    let ctx = Ctx {
        q,
        core,
        shared,
        cdev: dev.tgt.fds[0],
        faults: ctl.faults,
        served: std::cell::Cell::new(0),
        poisoned: std::cell::Cell::new(None),
        plans: PlanCounts::default(),
    };
    let exe = smol::LocalExecutor::new();
    let mut tasks = Vec::new();
    for tag in q.tags() {
        let ctx = &ctx;
        tasks.push(exe.spawn(async move {
            if let Err(e) = io_task(ctx, tag).await {
                ctl.fail(Error::Queue {
                    qid,
                    source: Box::new(e),
                });
            }
        }));
    }
    let ntags = tasks.len();
    // Wakes the loop when the device queue completes something while the ring sleeps, and
    // when the serving thread asks the queue threads to quit.
    tasks.push(exe.spawn(completion_watch(core.completion_fd())));
    tasks.push(exe.spawn(quit_watch(ctl.quit_fd.raw())));
    let run_ops = || {
        loop {
            while exe.try_tick() {}
            if core.pump() == 0 {
                break;
            }
        }
    };
    let done = || tasks[..ntags].iter().all(|t| t.is_finished());
    let overflows = std::cell::Cell::new(0);
    let r = event_loop(q, ctl, run_ops, done, &overflows);
    ctx.plans.log(qid);
    let dropped = with_task_io_ring_mut(|r| r.completion().overflow());
    if overflows.get() > 0 || dropped > 0 {
        log::warn!(
            "ublk queue {qid}: its completion queue overflowed ({} times seen, {dropped} \
             completions dropped)",
            overflows.get()
        );
    }
    // The tasks own the buffers of their device requests: those requests must be complete
    // before the tasks go (see `CoreQueue::submit`). They are, unless the loop ended early.
    if !core.drain(DRAIN_LIMIT) {
        log::error!(
            "ublk queue {qid}: the device did not complete {} request(s) within {DRAIN_LIMIT:?}; \
             their buffers are leaked",
            core.outstanding()
        );
        std::mem::forget(tasks);
        std::mem::forget(exe);
    }
    r
}

/// The queue's event loop (libublk's `wait_and_handle_io_events`, which cannot be left early):
/// wait for completions, wake their tasks, run the tasks and the device queue; leave when the
/// kernel aborted the queue's commands and every tag task ended, or when `ctl` says quit.
fn event_loop(
    q: &UblkQueue<'_>,
    ctl: &Control,
    run_ops: impl Fn(),
    done: impl Fn() -> bool,
    overflows: &std::cell::Cell<u64>,
) -> Result<(), Error> {
    let idle = types::Timespec::new().sec(20);
    run_ops();
    loop {
        let (timeout, failed) = match uring_poll_io_fn::<squeue::Entry>(q, Some(idle), 1) {
            Ok(t) => (t, false),
            Err(_) => (false, true),
        };
        // Completions the kernel could not post because the completion queue was full.
        if with_task_io_ring_mut(|r| r.submission().cq_overflow()) {
            overflows.set(overflows.get() + 1);
        }
        let aborted = ublk_reap_io_events_with_update_queue(q, timeout, None, |cqe| {
            ublk_wake_task(cqe.user_data(), cqe)
        })
        .map_err(ublk_err("reap completions"))?;
        run_ops();
        if ((aborted || failed) && done()) || ctl.quitting() {
            return Ok(());
        }
    }
}

/// Resolves once the quit eventfd is readable (it stays readable).
async fn quit_watch(fd: RawFd) {
    let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
    let _ = ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await;
}

/// Poll the device queue's completion eventfd through the ublk ring; each wake-up clears it and
/// lets the event loop run `pump`. Without an eventfd, tick every millisecond.
async fn completion_watch(fd: Option<RawFd>) {
    loop {
        let r = match fd {
            Some(fd) => {
                let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
                ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await
            }
            None => {
                let ts = Box::new(types::Timespec::new().nsec(1_000_000));
                let sqe = opcode::Timeout::new(&*ts).build();
                let r = ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await;
                // The timespec must outlive the SQE; leaking 16 bytes per tick is not an option,
                // so keep it until the completion arrived (it has: we awaited it).
                drop(ts);
                r
            }
        };
        match (r, fd) {
            (Ok(_), Some(fd)) => clear_eventfd(fd),
            (Ok(_), None) => {}
            (Err(_), _) => return,
        }
    }
}

fn clear_eventfd(fd: RawFd) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a u64; the fd was just reported readable, so this does not
        // block (only this thread consumes it).
        unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    }
}

/// Serve tag `tag` until the kernel aborts its command (`Ok`) or a command fails.
async fn io_task(ctx: &Ctx<'_>, tag: u16) -> Result<(), Error> {
    let q = ctx.q;
    let max_io = ctx.shared.max_io as usize;
    // Copy mode: the kernel copies request data to/from this per-tag buffer.
    let buf = match ctx.shared.path {
        DataPath::Copy => Some(IoBuf::<u8>::new(max_io)),
        _ => None,
    };
    // User copy / zero copy: staging buffer for the generic path, allocated on first use.
    let bounce: RefCell<Option<IoBuf<u8>>> = RefCell::new(None);
    let reg = sys::ublk_auto_buf_reg {
        index: tag,
        ..Default::default()
    };
    let desc = match (&ctx.shared.path, &buf) {
        (DataPath::Copy, Some(b)) => BufDesc::Slice(b.as_slice()),
        (DataPath::ZeroCopy, _) => BufDesc::AutoReg(reg),
        _ => BufDesc::Slice(&[]),
    };
    let r = q
        .submit_io_prep_cmd(tag, desc.clone(), 0, buf.as_ref())
        .await;
    if !fetched(r, "FETCH", tag)? {
        return Ok(());
    }
    loop {
        let t0 = Instant::now();
        let res = handle(ctx, tag, buf.as_ref(), &bounce).await;
        count(ctx, tag, res, t0);
        let r = q
            .submit_io_commit_cmd(ctx.commit_tag(tag), desc.clone(), res)
            .await;
        if !fetched(r, "COMMIT_AND_FETCH", tag)? {
            return Ok(());
        }
    }
}

/// The result of a FETCH or COMMIT_AND_FETCH: `Ok(true)` when it brought the tag's next
/// request, `Ok(false)` when the kernel aborted it (the device is stopping). Anything else is an
/// error: a command the kernel rejected left the tag's request with the kernel, and serving the
/// tag's descriptor again would repeat the old request for ever; the server must stop.
fn fetched(r: Result<i32, UblkError>, what: &'static str, tag: u16) -> Result<bool, Error> {
    let source = match r {
        Ok(n) if n == sys::UBLK_IO_RES_OK as i32 => return Ok(true),
        Err(UblkError::QueueIsDown) => return Ok(false),
        // The kernel's answer: a negative errno (UBLK_IO_RES_ABORT is QueueIsDown above).
        Ok(n) if n < 0 => std::io::Error::from_raw_os_error(-n),
        // UBLK_IO_RES_NEED_GET_DATA: only for UBLK_F_NEED_GET_DATA, which is never asked for.
        Ok(n) => std::io::Error::other(format!("unexpected result {n}")),
        Err(e) => ublk_io_error(e),
    };
    Err(Error::Command { what, tag, source })
}

fn bounce_ptr(b: &RefCell<Option<IoBuf<u8>>>, size: usize) -> *mut u8 {
    let mut b = b.borrow_mut();
    b.get_or_insert_with(|| IoBuf::<u8>::new(size)).as_mut_ptr()
}

async fn core_op(ctx: &Ctx<'_>, tag: u16, op: Op, flags: ReqFlags) -> i32 {
    // SAFETY: buffers in `op` are the tag's own (copy buffer or bounce buffer), used by nothing
    // else until the device completed the request: this await returns then, and if the task is
    // dropped before, `serve_queue` drains the device queue first (or leaks the task).
    unsafe { ctx.core.submit(tag, Request::new(op, 0, flags)) }.await
}

/// One served request into the export's stats: its kind and size come from its descriptor,
/// which stays the tag's until the commit.
fn count(ctx: &Ctx<'_>, tag: u16, res: i32, t0: Instant) {
    let iod = ctx.q.get_iod(tag);
    let (dir, bytes) = match iod.op_flags & 0xff {
        sys::UBLK_IO_OP_READ => (IoDir::Read, u64::from(iod.nr_sectors) << 9),
        sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_OP_WRITE_ZEROES => {
            (IoDir::Write, u64::from(iod.nr_sectors) << 9)
        }
        sys::UBLK_IO_OP_FLUSH => (IoDir::Flush, 0),
        sys::UBLK_IO_OP_DISCARD => (IoDir::Discard, u64::from(iod.nr_sectors) << 9),
        _ => return,
    };
    ctx.shared.stats.record(dir, bytes, t0.elapsed(), res >= 0);
}

async fn handle(
    ctx: &Ctx<'_>,
    tag: u16,
    buf: Option<&IoBuf<u8>>,
    bounce: &RefCell<Option<IoBuf<u8>>>,
) -> i32 {
    let iod = ctx.q.get_iod(tag);
    let op = iod.op_flags & 0xff;
    if op == sys::UBLK_IO_OP_READ && ctx.faults.hang_read == Some(iod.start_sector) {
        log::warn!(
            "fault injection: the READ at sector {} never completes",
            iod.start_sector
        );
        std::future::pending::<()>().await;
    }
    let off = iod.start_sector << 9;
    let len = iod.nr_sectors << 9;
    let max = ctx.shared.max_io;
    if len > max && matches!(op, sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE) {
        return -libc::EINVAL;
    }
    let fua = if iod.op_flags & sys::UBLK_IO_F_FUA != 0 {
        ReqFlags::FUA
    } else {
        ReqFlags::NONE
    };
    let done = |r: i32| if r < 0 { r } else { len as i32 };
    match (op, ctx.shared.path) {
        (sys::UBLK_IO_OP_READ, DataPath::Copy) => {
            let Some(b) = buf else { return -libc::EIO };
            done(
                core_op(
                    ctx,
                    tag,
                    Op::Read {
                        offset: off,
                        buf: b.as_mut_ptr(),
                        len: len as usize,
                    },
                    ReqFlags::NONE,
                )
                .await,
            )
        }
        (sys::UBLK_IO_OP_WRITE, DataPath::Copy) => {
            let Some(b) = buf else { return -libc::EIO };
            done(
                core_op(
                    ctx,
                    tag,
                    Op::Write {
                        offset: off,
                        buf: b.as_mut_ptr(),
                        len: len as usize,
                    },
                    fua,
                )
                .await,
            )
        }
        (sys::UBLK_IO_OP_READ, DataPath::ZeroCopy) if ctx.shared.planner.is_some() => {
            done(zc_read(ctx, tag, off, len, bounce).await)
        }
        (sys::UBLK_IO_OP_READ, _) => done(read_via_device(ctx, tag, off, len, 0, bounce).await),
        (sys::UBLK_IO_OP_WRITE, _) => {
            let p = bounce_ptr(bounce, max as usize);
            let r = user_copy(ctx, tag, p, len, 0, false);
            if r < 0 {
                return r;
            }
            done(
                core_op(
                    ctx,
                    tag,
                    Op::Write {
                        offset: off,
                        buf: p,
                        len: len as usize,
                    },
                    fua,
                )
                .await,
            )
        }
        (sys::UBLK_IO_OP_FLUSH, _) => core_op(ctx, tag, Op::Flush, ReqFlags::NONE).await,
        (sys::UBLK_IO_OP_DISCARD, _) => {
            core_op(
                ctx,
                tag,
                Op::Discard {
                    offset: off,
                    len: u64::from(len),
                },
                ReqFlags::NONE,
            )
            .await
        }
        (sys::UBLK_IO_OP_WRITE_ZEROES, _) => {
            let f = if iod.op_flags & sys::UBLK_IO_F_NOUNMAP != 0 {
                ReqFlags::NO_UNMAP
            } else {
                ReqFlags::NONE
            };
            core_op(
                ctx,
                tag,
                Op::WriteZeroes {
                    offset: off,
                    len: u64::from(len),
                },
                f,
            )
            .await
        }
        _ => -libc::EOPNOTSUPP,
    }
}

/// Generic read for user copy / zero copy: device queue into the bounce buffer, then one copy
/// into the request at `req_off`.
async fn read_via_device(
    ctx: &Ctx<'_>,
    tag: u16,
    off: u64,
    len: u32,
    req_off: u32,
    bounce: &RefCell<Option<IoBuf<u8>>>,
) -> i32 {
    let p = bounce_ptr(bounce, ctx.shared.max_io as usize);
    let r = core_op(
        ctx,
        tag,
        Op::Read {
            offset: off,
            buf: p,
            len: len as usize,
        },
        ReqFlags::NONE,
    )
    .await;
    if r < 0 {
        return r;
    }
    user_copy(ctx, tag, p, len, req_off, true)
}

/// Copy between `p` and the request's pages through /dev/ublkcN (UBLK_F_USER_COPY semantics,
/// also offered by zero-copy devices). `to_req`: write into the request (a READ's data).
fn user_copy(ctx: &Ctx<'_>, tag: u16, p: *mut u8, len: u32, req_off: u32, to_req: bool) -> i32 {
    let mut pos = UblkIOCtx::ublk_user_copy_pos(ctx.q.get_qid(), tag, req_off);
    let mut done = 0usize;
    let len = len as usize;
    while done < len {
        // SAFETY: p points to the tag's bounce buffer of max_io >= len bytes, owned by this task.
        let r = unsafe {
            let bp = p.add(done).cast();
            if to_req {
                libc::pwrite(ctx.cdev, bp, len - done, pos as libc::off_t)
            } else {
                libc::pread(ctx.cdev, bp, len - done, pos as libc::off_t)
            }
        };
        if r < 0 {
            return -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
        }
        if r == 0 {
            return -libc::EIO;
        }
        done += r as usize;
        pos += r as u64;
    }
    0
}

/// Zero-copy read: file segments are read by the kernel straight into the request's pages
/// (auto-registered buffer `tag`), zero segments from /dev/zero the same way; device segments
/// take the generic path into their slice of the request.
async fn zc_read(
    ctx: &Ctx<'_>,
    tag: u16,
    off: u64,
    len: u32,
    bounce: &RefCell<Option<IoBuf<u8>>>,
) -> i32 {
    let Some(planner) = ctx.shared.planner.as_ref() else {
        return -libc::EIO;
    };
    let mut plan = Vec::new();
    if let Err(e) = planner.plan(off, len, &mut plan) {
        return -e.errno;
    }
    if !validate(&plan, len, ctx.shared.nplan_files) {
        return -libc::EIO;
    }
    ctx.plans.note(&plan);
    // The kernel-side segments (file data, zeros) with their offset in the request, issued in
    // windows of READS_IN_FLIGHT: a plan can have a segment per block, and the queue ring's
    // completion queue is sized for that many per tag (`cq_entries`). The first window is in
    // flight while the device segments take the generic path.
    let mut kernel = Vec::new();
    let mut boff = 0u32;
    for s in &plan {
        if !matches!(s, Segment::Device { .. }) {
            kernel.push((*s, boff));
        }
        boff += s.len();
    }
    let mut windows = kernel.chunks(READS_IN_FLIGHT);
    let first = windows.next().map(|w| issue_window(ctx, tag, w));
    let mut res = 0;
    boff = 0;
    for s in &plan {
        if let Segment::Device { offset, len: l } = *s {
            let r = read_via_device(ctx, tag, offset, l, boff, bounce).await;
            if r < 0 {
                res = r;
            }
        }
        boff += s.len();
    }
    if let Some(f) = first {
        let r = finish_window(ctx, tag, f, &plan).await;
        if r < 0 {
            res = r;
        }
    }
    for w in windows {
        let r = finish_window(ctx, tag, issue_window(ctx, tag, w), &plan).await;
        if r < 0 {
            res = r;
        }
    }
    res
}

/// Issue one READ_FIXED per kernel-side segment of `w` (at most READS_IN_FLIGHT).
fn issue_window(
    ctx: &Ctx<'_>,
    tag: u16,
    w: &[(Segment, u32)],
) -> Vec<(UblkUringOpFuture, u32, u32)> {
    w.iter()
        .filter_map(|&(s, boff)| match s {
            Segment::File { file, offset, len } => Some((
                fixed_read(
                    ctx,
                    tag,
                    FIRST_PLAN_FILE + u32::from(file),
                    offset,
                    boff,
                    len,
                ),
                len,
                boff,
            )),
            Segment::Zero { len } => {
                Some((fixed_read(ctx, tag, ZERO_FILE, 0, boff, len), len, boff))
            }
            Segment::Device { .. } => None,
        })
        .collect()
}

/// Wait for a window's reads; finish short ones. Returns 0 or the last error.
async fn finish_window(
    ctx: &Ctx<'_>,
    tag: u16,
    futs: Vec<(UblkUringOpFuture, u32, u32)>,
    plan: &[Segment],
) -> i32 {
    let mut res = 0;
    for (f, l, b) in futs {
        let r = f.await;
        if r < 0 {
            res = r;
        } else if (r as u32) < l {
            // A partial read, or the end of the file: finish it (one read at a time).
            let r2 = finish_short(ctx, tag, b + r as u32, l - r as u32, plan, b).await;
            if r2 < 0 {
                res = r2;
            }
        }
    }
    res
}

/// Complete a short kernel-side read of the segment starting at request offset `seg_boff`.
async fn finish_short(
    ctx: &Ctx<'_>,
    tag: u16,
    mut boff: u32,
    mut left: u32,
    plan: &[Segment],
    seg_boff: u32,
) -> i32 {
    let mut o = 0u32;
    let mut seg = None;
    for s in plan {
        if o == seg_boff {
            seg = Some(*s);
            break;
        }
        o += s.len();
    }
    while left > 0 {
        let r = match seg {
            Some(Segment::File { file, offset, .. }) => {
                let foff = offset + u64::from(boff - seg_boff);
                fixed_read(
                    ctx,
                    tag,
                    FIRST_PLAN_FILE + u32::from(file),
                    foff,
                    boff,
                    left,
                )
                .await
            }
            _ => fixed_read(ctx, tag, ZERO_FILE, 0, boff, left).await,
        };
        if r < 0 {
            return r;
        }
        if r == 0 {
            // End of the file: what the device's own read does there decides, so that a planned
            // read never returns other bytes than the generic path (zeros past the end of a
            // plain file, as the file drivers read it; EIO for a snapshot's base or COW).
            match seg {
                Some(Segment::File { file, .. })
                    if ctx
                        .shared
                        .planner
                        .as_ref()
                        .is_some_and(|p| p.zeros_past_eof(file)) =>
                {
                    seg = None;
                    continue;
                }
                _ => return -libc::EIO,
            }
        }
        boff += r as u32;
        left -= r as u32;
    }
    0
}

/// io_uring READ_FIXED from fixed file `file` at `foff` into the request buffer (registered at
/// index `tag` by the kernel) at offset `boff`. With a kernel (bvec) buffer the "address" is the
/// offset inside the buffer.
fn fixed_read(
    ctx: &Ctx<'_>,
    tag: u16,
    file: u32,
    foff: u64,
    boff: u32,
    len: u32,
) -> UblkUringOpFuture {
    let sqe = opcode::ReadFixed::new(types::Fixed(file), boff as usize as *mut u8, len, tag)
        .offset(foff)
        .build()
        .flags(squeue::Flags::FIXED_FILE);
    ctx.q.ublk_submit_sqe(sqe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_words_parse() {
        assert_eq!(Faults::parse(""), Faults::default());
        assert_eq!(
            Faults::parse("setup-fail=1"),
            Faults {
                setup_fail: Some(1),
                ..Faults::default()
            }
        );
        assert_eq!(
            Faults::parse("reject-commit=20, setup-fail=0,hang-read=64,stop-dev-fail"),
            Faults {
                setup_fail: Some(0),
                reject_commit: Some(20),
                hang_read: Some(64),
                stop_dev_fail: true,
            }
        );
        // Unknown words and bad numbers are ignored (and logged).
        assert_eq!(Faults::parse("bogus,setup-fail=x"), Faults::default());
    }

    #[test]
    fn a_rejected_command_is_an_error_not_a_request() {
        assert!(fetched(Ok(0), "FETCH", 1).unwrap());
        assert!(!fetched(Err(UblkError::QueueIsDown), "FETCH", 1).unwrap());
        // Before the fix the tag served its old descriptor again after this.
        let e = fetched(Ok(-libc::EINVAL), "COMMIT_AND_FETCH", 3).unwrap_err();
        assert_eq!(
            Chain(&e).to_string(),
            "COMMIT_AND_FETCH of tag 3: Invalid argument (os error 22)"
        );
        assert!(fetched(Ok(1), "FETCH", 0).is_err());
        assert!(fetched(Err(UblkError::OtherError(-libc::EBUSY)), "FETCH", 0).is_err());
    }

    #[test]
    fn the_completion_queue_holds_every_tags_reads() {
        for depth in [1u16, 64, 128, 4096] {
            let per_tag = READS_IN_FLIGHT + 1; // a window and the read finishing a short one
            assert!(usize::from(cq_entries(depth)) >= usize::from(depth) * per_tag + 2);
        }
        // io_uring takes at most 65536 completion entries; u16 stays below.
        assert!(cq_entries(u16::MAX) == u16::MAX);
    }

    #[test]
    fn a_failure_is_kept_once_and_quits() {
        let c = Control::new(Faults::default()).unwrap();
        assert!(!c.quitting() && !c.failed());
        c.fail(Error::Config("first".into()));
        c.fail(Error::Config("second".into()));
        assert!(c.quitting());
        // The quit eventfd is readable, so every queue ring polling it wakes up.
        assert_eq!(c.quit_fd.drain(), 1);
        assert!(matches!(c.take_failure(), Some(Error::Config(m)) if m == "first"));
    }
}
