//! `snapblk_ota::generate` on ext4 image pairs made by `mkfs.ext4 -d` from two directories
//! (files edited in place, files with bytes inserted so bsdiff sources shift, moved, deleted
//! and new files, a zeroed region): the payload applies to exactly the new image; every
//! operation's hashes are those of its bytes; the merge operations keep update_engine's
//! invariants (COW_COPY blocks are SOURCE_COPY'd blocks, COW_XOR blocks lie inside bsdiff
//! operations with their source, no operation overwrites what a later one reads) and a merge
//! simulated in their order over the old image, by the rules of the notes (not the
//! generator's code), ends at the new image. Full payloads extract to the new image, and
//! signed payloads verify with the openssl-made key and by `openssl dgst -verify`.

use std::path::Path;

use snapblk_ota::testing::{apply_to_memory, extract_to_memory, sha256};
use snapblk_ota::{
    BsdiffFormat, CowMergeOpType, GenerateOptions, OpType, PartitionImages, PartitionUpdate,
    Payload, SignatureStatus, SigningKey, VabcOptions, VerifyKey, generate,
};
use snapblk_testsupport::openssl;
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

const BS: usize = 4096;

/// Compressible text-like bytes (so REPLACE_XZ and bsdiff both have something to do).
fn text(len: usize, seed: u64) -> Vec<u8> {
    let words = [
        "alpha ", "beta ", "gamma ", "delta\n", "epsilon ", "zeta ", "eta\n",
    ];
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

fn write(dir: &Path, name: &str, data: &[u8]) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// (old image, new image) of a 24 MiB ext4 pair with every kind of change.
fn ext4_pair(d: &TempDir) -> (Vec<u8>, Vec<u8>) {
    let (o, n) = (d.join("old"), d.join("new"));
    let lib = pattern(600 * 1024, 1);
    let doc = text(900 * 1024, 2);
    let log = text(300 * 1024, 3);
    let bin = pattern(400 * 1024, 4);
    let gone = pattern(256 * 1024, 5);
    for (dir, new) in [(&o, false), (&n, true)] {
        write(dir, "lib/libfoo.so", &lib);
        write(dir, "etc/log.txt", &log);
        if !new {
            write(dir, "app/doc.txt", &doc);
            write(dir, "bin/tool", &bin);
            write(dir, "old/gone.dat", &gone);
            write(dir, "data/blob", &pattern(512 * 1024, 6));
        } else {
            // Bytes inserted in the middle and near the start: everything after shifts.
            let mut d2 = doc.clone();
            d2.splice(300_000..300_000, text(1234, 7));
            d2.splice(10_000..10_000, b"inserted!".iter().copied());
            write(dir, "app/doc.txt", &d2);
            // Edited in place: a few scattered byte changes.
            let mut b2 = bin.clone();
            for i in (0..b2.len()).step_by(50_000) {
                b2[i] ^= 0x5a;
            }
            write(dir, "bin/tool", &b2);
            // Moved (same bytes, another directory); deleted: old/gone.dat.
            write(dir, "moved/blob", &pattern(512 * 1024, 6));
            write(dir, "new/fresh.dat", &pattern(200 * 1024, 8));
            // A zeroed region inside a file.
            let mut z = vec![0u8; 256 * 1024];
            z[..4096].copy_from_slice(&pattern(4096, 9));
            write(dir, "zero/holey", &z);
        }
    }
    let old = snapblk_testsupport::ext4::mkfs(&o, &d.join("old.img"), 24);
    let mut new = snapblk_testsupport::ext4::mkfs(&n, &d.join("new.img"), 24);
    // A zeroed region of the image itself (past the file data, inside the partition).
    new[20 * 1024 * 1024..20 * 1024 * 1024 + 64 * 1024].fill(0);
    (old, new)
}

fn blocks(ext: &[snapblk_ota::Extent]) -> Vec<u64> {
    ext.iter()
        .flat_map(|e| {
            let s = e.start_block.unwrap();
            s..s + e.num_blocks.unwrap()
        })
        .collect()
}

fn bytes_of(img: &[u8], bl: &[u64]) -> Vec<u8> {
    bl.iter()
        .flat_map(|&b| {
            let mut v = img
                .get(b as usize * BS..(b as usize + 1) * BS)
                .unwrap_or(&[])
                .to_vec();
            v.resize(BS, 0);
            v
        })
        .collect()
}

/// Every operation's `data_sha256_hash` is its blob's, `src_sha256_hash` its old bytes'.
fn check_op_hashes(p: &Payload, bytes: &[u8], part: &PartitionUpdate, old: &[u8]) {
    let data = p.data_start();
    for (i, op) in part.operations.iter().enumerate() {
        if let Some(len) = op.data_length {
            let at = (data + op.data_offset.unwrap()) as usize;
            let blob = &bytes[at..at + len as usize];
            assert_eq!(
                op.data_sha256_hash.as_deref(),
                Some(&sha256(blob)[..]),
                "op {i}"
            );
        }
        if !op.src_extents.is_empty() {
            let src = bytes_of(old, &blocks(&op.src_extents));
            assert_eq!(
                op.src_sha256_hash.as_deref(),
                Some(&sha256(&src)[..]),
                "op {i}"
            );
        }
    }
}

/// Every BROTLI_BSDIFF operation's patch, applied by an independent BSDF2 implementation
/// (crates.io `bsdiff-android`) to the operation's source bytes, gives its destination bytes.
/// Returns how many operations were checked.
fn check_bsdf2_with_oracle(
    p: &Payload,
    bytes: &[u8],
    part: &PartitionUpdate,
    old: &[u8],
    new: &[u8],
) -> usize {
    let data = p.data_start();
    let mut n = 0;
    for (i, op) in part.operations.iter().enumerate() {
        if op.op_type().unwrap() != OpType::BrotliBsdiff {
            continue;
        }
        let at = (data + op.data_offset.unwrap()) as usize;
        let patch = &bytes[at..at + op.data_length.unwrap() as usize];
        let mut src = bytes_of(old, &blocks(&op.src_extents));
        src.truncate(op.src_length.map_or(src.len(), |l| l as usize));
        let mut want = bytes_of(new, &blocks(&op.dst_extents));
        want.truncate(op.dst_length.map_or(want.len(), |l| l as usize));
        let mut got = Vec::new();
        bsdiff_android::patch_bsdf2(&src, patch, &mut got)
            .unwrap_or_else(|e| panic!("op {i}: bsdiff-android refused the patch: {e}"));
        assert!(got == want, "op {i}: bsdiff-android's output differs");
        n += 1;
    }
    n
}

/// The merge invariants, then a merge simulated over the old image: ordered operations in
/// the payload's order, each block per update_engine's rule (descending when source and
/// destination overlap with the destination after the source), COPY = the base block, XOR =
/// the base bytes at `src * 4096 + offset` XOR the COW's stored bytes (new XOR the *old*
/// image's bytes there); then every other block from the COW (raw data). Must end at `new`.
fn check_merge(part: &PartitionUpdate, old: &[u8], new: &[u8]) -> (usize, usize) {
    let mut copied = std::collections::HashMap::new();
    let mut diffed: Vec<(Vec<u64>, Vec<u64>)> = Vec::new();
    for op in &part.operations {
        match op.op_type().unwrap() {
            OpType::SourceCopy => {
                for (s, d) in blocks(&op.src_extents)
                    .into_iter()
                    .zip(blocks(&op.dst_extents))
                {
                    copied.insert(d, s);
                }
            }
            OpType::SourceBsdiff | OpType::BrotliBsdiff => {
                diffed.push((blocks(&op.src_extents), blocks(&op.dst_extents)))
            }
            _ => {}
        }
    }
    let ext = |e: &Option<snapblk_ota::Extent>| {
        let e = e.as_ref().unwrap();
        (e.start_block.unwrap(), e.num_blocks.unwrap())
    };
    let mut seen = std::collections::HashSet::new();
    let (mut ncopy, mut nxor) = (0, 0);
    let ops: Vec<_> = part
        .merge_operations
        .iter()
        .map(|m| {
            (
                m.r#type.unwrap(),
                ext(&m.src_extent),
                ext(&m.dst_extent),
                m.src_offset.unwrap_or(0),
            )
        })
        .collect();
    for &(t, (s, sn), (d, dn), off) in &ops {
        for b in d..d + dn {
            assert!(seen.insert(b), "block {b} in two merge operations");
        }
        if t == CowMergeOpType::CowCopy as i32 {
            ncopy += 1;
            assert_eq!((sn, off), (dn, 0));
            for i in 0..dn {
                assert_eq!(copied.get(&(d + i)), Some(&(s + i)), "COW_COPY {d}+{dn}");
            }
        } else {
            nxor += 1;
            assert_eq!(t, CowMergeOpType::CowXor as i32);
            assert!(off < BS as u32);
            assert_eq!(
                sn,
                dn + u64::from(off != 0),
                "XOR source: one more block with an offset"
            );
            let inside = diffed.iter().any(|(src, dst)| {
                (d..d + dn).all(|b| dst.contains(&b)) && (s..s + sn).all(|b| src.contains(&b))
            });
            assert!(
                inside,
                "COW_XOR {d}+{dn} from {s}+{sn} outside every bsdiff operation"
            );
        }
    }
    // No operation overwrites a block a later one reads (identity copies write nothing).
    for (i, a) in ops.iter().enumerate() {
        if a.0 == CowMergeOpType::CowCopy as i32 && a.1 == a.2 {
            continue;
        }
        for b in &ops[i + 1..] {
            let (ad, bs) = (a.2, b.1);
            assert!(
                !(ad.0 < bs.0 + bs.1 && bs.0 < ad.0 + ad.1),
                "merge op writing {ad:?} comes before one reading {bs:?}"
            );
        }
    }
    // The simulated merge.
    let mut base = old.to_vec();
    base.resize(new.len().max(old.len()), 0);
    let oldp = {
        let mut v = old.to_vec();
        v.resize(base.len() + BS, 0);
        v
    };
    for &(t, (s, sn), (d, dn), off) in &ops {
        let mut order: Vec<u64> = (0..dn).collect();
        if d > s && d < s + sn {
            order.reverse();
        }
        for i in order {
            let (db, sb) = ((d + i) as usize * BS, (s + i) as usize * BS + off as usize);
            let mut src = base[sb.min(base.len())..(sb + BS).min(base.len())].to_vec();
            src.resize(BS, 0);
            let out: Vec<u8> = if t == CowMergeOpType::CowCopy as i32 {
                src
            } else {
                let stored: Vec<u8> = new[db..db + BS]
                    .iter()
                    .zip(&oldp[sb..sb + BS])
                    .map(|(a, b)| a ^ b)
                    .collect();
                src.iter().zip(&stored).map(|(a, b)| a ^ b).collect()
            };
            base[db..db + BS].copy_from_slice(&out);
        }
    }
    for b in 0..new.len() / BS {
        if !seen.contains(&(b as u64)) {
            base[b * BS..(b + 1) * BS].copy_from_slice(&new[b * BS..(b + 1) * BS]);
        }
    }
    base.truncate(new.len());
    assert!(
        base == new,
        "the simulated merge does not end at the new image"
    );
    (ncopy, nxor)
}

fn histogram(part: &PartitionUpdate) -> std::collections::BTreeMap<OpType, usize> {
    let mut h = std::collections::BTreeMap::new();
    for op in &part.operations {
        *h.entry(op.op_type().unwrap()).or_default() += 1;
    }
    h
}

#[test]
fn ext4_pairs_round_trip_with_hashes_and_merge_invariants() {
    let d = TempDir::new("ota-gen-ext4");
    let (old, new) = ext4_pair(&d);
    for (format, bsdiff_type) in [
        (BsdiffFormat::Bsdf2, OpType::BrotliBsdiff),
        (BsdiffFormat::Bsdiff40, OpType::SourceBsdiff),
    ] {
        let opts = GenerateOptions {
            bsdiff_format: format,
            threads: 2,
            ..GenerateOptions::default()
        };
        let parts = [PartitionImages {
            name: "system",
            old: Some(&old),
            new: &new,
        }];
        let g = generate(&parts, &opts).unwrap();
        let bytes = g.to_bytes();
        assert!(
            bytes.len() < new.len() / 4,
            "payload of {} bytes",
            bytes.len()
        );
        let p = Payload::from_bytes(bytes.clone()).unwrap();
        let m = p.manifest();
        assert_eq!(m.minor_version, Some(8));
        let part = &m.partitions[0];
        let h = histogram(part);
        for t in [
            OpType::SourceCopy,
            OpType::Zero,
            OpType::ReplaceXz,
            bsdiff_type,
        ] {
            assert!(h.contains_key(&t), "{format:?}: no {t:?} in {h:?}");
        }
        check_op_hashes(&p, &bytes, part, &old);
        if format == BsdiffFormat::Bsdf2 {
            let n = check_bsdf2_with_oracle(&p, &bytes, part, &old, &new);
            assert!(n > 0, "no BROTLI_BSDIFF operation checked");
            eprintln!("{n} BROTLI_BSDIFF operations applied by bsdiff-android");
        }
        let (ncopy, nxor) = check_merge(part, &old, &new);
        assert!(
            ncopy > 0 && nxor > 0,
            "{format:?}: {ncopy} COW_COPY, {nxor} COW_XOR"
        );
        assert!(
            part.merge_operations
                .iter()
                .any(|o| o.src_offset.unwrap_or(0) != 0),
            "no XOR with a source offset (the inserted bytes shift the source)"
        );
        // VABC metadata and the estimate.
        let dm = m.dynamic_partition_metadata.as_ref().unwrap();
        assert_eq!(
            (dm.vabc_enabled, dm.snapshot_enabled, dm.cow_version),
            (Some(true), Some(true), Some(3))
        );
        assert_eq!(dm.vabc_compression_param.as_deref(), Some("lz4"));
        assert_eq!(dm.groups[0].partition_names, ["system"]);
        let est = part.estimate_cow_size.unwrap();
        assert!(est > 0 && est < new.len() as u64, "estimate {est}");
        assert!(part.estimate_op_count_max >= Some(25));
        // And it applies to exactly the new image.
        let (built, _) = apply_to_memory(&p, None, &[("system", &old)], false, 2).unwrap();
        assert!(built[0].1 == new, "{format:?}: applied image differs");
    }
}

#[test]
fn swapped_blocks_make_a_cycle_that_is_broken() {
    // new = old with blocks 0 and 1 swapped (and 2..4 rotated): COW_COPY cycles.
    let old = pattern(8 * BS, 11);
    let mut new = old.clone();
    new[..BS].copy_from_slice(&old[BS..2 * BS]);
    new[BS..2 * BS].copy_from_slice(&old[..BS]);
    new[2 * BS..3 * BS].copy_from_slice(&old[4 * BS..5 * BS]);
    new[3 * BS..4 * BS].copy_from_slice(&old[2 * BS..3 * BS]);
    new[4 * BS..5 * BS].copy_from_slice(&old[3 * BS..4 * BS]);
    let parts = [PartitionImages {
        name: "vendor",
        old: Some(&old),
        new: &new,
    }];
    let g = generate(&parts, &GenerateOptions::default()).unwrap();
    assert_eq!(
        g.stats[0].dropped, 2,
        "one operation per cycle dropped: {:?}",
        g.stats[0]
    );
    let p = Payload::from_bytes(g.to_bytes()).unwrap();
    let part = &p.manifest().partitions[0];
    check_merge(part, &old, &new);
    let (built, _) = apply_to_memory(&p, None, &[("vendor", &old)], false, 1).unwrap();
    assert!(built[0].1 == new);
}

#[test]
fn full_payloads_and_payloads_without_vabc() {
    let d = TempDir::new("ota-gen-full");
    let (old, new) = ext4_pair(&d);
    let parts = [PartitionImages {
        name: "system",
        old: None,
        new: &new,
    }];
    let g = generate(&parts, &GenerateOptions::default()).unwrap();
    let p = Payload::from_bytes(g.to_bytes()).unwrap();
    assert_eq!(p.manifest().minor_version, Some(0));
    let h = histogram(&p.manifest().partitions[0]);
    assert!(
        h.keys()
            .all(|t| matches!(t, OpType::ReplaceXz | OpType::Replace)),
        "{h:?}"
    );
    assert!(p.manifest().partitions[0].estimate_cow_size.is_some());
    let got = extract_to_memory(&p, None, 2).unwrap();
    assert!(got[0].1 == new);
    // Without Virtual A/B: no metadata, no merge operations, no estimate; with XOR off: only
    // COW_COPY.
    let delta = [PartitionImages {
        name: "system",
        old: Some(&old),
        new: &new,
    }];
    let plain = GenerateOptions {
        vabc: None,
        ..GenerateOptions::default()
    };
    let p = Payload::from_bytes(generate(&delta, &plain).unwrap().to_bytes()).unwrap();
    let part = &p.manifest().partitions[0];
    assert!(p.manifest().dynamic_partition_metadata.is_none());
    assert!(part.merge_operations.is_empty() && part.estimate_cow_size.is_none());
    let no_xor = GenerateOptions {
        vabc: Some(VabcOptions {
            xor: false,
            cow_version: 2,
            compression: "gz".into(),
            ..VabcOptions::default()
        }),
        ..GenerateOptions::default()
    };
    let p = Payload::from_bytes(generate(&delta, &no_xor).unwrap().to_bytes()).unwrap();
    let part = &p.manifest().partitions[0];
    assert!(!part.merge_operations.is_empty());
    assert!(
        part.merge_operations
            .iter()
            .all(|o| o.r#type == Some(CowMergeOpType::CowCopy as i32))
    );
    check_merge(part, &old, &new);
    let (built, _) = apply_to_memory(&p, None, &[("system", &old)], false, 2).unwrap();
    assert!(built[0].1 == new);
}

#[test]
fn signed_payloads_verify_with_openssl_and_the_crate() {
    let d = TempDir::new("ota-gen-sign");
    let old = pattern(16 * BS, 21);
    let mut new = old.clone();
    new[5000..5100].fill(3);
    let parts = [PartitionImages {
        name: "boot",
        old: Some(&old),
        new: &new,
    }];
    let g = generate(&parts, &GenerateOptions::default()).unwrap();
    let rsa = openssl::key(d.path(), "rsa", "rsa:2048");
    let ec = openssl::key(d.path(), "ec", "ec:P-256");
    let keys: Vec<SigningKey> = [&rsa, &ec]
        .iter()
        .map(|k| SigningKey::parse(&std::fs::read(&k.private).unwrap()).unwrap())
        .collect();
    let bytes = g.signed(&keys).unwrap();
    let p = Payload::from_bytes(bytes.clone()).unwrap();
    let digests = p.signature_digests(false, &mut |_| {}).unwrap();
    for (i, k) in [&rsa, &ec].iter().enumerate() {
        let vk = VerifyKey::parse_all(&std::fs::read(&k.public_pem).unwrap()).unwrap();
        let r = p.verify_signatures(&vk, Some(&digests)).unwrap();
        for s in [&r.metadata, &r.payload] {
            assert!(
                matches!(s, SignatureStatus::Verified { signatures: 2, signature, .. } if *signature == i),
                "key {i}: {s:?}"
            );
        }
    }
    // openssl checks the metadata signatures over the bytes the format says they sign.
    let m = u64::from_be_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let meta = &bytes[..24 + m];
    let sigs = p.verify_signatures(&[], None).unwrap();
    assert!(
        matches!(sigs.metadata, SignatureStatus::NotChecked { signatures: 2 }),
        "{sigs:?}"
    );
    let s = u32::from_be_bytes(bytes[20..24].try_into().unwrap()) as usize;
    let set =
        <snapblk_ota::Signatures as prost::Message>::decode(&bytes[24 + m..24 + m + s]).unwrap();
    std::fs::write(d.join("meta.bin"), meta).unwrap();
    for (sig, k) in set.signatures.iter().zip([&rsa, &ec]) {
        let data = sig.data.as_ref().unwrap();
        let n = sig.unpadded_signature_size.unwrap() as usize;
        std::fs::write(d.join("sig"), &data[..n]).unwrap();
        tool_ok(
            "openssl",
            &[
                "dgst",
                "-sha256",
                "-verify",
                path_str(&k.public_pem),
                "-signature",
                path_str(&d.join("sig")),
                path_str(&d.join("meta.bin")),
            ],
        );
    }
}
