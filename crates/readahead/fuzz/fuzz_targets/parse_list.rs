//! Fuzzes the readahead list parser (text v1, JSON Lines, classic block lists): it must never
//! panic, and whatever it accepts must survive a write/parse round trip unchanged.
#![no_main]
use libfuzzer_sys::fuzz_target;
use snapblk_readahead::{parse_bytes, write_jsonl, write_text, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_line: 1 << 16, max_entries: 1 << 12 };
    if let Ok(entries) = parse_bytes(data, limits) {
        // Entries with an empty range set are not written (they would widen to "*").
        let kept: Vec<_> = entries
            .into_iter()
            .filter(|e| !matches!(&e.extent, snapblk_readahead::Extent::Ranges(r) if r.is_empty()))
            .collect();
        let mut t = Vec::new();
        write_text(&mut t, &kept).unwrap();
        assert_eq!(parse_bytes(&t, Limits::default()).unwrap(), kept);
        let mut j = Vec::new();
        write_jsonl(&mut j, &kept).unwrap();
        assert_eq!(parse_bytes(&j, Limits::default()).unwrap(), kept);
    }
});
