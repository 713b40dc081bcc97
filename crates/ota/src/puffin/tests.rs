//! Unit tests of puffing and huffing blocks, the puff-stream layout and bad patches. Deflate
//! streams are Python zlib's output (hex below) or written bit by bit.

use super::bits::BitWriter;
use super::error::{DeflateError, PuffError, PuffSide};
use super::huff::{Huffer, inflate};
use super::huffman::{Encoder, HuffmanAlphabet, fixed_litlen_lens};
use super::puff::{Lossy, Puffer};
use super::stream::{gap_len, huff_stream, layout, puff_stream};
use super::testing::{Layout, locate_raw, make_puffdiff, puf1};
use super::{MAX_PUFF_RATIO, apply_puffdiff};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `zlib.compressobj(9, DEFLATED, -15).compress(TEXT)`: one dynamic block with matches.
const DYNAMIC: &str = "5d900b0e84200c44afd2aba112691694a824664fbf0c63916c62b5f6f33a6d74695a9cf87c6adc37d98ae4a032f9cbc9ea527272ea5adf8b8f35928a5cae307b845df01d4a6fc543ff0aff88fbc182401c6b300fd6c970609bfd873e872413fb713937ae0546ad20b080d1b98ef882f1a66198ecb91a13acae405bc464956748d3ac8dd7178bbce29e743e6a097acc4f26836b3409a08f077ab5e2aa79e0f9f5a5b2c264b0939ad175eb0f";
const TEXT: &str = "lambda epsilon nu phi beta gamma sigma delta mu tau beta rho eta beta gamma xi xi gamma theta gamma sigma xi beta tau delta theta phi phi tau beta tau tau nu beta theta beta sigma epsilon kappa xi epsilon sigma delta tau kappa sigma chi zeta delta tau tau phi eta mu delta sigma psi gamma tau beta upsilon eta pi chi sigma xi lambda omicron tau omicron mu kappa theta zeta psi theta gamma tau kappa rho pi lambda omega omicron kappa upsilon gamma delta rho xi";
/// `Z_HUFFMAN_ONLY` at level 9 of 16 a, 20 b, 26 c, 28 d, 13 e: dynamic, literals only.
const HUFFMAN_ONLY: &str = "05c1010100000883b0ac07ec5fc16ddbb66ddbb60d0000000040555555555555abaaaaaaaaaaaaeeeeeeeeeeeeee01";
/// `Z_FIXED` of "abcabcabcabc": a literal run and a match.
const FIXED: &str = "4b4c4a4e842100";
/// `Z_FIXED` of "hello hello", `Z_FULL_FLUSH` (an empty stored block), "world".
const FLUSHED: &str = "ca48cdc9c957c8009100000000ffff2bcf2fca490100";

fn puff_all(data: &[u8], start: u64, end: u64) -> Result<(Vec<u8>, Lossy), DeflateError> {
    let mut out = Vec::new();
    let l = Puffer::new()?.puff(data, start, end, &mut out, u64::MAX)?;
    Ok((out, l))
}

fn huff_all(puff: &[u8], start_bits: u32) -> Result<(Vec<u8>, u64), DeflateError> {
    let mut w = BitWriter::new(1 << 24);
    w.write(start_bits, 0)?;
    Huffer::new()?.huff(puff, &mut w)?;
    let bits = w.bits();
    Ok((w.finish(), bits))
}

/// Puff the whole raw stream, huff it back, check the bytes and the decompressed data.
fn round_trip(data: &[u8], text: &[u8]) -> Vec<u8> {
    let (end_blocks, end) = locate_raw(data, 0).unwrap();
    assert!(!end_blocks.is_empty());
    let (puff, lossy) = puff_all(data, 0, end).unwrap();
    assert_eq!(lossy, Lossy::default());
    assert_eq!(inflate(&puff, 1 << 20).unwrap().0, text);
    let (back, bits) = huff_all(&puff, 0).unwrap();
    assert_eq!(bits, end);
    assert_eq!(back, data);
    puff
}

