//! Crash safety of the merge: power cuts at random instants (fault-injection disks that lose,
//! tear and reorder unflushed writes), each followed by a restart that first reads the whole
//! device through the snapshot, then resumes the merge. Also: reads during a merge.

use snapblk_core::ReadAt;
use snapblk_core::rng::Rng;
use snapblk_snapshot::fault::FaultWorld;
use snapblk_snapshot::synth::{RawOnly, SynthCase, SynthSpec, generate};
use snapblk_snapshot::{MergeOptions, MergeStep, Snapshot, SnapshotConfig, SnapshotParts, merge};
use std::sync::Arc;

type MkDecoder<'a> = &'a dyn Fn() -> Arc<dyn snapblk_snapshot::Decoder>;

fn open_with(
    case: &SynthCase,
    world: &Arc<FaultWorld>,
    dec: MkDecoder,
) -> snapblk_snapshot::Result<Snapshot> {
    Snapshot::open(SnapshotParts {
        base: Arc::new(world.disk(0)),
        cow: Arc::new(world.disk(1)),
        map: case.map(),
        layout: case.layout,
        decoder: dec(),
        config: SnapshotConfig::default(),
    })
}

fn open(case: &SynthCase, world: &Arc<FaultWorld>) -> snapblk_snapshot::Result<Snapshot> {
    case.open_on(world, SnapshotConfig::default())
}

fn read_all(s: &Snapshot) -> Vec<u8> {
    let mut v = vec![0u8; s.capacity() as usize];
    s.read(0, &mut v).expect("read through snapshot");
    v
}

fn first_diff_block(a: &[u8], b: &[u8]) -> Option<usize> {
    a.chunks(4096).zip(b.chunks(4096)).position(|(x, y)| x != y)
}

/// The merge `snapblk merge` runs: the next window is read on a second thread while the current
/// one is written, so the cuts also land between that thread's reads; the units the pre-merge
/// check decoded are kept for the merge.
fn pipelined() -> MergeOptions<'static> {
    MergeOptions {
        pipeline: true,
        keep_decoded: snapblk_snapshot::KEEP_DECODED,
        ..Default::default()
    }
}

/// Run one merge to completion on a fresh world; returns the number of disk operations it took
/// and the report.
fn dry_run(case: &SynthCase, dec: MkDecoder) -> (u64, snapblk_snapshot::MergeReport) {
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = open_with(case, &world, dec).unwrap();
    let before = world.ops();
    let rep = merge(&s, pipelined()).unwrap();
    (world.ops() - before, rep)
}

#[derive(Default)]
struct Totals {
    cuts: u64,
    wrong_blocks: u64,
    resumed_from_scratch: u64,
    /// Windows of the uninterrupted runs that went through scratch / skipped it (self-safe).
    scratch_windows: usize,
    self_safe_windows: usize,
    /// Windows of the uninterrupted runs computed on the second thread ahead of their turn.
    computed_ahead: usize,
    /// Decoded units the merges (interrupted or not) took from their pre-merge check.
    units_from_check: u64,
}

/// Cut power `cuts` times at random instants while merging `case`, maybe cut the resume too,
/// then resume to completion; verify reads after every restart and the final base.
fn cut_and_resume(case: &SynthCase, seed: u64, cuts: u64, t: &mut Totals) {
    cut_and_resume_with(case, seed, cuts, t, &|| Arc::new(RawOnly))
}

fn cut_and_resume_with(case: &SynthCase, seed: u64, cuts: u64, t: &mut Totals, dec: MkDecoder) {
    let (total_ops, rep) = dry_run(case, dec);
    t.scratch_windows += rep.scratch_windows;
    t.self_safe_windows += rep.self_safe_windows;
    t.computed_ahead += rep.computed_ahead;
    t.units_from_check += rep.units_from_check;
    let mut rng = Rng::new(seed);
    for c in 0..cuts {
        let mut images = vec![case.base.clone(), case.cow.clone()];
        // Up to three successive interruptions (the resume itself may be cut).
        let rounds = 1 + rng.below(3);
        for _ in 0..rounds {
            let world = FaultWorld::new(images.clone());
            let s = open_with(case, &world, dec).unwrap();
            let got = read_all(&s);
            if let Some(b) = first_diff_block(&got, &case.target) {
                panic!("seed {seed} cut {c}: read after restart differs at block {b}");
            }
            world.cut_after(rng.below(total_ops + 1));
            let r = merge(&s, pipelined());
            if let Ok(rep) = &r {
                t.resumed_from_scratch += rep.resumed_from_scratch as u64;
            }
            images = world.recover(rng.next_u64());
            t.cuts += 1;
        }
        let world = FaultWorld::new(images);
        let s = open_with(case, &world, dec).unwrap();
        assert_eq!(
            read_all(&s),
            case.target,
            "seed {seed} cut {c}: read before final resume"
        );
        let rep = merge(&s, pipelined()).unwrap();
        t.resumed_from_scratch += rep.resumed_from_scratch as u64;
        t.units_from_check += rep.units_from_check;
        let base = world.current().swap_remove(0);
        let wrong = base
            .chunks(4096)
            .zip(case.target.chunks(4096))
            .filter(|(x, y)| x != y)
            .count() as u64;
        t.wrong_blocks += wrong;
        assert_eq!(
            wrong, 0,
            "seed {seed} cut {c}: merged base has {wrong} wrong blocks"
        );
        assert_eq!(
            read_all(&s),
            case.target,
            "seed {seed} cut {c}: read after merge"
        );
        assert_eq!(s.merge_progress().0, case.ops.len());
    }
}

