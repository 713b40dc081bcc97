//! The I/O scheduler every base/COW access of the snapshot layer goes through.
//!
//! Three classes: [`IoClass::Foreground`] (client requests), [`IoClass::Merge`] and
//! [`IoClass::Readahead`] (background). Foreground I/O is never held back. Background I/O gets an
//! in-flight *budget* in bytes, in the spirit of BFQ's per-queue budgets: while foreground I/O is
//! in flight the budget is `min_budget`; once foreground has been quiet for `idle`, it doubles every
//! further `idle` up to `max_budget`. A background request is admitted when it fits in the budget
//! (or when no background I/O is in flight at all, so an oversize request cannot starve), and
//! background callers split their I/O into pieces no larger than the current budget
//! ([`Scheduler::chunk`]). So a foreground request arriving at a device queue finds at most one
//! budget's worth of background I/O ahead of it, and only `min_budget` while foreground is busy.
//!
//! The policy lives in [`SchedCore`], a pure state machine driven with explicit timestamps, so it
//! can be tested against a deterministic device model; [`Scheduler`] wraps it with a mutex, a
//! condition variable and a monotonic clock. The foreground path of [`Scheduler`] takes no lock
//! and reads no clock (two atomic adds at admission, one at completion): background admission
//! samples the foreground counters under its lock and feeds them to the core
//! ([`SchedCore::observe_fg`]); a foreground burst that ended between two samples is dated at
//! the later sample, which errs towards keeping the budget small a little longer.
//! The clock is the monotonic one unless a [`Clock`] is given ([`Scheduler::with_clock`]): a
//! simulation's virtual clock, so that budgets grow and shrink in simulated time.

use serde::Serialize;
use snapblk_core::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Who issues an I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum IoClass {
    /// Requests from clients of the snapshot device.
    Foreground,
    /// The merge engine.
    Merge,
    /// Readahead / prefetch.
    Readahead,
}

impl IoClass {
    fn background(self) -> bool {
        self != IoClass::Foreground
    }
}

/// Scheduler tuning.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SchedConfig {
    /// When false, everything is admitted at once (the "no scheduler" baseline).
    pub enabled: bool,
    /// Background bytes in flight allowed while foreground is active.
    pub min_budget: u64,
    /// Background bytes in flight allowed after a long quiet period.
    pub max_budget: u64,
    /// Quiet time (ns) after which the budget starts doubling, and doubling period.
    pub idle_ns: u64,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            enabled: true,
            min_budget: 64 << 10,
            max_budget: 2 << 20,
            idle_ns: 5_000_000,
        }
    }
}

/// Per-class counters.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ClassStats {
    /// Requests admitted in this class.
    pub requests: u64,
    /// Bytes those requests moved.
    pub bytes: u64,
    /// Total time spent waiting for admission.
    pub wait_ns: u64,
    /// The longest single wait for admission, in nanoseconds.
    pub max_wait_ns: u64,
    /// Requests that could not be admitted at once (a background read's wait for room before
    /// it takes the merge view counts too).
    pub throttled: u64,
}

/// Scheduler counters, as reported by `--stats` / JSON.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SchedStats {
    /// Reads and writes served for the device's users.
    pub foreground: ClassStats,
    /// Base/COW I/O done by the merge.
    pub merge: ClassStats,
    /// Prefetch I/O from a recorded readahead list.
    pub readahead: ClassStats,
    /// Times the background budget was cut because foreground became active.
    pub budget_shrinks: u64,
    /// Times the budget grew back during a quiet period.
    pub budget_grows: u64,
}

impl SchedStats {
    fn class_mut(&mut self, c: IoClass) -> &mut ClassStats {
        match c {
            IoClass::Foreground => &mut self.foreground,
            IoClass::Merge => &mut self.merge,
            IoClass::Readahead => &mut self.readahead,
        }
    }
}

/// The scheduling policy as a pure state machine (times in ns from an arbitrary origin).
#[derive(Debug, Clone)]
pub(crate) struct SchedCore {
    cfg: SchedConfig,
    fg_inflight: u32,
    /// When foreground last completed; `None` = never (budget starts at max).
    last_fg_end: Option<u64>,
    bg_inflight: u64,
    last_budget: u64,
    /// Foreground requests started as of the last [`SchedCore::observe_fg`].
    fg_seen: u64,
    stats: SchedStats,
}

