//! `snapblk serve --nbd` end to end, with real clients: nbdinfo, nbdcopy, qemu-img, qemu-io.
//! Plain file devices and every golden snapshot case (base.img + snapshot.cow must read back as
//! target.img), writes on writable devices, concurrency, and clean shutdown on SIGTERM.

#[path = "serve_common.rs"]
mod common;
use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// `snapblk serve --base BASE --cow COW EXTRA… --nbd 0`.
fn serve_snapshot(base: &Path, cow: &Path, extra: &[&str]) -> Serve {
    let mut args = vec!["--base", path_str(base), "--cow", path_str(cow)];
    args.extend(extra);
    args.extend(["--nbd", "0"]);
    Serve::start(&args)
}

#[test]
fn plain_file_is_readable_by_every_client() {
    let d = TempDir::new("nbd-plain");
    let (img, data) = write_image(d.path(), "a.img", 6 << 20, 1);
    let s = Serve::start(&[path_str(&img), "--nbd", "0"]);
    assert_eq!(s.ready["export"], "nbd");
    assert_eq!(s.ready["size"], data.len() as u64);
    assert!(
        s.ready_str("address").starts_with("127.0.0.1:"),
        "binds to loopback by default"
    );
    let u = s.ready_str("uri");
    let info = nbd::info(&u);
    assert_eq!(info["exports"][0]["export-size"], data.len() as u64);
    assert_eq!(info["exports"][0]["is_read_only"], false);
    nbd::assert_export_reads(&u, &img, &data, d.path(), "plain file");
    let (st, rest, err) = s.stop();
    assert!(st.success(), "exit {st}: {err}");
    assert_eq!(
        rest.last().map(String::as_str),
        Some(r#"{"event":"stopped","export":"nbd","schema":"snapblk.serve-event.v1"}"#)
    );
}

#[test]
fn writes_are_durable_after_sigterm() {
    let d = TempDir::new("nbd-write");
    let (img, mut expect) = write_image(d.path(), "a.img", 4 << 20, 2);
    let sock = d.join("s.sock");
    let s = Serve::start(&[path_str(&img), "--nbd", &format!("unix:{}", sock.display())]);
    let u = s.ready_str("uri");
    assert!(u.starts_with("nbd+unix://"));
    nbd::qemu_io_ok(&u, &["write -P 0x5a 8192 131072", "write -z 1048576 65536"]);
    nbd::qemu_io_ok(&u, &["read -P 0x5a 8192 131072", "read -P 0 1048576 65536"]);
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert!(!sock.exists(), "unix socket removed on exit");
    expect[8192..8192 + 131072].fill(0x5a);
    expect[1048576..1048576 + 65536].fill(0);
    assert_file_eq(&img, &expect, "image after SIGTERM");
}

#[test]
fn read_only_flag_is_enforced() {
    let d = TempDir::new("nbd-ro");
    let (img, data) = write_image(d.path(), "a.img", 1 << 20, 3);
    let s = Serve::start(&[path_str(&img), "--read-only", "--nbd", "0"]);
    assert_eq!(s.ready["read_only"], true);
    let u = s.ready_str("uri");
    assert_eq!(nbd::info(&u)["exports"][0]["is_read_only"], true);
    let w = nbd::qemu_io(&u, &["write -P 1 0 4096"]);
    let text = String::from_utf8_lossy(&w.stdout).to_string() + &String::from_utf8_lossy(&w.stderr);
    assert!(
        !text.contains("wrote 4096"),
        "write must not succeed: {text}"
    );
    let (st, _, _) = s.stop();
    assert!(st.success());
    assert_file_eq(&img, &data, "read-only image");
}

#[test]
fn every_golden_snapshot_reads_back_as_target() {
    for case in golden::cases() {
        let name = &case.name;
        let d = TempDir::new("nbd-golden");
        // Work on copies: serving must not depend on (or touch) the checked-in files.
        let (base, cow) = case.copy_inputs(d.path());
        let target = case.read("target.img");
        let s = serve_snapshot(&base, &cow, &[]);
        let u = s.ready_str("uri");
        assert_eq!(s.ready["size"], target.len() as u64, "{name}");
        assert_eq!(
            s.ready["read_only"], true,
            "{name}: snapshots are read-only without --writable"
        );
        assert_eq!(
            nbd::info(&u)["exports"][0]["export-size"],
            target.len() as u64,
            "{name}"
        );
        nbd::assert_export_reads(&u, &case.target(), &target, d.path(), name);
        let (st, _, err) = s.stop();
        assert!(st.success(), "{name}: {err}");
        assert_file_eq(&base, &case.read("base.img"), &format!("{name}: base"));
    }
}

#[test]
fn writable_snapshot_writes_read_back_and_persist() {
    let case = golden::case("v3_replace_zstd");
    let d = TempDir::new("nbd-snapw");
    let (base, cow) = case.copy_inputs(d.path());
    let base_before = std::fs::read(&base).unwrap();
    let mut expect = case.read("target.img");
    let s = serve_snapshot(&base, &cow, &["--writable"]);
    assert_eq!(s.ready["read_only"], false);
    let u = s.ready_str("uri");
    // Aligned, unaligned and zeroing writes.
    nbd::qemu_io_ok(
        &u,
        &[
            "write -P 0x11 4096 8192",
            "write -P 0x22 20000 3000",
            "write -z 65536 4096",
            "flush",
        ],
    );
    expect[4096..12288].fill(0x11);
    expect[20000..23000].fill(0x22);
    expect[65536..69632].fill(0);
    let out = d.join("copy.img");
    nbd::copy(&u, path_str(&out));
    assert_file_eq(&out, &expect, "writes did not read back");
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_file_eq(&base, &base_before, "the base must never be written");
    // Served again (read-only): the writes persisted in the snapshot.
    let s = serve_snapshot(&base, &cow, &[]);
    let out2 = d.join("copy2.img");
    nbd::copy(&s.ready_str("uri"), path_str(&out2));
    assert_file_eq(&out2, &expect, "writes lost across restart");
    s.stop();
}

#[test]
fn merge_refuses_to_run_under_a_served_snapshot() {
    // A merge overwrites the base under a server that maps blocks from the old base: its
    // clients would read garbage. Both sides hold the files (flock), so the merge is refused,
    // in one clear line, with nothing written; once the server stops it runs to the end.
    let case = golden::case("v3_replace_zstd");
    let d = TempDir::new("nbd-merge-busy");
    let (base, cow) = case.copy_inputs(d.path());
    let base_before = std::fs::read(&base).unwrap();
    let cow_before = std::fs::read(&cow).unwrap();
    let merge = || {
        std::process::Command::new(bin())
            .args(["merge", path_str(&cow), "--base", path_str(&base)])
            .output()
            .unwrap()
    };
    let s = serve_snapshot(&base, &cow, &[]);
    // A second read-only server of the same files is fine.
    let s2 = serve_snapshot(&base, &cow, &[]);
    let o = merge();
    assert!(!o.status.success(), "merge ran under a server");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
    assert!(err.contains("in use by another process"), "{err}");
    assert_file_eq(&base, &base_before, "a refused merge wrote the base");
    assert_file_eq(&cow, &cow_before, "a refused merge wrote the COW");
    // Clients still read the new image.
    let out = d.join("copy.img");
    nbd::copy(&s.ready_str("uri"), path_str(&out));
    assert_file_eq(
        &out,
        &case.read("target.img"),
        "reads beside a refused merge",
    );
    for s in [s, s2] {
        let (st, _, err) = s.stop();
        assert!(st.success(), "{err}");
    }
    let o = merge();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_file_eq(&base, &case.read("target.img"), "base after the merge");
    // And a writable server keeps a read-only one out (it would miss the overlay's writes).
    std::fs::create_dir(d.join("w")).unwrap();
    let (base, cow) = case.copy_inputs(&d.join("w"));
    let w = serve_snapshot(&base, &cow, &["--writable"]);
    let r = Serve::try_start(&[
        "--base",
        path_str(&base),
        "--cow",
        path_str(&cow),
        "--nbd",
        "0",
    ]);
    assert!(
        matches!(&r, Err(e) if e.contains("in use by another process")),
        "{:?}",
        r.err()
    );
    w.stop();
}

/// A generated snapshot large enough that its merge takes a while: base.img, snapshot.cow, and
/// the new image.
fn big_snapshot(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    use snapblk_snapshot::synth::{SynthSpec, generate};
    let spec = SynthSpec {
        blocks: 16384,
        scratch_size: 2 << 20,
        chain_len: 2048,
        chains: 4,
        random_ordered: 4096,
        replaces: 2048,
        zeros: 16,
        ..SynthSpec::default()
    };
    let case = generate(&spec, 5);
    let (base, cow) = case.write_files(dir, Default::default()).unwrap();
    (base, cow, case.target)
}

#[test]
fn serve_merge_merges_in_place_while_clients_read_the_new_image() {
    let d = TempDir::new("nbd-serve-merge");
    let (base, cow, target) = big_snapshot(d.path());
    let mut s = serve_snapshot(&base, &cow, &["--merge"]);
    assert_eq!(
        s.ready["read_only"], true,
        "a merging snapshot serves read-only"
    );
    let u = s.ready_str("uri");
    // Copies while the merge runs (whichever part of it they overlap) and after it.
    let out = d.join("during.img");
    nbd::copy(&u, path_str(&out));
    assert_file_eq(&out, &target, "read during the merge");
    let (done, before) = s
        .wait_event("merge", std::time::Duration::from_secs(300))
        .unwrap();
    let m = &done["merge"];
    assert_eq!(m["state"], "done", "{done}");
    assert_eq!(m["merged"], m["total"]);
    assert!(m["total"].as_u64().unwrap() > 1000, "{done}");
    for l in &before {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(
            v["event"] == "merge-progress" || v["event"] == "nbd-connection",
            "{l}"
        );
    }
    let out = d.join("after.img");
    nbd::copy(&u, path_str(&out));
    assert_file_eq(&out, &target, "read after the merge");
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    let stopped: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(stopped["event"], "stopped");
    assert_eq!(stopped["merge"]["state"], "done");
    assert_file_eq(&base, &target, "the base holds the new image");
    // A second --merge finds nothing left to do.
    let s = serve_snapshot(&base, &cow, &["--merge"]);
    let (_, rest, _) = s.stop();
    let stopped: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(stopped["merge"]["resumed_at"], stopped["merge"]["total"]);
}

#[test]
fn stopping_a_merging_server_leaves_a_resumable_merge() {
    let d = TempDir::new("nbd-serve-merge-stop");
    let (base, cow, target) = big_snapshot(d.path());
    let mut s = serve_snapshot(&base, &cow, &["--merge"]);
    // Stop once the merge has made durable progress.
    let (p, _) = s
        .wait_event("merge-progress", std::time::Duration::from_secs(120))
        .unwrap();
    assert!(p["merged"].as_u64().unwrap() < p["total"].as_u64().unwrap());
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    let stopped: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    let m = &stopped["merge"];
    assert!(m["state"] == "stopped" || m["state"] == "done", "{stopped}");
    eprintln!("server stopped with merge {m}");
    // Whatever it reached, the files still read as the new image, and `snapblk merge` ends it.
    let check = std::process::Command::new(bin())
        .args(["merge", path_str(&cow), "--base", path_str(&base), "--json"])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(
        v["report"]["resumed_at"], m["merged"],
        "resumed where the server stopped"
    );
    assert_file_eq(&base, &target, "base after resuming");
    // --merge needs a snapshot and is no writable snapshot.
    let run = |args: &[&str]| {
        std::process::Command::new(bin())
            .arg("serve")
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[path_str(&base), "--merge", "--nbd", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("snapshot device only"));
    let o = run(&[
        "--base",
        path_str(&base),
        "--cow",
        path_str(&cow),
        "--merge",
        "--writable",
        "--nbd",
        "0",
    ]);
    assert!(!o.status.success());
}

#[test]
fn sixteen_concurrent_nbdcopy_clients_verify() {
    let case = golden::case("v3_multiblock_lz4_64k");
    let d = TempDir::new("nbd-16");
    let (base, cow) = case.copy_inputs(d.path());
    let target = case.read("target.img");
    let s = serve_snapshot(&base, &cow, &[]);
    let u = s.ready_str("uri");
    let kids: Vec<_> = (0..16)
        .map(|i| {
            let out = d.join(&format!("c{i}.img"));
            let child = std::process::Command::new("nbdcopy")
                .args(["--connections=2", "--requests=8", &u, path_str(&out)])
                .spawn()
                .expect("nbdcopy is required (scripts/install-deps.sh)");
            (child, out)
        })
        .collect();
    for (mut c, out) in kids {
        assert!(c.wait().unwrap().success());
        assert_file_eq(&out, &target, "concurrent nbdcopy");
    }
    let (st, _, _) = s.stop();
    assert!(st.success());
}

#[test]
fn bad_command_lines_fail_with_one_line_errors() {
    let run = |args: &[&str]| {
        std::process::Command::new(bin())
            .arg("serve")
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        !run(&["x.img"]).status.success(),
        "an export kind is required"
    );
    assert!(
        !run(&["x.img", "--nbd", "0", "--fuse", "/tmp"])
            .status
            .success(),
        "only one export kind"
    );
    assert!(
        !run(&["--base", "b", "--nbd", "0"]).status.success(),
        "--base needs --cow"
    );
    let o = run(&["/nonexistent/x.img", "--nbd", "0"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
    assert!(err.starts_with("snapblk: "), "{err}");
}

/// Big-endian NBD constants the raw clients below need.
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_GO: u32 = 7;

/// Connect, read the greeting and send the client flags (fixed newstyle, no zeroes).
fn nbd_greet(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s
}

/// An NBD_OPT_GO option for the default export.
fn opt_go() -> Vec<u8> {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&6u32.to_be_bytes());
    m.extend_from_slice(&[0; 6]); // empty name, no info requests
    m
}

/// A client that finished negotiating (holds a connection slot while it lives).
fn nbd_connected(addr: &str) -> TcpStream {
    let mut s = nbd_greet(addr);
    s.write_all(&opt_go()).unwrap();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let ty = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut d = vec![0u8; len as usize];
        s.read_exact(&mut d).unwrap();
        match ty {
            1 => return s, // ACK
            3 => {}        // INFO
            e => panic!("OPT_GO failed: {e:#x} {}", String::from_utf8_lossy(&d)),
        }
    }
}

/// The `nbd-connection` JSON events among stdout lines.
fn connection_events(lines: &[String]) -> Vec<serde_json::Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "nbd-connection")
        .collect()
}

