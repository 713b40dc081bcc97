//! Deterministic, bounded mutation smoke over the fuzz entry points (the same functions the
//! cargo-fuzz targets in crates/snapshot/fuzz call), seeded with journals and merge states made
//! by the real writers, so `cargo test` exercises the parsers of untrusted bytes on every run.

use snapblk_snapshot::fuzzing::{fuzz_merge_state, fuzz_overlay, seeds};

struct Rnd(u64);
impl Rnd {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// 1..=4 mutations: byte sets in the first `hot` bytes, bit flips anywhere, truncation, runs of
/// 0xff / 0x00 (lengths and counts at their extremes).
fn mutate(r: &mut Rnd, b: &mut Vec<u8>, hot: usize) {
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            return;
        }
        let len = b.len();
        match r.below(6) {
            0 | 1 => {
                let at = r.below(len.min(hot));
                b[at] = r.next() as u8;
            }
            2 => {
                let at = r.below(len);
                b[at] ^= 1 << r.below(8);
            }
            3 => b.truncate(r.below(len).max(1)),
            4 => {
                let at = r.below(len.min(hot));
                let end = (at + 8).min(len);
                b[at..end].fill(0xff);
            }
            _ => {
                let at = r.below(len);
                let end = (at + 16).min(len);
                b[at..end].fill(0);
            }
        }
    }
}

#[test]
fn seeds_are_accepted_unmutated() {
    let (overlay, states) = seeds();
    assert!(overlay.len() >= 4 && states.len() >= 4, "seeds were made");
    for s in overlay.iter().chain(&states) {
        assert!(!s.is_empty());
    }
    for s in &overlay {
        fuzz_overlay(s);
    }
    for s in &states {
        fuzz_merge_state(s);
    }
}

#[test]
fn fuzz_smoke_mutated_overlay_journals() {
    let (seeds, _) = seeds();
    let mut r = Rnd(0x9e37_79b9_7f4a_7c15);
    for i in 0..600 {
        let mut b = seeds[i % seeds.len()].clone();
        // Record headers sit every 4 KiB: aim byte mutations at the first header's fields.
        mutate(&mut r, &mut b, 48);
        if i % 3 == 0 {
            b[0] |= 1; // let the harness repair CRCs so the bounds checks behind them are hit
        }
        fuzz_overlay(&b);
    }
}

#[test]
fn fuzz_smoke_mutated_merge_states() {
    let (_, seeds) = seeds();
    let mut r = Rnd(0x2545_f491_4f6c_dd1d);
    for i in 0..1500 {
        let mut b = seeds[i % seeds.len()].clone();
        // Counter, state byte and the first entries.
        mutate(&mut r, &mut b, 80);
        if i % 4 == 0 {
            b[0] |= 1;
        }
        fuzz_merge_state(&b);
    }
}

/// `buffer_size` comes from the COW header. A hostile one (≈ 4 GiB) used to size merge windows
/// (≈ 1 M blocks, staged in memory in one allocation); windows now keep Android's geometry
/// (2 MiB scratch, 510 ops), and a window staged under that geometry loads back after a crash.
#[test]
fn hostile_buffer_size_keeps_android_windows() {
    use snapblk_snapshot::fault::FaultWorld;
    use snapblk_snapshot::synth::{SynthSpec, generate};
    use snapblk_snapshot::{
        CowLayout, MAX_SCRATCH_SIZE, MergeOptions, MergeStep, Scratch, SnapshotConfig,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let hostile = CowLayout {
        block_size: 4096,
        header_size: 78,
        scratch_size: u32::MAX,
        data_end: 0,
    };
    let android = Scratch {
        base: 78,
        meta_len: 8192,
        slots: 510,
        len: MAX_SCRATCH_SIZE,
    };
    assert_eq!(hostile.scratch(), Some(android));

    let mut case = generate(
        &SynthSpec {
            blocks: 4096,
            scratch_size: 2 << 20,
            chain_len: 600,
            chains: 3,
            random_ordered: 600,
            ..SynthSpec::default()
        },
        11,
    );
    let ordered = case.ops.iter().filter(|o| o.is_ordered()).count();
    assert!(ordered > 1020, "{ordered} ordered ops");
    case.layout.scratch_size = 0xffff_f000;
    let open = |w: &Arc<FaultWorld>| case.open_on(w, SnapshotConfig::default());
    // First run: power is cut right after the first window is staged (scratch flushed, state
    // byte 2), before any of its destinations is written.
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = open(&world).unwrap();
    let cut = AtomicBool::new(false);
    let windows = Mutex::new(Vec::new());
    let hook = |step: MergeStep| {
        if let MergeStep::Staged { start, end } = step {
            windows.lock().unwrap().push(end - start);
            if !cut.swap(true, Ordering::SeqCst) {
                world.cut_after(0);
            }
        }
    };
    let opts = MergeOptions {
        hook: Some(&hook),
        ..Default::default()
    };
    assert!(snapblk_snapshot::merge(&s, opts).is_err());
    drop(s);
    // Restart: the staged window loads from scratch and the merge finishes.
    let w2 = FaultWorld::new(world.recover(3));
    let s = open(&w2).unwrap();
    let rep = snapblk_snapshot::merge(&s, opts).unwrap();
    assert!(rep.resumed_from_scratch);
    let windows = windows.into_inner().unwrap();
    assert!(windows.iter().all(|&n| n <= 510), "{windows:?}");
    assert!(windows.contains(&510), "{windows:?}");
    assert!(
        w2.current()[0] == case.target,
        "merged base is the target image"
    );
}
