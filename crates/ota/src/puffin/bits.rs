//! Bit-level reading and writing in deflate's order: bits fill each byte from its least
//! significant bit up, multi-bit fields are stored least significant bit first (RFC 1951
//! §3.1.1). Both sides work on absolute bit positions of a whole buffer, so a deflate stream
//! may start and end at any bit and the byte alignment a stored block pads to is the buffer's.

use super::error::DeflateError;

/// Reads bits `[pos, end)` of a byte slice. Reading past `end` is an error, never a panic;
/// peeking past it gives zero bits (a Huffman decoder peeks its longest code length and then
/// consumes only the code's own length).
#[derive(Clone, Debug)]
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    pos: u64,
    end: u64,
}

impl<'a> BitReader<'a> {
    /// Bits `[start, end)` of `data`; `end` is clamped to the slice.
    pub(crate) fn new(data: &'a [u8], start: u64, end: u64) -> Self {
        let end = end.min(data.len() as u64 * 8);
        BitReader {
            data,
            pos: start.min(end),
            end,
        }
    }

    /// The absolute bit position of the next bit.
    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    /// Bits left before the end.
    pub(crate) fn remaining(&self) -> u64 {
        self.end - self.pos
    }

    /// The next `n` (at most 32) bits without consuming them; bits past the end read as 0.
    #[inline]
    pub(crate) fn peek(&self, n: u32) -> u32 {
        debug_assert!(n <= 32);
        let byte = (self.pos >> 3) as usize;
        let shift = (self.pos & 7) as u32;
        let word = match self.data.get(byte..).and_then(|s| s.first_chunk::<8>()) {
            Some(w) => u64::from_le_bytes(*w),
            None => {
                let mut w = [0u8; 8];
                let tail = self.data.get(byte..).unwrap_or(&[]);
                w[..tail.len()].copy_from_slice(tail);
                u64::from_le_bytes(w)
            }
        };
        let n = if self.remaining() >= 32 {
            n
        } else {
            self.remaining().min(u64::from(n)) as u32
        };
        ((word >> shift) & low_mask(n)) as u32
    }

    /// Consume `n` bits.
    #[inline]
    pub(crate) fn skip(&mut self, n: u32) -> Result<(), DeflateError> {
        if u64::from(n) > self.remaining() {
            return Err(DeflateError::Truncated { at: self.end });
        }
        self.pos += u64::from(n);
        Ok(())
    }

    /// Read `n` (at most 32) bits as an integer, least significant bit first.
    #[inline]
    pub(crate) fn read(&mut self, n: u32) -> Result<u32, DeflateError> {
        let v = self.peek(n);
        self.skip(n)?;
        Ok(v)
    }

    /// Bits from here to the next byte boundary of the buffer (0 to 7).
    pub(crate) fn to_boundary(&self) -> u32 {
        ((8 - (self.pos & 7)) & 7) as u32
    }

    /// Take `n` whole bytes; the position must be on a byte boundary.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DeflateError> {
        debug_assert_eq!(self.pos & 7, 0);
        if (n as u64).saturating_mul(8) > self.remaining() {
            return Err(DeflateError::Truncated { at: self.end });
        }
        let start = (self.pos >> 3) as usize;
        let b = self
            .data
            .get(start..start + n)
            .ok_or(DeflateError::Truncated { at: self.end })?;
        self.pos += n as u64 * 8;
        Ok(b)
    }
}

