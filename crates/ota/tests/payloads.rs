//! Payloads made by the crate's test writer: every encoding round-trips, and every bad input
//! is refused with a one-line error naming the partition and the op.

use snapblk_ota::testing::{Built, Encoding, PayloadBuilder, extract_to_memory, sha256};
use snapblk_ota::{Extent, OpError, OpType, OtaError, PartitionInfo, Payload};
use snapblk_testsupport::errors::chain;
use snapblk_testsupport::pattern;

const BS: usize = 4096;

/// An image of `blocks` blocks with patterned data and zero runs (blocks 3..7 and the last).
fn image(blocks: usize, seed: u64) -> Vec<u8> {
    let mut v = pattern(blocks * BS, seed);
    for b in (3..7).chain(blocks - 1..blocks) {
        v[b * BS..(b + 1) * BS].fill(0);
    }
    v
}

fn two_partitions() -> PayloadBuilder {
    PayloadBuilder::new()
        .partition(
            "system",
            &image(20, 1),
            2,
            &[Encoding::Replace, Encoding::Xz],
        )
        .partition("vendor", &image(12, 2), 3, &[Encoding::Bz, Encoding::Zstd])
}

fn open(b: &Built) -> Payload {
    Payload::from_bytes(b.to_bytes()).unwrap()
}

/// The one-line report of extracting `b` (which must fail).
fn fails(b: &Built) -> (OtaError, String) {
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    let e = extract_to_memory(&p, None, 2).unwrap_err();
    let line = chain(&e);
    (e, line)
}

#[test]
fn every_encoding_round_trips_with_any_thread_count() {
    let sys = image(33, 7);
    // A size that is not a whole number of blocks.
    let mut odd = pattern(5 * BS + 100, 9);
    odd[BS..2 * BS].fill(0);
    let zeros = vec![0u8; 8 * BS];
    for zero in [Some(OpType::Zero), Some(OpType::Discard), None] {
        let b = PayloadBuilder::new()
            .zero_ops(zero)
            .partition(
                "system",
                &sys,
                1,
                &[
                    Encoding::Replace,
                    Encoding::Bz,
                    Encoding::Xz,
                    Encoding::Zstd,
                ],
            )
            .partition("odd", &odd, 2, &[Encoding::Xz, Encoding::Replace])
            .partition("empty_ish", &zeros, 4, &[Encoding::Bz])
            .partition("none", &[], 1, &[Encoding::Replace]);
        let p = Payload::from_bytes(b.bytes()).unwrap();
        for threads in [1, 3, 8] {
            let out = extract_to_memory(&p, None, threads).unwrap();
            let names: Vec<_> = out.iter().map(|o| o.0.as_str()).collect();
            assert_eq!(names, ["system", "odd", "empty_ish", "none"]);
            assert!(out[0].1 == sys, "system, zero {zero:?}, {threads} threads");
            assert!(out[1].1 == odd, "odd, zero {zero:?}, {threads} threads");
            assert!(out[2].1 == zeros);
            assert!(out[3].1.is_empty());
        }
    }
}

/// The partition hash is read back ahead of the last operation, up to the lowest byte a
/// pending operation writes: operations out of block order (the last one in the manifest
/// writing the first blocks) must still give the image and its hash.
#[test]
fn operations_out_of_block_order_are_hashed_only_once_written() {
    let sys = image(40, 11);
    let b = PayloadBuilder::new().partition(
        "system",
        &sys,
        1,
        &[Encoding::Xz, Encoding::Replace, Encoding::Bz],
    );
    for order in ["reversed", "pairs swapped", "first last"] {
        let mut built = b.build();
        let ops = &mut built.manifest.partitions[0].operations;
        match order {
            "reversed" => ops.reverse(),
            "pairs swapped" => ops.chunks_mut(2).for_each(|c| c.reverse()),
            _ => ops.rotate_left(1),
        }
        let p = open(&built);
        for threads in [1, 2, 3, 8] {
            let out = extract_to_memory(&p, None, threads).unwrap();
            assert!(out[0].1 == sys, "{order}, {threads} threads");
        }
    }
}