/// H2: `--nbd-handshake-timeout` is one deadline for the whole negotiation: a client sending
/// one byte every 100 ms is dropped about 0.5 s after connecting; a client over the limit gets
/// an NBD error with the server's message (qemu-img shows it, nbdinfo fails cleanly); every
/// connection is logged on stderr and as a JSON event.
#[test]
fn nbd_negotiation_deadline_refusal_and_connection_log() {
    let d = TempDir::new("nbd-deadline");
    let (img, data) = write_image(d.path(), "a.img", 1 << 20, 7);
    let s = Serve::start(&[
        path_str(&img),
        "--nbd",
        "0",
        "--nbd-handshake-timeout",
        "0.5",
        "--nbd-max-connections",
        "1",
    ]);
    let addr = s.ready_str("address");
    let uri = s.ready_str("uri");

    // A trickling client: every read is answered within 100 ms, the option would take 2.2 s.
    let t0 = Instant::now();
    let mut t = nbd_greet(&addr);
    let trickler = t.local_addr().unwrap().to_string();
    t.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut dropped = false;
    for b in opt_go() {
        let mut r = [0u8; 64];
        let gone = match t.write_all(&[b]).and_then(|()| t.read(&mut r)) {
            Ok(0) => true,
            Ok(n) => panic!("the server answered a trickled option: {:?}", &r[..n]),
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        };
        if gone {
            dropped = true;
            break;
        }
    }
    assert!(
        dropped,
        "a client trickling one byte per 100 ms finished negotiating"
    );
    // Generous upper bound only (10 x the deadline).
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "dropped after {:?}",
        t0.elapsed()
    );

    // Over the limit: a proper refusal.
    let held = nbd_connected(&addr);
    let held_peer = held.local_addr().unwrap().to_string();
    let q = tool("qemu-img", &["info", &uri]);
    assert!(!q.status.success());
    let qerr = String::from_utf8_lossy(&q.stderr);
    assert!(
        qerr.contains("server at its connection limit (1)"),
        "{qerr}"
    );
    let i = tool("nbdinfo", &[&uri]);
    assert!(!i.status.success(), "nbdinfo got in over the limit");
    let ierr = String::from_utf8_lossy(&i.stderr);
    assert!(
        !ierr.contains("panicked") && ierr.contains("opt_go"),
        "{ierr}"
    );
    drop(held);
    // The slot frees: a real client reads the image.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tool("nbdinfo", &[&uri]).status.success() {
        assert!(Instant::now() < deadline, "connection slot never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // One connection: the limit is 1.
    tool_ok(
        "nbdcopy",
        &["--connections=1", &uri, path_str(&d.join("copy.img"))],
    );
    assert_file_eq(&d.join("copy.img"), &data, "read after the refusals");

    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    let ev = connection_events(&rest);
    let find = |action: &str, peer: &str| {
        ev.iter()
            .find(|e| e["action"] == action && e["peer"] == peer)
            .unwrap_or_else(|| panic!("no {action} event for {peer}: {ev:?}"))
            .clone()
    };
    let e = find("dropped", &trickler);
    assert_eq!(
        e["reason"],
        "negotiation not finished within the 0.5 s deadline"
    );
    assert_eq!(
        find("accepted", &held_peer)["reason"],
        serde_json::Value::Null
    );
    assert_eq!(
        find("closed", &held_peer)["reason"],
        "client closed the connection"
    );
    let refused: Vec<_> = ev.iter().filter(|e| e["action"] == "refused").collect();
    assert!(
        refused.len() >= 2,
        "qemu-img and nbdinfo were refused: {ev:?}"
    );
    for e in &refused {
        assert_eq!(e["reason"], "server at its connection limit (1)", "{e}");
        assert!(e["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{e}");
    }
    // The same on stderr, one line each.
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("snapblk: nbd: "))
        .collect();
    assert_eq!(lines.len(), ev.len(), "{err}");
    assert!(
        lines.iter().any(|l| l.contains(&trickler)
            && l.ends_with("dropped: negotiation not finished within the 0.5 s deadline")),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("refused: server at its connection limit (1)")),
        "{err}"
    );
}

