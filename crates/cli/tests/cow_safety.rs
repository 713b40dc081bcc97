//! `snapblk cow create|apply|verify|inspect` never destroy a user's data: outputs that are
//! inputs (by inode: hard links, symlinks, /proc/self/fd) are refused, outputs appear
//! atomically, the COW record catches a wrong base and a corrupt COW before anything is
//! written, op bounds are enforced, and write errors on stdout are errors. Each test drives the
//! real binary; the findings they reproduce are rows D1, D2, D6, C2, H1, W1, W2, W3 of the
//! data-safety issue (docs/safety.md maps them).

use snapblk_testsupport::entries;
use snapblk_testsupport::{TempDir, assert_file_eq, path_str};
use std::path::Path;
use std::process::{Command, Stdio};

#[path = "cli_common.rs"]
mod common;
use common::{Case, ok, patch, read, refused, replace_op_offset, snapblk};

#[test]
fn create_refuses_outputs_that_are_its_inputs() {
    let c = Case::new("safety-create-alias", 256, &[]);
    let (old, new) = (read(&c.old), read(&c.new));
    let hard = c.p("hard.img");
    std::fs::hard_link(&c.old, &hard).unwrap();
    let sym = c.p("sym.img");
    std::os::unix::fs::symlink(&c.new, &sym).unwrap();
    let f = std::fs::File::open(&c.old).unwrap();
    let fd = format!(
        "/proc/self/fd/{}",
        std::os::unix::io::AsRawFd::as_raw_fd(&f)
    );
    // /proc/self/fd/N names the test's open file; in the child it is inherited (no CLOEXEC on
    // an fd we dup below), so it is the same inode there too.
    // SAFETY: dup of a valid fd; the result is closed by the OS when the test exits.
    let dup = unsafe { libc::dup(std::os::unix::io::AsRawFd::as_raw_fd(&f)) };
    assert!(dup >= 0);
    let fd_dup = format!("/proc/self/fd/{dup}");
    for (out, names) in [
        (path_str(&c.old), "--old"),
        (path_str(&c.new), "--new"),
        (path_str(&hard), "--old"),
        (path_str(&sym), "--new"),
        (fd_dup.as_str(), "--old"),
    ] {
        let o = path_str(&c.old);
        let n = path_str(&c.new);
        refused(
            &["cow", "create", "--old", o, "--new", n, "-o", out],
            &format!("is the same file as {names}"),
        );
        assert_eq!(read(&c.old), old, "-o {out}: old image changed");
        assert_eq!(read(&c.new), new, "-o {out}: new image changed");
    }
    drop(fd);
}

/// A bind mount of `src` on `at`, unmounted on drop (the tests run as root).
struct Bind(std::path::PathBuf);

impl Bind {
    fn new(src: &Path, at: &Path) -> Bind {
        let st = Command::new("mount")
            .arg("--bind")
            .args([src, at])
            .status()
            .unwrap();
        assert!(st.success(), "mount --bind (the tests run as root)");
        Bind(at.to_owned())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn apply_refuses_outputs_that_are_its_inputs() {
    let c = Case::new("safety-apply-alias", 256, &[]);
    let hard = c.p("hard.img");
    std::fs::hard_link(&c.old, &hard).unwrap();
    let sym = c.p("sym.cow");
    std::os::unix::fs::symlink(&c.cow, &sym).unwrap();
    let before = [read(&c.old), read(&c.cow), read(&c.record())];
    let (cow, base) = (path_str(&c.cow), path_str(&c.old));
    let rec = c.record();
    for (out, what) in [
        (path_str(&c.old), "--base"),
        (path_str(&hard), "--base"),
        (path_str(&c.cow), "the COW"),
        (path_str(&sym), "the COW"),
        (path_str(&rec), "the record"),
    ] {
        refused(
            &["cow", "apply", cow, "--base", base, "-o", out],
            &format!("is the same file as {what}"),
        );
        let after = [read(&c.old), read(&c.cow), read(&c.record())];
        assert!(after == before, "-o {out}: an input changed");
    }
    // The base seen through a bind mount of its directory: another path, the same inode.
    let view = c.p("view");
    std::fs::create_dir(&view).unwrap();
    let bind = Bind::new(c.tmp.path(), &view);
    let through = bind.0.join(c.old.file_name().unwrap());
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            base,
            "-o",
            path_str(&through),
        ],
        "is the same file as --base",
    );
    drop(bind);
    assert!(
        read(&c.old) == before[0],
        "the base changed through a bind mount"
    );
    // Base and COW the same file.
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            cow,
            "-o",
            path_str(&c.p("x")),
        ],
        "are the same file",
    );
}

