//! `snapblk ota cow` keeps its memory bounded whatever the partition's size: on a 512 MiB
//! partition (old and new images as sparse files, an incremental payload with a COW_COPY, a
//! SOURCE_COPY the COW stores as REPLACE, 16 MiB of REPLACE data and ZERO for the rest) the
//! child's peak RSS (GNU time's `%M`, the kernel's `ru_maxrss` of exactly that process) stays under 150 MiB,
//! where holding either image in memory would take 512 MiB; and the COW it writes, with
//! `--verify` (v3), serves the new image's hash.

use std::path::Path;
use std::process::{Command, Stdio};

use snapblk_cow::record::sha256_of;
use snapblk_ota::testing::Built;
use snapblk_ota::testing::vabc::{VabcFields, cow_copy, set_vabc};
use snapblk_ota::{
    DeltaArchiveManifest, DeviceProfile, Extent, InstallOperation, OpType, PartitionInfo,
    PartitionUpdate, VabcParams, estimate_vabc_cow,
};
use snapblk_testsupport::{TempDir, path_str, pattern as noise};

const BS: u64 = 4096;
/// The partition: 512 MiB.
const BLOCKS: u64 = 512 << 8;
/// Peak RSS allowed: far below one image.
const LIMIT_KIB: i64 = 150 << 10;

fn ext(s: u64, n: u64) -> Extent {
    Extent {
        start_block: Some(s),
        num_blocks: Some(n),
    }
}

/// A sparse image of `BLOCKS` blocks with `pieces` (block, bytes) written in it.
fn image(path: &Path, pieces: &[(u64, &[u8])]) {
    let f = std::fs::File::create(path).unwrap();
    for &(b, data) in pieces {
        std::os::unix::fs::FileExt::write_all_at(&f, data, b * BS).unwrap();
    }
    f.set_len(BLOCKS * BS).unwrap();
}

/// Old: blocks 0..4096 noise A. New: 0..4096 = old 0..4096 (identity SOURCE_COPY),
/// 4096..6144 = old 0..2048 (SOURCE_COPY with a COW_COPY), 6144..8192 = old 2048..4096
/// (SOURCE_COPY without a merge op: REPLACE from the old image), 8192..12288 noise B
/// (REPLACE), the rest ZERO. Returns the payload's path and the new image's SHA-256.
fn payload(d: &TempDir, fields: &VabcFields) -> (std::path::PathBuf, [u8; 32]) {
    let a = noise((4096 * BS) as usize, 1);
    let b = noise((4096 * BS) as usize, 2);
    let old_dir = d.join("old");
    std::fs::create_dir_all(&old_dir).unwrap();
    let old_path = old_dir.join("system.img");
    let new_path = d.join("new.img");
    image(&old_path, &[(0, &a)]);
    image(&new_path, &[(0, &a), (4096, &a), (8192, &b)]);
    let old = std::fs::File::open(&old_path).unwrap();
    let new = std::fs::File::open(&new_path).unwrap();
    let (old_hash, new_hash) = (sha256_of(&old).unwrap(), sha256_of(&new).unwrap());
    let src_hash = |s: u64, n: u64| {
        snapblk_ota::testing::sha256(&a[(s * BS) as usize..((s + n) * BS) as usize])
    };
    let copy = |src: u64, dst: u64, n: u64| InstallOperation {
        r#type: OpType::SourceCopy as i32,
        src_extents: vec![ext(src, n)],
        dst_extents: vec![ext(dst, n)],
        src_sha256_hash: Some(src_hash(src, n)),
        ..Default::default()
    };
    let operations = vec![
        copy(0, 0, 4096),
        copy(0, 4096, 2048),
        copy(2048, 6144, 2048),
        InstallOperation {
            r#type: OpType::Replace as i32,
            dst_extents: vec![ext(8192, 4096)],
            data_offset: Some(0),
            data_length: Some(b.len() as u64),
            data_sha256_hash: Some(snapblk_ota::testing::sha256(&b)),
            ..Default::default()
        },
        InstallOperation {
            r#type: OpType::Zero as i32,
            dst_extents: vec![ext(12288, BLOCKS - 12288)],
            ..Default::default()
        },
    ];
    let info = |h: [u8; 32]| {
        Some(PartitionInfo {
            size: Some(BLOCKS * BS),
            hash: Some(h.to_vec()),
        })
    };
    let mut built = Built {
        manifest: DeltaArchiveManifest {
            block_size: Some(BS as u32),
            minor_version: Some(8),
            partitions: vec![PartitionUpdate {
                partition_name: "system".into(),
                old_partition_info: info(old_hash),
                new_partition_info: info(new_hash),
                operations,
                merge_operations: vec![cow_copy(0, 4096, 2048)],
                ..Default::default()
            }],
            ..Default::default()
        },
        data: b,
    };
    set_vabc(&mut built.manifest, &["system"], fields);
    let p = built.manifest.partitions[0].clone();
    let params = VabcParams::from_manifest(&built.manifest, &p).unwrap();
    let est = estimate_vabc_cow(&p, &params, DeviceProfile::CURRENT, Some(&old), &new).unwrap();
    let q = &mut built.manifest.partitions[0];
    q.estimate_cow_size = Some(est.estimate_cow_size);
    if fields.cow_version == 3 {
        q.estimate_op_count_max = Some(est.estimate_op_count_max);
    }
    let ota = d.join("payload.bin");
    std::fs::write(&ota, built.to_bytes()).unwrap();
    std::fs::remove_file(&new_path).unwrap();
    (ota, new_hash)
}

