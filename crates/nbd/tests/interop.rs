//! Interoperability with real NBD clients (libnbd's nbdinfo/nbdcopy, qemu-img, qemu-io) against
//! an in-process server over a plain file device. The tools must be installed
//! (scripts/install-deps.sh); a missing tool fails the test.

mod common;
use common::*;

const SIZE: usize = 8 << 20;

#[test]
fn nbdinfo_reports_size_flags_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = write_image(dir.path(), "a.img", SIZE, 1);
    let srv = TestServer::start(img.to_str().unwrap(), true, "127.0.0.1:0");
    let j: serde_json::Value =
        serde_json::from_str(&tool_ok("nbdinfo", &["--json", &srv.uri])).unwrap();
    let e = &j["exports"][0];
    assert_eq!(e["export-size"], SIZE as u64);
    assert_eq!(e["is_read_only"], true);
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["can_flush"], true);
    assert_eq!(e["block_size_maximum"], 32 << 20);
    let list = tool_ok("nbdinfo", &["--list", "--json", &srv.uri]);
    let l: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(l["exports"].as_array().unwrap().len(), 1);
    assert_eq!(l["exports"][0]["export-name"], "disk");
    assert_eq!(l["exports"][0]["description"], "test disk");
    // An unknown export name is refused, not served.
    let bad = srv.uri.replace("/disk", "/nope");
    assert!(!tool("nbdinfo", &[&bad]).status.success());
    srv.stop();
}

#[test]
fn nbdcopy_and_qemu_img_read_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let (img, data) = write_image(dir.path(), "a.img", SIZE, 2);
    let srv = TestServer::start(img.to_str().unwrap(), true, "127.0.0.1:0");
    let out = dir.path().join("copy.img");
    tool_ok("nbdcopy", &[&srv.uri, out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == data, "nbdcopy copy differs");
    tool_ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            img.to_str().unwrap(),
            &srv.uri,
        ],
    );
    let conv = dir.path().join("conv.img");
    tool_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &srv.uri,
            conv.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&conv).unwrap() == data,
        "qemu-img convert copy differs"
    );
    // A different image must NOT compare equal (the comparison can fail).
    let (other, _) = write_image(dir.path(), "b.img", SIZE, 3);
    assert!(
        !tool(
            "qemu-img",
            &[
                "compare",
                "-f",
                "raw",
                "-F",
                "raw",
                other.to_str().unwrap(),
                &srv.uri
            ]
        )
        .status
        .success()
    );
    srv.stop();
}

#[test]
fn unix_socket_export() {
    let dir = tempfile::tempdir().unwrap();
    let (img, data) = write_image(dir.path(), "a.img", SIZE, 4);
    let sock = dir.path().join("nbd.sock");
    let srv = TestServer::start(
        img.to_str().unwrap(),
        true,
        &format!("unix:{}", sock.display()),
    );
    assert!(srv.uri.starts_with("nbd+unix:///disk?socket="));
    let out = dir.path().join("copy.img");
    tool_ok("nbdcopy", &[&srv.uri, out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == data);
    srv.stop();
    assert!(!sock.exists(), "socket removed on stop");
}

#[test]
fn writes_through_nbd_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = write_image(dir.path(), "target.img", SIZE, 5);
    let (src, src_data) = write_image(dir.path(), "src.img", SIZE, 6);
    let srv = TestServer::start(img.to_str().unwrap(), false, "127.0.0.1:0");
    // Whole-image write with several connections and requests in flight.
    tool_ok(
        "nbdcopy",
        &[
            "--connections=4",
            "--requests=16",
            src.to_str().unwrap(),
            &srv.uri,
        ],
    );
    tool_ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            &srv.uri,
        ],
    );
    // Patterned writes, FUA write, zeroing and discard via qemu-io.
    let cmds = [
        "write -P 0xab 4096 65536",
        "write -f -P 0xcd 1048576 4096",
        "write -z 2097152 1048576",
        "discard 3145728 1048576",
        "flush",
    ];
    let mut args = vec!["-f", "raw"];
    for c in &cmds {
        args.extend(["-c", c]);
    }
    args.push(&srv.uri);
    tool_ok("qemu-io", &args);
    let verify = tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read -P 0xab 4096 65536",
            "-c",
            "read -P 0xcd 1048576 4096",
            "-c",
            "read -P 0 2097152 1048576",
            &srv.uri,
        ],
    );
    assert!(!verify.contains("Pattern verification failed"), "{verify}");
    srv.stop();
    // Stopped cleanly: the file holds every write.
    let mut expect = src_data;
    expect[4096..4096 + 65536].fill(0xab);
    expect[1048576..1048576 + 4096].fill(0xcd);
    expect[2097152..2097152 + 1048576].fill(0);
    let got = std::fs::read(&img).unwrap();
    assert!(
        got[..3145728] == expect[..3145728],
        "data before the discarded range differs"
    );
    assert!(
        got[4194304..] == expect[4194304..],
        "data after the discarded range differs"
    );
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (img, data) = write_image(dir.path(), "a.img", 1 << 20, 7);
    let srv = TestServer::start(img.to_str().unwrap(), true, "127.0.0.1:0");
    let out = tool(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 1 0 4096", &srv.uri],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success()
            || text.contains("failed")
            || text.contains("read-only")
            || text.contains("not permitted"),
        "{text}"
    );
    srv.stop();
    assert!(std::fs::read(&img).unwrap() == data);
}
