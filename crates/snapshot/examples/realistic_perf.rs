//! Realistic-COW benchmarks against `pread` and `cp` (run by bench/realistic-bench.sh, which
//! builds the ext4 pair with bench/cow/make-pair.py and the COWs with `snapblk cow create`).
//!
//! usage: realistic_perf DIR ROUNDS SECTIONS COW...   (SECTIONS: reads,merge; DIR holds old.img,
//!        new.img and the COWs)
//!        realistic_perf --ir DIR COW PATTERN N       (N 4 KiB reads, for callgrind)
//!
//! * `reads`: 4 KiB QD1 reads of the whole device through `Snapshot::read` (in process, as
//!   Android's figures drive snapuserd), sequential and in a random permutation of all blocks,
//!   vs `pread` of the new image with the same offsets. Each timed pass opens the snapshot anew
//!   (an empty unit cache; the page cache is warm for every variant). Per round every variant runs once, in a
//!   rotated order; medians of the per-round throughputs and of the paired ratios.
//! * `merge`: what `snapblk merge` does, timed from opening the files to the end (the COW record
//!   beside a COW loaded and checked, the pre-merge check, the merge and its fsyncs, a final
//!   `sync`), into a fresh copy of the old image, vs `cp --sparse=never` of the new image to a new
//!   file followed by `sync`, interleaved.
//!   The merge computes units ahead on a second thread as `snapblk merge` does;
//!   `SNAPBLK_BENCH_NO_PIPELINE=1` turns that off for an A/B comparison, and
//!   `SNAPBLK_BENCH_KEEP_DECODED=BYTES` sets the units the pre-merge check keeps for the merge
//!   (default `KEEP_DECODED`, as `snapblk merge`; 0 decodes every payload twice).
//!
//! Prints one JSON object.

use snapblk_core::rng::Rng;
use snapblk_snapshot::{
    KEEP_DECODED, MergeOptions, OpenMode, SnapshotConfig, load_verifier, merge, open_files,
};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

