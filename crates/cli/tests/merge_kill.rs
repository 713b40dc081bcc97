//! Kill a real `snapblk merge` with SIGKILL at random instants, then run it again; the merge must
//! resume and end with base == target, and reads through the snapshot must be right after every
//! kill. The COW is a real v3 file (2 MiB scratch, lz4) with long overlapping COPY/XOR chains.

use snapblk_core::rng::Rng;
use snapblk_snapshot::synth::{SynthSpec, generate, write_cow};
use snapblk_snapshot::{MergeOptions, OpenMode, SnapshotConfig, open_files};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("snapblk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    TempDir(p)
}

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

fn read_view(base: &Path, cow: &Path, len: usize) -> Vec<u8> {
    let s = open_files(base, cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
    let mut v = vec![0u8; len];
    s.read(0, &mut v).unwrap();
    v
}

#[test]
fn sigkill_at_random_points_then_resume() {
    let spec = SynthSpec {
        blocks: 4096,
        scratch_size: 2 << 20,
        chain_len: 300,
        chains: 6,
        random_ordered: 1500,
        replaces: 600,
        zeros: 100,
        unaligned_xor: true,
        ..SynthSpec::default()
    };
    let case = generate(&spec, 42);
    let opts = snapblk_cow::WriterOptions {
        codec: snapblk_cow::Codec::new(snapblk_cow::Compression::Lz4),
        ..Default::default()
    };
    let cow_bytes = write_cow(&case, opts).unwrap();
    let dir = tempdir("merge-kill");
    let (base, cow) = (dir.0.join("base.img"), dir.0.join("snapshot.cow"));

    // Time one uninterrupted merge to spread the kill instants over it.
    std::fs::write(&base, &case.base).unwrap();
    std::fs::write(&cow, &cow_bytes).unwrap();
    let t0 = Instant::now();
    let out = merge_cmd(&cow, &base).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let full = t0.elapsed();
    assert!(
        std::fs::read(&base).unwrap() == case.target,
        "uninterrupted merge"
    );

    std::fs::write(&base, &case.base).unwrap();
    std::fs::write(&cow, &cow_bytes).unwrap();
    let mut rng = Rng::new(7);
    let mut kills = 0;
    let mut mid_merge_kills = 0;
    for round in 0..200 {
        let mut child = merge_cmd(&cow, &base).spawn().unwrap();
        let delay = Duration::from_micros(rng.below(full.as_micros() as u64 + 1));
        std::thread::sleep(delay);
        let finished = child.try_wait().unwrap().is_some();
        if !finished {
            // std's Child::kill sends SIGKILL on Unix.
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        let killed = !status.success();
        if killed {
            kills += 1;
        }
        let s = open_files(&base, &cow, SnapshotConfig::default(), OpenMode::default()).unwrap();
        let (done, total) = s.merge_progress();
        if killed && done > 0 && done < total {
            mid_merge_kills += 1;
        }
        drop(s);
        assert!(
            read_view(&base, &cow, case.target.len()) == case.target,
            "round {round}: reads after kill"
        );
        if done == total && kills >= 25 {
            break;
        }
        if done == total {
            // Completed: start over to collect more kill points.
            std::fs::write(&base, &case.base).unwrap();
            std::fs::write(&cow, &cow_bytes).unwrap();
        }
    }
    eprintln!("{kills} kills, {mid_merge_kills} in the middle of a merge, full merge {full:?}");
    // Finish whatever is left and check the result.
    let out = merge_cmd(&cow, &base).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&base).unwrap() == case.target,
        "base after resumed merges"
    );
    assert!(kills >= 25, "only {kills} kills");
    assert!(
        mid_merge_kills >= 5,
        "only {mid_merge_kills} kills landed mid-merge"
    );
    // And the library agrees the merge is complete.
    let s = open_files(
        &base,
        &cow,
        SnapshotConfig::default(),
        OpenMode {
            base_writable: true,
            cow_writable: true,
        },
    )
    .unwrap();
    let (done, total) = s.merge_progress();
    assert_eq!(done, total);
    snapblk_snapshot::merge(&s, MergeOptions::default()).unwrap();
}