impl SchedCore {
    /// A core with `cfg`.
    pub(crate) fn new(cfg: SchedConfig) -> Self {
        let min_budget = cfg.min_budget.max(1);
        let cfg = SchedConfig {
            min_budget,
            max_budget: cfg.max_budget.max(min_budget),
            ..cfg
        };
        SchedCore {
            cfg,
            fg_inflight: 0,
            last_fg_end: None,
            bg_inflight: 0,
            last_budget: cfg.max_budget,
            fg_seen: 0,
            stats: SchedStats::default(),
        }
    }

    /// The background budget at time `now`.
    pub(crate) fn budget(&self, now: u64) -> u64 {
        if !self.cfg.enabled {
            return u64::MAX;
        }
        if self.fg_inflight > 0 {
            return self.cfg.min_budget;
        }
        match self.last_fg_end {
            None => self.cfg.max_budget,
            Some(t) => {
                let periods = now.saturating_sub(t) / self.cfg.idle_ns.max(1);
                if periods >= 63 {
                    return self.cfg.max_budget;
                }
                self.cfg
                    .min_budget
                    .saturating_mul(1 << periods)
                    .min(self.cfg.max_budget)
            }
        }
    }

    fn note_budget(&mut self, b: u64) {
        if b < self.last_budget {
            self.stats.budget_shrinks += 1;
        } else if b > self.last_budget {
            self.stats.budget_grows += 1;
        }
        self.last_budget = b;
    }

    /// A foreground request starts (it is always admitted).
    #[cfg(test)]
    pub(crate) fn fg_begin(&mut self, bytes: u64) {
        self.fg_inflight += 1;
        let s = self.stats.class_mut(IoClass::Foreground);
        s.requests += 1;
        s.bytes += bytes;
        if self.cfg.enabled {
            self.note_budget(self.cfg.min_budget);
        }
    }

    /// A foreground request completed at `now`.
    #[cfg(test)]
    pub(crate) fn fg_end(&mut self, now: u64) {
        self.fg_inflight = self.fg_inflight.saturating_sub(1);
        self.last_fg_end = Some(now);
    }

    /// Foreground state sampled at `now` by a lock-free front end: `inflight` requests active,
    /// `started` requests begun so far (monotonic). Requests that began and ended since the last
    /// sample count as having ended at `now`. Statistics are kept by the front end.
    pub(crate) fn observe_fg(&mut self, now: u64, inflight: u32, started: u64) {
        if inflight > 0 {
            self.fg_inflight = inflight;
        } else if self.fg_inflight > 0 || started != self.fg_seen {
            self.fg_inflight = 0;
            self.last_fg_end = Some(now);
        }
        self.fg_seen = started;
    }

    /// Whether `bytes` of background I/O would be admitted at `now` (nothing is taken).
    pub(crate) fn bg_fits(&self, now: u64, bytes: u64) -> bool {
        self.fits(self.budget(now), bytes)
    }

    /// Admission rule: within `budget`, or nothing background in flight (so an oversize
    /// request cannot starve).
    fn fits(&self, budget: u64, bytes: u64) -> bool {
        self.bg_inflight == 0 || self.bg_inflight.saturating_add(bytes) <= budget
    }

    /// Try to admit `bytes` of background I/O at `now`.
    pub(crate) fn bg_try_admit(&mut self, now: u64, bytes: u64) -> bool {
        let b = self.budget(now);
        if self.cfg.enabled {
            self.note_budget(b);
        }
        if self.fits(b, bytes) {
            self.bg_inflight += bytes;
            true
        } else {
            false
        }
    }

    /// Background I/O of `bytes` completed.
    pub(crate) fn bg_end(&mut self, bytes: u64) {
        self.bg_inflight = self.bg_inflight.saturating_sub(bytes);
    }

    /// Account an admitted request of `class` that waited `wait_ns`.
    pub(crate) fn account(&mut self, class: IoClass, bytes: u64, wait_ns: u64, throttled: bool) {
        let s = self.stats.class_mut(class);
        s.requests += 1;
        s.bytes += bytes;
        s.wait_ns += wait_ns;
        s.max_wait_ns = s.max_wait_ns.max(wait_ns);
        s.throttled += throttled as u64;
    }

    /// A wait of `wait_ns` for room in the budget before `class`'s admission (see
    /// [`Scheduler::wait_room`]): counted as throttling, the request itself at admission.
    pub(crate) fn note_wait(&mut self, class: IoClass, wait_ns: u64) {
        let s = self.stats.class_mut(class);
        s.wait_ns += wait_ns;
        s.max_wait_ns = s.max_wait_ns.max(wait_ns);
        s.throttled += 1;
    }

