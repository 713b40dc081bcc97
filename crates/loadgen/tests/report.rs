//! Result documents validate against crates/loadgen/schema.json; charts are well-formed SVG with the
//! expected elements; histograms in the document decode and merge.

use snapblk_loadgen::fgbg::{Background, FgBgSpec, Foreground, run_fgbg};
use snapblk_loadgen::{
    Document, JobSpec, LatHist, LatKind, RwMode, SpecTarget, Sweep, Target, TargetDesc, capture,
    noise_warnings, plot, validate, workload_table,
};

fn sweep_results() -> Vec<snapblk_loadgen::ConfigReport> {
    let mut t = SpecTarget::new("null:size=64M");
    let base = JobSpec {
        size: Some(16 << 20),
        runtime: Some(0.25),
        time_based: true,
        ..Default::default()
    };
    let sweep = Sweep {
        rw: vec![RwMode::RandRead, RwMode::Write],
        iodepth: vec![1, 8],
        ..Default::default()
    };
    let jobs = sweep.expand(&base);
    snapblk_loadgen::run_matrix(&mut t, &jobs, 2, None, None, |_, _, _| {}).unwrap()
}

fn to_value(d: &Document) -> serde_json::Value {
    serde_json::from_str(&d.to_json()).expect("document is JSON")
}

