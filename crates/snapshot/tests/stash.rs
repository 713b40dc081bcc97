//! The merge stash: a COW without a scratch area whose XOR ops read their own destination is
//! refused without a stash, and merges crash-safely with one: power cuts at random instants,
//! each followed by a restart with the same stash, always end in the new image. A stash for
//! another COW, or one the base does not match, is refused; a torn one is ignored.

use snapblk_core::rng::Rng;
use snapblk_snapshot::fault::FaultWorld;
use snapblk_snapshot::synth::{SynthCase, SynthSpec, generate};
use snapblk_snapshot::{MergeOptions, SnapError, SnapshotConfig, Stash, merge};
use std::sync::Arc;

fn no_scratch_case(seed: u64) -> SynthCase {
    let spec = SynthSpec {
        scratch_size: 0,
        unaligned_xor: true,
        ..SynthSpec::default()
    };
    generate(&spec, seed)
}

fn read_all(s: &snapblk_snapshot::Snapshot) -> Vec<u8> {
    let mut v = vec![0u8; s.capacity() as usize];
    s.read(0, &mut v).expect("read through snapshot");
    v
}

fn opts(stash: &Stash) -> MergeOptions<'_> {
    MergeOptions {
        stash: Some(stash),
        pipeline: true,
        ..Default::default()
    }
}

#[test]
fn ops_reading_their_own_destination_need_a_stash() {
    let case = no_scratch_case(7000);
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
    let e = merge(&s, MergeOptions::default()).unwrap_err();
    assert!(e.to_string().contains("merge --stash FILE"), "{e}");
    assert_eq!(world.current()[0], case.base, "refused before writing");
    let dir = tempfile::tempdir().unwrap();
    let stash = Stash::new(&dir.path().join("m.stash"));
    let rep = merge(&s, opts(&stash)).unwrap();
    assert!(rep.stashed_ops > 0, "{rep:?}");
    assert_eq!(world.current()[0], case.target);
}

#[test]
fn power_cuts_during_a_stashed_merge_lose_nothing() {
    let (mut cuts, mut stashed, mut resumed) = (0u64, 0usize, 0u64);
    for w in 0..12u64 {
        let case = no_scratch_case(7100 + w);
        let dir = tempfile::tempdir().unwrap();
        // Disk operations of an uninterrupted run, to spread the cuts over.
        let total = {
            let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
            let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
            let stash = Stash::new(&dir.path().join("dry.stash"));
            let before = world.ops();
            let rep = merge(&s, opts(&stash)).unwrap();
            stashed += rep.stashed_ops;
            world.ops() - before
        };
        let mut rng = Rng::new(w);
        for c in 0..25 {
            let stash = Stash::new(&dir.path().join(format!("cut{c}.stash")));
            let mut images = vec![case.base.clone(), case.cow.clone()];
            for _ in 0..1 + rng.below(3) {
                let world = FaultWorld::new(images.clone());
                let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
                s.attach_stash(&stash).unwrap();
                assert!(
                    read_all(&s) == case.target,
                    "case {w} cut {c}: read after restart"
                );
                world.cut_after(rng.below(total + 1));
                if let Ok(rep) = merge(&s, opts(&stash)) {
                    resumed += rep.resumed_from_stash as u64;
                }
                images = world.recover(rng.next_u64());
                cuts += 1;
            }
            let world = FaultWorld::new(images);
            let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
            let rep = merge(&s, opts(&stash)).unwrap();
            resumed += rep.resumed_from_stash as u64;
            let base = world.current().swap_remove(0);
            let wrong = base
                .chunks(4096)
                .zip(case.target.chunks(4096))
                .filter(|(x, y)| x != y)
                .count();
            assert_eq!(wrong, 0, "case {w} cut {c}: {wrong} wrong blocks");
        }
    }
    eprintln!("stash: {cuts} cuts, {stashed} stashed ops, {resumed} resumed from the stash");
    assert!(
        stashed >= 12,
        "every case has ops reading their own destination"
    );
    assert!(resumed > 5, "cuts must land between a stash and its commit");
}

