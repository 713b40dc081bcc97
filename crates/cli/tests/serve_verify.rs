//! The COW record on the serving side: a snapshot whose COW has a record beside it checks every
//! block of the new image it serves against the record, once, and answers a corrupt block with
//! an I/O error instead of wrong bytes (NBD through qemu-io and nbdcopy, FUSE through read(2));
//! a wrong base is refused eagerly with verify-base, and a merge into a base the record says it
//! does not belong to is refused before anything is written.

#[path = "serve_common.rs"]
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Case {
    tmp: TempDir,
    old: PathBuf,
    new: PathBuf,
    cow: PathBuf,
    /// Target block whose REPLACE payload `bad.cow` has one flipped byte.
    bad_block: u64,
    bad: PathBuf,
}

fn snapblk_ok(args: &[&str]) -> String {
    let o = Command::new(bin()).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "snapblk {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn case(tag: &str) -> Case {
    let tmp = TempDir::new(tag);
    let (old, new) = image_pair(tmp.path(), 256);
    let cow = tmp.join("u.cow");
    snapblk_ok(&[
        "cow",
        "create",
        "--old",
        path_str(&old),
        "--new",
        path_str(&new),
        "-o",
        path_str(&cow),
        "--compression",
        "none",
    ]);
    let j: serde_json::Value = serde_json::from_str(&snapblk_ok(&[
        "cow",
        "inspect",
        "--json",
        "--ops",
        path_str(&cow),
    ]))
    .unwrap();
    let op = j["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"]["type"] == "replace")
        .unwrap()
        .clone();
    let bad = tmp.join("bad.cow");
    let mut d = std::fs::read(&cow).unwrap();
    d[op["kind"]["payload"]["offset"].as_u64().unwrap() as usize + 100] ^= 0x10;
    std::fs::write(&bad, d).unwrap();
    std::fs::copy(
        format!("{}.snapblk", cow.display()),
        format!("{}.snapblk", bad.display()),
    )
    .unwrap();
    Case {
        bad_block: op["new_block"].as_u64().unwrap(),
        tmp,
        old,
        new,
        cow,
        bad,
    }
}

fn serve_nbd(base: &Path, cow: &Path, extra: &[&str]) -> Serve {
    let mut args = vec!["--base", path_str(base), "--cow", path_str(cow)];
    args.extend(extra);
    args.extend(["--nbd", "0"]);
    Serve::start(&args)
}

#[test]
fn nbd_answers_a_corrupt_block_with_eio_and_serves_the_rest() {
    let c = case("verify-nbd");
    let s = serve_nbd(&c.old, &c.bad, &[]);
    let u = s.ready_str("uri");
    let at = (c.bad_block * 4096).to_string();
    let qio = |cmd: &str| tool("qemu-io", &["-r", "-f", "raw", "-c", cmd, &u]);
    let o = qio(&format!("read {at} 4096"));
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(out.contains("Input/output error"), "{out}");
    // Twice, and a part of the block: a failed check is not remembered as a pass.
    let o = qio(&format!("read {} 512", c.bad_block * 4096 + 512));
    let out2 =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(out2.contains("Input/output error"), "{out2}");
    // Other blocks are served (their bytes are checked by the FUSE test and the intact case).
    let o = qio(&format!("read 0 {at}"));
    let out3 =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !out3.contains("error"), "{out3}");
    let copied = c.tmp.join("copy.img");
    let st = Command::new("nbdcopy")
        .arg(&u)
        .arg(&copied)
        .status()
        .unwrap();
    assert!(!st.success(), "nbdcopy must see the I/O error");
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}

#[test]
fn nbd_serves_an_intact_cow_exactly_with_checks_on() {
    let c = case("verify-nbd-ok");
    let s = serve_nbd(&c.old, &c.cow, &[]);
    let u = s.ready_str("uri");
    nbd::assert_export_reads(
        &u,
        &c.new,
        &std::fs::read(&c.new).unwrap(),
        c.tmp.path(),
        "checked",
    );
    s.stop();
}

