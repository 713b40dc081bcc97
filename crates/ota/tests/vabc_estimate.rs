//! The COW size of an incremental payload made by `ota generate` from an ext4 image pair
//! (edited, shifted, moved, deleted, new and zeroed files), against a size derived here from
//! the PAYLOAD alone and the COW format (../shared/spec/android-cow-format.md §3, §4, §5, §7):
//! no count comes from the writer or its dry run.
//!
//! From the manifest: per new block, the op update_engine's writer gives it (notes §2.3:
//! SOURCE_COPY → COPY where a COW_COPY covers the destination, nothing where source =
//! destination, REPLACE elsewhere; diff ops → XOR inside COW_XOR destinations, REPLACE
//! elsewhere; REPLACE* → REPLACE; ZERO/DISCARD → ZERO; the dm-verity blocks → REPLACE), the
//! merge sequence (every non-identity merge op's destinations), the labels (0, one per install
//! op, the end label). From the format: v3 is the 78-byte header, the 2 MiB scratch, 4 B per
//! sequence entry, 4 resume slots of 16 B, 16 B per op slot, then the payloads; v2 is the
//! 38-byte header, the scratch, clusters of 1024 20-byte slots (the last one a CLUSTER
//! record) each followed by its payloads, SEQUENCE records of at most 2048 entries, and an
//! 84-byte footer.
//!
//! Checked for COW v2 and v3, compression none/lz4/gz/zstd, a current device and a legacy
//! one (no XOR, no sequence, COPY ops up front), against both the file `write_vabc_cow`
//! writes and the size `estimate_vabc_cow`'s dry run gives, and the payload's own
//! `estimate_op_count_max` and `estimate_cow_size`.
//!
//! The counting and the layouts are in `cow_size/mod.rs` (shared with `vabc.rs`).
//!
//! Tolerance: with compression `none` the size is exact (0 bytes), for the file and for the
//! dry run (whose v3 op area holds max(ops, 25) slots, as update_engine's generator sizes
//! it). With a codec, payload lengths depend on the compressor's implementation and version,
//! so the analytical size is an upper bound: the same layout with every payload at its worst
//! case — the raw 4 KiB block for v3 (every codec: the writer stores the raw unit when
//! compression does not shrink it, spec §6.3) and for v2 lz4/zstd, zlib's
//! `compressBound(4096)` for v2 gz (v2 stores the gz stream even when longer). The layout is
//! still exact for every codec: the file is the analytical layout with empty payloads plus
//! the payload bytes stored (lengths read back by snapblk-cow's reader, one payload per
//! REPLACE or XOR block the payload predicts, none over its worst case).

use snapblk_core::MemFile;
use snapblk_cow::CowReader;
use snapblk_ota::{
    DeltaArchiveManifest, DeviceProfile, GenerateOptions, PartitionImages, Payload, VabcOptions,
    VabcParams, estimate_vabc_cow, generate, write_vabc_cow,
};
use snapblk_testsupport::{TempDir, pattern};

mod cow_size;

use cow_size::{B, Counts, V3_MIN_OP_SLOTS, V3_OP, zlib_bound};

fn text(len: usize, seed: u64) -> Vec<u8> {
    let words = ["alpha ", "beta ", "gamma ", "delta\n", "epsilon ", "zeta "];
    let mut v = Vec::with_capacity(len);
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    while v.len() < len {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.extend_from_slice(words[(x >> 33) as usize % words.len()].as_bytes());
        if (x >> 20).is_multiple_of(7) {
            v.extend_from_slice(format!("{} ", x % 100000).as_bytes());
        }
    }
    v.truncate(len);
    v
}

