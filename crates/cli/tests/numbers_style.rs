//! One style of numbers in text output: sizes human-readable in binary units (`2.02 MiB`,
//! `512 B`), with the exact count only in parentheses after one (`(2119708 bytes)`); `--json`
//! keeps exact integers (checked against the schemas in json_schemas.rs).

#[path = "cli_common.rs"]
mod cli_common;

use cli_common::{Case, ok};
use snapblk_testsupport::path_str;

/// The places in `text` where a count of bytes is printed bare ("1234 bytes" not in
/// parentheses after a human-readable size).
fn bare_byte_counts(text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let next = words.get(i + 1).copied().unwrap_or("");
            let is_count = w
                .trim_start_matches('(')
                .chars()
                .all(|c| c.is_ascii_digit())
                && !w.is_empty();
            if is_count
                && next.trim_end_matches([')', ',', ';', ':']) == "bytes"
                && !w.starts_with('(')
            {
                bad.push(line.to_owned());
            }
        }
    }
    bad
}

/// Whether `text` has a human-readable size (`1.50 KiB`, `512 B`).
fn has_human_size(text: &str) -> bool {
    let words: Vec<&str> = text.split_whitespace().collect();
    words.windows(2).any(|w| {
        w[0].trim_start_matches('(').parse::<f64>().is_ok()
            && ["B", "KiB", "MiB", "GiB", "TiB"].contains(&w[1].trim_end_matches([')', ',', ';']))
    })
}

#[test]
fn text_reports_print_human_sizes() {
    let c = Case::new("numbers", 512, &[]);
    let (old, new) = (path_str(&c.old), path_str(&c.new));
    let cow = c.p("n.cow");
    let base = c.file_copy(&c.old, "base.img");
    let len = std::fs::metadata(&c.new).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(len)
        .unwrap();
    let b = path_str(&base);
    let pay = c.p("pay.bin");
    let src = c.p("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::copy(&c.old, src.join("system.img")).unwrap();
    let outputs = [
        ok(&[
            "cow",
            "create",
            "--old",
            old,
            "--new",
            new,
            "-o",
            path_str(&cow),
        ]),
        ok(&["cow", "inspect", path_str(&cow)]),
        ok(&[
            "cow",
            "verify",
            path_str(&cow),
            "--base",
            old,
            "--expect",
            new,
        ]),
        ok(&["merge", path_str(&cow), "--base", b, "--check"]),
        ok(&["merge", path_str(&cow), "--base", b]),
        ok(&["info", b]),
        ok(&["info", "null:size=1G"]),
        ok(&[
            "cow",
            "apply",
            path_str(&cow),
            "--base",
            old,
            "-o",
            path_str(&c.p("applied.img")),
        ]),
        ok(&[
            "ota",
            "generate",
            "--source",
            old,
            "--target",
            new,
            "--partition",
            "system",
            "-o",
            path_str(&pay),
        ]),
        ok(&[
            "ota",
            "cow",
            path_str(&pay),
            "--source",
            path_str(&src),
            "-o",
            path_str(&c.p("cows")),
            "--all-partitions",
        ]),
        ok(&[
            "ota",
            "apply",
            path_str(&pay),
            "--source",
            path_str(&src),
            "-o",
            path_str(&c.p("applied")),
        ]),
    ];
    for (i, out) in outputs.iter().enumerate() {
        // cow verify's report counts blocks and payloads only.
        assert!(
            i == 2 || has_human_size(out),
            "no human-readable size in:\n{out}"
        );
        assert!(
            bare_byte_counts(out).is_empty(),
            "bare byte counts: {:?}",
            bare_byte_counts(out)
        );
    }
    assert!(outputs[0].contains(&format!(
        "MiB ({} bytes)",
        std::fs::metadata(&cow).unwrap().len()
    )));
    assert!(
        outputs[5].lines().any(|l| l
            .split_whitespace()
            .eq(["capacity", "2.00", "MiB", "(2097152", "bytes)"])),
        "{}",
        outputs[5]
    );
}

#[test]
fn the_checker_finds_bare_counts() {
    assert_eq!(
        bare_byte_counts("u.cow: 4408042 bytes; 16 blocks"),
        ["u.cow: 4408042 bytes; 16 blocks"]
    );
    assert!(bare_byte_counts("u.cow: 4.20 MiB (4408042 bytes); 16 blocks").is_empty());
    assert!(has_human_size("base (272.00 KiB)") && !has_human_size("16 blocks"));
}

#[path = "serve_common.rs"]
mod serve_common;

#[test]
fn ctl_text_prints_human_sizes() {
    let c = Case::new("numbers-ctl", 512, &[]);
    let sock = c.p("c.sock");
    let (img, s) = (path_str(&c.new), path_str(&sock));
    let srv = serve_common::Serve::start(&[img, "--nbd", "0", "--control", s]);
    serve_common::tool_ok("nbdcopy", &[&srv.ready_str("uri"), "null:"]);
    let status = ok(&["ctl", s, "status"]);
    let stats = ok(&["ctl", s, "stats"]);
    let (st, _, err) = srv.stop();
    assert!(st.success(), "{err}");
    assert!(
        status.starts_with("nbd export, 2.00 MiB (2097152 bytes), up "),
        "{status}"
    );
    // nbdcopy read the image (its data extents): a human size and an average rate.
    let read = stats.lines().next().unwrap();
    assert!(
        read.starts_with("read: ") && has_human_size(read) && read.contains("B/s average)"),
        "{stats}"
    );
    for out in [&status, &stats] {
        assert!(has_human_size(out), "no human-readable size in:\n{out}");
        assert!(bare_byte_counts(out).is_empty(), "{out}");
    }
}
