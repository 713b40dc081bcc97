//! `snapblk ota cow` over the whole format matrix, and the COW device's size limit.
//!
//! One ext4 image pair (mkfs.ext4 -d of two trees: files edited in place, a file with bytes
//! inserted near its start so the bsdiff sources shift, a moved file, a deleted file, a file
//! with a zeroed region, a new file) and one payload by `snapblk ota generate`; the payload's
//! Virtual A/B fields are rewritten for COW v2 and v3 × lz4, gz, zstd and none (with the
//! estimates the generator computes for them), and each is turned into a COW with XOR on
//! (`--profile current`) and off (`--profile no-xor`, and `legacy` for v2): `ota cow
//! --verify`, `snapblk cow verify`, XOR ops exactly when XOR is on, the view served over NBD
//! (read by nbdcopy) and the merge of a copy of the old image are the new image.
//!
//! The COW device is `estimate_cow_size` + 2 MiB rounded up to 4 KiB, as libsnapshot's
//! `PartitionCowCreator::GetCowSize` sizes it (notes/ota-payload.md §2.1): pinned exactly,
//! with a COW one 4 KiB step under the limit accepted and one over refused; and
//! `--verify-merge` refuses to start its merge-on-a-copy on a file system without room for
//! the copies (a small tmpfs).

use snapblk_testsupport::entries;
use std::path::{Path, PathBuf};
use std::process::Command;

use snapblk_ota::testing::vabc::{VabcFields, set_vabc};
use snapblk_ota::testing::{Built, DeltaOp, Encoding, PayloadBuilder};
use snapblk_ota::{CowMergeOpType, DeviceProfile, OpType, Payload, VabcParams, estimate_vabc_cow};
use snapblk_testsupport::ext4;
use snapblk_testsupport::{TempDir, nbd, path_str, pattern};

#[path = "cli_common.rs"]
mod common;
use common::{ok, read, snapblk};
#[path = "serve_common.rs"]
mod serve_common;
use serve_common::Serve;

const BS: usize = 4096;
const MIB: u64 = 1 << 20;