#[test]
fn power_cuts_during_merge_with_scratch() {
    let mut t = Totals::default();
    for w in 0..20u64 {
        let spec = SynthSpec {
            scratch_size: if w % 4 == 0 { 2 << 20 } else { 64 << 10 },
            ..SynthSpec::default()
        };
        let case = generate(&spec, 1000 + w);
        cut_and_resume(&case, w, 30, &mut t);
    }
    eprintln!(
        "scratch: {} cuts, {} resumed from scratch, {} wrong blocks",
        t.cuts, t.resumed_from_scratch, t.wrong_blocks
    );
    assert!(t.cuts >= 600);
    assert!(
        t.resumed_from_scratch > 10,
        "cuts must land inside staged windows"
    );
    // Both kinds of window are exercised: staged through scratch, and self-safe ones that skip
    // it (cuts inside those resume by re-reading their untouched sources).
    assert!(
        t.scratch_windows > 20 && t.self_safe_windows > 5,
        "{} scratch windows, {} self-safe windows",
        t.scratch_windows,
        t.self_safe_windows
    );
    // The cuts also land while a window is read ahead on the second thread.
    assert!(
        t.computed_ahead > 20,
        "{} windows computed ahead",
        t.computed_ahead
    );
    assert_eq!(t.wrong_blocks, 0);
}

/// Mostly random COPY/XOR ops on a larger device: most windows are self-safe and skip scratch
/// (their state byte stays 1), a chain keeps some scratch windows in between.
#[test]
fn power_cuts_during_merge_in_self_safe_windows() {
    let mut t = Totals::default();
    for w in 0..10u64 {
        let spec = SynthSpec {
            blocks: 1024,
            chains: 1,
            chain_len: 12,
            random_ordered: 80,
            ..SynthSpec::default()
        };
        let case = generate(&spec, 4000 + w);
        cut_and_resume(&case, 200 + w, 20, &mut t);
    }
    eprintln!(
        "self-safe: {} cuts, {} scratch windows, {} self-safe windows, {} wrong blocks",
        t.cuts, t.scratch_windows, t.self_safe_windows, t.wrong_blocks
    );
    assert!(t.cuts >= 200);
    assert!(
        t.self_safe_windows > t.scratch_windows,
        "{} self-safe vs {} scratch windows",
        t.self_safe_windows,
        t.scratch_windows
    );
    assert_eq!(t.wrong_blocks, 0);
}

#[test]
fn power_cuts_during_merge_without_scratch() {
    let mut t = Totals::default();
    for w in 0..20u64 {
        let spec = SynthSpec {
            scratch_size: 0,
            unaligned_xor: false,
            ..SynthSpec::default()
        };
        let case = generate(&spec, 2000 + w);
        cut_and_resume(&case, 100 + w, 25, &mut t);
    }
    eprintln!(
        "no scratch: {} cuts, {} wrong blocks",
        t.cuts, t.wrong_blocks
    );
    assert!(t.cuts >= 500);
    assert_eq!(t.wrong_blocks, 0);
}

#[test]
fn reads_are_right_at_every_merge_step() {
    for (w, scratch) in [(0u64, 64u32 << 10), (1, 0), (2, 2 << 20)] {
        let spec = SynthSpec {
            scratch_size: scratch,
            unaligned_xor: scratch != 0,
            ..SynthSpec::default()
        };
        let case = generate(&spec, 3000 + w);
        let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
        let s = open(&case, &world).unwrap();
        let steps = std::sync::Mutex::new(Vec::new());
        let hook = |st: MergeStep| {
            // Unaligned and full reads at every durable step of the merge.
            let all = read_all(&s);
            assert!(
                all == case.target,
                "{st:?}: full read wrong at block {:?}",
                first_diff_block(&all, &case.target)
            );
            let mut b = vec![0u8; 5000];
            s.read(11 * 512, &mut b).unwrap();
            assert_eq!(&b[..], &case.target[11 * 512..11 * 512 + 5000]);
            steps.lock().unwrap().push(st);
        };
        let opts = MergeOptions {
            hook: Some(&hook),
            max_window: Some(9),
            pipeline: true,
            ..Default::default()
        };
        let rep = merge(&s, opts).unwrap();
        assert!(rep.ordered_windows > 1, "several windows: {rep:?}");
        assert!(rep.computed_ahead > 0, "windows read ahead: {rep:?}");
        let steps = steps.into_inner().unwrap();
        assert!(steps.iter().any(|s| matches!(s, MergeStep::Staged { .. })));
        assert_eq!(world.current()[0], case.target);
    }
}

