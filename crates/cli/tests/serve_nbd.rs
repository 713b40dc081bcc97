//! `snapblk serve --nbd` end to end, with real clients: nbdinfo, nbdcopy, qemu-img, qemu-io.
//! Plain file devices and every golden snapshot case (base.img + snapshot.cow must read back as
//! target.img), writes on writable devices, concurrency, and clean shutdown on SIGTERM.

#[path = "serve_common.rs"]
mod common;
use common::*;

fn uri(s: &Serve) -> String {
    s.ready["uri"].as_str().unwrap().to_owned()
}

#[test]
fn plain_file_is_readable_by_every_client() {
    let d = TempDir::new("nbd-plain");
    let img = d.join("a.img");
    let data = pattern(6 << 20, 1);
    std::fs::write(&img, &data).unwrap();
    let s = Serve::start(&[img.to_str().unwrap(), "--nbd", "0"]);
    assert_eq!(s.ready["export"], "nbd");
    assert_eq!(s.ready["size"], data.len() as u64);
    assert!(
        s.ready["address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "binds to loopback by default"
    );
    let u = uri(&s);
    let info: serde_json::Value =
        serde_json::from_str(&tool_ok("nbdinfo", &["--json", &u])).unwrap();
    assert_eq!(info["exports"][0]["export-size"], data.len() as u64);
    assert_eq!(info["exports"][0]["is_read_only"], false);
    let out = d.join("copy.img");
    tool_ok("nbdcopy", &[&u, out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == data);
    tool_ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            img.to_str().unwrap(),
            &u,
        ],
    );
    let conv = d.join("conv.img");
    tool_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &u,
            conv.to_str().unwrap(),
        ],
    );
    assert!(std::fs::read(&conv).unwrap() == data);
    let (st, rest, err) = s.stop();
    assert!(st.success(), "exit {st}: {err}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some(r#"{"event":"stopped","export":"nbd"}"#)
    );
}

#[test]
fn writes_are_durable_after_sigterm() {
    let d = TempDir::new("nbd-write");
    let img = d.join("a.img");
    let mut expect = pattern(4 << 20, 2);
    std::fs::write(&img, &expect).unwrap();
    let sock = d.join("s.sock");
    let s = Serve::start(&[
        img.to_str().unwrap(),
        "--nbd",
        &format!("unix:{}", sock.display()),
    ]);
    let u = uri(&s);
    assert!(u.starts_with("nbd+unix://"));
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 8192 131072",
            "-c",
            "write -z 1048576 65536",
            &u,
        ],
    );
    let v = tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0x5a 8192 131072",
            "-c",
            "read -P 0 1048576 65536",
            &u,
        ],
    );
    assert!(!v.contains("verification failed"), "{v}");
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert!(!sock.exists(), "unix socket removed on exit");
    expect[8192..8192 + 131072].fill(0x5a);
    expect[1048576..1048576 + 65536].fill(0);
    assert!(std::fs::read(&img).unwrap() == expect);
}

#[test]
fn read_only_flag_is_enforced() {
    let d = TempDir::new("nbd-ro");
    let img = d.join("a.img");
    let data = pattern(1 << 20, 3);
    std::fs::write(&img, &data).unwrap();
    let s = Serve::start(&[img.to_str().unwrap(), "--read-only", "--nbd", "0"]);
    assert_eq!(s.ready["read_only"], true);
    let u = uri(&s);
    let info: serde_json::Value =
        serde_json::from_str(&tool_ok("nbdinfo", &["--json", &u])).unwrap();
    assert_eq!(info["exports"][0]["is_read_only"], true);
    let w = tool("qemu-io", &["-f", "raw", "-c", "write -P 1 0 4096", &u]);
    let text = String::from_utf8_lossy(&w.stdout).to_string() + &String::from_utf8_lossy(&w.stderr);
    assert!(
        !text.contains("wrote 4096"),
        "write must not succeed: {text}"
    );
    let (st, _, _) = s.stop();
    assert!(st.success());
    assert!(std::fs::read(&img).unwrap() == data);
}

#[test]
fn every_golden_snapshot_reads_back_as_target() {
    for case in golden_cases() {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let d = TempDir::new("nbd-golden");
        // Work on copies: serving must not depend on (or touch) the checked-in files.
        let (base, cow) = (d.join("base.img"), d.join("snapshot.cow"));
        std::fs::copy(case.join("base.img"), &base).unwrap();
        std::fs::copy(case.join("snapshot.cow"), &cow).unwrap();
        let target_path = case.join("target.img");
        let target = std::fs::read(&target_path).unwrap();
        let s = Serve::start(&[
            "--base",
            base.to_str().unwrap(),
            "--cow",
            cow.to_str().unwrap(),
            "--nbd",
            "0",
        ]);
        let u = uri(&s);
        assert_eq!(s.ready["size"], target.len() as u64, "{name}");
        assert_eq!(
            s.ready["read_only"], true,
            "{name}: snapshots are read-only without --writable"
        );
        let info: serde_json::Value =
            serde_json::from_str(&tool_ok("nbdinfo", &["--json", &u])).unwrap();
        assert_eq!(
            info["exports"][0]["export-size"],
            target.len() as u64,
            "{name}"
        );
        let out = d.join("copy.img");
        tool_ok("nbdcopy", &[&u, out.to_str().unwrap()]);
        assert!(
            std::fs::read(&out).unwrap() == target,
            "{name}: nbdcopy differs from target.img"
        );
        tool_ok(
            "qemu-img",
            &[
                "compare",
                "-f",
                "raw",
                "-F",
                "raw",
                target_path.to_str().unwrap(),
                &u,
            ],
        );
        let conv = d.join("conv.img");
        tool_ok(
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &u,
                conv.to_str().unwrap(),
            ],
        );
        assert!(
            std::fs::read(&conv).unwrap() == target,
            "{name}: qemu-img convert differs"
        );
        let (st, _, err) = s.stop();
        assert!(st.success(), "{name}: {err}");
        assert!(
            std::fs::read(&base).unwrap() == std::fs::read(case.join("base.img")).unwrap(),
            "{name}: base modified"
        );
    }
}

