//! Verify mode: clean runs pass, corrupted and misplaced blocks are caught.

mod common;

use common::recording_target;
use snapblk_loadgen::{JobSpec, RunOpts, RwMode, run_workload};

fn vjob(rw: RwMode) -> JobSpec {
    JobSpec {
        rw,
        bs: 4096,
        iodepth: 8,
        numjobs: 2,
        size: Some(512 << 10),
        offset_increment: 512 << 10,
        verify: true,
        ..Default::default()
    }
}

#[test]
fn clean_device_verifies() {
    for rw in [
        RwMode::Read,
        RwMode::Write,
        RwMode::RandRead,
        RwMode::RandWrite,
        RwMode::Rw,
        RwMode::RandRw,
    ] {
        let (mut t, _) = recording_target(1 << 20);
        let r = run_workload(&mut t, &vjob(rw), &RunOpts::default())
            .unwrap_or_else(|e| panic!("{rw}: {e}"));
        let checked: u64 = r.jobs.iter().map(|j| j.verified_blocks).sum();
        assert!(checked >= 256, "{rw}: only {checked} blocks checked");
    }
}

#[test]
fn corrupted_block_is_caught() {
    for rw in [RwMode::RandRead, RwMode::Write] {
        let (mut t, sh) = recording_target(1 << 20);
        sh.lock().unwrap().corrupt_read_at = Some(12288);
        let e = run_workload(&mut t, &vjob(rw), &RunOpts::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("verify failed") && e.contains("offset 12288"),
            "{rw}: {e}"
        );
    }
}

#[test]
fn writes_lost_after_an_identical_earlier_run_are_caught() {
    // A second run with the same seed writes the same blocks: if its writes are lost, the first
    // run's data is still there, and must not pass for the second run's.
    for rw in [RwMode::Write, RwMode::RandRead] {
        let (mut t, sh) = recording_target(1 << 20);
        run_workload(&mut t, &vjob(rw), &RunOpts::default()).unwrap();
        sh.lock().unwrap().drop_writes = true;
        let e = run_workload(&mut t, &vjob(rw), &RunOpts::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("verify failed") && e.contains("written by another run"),
            "{rw}: {e}"
        );
    }
}

#[test]
fn misplaced_write_is_caught() {
    let (mut t, sh) = recording_target(1 << 20);
    // The write meant for 64 KiB lands on block 0, which was written earlier: block 0 now holds
    // another block's data and block 64 KiB holds nothing.
    sh.lock().unwrap().misdirect_write = Some((65536, 0));
    let e = run_workload(&mut t, &vjob(RwMode::Write), &RunOpts::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("block at offset 0: holds the block written for offset 65536 (misplaced I/O)"),
        "{e}"
    );
    assert!(e.contains("2 of 128 blocks bad"), "{e}");
}

#[test]
fn time_based_random_writes_verify_across_passes() {
    let (mut t, _) = recording_target(1 << 20);
    let spec = JobSpec {
        runtime: Some(0.3),
        time_based: true,
        ..vjob(RwMode::RandRw)
    };
    run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
}
