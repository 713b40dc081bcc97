//! The payload's two signatures, as update_engine checks them:
//!
//! * the **metadata signature** (header field at offset 20 gives its size S; the `Signatures`
//!   message right after the manifest) signs SHA-256 of the metadata, bytes `[0, 24 + M)`;
//! * the **payload signature** (the manifest's `signatures_offset` and `signatures_size`, in
//!   the data area, the payload's last blob) signs SHA-256 of the metadata followed by the data
//!   area up to that blob, `[0, 24 + M) ‖ [24 + M + S, data_start + signatures_offset)`: the
//!   metadata signature is left out, so it can be added after the payload was signed.
//!
//! Each is a `Signatures` message of one or more `Signature`s (one per signing key); a
//! signature's `data` may be zero-padded to a fixed size (ECDSA's DER signatures vary in
//! length) and `unpadded_signature_size` gives its real length. A set verifies when one of its
//! signatures verifies with one of the given keys.

use sha2::{Digest, Sha256};

use crate::error::{OtaError, Result};
use crate::keys::VerifyKey;
use crate::payload::Payload;
use crate::proto::Signatures;

/// Largest signature blob read, in bytes (update_engine's are a few hundred bytes per key).
pub const MAX_SIGNATURE_BLOB: u64 = 64 << 10;

/// Chunk size of the digest pass.
const CHUNK: usize = 1 << 20;

/// What is known about one of the payload's signatures.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SignatureStatus {
    /// The payload carries no such signature.
    Unsigned,
    /// Present, not checked: no key was given.
    NotChecked {
        /// Signatures in the set.
        signatures: usize,
    },
    /// Signature `signature` (0-based) of the set verifies with key `key` (0-based index in
    /// the keys given).
    Verified {
        /// Signatures in the set.
        signatures: usize,
        /// The one that verified.
        signature: usize,
        /// The key it verified with.
        key: usize,
    },
    /// No signature of the set verifies with any key given.
    Mismatch {
        /// Signatures in the set.
        signatures: usize,
    },
    /// The signature blob is not a usable `Signatures` message (it cannot verify).
    Malformed {
        /// What is wrong, in words.
        problem: String,
    },
}

impl SignatureStatus {
    /// Whether the payload carries this signature (in any state but [`Unsigned`](Self::Unsigned)).
    pub fn is_present(&self) -> bool {
        !matches!(self, SignatureStatus::Unsigned)
    }
}

/// The state of both signatures.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SignatureReport {
    /// The metadata signature.
    pub metadata: SignatureStatus,
    /// The payload signature.
    pub payload: SignatureStatus,
}

impl SignatureReport {
    /// Whether the payload carries either signature.
    pub fn is_signed(&self) -> bool {
        self.metadata.is_present() || self.payload.is_present()
    }

    /// Ok when the payload signature verified (it covers every byte but the two signature
    /// blobs) and the metadata signature verified or is absent; otherwise
    /// [`OtaError::NotAuthentic`] naming the signature and what is wrong with it.
    pub fn require_verified(&self) -> Result<()> {
        let bad = |which: &'static str, s: &SignatureStatus| {
            let why = match s {
                SignatureStatus::Verified { .. } => return None,
                SignatureStatus::Unsigned => "the payload has none".to_string(),
                SignatureStatus::NotChecked { .. } => "no key was given".to_string(),
                SignatureStatus::Mismatch { signatures } => {
                    format!("none of its {signatures} signatures verifies with the keys given")
                }
                SignatureStatus::Malformed { problem } => problem.clone(),
            };
            Some(OtaError::NotAuthentic { which, why })
        };
        if let Some(e) = bad("payload", &self.payload) {
            return Err(e);
        }
        if self.metadata.is_present()
            && let Some(e) = bad("metadata", &self.metadata)
        {
            return Err(e);
        }
        Ok(())
    }
}

/// The SHA-256 digests one pass over the payload gives ([`Payload::signature_digests`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digests {
    /// Of the metadata, `[0, 24 + M)`: what the metadata signature signs (and
    /// `METADATA_HASH`).
    pub metadata: [u8; 32],
    /// Of the metadata and the data area before the payload signature blob: what the payload
    /// signature signs; `None` when the manifest names no payload signature.
    pub payload: Option<[u8; 32]>,
    /// Of the whole payload (`FILE_HASH`), when asked for.
    pub file: Option<[u8; 32]>,
}

