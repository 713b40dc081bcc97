//! fio's spellings in `snapblk bench`: fio command lines and a fio job file run unchanged, on
//! tmpfs files. Real fio is the reference for what the command lines mean: it parses every one
//! of them (`fio --parse-only`), and where a run is size-based (one pass, so its I/O count is
//! fixed) fio's count of I/Os is the expected one. How fast either tool is, is measured by
//! bench/fio-agreement.sh, never asserted here.

use snapblk_loadgen::validate;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const JOB_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../bench/jobs/fio-agreement.fio"
);

/// A directory on tmpfs (the test files are small), removed on drop.
struct Shm(PathBuf);

impl Shm {
    fn new(name: &str) -> Shm {
        let d =
            Path::new("/dev/shm").join(format!("snapblk-bench-fio-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Shm(d)
    }
    /// A file of `len` bytes of varied data.
    fn file(&self, name: &str, len: usize) -> String {
        let p = self.0.join(name);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&p, data).unwrap();
        p.to_str().unwrap().to_string()
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn snapblk(args: &[String], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .arg("bench")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run snapblk")
}

fn fio(args: &[String], env: &[(&str, &str)]) -> Output {
    Command::new("fio")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run fio (Debian package fio, scripts/install-deps.sh)")
}

/// stdout as a document that validates against the loadgen schema.
fn doc(o: &Output, what: &str) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{what}: not JSON ({e})"));
    validate(&v).unwrap_or_else(|e| panic!("{what}: {e}"));
    v
}

/// I/Os of snapblk result `i` (reads + writes of its only run).
fn snap_ios(v: &serde_json::Value, i: usize) -> u64 {
    let r = &v["results"][i]["runs"][0];
    r["read"]["ios"].as_u64().unwrap() + r["write"]["ios"].as_u64().unwrap()
}

/// I/Os of fio job (group) `i` of a `--output-format=json` document.
fn fio_ios(o: &Output, i: usize) -> u64 {
    assert!(
        o.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // fio may print notes before the document.
    let s = String::from_utf8_lossy(&o.stdout);
    let v: serde_json::Value = serde_json::from_str(&s[s.find('{').unwrap()..]).unwrap();
    let j = &v["jobs"][i];
    j["read"]["total_ios"].as_u64().unwrap() + j["write"]["total_ios"].as_u64().unwrap()
}

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

#[test]
fn fio_command_lines_run_unchanged() {
    let d = Shm::new("lines");
    let f = d.file("data.img", 4 << 20);
    // (command line, fio runs it here too, expected I/Os when size-based)
    let lines: [(String, bool, Option<u64>); 6] = [
        // size per job as fio means it: 2 jobs x 1 MiB = 512 reads of 4 KiB.
        (format!("--name=seq --filename={f} --ioengine=psync --direct=1 --rw=read --bs=4k --size=1M --numjobs=2 --group_reporting --output-format=json"), true, Some(512)),
        // A runtime without time_based only caps the pass.
        (format!("--name=rand --filename={f} --ioengine=io_uring --rw=randread --bs=4k --iodepth=8 --size=1M --runtime=30 --output-format=json"), true, Some(256)),
        (format!("--name=tb --filename={f} --ioengine=libaio --rw=randwrite --bs=4k,4k --iodepth=4 --size=1M --time_based --runtime=300ms --ramp_time=100ms --thread --output-format=json"), true, None),
        ("--name=nul --ioengine=null --rw=randrw --rwmixread=70 --bs=4k --size=1M --output-format=json".to_string(), true, Some(256)),
        (format!("--name=inc --filename={f} --rw=read --bs=4k --size=512k --numjobs=2 --offset_increment=1M --group_reporting --output-format=json"), true, Some(256)),
        // fio's libblkio engine with snapblk's own driver (Debian's fio has no libblkio).
        (format!("--name=blk --ioengine=libblkio --libblkio_driver=io_uring --filename={f} --rw=read --bs=64k --size=1M --output-format=json"), false, Some(16)),
    ];
    for (line, fio_too, ios) in &lines {
        let a = args(line);
        if *fio_too {
            let mut p = vec!["--parse-only".to_string()];
            p.extend(a.iter().cloned());
            let o = fio(&p, &[]);
            assert!(
                o.status.success(),
                "fio refuses {line}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let v = doc(&snapblk(&a, &[]), line);
        let cfg = &v["results"][0]["config"];
        let name = a[0].strip_prefix("--name=").unwrap();
        assert_eq!(cfg["name"], name, "{line}");
        if let Some(n) = ios {
            assert_eq!(snap_ios(&v, 0), *n, "{line}");
            if *fio_too {
                assert_eq!(fio_ios(&fio(&a, &[]), 0), *n, "fio: {line}");
            }
        }
    }
    // What the options turned into.
    let v = doc(&snapblk(&args(&lines[0].0), &[]), "seq");
    assert_eq!(v["target"]["spec"], format!("sync:path={f}"));
    let cfg = &v["results"][0]["config"];
    assert_eq!(
        (cfg["numjobs"].as_u64(), cfg["size"].as_u64()),
        (Some(2), Some(1 << 20))
    );
    assert_eq!(cfg["direct"], true);
    let o = snapblk(&args(&lines[2].0), &[]);
    let v = doc(&o, "tb");
    assert_eq!(v["target"]["driver"], "io_uring");
    assert_eq!(v["results"][0]["config"]["time_based"], true);
    assert!(v["results"][0]["runs"][0]["write"]["ios"].as_u64().unwrap() > 0);
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("ioengine=libaio runs on snapblk's io_uring")),
        "{warnings:?}"
    );
    let v = doc(&snapblk(&args(&lines[3].0), &[]), "null");
    assert_eq!(v["target"]["spec"], "null:size=1048576");
    assert_eq!(v["results"][0]["config"]["rwmixread"], 70);
    let v = doc(&snapblk(&args(&lines[5].0), &[]), "libblkio");
    assert_eq!(v["target"]["spec"], format!("io_uring:path={f}"));
}

#[test]
fn the_fio_job_file_runs_unchanged_under_both_tools() {
    let d = Shm::new("jobfile");
    let f = d.file("data.img", 4 << 20);
    let env = [
        ("FIOFILE", f.as_str()),
        ("FIOSIZE", "1M"),
        ("FIORUNTIME", "200ms"),
        ("FIORAMP", "0"),
    ];
    let o = snapblk(&[JOB_FILE.to_string(), "--output-format=json".into()], &env);
    let v = doc(&o, "job file");
    let names: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["config"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "seqread-1m",
            "randread-4k",
            "randwrite-4k",
            "randrw-4k-2jobs"
        ]
    );
    let last = &v["results"][3]["config"];
    assert_eq!(
        (last["numjobs"].as_u64(), last["rwmixread"].as_u64()),
        (Some(2), Some(70))
    );
    assert!(
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["config"]["time_based"] == true && r["config"]["direct"] == true)
    );
    assert_eq!(v["target"]["spec"], format!("sync:path={f}"));
    // Every option in it is supported: no warning names one.
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !stderr.contains("ignored") && !stderr.contains("runs after"),
        "{stderr}"
    );
    // fio runs the same file (what both measure is compared by bench/fio-agreement.sh).
    let o = fio(&[JOB_FILE.to_string(), "--output-format=json".into()], &env);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_size_based_job_file_does_the_ios_fio_does_and_names_what_it_ignores() {
    let d = Shm::new("ignored");
    let f = d.file("data.img", 4 << 20);
    let text = format!(
        "[global]\nfilename={f}\nbs=4k\nsize=512k\nnorandommap\nrate=10m\n\n\
         [one]\nrw=read\ndisable_slat=1\n\n[two]\nrw=randwrite\nnumjobs=2\noffset_increment=1M\n"
    );
    let jf = d.0.join("jobs.fio");
    std::fs::write(&jf, text).unwrap();
    let jf = jf.to_str().unwrap().to_string();
    let o = snapblk(&[jf.clone(), "--output-format=json".into()], &[]);
    let v = doc(&o, "job file");
    let fo = fio(&[jf.clone(), "--output-format=json".into()], &[]);
    for i in 0..2 {
        // fio reports numjobs=2 as two jobs without group_reporting.
        let want = if i == 0 {
            fio_ios(&fo, 0)
        } else {
            fio_ios(&fo, 1) + fio_ios(&fo, 2)
        };
        assert_eq!(snap_ios(&v, i), want, "job {i}");
    }
    assert_eq!((snap_ios(&v, 0), snap_ios(&v, 1)), (128, 256));
    // One warning line per ignored option, and one for the job fio would run concurrently.
    let err = String::from_utf8_lossy(&o.stderr);
    let warn: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("warning: ") && !l.contains("busy") && !l.contains("pressure"))
        .collect();
    assert_eq!(warn.len(), 4, "{err}");
    for opt in ["norandommap", "rate=10m", "disable_slat=1"] {
        assert_eq!(
            warn.iter()
                .filter(|w| w.contains(&format!("ignored fio option {opt} ")))
                .count(),
            1,
            "{opt}: {err}"
        );
    }
    assert!(
        warn.iter()
            .any(|w| w.contains("job \"two\" runs after \"one\"")),
        "{err}"
    );
}

