//! `snapblk ota cow` on incremental payloads from the crate's writer (`testing::vabc::vabc_case`:
//! merge operations of every kind, a verity tree and FEC left to the device, bsdiff patches by
//! Debian's `bsdiff`), with the COW estimates update_engine's generator would write: the COW
//! and its record appear (and nothing else), fit the reserved size, pass `snapblk cow verify`,
//! are served over NBD (read back by nbdcopy, an independent client) as exactly the new image,
//! and merge (`snapblk merge`, with the record) into exactly the new image; `--verify` and
//! `--verify-merge` report the payload's hash; a COW that would not fit, a payload without
//! estimates and `-o` = `--source` are refused with nothing named.

use snapblk_testsupport::entries;
use std::path::{Path, PathBuf};

use snapblk_ota::testing::vabc::{VabcFields, vabc_case};
use snapblk_ota::{DeviceProfile, VabcParams, estimate_vabc_cow};
use snapblk_testsupport::{TempDir, nbd, path_str, tool_ok};

#[path = "cli_common.rs"]
mod common;
use common::{ok, refused};
#[path = "serve_common.rs"]
mod serve_common;
use serve_common::Serve;

fn bsdiff(old: &[u8], new: &[u8]) -> Vec<u8> {
    let d = TempDir::new("ota-cow-bsdiff");
    let (o, n, p) = (d.join("old"), d.join("new"), d.join("patch"));
    std::fs::write(&o, old).unwrap();
    std::fs::write(&n, new).unwrap();
    tool_ok("bsdiff", &[path_str(&o), path_str(&n), path_str(&p)]);
    std::fs::read(&p).unwrap()
}

struct Setup {
    d: TempDir,
    ota: PathBuf,
    old_dir: PathBuf,
    new: Vec<u8>,
}

impl Setup {
    fn out(&self) -> PathBuf {
        self.d.join("out")
    }
    fn args<'a>(&'a self, out: &'a Path) -> Vec<&'a str> {
        vec![
            "ota",
            "cow",
            path_str(&self.ota),
            "--source",
            path_str(&self.old_dir),
            "-o",
            path_str(out),
        ]
    }
}

/// The case with `fields`, its `estimate_cow_size` set as the generator would (the dry run of
/// the COW a current device writes, + 1 %) and then passed through `estimate`.
fn setup(tag: &str, fields: &VabcFields, estimate: impl Fn(u64) -> Option<u64>) -> Setup {
    let d = TempDir::new(tag);
    let mut c = vabc_case(fields, &bsdiff);
    let p = c.built.manifest.partitions[0].clone();
    let params = VabcParams::from_manifest(&c.built.manifest, &p).unwrap();
    let est = estimate_vabc_cow(&p, &params, DeviceProfile::CURRENT, Some(&c.old), &c.new).unwrap();
    let q = &mut c.built.manifest.partitions[0];
    q.estimate_cow_size = estimate(est.estimate_cow_size);
    if fields.cow_version == 3 {
        q.estimate_op_count_max = Some(est.estimate_op_count_max);
    }
    let ota = d.join("payload.bin");
    std::fs::write(&ota, c.built.to_bytes()).unwrap();
    let old_dir = d.join("old");
    std::fs::create_dir(&old_dir).unwrap();
    std::fs::write(old_dir.join("system.img"), &c.old).unwrap();
    std::fs::write(d.join("new.img"), &c.new).unwrap();
    Setup {
        d,
        ota,
        old_dir,
        new: c.new,
    }
}

fn fields(version: u32, compression: &str) -> VabcFields {
    VabcFields {
        cow_version: version,
        compression: compression.into(),
        compression_factor: if version == 3 { 65536 } else { 0 },
        batch_writes: true,
        threaded: true,
    }
}

fn sha256_hex(b: &[u8]) -> String {
    snapblk_ota::hex(&snapblk_ota::testing::sha256(b))
}

