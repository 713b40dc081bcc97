//! End-to-end tests of `snapblk residency` and `snapblk readahead` on real file trees on disk
//! (not tmpfs: tmpfs pages cannot be evicted). Residency is cross-checked with util-linux
//! `fincore` and `vmtouch` (independent mincore users), run as root where mincore is truthful.

use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_snapblk");
const PAGE: u64 = 4096;
/// Set in the environment of this test binary when it is re-executed as the reading command.
const READER_ENV: &str = "SNAPBLK_RA_TEST_READER";
/// For the reader: ranges (same syntax) to hand to reclaim once everything is read, as memory
/// pressure would during a recording.
const READER_PAGEOUT_ENV: &str = "SNAPBLK_RA_TEST_READER_PAGEOUT";

fn scratch(name: &str) -> PathBuf {
    let d =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ra-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&d)
        .output()
        .unwrap();
    let fs = String::from_utf8_lossy(&fs.stdout).trim().to_string();
    assert!(
        fs != "tmpfs" && fs != "ramfs",
        "{} is on {fs}; these tests need a disk filesystem",
        d.display()
    );
    d
}

fn write_file(p: &Path, len: u64, seed: u8) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    std::fs::write(p, data).unwrap();
}

fn run(args: &[&str]) -> Output {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "snapblk {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    o
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

/// Runs `cmd`, which must succeed.
fn ok(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\n{}",
        text(&o.stderr),
        text(&o.stdout)
    );
    o
}

/// `snapblk readahead record -o LIST --scope SCOPE`, for more options and `-- CMD...`.
fn record_cmd(list: &Path, scope: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.args(["readahead", "record", "-o"])
        .arg(list)
        .arg("--scope")
        .arg(scope);
    c
}

/// Records into `list` what `cat FILES` reads from an evicted `scope`; the list's entries.
fn record_cat(list: &Path, scope: &Path, files: &[&Path]) -> Vec<snapblk_readahead::ListEntry> {
    ok(record_cmd(list, scope)
        .args(["--evict-first", "--", "cat"])
        .args(files));
    list_entries(list)
}

/// `snapblk readahead replay LIST --json EXTRA...`, which must succeed: the report.
fn replay_json(list: &Path, extra: &[&str]) -> Value {
    let list = list.to_str().unwrap();
    json(&run(
        &[&["readahead", "replay", list, "--json"], extra].concat()
    ))
}

/// A file `name` of `len` bytes in `d` and a list naming it (`d/list`).
fn file_and_list(d: &Path, name: &str, len: u64, seed: u8) -> (PathBuf, PathBuf) {
    let (f, list) = (d.join(name), d.join("list"));
    write_file(&f, len, seed);
    std::fs::write(&list, format!("{}\n", f.display())).unwrap();
    (f, list)
}

fn evict(paths: &[&Path]) {
    let mut a = vec!["readahead", "evict", "-r"];
    a.extend(paths.iter().map(|p| p.to_str().unwrap()));
    let v = json(&run(&[a, vec!["--json"]].concat()));
    assert_eq!(v["remaining_pages"], 0, "eviction left pages resident: {v}");
    assert_eq!(v["unknown_files"], 0, "eviction could not be checked: {v}");
    // The reclaim-aware checks below count shadow entries as "was read": none may be left
    // from before. DONTNEED drops them on this kernel; older ones keep them.
    let roots: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
    let opts = snapblk_readahead::WalkOptions {
        recursive: true,
        ..Default::default()
    };
    let errors = snapblk_readahead::walk(&roots, &opts, |f| {
        let p = f.path();
        assert_eq!(reclaimed_pages(p, 0, 0), 0, "{} kept shadows", p.display());
    });
    assert!(errors.is_empty(), "{errors:?}");
}

/// Pages of `[off, off+len)` (`len` 0: to the end) that were cached and then reclaimed:
/// shadow entries, which cachestat counts and mincore cannot see. This host runs proactive
/// reclaim (DAMON pageout) that can take a just-read page between a replay's own verification
/// and the test's independent check; after [`evict`] (which leaves no shadows) such a page
/// means "was read, then reclaimed", never "was not read".
fn reclaimed_pages(p: &Path, off: u64, len: u64) -> u64 {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(p).unwrap();
    snapblk_readahead::cachestat(f.as_fd(), off, len)
        .unwrap()
        .evicted
}

/// Bytes of a whole file read since the last [`evict`], by fincore (mincore) plus the pages
/// reclaimed since (see [`reclaimed_pages`]); page granular. The two counts are taken one after
/// the other, so a page reclaimed between them is counted by both: a sum above the file's pages
/// can only be that race, and is measured again.
fn read_bytes(p: &Path) -> u64 {
    let pages = p.metadata().unwrap().len().div_ceil(PAGE);
    recount(pages, || fincore_bytes(p) / PAGE + reclaimed_pages(p, 0, 0)) * PAGE
}

/// Pages of a range read since the last [`evict`]: vmtouch plus reclaimed (as [`read_bytes`]).
fn read_pages(p: &Path, off: u64, len: u64) -> u64 {
    recount(len.div_ceil(PAGE), || {
        vmtouch_pages(p, off, len) + reclaimed_pages(p, off, len)
    })
}

/// `count()`, taken again (up to 5 times) while it exceeds `most`, which only a page reclaimed
/// between its two measurements can cause.
fn recount(most: u64, count: impl Fn() -> u64) -> u64 {
    let mut n = count();
    for _ in 0..4 {
        if n <= most {
            break;
        }
        n = count();
    }
    n
}

