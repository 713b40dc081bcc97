//! A read the disk fails reaches real NBD clients (qemu-io, nbdcopy) as EIO: the export serves
//! the fault-injecting disk of snapblk-snapshot (`test-utils`), with a latent sector error in
//! the middle of an otherwise readable device. The tools must be installed
//! (scripts/install-deps.sh); a missing tool fails the test.

mod common;
use common::*;
use snapblk_core::Blkio;
use snapblk_nbd::ServerConfig;
use snapblk_snapshot::fault::FaultDriver;

const SIZE: u64 = 4 << 20;
/// The bad range: 512 bytes inside the second MiB.
const BAD: u64 = (1 << 20) + 8192;

/// A started fault device of [`SIZE`] bytes whose reads touching `[BAD, BAD + 512)` fail.
fn faulty_device() -> Blkio {
    let mut b = Blkio::new(Box::new(FaultDriver::configurable()));
    b.set_u64("size", SIZE).unwrap();
    b.set_u64("seed", 20).unwrap();
    b.set_u64("bad-offset", BAD).unwrap();
    b.set_u64("bad-length", 512).unwrap();
    b.connect().unwrap();
    b.start().unwrap();
    b
}

#[test]
fn a_read_the_disk_fails_reaches_nbd_clients_as_eio() {
    // Writable: qemu-io opens its image read-write.
    let srv = TestServer::start_device(
        faulty_device(),
        false,
        "127.0.0.1:0",
        ServerConfig::default(),
    );
    // Reads away from the bad range succeed (the disk is zero-filled).
    nbd::qemu_io_ok(&srv.uri, &["read -P 0 0 1M", "read -P 0 2M 64k"]);
    // A read covering it fails with EIO, and so does a read of one sector of it.
    for cmd in [
        format!("read {} 64k", BAD - 4096),
        format!("read {BAD} 512"),
    ] {
        let out = nbd::qemu_io(&srv.uri, &[&cmd]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("read failed: Input/output error"),
            "qemu-io {cmd}: {text}"
        );
    }
    // nbdcopy of the whole export fails on it and says why.
    let dir = TempDir::new("nbd-faults");
    let out = tool("nbdcopy", &[&srv.uri, path_str(&dir.join("copy.img"))]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nbdcopy succeeded over a bad sector");
    assert!(err.contains("Input/output error"), "nbdcopy: {err}");
    // The connection survives the error: the same client reads good data after it.
    nbd::qemu_io_ok(
        &srv.uri,
        &[&format!("read -P 0 {} 4k", BAD + 4096), "read -P 0 0 4k"],
    );
    let out = nbd::qemu_io(
        &srv.uri,
        &[
            &format!("read {BAD} 4k"),
            &format!("read -P 0 {} 4k", BAD + 65536),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("read failed: Input/output error")
            && text.matches("read 4096/4096").count() == 1,
        "qemu-io after an error: {text}"
    );
    srv.stop();
}
