//! A COW written by `snapblk ota cow` merged by `snapblk merge`, killed with SIGKILL at random
//! points of its progress (watched in the base: most kills must land with the base half
//! merged) and run again: the snapshot view stays the new image after every kill and the
//! resumed merge ends with the new image in the base. The
//! payload (16 MiB images) moves 4,000 blocks up by one — the self-overlapping copy the
//! generator splits into one-block COW_COPY ops, a long ordered chain merged through the
//! scratch area — plus REPLACE and ZERO data.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use snapblk_ota::testing::vabc::{VabcFields, cow_copy, set_vabc};
use snapblk_ota::testing::{DeltaOp, Encoding, PayloadBuilder};
use snapblk_ota::{DeviceProfile, VabcParams, estimate_vabc_cow};
use snapblk_snapshot::{OpenMode, SnapshotConfig, open_files};
use snapblk_testsupport::{TempDir, path_str, pattern};

#[path = "cli_common.rs"]
mod common;
use common::ok;

const BS: usize = 4096;
const BLOCKS: usize = 4096;
const CHAIN: u64 = 4000;
/// Blocks of the chain watched to see how far a merge has come.
const SAMPLES: usize = 64;

fn merge_cmd(cow: &Path, base: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.arg("merge")
        .arg(cow)
        .arg("--base")
        .arg(base)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn view(base: &Path, cow: &Path, len: usize) -> Vec<u8> {
    let s = open_files(base, cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
    let mut v = vec![0u8; len];
    s.read(0, &mut v).unwrap();
    v
}

#[test]
fn an_ota_cow_merge_killed_and_resumed_ends_at_the_new_image() {
    let d = TempDir::new("ota-cow-kill");
    let old = pattern(BLOCKS * BS, 21);
    let mut new = vec![0u8; BLOCKS * BS];
    new[..BS].copy_from_slice(&pattern(BS, 22));
    new[BS..(CHAIN as usize + 1) * BS].copy_from_slice(&old[..CHAIN as usize * BS]);
    let tail = CHAIN as usize + 1;
    let mid = 4040;
    new[tail * BS..mid * BS].copy_from_slice(&pattern((mid - tail) * BS, 23));
    let ops = vec![
        DeltaOp::Replace {
            dst: vec![(0, 1)],
            encoding: Encoding::Replace,
        },
        DeltaOp::Copy {
            src: vec![(0, CHAIN)],
            dst: vec![(1, CHAIN)],
        },
        DeltaOp::Replace {
            dst: vec![(tail as u64, (mid - tail) as u64)],
            encoding: Encoding::Zstd,
        },
        DeltaOp::Zero {
            dst: vec![(mid as u64, (BLOCKS - mid) as u64)],
        },
    ];
    let no_differ = |_: &[u8], _: &[u8]| Vec::new();
    let mut built = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, &no_differ)
        .build();
    let f = VabcFields {
        cow_version: 3,
        compression: "lz4".into(),
        compression_factor: 65536,
        batch_writes: true,
        threaded: true,
    };
    set_vabc(&mut built.manifest, &["system"], &f);
    let p = &mut built.manifest.partitions[0];
    // The self-overlapping copy split into one-block pieces, last first.
    p.merge_operations = (0..CHAIN).rev().map(|i| cow_copy(i, i + 1, 1)).collect();
    let params = VabcParams::from_manifest(&built.manifest, &built.manifest.partitions[0]).unwrap();
    let est = estimate_vabc_cow(
        &built.manifest.partitions[0],
        &params,
        DeviceProfile::CURRENT,
        Some(&old),
        &new,
    )
    .unwrap();
    let p = &mut built.manifest.partitions[0];
    p.estimate_cow_size = Some(est.estimate_cow_size);
    p.estimate_op_count_max = Some(est.estimate_op_count_max);
    let ota = d.join("ota.bin");
    std::fs::write(&ota, built.to_bytes()).unwrap();
    std::fs::create_dir(d.join("old")).unwrap();
    std::fs::write(d.join("old/system.img"), &old).unwrap();
    let out = d.join("out");
    ok(&[
        "ota",
        "cow",
        path_str(&ota),
        "--source",
        path_str(&d.join("old")),
        "-o",
        path_str(&out),
        "--verify",
    ]);
    let (cow0, rec0) = (out.join("system.cow"), out.join("system.cow.snapblk"));
    let (base, cow, rec) = (d.join("base.img"), d.join("m.cow"), d.join("m.cow.snapblk"));
    let fresh = || {
        std::fs::write(&base, &old).unwrap();
        std::fs::copy(&cow0, &cow).unwrap();
        std::fs::copy(&rec0, &rec).unwrap();
    };
    // One uninterrupted merge first.
    fresh();
    let o = merge_cmd(&cow, &base).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&base).unwrap()[..new.len()] == new[..]);
    // Then merges killed once a random share of the chain is in the base, watched through
    // `SAMPLES` of its blocks: a kill lands while the base is half old, half new, not in the
    // merge's start-up (the record check alone takes longer than a timed kill would wait).
    // SNAPBLK_KILL_SEED repeats the kill targets (where a kill lands depends on timing).
    let seed = std::env::var("SNAPBLK_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let mut rng = seed;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let samples: Vec<usize> = (0..SAMPLES)
        .map(|i| 1 + i * CHAIN as usize / SAMPLES)
        .collect();
    let merged_samples = |base_now: &std::fs::File| {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; BS];
        samples
            .iter()
            .filter(|&&j| {
                base_now.read_exact_at(&mut b, (j * BS) as u64).is_ok()
                    && b[..] == new[j * BS..(j + 1) * BS]
            })
            .count()
    };
    // Rounds of up to three kills on a fresh base, each round resumed to the end, until nine
    // kills have landed inside the merge (it had moved since the kill before and was not done)
    // or 60 kills were tried.
    let (mut kills, mut mid_merge, mut round) = (0, 0, 0);
    while mid_merge < 9 {
        assert!(
            kills < 60,
            "only {mid_merge} of {kills} kills hit a half-merged base (SNAPBLK_KILL_SEED={seed} \
             repeats the kill targets)"
        );
        round += 1;
        fresh();
        let watch = std::fs::File::open(&base).unwrap();
        for kill in 0..3 {
            // Kill once a random number more of the samples are merged, never all of them.
            let now = merged_samples(&watch);
            if now >= SAMPLES - 1 {
                break;
            }
            let target = now + 1 + next(SAMPLES - 1 - now);
            let mut child = merge_cmd(&cow, &base).spawn().unwrap();
            let t0 = Instant::now();
            while child.try_wait().unwrap().is_none()
                && t0.elapsed() < Duration::from_secs(60)
                && merged_samples(&watch) < target
            {
                std::thread::sleep(Duration::from_micros(100));
            }
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
            kills += 1;
            // Where the kill landed, counted once the process is gone.
            let at = merged_samples(&watch);
            if at > now && at < SAMPLES {
                mid_merge += 1;
            }
            assert!(
                view(&base, &cow, new.len()) == new,
                "view after kill {kill} of round {round} ({at} of {SAMPLES} samples merged; \
                 SNAPBLK_KILL_SEED={seed} repeats the kill targets)"
            );
        }
        let o = merge_cmd(&cow, &base).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let merged = std::fs::read(&base).unwrap();
        assert!(
            merged[..new.len()] == new[..],
            "resumed merge of round {round} (SNAPBLK_KILL_SEED={seed})"
        );
    }
    eprintln!("{mid_merge} of {kills} kills hit a half-merged base (SNAPBLK_KILL_SEED={seed})");
}