/// Decode a signature blob into what can be checked: the signatures, each truncated to its
/// unpadded size, or why the blob cannot verify.
fn decode_set(bytes: &[u8]) -> std::result::Result<Vec<Vec<u8>>, String> {
    let set = prost::Message::decode(bytes)
        .map_err(|_: prost::DecodeError| "the Signatures message does not decode".to_string())?;
    let Signatures { signatures } = set;
    if signatures.is_empty() {
        return Err("the Signatures message holds no signature".into());
    }
    signatures
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut data = s.data.unwrap_or_default();
            if let Some(n) = s.unpadded_signature_size {
                let n = n as usize;
                if n > data.len() {
                    return Err(format!(
                        "signature {}: unpadded_signature_size {n} is larger than its {} bytes",
                        i + 1,
                        data.len()
                    ));
                }
                data.truncate(n);
            }
            Ok(data)
        })
        .collect()
}

/// The status of one blob: `None` when absent, else checked against `digest` with `keys`
/// (none: not checked).
fn status(blob: Option<Vec<u8>>, keys: &[VerifyKey], digest: Option<&[u8; 32]>) -> SignatureStatus {
    let Some(blob) = blob else {
        return SignatureStatus::Unsigned;
    };
    let set = match decode_set(&blob) {
        Ok(s) => s,
        Err(problem) => return SignatureStatus::Malformed { problem },
    };
    let signatures = set.len();
    let Some(digest) = digest.filter(|_| !keys.is_empty()) else {
        return SignatureStatus::NotChecked { signatures };
    };
    for (signature, data) in set.iter().enumerate() {
        if let Some(key) = keys.iter().position(|k| k.verify_sha256(digest, data)) {
            return SignatureStatus::Verified {
                signatures,
                signature,
                key,
            };
        }
    }
    SignatureStatus::Mismatch { signatures }
}

impl Payload {
    /// The payload signature blob's bytes, `None` when the manifest names none; a blob larger
    /// than [`MAX_SIGNATURE_BLOB`] is given as an empty one (it is reported malformed).
    fn payload_signature_blob(&self) -> Result<Option<std::result::Result<Vec<u8>, String>>> {
        let Some((at, n)) = self.signatures_range() else {
            return Ok(None);
        };
        self.blob(at, n).map(Some)
    }

    fn metadata_signature_blob(&self) -> Result<Option<std::result::Result<Vec<u8>, String>>> {
        let n = u64::from(self.header().metadata_signature_size);
        if n == 0 {
            return Ok(None);
        }
        self.blob(self.metadata_size(), n).map(Some)
    }

