//! Snapshot specs with a base or COW given as a URL: what is refused before any request is sent
//! (the reads themselves are tested against radosgw by tests/suites/s3.sh).
#![cfg(all(feature = "snapshot", feature = "remote"))]

fn refused(spec: &str) -> snapblk::Error {
    match snapblk::open(spec, 1) {
        Ok(_) => panic!("{spec} opened"),
        Err(e) => e,
    }
}

#[test]
fn remote_snapshot_sides_refuse_merge_and_writes() {
    let e = refused("snapshot:base=s3://b/base.img,cow=/nonexistent.cow,merge=true");
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    assert!(e.msg.contains("merge needs a local base and COW"), "{e}");
    let e = refused("snapshot:base=/nonexistent.img,cow=https://h/x.cow,writable=true");
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    assert!(e.msg.contains("writable needs a local COW"), "{e}");
    // The record checks need verify (a remote side's record is checked as a local one's).
    let e = refused("snapshot:base=s3://b/base.img,cow=/x.cow,verify=false,verify-base=true");
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    assert!(e.msg.contains("need verify=true"), "{e}");
    // With a nested base, a remote COW is read-only too.
    let e = refused(
        "snapshot:cow=s3://b/x.cow,base.driver=null,base.size=1M,verify=false,writable=true",
    );
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    assert!(e.msg.contains("a COW given as a URL is read-only"), "{e}");
    // A local COW's record is a file: a URL there is refused, not looked for as a path.
    let e = refused("snapshot:base=/x.img,cow=/x.cow,cow-record=s3://b/x.cow.snapblk");
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    assert!(
        e.msg
            .contains("cow-record may be a URL only for a COW given as a URL"),
        "{e}"
    );
    // A URL that is not one the remote driver takes fails as such, not as a missing file.
    let e = refused("snapshot:base=s3://b,cow=/x.cow");
    assert_eq!(e.errno, libc::EINVAL, "{e}");
    assert!(e.msg.contains("not a remote location"), "{e}");
}
