//! The pressure back-off of a replay: submitters pause while other tasks' I/O stall (PSI minus
//! the submitters' own, see [`crate::ownstall`]) is above a threshold. A monitor thread samples
//! it every 50 ms ([`spawn_monitor`]) and sets the verdict the submitters read ([`Pressure`]);
//! a [`BackOffWatch`] hears the state changes while issuing.

use super::ReplayOptions;
use crate::ownstall::{self, OwnStall};
use crate::sysstat::PsiSampler;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The pressure back-off of a running replay, as reported to a [`BackOffWatch`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BackOff {
    /// Other tasks' I/O stall is above the threshold now: submitters are pausing (each pause
    /// lasts until it drops, at most 5 s, then one request goes out before the next check).
    pub paused: bool,
    /// Pauses begun so far.
    pub pauses: u64,
    /// Time spent in pauses that have ended.
    pub paused_secs: f64,
}

/// Called with the [`BackOff`] state whenever it changes, by the pressure monitor at its 50 ms
/// samples while issuing, plus a last call with `paused: false` when issuing ends (if that is a
/// change). Never called when the back-off is disabled or I/O pressure is unavailable. For
/// progress displays: under sustained outside pressure a replay crawls, and this is how a
/// terminal can say why.
pub type BackOffWatch<'a> = &'a (dyn Fn(BackOff) + Sync);

/// The watch of a running replay and the state it was last told; `to` is `None` without a
/// watch and once issuing has ended.
struct Watch<'a> {
    to: Option<BackOffWatch<'a>>,
    last: Option<BackOff>,
}

/// The back-off state shared by the submitters and the pressure monitor.
pub(super) struct Pressure<'a> {
    /// The monitor's verdict: other tasks' I/O stall is above the threshold.
    paused: AtomicBool,
    /// Where the back-off is reported (see [`Pressure::report`]).
    watch: Mutex<Watch<'a>>,
    /// The submitters, whose own I/O stalls the back-off discounts.
    pub own: OwnStall,
    /// Devices (major, minor) holding the files issued so far, for the back-off's view of
    /// other readers; `last_dev` skips the lock while the device does not change.
    devs: Mutex<Vec<(u32, u32)>>,
    last_dev: AtomicU64,
    /// Pauses begun, and microseconds spent in pauses that ended.
    pub pauses: AtomicU64,
    pub paused_us: AtomicU64,
}

impl<'a> Pressure<'a> {
    /// `watch` hears the state changes (only pass one when the back-off is on).
    pub(super) fn new(watch: Option<BackOffWatch<'a>>) -> Self {
        Pressure {
            paused: AtomicBool::new(false),
            watch: Mutex::new(Watch {
                to: watch,
                last: None,
            }),
            own: OwnStall::default(),
            devs: Mutex::new(Vec::new()),
            last_dev: AtomicU64::new(u64::MAX),
            pauses: AtomicU64::new(0),
            paused_us: AtomicU64::new(0),
        }
    }

    /// Waits while the monitor says other tasks' I/O stalls too much (at most 5 s at a time).
    pub(super) fn wait(&self) {
        if !self.paused.load(Relaxed) {
            return;
        }
        let t = Instant::now();
        self.pauses.fetch_add(1, Relaxed);
        // Bounded so a permanently busy system still gets its warm-up eventually.
        while self.paused.load(Relaxed) && t.elapsed() < Duration::from_secs(5) {
            ownstall::nap(Duration::from_millis(10));
        }
        self.paused_us
            .fetch_add(t.elapsed().as_micros() as u64, Relaxed);
    }

    /// Notes that a file on device `dev` (`st_dev`) is being read.
    pub(super) fn note_dev(&self, dev: u64) {
        if self.last_dev.swap(dev, Relaxed) != dev
            && let Ok(mut v) = self.devs.lock()
        {
            let d = (libc::major(dev), libc::minor(dev));
            if !v.contains(&d) {
                v.push(d);
            }
        }
    }