#[test]
fn a_selection_extracts_only_those_partitions_and_unknown_names_are_refused() {
    let b = two_partitions().build();
    let p = open(&b);
    let out = extract_to_memory(&p, Some(&["vendor".into()]), 1).unwrap();
    assert_eq!(out.len(), 1);
    assert!(out[0].1 == image(12, 2));
    let e = extract_to_memory(&p, Some(&["boot".into()]), 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no partition \"boot\" in the payload (it has: system, vendor)"
    );
}

#[test]
fn truncated_payloads_are_refused() {
    let bytes = two_partitions().bytes();
    let e = Payload::from_bytes(bytes[..10].to_vec()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "payload truncated: 10 bytes, the header alone is 24"
    );
    let e = Payload::from_bytes(bytes[..40].to_vec()).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::PastEnd {
                what: "manifest",
                len: 40,
                ..
            }
        ),
        "{e}"
    );
    // Cut inside the data area: the header and manifest parse, the plan names the first op
    // whose blob is cut.
    let cut = bytes.len() - 100;
    let p = Payload::from_bytes(bytes[..cut].to_vec()).unwrap();
    let e = p.plan_extract(None).unwrap_err();
    let line = chain(&e);
    assert!(
        line.starts_with("partition vendor, op 3: data blob at "),
        "{line}"
    );
    let area = p.data_len();
    assert!(
        line.ends_with(&format!(
            "ends past the payload's data area of {area} bytes"
        )),
        "{line}"
    );
}

#[test]
fn bad_magic_version_and_sizes_are_refused() {
    let good = two_partitions().bytes();
    let mut b = good.clone();
    b[0] = b'X';
    let e = Payload::from_bytes(b).unwrap_err();
    assert_eq!(
        e.to_string(),
        "not a payload: magic [58, 72, 41, 55], expected \"CrAU\""
    );
    let mut b = good.clone();
    b[4..12].copy_from_slice(&1u64.to_be_bytes());
    let e = Payload::from_bytes(b).unwrap_err();
    assert_eq!(
        e.to_string(),
        "payload major version 1 is not supported (only 2, Android's)"
    );
    // Manifest size past the file.
    let mut b = good.clone();
    b[12..20].copy_from_slice(&(u64::MAX - 3).to_be_bytes());
    let e = Payload::from_bytes(b).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("payload truncated: the manifest ends at byte 18446744073709551615"),
        "{e}"
    );
    // Metadata signature past the file.
    let mut b = good.clone();
    b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    let e = Payload::from_bytes(b).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::PastEnd {
                what: "metadata signature",
                ..
            }
        ),
        "{e}"
    );
    // A manifest that is not protobuf.
    let mut b = good.clone();
    b[24..40].fill(0xff);
    let e = Payload::from_bytes(b).unwrap_err();
    assert_eq!(e.to_string(), "decoding the manifest");
    // Payload signature past the file, block size not a power of two.
    let mut m = two_partitions().build();
    m.manifest.signatures_offset = Some(1 << 40);
    m.manifest.signatures_size = Some(256);
    let e = Payload::from_bytes(m.to_bytes()).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::PastEnd {
                what: "payload signature",
                ..
            }
        ),
        "{e}"
    );
    let mut m = two_partitions().build();
    m.manifest.block_size = Some(3000);
    let e = Payload::from_bytes(m.to_bytes()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "block size 3000 is not a power of two between 512 and 1 MiB"
    );
}

