//! Entry points shared by the cargo-fuzz targets (crates/cow/fuzz) and the in-suite fuzz smoke
//! test. They must never panic, whatever the input.

use crate::reader::{CowReader, OpenOptions};

/// Parse `data` as a COW and exercise everything a consumer would do with it: the block map,
/// merge order and its verification, decoding every payload and reading blocks of the view
/// over a zero base. Work is bounded (at most 512 blocks read).
pub fn fuzz_cow(data: &[u8]) {
    let opts = OpenOptions {
        device_blocks: Some(1 << 20),
        ..Default::default()
    };
    let Ok(r) = CowReader::open_with(data, opts) else {
        return;
    };
    let _ = r.verify_merge_order();
    let _ = crate::tools::summarize(&r);
    let bs = r.block_size() as usize;
    let base = vec![0u8; 64 * bs];
    let mut unit = Vec::new();
    for op in r.data_ops().take(512) {
        if let Some(p) = op.payload() {
            unit.resize(p.unit_blocks as usize * bs, 0);
            let _ = r.decode_payload(op, &mut unit);
        }
    }
    let mut blk = vec![0u8; bs];
    for (b, _, _) in r.block_map().take(512) {
        let _ = r.read_block(b, base.as_slice(), &mut blk);
    }
    let mut disk = vec![0u8; 64 * bs];
    let _ = crate::tools::simulate_merge(&r, &mut disk);
}

/// Expand `data` as an Android sparse image (bounded to 64 MiB of output).
pub fn fuzz_sparse(data: &[u8]) {
    let _ = crate::sparse::expand(data, 64 << 20);
}

/// Parse `data` as a COW record and use what it returns (digest lookups over every range). The
/// first byte is a flag: with bit 0 set, the rest gets a valid trailing checksum first, so the
/// fuzzer reaches the parser behind the checksum (random bytes almost never carry one).
pub fn fuzz_record(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut owned;
    let bytes = if flags & 1 != 0 && rest.len() >= 32 {
        owned = rest.to_vec();
        let n = owned.len() - 32;
        let sum = crate::record::sha256(&owned[..n]);
        owned[n..].copy_from_slice(&sum);
        &owned[..]
    } else {
        rest
    };
    let Ok(r) = crate::record::Record::decode(bytes) else {
        return;
    };
    let ix = r.index();
    for &(s, n) in r.read.iter().chain(&r.write).take(64) {
        let _ = ix.base_digest(s + n - 1);
        let _ = ix.target_digest(s);
    }
    let _ = r.target_blocks();
    assert_eq!(crate::record::Record::decode(&r.encode()).ok(), Some(r));
}
