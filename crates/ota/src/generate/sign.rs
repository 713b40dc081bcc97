//! Signing keys for generated payloads: RSA (PKCS#1 v1.5 over SHA-256, 2048 to 4096 bits) and
//! ECDSA P-256 (DER signatures), read from PEM or DER private keys (PKCS#8, PKCS#1
//! `RSA PRIVATE KEY`, SEC1 `EC PRIVATE KEY`), as `openssl genpkey`/`genrsa`/`ecparam` write
//! them. The checks are the crate's [`VerifyKey`](crate::VerifyKey)'s.

use prost::Message;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::traits::PublicKeyParts;

use crate::proto::{Signature, Signatures};

/// Largest DER ECDSA P-256 signature: the room each EC signature gets.
const EC_PADDED: usize = 72;

/// Why a signing key cannot be used or a signature made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// Not a private key this generator can use.
    #[error(
        "not an RSA (2048 to 4096 bits) or ECDSA P-256 private key (PEM or DER: PKCS#8, PKCS#1 or SEC1)"
    )]
    NotAKey,
    /// An RSA key outside the accepted sizes.
    #[error("RSA key of {0} bits: 2048 to 4096 bits are accepted")]
    RsaSize(usize),
    /// The signature could not be made.
    #[error("signing")]
    Rsa(#[source] rsa::Error),
    /// The ECDSA signature could not be made.
    #[error("signing")]
    Ecdsa(#[source] p256::ecdsa::Error),
}

/// A private key that signs payloads.
#[derive(Clone)]
pub struct SigningKey {
    key: Key,
}

#[derive(Clone)]
enum Key {
    Rsa(Box<rsa::RsaPrivateKey>),
    Ec(p256::ecdsa::SigningKey),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Key::Rsa(k) => write!(f, "SigningKey(RSA-{})", k.size() * 8),
            Key::Ec(_) => write!(f, "SigningKey(ECDSA P-256)"),
        }
    }
}

impl SigningKey {
    /// Read a private key file's bytes (PEM or DER).
    pub fn parse(bytes: &[u8]) -> Result<SigningKey, SignError> {
        let ders: Vec<Vec<u8>> = match std::str::from_utf8(bytes) {
            Ok(text) if text.contains("-----BEGIN") => crate::keys::pem_blocks(text)
                .into_iter()
                .filter_map(|b| x509_cert::der::Document::from_pem(b).ok())
                .map(|(_, d)| d.as_bytes().to_vec())
                .collect(),
            _ => vec![bytes.to_vec()],
        };
        for der in &ders {
            if let Some(k) = Self::from_der(der)? {
                return Ok(k);
            }
        }
        Err(SignError::NotAKey)
    }

    fn from_der(der: &[u8]) -> Result<Option<SigningKey>, SignError> {
        let rsa = rsa::RsaPrivateKey::from_pkcs8_der(der)
            .ok()
            .or_else(|| rsa::RsaPrivateKey::from_pkcs1_der(der).ok());
        if let Some(k) = rsa {
            let bits = k.size() * 8;
            if !(crate::MIN_RSA_BITS..=crate::MAX_RSA_BITS).contains(&bits) {
                return Err(SignError::RsaSize(bits));
            }
            return Ok(Some(SigningKey {
                key: Key::Rsa(Box::new(k)),
            }));
        }
        let ec = p256::SecretKey::from_pkcs8_der(der)
            .ok()
            .or_else(|| p256::SecretKey::from_sec1_der(der).ok());
        Ok(ec.map(|k| SigningKey {
            key: Key::Ec(p256::ecdsa::SigningKey::from(k)),
        }))
    }

    /// Room a signature of this key gets: the modulus' bytes for RSA, 72 for ECDSA P-256.
    pub fn padded_size(&self) -> usize {
        match &self.key {
            Key::Rsa(k) => k.size(),
            Key::Ec(_) => EC_PADDED,
        }
    }

    /// The signature of a SHA-256 digest: RSASSA-PKCS1-v1_5, or a DER ECDSA signature.
    pub fn sign_digest(&self, digest: &[u8; 32]) -> Result<Vec<u8>, SignError> {
        match &self.key {
            Key::Rsa(k) => k
                .sign(rsa::Pkcs1v15Sign::new::<sha2::Sha256>(), digest)
                .map_err(SignError::Rsa),
            Key::Ec(k) => {
                use p256::ecdsa::signature::hazmat::PrehashSigner;
                let s: p256::ecdsa::Signature = k.sign_prehash(digest).map_err(SignError::Ecdsa)?;
                Ok(s.to_der().as_bytes().to_vec())
            }
        }
    }
}

/// A `Signatures` message: each signature zero-padded to its size in `sizes`, with
/// `unpadded_signature_size` its own length.
pub(crate) fn signature_set(sigs: &[Vec<u8>], sizes: &[usize]) -> Vec<u8> {
    let signatures = sigs
        .iter()
        .zip(sizes)
        .map(|(s, &n)| {
            let mut data = s.clone();
            data.resize(n.max(s.len()), 0);
            Signature {
                version: None,
                data: Some(data),
                unpadded_signature_size: Some(s.len() as u32),
            }
        })
        .collect();
    Signatures { signatures }.encode_to_vec()
}
