//! Fuzzes the NBD message parsers: never panic; whatever parses re-encodes to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use snapblk_nbd::proto::{GoRequest, OptionHeader, RequestHeader, parse_export_name};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = RequestHeader::parse(data) {
        assert_eq!(&h.encode()[..], &data[..28]);
    }
    let _ = OptionHeader::parse(data);
    let _ = parse_export_name(data);
    if let Ok(g) = GoRequest::parse(data) {
        assert_eq!(g.encode(), data);
    }
});