/// Runs `snapblk serve ARGS` (it must exit by itself within 30 s; a server that starts instead
/// is killed by pid and fails the test).
fn serve_refused(args: &[&str]) -> (Option<i32>, String) {
    let child = std::process::Command::new(bin())
        .arg("serve")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = output_within(child, Duration::from_secs(30), &format!("serve {args:?}"));
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// D3: `serve --merge --read-only` merged anyway (both files changed). Now it is refused by
/// argument parsing, whichever order the flags come in, and both files stay byte-identical.
#[test]
fn merge_with_read_only_is_refused_and_changes_nothing() {
    let case = golden::case("v3_replace_zstd");
    let d = TempDir::new("nbd-merge-ro");
    let (base, cow) = case.copy_inputs(d.path());
    let base_before = std::fs::read(&base).unwrap();
    let cow_before = std::fs::read(&cow).unwrap();
    let (b, c) = (path_str(&base), path_str(&cow));
    for args in [
        [
            "--base",
            b,
            "--cow",
            c,
            "--merge",
            "--read-only",
            "--nbd",
            "0",
        ],
        [
            "--base",
            b,
            "--cow",
            c,
            "--read-only",
            "--merge",
            "--nbd",
            "0",
        ],
        [
            "--read-only",
            "--base",
            b,
            "--cow",
            c,
            "--merge",
            "--nbd",
            "0",
        ],
    ] {
        let (code, err) = serve_refused(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error: ")
                && first.contains("--merge")
                && first.contains("--read-only"),
            "{args:?}: {err}"
        );
        assert_file_eq(
            &base,
            &base_before,
            "base after a refused --merge --read-only",
        );
        assert_file_eq(&cow, &cow_before, "COW after a refused --merge --read-only");
    }
}

/// Options that contradict each other or would have no effect are refused before anything is
/// opened: clap's usage errors (exit 2, the reason on the first line) for contradictions and
/// out-of-range counts, one `snapblk:` line (exit 1) for an option without its export.
#[test]
fn serve_options_without_effect_or_contradicting_are_refused() {
    let case = golden::case("v3_replace_zstd");
    let d = TempDir::new("nbd-serve-audit");
    let (base, cow) = case.copy_inputs(d.path());
    let base_before = std::fs::read(&base).unwrap();
    let cow_before = std::fs::read(&cow).unwrap();
    let (img, data) = write_image(d.path(), "a.img", 1 << 20, 9);
    let (b, c, i) = (path_str(&base), path_str(&cow), path_str(&img));
    // Never mounted: a server that wrongly started fails on the missing directory instead.
    let nodir = d.join("no-such-dir");
    let fuse = path_str(&nodir);

    // (args, words the error must contain)
    let usage: &[(&[&str], &[&str])] = &[
        (
            &[
                "--base",
                b,
                "--cow",
                c,
                "--writable",
                "--read-only",
                "--nbd",
                "0",
            ],
            &["--writable", "--read-only"],
        ),
        (&[i, "--nbd", "0", "--queues", "0"], &["--queues"]),
        (
            &[i, "--nbd", "0", "--nbd-max-connections", "0"],
            &["--nbd-max-connections"],
        ),
        (
            &[i, "--nbd", "0", "--nbd-handshake-timeout", "0"],
            &["--nbd-handshake-timeout"],
        ),
        (
            &[i, "--nbd", "0", "--nbd-handshake-timeout", "nan"],
            &["--nbd-handshake-timeout"],
        ),
        (
            &[i, "--fuse", fuse, "--fuse-threads", "0"],
            &["--fuse-threads"],
        ),
        (&[i, "--nbd", "0", "--record-secs", "5"], &["--record"]),
    ];
    for (args, words) in usage {
        let (code, err) = serve_refused(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && words.iter().all(|w| err.contains(w)),
            "{args:?}: {err}"
        );
    }
    let one_line: &[(&[&str], &str)] = &[
        (
            &[i, "--nbd", "0", "--fuse-file", "x"],
            "--fuse-file has no effect without --fuse",
        ),
        (
            &[i, "--nbd", "0", "--fuse-threads", "2"],
            "--fuse-threads has no effect without --fuse",
        ),
        (
            &[i, "--nbd", "0", "--fuse-direct-io"],
            "--fuse-direct-io has no effect without --fuse",
        ),
        (
            &[i, "--nbd", "0", "--fuse-allow-other"],
            "--fuse-allow-other has no effect without --fuse",
        ),
        (
            &[i, "--fuse", fuse, "--nbd-name", "x"],
            "--nbd-name has no effect without --nbd",
        ),
        (
            &[i, "--fuse", fuse, "--nbd-max-connections", "2"],
            "--nbd-max-connections has no effect without --nbd",
        ),
        (
            &[i, "--fuse", fuse, "--nbd-handshake-timeout", "1"],
            "--nbd-handshake-timeout has no effect without --nbd",
        ),
        (
            &[i, "--fuse", fuse, "--nbd-no-multi-conn"],
            "--nbd-no-multi-conn has no effect without --nbd",
        ),
        (
            &[i, "--nbd", "0", "--ublk-queues", "1"],
            "--ublk-queues has no effect without --ublk",
        ),
        (
            &[i, "--nbd", "0", "--ublk-depth", "8"],
            "--ublk-depth has no effect without --ublk",
        ),
        (
            &[i, "--nbd", "0", "--ublk-mode", "copy"],
            "--ublk-mode has no effect without --ublk",
        ),
        (
            &[i, "--nbd", "0", "--ublk-max-io-kib", "64"],
            "--ublk-max-io-kib has no effect without --ublk",
        ),
        (
            &[i, "--nbd", "0", "--ublk-id", "3"],
            "--ublk-id has no effect without --ublk",
        ),
        (
            &[i, "--nbd", "0", "--ublk-no-plan"],
            "--ublk-no-plan has no effect without --ublk",
        ),
        (
            &[i, "--ublk", "--ublk-no-plan"],
            "--ublk-no-plan has no effect without --ublk-mode zero-copy",
        ),
    ];
    for (args, msg) in one_line {
        let (code, err) = serve_refused(args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err, format!("snapblk: {msg}\n"), "{args:?}");
    }
    assert_file_eq(&base, &base_before, "base");
    assert_file_eq(&cow, &cow_before, "COW");
    assert_file_eq(&img, &data, "image");
}
