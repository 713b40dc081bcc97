//! Nested device specs end to end: the snapshot driver over a base given as a device spec
//! (`base.driver=...`) serves exactly what it serves over the same base given as a path, for
//! every AOSP golden case, through specs and through property setters (the C ABI's path).
#![cfg(feature = "snapshot")]

use snapblk::{Blkio, open};
use snapblk_core::QueueExt;
use snapblk_testsupport::golden;

fn read_all(b: &mut Blkio) -> Vec<u8> {
    let cap = b.get_u64("capacity").unwrap();
    let q = b.queue(0, false).unwrap();
    let mut out = vec![0u8; cap as usize];
    for (i, chunk) in out.chunks_mut(64 << 10).enumerate() {
        q.read_at(i as u64 * (64 << 10), chunk).unwrap();
    }
    out
}

#[test]
fn a_device_base_reads_as_a_file_base_for_every_golden_case() {
    for case in golden::cases() {
        let (b, c) = (case.base(), case.cow());
        let (b, c) = (b.display(), c.display());
        let by_path = open(&format!("snapshot:base={b},cow={c}"), 1);
        let by_spec = open(
            &format!("snapshot:cow={c},base.driver=sync,base.path={b}"),
            1,
        );
        let nested = open(
            &format!("snapshot:cow={c},base.driver=io_uring,base.path={b},base.direct=false"),
            1,
        );
        match (by_path, by_spec, nested) {
            (Ok(mut p), Ok(mut s), Ok(mut n)) => {
                let want = read_all(&mut p);
                assert_eq!(read_all(&mut s), want, "{}", case.name);
                assert_eq!(read_all(&mut n), want, "{}", case.name);
                let target = case.read("target.img");
                assert_eq!(&want[..], &target[..want.len()], "{}", case.name);
            }
            (Err(p), Err(s), Err(n)) => {
                // A case the snapshot refuses is refused the same way over a device base.
                assert_eq!(p.errno, s.errno, "{}: {p:?} vs {s:?}", case.name);
                assert_eq!(p.errno, n.errno, "{}", case.name);
            }
            (p, s, n) => panic!(
                "{}: path {:?}, spec {:?}, io_uring {:?}",
                case.name,
                p.err(),
                s.err(),
                n.err()
            ),
        }
    }
}

#[test]
fn dotted_properties_through_the_setters() {
    let case = golden::case("v2_basic_none");
    let mut b = snapblk::create("snapshot").unwrap();
    b.set_str("cow", &case.cow().display().to_string()).unwrap();
    b.set_str("base.driver", "sync").unwrap();
    b.set_str("base.path", &case.base().display().to_string())
        .unwrap();
    assert_eq!(b.get_str("base.driver").unwrap(), "sync");
    assert_eq!(b.get_str("base.nosuch").unwrap_err().errno, libc::ENOENT);
    // Only the driver's child names take dotted keys.
    assert_eq!(b.set_str("cow.x", "1").unwrap_err().errno, libc::ENOENT);
    assert_eq!(b.set_str("base.", "1").unwrap_err().errno, libc::ENOENT);
    b.connect().unwrap();
    // Like every created-state property, they are fixed once connected.
    assert_eq!(b.set_str("base.path", "/x").unwrap_err().errno, libc::EBUSY);
    b.start().unwrap();
    let got = read_all(&mut b);
    let target = case.read("target.img");
    assert_eq!(&got[..], &target[..got.len()]);
    // A device base is opened read-only: the snapshot cannot write through it.
    assert!(b.get_bool("read-only").unwrap());
}

#[test]
fn bad_nested_specs_are_refused_with_a_reason() {
    let case = golden::case("v2_basic_none");
    let (b, c) = (case.base(), case.cow());
    let (b, c) = (b.display(), c.display());
    let err = |spec: &str| open(spec, 1).err().map(|e| (e.errno, e.msg.into_owned()));
    assert_eq!(
        err(&format!("snapshot:cow={c},base.path={b}")),
        Some((
            libc::EINVAL,
            "snapshot: base.driver must be set with base.* properties".into()
        ))
    );
    assert_eq!(
        err(&format!(
            "snapshot:cow={c},base={b},base.driver=sync,base.path={b}"
        )),
        Some((
            libc::EINVAL,
            "snapshot: base and base.* properties cannot both be set".into()
        ))
    );
    let (errno, msg) = err(&format!("snapshot:cow={c},base.driver=nosuch")).unwrap();
    assert_eq!(errno, libc::ENOENT);
    assert!(
        msg.starts_with("snapshot base (nosuch): unknown driver 'nosuch'"),
        "{msg}"
    );
    let (errno, msg) = err(&format!(
        "snapshot:cow={c},base.driver=sync,base.path=/nonexistent"
    ))
    .unwrap();
    assert_eq!(errno, libc::ENOENT, "{msg}");
    assert!(msg.starts_with("snapshot base (sync): "), "{msg}");
    // The child's own properties are checked by the child.
    let (errno, _) = err(&format!(
        "snapshot:cow={c},base.driver=sync,base.path={b},base.bogus=1"
    ))
    .unwrap();
    assert_eq!(errno, libc::ENOENT);
}
