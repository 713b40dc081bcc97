//! Instances dropped with submitted reads never reaped free everything they opened (the
//! conformance suite's `drop-unreaped` check), for the local drivers. Its own test binary: the
//! check counts the process's open files, which tests running beside it in one process would
//! change.

use snapblk_conformance::Outcome;
use snapblk_core::{Blkio, Driver};
use snapblk_drivers::{NullDriver, SyncDriver, UringDriver};

/// A driver's name and how to make one.
type Make = (&'static str, fn() -> Box<dyn Driver>);

#[test]
fn instances_dropped_with_unreaped_reads_leak_no_files() {
    let dir = std::env::temp_dir().join(format!("snapblk-drop-unreaped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("img");
    std::fs::write(&img, vec![7u8; 1 << 20]).unwrap();
    let drivers: [Make; 3] = [
        ("io_uring", || Box::new(UringDriver::new())),
        ("sync", || Box::new(SyncDriver::new())),
        ("null", || Box::new(NullDriver::new())),
    ];
    for (name, make) in drivers {
        let mut open = || {
            let mut b = Blkio::new(make());
            if name == "null" {
                b.set_u64("size", 1 << 20)?;
            } else {
                b.set_str("path", img.to_str().unwrap())?;
            }
            b.connect()?;
            Ok(b)
        };
        let out = snapblk_conformance::drop_unreaped(&mut open, 30);
        println!("{name}: {out:?}");
        assert!(matches!(out, Outcome::Pass(_)), "{name}: {out:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
