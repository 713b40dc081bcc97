//! A base given as a device spec (`sync:path=IMG`, read and written through the driver rather
//! than as a file): `cow create --old SPEC` makes the same record as from the file,
//! `cow verify --base SPEC` checks the base against it, `snapblk merge --base SPEC` gives the new
//! image with the same pre-merge checks as a path (the record, `--verify-base`,
//! `--base-sha256`), and the snapshot driver checks the record over a `base.driver=` base. The
//! same over a real RBD image, with the lock that keeps a server and a merge apart, is in
//! tests/suites/ceph.sh.

use std::path::Path;

#[path = "cli_common.rs"]
mod common;
use common::{Case, ok, read, refused};

#[test]
fn the_snapshot_driver_checks_the_record_over_a_device_base() {
    let c = Case::new("mdev-driver", 256, &[]);
    let mut w = read(&c.old);
    w[20 * 4096] ^= 1; // a COPY source
    let wrong = c.p("wrong.img");
    std::fs::write(&wrong, &w).unwrap();
    let dev = |base: &Path, extra: &str| {
        format!(
            "snapshot:cow={},base.driver=sync,base.path={}{extra}",
            c.cow.display(),
            base.display()
        )
    };
    // The size comes from the record (the base's size here), and the base checks pass.
    let out = ok(&["info", &dev(&c.old, ",verify-base=true")]);
    assert!(out.contains("1048576"), "{out}");
    refused(
        &["info", &dev(&wrong, ",verify-base=true")],
        "is not the image this COW was made for",
    );
    // A merge over the wrong device base is refused at connect, before anything is written.
    let m = c.cow_copy("m.cow");
    let spec = format!(
        "snapshot:cow={},base.driver=sync,base.path={},merge=true",
        m.display(),
        wrong.display()
    );
    let before = read(&m);
    refused(
        &["serve", &spec, "--nbd", "unix:/nonexistent/x.sock"],
        "not the file this COW's merge belongs to",
    );
    assert!(read(&wrong) == w && read(&m) == before, "a file changed");
}