#[test]
fn concurrent_readers_during_merge() {
    let spec = SynthSpec {
        blocks: 1024,
        chains: 6,
        chain_len: 60,
        random_ordered: 200,
        ..SynthSpec::default()
    };
    let case = generate(&spec, 77);
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = open(&case, &world).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        for r in 0..2u64 {
            let (s, case, done) = (&s, &case, &done);
            sc.spawn(move || {
                let mut rng = Rng::new(r);
                let mut n = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) || n < 200 {
                    let off = rng.below(s.capacity() - 9000);
                    let len = 1 + rng.below(9000) as usize;
                    let mut b = vec![0u8; len];
                    s.read(off, &mut b).unwrap();
                    assert!(
                        b[..] == case.target[off as usize..off as usize + len],
                        "reader {r} at {off}+{len}"
                    );
                    n += 1;
                }
            });
        }
        merge(
            &s,
            MergeOptions {
                max_window: Some(7),
                ..Default::default()
            },
        )
        .unwrap();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(world.current()[0], case.target);
}

#[test]
fn interrupted_merge_stops_at_a_safe_point_and_resumes() {
    let case = generate(&SynthSpec::default(), 5);
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = open(&case, &world).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let hook = |st: MergeStep| {
        if let MergeStep::Committed { merged } = st
            && merged > 20
        {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let r = merge(
        &s,
        MergeOptions {
            stop: Some(&stop),
            hook: Some(&hook),
            ..Default::default()
        },
    );
    assert!(matches!(r, Err(snapblk_snapshot::SnapError::Interrupted)));
    let imgs = world.current();
    let world2 = FaultWorld::new(imgs);
    let s2 = open(&case, &world2).unwrap();
    assert!(s2.merge_progress().0 > 20);
    assert_eq!(read_all(&s2), case.target);
    let rep = merge(&s2, MergeOptions::default()).unwrap();
    assert!(rep.resumed_at > 20);
    assert_eq!(world2.current()[0], case.target);
    let _ = ReadAt::size(&world2.disk(0));
}

/// Every other REPLACE block of a generated case becomes text, which lz4 stores compressed (the
/// generated data does not compress): the merge then has units to decode.
fn compressible_replaces(case: &mut SynthCase) {
    let bs = case.layout.block_size as usize;
    for (k, op) in case.ops.iter().enumerate().filter(|(k, _)| k % 2 == 0) {
        if let snapblk_snapshot::OpKind::Replace { payload, .. } = op.kind {
            let text: Vec<u8> = format!("block {} of op {k}\n", op.new_block)
                .bytes()
                .cycle()
                .take(bs)
                .collect();
            let at = payload.offset as usize;
            case.cow[at..at + bs].copy_from_slice(&text);
            let d = op.new_block as usize * bs;
            case.target[d..d + bs].copy_from_slice(&text);
        }
    }
}

#[test]
fn power_cuts_on_real_cow_files() {
    // The same workloads written as real v3 (2 MiB scratch, lz4) and v2 COW files.
    let mut t = Totals::default();
    for (w, version) in [(0u64, 3u16), (1, 2), (2, 3), (3, 2)] {
        let spec = SynthSpec {
            scratch_size: 2 << 20,
            ..SynthSpec::default()
        };
        let mut case = generate(&spec, 4000 + w);
        compressible_replaces(&mut case);
        let opts = snapblk_cow::WriterOptions {
            version,
            codec: snapblk_cow::Codec::new(snapblk_cow::Compression::Lz4),
            ..Default::default()
        };
        let cow = snapblk_snapshot::synth::write_cow(&case, opts).unwrap();
        // The block map and layout the snapshot builds from the real COW.
        let loaded = snapblk_snapshot::open_devs(
            Arc::new(snapblk_core::MemFile::new(case.base.clone())),
            Arc::new(snapblk_core::MemFile::new(cow.clone())),
            SnapshotConfig::default(),
        )
        .unwrap();
        case.cow = cow;
        case.layout = loaded.layout();
        case.ops = loaded.map().ops().to_vec();
        let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
        let s = open_with(&case, &world, &|| Arc::new(snapblk_snapshot::CowDecoder)).unwrap();
        assert_eq!(read_all(&s), case.target, "real COW v{version} reads");
        cut_and_resume_with(&case, 300 + w, 15, &mut t, &|| {
            Arc::new(snapblk_snapshot::CowDecoder)
        });
    }
    assert!(t.cuts >= 60);
    assert_eq!(t.wrong_blocks, 0);
    assert!(t.units_from_check > 0, "no unit kept by the check");
}
