//! fio's three latencies, checked on a recording driver that sleeps in chosen places: `slat`
//! ends when the call that submitted a request returns, `clat` runs from there to the reap, and
//! `lat = slat + clat`.

mod common;

use common::recording_target;
use snapblk_loadgen::{BatchOpts, JobSpec, RunOpts, RunResult, RwMode, run_workload};
use std::time::Duration;

const DELAY: Duration = Duration::from_millis(3);
/// HdrHistogram keeps 3 significant digits: a recorded value may read up to 0.1 % lower.
const FLOOR_NS: u64 = DELAY.as_nanos() as u64 * 999 / 1000;

#[derive(Default)]
struct Delays {
    enqueue: Duration,
    submit: Duration,
    wait: Duration,
}

fn run(delays: Delays, iodepth: u32, batch: BatchOpts) -> RunResult {
    let (mut t, sh) = recording_target(1 << 20);
    {
        let mut s = sh.lock().unwrap();
        s.enqueue_delay = delays.enqueue;
        s.submit_delay = delays.submit;
        s.wait_delay = delays.wait;
    }
    let spec = JobSpec {
        rw: RwMode::RandRead,
        bs: 4096,
        iodepth,
        size: Some(64 * 4096),
        batch,
        ..Default::default()
    };
    let r = run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
    let d = &r.read;
    assert_eq!(d.ios, 64);
    assert_eq!(
        (d.lat.count(), d.slat.count(), d.clat.count()),
        (64, 64, 64)
    );
    // Per request slat + clat = lat, so the means add up (within the histograms' precision).
    let sum = d.slat.mean() + d.clat.mean();
    assert!(
        (sum - d.lat.mean()).abs() <= d.lat.mean() * 0.002,
        "slat {} + clat {} != lat {}",
        d.slat.mean(),
        d.clat.mean(),
        d.lat.mean()
    );
    r
}

/// Smallest slat and clat of the run's reads.
fn mins(r: &RunResult) -> (u64, u64) {
    (r.read.slat.min(), r.read.clat.min())
}

#[test]
fn slow_submission_is_slat() {
    // fio's default loop: a commit call submits, a separate call waits.
    let submit = Delays {
        submit: DELAY,
        ..Default::default()
    };
    let (slat, clat) = mins(&run(submit, 1, BatchOpts::default()));
    assert!(
        slat >= FLOOR_NS && clat < FLOOR_NS,
        "slat min {slat}, clat min {clat}"
    );
}

#[test]
fn slow_completion_is_clat() {
    let wait = Delays {
        wait: DELAY,
        ..Default::default()
    };
    let (slat, clat) = mins(&run(wait, 1, BatchOpts::default()));
    assert!(
        clat >= FLOOR_NS && slat < FLOOR_NS,
        "slat min {slat}, clat min {clat}"
    );
}

#[test]
fn submit_with_wait_counts_the_call_as_completion_time() {
    // One call submits and waits: the request is issued when that call starts, so even a slow
    // submission inside it is completion time.
    let batch = BatchOpts {
        submit_with_wait: true,
        ..Default::default()
    };
    let submit = Delays {
        submit: DELAY,
        ..Default::default()
    };
    let (slat, clat) = mins(&run(submit, 1, batch));
    assert!(
        clat >= FLOOR_NS && slat < FLOOR_NS,
        "slat min {slat}, clat min {clat}"
    );
}

#[test]
fn time_queued_before_submission_is_slat() {
    // Each enqueue takes DELAY, so every request waits at least that long before the call that
    // submits it: with fio's loop and a batch of 4, and with submission inside the wait.
    let batches = [
        BatchOpts {
            iodepth_batch_submit: 4,
            ..Default::default()
        },
        BatchOpts {
            submit_with_wait: true,
            ..Default::default()
        },
    ];
    for batch in batches {
        let enqueue = Delays {
            enqueue: DELAY,
            ..Default::default()
        };
        let r = run(enqueue, 4, batch);
        assert!(
            r.read.slat.min() >= FLOOR_NS,
            "slat min {}",
            r.read.slat.min()
        );
    }
}
