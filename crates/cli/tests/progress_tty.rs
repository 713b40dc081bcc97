//! Progress bars: drawn on a terminal (a pseudo-terminal from util-linux `script`), with bytes,
//! rate and time left; absent when stderr is a pipe and with `--quiet`; `merge --progress`
//! draws even with `--quiet`.

#[path = "cli_common.rs"]
mod cli_common;

use cli_common::{Case, snapblk};
use snapblk_testsupport::path_str;
use std::process::Command;

/// Runs `snapblk ARGS` with stdin, stdout and stderr on a pseudo-terminal; returns everything
/// the terminal received.
fn on_tty(args: &[&str]) -> String {
    let mut line = String::from(env!("CARGO_BIN_EXE_snapblk"));
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let o = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect("script (util-linux)");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{line}: {text}");
    text
}

/// A byte bar's frame as `progress::BYTES` draws it: LABEL [...] DONE/TOTAL RATE eta T.
fn has_byte_bar(text: &str, label: &str) -> bool {
    text.lines().flat_map(|l| l.split('\r')).any(|l| {
        l.contains(label) && l.contains("iB/s") && l.contains(" eta ") && l.contains("iB/")
    })
}

/// A copy of the old image grown to the new image's size, to merge into.
fn base_copy(c: &Case, name: &str) -> std::path::PathBuf {
    let p = c.file_copy(&c.old, name);
    let len = std::fs::metadata(&c.new).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len)
        .unwrap();
    p
}