#[test]
fn extents_past_the_partition_are_refused_naming_partition_and_op() {
    let mut b = two_partitions().build();
    b.manifest.partitions[1].operations[2].dst_extents[0] = Extent {
        start_block: Some(11),
        num_blocks: Some(3),
    };
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition vendor, op 2: destination extent 0 (blocks 11+3) ends past the partition's 12 blocks"
    );
    // Overflowing arithmetic is the same error.
    b.manifest.partitions[1].operations[2].dst_extents[0].start_block = Some(u64::MAX - 1);
    let (e, _) = fails(&b);
    assert!(
        matches!(
            e,
            OtaError::Op {
                index: 2,
                source: OpError::ExtentPastPartition { .. },
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn overlapping_destination_extents_are_refused() {
    // Op 4 of system (blocks 8..10) also writes block 1 (op 0's).
    let mut b = two_partitions().build();
    b.manifest.partitions[0].operations[4]
        .dst_extents
        .push(Extent {
            start_block: Some(1),
            num_blocks: Some(1),
        });
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition system, op 4: destination extent 1 overlaps op 0's (block 1)"
    );
    // Within one op.
    let mut b = two_partitions().build();
    let ext = b.manifest.partitions[0].operations[2].dst_extents[0].clone();
    b.manifest.partitions[0].operations[2].dst_extents.push(ext);
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition system, op 2: destination extent 1 overlaps op 2's (block 4)"
    );
    // So many whole-partition extents that their byte count passes 2^64 (the largest
    // partition is 2^50 bytes): still an overlap, not an arithmetic overflow.
    let mut b = two_partitions().build();
    let whole = Extent {
        start_block: Some(0),
        num_blocks: Some(snapblk_ota::MAX_PARTITION / 4096),
    };
    let p = &mut b.manifest.partitions[0];
    p.new_partition_info.as_mut().unwrap().size = Some(snapblk_ota::MAX_PARTITION);
    p.operations.truncate(1);
    p.operations[0].r#type = OpType::Zero as i32;
    p.operations[0].dst_extents = vec![whole; (1 << 14) + 1];
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition system, op 0: destination extent 1 overlaps op 0's (block 0)"
    );
}

#[test]
fn hash_mismatches_are_refused() {
    // A flipped byte in op 1's blob of system.
    let mut b = two_partitions().build();
    let op = &b.manifest.partitions[0].operations[1];
    let at = op.data_offset.unwrap() as usize + 5;
    b.data[at] ^= 1;
    let (e, line) = fails(&b);
    assert!(
        line.starts_with("partition system, op 1: "),
        "{line} ({e:?})"
    );
    // A blob that still decodes but whose hash differs: a wrong recorded hash.
    let mut b = two_partitions().build();
    b.manifest.partitions[0].operations[0].data_sha256_hash = Some(vec![0; 32]);
    let (_, line) = fails(&b);
    assert!(
        line.starts_with("partition system, op 0: data SHA-256 ")
            && line.ends_with(
                "does not match data_sha256_hash 0000000000000000000000000000000000000000000000000000000000000000"
            ),
        "{line}"
    );
    // A hash of the wrong length.
    let mut b = two_partitions().build();
    b.manifest.partitions[1].operations[0].data_sha256_hash = Some(vec![1; 20]);
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition vendor, op 0: data_sha256_hash has 20 bytes, not 32"
    );
    // A wrong partition hash.
    let mut b = two_partitions().build();
    b.manifest.partitions[1].new_partition_info = Some(PartitionInfo {
        size: Some(12 * BS as u64),
        hash: Some(vec![0xab; 32]),
    });
    let (e, _) = fails(&b);
    assert!(
        matches!(&e, OtaError::PartitionHash { partition, .. } if partition == "vendor"),
        "{e:?}"
    );
    // No hash at all.
    let mut b = two_partitions().build();
    b.manifest.partitions[0]
        .new_partition_info
        .as_mut()
        .unwrap()
        .hash = None;
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition system: new_partition_info has no 32-byte hash"
    );
}