/// Resident bytes of a whole file according to util-linux fincore (mincore based).
fn fincore_bytes(p: &Path) -> u64 {
    let o = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "-o", "RES"])
        .arg(p)
        .output()
        .expect("fincore (util-linux) is required");
    assert!(
        o.status.success(),
        "fincore failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// Resident pages in a byte range according to vmtouch -p (mincore based).
fn vmtouch_pages(p: &Path, off: u64, len: u64) -> u64 {
    let o = Command::new("vmtouch")
        .arg("-p")
        .arg(format!("{}-{}", off, off + len))
        .arg(p)
        .output()
        .expect("vmtouch is required (scripts/install-deps.sh)");
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s
        .lines()
        .find(|l| l.contains("Resident Pages"))
        .unwrap_or_else(|| panic!("vmtouch output: {s}"));
    line.split_whitespace()
        .nth(2)
        .and_then(|f| f.split('/').next())
        .unwrap()
        .parse()
        .unwrap()
}

/// The reading command for the record test: re-executes this test binary, which then reads the
/// given ranges with readahead disabled (POSIX_FADV_RANDOM), so exactly those pages are read.
fn reader_command() -> Vec<String> {
    vec![
        std::env::current_exe().unwrap().display().to_string(),
        "--exact".into(),
        "reader_helper".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
    .into_iter()
    .collect()
}

/// spec: `path@off:len,off:len;path@...`
fn parse_spec(spec: &str) -> Vec<(PathBuf, Vec<(u64, u64)>)> {
    spec.split(';')
        .filter(|s| !s.is_empty())
        .map(|f| {
            let (p, r) = f.split_once('@').unwrap();
            let r = r
                .split(',')
                .map(|t| {
                    let (o, l) = t.split_once(':').unwrap();
                    (o.parse().unwrap(), l.parse().unwrap())
                })
                .collect();
            (PathBuf::from(p), r)
        })
        .collect()
}

#[test]
fn reader_helper() {
    // Reader mode when re-executed by the record test; otherwise check the spec parser.
    let spec = std::env::var(READER_ENV).ok();
    let Some(spec) = spec else {
        assert_eq!(
            parse_spec("/a@0:1,8:2;/b@3:4"),
            vec![
                (PathBuf::from("/a"), vec![(0, 1), (8, 2)]),
                (PathBuf::from("/b"), vec![(3, 4)])
            ]
        );
        return;
    };
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileExt;
    // Stay on one CPU: the pages read wait in that CPU's LRU batch until drained, and
    // MADV_PAGEOUT drains only the local CPU's, so a reader that migrated between reading and
    // pageout would find them unreclaimable (seen with refaulted pages).
    // SAFETY: a zeroed cpu_set_t with one CPU set, passed by pointer with its size.
    unsafe {
        let cpu = libc::sched_getcpu();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu.max(0) as usize, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
    for (p, ranges) in parse_spec(&spec) {
        let f = std::fs::File::open(&p).unwrap();
        snapblk_readahead::fadvise(f.as_fd(), 0, 0, libc_fadv_random()).unwrap();
        for (o, l) in ranges {
            let mut buf = vec![0u8; l as usize];
            f.read_exact_at(&mut buf, o).unwrap();
        }
    }
    let pageout = std::env::var(READER_PAGEOUT_ENV).unwrap_or_default();
    for (p, ranges) in parse_spec(&pageout) {
        let f = std::fs::File::open(&p).unwrap();
        for (o, l) in ranges {
            snapblk_readahead::pageout(f.as_fd(), o, l).unwrap();
            assert_eq!(
                reclaimed_pages(&p, o, l),
                l.div_ceil(PAGE),
                "{}: pageout {o}:{l} left pages cached",
                p.display()
            );
        }
    }
}

fn libc_fadv_random() -> i32 {
    1 // POSIX_FADV_RANDOM on Linux
}

fn list_entries(p: &Path) -> Vec<snapblk_readahead::ListEntry> {
    snapblk_readahead::parse_bytes(&std::fs::read(p).unwrap(), Default::default()).unwrap()
}

fn ranges_of(e: &snapblk_readahead::ListEntry) -> Vec<(u64, u64)> {
    match &e.extent {
        snapblk_readahead::Extent::Ranges(r) => {
            r.ranges().iter().map(|r| (r.offset, r.len)).collect()
        }
        snapblk_readahead::Extent::Whole => panic!("whole-file entry"),
    }
}

#[test]
fn record_of_known_reads_yields_exactly_those_ranges() {
    let d = scratch("record");
    let (a, b, c) = (d.join("a.bin"), d.join("b.bin"), d.join("untouched.bin"));
    write_file(&a, (1 << 20) + 123, 1);
    write_file(&b, 256 << 10, 2);
    write_file(&c, 64 << 10, 3);
    let spec = format!(
        "{}@0:4096,40960:8192,1048576:123;{}@65536:4096,70000:100",
        a.display(),
        b.display()
    );
    // Some of the pages read are reclaimed before the window ends, as memory pressure would:
    // the recording still lists them (from their shadow entries) and says so.
    let reclaim = format!("{}@40960:8192,1048576:123", a.display());
    let list = d.join("list.txt");
    let rec = json(&ok(record_cmd(&list, &d)
        .args(["--evict-first", "--json", "--"])
        .args(reader_command())
        .env(READER_ENV, &spec)
        .env(READER_PAGEOUT_ENV, &reclaim)));
    assert!(
        rec["reclaimed_bytes"].as_u64().unwrap() >= 8192 + 123,
        "{rec}"
    );
    let text = std::fs::read_to_string(&list).unwrap();
    assert!(text.starts_with("# snapblk-readahead-list v1"), "{text}");
    let v = list_entries(&list);
    assert_eq!(v.len(), 2, "expected exactly a and b in the list:\n{text}");
    assert_eq!(v[0].path, a);
    // Ranges are page granular and clipped to the file size.
    assert_eq!(
        ranges_of(&v[0]),
        vec![(0, PAGE), (10 * PAGE, 2 * PAGE), (1 << 20, 123)]
    );
    assert_eq!(v[1].path, b);
    assert_eq!(ranges_of(&v[1]), vec![(16 * PAGE, 2 * PAGE)]);
    let id = v[0].identity.expect("identity recorded");
    assert_eq!(id.size, (1 << 20) + 123);

    // A whole-file read (cat) records the whole file, in JSON Lines when asked.
    let jl = d.join("list.jsonl");
    let v = record_cat(&jl, &d, &[&b]);
    let first = std::fs::read_to_string(&jl).unwrap();
    assert!(first.starts_with('{'), "{first}");
    assert_eq!(v.len(), 1, "{first}");
    assert_eq!(ranges_of(&v[0]), vec![(0, 256 << 10)]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The residency diff's blind spot, closed by `--trace`: pages that were already shadow
/// entries before the window, read in it and reclaimed again before its end look untouched to
/// the diff. The trace of page-cache insertions lists them. (Root with tracefs, like the
/// suite; a missing tracefs fails here.)
#[test]
fn trace_lists_pages_read_and_reclaimed_where_shadows_already_were() {
    let d = scratch("trace");
    for trace in [false, true] {
        // Fresh files each round: pages that went through this cycle once do not reliably
        // go to reclaim again at once (the test needs MADV_PAGEOUT to take them).
        let (a, b) = (
            d.join(format!("a-{trace}.bin")),
            d.join(format!("b-{trace}.bin")),
        );
        write_file(&a, 256 << 10, 4);
        write_file(&b, 64 << 10, 5);
        let read = format!(
            "{}@40960:8192,131072:4096;{}@0:4096",
            a.display(),
            b.display()
        );
        let reclaim = format!("{}@40960:8192", a.display());
        evict(&[&d]);
        // Before the window: the pages are read and reclaimed once, leaving shadows.
        let rc = reader_command();
        ok(Command::new(&rc[0])
            .args(&rc[1..])
            .env(READER_ENV, format!("{}@40960:8192", a.display()))
            .env(READER_PAGEOUT_ENV, &reclaim));
        assert_eq!(reclaimed_pages(&a, 40960, 8192), 2);
        // In the window: read again (with another page and file) and reclaimed again.
        let list = d.join(format!("list-{trace}.txt"));
        let mut c = record_cmd(&list, &d);
        if trace {
            c.arg("--trace");
        }
        let rec = json(&ok(c
            .args(["--json", "--"])
            .args(reader_command())
            .env(READER_ENV, &read)
            .env(READER_PAGEOUT_ENV, &reclaim)));
        let v = list_entries(&list);
        let ranges = |p: &Path| v.iter().find(|e| e.path == p).map(ranges_of);
        assert_eq!(ranges(&b), Some(vec![(0, PAGE)]), "{v:?}");
        if trace {
            assert_eq!(
                ranges(&a),
                Some(vec![(10 * PAGE, 2 * PAGE), (32 * PAGE, PAGE)])
            );
            assert_eq!(rec["trace"]["traced_only_bytes"], 2 * PAGE, "{rec}");
            assert!(rec["trace"]["events"].as_u64().unwrap() >= 4, "{rec}");
            assert_eq!(rec["trace"]["lost_events"], 0, "{rec}");
            assert_eq!(rec["trace"]["untraceable_files"], 0, "{rec}");
        } else {
            // The blind spot this test is about (if it ever disappears, so can this part).
            assert_eq!(ranges(&a), Some(vec![(32 * PAGE, PAGE)]));
            assert!(rec["trace"].is_null(), "{rec}");
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// overlayfs caches a file's pages in the underlying file's inode. cachestat on the overlay's
/// file counted the overlay inode's own, empty, cache: residency said 0 % of a cached file and
/// `record` listed nothing. Residency now goes through mincore there, and `--trace`, which names
/// the underlying inode, says it cannot be used for such files instead of silently adding nothing.
#[test]
fn overlayfs_residency_record_and_trace_warning() {
    let d = scratch("overlay");
    for s in ["lower", "upper", "work", "merged"] {
        std::fs::create_dir(d.join(s)).unwrap();
    }
    write_file(&d.join("lower/f.bin"), 64 << 10, 9);
    let m = d.join("merged");
    ok(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "lowerdir={},upperdir={},workdir={}",
            d.join("lower").display(),
            d.join("upper").display(),
            d.join("work").display()
        ))
        .arg(&m));
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let mounted = Umount(m.clone());
    let f = m.join("f.bin");
    assert_eq!(std::fs::read(&f).unwrap().len(), 64 << 10);
    assert_eq!(fincore_bytes(&f), 64 << 10);
    let res = json(&run(&["residency", "--json", f.to_str().unwrap()]));
    assert_eq!(res["total"]["resident_pages"], 16, "{res}");
    assert_eq!(res["files"][0]["residency"]["source"], "mincore", "{res}");
    evict(&[&f]);
    assert_eq!(fincore_bytes(&f), 0, "evict through the overlay");
    let list = d.join("list.txt");
    let o = ok(record_cmd(&list, &m)
        .args([
            "--trace",
            "--json",
            "--",
            "sh",
            "-c",
            "cat \"$0\" > /dev/null",
        ])
        .arg(&f));
    let rec = json(&o);
    assert_eq!(rec["trace"]["untraceable_files"], 1, "{rec}");
    assert!(
        text(&o.stderr).contains("1 files are on btrfs or overlayfs"),
        "{}",
        text(&o.stderr)
    );
    let v = list_entries(&list);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(ranges_of(&v[0]), vec![(0, 64 << 10)]);
    drop(mounted);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn replay_after_evict_makes_listed_pages_resident() {
    let d = scratch("replay");
    // A file far above the kernel's 8 MiB readahead clip, a partially listed one, small files.
    let big = d.join("big.bin");
    write_file(&big, 24 << 20, 9);
    let part = d.join("part.bin");
    write_file(&part, 4 << 20, 7);
    let mut small = Vec::new();
    for i in 0..40u64 {
        let p = d.join(format!("s{i:02}.so"));
        write_file(&p, 1000 + i * 7919, i as u8);
        small.push(p);
    }
    // Mixed forms: classic block list, text v1 with a whole file, JSON Lines.
    let mut list = String::from("# mixed forms\n");
    list.push_str(&format!("{}\t-\t*\n", big.display()));
    list.push_str(&format!(
        "{} 0:65536,1048576:524288,3145728:4096\n",
        part.display()
    ));
    for p in &small {
        list.push_str(&format!(
            "{{\"path\":\"{}\",\"ranges\":\"*\"}}\n",
            p.display()
        ));
    }
    let lp = d.join("list.txt");
    std::fs::write(&lp, list).unwrap();

    let requested = (24u64 << 20)
        + 65536
        + 524288
        + 4096
        + small
            .iter()
            .map(|p| p.metadata().unwrap().len())
            .sum::<u64>();
    // Every method must end fully resident (readahead is the default).
    // (method, max chunks in flight per thread; 0 = unbounded)
    for (method, inflight) in [
        ("readahead", "0"),
        ("readahead", "1"),
        ("uring", "0"),
        ("fadvise", "0"),
        ("pread", "0"),
    ] {
        evict(&[&d]);
        assert_eq!(fincore_bytes(&big), 0);
        let v = replay_json(
            &lp,
            &["--method", method, "--max-inflight", inflight, "-q", "2"],
        );

        assert_eq!(v["bytes_requested"], requested, "{v}");
        assert_eq!(v["bytes_resident_before"], 0, "{v}");
        assert!(
            v["resident_fraction"].as_f64().unwrap() >= 0.995,
            "{method}: tool says not resident: {v}"
        );
        assert_eq!(v["bytes_unverifiable"], 0);

        // Independent checks with mincore-based tools.
        assert_eq!(
            read_bytes(&big),
            24 << 20,
            "{method}: big file not fully resident (kernel clip not handled?)"
        );
        for p in &small {
            let len = p.metadata().unwrap().len();
            assert_eq!(
                read_bytes(p),
                len.next_multiple_of(PAGE),
                "{method}: {} (tool: {v})",
                p.display()
            );
        }
        for (o, l) in [(0u64, 65536u64), (1 << 20, 524288), (3 << 20, 4096)] {
            assert_eq!(
                read_pages(&part, o, l),
                l / PAGE,
                "{method}: range {o}:{l} of part.bin"
            );
        }
    }

    // A second replay finds everything resident and issues nothing, except what the kernel
    // reclaimed meanwhile, which it issues again. How much that is depends on the host's
    // reclaim (a CI run saw 128 pages go): every listed page not resident must be a shadow
    // entry, i.e. reclaimed after it was read (the last evict left no shadows). Counted just
    // before the replay (which reads them back, replacing the shadows), with 64 pages of
    // slack for reclaim in the moment between.
    let shadows = reclaimed_pages(&big, 0, 0)
        + small.iter().map(|p| reclaimed_pages(p, 0, 0)).sum::<u64>()
        + [(0u64, 65536u64), (1 << 20, 524288), (3 << 20, 4096)]
            .iter()
            .map(|&(o, l)| reclaimed_pages(&part, o, l))
            .sum::<u64>();
    let v = replay_json(&lp, &[]);
    let before = v["bytes_resident_before"].as_u64().unwrap();
    assert!(
        requested - before <= (shadows + 64) * PAGE,
        "{shadows} shadow pages: {v}"
    );
    assert_eq!(v["bytes_issued"] == 0, before == requested, "{v}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn stale_and_missing_entries_are_reported() {
    let d = scratch("stale");
    let (a, b, gone) = (d.join("a"), d.join("b"), d.join("gone"));
    write_file(&a, 64 << 10, 1);
    write_file(&b, 64 << 10, 2);
    write_file(&gone, 8192, 3);
    // Record a list with identities (cat reads both files).
    let lp = d.join("list");
    assert_eq!(record_cat(&lp, &d, &[&a, &b, &gone]).len(), 3);
    // Change b, delete gone.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&b)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"more"))
        .unwrap();
    std::fs::remove_file(&gone).unwrap();
    evict(&[&d]);
    let v = replay_json(&lp, &[]);
    let stale: Vec<(String, String)> = v["stale"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap().to_string(),
                s["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(stale.len(), 2, "{v}");
    assert!(
        stale
            .iter()
            .any(|(p, r)| p == b.to_str().unwrap() && r.contains("size") && r.contains("mtime")),
        "{stale:?}"
    );
    assert!(
        stale
            .iter()
            .any(|(p, r)| p == gone.to_str().unwrap() && r.contains("missing")),
        "{stale:?}"
    );
    assert_eq!(v["files_replayed"], 1);
    assert_eq!(read_bytes(&a), 64 << 10);
    assert_eq!(read_bytes(&b), 0, "stale entry must not be replayed");
    // Human output names them too.
    let o = run(&["readahead", "replay", lp.to_str().unwrap()]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains(&format!("stale: {}: changed: size, mtime", b.display())),
        "{s}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn unprivileged_caller_gets_unknown_not_a_false_100_percent() {
    use std::os::unix::process::CommandExt;
    let uid = Command::new("id").arg("-u").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&uid.stdout).trim(),
        "0",
        "this test drops privileges and must run as root"
    );
    let d = scratch("unpriv");
    let f = d.join("lib.so");
    write_file(&f, 2 << 20, 5);
    // Root-owned, mode 0644: nobody neither owns nor may write it (the mincore lie condition).
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    evict(&[&f]);
    let as_nobody = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .arg(&f)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let o = as_nobody(BIN, &["residency", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&o);
    let r = &v["files"][0]["residency"];
    assert_eq!(r["state"], "unknown", "{v}");
    assert!(r["reason"].as_str().unwrap().contains("EPERM"), "{v}");
    assert_eq!(v["total"]["unknown_files"], 1);
    assert_eq!(v["total"]["resident_pages"], 0);
    let o = as_nobody(BIN, &["residency"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("unknown"));
    // The trap this guards against: mincore-based vmtouch claims the evicted file is resident.
    let o = as_nobody("vmtouch", &[]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("512/512"),
        "expected vmtouch to show the kernel's mincore lie, got: {s}"
    );
    // As root the same file is known and 0% resident.
    let v = json(&run(&["residency", "--json", f.to_str().unwrap()]));
    assert_eq!(v["files"][0]["residency"]["state"], "known");
    assert_eq!(v["files"][0]["residency"]["resident_pages"], 0);
    // Evicting as nobody cannot check the result: the summary says so instead of claiming
    // that 0 pages remain resident.
    let o = as_nobody(BIN, &["readahead", "evict"]);
    let out = text(&o.stdout);
    assert!(
        out.contains(
            "0 pages remain resident in the 0 files that could be checked, 1 files unknown"
        ),
        "{out}"
    );
    let o = as_nobody(BIN, &["readahead", "evict", "--json"]);
    assert_eq!(json(&o)["unknown_files"], 1);
    // A warm-up whose result cannot be verified does not meet a requirement.
    let o = as_nobody(BIN, &["readahead", "warm", "--require", "99.5", "--json"]);
    assert!(!o.status.success(), "unverifiable warm-up passed --require");
    let v = json(&o);
    assert_eq!(v["resident_fraction"], Value::Null, "{v}");
    assert_eq!(v["bytes_unverifiable"], 2 << 20, "{v}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn residency_tree_matches_fincore_and_background_replay_completes() {
    let d = scratch("tree");
    std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
    let files: Vec<PathBuf> = (0..12u64)
        .map(|i| {
            let p = d
                .join(if i % 3 == 0 {
                    "sub/deeper"
                } else if i % 3 == 1 {
                    "sub"
                } else {
                    ""
                })
                .join(format!("f{i}"));
            write_file(&p, (i + 1) * 20000, i as u8);
            p
        })
        .collect();
    evict(&[&d]);
    // Warm every other file in the background; the command must return at once.
    let log = d.join("bg.log");
    let o = Command::new(BIN)
        .args([
            "readahead",
            "warm",
            "--background",
            "--json",
            "--log",
            log.to_str().unwrap(),
        ])
        .args(files.iter().step_by(2))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pid: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("background prints the pid");
    let mut report = None;
    for _ in 0..500 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if let Ok(s) = std::fs::read_to_string(&log)
            && let Some(line) = s.lines().find(|l| l.starts_with('{'))
        {
            report = Some(serde_json::from_str::<Value>(line).unwrap());
            break;
        }
    }
    let report = report.unwrap_or_else(|| panic!("background replay (pid {pid}) wrote no report"));
    assert!(
        report["resident_fraction"].as_f64().unwrap() >= 0.995,
        "{report}"
    );
    let v = json(&run(&["residency", "-r", "--json", d.to_str().unwrap()]));
    let listed = v["files"].as_array().unwrap();
    assert_eq!(listed.len(), files.len() + 1, "{v}"); // + the log
    for (i, p) in files.iter().enumerate() {
        let e = listed
            .iter()
            .find(|e| e["path"] == p.to_str().unwrap())
            .unwrap();
        let pages = e["residency"]["resident_pages"].as_u64().unwrap();
        let reclaimed = e["residency"]["evicted_pages"].as_u64().unwrap();
        // fincore runs a moment later: the kernel may have reclaimed some of them since.
        let (fin, gone) = (fincore_pages(p), reclaimed_pages(p, 0, 0));
        assert!(
            fin <= pages && pages <= fin + gone,
            "{}: residency says {pages}, fincore {fin} (+{gone} reclaimed)",
            p.display()
        );
        if i % 2 == 0 {
            assert_eq!(
                pages + reclaimed,
                e["pages"].as_u64().unwrap(),
                "{}",
                p.display()
            );
        } else {
            assert_eq!(pages + gone, 0, "{} was not in the warm set", p.display());
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Runs snapblk without requiring success.
fn run_any(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn list_that_replays_nothing_is_not_reported_as_success() {
    let d = scratch("g1");
    let (a, b) = (d.join("a"), d.join("b"));
    write_file(&a, 64 << 10, 1);
    write_file(&b, 64 << 10, 2);
    let lp = d.join("list");
    assert_eq!(record_cat(&lp, &d, &[&a, &b]).len(), 2);
    // The "OTA": a is replaced by a new file, b is gone.
    std::fs::remove_file(&a).unwrap();
    write_file(&a, 64 << 10, 9);
    std::fs::remove_file(&b).unwrap();
    let lps = lp.to_str().unwrap();
    let o = run_any(&["readahead", "replay", lps, "--json", "--require", "99.5"]);
    assert!(!o.status.success(), "stale list passed --require: {o:?}");
    let v = json(&o);
    assert_eq!(v["resident_fraction"], Value::Null, "{v}");
    assert_eq!(v["entries"], 2);
    assert_eq!(v["files_replayed"], 0);
    assert_eq!(v["entries_stale"], 1, "{v}");
    assert_eq!(v["entries_missing"], 1, "{v}");
    assert_eq!(v["entries_not_replayed"], 2);
    let err = text(&o.stderr);
    assert!(
        err.contains("warning: all 2 of 2 entries were not replayed (1 stale, 1 missing)"),
        "{err}"
    );
    assert!(err.contains("nothing could be verified"), "{err}");
    // Without --require the replay itself exits 0 but says n/a, not 100 %.
    let o = run(&["readahead", "replay", lps]);
    let out = text(&o.stdout);
    assert!(out.contains("resident (n/a)"), "{out}");
    assert!(!out.contains("100.000%"), "{out}");
    assert!(
        out.contains("entries 2 (replayed 0, stale 1, missing 1, failed 0)"),
        "{out}"
    );
    assert!(text(&o.stderr).contains("warning:"));

    // An empty list and an arbitrary text file (every line a "missing" file) fail too.
    let empty = d.join("empty.list");
    std::fs::write(&empty, "").unwrap();
    let o = run_any(&[
        "readahead",
        "replay",
        empty.to_str().unwrap(),
        "--require",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("the list has no entries"), "{o:?}");
    let junk = d.join("passwd");
    std::fs::write(
        &junk,
        "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/sh\n",
    )
    .unwrap();
    let o = run_any(&[
        "readahead",
        "replay",
        junk.to_str().unwrap(),
        "--require",
        "99.5",
    ]);
    assert!(!o.status.success(), "{o:?}");
    assert!(text(&o.stdout).contains("missing 2"), "{o:?}");

    // Half of the list still valid: all its bytes resident, but only half the entries.
    let c = d.join("c");
    write_file(&c, 32 << 10, 3);
    let half = d.join("half.list");
    std::fs::write(
        &half,
        format!("{}\n{}\n", c.display(), d.join("nosuch").display()),
    )
    .unwrap();
    let hs = half.to_str().unwrap();
    let o = run_any(&["readahead", "replay", hs, "--json", "--require", "99.5"]);
    assert!(!o.status.success(), "{o:?}");
    assert_eq!(json(&o)["resident_fraction"], 1.0);
    assert!(
        text(&o.stderr).contains("only 1 of 2 entries were replayed"),
        "{o:?}"
    );
    run(&["readahead", "replay", hs, "--require", "50"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Waits for the JSON report a background replay writes to its log.
/// Runs `cmd` with `input` on its stdin and collects its output.
fn with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn wait_for_log_report(log: &Path, pid: u32) -> Value {
    for _ in 0..1500 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if let Ok(s) = std::fs::read_to_string(log)
            && let Some(line) = s.lines().find(|l| l.starts_with('{'))
        {
            return serde_json::from_str::<Value>(line).unwrap();
        }
    }
    panic!(
        "background replay (pid {pid}) wrote no report to {}",
        log.display()
    )
}

#[test]
fn background_replay_of_a_list_on_stdin_warms_it() {
    let d = scratch("bgstdin");
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let files: Vec<PathBuf> = (0..5u64)
        .map(|i| {
            let p = d.join(format!("f{i}"));
            write_file(&p, 100_000 + i * 4096, i as u8);
            p
        })
        .collect();
    evict(&[&d]);
    let list: String = files.iter().map(|p| format!("{}\n", p.display())).collect();
    let log = d.join("bg.log");
    let o = with_stdin(
        Command::new(BIN)
            .args([
                "readahead",
                "replay",
                "-",
                "--background",
                "--json",
                "--log",
            ])
            .arg(&log)
            .env("TMPDIR", &tmp),
        list.as_bytes(),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let pid: u32 = text(&o.stdout).trim().parse().expect("pid");
    let v = wait_for_log_report(&log, pid);
    assert_eq!(v["entries"], 5, "{v}");
    assert_eq!(v["files_replayed"], 5, "{v}");
    assert!(v["resident_fraction"].as_f64().unwrap() >= 0.995, "{v}");
    for p in &files {
        let len = p.metadata().unwrap().len();
        assert_eq!(read_bytes(p), len.next_multiple_of(PAGE), "{}", p.display());
    }
    // The private copy of stdin was removed by the child.
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "temporary list left behind: {left:?}");

    // A malformed list on stdin is an error now, not in the log.
    let o = with_stdin(
        Command::new(BIN)
            .args(["readahead", "replay", "-", "--background"])
            .env("TMPDIR", &tmp),
        b"/x\t-\t0:0\n",
    );
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("line 1"), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn record_scopes_are_absolute_existing_and_evict_first_needs_one() {
    let d = scratch("scope");
    std::fs::create_dir(d.join("t")).unwrap();
    let f = d.join("t/data");
    write_file(&f, 40 << 10, 4);
    // A relative scope, recorded from d: the list holds absolute paths.
    let lp = d.join("rel.list");
    let o = Command::new(BIN)
        .current_dir(&d)
        .args(["readahead", "record", "-o", "rel.list", "--scope", "t"])
        .args(["--evict-first", "--", "cat", "t/data"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = list_entries(&lp);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].path, std::fs::canonicalize(&f).unwrap());
    assert!(v[0].path.is_absolute());
    // ... so it replays from any working directory.
    evict(&[&f]);
    let o = Command::new(BIN)
        .current_dir("/")
        .args(["readahead", "replay", "--json", "--require", "99.5"])
        .arg(&lp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(json(&o)["files_replayed"], 1);

    // A missing scope is a one-line error, and no list is written.
    let out = d.join("missing.list");
    let o = run_any(&[
        "readahead",
        "record",
        "-o",
        out.to_str().unwrap(),
        "--scope",
        d.join("nosuch").to_str().unwrap(),
        "--duration",
        "0",
    ]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("scope") && err.contains("No such file"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!out.exists());

    // --evict-first with the default scope "/" is refused before anything is evicted.
    let o = run_any(&[
        "readahead",
        "record",
        "-o",
        out.to_str().unwrap(),
        "--evict-first",
        "--duration",
        "0",
    ]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("--evict-first") && err.contains("--scope"),
        "{err}"
    );
    assert!(!out.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_numeric_options_are_one_line_errors_not_panics() {
    let d = scratch("badopts");
    let f = d.join("f");
    write_file(&f, 8192, 1);
    let fs = f.to_str().unwrap();
    let out = d.join("l");
    let os = out.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["readahead", "replay", fs, "--settle-timeout", "nan"],
        vec!["readahead", "replay", fs, "--settle-timeout", "1e300"],
        vec!["readahead", "replay", fs, "--settle-timeout=-1"],
        vec!["readahead", "warm", fs, "--settle-timeout", "inf"],
        vec!["readahead", "warm", fs, "--psi-threshold", "nan"],
        vec!["readahead", "warm", fs, "--psi-threshold", "101"],
        vec!["readahead", "warm", fs, "--require", "150"],
        vec!["readahead", "warm", fs, "--require=-5"],
        vec!["readahead", "warm", fs, "--require", "nan"],
        vec!["readahead", "warm", fs, "-q", "0"],
        vec!["readahead", "warm", fs, "--threads", "100000"],
        vec!["readahead", "warm", fs, "--retries", "1000000"],
        vec!["residency", fs, "--threads", "1000000"],
        vec![
            "readahead",
            "record",
            "-o",
            os,
            "--scope",
            fs,
            "--duration",
            "1e300",
        ],
        vec![
            "readahead",
            "record",
            "-o",
            os,
            "--scope",
            fs,
            "--duration",
            "nan",
        ],
        vec![
            "readahead",
            "record",
            "-o",
            os,
            "--scope",
            fs,
            "--duration",
            "-1",
        ],
    ];
    for args in cases {
        let o = run_any(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let first = err.lines().next().unwrap_or_default();
        let last = args[args.len() - 1];
        let opt = match last.split_once('=') {
            Some((o, _)) => o,
            None => args[args.len() - 2],
        };
        assert!(
            first.starts_with("error: invalid value") && first.contains(opt),
            "{args:?}: {err}"
        );
    }
    assert!(!out.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn unreadable_paths_fail_and_totals_without_data_say_n_a() {
    let d = scratch("exit");
    let f = d.join("f");
    write_file(&f, 20 << 10, 1);
    let fs = f.to_str().unwrap();
    let nosuch = d.join("nosuch");
    let ns = nosuch.to_str().unwrap();

    // residency: exit 1, the error on stderr, the total n/a rather than 100 %.
    let o = run_any(&["residency", ns]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let out = text(&o.stdout);
    assert!(out.contains("Resident Pages: 0/0  0 B/0 B  n/a"), "{out}");
    assert!(!out.contains("100.000%"), "{out}");
    assert!(
        text(&o.stderr).contains("1 path could not be read"),
        "{o:?}"
    );
    let o = run_any(&["residency", "--json", ns]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert_eq!(v["total"]["resident_fraction"], Value::Null, "{v}");
    assert_eq!(v["errors"][0]["path"], ns, "{v}");
    // A readable file next to it is still reported; the exit status still says failure.
    let o = run_any(&["residency", "--json", fs, ns]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert_eq!(v["total"]["files"], 1);
    assert_eq!(v["total"]["resident_fraction"], 1.0, "{v}");
    // -v bars span 40 columns even for a 5-page file.
    let o = run(&["residency", "-v", fs]);
    let want = format!("[{}] 5/5  100.0%", "O".repeat(40));
    assert!(text(&o.stdout).contains(&want), "{o:?}");
    // An empty file: nothing to measure, n/a too.
    let empty = d.join("empty");
    std::fs::write(&empty, "").unwrap();
    let o = run(&["residency", empty.to_str().unwrap()]);
    assert!(text(&o.stdout).contains("0/0\tn/a"), "{o:?}");

    // warm: exit 1, walk errors in --json.
    let o = run_any(&["readahead", "warm", "--json", fs, ns]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let v = json(&o);
    assert_eq!(v["walk_errors"][0]["path"], ns, "{v}");
    assert!(
        v["walk_errors"][0]["error"]
            .as_str()
            .unwrap()
            .contains("No such file"),
        "{v}"
    );
    assert_eq!(v["files_replayed"], 1);
    let o = run_any(&["readahead", "warm", ns]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("resident (n/a)"), "{o:?}");
    assert!(text(&o.stderr).contains("no files found"), "{o:?}");
    // evict agrees.
    assert_eq!(run_any(&["readahead", "evict", ns]).status.code(), Some(1));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn duplicate_list_entries_are_requested_once() {
    let d = scratch("dups");
    let f = d.join("lib.so");
    write_file(&f, 37_000, 1);
    let lp = d.join("list");
    let line = format!("{}\n", f.display());
    std::fs::write(&lp, line.repeat(3) + &format!("{} 0:4096\n", f.display())).unwrap();
    evict(&[&f]);
    let v = replay_json(&lp, &["--require", "99.5"]);
    assert_eq!(v["entries"], 4, "{v}");
    assert_eq!(v["entries_duplicate"], 3, "{v}");
    assert_eq!(v["files_replayed"], 1, "{v}");
    // Once, clipped to the file size (listed 4 times, 148 KB or more before merging).
    assert_eq!(v["bytes_requested"], 37_000, "{v}");
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Resident pages of a file by cachestat-free means (fincore), in pages.
fn fincore_pages(p: &Path) -> u64 {
    fincore_bytes(p) / PAGE
}

/// (major, minor) of the device holding `p` (glibc's dev_t encoding).
fn dev_of(p: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let dev = p.metadata().unwrap().dev();
    (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    )
}

/// The counters of one device in /proc/diskstats, from field 4 on: reads, reads merged,
/// sectors read, read ms, ...
fn proc_diskstats(major: u64, minor: u64) -> Vec<u64> {
    let s = std::fs::read_to_string("/proc/diskstats").unwrap();
    s.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 11 && f[0] == major.to_string() && f[1] == minor.to_string())
        .unwrap_or_else(|| panic!("{major}:{minor} not in /proc/diskstats"))[3..]
        .iter()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn replay_options_show_in_the_report() {
    let d = scratch("opts");
    let (f, lp) = file_and_list(&d, "data", 3 << 20, 5);
    let ls = lp.to_str().unwrap();

    // --diskstats: the device holding the scratch dir, before and after a cold replay and the
    // difference, in JSON and text; bracketed by this test's own reads of /proc/diskstats.
    let (major, minor) = dev_of(&f);
    evict(&[&f]);
    let outer_before = proc_diskstats(major, minor);
    let v = replay_json(&lp, &["--diskstats"]);
    let outer_after = proc_diskstats(major, minor);
    let devs = v["diskstats"].as_array().expect("diskstats");
    let dev = devs
        .iter()
        .find(|s| (s["major"].as_u64(), s["minor"].as_u64()) == (Some(major), Some(minor)))
        .unwrap_or_else(|| panic!("no diskstats for {major}:{minor}: {v}"));
    let (before, after, delta) = (&dev["before"], &dev["after"], &dev["delta"]);
    let n = |x: &Value, k: &str| x[k].as_u64().unwrap_or_else(|| panic!("{k}: {x}"));
    for (k, col) in [("reads", 0), ("sectors_read", 2), ("read_ms", 3)] {
        assert!(outer_before[col] <= n(before, k), "{k}: {v}");
        assert!(n(before, k) <= n(after, k), "{k}: {v}");
        assert!(n(after, k) <= outer_after[col], "{k}: {v}");
    }
    for k in [
        "reads",
        "sectors_read",
        "read_ms",
        "writes",
        "sectors_written",
    ] {
        assert_eq!(n(delta, k), n(after, k) - n(before, k), "{k}: {v}");
    }
    assert_eq!(
        delta["in_flight"].as_i64().unwrap(),
        n(after, "in_flight") as i64 - n(before, "in_flight") as i64
    );
    // The cold replay read the whole 3 MiB file from this device.
    assert!(n(delta, "sectors_read") >= (3 << 20) / 512, "{v}");
    assert!(n(delta, "reads") > 0, "{v}");
    // The plain delta list is still there for earlier readers.
    let old = v["diskstats_delta"].as_array().expect("diskstats_delta");
    let od = old
        .iter()
        .find(|s| s["minor"] == minor && s["major"] == major);
    assert_eq!(od.unwrap()["sectors_read"], delta["sectors_read"], "{v}");

    evict(&[&f]);
    let outer_before = proc_diskstats(major, minor);
    let o = run(&["readahead", "replay", ls, "--diskstats"]);
    let outer_after = proc_diskstats(major, minor);
    let out = text(&o.stdout);
    let name = dev["name"].as_str().unwrap();
    let head = format!("diskstats {name} ({major}:{minor}):");
    let table: Vec<&str> = out.lines().skip_while(|l| *l != head).take(8).collect();
    assert_eq!(table.len(), 8, "{out}");
    assert_eq!(
        table[1].split_whitespace().collect::<Vec<_>>(),
        ["before", "after", "delta"]
    );
    let row = |label: &str| -> (u64, u64, String) {
        let l = table
            .iter()
            .find_map(|l| l.trim_start().strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label} row: {out}"));
        let f: Vec<&str> = l.split_whitespace().collect();
        (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].to_string(),
        )
    };
    for (label, col) in [("reads ", 0), ("sectors read ", 2), ("read ms ", 3)] {
        let (b, a, d) = row(label);
        assert!(
            outer_before[col] <= b && b <= a && a <= outer_after[col],
            "{label}: {out}"
        );
        assert_eq!(d, format!("+{}", a - b), "{label}: {out}");
    }
    let (b, a, _) = row("sectors read ");
    assert!(a - b >= (3 << 20) / 512, "{out}");
    let (b, a, change) = row("in flight ");
    assert_eq!(change, format!("{:+}", a as i64 - b as i64), "{out}");
    // Without the option: no diskstats.
    let v = replay_json(&lp, &[]);
    assert_eq!(v["diskstats"], Value::Null);
    assert_eq!(v["diskstats_delta"], Value::Null);

    // -q and --threads set the submitter count.
    for (args, depth, threads) in [
        (vec!["-q", "3"], 3, 3),
        (vec!["-q", "5", "--threads", "2"], 5, 2),
        (vec!["--method", "uring", "-q", "8"], 8, 2),
        (vec![], 4, 4),
    ] {
        let v = replay_json(&lp, &args);
        assert_eq!(v["queue_depth"], depth, "{args:?}: {v}");
        assert_eq!(v["threads"], threads, "{args:?}: {v}");
    }

    // The file is resident now: skipped by default, issued with --no-skip-resident.
    assert_eq!(fincore_pages(&f), 768);
    let v = replay_json(&lp, &[]);
    assert_eq!(v["bytes_issued"], 0, "{v}");
    assert_eq!(v["bytes_resident_before"], 3 << 20);
    let v = replay_json(&lp, &["--no-skip-resident"]);
    assert_eq!(v["bytes_issued"], 3 << 20, "{v}");
    assert_eq!(v["requests_issued"], 2, "{v}"); // two 2 MiB chunks (the last one short)
    assert_eq!(v["resident_fraction"], 1.0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn record_duration_captures_reads_by_another_process_in_the_window() {
    let d = scratch("window");
    let (canary, target, other) = (d.join("canary"), d.join("target"), d.join("other"));
    write_file(&canary, 16 << 10, 1);
    write_file(&target, 96 << 10, 2);
    write_file(&other, 32 << 10, 3);
    assert!(fincore_pages(&canary) > 0);
    let lp = d.join("window.list");
    let rec = Command::new(BIN)
        .args(["readahead", "record", "-o", lp.to_str().unwrap()])
        .args(["--scope", d.to_str().unwrap(), "--evict-first", "--json"])
        .args(["--duration", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The canary going cold means the eviction is done; the "before" snapshot of this small
    // tree follows within milliseconds, so read the target a little later, from another
    // process, well inside the 3 s window.
    let t = std::time::Instant::now();
    while fincore_pages(&canary) > 0 {
        assert!(t.elapsed().as_secs() < 20, "record never evicted its scope");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let cat = Command::new("cat").arg(&target).output().unwrap();
    assert_eq!(cat.stdout.len(), 96 << 10);
    let o = rec.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    assert_eq!(v["files"], 1, "{v}");
    assert_eq!(v["exit_status"], Value::Null);
    let entries = list_entries(&lp);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].path, target);
    assert_eq!(ranges_of(&entries[0]), vec![(0, 96 << 10)]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn classic_list_typos_fail_the_replay_naming_line_and_token() {
    let d = scratch("classic");
    // Names with spaces and a colon: the classic form must keep them as names.
    let (a, b) = (d.join("lib a.so"), d.join("Track 1:Intro"));
    write_file(&a, 256 << 10, 1);
    write_file(&b, 40 << 10, 2);
    let good = format!(
        "{} 0:4096,131072:65536\n{}\n{}  4096:8192 \n",
        a.display(),
        b.display(),
        b.display()
    );
    let lp = d.join("classic.list");
    std::fs::write(&lp, &good).unwrap();
    evict(&[&d]);
    let v = replay_json(&lp, &["--require", "99.5"]);
    assert_eq!(v["entries_missing"], 0, "{v}");
    assert_eq!(v["files_replayed"], 2, "{v}");
    // a: two ranges; b: the whole file (its ranged line is a duplicate of the same file).
    assert_eq!(v["bytes_requested"], 4096 + 65536 + (40 << 10), "{v}");
    assert_eq!(read_pages(&a, 0, 4096), 1);
    assert_eq!(read_pages(&a, 131072, 65536), 16);
    assert_eq!(read_bytes(&b), 40 << 10);

    // A typo in a range list is an error naming the line and the token, not a "missing" file.
    for (typo, token) in [
        (
            format!("{} 0:4096,40g96:8192", a.display()),
            "0:4096,40g96:8192",
        ),
        (format!("{} 0:4096,", a.display()), "0:4096,"),
        (format!("{} 12:", b.display()), "12:"),
    ] {
        let bad = d.join("bad.list");
        std::fs::write(&bad, format!("{good}# a comment\n{typo}\n")).unwrap();
        for extra in [&[][..], &["--require", "50"][..], &["--json"][..]] {
            let o = run_any(&[&["readahead", "replay", bad.to_str().unwrap()], extra].concat());
            assert!(!o.status.success(), "{typo:?} {extra:?} passed: {o:?}");
            let err = text(&o.stderr);
            assert!(err.contains("line 5: bad range list"), "{typo:?}: {err}");
            assert!(err.contains(&format!("{token:?}")), "{typo:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(o.stdout.is_empty(), "a report was printed: {o:?}");
        }
        // A background replay refuses the list before detaching.
        let o = run_any(&["readahead", "replay", bad.to_str().unwrap(), "--background"]);
        assert!(!o.status.success());
        assert!(text(&o.stderr).contains("line 5: bad range list"), "{o:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn record_json_keeps_the_commands_stdout_off_stdout() {
    let d = scratch("recjson");
    let f = d.join("data.bin");
    write_file(&f, 40 << 10, 9);
    let list = d.join("l.txt");
    let script = format!("echo hello; cat '{}'", f.display());
    let record = |json: bool| {
        let mut c = record_cmd(&list, &d);
        c.arg("--evict-first");
        if json {
            c.arg("--json");
        }
        ok(c.args(["--", "sh", "-c", &script]))
    };
    // --json: stdout is exactly one JSON document (the file's binary bytes included in the
    // command's output would otherwise break any JSON reader); the output went to stderr.
    let o = record(true);
    let v = json(&o);
    assert_eq!(v["schema"], "snapblk.record.v1", "{v}");
    assert_eq!(v["files"], 1, "{v}");
    assert!(
        text(&o.stderr).starts_with("hello\n"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(o.stderr.len(), "hello\n".len() + (40 << 10));
    // Without --json the command's stdout stays on stdout, before the summary (like time).
    let o = record(false);
    let out = text(&o.stdout);
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(out.contains("recorded 1 files"), "{out}");
    assert!(!text(&o.stderr).contains("hello"), "{}", text(&o.stderr));
    assert_eq!(list_entries(&list).len(), 1);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn record_leaves_out_files_the_command_wrote_and_reports_them() {
    let d = scratch("recwrite");
    let (a, b, log) = (d.join("a.bin"), d.join("b.out"), d.join("app.log"));
    write_file(&a, 48 << 10, 1);
    write_file(&log, 20 << 10, 2);
    let list = d.join("l.txt");
    // Reads a, creates b, and reads then appends to the log.
    let script = format!(
        "cat '{}' '{}' >/dev/null; head -c 100000 /dev/zero > '{}'; echo more >> '{}'",
        a.display(),
        log.display(),
        b.display(),
        log.display()
    );
    let v = json(&ok(record_cmd(&list, &d).args([
        "--evict-first",
        "--json",
        "--",
        "sh",
        "-c",
        &script,
    ])));
    let entries = list_entries(&list);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].path, a);
    assert_eq!(ranges_of(&entries[0]), vec![(0, 48 << 10)]);
    assert_eq!(v["files"], 1, "{v}");
    assert_eq!(v["written_files"], 2, "{v}");
    let written: Vec<(&str, &str)> = v["written"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["path"].as_str().unwrap(), w["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(written.len(), 2, "{v}");
    assert_eq!(written[0].0, log.to_str().unwrap());
    assert!(written[0].1.starts_with("changed: size, mtime"), "{v}");
    assert_eq!(written[1].0, b.to_str().unwrap());
    assert!(written[1].1.starts_with("created"), "{v}");
    // The list replays cleanly next time: nothing in it is stale.
    evict(&[&a]);
    let r = replay_json(&list, &["--require", "99.5"]);
    assert_eq!(r["entries_stale"], 0, "{r}");
    // The text summary counts and names them.
    let o = ok(record_cmd(&list, &d).args(["--", "sh", "-c"]).arg(format!(
        "cat '{}' >/dev/null; echo x > '{}'",
        a.display(),
        b.display()
    )));
    let out = text(&o.stdout);
    assert!(
        out.contains("left out 1 files written during the recording"),
        "{out}"
    );
    assert!(
        out.contains(&format!("written: {}: changed: ", b.display())),
        "{out}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_bad_output_path_fails_before_recording_and_names_that_path() {
    let d = scratch("badout");
    let marker = d.join("ran");
    let touch = format!("touch '{}'", marker.display());
    let bad = d.join("nosuch/dir/x.txt");
    for (out, why) in [
        (bad.as_path(), "No such file or directory"),
        (d.as_path(), "Is a directory"),
    ] {
        let o = Command::new(BIN)
            .args(["readahead", "record", "-o"])
            .arg(out)
            .arg("--scope")
            .arg(&d)
            .args(["--", "sh", "-c", &touch])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let err = text(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("cannot write the list {}", out.display())) && err.contains(why),
            "{err}"
        );
        assert!(!err.contains("tmp~"), "{err}");
        // Checked before the command ran (not after a long recording).
        assert!(!marker.exists(), "the command ran despite the bad -o {err}");
    }
    // The probe leaves nothing behind in a writable directory.
    let good = d.join("ok.txt");
    let o = run(&[
        "readahead",
        "record",
        "-o",
        good.to_str().unwrap(),
        "--scope",
        d.to_str().unwrap(),
        "--json",
        "--duration",
        "0",
    ]);
    assert_eq!(
        json(&o)["written_files"],
        0,
        "the probe was seen as written"
    );
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ok.txt"], "{names:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn require_failure_as_nobody_names_unknown_residency_not_the_first_warning() {
    use std::os::unix::process::CommandExt;
    let d = scratch("reqwhy");
    let f = d.join("lib.so");
    write_file(&f, 64 << 10, 6);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    // One entry that exists (residency unknown to nobody), one that is missing.
    let lp = d.join("mix.lst");
    std::fs::write(
        &lp,
        format!("{}\n{}\n", f.display(), d.join("gone").display()),
    )
    .unwrap();
    std::fs::set_permissions(&lp, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = Command::new(BIN)
        .args(["readahead", "replay", "--require", "50"])
        .arg(&lp)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(!o.status.success(), "unverifiable replay passed --require");
    let err = text(&o.stderr);
    let last = err.trim().lines().last().unwrap_or_default();
    let unknown = last.find("residency of all 65536 requested bytes is unknown");
    let missing = last.find("1 of 2 entries were not replayed (1 missing)");
    assert!(
        last.contains("nothing could be verified")
            && unknown.is_some()
            && missing.is_some()
            && unknown < missing,
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// `record --help` names the file systems the trace cannot see into (btrfs, overlayfs) and
/// where the record reports them; the JSON and the warning are checked on a real overlay mount
/// in `overlayfs_residency_record_and_trace_warning`.
#[test]
fn record_help_names_the_trace_blind_spots() {
    let help = text(&run(&["readahead", "record", "--help"]).stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("Files on btrfs or overlayfs cannot be matched to the trace")
            && help.contains("trace.untraceable_files"),
        "{help}"
    );
}

#[test]
fn the_report_and_help_say_how_the_pressure_back_off_throttled() {
    let d = scratch("backoff");
    let f = d.join("data");
    write_file(&f, 64 << 10, 8);
    let fs = f.to_str().unwrap();
    let time_line = |extra: &[&str]| {
        let o = run(&[&["readahead", "warm", fs][..], extra].concat());
        let out = text(&o.stdout);
        out.lines()
            .find(|l| l.starts_with("time: "))
            .unwrap_or_else(|| panic!("no time line: {out}"))
            .to_string()
    };
    let off = time_line(&["--psi-threshold", "0"]);
    assert!(off.ends_with("; I/O pressure back-off disabled"), "{off}");
    // This machine's real pressure decides whether the replay paused; either way the line
    // says so in words.
    let on = time_line(&[]);
    let paused = on.contains(" for other tasks' I/O pressure above 60%")
        && on.contains("; paused ")
        && on.contains(" times (");
    assert!(
        on.ends_with("; no pauses for I/O pressure") || paused,
        "{on}"
    );
    let help = text(&run(&["readahead", "replay", "--help"]).stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("about one request per thread every 5 s"),
        "{help}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Runs `cmd` to completion, collecting its output; kills it and fails after `limit`.
fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    snapblk_testsupport::output_within(child, limit, &format!("{cmd:?}"))
}

#[test]
fn replay_under_outside_pressure_backs_off_and_says_so() {
    use snapblk_readahead::fake::FakePressure;
    use std::os::unix::fs::MetadataExt;
    let d = scratch("pressure");
    let (f, lp) = file_and_list(&d, "data", 16 << 20, 5);
    // A cold file in 4096 chunks, each waited for before the next: issuing outlasts the
    // monitor's first decision (two 50 ms samples) even when the disk answers from its host's
    // cache (a CI run saw 1024 chunks read in 89 ms, 87 us apiece, and no decision). Others stall for
    // 700 ms while reading the file's disk (so the stall counts as theirs however blocked the
    // replay is); the pause ends then, well before its 5 s cap.
    // `on_tty`: run under script(1), which gives the command a terminal (so it draws its
    // progress bar) and copies what it writes there to stdout.
    let replay = |on_tty: bool, extra: &[&str]| {
        evict(&[&f]);
        let fake = FakePressure::start(&d, f.metadata().unwrap().dev()).unwrap();
        fake.set_foreign(true);
        fake.stall_for(std::time::Duration::from_millis(700));
        let mut args: Vec<String> = [
            BIN,
            "readahead",
            "replay",
            lp.to_str().unwrap(),
            "--chunk",
            "4K",
            "-q",
            "1",
            "--max-inflight",
            "1",
            "--psi-threshold",
            "50",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        args.extend(fake.cli_args());
        let mut cmd = if on_tty {
            // One shell string; the typescript itself is not wanted.
            let line: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
            let mut c = Command::new("script");
            c.args(["-qefc", &line.join(" "), "/dev/null"]);
            c
        } else {
            let mut c = Command::new(BIN);
            c.args(&args[1..]);
            c
        };
        let o = output_within(&mut cmd, std::time::Duration::from_secs(60));
        assert!(o.status.success(), "{o:?}");
        o
    };
    let v = json(&replay(false, &["--json"]));
    assert!(v["psi_pauses"].as_u64().unwrap() >= 1, "no back-off: {v}");
    assert!(v["psi_paused_secs"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["resident_fraction"], 1.0, "{v}");
    // On a terminal (script(1) gives it one): the bar says it is paused, and the text
    // report's time line how often and how long.
    let o = replay(true, &[]);
    let out = text(&o.stdout);
    // (The count may still be 0 in the first message: the monitor flags the pause before a
    // submitter reaches it.)
    let bar = out
        .split("replay: paused for other tasks' I/O pressure (")
        .nth(1)
        .unwrap_or_else(|| panic!("the bar never said paused: {out}"));
    assert!(
        bar.contains(" pauses, ") && bar.contains(" s so far) ["),
        "{out}"
    );
    let time = out
        .lines()
        .find(|l| l.contains("time: "))
        .unwrap_or_else(|| panic!("no time line: {out}"));
    assert!(time.contains("; paused "), "{time}");
    assert!(
        time.trim_end()
            .ends_with(" for other tasks' I/O pressure above 50%"),
        "{time}"
    );
    // The stand-in options are for tests: not in --help.
    let help = text(&run(&["readahead", "replay", "--help"]).stdout);
    assert!(!help.contains("--psi-file"), "{help}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn library_debug_log_reaches_stderr_only_when_asked() {
    // The replay library logs through `log`; the CLI's logger writes the records to stderr,
    // filtered by RUST_LOG, and SNAPBLK_RA_DEBUG still turns replay's debug lines on.
    let d = scratch("debuglog");
    let (_, list) = file_and_list(&d, "f", 3 * PAGE, 7);
    let replay = |env: &[(&str, &str)]| {
        let mut c = Command::new(BIN);
        c.args(["readahead", "replay", "--json"])
            .arg(&list)
            .env_remove("RUST_LOG")
            .env_remove("SNAPBLK_RA_DEBUG");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{o:?}");
        // stdout stays one JSON document whatever is logged.
        let _: Value = serde_json::from_slice(&o.stdout).unwrap();
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let verify_line = "[debug snapblk_readahead::replay] verify: ";
    let quiet = replay(&[]);
    assert!(!quiet.contains("[debug "), "{quiet}");
    for env in [
        &[("SNAPBLK_RA_DEBUG", "1")][..],
        &[("RUST_LOG", "snapblk_readahead=debug")][..],
        &[("RUST_LOG", "debug")][..],
    ] {
        let err = replay(env);
        assert!(err.contains(verify_line), "{env:?}: {err}");
    }
    // A more specific directive wins over the default level.
    let err = replay(&[("RUST_LOG", "debug,snapblk_readahead::replay=info")]);
    assert!(!err.contains(verify_line), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The list's temporary file is always a new one: a link planted at its name while recording
/// (here by the recorded command, which knows record's pid as `$PPID`) fails the record, and
/// the link's target is left as it was (it used to be truncated, filled with the list and
/// named as the list).
#[test]
fn record_never_writes_through_a_link_at_its_temporary_name() {
    let d = scratch("tmp-link");
    std::fs::create_dir(d.join("t")).unwrap();
    write_file(&d.join("t/data"), 4096, 1);
    let victim = d.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let list = d.join("l.list");
    let o = record_cmd(&list, &d.join("t"))
        .args(["--", "sh", "-c", r#"ln -s "$1" "$2.$PPID.tmp~""#, "sh"])
        .arg(&victim)
        .arg(&list)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("cannot write the list"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(
        std::fs::symlink_metadata(&list).is_err(),
        "a list was named"
    );
}

#[test]
fn record_never_replaces_a_file_that_is_not_a_list() {
    // `-o disk.img` (a typo for the list's name) used to replace the image with the list.
    let d = scratch("record-typo");
    let img = d.join("disk.img");
    write_file(&img, 64 << 10, 5);
    let before = std::fs::read(&img).unwrap();
    let scope = d.to_str().unwrap();
    let o = run_any(&[
        "readahead",
        "record",
        "-o",
        img.to_str().unwrap(),
        "--scope",
        scope,
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let e = text(&o.stderr);
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(e.contains("is not a readahead list"), "{e}");
    assert_eq!(std::fs::read(&img).unwrap(), before, "the image changed");
    // A list from an earlier recording (text or JSON Lines) and an empty file are replaced.
    for (name, old) in [
        ("old.list", "# snapblk-readahead-list v1\n"),
        (
            "old.jsonl",
            "{\"path\":\"/x\",\"identity\":null,\"ranges\":\"*\"}\n",
        ),
        ("empty.list", ""),
    ] {
        let l = d.join(name);
        std::fs::write(&l, old).unwrap();
        run(&[
            "readahead",
            "record",
            "-o",
            l.to_str().unwrap(),
            "--scope",
            scope,
            "--",
            "true",
        ]);
        assert_ne!(std::fs::read_to_string(&l).unwrap(), old, "{name}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
