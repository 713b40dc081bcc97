//! I/O patterns of every workload, checked on a recording driver.

mod common;

use common::recording_target;
use snapblk_loadgen::{BatchOpts, Iomem, JobSpec, RunOpts, RwMode, run_workload};
use std::collections::HashSet;

const MB: usize = 1 << 20;

fn job(rw: RwMode, bs: u64, qd: u32, jobs: u32, size: u64) -> JobSpec {
    JobSpec {
        rw,
        bs,
        iodepth: qd,
        numjobs: jobs,
        size: Some(size),
        ..Default::default()
    }
}

#[test]
fn sequential_read_is_contiguous_and_counted() {
    let (mut t, sh) = recording_target(4 * MB);
    let r = run_workload(
        &mut t,
        &job(RwMode::Read, 4096, 8, 1, 2 << 20),
        &RunOpts::default(),
    )
    .unwrap();
    let log = sh.lock().unwrap().log.clone();
    assert_eq!(log.len(), 512);
    for (i, rec) in log.iter().enumerate() {
        assert!(!rec.write);
        assert_eq!(rec.offset, i as u64 * 4096, "request {i}");
        assert_eq!(rec.len, 4096);
    }
    assert_eq!(r.read.ios, 512);
    assert_eq!(r.write.ios, 0);
    assert_eq!(r.read.bytes, 2 << 20);
    assert_eq!(r.read.lat.count(), 512);
    assert!(sh.lock().unwrap().max_outstanding[0] <= 8);
}

#[test]
fn sequential_write_is_contiguous_with_offset() {
    let (mut t, sh) = recording_target(4 * MB);
    let spec = JobSpec {
        offset: 1 << 20,
        ..job(RwMode::Write, 65536, 4, 1, 1 << 20)
    };
    run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
    let log = sh.lock().unwrap().log.clone();
    let offs: Vec<u64> = log.iter().map(|r| r.offset).collect();
    assert_eq!(
        offs,
        (0..16).map(|i| (1 << 20) + i * 65536).collect::<Vec<_>>()
    );
    assert!(log.iter().all(|r| r.write));
}

#[test]
fn random_offsets_aligned_in_range_and_cover_once() {
    for rw in [RwMode::RandRead, RwMode::RandWrite] {
        let (mut t, sh) = recording_target(8 * MB);
        run_workload(&mut t, &job(rw, 8192, 16, 1, 4 << 20), &RunOpts::default()).unwrap();
        let log = sh.lock().unwrap().log.clone();
        assert_eq!(log.len(), 512);
        let mut seen = HashSet::new();
        for r in &log {
            assert_eq!(r.offset % 8192, 0);
            assert!(r.offset + 8192 <= 4 << 20);
            assert!(
                seen.insert(r.offset),
                "block {} twice in one pass",
                r.offset
            );
            assert_eq!(r.write, rw == RwMode::RandWrite);
        }
        let ascending = log
            .windows(2)
            .filter(|w| w[1].offset == w[0].offset + 8192)
            .count();
        assert!(
            ascending < 40,
            "random pattern has {ascending} sequential steps"
        );
        assert!(
            sh.lock().unwrap().max_outstanding[0] >= 2,
            "queue depth was not used"
        );
    }
}

#[test]
fn mix_ratio_follows_rwmixread() {
    for (rw, pct) in [(RwMode::RandRw, 70u32), (RwMode::Rw, 30)] {
        let (mut t, sh) = recording_target(16 * MB);
        let spec = JobSpec {
            rwmixread: pct,
            ..job(rw, 4096, 4, 1, 16 << 20)
        };
        let r = run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
        let log = sh.lock().unwrap().log.clone();
        let reads = log.iter().filter(|r| !r.write).count() as f64 / log.len() as f64;
        assert!(
            (reads * 100.0 - f64::from(pct)).abs() < 3.0,
            "{rw}: {reads}"
        );
        assert_eq!(r.read.ios + r.write.ios, 4096);
        if rw == RwMode::Rw {
            // rw is sequential: offsets still contiguous whatever the direction.
            assert!(log.windows(2).all(|w| w[1].offset == w[0].offset + 4096));
        }
    }
}

#[test]
fn numjobs_share_the_region_as_in_fio() {
    // fio: `size` is per job, and without offset_increment every job covers the same bytes.
    let (mut t, sh) = recording_target(8 * MB);
    run_workload(
        &mut t,
        &job(RwMode::Read, 4096, 2, 4, 1 << 20),
        &RunOpts::default(),
    )
    .unwrap();
    let log = sh.lock().unwrap().log.clone();
    assert_eq!(log.len(), 1024, "4 jobs x 1 MiB each");
    for q in 0..4usize {
        let mine: Vec<u64> = log
            .iter()
            .filter(|r| r.queue == q)
            .map(|r| r.offset)
            .collect();
        assert_eq!(mine, (0..256).map(|i| i * 4096).collect::<Vec<u64>>());
    }
}

