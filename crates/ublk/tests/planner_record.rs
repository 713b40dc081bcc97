//! The zero-copy planner of a snapshot with a COW record: a block the record has a digest for is
//! left to the device until it has passed the check, and is planned straight from the files
//! once it has, whichever open of the snapshot (the served device's, the planner's) checked it.
//! A block that fails the check fails on every path, every time.

use snapblk_core::QueueExt;
use snapblk_cow::record::{Record, sidecar_path};
use snapblk_ublk::{ReadPlanner, Segment, planner_for};
use std::path::{Path, PathBuf};

/// An uncompressed v3 case: every block the COW writes is a COW file segment once verified.
fn case() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow/v3_basic_none")
}

/// A scratch directory holding a copy of the case's base and COW with its record beside it.
struct Files {
    dir: PathBuf,
    base: PathBuf,
    cow: PathBuf,
    target: Vec<u8>,
    record: Record,
}

impl Files {
    fn new(name: &str) -> Files {
        let c = case();
        let dir = std::env::temp_dir().join(format!(
            "snapblk-ublk-plan-rec-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (base, cow) = (dir.join("base.img"), dir.join("snapshot.cow"));
        std::fs::copy(c.join("base.img"), &base).unwrap();
        std::fs::copy(c.join("snapshot.cow"), &cow).unwrap();
        let target = std::fs::read(c.join("target.img")).unwrap();
        let old = std::fs::read(&base).unwrap();
        let bytes = std::fs::read(&cow).unwrap();
        let reader = snapblk_cow::CowReader::open(bytes.as_slice()).unwrap();
        let record = Record::build(&reader, &old, &target);
        std::fs::write(sidecar_path(&cow), record.encode()).unwrap();
        Files {
            dir,
            base,
            cow,
            target,
            record,
        }
    }

    /// The snapshot device as `serve --ublk` opens it for a read-only export, and its planner.
    fn open(&self) -> (snapblk_core::Blkio, std::sync::Arc<dyn ReadPlanner>) {
        let spec = format!(
            "snapshot:base={},cow={},read-only=true",
            self.base.display(),
            self.cow.display()
        );
        let dev = snapblk::open(&spec, 1).expect("open snapshot device");
        let p = planner_for(&dev).expect("a read-only snapshot has a planner");
        (dev, p)
    }

    /// Target blocks the record has a digest for.
    fn written(&self) -> Vec<u64> {
        snapblk_cow::record::blocks(&self.record.write).collect()
    }

    fn bs(&self) -> u64 {
        u64::from(self.record.block_size)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn plan(p: &dyn ReadPlanner, off: u64, len: u64) -> Vec<Segment> {
    let mut out = Vec::new();
    p.plan(off, len as u32, &mut out).expect("plan");
    out
}

fn is_device(plan: &[Segment]) -> bool {
    plan.iter().any(|s| matches!(s, Segment::Device { .. }))
}

#[test]
fn a_block_verified_by_a_device_read_is_planned_from_the_files() {
    let f = Files::new("verified");
    let (mut dev, p) = f.open();
    let bs = f.bs();
    let written = f.written();
    assert!(written.len() >= 4, "the case writes blocks: {written:?}");
    for &b in &written {
        assert!(
            is_device(&plan(&*p, b * bs, bs)),
            "block {b}: unchecked, so left to the device"
        );
    }
    // One read through the served device checks every block of the range...
    let mut buf = vec![0u8; f.target.len()];
    dev.queue(0, false)
        .unwrap()
        .read_at(0, &mut buf)
        .expect("device read");
    assert!(buf == f.target, "the device reads the target");
    // ...and the planner then reads them straight from the files.
    let mut cow_segments = 0;
    for &b in &written {
        let pl = plan(&*p, b * bs, bs);
        assert!(!is_device(&pl), "block {b}: verified, so planned: {pl:?}");
        cow_segments += pl
            .iter()
            .filter(|s| matches!(s, Segment::File { file: 1, .. }))
            .count();
    }
    assert!(
        cow_segments > 0,
        "verified COW data is read from the COW file"
    );
    let whole = plan(&*p, 0, f.target.len() as u64);
    assert!(!is_device(&whole), "the whole device is planned: {whole:?}");
}

#[test]
fn a_block_failing_verification_fails_on_both_paths() {
    let f = Files::new("corrupt");
    let bs = f.bs();
    // Where the COW holds block `b`'s data, from a planner that does not verify.
    let unchecked =
        snapblk_ublk::SnapshotPlanner::open_with(&f.base, &f.cow, false, None).expect("planner");
    let b = f.written()[1];
    let Some(Segment::File {
        file: 1, offset, ..
    }) = plan(&unchecked, b * bs, bs).first().copied()
    else {
        panic!("block {b} is COW data");
    };
    drop(unchecked);
    // Flip one byte of that data (the COW's header and ops are untouched: it still opens).
    let mut cow = std::fs::read(&f.cow).unwrap();
    cow[offset as usize + 7] ^= 0x5a;
    std::fs::write(&f.cow, &cow).unwrap();
    let (mut dev, p) = f.open();
    for _ in 0..2 {
        let mut buf = vec![0u8; bs as usize];
        assert!(
            dev.queue(0, false)
                .unwrap()
                .read_at(b * bs, &mut buf)
                .is_err(),
            "block {b}: the device fails the read"
        );
        assert_eq!(
            plan(&*p, b * bs, bs),
            vec![Segment::Device {
                offset: b * bs,
                len: bs as u32
            }],
            "block {b}: still unchecked, left to the device (which fails it)"
        );
    }
    // The other blocks still read and are then planned.
    let other = f.written()[0];
    let mut buf = vec![0u8; bs as usize];
    dev.queue(0, false)
        .unwrap()
        .read_at(other * bs, &mut buf)
        .expect("an intact block reads");
    assert!(!is_device(&plan(&*p, other * bs, bs)));
}