/// Run `snapblk ARGS` under GNU time (`/usr/bin/time`, from scripts/install-deps.sh): its exit
/// status, stdout and peak RSS in KiB. time forks a small child that execs snapblk, so the
/// figure is snapblk's own (a child spawned from this test would carry the test's peak).
fn run_measured(args: &[&str]) -> (std::process::ExitStatus, String, i64) {
    let d = TempDir::new("ota-cow-mem-time");
    let rss_path = d.join("maxrss");
    let o = Command::new("/usr/bin/time")
        .args([
            "-f",
            "%M",
            "-o",
            path_str(&rss_path),
            env!("CARGO_BIN_EXE_snapblk"),
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run /usr/bin/time (Debian package time, scripts/install-deps.sh)");
    let rss = std::fs::read_to_string(&rss_path).unwrap();
    let rss_kib = rss
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time: {rss:?}"));
    assert!(
        o.status.success(),
        "snapblk {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status, String::from_utf8(o.stdout).unwrap(), rss_kib)
}

#[test]
fn peak_memory_does_not_grow_with_the_partition() {
    for (version, comp) in [(3, "lz4"), (2, "gz")] {
        let what = format!("v{version} {comp}");
        let d = TempDir::new("ota-cow-mem");
        let fields = VabcFields {
            cow_version: version,
            compression: comp.into(),
            compression_factor: if version == 3 { 65536 } else { 0 },
            batch_writes: true,
            threaded: true,
        };
        let (ota, new_hash) = payload(&d, &fields);
        let out = d.join("out");
        let (old, ota_s) = (d.join("old"), path_str(&ota).to_owned());
        let mut args = vec![
            "ota",
            "cow",
            &ota_s,
            "--source",
            path_str(&old),
            "-o",
            path_str(&out),
            "--threads",
            "2",
            "--json",
        ];
        // The snapshot view's check once (it reads the whole partition through the driver).
        if version == 3 {
            args.push("--verify");
        }
        let (status, stdout, rss_kib) = run_measured(&args);
        assert!(status.success(), "{what}: snapblk {args:?} failed");
        let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let p = &doc["partitions"][0];
        if version == 3 {
            assert_eq!(
                p["view_sha256"],
                snapblk_ota::hex(&new_hash),
                "{what}: the snapshot view is the new image"
            );
        }
        assert_eq!(p["ops"]["copy_blocks"], 2048, "{what}");
        assert_eq!(p["ops"]["replace_blocks"], 2048 + 4096, "{what}");
        assert_eq!(p["ops"]["zero_blocks"], BLOCKS - 12288, "{what}");
        eprintln!("{what}: peak RSS {} MiB", rss_kib >> 10);
        assert!(
            rss_kib < LIMIT_KIB,
            "{what}: peak RSS {rss_kib} KiB for a {} MiB partition (limit {LIMIT_KIB} KiB)",
            (BLOCKS * BS) >> 20
        );
    }
}

/// `ota apply` of the same incremental payload and `ota extract` of a full payload of a
/// 512 MiB partition stay within the bound docs/ota.md states: about threads × (largest
/// operation's source + destination) + 64 MiB, whatever the partition's size; and write the
/// images the payloads' hashes name.
#[test]
fn apply_and_extract_memory_is_bounded_by_the_operations() {
    // apply: the largest operations are the 16 MiB SOURCE_COPY and REPLACE (source or data
    // 16 MiB, destination 16 MiB), on 2 threads.
    let d = TempDir::new("ota-apply-mem");
    let fields = VabcFields {
        cow_version: 3,
        compression: "lz4".into(),
        compression_factor: 65536,
        batch_writes: true,
        threaded: true,
    };
    let (ota, new_hash) = payload(&d, &fields);
    let out = d.join("applied");
    let old = d.join("old");
    let args = [
        "ota",
        "apply",
        path_str(&ota),
        "--source",
        path_str(&old),
        "-o",
        path_str(&out),
        "--threads",
        "2",
        "--quiet",
    ];
    bounded_run(
        "ota apply",
        &args,
        (2 * (16 + 16) + 64) << 10,
        &out,
        &new_hash,
    );

    // extract: a full payload in 2 MiB REPLACE_XZ / REPLACE_BZ operations (zero chunks as
    // ZERO), 16 MiB of data and 496 MiB of zeros.
    let d = TempDir::new("ota-extract-mem");
    let mut img = vec![0u8; (BLOCKS * BS) as usize];
    img[..(4096 * BS) as usize].copy_from_slice(&noise((4096 * BS) as usize, 3));
    let want = snapblk_ota::testing::sha256(&img);
    let built = snapblk_ota::testing::PayloadBuilder::new()
        .partition(
            "system",
            &img,
            512,
            &[
                snapblk_ota::testing::Encoding::Xz,
                snapblk_ota::testing::Encoding::Bz,
            ],
        )
        .build();
    drop(img);
    let ota = d.join("full.bin");
    std::fs::write(&ota, built.to_bytes()).unwrap();
    drop(built);
    let out = d.join("extracted");
    let args = [
        "ota",
        "extract",
        path_str(&ota),
        "-o",
        path_str(&out),
        "--threads",
        "2",
        "--quiet",
    ];
    bounded_run("ota extract", &args, (2 * (2 + 2) + 64) << 10, &out, &want);
}

/// Run `snapblk ARGS` measured: its peak RSS stays under `limit` KiB, and the
/// `OUT/system.img` it writes hashes to `want`.
fn bounded_run(what: &str, args: &[&str], limit: i64, out: &Path, want: &[u8]) {
    let (_, _, rss_kib) = run_measured(args);
    eprintln!("{what}: peak RSS {} MiB", rss_kib >> 10);
    assert!(
        rss_kib < limit,
        "{what}: peak RSS {rss_kib} KiB for a 512 MiB partition (limit {limit} KiB)"
    );
    let got = sha256_of(&std::fs::File::open(out.join("system.img")).unwrap()).unwrap();
    assert_eq!(&got[..], want, "{what}: the image");
}
