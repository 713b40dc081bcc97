//! Canonical Huffman codes of deflate (RFC 1951 §3.2.2): the constants of the length and
//! distance alphabets, code construction from code lengths with zlib's validity rules, a
//! table decoder and an encoder.

use super::bits::{BitReader, BitWriter};
use super::error::DeflateError;

/// Longest code length deflate allows.
pub(crate) const MAX_BITS: u32 = 15;

/// Order in which a dynamic block stores the code lengths of the code-length alphabet.
pub(crate) const CL_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Base match length of length symbols 257..=285.
pub(crate) const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
/// Extra bits of length symbols 257..=285.
pub(crate) const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Base distance of distance symbols 0..=29.
pub(crate) const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
/// Extra bits of distance symbols 0..=29.
pub(crate) const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

/// The end-of-block symbol of the literal/length alphabet.
pub(crate) const END_OF_BLOCK: usize = 256;

/// Which alphabet a code is for: it decides which incomplete codes are allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HuffmanAlphabet {
    /// The code-length alphabet of a dynamic block header (19 symbols).
    CodeLengths,
    /// Literals, end of block and lengths (up to 288 symbols).
    LitLen,
    /// Distances (up to 32 symbols).
    Distance,
}

impl std::fmt::Display for HuffmanAlphabet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HuffmanAlphabet::CodeLengths => "code-length",
            HuffmanAlphabet::LitLen => "literal/length",
            HuffmanAlphabet::Distance => "distance",
        })
    }
}

/// The canonical codes of a set of code lengths, bit-reversed (deflate sends Huffman codes
/// most significant bit first into an LSB-first stream), after zlib's checks: no length
/// over 15, not over-subscribed, and complete — except, as zlib's inflate allows, a
/// literal/length or distance code of one symbol with a one-bit code, and a distance code
/// with no symbols at all (a block of literals only). A literal/length code must have the
/// end-of-block symbol.
fn canonical(lens: &[u8], alphabet: HuffmanAlphabet) -> Result<(Vec<u16>, u32), DeflateError> {
    let mut count = [0u32; MAX_BITS as usize + 1];
    for &l in lens {
        if u32::from(l) > MAX_BITS {
            return Err(DeflateError::CodeLength { alphabet, len: l });
        }
        count[usize::from(l)] += 1;
    }
    count[0] = 0;
    let used: u32 = count.iter().sum();
    let max = (1..=MAX_BITS)
        .rev()
        .find(|&l| count[l as usize] != 0)
        .unwrap_or(0);
    let mut left: i64 = 1;
    for &c in &count[1..] {
        left = 2 * left - i64::from(c);
        if left < 0 {
            return Err(DeflateError::OverSubscribed { alphabet });
        }
    }
    if left > 0 {
        let single = used == 1 && max == 1 && alphabet != HuffmanAlphabet::CodeLengths;
        let empty = used == 0 && alphabet == HuffmanAlphabet::Distance;
        if !(single || empty) {
            return Err(DeflateError::Incomplete { alphabet });
        }
    }
    if alphabet == HuffmanAlphabet::LitLen && lens.get(END_OF_BLOCK).is_none_or(|&l| l == 0) {
        return Err(DeflateError::NoEndOfBlock);
    }
    let mut next = [0u32; MAX_BITS as usize + 2];
    let mut code = 0u32;
    for l in 1..=MAX_BITS as usize {
        code = (code + count[l - 1]) << 1;
        next[l] = code;
    }
    let mut codes = vec![0u16; lens.len()];
    for (sym, &l) in lens.iter().enumerate() {
        if l != 0 {
            let c = next[usize::from(l)];
            next[usize::from(l)] += 1;
            codes[sym] = (c.reverse_bits() >> (32 - u32::from(l))) as u16;
        }
    }
    Ok((codes, max))
}

/// A table decoder: one entry per `max_bits`-bit pattern holds the symbol whose code is a
/// prefix of it and that code's length (zero: no code starts so).
#[derive(Clone, Debug)]
pub(crate) struct Decoder {
    /// `len << 9 | symbol`.
    table: Vec<u16>,
    max_bits: u32,
    alphabet: HuffmanAlphabet,
}