#[test]
fn engines_without_an_equivalent_and_per_direction_sizes_are_refused_in_one_line() {
    let d = Shm::new("refused");
    let f = d.file("data.img", 1 << 20);
    for (line, want) in [
        (
            format!("--filename={f} --ioengine=posixaio"),
            "ioengine=posixaio has no snapblk equivalent",
        ),
        (
            format!("--filename={f} --ioengine=mmap"),
            "ioengine=mmap has no snapblk equivalent",
        ),
        (
            "--ioengine=null --rw=read".to_string(),
            "ioengine=null needs a size",
        ),
        (
            format!("--filename={f} --ioengine=libblkio"),
            "needs libblkio_driver",
        ),
        (format!("--filename={f} --bs=4k,64k"), "use --sweep-bs"),
        (format!("{f} --filename={f}"), "give the target once"),
        // fio's null engine is sized to the furthest job: saturates instead of overflowing.
        (
            "--ioengine=null --rw=read --size=1M --numjobs=4 --offset_increment=10000000t".into(),
            "more than the largest capacity",
        ),
    ] {
        let o = snapblk(&args(&line), &[]);
        assert_eq!(o.status.code(), Some(1), "{line}");
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| !l.starts_with("warning: "))
            .collect();
        assert_eq!(lines.len(), 1, "{line}: {err}");
        assert!(
            lines[0].starts_with("snapblk: ") && lines[0].contains(want),
            "{line}: {err}"
        );
    }
    // The sweep has a flag of its own.
    let v = doc(
        &snapblk(
            &args(&format!("{f} --sweep-bs 4k,64k --rw read --json")),
            &[],
        ),
        "sweep",
    );
    let bs: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["config"]["bs"].as_u64().unwrap())
        .collect();
    assert_eq!(bs, [4096, 65536]);
}

