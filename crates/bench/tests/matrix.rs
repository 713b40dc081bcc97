//! `run_matrix`: how configurations and repetitions are scheduled, and stopping early.

mod common;

use common::recording_target;
use snapblk_bench::spec::{JobSpec, RwMode, Sweep};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const MB: usize = 1 << 20;

fn qd_sweep(qds: &[u32], runtime: Option<f64>) -> Vec<JobSpec> {
    let base = JobSpec {
        rw: RwMode::RandRead,
        size: Some(MB as u64),
        runtime,
        ..Default::default()
    };
    Sweep {
        iodepth: qds.to_vec(),
        ..Default::default()
    }
    .expand(&base)
}

#[test]
fn stop_ends_the_current_run_and_skips_the_rest() {
    let (mut t, _) = recording_target(MB);
    // Three 30 s configurations; the stop flag is raised 0.3 s into the first.
    let jobs = qd_sweep(&[1, 4, 16], Some(30.0));
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        s.store(true, Ordering::Relaxed);
    });
    let mut calls = 0;
    let t0 = std::time::Instant::now();
    let r = snapblk_bench::run_matrix(&mut t, &jobs, 2, false, Some(stop), |_, _, _| calls += 1)
        .unwrap();
    raiser.join().unwrap();
    assert!(t0.elapsed().as_secs() < 20, "stop was not honoured");
    assert_eq!(calls, 1, "nothing runs after the stop");
    assert_eq!(r.len(), 1, "configurations that never ran are left out");
    assert_eq!(r[0].runs.len(), 1);
    let run = &r[0].runs[0];
    assert!(run.read.ios > 0 && run.seconds < 20.0, "{run:?}");
}