#[test]
fn failed_apply_leaves_the_previous_output_and_no_partial_file() {
    let c = Case::new("safety-apply-atomic", 256, &[]);
    let out = c.p("out.img");
    std::fs::write(&out, b"previous contents").unwrap();
    let listing = entries(c.tmp.path());
    // A base that is too short: refused before anything is written.
    let short = c.p("short.img");
    std::fs::write(&short, &read(&c.old)[..8 << 12]).unwrap();
    let listing_short = entries(c.tmp.path());
    refused(
        &[
            "cow",
            "apply",
            path_str(&c.cow),
            "--base",
            path_str(&short),
            "-o",
            path_str(&out),
            "--no-record",
        ],
        "too short for this COW",
    );
    assert_eq!(read(&out), b"previous contents");
    assert_eq!(entries(c.tmp.path()), listing_short);
    // A disk that fills up half way: the previous file stays, nothing else appears.
    let mnt = c.p("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tiny", path_str(&mnt)])
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs (the tests run as root)");
    let full_out = mnt.join("out.img");
    std::fs::write(&full_out, b"previous").unwrap();
    let o = snapblk(&[
        "cow",
        "apply",
        path_str(&c.cow),
        "--base",
        path_str(&c.old),
        "-o",
        path_str(&full_out),
    ]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let after = read(&full_out);
    let left = entries(&mnt);
    Command::new("umount").arg(&mnt).status().unwrap();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert_eq!(after, b"previous");
    assert_eq!(left, vec!["out.img".to_owned()]);
    let _ = listing;
}

#[test]
fn killed_create_leaves_the_old_file_or_the_complete_new_one() {
    let c = Case::new("safety-create-kill", 1024, &[]);
    let before = read(&c.cow);
    for delay_ms in [0u64, 20, 60] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_snapblk"))
            .args([
                "cow",
                "create",
                "--old",
                path_str(&c.old),
                "--new",
                path_str(&c.new),
            ])
            .args([
                "-o",
                path_str(&c.cow),
                "--compression",
                "brotli",
                "--threads",
                "1",
            ])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let now = read(&c.cow);
        if now != before {
            // It finished before the kill: the new file must be a complete, valid COW.
            ok(&[
                "cow",
                "verify",
                path_str(&c.cow),
                "--base",
                path_str(&c.old),
                "--expect",
                path_str(&c.new),
                "--no-record",
            ]);
        }
        let stray: Vec<String> = entries(c.tmp.path())
            .into_iter()
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(stray.is_empty(), "temporary files left: {stray:?}");
    }
}

#[test]
fn outputs_that_cannot_be_replaced_atomically_are_refused() {
    let c = Case::new("safety-special-out", 256, &[]);
    let fifo = c.p("fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    refused(
        &[
            "cow",
            "apply",
            path_str(&c.cow),
            "--base",
            path_str(&c.old),
            "-o",
            path_str(&fifo),
        ],
        "is a FIFO",
    );
    refused(
        &[
            "cow",
            "apply",
            path_str(&c.cow),
            "--base",
            path_str(&c.old),
            "-o",
            path_str(c.tmp.path()),
        ],
        "is a directory",
    );
}

#[test]
fn thread_counts_are_bounded() {
    let c = Case::new("safety-threads", 256, &[]);
    let o = snapblk(&[
        "cow",
        "create",
        "--old",
        path_str(&c.old),
        "--new",
        path_str(&c.new),
        "-o",
        path_str(&c.p("t.cow")),
        "--threads",
        "100000",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("100000") && !err.contains("panicked"), "{err}");
    assert!(!c.p("t.cow").exists());
}

#[test]
fn an_op_past_the_image_is_refused_before_any_output() {
    let c = Case::new("safety-h1", 256, &["--compression", "none"]);
    let (rec_off, _) = replace_op_offset(&c.cow);
    // The v3 op's new_block is a u32 at record offset 4: make it ~2^31 blocks (8 TiB).
    patch(&c.cow, rec_off + 7, |b| b ^ 0x80);
    let out = c.p("out.img");
    let (cow, base) = (path_str(&c.cow), path_str(&c.old));
    // The record no longer matches the COW: reported as a stale record, never applied.
    refused(
        &["cow", "apply", cow, "--base", base, "-o", path_str(&out)],
        "record",
    );
    // Without the record the size bound applies.
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            base,
            "-o",
            path_str(&out),
            "--no-record",
        ],
        "past the end of the 1048576-byte new image",
    );
    refused(
        &["cow", "verify", cow, "--base", base, "--no-record"],
        "past the end",
    );
    assert!(!out.exists());
}