#[test]
fn fuse_answers_a_corrupt_block_with_eio() {
    let c = case("verify-fuse");
    let mnt = c.tmp.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let s = Serve::start(&[
        "--base",
        path_str(&c.old),
        "--cow",
        path_str(&c.bad),
        "--fuse",
        path_str(&mnt),
    ]);
    let f = std::fs::File::open(mnt.join("disk.img")).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, c.bad_block * 4096)
        .expect_err("a corrupt block must not be served");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let new = std::fs::read(&c.new).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 0).unwrap();
    assert_eq!(buf, new[..4096]);
    drop(f);
    s.stop();
}

#[test]
fn a_wrong_base_is_refused_at_start_with_verify_base_and_caught_lazily_without() {
    let c = case("verify-wrong-base");
    let e = Serve::try_start(&[
        "--base",
        path_str(&c.new),
        "--cow",
        path_str(&c.cow),
        "--verify-base",
        "--nbd",
        "0",
    ])
    .err()
    .expect("refused");
    assert!(e.contains("is not the image this COW was made for"), "{e}");
    // Lazily: the blocks the COW produces from the wrong base fail their check.
    let s = serve_nbd(&c.new, &c.cow, &[]);
    let copied = c.tmp.join("copy.img");
    let st = Command::new("nbdcopy")
        .arg(s.ready_str("uri"))
        .arg(&copied)
        .status()
        .unwrap();
    assert!(!st.success(), "wrong bytes must not be served");
    s.stop();
}

#[test]
fn a_merge_into_a_base_it_does_not_belong_to_is_refused_before_writing() {
    let c = case("verify-merge");
    let before = [
        std::fs::read(&c.new).unwrap(),
        std::fs::read(&c.cow).unwrap(),
    ];
    // The new image as base (an update merged twice).
    let spec = format!(
        "snapshot:base={},cow={},merge=true",
        path_str(&c.new),
        path_str(&c.cow)
    );
    let e = Serve::try_start(&[&spec, "--nbd", "0"])
        .err()
        .expect("refused");
    assert!(e.contains("already holds the new image"), "{e}");
    let e = Serve::try_start(&[
        "--base",
        path_str(&c.new),
        "--cow",
        path_str(&c.cow),
        "--merge",
        "--nbd",
        "0",
    ])
    .err()
    .expect("refused");
    assert!(e.contains("already holds the new image"), "{e}");
    let after = [
        std::fs::read(&c.new).unwrap(),
        std::fs::read(&c.cow).unwrap(),
    ];
    assert!(before == after, "nothing may be written");
}

#[test]
fn verify_false_serves_without_checks() {
    let c = case("verify-off");
    let s = Serve::start(&[
        "--base",
        path_str(&c.old),
        "--cow",
        path_str(&c.bad),
        "--no-record",
        "--nbd",
        "0",
    ]);
    let copied = c.tmp.join("copy.img");
    nbd::copy(s.ready_str("uri").as_str(), path_str(&copied));
    assert_ne!(
        std::fs::read(&copied).unwrap(),
        std::fs::read(&c.new).unwrap()
    );
    s.stop();
}

#[test]
fn a_shrinking_update_is_served_at_exactly_the_new_size() {
    let tmp = TempDir::new("verify-shrink");
    let (old, new) = image_pair(tmp.path(), 240);
    let cow = tmp.join("s.cow");
    snapblk_ok(&[
        "cow",
        "create",
        "--old",
        path_str(&old),
        "--new",
        path_str(&new),
        "-o",
        path_str(&cow),
    ]);
    let s = serve_nbd(&old, &cow, &[]);
    assert_eq!(s.ready["size"], 240 * 4096);
    let u = s.ready_str("uri");
    nbd::assert_export_reads(
        &u,
        &new,
        &std::fs::read(&new).unwrap(),
        tmp.path(),
        "shrunk",
    );
    s.stop();
}