/// The low `n` bits set (n up to 64).
#[inline]
pub(crate) fn low_mask(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// Appends bits to a byte vector; the last byte may be partial. Writing past `limit` bits is
/// an error, so output stays bounded whatever the input asks for.
#[derive(Debug)]
pub(crate) struct BitWriter {
    out: Vec<u8>,
    acc: u64,
    nacc: u32,
    limit: u64,
}

impl BitWriter {
    /// An empty writer that refuses to grow past `limit` bits.
    #[cfg(any(test, feature = "test-utils"))]
    pub(crate) fn new(limit: u64) -> Self {
        // Grow with the data; `limit` is a bound, not a size hint.
        let cap = (limit / 8).min(1 << 20) as usize;
        Self::with_vec(Vec::with_capacity(cap), limit)
    }

    /// A writer appending to `out` (cleared), up to `limit` bits: room reserved in `out`
    /// beforehand is used.
    pub(crate) fn with_vec(mut out: Vec<u8>, limit: u64) -> Self {
        out.clear();
        BitWriter {
            out,
            acc: 0,
            nacc: 0,
            limit,
        }
    }

    /// Bits written so far.
    #[inline]
    pub(crate) fn bits(&self) -> u64 {
        self.out.len() as u64 * 8 + u64::from(self.nacc)
    }

    /// Append the low `n` (at most 32) bits of `v`, least significant first. Bits of `v`
    /// above `n` are ignored.
    #[inline]
    pub(crate) fn write(&mut self, n: u32, v: u32) -> Result<(), DeflateError> {
        debug_assert!(n <= 32);
        if self.bits() + u64::from(n) > self.limit {
            return Err(DeflateError::OutputLimit { limit: self.limit });
        }
        // `nacc` stays below 32, so up to 63 bits fit the accumulator.
        self.acc |= (u64::from(v) & low_mask(n)) << self.nacc;
        self.nacc += n;
        if self.nacc >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.nacc -= 32;
        }
        Ok(())
    }

    /// Bits from here to the next byte boundary (0 to 7).
    pub(crate) fn to_boundary(&self) -> u32 {
        (8 - (self.nacc & 7)) & 7
    }

    /// Move the accumulator's whole bytes to the output.
    fn drain(&mut self) {
        while self.nacc >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.nacc -= 8;
        }
    }

    /// Append whole bytes; the writer must be on a byte boundary.
    pub(crate) fn write_bytes(&mut self, b: &[u8]) -> Result<(), DeflateError> {
        debug_assert_eq!(self.nacc % 8, 0);
        if self.bits() + b.len() as u64 * 8 > self.limit {
            return Err(DeflateError::OutputLimit { limit: self.limit });
        }
        self.drain();
        self.out.extend_from_slice(b);
        Ok(())
    }

    /// The bytes written, the last one padded with zero bits.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.drain();
        if self.nacc > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_takes_bits_lsb_first_across_bytes() {
        let data = [0b1010_1100u8, 0b0000_0011, 0xff];
        let mut r = BitReader::new(&data, 0, 24);
        assert_eq!(r.read(2).unwrap(), 0b00);
        assert_eq!(r.read(3).unwrap(), 0b011);
        // 3 high bits of byte 0, then 2 low bits of byte 1.
        assert_eq!(r.read(5).unwrap(), 0b11_101);
        assert_eq!(r.pos(), 10);
        assert_eq!(r.to_boundary(), 6);
        r.skip(6).unwrap();
        assert_eq!(r.bytes(1).unwrap(), &[0xff]);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn reader_starts_and_stops_at_any_bit() {
        let data = [0xffu8, 0xff];
        let mut r = BitReader::new(&data, 3, 11);
        assert_eq!(r.remaining(), 8);
        // Peeking past the end gives zeros, reading past it fails.
        assert_eq!(r.peek(12), 0xff);
        assert!(matches!(r.read(9), Err(DeflateError::Truncated { at: 11 })));
        assert_eq!(r.read(8).unwrap(), 0xff);
        assert!(r.read(1).is_err());
        // An end past the slice is clamped to it.
        let r = BitReader::new(&data, 0, 1000);
        assert_eq!(r.remaining(), 16);
    }

    #[test]
    fn reader_peeks_near_the_slice_end() {
        let data: Vec<u8> = (1..=10).collect();
        let mut r = BitReader::new(&data, 0, 80);
        r.skip(72).unwrap();
        assert_eq!(r.peek(16), 10);
        assert!(r.bytes(2).is_err());
        assert_eq!(r.bytes(1).unwrap(), &[10]);
    }

    #[test]
    fn writer_packs_bits_and_masks_values() {
        let mut w = BitWriter::new(64);
        w.write(2, 0b00).unwrap();
        w.write(3, 0xff_ff_fb).unwrap(); // only the low 3 bits, 0b011
        w.write(5, 0b11_101).unwrap();
        assert_eq!(w.bits(), 10);
        assert_eq!(w.to_boundary(), 6);
        w.write(6, 0).unwrap();
        w.write_bytes(&[0xff]).unwrap();
        assert_eq!(w.finish(), vec![0b1010_1100, 0b0000_0011, 0xff]);
    }

    #[test]
    fn writer_refuses_past_its_limit() {
        let mut w = BitWriter::new(12);
        w.write(8, 1).unwrap();
        w.write(4, 1).unwrap();
        assert!(matches!(
            w.write(1, 1),
            Err(DeflateError::OutputLimit { limit: 12 })
        ));
        let mut w = BitWriter::new(8);
        assert!(w.write_bytes(&[1, 2]).is_err());
        assert_eq!(w.finish(), Vec::<u8>::new());
    }

    #[test]
    fn writer_round_trips_through_reader() {
        let mut w = BitWriter::new(1 << 20);
        let fields: Vec<(u32, u32)> = (0..500u32)
            .map(|i| (1 + i % 32, i.wrapping_mul(2654435761)))
            .collect();
        for &(n, v) in &fields {
            w.write(n, v).unwrap();
        }
        let bits = w.bits();
        let out = w.finish();
        let mut r = BitReader::new(&out, 0, bits);
        for &(n, v) in &fields {
            assert_eq!(u64::from(r.read(n).unwrap()), u64::from(v) & low_mask(n));
        }
        assert_eq!(r.remaining(), 0);
    }
}