#[test]
fn fixed_block_puffs_to_literals_and_a_match() {
    let data = hex(FIXED);
    let puff = round_trip(&data, b"abcabcabcabc");
    assert_eq!(
        puff,
        [
            &[0, 0, 0xa0][..],            // metadata: 1 byte, final fixed block
            &[3, b'a', b'b', b'c', b'a'], // four literals
            &[0x80 | (8 - 3), 0, 2],      // length 8, distance 3
            &[0xff, 0x81],                // end of block
        ]
        .concat()
    );
}

#[test]
fn dynamic_block_keeps_its_header_as_sent() {
    let data = hex(DYNAMIC);
    let puff = round_trip(&data, TEXT.as_bytes());
    // Metadata: length, header byte (final, dynamic), HLIT, HDIST, HCLEN from the bits.
    let len = usize::from(u16::from_be_bytes([puff[0], puff[1]])) + 1;
    assert!(len > 4 && len <= 339);
    assert_eq!(puff[2], 0xc0);
    let bits = u32::from_le_bytes([data[0], data[1], data[2], 0]);
    assert_eq!(u32::from(puff[3]), (bits >> 3) & 0x1f, "HLIT");
    assert_eq!(u32::from(puff[4]), (bits >> 8) & 0x1f, "HDIST");
    assert_eq!(u32::from(puff[5]), (bits >> 13) & 0x0f, "HCLEN");
    let huff = hex(HUFFMAN_ONLY);
    round_trip(
        &huff,
        &[
            &[b'a'; 16][..],
            &[b'b'; 20],
            &[b'c'; 26],
            &[b'd'; 28],
            &[b'e'; 13],
        ]
        .concat(),
    );
}

#[test]
fn flushed_stream_has_a_stored_block_between_compressed_ones() {
    let data = hex(FLUSHED);
    let (blocks, end) = locate_raw(&data, 0).unwrap();
    // The empty stored block of the flush is not listed; the two fixed blocks are.
    assert_eq!(blocks.len(), 2);
    assert_eq!(end.div_ceil(8), data.len() as u64);
    let stored = blocks[0].0 + blocks[0].1;
    assert_eq!(blocks[1].0 % 8, 0);
    assert!(blocks[1].0 > stored);
    let puff = round_trip(&data, b"hello helloworld");
    // The stored block's puff: header byte 0 (not final, stored, zero padding), no literals.
    let stored_puff = [0u8, 0, 0, 0xff, 0x81];
    assert!(puff.windows(5).any(|w| w == stored_puff));
}

fn stored_block(shift: u32, padding: u32, payload: &[u8], last: bool) -> (Vec<u8>, u64) {
    let mut w = BitWriter::new(1 << 20);
    w.write(shift, 0b101).unwrap();
    w.write(1, u32::from(last)).unwrap();
    w.write(2, 0).unwrap();
    let pad = w.to_boundary();
    w.write(pad, padding).unwrap();
    w.write(16, payload.len() as u32).unwrap();
    w.write(16, !(payload.len() as u32)).unwrap();
    w.write_bytes(payload).unwrap();
    let bits = w.bits();
    (w.finish(), bits)
}

#[test]
fn stored_blocks_keep_their_padding_bits() {
    // At bit 0 the padding is 5 bits; 0b10101 is kept in the header byte.
    let (data, bits) = stored_block(0, 0b10101, b"hello", true);
    let (puff, lossy) = puff_all(&data, 0, bits).unwrap();
    assert_eq!(lossy, Lossy::default());
    assert_eq!(
        puff,
        [&[0, 0, 0x80 | 0b10101][..], &[4], b"hello", &[0xff, 0x81]].concat()
    );
    assert_eq!(huff_all(&puff, 0).unwrap(), (data.clone(), bits));
    // Starting at bit 3, the padding is 2 bits.
    let (data, bits) = stored_block(3, 0b10, b"", false);
    let (puff, _) = puff_all(&data, 3, bits).unwrap();
    assert_eq!(puff, [0, 0, 0b10, 0xff, 0x81]);
    let (back, end) = huff_all(&puff, 3).unwrap();
    assert_eq!((back[1..].to_vec(), end), (data[1..].to_vec(), bits));
    // A long stored block is one long literal run.
    let payload: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    let (data, bits) = stored_block(0, 0, &payload, true);
    let (puff, _) = puff_all(&data, 0, bits).unwrap();
    assert_eq!(&puff[3..6], &[127, 0, (300 - 128) as u8]);
    assert_eq!(huff_all(&puff, 0).unwrap().0, data);
}