#[test]
fn shrinking_and_growing_updates_apply_to_exactly_the_new_size() {
    for blocks in [240usize, 300] {
        let c = Case::new("safety-resize", blocks, &[]);
        let (cow, base) = (path_str(&c.cow), path_str(&c.old));
        let out = c.p("out.img");
        ok(&["cow", "apply", cow, "--base", base, "-o", path_str(&out)]);
        assert_file_eq(&out, &read(&c.new), &format!("{blocks} blocks"));
        ok(&[
            "cow",
            "verify",
            cow,
            "--base",
            base,
            "--expect",
            path_str(&c.new),
        ]);
        // Without the record the size must be given; the default (the base's) is refused or,
        // for a shrink, produces the base-sized image the user asked for.
        let size = (blocks * 4096).to_string();
        let out2 = c.p("out2.img");
        ok(&[
            "cow",
            "apply",
            cow,
            "--base",
            base,
            "-o",
            path_str(&out2),
            "--no-record",
            "--size",
            &size,
        ]);
        assert_file_eq(&out2, &read(&c.new), &format!("{blocks} blocks, --size"));
        if blocks > 256 {
            refused(
                &[
                    "cow",
                    "apply",
                    cow,
                    "--base",
                    base,
                    "-o",
                    path_str(&out2),
                    "--no-record",
                ],
                "give its size with --size",
            );
        }
        // --size contradicting the record is refused.
        refused(
            &[
                "cow",
                "apply",
                cow,
                "--base",
                base,
                "-o",
                path_str(&out2),
                "--size",
                "4096",
            ],
            "contradicts the record",
        );
    }
}

#[test]
fn the_record_refuses_a_wrong_base_before_writing() {
    let c = Case::new("safety-wrong-base", 256, &[]);
    let cow = path_str(&c.cow);
    let out = c.p("out.img");
    // The already-updated image as base (an update applied twice) and an unrelated file of the
    // same size.
    let other = c.p("other.img");
    std::fs::write(&other, snapblk_testsupport::pattern(256 * 4096, 5)).unwrap();
    for base in [&c.new, &other] {
        let err = refused(
            &[
                "cow",
                "apply",
                cow,
                "--base",
                path_str(base),
                "-o",
                path_str(&out),
            ],
            "is not the image this COW was made for",
        );
        assert!(err.contains("blocks it reads differ"), "{err}");
        assert!(!out.exists());
        refused(
            &["cow", "verify", cow, "--base", path_str(base)],
            "is not the image this COW was made for",
        );
    }
    // A base of another size.
    let big = c.p("big.img");
    let mut d = read(&c.old);
    d.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&big, d).unwrap();
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            path_str(&big),
            "-o",
            path_str(&out),
        ],
        "this COW was made for a base of 1048576 bytes",
    );
    // An unchanged block outside what the COW reads differs: only the whole-image SHA-256
    // sees it, and verify checks it.
    let mut d = read(&c.old);
    let last = d.len() - 1;
    d[last] ^= 1;
    let near = c.p("near.img");
    std::fs::write(&near, d).unwrap();
    refused(
        &["cow", "verify", cow, "--base", path_str(&near)],
        "SHA-256",
    );
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            path_str(&near),
            "-o",
            path_str(&out),
        ],
        "SHA-256",
    );
    assert!(!out.exists());
}

#[test]
fn the_record_catches_corrupt_payloads_that_still_decode() {
    let c = Case::new("safety-w1", 256, &["--compression", "none"]);
    let (_, payload) = replace_op_offset(&c.cow);
    patch(&c.cow, payload + 100, |b| b ^ 0x01);
    let (cow, base) = (path_str(&c.cow), path_str(&c.old));
    let out = c.p("out.img");
    refused(
        &["cow", "apply", cow, "--base", base, "-o", path_str(&out)],
        "the COW is corrupt",
    );
    assert!(!out.exists(), "no output for a corrupt COW");
    let o = snapblk(&["cow", "verify", cow, "--base", base, "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON verdict");
    assert_eq!(j["ok"], false);
    assert_eq!(j["schema"], "snapblk.cow-verify.v1");
    assert_eq!(
        j["check"]["corrupt_blocks"].as_array().unwrap().len(),
        1,
        "{j}"
    );
    // Without a record the corruption cannot be seen: verify says so, not just "OK".
    let s = ok(&["cow", "verify", cow, "--base", base, "--no-record"]);
    assert!(s.contains("NOT verified"), "{s}");
}

#[test]
fn a_damaged_or_foreign_record_is_named_as_such() {
    let c = Case::new("safety-record", 256, &[]);
    let (cow, base) = (path_str(&c.cow), path_str(&c.old));
    // Another COW's record.
    let c2 = Case::new("safety-record-2", 300, &[]);
    std::fs::copy(c2.record(), c.record()).unwrap();
    refused(
        &["cow", "verify", cow, "--base", base],
        "does not describe this COW",
    );
    // A damaged one.
    let mut d = read(&c2.record());
    d[40] ^= 4;
    std::fs::write(c.record(), d).unwrap();
    let err = refused(&["cow", "verify", cow, "--base", base], "record is damaged");
    assert!(!err.contains("invalid COW"), "{err}");
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            base,
            "-o",
            path_str(&c.p("o.img")),
        ],
        "record is damaged",
    );
    // --no-record goes on, with one warning.
    let o = snapblk(&["cow", "verify", cow, "--base", base, "--no-record"]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("cannot be verified").count(), 1, "{err}");
}