const BS: u64 = 4096;

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return 0.0;
    }
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn offsets(blocks: u64, random: bool) -> Vec<u64> {
    let mut v: Vec<u64> = (0..blocks).map(|b| b * BS).collect();
    if random {
        let mut rng = Rng::new(42);
        for i in (1..v.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
    v
}

/// MiB/s of reading `offs` with `read`.
fn run(offs: &[u64], read: &mut dyn FnMut(u64, &mut [u8])) -> f64 {
    let mut buf = vec![0u8; BS as usize];
    let t0 = Instant::now();
    for &o in offs {
        read(o, &mut buf);
    }
    let s = t0.elapsed().as_secs_f64();
    offs.len() as f64 * BS as f64 / (1 << 20) as f64 / s
}

fn open_ro(dir: &Path, cow: &str) -> snapblk_snapshot::Snapshot {
    open_files(
        &dir.join("old.img"),
        &dir.join(cow),
        SnapshotConfig::default(),
        OpenMode::default(),
    )
    .unwrap_or_else(|e| panic!("open {cow}: {e}"))
}

fn bench_reads(dir: &Path, rounds: usize, cows: &[String]) -> serde_json::Value {
    let new = std::fs::File::open(dir.join("new.img")).unwrap();
    let blocks = new.metadata().unwrap().len() / BS;
    let mut out = serde_json::Map::new();
    for pattern in ["sequential", "random"] {
        let offs = offsets(blocks, pattern == "random");
        // One untimed pass each warms the page cache; every timed pass opens the snapshot anew,
        // so its unit cache starts empty (each block of the device is read once per pass).
        let mut pread = |o: u64, b: &mut [u8]| new.read_exact_at(b, o).unwrap();
        run(&offs, &mut pread);
        for c in cows {
            let s = open_ro(dir, c);
            run(&offs, &mut |o, b| s.read(o, b).unwrap());
        }
        let nvar = cows.len() + 1;
        let mut mibs = vec![Vec::new(); nvar];
        for r in 0..rounds {
            for k in 0..nvar {
                let v = (k + r) % nvar;
                let m = if v == 0 {
                    run(&offs, &mut pread)
                } else {
                    let s = open_ro(dir, &cows[v - 1]);
                    run(&offs, &mut |o, b| s.read(o, b).unwrap())
                };
                mibs[v].push(m);
            }
        }
        let mut p = serde_json::Map::new();
        p.insert("pread_mib_s".into(), median(&mibs[0]).into());
        for (i, c) in cows.iter().enumerate() {
            let ratios: Vec<f64> = mibs[i + 1]
                .iter()
                .zip(&mibs[0])
                .map(|(s, p)| s / p)
                .collect();
            p.insert(
                c.clone(),
                serde_json::json!({
                    "mib_s": median(&mibs[i + 1]),
                    "vs_pread": median(&ratios),
                    "vs_pread_min": ratios.iter().cloned().fold(f64::MAX, f64::min),
                    "vs_pread_max": ratios.iter().cloned().fold(0.0, f64::max),
                }),
            );
        }
        out.insert(pattern.into(), p.into());
    }
    out.into()
}

fn sync_all() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn cp_secs(dir: &Path) -> f64 {
    let dst = dir.join("cp-out.img");
    let _ = std::fs::remove_file(&dst);
    sync_all();
    let t0 = Instant::now();
    let st = std::process::Command::new("cp")
        .arg("--sparse=never")
        .arg(dir.join("new.img"))
        .arg(&dst)
        .status()
        .unwrap();
    assert!(st.success());
    sync_all();
    let s = t0.elapsed().as_secs_f64();
    std::fs::remove_file(&dst).unwrap();
    s
}

fn merge_secs(dir: &Path, cow: &str, new: &[u8]) -> f64 {
    let base = dir.join("merge-base.img");
    let mcow = dir.join("merge.cow");
    std::fs::copy(dir.join("old.img"), &base).unwrap();
    std::fs::copy(dir.join(cow), &mcow).unwrap();
    let rec = dir.join(format!("{cow}.snapblk"));
    let mrec = dir.join("merge.cow.snapblk");
    let _ = std::fs::remove_file(&mrec);
    if rec.exists() {
        std::fs::copy(&rec, &mrec).unwrap();
    }
    sync_all();
    let t0 = Instant::now();
    // As `snapblk merge` does: the COW record beside the COW, when there is one, is checked.
    let verifier = load_verifier(&base, &mcow, None, false).unwrap();
    let s = open_files(
        &base,
        &mcow,
        SnapshotConfig::default(),
        OpenMode {
            base_writable: true,
            cow_writable: true,
        },
    )
    .unwrap();
    if let Some(v) = verifier {
        s.attach_verifier(v).unwrap();
    }
    // As `snapblk merge` does: the next window is read on a second thread.
    let opts = MergeOptions {
        pipeline: std::env::var_os("SNAPBLK_BENCH_NO_PIPELINE").is_none(),
        keep_decoded: std::env::var("SNAPBLK_BENCH_KEEP_DECODED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(KEEP_DECODED),
        ..Default::default()
    };
    merge(&s, opts).unwrap();
    drop(s);
    sync_all();
    let secs = t0.elapsed().as_secs_f64();
    assert!(std::fs::read(&base).unwrap() == new, "{cow}: merge result");
    std::fs::remove_file(&base).unwrap();
    std::fs::remove_file(&mcow).unwrap();
    let _ = std::fs::remove_file(&mrec);
    secs
}

fn bench_merge(dir: &Path, rounds: usize, cows: &[String]) -> serde_json::Value {
    let new = std::fs::read(dir.join("new.img")).unwrap();
    let nvar = cows.len() + 1;
    let mut secs = vec![Vec::new(); nvar];
    for r in 0..rounds {
        for k in 0..nvar {
            let v = (k + r) % nvar;
            let s = if v == 0 {
                cp_secs(dir)
            } else {
                merge_secs(dir, &cows[v - 1], &new)
            };
            secs[v].push(s);
        }
    }
    let mut out = serde_json::Map::new();
    out.insert("cp_s".into(), median(&secs[0]).into());
    for (i, c) in cows.iter().enumerate() {
        let ratios: Vec<f64> = secs[0]
            .iter()
            .zip(&secs[i + 1])
            .map(|(cp, m)| cp / m)
            .collect();
        out.insert(
            c.clone(),
            serde_json::json!({
                "merge_s": median(&secs[i + 1]),
                "vs_cp": median(&ratios),
                "vs_cp_min": ratios.iter().cloned().fold(f64::MAX, f64::min),
                "vs_cp_max": ratios.iter().cloned().fold(0.0, f64::max),
            }),
        );
    }
    out.into()
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.first().map(String::as_str) == Some("--ir") {
        // Passes over the device, each on a fresh open (an empty unit cache), as timed.
        let dir = Path::new(&a[1]);
        let mut s = open_ro(dir, &a[2]);
        let blocks = s.capacity() / BS;
        let offs = offsets(blocks, a[3] == "random");
        let n: usize = a[4].parse().unwrap();
        let mut buf = vec![0u8; BS as usize];
        for (i, &o) in offs.iter().cycle().take(n).enumerate() {
            if i > 0 && i % offs.len() == 0 {
                s = open_ro(dir, &a[2]);
            }
            s.read(o, &mut buf).unwrap();
        }
        return;
    }
    if a.len() < 4 {
        eprintln!("usage: realistic_perf DIR ROUNDS SECTIONS COW...");
        std::process::exit(2);
    }
    let dir = Path::new(&a[0]);
    let rounds: usize = a[1].parse().unwrap();
    let sections = &a[2];
    let cows = &a[3..];
    let mut out = serde_json::Map::new();
    if sections.contains("reads") {
        out.insert("reads".into(), bench_reads(dir, rounds, cows));
    }
    if sections.contains("merge") {
        out.insert("merge".into(), bench_merge(dir, rounds, cows));
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::Value::Object(out)).unwrap()
    );
}