#[test]
fn wide_stored_padding_is_ored_into_the_header_as_puffin_does() {
    // Starting at bit 6, the padding is 7 bits: 0b1100000 overflows the header's 5 bits into
    // the type bits. Puffing keeps puffin's byte; huffing cannot give the bits back.
    let (data, bits) = stored_block(6, 0b110_0000, b"x", true);
    let (puff, lossy) = puff_all(&data, 6, bits).unwrap();
    assert!(lossy.wide_padding);
    assert_eq!(&puff[..3], &[0, 0, 0x80 | 0x60]);
    assert!(huff_all(&puff, 6).is_err());
}

#[test]
fn stored_length_must_match_its_complement() {
    let (mut data, bits) = stored_block(0, 0, b"abc", true);
    data[3] ^= 1; // NLEN
    assert!(matches!(
        puff_all(&data, 0, bits),
        Err(DeflateError::StoredLength { len: 3, .. })
    ));
    // A stored block longer than its data is truncated.
    let (data, bits) = stored_block(0, 0, b"abc", true);
    assert!(matches!(
        puff_all(&data[..6], 0, 48),
        Err(DeflateError::Truncated { .. })
    ));
    assert!(puff_all(&data, 0, bits - 8).is_err());
}

#[test]
fn reserved_block_type_and_truncation_are_errors() {
    assert!(matches!(
        puff_all(&[0b111, 0, 0], 0, 24),
        Err(DeflateError::ReservedBlockType { at: 0 })
    ));
    let data = hex(DYNAMIC);
    for cut in [1, 10, 40, data.len() - 1] {
        assert!(
            matches!(
                puff_all(&data[..cut], 0, cut as u64 * 8),
                Err(DeflateError::Truncated { .. }) | Err(DeflateError::BadCode { .. })
            ),
            "cut at {cut}"
        );
    }
}

#[test]
fn blocks_must_end_exactly_at_the_extent_end() {
    let data = hex(FIXED);
    let (_, end) = locate_raw(&data, 0).unwrap();
    // A shorter extent cuts the end-of-block code; a longer one leaves bits after the final
    // block, which then read as another (truncated) block.
    assert!(puff_all(&data, 0, end - 1).is_err());
    assert!(puff_all(&data, 0, end + 3).is_err());
    assert!(matches!(
        puff_all(&data, 4, 4),
        Err(DeflateError::EmptyExtent)
    ));
    assert!(matches!(
        puff_all(&data, 0, 1000),
        Err(DeflateError::EmptyExtent)
    ));
}

/// A dynamic block header from its fields, then an end of block coded by `lens`.
fn dynamic_block(hlit: u32, hdist: u32, cl: &[u8; 19], entries: &[(usize, u32, u32)]) -> Vec<u8> {
    let mut w = BitWriter::new(1 << 16);
    w.write(1, 1).unwrap();
    w.write(2, 2).unwrap();
    w.write(5, hlit).unwrap();
    w.write(5, hdist).unwrap();
    w.write(4, 15).unwrap();
    for &slot in &super::huffman::CL_ORDER {
        w.write(3, u32::from(cl[slot])).unwrap();
    }
    let mut lens = [0u8; 19];
    lens.copy_from_slice(cl);
    let e = Encoder::new(&lens, HuffmanAlphabet::CodeLengths);
    if let Ok(e) = e {
        for &(sym, n, v) in entries {
            e.write(&mut w, sym).unwrap();
            w.write(n, v).unwrap();
        }
    }
    w.write(16, 0).unwrap();
    w.finish()
}

