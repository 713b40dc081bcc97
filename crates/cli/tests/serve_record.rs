//! `snapblk serve --record` / `--readahead` end to end: the real binary serves a snapshot over
//! NBD (unix socket), qemu-io reads known ranges, SIGTERM stops it, and the recorded list must
//! hold exactly those ranges; a second server replays the list, and the base pages behind the
//! listed ranges (COPY sources and unchanged blocks) must have become resident after eviction.

#[path = "serve_common.rs"]
mod common;
use common::*;

use snapblk_cow::{CowWriter, WriterOptions};
use snapblk_readahead::{BlockFile, Limits, Range, RangeSet, Residency};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BS: u64 = 4096;
const BASE_LEN: u64 = 8 << 20;

/// base.img (8 MiB) and a COW where device blocks 0..64 are COPY ops from base blocks
/// 1024..1088 (4 MiB on), blocks 128..144 are raw REPLACE data, everything else is unchanged.
fn make_snapshot(d: &TempDir, copy_src: u64) -> (PathBuf, PathBuf) {
    let base = d.join("base.img");
    let cow = d.join(&format!("snap-{copy_src}.cow"));
    std::fs::write(&base, pattern(BASE_LEN as usize, 7)).unwrap();
    let f = std::fs::File::create(&cow).unwrap();
    let mut w = CowWriter::new(
        &f,
        WriterOptions {
            op_count_max: BASE_LEN / BS,
            ..WriterOptions::default()
        },
    )
    .unwrap();
    w.add_copy(0, copy_src, 64).unwrap();
    w.add_raw_blocks(128, &pattern(16 * BS as usize, 9))
        .unwrap();
    w.finalize().unwrap();
    (base, cow)
}

fn snap_args<'a>(base: &'a Path, cow: &'a Path) -> Vec<&'a str> {
    vec![
        "--base",
        base.to_str().unwrap(),
        "--cow",
        cow.to_str().unwrap(),
    ]
}

fn uri(s: &Serve) -> String {
    s.ready["uri"].as_str().unwrap().to_owned()
}

fn line(lines: &[String], event: &str) -> serde_json::Value {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == event)
        .unwrap_or_else(|| panic!("no {event:?} line in {lines:?}"))
}

/// Pages of a range that were read since the last [`evict`]: resident, or reclaimed since
/// (shadow entries). This host's proactive reclaim (DAMON pageout) can take a page that the
/// replay read before the test looks; eviction leaves no shadows, so one means "was read".
fn read_pages(path: &Path, off: u64, len: u64) -> u64 {
    let f = snapblk_readahead::open_quiet(path).unwrap();
    let meta = f.metadata().unwrap();
    match snapblk_readahead::measure(&f, path, &meta, Range::new(off, len)) {
        Residency::Known {
            resident_pages,
            evicted_pages,
            ..
        } => resident_pages + evicted_pages,
        r => panic!("residency of {} unknown: {r:?}", path.display()),
    }
}

fn evict(path: &Path) {
    let rep = snapblk_readahead::evict(&[path.to_owned()], &Default::default());
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert_eq!(rep.remaining_pages(), 0, "eviction left pages resident");
}

/// The ranges read, as (device offset, length), and where their data lives in the base.
const READS: &[(u64, u64)] = &[
    (0, 65536),         // COPY: base 4 MiB..
    (4096 * 129, 8192), // REPLACE: COW data, not base
    (1 << 20, 131072),  // unchanged
    (4 << 20, 4096),    // unchanged
];