#[test]
fn workload_document_validates_and_carries_histograms() {
    let results = sweep_results();
    assert_eq!(results.len(), 4);
    let t = SpecTarget::new("null:size=64M");
    let ctx = capture(t.path().as_deref());
    let mut doc = Document::new(
        "workload",
        ctx,
        Some(TargetDesc {
            spec: t.describe(),
            driver: t.driver(),
        }),
    );
    doc.warnings = noise_warnings(&results, &doc.context);
    doc.results = results;
    let v = to_value(&doc);
    validate(&v).unwrap();
    // Every repetition is reported, and the merged histogram holds all samples of both reps.
    let r0 = &v["results"][0];
    assert_eq!(r0["runs"].as_array().unwrap().len(), 2);
    let samples: u64 = r0["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["read"]["lat_ns"]["samples"].as_u64().unwrap())
        .sum();
    let h = LatHist::from_base64(r0["summary"]["lat_ns"]["histogram"].as_str().unwrap()).unwrap();
    assert_eq!(h.count(), samples);
    assert!(samples > 0);
    assert!(
        r0["runs"][0]["series"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    );
    assert!(workload_table(&doc.results, &[LatKind::Clat]).contains("randread bs=4k qd=8 jobs=1"));
    // fio's three latencies, each over every I/O of the direction.
    for run in r0["runs"].as_array().unwrap() {
        let d = &run["read"];
        let n = d["ios"].as_u64().unwrap();
        for k in ["lat_ns", "slat_ns", "clat_ns"] {
            assert_eq!(d[k]["samples"].as_u64(), Some(n), "{k}");
        }
    }
    // A broken document is rejected (the validator is not a no-op).
    let mut no_clat = v.clone();
    no_clat["results"][0]["runs"][0]["read"]
        .as_object_mut()
        .unwrap()
        .remove("clat_ns");
    assert!(validate(&no_clat).is_err());
    let mut bad = v.clone();
    bad["results"][0]["summary"]["lat_ns"]["percentiles"]
        .as_object_mut()
        .unwrap()
        .remove("p99");
    assert!(validate(&bad).is_err());
    let mut bad = v;
    bad["schema_version"] = 1.into();
    assert!(validate(&bad).is_err());
}

#[test]
fn error_document_validates() {
    let mut doc = Document::new("workload", capture(None), None);
    doc.error = Some("open x: No such file".into());
    validate(&to_value(&doc)).unwrap();
}

#[test]
fn charts_are_svg_with_expected_elements() {
    let results = sweep_results();
    let dir = std::env::temp_dir().join(format!("snapblk-loadgen-plots-{}", std::process::id()));
    let files = plot::write_all(&dir, &results).unwrap();
    assert_eq!(files.len(), 3);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let doc =
            roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        let lines: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .collect();
        let name = f.file_name().unwrap().to_str().unwrap();
        // CDF and time series: one line per configuration; IOPS vs QD: one per (rw, bs, jobs).
        let want = if name == "iops-vs-qd.svg" { 2 } else { 4 };
        assert_eq!(lines.len(), want, "{name}");
        for l in &lines {
            let pts = l.attribute("points").unwrap();
            // Runs of 0.25 s have a single per-second sample; the other charts have several points.
            let min_points = if name == "timeseries.svg" { 1 } else { 2 };
            assert!(
                pts.split(' ').count() >= min_points,
                "{name}: line with {pts:?}"
            );
            for p in pts.split(' ') {
                let (x, y) = p.split_once(',').unwrap();
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!(
                    (0.0..=760.0).contains(&x) && (0.0..=440.0).contains(&y),
                    "{name}: point {p} off canvas"
                );
            }
        }
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            texts.iter().any(|t| t.contains("randread")),
            "{name}: legend missing"
        );
        assert!(doc.descendants().any(|n| n.has_tag_name("title")));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fgbg_document_validates() {
    let dir = std::env::temp_dir();
    let bg = dir.join(format!("snapblk-loadgen-bg-{}", std::process::id()));
    std::fs::write(&bg, vec![1u8; 4 << 20]).unwrap();
    let data = dir.join(format!("snapblk-loadgen-fg-{}", std::process::id()));
    std::fs::write(&data, vec![2u8; 1 << 20]).unwrap();
    let list = dir.join(format!("snapblk-loadgen-fg-{}.list", std::process::id()));
    let entries = vec![snapblk_readahead::ListEntry {
        path: data.clone(),
        identity: None,
        extent: snapblk_readahead::Extent::Whole,
    }];
    let mut text = Vec::new();
    snapblk_readahead::write_text(&mut text, &entries).unwrap();
    std::fs::write(&list, text).unwrap();
    let spec = FgBgSpec {
        background: vec![
            Background::Read { path: bg.clone() },
            Background::Cmd {
                cmd: "sleep 30".into(),
            },
        ],
        foreground: Foreground::ReadList { list: list.clone() },
        iterations: 2,
        warmup: 0.1,
        pause: 0.0,
        bg_direct: false,
        drop_caches: false,
        schedulers: vec![],
        device: None,
        fg_timeout: 10.0,
    };
    let t0 = std::time::Instant::now();
    let r = run_fgbg(&spec, None, None, |_| {}).unwrap();
    assert!(
        t0.elapsed().as_secs() < 20,
        "background command was not stopped"
    );
    assert_eq!(r.cells.len(), 2);
    assert_eq!(r.cells[0].load, "idle");
    assert!(r.cells[1].bg_bytes_per_s.unwrap() > 0.0);
    assert!(r.cells[1].fg_lat_p50_ns.unwrap() > 0);
    assert_eq!(r.cells[1].fg_seconds.len(), 2);
    let mut doc = Document::new("fgbg", capture(Some(&bg)), None);
    doc.fgbg = Some(serde_json::to_value(&r).unwrap());
    let good = to_value(&doc);
    validate(&good).unwrap();
    // Without a device there are no tunables to report: null. The field itself is required,
    // and when present it maps names to strings.
    assert!(good["fgbg"]["cells"][0]["scheduler_tunables"].is_null());
    let mut v = good.clone();
    v["fgbg"]["cells"][0]
        .as_object_mut()
        .unwrap()
        .remove("scheduler_tunables");
    assert!(validate(&v).is_err(), "cell without scheduler_tunables");
    let mut v = good.clone();
    v["fgbg"]["cells"][1]["scheduler_tunables"] = serde_json::json!({ "fifo_batch": 16 });
    assert!(validate(&v).is_err(), "non-string tunable");
    v["fgbg"]["cells"][1]["scheduler_tunables"] = serde_json::json!({ "fifo_batch": "16" });
    validate(&v).unwrap();
    // Scheduler switching needs a device.
    let bad = FgBgSpec {
        schedulers: vec!["none".into()],
        ..spec
    };
    assert!(run_fgbg(&bad, None, None, |_| {}).is_err());
    for p in [bg, data, list] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn per_second_rates_match_the_run_including_the_partial_last_second() {
    // 1.2 s on the null driver: one full bucket and a 0.2 s one. Reported as a plain count the
    // last would read as a fifth of the rate; scaled by its length it is the run's rate.
    let mut t = SpecTarget::new("null:size=64M");
    let job = JobSpec {
        size: Some(16 << 20),
        runtime: Some(1.2),
        time_based: true,
        ..Default::default()
    };
    let r = snapblk_loadgen::run_workload(&mut t, &job, &Default::default()).unwrap();
    let rep = snapblk_loadgen::RunReport::of(0, &r);
    assert_eq!(rep.series.len(), 2, "{:?}", rep.series);
    let overall = rep.iops;
    for s in &rep.series {
        // Loose bounds: other processes share the CPUs; the bug this guards gives 0.2x.
        let ratio = s.iops as f64 / overall;
        assert!(
            (0.45..2.2).contains(&ratio),
            "bucket t={} ({} s) at {} IOPS vs {overall:.0} overall",
            s.t,
            s.seconds,
            s.iops
        );
    }
    assert_eq!(rep.series[0].seconds, 1.0);
    let last = &rep.series[1];
    assert!((last.seconds - 0.2).abs() < 0.05, "{}", last.seconds);
    assert_eq!(
        last.iops,
        (last.ios as f64 / last.seconds).round() as u64,
        "the partial bucket is scaled by its length"
    );
    let total: u64 = rep.series.iter().map(|s| s.ios).sum();
    assert_eq!(total, r.ios());
}

#[test]
fn file_documents_validate_and_wrong_ones_are_rejected() {
    use snapblk_loadgen::fileio::{FileTestSpec, TESTS, overwrite_test, run_file_tests};
    let dir = std::env::temp_dir().join(format!("snapblk-loadgen-filedoc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = FileTestSpec {
        dir: dir.clone(),
        file_sizes: vec![64 << 10],
        record_sizes: vec![4096],
        tests: TESTS.iter().map(|s| s.to_string()).collect(),
        fsync: false,
        direct: false,
        drop_cache: false,
        seed: 1,
    };
    let r = run_file_tests(&spec, None, |_| {}).unwrap();
    let mut doc = Document::new("file", capture(Some(&dir)), None);
    doc.file_tests = Some(serde_json::to_value(&r).unwrap());
    let file = to_value(&doc);
    validate(&file).unwrap();
    let o = overwrite_test(&dir, 64 << 10, 1024, false, None)
        .unwrap()
        .unwrap();
    doc.file_tests = Some(serde_json::json!({ "overwrite": [o] }));
    let over = to_value(&doc);
    validate(&over).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    // Each of these breaks the description of file_tests and must be rejected.
    type Breaker = fn(&mut serde_json::Value);
    let broken: Vec<(&str, Breaker)> = vec![
        ("cell without mib_s", |v| {
            v["file_tests"]["cells"][0]
                .as_object_mut()
                .unwrap()
                .remove("mib_s");
        }),
        ("unknown test name", |v| {
            v["file_tests"]["cells"][0]["test"] = "sideways".into()
        }),
        ("negative rate", |v| {
            v["file_tests"]["cells"][1]["mib_s"] = (-1.0).into()
        }),
        ("fsync not a boolean", |v| {
            v["file_tests"]["spec"]["fsync"] = "yes".into()
        }),
        ("empty object", |v| v["file_tests"] = serde_json::json!({})),
        ("no results without an error", |v| {
            v["file_tests"] = serde_json::Value::Null
        }),
    ];
    for (what, f) in broken {
        let mut bad = file.clone();
        f(&mut bad);
        assert!(validate(&bad).is_err(), "{what} was accepted");
    }
    let mut bad = over.clone();
    bad["file_tests"]["overwrite"][0]["overwrite_mib_s"] = "fast".into();
    assert!(
        validate(&bad).is_err(),
        "overwrite rate as a string was accepted"
    );
    let mut bad = over;
    bad["file_tests"]["overwrite"] = serde_json::json!([]);
    assert!(validate(&bad).is_err(), "empty overwrite list was accepted");
    // A failed file run has no results, and says why.
    let mut failed = file;
    failed["file_tests"] = serde_json::Value::Null;
    failed["error"] = "no such directory".into();
    validate(&failed).unwrap();
}
