//! NBD wire format: constants, parsers for what a client sends, encoders for what the server
//! sends. Pure functions over byte slices, so they can be fuzzed and property-tested without
//! sockets. Everything is big-endian ("network byte order") as the protocol requires.

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation magic, also prefixes every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of every simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

// Handshake flags (server → client).
/// `NBD_FLAG_FIXED_NEWSTYLE`: the server speaks fixed newstyle (answers unknown options
/// instead of disconnecting).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// `NBD_FLAG_NO_ZEROES`: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
// Client flags (client → server).
/// `NBD_FLAG_C_FIXED_NEWSTYLE`: the client accepts fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// `NBD_FLAG_C_NO_ZEROES`: the client asks the server to omit the 124 zero bytes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags (per export).
/// `NBD_FLAG_HAS_FLAGS`: always set; the other transmission flags are meaningful.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
/// `NBD_FLAG_READ_ONLY`: the export refuses writes, trims and write-zeroes (`EPERM`).
pub const TF_READ_ONLY: u16 = 1 << 1;
/// `NBD_FLAG_SEND_FLUSH`: the export accepts `NBD_CMD_FLUSH`.
pub const TF_SEND_FLUSH: u16 = 1 << 2;
/// `NBD_FLAG_SEND_FUA`: the export accepts `NBD_CMD_FLAG_FUA` on writes.
pub const TF_SEND_FUA: u16 = 1 << 3;
/// `NBD_FLAG_ROTATIONAL`: the export is a spinning disk (clients may schedule for seeks).
pub const TF_ROTATIONAL: u16 = 1 << 4;
/// `NBD_FLAG_SEND_TRIM`: the export accepts `NBD_CMD_TRIM`.
pub const TF_SEND_TRIM: u16 = 1 << 5;
/// `NBD_FLAG_SEND_WRITE_ZEROES`: the export accepts `NBD_CMD_WRITE_ZEROES`.
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// `NBD_FLAG_CAN_MULTI_CONN`: a flush on one connection covers writes completed on all of
/// them, so clients may open several connections to one export.
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
/// `NBD_FLAG_SEND_FAST_ZERO`: the export accepts `NBD_CMD_FLAG_FAST_ZERO`.
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
/// `NBD_OPT_EXPORT_NAME`: select an export by name and enter transmission (no error reply
/// possible: an unknown name closes the connection).
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`: the client ends negotiation.
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`: list the export names (one `NBD_REP_SERVER` each).
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS`: upgrade to TLS; not supported here.
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`: describe an export (as [`OPT_GO`]) without entering transmission.
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`: describe an export and enter transmission on it.
pub const OPT_GO: u32 = 7;
/// `NBD_OPT_STRUCTURED_REPLY`: ask for structured replies; refused here (simple replies only).
pub const OPT_STRUCTURED_REPLY: u32 = 8;

// Option reply types.
/// `NBD_REP_ACK`: the option succeeded (ends the replies to it).
pub const REP_ACK: u32 = 1;
/// `NBD_REP_SERVER`: one export name, in reply to `NBD_OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// `NBD_REP_INFO`: one `NBD_INFO_*` item, in reply to `NBD_OPT_INFO`/`NBD_OPT_GO`.
pub const REP_INFO: u32 = 3;
const REP_ERR: u32 = 1 << 31;
/// `NBD_REP_ERR_UNSUP`: the option is unknown or not supported.
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
/// `NBD_REP_ERR_POLICY`: refused by server policy.
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
/// `NBD_REP_ERR_INVALID`: the option's data is malformed.
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
/// `NBD_REP_ERR_UNKNOWN`: no export of that name.
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
/// `NBD_REP_ERR_SHUTDOWN`: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
/// `NBD_REP_ERR_TOO_BIG`: the option's data is longer than the server accepts.
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

// Info types carried in `REP_INFO`.
/// `NBD_INFO_EXPORT`: export size and transmission flags (always sent).
pub const INFO_EXPORT: u16 = 0;
/// `NBD_INFO_NAME`: the export's canonical name.
pub const INFO_NAME: u16 = 1;
/// `NBD_INFO_DESCRIPTION`: a human-readable description of the export.
pub const INFO_DESCRIPTION: u16 = 2;
/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum block sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
/// `NBD_CMD_READ`: read `len` bytes at `offset`.
pub const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE`: write the `len` bytes that follow the header at `offset`.
pub const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`: the client disconnects after its in-flight requests complete.
pub const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`: make every completed write durable.
pub const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`: discard a range (a device discard).
pub const CMD_TRIM: u16 = 4;
/// `NBD_CMD_WRITE_ZEROES`: make a range read back as zeroes.
pub const CMD_WRITE_ZEROES: u16 = 6;