    /// Counters so far.
    pub(crate) fn stats(&self) -> SchedStats {
        self.stats
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> SchedConfig {
        self.cfg
    }
}

/// A time source for [`Scheduler::with_clock`]: nanoseconds from an arbitrary origin, never
/// going back.
pub trait Clock: Send + Sync {
    /// The time now.
    fn now_ns(&self) -> u64;
}

/// The thread-safe scheduler.
pub struct Scheduler {
    core: Mutex<SchedCore>,
    cv: Condvar,
    epoch: Instant,
    /// Time source when not the monotonic clock (read on the background path only).
    clock: Option<Arc<dyn Clock>>,
    /// Foreground requests in flight (low 24 bits) and started so far (high 40 bits): one
    /// atomic add per admission and one per completion.
    fg_state: AtomicU64,
    fg_bytes: AtomicU64,
    /// The queues' own foreground counters ([`Scheduler::lane`]), summed with the two above.
    lanes: Mutex<Vec<Arc<LaneCounters>>>,
}

/// One queue's foreground counters, laid out as `fg_state` and `fg_bytes`, on a cache line of
/// their own. Only the queue's thread writes them, so it counts with plain loads and stores:
/// no atomic read-modify-write per request.
#[repr(align(64))]
#[derive(Default)]
struct LaneCounters {
    state: AtomicU64,
    bytes: AtomicU64,
}

/// A queue's foreground admission ([`Scheduler::lane`]): what [`Scheduler::admit`] counts for
/// the foreground, on counters only this lane writes. A request is [`FgLane::begin`] before
/// its I/O and [`FgLane::end`] after it. One thread at a time uses a lane (a queue's); used
/// from two at once it would lose counts, never memory safety. Dropping it folds its counts
/// into the scheduler's.
pub(crate) struct FgLane {
    sched: Arc<Scheduler>,
    c: Arc<LaneCounters>,
}

impl FgLane {
    /// A foreground request of `bytes` begins.
    #[inline]
    pub(crate) fn begin(&self, bytes: u64) {
        let st = self.c.state.load(Ordering::Relaxed);
        self.c
            .state
            .store(st.wrapping_add(FG_STARTED_ONE + 1), Ordering::Release);
        let b = self.c.bytes.load(Ordering::Relaxed);
        self.c.bytes.store(b.wrapping_add(bytes), Ordering::Relaxed);
    }

    /// The request begun last has completed.
    #[inline]
    pub(crate) fn end(&self) {
        let st = self.c.state.load(Ordering::Relaxed);
        self.c.state.store(st.wrapping_sub(1), Ordering::Release);
    }
}

impl Drop for FgLane {
    fn drop(&mut self) {
        let mut lanes = lock(&self.sched.lanes);
        let started = self.c.state.load(Ordering::Acquire) & !(FG_STARTED_ONE - 1);
        self.sched.fg_state.fetch_add(started, Ordering::AcqRel);
        self.sched
            .fg_bytes
            .fetch_add(self.c.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        lanes.retain(|l| !Arc::ptr_eq(l, &self.c));
    }
}

const FG_SHIFT: u32 = 24;
const FG_STARTED_ONE: u64 = 1 << FG_SHIFT;

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new(SchedConfig::default())
    }
}

/// Admission of one request; dropping it marks the I/O complete.
#[must_use]
pub(crate) struct Ticket<'a> {
    sched: &'a Scheduler,
    class: IoClass,
    bytes: u64,
}

impl Drop for Ticket<'_> {
    #[inline]
    fn drop(&mut self) {
        if !self.class.background() {
            self.sched.fg_state.fetch_sub(1, Ordering::Release);
            return;
        }
        self.sched.bg_end(self.bytes);
    }
}

impl Scheduler {
    /// A scheduler with `cfg`.
    pub fn new(cfg: SchedConfig) -> Self {
        Scheduler {
            core: Mutex::new(SchedCore::new(cfg)),
            cv: Condvar::new(),
            epoch: Instant::now(),
            clock: None,
            fg_state: AtomicU64::new(0),
            fg_bytes: AtomicU64::new(0),
            lanes: Mutex::new(Vec::new()),
        }
    }

