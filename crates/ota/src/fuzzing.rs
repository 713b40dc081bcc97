//! Entry points shared by the cargo-fuzz targets (crates/ota/fuzz: `payload`, `bspatch`,
//! `keys`) and the in-suite fuzz smoke test. They must never panic, whatever the input.

use prost::Message;

use crate::payload::{HEADER_LEN, MAGIC, MAJOR_VERSION, Payload};
use crate::proto::DeltaArchiveManifest;

pub use crate::puffin::testing::fuzz_puffin;

/// Largest total partition size extracted into memory per input.
const MAX_EXTRACT: u64 = 16 << 20;

/// Public keys the payload harness checks signatures with when the input brings none
/// (made once by `openssl genpkey`; their private halves were not kept): ECDSA P-256 and
/// RSA-2048.
const FUZZ_KEYS: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEk1lVniFe/jEMHxWd1TRPjDgH9DbE
P/sHXNwkFSwVifgMn5Y70H3GyX9/oKV1nKWwIjFLtHJ1Yxcaks8pUhsR2A==
-----END PUBLIC KEY-----
-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA6NBBsMBJefuCG7b+Gsyw
oWyyDFoD/gwUiNrs1ciZn1AdskkZPEgDs5crcv5Zb2JehAL/Aq2ERmPaONlNidlo
eOJRAKUaussm3MWX47bd4aNwWP8zIL0qflKybSzzXXnkZZ6IxdKe5uC2zg2/bjsW
RQ1xl+V+Lty6OfOkSkSwPrdp/ODBKslBXfdG7WyNIeQovm8s/So6iYfc+IkkmFM/
w1SAf4SGYO79qHgOLCruLj30HdOupS5TFxiRIIrtoztRsE3ElU9rvBFtoMLokw/M
vfBXSPePDw/+ZqYiVVG5OlLSunn8EkaKe4nuKbcodvXeR9fmNVWsl+EnhxUpFTbp
SQIDAQAB
-----END PUBLIC KEY-----
";

/// Parse `data` as a payload and do what `ota info`, `ota apply` (its plan) and `ota extract`
/// do with it: the summary, the signatures (decoded, digested and checked), the apply and
/// extraction plans and, when the partitions are small, the extraction itself into memory.
/// The first byte is a flag: with bit 0 set, the rest is a manifest wrapped in a valid header
/// and followed by a 64 KiB data area of a repeating pattern, so the fuzzer reaches the
/// manifest checks without finding the header first; with bit 1 set, the input ends with a
/// key file (PEM or DER) and its length as 2 bytes big-endian, and the signatures are checked
/// with its keys (else with two fixed keys), so a seed signed by that key reaches the
/// verified path.
pub fn fuzz_payload(data: &[u8]) {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let mut keys = crate::keys::VerifyKey::parse_all(FUZZ_KEYS.as_bytes()).unwrap_or_default();
    if flags & 2 != 0 {
        let Some((body, len)) = rest.split_last_chunk::<2>() else {
            return;
        };
        let n = usize::from(u16::from_be_bytes(*len)).min(body.len());
        let (payload, key) = body.split_at(body.len() - n);
        keys = crate::keys::VerifyKey::parse_all(key).unwrap_or_default();
        rest = payload;
    }
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
    let _ = p.signature_status();
    if let Ok(d) = p.signature_digests(flags & 4 != 0, &mut |_| {}) {
        let _ = p.verify_signatures(&keys, Some(&d));
    }
    let _ = p.plan_apply(None, true);
    let Ok(plan) = p.plan_extract(None) else {
        return;
    };
    let total: u64 = plan.partitions().iter().map(|q| q.size).sum();
    if total <= MAX_EXTRACT {
        let _ = crate::testing::extract_to_memory(&p, None, 1);
    }
}

/// Parse `data` as a key file (`--key`: PEM or DER, certificate or public key, or a zip of
/// them) and check a fixed digest against the input itself as a signature with every key
/// found.
pub fn fuzz_keys(data: &[u8]) {
    if let Ok(keys) = crate::keys::VerifyKey::parse_all(data) {
        for k in keys {
            let _ = k.verify_sha256(&[0x5a; 32], data);
        }
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
