//! Tests of [`super`]: replays and tree warm-ups against real files on disk, with fake
//! pressure inputs ([`crate::fake`]) where the back-off is under test.

use super::pressure::MONITOR_THREAD;
use super::*;
use crate::fake::FakePressure;
use std::io::Write;

fn make_tree(tag: &str) -> PathBuf {
    let dir = crate::test_support::disk_dir()
        .join(format!("snapblk-ra-tree-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    // Small files, one bigger than a chunk, an empty one and a hard link.
    for (name, len) in [
        ("a/one", 3000usize),
        ("a/b/two", 70_000),
        ("big", 5 << 20),
        ("empty", 0),
    ] {
        let mut f = File::create(dir.join(name)).unwrap();
        f.write_all(&vec![0x5a; len]).unwrap();
        f.sync_all().unwrap();
    }
    std::fs::hard_link(dir.join("a/one"), dir.join("a/b/link")).unwrap();
    dir
}

fn evict(dir: &Path) {
    let w = WalkOptions {
        recursive: true,
        ..Default::default()
    };
    walk::walk(&[dir.to_path_buf()], &w, |found| {
        if let Ok(f) = found.open_quiet() {
            let _ = sys::fadvise(f.as_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    });
}

#[test]
fn warm_tree_makes_everything_resident_and_verifies_inline() {
    let dir = make_tree("warm");
    evict(&dir);
    let w = WalkOptions {
        recursive: true,
        ..Default::default()
    };
    let opts = ReplayOptions {
        chunk: 1 << 20,
        psi_threshold: None,
        ..Default::default()
    };
    let (rep, errors) = warm_tree(std::slice::from_ref(&dir), &w, &opts, None);
    assert!(errors.is_empty(), "{errors:?}");
    // The hard link is the same inode as a/one: warmed once.
    assert_eq!(rep.files_replayed, 4);
    assert_eq!(rep.bytes_requested, 3000 + 70_000 + (5 << 20));
    assert_eq!(rep.bytes_resident_after, rep.bytes_requested);
    assert_eq!(rep.resident_fraction, Some(1.0));
    // Every issued file was checked by its submitter on the open fd, none reopened.
    assert_eq!(rep.final_checked, 0);
    assert_eq!(rep.verified_inline, 3);
    // Independent check with mincore on fresh fds, plus the pages the kernel may have
    // reclaimed since (shadow entries; the eviction above left none).
    for name in ["a/one", "a/b/two", "big"] {
        let f = File::open(dir.join(name)).unwrap();
        let len = f.metadata().unwrap().len();
        let pages = len.div_ceil(sys::page_size());
        let reclaimed = sys::cachestat(f.as_fd(), 0, 0).unwrap().evicted;
        assert_eq!(
            sys::mincore_count(f.as_fd(), 0, len).unwrap() + reclaimed,
            pages,
            "{name}"
        );
    }
    // A second warm-up finds everything resident and issues nothing but what the kernel
    // reclaimed meanwhile (a few pages at most).
    let (again, _) = warm_tree(std::slice::from_ref(&dir), &w, &opts, None);
    let ps = sys::page_size();
    assert!(again.bytes_resident_before + 64 * ps >= again.bytes_requested);
    assert_eq!(
        again.bytes_issued == 0,
        again.bytes_resident_before == again.bytes_requested
    );
    assert_eq!(again.resident_fraction, Some(1.0));
    // Files found resident are counted, not kept for the final check, and still reported.
    assert_eq!(again.files_replayed, 4);
    assert_eq!(again.bytes_requested, rep.bytes_requested);
    assert_eq!(again.bytes_resident_after, again.bytes_requested);
    assert_eq!(again.final_checked, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deferred_check_with_no_spare_fds_falls_back_to_the_final_check() {
    // lag_files = 0 (as when RLIMIT_NOFILE leaves no room): nothing is checked inline, the
    // final verification reopens every file and still proves residency.
    let dir = make_tree("nofd");
    evict(&dir);
    let entries: Vec<ListEntry> = ["a/one", "a/b/two", "big"]
        .iter()
        .map(|n| ListEntry {
            path: dir.join(n),
            identity: None,
            extent: Extent::Whole,
        })
        .collect();
    let opts = ReplayOptions {
        psi_threshold: None,
        ..Default::default()
    };
    let rep = run(&opts, false, 0, None, |shared| {
        parallel_for(
            entries.len(),
            1,
            shared.opts,
            |i, ctx| shared.pass1(&entries[i], ctx, None, 3),
            |ctx| shared.drain(ctx),
        );
        (3, Vec::new())
    });
    assert_eq!(rep.verified_inline, 0);
    assert_eq!(rep.final_checked, 3);
    assert_eq!(rep.resident_fraction, Some(1.0));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn entry(path: PathBuf, identity: Option<FileIdentity>) -> ListEntry {
    ListEntry {
        path,
        identity,
        extent: Extent::Whole,
    }
}

fn quiet() -> ReplayOptions {
    ReplayOptions {
        psi_threshold: None,
        ..Default::default()
    }
}

#[test]
fn nothing_replayed_is_not_success() {
    let dir = make_tree("g1");
    // An empty list: n/a, a warning, --require fails.
    let rep = replay(&[], &quiet(), None);
    assert_eq!(rep.entries, 0);
    assert_eq!(rep.resident_fraction, None);
    assert!(
        rep.warnings.iter().any(|w| w.contains("no entries")),
        "{:?}",
        rep.warnings
    );
    assert!(rep.check_require(0.0).is_err());

    // After an "OTA": every entry is missing or changed.
    let f = File::open(dir.join("a/one")).unwrap();
    let mut id = FileIdentity::of(&f.metadata().unwrap());
    id.size += 1;
    let list = vec![
        entry(dir.join("gone1"), None),
        entry(dir.join("gone2"), None),
        entry(dir.join("a/one"), Some(id)),
    ];
    let rep = replay(&list, &quiet(), None);
    assert_eq!(rep.files_replayed, 0);
    assert_eq!(rep.entries_missing, 2);
    assert_eq!(rep.entries_stale, 1);
    assert_eq!(rep.entries_not_replayed, 3);
    assert_eq!(rep.bytes_requested, 0);
    assert_eq!(rep.resident_fraction, None);
    assert!(
        rep.warnings
            .iter()
            .any(|w| w.contains("all 3 of 3 entries were not replayed")
                && w.contains("1 stale")
                && w.contains("2 missing")),
        "{:?}",
        rep.warnings
    );
    let err = rep.check_require(99.5).unwrap_err();
    assert!(err.contains("nothing could be verified"), "{err}");

    // Half the list replayed: the bytes are all resident, but not every entry was
    // replayed, so a 99.5 % requirement fails while 50 % passes.
    let list = vec![
        entry(dir.join("a/b/two"), None),
        entry(dir.join("gone"), None),
    ];
    let rep = replay(&list, &quiet(), None);
    assert_eq!(rep.files_replayed, 1);
    assert_eq!(rep.resident_fraction, Some(1.0));
    assert_eq!(rep.entries_not_replayed, 1);
    assert!(!rep.warnings.is_empty());
    let err = rep.check_require(99.5).unwrap_err();
    assert!(err.contains("1 of 2 entries"), "{err}");
    assert!(rep.check_require(50.0).is_ok());

    // A complete replay has no warnings and passes.
    let rep = replay(&[entry(dir.join("big"), None)], &quiet(), None);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert!(rep.check_require(99.5).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Fake pressure inputs (see [`crate::fake`]) for the device holding `dir`'s files.
fn fake_pressure(dir: &Path) -> FakePressure {
    FakePressure::start(dir, std::fs::metadata(dir.join("big")).unwrap().dev()).unwrap()
}

/// One submitter, no skipping, and the back-off at `threshold` reading `fake`.
fn fake_options(fake: &FakePressure, threshold: Option<f64>) -> ReplayOptions {
    fake.options(ReplayOptions {
        threads: Some(1),
        skip_resident: false,
        psi_threshold: threshold,
        ..Default::default()
    })
}

/// The three non-empty files of [`make_tree`] as a whole-file list.
fn tree_list(dir: &Path) -> Vec<ListEntry> {
    ["a/one", "a/b/two", "big"]
        .iter()
        .map(|n| entry(dir.join(n), None))
        .collect()
}

#[test]
fn back_off_is_reported_to_the_watch_by_the_pressure_monitor() {
    let dir = make_tree("watch");
    let fake = fake_pressure(&dir);
    let list = tree_list(&dir);
    // Each call with the name of the thread that made it.
    let seen = Mutex::new(Vec::<(BackOff, Option<String>)>::new());
    let watch = |b: BackOff| {
        let name = std::thread::current().name().map(String::from);
        seen.lock().unwrap().push((b, name));
    };
    let stall = fake.staller();
    let progress = |done: u64, _: u64| {
        if done == 1 {
            // Other tasks stall 100 % of the time for 600 ms; idle (not an own stall)
            // for 300 ms so the monitor sees it before the next entry is issued.
            stall(Duration::from_millis(600));
            crate::ownstall::nap(Duration::from_millis(300));
        }
    };
    let caller = std::thread::current().name().map(String::from);
    let rep = replay_watched(
        &list,
        &fake_options(&fake, Some(0.6)),
        Some(&progress),
        Some(&watch),
    );
    let seen = seen.into_inner().unwrap();
    assert_eq!(rep.files_replayed, 3);
    assert!(rep.psi_pauses >= 1, "{rep:?}");
    let first_paused = seen.iter().position(|(b, _)| b.paused);
    assert!(first_paused.is_some(), "never reported paused: {seen:?}");
    // paused: true first, paused: false last, with the report's pause count and time
    // (all pauses happen while issuing unless a re-issue pass was needed).
    let (last, last_thread) = seen.last().cloned().unwrap_or_default();
    assert!(first_paused < Some(seen.len() - 1), "{seen:?}");
    assert!(!last.paused, "{seen:?}");
    if rep.passes == 1 {
        assert_eq!(last.pauses, rep.psi_pauses, "{seen:?} {rep:?}");
        assert_eq!(last.paused_secs, rep.psi_paused_secs, "{seen:?} {rep:?}");
    } else {
        assert!(
            last.pauses >= 1 && last.pauses <= rep.psi_pauses,
            "{seen:?}"
        );
    }
    assert!(last.paused_secs > 0.0, "{seen:?}");
    // Consecutive reports differ (sent on change only).
    assert!(seen.windows(2).all(|w| w[0].0 != w[1].0), "{seen:?}");
    // One polling thread: every call comes from the pressure monitor, except possibly
    // the final one, made by the replay's caller when issuing ends.
    let (body, _) = seen.split_at(seen.len() - 1);
    assert!(
        body.iter()
            .all(|(_, t)| t.as_deref() == Some(MONITOR_THREAD)),
        "{seen:?}"
    );
    assert!(
        last_thread.as_deref() == Some(MONITOR_THREAD) || last_thread == caller,
        "{last_thread:?} {seen:?}"
    );
    // No calls with the back-off disabled, or when the pressure file cannot be read.
    let calls = AtomicU64::new(0);
    let count = |_: BackOff| {
        calls.fetch_add(1, Relaxed);
    };
    let quiet_rep = replay_watched(&list, &quiet(), None, Some(&count));
    assert_eq!(quiet_rep.files_replayed, 3);
    let no_psi = ReplayOptions {
        psi_path: dir.join("nosuch"),
        ..fake_options(&fake, Some(0.6))
    };
    assert_eq!(
        replay_watched(&list, &no_psi, None, Some(&count)).files_replayed,
        3
    );
    assert_eq!(calls.load(Relaxed), 0);
    drop(fake);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn require_failure_names_the_real_shortfalls_cause_first() {
    // As an unprivileged caller: one entry missing, the other replayed but its residency
    // unknown. The failure is about the unknown residency; the missing entry comes second.
    let mut r = ReplayReport {
        entries: 2,
        files_replayed: 1,
        entries_missing: 1,
        entries_not_replayed: 1,
        bytes_requested: 8192,
        bytes_unverifiable: 8192,
        resident_fraction: None,
        ..Default::default()
    };
    r.warnings = shortfalls(&r, false, false);
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(r.warnings[0].contains("1 of 2 entries were not replayed"));
    let err = r.check_require(50.0).unwrap_err();
    let unknown = err.find("residency of all 8192 requested bytes is unknown");
    let missing = err.find("1 of 2 entries were not replayed (1 missing)");
    assert!(
        unknown.is_some() && missing.is_some() && unknown < missing,
        "{err}"
    );
    // Everything replayed, residency unknown: that alone is named.
    let mut r = ReplayReport {
        entries: 1,
        files_replayed: 1,
        bytes_requested: 4096,
        bytes_unverifiable: 4096,
        ..Default::default()
    };
    r.warnings = shortfalls(&r, false, false);
    let err = r.check_require(99.5).unwrap_err();
    assert!(err.contains("residency of all 4096"), "{err}");
    assert!(!err.contains("not replayed"), "{err}");
    // Nothing requested because nothing was replayed: the entries are the cause.
    let mut r = ReplayReport {
        entries: 3,
        entries_missing: 2,
        entries_stale: 1,
        entries_not_replayed: 3,
        ..Default::default()
    };
    r.warnings = shortfalls(&r, false, false);
    let err = r.check_require(99.5).unwrap_err();
    let entries = err.find("all 3 of 3 entries were not replayed (1 stale, 2 missing)");
    let nothing = err.find("0 bytes requested");
    assert!(
        entries.is_some() && nothing.is_some() && entries < nothing,
        "{err}"
    );
}

#[test]
fn duplicate_entries_are_merged_and_counted_once() {
    let r = |o, l| Range::new(o, l).unwrap();
    let ranges = |v: Vec<Range>| Extent::Ranges(RangeSet::from_ranges(v));
    let id = |size| FileIdentity {
        dev_major: 1,
        dev_minor: 2,
        ino: 3,
        size,
        mtime_sec: 4,
        mtime_nsec: 5,
    };
    let e = |p: &str, identity, extent| ListEntry {
        path: PathBuf::from(p),
        identity,
        extent,
    };
    let list = vec![
        e("/a", None, ranges(vec![r(0, 4096)])),
        e("/b", Some(id(10)), ranges(vec![r(0, 10)])),
        e(
            "/a",
            Some(id(7)),
            ranges(vec![r(2048, 8192), r(65536, 4096)]),
        ),
        e("/b", Some(id(11)), ranges(vec![r(0, 11)])), // another identity: kept apart
        e("/a", None, ranges(vec![r(0, 4096)])),
        e("/c", None, Extent::Whole),
        e("/c", None, ranges(vec![r(0, 1)])),
    ];
    let (m, merged) = merge_duplicates(&list);
    assert_eq!(merged, 3);
    assert_eq!(
        m,
        vec![
            e("/a", Some(id(7)), ranges(vec![r(0, 10240), r(65536, 4096)])),
            e("/b", Some(id(10)), ranges(vec![r(0, 10)])),
            e("/b", Some(id(11)), ranges(vec![r(0, 11)])),
            e("/c", None, Extent::Whole),
        ]
    );

    // Replaying a file listed three times requests its bytes once.
    let dir = make_tree("dup");
    let two = dir.join("a/b/two");
    let list = vec![entry(two.clone(), None); 3];
    let rep = replay(&list, &quiet(), None);
    assert_eq!(rep.entries, 3);
    assert_eq!(rep.entries_duplicate, 2);
    assert_eq!(rep.files_replayed, 1);
    assert_eq!(rep.bytes_requested, 70_000);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert!(rep.check_require(99.5).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `replay` on a fresh thread (priorities are per thread and inherited, so the test
/// harness thread is left alone) and returns the report.
fn replay_on_new_thread(
    list: Vec<ListEntry>,
    opts: ReplayOptions,
    progress: impl Fn(u64, u64) + Sync + Send + 'static,
) -> ReplayReport {
    std::thread::spawn(move || replay(&list, &opts, Some(&progress)))
        .join()
        .unwrap()
}

#[test]
fn submitters_run_at_idle_ioprio_and_nice_10_by_default() {
    let dir = make_tree("prio");
    let list: Vec<ListEntry> = ["a/one", "a/b/two", "big"]
        .iter()
        .map(|n| entry(dir.join(n), None))
        .collect();
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let record = |seen: std::sync::Arc<Mutex<Vec<(i32, i32)>>>| {
        move |_: u64, _: u64| {
            // Called on the submitter thread right after it handled an entry.
            let p = (sys::get_ioprio().unwrap(), sys::get_nice().unwrap());
            seen.lock().unwrap().push(p);
        }
    };
    let opts = ReplayOptions {
        skip_resident: false,
        ..quiet()
    };
    let rep = replay_on_new_thread(list.clone(), opts.clone(), record(seen.clone()));
    assert_eq!(rep.files_replayed, 3);
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, vec![(IoPrio::Idle.raw(), 10); 3]);

    // Explicit settings are applied as given; `None` leaves the inherited values.
    let opts = ReplayOptions {
        ioprio: Some(IoPrio::BestEffort(2)),
        nice: None,
        ..opts
    };
    let inherited = std::thread::spawn(|| sys::get_nice().unwrap())
        .join()
        .unwrap();
    replay_on_new_thread(list, opts, record(seen.clone()));
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, vec![(IoPrio::BestEffort(2).raw(), inherited); 3]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn thread_count_follows_queue_depth_and_threads() {
    let dir = make_tree("threads");
    // Distinct paths (copies of a/one), so the list is not merged.
    let list: Vec<ListEntry> = (0..8)
        .map(|i| {
            let p = dir.join(format!("copy{i}"));
            std::fs::copy(dir.join("a/one"), &p).unwrap();
            entry(p, None)
        })
        .collect();
    for (queue_depth, threads, want) in [(3, None, 3usize), (5, Some(2), 2), (1, None, 1)] {
        let ids = std::sync::Arc::new(Mutex::new(std::collections::HashSet::new()));
        let seen = ids.clone();
        let progress = move |_: u64, _: u64| {
            seen.lock().unwrap().insert(std::thread::current().id());
            // Hold this entry until `want` submitters are busy at once (bounded), so a
            // fast thread cannot take every entry and hide the others.
            let t = Instant::now();
            while seen.lock().unwrap().len() < want && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let opts = ReplayOptions {
            queue_depth,
            threads,
            skip_resident: false,
            ..quiet()
        };
        let rep = replay_on_new_thread(list.clone(), opts, progress);
        assert_eq!(rep.threads, want);
        assert_eq!(
            ids.lock().unwrap().len(),
            want,
            "q {queue_depth} threads {threads:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn replay_pauses_while_io_pressure_is_high() {
    let dir = make_tree("psi");
    let fake = fake_pressure(&dir);
    let list = tree_list(&dir);
    // `own_stall`: whether the submitter itself is blocked while the system stalls (as a
    // cold warm-up is on its metadata reads) or idle (the stall is someone else's).
    // `others_read`: whether someone else reads the tree's disk meanwhile.
    let run_with = |threshold: Option<f64>, own_stall: bool, others_read: bool| {
        fake.set_foreign(others_read);
        let stall = fake.staller();
        // After the first entry: the system stalls for 600 ms; stay on this entry for
        // 300 ms so the monitor (50 ms samples) sees it before the next entry issues.
        let progress = move |done: u64, _: u64| {
            if done == 1 {
                stall(Duration::from_millis(600));
                if own_stall {
                    // Blocked without saying so: to the sampler, like a stalled syscall.
                    std::thread::sleep(Duration::from_millis(300));
                } else {
                    crate::ownstall::nap(Duration::from_millis(300));
                }
            }
        };
        replay_on_new_thread(list.clone(), fake_options(&fake, threshold), progress)
    };
    let paused = run_with(Some(0.6), false, false);
    let ungated = run_with(None, false, false);
    let self_inflicted = run_with(Some(0.6), true, false);
    let shared_disk = run_with(Some(0.6), true, true);
    drop(fake);
    assert!(paused.psi_pauses >= 1, "{paused:?}");
    assert!(paused.psi_paused_secs > 0.0, "{paused:?}");
    assert_eq!(paused.files_replayed, 3);
    assert_eq!(ungated.psi_pauses, 0, "{ungated:?}");
    // The stall was the submitter's own: no back-off from itself.
    assert_eq!(self_inflicted.psi_pauses, 0, "{self_inflicted:?}");
    assert_eq!(self_inflicted.files_replayed, 3);
    // The submitter is blocked too, but someone else reads the same disk: their stall
    // cannot be told from ours, so the replay backs off.
    assert!(shared_disk.psi_pauses >= 1, "{shared_disk:?}");
    assert_eq!(shared_disk.files_replayed, 3);
    // A pressure file that cannot be read is reported, not silently ignored.
    let opts = ReplayOptions {
        psi_path: dir.join("nosuch"),
        ..Default::default()
    };
    let rep = replay_on_new_thread(list, opts, |_, _| {});
    assert!(
        rep.notes
            .iter()
            .any(|n| n.contains("I/O pressure unavailable")),
        "{:?}",
        rep.notes
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
