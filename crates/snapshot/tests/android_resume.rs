//! Resume of a merge AOSP's snapuserd left in the middle of a window. The crashed states are built
//! from the specification alone (tests/support/android_crash.rs), for golden COWs made by AOSP's
//! writer (merge order as AOSP's GetMergeOpIter yields it, from the case README) and for a
//! generated COW with three windows. For each state: reads through the snapshot equal target.img
//! before resuming, `merge` resumes to target.img, the COW ends as AOSP leaves a finished merge
//! (num_merge_ops = merge order length, state byte 1), and a second open is fully merged.

#[path = "support/android_crash.rs"]
mod android_crash;

use android_crash::{
    Crashed, Input, Kill, assert_merged, crash, crashes, for_each_golden_input,
    redone_from_scratch, windows,
};
use snapblk_snapshot::{
    MergeOptions, MergeStep, OpenMode, Snapshot, SnapshotConfig, merge, open_files,
};
use std::path::{Path, PathBuf};

const RW: OpenMode = OpenMode {
    base_writable: true,
    cow_writable: true,
};

/// Write `base` and `cow` as `dir`/base.img and `dir`/snapshot.cow; returns the two paths.
fn write_files(dir: &Path, base: &[u8], cow: &[u8]) -> (PathBuf, PathBuf) {
    let (bp, cp) = (dir.join("base.img"), dir.join("snapshot.cow"));
    std::fs::write(&bp, base).unwrap();
    std::fs::write(&cp, cow).unwrap();
    (bp, cp)
}

fn read_all(s: &Snapshot, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // Big reads, then single blocks at an odd offset (the one-segment fast path).
    for (i, c) in v.chunks_mut(96 << 10).enumerate() {
        s.read((i * (96 << 10)) as u64, c).unwrap();
    }
    let mut one = vec![0u8; 4096];
    for b in (0..len / 4096).step_by(3) {
        s.read((b * 4096) as u64, &mut one).unwrap();
        assert!(
            one == v[b * 4096..(b + 1) * 4096],
            "block {b}: block read != big read"
        );
    }
    v
}

/// Write the crashed files, check reads, resume, check the result.
fn resume(name: &str, inp: &Input, c: &Crashed, kill: Kill, dir: &Path) {
    let what = format!("{name} window {:?} {kill:?}", c.window);
    let (base, cow) = write_files(dir, &c.base, &c.cow);
    let total = inp.merge_order.len();
    {
        let s = open_files(&base, &cow, SnapshotConfig::default(), OpenMode::default())
            .unwrap_or_else(|e| panic!("{what}: open: {e}"));
        assert_eq!(
            s.merge_progress(),
            (c.num_merge_ops as usize, total),
            "{what}"
        );
        assert!(
            read_all(&s, inp.target.len()) == inp.target,
            "{what}: reads before resuming"
        );
    }
    let s = open_files(&base, &cow, SnapshotConfig::default(), RW).unwrap();
    let rep = merge(&s, MergeOptions::default()).unwrap_or_else(|e| panic!("{what}: merge: {e}"));
    assert_eq!(rep.resumed_at, c.num_merge_ops as usize, "{what}");
    assert_eq!(
        rep.resumed_from_scratch,
        redone_from_scratch(c, kill),
        "{what}"
    );
    assert!(
        read_all(&s, inp.target.len()) == inp.target,
        "{what}: reads after merge"
    );
    drop(s);
    assert_merged(inp, c, &base, &cow, &what);
    let s = open_files(&base, &cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
    assert_eq!(s.merge_progress(), (total, total), "{what}");
}

#[test]
fn resumes_golden_cows_killed_mid_window() {
    let mut checked = 0;
    for_each_golden_input(|name, inp| {
        for (kill, c) in crashes(inp) {
            // The crashed base really is partial: neither the old nor the new image.
            if kill == Kill::MidWrite {
                assert!(
                    c.base != inp.base && c.base != inp.target,
                    "{name}: partial base"
                );
            }
            let dir = tempfile::tempdir().unwrap();
            resume(name, inp, &c, kill, dir.path());
            checked += 1;
        }
    });
    // 2 scratch cases x 3 kills + the no-scratch case x 2 (mid-write is unrecoverable there).
    assert_eq!(checked, 8);
}

/// A v3 COW with 1200 ordered ops in three windows of 510, 510 and 180: a shift-up chain (new
/// b+1 <- b, highest first), a 510-block extent moved by 600 blocks (a window no op of which writes
/// a block another reads: self-safe) and a shift-down chain (new b <- b+1, ascending); one chain op
/// in 7 is an XOR. Then REPLACE and ZERO ops. The expected image is computed op by op here,
/// independently of the engine.
fn generated() -> Generated {
    const BLOCKS: u64 = 2400;
    let bs = 4096usize;
    let mut rng = snapblk_core::rng::Rng::new(42);
    let mut base = vec![0u8; BLOCKS as usize * bs];
    rng.fill(&mut base);
    let mut img = base.clone();
    let sink = snapblk_cow::MemFile::new(Vec::new());
    let opts = snapblk_cow::WriterOptions {
        op_count_max: BLOCKS + 16,
        ..Default::default()
    };
    let mut w = snapblk_cow::CowWriter::new(&sink, opts).unwrap();
    // (new block, source block) in merge order; each op reads a block no earlier op wrote.
    let mut ordered: Vec<(u64, u64)> = (0..510).rev().map(|b| (b + 1, b)).collect();
    ordered.extend((0..510).map(|i| (600 + i, 1200 + i)));
    ordered.extend((1800..1980).map(|b| (b, b + 1)));
    let seq: Vec<u32> = ordered.iter().map(|&(nb, _)| nb as u32).collect();
    w.add_sequence_data(&seq).unwrap();
    for &(nb, src) in &ordered {
        let (s, d) = (src as usize * bs, nb as usize * bs);
        let old = img[s..s + bs].to_vec();
        if nb % 7 == 3 {
            let mut payload = vec![0u8; bs];
            rng.fill(&mut payload[..512]);
            w.add_xor_blocks(nb, &payload, src, 0).unwrap();
            let new: Vec<u8> = old.iter().zip(&payload).map(|(a, p)| a ^ p).collect();
            img[d..d + bs].copy_from_slice(&new);
        } else {
            w.add_copy(nb, src, 1).unwrap();
            img[d..d + bs].copy_from_slice(&old);
        }
    }
    let mut order: Vec<u64> = ordered.iter().map(|&(nb, _)| nb).collect();
    for nb in 2100..2110u64 {
        let mut data = vec![0u8; bs];
        rng.fill(&mut data);
        w.add_raw_blocks(nb, &data).unwrap();
        img[nb as usize * bs..(nb as usize + 1) * bs].copy_from_slice(&data);
        order.push(nb);
    }
    w.add_zero_blocks(2150, 2).unwrap();
    img[2150 * bs..2152 * bs].fill(0);
    order.extend([2150, 2151]);
    w.finalize().unwrap();
    Generated {
        cow: sink.into_inner(),
        base,
        target: img,
        order,
        ordered: 1200,
    }
}

/// The files and merge order [`generated`] builds.
struct Generated {
    cow: Vec<u8>,
    base: Vec<u8>,
    target: Vec<u8>,
    order: Vec<u64>,
    ordered: usize,
}

impl Generated {
    fn input(&self) -> Input<'_> {
        Input {
            cow: &self.cow,
            base: &self.base,
            target: &self.target,
            merge_order: &self.order,
            ordered: self.ordered,
        }
    }
}