#[test]
fn numjobs_get_disjoint_regions_with_offset_increment() {
    let (mut t, sh) = recording_target(8 * MB);
    let spec = JobSpec {
        offset_increment: 1 << 20,
        ..job(RwMode::Read, 4096, 2, 4, 1 << 20)
    };
    run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
    let log = sh.lock().unwrap().log.clone();
    assert_eq!(log.len(), 1024);
    for q in 0..4u64 {
        let mine: Vec<u64> = log
            .iter()
            .filter(|r| r.queue == q as usize)
            .map(|r| r.offset)
            .collect();
        assert_eq!(mine.len(), 256);
        let lo = q * (1 << 20);
        assert!(
            mine.iter().all(|&o| o >= lo && o < lo + (1 << 20)),
            "job {q} left its region"
        );
        assert!(mine.windows(2).all(|w| w[1] == w[0] + 4096));
    }
}

#[test]
fn time_based_loops_and_reports_series() {
    let (mut t, sh) = recording_target(MB);
    let spec = JobSpec {
        runtime: Some(1.2),
        time_based: true,
        ramp_time: 0.2,
        ..job(RwMode::RandRead, 4096, 4, 2, 1 << 20)
    };
    let r = run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
    let n = sh.lock().unwrap().log.len() as u64;
    assert!(
        n > 256,
        "time-based run should wrap the 256-block region, did {n} I/Os"
    );
    assert!(
        r.read.ios > 0 && r.read.ios < n,
        "ramp I/Os are not counted"
    );
    assert!((r.seconds - 1.2).abs() < 0.05, "{}", r.seconds);
    assert!(!r.series.is_empty() && r.series.len() <= 3);
    let series_ios: u64 = r.series.iter().map(|s| s.read_ios).sum();
    assert_eq!(series_ios, r.read.ios);
}

#[test]
fn bad_jobs_are_rejected() {
    let (mut t, _) = recording_target(MB);
    assert!(
        run_workload(
            &mut t,
            &job(RwMode::Read, 4096, 1, 1, 2 << 20),
            &RunOpts::default()
        )
        .is_err()
    );
    assert!(
        run_workload(
            &mut t,
            &job(RwMode::Read, 0, 1, 1, 4096),
            &RunOpts::default()
        )
        .is_err()
    );
    assert!(
        run_workload(
            &mut t,
            &job(RwMode::Read, 4096, 0, 1, 4096),
            &RunOpts::default()
        )
        .is_err()
    );
}

/// Blocks of `data` in `[0, size)` of `bs` bytes.
fn blocks(data: &[u8], bs: usize, size: usize) -> Vec<Vec<u8>> {
    data[..size].chunks(bs).map(<[u8]>::to_vec).collect()
}

#[test]
fn write_buffers_are_random_and_scrambled_like_fio() {
    use snapblk_loadgen::BufferOpts;
    // 2 buffers reused for 16 writes.
    let run = |buffers: BufferOpts| {
        let (mut t, sh) = recording_target(MB);
        let spec = JobSpec {
            buffers,
            ..job(RwMode::Write, 4096, 2, 1, 64 << 10)
        };
        run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
        let d = sh.lock().unwrap().data.clone();
        blocks(&d, 4096, 64 << 10)
    };
    let zeros = |b: &[Vec<u8>]| b.iter().flatten().filter(|&&x| x == 0).count();
    let distinct = |b: &[Vec<u8>]| b.iter().collect::<HashSet<_>>().len();

    // Default: random, and every write unique although buffers are reused.
    let def = run(BufferOpts::default());
    assert_eq!(distinct(&def), 16);
    // Random bytes are zero 1/256 of the time; the stamps add a few zero bytes per sector
    // (high bytes of small offsets and times; offsets of earlier writes stay in the buffer).
    assert!(
        zeros(&def) < (64 << 10) / 10,
        "default data is not random: {} zeros",
        zeros(&def)
    );
    // ... and every 512-byte sector too (no dedupe possible).
    let secs: HashSet<&[u8]> = def.iter().flat_map(|b| b.chunks(512)).collect();
    assert_eq!(secs.len(), 128);

    // Scrambling off: the 2 buffers are written over and over.
    let plain = run(BufferOpts {
        scramble: false,
        ..Default::default()
    });
    assert_eq!(distinct(&plain), 2);

    // Refill: unique writes that share almost no bytes.
    let refill = run(BufferOpts {
        refill: true,
        scramble: false,
        ..Default::default()
    });
    assert_eq!(distinct(&refill), 16);
    let same = refill[0]
        .iter()
        .zip(&refill[2])
        .filter(|(a, b)| a == b)
        .count();
    assert!(same < 100, "{same} equal bytes after refill");

    // A compressible share (without the stamps, which land in the zero half too).
    let half = run(BufferOpts {
        compress_percentage: 50,
        scramble: false,
        ..Default::default()
    });
    let share = zeros(&half) as f64 / (64 << 10) as f64;
    assert!((0.495..0.51).contains(&share), "{share}");
}