#[test]
fn record_over_nbd_then_replay_warms_the_base() {
    let d = TempDir::new("serve-record");
    let (base, cow) = make_snapshot(&d, 1024);
    let list = d.join("boot.blocks");
    let sock = d.join("a.sock");
    let mut args = snap_args(&base, &cow);
    let nbd = format!("unix:{}", sock.display());
    args.extend(["--nbd", &nbd, "--record", list.to_str().unwrap()]);
    let s = Serve::start(&args);
    let mut cmds = Vec::new();
    for (o, l) in READS {
        cmds.push("-c".to_owned());
        cmds.push(format!("read {o} {l}"));
    }
    let u = uri(&s);
    let mut qa: Vec<&str> = vec!["-f", "raw", "-r"];
    qa.extend(cmds.iter().map(String::as_str));
    qa.push(&u);
    let out = tool_ok("qemu-io", &qa);
    assert_eq!(out.matches("read ").count(), READS.len(), "{out}");
    assert!(!list.exists(), "the 30 s window is still open");
    let (st, rest, err) = s.stop();
    assert!(st.success(), "exit {st}: {err}");

    // Written at SIGTERM, exactly the ranges read.
    let stopped = line(&rest, "stopped");
    let rec = &stopped["record"];
    assert_eq!(rec["written"], true, "{stopped}");
    assert_eq!(rec["window_ms"], 30_000);
    let want = RangeSet::from_ranges(
        READS
            .iter()
            .map(|&(o, l)| Range::new(o, l).unwrap())
            .collect(),
    );
    let f = BlockFile::parse(
        std::io::BufReader::new(std::fs::File::open(&list).unwrap()),
        Limits::default(),
    )
    .unwrap();
    assert_eq!(f.list.ranges, want);
    assert_eq!(rec["ranges"], READS.len() as u64);
    assert_eq!(rec["bytes"], want.total_bytes());
    assert_eq!(f.get("capacity"), Some(&*BASE_LEN.to_string()));

    // Replay: evict the base, serve with --readahead, no client I/O at all.
    evict(&base);
    let copy_src = (4 << 20, 65536); // base bytes behind device [0, 64K)
    let plain = (1 << 20, 131072);
    let untouched = (6 << 20, 1 << 20);
    for (o, l) in [copy_src, plain, untouched] {
        assert_eq!(read_pages(&base, o, l), 0);
    }
    let sock2 = d.join("b.sock");
    let nbd2 = format!("unix:{}", sock2.display());
    let mut args = snap_args(&base, &cow);
    args.extend(["--nbd", &nbd2, "--readahead", list.to_str().unwrap()]);
    let s = Serve::start(&args);
    let t0 = Instant::now();
    while read_pages(&base, copy_src.0, copy_src.1) < copy_src.1 / 4096
        || read_pages(&base, plain.0, plain.1) < plain.1 / 4096
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "listed base pages not resident after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, rest, err) = s.stop();
    assert!(st.success(), "exit {st}: {err}");
    assert_eq!(
        read_pages(&base, untouched.0, untouched.1),
        0,
        "replay read only the listed ranges"
    );
    let done = line(&rest, "readahead");
    let ra = &done["readahead"];
    assert_eq!(ra["state"], "done", "{done}");
    assert_eq!(ra["ranges"], READS.len() as u64);
    assert_eq!(ra["bytes"], want.total_bytes());
    assert_eq!(ra["errors"], 0);
    assert_eq!(ra["clipped_ranges"], 0);
    let stopped = line(&rest, "stopped");
    assert_eq!(stopped["readahead"], *ra);
    assert!(stopped.get("record").is_none(), "{stopped}");
}

#[test]
fn window_end_writes_the_list_while_serving() {
    let d = TempDir::new("serve-record-win");
    let (base, cow) = make_snapshot(&d, 1024);
    let list = d.join("w.blocks");
    let mut args = snap_args(&base, &cow);
    let sock = d.join("w.sock");
    let nbd = format!("unix:{}", sock.display());
    args.extend([
        "--nbd",
        &nbd,
        "--record",
        list.to_str().unwrap(),
        "--record-secs",
        "1",
    ]);
    let mut s = Serve::start(&args);
    let u = uri(&s);
    tool_ok("qemu-io", &["-f", "raw", "-r", "-c", "read 8192 4096", &u]);
    let t0 = Instant::now();
    while !list.exists() {
        assert!(t0.elapsed() < Duration::from_secs(30), "list not written");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.running_after(Duration::from_millis(10)), "still serving");
    // After the window: not recorded.
    tool_ok("qemu-io", &["-f", "raw", "-r", "-c", "read 65536 4096", &u]);
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    let f = BlockFile::parse(&std::fs::read(&list).unwrap()[..], Limits::default()).unwrap();
    assert_eq!(
        f.list.ranges,
        RangeSet::from_ranges(vec![Range::new(8192, 4096).unwrap()])
    );
    assert_eq!(line(&rest, "stopped")["record"]["reads"], 1);
}

