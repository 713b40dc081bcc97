//! A base given as a device spec (`sync:path=IMG`, read and written through the driver rather
//! than as a file): `cow create --old SPEC` makes the same record as from the file,
//! `cow verify --base SPEC` checks the base against it, `snapblk merge --base SPEC` gives the new
//! image with the same pre-merge checks as a path (the record, `--verify-base`,
//! `--base-sha256`), and the snapshot driver checks the record over a `base.driver=` base. The
//! same over a real RBD image, with the lock that keeps a server and a merge apart, is in
//! tests/suites/ceph.sh.

use snapblk_testsupport::{assert_file_eq, path_str};
use std::path::Path;

#[path = "cli_common.rs"]
mod common;
use common::{Case, ok, read, refused};

fn spec(p: &Path) -> String {
    format!("sync:path={}", p.display())
}

#[test]
fn a_cow_made_verified_and_merged_through_a_device_spec() {
    let c = Case::new("mdev-merge", 256, &[]);
    // The record made reading the old image through the driver is the one made from the file.
    let cow = c.p("dev.cow");
    ok(&[
        "cow",
        "create",
        "--old",
        &spec(&c.old),
        "--new",
        &spec(&c.new),
        "-o",
        path_str(&cow),
    ]);
    assert_file_eq(&cow, &read(&c.cow), "the COW made through the driver");
    assert_file_eq(
        &c.p("dev.cow.snapblk"),
        &read(&c.record()),
        "the record made through the driver",
    );
    let rec = c.p("again.snapblk");
    ok(&[
        "cow",
        "record",
        path_str(&c.cow),
        "--old",
        &spec(&c.old),
        "--new",
        path_str(&c.new),
        "-o",
        path_str(&rec),
    ]);
    assert_file_eq(&rec, &read(&c.record()), "cow record --old SPEC");
    let out = ok(&["cow", "verify", path_str(&c.cow), "--base", &spec(&c.old)]);
    assert!(out.contains("base matches the record"), "{out}");

    let base = c.file_copy(&c.old, "base.img");
    let m = c.cow_copy("m.cow");
    let out = ok(&[
        "merge",
        path_str(&m),
        "--base",
        &spec(&base),
        "--verify-base",
    ]);
    assert!(out.contains("merged "), "{out}");
    assert_file_eq(&base, &read(&c.new), "the base merged through sync:");
    let st = ok(&["merge", "--status", path_str(&m), "--base", &spec(&base)]);
    assert!(st.contains("the merge is complete"), "{st}");
}

#[test]
fn a_wrong_device_base_is_refused_with_nothing_written() {
    let c = Case::new("mdev-wrong", 256, &[]);
    // Every block differs from the old image in its first bytes (blocks 10..60 are COPY sources).
    let mut w = read(&c.old);
    for b in w.chunks_mut(4096) {
        b[..8].copy_from_slice(b"WRONGBAS");
    }
    let wrong = c.p("wrong.img");
    std::fs::write(&wrong, &w).unwrap();
    let f = std::fs::File::open(&c.old).unwrap();
    let old_sha = snapblk_cow::record::hex(&snapblk_cow::record::sha256_of(&f).unwrap());
    let cases: [(&[&str], &str); 3] = [
        (&[], "not the file this COW's merge belongs to"),
        (&["--verify-base"], "is not the image this COW was made for"),
        (
            &["--no-record", "--base-sha256", &old_sha],
            "not the --base-sha256 given",
        ),
    ];
    for (args, want) in cases {
        let m = c.cow_copy("m.cow");
        let before = read(&m);
        let s = spec(&wrong);
        let mut a = vec!["merge", path_str(&m), "--base", &s];
        a.extend_from_slice(args);
        refused(&a, want);
        assert!(read(&wrong) == w, "{args:?}: the base changed");
        assert!(read(&m) == before, "{args:?}: the COW changed");
    }
}

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