/// fio's submission loop: by default every request is submitted on its own (a `do_io` with no
/// room for completions), and a full queue reaps at least one; `iodepth_batch_submit` and
/// `iodepth_batch_complete_min/max` change exactly that.
#[test]
fn submission_and_reaping_follow_fios_batch_options() {
    let run = |batch: BatchOpts| {
        let (mut t, sh) = recording_target(4 * MB);
        let spec = JobSpec {
            batch,
            ..job(RwMode::RandRead, 4096, 8, 1, 1 << 20)
        };
        let r = run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
        assert_eq!(r.read.ios, 256);
        assert_eq!(r.read.lat.count(), 256);
        let s = sh.lock().unwrap();
        assert_eq!(s.log.len(), 256);
        assert!(s.max_outstanding[0] <= 8);
        assert_eq!(s.calls.iter().map(|c| c.submitted).sum::<usize>(), 256);
        assert_eq!(s.calls.iter().map(|c| c.returned).sum::<usize>(), 256);
        s.calls.clone()
    };

    // Defaults: submit each request alone (commit: min 0, no room for completions), reap only
    // when the queue is full.
    let d = BatchOpts::default();
    assert_eq!(
        (
            d.iodepth_batch_submit,
            d.iodepth_batch_complete_min,
            d.iodepth_batch_complete_max
        ),
        (1, 1, 1)
    );
    let calls = run(d);
    let commits: Vec<_> = calls.iter().filter(|c| c.max == 0).collect();
    assert_eq!(commits.len(), 256);
    assert!(
        commits
            .iter()
            .all(|c| c.min == 0 && c.returned == 0 && c.submitted == 1)
    );
    let reaps: Vec<_> = calls.iter().filter(|c| c.max > 0).collect();
    assert!(reaps.iter().all(|c| c.submitted == 0 && c.min <= 1));
    // The recording driver completes at submission, so the first reap gets the whole queue;
    // with complete_max 1 the engine handles those one per loop, without asking the driver
    // again, exactly as fio takes one CQE per reap and leaves the rest in the ring.
    assert_eq!(reaps[0].returned, 8);
    assert_eq!(reaps.len(), 256 / 8);

    // complete_max = iodepth handles them all at once: what the driver sees is the same, only
    // the moment each completion is timestamped differs.
    let all = run(BatchOpts {
        iodepth_batch_complete_max: 0,
        ..d
    });
    assert_eq!(all, calls);

    // Submit in batches of 4: every commit carries 4 requests.
    let calls = run(BatchOpts {
        iodepth_batch_submit: 4,
        iodepth_batch_complete_max: 0,
        ..d
    });
    let commits: Vec<_> = calls.iter().filter(|c| c.max == 0).collect();
    assert_eq!(commits.len(), 256 / 4);
    assert!(commits.iter().all(|c| c.submitted == 4), "{commits:?}");

    // 0 means iodepth: the whole queue goes in one submission.
    let calls = run(BatchOpts {
        iodepth_batch_submit: 0,
        iodepth_batch_complete_max: 0,
        ..d
    });
    assert!(
        calls.iter().all(|c| c.submitted == 0 || c.submitted == 8),
        "{calls:?}"
    );
    assert_eq!(calls[0].submitted, 8);

    // A batch that is not full yet is still submitted before waiting (fio commits before
    // every reap): batches of 3 at depth 8, one completion handled per loop.
    let calls = run(BatchOpts {
        iodepth_batch_submit: 3,
        ..d
    });
    assert!(calls.iter().all(|c| c.submitted <= 3));
    assert!(
        calls
            .iter()
            .any(|c| c.max == 0 && c.submitted < 3 && c.submitted > 0)
    );

    // submit_with_wait: no commits at all, every do_io is a wait that submits; with
    // complete_max = iodepth that is one do_io per refill (the old engine loop).
    let calls = run(BatchOpts {
        submit_with_wait: true,
        iodepth_batch_complete_max: 0,
        ..d
    });
    assert!(calls.iter().all(|c| c.max > 0 && c.min >= 1), "{calls:?}");
    assert_eq!(calls[0].submitted, 8);
    assert_eq!(calls.len(), 256 / 8);

    // complete_min 4: a full queue waits for 4.
    let calls = run(BatchOpts {
        iodepth_batch_complete_min: 4,
        iodepth_batch_complete_max: 0,
        ..d
    });
    let reaps: Vec<_> = calls.iter().filter(|c| c.max > 0).collect();
    assert!(
        reaps.iter().all(|c| c.min == 4 || c.min == c.returned),
        "{reaps:?}"
    );
}

