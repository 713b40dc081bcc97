//! `snapblk bench` end to end: flags, sweeps, job files, JSON on stdout or in a file (validated
//! against crates/loadgen/schema.json), plots, file tests, errors reported as JSON.

use snapblk_loadgen::validate;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

fn snapblk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run snapblk")
}

/// `snapblk bench ARGS` started with its output piped, for tests that signal it.
fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .arg("bench")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run snapblk")
}

/// kill(1) `-SIG` to `pids`, which must all exist.
fn kill(sig: &str, pids: &[u32]) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(u32::to_string))
        .status()
        .expect("kill(1)");
    assert!(st.success(), "kill -{sig} {pids:?}");
}

/// A scratch directory for one test, removed when dropped (on failure too).
struct Scratch(PathBuf);

impl Scratch {
    /// In the temp dir.
    fn new(name: &str) -> Scratch {
        Scratch::under(&std::env::temp_dir(), name)
    }

    /// On tmpfs when there is one (fast, no disk wear), else in the temp dir.
    fn shm(name: &str) -> Scratch {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            Scratch::under(shm, name)
        } else {
            Scratch::new(name)
        }
    }

    fn under(parent: &Path, name: &str) -> Scratch {
        let d = parent.join(format!("snapblk-loadgen-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    /// A file `name` in it holding `len` bytes of `byte`.
    fn file(&self, name: &str, len: usize, byte: u8) -> PathBuf {
        let f = self.0.join(name);
        std::fs::write(&f, vec![byte; len]).unwrap();
        f
    }

    /// How many entries it holds.
    fn count(&self) -> usize {
        std::fs::read_dir(&self.0).unwrap().count()
    }

    /// The tests' scratch files were all removed.
    fn assert_empty(&self) {
        assert_eq!(
            self.count(),
            0,
            "test files left behind in {}",
            self.0.display()
        );
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    validate(&v).unwrap();
    v
}

/// The run succeeded (else fail with its stderr).
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The run succeeded and wrote a valid document on stdout.
fn ok_json(o: &Output) -> serde_json::Value {
    assert_ok(o);
    json(o)
}

/// The run failed with status 1 and a valid document whose error holds every `want`.
fn failed_json(o: &Output, want: &[&str]) -> serde_json::Value {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let v = json(o);
    let e = v["error"].as_str().unwrap();
    for w in want {
        assert!(e.contains(w), "{w:?} not in {e:?}");
    }
    v
}

/// `fgbg` arguments: `extra`, then `--iterations N --warmup W --pause 0 --json`.
fn fgbg_args<'a>(extra: &[&'a str], iterations: &'a str, warmup: &'a str) -> Vec<&'a str> {
    let mut a = vec!["fgbg"];
    a.extend_from_slice(extra);
    a.extend([
        "--iterations",
        iterations,
        "--warmup",
        warmup,
        "--pause",
        "0",
        "--json",
    ]);
    a
}

#[test]
fn sweep_to_json_with_plots() {
    let d = Scratch::new("sweep");
    let plots = d.join("plots");
    let o = snapblk(&[
        "null:size=64M",
        "--rw",
        "randread",
        "--sweep-bs",
        "4k,64k",
        "--iodepth",
        "1,8",
        "--runtime",
        "0.2",
        "--ramp-time",
        "0.05",
        "--json",
        "--plot",
        plots.to_str().unwrap(),
    ]);
    let v = ok_json(&o);
    let labels: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "randread bs=4k qd=1 jobs=1",
            "randread bs=4k qd=8 jobs=1",
            "randread bs=64k qd=1 jobs=1",
            "randread bs=64k qd=8 jobs=1"
        ]
    );
    assert_eq!(v["target"]["driver"], "null");
    assert_eq!(v["results"][0]["config"]["ramp_time"], 0.05);
    for f in ["latency-cdf.svg", "iops-vs-qd.svg", "timeseries.svg"] {
        let s = std::fs::read_to_string(plots.join(f)).unwrap();
        assert!(
            s.starts_with("<?xml") && s.contains("<svg") && s.trim_end().ends_with("</svg>"),
            "{f}"
        );
    }
}