#[test]
fn decompression_bombs_and_oversized_raw_data_are_refused() {
    // One block of destination, 8 MiB of zeros compressed (bzip2, xz, zstd).
    for (t, e) in [
        (OpType::ReplaceBz, Encoding::Bz),
        (OpType::ReplaceXz, Encoding::Xz),
        (OpType::ReplaceZstd, Encoding::Zstd),
    ] {
        let bomb = snapblk_ota::testing::encode(e, &vec![0u8; 8 << 20]);
        let mut b = two_partitions().build();
        let op = &mut b.manifest.partitions[1].operations[1];
        op.r#type = t as i32;
        op.data_offset = Some(b.data.len() as u64);
        op.data_length = Some(bomb.len() as u64);
        op.data_sha256_hash = Some(sha256(&bomb));
        b.data.extend_from_slice(&bomb);
        let (_, line) = fails(&b);
        assert_eq!(
            line,
            "partition vendor, op 1: data decompresses to more than the 12288 bytes of its destination extents",
            "{t:?}"
        );
    }
    // A raw blob longer than its destination: refused by the plan.
    let mut b = two_partitions().build();
    let op = &mut b.manifest.partitions[0].operations[0];
    assert_eq!(op.r#type, OpType::Replace as i32);
    op.data_length = Some(op.data_length.unwrap() + 1);
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition system, op 0: data is more than the 8192 bytes of its destination extents"
    );
}

#[test]
fn untrusted_partition_names_are_refused() {
    for (name, why) in [
        ("", "empty name"),
        ("a/b", "name contains '/'"),
        ("..", "name contains '..'"),
        ("x..y", "name contains '..'"),
        ("x\0y", "name contains NUL"),
        (".hidden", "name starts with '.'"),
        ("a\nb", "name contains a control character"),
    ] {
        let mut b = two_partitions().build();
        b.manifest.partitions[1].partition_name = name.into();
        let (e, line) = fails(&b);
        assert!(
            matches!(&e, OtaError::BadPartitionName { index: 1, problem, .. } if *problem == why),
            "{name:?}: {line}"
        );
        assert!(!line.contains('\n') && !line.contains('\0'), "{line:?}");
    }
    let long = "p".repeat(201);
    assert!(snapblk_ota::check_partition_name(&long).is_err());
    assert!(snapblk_ota::check_partition_name("system_ext").is_ok());
    // Two partitions with one name would write one file twice.
    let mut b = two_partitions().build();
    b.manifest.partitions[1].partition_name = "system".into();
    let (_, line) = fails(&b);
    assert_eq!(
        line,
        "partition \"system\" appears twice in the manifest (indexes 0 and 1)"
    );
}

#[test]
fn unknown_and_incremental_op_types_are_refused_before_writing() {
    let mut b = two_partitions().build();
    b.manifest.partitions[0].operations[3].r#type = 99;
    let (_, line) = fails(&b);
    assert_eq!(line, "partition system, op 3: unknown operation type 99");
    let mut b = two_partitions().build();
    b.manifest.partitions[1].operations[2].r#type = OpType::Puffdiff as i32;
    let (e, line) = fails(&b);
    assert!(
        line.starts_with("partition vendor, op 2: PUFFDIFF is not supported by extract"),
        "{line}"
    );
    assert!(matches!(
        e,
        OtaError::Op {
            source: OpError::Unsupported {
                op_type: OpType::Puffdiff,
                ..
            },
            ..
        }
    ));
    // info says which types stop which partition.
    let s = Payload::from_bytes(b.to_bytes()).unwrap().summary();
    assert!(s.partitions[0].extractable);
    assert!(!s.partitions[1].extractable);
    assert_eq!(s.partitions[1].blocked_by, ["PUFFDIFF"]);
}

#[test]
fn partitions_without_info_or_too_large_are_refused() {
    let mut b = two_partitions().build();
    b.manifest.partitions[0].new_partition_info = None;
    let (_, line) = fails(&b);
    assert_eq!(line, "partition system: new_partition_info has no size");
    let mut b = two_partitions().build();
    b.manifest.partitions[0]
        .new_partition_info
        .as_mut()
        .unwrap()
        .size = Some(u64::MAX);
    let (e, _) = fails(&b);
    assert!(matches!(e, OtaError::PartitionTooLarge { .. }), "{e:?}");
}
