//! `bench` with a job that writes on a read-only target says so before any I/O (issue 19,
//! U7): it used to fail at the first write with "Bad file descriptor (os error 9)". Drives the
//! real binary.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");

#[test]
fn writing_jobs_on_a_read_only_target_are_refused_clearly() {
    let d = std::env::temp_dir().join(format!("snapblk-loadgen-ro-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let img = d.join("t.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    for (driver, rw) in [("io_uring", "write"), ("sync", "randrw")] {
        let spec = format!("{driver}:path={},read-only=true", img.display());
        let o = Command::new(BIN)
            .args(["bench", &spec, "--rw", rw, "--runtime", "0.05"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{spec} {rw}: {err}");
        assert_eq!(
            err.lines().last().unwrap_or_default(),
            format!(
                "snapblk: invalid job: --rw {rw} writes, but the target is read-only \
                 (read-only=true in its spec, or a snapshot without writable=true)"
            ),
            "{spec} {rw}"
        );
        assert!(o.stdout.is_empty(), "no results for a refused job");
    }
    // Reading it read-only still works.
    let spec = format!("io_uring:path={},read-only=true", img.display());
    let o = Command::new(BIN)
        .args(["bench", &spec, "--rw", "read", "--runtime", "0.05"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The file is unchanged.
    assert!(std::fs::read(&img).unwrap().iter().all(|&b| b == 0));
    std::fs::remove_dir_all(&d).unwrap();
}
