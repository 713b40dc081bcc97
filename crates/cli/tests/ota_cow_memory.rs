//! The memory of `snapblk ota cow`, `ota apply` and `ota extract` does not grow with the
//! partition. Each runs on an 8 MiB and on a 32 MiB partition of the same make (data that no
//! codec shrinks, operations of one fixed size, so only their number grows), under GNU time
//! (`%M`, the kernel's `ru_maxrss` of exactly that process), and its peak RSS may grow by less
//! than half of the 24 MiB the images grow by: holding one image in memory adds 24 MiB, an image
//! and its copy 48. The outputs are checked too (the images' and the snapshot view's SHA-256).
//! The absolute bounds on a 512 MiB partition are measured by `bench/ota-memory.sh`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use snapblk_cow::record::sha256_of;
use snapblk_ota::testing::vabc::{VabcFields, cow_copy, set_vabc};
use snapblk_ota::testing::{Built, Encoding, PayloadBuilder, sha256};
use snapblk_ota::{
    DeltaArchiveManifest, DeviceProfile, Extent, InstallOperation, OpType, PartitionInfo,
    PartitionUpdate, VabcParams, estimate_vabc_cow,
};
use snapblk_testsupport::{TempDir, path_str, pattern as noise};

const BS: u64 = 4096;
/// The two partition sizes, in blocks: 8 MiB and 32 MiB.
const SIZES: [u64; 2] = [8 << 8, 32 << 8];
/// Blocks per operation (1 MiB), whatever the partition's size.
const OP: u64 = 256;
/// Largest peak RSS growth from the small partition to the large one: half the 24 MiB the
/// images grow by.
const GROWTH_KIB: i64 = ((SIZES[1] - SIZES[0]) * BS / 2 / 1024) as i64;

fn ext(s: u64, n: u64) -> Extent {
    Extent {
        start_block: Some(s),
        num_blocks: Some(n),
    }
}

/// `(start, n)` cut into pieces of at most [`OP`] blocks.
fn pieces(start: u64, n: u64) -> impl Iterator<Item = (u64, u64)> {
    (start..start + n)
        .step_by(OP as usize)
        .map(move |s| (s, OP.min(start + n - s)))
}

/// A partition of `blocks` blocks, in eighths (q = blocks / 8). Old: noise A everywhere.
/// New: 0..2q = old 0..2q (identity SOURCE_COPY), 2q..3q = old 0..q (SOURCE_COPY with a
/// COW_COPY: COPY in the COW), 3q..4q = old q..2q (SOURCE_COPY without a merge op: REPLACE
/// from the old image), 4q..7q noise B (REPLACE), 7q..8q zeros (ZERO). Every operation but the
/// ZERO covers at most [`OP`] blocks. Writes `d/old/system.img` and `d/payload.bin`; returns
/// the payload's path and the new image.
fn payload(d: &TempDir, blocks: u64, fields: &VabcFields) -> (PathBuf, Vec<u8>) {
    let q = blocks / 8;
    let at = |b: u64| (b * BS) as usize;
    let a = noise(at(blocks), 1);
    let mut new = vec![0u8; at(blocks)];
    new[..at(2 * q)].copy_from_slice(&a[..at(2 * q)]);
    new[at(2 * q)..at(3 * q)].copy_from_slice(&a[..at(q)]);
    new[at(3 * q)..at(4 * q)].copy_from_slice(&a[at(q)..at(2 * q)]);
    new[at(4 * q)..at(7 * q)].copy_from_slice(&noise(at(3 * q), 2));
    let old_dir = d.join("old");
    std::fs::create_dir_all(&old_dir).unwrap();
    let old_path = old_dir.join("system.img");
    let new_path = d.join("new.img");
    std::fs::write(&old_path, &a).unwrap();
    std::fs::write(&new_path, &new).unwrap();
    let copy = |src: u64, dst: u64, n: u64| InstallOperation {
        r#type: OpType::SourceCopy as i32,
        src_extents: vec![ext(src, n)],
        dst_extents: vec![ext(dst, n)],
        src_sha256_hash: Some(sha256(&a[at(src)..at(src + n)])),
        ..Default::default()
    };
    let mut operations = Vec::new();
    let mut merge_operations = Vec::new();
    let mut data = Vec::new();
    for (s, n) in pieces(0, 2 * q) {
        operations.push(copy(s, s, n));
    }
    for (s, n) in pieces(0, q) {
        operations.push(copy(s, 2 * q + s, n));
        merge_operations.push(cow_copy(s, 2 * q + s, n));
    }
    for (s, n) in pieces(q, q) {
        operations.push(copy(s, 2 * q + s, n));
    }
    for (s, n) in pieces(4 * q, 3 * q) {
        let blob = &new[at(s)..at(s + n)];
        operations.push(InstallOperation {
            r#type: OpType::Replace as i32,
            dst_extents: vec![ext(s, n)],
            data_offset: Some(data.len() as u64),
            data_length: Some(blob.len() as u64),
            data_sha256_hash: Some(sha256(blob)),
            ..Default::default()
        });
        data.extend_from_slice(blob);
    }
    operations.push(InstallOperation {
        r#type: OpType::Zero as i32,
        dst_extents: vec![ext(7 * q, blocks - 7 * q)],
        ..Default::default()
    });
    let info = |img: &[u8]| {
        Some(PartitionInfo {
            size: Some(img.len() as u64),
            hash: Some(sha256(img)),
        })
    };
    let mut built = Built {
        manifest: DeltaArchiveManifest {
            block_size: Some(BS as u32),
            minor_version: Some(8),
            partitions: vec![PartitionUpdate {
                partition_name: "system".into(),
                old_partition_info: info(&a),
                new_partition_info: info(&new),
                operations,
                merge_operations,
                ..Default::default()
            }],
            ..Default::default()
        },
        data,
    };
    set_vabc(&mut built.manifest, &["system"], fields);
    let p = built.manifest.partitions[0].clone();
    let params = VabcParams::from_manifest(&built.manifest, &p).unwrap();
    let old = std::fs::File::open(&old_path).unwrap();
    let newf = std::fs::File::open(&new_path).unwrap();
    let est = estimate_vabc_cow(&p, &params, DeviceProfile::CURRENT, Some(&old), &newf).unwrap();
    let q = &mut built.manifest.partitions[0];
    q.estimate_cow_size = Some(est.estimate_cow_size);
    if fields.cow_version == 3 {
        q.estimate_op_count_max = Some(est.estimate_op_count_max);
    }
    let ota = d.join("payload.bin");
    std::fs::write(&ota, built.to_bytes()).unwrap();
    std::fs::remove_file(&new_path).unwrap();
    (ota, new)
}