impl Decoder {
    /// Build from code lengths, `lens[symbol]` (0: the symbol has no code).
    pub(crate) fn new(lens: &[u8], alphabet: HuffmanAlphabet) -> Result<Self, DeflateError> {
        let mut d = Decoder {
            table: Vec::new(),
            max_bits: 0,
            alphabet,
        };
        d.rebuild(lens)?;
        Ok(d)
    }

    /// Rebuild in place (reusing the table's memory) from new code lengths.
    pub(crate) fn rebuild(&mut self, lens: &[u8]) -> Result<(), DeflateError> {
        let (codes, max) = canonical(lens, self.alphabet)?;
        self.max_bits = max;
        self.table.clear();
        self.table.resize(1 << max, 0);
        for (sym, (&code, &l)) in codes.iter().zip(lens).enumerate() {
            if l == 0 {
                continue;
            }
            let entry = (u16::from(l) << 9) | sym as u16;
            let mut i = usize::from(code);
            while i < self.table.len() {
                self.table[i] = entry;
                i += 1 << l;
            }
        }
        Ok(())
    }

    /// Decode one symbol.
    #[inline]
    pub(crate) fn decode(&self, r: &mut BitReader<'_>) -> Result<usize, DeflateError> {
        let bits = r.peek(self.max_bits) as usize;
        // `table` has 2^max_bits entries and `bits` fewer bits: the mask only spares the
        // bounds check.
        let e = self.table[bits & (self.table.len() - 1)];
        let len = u32::from(e >> 9);
        if len == 0 {
            if r.remaining() < u64::from(self.max_bits) {
                return Err(DeflateError::Truncated {
                    at: r.pos() + r.remaining(),
                });
            }
            return Err(DeflateError::BadCode {
                alphabet: self.alphabet,
                at: r.pos(),
            });
        }
        r.skip(len)?;
        Ok(usize::from(e & 0x1ff))
    }
}

/// An encoder: each symbol's bit-reversed code and its length, as `len << 16 | code`.
#[derive(Clone, Debug)]
pub(crate) struct Encoder {
    codes: Vec<u32>,
    alphabet: HuffmanAlphabet,
}

impl Encoder {
    /// Build from code lengths, `lens[symbol]` (0: the symbol has no code).
    pub(crate) fn new(lens: &[u8], alphabet: HuffmanAlphabet) -> Result<Self, DeflateError> {
        let (codes, _) = canonical(lens, alphabet)?;
        let codes = codes
            .iter()
            .zip(lens)
            .map(|(&c, &l)| u32::from(l) << 16 | u32::from(c))
            .collect();
        Ok(Encoder { codes, alphabet })
    }

    /// Write `symbol`'s code.
    #[inline]
    pub(crate) fn write(&self, w: &mut BitWriter, symbol: usize) -> Result<(), DeflateError> {
        match self.codes.get(symbol) {
            Some(&e) if e >> 16 != 0 => w.write(e >> 16, e & 0xffff),
            _ => Err(DeflateError::NoCode {
                alphabet: self.alphabet,
                symbol,
            }),
        }
    }
}

/// The fixed literal/length code lengths (RFC 1951 §3.2.6), all 288 symbols.
pub(crate) fn fixed_litlen_lens() -> [u8; 288] {
    let mut l = [8u8; 288];
    l[144..256].fill(9);
    l[256..280].fill(7);
    l
}

/// The fixed distance code lengths: 32 five-bit codes (30 and 31 never occur in valid data).
pub(crate) const FIXED_DIST_LENS: [u8; 32] = [5; 32];

/// The length symbol (257..=285) for a match length of 3..=258, as zlib and puffin choose
/// it: 258 is always symbol 285, never 284 with 31 extra.
pub(crate) fn length_symbol(len: u16) -> usize {
    let i = LEN_BASE.partition_point(|&b| b <= len).saturating_sub(1);
    257 + i
}

