//! Entry points shared by the cargo-fuzz targets (crates/ota/fuzz) and the in-suite fuzz
//! smoke test. They must never panic, whatever the input.

use prost::Message;

use crate::payload::{HEADER_LEN, MAGIC, MAJOR_VERSION, Payload};
use crate::proto::DeltaArchiveManifest;

/// Largest total partition size extracted into memory per input.
const MAX_EXTRACT: u64 = 16 << 20;

/// Parse `data` as a payload and do what `ota info` and `ota extract` do with it: the summary,
/// the metadata signature, the extraction plan and, when the partitions are small, the
/// extraction itself into memory. The first byte is a flag: with bit 0 set, the rest is a
/// manifest wrapped in a valid header and followed by a 64 KiB data area of a repeating
/// pattern, so the fuzzer reaches the manifest checks without finding the header first.
pub fn fuzz_payload(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let bytes = if flags & 1 != 0 {
        wrap_manifest(rest)
    } else {
        rest.to_vec()
    };
    let Ok(p) = Payload::from_bytes(bytes) else {
        return;
    };
    let _ = p.summary();
    let _ = p.metadata_signatures();
    let Ok(plan) = p.plan_extract(None) else {
        return;
    };
    let total: u64 = plan.partitions().iter().map(|q| q.size).sum();
    if total <= MAX_EXTRACT {
        let _ = crate::testing::extract_to_memory(&p, None, 1);
    }
}

/// A header for `manifest`, the manifest, and a data area.
fn wrap_manifest(manifest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN as usize + manifest.len() + (64 << 10));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&MAJOR_VERSION.to_be_bytes());
    out.extend_from_slice(&(manifest.len() as u64).to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(manifest);
    out.extend((0..64u32 << 10).map(|i| (i % 251) as u8));
    out
}

/// A seed for the wrapped form: flag byte 1, then `payload`'s manifest (for corpora).
pub fn manifest_seed(payload: &[u8]) -> Option<Vec<u8>> {
    let p = Payload::from_bytes(payload.to_vec()).ok()?;
    let m: &DeltaArchiveManifest = p.manifest();
    let mut v = vec![1u8];
    v.extend(m.encode_to_vec());
    Some(v)
}
