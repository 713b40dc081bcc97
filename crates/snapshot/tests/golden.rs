//! The AOSP golden COW vectors (tests/data/aosp-cow): reads through the snapshot device equal
//! target.img (full, unaligned, random), merging turns a copy of base.img into target.img with
//! correct reads at every step, and the merge state left in the COW matches what AOSP's
//! snapuserd left (num_merge_ops, scratch state byte, scratch metadata entries).

use snapblk_core::rng::Rng;
use snapblk_snapshot::{
    MergeOptions, MergeStep, OpenMode, SnapError, Snapshot, SnapshotConfig, merge, open_files,
};
use snapblk_testsupport::golden::{self, Case};
use std::path::PathBuf;

struct Work {
    _dir: tempfile::TempDir,
    base: PathBuf,
    cow: PathBuf,
    target: Vec<u8>,
}

fn copy_case(case: &Case) -> Work {
    let dir = tempfile::tempdir().unwrap();
    let (base, cow) = case.copy_inputs(dir.path());
    let target = case.read("target.img");
    Work {
        _dir: dir,
        base,
        cow,
        target,
    }
}

fn open_rw(w: &Work) -> Snapshot {
    let mode = OpenMode {
        base_writable: true,
        cow_writable: true,
    };
    open_files(&w.base, &w.cow, SnapshotConfig::default(), mode).unwrap()
}

fn open_ro(w: &Work, cfg: SnapshotConfig) -> Snapshot {
    open_files(&w.base, &w.cow, cfg, OpenMode::default()).unwrap()
}

/// Full, unaligned (sector 11, 5000 bytes as in the AOSP harness) and random reads.
fn check_reads(s: &Snapshot, target: &[u8], what: &str, seed: u64) {
    let mut all = vec![0u8; target.len()];
    s.read(0, &mut all).unwrap();
    assert!(
        all == target,
        "{what}: full read differs at block {:?}",
        all.chunks(4096)
            .zip(target.chunks(4096))
            .position(|(a, b)| a != b)
    );
    let mut b = vec![0u8; 5000];
    s.read(11 * 512, &mut b).unwrap();
    assert_eq!(&b[..], &target[5632..10632], "{what}: unaligned read");
    let mut rng = Rng::new(seed);
    for _ in 0..200 {
        let off = rng.below(target.len() as u64);
        let len = 1 + rng.below((target.len() as u64 - off).min(20000)) as usize;
        let mut b = vec![0u8; len];
        s.read(off, &mut b).unwrap();
        assert!(
            b[..] == target[off as usize..off as usize + len],
            "{what}: random read {off}+{len}"
        );
    }
}

#[test]
fn reads_match_target_for_every_case() {
    for case in golden::cases() {
        let w = copy_case(&case);
        let s = open_ro(&w, SnapshotConfig::default());
        check_reads(&s, &w.target, &case.name, 1);
        // A tiny cache must give the same answers (eviction path).
        let cfg = SnapshotConfig {
            cache_bytes: 4096,
            ..Default::default()
        };
        let s = open_ro(&w, cfg);
        check_reads(&s, &w.target, &case.name, 2);
    }
}

/// Expected post-merge state from the case README (AOSP snapuserd harness, first run).
struct AospState {
    num_merge_ops: u64,
    state: Option<(u64, u8)>,
    entries: Vec<(u64, u64, u64)>,
}

fn aosp_state(readme: &str) -> Option<AospState> {
    let block = readme.split("snapuserd merge harness").nth(1)?;
    let num = |s: &str| s.trim().parse::<u64>().ok();
    let mut st = AospState {
        num_merge_ops: 0,
        state: None,
        entries: Vec::new(),
    };
    let mut found = false;
    for line in block.lines() {
        let l = line.trim();
        if let Some(r) = l.strip_prefix("COW header after merge: num_merge_ops=") {
            st.num_merge_ops = num(r.split_whitespace().next()?)?;
            found = true;
        } else if let Some(r) = l.strip_prefix("scratch: read_ahead_state byte @") {
            let (off, v) = r.split_once(" = ")?;
            st.state = Some((num(off)?, num(v)? as u8));
        } else if let Some(r) = l.strip_prefix("scratch metadata[") {
            let (_, r) = r.split_once("] @")?;
            let (off, r) = r.split_once(": new_block=")?;
            let (nb, fo) = r.split_once(" file_offset=")?;
            st.entries.push((num(off)?, num(nb)?, num(fo)?));
        }
    }
    found.then_some(st)
}

