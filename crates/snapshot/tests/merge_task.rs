//! The driver's `merge` property: the COW is merged into the base on a background thread while
//! the device serves reads, as snapuserd does after the first boot of an update. Reads stay the
//! new image before, during and after; closing the device stops the merge at a durable step and
//! a later open resumes it; combinations that cannot work are refused at connect.

use snapblk_core::{Driver, PropValue, QueueExt, State};
use snapblk_snapshot::synth::{SynthSpec, generate};
use snapblk_snapshot::{MergeState, SnapshotDriver};
use snapblk_testsupport::golden;
use std::path::{Path, PathBuf};
use std::time::Duration;

struct Files {
    _dir: tempfile::TempDir,
    base: PathBuf,
    cow: PathBuf,
    target: Vec<u8>,
}

/// A generated case with many scratch windows (chains that move by one block, so every window
/// reads what its predecessor wrote).
fn files(blocks: u64) -> Files {
    let spec = SynthSpec {
        blocks,
        scratch_size: 2 << 20,
        chain_len: blocks / 8,
        chains: 4,
        random_ordered: blocks / 4,
        replaces: blocks / 8,
        zeros: 16,
        ..SynthSpec::default()
    };
    let case = generate(&spec, 11);
    let dir = tempfile::tempdir().unwrap();
    let (base, cow) = case.write_files(dir.path(), Default::default()).unwrap();
    Files {
        _dir: dir,
        base,
        cow,
        target: case.target,
    }
}

fn driver(base: &Path, cow: &Path, props: &[(&str, PropValue)]) -> SnapshotDriver {
    let mut d = SnapshotDriver::new();
    let s = |p: &Path| PropValue::Str(p.display().to_string());
    d.set_prop("base", s(base), State::Created).unwrap();
    d.set_prop("cow", s(cow), State::Created).unwrap();
    for (k, v) in props {
        d.set_prop(k, v.clone(), State::Created).unwrap();
    }
    d
}

fn merging(f: &Files) -> SnapshotDriver {
    driver(&f.base, &f.cow, &[("merge", PropValue::Bool(true))])
}

fn num_merge_ops(cow: &Path) -> u64 {
    let c = std::fs::read(cow).unwrap();
    u64::from_le_bytes(c[26..34].try_into().unwrap())
}

#[test]
fn reads_stay_the_new_image_while_the_device_merges_itself() {
    let f = files(4096);
    let mut d = merging(&f);
    let info = d.connect(false).unwrap();
    assert!(info.read_only, "a merging device serves read-only");
    let mut q = d.create_queue(false).unwrap();
    let act = d.activity();
    // Whole-device passes in 64 KiB reads until the merge is done, then one more.
    let mut passes = 0;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let running = act.merge().stats().state == MergeState::Running;
        for (i, want) in f.target.chunks(buf.len()).enumerate() {
            q.read_at((i * buf.len()) as u64, &mut buf[..want.len()])
                .unwrap();
            assert!(
                buf[..want.len()] == *want,
                "pass {passes}: read at {} differs (merge running: {running})",
                i * buf.len()
            );
        }
        passes += 1;
        if !running {
            break;
        }
    }
    let st = act.merge().wait(Duration::from_secs(120));
    assert_eq!(st.state, MergeState::Done, "{st:?}");
    assert_eq!((st.merged, st.resumed_at), (st.total, 0));
    assert!(st.report.is_some() && st.error.is_none());
    let PropValue::Str(j) = d.get_prop("merge-stats", State::Started).unwrap() else {
        panic!()
    };
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["state"], "done");
    assert_eq!(v["merged"], st.total);
    drop(q);
    drop(d);
    assert!(std::fs::read(&f.base).unwrap() == f.target, "merged base");
    assert_eq!(num_merge_ops(&f.cow), st.total);
    eprintln!("{passes} read passes during the merge");
}

