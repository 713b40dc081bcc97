use super::*;
use crate::error::VerityError;
use sha2::{Digest, Sha256};
use snapblk_core::MemFile;

const BS: u64 = 4096;

fn ext(start: u64, n: u64) -> Option<Extent> {
    Some(Extent {
        start_block: Some(start),
        num_blocks: Some(n),
    })
}

/// A partition of `data` blocks, its tree right after, its FEC (2 roots) right after the tree.
fn part(data: u64) -> PartitionUpdate {
    let tree: u64 = hash_tree_levels(data, 4096, HashAlgorithm::Sha256)
        .iter()
        .sum();
    let fec = fec_size((data + tree) * BS, 2) / BS;
    PartitionUpdate {
        partition_name: "system".into(),
        hash_tree_data_extent: ext(0, data),
        hash_tree_extent: ext(data, tree),
        hash_tree_algorithm: Some("sha256".into()),
        hash_tree_salt: Some(vec![0xab; 32]),
        fec_data_extent: ext(0, data + tree),
        fec_extent: ext(data + tree, fec),
        fec_roots: Some(2),
        ..Default::default()
    }
}

/// The end of the furthest extent, in bytes.
fn size_of(p: &PartitionUpdate) -> u64 {
    [
        &p.hash_tree_data_extent,
        &p.hash_tree_extent,
        &p.fec_data_extent,
        &p.fec_extent,
    ]
    .into_iter()
    .flatten()
    .map(|e| {
        e.start_block()
            .saturating_add(e.num_blocks())
            .saturating_mul(BS)
    })
    .max()
    .unwrap_or(0)
}

fn check(p: &PartitionUpdate) -> Result<Option<Verity>, VerityError> {
    Verity::from_partition(p, 4096, size_of(p))
}

/// The error for `p` in a partition of `part(300)`'s size (308 blocks).
fn err(p: &PartitionUpdate) -> String {
    Verity::from_partition(p, 4096, 308 * BS)
        .unwrap_err()
        .to_string()
}

#[test]
fn levels_follow_update_engines_count() {
    let l = |n| hash_tree_levels(n, 4096, HashAlgorithm::Sha256);
    assert_eq!(l(1), [1]);
    assert_eq!(l(128), [1]);
    assert_eq!(l(129), [2, 1]);
    assert_eq!(l(128 * 128), [128, 1]);
    assert_eq!(l(128 * 128 + 1), [129, 2, 1]);
    // SHA-1 digests take 32-byte slots too; SHA-512's 64.
    assert_eq!(hash_tree_levels(129, 4096, HashAlgorithm::Sha1), [2, 1]);
    assert_eq!(hash_tree_levels(65, 4096, HashAlgorithm::Sha512), [2, 1]);
    assert_eq!(hash_tree_levels(17, 512, HashAlgorithm::Sha256), [2, 1]);
    // FEC: ⌈blocks / 253⌉ rounds of 2 × 4096 bytes.
    assert_eq!(fec_size(253 * BS, 2), 2 * BS);
    assert_eq!(fec_size(254 * BS, 2), 4 * BS);
    assert_eq!(fec_size(231 * BS, 24), 24 * BS);
}

#[test]
fn algorithms_are_named_as_update_engine_names_them() {
    assert_eq!(HashAlgorithm::parse("SHA256"), Some(HashAlgorithm::Sha256));
    assert_eq!(HashAlgorithm::parse("sha1"), Some(HashAlgorithm::Sha1));
    assert_eq!(HashAlgorithm::parse("Sha512"), Some(HashAlgorithm::Sha512));
    assert_eq!(HashAlgorithm::parse("md5"), None);
    assert_eq!(HashAlgorithm::Sha1.slot_len(), 32);
}

#[test]
fn absent_or_empty_outputs_mean_nothing_to_do() {
    let mut p = part(300);
    p.hash_tree_extent = None;
    p.fec_extent = ext(10, 0);
    assert_eq!(check(&p).unwrap(), None);
    let v = check(&part(300)).unwrap().unwrap();
    assert!(v.has_hash_tree() && v.has_fec());
    // A tree without FEC, FEC without a tree.
    let mut p = part(300);
    p.fec_extent = None;
    let v = check(&p).unwrap().unwrap();
    assert!(v.has_hash_tree() && !v.has_fec());
    let mut p = part(300);
    p.hash_tree_extent = None;
    let v = check(&p).unwrap().unwrap();
    assert!(!v.has_hash_tree() && v.has_fec());
}

