//! The merge and the scheduler under the seeded fault-injecting disk (`fault.rs`), without power
//! loss: read, write and flush errors that make a merge fail, and a slow disk on which
//! foreground reads must still be served promptly while the merge runs. Every failure message
//! names the seed that reproduces it.

use snapblk_core::rng::Rng;
use snapblk_snapshot::fault::{FaultPlan, FaultWorld, Latency, OpInfo};
use snapblk_snapshot::synth::{RawOnly, SynthCase, SynthSpec, generate};
use snapblk_snapshot::{
    MergeOptions, SchedConfig, Scheduler, Snapshot, SnapshotConfig, SnapshotParts, merge,
};
use std::sync::{Arc, Mutex};

fn read_all(s: &Snapshot, what: &str) -> Vec<u8> {
    let mut v = vec![0u8; s.capacity() as usize];
    s.read(0, &mut v)
        .unwrap_or_else(|e| panic!("{what}: read through snapshot: {e}"));
    v
}

/// The first 4 KiB block where `a` and `b` differ.
fn first_diff_block(a: &[u8], b: &[u8]) -> Option<usize> {
    a.chunks(4096).zip(b.chunks(4096)).position(|(x, y)| x != y)
}

/// An error and its causes, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[derive(Default, Debug)]
struct Totals {
    failed_merges: u64,
    reads: u64,
    writes: u64,
    flushes: u64,
    resumed_from_scratch: u64,
}

/// Merge `case` on disks that fail reads, writes and flushes at random (1 to 3 failing runs,
/// each on a fresh seed), checking after each failure that the merge reported EIO and that the
/// snapshot still reads as the target image; then turn the faults off and finish the merge,
/// on the same snapshot or (`restart`) on one opened again from the disks as they are.
fn fail_then_resume(case: &SynthCase, seed: u64, restart: bool, t: &mut Totals) {
    let mut rng = Rng::new(seed);
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let mut snap = case.open_on(&world, SnapshotConfig::default()).unwrap();
    let attempts = 1 + rng.below(3);
    for a in 0..attempts {
        let plan_seed = rng.next_u64();
        world.set_plan(FaultPlan {
            seed: plan_seed,
            read_error_probability: 0.01,
            write_error_probability: 0.01,
            flush_error_probability: 0.02,
            ..FaultPlan::default()
        });
        let what = format!("seed {seed} attempt {a} (fault seed {plan_seed})");
        match merge(&snap, MergeOptions::default()) {
            Ok(_) => {
                world.set_plan(FaultPlan::default());
                let base = world.current().swap_remove(0);
                assert_eq!(
                    first_diff_block(&base, &case.target),
                    None,
                    "{what}: a merge that succeeded left a wrong base"
                );
                return;
            }
            Err(e) => {
                let msg = chain(&e);
                let errno = snapblk_core::Error::from(e).errno;
                assert_eq!(errno, libc::EIO, "{what}: {msg}");
                assert!(
                    msg.contains("injected"),
                    "{what}: not the injected error: {msg}"
                );
                t.failed_merges += 1;
            }
        }
        world.set_plan(FaultPlan::default());
        if let Some(b) = first_diff_block(&read_all(&snap, &what), &case.target) {
            panic!("{what}: after the failed merge the snapshot reads wrong at block {b}");
        }
    }
    let inj = world.injected();
    t.reads += inj.reads;
    t.writes += inj.writes;
    t.flushes += inj.flushes;
    let what = format!("seed {seed} (restart: {restart})");
    if restart {
        // A restart without power loss: every write the failed runs made is still there.
        let images = world.current();
        let world2 = FaultWorld::new(images);
        snap = case.open_on(&world2, SnapshotConfig::default()).unwrap();
        let rep = merge(&snap, MergeOptions::default())
            .unwrap_or_else(|e| panic!("{what}: resume after restart: {}", chain(&e)));
        t.resumed_from_scratch += rep.resumed_from_scratch as u64;
        check_merged(case, &world2, &snap, &what);
    } else {
        merge(&snap, MergeOptions::default())
            .unwrap_or_else(|e| panic!("{what}: resume: {}", chain(&e)));
        check_merged(case, &world, &snap, &what);
    }
}