#[test]
fn merge_every_valid_case_and_match_aosp_state() {
    let mut compared_entries = 0;
    for case in golden::cases() {
        if case.invalid_merge_order() {
            continue;
        }
        let name = &case.name;
        let w = copy_case(&case);
        let s = open_rw(&w);
        let total = s.merge_progress().1;
        let steps = std::sync::atomic::AtomicUsize::new(0);
        let hook = |st: MergeStep| {
            check_reads(&s, &w.target, &format!("{name} during merge at {st:?}"), 3);
            steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        // Small windows so cases with several ordered ops go through several windows.
        let rep = merge(
            &s,
            MergeOptions {
                hook: Some(&hook),
                max_window: Some(3),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(steps.into_inner() > 0, "{name}: hook ran");
        assert_eq!(rep.total_ops, total);
        check_reads(&s, &w.target, &format!("{name} after merge"), 4);
        assert!(
            std::fs::read(&w.base).unwrap() == w.target,
            "{name}: merged base != target.img"
        );
        // Reopen (after closing: a merge holds its files to itself): everything merged, still
        // reads the new image.
        drop(s);
        let s2 = open_rw(&w);
        assert_eq!(s2.merge_progress(), (total, total), "{name}");
        check_reads(&s2, &w.target, &format!("{name} reopened"), 5);
        merge(&s2, MergeOptions::default()).unwrap();
        assert!(
            std::fs::read(&w.base).unwrap() == w.target,
            "{name}: second merge run changed base"
        );

        let cow = std::fs::read(&w.cow).unwrap();
        let got_num = u64::from_le_bytes(cow[26..34].try_into().unwrap());
        let aosp = aosp_state(&case.readme())
            .unwrap_or_else(|| panic!("{name}: README lacks the AOSP merge state"));
        assert_eq!(got_num, aosp.num_merge_ops, "{name}: num_merge_ops vs AOSP");
        if let Some((off, v)) = aosp.state {
            assert_eq!(cow[off as usize], v, "{name}: scratch state byte vs AOSP");
        }
        if !aosp.entries.is_empty() {
            // Same result with Android's window size (one window of up to 510 ops).
            let w2 = copy_case(&case);
            let s3 = open_rw(&w2);
            merge(&s3, MergeOptions::default()).unwrap();
            let cow = std::fs::read(&w2.cow).unwrap();
            for (off, nb, fo) in &aosp.entries {
                let o = *off as usize;
                let e_nb = u64::from_le_bytes(cow[o..o + 8].try_into().unwrap());
                let e_fo = u64::from_le_bytes(cow[o + 8..o + 16].try_into().unwrap());
                assert_eq!(
                    (e_nb, e_fo),
                    (*nb, *fo),
                    "{name}: scratch entry @{off} vs AOSP"
                );
                compared_entries += 1;
            }
            assert!(std::fs::read(&w2.base).unwrap() == w2.target);
        }
    }
    assert!(
        compared_entries >= 8,
        "scratch entries compared with AOSP: {compared_entries}"
    );
}

#[test]
fn invalid_order_is_refused_and_base_untouched() {
    let case = golden::case(golden::INVALID_MERGE_ORDER);
    let w = copy_case(&case);
    let s = open_rw(&w);
    check_reads(&s, &w.target, "invalid-order case", 6);
    let e = merge(&s, MergeOptions::default()).unwrap_err();
    assert!(matches!(e, SnapError::MergeOrder(_)), "{e}");
    assert_eq!(std::fs::read(&w.base).unwrap(), case.read("base.img"));
    let cow = std::fs::read(&w.cow).unwrap();
    assert_eq!(&cow[26..34], &[0u8; 8], "num_merge_ops untouched");
    check_reads(&s, &w.target, "invalid-order case after refusal", 7);
}

#[test]
fn read_only_snapshot_refuses_writes() {
    let w = copy_case(&golden::case("v2_basic_none"));
    let s = open_ro(&w, SnapshotConfig::default());
    assert!(matches!(
        s.write(0, &[1, 2, 3], false),
        Err(SnapError::ReadOnly)
    ));
    assert_eq!(SnapError::ReadOnly.errno(), libc::EROFS);
}
