//! Fuzzes the block-list parser used by devices: never panics, round-trips what it accepts.
#![no_main]
use libfuzzer_sys::fuzz_target;
use snapblk_readahead::{BlockList, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_line: 1 << 12, max_entries: 1 << 12 };
    if let Ok(l) = BlockList::parse(data, limits) {
        let mut out = Vec::new();
        l.write(&mut out).unwrap();
        assert_eq!(BlockList::parse(&out[..], Limits::default()).unwrap(), l);
    }
});