#[test]
fn dynamic_header_errors() {
    // Code-length code: symbols 0, 1, 16, 17, 18 with lengths 2, 2, 3, 3, 2... kept complete:
    // 0:2, 1:2, 18:2, 16:3, 17:3.
    let mut cl = [0u8; 19];
    cl[0] = 2;
    cl[1] = 2;
    cl[18] = 2;
    cl[16] = 3;
    cl[17] = 3;
    let bits = |d: &[u8]| d.len() as u64 * 8;
    // HLIT 30: 287 literal/length codes.
    let d = dynamic_block(30, 0, &cl, &[]);
    assert!(matches!(
        puff_all(&d, 0, bits(&d)),
        Err(DeflateError::TooManyCodes {
            nlit: 287,
            ndist: 1
        })
    ));
    // HDIST 30: 31 distance codes.
    let d = dynamic_block(0, 30, &cl, &[]);
    assert!(matches!(
        puff_all(&d, 0, bits(&d)),
        Err(DeflateError::TooManyCodes { ndist: 31, .. })
    ));
    // A repeat (16) first.
    let d = dynamic_block(0, 0, &cl, &[(16, 2, 0)]);
    assert!(matches!(
        puff_all(&d, 0, bits(&d)),
        Err(DeflateError::RepeatWithoutLength)
    ));
    // 257 + 1 codes, then a run of 138 zeros three times overruns.
    let d = dynamic_block(0, 0, &cl, &[(18, 7, 127), (18, 7, 127), (18, 7, 127)]);
    assert!(matches!(
        puff_all(&d, 0, bits(&d)),
        Err(DeflateError::RepeatOverrun)
    ));
    // An incomplete code-length code.
    let mut holey = cl;
    holey[17] = 0;
    let d = dynamic_block(0, 0, &holey, &[]);
    assert!(matches!(
        puff_all(&d, 0, bits(&d)),
        Err(DeflateError::Incomplete {
            alphabet: HuffmanAlphabet::CodeLengths
        })
    ));
    // Lengths for 256 zeros then EOB 1 and distance 1: literal/length code of one 1-bit code
    // (end of block alone) and one 1-bit distance code, both allowed; the block is empty.
    let d = dynamic_block(
        0,
        0,
        &cl,
        &[(18, 7, 127), (18, 7, 107), (1, 0, 0), (1, 0, 0)],
    );
    // 138 + 118 = 256 zeros, then lengths 1 (symbol 256) and 1 (distance 0); then the end of
    // block code 0 is the first zero bit of the padding. Header 3 + 14 bits, 19 × 3 bits of
    // code-length code, two 18s (2 + 7 bits), two 1s (2 bits), end of block (1 bit).
    let (puff, _) = puff_all(&d, 0, 3 + 14 + 57 + 2 * 9 + 2 * 2 + 1).unwrap();
    // HLIT, HDIST, HCLEN, then the lengths of code-length symbols 16 and 17 in one byte.
    assert_eq!(&puff[3..7], &[0, 0, 15, 0x33]);
    assert_eq!(
        &puff[puff.len() - 6..puff.len() - 2],
        &[28 + 127, 28 + 107, 1, 1]
    );
    assert_eq!(&puff[puff.len() - 2..], &[0xff, 0x81]);
}

#[test]
fn length_258_sent_as_284_is_reported_lossy() {
    // Fixed block: literal 'a', then length symbol 284 with extra 31 (= 258), distance 1,
    // end of block.
    let lit = Encoder::new(&fixed_litlen_lens(), HuffmanAlphabet::LitLen).unwrap();
    let mut w = BitWriter::new(1 << 10);
    w.write(1, 1).unwrap();
    w.write(2, 1).unwrap();
    lit.write(&mut w, usize::from(b'a')).unwrap();
    lit.write(&mut w, 284).unwrap();
    w.write(5, 31).unwrap();
    w.write(5, 0).unwrap(); // distance symbol 0 (fixed codes are 5 bits, 0 is 00000)
    lit.write(&mut w, 256).unwrap();
    let bits = w.bits();
    let data = w.finish();
    let (puff, lossy) = puff_all(&data, 0, bits).unwrap();
    assert!(lossy.long_284);
    assert_eq!(&puff[5..9], &[0xff, (258 - 130) as u8, 0, 0]);
    // Huffing writes symbol 285: five bits shorter.
    let (_, back) = huff_all(&puff, 0).unwrap();
    assert_eq!(back, bits - 5);
}