// Command flags.
/// `NBD_CMD_FLAG_FUA`: the write is durable when its reply is sent.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// `NBD_CMD_FLAG_NO_HOLE`: write-zeroes must allocate, not punch a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// `NBD_CMD_FLAG_FAST_ZERO`: write-zeroes must fail (`ENOTSUP`) rather than write zero
/// buffers slowly.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Error values in replies (the protocol's own numbering, which happens to match Linux).
/// `NBD_EPERM`: operation not permitted (a write to a read-only export).
pub const EPERM: u32 = 1;
/// `NBD_EIO`: input/output error; what any device error without a closer match becomes.
pub const EIO: u32 = 5;
/// `NBD_ENOMEM`: out of memory.
pub const ENOMEM: u32 = 12;
/// `NBD_EINVAL`: invalid request (unknown command or flag, misaligned or out of range).
pub const EINVAL: u32 = 22;
/// `NBD_ENOSPC`: no space left (a write past the end of the export, or a full backing store).
pub const ENOSPC: u32 = 28;
/// `NBD_EOVERFLOW`: the request's length is too large.
pub const EOVERFLOW: u32 = 75;
/// `NBD_ENOTSUP`: not supported (e.g. `NBD_CMD_FLAG_FAST_ZERO` without a fast path).
pub const ENOTSUP: u32 = 95;
/// `NBD_ESHUTDOWN`: the server is shutting down; the client should disconnect.
pub const ESHUTDOWN: u32 = 108;

/// Longest export name (or other string) the protocol allows.
pub const MAX_STRING: usize = 4096;
/// Size of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;

/// Why a client message was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// The message does not start with the magic its phase requires (`IHAVEOPT` for options,
    /// `NBD_REQUEST_MAGIC` for requests); the value found.
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    /// The message is shorter than its fixed fields or its own length fields say.
    #[error("message truncated")]
    Truncated,
    /// A name or string is longer than [`MAX_STRING`] bytes.
    #[error("string longer than {MAX_STRING} bytes")]
    StringTooLong,
    /// A name or string is not UTF-8 or contains a NUL byte.
    #[error("string is not valid UTF-8 or contains NUL")]
    BadString,
    /// Bytes are left over after the last field the option defines.
    #[error("trailing bytes after the option data")]
    Trailing,
}

fn be_u16(b: &[u8], at: usize) -> Result<u16, ProtoError> {
    let s = b.get(at..at + 2).ok_or(ProtoError::Truncated)?;
    Ok(u16::from_be_bytes([s[0], s[1]]))
}
fn be_u32(b: &[u8], at: usize) -> Result<u32, ProtoError> {
    let s = b.get(at..at + 4).ok_or(ProtoError::Truncated)?;
    Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}
fn be_u64(b: &[u8], at: usize) -> Result<u64, ProtoError> {
    let s = b.get(at..at + 8).ok_or(ProtoError::Truncated)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_be_bytes(a))
}

/// The 16-byte header of a client option (`IHAVEOPT`, option, data length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option code (`OPT_*`).
    pub option: u32,
    /// Length in bytes of the option data that follows the header.
    pub len: u32,
}

impl OptionHeader {
    /// Size of the header on the wire.
    pub const LEN: usize = 16;
    /// Parse the first [`OptionHeader::LEN`] bytes of `b` (extra bytes are ignored).
    pub fn parse(b: &[u8]) -> Result<OptionHeader, ProtoError> {
        let magic = be_u64(b, 0)?;
        if magic != IHAVEOPT {
            return Err(ProtoError::BadMagic(magic));
        }
        Ok(OptionHeader {
            option: be_u32(b, 8)?,
            len: be_u32(b, 12)?,
        })
    }
}

fn parse_string(b: &[u8]) -> Result<String, ProtoError> {
    if b.len() > MAX_STRING {
        return Err(ProtoError::StringTooLong);
    }
    if b.contains(&0) {
        return Err(ProtoError::BadString);
    }
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadString)
}

/// Data of `NBD_OPT_EXPORT_NAME`: the whole payload is the name.
pub fn parse_export_name(data: &[u8]) -> Result<String, ProtoError> {
    parse_string(data)
}

/// Data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    /// The export name (may be empty: the default export).
    pub name: String,
    /// Info types the client asked for.
    pub infos: Vec<u16>,
}

impl GoRequest {
    /// Parse the whole option data `d`: name length, name, info count, info types; extra
    /// bytes are an error.
    pub fn parse(d: &[u8]) -> Result<GoRequest, ProtoError> {
        let nlen = be_u32(d, 0)? as usize;
        if nlen > MAX_STRING {
            return Err(ProtoError::StringTooLong);
        }
        let name_bytes = d.get(4..4 + nlen).ok_or(ProtoError::Truncated)?;
        let name = parse_string(name_bytes)?;
        let n = be_u16(d, 4 + nlen)? as usize;
        let start = 6 + nlen;
        let list = d.get(start..start + 2 * n).ok_or(ProtoError::Truncated)?;
        if d.len() != start + 2 * n {
            return Err(ProtoError::Trailing);
        }
        let infos = list
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        Ok(GoRequest { name, infos })
    }

    /// Encode (used by tests and fuzzers to build valid inputs).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(6 + self.name.len() + 2 * self.infos.len());
        v.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v.extend_from_slice(&(self.infos.len() as u16).to_be_bytes());
        for i in &self.infos {
            v.extend_from_slice(&i.to_be_bytes());
        }
        v
    }
}