#[test]
fn bad_settings_are_refused_with_one_line_each() {
    type Change = Box<dyn Fn(&mut PartitionUpdate)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "hash_tree_data_extent is missing or empty",
            Box::new(|p| p.hash_tree_data_extent = None),
        ),
        (
            "fec_data_extent is missing or empty",
            Box::new(|p| p.fec_data_extent = ext(0, 0)),
        ),
        (
            "hash_tree_algorithm is missing or empty",
            Box::new(|p| p.hash_tree_algorithm = None),
        ),
        (
            "hash_tree_algorithm \"md5\" is not sha1, sha256 or sha512",
            Box::new(|p| p.hash_tree_algorithm = Some("md5".into())),
        ),
        (
            "fec_extent (blocks 306+4) ends past the partition's 1261568 bytes",
            Box::new(|p| p.fec_extent = ext(306, 4)),
        ),
        (
            "hash_tree_data_extent (blocks 18446744073709551615+1) ends past the partition's 1261568 bytes",
            Box::new(|p| p.hash_tree_data_extent = ext(u64::MAX, 1)),
        ),
        (
            "hash_tree_extent starts at block 299, before the end of hash_tree_data_extent (block 300)",
            Box::new(|p| p.hash_tree_extent = ext(299, 4)),
        ),
        (
            "fec_extent starts at block 300, before the end of fec_data_extent (block 304)",
            Box::new(|p| p.fec_extent = ext(300, 4)),
        ),
        (
            "fec_extent overlaps hash_tree_data_extent",
            Box::new(|p| {
                p.fec_data_extent = ext(0, 10);
                p.fec_extent = ext(10, 2);
            }),
        ),
        (
            "fec_extent overlaps hash_tree_extent",
            Box::new(|p| {
                p.fec_data_extent = ext(0, 300);
                p.fec_extent = ext(300, 4);
            }),
        ),
        (
            "hash_tree_extent has 5 blocks; a sha256 tree over 300 data blocks has 4",
            Box::new(|p| p.hash_tree_extent = ext(300, 5)),
        ),
        (
            "fec_extent has 3 blocks; FEC with 2 roots over 304 data blocks has 4",
            Box::new(|p| p.fec_extent = ext(304, 3)),
        ),
        (
            "fec_roots 1 is outside 2..=24",
            Box::new(|p| p.fec_roots = Some(1)),
        ),
        (
            "fec_roots 25 is outside 2..=24",
            Box::new(|p| p.fec_roots = Some(25)),
        ),
    ];
    for (want, change) in cases {
        let mut p = part(300);
        change(&mut p);
        assert_eq!(err(&p), want);
    }
    // Blocks other than 4096 bytes: a tree is fine, FEC is not.
    let p = part(300);
    let e = Verity::from_partition(&p, 1024, size_of(&p)).unwrap_err();
    assert!(
        e.to_string().starts_with("hash_tree_extent has 4 blocks"),
        "{e}"
    );
    let mut p = part(300);
    p.hash_tree_extent = None;
    let e = Verity::from_partition(&p, 1024, size_of(&p)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "FEC needs 4096-byte blocks, the payload's are 1024 bytes"
    );
    let e = Verity::from_partition(&part(300), 1000, 1 << 30).unwrap_err();
    assert_eq!(
        e.to_string(),
        "block size 1000 is not a power of two of at least 512 bytes"
    );
}

#[test]
fn the_default_fec_roots_is_two() {
    let mut p = part(300);
    p.fec_roots = None;
    assert_eq!(check(&p).unwrap().unwrap().fec.unwrap().roots, 2);
}

/// An image of the partition `p` describes, data from `seed`, the rest garbage that the
/// outputs must overwrite entirely.
fn image(p: &PartitionUpdate, seed: u64) -> MemFile {
    let size = size_of(p) as usize;
    let mut b = snapblk_testsupport::pattern(size, seed + 100);
    let data = p.hash_tree_data_extent.as_ref().unwrap().num_blocks() as usize * BS as usize;
    b[..data].copy_from_slice(&snapblk_testsupport::pattern(data, seed));
    // Some zero blocks in the data (the zero-hash shortcut).
    if data >= 8 * BS as usize {
        let z = (data / 3) & !(BS as usize - 1);
        b[z..z + 3 * BS as usize].fill(0);
    }
    MemFile::new(b)
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // Several chunks of blocks per level (256 blocks a chunk). Two FEC batches of rounds on
    // two threads are compared with veritysetup in tests/verity.rs.
    for data in [300, 2_000] {
        let p = part(data);
        let v = check(&p).unwrap().unwrap();
        // The progress adds up to the work announced: each level's input but the top one,
        // then the FEC's data in whole rounds of 253 blocks (2 roots).
        let levels = hash_tree_levels(data, 4096, HashAlgorithm::Sha256);
        let fec_data = data + levels.iter().sum::<u64>();
        let below_top: u64 = levels[..levels.len() - 1].iter().sum();
        let work = (data + below_top + fec_data.div_ceil(253) * 253) * BS;
        assert_eq!(v.work_bytes(), work, "{data} blocks");
        let mut results = Vec::new();
        for threads in [1, 2, 3] {
            let img = image(&p, data);
            let done = AtomicU64::new(0);
            let add = |n| {
                done.fetch_add(n, Ordering::Relaxed);
            };
            let r = v.write_with_progress(&img, threads, &add).unwrap();
            assert_eq!(done.into_inner(), work, "{data} blocks, {threads} threads");
            results.push((img.into_inner(), r));
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{data} blocks");
    }
}

#[test]
fn one_data_block_has_a_one_block_tree_as_in_update_engine() {
    let mut p = part(1);
    p.fec_extent = None;
    assert_eq!(p.hash_tree_extent.as_ref().unwrap().num_blocks(), 1);
    let v = check(&p).unwrap().unwrap();
    let img = image(&p, 5);
    let data = img.contents()[..BS as usize].to_vec();
    let r = v.write(&img, 1).unwrap();
    let salt = [0xabu8; 32];
    let leaf = Sha256::new_with_prefix(salt).chain_update(&data).finalize();
    let mut level = vec![0u8; BS as usize];
    level[..32].copy_from_slice(&leaf);
    assert_eq!(img.contents()[BS as usize..], level[..]);
    let root = Sha256::new_with_prefix(salt)
        .chain_update(&level)
        .finalize();
    assert_eq!(r.root_digest.unwrap(), crate::hex(&root));
}

#[test]
fn io_errors_name_what_was_being_done() {
    let p = part(300);
    let v = check(&p).unwrap().unwrap();
    // An image shorter than the partition: reading back the tree's data fails.
    let img = MemFile::new(vec![0u8; 100 * BS as usize]);
    let e = v.write(&img, 2).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("reading the hash tree's data at byte"),
        "{e}"
    );
}