/// Run `snapblk ARGS` under GNU time (`/usr/bin/time`, from scripts/install-deps.sh): its
/// stdout and peak RSS in KiB. time forks a small child that execs snapblk, so the figure is
/// snapblk's own (a child spawned from this test would carry the test's peak).
fn run_measured(args: &[&str]) -> (String, i64) {
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
    assert!(
        o.status.success(),
        "snapblk {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rss = std::fs::read_to_string(&rss_path).unwrap();
    let rss_kib = rss
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time: {rss:?}"));
    (String::from_utf8(o.stdout).unwrap(), rss_kib)
}

/// The peak RSS of `run` on the small and the large partition grows by less than
/// [`GROWTH_KIB`]. `run(blocks)` returns its peak RSS in KiB.
fn assert_flat(what: &str, run: impl Fn(u64) -> i64) {
    let [small, large] = SIZES.map(&run);
    let growth = large - small;
    let mib = |b: u64| (b * BS) >> 20;
    eprintln!(
        "{what}: peak RSS {small} KiB for {} MiB, {large} KiB for {} MiB",
        mib(SIZES[0]),
        mib(SIZES[1])
    );
    assert!(
        growth < GROWTH_KIB,
        "{what}: peak RSS {small} KiB for the {} MiB partition and {large} KiB for the {} MiB one: \
         it grew by {growth} KiB, not less than {GROWTH_KIB} KiB (half of what the images grow \
         by): memory grows with the partition",
        mib(SIZES[0]),
        mib(SIZES[1])
    );
}

fn fields(version: u32, comp: &str) -> VabcFields {
    VabcFields {
        cow_version: version,
        compression: comp.into(),
        compression_factor: if version == 3 { 65536 } else { 0 },
        batch_writes: true,
        threaded: true,
    }
}

#[test]
fn ota_cow_memory_does_not_grow_with_the_partition() {
    for (version, comp) in [(3, "lz4"), (2, "gz")] {
        let what = format!("ota cow v{version} {comp}");
        assert_flat(&what, |blocks| {
            let d = TempDir::new("ota-cow-mem");
            let (ota, new) = payload(&d, blocks, &fields(version, comp));
            let (old, out) = (d.join("old"), d.join("out"));
            let mut args = vec![
                "ota",
                "cow",
                path_str(&ota),
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
            let (stdout, rss_kib) = run_measured(&args);
            let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            let p = &doc["partitions"][0];
            if version == 3 {
                assert_eq!(
                    p["view_sha256"],
                    snapblk_ota::hex(&sha256(&new)),
                    "{what}: the snapshot view is the new image"
                );
            }
            let q = blocks / 8;
            assert_eq!(p["ops"]["copy_blocks"], q, "{what}");
            assert_eq!(p["ops"]["replace_blocks"], 4 * q, "{what}");
            assert_eq!(p["ops"]["zero_blocks"], q, "{what}");
            rss_kib
        });
    }
}

#[test]
fn ota_apply_memory_does_not_grow_with_the_partition() {
    assert_flat("ota apply", |blocks| {
        let d = TempDir::new("ota-apply-mem");
        let (ota, new) = payload(&d, blocks, &fields(3, "lz4"));
        let (old, out) = (d.join("old"), d.join("applied"));
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
        let (_, rss_kib) = run_measured(&args);
        check_image(&out, &new, "ota apply");
        rss_kib
    });
}

/// A full payload in 2 MiB operations (REPLACE, REPLACE_XZ and REPLACE_ZSTD in turn; the
/// zero eighth as ZERO) of the same new image.
#[test]
fn ota_extract_memory_does_not_grow_with_the_partition() {
    assert_flat("ota extract", |blocks| {
        let d = TempDir::new("ota-extract-mem");
        let (_, new) = payload(&d, blocks, &fields(3, "lz4"));
        let built = PayloadBuilder::new()
            .partition(
                "system",
                &new,
                512,
                &[Encoding::Replace, Encoding::Xz, Encoding::Zstd],
            )
            .build();
        let ota = d.join("full.bin");
        std::fs::write(&ota, built.to_bytes()).unwrap();
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
        let (_, rss_kib) = run_measured(&args);
        check_image(&out, &new, "ota extract");
        rss_kib
    });
}

/// `OUT/system.img` is `want`.
fn check_image(out: &Path, want: &[u8], what: &str) {
    let got = sha256_of(&std::fs::File::open(out.join("system.img")).unwrap()).unwrap();
    assert_eq!(got.to_vec(), sha256(want), "{what}: the image");
}
