//! Snapshot benchmarks (run by bench/snapshot-bench.sh; put the files on tmpfs or zram).
//!
//! usage: snapbench DIR [MiB]
//!
//! Prints one JSON object with:
//! * `copy_qd1`: 4 KiB random reads at QD1 through the snapshot driver (Blkio queue API) of a
//!   COPY-only COW vs the same reads on the raw base (pread, and the `sync` driver's queue);
//! * `lz4`: sequential 1 MiB reads of a REPLACE-lz4 COW through the driver vs decoding the same
//!   payloads in memory with the same codec (no I/O at all);
//! * `merge`: merge throughput of a COPY-only COW (every block moves) vs a plain sequential copy
//!   (read image, write it to another file, fdatasync);
//! * `fg_during_merge`: p50/p99 of foreground 4 KiB random reads idle vs while a merge runs, with
//!   and without the scheduler.

use snapblk_core::{Blkio, QueueExt};
use snapblk_snapshot::cowsrc::{OpenMode, open_files};
use snapblk_snapshot::rng::Rng;
use snapblk_snapshot::sched::SchedConfig;
use snapblk_snapshot::{MergeOptions, SnapshotConfig, SnapshotDriver, merge};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

const BS: usize = 4096;

fn text_block(b: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(BS);
    let mut line = 0;
    while v.len() < BS {
        v.extend_from_slice(
            format!("block-tag {b} variant 1 line {line}: the quick brown fox\n").as_bytes(),
        );
        line += 1;
    }
    v.truncate(BS);
    v
}

fn write_cow(
    path: &Path,
    opts: snapblk_cow::WriterOptions,
    f: impl FnOnce(&mut snapblk_cow::CowWriter<&std::fs::File>),
) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = snapblk_cow::CowWriter::new(&file, opts).unwrap();
    f(&mut w);
    w.finalize().unwrap();
}

fn opts(codec: snapblk_cow::Compression, blocks: u64) -> snapblk_cow::WriterOptions {
    snapblk_cow::WriterOptions {
        codec: snapblk_cow::Codec::new(codec),
        op_count_max: blocks + 16,
        ..Default::default()
    }
}