/// The distance symbol (0..=29) for a distance of 1..=32768.
pub(crate) fn distance_symbol(dist: u16) -> usize {
    DIST_BASE.partition_point(|&b| b <= dist).saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(d: &Decoder, data: &[u8], bits: u64) -> Vec<usize> {
        let mut r = BitReader::new(data, 0, bits);
        let mut out = Vec::new();
        while r.remaining() > 0 {
            out.push(d.decode(&mut r).unwrap());
        }
        out
    }

    #[test]
    fn rfc_example_codes() {
        // RFC 1951 §3.2.2: lengths (3, 3, 3, 3, 3, 2, 4, 4) give codes 010, 011, 100, 101,
        // 110, 00, 1110, 1111.
        let lens = [3, 3, 3, 3, 3, 2, 4, 4];
        let (codes, max) = canonical(&lens, HuffmanAlphabet::Distance).unwrap();
        assert_eq!(max, 4);
        let msb_first = [0b010, 0b011, 0b100, 0b101, 0b110, 0b00, 0b1110, 0b1111];
        for (sym, &c) in msb_first.iter().enumerate() {
            let l = u32::from(lens[sym]);
            assert_eq!(
                u32::from(codes[sym]),
                (c as u32).reverse_bits() >> (32 - l),
                "symbol {sym}"
            );
        }
    }

    #[test]
    fn encoder_and_decoder_agree() {
        let lens = [3, 3, 3, 3, 3, 2, 4, 4];
        let e = Encoder::new(&lens, HuffmanAlphabet::Distance).unwrap();
        let d = Decoder::new(&lens, HuffmanAlphabet::Distance).unwrap();
        let syms = [5, 0, 7, 6, 1, 2, 3, 4, 5, 5, 7];
        let mut w = BitWriter::new(1 << 10);
        for &s in &syms {
            e.write(&mut w, s).unwrap();
        }
        let bits = w.bits();
        assert_eq!(decode_all(&d, &w.finish(), bits), syms);
    }

    #[test]
    fn fixed_codes_are_complete_and_decode() {
        let lit = fixed_litlen_lens();
        let e = Encoder::new(&lit, HuffmanAlphabet::LitLen).unwrap();
        let d = Decoder::new(&lit, HuffmanAlphabet::LitLen).unwrap();
        let syms: Vec<usize> = (0..288).collect();
        let mut w = BitWriter::new(1 << 14);
        for &s in &syms {
            e.write(&mut w, s).unwrap();
        }
        let bits = w.bits();
        assert_eq!(bits, 144 * 8 + 112 * 9 + 24 * 7 + 8 * 8);
        assert_eq!(decode_all(&d, &w.finish(), bits), syms);
        // Literal 0 is 00110000 (MSB first): reversed 00001100 in the stream.
        let mut w = BitWriter::new(8);
        e.write(&mut w, 0).unwrap();
        assert_eq!(w.finish(), vec![0b0000_1100]);
        Decoder::new(&FIXED_DIST_LENS, HuffmanAlphabet::Distance).unwrap();
    }

    #[test]
    fn over_subscribed_sets_are_errors() {
        for alphabet in [
            HuffmanAlphabet::CodeLengths,
            HuffmanAlphabet::LitLen,
            HuffmanAlphabet::Distance,
        ] {
            // Three one-bit codes.
            let lens = [1, 1, 1];
            assert!(
                matches!(
                    Decoder::new(&lens, alphabet),
                    Err(DeflateError::OverSubscribed { .. })
                ),
                "{alphabet}"
            );
            assert!(Encoder::new(&lens, alphabet).is_err());
        }
        // Over-subscribed only at a longer length: two 2-bit and five 3-bit codes use 9/8,
        // one 3-bit code fewer is exactly complete.
        assert!(Decoder::new(&[2, 2, 3, 3, 3, 3], HuffmanAlphabet::Distance).is_ok());
        assert!(matches!(
            Decoder::new(&[2, 2, 3, 3, 3, 3, 3], HuffmanAlphabet::Distance),
            Err(DeflateError::OverSubscribed { .. })
        ));
    }

    #[test]
    fn incomplete_sets_are_errors_except_zlibs_two_cases() {
        // 1 + 2 of 3 bits leaves a hole.
        let lens = [1, 2];
        for alphabet in [HuffmanAlphabet::CodeLengths, HuffmanAlphabet::Distance] {
            assert!(matches!(
                Decoder::new(&lens, alphabet),
                Err(DeflateError::Incomplete { .. })
            ));
        }
        // One one-bit code: allowed for distances and literal/lengths, not for code lengths.
        assert!(Decoder::new(&[0, 1, 0], HuffmanAlphabet::Distance).is_ok());
        assert!(matches!(
            Decoder::new(&[0, 1, 0], HuffmanAlphabet::CodeLengths),
            Err(DeflateError::Incomplete { .. })
        ));
        let mut lit = [0u8; 257];
        lit[256] = 1;
        assert!(Decoder::new(&lit, HuffmanAlphabet::LitLen).is_ok());
        // One two-bit code is incomplete everywhere.
        assert!(Decoder::new(&[0, 2], HuffmanAlphabet::Distance).is_err());
        // No codes at all: only distances.
        assert!(Decoder::new(&[0; 30], HuffmanAlphabet::Distance).is_ok());
        assert!(Decoder::new(&[0; 19], HuffmanAlphabet::CodeLengths).is_err());
        assert!(Decoder::new(&[0; 257], HuffmanAlphabet::LitLen).is_err());
        // A literal/length code needs end of block.
        let mut lit = [0u8; 257];
        lit[0] = 1;
        lit[1] = 1;
        assert!(matches!(
            Decoder::new(&lit, HuffmanAlphabet::LitLen),
            Err(DeflateError::NoEndOfBlock)
        ));
        // Lengths over 15 are refused.
        assert!(matches!(
            Encoder::new(&[16, 1], HuffmanAlphabet::Distance),
            Err(DeflateError::CodeLength { len: 16, .. })
        ));
    }

    #[test]
    fn single_code_decodes_its_bit_and_refuses_the_other() {
        let d = Decoder::new(&[0, 1], HuffmanAlphabet::Distance).unwrap();
        let mut r = BitReader::new(&[0b10], 0, 2);
        assert_eq!(d.decode(&mut r).unwrap(), 1);
        assert!(matches!(
            d.decode(&mut r),
            Err(DeflateError::BadCode { at: 1, .. })
        ));
        // A symbol without a code cannot be written.
        let e = Encoder::new(&[0, 1], HuffmanAlphabet::Distance).unwrap();
        let mut w = BitWriter::new(8);
        assert!(matches!(
            e.write(&mut w, 0),
            Err(DeflateError::NoCode { symbol: 0, .. })
        ));
        assert!(e.write(&mut w, 40).is_err());
    }

    #[test]
    fn decoding_past_the_end_is_truncation() {
        let d = Decoder::new(&fixed_litlen_lens(), HuffmanAlphabet::LitLen).unwrap();
        // Six bits of a seven-bit code.
        let mut r = BitReader::new(&[0], 0, 6);
        assert!(matches!(
            d.decode(&mut r),
            Err(DeflateError::Truncated { at: 6 })
        ));
    }

    #[test]
    fn length_and_distance_symbols() {
        assert_eq!(length_symbol(3), 257);
        assert_eq!(length_symbol(10), 264);
        assert_eq!(length_symbol(11), 265);
        assert_eq!(length_symbol(12), 265);
        assert_eq!(length_symbol(227), 284);
        assert_eq!(length_symbol(257), 284);
        assert_eq!(length_symbol(258), 285);
        for len in 3..=258u16 {
            let s = length_symbol(len) - 257;
            let extra = len - LEN_BASE[s];
            assert!(u32::from(extra) < 1 << LEN_EXTRA[s], "length {len}");
        }
        assert_eq!(distance_symbol(1), 0);
        assert_eq!(distance_symbol(4), 3);
        assert_eq!(distance_symbol(5), 4);
        assert_eq!(distance_symbol(24577), 29);
        assert_eq!(distance_symbol(32768), 29);
        for d in 1..=32768u32 {
            let s = distance_symbol(d as u16);
            let extra = d - u32::from(DIST_BASE[s]);
            assert!(extra < 1 << DIST_EXTRA[s], "distance {d}");
        }
    }
}
