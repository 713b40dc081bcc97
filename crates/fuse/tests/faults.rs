//! A read the disk fails reaches readers of the mounted FUSE file as EIO, with and without the
//! page cache: the export serves the fault-injecting disk of snapblk-snapshot (`test-utils`)
//! with a latent sector error in the middle of an otherwise readable device.

use snapblk_core::Blkio;
use snapblk_fuse::{FuseOptions, mount};
use snapblk_snapshot::fault::FaultDriver;
use std::os::unix::fs::FileExt;

const SIZE: u64 = 4 << 20;
/// The bad range: 512 bytes inside the second MiB.
const BAD: u64 = (1 << 20) + 8192;

/// A started fault device of [`SIZE`] bytes whose reads touching `[BAD, BAD + 512)` fail.
fn faulty_device() -> Blkio {
    let mut b = Blkio::new(Box::new(FaultDriver::configurable()));
    b.set_u64("size", SIZE).unwrap();
    b.set_u64("bad-offset", BAD).unwrap();
    b.set_u64("bad-length", 512).unwrap();
    b.connect().unwrap();
    b.start().unwrap();
    b
}

fn mount_and_read(direct_io: bool) {
    let what = if direct_io {
        "direct I/O"
    } else {
        "page cache"
    };
    let dir =
        std::env::temp_dir().join(format!("fuse-faults-{}-{}", std::process::id(), direct_io));
    std::fs::create_dir_all(&dir).unwrap();
    let opts = FuseOptions {
        read_only: true,
        direct_io,
        ..FuseOptions::default()
    };
    let mut m = mount(faulty_device(), &dir, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
    let f = std::fs::File::open(m.file()).unwrap();
    let mut buf = vec![0xffu8; 64 << 10];
    f.read_exact_at(&mut buf, 0)
        .unwrap_or_else(|e| panic!("{what}: read away from the bad range: {e}"));
    assert!(buf.iter().all(|&b| b == 0), "{what}: zero-filled disk");
    for (off, len) in [(BAD - 4096, 64 << 10), (BAD, 512), (BAD + 100, 1)] {
        let e = f
            .read_exact_at(&mut buf[..len], off)
            .expect_err(&format!("{what}: read of {len} bytes at {off} succeeded"));
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EIO),
            "{what}: read of {len} bytes at {off}: {e}"
        );
    }
    // Far from the bad range the file still reads.
    f.read_exact_at(&mut buf[..4096], 3 << 20)
        .unwrap_or_else(|e| panic!("{what}: read after the error: {e}"));
    drop(f);
    m.try_unmount().unwrap();
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn a_read_the_disk_fails_reaches_the_fuse_file_as_eio() {
    mount_and_read(false);
    mount_and_read(true);
}