#[test]
fn cows_verify_serve_and_merge_to_the_new_image() {
    for (version, comp, profile) in [
        (3, "lz4", "current"),
        (2, "gz", "current"),
        (3, "zstd,3", "no-xor"),
        (2, "none", "legacy"),
    ] {
        let what = format!("v{version} {comp} {profile}");
        let s = setup("ota-cow-cli", &fields(version, comp), Some);
        let out = s.out();
        let mut args = s.args(&out);
        args.extend(["--profile", profile, "--verify", "--verify-merge", "--json"]);
        let doc: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
        assert_eq!(doc["schema"], "snapblk.ota-cow.v1");
        assert_eq!(doc["ok"], true, "{what}");
        let r = &doc["partitions"][0];
        let want = sha256_hex(&s.new);
        assert_eq!(r["view_sha256"], want, "{what}");
        assert_eq!(r["merge_sha256"], want, "{what}");
        let (size, device) = (
            r["cow_size"].as_u64().unwrap(),
            r["cow_device_size"].as_u64().unwrap(),
        );
        assert!(size <= device, "{what}: {size} > {device}");
        assert_eq!(
            entries(&out),
            ["system.cow", "system.cow.snapblk"],
            "{what}: only the COW and its record"
        );
        let cow = out.join("system.cow");
        assert_eq!(std::fs::metadata(&cow).unwrap().len(), size);
        let old = s.old_dir.join("system.img");
        let new = s.d.join("new.img");
        ok(&[
            "cow",
            "verify",
            path_str(&cow),
            "--base",
            path_str(&old),
            "--expect",
            path_str(&new),
        ]);
        // Served over NBD with the record, read by nbdcopy.
        let srv = Serve::start(&[
            "--base",
            path_str(&old),
            "--cow",
            path_str(&cow),
            "--read-only",
            "--nbd",
            "0",
        ]);
        let got = s.d.join("served.img");
        nbd::copy(&srv.ready_str("uri"), path_str(&got));
        drop(srv);
        assert!(std::fs::read(&got).unwrap() == s.new, "{what}: served view");
        // Merged into a copy of the old image, with the record.
        let base = s.d.join("base.img");
        std::fs::copy(&old, &base).unwrap();
        ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
        let merged = std::fs::read(&base).unwrap();
        assert!(merged[..s.new.len()] == s.new[..], "{what}: merged");
    }
}

#[test]
fn text_report_names_the_sizes() {
    let s = setup("ota-cow-text", &fields(3, "lz4"), Some);
    let out = s.out();
    let text = ok(&s.args(&out));
    assert!(text.contains("system.cow: "), "{text}");
    assert!(text.contains("% used)"), "{text}");
    assert!(
        text.ends_with(&format!("1 COW written to {}\n", out.display())),
        "{text}"
    );
    // The phases line: the COW writer's time and throughput among the others.
    assert!(
        text.contains(" s: check old ")
            && text.contains(", apply ")
            && text.contains(", verity ")
            && text.contains(", COW writer ")
            && text.contains(" MiB of image/s), record "),
        "{text}"
    );
}