#[test]
fn list_of_another_cow_is_refused_with_a_warning() {
    let d = TempDir::new("serve-record-stale");
    let (base, cow_a) = make_snapshot(&d, 1024);
    let (_, cow_b) = make_snapshot(&d, 1500);
    let list = d.join("a.blocks");
    let sock = d.join("s.sock");
    let nbd = format!("unix:{}", sock.display());
    let mut args = snap_args(&base, &cow_a);
    args.extend(["--nbd", &nbd, "--record", list.to_str().unwrap()]);
    let s = Serve::start(&args);
    tool_ok(
        "qemu-io",
        &["-f", "raw", "-r", "-c", "read 0 4096", &uri(&s)],
    );
    let (st, _, err) = s.stop();
    assert!(st.success(), "{err}");
    let mut args = snap_args(&base, &cow_b);
    args.extend(["--nbd", &nbd, "--readahead", list.to_str().unwrap()]);
    let s = Serve::start(&args);
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    assert!(
        err.contains("not replayed") && err.contains("cow-id"),
        "{err}"
    );
    let ra = &line(&rest, "stopped")["readahead"];
    assert_eq!(ra["state"], "refused");
    assert_eq!(ra["bytes"], 0);
}

#[test]
fn bad_uses_fail_with_one_line_errors() {
    let d = TempDir::new("serve-record-bad");
    let (base, cow) = make_snapshot(&d, 1024);
    let run = |args: &[&str]| {
        let o = std::process::Command::new(bin())
            .arg("serve")
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} should fail");
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
        e
    };
    let l = d.join("x.blocks");
    let e = run(&[
        base.to_str().unwrap(),
        "--nbd",
        "0",
        "--record",
        l.to_str().unwrap(),
    ]);
    assert!(e.contains("snapshot device only"), "{e}");
    let e = run(&[
        "null:size=1M",
        "--nbd",
        "0",
        "--readahead",
        l.to_str().unwrap(),
    ]);
    assert!(e.contains("snapshot device only"), "{e}");
    std::fs::write(&l, "# snapblk-block-list v1\n0:4096\nnot a range\n").unwrap();
    let mut a = snap_args(&base, &cow);
    a.extend(["--nbd", "0", "--readahead", l.to_str().unwrap()]);
    let e = run(&a);
    assert!(e.contains("x.blocks") && e.contains("line 3"), "{e}");
    // The snapshot: spec form is accepted like --base/--cow.
    let spec = format!("snapshot:base={},cow={}", base.display(), cow.display());
    let rec = d.join("spec.blocks");
    let s = Serve::start(&[&spec, "--nbd", "0", "--record", rec.to_str().unwrap()]);
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_eq!(line(&rest, "stopped")["record"]["written"], true);
    assert!(rec.exists());
}

#[test]
fn record_never_replaces_a_file_that_is_not_a_block_list() {
    // `--record base.img` (a typo for a list name) used to replace the base with the list
    // when the server stopped; an existing list is still replaced.
    let d = TempDir::new("serve-record-typo");
    let (base, cow) = make_snapshot(&d, 1024);
    let before = std::fs::read(&base).unwrap();
    let mut a = snap_args(&base, &cow);
    a.extend(["--nbd", "0", "--record", base.to_str().unwrap()]);
    let o = std::process::Command::new(bin())
        .arg("serve")
        .args(&a)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(e.contains("not a block list"), "{e}");
    assert_eq!(std::fs::read(&base).unwrap(), before, "the base changed");
    let l = d.join("old.blocks");
    std::fs::write(&l, "# snapblk-block-list v1\n0:4096\n").unwrap();
    let mut a = snap_args(&base, &cow);
    a.extend(["--nbd", "0", "--record", l.to_str().unwrap()]);
    let s = Serve::start(&a);
    let (st, rest, err) = s.stop();
    assert!(st.success(), "{err}");
    assert_eq!(line(&rest, "stopped")["record"]["written"], true);
    assert!(!std::fs::read_to_string(&l).unwrap().contains("\n0:4096\n"));
}
