//! A merge running on its own thread while the snapshot device serves its clients (the driver's
//! `merge` property, `snapblk serve --merge`): what Android's snapuserd does after the first boot
//! of an update. The clients keep reading the new image throughout (the merge publishes each
//! window before it overwrites sources, and its I/O is in the scheduler's `Merge` class, behind
//! theirs); once it is done they read it from the base. Closing the device stops the merge at
//! its next durable step; opening it again with `merge` resumes from there. An operator can also
//! pause it ([`MergeTask::pause`]: it stops at its next durable step, as a close does) and resume
//! it ([`MergeTask::resume`]: the engine starts again from what is on disk, as a reopen does),
//! or have it wait for a start ([`MergeTask::start_merge`]) when the device opens.

use crate::error::SnapError;
use crate::merge::{MergeOptions, MergeProgress, MergeReport, merge};
use crate::snapshot::Snapshot;
use serde::Serialize;
use snapblk_core::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where a background merge is.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MergeState {
    /// No merge was asked for.
    #[default]
    Off,
    /// The merge thread is working through the merge order.
    Running,
    /// Every op is in the base (the COW records it: a later open finds nothing to do).
    Done,
    /// The device was closed first; the progress so far is durable and a later merge resumes.
    Stopped,
    /// Held at a durable step (paused, or waiting for its start): nothing is written until it
    /// is resumed (or started).
    Paused,
    /// An I/O or format error ended it (see [`MergeStats::error`]); the device keeps serving.
    Failed,
}

/// Background merge counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MergeStats {
    /// Where the merge is now.
    pub state: MergeState,
    /// Ops merged durably so far, counted from the start of the merge order (as the COW's
    /// `num_merge_ops` records them).
    pub merged: u64,
    /// Ops in the COW's merge order: `merged` reaches this when the merge is done.
    pub total: u64,
    /// Ops already merged when this run started.
    pub resumed_at: u64,
    /// The error that ended the merge, when `state` is [`MergeState::Failed`].
    pub error: Option<String>,
    /// The engine's report, once it finished.
    pub report: Option<MergeReport>,
    /// Time from the start of the merge to its end (or so far), pauses included.
    pub elapsed_us: u64,
    /// Whether the merge has started (false while it waits for its start).
    pub started: bool,
}

/// One device's background merge.
#[derive(Default)]
pub struct MergeTask {
    stats: Mutex<MergeStats>,
    cv: Condvar,
    /// Interrupts the engine at its next durable step (a pause, or the device closing).
    stop: AtomicBool,
    /// The device is closing: the merge ends instead of pausing.
    closing: AtomicBool,
    /// Held by an operator: the merge pauses at its next durable step and waits on `hold_cv`
    /// until it is released. Lock order: `hold`, then `stats`.
    hold: Mutex<bool>,
    hold_cv: Condvar,
}

/// Why a [`MergeTask`] control request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeControlError {
    /// The device was not opened to merge (the driver's `merge` property is off).
    #[error("no merge: the device was not opened to merge (serve --merge)")]
    NoMerge,
    /// The request does not apply in the merge's current state.
    #[error("the merge is {0}")]
    State(&'static str),
}

impl MergeState {
    /// Lower-case name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            MergeState::Off => "off",
            MergeState::Running => "running",
            MergeState::Done => "done",
            MergeState::Stopped => "stopped",
            MergeState::Paused => "paused",
            MergeState::Failed => "failed",
        }
    }
}

impl MergeTask {
    /// Merge `snap` on a new thread. `snap` must be open for merging (base and COW writable).
    /// An unmergeable COW ends the merge as [`MergeState::Failed`] before anything is written
    /// ([`merge`] checks the order first); callers that want to refuse it up front call
    /// [`crate::merge::validate_order`] themselves.
    /// With `held`, the thread waits in [`MergeState::Paused`] for [`MergeTask::start_merge`].
    pub(crate) fn start(
        self: &Arc<Self>,
        snap: Arc<Snapshot>,
        held: bool,
    ) -> crate::Result<JoinHandle<()>> {
        let (merged, total) = snap.merge_progress();
        *lock(&self.hold) = held;
        *lock(&self.stats) = MergeStats {
            state: if held {
                MergeState::Paused
            } else {
                MergeState::Running
            },
            merged: merged as u64,
            total: total as u64,
            resumed_at: merged as u64,
            started: !held,
            ..MergeStats::default()
        };
        let me = self.clone();
        std::thread::Builder::new()
            .name("snap-merge".into())
            .spawn(move || me.run(&snap))
            .map_err(SnapError::MergeThread)
    }

