//! The snapshot driver's errors as the C ABI sees them: one errno and one message, which
//! `blkio_get_error_msg()` returns. The library's errors keep their causes as sources; the one
//! message must still carry the whole chain, each cause once.

use snapblk_core::{Driver, PropValue, State};
use snapblk_snapshot::SnapshotDriver;
use std::path::Path;

fn connect(base: &Path, cow: &Path) -> snapblk_core::Error {
    let mut d = SnapshotDriver::new();
    let s = |p: &Path| PropValue::Str(p.display().to_string());
    d.set_prop("base", s(base), State::Created).unwrap();
    d.set_prop("cow", s(cow), State::Created).unwrap();
    d.connect(false).unwrap_err()
}

#[test]
fn connect_errors_carry_the_whole_chain_in_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.img");
    std::fs::write(&base, vec![0u8; 8192]).unwrap();

    // A COW error from snapblk-cow, through the snapshot layer.
    let garbage = dir.path().join("garbage.cow");
    std::fs::write(&garbage, [0x5au8; 8192]).unwrap();
    let e = connect(&base, &garbage);
    assert_eq!(e.errno, libc::EIO);
    assert!(
        e.msg.ends_with(
            "invalid COW: bad magic 0x5a5a5a5a5a5a5a5a at offset 0 (expected 0x436f77634f572121)"
        ),
        "{}",
        e.msg
    );

    // An OS error: its errno and its text, once.
    let missing = dir.path().join("missing.cow");
    let e = connect(&base, &missing);
    assert_eq!(e.errno, libc::ENOENT, "{}", e.msg);
    let os = "No such file or directory (os error 2)";
    assert_eq!(e.msg.matches(os).count(), 1, "{}", e.msg);
    assert!(
        e.msg
            .contains(&format!("opening COW: {}", missing.display())),
        "{}",
        e.msg
    );
}
