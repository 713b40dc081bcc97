//! The zero-copy read plans, executed in userspace exactly as the server has the kernel execute
//! them (file segments read from the planner's files, zeros, device segments through the device
//! queue), must give the snapshot's content (`target.img`) for every golden case.

use snapblk_core::QueueExt;
use snapblk_ublk::{FilePlanner, ReadPlanner, Segment, SnapshotPlanner};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/aosp-cow");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("golden data")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("target.img").exists() && !p.to_string_lossy().contains("invalid"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 10,
        "expected the golden cases in {}",
        root.display()
    );
    v
}

/// Execute `plan` for device range `[off, off+len)`.
fn execute(p: &dyn ReadPlanner, dev: &mut snapblk_core::Blkio, off: u64, len: u32) -> Vec<u8> {
    let mut plan = Vec::new();
    p.plan(off, len, &mut plan).expect("plan");
    assert!(
        snapblk_ublk::validate(&plan, len, p.files().len()),
        "plan {plan:?} for {off}+{len}"
    );
    let files: Vec<std::fs::File> = p
        .files()
        .into_iter()
        .map(|fd| {
            // SAFETY: dup of a descriptor the planner keeps open.
            let d = unsafe { libc::dup(fd) };
            assert!(d >= 0);
            // SAFETY: `d` is a fresh descriptor we own.
            unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(d) }
        })
        .collect();
    let mut out = vec![0u8; len as usize];
    let mut pos = 0usize;
    for s in &plan {
        let l = s.len() as usize;
        let dst = &mut out[pos..pos + l];
        match *s {
            Segment::File { file, offset, .. } => files[usize::from(file)]
                .read_exact_at(dst, offset)
                .expect("file read"),
            Segment::Zero { .. } => dst.fill(0),
            Segment::Device { offset, .. } => dev
                .queue(0, false)
                .expect("queue")
                .read_at(offset, dst)
                .expect("device read"),
        }
        pos += l;
    }
    out
}

#[test]
fn snapshot_plans_reproduce_target() {
    for c in cases() {
        let target = std::fs::read(c.join("target.img")).unwrap();
        let (base, cow) = (c.join("base.img"), c.join("snapshot.cow"));
        let p =
            SnapshotPlanner::open(&base, &cow).unwrap_or_else(|e| panic!("{}: {e}", c.display()));
        // A snapshot's base and COW reads must be whole: a short one is EIO, never zeros.
        assert!(!p.zeros_past_eof(0) && !p.zeros_past_eof(1));
        let spec = format!("snapshot:base={},cow={}", base.display(), cow.display());
        let mut dev = snapblk::open(&spec, 1).expect("open snapshot device");
        let n = target.len() as u64;
        // whole device in 128 KiB requests, then odd sector-aligned ranges
        let mut off = 0;
        while off < n {
            let len = (n - off).min(128 * 1024) as u32;
            assert_eq!(
                execute(&p, &mut dev, off, len),
                target[off as usize..(off + u64::from(len)) as usize],
                "{} at {off}",
                c.display()
            );
            off += u64::from(len);
        }
        for (o, l) in [
            (512u64, 512u32),
            (3584, 1024),
            (4096 * 3 + 512, 4096 * 5),
            (0, 512),
        ] {
            if o + u64::from(l) <= n {
                assert_eq!(
                    execute(&p, &mut dev, o, l),
                    target[o as usize..(o + u64::from(l)) as usize],
                    "{} at {o}+{l}",
                    c.display()
                );
            }
        }
    }
}

#[test]
fn a_cow_without_a_descriptor_is_planned_through_the_device() {
    use snapblk_snapshot::{BlockDev, FileDev, OpenMode, open_devs, open_files};
    use std::sync::Arc;
    let mut cow_file_segments = 0;
    for c in cases() {
        let target = std::fs::read(c.join("target.img")).unwrap();
        let (base, cow) = (c.join("base.img"), c.join("snapshot.cow"));
        // The planner's snapshot: the base a file, the COW in memory.
        let snap = open_devs(
            Arc::new(FileDev::open(&base, false).unwrap()) as Arc<dyn BlockDev>,
            Arc::new(snapblk_core::MemFile::new(std::fs::read(&cow).unwrap())),
            snapblk_snapshot::SnapshotConfig::default(),
        )
        .unwrap();
        let p = SnapshotPlanner::new(snap);
        assert_eq!(p.files().len(), 1, "only the base has a descriptor");
        let all_files = SnapshotPlanner::new(
            open_files(&base, &cow, Default::default(), OpenMode::default()).unwrap(),
        );
        assert_eq!(all_files.files().len(), 2);
        let spec = format!("snapshot:base={},cow={}", base.display(), cow.display());
        let mut dev = snapblk::open(&spec, 1).expect("open snapshot device");
        let n = target.len() as u64;
        let mut off = 0;
        while off < n {
            let len = (n - off).min(128 * 1024) as u32;
            let mut plan = Vec::new();
            p.plan(off, len, &mut plan).unwrap();
            assert!(
                plan.iter()
                    .all(|s| !matches!(s, Segment::File { file: 1.., .. })),
                "{}: no COW file segment in {plan:?}",
                c.display()
            );
            plan.clear();
            all_files.plan(off, len, &mut plan).unwrap();
            cow_file_segments += plan
                .iter()
                .filter(|s| matches!(s, Segment::File { file: 1, .. }))
                .count();
            assert_eq!(
                execute(&p, &mut dev, off, len),
                target[off as usize..(off + u64::from(len)) as usize],
                "{} at {off}",
                c.display()
            );
            off += u64::from(len);
        }
    }
    assert!(
        cow_file_segments > 0,
        "some case reads COW data that a COW file would serve"
    );
}

#[test]
fn file_plan_reads_the_file() {
    let c = &cases()[0];
    let p = FilePlanner::open(&c.join("target.img")).unwrap();
    let target = std::fs::read(c.join("target.img")).unwrap();
    let mut dev = snapblk::open(&c.join("target.img").display().to_string(), 1).unwrap();
    assert_eq!(execute(&p, &mut dev, 4096, 8192), target[4096..12288]);
}

#[test]
fn serve_needs_ublk() {
    // On a kernel without ublk (the host), serving fails with a clear error instead of hanging;
    // with ublk, the feature query must work.
    match snapblk_ublk::kernel_features() {
        Err(snapblk_ublk::Error::NoUblk(_)) => {
            assert!(!Path::new("/dev/ublk-control").exists());
            let dev = snapblk::open("null:size=1M", 1).unwrap();
            let r = snapblk_ublk::serve(
                dev,
                &snapblk_ublk::Config::default(),
                None,
                |_| {},
                |_| true,
            );
            assert!(matches!(r, Err(snapblk_ublk::Error::NoUblk(_))), "{r:?}");
        }
        Ok(f) => assert!(!snapblk_ublk::feature_names(f).is_empty()),
        Err(e) => panic!("unexpected: {e}"),
    }
}