#[test]
fn huffing_refuses_puffs_puffing_cannot_make() {
    let ok = [0u8, 0, 0xa0, 0, b'a', 0xff, 0x81];
    assert!(huff_all(&ok, 0).is_ok());
    let malformed = |p: &[u8]| {
        matches!(
            huff_all(p, 0),
            Err(DeflateError::PuffMalformed { .. }) | Err(DeflateError::PuffTruncated { .. })
        )
    };
    // Fixed block with metadata past its header byte, or padding bits.
    assert!(malformed(&[0, 1, 0xa0, 0, 0, b'a', 0xff, 0x81]));
    assert!(malformed(&[0, 0, 0xa1, 0, b'a', 0xff, 0x81]));
    // A match in a stored block; a stored block not ended after its bytes.
    assert!(malformed(&[0, 0, 0x80, 0x80, 0, 0, 0xff, 0x81]));
    assert!(malformed(&[0, 0, 0x80, 0, b'a', 0, b'b', 0xff, 0x81]));
    // A stored block's padding (5 bits at bit 3) wider than the padding.
    assert!(huff_all(&[0, 0, 0x80 | 0x1f, 0xff, 0x81], 0).is_ok());
    assert!(matches!(
        huff_all(&[0, 0, 0x80 | 0x1f, 0xff, 0x81], 1),
        Err(DeflateError::PuffMalformed { .. })
    ));
    // Match length over 258, distance over 32768.
    assert!(malformed(&[0, 0, 0xa0, 0xff, 130, 0, 0, 0xff, 0x81]));
    assert!(malformed(&[0, 0, 0xa0, 0x80, 0x80, 0, 0xff, 0x81]));
    // Block type 3; metadata over 339 bytes; truncated elements; no end of block.
    assert!(malformed(&[0, 0, 0xe0, 0xff, 0x81]));
    assert!(malformed(&[0x01, 0x53]));
    assert!(malformed(&[0, 0, 0xa0, 5, b'a']));
    assert!(malformed(&[0, 0, 0xa0, 0, b'a']));
    assert!(malformed(&[0]));
    // A dynamic block's metadata: a nibble over 7, an entry over 155, bytes left over.
    let dynamic = {
        let data = hex(HUFFMAN_ONLY);
        let (_, end) = locate_raw(&data, 0).unwrap();
        puff_all(&data, 0, end).unwrap().0
    };
    assert!(huff_all(&dynamic, 0).is_ok());
    let mut bad = dynamic.clone();
    bad[6] |= 0x80;
    assert!(malformed(&bad));
    let mlen = usize::from(u16::from_be_bytes([dynamic[0], dynamic[1]])) + 1;
    let mut bad = dynamic.clone();
    bad[2 + mlen - 1] = 156;
    assert!(malformed(&bad));
    let mut bad = dynamic[..2 + mlen].to_vec();
    bad[..2].copy_from_slice(&(mlen as u16).to_be_bytes());
    bad.push(0);
    bad.extend_from_slice(&dynamic[2 + mlen..]);
    assert!(malformed(&bad));
    // A literal with no code in the block's table.
    let mut bad = dynamic.clone();
    let lit = bad.iter().rposition(|&b| b == b'e').unwrap();
    bad[lit] = b'z';
    assert!(matches!(
        huff_all(&bad, 0),
        Err(DeflateError::NoCode {
            alphabet: HuffmanAlphabet::LitLen,
            symbol: 122
        })
    ));
}

#[test]
fn gaps_follow_puffins_layout() {
    // Adjacent inside a byte: no gap byte. Aligned: none. Else the bytes touched.
    assert_eq!(gap_len(10, 10), 0);
    assert_eq!(gap_len(16, 16), 0);
    assert_eq!(gap_len(10, 13), 1);
    assert_eq!(gap_len(10, 16), 1);
    assert_eq!(gap_len(10, 17), 2);
    assert_eq!(gap_len(16, 24), 1);
    assert_eq!(gap_len(0, 3), 1);
    // Layout: deflates at bits 0+10 and 10+20 in 5 bytes, puffs of 7 and 9 bytes: no leading
    // gap, no gap between, a trailing gap of bits 30..40 (2 bytes).
    let (puffs, total) = layout(PuffSide::Source, &[(0, 10), (10, 20)], [7, 9], 5).unwrap();
    assert_eq!(puffs, vec![(0, 7), (7, 9)]);
    assert_eq!(total, 18);
    // Deflates at bits 12+10 and 26+8 in 6 bytes: gaps of 2 bytes (bits 0..12), 2 (bits
    // 22..26: bytes 2 and 3 of the buffer) and 2 (bits 34..48).
    let (puffs, total) = layout(PuffSide::Source, &[(12, 10), (26, 8)], [3, 4], 6).unwrap();
    assert_eq!(puffs, vec![(2, 3), (7, 4)]);
    assert_eq!(total, 13);
    for bad in [&[(0u64, 0u64)][..], &[(8, 8), (12, 8)], &[(40, 9)]] {
        assert!(matches!(
            layout(PuffSide::Destination, bad, [1, 1], 6),
            Err(PuffError::DeflateExtent { .. })
        ));
    }
}