/// `--json` times every phase, from the library's reports (the apply run's `ExtractTiming`,
/// the COW writer's `VabcTiming`) and around the other steps: each phase is there and no
/// other, each is non-zero when its step ran (the payload has every kind of step: old images
/// to hash, operations, a hash tree and FEC left to the device) and zero when it did not
/// (`--verify-merge` left out); the phases, which run one after another, add up to at most
/// the total; a partition's COW reads and verity blocks lie within its `cow_write`, and the
/// command's per-step sums are the partition's (one partition).
#[test]
fn json_times_every_phase_and_the_phases_add_up() {
    use serde_json::Value;
    let num = |v: &Value, k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("seconds.{k} missing or not a number: {v}"))
    };
    let keys = |v: &Value| {
        let mut k: Vec<String> = v
            .as_object()
            .unwrap_or_else(|| panic!("no seconds object: {v}"))
            .keys()
            .cloned()
            .collect();
        k.sort();
        k
    };
    let sorted = |v: &[&str]| {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    let phases = [
        "check_old",
        "apply",
        "verity",
        "cow_write",
        "record",
        "verify",
        "verify_merge",
    ];
    let steps = [
        "cow_write",
        "cow_read",
        "cow_verity",
        "record",
        "verify",
        "verify_merge",
    ];
    for merge in [true, false] {
        let s = setup("ota-cow-times", &fields(3, "lz4"), Some);
        let out = s.out();
        let mut args = s.args(&out);
        args.extend(["--verify", "--json"]);
        if merge {
            args.push("--verify-merge");
        }
        let doc: Value = serde_json::from_str(&ok(&args)).unwrap();
        let t = &doc["seconds"];
        let mut all = phases.to_vec();
        all.push("total");
        assert_eq!(keys(t), sorted(&all), "the command's phases: {doc}");
        let total = num(t, "total");
        let sum: f64 = phases.iter().map(|k| num(t, k)).sum();
        assert!(
            sum <= total,
            "the phases add up to {sum} s, more than the total {total} s: {t}"
        );
        for k in phases {
            let ran = k != "verify_merge" || merge;
            assert_eq!(
                num(t, k) > 0.0,
                ran,
                "seconds.{k} (--verify-merge {merge}): {t}"
            );
        }
        let p = &doc["partitions"][0]["seconds"];
        assert_eq!(keys(p), sorted(&steps), "a partition's steps: {doc}");
        let w = num(p, "cow_write");
        for k in ["cow_read", "cow_verity"] {
            assert!(
                num(p, k) > 0.0 && num(p, k) <= w,
                "{k} within cow_write: {p}"
            );
        }
        for k in ["cow_write", "record", "verify", "verify_merge"] {
            assert_eq!(
                num(p, k),
                num(t, k),
                "{k}: the partition's and the command's"
            );
        }
    }
}

#[test]
fn a_cow_that_would_not_fit_is_refused_and_nothing_is_named() {
    let s = setup("ota-cow-fit", &fields(3, "lz4"), |_| Some(1));
    let out = s.out();
    refused(&s.args(&out), "would not fit; nothing written");
    assert!(entries(&out).is_empty(), "{:?}", entries(&out));
}

/// Of two partitions, the second's COW would not fit: neither COW is named (the first is not
/// left beside the second's absent or older one).
#[test]
fn no_cow_is_named_unless_every_cow_fits() {
    use snapblk_ota::Payload;
    let s = setup("ota-cow-fit-two", &fields(3, "lz4"), Some);
    // 3 MiB that lz4 cannot shrink: its COW is over the 2 MiB slack of any estimate.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let vendor: Vec<u8> = (0..3 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let two = with_vendor(&s, &vendor);
    let bytes = std::fs::read(&two).unwrap();
    let p = Payload::from_bytes(bytes.clone()).unwrap();
    let mut m = p.manifest().clone();
    assert_eq!(m.partitions[1].partition_name, "vendor");
    m.partitions[1].estimate_cow_size = Some(1);
    let data = bytes[p.data_start() as usize..].to_vec();
    let built = snapblk_ota::testing::Built { manifest: m, data };
    std::fs::write(&two, built.to_bytes()).unwrap();
    let out = s.out();
    let mut args = s.args(&out);
    args[2] = path_str(&two);
    refused(&args, "would not fit");
    assert!(entries(&out).is_empty(), "{:?}", entries(&out));
}