/// Merge until the first stashed op is written to the base but not committed; returns the
/// disks' contents at that instant.
fn stop_after_first_stashed_write(case: &SynthCase, stash: &Stash) -> Vec<Vec<u8>> {
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let at = std::sync::Mutex::new(None);
    let hook = |st: snapblk_snapshot::MergeStep| {
        let mut at = at.lock().unwrap();
        if at.is_none()
            && matches!(st, snapblk_snapshot::MergeStep::Written { .. })
            && std::fs::metadata(stash.path()).is_ok_and(|m| m.len() > 24)
        {
            *at = Some(world.current());
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let _ = merge(
        &s,
        MergeOptions {
            stash: Some(stash),
            hook: Some(&hook),
            stop: Some(&stop),
            ..Default::default()
        },
    );
    at.into_inner().unwrap().expect("a stashed op was reached")
}

#[test]
fn a_stash_of_another_cow_or_base_is_refused_and_a_torn_one_ignored() {
    let case = no_scratch_case(7300);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.stash");
    let stash = Stash::new(&path);
    let images = stop_after_first_stashed_write(&case, &stash);
    assert!(path.exists(), "the first stashed op was reached");
    let saved = std::fs::read(&path).unwrap();

    // Another COW's merge refuses this stash.
    let other = no_scratch_case(7301);
    let w2 = FaultWorld::new(vec![other.base.clone(), other.cow.clone()]);
    let s2 = other.open_on(&w2, SnapshotConfig::default()).unwrap();
    let e = merge(&s2, opts(&stash)).unwrap_err();
    assert!(matches!(e, SnapError::Stash { .. }), "{e}");
    assert!(e.to_string().contains("another COW"), "{e}");
    assert_eq!(w2.current()[0], other.base);

    // The right COW over a base whose stashed block holds something else: refused.
    let mut wrong = images.clone();
    let rep_world = FaultWorld::new(images.clone());
    let s = case.open_on(&rep_world, SnapshotConfig::default()).unwrap();
    assert!(
        s.attach_stash(&stash).unwrap(),
        "the stashed op is the next to merge"
    );
    assert!(
        read_all(&s) == case.target,
        "reads see the stashed op's new block"
    );
    let n = s.merge_progress().0;
    let blk = case.map().ops()[n].new_block as usize;
    wrong[0][blk * 4096] ^= 0xff;
    let ww = FaultWorld::new(wrong.clone());
    let sw = case.open_on(&ww, SnapshotConfig::default()).unwrap();
    let e = merge(&sw, opts(&stash)).unwrap_err();
    assert!(e.to_string().contains("neither the old nor the new"), "{e}");
    assert_eq!(ww.current()[0], wrong[0], "refused before writing");

    // The right pair finishes from the stash.
    let rep = merge(&s, opts(&stash)).unwrap();
    assert!(rep.resumed_from_stash, "{rep:?}");
    assert_eq!(rep_world.current()[0], case.target);

    // A torn stash counts as empty (it was never synced, so the base was not written for it):
    // a merge that has not started ignores it.
    std::fs::write(&path, &saved[..saved.len() - 100]).unwrap();
    let fresh = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let sf = case.open_on(&fresh, SnapshotConfig::default()).unwrap();
    let rep = merge(&sf, opts(&stash)).unwrap();
    assert!(!rep.resumed_from_stash);
    assert_eq!(fresh.current()[0], case.target);
    let _ = Arc::new(());
}

/// Merge until a stashed op other than the first op of the merge order is written to the base
/// but not committed; returns the disks' contents at that instant and the stash's bytes.
fn stop_inside_a_later_stashed_op(case: &SynthCase, stash: &Stash) -> (Vec<Vec<u8>>, Vec<u8>) {
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let at = std::sync::Mutex::new(None);
    let hook = |st: snapblk_snapshot::MergeStep| {
        let mut at = at.lock().unwrap();
        if let snapblk_snapshot::MergeStep::Written { start, .. } = st
            && at.is_none()
            && start > 0
            && let Ok(b) = std::fs::read(stash.path())
            && b.len() > 32
            && u64::from_le_bytes(b[24..32].try_into().unwrap()) == start as u64
        {
            *at = Some((world.current(), b));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let _ = merge(
        &s,
        MergeOptions {
            stash: Some(stash),
            hook: Some(&hook),
            stop: Some(&stop),
            ..Default::default()
        },
    );
    at.into_inner()
        .unwrap()
        .expect("a later stashed op was reached")
}

#[test]
fn a_lost_stash_is_refused_and_its_block_is_not_served_unchecked() {
    let case = no_scratch_case(7400);
    let dir = tempfile::tempdir().unwrap();
    let stash = Stash::new(&dir.path().join("m.stash"));
    let (images, saved) = stop_inside_a_later_stashed_op(&case, &stash);
    let world = FaultWorld::new(images.clone());
    let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
    assert!(s.merge_progress().0 > 0);
    // A reader without the stash gets an error for the in-flight block, never wrong bytes.
    let mut all = vec![0u8; s.capacity() as usize];
    let e = s.read(0, &mut all).unwrap_err();
    assert!(matches!(e, SnapError::InFlight), "{e}");
    // The merge refuses to go on without it, and writes nothing.
    std::fs::remove_file(stash.path()).unwrap();
    let e = merge(&s, opts(&stash)).unwrap_err();
    assert!(
        e.to_string()
            .contains("does not exist, but the merge stopped"),
        "{e}"
    );
    assert_eq!(world.current()[0], images[0]);
    // With the stash back it finishes.
    std::fs::write(stash.path(), &saved).unwrap();
    let rep = merge(&s, opts(&stash)).unwrap();
    assert!(rep.resumed_from_stash);
    assert_eq!(world.current()[0], case.target);
}

#[test]
fn a_torn_block_write_resumes_from_the_stash() {
    let case = no_scratch_case(7500);
    let dir = tempfile::tempdir().unwrap();
    let stash = Stash::new(&dir.path().join("m.stash"));
    let (mut images, saved) = stop_inside_a_later_stashed_op(&case, &stash);
    // The destination block half written: its first sectors new, the rest old.
    let blk = u64::from_le_bytes(saved[32..40].try_into().unwrap()) as usize;
    let old = &saved[40..40 + 4096];
    images[0][blk * 4096 + 2048..blk * 4096 + 4096].copy_from_slice(&old[2048..]);
    let world = FaultWorld::new(images);
    let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
    let rep = merge(&s, opts(&stash)).unwrap();
    assert!(rep.resumed_from_stash);
    assert_eq!(world.current()[0], case.target);
}

#[test]
fn a_stash_must_be_a_stash_on_a_file_system_that_survives_a_crash() {
    let case = no_scratch_case(7600);
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = case.open_on(&world, SnapshotConfig::default()).unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let e = merge(&s, opts(&Stash::new(&shm.path().join("m.stash")))).unwrap_err();
    assert!(e.to_string().contains("tmpfs or ramfs"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let not = dir.path().join("notes.txt");
    std::fs::write(&not, b"my notes").unwrap();
    let e = merge(&s, opts(&Stash::new(&not))).unwrap_err();
    assert!(e.to_string().contains("not a merge stash"), "{e}");
    assert_eq!(std::fs::read(&not).unwrap(), b"my notes");
    let e = merge(&s, opts(&Stash::new(dir.path()))).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert_eq!(world.current()[0], case.base, "nothing written");
}