#[test]
fn whole_image_digests_match_sha256sum() {
    let c = Case::new("safety-sha", 256, &[]);
    let sum = |p: &Path| {
        let o = Command::new("sha256sum").arg(p).output().unwrap();
        String::from_utf8(o.stdout).unwrap()[..64].to_owned()
    };
    let j: serde_json::Value =
        serde_json::from_str(&ok(&["cow", "inspect", "--json", path_str(&c.cow)])).unwrap();
    assert_eq!(j["record"]["base_sha256"], sum(&c.old));
    assert_eq!(j["record"]["target_sha256"], sum(&c.new));
    let (cow, base) = (path_str(&c.cow), path_str(&c.old));
    let out = c.p("out.img");
    let (bsum, nsum) = (sum(&c.old), sum(&c.new));
    ok(&[
        "cow",
        "apply",
        cow,
        "--base",
        base,
        "-o",
        path_str(&out),
        "--no-record",
        "--base-sha256",
        &bsum,
        "--expect-sha256",
        &nsum,
    ]);
    refused(
        &[
            "cow",
            "apply",
            cow,
            "--base",
            base,
            "-o",
            path_str(&c.p("x.img")),
            "--no-record",
            "--base-sha256",
            &nsum,
        ],
        "not the --base-sha256 given",
    );
    refused(
        &[
            "cow",
            "verify",
            cow,
            "--base",
            base,
            "--no-record",
            "--expect-sha256",
            &bsum,
        ],
        "the result has SHA-256",
    );
}

#[test]
fn json_to_a_full_stdout_is_an_error() {
    let c = Case::new("safety-w3", 256, &[]);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    for args in [
        vec!["cow", "inspect", "--json", path_str(&c.cow)],
        vec![
            "cow",
            "verify",
            path_str(&c.cow),
            "--base",
            path_str(&c.old),
        ],
        vec![
            "cow",
            "verify",
            "--json",
            path_str(&c.cow),
            "--base",
            path_str(&c.old),
        ],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_snapblk"))
            .args(&args)
            .stdout(full.try_clone().unwrap())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} exited 0 on a full stdout");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn cow_record_seals_a_cow_made_by_android_tools() {
    let tmp = TempDir::new("safety-golden-record");
    let case = snapblk_testsupport::golden::case("v2_xor_seq_lz4");
    let cow = tmp.join("g.cow");
    std::fs::copy(case.cow(), &cow).unwrap();
    let (base, target) = (case.base(), case.target());
    // A record is only written for images the COW really turns one into the other.
    refused(
        &[
            "cow",
            "record",
            path_str(&cow),
            "--old",
            path_str(&target),
            "--new",
            path_str(&target),
        ],
        "does not turn",
    );
    assert!(!tmp.join("g.cow.snapblk").exists());
    ok(&[
        "cow",
        "record",
        path_str(&cow),
        "--old",
        path_str(&base),
        "--new",
        path_str(&target),
    ]);
    let s = ok(&["cow", "verify", path_str(&cow), "--base", path_str(&base)]);
    assert!(s.contains("base matches the record"), "{s}");
    refused(
        &["cow", "verify", path_str(&cow), "--base", path_str(&target)],
        "is not the image this COW was made for",
    );
    let out = tmp.join("out.img");
    ok(&[
        "cow",
        "apply",
        path_str(&cow),
        "--base",
        path_str(&base),
        "-o",
        path_str(&out),
    ]);
    assert_file_eq(&out, &read(&target), "golden apply with a record");
}