/// Fixed blocks `hello` (not final) and `world` (final), `shift` bits apart after `lead` bits.
fn two_blocks(lead: u32, shift: u32) -> (Vec<u8>, Vec<(u64, u64)>) {
    let lit = Encoder::new(&fixed_litlen_lens(), HuffmanAlphabet::LitLen).unwrap();
    let mut w = BitWriter::new(1 << 12);
    w.write(lead, 0x2a5).unwrap();
    let mut ext = Vec::new();
    for (last, word) in [(0, b"hello"), (1, b"world")] {
        let at = w.bits();
        w.write(1, last).unwrap();
        w.write(2, 1).unwrap();
        for &c in word {
            lit.write(&mut w, usize::from(c)).unwrap();
        }
        lit.write(&mut w, 256).unwrap();
        ext.push((at, w.bits() - at));
        w.write(shift, 0x5a5a).unwrap();
    }
    w.write(13, 0x1abc).unwrap();
    (w.finish(), ext)
}

#[test]
fn streams_round_trip_with_deflates_at_any_bit() {
    for lead in [0, 3, 8, 13] {
        for shift in [0, 2, 5, 8, 11] {
            let (data, ext) = two_blocks(lead, shift);
            let l = Layout::of(&data, ext.clone()).unwrap();
            let (puff, _) = puff_stream(
                PuffSide::Source,
                &data,
                &l.deflates,
                &l.puffs,
                l.puff_len,
                vec![],
            )
            .unwrap();
            assert_eq!(puff.len() as u64, l.puff_len);
            // Each puff starts with its metadata.
            for &(o, _) in &l.puffs {
                assert_eq!(&puff[o as usize..o as usize + 2], &[0, 0]);
            }
            let back =
                huff_stream(&puff, &l.deflates, &l.puffs, data.len() as u64, vec![]).unwrap();
            assert_eq!(back, data, "lead {lead} shift {shift}");
        }
    }
}

#[test]
fn gap_bits_outside_the_gap_are_refused() {
    let (data, ext) = two_blocks(3, 2);
    let l = Layout::of(&data, ext).unwrap();
    let mut puff = l.puff(&data).unwrap();
    // The first gap byte holds bits 0..3: setting bit 3 is outside it.
    puff[0] |= 1 << 3;
    assert!(matches!(
        l.huff(&puff, data.len() as u64),
        Err(PuffError::GapBits { at: 0 })
    ));
}

// ---- whole patches ----

fn identity_patch(src: &[u8], dst: &[u8]) -> Vec<u8> {
    let sl = Layout::of(src, locate_raw(src, 0).unwrap().0).unwrap();
    let dl = Layout::of(dst, locate_raw(dst, 0).unwrap().0).unwrap();
    make_puffdiff(src, &sl, dst, &dl, |_, new| new.to_vec()).unwrap()
}

fn apply_identity(src: &[u8], patch: &[u8], dst_len: u64) -> Result<Vec<u8>, PuffError> {
    apply_puffdiff(src, patch, dst_len, |_, inner, n, new| {
        assert_eq!(inner.len() as u64, n);
        assert!(new.is_empty() && new.capacity() as u64 >= n);
        new.extend_from_slice(inner);
        Ok::<_, std::io::Error>(())
    })
}