/// The writer compresses a MiB of REPLACE blocks on as many threads as `--threads` gives
/// (`CowWriter::set_threads`); the COWs are the same files on one thread as on four, and
/// hold the new images.
#[test]
fn cows_are_the_same_on_one_thread_as_on_four() {
    // 3 MiB, a third noise, the rest runs of one byte: lz4 shrinks it some.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let vendor: Vec<u8> = (0..3usize << 20)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if (i / 48) % 3 == 0 {
                x as u8
            } else {
                (i >> 12) as u8
            }
        })
        .collect();
    for version in [2, 3] {
        let s = setup(
            &format!("ota-cow-threads-v{version}"),
            &fields(version, "lz4"),
            Some,
        );
        let two = with_vendor(&s, &vendor);
        let cows: Vec<Vec<Vec<u8>>> = ["1", "4"]
            .iter()
            .map(|t| {
                let out = s.d.join(&format!("out-{t}"));
                let mut args = s.args(&out);
                args[2] = path_str(&two);
                args.extend(["--all-partitions", "--verify", "--threads", t]);
                ok(&args);
                ["system.cow", "vendor.cow"]
                    .iter()
                    .map(|n| std::fs::read(out.join(n)).unwrap())
                    .collect()
            })
            .collect();
        assert!(cows[0] == cows[1], "v{version}: the COWs differ");
    }
}

#[test]
fn partitions_without_an_estimate_need_all_partitions() {
    let s = setup("ota-cow-noest", &fields(2, "lz4"), |_| None);
    let out = s.out();
    refused(&s.args(&out), "--all-partitions");
    let mut args = s.args(&out);
    args.extend(["--all-partitions", "--verify"]);
    let text = ok(&args);
    assert!(text.contains("no estimate"), "{text}");
    assert_eq!(entries(&out), ["system.cow", "system.cow.snapblk"]);
}

#[test]
fn output_is_never_the_source_directory() {
    let s = setup("ota-cow-alias", &fields(3, "lz4"), Some);
    let src = s.old_dir.clone();
    refused(&s.args(&src), "same directory as --source");
    assert_eq!(entries(&src), ["system.img"]);
}

/// The case plus a partition `vendor` without a COW estimate (one REPLACE), as OTA bytes.
fn with_vendor(s: &Setup, vendor: &[u8]) -> PathBuf {
    use snapblk_ota::testing::sha256;
    use snapblk_ota::{Extent, InstallOperation, OpType, PartitionInfo, PartitionUpdate, Payload};
    let bytes = std::fs::read(&s.ota).unwrap();
    let p = Payload::from_bytes(bytes.clone()).unwrap();
    let mut m = p.manifest().clone();
    let mut data = bytes[p.data_start() as usize..].to_vec();
    m.partitions.push(PartitionUpdate {
        partition_name: "vendor".into(),
        new_partition_info: Some(PartitionInfo {
            size: Some(vendor.len() as u64),
            hash: Some(sha256(vendor)),
        }),
        operations: vec![InstallOperation {
            r#type: OpType::Replace as i32,
            data_offset: Some(data.len() as u64),
            data_length: Some(vendor.len() as u64),
            data_sha256_hash: Some(sha256(vendor)),
            dst_extents: vec![Extent {
                start_block: Some(0),
                num_blocks: Some((vendor.len() / 4096) as u64),
            }],
            ..Default::default()
        }],
        ..Default::default()
    });
    data.extend_from_slice(vendor);
    let built = snapblk_ota::testing::Built { manifest: m, data };
    let path = s.d.join("two.bin");
    std::fs::write(&path, built.to_bytes()).unwrap();
    path
}