#[test]
fn a_fio_command_line_with_several_jobs_runs_them_one_after_the_other() {
    let d = Shm::new("multi");
    let f = d.file("data.img", 2 << 20);
    let line = format!(
        "--filename={f} --direct=1 --size=512k --name=a --rw=read --name=b --rw=randwrite \
         --bs=64k --norandommap --output-format=json"
    );
    let a = args(&line);
    let o = snapblk(&a, &[]);
    let v = doc(&o, &line);
    let names: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["config"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(v["results"][1]["config"]["bs"], 65536);
    assert_eq!(
        v["results"][0]["config"]["bs"], 4096,
        "b's --bs is b's alone"
    );
    // fio runs the same line (both jobs at once); the I/O counts are fixed by the sizes.
    let fo = fio(&a, &[]);
    assert_eq!(
        (snap_ios(&v, 0), snap_ios(&v, 1)),
        (fio_ios(&fo, 0), fio_ios(&fo, 1))
    );
    assert_eq!((snap_ios(&v, 0), snap_ios(&v, 1)), (128, 8));
    let err = String::from_utf8_lossy(&o.stderr);
    let warn: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(
        warn.iter()
            .filter(|w| w.contains("ignored fio option norandommap"))
            .count(),
        1,
        "{err}"
    );
    assert!(
        warn.iter()
            .any(|w| w.contains("job \"b\" runs after \"a\"")),
        "{err}"
    );
}

/// A job file that never ends (`/dev/zero`) is refused at a bound, with one line, instead of
/// read until memory runs out (the run is capped at 2 GB of address space so that a regression
/// fails with "out of memory" rather than filling the machine).
#[test]
fn an_endless_job_file_is_refused() {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 2000000; exec {} bench --job-file /dev/zero null:size=1M",
            env!("CARGO_BIN_EXE_snapblk")
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("not a job file"), "{err}");
}
