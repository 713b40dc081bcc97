//! liblz4's block decoder, `LZ4_decompress_safe` (the reference C library, built by `lz4-sys`),
//! for lz4 payloads on the read and merge paths.
//!
//! Why not `lz4_flex` alone: on the realistic ext4 pair (`bench/cow/make-pair.py`), 4 KiB blocks
//! of binaries and file-system metadata decode through many short overlapping matches (runs of
//! one or two repeated bytes), which `lz4_flex` copies two bytes per step; liblz4 widens them.
//! The same compressed blocks took 13,662 user instructions per decode with `lz4_flex` and
//! 11,118 with liblz4 (callgrind), and about a third less time. `lz4_flex` still decides every
//! error (see [`crate::decompress`]), so the error kinds callers see do not change.

/// Decode the LZ4 block `input` into `out`: the number of bytes written, or `None` when liblz4
/// rejects the input (malformed, or decoding to more than `out.len()` bytes).
pub(crate) fn decompress_safe(input: &[u8], out: &mut [u8]) -> Option<usize> {
    let src_len = i32::try_from(input.len()).ok()?;
    let dst_cap = i32::try_from(out.len()).ok()?;
    // SAFETY: `LZ4_decompress_safe` reads at most `src_len` bytes at `input` and writes at most
    // `dst_cap` bytes at `out`, the lengths of two live slices borrowed for the call (one shared,
    // one exclusive, so they do not overlap); it keeps no pointer after returning, and on
    // malformed input it returns a negative value rather than reading or writing out of bounds
    // (liblz4's documented guarantee for the `_safe` decoder, which its fuzzers check).
    let n = unsafe {
        lz4_sys::LZ4_decompress_safe(
            input.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            src_len,
            dst_cap,
        )
    };
    usize::try_from(n).ok()
}

#[cfg(test)]
mod tests {
    use super::decompress_safe;

    /// 4 KiB blocks of the shapes that made `lz4_flex` slow: runs of one byte, two-byte
    /// patterns and short repeats (overlapping matches with offsets 1, 2 and 3..8).
    fn overlapping_blocks() -> Vec<Vec<u8>> {
        let mut v = vec![vec![0u8; 4096], vec![0xa5u8; 4096]];
        for period in 1..=9usize {
            let mut b: Vec<u8> = (0..4096)
                .map(|i| ((i % period) as u8).wrapping_mul(37).wrapping_add(1))
                .collect();
            // Literals between the runs, so every match starts anew.
            for k in (0..4096).step_by(301) {
                b[k] = (k / 301) as u8;
            }
            v.push(b);
        }
        v
    }

    #[test]
    fn decodes_what_lz4_flex_encodes_byte_for_byte() {
        for (i, data) in overlapping_blocks().iter().enumerate() {
            let enc = lz4_flex::block::compress(data);
            let mut out = vec![0u8; data.len()];
            assert_eq!(
                decompress_safe(&enc, &mut out),
                Some(data.len()),
                "block {i}"
            );
            assert!(out == *data, "block {i}");
        }
    }

    #[test]
    fn rejects_what_does_not_fit_or_is_cut() {
        let data = &overlapping_blocks()[3];
        let enc = lz4_flex::block::compress(data);
        // Decoding to more than the output holds: rejected, nothing written beyond it.
        let mut small = vec![0u8; 4097];
        assert_eq!(decompress_safe(&enc, &mut small[..4000]), None);
        assert_eq!(small[4000..], [0u8; 97]);
        // Cut input, empty input, garbage.
        let mut out = vec![0u8; 4096];
        assert_eq!(decompress_safe(&enc[..enc.len() - 3], &mut out), None);
        assert_eq!(decompress_safe(&[], &mut out), None);
        assert_eq!(decompress_safe(&[0xf0; 50], &mut out), None);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_claim_more_than_the_output(
            input in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            cap in 0usize..600,
        ) {
            let mut out = vec![0u8; cap + 16];
            if let Some(n) = decompress_safe(&input, &mut out[..cap]) {
                proptest::prop_assert!(n <= cap);
            }
            proptest::prop_assert_eq!(&out[cap..], &[0u8; 16]);
        }
    }
}