    fn run(&self, snap: &Snapshot) {
        let mut t0 = None;
        loop {
            if !self.wait_unheld() {
                let mut s = lock(&self.stats);
                s.state = MergeState::Stopped;
                drop(s);
                self.cv.notify_all();
                return;
            }
            let t0 = *t0.get_or_insert_with(Instant::now);
            let progress = |p: MergeProgress| {
                let mut s = lock(&self.stats);
                s.merged = p.merged as u64;
                s.elapsed_us = t0.elapsed().as_micros() as u64;
                drop(s);
                self.cv.notify_all();
            };
            // Each run starts from what the COW records (a resumed run rechecks what is left,
            // as a reopened device does).
            let r = merge(
                snap,
                MergeOptions {
                    stop: Some(&self.stop),
                    progress: Some(&progress),
                    ..MergeOptions::default()
                },
            );
            let mut s = lock(&self.stats);
            s.merged = snap.merge_progress().0 as u64;
            s.elapsed_us = t0.elapsed().as_micros() as u64;
            match r {
                Ok(report) => {
                    s.state = MergeState::Done;
                    s.report = Some(report);
                }
                Err(SnapError::Interrupted) if !self.closing.load(Ordering::Relaxed) => {
                    // Paused (or a pause and resume raced past the engine): `wait_unheld`
                    // reports the pause and waits, then the engine resumes.
                    drop(s);
                    continue;
                }
                Err(SnapError::Interrupted) => s.state = MergeState::Stopped,
                Err(e) => {
                    s.state = MergeState::Failed;
                    s.error = Some(snapblk_core::Chain(&e).to_string());
                }
            }
            drop(s);
            self.cv.notify_all();
            return;
        }
    }

    /// Wait while an operator holds the merge. Returns false when the device is closing.
    /// Leaves the state `Running` when it returns true.
    fn wait_unheld(&self) -> bool {
        let mut hold = lock(&self.hold);
        loop {
            if self.closing.load(Ordering::Relaxed) {
                return false;
            }
            // Lock order everywhere: `hold`, then `stats`.
            let mut s = lock(&self.stats);
            if !*hold {
                // Cleared with the hold, under its lock: a pause after this interrupts again.
                self.stop.store(false, Ordering::Relaxed);
                s.state = MergeState::Running;
                s.started = true;
                drop(s);
                self.cv.notify_all();
                return true;
            }
            s.state = MergeState::Paused;
            drop(s);
            self.cv.notify_all();
            hold = self.hold_cv.wait(hold).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Pause a running merge at its next durable step and wait (at most `timeout`) until it
    /// has stopped there: from then on nothing is written to the base or the COW until
    /// [`MergeTask::resume`]. Pausing a paused merge is not an error.
    pub fn pause(&self, timeout: Duration) -> Result<MergeStats, MergeControlError> {
        {
            let mut hold = lock(&self.hold);
            let st = lock(&self.stats).state;
            match st {
                MergeState::Running | MergeState::Paused => {}
                MergeState::Off => return Err(MergeControlError::NoMerge),
                s => return Err(MergeControlError::State(s.name())),
            }
            *hold = true;
            self.stop.store(true, Ordering::Relaxed);
        }
        let g = lock(&self.stats);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |s| s.state == MergeState::Running)
            .unwrap_or_else(|e| e.into_inner());
        Ok(g.clone())
    }

    /// Resume a paused merge (from its last durable step).
    pub fn resume(&self) -> Result<MergeStats, MergeControlError> {
        self.release(|s| {
            if s.state == MergeState::Paused && s.started {
                Ok(())
            } else {
                Err(MergeControlError::State(s.state.name()))
            }
        })
    }

    /// Start a merge that waits for its start (the driver's `merge-held` property).
    pub fn start_merge(&self) -> Result<MergeStats, MergeControlError> {
        self.release(|s| {
            if s.state == MergeState::Paused && !s.started {
                Ok(())
            } else if s.started && s.state != MergeState::Off {
                Err(MergeControlError::State("already started"))
            } else {
                Err(MergeControlError::State(s.state.name()))
            }
        })
    }

    fn release(
        &self,
        check: impl FnOnce(&MergeStats) -> Result<(), MergeControlError>,
    ) -> Result<MergeStats, MergeControlError> {
        let mut hold = lock(&self.hold);
        let mut s = lock(&self.stats);
        if s.state == MergeState::Off {
            return Err(MergeControlError::NoMerge);
        }
        check(&s)?;
        *hold = false;
        // Running from now on (the thread says so too once it wakes): a `wait` right after
        // this must not take the old state for the end.
        s.state = MergeState::Running;
        s.started = true;
        let st = s.clone();
        drop(s);
        drop(hold);
        self.hold_cv.notify_all();
        Ok(st)
    }

    /// Counters so far.
    pub fn stats(&self) -> MergeStats {
        lock(&self.stats).clone()
    }

    /// Wait until the merge is no longer running (at once when there is none; a paused merge
    /// counts as running once [`MergeTask::stop`] was called), at most `timeout`. Returns the
    /// counters.
    pub fn wait(&self, timeout: Duration) -> MergeStats {
        let g = lock(&self.stats);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |s| {
                s.state == MergeState::Running
                    || (s.state == MergeState::Paused && self.closing.load(Ordering::Relaxed))
            })
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// Wait until the merge has got past `merged` ops or is no longer running (or paused), at
    /// most `timeout`. Returns the counters.
    pub fn wait_progress(&self, merged: u64, timeout: Duration) -> MergeStats {
        let g = lock(&self.stats);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |s| {
                matches!(s.state, MergeState::Running | MergeState::Paused) && s.merged == merged
            })
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// Ask the merge to stop at its next durable step (the caller joins its thread); a paused
    /// merge ends where it is.
    pub fn stop(&self) {
        let _hold = lock(&self.hold);
        self.closing.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        self.hold_cv.notify_all();
    }
}
