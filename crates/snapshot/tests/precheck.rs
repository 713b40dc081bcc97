//! The pre-merge check run by `merge` itself (issue 19, item 4): a merge that could not finish
//! is refused before the first write of the run — also a resumed merge (over the ops it has
//! still to merge) and a merge the driver runs on its own thread (`merge=true`) — and leaves base
//! and COW byte-identical.

use snapblk_core::{Driver, PropValue, State};
use snapblk_snapshot::synth::{SynthCase, SynthSpec, generate};
use snapblk_snapshot::{
    MergeOptions, MergeState, MergeStep, OpKind, OpenMode, Payload, SnapError, SnapshotConfig,
    SnapshotDriver, merge, open_files, precheck,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const RW: OpenMode = OpenMode {
    base_writable: true,
    cow_writable: true,
};

struct Files {
    _dir: tempfile::TempDir,
    base: PathBuf,
    cow: PathBuf,
    case: SynthCase,
}

/// A v3 lz4 COW with a scratch area, ordered windows and several REPLACE batches (256 ops
/// each), as files.
fn lz4_files(seed: u64) -> Files {
    let spec = SynthSpec {
        blocks: 4096,
        scratch_size: 2 << 20,
        chain_len: 200,
        chains: 3,
        random_ordered: 300,
        replaces: 900,
        zeros: 16,
        ..SynthSpec::default()
    };
    let mut case = generate(&spec, seed);
    // Compressible REPLACE data, so lz4 stores it compressed.
    let bs = case.layout.block_size as usize;
    for op in &case.ops {
        if let OpKind::Replace { payload, .. } = op.kind {
            let mut t = Vec::new();
            let mut k = 0;
            while t.len() < bs {
                t.extend_from_slice(
                    format!("block {} line {k} of text\n", op.new_block).as_bytes(),
                );
                k += 1;
            }
            let at = payload.offset as usize;
            case.cow[at..at + bs].copy_from_slice(&t[..bs]);
            let d = op.new_block as usize * bs;
            case.target[d..d + bs].copy_from_slice(&t[..bs]);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let opts = snapblk_cow::WriterOptions {
        codec: snapblk_cow::Codec::new(snapblk_cow::Compression::Lz4),
        ..Default::default()
    };
    let (base, cow) = case.write_files(dir.path(), opts).unwrap();
    Files {
        _dir: dir,
        base,
        cow,
        case,
    }
}

fn bytes(f: &Files) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(&f.base).unwrap(),
        std::fs::read(&f.cow).unwrap(),
    )
}

/// The compressed payloads of the COW's ops, by merge index (from the snapshot's own map).
fn compressed_payloads(base: &Path, cow: &Path) -> Vec<(usize, Payload)> {
    let s = open_files(base, cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
    s.map()
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o.kind {
            OpKind::Replace { payload, .. } | OpKind::Xor { payload, .. }
                if payload.codec != snapblk_snapshot::Codec::None =>
            {
                Some((i, payload))
            }
            _ => None,
        })
        .collect()
}

fn corrupt(cow: &Path, p: &Payload) {
    let mut c = std::fs::read(cow).unwrap();
    c[p.offset as usize..(p.offset + u64::from(p.stored_len)) as usize].fill(0xFF);
    std::fs::write(cow, c).unwrap();
}

#[test]
fn an_undecodable_payload_is_refused_before_the_first_write() {
    let f = lz4_files(3);
    let list = compressed_payloads(&f.base, &f.cow);
    let &(last, p) = list.last().unwrap();
    corrupt(&f.cow, &p);
    let before = bytes(&f);
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let e = precheck(&s, &MergeOptions::default()).unwrap_err();
    assert!(
        matches!(e, SnapError::UndecodablePayload { op, .. } if op == last),
        "{e}"
    );
    let e = merge(&s, MergeOptions::default()).unwrap_err();
    assert!(matches!(e, SnapError::UndecodablePayload { .. }), "{e}");
    // The decoder's words are the source, not repeated in the message.
    assert!(std::error::Error::source(&e).is_some());
    drop(s);
    assert!(
        bytes(&f) == before,
        "base or COW changed by a refused merge"
    );
}

#[test]
fn a_resumed_merge_checks_the_ops_it_has_still_to_merge() {
    let f = lz4_files(5);
    let ordered = {
        let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
        s.map().ordered_len()
    };
    // Stop the merge after its first REPLACE batch is committed.
    let stop = AtomicBool::new(false);
    let hook = |st: MergeStep| {
        if let MergeStep::Committed { merged } = st
            && merged > ordered
        {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let r = merge(
        &s,
        MergeOptions {
            stop: Some(&stop),
            hook: Some(&hook),
            ..Default::default()
        },
    );
    assert!(matches!(r, Err(SnapError::Interrupted)), "{r:?}");
    let merged = s.merge_progress().0;
    drop(s);
    assert!(merged > ordered && merged < f.case.ops.len(), "{merged}");
    let list = compressed_payloads(&f.base, &f.cow);
    // A corrupt payload of an op already merged does not stop the rest: it is never read again.
    let done = list.iter().find(|(i, _)| *i < merged).unwrap().1;
    let todo = list.iter().find(|(i, _)| *i >= merged).unwrap().1;
    let pristine = std::fs::read(&f.cow).unwrap();
    corrupt(&f.cow, &todo);
    let before = bytes(&f);
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let e = merge(&s, MergeOptions::default()).unwrap_err();
    assert!(matches!(e, SnapError::UndecodablePayload { .. }), "{e}");
    drop(s);
    assert!(
        bytes(&f) == before,
        "base or COW changed by a refused resume"
    );
    std::fs::write(&f.cow, pristine).unwrap();
    corrupt(&f.cow, &done);
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let pre = precheck(&s, &MergeOptions::default()).unwrap();
    assert_eq!(pre.from_op, merged);
    let rep = merge(&s, MergeOptions::default()).unwrap();
    assert_eq!(rep.resumed_at, merged);
    drop(s);
    assert!(std::fs::read(&f.base).unwrap() == f.case.target);
}

#[test]
fn a_merge_the_driver_runs_is_refused_before_its_first_write() {
    let f = lz4_files(7);
    let list = compressed_payloads(&f.base, &f.cow);
    corrupt(&f.cow, &list.last().unwrap().1);
    let before = bytes(&f);
    let mut d = SnapshotDriver::new();
    let s = |p: &Path| PropValue::Str(p.display().to_string());
    d.set_prop("base", s(&f.base), State::Created).unwrap();
    d.set_prop("cow", s(&f.cow), State::Created).unwrap();
    d.set_prop("merge", PropValue::Bool(true), State::Created)
        .unwrap();
    d.connect(false).unwrap();
    let st = d.activity().merge().wait(Duration::from_secs(120));
    assert_eq!(st.state, MergeState::Failed, "{st:?}");
    assert!(
        st.error
            .as_deref()
            .unwrap_or("")
            .contains("does not decode"),
        "{st:?}"
    );
    assert_eq!(st.merged, 0);
    drop(d);
    assert!(
        bytes(&f) == before,
        "base or COW changed by a refused merge"
    );
}

#[test]
fn without_scratch_an_xor_reading_its_own_destination_is_refused_up_front() {
    // Unaligned XOR sources in shift chains read their own destination; the chains come after
    // nothing else in the merge order, so the old engine merged windows before it got there.
    for seed in 0..20 {
        let spec = SynthSpec {
            blocks: 512,
            scratch_size: 0,
            chain_len: 40,
            chains: 3,
            random_ordered: 60,
            unaligned_xor: true,
            ..SynthSpec::default()
        };
        let case = generate(&spec, seed);
        let bs = 4096u64;
        let Some(bad) = case.ops.iter().position(|o| match o.kind {
            OpKind::Xor { src_byte, .. } => {
                (src_byte / bs..(src_byte + bs).div_ceil(bs)).contains(&o.new_block)
            }
            _ => false,
        }) else {
            continue;
        };
        if bad == 0 {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let opts = snapblk_cow::WriterOptions {
            scratch_size: 0,
            ..Default::default()
        };
        let (base, cow) = case.write_files(dir.path(), opts).unwrap();
        let before = (std::fs::read(&base).unwrap(), std::fs::read(&cow).unwrap());
        let s = open_files(&base, &cow, SnapshotConfig::default(), RW).unwrap();
        let e = precheck(&s, &MergeOptions::default()).unwrap_err();
        assert!(matches!(e, SnapError::MergeOrder(_)), "{e}");
        assert!(e.to_string().contains("reads its own destination"), "{e}");
        let e = merge(&s, MergeOptions::default()).unwrap_err();
        assert!(matches!(e, SnapError::MergeOrder(_)), "{e}");
        drop(s);
        let after = (std::fs::read(&base).unwrap(), std::fs::read(&cow).unwrap());
        assert!(after == before, "seed {seed}: refused merge wrote");
        return;
    }
    panic!("no seed made an XOR reading its own destination after the first op");
}

#[test]
fn a_good_cow_passes_and_the_report_says_what_was_checked() {
    let f = lz4_files(9);
    let n = compressed_payloads(&f.base, &f.cow).len() as u64;
    let s = open_files(&f.base, &f.cow, SnapshotConfig::default(), RW).unwrap();
    let rep = merge(&s, MergeOptions::default()).unwrap();
    let pre = &rep.precheck;
    assert!(pre.order_valid && pre.scratch);
    assert_eq!(pre.payloads_decoded, n);
    assert_eq!(pre.ops_checked, f.case.ops.len());
    assert_eq!(pre.from_op, 0);
    drop(s);
    assert!(std::fs::read(&f.base).unwrap() == f.case.target);
}