#[test]
fn writable_snapshot_writes_read_back_and_persist() {
    let case = golden_dir().join("v3_replace_zstd");
    let d = TempDir::new("nbd-snapw");
    let (base, cow) = (d.join("base.img"), d.join("snapshot.cow"));
    std::fs::copy(case.join("base.img"), &base).unwrap();
    std::fs::copy(case.join("snapshot.cow"), &cow).unwrap();
    let base_before = std::fs::read(&base).unwrap();
    let mut expect = std::fs::read(case.join("target.img")).unwrap();
    let args = [
        "--base",
        base.to_str().unwrap(),
        "--cow",
        cow.to_str().unwrap(),
        "--writable",
        "--nbd",
        "0",
    ];
    let s = Serve::start(&args);
    assert_eq!(s.ready["read_only"], false);
    let u = uri(&s);
    // Aligned, unaligned and zeroing writes.
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x11 4096 8192",
            "-c",
            "write -P 0x22 20000 3000",
            "-c",
            "write -z 65536 4096",
            "-c",
            "flush",
            &u,
        ],
    );
    expect[4096..12288].fill(0x11);
    expect[20000..23000].fill(0x22);
    expect[65536..69632].fill(0);
    let out = d.join("copy.img");
    tool_ok("nbdcopy", &[&u, out.to_str().unwrap()]);
    assert!(
        std::fs::read(&out).unwrap() == expect,
        "writes did not read back"
    );
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert!(
        std::fs::read(&base).unwrap() == base_before,
        "the base must never be written"
    );
    // Served again (read-only): the writes persisted in the snapshot.
    let s = Serve::start(&[
        "--base",
        base.to_str().unwrap(),
        "--cow",
        cow.to_str().unwrap(),
        "--nbd",
        "0",
    ]);
    let out2 = d.join("copy2.img");
    tool_ok("nbdcopy", &[&uri(&s), out2.to_str().unwrap()]);
    assert!(
        std::fs::read(&out2).unwrap() == expect,
        "writes lost across restart"
    );
    s.stop();
}

#[test]
fn sixteen_concurrent_nbdcopy_clients_verify() {
    let case = golden_dir().join("v3_multiblock_lz4_64k");
    let d = TempDir::new("nbd-16");
    let (base, cow) = (d.join("base.img"), d.join("snapshot.cow"));
    std::fs::copy(case.join("base.img"), &base).unwrap();
    std::fs::copy(case.join("snapshot.cow"), &cow).unwrap();
    let target = std::fs::read(case.join("target.img")).unwrap();
    let s = Serve::start(&[
        "--base",
        base.to_str().unwrap(),
        "--cow",
        cow.to_str().unwrap(),
        "--nbd",
        "0",
    ]);
    let u = uri(&s);
    let kids: Vec<_> = (0..16)
        .map(|i| {
            let out = d.join(&format!("c{i}.img"));
            let child = std::process::Command::new("nbdcopy")
                .args(["--connections=2", "--requests=8", &u, out.to_str().unwrap()])
                .spawn()
                .expect("nbdcopy is required (scripts/install-deps.sh)");
            (child, out)
        })
        .collect();
    for (mut c, out) in kids {
        assert!(c.wait().unwrap().success());
        assert!(
            std::fs::read(&out).unwrap() == target,
            "{} differs",
            out.display()
        );
    }
    let (st, _, _) = s.stop();
    assert!(st.success());
}

#[test]
fn bad_command_lines_fail_with_one_line_errors() {
    let run = |args: &[&str]| {
        std::process::Command::new(bin())
            .arg("serve")
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        !run(&["x.img"]).status.success(),
        "an export kind is required"
    );
    assert!(
        !run(&["x.img", "--nbd", "0", "--fuse", "/tmp"])
            .status
            .success(),
        "only one export kind"
    );
    assert!(
        !run(&["--base", "b", "--nbd", "0"]).status.success(),
        "--base needs --cow"
    );
    let o = run(&["/nonexistent/x.img", "--nbd", "0"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
    assert!(err.starts_with("snapblk: "), "{err}");
}
