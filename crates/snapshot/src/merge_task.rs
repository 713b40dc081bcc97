//! A merge running on its own thread while the snapshot device serves its clients (the driver's
//! `merge` property, `snapblk serve --merge`): what Android's snapuserd does after the first boot
//! of an update. The clients keep reading the new image throughout (the merge publishes each
//! window before it overwrites sources, and its I/O is in the scheduler's `Merge` class, behind
//! theirs); once it is done they read it from the base. Closing the device stops the merge at
//! its next durable step; opening it again with `merge` resumes from there.

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
    /// Time from the start of the merge to its end (or so far).
    pub elapsed_us: u64,
}

/// One device's background merge.
#[derive(Default)]
pub struct MergeTask {
    stats: Mutex<MergeStats>,
    cv: Condvar,
    stop: AtomicBool,
}

impl MergeTask {
    /// Merge `snap` on a new thread. `snap` must be open for merging (base and COW writable).
    /// An unmergeable COW ends the merge as [`MergeState::Failed`] before anything is written
    /// ([`merge`] checks the order first); callers that want to refuse it up front call
    /// [`crate::merge::validate_order`] themselves.
    pub(crate) fn start(self: &Arc<Self>, snap: Arc<Snapshot>) -> crate::Result<JoinHandle<()>> {
        let (merged, total) = snap.merge_progress();
        *lock(&self.stats) = MergeStats {
            state: MergeState::Running,
            merged: merged as u64,
            total: total as u64,
            resumed_at: merged as u64,
            ..MergeStats::default()
        };
        let me = self.clone();
        std::thread::Builder::new()
            .name("snap-merge".into())
            .spawn(move || me.run(&snap))
            .map_err(SnapError::MergeThread)
    }

    fn run(&self, snap: &Snapshot) {
        let t0 = Instant::now();
        let progress = |p: MergeProgress| {
            let mut s = lock(&self.stats);
            s.merged = p.merged as u64;
            s.elapsed_us = t0.elapsed().as_micros() as u64;
            drop(s);
            self.cv.notify_all();
        };
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
            Err(SnapError::Interrupted) => s.state = MergeState::Stopped,
            Err(e) => {
                s.state = MergeState::Failed;
                s.error = Some(snapblk_core::Chain(&e).to_string());
            }
        }
        drop(s);
        self.cv.notify_all();
    }

    /// Counters so far.
    pub fn stats(&self) -> MergeStats {
        lock(&self.stats).clone()
    }

    /// Wait until the merge is no longer running (at once when there is none), at most
    /// `timeout`. Returns the counters.
    pub fn wait(&self, timeout: Duration) -> MergeStats {
        let g = lock(&self.stats);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |s| s.state == MergeState::Running)
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// Wait until the merge has got past `merged` ops or is no longer running, at most
    /// `timeout`. Returns the counters.
    pub fn wait_progress(&self, merged: u64, timeout: Duration) -> MergeStats {
        let g = lock(&self.stats);
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |s| {
                s.state == MergeState::Running && s.merged == merged
            })
            .unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// Ask the merge to stop at its next durable step (the caller joins its thread).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