#[test]
fn reap_range_is_fios() {
    let d = BatchOpts::default();
    assert_eq!(d.reap_range(32), (1, 1));
    assert_eq!(d.submit_batch(32), 1);
    let all = BatchOpts {
        iodepth_batch_complete_max: 0,
        ..d
    };
    assert_eq!(all.reap_range(32), (1, 32));
    let b = BatchOpts {
        iodepth_batch_submit: 64,
        iodepth_batch_complete_min: 0,
        iodepth_batch_complete_max: 0,
        submit_with_wait: false,
    };
    // Submit batch above iodepth means iodepth; min 0 behaves as 1 on a full queue.
    assert_eq!(b.submit_batch(32), 32);
    assert_eq!(b.reap_range(32), (1, 32));
    // max below min is raised to min (fio's fixup); both bounded by what is in flight.
    let c = BatchOpts {
        iodepth_batch_submit: 1,
        iodepth_batch_complete_min: 8,
        iodepth_batch_complete_max: 2,
        submit_with_wait: false,
    };
    assert_eq!(c.reap_range(32), (8, 8));
    assert_eq!(c.reap_range(3), (3, 3));
    let w = BatchOpts {
        submit_with_wait: true,
        ..d
    };
    assert_eq!(w.submit_batch(1), usize::MAX);
}

#[test]
fn iomem_chooses_private_or_shared_memfd_buffers() {
    // fio's default (malloc): private anonymous memory; memfd: the device's shared
    // alloc_mem_region memory. Checked on the mapping the driver's requests point into.
    for (iomem, want) in [
        (Iomem::Malloc, "rw-p "),
        (Iomem::Memfd, "rw-s /memfd:libblkio-buf (deleted)"),
    ] {
        let (mut t, sh) = recording_target(MB);
        sh.lock().unwrap().map_bufs = true;
        let spec = JobSpec {
            iomem,
            ..job(RwMode::RandWrite, 4096, 4, 2, MB as u64)
        };
        run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
        let maps = sh.lock().unwrap().buf_maps.clone();
        assert!(!maps.is_empty());
        assert!(maps.iter().all(|m| m == want), "{iomem:?}: {maps:?}");
    }
}

#[test]
fn a_size_based_run_with_a_ramp_measures_one_full_pass_after_it() {
    // As fio without time_based: the ramp loops over the region, then a whole pass of `size`
    // bytes is measured (before, the ramp could use up the only pass and 0 I/Os were measured).
    let (mut t, sh) = recording_target(MB);
    sh.lock().unwrap().submit_delay = std::time::Duration::from_micros(200);
    let spec = JobSpec {
        ramp_time: 0.3,
        ..job(RwMode::Read, 4096, 4, 1, MB as u64)
    };
    let r = run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
    // The pass, plus at most the iodepth requests of the ramp still in flight when it ended
    // (counted when they complete, as time-based runs and fio count them).
    assert!(
        (256..=260).contains(&r.read.ios),
        "measured I/Os: {}",
        r.read.ios
    );
    let total = sh.lock().unwrap().log.len();
    assert!(total > 256, "the ramp did I/O too: {total} requests in all");
}

#[test]
fn runtime_without_time_based_stops_after_one_pass() {
    // fio: a runtime alone is a cap; the job ends when its pass is done.
    let (mut t, sh) = recording_target(MB);
    let spec = JobSpec {
        runtime: Some(30.0),
        ..job(RwMode::RandRead, 4096, 4, 1, 256 << 10)
    };
    let r = run_workload(&mut t, &spec, &RunOpts::default()).unwrap();
    assert_eq!(r.read.ios, 64);
    assert_eq!(sh.lock().unwrap().log.len(), 64);
}