#[test]
fn long_commands_draw_byte_bars_on_a_terminal_only() {
    let c = Case::new("progress-tty", 2048, &[]);
    let (old, new) = (path_str(&c.old), path_str(&c.new));

    let cow2 = c.p("2.cow");
    let t = on_tty(&[
        "cow",
        "create",
        "--old",
        old,
        "--new",
        new,
        "-o",
        path_str(&cow2),
    ]);
    assert!(has_byte_bar(&t, "diffing"), "cow create: {t:?}");

    let out = c.p("applied.img");
    let t = on_tty(&[
        "cow",
        "apply",
        path_str(&c.cow),
        "--base",
        old,
        "-o",
        path_str(&out),
    ]);
    assert!(has_byte_bar(&t, "applying"), "cow apply: {t:?}");

    let base = base_copy(&c, "base.img");
    let t = on_tty(&[
        "merge",
        path_str(&c.cow_copy("m.cow")),
        "--base",
        path_str(&base),
    ]);
    assert!(has_byte_bar(&t, "merge"), "merge: {t:?}");
    assert_eq!(
        std::fs::read(&base).unwrap(),
        std::fs::read(&c.new).unwrap()
    );

    // A pipe gets the summary only.
    let base = base_copy(&c, "base-pipe.img");
    let o = snapblk(&[
        "merge",
        path_str(&c.cow_copy("p.cow")),
        "--base",
        path_str(&base),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("eta"), "{err}");
}

#[test]
fn quiet_hides_bars_and_merge_progress_forces_one() {
    let c = Case::new("progress-quiet", 2048, &[]);
    let old = path_str(&c.old);
    let out = c.p("applied.img");
    let t = on_tty(&[
        "cow",
        "apply",
        path_str(&c.cow),
        "--base",
        old,
        "-o",
        path_str(&out),
        "--quiet",
    ]);
    assert!(!t.contains("eta"), "cow apply --quiet: {t:?}");

    let base = base_copy(&c, "base.img");
    let t = on_tty(&[
        "--quiet",
        "merge",
        path_str(&c.cow_copy("q.cow")),
        "--base",
        path_str(&base),
    ]);
    assert!(!t.contains("eta"), "merge --quiet: {t:?}");
    assert!(t.contains("merged"), "the summary stays: {t:?}");

    let base = base_copy(&c, "base2.img");
    let cow = c.cow_copy("f.cow");
    let t = on_tty(&[
        "merge",
        path_str(&cow),
        "--base",
        path_str(&base),
        "--quiet",
        "--progress",
    ]);
    assert!(has_byte_bar(&t, "merge"), "merge --quiet --progress: {t:?}");
}

#[test]
fn readahead_replay_warm_and_record_show_progress_on_a_terminal() {
    let c = Case::new("progress-ra", 16, &[]);
    let tree = c.p("tree");
    std::fs::create_dir(&tree).unwrap();
    let big = tree.join("big");
    std::fs::write(&big, vec![7u8; 8 << 20]).unwrap();
    std::fs::copy(&c.old, tree.join("small")).unwrap();
    let list = c.p("l.list");
    // Classic lines: a range, and a whole file.
    let text = format!(
        "{} 0:4194304\n{}\n",
        big.display(),
        tree.join("small").display()
    );
    std::fs::write(&list, text).unwrap();
    let t = on_tty(&["readahead", "replay", path_str(&list)]);
    assert!(has_byte_bar(&t, "replay"), "replay: {t:?}");
    assert!(
        t.contains("/5.00 MiB"),
        "replay counts the listed bytes: {t:?}"
    );
    let t = on_tty(&["readahead", "replay", path_str(&list), "--quiet"]);
    assert!(!t.contains("eta"), "replay --quiet: {t:?}");

    let t = on_tty(&["readahead", "warm", "-r", path_str(&tree)]);
    // Counting files (the last count may fall between two frames).
    assert!(t.contains("warm ") && t.contains(" files "), "warm: {t:?}");

    let out = c.p("r.list");
    let t = on_tty(&[
        "readahead",
        "record",
        "-o",
        path_str(&out),
        "--scope",
        path_str(&tree),
        "--duration",
        "0.3",
    ]);
    assert!(t.contains("recording"), "record --duration: {t:?}");
    // With a command: the scans before and after it are drawn, not over the command's output.
    let t = on_tty(&[
        "readahead",
        "record",
        "-o",
        path_str(&out),
        "--scope",
        path_str(&tree),
        "--",
        "sh",
        "-c",
        "echo the-command-ran",
    ]);
    assert!(
        t.contains("scanning what is cached before")
            && t.contains("scanning what was read during the window")
            && t.contains("the-command-ran"),
        "record -- CMD: {t:?}"
    );
    // Piped: the summary only.
    let o = snapblk(&["readahead", "replay", path_str(&list)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("eta"), "{err}");
}

#[test]
fn ota_extract_and_apply_draw_byte_bars() {
    let c = Case::new("progress-ota", 16, &[]);
    let d = c.p("ota");
    std::fs::create_dir(&d).unwrap();
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota");
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        let st = Command::new("tar")
            .args(["-xf", path_str(&data.join(a)), "-C", path_str(&d)])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let old = d.join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::copy(d.join("disk_ext2_4k_empty.img"), old.join("kernel.img")).unwrap();
    std::fs::copy(d.join("disk_sqfs_empty.img"), old.join("root.img")).unwrap();
    let full = d.join("full_payload.bin");
    let t = on_tty(&["ota", "extract", path_str(&full), "-o", path_str(&c.p("x"))]);
    assert!(
        t.contains("iB/s") && t.contains(" eta "),
        "ota extract: {t:?}"
    );
    let delta = d.join("delta_payload.bin");
    let (o, z) = (path_str(&old), c.p("z"));
    let t = on_tty(&[
        "ota",
        "apply",
        path_str(&delta),
        "--source",
        o,
        "-o",
        path_str(&z),
    ]);
    assert!(has_byte_bar(&t, "check old"), "ota apply: {t:?}");
    assert!(has_byte_bar(&t, "apply"), "ota apply: {t:?}");
    let t = on_tty(&[
        "ota",
        "extract",
        path_str(&full),
        "-o",
        path_str(&c.p("q")),
        "--quiet",
    ]);
    assert!(!t.contains(" eta "), "ota extract --quiet: {t:?}");
}