fn check_merged(case: &SynthCase, world: &FaultWorld, snap: &Snapshot, what: &str) {
    let base = world.current().swap_remove(0);
    if let Some(b) = first_diff_block(&base, &case.target) {
        panic!("{what}: merged base differs from the target at block {b}");
    }
    assert_eq!(
        first_diff_block(&read_all(snap, what), &case.target),
        None,
        "{what}: read after merge"
    );
    assert_eq!(snap.merge_progress().0, case.ops.len(), "{what}");
}

#[test]
fn a_merge_failing_with_eio_leaves_the_base_consistent_and_resumable() {
    let mut t = Totals::default();
    for seed in 0..120u64 {
        let spec = SynthSpec {
            scratch_size: match seed % 3 {
                0 => 0,
                1 => 64 << 10,
                _ => 2 << 20,
            },
            // Without scratch an XOR that reads its own destination is refused.
            unaligned_xor: seed % 3 != 0,
            ..SynthSpec::default()
        };
        let case = generate(&spec, 5000 + seed);
        fail_then_resume(&case, seed, seed % 2 == 0, &mut t);
    }
    eprintln!("seeds 0..120: {t:?}");
    // The faults hit every kind of operation, and most runs failed at least once.
    assert!(t.failed_merges >= 100, "seeds 0..120: {t:?}");
    assert!(
        t.reads > 20 && t.writes > 20 && t.flushes > 20,
        "seeds 0..120: {t:?}"
    );
    assert!(
        t.resumed_from_scratch > 0,
        "seeds 0..120: some restarts find a window staged in scratch: {t:?}"
    );
}

/// What a foreground reader saw during one merge on a slow disk.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FgRun {
    /// Per foreground read: (virtual latency, time since the previous foreground read ended).
    reads: Vec<(u64, u64)>,
    /// Virtual time the whole merge took.
    merge_ns: u64,
}

const READ: Latency = Latency {
    min_ns: 100_000,
    jitter_mean_ns: 0,
    ns_per_kib: 10_000,
};
const FLUSH: Latency = Latency {
    min_ns: 500_000,
    jitter_mean_ns: 0,
    ns_per_kib: 0,
};

fn service(l: Latency, bytes: u64) -> u64 {
    l.min_ns + bytes * l.ns_per_kib / 1024
}

/// A case whose merge moves long contiguous runs (four shifted ranges of 600 blocks), staged
/// through a 2 MiB scratch area: large requests unless the scheduler splits them.
fn big_runs_case(seed: u64) -> SynthCase {
    let spec = SynthSpec {
        blocks: 8192,
        scratch_size: 2 << 20,
        chain_len: 600,
        chains: 4,
        random_ordered: 40,
        replaces: 64,
        zeros: 8,
        unaligned_xor: false,
        ..SynthSpec::default()
    };
    generate(&spec, seed)
}

/// Merge `case` on a slow disk (100 µs + 10 µs/KiB, flush 500 µs: about 100 MB/s) with a
/// scheduler on the disk's virtual clock, while a foreground client reads random 4 KiB blocks:
/// think times of 50–500 µs, and one time in 40 a quiet gap of 30 ms (long enough for the
/// background budget to grow back to its maximum). Each client read arrives
/// while a merge request is in service (the world's issue hook), so it queues behind it.
fn merge_with_foreground(case: &SynthCase, cfg: SchedConfig, seed: u64) -> FgRun {
    let world = FaultWorld::with_plan(
        vec![case.base.clone(), case.cow.clone()],
        FaultPlan {
            seed,
            read_latency: READ,
            write_latency: READ,
            flush_latency: FLUSH,
            ..FaultPlan::default()
        },
    );
    let snap = Arc::new(
        Snapshot::open_with_scheduler(
            SnapshotParts {
                base: Arc::new(world.disk(0)),
                cow: Arc::new(world.disk(1)),
                map: case.map(),
                layout: case.layout,
                decoder: Arc::new(RawOnly),
                config: SnapshotConfig::default(),
            },
            Scheduler::with_clock(cfg, world.clone()),
        )
        .unwrap(),
    );
    struct Client {
        rng: Rng,
        next: u64,
        last_end: u64,
        reads: Vec<(u64, u64)>,
    }
    let client = Arc::new(Mutex::new(Client {
        rng: Rng::new(seed ^ 0xf00d),
        next: world.now_ns() + 1_000_000,
        last_end: 0,
        reads: Vec::new(),
    }));
    let blocks = snap.capacity() / 4096;
    let (w, s, c) = (world.clone(), snap.clone(), client.clone());
    world.on_issue(Some(Arc::new(move |op: &OpInfo| {
        let mut c = c.lock().unwrap();
        if c.next >= op.done_ns {
            return;
        }
        w.advance_to(c.next);
        let arrival = w.now_ns();
        let block = c.rng.below(blocks);
        let mut buf = [0u8; 4096];
        s.read(block * 4096, &mut buf)
            .unwrap_or_else(|e| panic!("seed {seed}: foreground read of block {block}: {e}"));
        let end = w.now_ns();
        let since = arrival - c.last_end;
        c.reads.push((end - arrival, since));
        c.last_end = end;
        let think = if c.rng.below(40) == 0 {
            30_000_000
        } else {
            50_000 + c.rng.below(450_000)
        };
        c.next = end + think;
    })));
    let start = world.now_ns();
    merge(&snap, MergeOptions::default())
        .unwrap_or_else(|e| panic!("seed {seed}: merge on the slow disk: {}", chain(&e)));
    world.on_issue(None);
    let base = world.current().swap_remove(0);
    assert_eq!(
        first_diff_block(&base, &case.target),
        None,
        "seed {seed}: merged base"
    );
    let reads = client.lock().unwrap().reads.clone();
    FgRun {
        reads,
        merge_ns: world.now_ns() - start,
    }
}