/// Incompressible bytes (splitmix64), so some payloads do not shrink and the bounds below
/// are reached.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        v.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A 24 MiB ext4 pair with every kind of change, over a dozen files.
fn ext4_pair(d: &TempDir) -> (Vec<u8>, Vec<u8>) {
    let (o, n) = (d.join("old"), d.join("new"));
    let put = |dir: &std::path::Path, name: &str, data: &[u8]| {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    };
    let doc = text(700 * 1024, 2);
    let bin = pattern(300 * 1024, 4);
    for (dir, new) in [(&o, false), (&n, true)] {
        put(dir, "lib/libfoo.so", &pattern(400 * 1024, 1));
        put(dir, "etc/log.txt", &text(200 * 1024, 3));
        if !new {
            put(dir, "app/doc.txt", &doc);
            put(dir, "bin/tool", &bin);
            put(dir, "old/gone.dat", &pattern(200 * 1024, 5));
            put(dir, "data/blob", &pattern(400 * 1024, 6));
        } else {
            let mut d2 = doc.clone();
            d2.splice(200_000..200_000, text(1234, 7));
            d2.splice(10_000..10_000, b"inserted!".iter().copied());
            put(dir, "app/doc.txt", &d2);
            let mut b2 = bin.clone();
            for i in (0..b2.len()).step_by(40_000) {
                b2[i] ^= 0x5a;
            }
            put(dir, "bin/tool", &b2);
            put(dir, "moved/blob", &pattern(400 * 1024, 6));
            put(dir, "new/fresh.dat", &noise(150 * 1024, 8));
            let mut z = vec![0u8; 200 * 1024];
            z[..4096].copy_from_slice(&pattern(4096, 9));
            put(dir, "zero/holey", &z);
        }
        // More files: text with bytes inserted (bsdiff sources shift, offset XORs), binaries
        // edited in place (XOR at offset 0), one shrunk, one grown.
        for k in 0..6u64 {
            let mut t = text(150 * 1024 + 10_000 * k as usize, 20 + k);
            let mut b = pattern(120 * 1024, 30 + k);
            if new {
                t.splice(
                    5_000 * (k as usize + 1)..5_000 * (k as usize + 1),
                    text(300, 40 + k),
                );
                for i in (k as usize..b.len()).step_by(9_000) {
                    b[i] = b[i].wrapping_add(1);
                }
                if k == 4 {
                    t.truncate(60 * 1024);
                }
                if k == 5 {
                    b.extend_from_slice(&noise(64 * 1024, 50));
                }
            }
            put(dir, &format!("share/t{k}.txt"), &t);
            put(dir, &format!("bin/b{k}"), &b);
        }
    }
    let old = snapblk_testsupport::ext4::mkfs(&o, &d.join("old.img"), 24);
    let mut new = snapblk_testsupport::ext4::mkfs(&n, &d.join("new.img"), 24);
    new[20 << 20..(20 << 20) + (64 << 10)].fill(0);
    (old, new)
}

/// The manifest with other VABC parameters.
fn with(m: &DeltaArchiveManifest, version: u32, compression: &str) -> DeltaArchiveManifest {
    let mut m = m.clone();
    let d = m.dynamic_partition_metadata.as_mut().unwrap();
    d.cow_version = Some(version);
    d.vabc_compression_param = Some(compression.into());
    d.compression_factor = None;
    m
}