#[test]
fn resumes_a_three_window_cow_killed_in_each_window() {
    let g = generated();
    let (inp, target) = (g.input(), &g.target);
    assert_eq!(windows(&inp), vec![(0, 510), (510, 1020), (1020, 1200)]);
    // The generated file is a sound test: a clean merge gives the independently computed image.
    {
        let dir = tempfile::tempdir().unwrap();
        let c = crash(&inp, 0, Kill::AfterStaging).unwrap();
        let mut fresh = c.cow.clone();
        let h = u16::from_le_bytes([fresh[12], fresh[13]]) as usize;
        fresh[h] = 0;
        let (bp, cp) = write_files(dir.path(), &g.base, &fresh);
        let s = open_files(&bp, &cp, SnapshotConfig::default(), RW).unwrap();
        assert!(read_all(&s, target.len()) == *target, "fresh reads");
        merge(&s, MergeOptions::default()).unwrap();
        assert!(std::fs::read(&bp).unwrap() == *target);
    }
    // Every window has scratch, so every kill leaves a state: 3 windows x 3 kills.
    let states: Vec<_> = crashes(&inp).collect();
    assert_eq!(states.len(), 9);
    for (kill, c) in states {
        let dir = tempfile::tempdir().unwrap();
        resume("generated", &inp, &c, kill, dir.path());
    }
}

/// State (c) in window 0, then a crash right after the merge staged window 1, which is self-safe
/// (our engine leaves the state byte alone for such windows and writes only their entries). The
/// "done" byte (c) left must not survive into that state, or a restart would take window 1's
/// entries for a staged window and serve window 0's stale scratch data for it.
#[test]
fn a_committed_done_byte_is_cleared_before_a_self_safe_window() {
    let g = generated();
    let (inp, target) = (g.input(), &g.target);
    let c = crash(&inp, 0, Kill::AfterCounter).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (bp, cp) = write_files(dir.path(), &c.base, &c.cow);
    let s = open_files(&bp, &cp, SnapshotConfig::default(), RW).unwrap();
    let cut = std::sync::Mutex::new(None);
    let hook = |st: MergeStep| {
        if st
            == (MergeStep::Staged {
                start: 510,
                end: 1020,
            })
        {
            let files = (std::fs::read(&bp).unwrap(), std::fs::read(&cp).unwrap());
            *cut.lock().unwrap() = Some(files);
        }
    };
    let rep = merge(
        &s,
        MergeOptions {
            hook: Some(&hook),
            ..MergeOptions::default()
        },
    )
    .unwrap();
    assert!(rep.self_safe_windows >= 1, "window 1 is self-safe: {rep:?}");
    let (b2, c2) = cut.into_inner().unwrap().expect("window 1 was staged");
    let h = u16::from_le_bytes([c2[12], c2[13]]) as usize;
    assert_eq!(c2[h], 1, "state byte when window 1 is staged");
    let d2 = tempfile::tempdir().unwrap();
    let (bp2, cp2) = write_files(d2.path(), &b2, &c2);
    let s = open_files(&bp2, &cp2, SnapshotConfig::default(), RW).unwrap();
    assert!(
        read_all(&s, target.len()) == *target,
        "reads after the second crash"
    );
    merge(&s, MergeOptions::default()).unwrap();
    assert!(std::fs::read(&bp2).unwrap() == *target);
}
