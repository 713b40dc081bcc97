//! Unit tests of the generator's pieces: XOR blocks from a bsdiff control stream, merge
//! ordering and cycle breaking, COW_COPY splitting, settings checks, error chains.

use super::diff::{XorBlock, make_patch, xor_blocks};
use super::merge::{MergeOp, copies, order};
use super::*;

fn copy(src: u64, dst: u64, n: u64) -> MergeOp {
    MergeOp {
        xor: false,
        src: (src, n),
        dst: (dst, n),
        offset: 0,
    }
}

#[test]
fn xor_blocks_follow_the_shifted_source() {
    // New = old with 100 bytes inserted at the front: each new block b (from 1 on) is old
    // bytes starting at b*4096 - 100, i.e. old block b-1 at offset 3996.
    let old: Vec<u8> = (0..16 * 4096u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let mut new = vec![0xee; 100];
    new.extend_from_slice(&old[..16 * 4096 - 100]);
    let p = make_patch(&old, &new).unwrap();
    let x = xor_blocks(&p, 4096, 16, 16);
    assert!(x.len() >= 14, "{x:?}");
    for b in &x {
        assert_eq!((b.src, b.offset), (b.dst - 1, 3996), "{b:?}");
        // The XOR of new and the source bytes it names is all zero here.
        let from = (b.src * 4096 + u64::from(b.offset)) as usize;
        let d = b.dst as usize * 4096;
        assert_eq!(new[d..d + 4096], old[from..from + 4096]);
    }
}

#[test]
fn xor_blocks_stay_inside_both_files() {
    let old = vec![1u8; 3 * 4096];
    let mut new = vec![1u8; 5 * 4096];
    new[4096 * 4 + 7] = 9;
    let p = make_patch(&old, &new).unwrap();
    for b in xor_blocks(&p, 4096, 3, 5) {
        let XorBlock { dst, src, offset } = b;
        assert!(
            dst < 5 && (src * 4096 + u64::from(offset) + 4096) <= 3 * 4096,
            "{b:?}"
        );
    }
}

#[test]
fn overlapping_copies_are_split_and_cycles_broken() {
    let mut v = Vec::new();
    copies(10, 13, 8, &mut v); // shifted by 3: pieces of 3, 3, 2
    assert_eq!(v, [copy(10, 13, 3), copy(13, 16, 3), copy(16, 19, 2)]);
    // Each piece reads what the next one writes: the later pieces merge first.
    let o = order(v);
    assert!(o.dropped.is_empty());
    assert_eq!(o.ops, [copy(16, 19, 2), copy(13, 16, 3), copy(10, 13, 3)]);
    // A swap is a cycle: one of the two is dropped; identity copies take no part.
    let o = order(vec![copy(0, 1, 1), copy(1, 0, 1), copy(5, 5, 2)]);
    assert_eq!(o.dropped.len(), 1);
    assert_eq!(o.ops.len(), 2);
    // An XOR is preferred for dropping on a tie.
    let x = MergeOp {
        xor: true,
        src: (2, 2),
        dst: (3, 1),
        offset: 8,
    };
    let o = order(vec![copy(3, 2, 1), x]);
    assert_eq!(o.dropped, [x]);
}

#[test]
fn settings_are_checked_before_any_work() {
    let img = vec![0u8; 8192];
    let one = |old: Option<&'static [u8]>| PartitionImages {
        name: "system",
        old,
        new: &[1; 4096],
    };
    let e = |parts: &[PartitionImages<'_>], o: &GenerateOptions| {
        generate(parts, o).unwrap_err().to_string()
    };
    let d = GenerateOptions::default();
    assert_eq!(e(&[], &d), "no partition to write");
    assert!(e(&[one(None), one(None)], &d).contains("given twice"));
    let bad = PartitionImages {
        name: "../x",
        old: None,
        new: &img,
    };
    assert!(e(&[bad], &d).starts_with("partition name \"../x\""));
    let odd = PartitionImages {
        name: "boot",
        old: Some(&img[..100]),
        new: &img,
    };
    assert!(e(&[odd], &d).contains("old image of 100 bytes"));
    let m = |v| GenerateOptions {
        minor_version: Some(v),
        ..GenerateOptions::default()
    };
    assert!(e(&[one(None)], &m(8)).contains("minor version 0"));
    assert!(e(&[one(Some(&[0; 4096]))], &m(3)).contains("minor versions 4 to 9"));
    let v = |f: fn(&mut VabcOptions)| {
        let mut o = VabcOptions::default();
        f(&mut o);
        GenerateOptions {
            vabc: Some(o),
            ..GenerateOptions::default()
        }
    };
    assert!(e(&[one(None)], &v(|o| o.compression = "lzma".into())).contains("lzma"));
    assert!(e(&[one(None)], &v(|o| o.compression = "zstd,x".into())).contains("zstd,x"));
    assert!(e(&[one(None)], &v(|o| o.cow_version = 4)).contains("COW version 4"));
    assert!(e(&[one(None)], &v(|o| o.compression_factor = 5000)).contains("5000"));
    let g = generate(&[one(None)], &v(|o| o.compression = "zstd,3".into())).unwrap();
    assert!(g.manifest.partitions[0].estimate_cow_size.is_some());
}

#[test]
fn wrapped_causes_are_sources_not_text() {
    use snapblk_testsupport::errors::assert_cause_is_source;
    assert_cause_is_source(
        &GenerateError::Encode {
            partition: "system".into(),
            start: 1,
            count: 2,
            source: std::io::Error::other("disk on fire"),
        },
        Some("disk on fire"),
    );
    let cow = crate::VabcError::Cow(snapblk_cow::CowError::InvalidArgument("bad".into()));
    assert_cause_is_source(
        &GenerateError::Estimate {
            partition: "system".into(),
            source: cow,
        },
        None,
    );
    let rsa = rsa::Error::Verification;
    assert_cause_is_source(&SignError::Rsa(rsa), None);
    assert_cause_is_source(&SignError::Ecdsa(p256::ecdsa::Error::new()), None);
}
