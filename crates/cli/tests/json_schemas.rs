//! Every `--json` document validates against the JSON Schema it names in its `schema` field
//! (`schemas/<schema>.json` in the repository), checked by the `jsonschema` crate, an
//! independent validator; failures documents (`ok: false`) included.

#[path = "cli_common.rs"]
mod cli_common;

use cli_common::{Case, snapblk};
use serde_json::Value;
use snapblk_testsupport::path_str;
use std::path::PathBuf;

fn schemas_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
}

/// Validates `doc` against the schema it names, which must be `want`.
fn check(doc: &Value, want: &str, what: &str) {
    let name = doc["schema"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no schema field: {doc}"));
    assert_eq!(name, want, "{what}");
    let path = schemas_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let schema: Value = serde_json::from_str(&text).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name}: {e}"));
    let errs: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path))
        .collect();
    assert!(
        errs.is_empty(),
        "{what} breaks {name}:\n{}\n{doc:#}",
        errs.join("\n")
    );
}

/// Runs `snapblk ARGS`, requires exit status `code`, and parses its stdout as one JSON document.
fn json_of(args: &[&str], code: i32) -> Value {
    let o = snapblk(args);
    assert_eq!(
        o.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

#[test]
fn every_schema_is_valid_and_named_by_its_file() {
    let mut n = 0;
    for e in std::fs::read_dir(schemas_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let file = p.file_name().unwrap().to_str().unwrap().to_owned();
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            schema["$id"]
                .as_str()
                .unwrap()
                .ends_with(&format!("/{file}")),
            "{file}: $id"
        );
        let version = file.strip_suffix(".json").unwrap();
        assert!(
            version.starts_with("snapblk.") && version.rsplit('.').next().unwrap().starts_with('v'),
            "{file}"
        );
        assert!(
            text_mentions(&schema, version),
            "{file}: its schema const is not {version}"
        );
        n += 1;
    }
    assert!(n >= 7, "{n} schemas");
}

/// Whether `schema` pins a `schema` property to `name` somewhere.
fn text_mentions(schema: &Value, name: &str) -> bool {
    schema
        .to_string()
        .contains(&format!("{{\"const\":\"{name}\"}}"))
}

#[test]
fn cow_documents_validate() {
    let c = Case::new("json-cow", 256, &[]);
    let (old, new, cow) = (path_str(&c.old), path_str(&c.new), path_str(&c.cow));
    let out = c.p("2.cow");
    let doc = json_of(
        &[
            "cow",
            "create",
            "--old",
            old,
            "--new",
            new,
            "-o",
            path_str(&out),
            "--json",
        ],
        0,
    );
    check(&doc, "snapblk.cow-create.v1", "cow create");
    let doc = json_of(
        &[
            "cow",
            "create",
            "--old",
            old,
            "--new",
            path_str(&c.p("none")),
            "-o",
            path_str(&c.p("3.cow")),
            "--json",
        ],
        1,
    );
    check(&doc, "snapblk.cow-create.v1", "cow create (failed)");

    check(
        &json_of(&["cow", "inspect", cow, "--json"], 0),
        "snapblk.cow-inspect.v1",
        "cow inspect",
    );
    check(
        &json_of(&["cow", "inspect", cow, "--json", "--ops"], 0),
        "snapblk.cow-inspect.v1",
        "cow inspect --ops",
    );
    check(
        &json_of(&["cow", "inspect", new, "--json"], 1),
        "snapblk.cow-inspect.v1",
        "cow inspect (not a COW)",
    );
    let v2 = c.p("v2.cow");
    json_of(
        &[
            "cow",
            "create",
            "--old",
            old,
            "--new",
            new,
            "-o",
            path_str(&v2),
            "--format",
            "v2",
            "--json",
        ],
        0,
    );
    check(
        &json_of(&["cow", "inspect", path_str(&v2), "--json", "--ops"], 0),
        "snapblk.cow-inspect.v1",
        "cow inspect v2",
    );

    let doc = json_of(
        &[
            "cow", "verify", cow, "--base", old, "--expect", new, "--json",
        ],
        0,
    );
    check(&doc, "snapblk.cow-verify.v1", "cow verify");
    let doc = json_of(&["cow", "verify", cow, "--base", new, "--json"], 1);
    check(&doc, "snapblk.cow-verify.v1", "cow verify (wrong base)");

    let apply = |base: &str, out: &str, code| {
        json_of(
            &["cow", "apply", cow, "--base", base, "-o", out, "--json"],
            code,
        )
    };
    let doc = apply(old, path_str(&c.p("a.img")), 0);
    check(&doc, "snapblk.cow-apply.v1", "cow apply");
    assert_eq!(doc["record"], format!("{cow}.snapblk"));
    let doc = apply(new, path_str(&c.p("b.img")), 1);
    check(&doc, "snapblk.cow-apply.v1", "cow apply (wrong base)");
    let doc = apply(path_str(&c.p("none")), path_str(&c.p("c.img")), 1);
    check(&doc, "snapblk.cow-apply.v1", "cow apply (no base)");
    assert!(
        doc["error"].as_str().unwrap().contains("No such file"),
        "{doc}"
    );
}

#[test]
fn merge_documents_validate() {
    let c = Case::new("json-merge", 256, &[]);
    let base = c.file_copy(&c.old, "base.img");
    let len = std::fs::metadata(&c.new).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(len)
        .unwrap();
    let (cow, b) = (path_str(&c.cow), path_str(&base));
    check(
        &json_of(&["merge", cow, "--base", b, "--check", "--json"], 0),
        "snapblk.merge-check.v1",
        "merge --check",
    );
    check(
        &json_of(
            &[
                "merge",
                cow,
                "--base",
                path_str(&c.new),
                "--check",
                "--json",
            ],
            1,
        ),
        "snapblk.merge-check.v1",
        "merge --check (refused)",
    );
    check(
        &json_of(&["merge", cow, "--base", b, "--status", "--json"], 0),
        "snapblk.merge-status.v1",
        "merge --status",
    );
    check(
        &json_of(&["merge", cow, "--base", b, "--json", "--stats"], 0),
        "snapblk.merge.v1",
        "merge",
    );
    assert_eq!(
        std::fs::read(&base).unwrap(),
        std::fs::read(&c.new).unwrap()
    );
    check(
        &json_of(&["merge", cow, "--base", b, "--status", "--json"], 0),
        "snapblk.merge-status.v1",
        "merge --status (done)",
    );
    // A failing merge or status still prints its document: ok false and the error.
    let wrong = path_str(&c.old);
    let missing = c.p("missing.cow");
    for (args, schema) in [
        (
            vec!["merge", cow, "--base", wrong, "--json"],
            "snapblk.merge.v1",
        ),
        (
            vec![
                "merge",
                path_str(&missing),
                "--base",
                b,
                "--status",
                "--json",
            ],
            "snapblk.merge-status.v1",
        ),
    ] {
        let doc = json_of(&args, 1);
        check(&doc, schema, &format!("{args:?} (failed)"));
        assert_eq!(doc["ok"], false, "{doc}");
        assert!(!doc["error"].as_str().unwrap().is_empty(), "{doc}");
    }
    // merge --check's verdict for a refusal before the check (the COW given as --base too).
    let doc = json_of(&["merge", cow, "--base", cow, "--check", "--json"], 1);
    check(
        &doc,
        "snapblk.merge-check.v1",
        "merge --check (refused early)",
    );
    assert_eq!(doc["mergeable"], false, "{doc}");
}

#[test]
fn info_documents_validate() {
    let c = Case::new("json-info", 16, &[]);
    check(
        &json_of(&["info", path_str(&c.old), "--json"], 0),
        "snapblk.info.v1",
        "info FILE",
    );
    check(
        &json_of(&["info", "null:size=1G", "--json"], 0),
        "snapblk.info.v1",
        "info null",
    );
    // Documents from before `ok` and `error` existed still validate.
    let mut old = json_of(&["info", "null:size=1G", "--json"], 0);
    let m = old.as_object_mut().unwrap();
    assert_eq!(
        (m.remove("ok"), m.remove("error")),
        (Some(true.into()), Some(Value::Null))
    );
    check(&old, "snapblk.info.v1", "info null, without ok and error");
    let doc = json_of(&["info", "nosuchdriver:x=1", "--json"], 1);
    check(&doc, "snapblk.info.v1", "info (failed)");
    assert_eq!(doc["ok"], false, "{doc}");
}

#[test]
fn readahead_documents_validate() {
    let c = Case::new("json-readahead", 64, &[]);
    let tree = c.p("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::copy(&c.old, tree.join("a")).unwrap();
    std::fs::copy(&c.new, tree.join("sub/b")).unwrap();
    let t = path_str(&tree);
    let doc = json_of(&["residency", "-r", t, "--json"], 0);
    assert_eq!(doc["files"].as_array().unwrap().len(), 2);
    check(&doc, "snapblk.residency.v1", "residency");
    check(
        &json_of(&["residency", "-r", t, "--summary", "--json"], 0),
        "snapblk.residency.v1",
        "residency --summary",
    );
    // A missing path: an error in the document, still valid.
    let missing = c.p("missing");
    check(
        &json_of(&["residency", "-r", path_str(&missing), t, "--json"], 1),
        "snapblk.residency.v1",
        "residency (missing path)",
    );

    check(
        &json_of(&["readahead", "evict", "-r", t, "--json"], 0),
        "snapblk.evict.v1",
        "evict",
    );
    let list = c.p("boot.list");
    let doc = json_of(
        &[
            "readahead",
            "record",
            "-o",
            path_str(&list),
            "--scope",
            t,
            "--json",
            "--",
            "cat",
            path_str(&tree.join("a")),
        ],
        0,
    );
    check(&doc, "snapblk.record.v1", "record");
    assert_eq!(doc["exit_status"], 0);
    check(
        &json_of(
            &[
                "readahead",
                "record",
                "-o",
                path_str(&c.p("w.list")),
                "--scope",
                t,
                "--duration",
                "0.1",
                "--json",
            ],
            0,
        ),
        "snapblk.record.v1",
        "record --duration",
    );
    json_of(&["readahead", "evict", "-r", t, "--json"], 0);
    check(
        &json_of(&["readahead", "replay", path_str(&list), "--json"], 0),
        "snapblk.replay.v1",
        "replay",
    );
    check(
        &json_of(
            &[
                "readahead",
                "replay",
                path_str(&list),
                "--json",
                "--diskstats",
            ],
            0,
        ),
        "snapblk.replay.v1",
        "replay --diskstats",
    );
    check(
        &json_of(&["readahead", "warm", "-r", t, "--json"], 0),
        "snapblk.replay.v1",
        "warm",
    );
}

#[path = "serve_common.rs"]
mod serve_common;

/// Every line `serve --json` printed (the readiness line and the rest) validates.
fn check_serve_lines(ready: &Value, rest: &[String], what: &str) -> Vec<Value> {
    let mut all = vec![ready.clone()];
    for l in rest {
        all.push(serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {l:?}: {e}")));
    }
    for v in &all {
        check(
            v,
            "snapblk.serve-event.v1",
            &format!("{what}: {}", v["event"]),
        );
    }
    all
}

#[test]
fn serve_events_validate() {
    use serde_json::json;
    use std::time::Duration;
    let c = Case::new("json-serve", 256, &[]);
    let base = c.file_copy(&c.old, "base.img");
    let len = std::fs::metadata(&c.new).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(len)
        .unwrap();
    let (b, cow) = (path_str(&base), path_str(&c.cow));
    let list = c.p("served.list");
    let sock = format!("unix:{}", c.p("a.sock").display());

    // Recording, and a client whose connection is logged.
    let s = serve_common::Serve::start(&[
        "--base",
        b,
        "--cow",
        cow,
        "--nbd",
        &sock,
        "--record",
        path_str(&list),
    ]);
    serve_common::tool_ok("nbdinfo", &[&s.ready_str("uri")]);
    let ready = s.ready.clone();
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    let all = check_serve_lines(&ready, &rest, "serve --record");
    assert!(
        all.iter().any(|v| v["event"] == "nbd-connection"),
        "{all:?}"
    );
    assert!(
        all.iter()
            .any(|v| v["event"] == "stopped" && v["record"].is_object()),
        "{all:?}"
    );

    // The replay of that list.
    let mut s = serve_common::Serve::start(&[
        "--base",
        b,
        "--cow",
        cow,
        "--nbd",
        &sock,
        "--readahead",
        path_str(&list),
    ]);
    let ready = s.ready.clone();
    let (ra, before) = s.wait_event("readahead", Duration::from_secs(60)).unwrap();
    let (st, mut rest, err) = s.stop();
    assert!(st.success(), "{err}");
    rest.splice(0..0, before.into_iter().chain([ra.to_string()]));
    check_serve_lines(&ready, &rest, "serve --readahead");

    // A merge to its end.
    let mut s = serve_common::Serve::start(&["--base", b, "--cow", cow, "--nbd", &sock, "--merge"]);
    let ready = s.ready.clone();
    let (merge, before) = s.wait_event("merge", Duration::from_secs(60)).unwrap();
    assert_eq!(merge["merge"]["state"], json!("done"), "{merge}");
    let (st, mut rest, err) = s.stop();
    assert!(st.success(), "{err}");
    rest.splice(0..0, before.into_iter().chain([merge.to_string()]));
    let all = check_serve_lines(&ready, &rest, "serve --merge");
    assert!(
        all.iter()
            .any(|v| v["event"] == "stopped" && v["merge"].is_object()),
        "{all:?}"
    );
}

#[test]
fn ota_documents_validate() {
    let c = Case::new("json-ota", 16, &[]);
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota");
    let d = c.p("ota");
    std::fs::create_dir(&d).unwrap();
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        serve_common::tool_ok("tar", &["-xf", path_str(&data.join(a)), "-C", path_str(&d)]);
    }
    let old = d.join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::copy(d.join("disk_ext2_4k_empty.img"), old.join("kernel.img")).unwrap();
    std::fs::copy(d.join("disk_sqfs_empty.img"), old.join("root.img")).unwrap();
    let (full, delta) = (d.join("full_payload.bin"), d.join("delta_payload.bin"));
    for p in [&full, &delta] {
        check(
            &json_of(&["ota", "info", path_str(p), "--json"], 0),
            "snapblk.ota-info.v1",
            "ota info",
        );
    }
    check(
        &json_of(&["ota", "info", path_str(&c.old), "--json"], 1),
        "snapblk.ota-info.v1",
        "ota info (not an OTA)",
    );
    let out = c.p("x");
    check(
        &json_of(
            &[
                "ota",
                "extract",
                path_str(&full),
                "-o",
                path_str(&out),
                "--json",
            ],
            0,
        ),
        "snapblk.ota-extract.v1",
        "ota extract",
    );
    check(
        &json_of(
            &[
                "ota",
                "extract",
                path_str(&delta),
                "-o",
                path_str(&c.p("y")),
                "--json",
            ],
            1,
        ),
        "snapblk.ota-extract.v1",
        "ota extract (incremental)",
    );
    let z = c.p("z");
    let args = [
        "ota",
        "apply",
        path_str(&delta),
        "--source",
        path_str(&old),
        "-o",
        path_str(&z),
        "--json",
    ];
    check(&json_of(&args, 0), "snapblk.ota-apply.v1", "ota apply");

    // A payload of our own (the old and new images as partition "system"), and its COW.
    let pay = c.p("pay.bin");
    let generate = |target: &std::path::Path, code| {
        let args = [
            "ota",
            "generate",
            "--source",
            path_str(&c.old),
            "--target",
            path_str(target),
            "--partition",
            "system",
            "-o",
            path_str(&pay),
            "--json",
        ];
        json_of(&args, code)
    };
    let doc = generate(&c.new, 0);
    check(&doc, "snapblk.ota-generate.v1", "ota generate");
    check(
        &generate(&c.p("none.img"), 1),
        "snapblk.ota-generate.v1",
        "ota generate (no target)",
    );
    let src = c.p("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::copy(&c.old, src.join("system.img")).unwrap();
    let cow = |src: &std::path::Path, out: &str, code| {
        let args = [
            "ota",
            "cow",
            path_str(&pay),
            "--source",
            path_str(src),
            "-o",
            out,
            "--all-partitions",
            "--verify",
            "--json",
        ];
        json_of(&args, code)
    };
    let doc = cow(&src, path_str(&c.p("cows")), 0);
    check(&doc, "snapblk.ota-cow.v1", "ota cow");
    assert_eq!(doc["partitions"][0]["partition"], "system", "{doc}");
    check(
        &cow(&c.p("none"), path_str(&c.p("cows2")), 1),
        "snapblk.ota-cow.v1",
        "ota cow (no source)",
    );
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    cmd.args(["ota", "serve", path_str(&pay), "--source", path_str(&src)])
        .args(["--work", path_str(&c.p("work")), "--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut cmd).unwrap();
    let ready = srv.ready.clone();
    let (st, rest, err) = srv.stop();
    assert!(st.success(), "{err}");
    assert_eq!(ready["partitions"][0]["name"], "system", "{ready}");
    for l in std::iter::once(ready).chain(rest.iter().map(|l| serde_json::from_str(l).unwrap())) {
        check(&l, "snapblk.ota-serve-event.v1", "ota serve");
    }
    // With --merge: the `merge` line of each partition and the `stopped` line's counters.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    cmd.args(["ota", "serve", path_str(&pay), "--source", path_str(&src)])
        .args([
            "--work",
            path_str(&c.p("work-m")),
            "--merge",
            "--nbd",
            "0",
            "--json",
        ]);
    let mut srv = snapblk_testsupport::ReadyProcess::spawn(&mut cmd).unwrap();
    check(
        &srv.ready,
        "snapblk.ota-serve-event.v1",
        "ota serve --merge",
    );
    let (merge, _) = srv
        .wait_event("merge", std::time::Duration::from_secs(120))
        .unwrap();
    check(&merge, "snapblk.ota-serve-event.v1", "ota serve --merge");
    let (st, rest, err) = srv.stop();
    assert!(st.success(), "{err}");
    let stopped: Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert!(stopped["merges"]["system"].is_object(), "{stopped}");
    check(&stopped, "snapblk.ota-serve-event.v1", "ota serve --merge");
}

/// `snapblk ctl SOCK CMD --json`: its exit status and its one-line document.
fn ctl_doc(sock: &std::path::Path, cmd: &str) -> (i32, Value) {
    let o = snapblk(&["ctl", path_str(sock), cmd, "--json"]);
    let doc = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "ctl {cmd}: stdout is not one JSON document ({e}): {} {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    check(&doc, "snapblk.ctl.v1", &format!("ctl {cmd}"));
    assert_eq!(doc["cmd"], cmd);
    let code = o.status.code().unwrap();
    assert_eq!(code == 0, doc["ok"] == true, "ctl {cmd}: {doc}");
    (code, doc)
}

#[test]
fn control_replies_and_ready_lines_validate() {
    use std::time::Duration;
    let c = Case::new("json-ctl", 256, &[]);
    let base = c.file_copy(&c.old, "base.img");
    let len = std::fs::metadata(&c.new).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(len)
        .unwrap();
    let sock = c.p("ctl.sock");
    let mut s = serve_common::Serve::start(&[
        "--base",
        path_str(&base),
        "--cow",
        path_str(&c.cow),
        "--nbd",
        "0",
        "--merge",
        "--merge-wait",
        "--control",
        path_str(&sock),
        "--metrics",
        "0",
    ]);
    let ready = s.ready.clone();
    assert!(
        ready["metrics"].is_string() && ready["control"].is_string(),
        "{ready}"
    );
    // Held by --merge-wait: paused, not started.
    let (_, st) = ctl_doc(&sock, "status");
    assert_eq!(st["merge"]["state"], "paused", "{st}");
    assert_eq!(st["merge"]["started"], false, "{st}");
    let (_, stats) = ctl_doc(&sock, "stats");
    assert!(
        stats["sched"].is_object() && stats["cache"].is_object(),
        "{stats}"
    );
    assert_eq!(ctl_doc(&sock, "merge-resume").0, 1, "resume before start");
    assert_eq!(ctl_doc(&sock, "merge-start").0, 0);
    // The merge of this small COW may end before the pause: both replies validate.
    let (_, paused) = ctl_doc(&sock, "merge-pause");
    let (resumed, _) = ctl_doc(&sock, "merge-resume");
    if paused["merge"]["state"] == "paused" {
        assert_eq!(resumed, 0, "a resume follows a pause that worked: {paused}");
    }
    let (done, before) = s.wait_event("merge", Duration::from_secs(120)).unwrap();
    assert_eq!(done["merge"]["state"], "done", "{done}");
    assert_eq!(done["merge"]["started"], true, "{done}");
    let (_, st) = ctl_doc(&sock, "status");
    assert_eq!(st["merge"]["state"], "done", "{st}");
    let (st, mut rest, err) = s.stop();
    assert!(st.success(), "{err}");
    rest.splice(0..0, before.into_iter().chain([done.to_string()]));
    check_serve_lines(&ready, &rest, "serve --control --merge-wait");

    // Without a snapshot device: no merge, sched or cache, and merge requests are refused.
    let sock = c.p("plain.sock");
    let s =
        serve_common::Serve::start(&[path_str(&c.new), "--nbd", "0", "--control", path_str(&sock)]);
    let (_, st) = ctl_doc(&sock, "status");
    assert!(st["merge"].is_null(), "{st}");
    let (_, stats) = ctl_doc(&sock, "stats");
    assert!(
        stats["sched"].is_null() && stats["merge"].is_null(),
        "{stats}"
    );
    for cmd in ["merge-start", "merge-pause", "merge-resume"] {
        assert_eq!(ctl_doc(&sock, cmd).0, 1, "{cmd} without a merge");
    }
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
}
