//! Interoperability with real NBD clients (libnbd's nbdinfo/nbdcopy, qemu-img, qemu-io) against
//! an in-process server over a plain file device. The tools must be installed
//! (scripts/install-deps.sh); a missing tool fails the test.

mod common;
use common::*;

const SIZE: usize = 8 << 20;

#[test]
fn nbdinfo_reports_size_flags_and_exports() {
    let (srv, _img, _data, _dir) = serve_image(SIZE, 1, true);
    let j = nbd::info(&srv.uri);
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
    let (srv, img, data, dir) = serve_image(SIZE, 2, true);
    nbd::assert_export_reads(&srv.uri, &img, &data, dir.path(), "file export");
    // A different image must NOT compare equal (the comparison can fail).
    let (other, _) = write_image(dir.path(), "b.img", SIZE, 3);
    assert!(
        !nbd::qemu_img_compare(path_str(&other), &srv.uri)
            .status
            .success()
    );
    srv.stop();
}

#[test]
fn unix_socket_export() {
    let dir = TempDir::new("nbd-unix");
    let (img, data) = write_image(dir.path(), "a.img", SIZE, 4);
    let sock = dir.join("nbd.sock");
    let srv = TestServer::start(path_str(&img), true, &format!("unix:{}", sock.display()));
    assert!(srv.uri.starts_with("nbd+unix:///disk?socket="));
    let out = dir.join("copy.img");
    nbd::copy(&srv.uri, path_str(&out));
    assert_file_eq(&out, &data, "copy over the unix socket");
    srv.stop();
    assert!(!sock.exists(), "socket removed on stop");
}

#[test]
fn writes_through_nbd_read_back() {
    let (srv, img, _data, dir) = serve_image(SIZE, 5, false);
    let (src, src_data) = write_image(dir.path(), "src.img", SIZE, 6);
    // Whole-image write with several connections and requests in flight.
    tool_ok(
        "nbdcopy",
        &["--connections=4", "--requests=16", path_str(&src), &srv.uri],
    );
    nbd::assert_qemu_img_same(path_str(&src), &srv.uri);
    // Patterned writes, FUA write, zeroing and discard via qemu-io.
    nbd::qemu_io_ok(
        &srv.uri,
        &[
            "write -P 0xab 4096 65536",
            "write -f -P 0xcd 1048576 4096",
            "write -z 2097152 1048576",
            "discard 3145728 1048576",
            "flush",
        ],
    );
    nbd::qemu_io_ok(
        &srv.uri,
        &[
            "read -P 0xab 4096 65536",
            "read -P 0xcd 1048576 4096",
            "read -P 0 2097152 1048576",
        ],
    );
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
    let (srv, img, data, _dir) = serve_image(1 << 20, 7, true);
    let out = nbd::qemu_io(&srv.uri, &["write -P 1 0 4096"]);
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
    assert_file_eq(&img, &data, "read-only image");
}
