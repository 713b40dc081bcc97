//! The writable overlay: writes through the driver, flush, restart, crash (power cut) and
//! folding into the base by the merge.

use snapblk_core::rng::Rng;
use snapblk_core::{Blkio, QueueExt};
use snapblk_snapshot::fault::FaultWorld;
use snapblk_snapshot::synth::{SynthCase, SynthSpec, generate};
use snapblk_snapshot::{
    MergeOptions, OpenMode, Snapshot, SnapshotConfig, SnapshotDriver, merge, open_files,
};
use std::path::Path;
use std::sync::Arc;

fn copy_case(name: &str, dir: &Path) -> (String, String, Vec<u8>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/aosp-cow")
        .join(name);
    let base = dir.join("base.img");
    let cow = dir.join("snapshot.cow");
    std::fs::copy(src.join("base.img"), &base).unwrap();
    std::fs::copy(src.join("snapshot.cow"), &cow).unwrap();
    (
        base.display().to_string(),
        cow.display().to_string(),
        std::fs::read(src.join("target.img")).unwrap(),
    )
}

/// A writable snapshot of `case` on the fault world's disks (0: base, 1: COW).
fn open_writable(case: &SynthCase, w: &Arc<FaultWorld>) -> Snapshot {
    case.open_on(
        w,
        SnapshotConfig {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn open_driver(base: &str, cow: &str, writable: bool) -> Blkio {
    let mut b = Blkio::new(Box::new(SnapshotDriver::new()));
    b.set_str("base", base).unwrap();
    b.set_str("cow", cow).unwrap();
    b.set_bool("writable", writable).unwrap();
    b.connect().unwrap();
    b.start().unwrap();
    b
}

#[test]
fn writes_read_back_survive_restart_and_merge_folds_them() {
    for case in ["v3_basic_none", "v2_xor_seq_lz4", "v3_multiblock_lz4_64k"] {
        let dir = tempfile::tempdir().unwrap();
        let (base, cow, target) = copy_case(case, dir.path());
        let mut expect = target.clone();
        let mut rng = Rng::new(9);
        {
            let mut b = open_driver(&base, &cow, true);
            assert!(!b.get_bool("read-only").unwrap());
            let q = b.queue(0, false).unwrap();
            for i in 0..40 {
                // Unaligned offsets and lengths, some spanning several blocks.
                let off = rng.below(expect.len() as u64 - 20000) as usize;
                let len = 1 + rng.below(if i % 5 == 0 { 20000 } else { 3000 }) as usize;
                let mut data = vec![0u8; len];
                rng.fill(&mut data);
                q.write_at(off as u64, &data, i % 7 == 0).unwrap();
                expect[off..off + len].copy_from_slice(&data);
                let mut back = vec![0u8; len];
                q.read_at(off as u64, &mut back).unwrap();
                assert_eq!(back, data, "{case}: read after write {i}");
            }
            q.flush().unwrap();
            let mut all = vec![0u8; expect.len()];
            q.read_at(0, &mut all).unwrap();
            assert!(all == expect, "{case}: full read after writes");
        }
        // Restart, read-only: the journal is replayed; writes are refused with EROFS.
        {
            let mut b = open_driver(&base, &cow, false);
            assert!(b.get_bool("read-only").unwrap());
            let q = b.queue(0, false).unwrap();
            let mut all = vec![0u8; expect.len()];
            q.read_at(0, &mut all).unwrap();
            assert!(all == expect, "{case}: full read after restart");
            assert_eq!(q.write_at(0, &[1], false).unwrap_err().errno, libc::EROFS);
        }
        // The COW is still a valid Android COW (the journal lies past its data).
        snapblk_cow::CowReader::open_with(
            std::fs::File::open(&cow).unwrap(),
            snapblk_cow::OpenOptions {
                duplicates: snapblk_cow::DuplicatePolicy::FirstWins,
                ..Default::default()
            },
        )
        .unwrap();
        // Merge folds the overlay into the base.
        let s = open_files(
            Path::new(&base),
            Path::new(&cow),
            SnapshotConfig::default(),
            OpenMode {
                base_writable: true,
                cow_writable: true,
            },
        )
        .unwrap();
        let rep = merge(&s, MergeOptions::default()).unwrap();
        assert!(rep.overlay_blocks > 0);
        assert!(
            std::fs::read(&base).unwrap() == expect,
            "{case}: merged base includes overlay writes"
        );
        let mut all = vec![0u8; expect.len()];
        s.read(0, &mut all).unwrap();
        assert!(all == expect);
    }
}

#[test]
fn power_cut_keeps_flushed_writes_and_whole_records_only() {
    let case = generate(
        &SynthSpec {
            blocks: 64,
            ..SynthSpec::default()
        },
        4,
    );
    let bs = 4096usize;
    for seed in 0..200u64 {
        let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
        let open = |w: &Arc<FaultWorld>| open_writable(&case, w);
        let s = open(&world);
        let mut rng = Rng::new(seed);
        let mut flushed = case.target.clone();
        // Each write: (block, fill byte); all whole-block so outcomes are easy to enumerate.
        let mut unflushed: Vec<(usize, u8)> = Vec::new();
        world.cut_after(rng.below(60));
        for i in 0..30u8 {
            let blk = rng.below(64) as usize;
            // A write interrupted by the cut was not acknowledged, but may still land.
            unflushed.push((blk, i + 1));
            if s.write((blk * bs) as u64, &vec![i + 1; bs], false).is_err() {
                break;
            }
            if rng.below(4) == 0 {
                if s.flush().is_err() {
                    break;
                }
                for (b, v) in unflushed.drain(..) {
                    flushed[b * bs..(b + 1) * bs].fill(v);
                }
            }
        }
        let imgs = world.recover(seed);
        let w2 = FaultWorld::new(imgs);
        let s2 = open(&w2);
        let mut all = vec![0u8; case.target.len()];
        s2.read(0, &mut all).unwrap();
        // Survivors form a prefix of the unflushed writes (the journal is replayed in order and
        // stops at the first missing record).
        let ok = (0..=unflushed.len()).any(|k| {
            let mut e = flushed.clone();
            for &(b, v) in &unflushed[..k] {
                e[b * bs..(b + 1) * bs].fill(v);
            }
            e == all
        });
        assert!(
            ok,
            "seed {seed}: contents are not flushed data plus a prefix of unflushed writes"
        );
        // Still writable after recovery, and the new writes win.
        s2.write(0, &vec![0xEE; bs], true).unwrap();
        let s3 = open(&FaultWorld::new(w2.current()));
        let mut b0 = vec![0u8; bs];
        s3.read(0, &mut b0).unwrap();
        assert!(b0.iter().all(|&x| x == 0xEE), "seed {seed}");
    }
}

/// Records R1 (flushed), R2, R3 (not flushed); power loss tears R2 but R3 lands. Reopening stops
/// at R2, so R3 is rightly dropped. The client then rewrites R2's block with the same data: the
/// new record must not re-link R3 (byte-identical to R2 it used to, and R3 came back on the next
/// open).
#[test]
fn rewriting_a_torn_record_identically_does_not_revive_later_records() {
    let case = generate(
        &SynthSpec {
            blocks: 64,
            ..SynthSpec::default()
        },
        4,
    );
    let bs = 4096usize;
    let open = |w: &Arc<FaultWorld>| open_writable(&case, w);
    let read_block = |s: &Snapshot, b: usize| {
        let mut v = vec![0u8; bs];
        s.read((b * bs) as u64, &mut v).unwrap();
        v
    };
    let target = |b: usize| case.target[b * bs..(b + 1) * bs].to_vec();
    let (b1, b2, b3) = (5usize, 6usize, 7usize);
    let world = FaultWorld::new(vec![case.base.clone(), case.cow.clone()]);
    let s = open(&world);
    s.write((b1 * bs) as u64, &vec![0xA1; bs], true).unwrap();
    s.write((b2 * bs) as u64, &vec![0xB2; bs], false).unwrap();
    s.write((b3 * bs) as u64, &vec![0xC3; bs], false).unwrap();
    drop(s);
    // Each record is a header block and a data block, at the journal start in order.
    let start = case.layout.data_end.div_ceil(4096) as usize * 4096;
    let (r2, r3) = (start + 2 * bs, start + 4 * bs);
    let full = world.current()[1].clone();
    let mut scenarios = 0;
    for seed in 0..64 {
        let imgs = world.recover(seed);
        let cow = &imgs[1];
        let same = |a: usize, n: usize| cow.get(a..a + n) == full.get(a..a + n);
        // R2 torn (header or data lost), R3 wholly on disk.
        if same(r2, 2 * bs) || !same(r3, 2 * bs) {
            continue;
        }
        scenarios += 1;
        let w2 = FaultWorld::new(imgs);
        let s2 = open(&w2);
        // (assert! rather than assert_eq!: a failure would print 4 KiB blocks.)
        assert!(
            read_block(&s2, b1) == [0xA1; 4096],
            "seed {seed}: flushed R1"
        );
        assert!(read_block(&s2, b2) == target(b2), "seed {seed}: torn R2");
        assert!(
            read_block(&s2, b3) == target(b3),
            "seed {seed}: R3 after the tear"
        );
        s2.write((b2 * bs) as u64, &vec![0xB2; bs], true).unwrap();
        drop(s2);
        let s3 = open(&FaultWorld::new(w2.current()));
        assert!(read_block(&s3, b2) == [0xB2; 4096], "seed {seed}: rewrite");
        assert!(
            read_block(&s3, b3) == target(b3),
            "seed {seed}: stale R3 came back"
        );
    }
    assert!(scenarios >= 2, "only {scenarios} seeds tore R2 and kept R3");
}

/// A v3 COW with only COPY and ZERO ops (no payload) and room for many more ops: the journal
/// goes after every op slot, not into the free ones (where an appender puts its records). A
/// journal that older versions put right after the used records is still found there.
#[test]
fn journal_of_a_payloadless_v3_cow_starts_after_the_op_slots() {
    use snapblk_cow::{Codec, Compression, CowReader, CowWriter, MemFile, WriterOptions};
    let dir = tempfile::tempdir().unwrap();
    let base: Vec<u8> = (0..64 * 4096)
        .map(|i| (i / 4096 * 7 + i % 251) as u8)
        .collect();
    let f = MemFile::default();
    let mut w = CowWriter::new(
        &f,
        WriterOptions {
            version: 3,
            codec: Codec::new(Compression::None),
            op_count_max: 1024,
            ..Default::default()
        },
    )
    .unwrap();
    w.add_copy(1, 40, 4).unwrap();
    w.add_zero_blocks(20, 2).unwrap();
    w.finalize().unwrap();
    let (bp, cp) = (dir.path().join("base.img"), dir.path().join("snapshot.cow"));
    std::fs::write(&bp, &base).unwrap();
    std::fs::write(&cp, f.into_inner()).unwrap();
    let (h, cow_len) = {
        let r = CowReader::open(std::fs::File::open(&cp).unwrap()).unwrap();
        (r.header().clone(), r.file_len())
    };
    let used_end = h.v3_op_offset() + 6 * 16;
    let start = h.v3_data_offset().div_ceil(4096) * 4096;
    let legacy = used_end.div_ceil(4096) * 4096;
    assert!(
        legacy < h.v3_data_offset(),
        "the case must tell the two apart"
    );
    let (base_s, cow_s) = (bp.display().to_string(), cp.display().to_string());
    {
        let mut b = open_driver(&base_s, &cow_s, true);
        let q = b.queue(0, false).unwrap();
        q.write_at(10 * 4096, &[0x77; 4096], false).unwrap();
        q.flush().unwrap();
    }
    let bytes = std::fs::read(&cp).unwrap();
    assert!(
        bytes[cow_len as usize..start as usize]
            .iter()
            .all(|&b| b == 0),
        "the free op slots stay untouched"
    );
    assert_eq!(&bytes[start as usize..start as usize + 8], b"SNAPBLKO");
    let read_block = |n: u64| {
        let mut b = open_driver(&base_s, &cow_s, false);
        let q = b.queue(0, false).unwrap();
        let mut v = vec![0u8; 4096];
        q.read_at(n * 4096, &mut v).unwrap();
        v
    };
    assert!(read_block(10) == [0x77; 4096], "overlay write read back");
    // The same journal where older versions wrote it (right after the used op records).
    let journal = bytes[start as usize..].to_vec();
    let mut old = bytes[..legacy as usize].to_vec();
    old.extend_from_slice(&journal);
    std::fs::write(&cp, &old).unwrap();
    assert!(read_block(10) == [0x77; 4096], "legacy journal replayed");
    assert!(read_block(1) == base[40 * 4096..41 * 4096], "COPY op");
}