/// A transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags (`CMD_FLAG_*`).
    pub flags: u16,
    /// The command (`CMD_*`).
    pub cmd: u16,
    /// Opaque to the server: echoed in the reply so the client can match it (called
    /// `handle` in older protocol texts).
    pub cookie: u64,
    /// Byte offset on the export.
    pub offset: u64,
    /// Length in bytes (of the payload that follows, for `CMD_WRITE`).
    pub len: u32,
}

impl RequestHeader {
    /// Parse the first [`REQUEST_LEN`] bytes of `b` (extra bytes are ignored).
    pub fn parse(b: &[u8]) -> Result<RequestHeader, ProtoError> {
        let magic = be_u32(b, 0)?;
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic(magic.into()));
        }
        Ok(RequestHeader {
            flags: be_u16(b, 4)?,
            cmd: be_u16(b, 6)?,
            cookie: be_u64(b, 8)?,
            offset: be_u64(b, 16)?,
            len: be_u32(b, 24)?,
        })
    }

    /// Encode as a client sends it (used by tests and fuzzers).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.cmd.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// A simple reply header.
pub(crate) fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// An option reply (header + data).
pub(crate) fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&reply.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// `NBD_INFO_EXPORT` payload.
pub(crate) fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

/// `NBD_INFO_NAME` / `NBD_INFO_DESCRIPTION` payload.
pub(crate) fn info_string(kind: u16, s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + s.len());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(s.as_bytes());
    v
}

/// `NBD_INFO_BLOCK_SIZE` payload.
pub(crate) fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    v.extend_from_slice(&min.to_be_bytes());
    v.extend_from_slice(&preferred.to_be_bytes());
    v.extend_from_slice(&max.to_be_bytes());
    v
}

/// `NBD_REP_SERVER` payload for `NBD_OPT_LIST`.
pub(crate) fn rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + name.len() + description.len());
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(description.as_bytes());
    v
}

/// Map an OS errno from the device to the protocol's error set (unknown values become EIO, as
/// the protocol requires servers to send only the listed values).
pub(crate) fn errno_to_nbd(errno: i32) -> u32 {
    match errno {
        libc::EPERM | libc::EACCES | libc::EROFS => EPERM,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_header_roundtrip_and_magic() {
        let h = RequestHeader {
            flags: 1,
            cmd: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: 4096,
            len: 512,
        };
        assert_eq!(RequestHeader::parse(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(matches!(
            RequestHeader::parse(&bad),
            Err(ProtoError::BadMagic(_))
        ));
        assert_eq!(
            RequestHeader::parse(&h.encode()[..10]),
            Err(ProtoError::Truncated)
        );
    }

    #[test]
    fn go_request_rejects_malformed() {
        let g = GoRequest {
            name: "disk".into(),
            infos: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        let e = g.encode();
        assert_eq!(GoRequest::parse(&e).unwrap(), g);
        assert_eq!(
            GoRequest::parse(&e[..e.len() - 1]),
            Err(ProtoError::Truncated)
        );
        let mut t = e.clone();
        t.push(0);
        assert_eq!(GoRequest::parse(&t), Err(ProtoError::Trailing));
        // Name length far past the data, and past the protocol maximum.
        let mut huge = e.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(GoRequest::parse(&huge), Err(ProtoError::StringTooLong));
        let mut nul = GoRequest {
            name: "a".into(),
            infos: vec![],
        }
        .encode();
        nul[4] = 0;
        assert_eq!(GoRequest::parse(&nul), Err(ProtoError::BadString));
    }

    #[test]
    fn option_header_parse() {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&OPT_GO.to_be_bytes());
        b.extend_from_slice(&7u32.to_be_bytes());
        assert_eq!(
            OptionHeader::parse(&b).unwrap(),
            OptionHeader {
                option: OPT_GO,
                len: 7
            }
        );
        b[3] = 0;
        assert!(OptionHeader::parse(&b).is_err());
    }

    #[test]
    fn errno_mapping_only_emits_protocol_values() {
        for e in 0..200 {
            let v = errno_to_nbd(e);
            assert!(
                [
                    EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN
                ]
                .contains(&v)
            );
        }
    }

    proptest! {
        #[test]
        fn parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = RequestHeader::parse(&b);
            let _ = OptionHeader::parse(&b);
            let _ = GoRequest::parse(&b);
            let _ = parse_export_name(&b);
        }

        #[test]
        fn go_roundtrip(name in "[a-z0-9/._-]{0,40}", infos in proptest::collection::vec(any::<u16>(), 0..8)) {
            let g = GoRequest { name, infos };
            prop_assert_eq!(GoRequest::parse(&g.encode()).unwrap(), g);
        }

        #[test]
        fn request_roundtrip(flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) {
            let h = RequestHeader { flags, cmd, cookie, offset, len };
            prop_assert_eq!(RequestHeader::parse(&h.encode()).unwrap(), h);
        }
    }
}