    /// A scheduler with `cfg` that reads time from `clock` (a simulation's virtual clock).
    /// Waits for budget still time out on the real clock, to re-evaluate the budget.
    pub fn with_clock(cfg: SchedConfig, clock: Arc<dyn Clock>) -> Self {
        Scheduler {
            clock: Some(clock),
            ..Scheduler::new(cfg)
        }
    }

    fn lock(&self) -> MutexGuard<'_, SchedCore> {
        lock(&self.core)
    }

    fn now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now_ns(),
            None => self.epoch.elapsed().as_nanos() as u64,
        }
    }

    /// Feed the foreground counters to the core (called with the lock held).
    fn sync_fg(&self, c: &mut SchedCore, now: u64) {
        let mut st = self.fg_state.load(Ordering::Acquire);
        for l in lock(&self.lanes).iter() {
            st = st.wrapping_add(l.state.load(Ordering::Acquire));
        }
        c.observe_fg(now, (st & (FG_STARTED_ONE - 1)) as u32, st >> FG_SHIFT);
    }

    #[inline(never)]
    fn bg_end(&self, bytes: u64) {
        self.lock().bg_end(bytes);
        self.cv.notify_all();
    }

    /// Foreground counters of a queue's own ([`FgLane`]): the queue's reads are counted
    /// without an atomic read-modify-write, and the scheduler sees them as it sees admitted
    /// foreground requests (in flight, started, bytes).
    pub(crate) fn lane(self: &Arc<Self>) -> FgLane {
        let c = Arc::new(LaneCounters::default());
        lock(&self.lanes).push(c.clone());
        FgLane {
            sched: self.clone(),
            c,
        }
    }

    /// Admit a request of `bytes` for `class`, waiting if it is background and over budget.
    #[inline]
    pub(crate) fn admit(&self, class: IoClass, bytes: u64) -> Ticket<'_> {
        if !class.background() {
            self.fg_state
                .fetch_add(FG_STARTED_ONE + 1, Ordering::AcqRel);
            // Statistics only.
            self.fg_bytes.fetch_add(bytes, Ordering::Relaxed);
            return Ticket {
                sched: self,
                class,
                bytes,
            };
        }
        self.admit_bg(class, bytes)
    }

    #[inline(never)]
    fn admit_bg(&self, class: IoClass, bytes: u64) -> Ticket<'_> {
        let start = self.now();
        let mut throttled = false;
        let mut c = self.wait_until(|c, now| {
            let ok = c.bg_try_admit(now, bytes);
            throttled |= !ok;
            ok
        });
        c.account(class, bytes, self.now() - start, throttled);
        Ticket {
            sched: self,
            class,
            bytes,
        }
    }

    /// Wait until `bytes` of background I/O would be admitted, without admitting them. A
    /// background reader calls this before it takes a lock that writers wait for (the
    /// snapshot's merge view), so that it waits for its budget with the lock free and holds
    /// the lock only for its I/O. Admission afterwards is normally immediate; it may wait
    /// again if foreground I/O began in between.
    /// A wait here counts for `class` as a throttled admission would.
    pub(crate) fn wait_room(&self, class: IoClass, bytes: u64) {
        let start = self.now();
        let mut waited = false;
        let mut c = self.wait_until(|c, now| {
            let ok = c.bg_fits(now, bytes);
            waited |= !ok;
            ok
        });
        if waited {
            c.note_wait(class, self.now() - start);
        }
    }

    /// Evaluate `ready` on the core (foreground counters synced) until it returns true; the
    /// core stays locked for the caller.
    fn wait_until(
        &self,
        mut ready: impl FnMut(&mut SchedCore, u64) -> bool,
    ) -> MutexGuard<'_, SchedCore> {
        let mut c = self.lock();
        loop {
            let now = self.now();
            self.sync_fg(&mut c, now);
            if ready(&mut c, now) {
                return c;
            }
            // Woken by background completions; the timeout re-evaluates budget growth (and
            // notices foreground activity, which does not signal the condition variable).
            let tick = Duration::from_nanos((c.config().idle_ns / 4).clamp(50_000, 5_000_000));
            c = self
                .cv
                .wait_timeout(c, tick)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// The largest piece a background caller should issue now (the current budget).
    pub fn chunk(&self) -> u64 {
        let now = self.now();
        let mut c = self.lock();
        self.sync_fg(&mut c, now);
        c.budget(now).max(4096)
    }

    /// Counters so far.
    pub fn stats(&self) -> SchedStats {
        let mut st = self.lock().stats();
        let lanes = lock(&self.lanes);
        st.foreground.requests = self.fg_state.load(Ordering::Relaxed) >> FG_SHIFT;
        st.foreground.bytes = self.fg_bytes.load(Ordering::Relaxed);
        for l in lanes.iter() {
            st.foreground.requests += l.state.load(Ordering::Relaxed) >> FG_SHIFT;
            st.foreground.bytes += l.bytes.load(Ordering::Relaxed);
        }
        st
    }

    /// The background in-flight budget in bytes now (`u64::MAX` with the scheduler off).
    pub fn budget_now(&self) -> u64 {
        let now = self.now();
        let mut c = self.lock();
        self.sync_fg(&mut c, now);
        c.budget(now)
    }

    /// The configuration in force.
    pub fn config(&self) -> SchedConfig {
        self.lock().config()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::rng::Rng;
    use std::collections::VecDeque;

    /// A deterministic single-queue device: FIFO, service time = 20 µs + size / (1 GB/s).
    fn service_ns(bytes: u64) -> u64 {
        20_000 + bytes
    }

    struct Outcome {
        /// Per foreground request: (time waiting behind other I/O, background bytes queued ahead
        /// of it at arrival).
        fg_waits: Vec<(u64, u64)>,
        bg_done: u64,
        core: SchedCore,
    }

    /// Simulate a merge that keeps background I/O queued as far as the scheduler lets it, and a
    /// foreground reader issuing 4 KiB reads at random times, in bursts separated by quiet gaps.
    fn simulate(cfg: SchedConfig, seed: u64) -> Outcome {
        let mut rng = Rng::new(seed);
        let mut core = SchedCore::new(cfg);
        // Device queue entries: (is_fg, bytes, arrival, bg bytes ahead at arrival).
        let mut q: VecDeque<(bool, u64, u64, u64)> = VecDeque::new();
        let mut busy_until = 0u64;
        let mut now = 0u64;
        let mut next_fg = 1_000_000u64;
        let mut fg_waits = Vec::new();
        let mut bg_done = 0;
        while now < 2_000_000_000 {
            // Background producer: the merge submits whatever is admitted, in pieces of at most
            // 1 MiB and at most the current budget (as the merge engine splits its I/O), up to a
            // device queue depth of 64.
            while q.len() < 64 {
                let piece = (1u64 << 20).min(core.budget(now).max(4096));
                if !core.bg_try_admit(now, piece) {
                    break;
                }
                q.push_back((false, piece, now, 0));
            }
            if let Some(&(fg, bytes, arrival, ahead)) = q.front() {
                let start = busy_until.max(arrival);
                if start + service_ns(bytes) <= next_fg {
                    now = start + service_ns(bytes);
                    busy_until = now;
                    q.pop_front();
                    if fg {
                        core.fg_end(now);
                        fg_waits.push((start - arrival, ahead));
                    } else {
                        core.bg_end(bytes);
                        bg_done += bytes;
                    }
                    continue;
                }
            }
            now = next_fg;
            let ahead: u64 = q.iter().filter(|e| !e.0).map(|e| e.1).sum();
            core.fg_begin(4096);
            q.push_back((true, 4096, now, ahead));
            // Bursts: think times of 50..500 µs, and one time in 20 a quiet gap of 50 ms.
            next_fg = now
                + if rng.below(20) == 0 {
                    50_000_000
                } else {
                    50_000 + rng.below(450_000)
                };
        }
        Outcome {
            fg_waits,
            bg_done,
            core,
        }
    }

    #[test]
    fn foreground_waits_behind_at_most_one_budget() {
        let cfg = SchedConfig::default();
        for seed in 0..4 {
            let o = simulate(cfg, seed);
            assert!(
                o.fg_waits.len() > 500,
                "enough foreground requests: {}",
                o.fg_waits.len()
            );
            // Worst case: a full background budget plus one earlier foreground request ahead.
            let bound = service_ns(cfg.max_budget) + 2 * service_ns(4096);
            for &(wait, backlog) in &o.fg_waits {
                assert!(backlog <= cfg.max_budget, "backlog {backlog} > one budget");
                assert!(wait <= bound, "wait {wait} ns > one budget ({bound} ns)");
            }
            // Inside a burst the budget has shrunk: most requests find at most min_budget ahead.
            let small = o
                .fg_waits
                .iter()
                .filter(|&&(_, b)| b <= cfg.min_budget)
                .count();
            assert!(
                small * 2 >= o.fg_waits.len(),
                "{small} of {} within min budget",
                o.fg_waits.len()
            );
            assert!(
                o.bg_done > 100 << 20,
                "background still progresses: {} bytes",
                o.bg_done
            );
            let st = o.core.stats();
            assert!(st.budget_shrinks > 0 && st.budget_grows > 0);
        }
    }

    #[test]
    fn without_scheduler_foreground_waits_behind_the_whole_queue() {
        let cfg = SchedConfig {
            enabled: false,
            ..SchedConfig::default()
        };
        let o = simulate(cfg, 1);
        let worst = o.fg_waits.iter().map(|w| w.0).max().unwrap_or(0);
        let with = simulate(SchedConfig::default(), 1);
        let worst_with = with.fg_waits.iter().map(|w| w.0).max().unwrap_or(0);
        assert!(
            worst > 10 * worst_with,
            "unscheduled worst wait {worst} vs scheduled {worst_with}"
        );
    }

    #[test]
    fn budget_shrinks_and_grows_back() {
        let cfg = SchedConfig {
            enabled: true,
            min_budget: 64 << 10,
            max_budget: 1 << 20,
            idle_ns: 1000,
        };
        let mut c = SchedCore::new(cfg);
        assert_eq!(c.budget(0), 1 << 20);
        c.fg_begin(4096);
        assert_eq!(c.budget(10), 64 << 10);
        c.fg_end(100);
        assert_eq!(c.budget(100), 64 << 10);
        assert_eq!(c.budget(1100), 128 << 10);
        assert_eq!(c.budget(100 + 4 * 1000), 1 << 20);
        assert!(
            c.bg_try_admit(200, 1 << 20),
            "oversize admitted when nothing in flight"
        );
        assert!(!c.bg_try_admit(200, 4096));
        c.bg_end(1 << 20);
        assert!(c.bg_try_admit(200, 4096));
    }

    #[test]
    fn a_lane_counts_as_admitted_foreground_and_keeps_its_counts() {
        let cfg = SchedConfig {
            enabled: true,
            min_budget: 64 << 10,
            max_budget: 1 << 20,
            idle_ns: 1_000_000_000,
        };
        let s = Arc::new(Scheduler::new(cfg));
        assert_eq!(s.budget_now(), 1 << 20);
        let lane = s.lane();
        lane.begin(4096);
        assert_eq!(
            s.budget_now(),
            64 << 10,
            "a lane's read in flight shrinks the budget"
        );
        lane.end();
        assert_eq!(s.budget_now(), 64 << 10, "and its end starts the idle time");
        let t = s.admit(IoClass::Foreground, 100);
        drop(t);
        lane.begin(512);
        lane.end();
        let st = s.stats().foreground;
        assert_eq!((st.requests, st.bytes), (3, 4096 + 100 + 512));
        drop(lane);
        assert!(lock(&s.lanes).is_empty());
        let st = s.stats().foreground;
        assert_eq!(
            (st.requests, st.bytes),
            (3, 4096 + 100 + 512),
            "kept after the drop"
        );
        let other = s.lane();
        other.begin(1);
        assert_eq!(s.stats().foreground.requests, 4);
        // In flight: the sample sees it until it ends.
        let mut c = s.lock();
        s.sync_fg(&mut c, 5);
        assert_eq!(c.fg_inflight, 1);
        drop(c);
        other.end();
        let mut c = s.lock();
        s.sync_fg(&mut c, 6);
        assert_eq!((c.fg_inflight, c.last_fg_end), (0, Some(6)));
    }

    #[test]
    fn threaded_scheduler_throttles_background_while_foreground_active() {
        let s = Scheduler::new(SchedConfig {
            min_budget: 8192,
            max_budget: 8192,
            ..SchedConfig::default()
        });
        let fg = s.admit(IoClass::Foreground, 4096);
        let a = s.admit(IoClass::Merge, 8192);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let _b = s.admit(IoClass::Merge, 4096);
            });
            std::thread::sleep(Duration::from_millis(20));
            drop(a);
            h.join().unwrap();
        });
        drop(fg);
        let st = s.stats();
        assert_eq!(st.merge.requests, 2);
        assert_eq!(st.merge.throttled, 1);
        assert!(st.merge.max_wait_ns >= 10_000_000);
        assert_eq!(st.foreground.requests, 1);
    }
}
