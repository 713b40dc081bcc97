//! The COW record in the merge engine: a window staged in scratch by an interrupted merge is
//! checked against the record before it is written (its sources may be gone, so the staged copy
//! is all there is), and a resumed merge of an intact staged window still finishes.

use snapblk_cow::record::Record;
use snapblk_snapshot::synth::{SynthCase, SynthSpec, generate};
use snapblk_snapshot::{
    MergeOptions, MergeStep, OpenMode, SnapError, SnapshotConfig, load_verifier, merge, open_files,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

const RW: OpenMode = OpenMode {
    base_writable: true,
    cow_writable: true,
};

/// A COW with a scratch area and long shift chains (windows staged in scratch), its record
/// beside it.
fn files(dir: &Path) -> (PathBuf, PathBuf, SynthCase) {
    let spec = SynthSpec {
        blocks: 1024,
        scratch_size: 2 << 20,
        chain_len: 300,
        chains: 2,
        ..SynthSpec::default()
    };
    let case = generate(&spec, 3);
    let (base, cow) = case.write_files(dir, Default::default()).unwrap();
    let bytes = std::fs::read(&cow).unwrap();
    let r = snapblk_cow::CowReader::open(bytes.as_slice()).unwrap();
    let rec = Record::build(&r, &case.base, &case.target);
    std::fs::write(snapblk_cow::record::sidecar_path(&cow), rec.encode()).unwrap();
    (base, cow, case)
}

/// Open with the record attached and merge.
fn run(base: &Path, cow: &Path) -> Result<(), SnapError> {
    let v = load_verifier(base, cow, None, false)?.expect("a record");
    let s = open_files(base, cow, SnapshotConfig::default(), RW)?;
    s.attach_verifier(v)?;
    merge(&s, MergeOptions::default()).map(|_| ())
}

/// Leave base and COW as an interrupted merge leaves them right after staging its first window
/// in scratch (state byte 2, nothing of the window written): merge, copy both files at that
/// step, and put the copies back afterwards.
fn interrupt_after_staging(base: &Path, cow: &Path) {
    let v = load_verifier(base, cow, None, false)
        .unwrap()
        .expect("a record");
    let s = open_files(base, cow, SnapshotConfig::default(), RW).unwrap();
    s.attach_verifier(v).unwrap();
    let taken = AtomicBool::new(false);
    let (b2, c2) = (base.with_extension("staged"), cow.with_extension("staged"));
    let hook = |step: MergeStep| {
        if matches!(step, MergeStep::Staged { .. }) && !taken.swap(true, Ordering::SeqCst) {
            std::fs::copy(base, &b2).unwrap();
            std::fs::copy(cow, &c2).unwrap();
        }
    };
    let opts = MergeOptions {
        hook: Some(&hook),
        ..Default::default()
    };
    merge(&s, opts).unwrap();
    drop(s);
    assert!(
        taken.load(Ordering::SeqCst),
        "a window went through scratch"
    );
    std::fs::rename(&b2, base).unwrap();
    std::fs::rename(&c2, cow).unwrap();
}

/// (header size, first scratch entry's data offset) of the COW, whose state byte must say a
/// window is staged.
fn staged_slot(cow: &Path) -> u64 {
    let d = std::fs::read(cow).unwrap();
    let r = snapblk_cow::CowReader::open(d.as_slice()).unwrap();
    let hs = r.header().header_size as usize;
    assert_eq!(d[hs], 2, "a window is staged in scratch");
    let e = &d[hs + 1..hs + 17];
    u64::from_le_bytes(e[8..16].try_into().unwrap())
}

#[test]
fn a_corrupt_staged_window_is_refused_before_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (base, cow, _) = files(dir.path());
    interrupt_after_staging(&base, &cow);
    let off = staged_slot(&cow) as usize;
    let mut d = std::fs::read(&cow).unwrap();
    d[off + 10] ^= 0x04;
    std::fs::write(&cow, d).unwrap();
    let before = std::fs::read(&base).unwrap();
    match run(&base, &cow) {
        Err(SnapError::Corrupt { .. }) => {}
        r => panic!("a corrupt staged block must be refused, got {r:?}"),
    }
    assert!(
        std::fs::read(&base).unwrap() == before,
        "nothing may be written"
    );
}

#[test]
fn an_intact_staged_window_is_merged_to_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let (base, cow, case) = files(dir.path());
    interrupt_after_staging(&base, &cow);
    staged_slot(&cow);
    run(&base, &cow).unwrap();
    assert!(
        std::fs::read(&base).unwrap() == case.target,
        "merged base is the target"
    );
}
