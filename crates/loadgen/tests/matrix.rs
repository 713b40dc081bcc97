//! `run_matrix`: how configurations and repetitions are scheduled, and stopping early.

mod common;

use common::recording_target;
use snapblk_loadgen::{JobSpec, RwMode, Sweep};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const MB: usize = 1 << 20;

fn qd_sweep(qds: &[u32], runtime: Option<f64>) -> Vec<JobSpec> {
    let base = JobSpec {
        rw: RwMode::RandRead,
        size: Some(MB as u64),
        runtime,
        time_based: runtime.is_some(),
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
    let r = snapblk_loadgen::run_matrix(&mut t, &jobs, 2, None, Some(stop), |_, _, _| calls += 1)
        .unwrap();
    raiser.join().unwrap();
    assert!(t0.elapsed().as_secs() < 20, "stop was not honoured");
    assert_eq!(calls, 1, "nothing runs after the stop");
    assert_eq!(r.len(), 1, "configurations that never ran are left out");
    assert_eq!(r[0].runs.len(), 1);
    let run = &r[0].runs[0];
    assert!(run.read.ios > 0 && run.seconds < 20.0, "{run:?}");
}

#[test]
fn repetitions_are_interleaved_across_configurations() {
    let (mut t, _) = recording_target(MB);
    let jobs = qd_sweep(&[1, 4, 16], None);
    let mut order = Vec::new();
    let r = snapblk_loadgen::run_matrix(&mut t, &jobs, 3, None, None, |rep, job, _| {
        order.push((rep, job.iodepth))
    })
    .unwrap();
    // Rep 1 of every configuration before rep 2 of any, and so on.
    assert_eq!(
        order,
        [
            (0, 1),
            (0, 4),
            (0, 16),
            (1, 1),
            (1, 4),
            (1, 16),
            (2, 1),
            (2, 4),
            (2, 16)
        ]
    );
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|c| c.runs.len() == 3));
}

#[test]
fn direct_reaches_the_target_open() {
    let (mut t, sh) = recording_target(MB);
    let mut jobs = qd_sweep(&[1], None);
    jobs.push(JobSpec {
        direct: true,
        ..jobs[0].clone()
    });
    snapblk_loadgen::run_matrix(&mut t, &jobs, 1, None, None, |_, _, _| {}).unwrap();
    // The first open is the up-front alignment check of the direct job.
    assert_eq!(sh.lock().unwrap().opened_direct, [true, false, true]);
}

#[test]
fn misaligned_direct_jobs_fail_before_any_io() {
    let (mut t, sh) = recording_target(MB);
    sh.lock().unwrap().request_alignment = 512;
    let direct = |bs: u64, offset: u64, size: Option<u64>| JobSpec {
        rw: RwMode::Write,
        bs,
        offset,
        size,
        direct: true,
        ..Default::default()
    };
    let cases = [
        (
            vec![direct(1000, 0, None)],
            "--bs 1000 is not a multiple of the target's 512-byte direct I/O alignment",
        ),
        (
            vec![direct(4096, 1000, None)],
            "--offset 1000 is not a multiple of the target's 512-byte direct I/O alignment",
        ),
        (
            vec![direct(4096, 0, Some(100_000))],
            "--size 100000 is not a multiple of the target's 512-byte direct I/O alignment",
        ),
        // A sweep whose second block size is bad: caught before the first one runs.
        (
            vec![direct(4096, 0, None), direct(1000, 0, None)],
            "--bs 1000 is not",
        ),
    ];
    for (jobs, want) in cases {
        let mut runs = 0;
        let e = snapblk_loadgen::run_matrix(&mut t, &jobs, 1, None, None, |_, _, _| runs += 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
        assert_eq!(runs, 0, "{want}: a configuration ran");
        let s = sh.lock().unwrap();
        assert!(
            s.log.is_empty() && s.calls.is_empty(),
            "{want}: I/O was done"
        );
    }
    // The same checks guard a single run (e.g. fgbg's foreground), also without O_DIRECT when
    // the device demands alignment anyway.
    let job = JobSpec {
        direct: false,
        ..direct(1000, 0, None)
    };
    let e = snapblk_loadgen::run_workload(&mut t, &job, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--bs 1000 is not a multiple of the target's 512-byte I/O alignment"),
        "{e}"
    );
    // Aligned values pass.
    let r = snapblk_loadgen::run_matrix(
        &mut t,
        &[direct(512, 1024, Some(8192))],
        1,
        None,
        None,
        |_, _, _| {},
    )
    .unwrap();
    assert_eq!(r[0].runs[0].write.ios, 16);
}

#[test]
fn request_buffers_start_on_buf_alignment() {
    // bs 4096 with an 8 KiB buf-alignment: slots must not simply be bs apart.
    let (mut t, sh) = recording_target(MB);
    sh.lock().unwrap().buf_alignment = 8192;
    let job = JobSpec {
        rw: RwMode::RandWrite,
        bs: 4096,
        iodepth: 8,
        size: Some(256 << 10),
        ..Default::default()
    };
    let r = snapblk_loadgen::run_workload(&mut t, &job, &Default::default()).unwrap();
    assert_eq!(r.write.ios, 64);
    assert_eq!(sh.lock().unwrap().misaligned_bufs, 0);
}

/// The open-file flags (octal `flags:` of /proc/self/fdinfo) of every descriptor of this
/// process that refers to `path`.
fn open_flags_of(path: &std::path::Path) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if std::fs::read_link(e.path()).ok().as_deref() != Some(path) {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            e.file_name().to_str().unwrap()
        ))
        .unwrap_or_default();
        if let Some(f) = info.lines().find_map(|l| l.strip_prefix("flags:")) {
            out.push(i32::from_str_radix(f.trim(), 8).unwrap());
        }
    }
    out
}

#[test]
fn direct_opens_a_path_target_with_o_direct() {
    use snapblk_loadgen::{SpecTarget, Target};
    // The temp dir's filesystem must accept O_DIRECT (ext4, tmpfs since Linux 6.6); if it does
    // not, the open fails the test rather than skipping it.
    let dir = std::env::temp_dir().join(format!("snapblk-loadgen-direct-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("img");
    std::fs::write(&img, vec![0u8; MB]).unwrap();
    let img = img.canonicalize().unwrap();
    let mut t = SpecTarget::new(img.to_str().unwrap());
    for direct in [false, true] {
        let dev = t.open(1, direct).unwrap();
        let flags = open_flags_of(&img);
        assert!(!flags.is_empty(), "the target does not hold {img:?} open");
        assert!(
            flags.iter().all(|f| (f & libc::O_DIRECT != 0) == direct),
            "direct={direct}: open flags {flags:?} (O_DIRECT is {:#o})",
            libc::O_DIRECT
        );
        drop(dev);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