    /// The devices noted so far, sorted.
    pub(super) fn devices(&self) -> Vec<(u32, u32)> {
        let mut v = self.devs.lock().map(|v| v.clone()).unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Tells the watch the back-off state if it changed since the last call. `end`: issuing
    /// has ended, so this is the last call (`paused: false`; later verification passes are
    /// not reported). The lock keeps the calls in order and none after the last.
    pub(super) fn report(&self, end: bool) {
        let Ok(mut w) = self.watch.lock() else {
            return;
        };
        let Some(to) = w.to else {
            return;
        };
        let st = BackOff {
            paused: !end && self.paused.load(Relaxed),
            pauses: self.pauses.load(Relaxed),
            paused_secs: self.paused_us.load(Relaxed) as f64 / 1e6,
        };
        if w.last != Some(st) {
            to(st);
            w.last = Some(st);
        }
        if end {
            w.to = None;
        }
    }

    /// No more calls to the watch (the monitor did not start).
    pub(super) fn forget_watch(&self) {
        if let Ok(mut w) = self.watch.lock() {
            w.to = None;
        }
    }
}

/// Name of the pressure monitor thread (the one that calls a [`BackOffWatch`] while issuing).
pub(super) const MONITOR_THREAD: &str = "ra-pressure";

/// Starts the pressure monitor in scope `s`: every 50 ms it sets `p`'s verdict from `psi`
/// (threshold `th`), discounting the submitters' own stalls, and tells the watch, until `stop`
/// (see [`StopMonitor`]). Returns its thread, to wake it when stopping.
pub(super) fn spawn_monitor<'scope, 'env>(
    s: &'scope std::thread::Scope<'scope, 'env>,
    p: &'env Pressure<'_>,
    stop: &'env AtomicBool,
    th: f64,
    mut psi: PsiSampler,
    opts: &ReplayOptions,
) -> std::io::Result<std::thread::Thread> {
    // Baseline before anything is issued (see ForeignReads).
    let mut foreign = ownstall::ForeignReads::new(&opts.diskstats_path, &opts.self_io_path);
    let monitor = std::thread::Builder::new()
        .name(MONITOR_THREAD.into())
        .spawn_scoped(s, move || {
            // The submitters' own stalls are discounted (see `ownstall`): a cold warm-up
            // stalls on its own metadata reads and must not back off from itself.
            let mut own = ownstall::Sampler::default();
            // The first period only sets the samplers' baselines: deciding on it would
            // take the whole figure as others' (one needless pause per thread at start).
            let mut primed = false;
            while !stop.load(Relaxed) {
                // Parked, not asleep: the end of the replay wakes it at once instead of
                // waiting out the period (up to 50 ms added to every run).
                std::thread::park_timeout(Duration::from_millis(50));
                let mine = own.sample(&p.own);
                let devs = p.devs.lock().map(|v| v.clone()).unwrap_or_default();
                let theirs = foreign.sample(&devs);
                if let Some(f) = psi.sample() {
                    let o = ownstall::others(f, mine.as_deref(), theirs);
                    log::debug!("pressure {f:.3} own {mine:.3?} foreign {theirs:?} -> {o:.3}");
                    if primed {
                        p.paused.store(o > th, Relaxed);
                    }
                    primed = true;
                }
                p.report(false);
            }
            p.paused.store(false, Relaxed);
        })?;
    Ok(monitor.thread().clone())
}

/// Stops the pressure monitor (if started) when dropped, also if anything panics (the scope
/// would otherwise wait for it forever).
pub(super) struct StopMonitor<'a>(pub &'a AtomicBool, pub Option<std::thread::Thread>);

impl Drop for StopMonitor<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
        if let Some(t) = &self.1 {
            // Wakes it from its 50 ms park at once.
            t.unpark();
        }
    }
}