/// COPY-only COW: new block b <- base block b+1 (a shift; sequence ascending is a safe order).
fn copy_cow(path: &Path, blocks: u64) {
    write_cow(path, opts(snapblk_cow::Compression::None, blocks), |w| {
        let seq: Vec<u32> = (0..blocks as u32 - 1).collect();
        w.add_sequence_data(&seq).unwrap();
        w.add_copy(0, 1, blocks - 1).unwrap();
    });
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn open_driver(base: &Path, cow: &Path, sched: bool) -> Blkio {
    let mut b = Blkio::new(Box::new(SnapshotDriver::new()));
    b.set_str("base", &base.display().to_string()).unwrap();
    b.set_str("cow", &cow.display().to_string()).unwrap();
    b.set_bool("scheduler", sched).unwrap();
    b.connect().unwrap();
    b.start().unwrap();
    b
}

fn qd1_reads(
    q: &mut dyn FnMut(u64, &mut [u8]),
    blocks: u64,
    n: usize,
    seed: u64,
) -> (f64, u64, u64) {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; BS];
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        let b = rng.below(blocks - 1);
        let t = Instant::now();
        q(b * BS as u64, &mut buf);
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let total = t0.elapsed().as_secs_f64();
    let iops = n as f64 / total;
    (iops, percentile(&mut lat, 0.5), percentile(&mut lat, 0.99))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .map(String::as_str)
            .unwrap_or("/dev/shm/snapbench"),
    );
    let mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(256);
    std::fs::create_dir_all(&dir).unwrap();
    let blocks = mib * 256;
    let mut rng = Rng::new(1);
    let base = dir.join("base.img");
    let mut img = vec![0u8; (blocks as usize) * BS];
    rng.fill(&mut img);
    std::fs::write(&base, &img).unwrap();
    let mut report = serde_json::Map::new();
    report.insert("image_mib".into(), mib.into());
    report.insert("dir".into(), dir.display().to_string().into());

    // 1. COPY-only 4 KiB random reads at QD1.
    let cow = dir.join("copy.cow");
    copy_cow(&cow, blocks);
    let n = 300_000;
    {
        let f = std::fs::File::open(&base).unwrap();
        let mut raw = |off: u64, buf: &mut [u8]| f.read_exact_at(buf, off).unwrap();
        qd1_reads(&mut raw, blocks, n / 3, 9); // warm-up
        let (raw_iops, raw_p50, raw_p99) = qd1_reads(&mut raw, blocks, n, 10);
        let mut sb = Blkio::new(Box::new(snapblk_drivers::SyncDriver::new()));
        sb.set_str("path", &base.display().to_string()).unwrap();
        sb.connect().unwrap();
        sb.start().unwrap();
        let q = sb.queue(0, false).unwrap();
        let mut sync = |off: u64, buf: &mut [u8]| q.read_at(off, buf).unwrap();
        let (sync_iops, _, _) = qd1_reads(&mut sync, blocks, n, 10);
        let direct =
            open_files(&base, &cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
        let mut dread = |off: u64, buf: &mut [u8]| direct.read(off, buf).unwrap();
        qd1_reads(&mut dread, blocks, n / 3, 9);
        let (direct_iops, _, _) = qd1_reads(&mut dread, blocks, n, 10);
        let mut b = open_driver(&base, &cow, true);
        let q = b.queue(0, false).unwrap();
        let mut snap = |off: u64, buf: &mut [u8]| q.read_at(off, buf).unwrap();
        qd1_reads(&mut snap, blocks, n / 3, 9);
        let (snap_iops, snap_p50, snap_p99) = qd1_reads(&mut snap, blocks, n, 10);
        report.insert(
            "copy_qd1".into(),
            serde_json::json!({
                "raw_pread_iops": raw_iops, "raw_p50_ns": raw_p50, "raw_p99_ns": raw_p99,
                "raw_sync_driver_iops": sync_iops,
                "snapshot_iops": snap_iops, "snapshot_p50_ns": snap_p50, "snapshot_p99_ns": snap_p99,
                "time_ratio_vs_pread": raw_iops / snap_iops,
                "time_ratio_vs_sync_driver": sync_iops / snap_iops,
                "snapshot_api_iops": direct_iops,
                "snapshot_api_time_ratio_vs_pread": raw_iops / direct_iops,
            }),
        );
    }

    // 2. REPLACE-lz4: sequential reads through the driver vs in-memory decode of the payloads.
    {
        let cow = dir.join("lz4.cow");
        let mut data = Vec::with_capacity(blocks as usize * BS);
        for b in 0..blocks {
            data.extend_from_slice(&text_block(b));
        }
        write_cow(&cow, opts(snapblk_cow::Compression::Lz4, blocks), |w| {
            w.add_raw_blocks(0, &data).unwrap()
        });
        let bytes = std::fs::read(&cow).unwrap();
        let reader = snapblk_cow::CowReader::open(bytes.as_slice()).unwrap();
        let ops: Vec<_> = reader.data_ops().copied().collect();
        let mut out = vec![0u8; BS];
        let t0 = Instant::now();
        for op in &ops {
            let p = op.payload().unwrap();
            let src = &bytes[p.offset as usize..p.offset as usize + p.len as usize];
            snapblk_cow::codec::decompress(p.codec, src, &mut out).unwrap();
            std::hint::black_box(&out);
        }
        let decode_s = t0.elapsed().as_secs_f64();
        let mut b = open_driver(&base, &cow, true);
        let q = b.queue(0, false).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let t0 = Instant::now();
        let mut off = 0u64;
        while off < blocks * BS as u64 {
            q.read_at(off, &mut buf).unwrap();
            off += buf.len() as u64;
        }
        let read_s = t0.elapsed().as_secs_f64();
        q.read_at(0, &mut buf[..BS]).unwrap();
        assert_eq!(&buf[..BS], &data[..BS]);
        let mibs = |s: f64| mib as f64 / s;
        report.insert(
            "lz4".into(),
            serde_json::json!({
                "raw_decode_mib_s": mibs(decode_s), "snapshot_read_mib_s": mibs(read_s),
                "ratio": decode_s / read_s, "ops": ops.len(),
            }),
        );
    }

    // 3. Merge throughput vs sequential copy.
    {
        let work = dir.join("merge-base.img");
        std::fs::copy(&base, &work).unwrap();
        let cow = dir.join("merge.cow");
        copy_cow(&cow, blocks);
        let s = open_files(
            &work,
            &cow,
            SnapshotConfig::default(),
            OpenMode {
                base_writable: true,
                cow_writable: true,
            },
        )
        .unwrap();
        let t0 = Instant::now();
        let rep = merge(&s, MergeOptions::default()).unwrap();
        let merge_s = t0.elapsed().as_secs_f64();
        let merged_mib = rep.blocks_written as f64 * BS as f64 / (1 << 20) as f64;
        drop(s);
        let got = std::fs::read(&work).unwrap();
        assert!(got[..BS] == img[BS..2 * BS], "merge result");
        // Plain copy: read the image and write it over an existing copy (in place, like the
        // merge) in 1 MiB pieces, then fdatasync.
        let dst = dir.join("copy.img");
        std::fs::copy(&base, &dst).unwrap();
        let t0 = Instant::now();
        {
            let src = std::fs::File::open(&base).unwrap();
            let mut d = std::fs::OpenOptions::new().write(true).open(&dst).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            while off < blocks * BS as u64 {
                src.read_exact_at(&mut buf, off).unwrap();
                d.write_all(&buf).unwrap();
                off += buf.len() as u64;
            }
            d.sync_data().unwrap();
        }
        let copy_s = t0.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&dst);
        report.insert(
            "merge".into(),
            serde_json::json!({
                "merge_mib_s": merged_mib / merge_s, "copy_mib_s": mib as f64 / copy_s,
                "ratio": (merged_mib / merge_s) / (mib as f64 / copy_s),
                "windows": rep.ordered_windows, "blocks_written": rep.blocks_written,
            }),
        );
    }

    // 4. Foreground p99 during a merge, with and without the scheduler.
    let mut fg = serde_json::Map::new();
    for sched in [true, false] {
        let work = dir.join("fg-base.img");
        std::fs::copy(&base, &work).unwrap();
        let cow = dir.join("fg.cow");
        copy_cow(&cow, blocks);
        let cfg = SnapshotConfig {
            sched: SchedConfig {
                enabled: sched,
                ..SchedConfig::default()
            },
            ..Default::default()
        };
        let s = Arc::new(
            open_files(
                &work,
                &cow,
                cfg,
                OpenMode {
                    base_writable: true,
                    cow_writable: true,
                },
            )
            .unwrap(),
        );
        let mut read = |off: u64, buf: &mut [u8]| s.read(off, buf).unwrap();
        qd1_reads(&mut read, blocks, 20_000, 3);
        let (_, idle_p50, idle_p99) = qd1_reads(&mut read, blocks, 100_000, 4);
        let done = AtomicBool::new(false);
        let (busy_p50, busy_p99, n, stats) = std::thread::scope(|sc| {
            let s2 = s.clone();
            let done = &done;
            let h = sc.spawn(move || {
                let r = merge(&s2, MergeOptions::default());
                done.store(true, Ordering::Relaxed);
                r.unwrap();
            });
            let mut lat = Vec::new();
            let mut rng = Rng::new(5);
            let mut buf = vec![0u8; BS];
            while !done.load(Ordering::Relaxed) {
                let b = rng.below(blocks - 1);
                let t = Instant::now();
                s.read(b * BS as u64, &mut buf).unwrap();
                lat.push(t.elapsed().as_nanos() as u64);
            }
            h.join().unwrap();
            let n = lat.len();
            (
                percentile(&mut lat, 0.5),
                percentile(&mut lat, 0.99),
                n,
                s.sched_stats(),
            )
        });
        fg.insert(
            if sched {
                "with_scheduler"
            } else {
                "without_scheduler"
            }
            .into(),
            serde_json::json!({
                "idle_p50_ns": idle_p50, "idle_p99_ns": idle_p99,
                "merge_p50_ns": busy_p50, "merge_p99_ns": busy_p99,
                "p99_ratio": busy_p99 as f64 / idle_p99 as f64, "samples": n,
                "merge_throttled": stats.merge.throttled, "merge_wait_ns": stats.merge.wait_ns,
            }),
        );
    }
    report.insert("fg_during_merge".into(), fg.into());
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    for f in [
        "base.img",
        "copy.cow",
        "lz4.cow",
        "merge-base.img",
        "merge.cow",
        "fg-base.img",
        "fg.cow",
    ] {
        let _ = std::fs::remove_file(dir.join(f));
    }
}