#[test]
fn json_commands_print_a_verdict_when_they_fail() {
    let c = Case::new("safety-json-fail", 256, &[]);
    let junk = c.p("junk.cow");
    std::fs::write(&junk, b"not a cow").unwrap();
    let missing = c.p("missing.img");
    for args in [
        vec!["cow", "inspect", "--json", path_str(&junk)],
        vec![
            "cow",
            "create",
            "--json",
            "--old",
            path_str(&c.old),
            "--new",
            path_str(&missing),
            "-o",
            path_str(&c.p("x.cow")),
        ],
        vec![
            "cow",
            "verify",
            "--json",
            path_str(&c.cow),
            "--base",
            path_str(&missing),
        ],
    ] {
        let o = snapblk(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let j: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON ({e})"));
        assert_eq!(j["ok"], false, "{args:?}: {j}");
        assert!(j["error"].as_str().is_some_and(|e| !e.is_empty()), "{j}");
    }
}

#[test]
fn a_new_cow_never_sits_beside_an_old_record() {
    let c = Case::new("safety-stale-record", 256, &[]);
    let (old, new, cow) = (path_str(&c.old), path_str(&c.new), path_str(&c.cow));
    // Another new image with the same blocks changed, different contents.
    let mut other = read(&c.new);
    other[150 * 4096 + 100] ^= 0x55;
    let other_p = c.p("other.img");
    std::fs::write(&other_p, &other).unwrap();
    ok(&[
        "cow",
        "create",
        "--old",
        old,
        "--new",
        path_str(&other_p),
        "-o",
        cow,
        "--no-record",
    ]);
    assert!(
        !c.record().exists(),
        "the old record is removed with --no-record"
    );
    let out = c.p("o.img");
    ok(&[
        "cow",
        "apply",
        cow,
        "--base",
        old,
        "-o",
        path_str(&out),
        "--no-record",
    ]);
    assert_file_eq(&out, &other, "the new COW");
    // A record of another COW with the same block sets is stale by its ops digest.
    ok(&[
        "cow",
        "create",
        "--old",
        old,
        "--new",
        new,
        "-o",
        path_str(&c.p("a.cow")),
    ]);
    ok(&[
        "cow",
        "create",
        "--old",
        old,
        "--new",
        path_str(&other_p),
        "-o",
        path_str(&c.p("b.cow")),
    ]);
    std::fs::copy(c.p("a.cow.snapblk"), c.p("b.cow.snapblk")).unwrap();
    refused(
        &["cow", "verify", path_str(&c.p("b.cow")), "--base", old],
        "does not describe this COW",
    );
}

/// A --level outside its algorithm's range (which the encoders would silently clamp) is
/// refused with one line naming the range, and no COW appears; the ends of each range and
/// zstd's negative levels are accepted.
#[test]
fn create_refuses_levels_out_of_range() {
    let c = Case::new("safety-create-level", 16, &[]);
    let out = c.p("l.cow");
    let args = |algo: &'static str, level: &'static str| {
        let mut v = vec!["cow", "create", "--old", path_str(&c.old), "--new"];
        v.extend([path_str(&c.new), "-o", path_str(&out)]);
        v.extend(["--compression", algo, "--level", level]);
        v
    };
    for (algo, level, range) in [
        ("zstd", "23", "zstd levels are -131072 to 22"),
        ("zstd", "-200000", "zstd levels are -131072 to 22"),
        ("gz", "10", "gz levels are 0 to 9"),
        ("brotli", "-1", "brotli levels are 0 to 11"),
    ] {
        let err = refused(&args(algo, level), range);
        assert_eq!(err.lines().count(), 1, "{err}");
        let what = format!("--level: {algo} level {level} is out of range");
        assert!(err.contains(&what), "{err}");
        assert!(!out.exists(), "{algo} {level}");
    }
    for (algo, level) in [
        ("zstd", "22"),
        ("zstd", "-5"),
        ("gz", "0"),
        ("brotli", "11"),
    ] {
        ok(&args(algo, level));
        std::fs::remove_file(&out).unwrap();
    }
}

/// An empty new image (`--new /dev/null`, a truncated file) is refused in one line and no COW
/// appears: it used to give a COW of a 0-byte device.
#[test]
fn create_refuses_an_empty_new_image() {
    let c = Case::new("safety-create-empty", 16, &[]);
    let out = c.p("e.cow");
    let empty = c.p("empty.img");
    std::fs::write(&empty, b"").unwrap();
    for new in ["/dev/null", path_str(&empty)] {
        let args = [
            "cow",
            "create",
            "--old",
            path_str(&c.old),
            "--new",
            new,
            "-o",
            path_str(&out),
        ];
        let err = refused(&args, "is empty");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!("--new {new} is empty")), "{err}");
        assert!(!out.exists(), "{new}");
    }
}
