//! Errors of the PUFFDIFF applier: [`PuffError`] for the patch and its streams,
//! [`DeflateError`] for one deflate run or its puff.

use super::huffman::HuffmanAlphabet;

/// Which buffer of a PUFFDIFF operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PuffSide {
    /// The source extents' bytes (puffed, then patched).
    Source,
    /// The destination extents' bytes (huffed from the patched puff stream).
    Destination,
}

impl std::fmt::Display for PuffSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PuffSide::Source => "source",
            PuffSide::Destination => "destination",
        })
    }
}

/// A PUFFDIFF patch that cannot be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PuffError {
    /// Shorter than the magic and the header length.
    #[error("PUFFDIFF patch of {len} bytes is shorter than its 8-byte preamble")]
    ShortPatch {
        /// Patch length.
        len: usize,
    },
    /// Not `PUF1`.
    #[error("not a PUFFDIFF patch: magic {found:02x?}, expected \"PUF1\"")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The header length runs past the patch.
    #[error("PUFFDIFF header of {header} bytes runs past the patch's remaining {left}")]
    HeaderPastEnd {
        /// Declared header length.
        header: u32,
        /// Bytes after the preamble.
        left: usize,
    },
    /// The header is not a valid `PatchHeader` message.
    #[error("decoding the PUFFDIFF header")]
    Header(#[source] prost::DecodeError),
    /// The inner patch type is not BSDIFF.
    #[error("PUFFDIFF inner patch type {name} is not supported (only BSDIFF)")]
    UnsupportedType {
        /// `ZUCCHINI` or the number.
        name: String,
    },
    /// Deflate and puff extent lists of different lengths.
    #[error("the {side} has {deflates} deflate extents but {puffs} puff extents")]
    ExtentCount {
        /// Which stream.
        side: PuffSide,
        /// Deflate extents.
        deflates: usize,
        /// Puff extents.
        puffs: usize,
    },
    /// A deflate extent that is empty, overlaps the one before or ends past the buffer.
    #[error(
        "{side} deflate extent {index} (bits {offset}+{length}) is empty, overlaps the one before or ends past the {bits} bits"
    )]
    DeflateExtent {
        /// Which stream.
        side: PuffSide,
        /// Extent index.
        index: usize,
        /// First bit.
        offset: u64,
        /// Bits.
        length: u64,
        /// Bits in the buffer.
        bits: u64,
    },
    /// A puff extent in bits that are not whole bytes.
    #[error("{side} puff extent {index} is not in whole bytes (bits {offset}+{length})")]
    PuffNotBytes {
        /// Which stream.
        side: PuffSide,
        /// Extent index.
        index: usize,
        /// First bit.
        offset: u64,
        /// Bits.
        length: u64,
    },
    /// A puff extent not where its deflate's position puts it.
    #[error(
        "{side} puff extent {index} starts at byte {found}, the deflate layout puts it at {expected}"
    )]
    PuffLocation {
        /// Which stream.
        side: PuffSide,
        /// Extent index.
        index: usize,
        /// Where the layout puts it.
        expected: u64,
        /// Where the header puts it.
        found: u64,
    },
    /// A puff stream length that does not match the layout.
    #[error("{side} puff stream is {found} bytes in the header, the layout makes it {expected}")]
    PuffLength {
        /// Which stream.
        side: PuffSide,
        /// From the layout.
        expected: u64,
        /// From the header.
        found: u64,
    },
    /// A puff stream longer than any buffer of this size can puff to.
    #[error("{side} puff stream of {found} bytes is over the limit of {limit} for {len} bytes")]
    PuffTooLarge {
        /// Which stream.
        side: PuffSide,
        /// Declared length.
        found: u64,
        /// The limit.
        limit: u64,
        /// Buffer length.
        len: u64,
    },
    /// A buffer too large to address in bits.
    #[error("the {side} of {len} bytes is too large")]
    TooLarge {
        /// Which stream.
        side: PuffSide,
        /// Its length.
        len: u64,
    },
    /// A source deflate extent that does not puff.
    #[error("puffing {side} deflate {index} (bits {offset}+{length})")]
    Deflate {
        /// Which stream.
        side: PuffSide,
        /// Extent index.
        index: usize,
        /// First bit.
        offset: u64,
        /// Bits.
        length: u64,
        /// The cause.
        #[source]
        source: DeflateError,
    },
    /// A puff of the wrong size.
    #[error("{side} deflate {index} puffs to {found} bytes, the header says {expected}")]
    PuffSize {
        /// Which stream.
        side: PuffSide,
        /// Extent index.
        index: usize,
        /// From the header.
        expected: u64,
        /// Puffed.
        found: u64,
    },
    /// A buffer of a checked size could not be allocated.
    #[error("no memory for {bytes} bytes")]
    NoMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// The inner patch failed.
    #[error("applying the PUFFDIFF's inner bsdiff patch")]
    Bspatch(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The inner patch made a puff stream of the wrong length.
    #[error("the patched puff stream has {found} bytes, the header says {expected}")]
    PatchedSize {
        /// Expected.
        expected: u64,
        /// Made.
        found: u64,
    },
    /// A destination puff that does not huff.
    #[error("re-encoding destination deflate {index} (bits {offset}+{length})")]
    Huff {
        /// Extent index.
        index: usize,
        /// First bit.
        offset: u64,
        /// Bits.
        length: u64,
        /// The cause.
        #[source]
        source: DeflateError,
    },
    /// A destination puff that huffs to the wrong bit length.
    #[error("destination deflate {index} re-encodes to {found} bits, its extent has {expected}")]
    HuffLength {
        /// Extent index.
        index: usize,
        /// Extent bits.
        expected: u64,
        /// Written bits.
        found: u64,
    },
    /// A gap byte of the patched puff stream with bits set outside its gap.
    #[error("the patched puff stream's bytes between deflates do not fit the gap at bit {at}")]
    GapBits {
        /// Destination bit.
        at: u64,
    },
    /// Writing the destination went past its length.
    #[error("writing the destination")]
    Output(#[source] DeflateError),
    /// A fixed Huffman table could not be built (a bug, not bad input).
    #[error("building the fixed Huffman tables")]
    Internal(#[source] DeflateError),
}

/// A deflate run of blocks, or its puff, that is malformed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeflateError {
    /// The bits end inside a block.
    #[error("the deflate data ends inside a block (bit {at})")]
    Truncated {
        /// Where the data ends.
        at: u64,
    },
    /// The blocks would write past the output's end.
    #[error("output past its {limit} bits")]
    OutputLimit {
        /// Bits allowed.
        limit: u64,
    },
    /// A puff longer than its extent says.
    #[error("the puff is longer than its extent")]
    PuffTooLong,
    /// An empty extent or one past the data.
    #[error("empty deflate extent, or one past the data")]
    EmptyExtent,
    /// Block type 3.
    #[error("reserved block type 3 at bit {at}")]
    ReservedBlockType {
        /// The block's first bit.
        at: u64,
    },
    /// A stored block whose NLEN is not the complement of LEN.
    #[error("stored block at bit {at}: LEN {len:#06x} and NLEN {nlen:#06x} are not complements")]
    StoredLength {
        /// The block's first bit.
        at: u64,
        /// LEN.
        len: u32,
        /// NLEN.
        nlen: u32,
    },
    /// Too many literal/length or distance codes.
    #[error(
        "dynamic block with {nlit} literal/length and {ndist} distance codes (at most 286 and 30)"
    )]
    TooManyCodes {
        /// Literal/length codes.
        nlit: usize,
        /// Distance codes.
        ndist: usize,
    },
    /// Code-length symbol 16 (repeat) as the first length.
    #[error("dynamic block repeats a previous code length before the first one")]
    RepeatWithoutLength,
    /// Code-length repeats past the declared codes.
    #[error("dynamic block code-length repeats run past the declared codes")]
    RepeatOverrun,
    /// A code length over 15.
    #[error("{alphabet} code length {len} is over 15")]
    CodeLength {
        /// Which code.
        alphabet: HuffmanAlphabet,
        /// The length.
        len: u8,
    },
    /// More codes than code space.
    #[error("over-subscribed {alphabet} code")]
    OverSubscribed {
        /// Which code.
        alphabet: HuffmanAlphabet,
    },
    /// Unused code space (allowed only as zlib allows it).
    #[error("incomplete {alphabet} code")]
    Incomplete {
        /// Which code.
        alphabet: HuffmanAlphabet,
    },
    /// A literal/length code without end of block.
    #[error("literal/length code without an end-of-block code")]
    NoEndOfBlock,
    /// Bits that are no code of an incomplete code.
    #[error("bits at {at} are no {alphabet} code")]
    BadCode {
        /// Which code.
        alphabet: HuffmanAlphabet,
        /// Bit position.
        at: u64,
    },
    /// A symbol deflate does not define (literal/length 286, 287; distance 30, 31).
    #[error("invalid {alphabet} symbol {symbol}")]
    BadSymbol {
        /// Which alphabet.
        alphabet: HuffmanAlphabet,
        /// The symbol.
        symbol: usize,
    },
    /// A symbol without a code in its block's table.
    #[error("{alphabet} symbol {symbol} has no code in its block")]
    NoCode {
        /// Which alphabet.
        alphabet: HuffmanAlphabet,
        /// The symbol.
        symbol: usize,
    },
    /// The puff ends inside an element.
    #[error("the puff ends inside an element ({at} bytes)")]
    PuffTruncated {
        /// Puff length.
        at: usize,
    },
    /// A puff that puffing cannot have made.
    #[error("malformed puff at byte {at}: {what}")]
    PuffMalformed {
        /// What is wrong.
        what: &'static str,
        /// Byte offset in the puff.
        at: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_testsupport::errors;

    #[test]
    fn wrapped_causes_are_sources_not_text() {
        let cause = || DeflateError::Truncated { at: 7 };
        let text = "the deflate data ends inside a block (bit 7)";
        errors::assert_cause_is_source(
            &PuffError::Deflate {
                side: PuffSide::Source,
                index: 1,
                offset: 80,
                length: 20,
                source: cause(),
            },
            Some(text),
        );
        errors::assert_cause_is_source(
            &PuffError::Huff {
                index: 1,
                offset: 80,
                length: 20,
                source: cause(),
            },
            Some(text),
        );
        errors::assert_cause_is_source(&PuffError::Output(cause()), Some(text));
        errors::assert_cause_is_source(&PuffError::Internal(cause()), Some(text));
        let io = std::io::Error::other("disk on fire");
        let line =
            errors::assert_cause_is_source(&PuffError::Bspatch(Box::new(io)), Some("disk on fire"));
        assert_eq!(
            line,
            "applying the PUFFDIFF's inner bsdiff patch: disk on fire"
        );
        let bad = <super::super::header::PatchHeader as prost::Message>::decode(&[0xffu8][..])
            .unwrap_err();
        errors::assert_cause_is_source(&PuffError::Header(bad), None);
    }
}