#[test]
fn ota_serve_exports_every_partition_under_its_name() {
    let s = setup("ota-serve", &fields(3, "lz4"), Some);
    let vendor = snapblk_testsupport::pattern(8 * 4096, 5);
    let ota = with_vendor(&s, &vendor);
    let work = s.d.join("work");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.args(["ota", "serve", path_str(&ota), "--source"])
        .arg(&s.old_dir)
        .args(["--work", path_str(&work), "--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    let names: Vec<&str> = srv.ready["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["system", "vendor"]);
    let uris: Vec<String> = srv.ready["uris"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_owned())
        .collect();
    assert!(
        uris[0].ends_with("/system") && uris[1].ends_with("/vendor"),
        "{uris:?}"
    );
    for (u, want) in uris.iter().zip([&s.new, &vendor]) {
        let got = s.d.join("got.img");
        let _ = std::fs::remove_file(&got);
        nbd::copy(u, path_str(&got));
        assert!(std::fs::read(&got).unwrap() == **want, "{u}");
    }
    // A partition without a COW is served read-only from its applied image: a write through
    // the export is refused and the image keeps the payload's bytes.
    let ro = &nbd::info(&uris[1])["exports"][0]["is_read_only"];
    assert_eq!(ro, &serde_json::Value::Bool(true), "vendor export: {ro}");
    let w = nbd::qemu_io(&uris[1], &["write -P 0x55 0 4k"]);
    let out = String::from_utf8_lossy(&w.stdout).to_string() + &String::from_utf8_lossy(&w.stderr);
    assert!(
        out.contains("Permission denied") || out.contains("read-only"),
        "a write to the vendor export was not refused as a write to a read-only export: {out}"
    );
    let (status, _, err) = srv.stop();
    assert!(status.success(), "{err}");
    assert_eq!(
        entries(&work),
        ["system.cow", "system.cow.snapblk", "vendor.img"]
    );
    assert!(std::fs::read(work.join("vendor.img")).unwrap() == vendor);
}

#[test]
fn ota_serve_merge_serves_the_new_image_and_leaves_it_in_the_old_one() {
    let s = setup("ota-serve-merge", &fields(3, "lz4"), Some);
    let work = s.d.join("work");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.args(["ota", "serve", path_str(&s.ota), "--source"])
        .arg(&s.old_dir)
        .args(["--work", path_str(&work), "--merge", "--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    let got = s.d.join("got.img");
    nbd::copy(&srv.ready_str("uri"), path_str(&got));
    assert!(
        std::fs::read(&got).unwrap() == s.new,
        "served while merging"
    );
    // The server's own merge, nothing else, turns the old image into the new one: it says so
    // in a `merge` line, and the `stopped` line's counters agree.
    let mut srv = srv;
    let (line, _) = srv
        .wait_event("merge", std::time::Duration::from_secs(120))
        .unwrap();
    assert_eq!(line["partition"], "system", "{line}");
    assert_eq!(line["stats"]["state"], "done", "{line}");
    let base = s.old_dir.join("system.img");
    assert!(
        std::fs::read(&base).unwrap()[..s.new.len()] == s.new[..],
        "old image after the merge"
    );
    let after = s.d.join("after.img");
    nbd::copy(&srv.ready_str("uri"), path_str(&after));
    assert!(
        std::fs::read(&after).unwrap() == s.new,
        "served after the merge"
    );
    let (status, rest, err) = srv.stop();
    assert!(status.success(), "{err}");
    let stopped: serde_json::Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(stopped["event"], "stopped", "{stopped}");
    let st = &stopped["merges"]["system"];
    assert!(
        st["state"] == "done" && st["merged"] == st["total"] && st["total"].as_u64() > Some(0),
        "{stopped}"
    );
    // The old image now holds new data: serving that work directory without --merge is
    // refused.
    let mut plain = vec!["ota", "serve", path_str(&s.ota), "--source"];
    plain.extend([
        path_str(&s.old_dir),
        "--work",
        path_str(&work),
        "--nbd",
        "0",
    ]);
    refused(&plain, "serve them with --merge");
    let merged = std::fs::read(&base).unwrap();
    assert!(merged[..s.new.len()] == s.new[..], "merged");
}

/// A work directory whose merge has begun belongs to the OTA that made it: resuming it with
/// another OTA (here one whose partition has the same name) is refused, not served as if it
/// were that OTA's update.
#[test]
fn a_begun_merge_is_resumed_only_with_its_own_ota() {
    let s = setup("ota-serve-merge-other", &fields(3, "lz4"), Some);
    let work = s.d.join("work");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.args(["ota", "serve", path_str(&s.ota), "--source"])
        .arg(&s.old_dir)
        .args(["--work", path_str(&work), "--merge", "--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    let (status, _, err) = srv.stop();
    assert!(status.success(), "{err}");
    let cow = work.join("system.cow");
    let base = s.old_dir.join("system.img");
    ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
    let (_other_dir, other, _, _) = growing_case("ota-serve-merge-other-ota");
    let mut args = vec!["ota", "serve", path_str(&other), "--source"];
    args.extend([path_str(&s.old_dir), "--work", path_str(&work)]);
    args.extend(["--merge", "--nbd", "0"]);
    refused(&args, "written for another OTA");
}

#[test]
fn a_second_run_replaces_the_cow_and_its_record_together() {
    let s = setup("ota-cow-rerun", &fields(3, "lz4"), Some);
    let out = s.out();
    ok(&s.args(&out));
    let first = std::fs::read(out.join("system.cow.snapblk")).unwrap();
    let mut args = s.args(&out);
    args.extend(["--profile", "legacy"]);
    ok(&args);
    assert!(std::fs::read(out.join("system.cow.snapblk")).unwrap() != first);
    assert_eq!(entries(&out), ["system.cow", "system.cow.snapblk"]);
    // The record describes the new COW: a merge with it (stale records are refused) ends right.
    let base = s.d.join("base.img");
    std::fs::copy(s.old_dir.join("system.img"), &base).unwrap();
    ok(&[
        "merge",
        path_str(&out.join("system.cow")),
        "--base",
        path_str(&base),
    ]);
    assert!(std::fs::read(&base).unwrap()[..s.new.len()] == s.new[..]);
}

/// update_engine's own sample payloads (tests/data/ota, made by delta_generator; no VABC
/// metadata, so --all-partitions): the COWs of both, over the delta's old images (`root`
/// grows from 4 to 12 KiB), served and merged to the payloads' own hashes.
#[test]
fn update_engines_sample_payloads_give_cows_of_their_hashes() {
    let d = TempDir::new("ota-cow-samples");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/ota");
    for a in ["sample_payloads.tar.xz", "sample_images.tar.bz2"] {
        tool_ok(
            "tar",
            &["-xf", path_str(&data.join(a)), "-C", path_str(d.path())],
        );
    }
    let old = d.join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::copy(d.join("disk_ext2_4k_empty.img"), old.join("kernel.img")).unwrap();
    std::fs::copy(d.join("disk_sqfs_empty.img"), old.join("root.img")).unwrap();
    let want = [
        ("kernel", std::fs::read(d.join("disk_ext2_4k.img")).unwrap()),
        (
            "root",
            std::fs::read(d.join("disk_sqfs_default.img")).unwrap(),
        ),
    ];
    for (payload, profile) in [
        ("full_payload.bin", "current"),
        ("delta_payload.bin", "current"),
        ("delta_payload.bin", "legacy"),
    ] {
        let out = d.join(&format!("out-{payload}-{profile}"));
        let doc: serde_json::Value = serde_json::from_str(&ok(&[
            "ota",
            "cow",
            path_str(&d.join(payload)),
            "--source",
            path_str(&old),
            "-o",
            path_str(&out),
            "--all-partitions",
            "--profile",
            profile,
            "--verify",
            "--verify-merge",
            "--json",
        ]))
        .unwrap();
        for (i, (name, img)) in want.iter().enumerate() {
            let r = &doc["partitions"][i];
            assert_eq!(r["partition"], *name);
            assert_eq!(r["view_sha256"], sha256_hex(img), "{payload} {name}");
            assert_eq!(r["merge_sha256"], sha256_hex(img), "{payload} {name}");
            assert!(r["estimate_cow_size"].is_null());
        }
    }
}

/// A payload whose one partition, `system`, grows from 8 to 16 blocks: (dir, ota, old, new),
/// the old image at DIR/old/system.img.
fn growing_case(tag: &str) -> (TempDir, PathBuf, Vec<u8>, Vec<u8>) {
    use snapblk_ota::testing::{DeltaOp, Encoding, PayloadBuilder};
    let d = TempDir::new(tag);
    let old = snapblk_testsupport::pattern(8 * 4096, 31);
    let mut new = old.clone();
    new.extend(snapblk_testsupport::pattern(8 * 4096, 32));
    let ops = [
        DeltaOp::Copy {
            src: vec![(0, 8)],
            dst: vec![(0, 8)],
        },
        DeltaOp::Replace {
            dst: vec![(8, 8)],
            encoding: Encoding::Xz,
        },
    ];
    let mut built = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, &bsdiff)
        .build();
    snapblk_ota::testing::vabc::set_vabc(&mut built.manifest, &["system"], &fields(3, "lz4"));
    let p = built.manifest.partitions[0].clone();
    let params = VabcParams::from_manifest(&built.manifest, &p).unwrap();
    let est = estimate_vabc_cow(&p, &params, DeviceProfile::CURRENT, Some(&old), &new).unwrap();
    built.manifest.partitions[0].estimate_cow_size = Some(est.estimate_cow_size);
    let ota = d.join("ota.bin");
    std::fs::write(&ota, built.to_bytes()).unwrap();
    std::fs::create_dir(d.join("old")).unwrap();
    std::fs::write(d.join("old/system.img"), &old).unwrap();
    (d, ota, old, new)
}

/// `ota serve` of a growing partition over NBD, with `extra` arguments: what nbdcopy read.
fn serve_growing(d: &TempDir, ota: &Path, extra: &[&str]) -> Vec<u8> {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.args(["ota", "serve", path_str(ota), "--source"])
        .arg(d.join("old"))
        .args(extra)
        .args(["--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    let got = d.join("got.img");
    nbd::copy(&srv.ready_str("uri"), path_str(&got));
    let (status, _, err) = srv.stop();
    assert!(status.success(), "{err}");
    std::fs::read(&got).unwrap()
}

/// A partition that grows (8 → 16 blocks) is served over a grown copy of its old image; the
/// old image is left as it was.
#[test]
fn ota_serve_serves_a_growing_partition() {
    let (d, ota, old, new) = growing_case("ota-serve-grow");
    assert!(serve_growing(&d, &ota, &[]) == new, "served");
    assert!(std::fs::read(d.join("old/system.img")).unwrap() == old);
}

/// The grown copy's name in --work is a symbolic or hard link to the old image (left there by
/// hand or by an adversary): the copy is written to a new file, never through the link, so the
/// old image is left as it was.
#[test]
fn a_grown_copy_never_writes_through_a_link_to_the_old_image() {
    for link in ["symlink", "hardlink"] {
        let (d, ota, old, new) = growing_case("ota-serve-grow-link");
        let work = d.join("work");
        std::fs::create_dir(&work).unwrap();
        let grown = work.join("system.base.img");
        if link == "symlink" {
            std::os::unix::fs::symlink(d.join("old/system.img"), &grown).unwrap();
        } else {
            std::fs::hard_link(d.join("old/system.img"), &grown).unwrap();
        }
        let got = serve_growing(&d, &ota, &["--work", path_str(&work)]);
        assert!(
            std::fs::read(d.join("old/system.img")).unwrap() == old,
            "{link}: the old image changed"
        );
        assert!(got == new, "{link}: served");
    }
}

/// Lazily unmounts the given mount points on drop (a failing test must not leave a dead FUSE
/// mount behind); create it after the `TempDir`.
struct Unmount(Vec<PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for m in &self.0 {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(m)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

#[test]
fn ota_serve_fuse_mounts_one_file_per_partition() {
    let s = setup("ota-serve-fuse", &fields(2, "gz"), Some);
    let vendor = snapblk_testsupport::pattern(8 * 4096, 6);
    let ota = with_vendor(&s, &vendor);
    let mnt = s.d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _guard = Unmount(vec![mnt.join("system"), mnt.join("vendor")]);
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.args(["ota", "serve", path_str(&ota), "--source"])
        .arg(&s.old_dir)
        .args(["--fuse", path_str(&mnt), "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    assert_eq!(srv.ready["export"], "fuse");
    let sys = mnt.join("system/system.img");
    let ven = mnt.join("vendor/vendor.img");
    assert_eq!(
        srv.ready["partitions"][0]["path"].as_str().unwrap(),
        path_str(&sys)
    );
    // Read by cp, not by this process's own code.
    let (a, b) = (s.d.join("a.img"), s.d.join("b.img"));
    tool_ok("cp", &[path_str(&sys), path_str(&a)]);
    tool_ok("cp", &[path_str(&ven), path_str(&b)]);
    assert!(std::fs::read(&a).unwrap() == s.new, "system");
    assert!(std::fs::read(&b).unwrap() == vendor, "vendor");
    let (status, _, err) = srv.stop();
    assert!(status.success(), "{err}");
    assert!(!sys.exists() && !ven.exists(), "unmounted at exit");
}

/// Without --work, the work directory is a new one in $TMPDIR with a random name (not the
/// process id, which another user can guess and plant first) and mode 0700, gone at exit; a
/// missing --work is created 0700 as well; a --work owned by another user is refused before
/// anything is written.
#[test]
fn ota_serve_work_directory_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup("ota-serve-work", &fields(3, "lz4"), Some);
    let tmp = s.d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"));
    c.env("TMPDIR", &tmp)
        .args(["ota", "serve", path_str(&s.ota), "--source"])
        .arg(&s.old_dir)
        .args(["--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    let work = PathBuf::from(srv.ready_str("work"));
    assert_eq!(work.parent(), Some(tmp.as_path()), "{}", work.display());
    let mode = std::fs::metadata(&work).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{}", work.display());
    let name = work.file_name().unwrap().to_string_lossy().into_owned();
    assert_ne!(name, format!("snapblk-ota-serve-{}", srv.pid()));
    let (status, _, err) = srv.stop();
    assert!(status.success(), "{err}");
    assert!(entries(&tmp).is_empty(), "{:?}", entries(&tmp));

    // A --work that does not exist is created 0700 too, whatever the umask, and only once
    // everything is checked (here a missing --source: nothing is created).
    let given = s.d.join("given/work");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(["ota", "serve", path_str(&s.ota), "--source"])
        .arg(s.d.join("no-such-dir"))
        .args(["--work", path_str(&given), "--nbd", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(!s.d.join("given").exists());
    let mut c = std::process::Command::new("sh");
    c.args(["-c", "umask 022 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_snapblk"))
        .args(["ota", "serve", path_str(&s.ota), "--source"])
        .arg(&s.old_dir)
        .args(["--work", path_str(&given), "--nbd", "0", "--json"]);
    let srv = snapblk_testsupport::ReadyProcess::spawn(&mut c).unwrap();
    let mode = std::fs::metadata(&given).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{}", given.display());
    let (status, _, err) = srv.stop();
    assert!(status.success(), "{err}");

    let foreign = s.d.join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    // As root: a directory given to nobody (65534); as anyone else, root's own "/" is foreign.
    let foreign = match std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)) {
        Ok(()) => foreign,
        Err(_) => PathBuf::from("/"),
    };
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_snapblk"))
        .args(["ota", "serve", path_str(&s.ota), "--source"])
        .arg(&s.old_dir)
        .args(["--work", path_str(&foreign), "--nbd", "0", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("owned by user") && err.lines().count() == 1,
        "{err}"
    );
    if foreign != Path::new("/") {
        assert!(entries(&foreign).is_empty());
    }
}