    fn blob(&self, at: u64, n: u64) -> Result<std::result::Result<Vec<u8>, String>> {
        if n > MAX_SIGNATURE_BLOB {
            return Ok(Err(format!(
                "the signature blob has {n} bytes, more than the {MAX_SIGNATURE_BLOB} read"
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.read_exact_at(at, &mut buf)?;
        Ok(Ok(buf))
    }

    /// What the payload's signatures are without checking them: [`SignatureStatus::Unsigned`],
    /// [`SignatureStatus::NotChecked`] with the number of signatures, or
    /// [`SignatureStatus::Malformed`]. Reads only the two signature blobs.
    pub fn signature_status(&self) -> Result<SignatureReport> {
        self.verify_signatures(&[], None)
    }

    /// Check both signatures with `keys` against `digests` (from
    /// [`Payload::signature_digests`] of this payload). With no keys or no digests the
    /// signatures present are [`SignatureStatus::NotChecked`]. Reads only the two blobs.
    pub fn verify_signatures(
        &self,
        keys: &[VerifyKey],
        digests: Option<&Digests>,
    ) -> Result<SignatureReport> {
        let one =
            |blob: Option<std::result::Result<Vec<u8>, String>>, d: Option<&[u8; 32]>| match blob {
                Some(Err(problem)) => SignatureStatus::Malformed { problem },
                Some(Ok(b)) => status(Some(b), keys, d),
                None => SignatureStatus::Unsigned,
            };
        let metadata = one(
            self.metadata_signature_blob()?,
            digests.map(|d| &d.metadata),
        );
        let payload = one(
            self.payload_signature_blob()?,
            digests.and_then(|d| d.payload.as_ref()),
        );
        Ok(SignatureReport { metadata, payload })
    }

    /// The digests the signatures sign, and the whole payload's when `file` is set, in one
    /// sequential read (1 MiB at a time: memory does not grow with the payload); `progress`
    /// gets the bytes of each chunk read. Without `file` the read stops at the payload
    /// signature blob.
    pub fn signature_digests(&self, file: bool, progress: &mut dyn FnMut(u64)) -> Result<Digests> {
        let meta_end = self.metadata_size();
        let data_start = self.data_start();
        let sig_at = self.signatures_range().map(|(at, _)| at);
        let stop = if file {
            self.len()
        } else {
            sig_at.unwrap_or(meta_end).max(meta_end)
        };
        let mut signed = Sha256::new();
        let mut whole = file.then(Sha256::new);
        let mut metadata = None;
        let mut buf = vec![0u8; CHUNK.min(stop as usize)];
        let mut at = 0u64;
        while at < stop {
            let n = (stop - at).min(CHUNK as u64) as usize;
            let chunk = &mut buf[..n];
            self.read_exact_at(at, chunk)?;
            let end = at + n as u64;
            if let Some(w) = whole.as_mut() {
                w.update(&*chunk);
            }
            // The signed ranges: [0, meta_end) and [data_start, sig_at).
            let part = |from: u64, to: u64| {
                let (a, b) = (from.max(at), to.min(end));
                (a < b).then(|| (a - at) as usize..(b - at) as usize)
            };
            if let Some(r) = part(0, meta_end) {
                signed.update(&chunk[r]);
            }
            if metadata.is_none() && end >= meta_end {
                metadata = Some(signed.clone().finalize().into());
            }
            if let Some(r) = sig_at.and_then(|s| part(data_start, s)) {
                signed.update(&chunk[r]);
            }
            progress(n as u64);
            at = end;
        }
        let metadata = match metadata {
            Some(m) => m,
            // An empty manifest and nothing read (not reachable for a parsed payload).
            None => signed.clone().finalize().into(),
        };
        Ok(Digests {
            metadata,
            payload: sig_at.map(|_| signed.finalize().into()),
            file: whole.map(|w| w.finalize().into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpadded_size_truncates_and_is_checked() {
        let set = |sigs: Vec<crate::proto::Signature>| {
            prost::Message::encode_to_vec(&Signatures { signatures: sigs })
        };
        let sig = |data: &[u8], unpadded: Option<u32>| crate::proto::Signature {
            version: None,
            data: Some(data.to_vec()),
            unpadded_signature_size: unpadded,
        };
        assert_eq!(
            decode_set(&set(vec![sig(&[1, 2, 0, 0], Some(2)), sig(&[3], None)])).unwrap(),
            [vec![1, 2], vec![3]]
        );
        let e = decode_set(&set(vec![sig(&[1], None), sig(&[1, 2], Some(3))])).unwrap_err();
        assert_eq!(
            e,
            "signature 2: unpadded_signature_size 3 is larger than its 2 bytes"
        );
        assert_eq!(
            decode_set(&set(vec![])).unwrap_err(),
            "the Signatures message holds no signature"
        );
        let mut b = set(vec![sig(&[7; 72], Some(70))]);
        b.truncate(b.len() - 10);
        assert_eq!(
            decode_set(&b).unwrap_err(),
            "the Signatures message does not decode"
        );
    }

    #[test]
    fn without_keys_or_digests_nothing_is_checked() {
        let b = prost::Message::encode_to_vec(&Signatures {
            signatures: vec![crate::proto::Signature {
                version: None,
                data: Some(vec![1; 256]),
                unpadded_signature_size: Some(256),
            }],
        });
        assert_eq!(
            status(Some(b.clone()), &[], Some(&[0; 32])),
            SignatureStatus::NotChecked { signatures: 1 }
        );
        assert_eq!(status(None, &[], None), SignatureStatus::Unsigned);
    }

    #[test]
    fn only_a_verified_payload_signature_passes() {
        let r = |metadata, payload| SignatureReport { metadata, payload };
        let v = || SignatureStatus::Verified {
            signatures: 1,
            signature: 0,
            key: 0,
        };
        assert!(r(v(), v()).require_verified().is_ok());
        assert!(
            r(SignatureStatus::Unsigned, v()).require_verified().is_ok(),
            "the payload signature covers the metadata"
        );
        let e = r(v(), SignatureStatus::Unsigned)
            .require_verified()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the payload signature does not verify: the payload has none"
        );
        let e = r(SignatureStatus::Mismatch { signatures: 2 }, v())
            .require_verified()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the metadata signature does not verify: none of its 2 signatures verifies with the keys given"
        );
    }
}
