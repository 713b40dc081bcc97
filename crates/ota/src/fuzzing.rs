//! Entry points shared by the cargo-fuzz targets (crates/ota/fuzz: `payload`, `bspatch`) and
//! the in-suite fuzz smoke test. They must never panic, whatever the input.

use prost::Message;

use crate::payload::{HEADER_LEN, MAGIC, MAJOR_VERSION, Payload};
use crate::proto::DeltaArchiveManifest;

pub use crate::puffin::testing::fuzz_puffin;

/// Largest total partition size extracted into memory per input.
const MAX_EXTRACT: u64 = 16 << 20;

/// Parse `data` as a payload and do what `ota info`, `ota apply` (its plan) and `ota extract`
/// do with it: the summary, the metadata signature, the apply and extraction plans and, when
/// the partitions are small, the extraction itself into memory. The first byte is a flag: with bit 0 set, the rest is a
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
    let _ = p.plan_apply(None, true);
    let Ok(plan) = p.plan_extract(None) else {
        return;
    };
    let total: u64 = plan.partitions().iter().map(|q| q.size).sum();
    if total <= MAX_EXTRACT {
        let _ = crate::testing::extract_to_memory(&p, None, 1);
    }
}

/// Largest new file [`fuzz_bspatch`] lets a patch make.
const MAX_BSPATCH_OUT: u64 = 1 << 20;

/// Apply `data` as a bsdiff patch (BSDIFF40 or BSDF2) the way SOURCE_BSDIFF and BROTLI_BSDIFF
/// operations do: the first two bytes are the old file's length (little-endian, at most what
/// follows), then the old file, then the patch; the new file may have at most 1 MiB. Checks
/// that the applier hands out exactly the size it reports; returns whether the patch applied.
pub fn fuzz_bspatch(data: &[u8]) -> bool {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return false;
    };
    let n = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (old, patch) = rest.split_at(n);
    let mut buf = [0u8; 4096];
    let mut out = 0u64;
    let r = crate::bspatch::apply(old, patch, MAX_BSPATCH_OUT, &mut buf, &mut |b: &[u8]| {
        out += b.len() as u64;
        Ok::<(), ()>(())
    });
    let Ok(size) = r else {
        return false;
    };
    assert_eq!(
        size, out,
        "the applier reported {size} bytes and handed out {out}"
    );
    assert!(size <= MAX_BSPATCH_OUT);
    true
}

/// A seed for [`fuzz_bspatch`]: `old`'s length, `old`, `patch`.
pub fn bspatch_seed(old: &[u8], patch: &[u8]) -> Vec<u8> {
    let n = u16::try_from(old.len()).unwrap_or(u16::MAX);
    let mut v = n.to_le_bytes().to_vec();
    v.extend_from_slice(&old[..usize::from(n)]);
    v.extend_from_slice(patch);
    v
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