fn sha256_hex(b: &[u8]) -> String {
    snapblk_ota::hex(&snapblk_ota::testing::sha256(b))
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

/// The old and new ext4 images, as D/old/system.img and D/new/system.img.
fn ext4_pair(d: &TempDir) -> (Vec<u8>, Vec<u8>) {
    // 1 MiB with 1,234 bytes inserted near its start: every later block of it shifts, so
    // bsdiff reads it at an offset (COW_XOR with src_offset). Its size bounds what the COW
    // without XOR adds over the estimate (made with XOR) below the device's 2 MiB slack.
    let doc = pattern(1 << 20, 51);
    let mut doc2 = doc.clone();
    doc2.splice(3000..3000, pattern(1234, 52));
    // Edited in place at three places.
    let bin = pattern(512 << 10, 53);
    let mut bin2 = bin.clone();
    bin2[5000..5100].fill(1);
    bin2[200_000..200_300].fill(2);
    bin2[500_000..500_010].fill(3);
    // A region zeroed.
    let zr = pattern(800 << 10, 54);
    let mut zr2 = zr.clone();
    zr2[100 << 10..400 << 10].fill(0);
    let moved = pattern(1 << 20, 55);
    let old = ext4::of_files(
        d.path(),
        "o",
        &[
            ("a/doc", doc),
            ("b/bin", bin),
            ("c/gone", pattern(400 << 10, 56)),
            ("e/moved", moved.clone()),
            ("z/zeroed", zr),
        ],
        16,
    );
    let new = ext4::of_files(
        d.path(),
        "n",
        &[
            ("a/doc", doc2),
            ("b/bin", bin2),
            ("d/new", pattern(300 << 10, 57)),
            ("f/moved", moved),
            ("z/zeroed", zr2),
        ],
        16,
    );
    for (sub, img) in [("old", &old), ("new", &new)] {
        std::fs::create_dir(d.join(sub)).unwrap();
        std::fs::write(d.join(sub).join("system.img"), img).unwrap();
    }
    (old, new)
}

/// `payload` (unsigned) with its Virtual A/B fields set to COW `version` and `compression`
/// and the COW estimates of the one partition recomputed as `ota generate` computes them (a
/// dry run of the COW writer a current device runs, + 1 %).
fn variant(payload: &[u8], old: &[u8], new: &[u8], version: u32, compression: &str) -> Vec<u8> {
    let p = Payload::from_bytes(payload.to_vec()).unwrap();
    let mut manifest = p.manifest().clone();
    let dm = manifest.dynamic_partition_metadata.as_mut().unwrap();
    dm.cow_version = Some(version);
    dm.vabc_compression_param = Some(compression.into());
    let part = manifest.partitions[0].clone();
    let params = VabcParams::from_manifest(&manifest, &part).unwrap();
    let est = estimate_vabc_cow(&part, &params, DeviceProfile::CURRENT, Some(old), new).unwrap();
    let q = &mut manifest.partitions[0];
    q.estimate_cow_size = Some(est.estimate_cow_size);
    q.estimate_op_count_max = Some(est.estimate_op_count_max);
    let data = payload[p.data_start() as usize..].to_vec();
    Built { manifest, data }.to_bytes()
}

/// `ota generate` of D/old → D/new into `out`, with `extra` flags.
fn generate(d: &TempDir, out: &Path, extra: &[&str]) -> serde_json::Value {
    let (old, new) = (d.join("old"), d.join("new"));
    let mut args = vec!["ota", "generate", "--source", path_str(&old)];
    args.extend(["--target", path_str(&new), "-o", path_str(out)]);
    args.extend(["--json"]);
    args.extend(extra);
    json(&ok(&args))
}

#[test]
fn ext4_round_trip_for_every_cow_format_with_and_without_xor() {
    let d = TempDir::new("ota-cow-matrix");
    let (old, new) = ext4_pair(&d);
    let pay = d.join("gen.bin");
    let g = generate(&d, &pay, &[]);
    let payload = read(&pay);

    // The payload has every kind of change the pair was made for.
    let p = Payload::from_bytes(payload.clone()).unwrap();
    let part = &p.manifest().partitions[0];
    let count_ops = |t: OpType| {
        part.operations
            .iter()
            .filter(|o| o.r#type == t as i32)
            .count()
    };
    for t in [OpType::SourceCopy, OpType::BrotliBsdiff, OpType::Zero] {
        assert!(count_ops(t) > 0, "no {t:?} op: {g}");
    }
    let merge_ops = |t: CowMergeOpType| {
        part.merge_operations
            .iter()
            .filter(move |m| m.r#type == Some(t as i32))
    };
    assert!(merge_ops(CowMergeOpType::CowCopy).count() > 0, "{g}");
    assert!(merge_ops(CowMergeOpType::CowXor).count() > 0, "{g}");
    assert!(
        merge_ops(CowMergeOpType::CowXor).any(|m| m.src_offset.unwrap_or(0) > 0),
        "no COW_XOR with a source offset: {g}"
    );

    // The rewritten payload is the one `ota generate` writes with those settings.
    let g2 = d.join("gen-v2-gz.bin");
    generate(&d, &g2, &["--cow-version", "2", "--vabc-compression", "gz"]);
    assert!(
        Payload::from_bytes(variant(&payload, &old, &new, 2, "gz"))
            .unwrap()
            .manifest()
            == Payload::from_bytes(read(&g2)).unwrap().manifest(),
        "the rewritten v2 gz manifest is not the generator's"
    );

    let old_img = d.join("old/system.img");
    let new_img = d.join("new/system.img");
    let want = sha256_hex(&new);
    for version in [2u32, 3] {
        for comp in ["lz4", "gz", "zstd", "none"] {
            let ota = d.join(&format!("v{version}-{comp}.bin"));
            std::fs::write(&ota, variant(&payload, &old, &new, version, comp)).unwrap();
            let mut profiles = vec![("current", true), ("no-xor", false)];
            if version == 2 {
                profiles.push(("legacy", false));
            }
            for (profile, xor) in profiles {
                let what = format!("v{version} {comp} {profile}");
                let out = d.join(&format!("cow-v{version}-{comp}-{profile}"));
                let doc = ok(&[
                    "ota",
                    "cow",
                    path_str(&ota),
                    "--source",
                    path_str(&d.join("old")),
                    "-o",
                    path_str(&out),
                    "--profile",
                    profile,
                    "--verify",
                    "--json",
                ]);
                let r = &json(&doc)["partitions"][0];
                assert_eq!(r["view_sha256"], want, "{what}: {doc}");
                let (size, device) = (
                    r["cow_size"].as_u64().unwrap(),
                    r["cow_device_size"].as_u64().unwrap(),
                );
                assert!(size <= device, "{what}: {size} > {device}");
                let cow = out.join("system.cow");
                // The COW's own header and ops, read back by `cow inspect`.
                let i = json(&ok(&["cow", "inspect", "--json", path_str(&cow)]));
                assert_eq!(i["header"]["major"], version, "{what}: {i}");
                assert_eq!(i["compression"], comp, "{what}: {i}");
                let xor_ops = i["op_counts"]["xor"].as_u64().unwrap();
                assert_eq!(xor_ops > 0, xor, "{what}: {xor_ops} XOR ops");
                ok(&[
                    "cow",
                    "verify",
                    path_str(&cow),
                    "--base",
                    path_str(&old_img),
                    "--expect",
                    path_str(&new_img),
                ]);
                // Served over NBD (with the record), read by nbdcopy.
                let srv = Serve::start(&[
                    "--base",
                    path_str(&old_img),
                    "--cow",
                    path_str(&cow),
                    "--read-only",
                    "--nbd",
                    "0",
                ]);
                let got = d.join("served.img");
                let _ = std::fs::remove_file(&got);
                nbd::copy(&srv.ready_str("uri"), path_str(&got));
                drop(srv);
                assert!(read(&got) == new, "{what}: served view differs");
                // Merged into a copy of the old image (with the record).
                let base = d.join("base.img");
                std::fs::copy(&old_img, &base).unwrap();
                ok(&["merge", path_str(&cow), "--base", path_str(&base)]);
                assert!(read(&base) == new, "{what}: merged image differs");
            }
        }
    }
}

/// Old: 768 pattern blocks; new: 768 other blocks (3 MiB that no codec shrinks), one raw
/// REPLACE; COW v3, lz4. (old, new, payload with `estimate_op_count_max` and no
/// `estimate_cow_size`.)
fn replace_case() -> (Vec<u8>, Vec<u8>, Built) {
    let old = pattern(768 * BS, 61);
    let new = pattern(768 * BS, 62);
    let ops = [DeltaOp::Replace {
        dst: vec![(0, 768)],
        encoding: Encoding::Replace,
    }];
    let no_differ = |_: &[u8], _: &[u8]| Vec::new();
    let mut built = PayloadBuilder::new()
        .delta("system", &old, &new, &ops, &no_differ)
        .build();
    let f = VabcFields {
        cow_version: 3,
        compression: "lz4".into(),
        compression_factor: 65536,
        batch_writes: true,
        threaded: true,
    };
    set_vabc(&mut built.manifest, &["system"], &f);
    let part = built.manifest.partitions[0].clone();
    let params = VabcParams::from_manifest(&built.manifest, &part).unwrap();
    let est = estimate_vabc_cow(&part, &params, DeviceProfile::CURRENT, Some(&old), &new).unwrap();
    built.manifest.partitions[0].estimate_op_count_max = Some(est.estimate_op_count_max);
    (old, new, built)
}

/// D/old/system.img, and the payload with `estimate_cow_size` = `estimate` at D/<tag>.bin.
fn write_case(d: &TempDir, old: &[u8], built: &Built, estimate: u64, tag: &str) -> PathBuf {
    let old_dir = d.join("old");
    if !old_dir.exists() {
        std::fs::create_dir(&old_dir).unwrap();
        std::fs::write(old_dir.join("system.img"), old).unwrap();
    }
    let mut b = Built {
        manifest: built.manifest.clone(),
        data: built.data.clone(),
    };
    let p = &mut b.manifest.partitions[0];
    p.estimate_cow_size = Some(estimate);
    let ota = d.join(&format!("{tag}.bin"));
    std::fs::write(&ota, b.to_bytes()).unwrap();
    ota
}

/// libsnapshot's COW device size for `estimate`: the estimate rounded up to 4 KiB, + 2 MiB.
fn device_size(estimate: u64) -> u64 {
    estimate.div_ceil(BS as u64) * BS as u64 + 2 * MIB
}

/// The COW device is exactly estimate (rounded up to 4 KiB) + 2 MiB, and the limit is exact:
/// with S the COW's size, an estimate whose device is the last 4 KiB step below S is refused
/// with one line and nothing in the output directory, and the estimate one byte larger (its
/// device the first step at or above S, and an estimate not 4 KiB-aligned, so the rounding
/// decides) is accepted.
#[test]
fn the_cow_device_is_the_estimate_plus_2_mib_and_its_limit_is_exact() {
    let d = TempDir::new("ota-cow-device-size");
    let (old, _new, built) = replace_case();
    let old_dir = d.join("old");
    let run = |estimate: u64, tag: &str| {
        let ota = write_case(&d, &old, &built, estimate, tag);
        let out = d.join(&format!("out-{tag}"));
        let mut args = vec!["ota", "cow", path_str(&ota), "--source"];
        args.extend([path_str(&old_dir), "-o", path_str(&out), "--json"]);
        (snapblk(&args), out)
    };
    // A roomy estimate (64 MiB + 1 byte: not 4 KiB-aligned) gives the COW's size S.
    let roomy = 64 * MIB + 1;
    let (o, _) = run(roomy, "roomy");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = json(&String::from_utf8_lossy(&o.stdout))["partitions"][0].clone();
    assert_eq!(r["estimate_cow_size"], roomy);
    assert_eq!(r["cow_device_size"], device_size(roomy), "{r}");
    assert_eq!(r["cow_device_size"], 66 * MIB + 4096, "{r}");
    let s = r["cow_size"].as_u64().unwrap();
    assert!(
        s > 3 * MIB,
        "the COW holds 3 MiB that lz4 cannot shrink: {s}"
    );

    // The largest estimate whose device is below S.
    let step = |x: u64| x / BS as u64 * BS as u64;
    let over = step(s - 1) - 2 * MIB;
    assert!(device_size(over) < s);
    let (o, out) = run(over, "over");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("snapblk: ")
            && err.contains(&format!(
                "the COW is {s} bytes, more than the {} bytes the device reserves (estimate_cow_size {over} + 2 MiB): it would not fit; nothing written",
                device_size(over)
            )),
        "{err}"
    );
    assert!(entries(&out).is_empty(), "{:?}", entries(&out));

    // One byte more: the device is the next 4 KiB step, at or above S.
    let just = over + 1;
    assert_ne!(just % BS as u64, 0);
    let (o, out) = run(just, "just");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = json(&String::from_utf8_lossy(&o.stdout))["partitions"][0].clone();
    assert_eq!(r["cow_size"], s, "{r}");
    let device = r["cow_device_size"].as_u64().unwrap();
    assert_eq!(device, device_size(just), "{r}");
    assert!(device >= s && device - s < BS as u64, "{r}");
    assert_eq!(entries(&out), ["system.cow", "system.cow.snapblk"]);
}

/// Unmounts a mount point on drop (a failing test leaves no tmpfs behind); create it after
/// the `TempDir` that holds the mount point.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `--verify-merge` checks there is room in the output directory for copies of the old image
/// and the COW before it makes them: on a tmpfs that holds the new image and the COW but not
/// the copies as well, it refuses with one line naming what it needs (exactly old image + COW
/// bytes) and leaves nothing; remounted with room for them, the same run merges the copy to
/// the new image.
#[test]
fn verify_merge_refuses_to_start_without_room_for_its_copies() {
    let d = TempDir::new("ota-cow-verify-merge-room");
    let (old, new, built) = replace_case();
    let ota = write_case(&d, &old, &built, 64 * MIB, "p");
    // The COW's size, from a run on the ordinary file system.
    let out = d.join("plain");
    let doc = json(&ok(&[
        "ota",
        "cow",
        path_str(&ota),
        "--source",
        path_str(&d.join("old")),
        "-o",
        path_str(&out),
        "--json",
    ]));
    let s = doc["partitions"][0]["cow_size"].as_u64().unwrap();
    let img = new.len() as u64;
    let need = img + s;
    // While the merge check runs, the output directory holds the built new image and the
    // COW (img + s); the copies need `need` more. 1 MiB short of that:
    let mnt = d.join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    let _guard = Unmount(mnt.clone());
    let kib = |b: u64| format!("size={}k", b.div_ceil(1024));
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &kib(img + s + need - MIB), "tiny"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs (the tests run as root)");
    let out = mnt.join("out");
    let args = |out: &'_ Path| -> Vec<String> {
        [
            "ota",
            "cow",
            path_str(&ota),
            "--source",
            path_str(&d.join("old")),
            "-o",
            path_str(out),
            "--verify",
            "--verify-merge",
            "--json",
        ]
        .map(String::from)
        .to_vec()
    };
    let a = args(&out);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let o = snapblk(&a);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let head = format!(
        "--verify-merge needs {need} bytes free in {} for copies of the old image and the COW, and ",
        out.display()
    );
    let at = err
        .find(&head)
        .unwrap_or_else(|| panic!("not the free-space refusal: {err}"));
    let free: u64 = err[at + head.len()..]
        .trim_end()
        .trim_end_matches(" are")
        .parse()
        .unwrap_or_else(|e| panic!("{e}: {err}"));
    assert!(free < need, "{free} >= {need}: {err}");
    assert!(entries(&out).is_empty(), "{:?}", entries(&out));

    // With room for the copies (1 MiB more than they need), the same run merges.
    let st = Command::new("mount")
        .args(["-o", &format!("remount,{}", kib(img + s + need + MIB))])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "remount the tmpfs larger");
    let doc = json(&ok(&a));
    let r = &doc["partitions"][0];
    assert_eq!(r["merge_sha256"], sha256_hex(&new), "{doc}");
    assert_eq!(entries(&out), ["system.cow", "system.cow.snapblk"]);
}