#[test]
fn identity_inner_patch_gives_the_destination() {
    let src = hex(FIXED);
    let dst = hex(DYNAMIC);
    let p = identity_patch(&src, &dst);
    assert_eq!(apply_identity(&src, &p, dst.len() as u64).unwrap(), dst);
    // The inner patch sees the source's puff stream.
    let mut seen = Vec::new();
    let out = apply_puffdiff(&src, &p, dst.len() as u64, |old, inner, _, new| {
        seen = old.to_vec();
        new.extend_from_slice(inner);
        Ok::<_, std::io::Error>(())
    })
    .unwrap();
    assert_eq!(out, dst);
    let sl = Layout::of(&src, locate_raw(&src, 0).unwrap().0).unwrap();
    assert_eq!(seen, sl.puff(&src).unwrap());
}

/// The header of `p` as (src, dst) layouts and the inner patch.
fn split(p: &[u8]) -> (Layout, Layout, Vec<u8>) {
    let h = super::header::parse(p).unwrap();
    let l = |s: super::header::Stream| Layout {
        deflates: s.deflates,
        puffs: s.puffs,
        puff_len: s.puff_len,
    };
    (l(h.src), l(h.dst), h.inner.to_vec())
}

#[test]
fn bad_patches_are_refused() {
    let src = hex(FIXED);
    let dst = hex(DYNAMIC);
    let dst_len = dst.len() as u64;
    let good = identity_patch(&src, &dst);
    let (sl, dl, inner) = split(&good);
    let apply = |p: &[u8]| apply_identity(&src, p, dst_len);

    assert!(matches!(
        apply(&good[..7]),
        Err(PuffError::ShortPatch { len: 7 })
    ));
    let mut p = good.clone();
    p[3] = b'0';
    assert!(matches!(apply(&p), Err(PuffError::BadMagic { found }) if &found == b"PUF0"));
    let mut p = good.clone();
    p[4] = 0x10;
    assert!(matches!(apply(&p), Err(PuffError::HeaderPastEnd { .. })));
    let mut p = good.clone();
    p[8] = 0xff;
    assert!(matches!(apply(&p), Err(PuffError::Header(_))));

    let with = |s: &Layout, d: &Layout| apply(&puf1(s, d, &inner));
    // Extents past the source, overlapping, or empty.
    let mut s = sl.clone();
    s.deflates[0].1 += 1000;
    assert!(matches!(
        with(&s, &dl),
        Err(PuffError::DeflateExtent {
            side: PuffSide::Source,
            index: 0,
            ..
        })
    ));
    let mut d = dl.clone();
    d.deflates.push(d.deflates[0]);
    d.puffs.push(d.puffs[0]);
    assert!(matches!(
        with(&sl, &d),
        Err(PuffError::DeflateExtent {
            side: PuffSide::Destination,
            index: 1,
            ..
        })
    ));
    // Counts that differ.
    let mut s = sl.clone();
    s.puffs.clear();
    assert!(matches!(
        with(&s, &dl),
        Err(PuffError::ExtentCount {
            deflates: 1,
            puffs: 0,
            ..
        })
    ));
    // A puff extent moved, a puff stream length off by one, a puff size wrong.
    let mut s = sl.clone();
    s.puffs[0].0 += 1;
    assert!(matches!(
        with(&s, &dl),
        Err(PuffError::PuffLocation {
            expected: 0,
            found: 1,
            ..
        })
    ));
    let mut d = dl.clone();
    d.puff_len += 1;
    assert!(matches!(
        with(&sl, &d),
        Err(PuffError::PuffLength {
            side: PuffSide::Destination,
            ..
        })
    ));
    let mut s = sl.clone();
    s.puffs[0].1 -= 1;
    s.puff_len -= 1;
    assert!(matches!(
        with(&s, &dl),
        Err(PuffError::Deflate {
            side: PuffSide::Source,
            index: 0,
            source: DeflateError::PuffTooLong,
            ..
        })
    ));
    let mut s = sl.clone();
    s.puffs[0].1 += 1;
    s.puff_len += 1;
    assert!(matches!(
        with(&s, &dl),
        Err(PuffError::PuffSize {
            side: PuffSide::Source,
            index: 0,
            ..
        })
    ));
    // A destination puff size that is wrong huffs to the wrong bits.
    let mut d = dl.clone();
    d.deflates[0].1 -= 1;
    assert!(matches!(
        with(&sl, &d),
        Err(PuffError::HuffLength { .. }) | Err(PuffError::PuffLength { .. })
    ));
    // A puff stream over the size limit.
    let mut d = dl.clone();
    d.puffs[0].1 = dst_len * MAX_PUFF_RATIO + 65;
    d.puff_len = d.puffs[0].1 + 1;
    assert!(matches!(with(&sl, &d), Err(PuffError::PuffTooLarge { .. })));
    // Puff extents in bits that are not whole bytes.
    let mut h = <super::header::PatchHeader as prost::Message>::decode(
        &good[8..8 + u32::from_be_bytes(good[4..8].try_into().unwrap()) as usize],
    )
    .unwrap();
    h.dst.as_mut().unwrap().puffs[0].length += 4;
    let mut p = b"PUF1".to_vec();
    let enc = prost::Message::encode_to_vec(&h);
    p.extend_from_slice(&(enc.len() as u32).to_be_bytes());
    p.extend_from_slice(&enc);
    p.extend_from_slice(&inner);
    assert!(matches!(apply(&p), Err(PuffError::PuffNotBytes { .. })));
    // Inner types other than BSDIFF.
    for (t, name) in [(1, "ZUCCHINI"), (7, "7")] {
        h.r#type = t;
        let enc = prost::Message::encode_to_vec(&h);
        let mut p = b"PUF1".to_vec();
        p.extend_from_slice(&(enc.len() as u32).to_be_bytes());
        p.extend_from_slice(&enc);
        match apply(&p) {
            Err(PuffError::UnsupportedType { name: n }) => assert_eq!(n, name),
            other => panic!("{other:?}"),
        }
    }
    // The wrong destination length.
    assert!(matches!(
        apply_identity(&src, &good, dst_len + 1),
        Err(PuffError::PuffLength { .. })
    ));
    // A destination of 2^60 bytes without deflates: a consistent header, but no memory for
    // its puff stream, which is an error, not an abort.
    let huge = Layout {
        deflates: vec![],
        puffs: vec![],
        puff_len: 1 << 60,
    };
    assert!(matches!(
        apply_identity(&src, &puf1(&sl, &huge, &inner), 1 << 60),
        Err(PuffError::NoMemory { bytes }) if bytes == 1 << 60
    ));
}

