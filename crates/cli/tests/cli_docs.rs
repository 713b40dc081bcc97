//! What the command line says about itself, checked by the tools that read it: completion
//! scripts run by bash and fish and parsed by zsh, man pages rendered by groff, the version
//! line against `git`, and `--help` of every command as a user sees it.

#[path = "cli_common.rs"]
mod cli_common;

use cli_common::ok;
use snapblk_testsupport::{TempDir, path_str};
use std::process::Command;

/// Every command below `snapblk`, as typed.
const COMMANDS: &[&str] = &[
    "cow",
    "cow create",
    "cow inspect",
    "cow verify",
    "cow record",
    "cow apply",
    "info",
    "merge",
    "ota",
    "ota info",
    "ota extract",
    "ota apply",
    "serve",
    "residency",
    "readahead",
    "readahead record",
    "readahead replay",
    "readahead warm",
    "readahead evict",
    "bench",
    "bench file",
    "bench overwrite",
    "bench fgbg",
    "completions",
    "man",
];

fn run(prog: &str, args: &[&str]) -> String {
    let o = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog} (scripts/install-deps.sh installs it): {e}"));
    assert!(
        o.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// The names bash's completion offers after `words` (the last word is being completed).
fn bash_completes(script: &str, words: &[&str]) -> Vec<String> {
    let arr: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let prog = format!(
        "source '{script}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         _snapblk snapblk '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        arr.join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    run("bash", &["-c", &prog])
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completion_offers_every_subcommand() {
    let t = TempDir::new("cli-docs-bash");
    let script = t.path().join("snapblk.bash");
    std::fs::write(&script, ok(&["completions", "bash"])).unwrap();
    let s = path_str(&script);
    for (parent, children) in [
        (
            "",
            vec![
                "cow",
                "info",
                "merge",
                "ota",
                "serve",
                "residency",
                "readahead",
                "bench",
                "completions",
                "man",
            ],
        ),
        (
            "cow",
            vec!["create", "inspect", "verify", "record", "apply"],
        ),
        ("ota", vec!["info", "extract", "apply"]),
        ("readahead", vec!["record", "replay", "warm", "evict"]),
        ("bench", vec!["file", "overwrite", "fgbg"]),
    ] {
        let mut words = vec!["snapblk"];
        words.extend(parent.split_whitespace());
        words.push("");
        let got = bash_completes(s, &words);
        for c in children {
            assert!(
                got.iter().any(|g| g == c),
                "snapblk {parent} <TAB>: {c} missing from {got:?}"
            );
        }
    }
    // Options too: `cow create --ol<TAB>` completes to --old.
    let got = bash_completes(s, &["snapblk", "cow", "create", "--ol"]);
    assert_eq!(got, ["--old"]);
}

#[test]
fn fish_completion_offers_every_subcommand() {
    let t = TempDir::new("cli-docs-fish");
    let script = t.path().join("snapblk.fish");
    std::fs::write(&script, ok(&["completions", "fish"])).unwrap();
    for cmd in COMMANDS {
        let (parent, last) = cmd.rsplit_once(' ').unwrap_or(("", cmd));
        let line = format!("snapblk {parent} ").replace("  ", " ");
        let out = run(
            "fish",
            &[
                "-c",
                &format!("source {}; complete -C '{line}'", path_str(&script)),
            ],
        );
        assert!(
            out.lines().any(|l| l.split('\t').next() == Some(last)),
            "fish: `{line}<TAB>` lacks {last}: {out}"
        );
    }
}

#[test]
fn zsh_completion_parses_and_names_every_subcommand() {
    let t = TempDir::new("cli-docs-zsh");
    let script = t.path().join("_snapblk");
    let text = ok(&["completions", "zsh"]);
    std::fs::write(&script, &text).unwrap();
    run("zsh", &["-n", path_str(&script)]);
    for cmd in COMMANDS {
        let last = cmd.rsplit(' ').next().unwrap();
        assert!(
            text.contains(&format!("'{last}:")),
            "zsh script lacks {cmd}"
        );
    }
}

#[test]
fn a_man_page_per_command_renders_cleanly() {
    let t = TempDir::new("cli-docs-man");
    let dir = t.path().join("man1");
    ok(&["man", path_str(&dir)]);
    let top = std::fs::read_to_string(dir.join("snapblk.1")).unwrap();
    for cmd in COMMANDS {
        let name = format!("snapblk-{}", cmd.replace(' ', "-"));
        let page = dir.join(format!("{name}.1"));
        assert!(page.exists(), "no man page {}", page.display());
        // groff as man runs it (-k: preconv) with all warnings: the roff must be clean, and the page names its command.
        let o = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-z", path_str(&page)])
            .output()
            .expect("groff (scripts/install-deps.sh installs groff-base)");
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let text = run("groff", &["-k", "-man", "-Tutf8", path_str(&page)]);
        assert!(text.contains(&name), "{name}.1 does not name its command");
        assert!(text.contains("Example:"), "{name}.1 has no example");
        if !cmd.contains(' ') {
            let roff_name = name.replace('-', "\\-");
            assert!(
                top.contains(&format!("{roff_name}(1)")),
                "snapblk.1 does not list {name}(1)"
            );
        }
    }
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let v = ok(&["--version"]);
    let head = run(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short=12",
            "HEAD",
        ],
    );
    let want = format!(
        "snapblk {} (commit {})\n",
        env!("CARGO_PKG_VERSION"),
        head.trim()
    );
    assert_eq!(v, want);
}

#[test]
fn every_help_shows_purpose_example_and_quiet() {
    for cmd in COMMANDS {
        let mut args: Vec<&str> = cmd.split(' ').collect();
        args.push("--help");
        let h = ok(&args);
        let first = h.lines().next().unwrap_or("");
        assert!(
            first.len() > 10 && !first.starts_with("Usage") && h.lines().nth(1) == Some(""),
            "{cmd}: purpose line {first:?}"
        );
        let ex = h
            .split("Example:\n  ")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd}: no example:\n{h}"));
        assert!(
            ex.starts_with(&format!("snapblk {cmd}")),
            "{cmd}: example {ex:?}"
        );
        assert!(h.contains("--quiet"), "{cmd}: no --quiet");
    }
}

/// A target named like a `bench` subcommand is reachable as `./NAME` and after `--`, and
/// `bench --help` says so.
#[test]
fn a_target_named_like_a_subcommand_is_not_shadowed() {
    let t = TempDir::new("cli-docs-shadow");
    std::fs::write(t.path().join("file"), vec![0u8; 1 << 20]).unwrap();
    for args in [
        &["bench", "./file", "--runtime", "0.05", "--json"][..],
        &["bench", "--runtime", "0.05", "--json", "--", "file"][..],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_snapblk"))
            .args(args)
            .current_dir(t.path())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            doc["kind"], "workload",
            "{args:?}: ran the workload, not `bench file`"
        );
    }
    assert!(ok(&["bench", "--help"]).contains("`./file`, or goes after `--`"));
}