#[test]
fn foreground_latency_on_a_slow_disk_stays_bounded_in_virtual_time() {
    let cfg = SchedConfig::default();
    let fg = 2 * service(READ, 4096);
    // Behind at most one background request of the largest budget (after a quiet period) ...
    let bound = service(READ, cfg.max_budget).max(FLUSH.min_ns) + fg;
    // ... and, within a burst (the previous read ended less than `idle` ago), of the smallest.
    let burst_bound = service(READ, cfg.min_budget).max(FLUSH.min_ns) + fg;
    let mut worst_unscheduled = 0;
    for seed in 0..3u64 {
        let case = big_runs_case(100 + seed);
        let run = merge_with_foreground(&case, cfg, seed);
        assert_eq!(
            run,
            merge_with_foreground(&case, cfg, seed),
            "seed {seed}: the same seed gives the same virtual run"
        );
        let burst_worst = run
            .reads
            .iter()
            .filter(|r| r.1 < cfg.idle_ns)
            .map(|r| r.0)
            .max();
        eprintln!(
            "seed {seed}: {} reads over {} virtual ns of merge; worst latency {:?} ns, within bursts {burst_worst:?} ns",
            run.reads.len(),
            run.merge_ns,
            run.reads.iter().map(|r| r.0).max(),
        );
        assert!(
            run.reads.len() > 200,
            "seed {seed}: only {} foreground reads",
            run.reads.len()
        );
        let mut in_burst = 0;
        for &(lat, since) in &run.reads {
            assert!(
                lat <= bound,
                "seed {seed}: a read took {lat} ns > {bound} ns"
            );
            if since < cfg.idle_ns {
                in_burst += 1;
                assert!(
                    lat <= burst_bound,
                    "seed {seed}: a read {since} ns after the previous one took {lat} ns > {burst_bound} ns"
                );
            }
        }
        assert!(
            in_burst * 10 >= run.reads.len() * 8,
            "seed {seed}: {in_burst} of {} reads within bursts",
            run.reads.len()
        );
        // The merge still progresses at a useful rate while it yields: it moved about 30 MiB,
        // i.e. about 0.3 s at the disk's 100 MB/s, plus the client's reads and quiet gaps.
        assert!(
            run.merge_ns < 10_000_000_000,
            "seed {seed}: merge took {} virtual ns",
            run.merge_ns
        );
        // Without the scheduler the merge issues whole runs and reads wait behind them.
        let off = merge_with_foreground(
            &case,
            SchedConfig {
                enabled: false,
                ..cfg
            },
            seed,
        );
        let worst = off
            .reads
            .iter()
            .filter(|r| r.1 < cfg.idle_ns)
            .map(|r| r.0)
            .max()
            .unwrap_or(0);
        worst_unscheduled = worst_unscheduled.max(worst);
    }
    eprintln!(
        "seeds 0..3 without the scheduler: worst latency within bursts {worst_unscheduled} ns"
    );
    assert!(
        worst_unscheduled > 5 * burst_bound,
        "seeds 0..3: the test must be able to fail: unscheduled worst burst latency {worst_unscheduled} ns vs bound {burst_bound} ns"
    );
}