#[test]
fn cow_sizes_match_the_size_derived_from_the_payload_and_the_format() {
    let d = TempDir::new("ota-vabc-estimate");
    let (old, new) = ext4_pair(&d);
    let opts = GenerateOptions {
        vabc: Some(VabcOptions {
            compression: "lz4".into(),
            cow_version: 3,
            compression_factor: 4096,
            ..VabcOptions::default()
        }),
        threads: 2,
        ..GenerateOptions::default()
    };
    let g = generate(
        &[PartitionImages {
            name: "system",
            old: Some(&old),
            new: &new,
        }],
        &opts,
    )
    .unwrap();
    let payload = Payload::from_bytes(g.to_bytes()).unwrap();
    let m = payload.manifest();
    let part = &m.partitions[0];
    let c = Counts::from_payload(part, DeviceProfile::CURRENT);
    eprintln!(
        "{} blocks: {} install ops, {} merge ops; copy {} xor {} replace {} zero {} verity {} \
         sequence {}",
        new.len() as u64 / B,
        part.operations.len(),
        part.merge_operations.len(),
        c.copy,
        c.xor,
        c.replace,
        c.zero,
        c.verity,
        c.sequence
    );
    // A payload with every kind of block.
    assert!(
        c.copy >= 50 && c.xor >= 50 && c.replace >= 50 && c.zero >= 16 && c.sequence > 0,
        "{c:?}"
    );
    assert_eq!(c.labels, part.operations.len() as u64 + 2);
    // The payload's own op-count estimate (v3, 4 KiB units) is the analytical op count.
    assert_eq!(
        part.estimate_op_count_max,
        Some(c.op_records().max(V3_MIN_OP_SLOTS)),
        "estimate_op_count_max"
    );
    let legacy = Counts::from_payload(part, DeviceProfile::LEGACY);
    assert_eq!((legacy.sequence, legacy.xor), (0, 0));
    assert_eq!(legacy.op_records(), c.op_records());
    for (profile, version, comp) in [
        (3, "none"),
        (3, "lz4"),
        (3, "gz"),
        (3, "zstd"),
        (2, "none"),
        (2, "lz4"),
        (2, "gz"),
    ]
    .into_iter()
    .flat_map(|v| [(DeviceProfile::CURRENT, v), (DeviceProfile::LEGACY, v)])
    .map(|(p, (v, comp))| (p, v, comp))
    {
        let c = if profile.xor { &c } else { &legacy };
        let dry_slots = c.op_records().max(V3_MIN_OP_SLOTS);
        let what = format!("v{version} {comp} {profile:?}");
        let mm = with(m, version, comp);
        let mut params = VabcParams::from_manifest(&mm, part).unwrap();
        // The COW on the device has the payload's op slots (v3).
        params.op_count_max = part.estimate_op_count_max.unwrap();
        let sink = MemFile::new(Vec::new());
        let r = write_vabc_cow(part, &params, profile, Some(&old), &new, &sink).unwrap();
        let bytes = sink.into_inner();
        let len = bytes.len() as u64;
        assert_eq!(r.cow_size, len, "{what}");
        // The stored payloads, as snapblk-cow's reader finds them: one per REPLACE or XOR
        // block, none over the worst case.
        let cow = CowReader::open(bytes).unwrap();
        let per_block = if version == 2 && comp == "gz" {
            zlib_bound(B)
        } else {
            B
        };
        let stored: Vec<u64> = cow
            .data_ops()
            .filter_map(|o| o.payload())
            .map(|p| u64::from(p.len))
            .collect();
        assert_eq!(stored.len() as u64, c.data_blocks(), "{what}: payloads");
        if let Some(over) = stored.iter().find(|&&n| n > per_block) {
            panic!("{what}: a payload of {over} bytes, over {per_block}");
        }
        let stored: u64 = stored.iter().sum();
        let est = estimate_vabc_cow(part, &params, profile, Some(&old), &new).unwrap();
        let (file_bound, dry_bound, bare) = if version == 3 {
            (
                c.v3_size(params.op_count_max, per_block),
                c.v3_size(dry_slots, per_block),
                c.v3_size(params.op_count_max, 0),
            )
        } else {
            (c.v2_size(per_block), c.v2_size(per_block), c.v2_size(0))
        };
        eprintln!(
            "{what}: file {len}, dry run {}, analytical {file_bound} / {dry_bound}",
            est.cow_size
        );
        if comp == "none" {
            assert_eq!(len, file_bound, "{what}: the file's analytical size");
            assert_eq!(
                est.cow_size, dry_bound,
                "{what}: the dry run's analytical size"
            );
        } else {
            assert!(len <= file_bound, "{what}: {len} over {file_bound}");
            assert!(
                est.cow_size <= dry_bound,
                "{what}: dry run {} over {dry_bound}",
                est.cow_size
            );
        }
        // Exact for every codec: the analytical layout with empty payloads plus the payload
        // bytes stored.
        assert_eq!(len, bare + stored, "{what}: layout + stored payloads");
        // The dry run is the file's size with the op area the generator sizes.
        let slack = if version == 3 {
            (params.op_count_max - dry_slots) * V3_OP
        } else {
            0
        };
        assert_eq!(len - slack, est.cow_size, "{what}: dry run vs file");
        // The payload's estimate (made for v3 lz4, current device) is the dry run plus 1 %.
        if (profile, version, comp) == (DeviceProfile::CURRENT, 3, "lz4") {
            let e = part.estimate_cow_size.unwrap();
            assert_eq!(e, est.cow_size + est.cow_size / 100, "estimate_cow_size");
            assert!(e <= dry_bound + dry_bound / 100, "estimate_cow_size {e}");
        }
    }
}