#[test]
fn closing_stops_the_merge_durably_and_the_next_open_resumes() {
    let f = files(16384);
    let mut d = merging(&f);
    d.connect(false).unwrap();
    let act = d.activity();
    // Close as soon as the first window is durable: the merge stops at its next step.
    while act.merge().stats().merged == 0 {
        assert_eq!(act.merge().stats().state, MergeState::Running);
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(d);
    let st = act.merge().stats();
    assert_eq!(st.state, MergeState::Stopped, "{st:?}");
    assert!(st.merged > 0 && st.merged < st.total, "{st:?}");
    assert_eq!(num_merge_ops(&f.cow), st.merged, "progress on disk");

    // Reopened read-only (no merge): still the new image, half merged.
    let mut r = driver(&f.base, &f.cow, &[]);
    r.connect(false).unwrap();
    let mut q = r.create_queue(false).unwrap();
    let mut all = vec![0u8; f.target.len()];
    q.read_at(0, &mut all).unwrap();
    assert!(all == f.target, "reads of a stopped merge");
    drop(q);
    drop(r);

    let mut d = merging(&f);
    d.connect(false).unwrap();
    let st2 = d.activity().merge().wait(Duration::from_secs(300));
    assert_eq!(st2.state, MergeState::Done, "{st2:?}");
    assert_eq!(st2.resumed_at, st.merged);
    drop(d);
    assert!(std::fs::read(&f.base).unwrap() == f.target, "resumed merge");
}

#[test]
fn a_paused_merge_writes_nothing_and_resumes_where_it_paused() {
    let f = files(16384);
    let mut d = driver(
        &f.base,
        &f.cow,
        &[
            ("merge", PropValue::Bool(true)),
            ("merge-held", PropValue::Bool(true)),
        ],
    );
    d.connect(false).unwrap();
    let act = d.activity();
    let m = act.merge();
    // Held at open: nothing written, and only merge-start releases it.
    let st = m.stats();
    assert_eq!(
        (st.state, st.started, st.merged),
        (MergeState::Paused, false, 0)
    );
    assert!(m.resume().is_err(), "resume before start");
    let base0 = std::fs::read(&f.base).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        std::fs::read(&f.base).unwrap() == base0,
        "base written while held"
    );
    assert_eq!(num_merge_ops(&f.cow), 0);
    m.start_merge().unwrap();
    assert!(m.start_merge().is_err(), "started twice");
    while m.stats().merged == 0 {
        assert_eq!(m.stats().state, MergeState::Running);
        std::thread::sleep(Duration::from_millis(1));
    }
    let p = m.pause(Duration::from_secs(120)).unwrap();
    assert_eq!(p.state, MergeState::Paused, "{p:?}");
    assert!(p.merged > 0 && p.merged < p.total, "{p:?}");
    // Durable at the pause, and nothing moves while paused.
    assert_eq!(num_merge_ops(&f.cow), p.merged, "progress on disk");
    let (base1, cow1) = (
        std::fs::read(&f.base).unwrap(),
        std::fs::read(&f.cow).unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        std::fs::read(&f.base).unwrap() == base1,
        "base written while paused"
    );
    assert!(
        std::fs::read(&f.cow).unwrap() == cow1,
        "COW written while paused"
    );
    assert_eq!(m.stats().merged, p.merged);
    // Reads stay the new image while paused.
    let mut q = d.create_queue(false).unwrap();
    let mut all = vec![0u8; f.target.len()];
    q.read_at(0, &mut all).unwrap();
    assert!(all == f.target, "reads of a paused merge");
    assert_eq!(
        m.pause(Duration::from_secs(1)).unwrap().state,
        MergeState::Paused
    );
    m.resume().unwrap();
    let st = m.wait(Duration::from_secs(300));
    assert_eq!(st.state, MergeState::Done, "{st:?}");
    assert_eq!(st.merged, st.total);
    let report = st.report.unwrap();
    assert_eq!(
        report.resumed_at as u64, p.merged,
        "the engine resumed at the pause"
    );
    assert!(m.pause(Duration::from_secs(1)).is_err(), "pause after done");
    drop(q);
    drop(d);
    assert!(std::fs::read(&f.base).unwrap() == f.target, "merged base");
}

#[test]
fn closing_a_paused_merge_stops_it_there() {
    let f = files(8192);
    let mut d = driver(
        &f.base,
        &f.cow,
        &[
            ("merge", PropValue::Bool(true)),
            ("merge-held", PropValue::Bool(true)),
        ],
    );
    d.connect(false).unwrap();
    let act = d.activity();
    drop(d);
    let st = act.merge().stats();
    assert_eq!(st.state, MergeState::Stopped, "{st:?}");
    assert_eq!(num_merge_ops(&f.cow), 0);
}

#[test]
fn merge_is_refused_where_it_cannot_work() {
    let f = files(256);
    let (base0, cow0) = (
        std::fs::read(&f.base).unwrap(),
        std::fs::read(&f.cow).unwrap(),
    );
    // With client writes (the overlay would outlive the merge's fold).
    let mut d = driver(
        &f.base,
        &f.cow,
        &[
            ("merge", PropValue::Bool(true)),
            ("writable", PropValue::Bool(true)),
        ],
    );
    let e = d.connect(false).unwrap_err();
    assert_eq!(e.errno, libc::EINVAL);
    assert!(e.to_string().contains("merge and writable"), "{e}");
    // Under another open of the same files.
    let mut reader = driver(&f.base, &f.cow, &[]);
    reader.connect(false).unwrap();
    let e = merging(&f).connect(false).unwrap_err();
    assert_eq!(e.errno, libc::EBUSY, "{e}");
    drop(reader);
    // A merge order an in-place merge cannot follow: refused at connect.
    let case = golden::case(golden::INVALID_MERGE_ORDER);
    let dir = tempfile::tempdir().unwrap();
    let (b, c) = case.copy_inputs(dir.path());
    let b0 = std::fs::read(&b).unwrap();
    let e = driver(&b, &c, &[("merge", PropValue::Bool(true))])
        .connect(false)
        .unwrap_err();
    assert!(e.to_string().contains("merge refused"), "{e}");
    assert!(
        std::fs::read(&b).unwrap() == b0,
        "refused merge wrote the base"
    );
    // Nothing was written by the refusals.
    assert!(std::fs::read(&f.base).unwrap() == base0);
    assert!(std::fs::read(&f.cow).unwrap() == cow0);
    // And a read-only connect still merges (read-only is about clients).
    let mut d = merging(&f);
    d.connect(true).unwrap();
    assert_eq!(
        d.activity().merge().wait(Duration::from_secs(60)).state,
        MergeState::Done
    );
    drop(d);
    assert!(std::fs::read(&f.base).unwrap() == f.target);
}