#[test]
fn table_on_stdout_json_in_file_and_verify_on_a_file() {
    let d = Scratch::new("file");
    let img = d.file("img", 8 << 20, 0);
    let out = d.join("out.json");
    let o = snapblk(&[
        img.to_str().unwrap(),
        "--direct",
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--iodepth",
        "8",
        "--numjobs",
        "2",
        // fio's layout: 4 MiB per job, side by side (verify needs disjoint regions).
        "--size",
        "4M",
        "--offset_increment",
        "4M",
        "--verify",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_ok(&o);
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(table.starts_with("config"), "{table}");
    assert!(table.contains("randrw bs=4k qd=8 jobs=2"));
    // fio's default view: completion-latency percentiles, named as such.
    assert_eq!(
        header_cells(&table)[6..],
        ["clat p50", "clat p99", "clat p99.9", "clat p99.99"],
        "{table}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    validate(&v).unwrap();
    let clat = &v["results"][0]["summary"]["clat_ns"];
    assert!(clat["samples"].as_u64().unwrap() >= 2048, "{clat}");
    assert!(
        clat["mean"].as_f64().unwrap()
            < v["results"][0]["summary"]["lat_ns"]["mean"]
                .as_f64()
                .unwrap(),
        "clat is part of lat"
    );
    assert_eq!(v["context"]["target"]["kind"], "file");
    assert_eq!(v["results"][0]["config"]["direct"], true);
    assert_eq!(v["results"][0]["config"]["iomem"], "malloc");
    assert!(
        v["results"][0]["runs"][0]["verified_blocks"]
            .as_u64()
            .unwrap()
            >= 2048
    );
}

/// The column names of a `snapblk bench` table (cells are separated by two or more spaces).
fn header_cells(table: &str) -> Vec<String> {
    table
        .lines()
        .next()
        .unwrap_or("")
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn table_percentiles_follow_fios_percentile_options() {
    let base = ["null:size=64M", "--rw", "randread", "--runtime", "0.2"];
    let cols = |extra: &[&str]| {
        let o = snapblk(&[&base[..], extra].concat());
        assert_ok(&o);
        header_cells(&String::from_utf8(o.stdout).unwrap())[6..].to_vec()
    };
    let four = |k: &str| ["p50", "p99", "p99.9", "p99.99"].map(|p| format!("{k} {p}"));
    assert_eq!(
        cols(&["--lat_percentiles", "1", "--clat_percentiles", "0"]),
        four("lat")
    );
    // Several kinds appear in fio's order: slat, clat, lat.
    assert_eq!(
        cols(&["--lat_percentiles", "1", "--slat_percentiles", "1"]),
        [four("slat"), four("clat"), four("lat")].concat()
    );
    assert!(cols(&["--clat_percentiles", "0"]).is_empty());
    let o = snapblk(&[&base[..], &["--lat_percentiles", "maybe"]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected 0 or 1"));
}

#[test]
fn job_file_sweep() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench/jobs/sample.toml");
    let d = Scratch::new("jobs");
    // Shorter than the sample's own runtime: flags give defaults, the job file overrides them,
    // so copy the file with a small runtime.
    let text = std::fs::read_to_string(root)
        .unwrap()
        .replace("runtime = \"2s\"", "runtime = \"0.1s\"")
        .replace("ramp_time = \"0.5s\"", "ramp_time = 0");
    let jf = d.join("j.toml");
    std::fs::write(&jf, text).unwrap();
    let o = snapblk(&["null:size=1G", "--job-file", jf.to_str().unwrap(), "--json"]);
    let v = ok_json(&o);
    assert_eq!(v["results"].as_array().unwrap().len(), 6);
    assert_eq!(v["results"][5]["config"]["rw"], "write");
    // The job names of the file lead the labels, in the JSON and in the table.
    let label = |i: usize| v["results"][i]["label"].as_str().unwrap().to_string();
    assert!(label(0).starts_with("random-4k: "), "{}", label(0));
    assert!(label(5).starts_with("seq-1m: "), "{}", label(5));
    let o = snapblk(&["null:size=1G", "--job-file", jf.to_str().unwrap()]);
    assert_ok(&o);
    let table = String::from_utf8(o.stdout).unwrap();
    assert!(
        table.contains("random-4k: ") && table.contains("seq-1m: "),
        "{table}"
    );
}

#[test]
fn errors_still_produce_a_valid_document() {
    let o = snapblk(&["/nonexistent/snapblk-loadgen-target", "--json"]);
    assert!(!o.status.success());
    let v = json(&o);
    assert!(v["error"].as_str().unwrap().contains("nonexistent"), "{v}");
    let o = snapblk(&["null:size=1M", "--rw", "sideways"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown rw mode"));
}

#[test]
fn file_tests_and_overwrite() {
    let d = Scratch::new("iozone");
    let o = snapblk(&[
        "file",
        d.to_str().unwrap(),
        "-s",
        "256k",
        "--record-size",
        "4k,64k",
        "--fsync",
        "--json",
    ]);
    let v = ok_json(&o);
    assert_eq!(v["kind"], "file");
    assert_eq!(v["file_tests"]["cells"].as_array().unwrap().len(), 12);
    let o = snapblk(&["overwrite", d.to_str().unwrap(), "--mb", "1"]);
    assert_ok(&o);
    let t = String::from_utf8(o.stdout).unwrap();
    assert!(
        t.contains("overwrite MiB/s") && t.lines().count() == 4,
        "{t}"
    );
    d.assert_empty();
}

#[test]
fn foreground_under_background_command() {
    let d = Scratch::new("fgbg");
    let bg = d.file("bg", 2 << 20, 3);
    let o = snapblk(&fgbg_args(
        &[
            "--bg-read",
            bg.to_str().unwrap(),
            "--bg-cmd",
            "sleep 60",
            "--fg-cmd",
            "true",
        ],
        "2",
        "0.1",
    ));
    let v = ok_json(&o);
    let cells = v["fgbg"]["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    assert_eq!(cells[0]["load"], "idle");
    assert_eq!(cells[1]["load"], "loaded");
    assert!(cells[1]["bg_bytes_per_s"].as_f64().unwrap() > 0.0);
    assert!(cells[1]["slowdown"].as_f64().is_some());
}

#[test]
fn fgbg_json_stays_valid_when_commands_print() {
    // Foreground and background commands print; their stdout must go to our stderr, not into
    // the JSON document on our stdout.
    let o = snapblk(&fgbg_args(
        &[
            "--bg-cmd",
            "echo BG-POLLUTES; sleep 30",
            "--fg-cmd",
            "echo FG-POLLUTES",
        ],
        "2",
        "0.2",
    ));
    let v = ok_json(&o);
    assert_eq!(v["fgbg"]["cells"].as_array().unwrap().len(), 2);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("FG-POLLUTES") && err.contains("BG-POLLUTES"),
        "the commands' output belongs on stderr: {err}"
    );
}

#[test]
fn interrupted_json_run_still_writes_a_valid_document() {
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let t0 = std::time::Instant::now();
        // Signalled about 0.5 s into the first of 2 x 2 runs of 30 s.
        let args = [
            "null:size=256M",
            "--iodepth",
            "1,8",
            "--runtime",
            "30",
            "--time_based",
            "--repeat",
            "2",
            "--json",
        ];
        let (o, _, _) = interrupt_mode(&args, sig, |_| true);
        assert_eq!(
            o.status.code(),
            Some(code),
            "SIG{sig}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // The 30 s runtime was cut short (generous bound: this is not a timing test).
        assert!(t0.elapsed().as_secs() < 20, "SIG{sig} did not stop the run");
        let v = json(&o);
        assert_eq!(v["interrupted"], format!("SIG{sig}"));
        assert!(
            v["error"].as_str().unwrap().contains("partial results"),
            "{v}"
        );
        // The run in progress is reported with what it measured; nothing after it ran.
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "{v}");
        let run = &results[0]["runs"][0];
        assert!(run["read"]["ios"].as_u64().unwrap() > 0, "{run}");
        assert!(run["seconds"].as_f64().unwrap() < 20.0);
    }
}

#[test]
fn snapshot_spec_target() {
    let d = Scratch::new("snapshot");
    // A 4 MiB base and a new image with its second MiB changed, as a COW.
    let base: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut new = base.clone();
    new[1 << 20..2 << 20].fill(0xa5);
    let (old_p, new_p, cow) = (d.join("old.img"), d.join("new.img"), d.join("x.cow"));
    std::fs::write(&old_p, &base).unwrap();
    std::fs::write(&new_p, &new).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(["cow", "create", "--old"])
        .arg(&old_p)
        .arg("--new")
        .arg(&new_p)
        .arg("-o")
        .arg(&cow)
        .output()
        .unwrap();
    assert_ok(&o);
    let spec = format!("snapshot:base={},cow={}", old_p.display(), cow.display());
    // One sequential pass over the snapshot device: 64 reads of 64 KiB.
    let o = snapblk(&[
        &spec,
        "--rw",
        "read",
        "--bs",
        "64k",
        "--iodepth",
        "4",
        "--json",
    ]);
    let v = ok_json(&o);
    assert_eq!(v["target"]["driver"], "snapshot");
    assert_eq!(v["results"][0]["capacity"], 4 << 20);
    assert_eq!(v["results"][0]["runs"][0]["read"]["ios"], 64);
    // Writes through a writable snapshot, checked on read-back; the base stays untouched.
    let o = snapblk(&[
        &format!("{spec},writable=true"),
        "--rw",
        "randwrite",
        "--iodepth",
        "8",
        "--verify",
        "--json",
    ]);
    let v = ok_json(&o);
    assert_eq!(v["results"][0]["runs"][0]["verified_blocks"], 1024);
    assert_eq!(std::fs::read(&old_p).unwrap(), base, "the base was written");
}

#[test]
fn bad_input_gets_a_clear_one_line_error() {
    let d = Scratch::new("errors");
    let dir = d.to_str().unwrap();
    let missing = d.join("missing");
    let out_missing = d.join("no/such/dir/x.json");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["file", missing.to_str().unwrap()],
            "directory /", // the path, once
        ),
        (
            vec!["file", dir, "-s", "1m", "--record-size", "2m"],
            "every record size is larger than every file size",
        ),
        (vec!["file", dir, "-s", "0"], "must be above 0"),
        (
            vec!["null:size=1G", "--offset", "2G"],
            "offset 2147483648 is past the end of the target",
        ),
        (
            vec!["nosuchdriver:x=1"],
            "unknown driver \"nosuchdriver\" in device spec \"nosuchdriver:x=1\" (known: io_uring",
        ),
        (vec!["null:size=1G", "--driver", "null"], "--libblkio"),
        (vec!["null:size=1G", "--repeat", "0"], "--repeat"),
        (
            vec!["null:size=1G", "--iomem", "shm"],
            "unknown iomem \"shm\" (malloc, memfd)",
        ),
        (
            // Fails before the 30 s run, not after it.
            vec![
                "null:size=1G",
                "--runtime",
                "30",
                "--time_based",
                "--output",
                out_missing.to_str().unwrap(),
            ],
            "--output ",
        ),
    ];
    for (args, want) in cases {
        let t0 = std::time::Instant::now();
        let o = snapblk(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(t0.elapsed().as_secs() < 15, "{args:?} ran before failing");
        if err.starts_with("snapblk: ") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
    }
    let o = snapblk(&["file", missing.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    let path = missing.to_str().unwrap();
    assert_eq!(err.matches(path).count(), 1, "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

/// Every process descended from `root`, by scanning /proc (pid, start time).
fn descendants(root: u32) -> Vec<(u32, u64)> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((ppid, start)) = stat_of(pid) {
            parent.insert(pid, (ppid, start));
        }
    }
    let mut out = Vec::new();
    for (&pid, &(_, start)) in &parent {
        let mut p = pid;
        while let Some(&(pp, _)) = parent.get(&p) {
            if pp == root {
                out.push((pid, start));
                break;
            }
            if pp <= 1 {
                break;
            }
            p = pp;
        }
    }
    out
}

/// (parent pid, start time) of a live, non-zombie process.
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.first() == Some(&"Z") {
        return None;
    }
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

/// Processes whose command line contains `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
                && stat_of(*pid).is_some()
        })
        .collect()
}

/// Run `snapblk bench ARGS`, wait until `ready()` holds (at most 20 s) and then about 0.5 s
/// more, send `sig`, and return its output, how long it took to exit after the signal, and the
/// processes it had started (seen just before the signal).
fn interrupt_mode(
    args: &[&str],
    sig: &str,
    ready: impl Fn(u32) -> bool,
) -> (Output, std::time::Duration, Vec<(u32, u64)>) {
    use std::time::{Duration, Instant};
    let child = spawn(args);
    let pid = child.id();
    let t0 = Instant::now();
    while !ready(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{args:?} never got going"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let kids = descendants(pid);
    kill(sig, &[pid]);
    let sent = Instant::now();
    // Generous: this checks that it stops at all, not how fast.
    let o = wait_output(child, &format!("{args:?} after SIG{sig}"));
    (o, sent.elapsed(), kids)
}

/// The exit status, a valid document marked interrupted by `sig`, and its error text.
fn assert_interrupted(o: &Output, sig: &str, code: i32) -> serde_json::Value {
    assert_eq!(
        o.status.code(),
        Some(code),
        "SIG{sig}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(o);
    assert_eq!(v["interrupted"], format!("SIG{sig}"), "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("partial results"),
        "{v}"
    );
    v
}

#[test]
fn interrupted_file_tests_write_a_partial_document_and_remove_their_file() {
    let d = Scratch::shm("file-int");
    let dir = d.to_str().unwrap().to_string();
    // Long: 6 passes over 256 MiB in 512-byte records (several seconds even on tmpfs); the
    // signal comes once the scratch file exists.
    let (o, _, _) = interrupt_mode(
        &["file", &dir, "-s", "256m", "--record-size", "512", "--json"],
        "INT",
        |_| d.count() > 0,
    );
    let v = assert_interrupted(&o, "INT", 130);
    assert_eq!(v["kind"], "file");
    // Whatever completed is reported; the cell in progress is not.
    let cells = v["file_tests"]["cells"].as_array().unwrap();
    assert!(cells.len() < 6, "the sweep ran to its end: {v}");
    assert!(cells.iter().all(|c| c["ops"] == 524288), "{v}");
    d.assert_empty();
}

#[test]
fn interrupted_overwrite_writes_a_valid_document_and_removes_its_file() {
    let d = Scratch::shm("overwrite-int");
    let dir = d.to_str().unwrap().to_string();
    // 1 GiB in 1 KiB overwrites with fdatasync after each: far longer than the test waits.
    let (o, _, _) = interrupt_mode(
        &["overwrite", &dir, "--mb", "1024", "--fsync", "--json"],
        "TERM",
        |_| d.count() > 0,
    );
    let v = assert_interrupted(&o, "TERM", 143);
    assert_eq!(v["kind"], "file");
    // The only variant was cut short: no measurement to report.
    assert!(v["file_tests"].is_null(), "{v}");
    d.assert_empty();
}

#[test]
fn interrupted_fgbg_kills_and_reaps_everything_it_started() {
    let d = Scratch::shm("fgbg-int");
    let bg = d.file("bg", 4 << 20, 3);
    let w = d.join("w");
    let flag = d.join("loaded");
    let marker = format!("snapblk-fgbg-int-{}", std::process::id());
    // The background command marks the load as started; from then on the foreground hangs, so
    // the signal lands with the loaded cell's foreground and background all running.
    let bg_cmd = format!("touch {} && sleep 1000 && echo {marker}-bg", flag.display());
    let fg_cmd = format!(
        "test -e {} && sleep 1000 && echo {marker}-fg || true",
        flag.display()
    );
    for (sig, code) in [("INT", 130), ("TERM", 143)] {
        let _ = std::fs::remove_file(&flag);
        let (o, _, kids) = interrupt_mode(
            &fgbg_args(
                &[
                    "--bg-read",
                    bg.to_str().unwrap(),
                    "--bg-write",
                    w.to_str().unwrap(),
                    "--bg-size",
                    "2M",
                    "--bg-cmd",
                    &bg_cmd,
                    "--fg-cmd",
                    &fg_cmd,
                ],
                "2",
                "0.1",
            ),
            sig,
            // Both commands of the loaded cell run (children of the CLI, not the CLI itself,
            // whose own command line holds the markers too).
            |pid| {
                let kids: Vec<u32> = descendants(pid).iter().map(|k| k.0).collect();
                let running = |m: &str| with_marker(m).iter().any(|p| kids.contains(p));
                running(&format!("{marker}-bg")) && running(&format!("{marker}-fg"))
            },
        );
        let v = assert_interrupted(&o, sig, code);
        assert_eq!(v["kind"], "fgbg");
        // The idle cell completed; the loaded one had no foreground run done: left out.
        let cells = v["fgbg"]["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 1, "{v}");
        assert_eq!(cells[0]["load"], "idle");
        assert_eq!(cells[0]["fg_seconds"].as_array().unwrap().len(), 2);
        assert!(
            kids.len() >= 4,
            "expected two shells and two sleeps: {kids:?}"
        );
        let alive: Vec<_> = kids
            .iter()
            .filter(|(pid, start)| stat_of(*pid).is_some_and(|(_, s)| s == *start))
            .collect();
        assert!(alive.is_empty(), "SIG{sig}: children survived: {alive:?}");
        let marked = with_marker(&format!("{marker}-"));
        assert!(marked.is_empty(), "SIG{sig}: commands survived: {marked:?}");
    }
}

#[test]
fn misaligned_direct_options_fail_up_front() {
    let d = Scratch::new("align");
    let img = d.file("img", 8 << 20, 0);
    let before = std::fs::metadata(&img).unwrap().modified().unwrap();
    let t = img.to_str().unwrap();
    // Each would fail only mid-run with EINVAL if not checked first; the 30 s sweep shows the
    // good first configuration never ran.
    let cases: [(&[&str], &str); 4] = [
        (
            &["--bs", "1000"],
            "--bs 1000 is not a multiple of the target's ",
        ),
        (
            &["--offset", "1000"],
            "--offset 1000 is not a multiple of the target's ",
        ),
        (
            &["--size", "1000000"],
            "--size 1000000 is not a multiple of the target's ",
        ),
        (
            &[
                "--sweep-bs",
                "4k,1000",
                "--runtime",
                "30",
                "--time_based",
                "--rw",
                "randwrite",
            ],
            "--bs 1000 is not a multiple of the target's ",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec![t, "--direct", "--json"];
        args.extend_from_slice(extra);
        let t0 = std::time::Instant::now();
        let o = snapblk(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        // One line, apart from warnings about a busy host.
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| !l.starts_with("warning: "))
            .collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(lines[0].contains(want), "{args:?}: {err}");
        assert!(lines[0].ends_with("-byte direct I/O alignment"), "{err}");
        assert!(t0.elapsed().as_secs() < 15, "{args:?} ran before failing");
        // The error document: no configuration ran.
        let v = json(&o);
        assert_eq!(v["results"].as_array().unwrap().len(), 0, "{v}");
    }
    assert_eq!(std::fs::metadata(&img).unwrap().modified().unwrap(), before);
    // Without --direct the file driver has no alignment to demand: the same bs runs.
    let o = snapblk(&[t, "--bs", "1000", "--size", "1000000", "--json"]);
    assert_ok(&o);
    assert_eq!(json(&o)["results"][0]["runs"][0]["read"]["ios"], 1000);
}

/// A loop device over a tmpfs file, detached on drop (needs root, as the tests run here).
struct LoopDev {
    dev: String,
    dir: Scratch,
}

impl LoopDev {
    fn new(name: &str) -> LoopDev {
        let dir = Scratch::shm(name);
        let img = dir.file("img", 16 << 20, 0);
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&img)
            .output()
            .expect("losetup (util-linux) must be installed");
        assert!(
            o.status.success(),
            "losetup failed (root needed): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let dev = String::from_utf8(o.stdout).unwrap().trim().to_string();
        LoopDev { dev, dir }
    }
    fn sysfs(&self) -> PathBuf {
        PathBuf::from("/sys/block").join(self.dev.trim_start_matches("/dev/"))
    }
    fn scheduler(&self) -> String {
        let s = std::fs::read_to_string(self.sysfs().join("queue/scheduler")).unwrap();
        let a = s.split_whitespace().find(|w| w.starts_with('[')).unwrap();
        a.trim_matches(|c| c == '[' || c == ']').to_string()
    }
    fn set_scheduler(&self, s: &str) {
        std::fs::write(self.sysfs().join("queue/scheduler"), s).unwrap();
        assert_eq!(self.scheduler(), s);
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        // Before `dir` (and the image in it) goes.
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

#[test]
fn fgbg_cells_carry_their_schedulers_tunables_and_the_scheduler_is_restored() {
    let lo = LoopDev::new("sched");
    // Start from mq-deadline, so that restoring it after ending on `none` is visible, with a
    // tunable off its default: switching schedulers resets tunables, so it must be put back too.
    lo.set_scheduler("mq-deadline");
    let read_expire = lo.sysfs().join("queue/iosched/read_expire");
    std::fs::write(&read_expire, "124").unwrap();
    let tunable = || {
        std::fs::read_to_string(&read_expire)
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(tunable(), "124");
    let expect_keys: Vec<String> = std::fs::read_dir(lo.sysfs().join("queue/iosched"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        expect_keys.iter().any(|k| k == "fifo_batch"),
        "{expect_keys:?}"
    );
    let o = snapblk(&fgbg_args(
        &[
            "--device",
            &lo.dev,
            "--schedulers",
            "mq-deadline,none",
            "--bg-read",
            &lo.dev,
            "--fg-cmd",
            "true",
        ],
        "1",
        "0.1",
    ));
    let v = ok_json(&o);
    let cells = v["fgbg"]["cells"].as_array().unwrap();
    let got: Vec<(&str, &str)> = cells
        .iter()
        .map(|c| {
            (
                c["scheduler"].as_str().unwrap(),
                c["load"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("mq-deadline", "idle"),
            ("mq-deadline", "loaded"),
            ("none", "idle"),
            ("none", "loaded")
        ]
    );
    for c in &cells[..2] {
        let t = c["scheduler_tunables"].as_object().unwrap();
        let mut keys: Vec<&String> = t.keys().collect();
        keys.sort();
        let mut want: Vec<&String> = expect_keys.iter().collect();
        want.sort();
        assert_eq!(keys, want, "{c}");
        assert!(t.values().all(|v| !v.as_str().unwrap().is_empty()), "{c}");
    }
    for c in &cells[2..] {
        // `none` has no tunables: an empty object, not a missing or null field.
        assert_eq!(c["scheduler_tunables"], serde_json::json!({}), "{c}");
    }
    assert_eq!(lo.scheduler(), "mq-deadline", "scheduler not restored");
    assert_eq!(tunable(), "124", "tunable not restored");

    // Interrupted while `none` is switched in: the original comes back all the same.
    let flag = lo.dir.join("loaded");
    let (o, _, _) = interrupt_mode(
        &fgbg_args(
            &[
                "--device",
                &lo.dev,
                "--schedulers",
                "none",
                "--bg-read",
                &lo.dev,
                "--bg-cmd",
                &format!("touch {} && sleep 1000", flag.display()),
                "--fg-cmd",
                &format!("test -e {} && sleep 1000 || true", flag.display()),
            ],
            "1",
            "0.1",
        ),
        "INT",
        |_| flag.exists(),
    );
    let v = assert_interrupted(&o, "INT", 130);
    assert_eq!(v["fgbg"]["cells"][0]["scheduler"], "none");
    assert_eq!(lo.scheduler(), "mq-deadline", "scheduler not restored");
    assert_eq!(tunable(), "124", "tunable not restored");
}

/// Waits for `child`, failing after 20 s.
fn wait_output(child: Child, what: &str) -> Output {
    snapblk_testsupport::output_within(child, std::time::Duration::from_secs(20), what)
}

#[test]
fn a_signal_delivered_twice_at_once_still_reports_the_partial_results() {
    // GNU timeout signals its child and then its whole process group: the same interrupt
    // arrives twice within microseconds. That is not "quit at once": the results must come.
    for round in 0..3 {
        for (sig, code) in [("INT", 130), ("TERM", 143)] {
            let child = spawn(&[
                "null:size=256M",
                "--runtime",
                "30",
                "--time_based",
                "--json",
            ]);
            std::thread::sleep(std::time::Duration::from_millis(300));
            // kill(1) sends to each pid in turn: two signals back to back.
            kill(sig, &[child.id(), child.id()]);
            let o = wait_output(child, &format!("round {round} SIG{sig} twice"));
            let v = assert_interrupted(&o, sig, code);
            assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
        }
        for (sig, code) in [("TERM", 143), ("INT", 130)] {
            let child = Command::new("timeout")
                .args(["--preserve-status", "-s", sig, "0.7"])
                .arg(env!("CARGO_BIN_EXE_snapblk"))
                .args([
                    "bench",
                    "null:size=256M",
                    "--runtime",
                    "30",
                    "--time_based",
                    "--json",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("timeout (coreutils) must be installed");
            let o = wait_output(child, &format!("round {round} timeout -s {sig}"));
            let v = assert_interrupted(&o, sig, code);
            let run = &v["results"][0]["runs"][0];
            assert!(run["read"]["ios"].as_u64().unwrap() > 0, "{v}");
        }
    }
}

#[test]
fn a_second_interrupt_a_second_later_quits_at_once_but_cleans_up() {
    // The loaded cell hangs for good in the foreground (opening a FIFO nobody writes, which
    // no stop flag can end); a user's second Ctrl-C then quits at once, and must still kill
    // and reap the background command and put the device's scheduler back.
    let lo = LoopDev::new("quitnow");
    lo.set_scheduler("mq-deadline");
    let real = lo.dir.file("real", 64 << 10, 7);
    let fifo = lo.dir.join("fifo");
    let list = lo.dir.join("list");
    std::fs::write(&list, format!("{}\n{}\n", real.display(), fifo.display())).unwrap();
    let marker = format!("snapblk-quitnow-{}", std::process::id());
    // The FIFO appears only with the load, so the idle cell completes (reading `real`).
    let bg_cmd = format!("mkfifo {} && sleep 1000 && echo {marker}", fifo.display());
    let child = spawn(&fgbg_args(
        &[
            "--device",
            &lo.dev,
            "--schedulers",
            "none",
            "--bg-cmd",
            &bg_cmd,
            "--fg-list",
            list.to_str().unwrap(),
        ],
        "1",
        "0.2",
    ));
    let pid = child.id();
    let t0 = std::time::Instant::now();
    while !fifo.exists() || with_marker(&marker).is_empty() {
        assert!(t0.elapsed().as_secs() < 20, "the loaded cell never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(lo.scheduler(), "none");
    let kids = descendants(pid);
    kill("INT", &[pid]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // The first interrupt could not end the hung foreground.
    assert!(stat_of(pid).is_some(), "exited on the first signal");
    kill("INT", &[pid]);
    let o = wait_output(child, "second SIGINT");
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("giving up at once"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!kids.is_empty());
    let alive: Vec<_> = kids
        .iter()
        .filter(|(p, start)| stat_of(*p).is_some_and(|(_, s)| s == *start))
        .collect();
    assert!(alive.is_empty(), "children survived: {alive:?}");
    assert!(with_marker(&marker).is_empty(), "the command survived");
    assert_eq!(lo.scheduler(), "mq-deadline", "scheduler not restored");
}

#[test]
fn fgbg_fails_when_the_background_ends_early() {
    let d = Scratch::shm("bg-ends");
    let bin = env!("CARGO_BIN_EXE_snapblk");
    let fgbg = |bg: &[&str], fg_cmd: &str| {
        let mut a = bg.to_vec();
        a.extend(["--fg-cmd", fg_cmd]);
        snapblk(&fgbg_args(&a, "2", "0.3"))
    };
    // Said on stderr too, and no cells reported.
    let failed = |o: &Output, want: &[&str]| {
        let v = failed_json(o, want);
        let err = String::from_utf8_lossy(&o.stderr);
        for w in want {
            assert!(err.contains(w), "{w:?} not in {err:?}");
        }
        assert!(v["fgbg"].is_null(), "{v}");
    };
    // Exits before the first loaded foreground run (during the warm-up).
    let o = fgbg(&["--bg-cmd", "exit 3", "--bg-cmd", "sleep 60"], "true");
    failed(&o, &["background command `exit 3`", "exit status: 3"]);
    // A background merge that fails at once.
    let merge = format!(
        "{bin} merge --base {0}/missing.img {0}/missing.cow",
        d.display()
    );
    let o = fgbg(&["--bg-cmd", &merge], "true");
    failed(&o, &["background command", "missing.cow", "exit status: "]);
    // A foreground command that outlives --fg-timeout is no sample: the run fails.
    let mut a = fgbg_args(&["--bg-cmd", "sleep 60", "--fg-cmd", "sleep 5"], "2", "0.3");
    a.extend(["--fg-timeout", "0.2"]);
    failed(&snapblk(&a), &["did not finish within --fg-timeout 0.2 s"]);
    // Ends with status 0 while the first loaded foreground run is going on.
    let o = fgbg(&["--bg-cmd", "sleep 0.5"], "sleep 0.9");
    failed(&o, &["ended during the loaded cell", "exit status: 0"]);
    // A background reader whose file is cut short meanwhile: its read fails.
    let f = d.file("shrinks", 8 << 20, 1);
    let cut = format!("sleep 0.1; truncate -s 0 {}; sleep 60", f.display());
    let o = fgbg(
        &["--bg-read", f.to_str().unwrap(), "--bg-cmd", &cut],
        "true",
    );
    failed(&o, &["background stream on", "shrinks"]);
}

#[test]
fn fgbg_read_list_problems_are_named_and_nothing_is_never_measured() {
    let d = Scratch::shm("fglist");
    let fgbg = |list: &Path| {
        let list = list.to_str().unwrap();
        snapblk(&fgbg_args(
            &["--bg-cmd", "sleep 60", "--fg-list", list],
            "1",
            "0",
        ))
    };
    let failed = |o: &Output, want: &[&str]| {
        failed_json(o, want);
    };
    // A missing list file: its path is in the error.
    let missing = d.join("no-such.list");
    failed(
        &fgbg(&missing),
        &["--fg-list", "no-such.list", "No such file"],
    );
    // Only missing files: nothing to replay.
    let list = d.join("garbage.list");
    std::fs::write(&list, "garbage\n").unwrap();
    failed(&fgbg(&list), &["garbage.list", "nothing to replay"]);
    // A file present but shorter than the list's only range: the replay reads 0 bytes.
    let short = d.join("short");
    std::fs::write(&short, b"x").unwrap();
    let list = d.join("short.list");
    std::fs::write(&list, format!("{} 4096:4096\n", short.display())).unwrap();
    let o = fgbg(&list);
    if o.status.success() {
        panic!(
            "a replay of nothing measured: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    failed(&o, &["short.list", "read 0 bytes"]);
    // One missing file next to a real one: measured, with a warning naming both paths.
    let real = d.file("real", 256 << 10, 5);
    let list = d.join("mixed.list");
    std::fs::write(&list, format!("{}\n{}/gone\n", real.display(), d.display())).unwrap();
    let o = fgbg(&list);
    let v = ok_json(&o);
    let w: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        w.iter()
            .any(|w| w.contains("mixed.list") && w.contains("/gone") && w.contains("skipped")),
        "{w:?}"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("/gone"));
    let cells = v["fgbg"]["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    assert!(
        cells
            .iter()
            .all(|c| c["fg_lat_p50_ns"].as_u64().unwrap() > 0),
        "{v}"
    );
}

#[test]
fn direct_on_a_target_without_a_file_is_warned_about_and_recorded_as_off() {
    let warned = |v: &serde_json::Value| {
        v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("--direct ignored: "))
    };
    let o = snapblk(&["null:size=64M", "--direct", "--runtime", "0.1", "--json"]);
    let v = ok_json(&o);
    assert!(warned(&v), "{v}");
    assert_eq!(v["results"][0]["config"]["direct"], false, "{v}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("warning: --direct ignored: null:size=64M")
    );
    // The fgbg foreground workload too.
    let o = snapblk(&fgbg_args(
        &[
            "--bg-cmd",
            "sleep 60",
            "--fg-target",
            "null:size=64M",
            "--size",
            "1M",
            "--direct",
        ],
        "1",
        "0",
    ));
    let v = ok_json(&o);
    assert!(warned(&v), "{v}");
    assert_eq!(
        v["fgbg"]["spec"]["foreground"]["job"]["direct"], false,
        "{v}"
    );
    // A file target is opened O_DIRECT: no warning, direct stays on.
    let d = Scratch::shm("direct-file");
    let img = d.file("img", 1 << 20, 0);
    let o = snapblk(&[img.to_str().unwrap(), "--direct", "--json"]);
    let v = ok_json(&o);
    assert!(!warned(&v), "{v}");
    assert_eq!(v["results"][0]["config"]["direct"], true);
}

#[test]
fn read_only_jobs_work_with_read_access_alone() {
    use std::os::unix::fs::PermissionsExt;
    let d = Scratch::shm("readonly");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = d.file("ro.img", 4 << 20, 9);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).unwrap();
    let t = f.to_str().unwrap();
    // As nobody: may read the root-owned file, may not write it.
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_snapblk"))
            .arg("bench")
            .args(args)
            .output()
            .expect("setpriv (util-linux) must be installed")
    };
    for args in [
        &[t, "--rw", "randread", "--json"][..],
        &[t, "--rw", "read,randread", "--sweep-bs", "4k,64k", "--json"],
        &[t, "--rw", "rw", "--rwmixread", "100", "--json"],
    ] {
        let o = as_nobody(args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v = json(&o);
        for r in v["results"].as_array().unwrap() {
            assert!(r["runs"][0]["read"]["ios"].as_u64().unwrap() > 0, "{r}");
        }
    }
    // Anything that writes still needs write access, and says so.
    for args in [
        &[t, "--rw", "randwrite"][..],
        &[t, "--rw", "read", "--verify"],
        &[t, "--rw", "read,write"],
    ] {
        let o = as_nobody(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("Permission denied"), "{args:?}: {err}");
    }
}

#[test]
fn bad_plot_dirs_and_background_paths_fail_before_anything_runs() {
    // A 30 s run that never starts: no results in the error document.
    let o = snapblk(&[
        "null:size=64M",
        "--runtime",
        "30",
        "--time_based",
        "--plot",
        "/proc/snapblk-no",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("--plot /proc/snapblk-no"),
        "{v}"
    );
    assert_eq!(v["results"], serde_json::json!([]), "{v}");
    // The idle cell's foreground would leave a mark: it must never run.
    let d = Scratch::shm("bg-check");
    let mark = d.join("fg-ran");
    let fg = format!("touch {}", mark.display());
    let small = d.join("small");
    std::fs::write(&small, b"tiny").unwrap();
    for (bg, want) in [
        (
            &["--bg-read", "/nonexistent/snapblk-bg"][..],
            "background /nonexistent/snapblk-bg: No such file",
        ),
        (
            &["--bg-read", small.to_str().unwrap()],
            "needs at least 1 MiB",
        ),
        (
            &["--bg-write", "/nonexistent/dir/w"],
            "background /nonexistent/dir/w: No such file",
        ),
    ] {
        let mut a = bg.to_vec();
        a.extend(["--fg-cmd", &fg]);
        let o = snapblk(&fgbg_args(&a, "1", "0"));
        assert_eq!(o.status.code(), Some(1), "{bg:?}");
        let e = json(&o)["error"].as_str().unwrap().to_string();
        assert!(e.contains(want), "{bg:?}: {e}");
        assert!(!mark.exists(), "{bg:?}: the idle cell ran first");
    }
}

#[test]
fn overwrite_shows_byte_progress_on_a_terminal_only() {
    let d = Scratch::shm("overwrite-progress");
    let dir = d.to_str().unwrap();
    let cmd = format!(
        "{} bench overwrite {dir} --mb 8 --fsync",
        env!("CARGO_BIN_EXE_snapblk")
    );
    // script(1) runs it on a pseudo-terminal and copies what it draws (stdout and stderr).
    let o = Command::new("script")
        .args(["-qefc", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script (bsdutils) must be installed");
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    // Each pass gets its bar, labelled, with the file's size as total and a rate.
    for pass in ["create (with fsync) ", "overwrite (with fsync) "] {
        let frame = tty
            .split(['\r', '\n'])
            .find(|l| l.contains(pass))
            .unwrap_or_else(|| panic!("no {pass:?} bar: {tty:?}"));
        assert!(
            frame.contains("/8.00 MiB ") && frame.contains("B/s"),
            "{frame:?}"
        );
    }
    assert!(tty.contains("overwrite MiB/s"), "no table: {tty:?}");
    // Without a terminal: the table alone, no progress on stderr.
    let o = snapblk(&["overwrite", dir, "--mb", "8", "--fsync"]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("MiB"), "progress without a terminal: {err:?}");
}

/// `--output` that is the same file as the target or the job file (by name or through a
/// link) is refused before the run: the document would replace the data it measured.
#[test]
fn output_never_replaces_the_target_or_the_job_file() {
    let d = Scratch::new("output-alias");
    let img = d.file("data.img", 1 << 20, 0x5a);
    let link = d.0.join("link.json");
    std::os::unix::fs::symlink(&img, &link).unwrap();
    let job = d.0.join("job.fio");
    let job_text = format!(
        "[r]\nfilename={}\nrw=read\nbs=4k\nsize=64k\n",
        img.display()
    );
    std::fs::write(&job, &job_text).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let (i, l, j) = (s(&img), s(&link), s(&job));
    let (i, l, j) = (i.as_str(), l.as_str(), j.as_str());
    for (args, flag) in [
        (
            vec![i, "--rw", "read", "--size", "64k", "--output", i],
            "TARGET",
        ),
        (
            vec![i, "--rw", "read", "--size", "64k", "--output", l],
            "TARGET",
        ),
        (
            vec!["--filename", i, "--size", "64k", "--output", i],
            "--filename",
        ),
        (vec!["--job-file", j, "--output", j], "--job-file"),
    ] {
        let o = snapblk(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("is the same file as {flag}")),
            "{args:?}: {err}"
        );
        assert!(
            std::fs::read(&img).unwrap() == vec![0x5a; 1 << 20],
            "{args:?}"
        );
        assert_eq!(std::fs::read_to_string(&job).unwrap(), job_text, "{args:?}");
    }
}

/// `--output` is replaced atomically (a new file renamed into place), never rewritten in
/// place: a hard link to the previous document keeps it, and the new one validates.
#[test]
fn output_is_replaced_not_rewritten() {
    let d = Scratch::new("output-atomic");
    let out = d.0.join("r.json");
    std::fs::write(&out, b"{}\n").unwrap();
    let peer = d.0.join("peer.json");
    std::fs::hard_link(&out, &peer).unwrap();
    let o = snapblk(&[
        "null:size=1M",
        "--size",
        "64k",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_ok(&o);
    assert!(
        std::fs::read(&peer).unwrap() == b"{}\n",
        "the old document was rewritten in place"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    validate(&v).unwrap();
}

#[test]
fn output_never_replaces_a_file_that_is_not_a_result() {
    // `--output disk.img` (a typo for the result's name) used to replace the image with the
    // JSON document; an earlier result, an empty file and a new name are written.
    let d = Scratch::shm("output-typo");
    let img = d.file("disk.img", 1 << 20, 0x5a);
    let args = |out: &Path| {
        let out = out.to_str().unwrap();
        snapblk(&[
            "null:size=1M",
            "--rw",
            "read",
            "--size",
            "64k",
            "--output",
            out,
        ])
    };
    let o = args(&img);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("is not a JSON document"), "{err}");
    assert!(std::fs::read(&img).unwrap() == vec![0x5a; 1 << 20]);
    for (name, old) in [("old.json", "{\"schema\":\"x\"}\n"), ("empty.json", "")] {
        let p = d.0.join(name);
        std::fs::write(&p, old).unwrap();
        let o = args(&p);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert!(v.get("results").is_some(), "{v}");
    }
}