#[test]
fn inner_patch_failures_are_reported() {
    let src = hex(FIXED);
    let dst = hex(DYNAMIC);
    let p = identity_patch(&src, &dst);
    let e = apply_puffdiff(&src, &p, dst.len() as u64, |_, _, _, _| {
        Err(std::io::Error::other("bad bsdiff"))
    })
    .unwrap_err();
    assert!(matches!(e, PuffError::Bspatch(_)));
    let e = apply_puffdiff(&src, &p, dst.len() as u64, |_, inner, _, new| {
        new.extend_from_slice(&inner[1..]);
        Ok::<_, std::io::Error>(())
    })
    .unwrap_err();
    assert!(matches!(e, PuffError::PatchedSize { .. }));
    // A corrupted patched puff fails to huff, naming the deflate.
    let e = apply_puffdiff(&src, &p, dst.len() as u64, |_, inner, _, new| {
        new.extend_from_slice(inner);
        new[2] = 0xe0;
        Ok::<_, std::io::Error>(())
    })
    .unwrap_err();
    assert!(matches!(e, PuffError::Huff { index: 0, .. }), "{e:?}");
}

#[test]
fn no_deflates_is_a_plain_copy_through_the_inner_patch() {
    let src = b"plain bytes".to_vec();
    let dst = b"other plain bytes".to_vec();
    let sl = Layout::of(&src, vec![]).unwrap();
    let dl = Layout::of(&dst, vec![]).unwrap();
    assert_eq!(sl.puff_len, src.len() as u64);
    let p = make_puffdiff(&src, &sl, &dst, &dl, |_, n| n.to_vec()).unwrap();
    assert_eq!(apply_identity(&src, &p, dst.len() as u64).unwrap(), dst);
}
