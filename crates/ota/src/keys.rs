//! Public keys that check payload signatures: read from an X.509 certificate (what Android's
//! `otacerts.zip` and an OTA's `META-INF/com/android/otacert` hold) or a public key
//! (`SubjectPublicKeyInfo`, as `openssl pkey -pubout` writes it; PKCS#1 `RSA PUBLIC KEY` too),
//! PEM or DER. The algorithms are update_engine's: RSA with PKCS#1 v1.5 padding over SHA-256,
//! and ECDSA; here ECDSA on P-256 only, RSA of 2048 to 4096 bits.

use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::traits::PublicKeyParts;
use sha2::{Digest, Sha256};
use x509_cert::Certificate;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Decode, Encode};
use x509_cert::spki::SubjectPublicKeyInfoOwned;

/// Smallest RSA modulus accepted, in bits.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest RSA modulus accepted, in bits (the `rsa` crate's limit; update_engine's keys are
/// 2048 or 4096 bits).
pub const MAX_RSA_BITS: usize = 4096;

const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const PRIME256V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");

/// Algorithms whose keys are refused by name (anything else by its OID).
const KNOWN: &[(&str, &str)] = &[
    ("1.2.840.113549.1.1.10", "RSA-PSS"),
    ("1.3.101.112", "Ed25519"),
    ("1.3.101.113", "Ed448"),
    ("1.3.101.110", "X25519"),
    ("1.3.101.111", "X448"),
    ("1.2.840.10040.4.1", "DSA"),
    ("1.2.840.10046.2.1", "Diffie-Hellman"),
];
const CURVES: &[(&str, &str)] = &[
    ("1.3.132.0.34", "P-384"),
    ("1.3.132.0.35", "P-521"),
    ("1.3.132.0.10", "secp256k1"),
    ("1.2.840.10045.3.1.1", "P-192"),
    ("1.3.132.0.33", "P-224"),
];

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// A PEM block does not decode.
    #[error("PEM block {index} ({label}) does not decode")]
    Pem {
        /// 1-based index of the block in the file.
        index: usize,
        /// Its label (`CERTIFICATE`, `PUBLIC KEY`, ...).
        label: String,
        /// The cause.
        #[source]
        source: x509_cert::der::Error,
    },
    /// The file has PEM blocks, but none is a certificate or a public key.
    #[error("no CERTIFICATE, PUBLIC KEY or RSA PUBLIC KEY block in the PEM file (found: {labels})")]
    NoKeyBlock {
        /// The labels found, comma-separated.
        labels: String,
    },
    /// A private key was given.
    #[error("PEM block {index} is a private key ({label}); give the certificate or the public key")]
    PrivateKey {
        /// 1-based index of the block.
        index: usize,
        /// Its label.
        label: String,
    },
    /// Not PEM, and neither a DER certificate nor a DER public key.
    #[error("neither PEM nor a DER certificate or public key")]
    NotAKey(#[source] x509_cert::der::Error),
    /// A certificate does not decode.
    #[error("decoding the certificate")]
    Certificate(#[source] x509_cert::der::Error),
    /// A `SubjectPublicKeyInfo` does not decode (or re-encode, for its fingerprint).
    #[error("decoding the public key")]
    PublicKey(#[source] x509_cert::der::Error),
    /// An RSA key's numbers do not decode.
    #[error("decoding the RSA public key")]
    Rsa(#[source] rsa::pkcs1::Error),
    /// An RSA key the verifier refuses (exponent out of range).
    #[error("unusable RSA public key")]
    RsaKey(#[source] rsa::Error),
    /// An RSA modulus outside 2048..=4096 bits.
    #[error("RSA key of {bits} bits: only {MIN_RSA_BITS} to {MAX_RSA_BITS} bits are supported")]
    RsaSize {
        /// Bits of the modulus.
        bits: usize,
    },
    /// An EC key whose point does not decode.
    #[error("decoding the P-256 public point")]
    EcPoint(#[source] p256::ecdsa::Error),
    /// An EC key on another curve than P-256.
    #[error("EC key on curve {curve}: only P-256 (prime256v1) is supported")]
    Curve {
        /// Curve name, or its OID.
        curve: String,
    },
    /// A zip (`otacerts.zip`) whose directory or an entry cannot be read.
    #[error("reading the zip of certificates")]
    Zip(#[source] zip::result::ZipError),
    /// An entry of a zip of certificates is too large or cannot be read.
    #[error("reading {name} from the zip of certificates")]
    ZipRead {
        /// Entry name.
        name: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An entry of a zip of certificates is not a usable key.
    #[error("{name} in the zip of certificates")]
    ZipEntry {
        /// Entry name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: Box<KeyError>,
    },
    /// A zip of certificates without any file.
    #[error("the zip holds no certificate")]
    EmptyZip,
    /// A key of another algorithm.
    #[error(
        "{algorithm} key: only RSA (PKCS#1 v1.5 signatures) and ECDSA P-256 keys are supported"
    )]
    Unsupported {
        /// Algorithm name, or its OID.
        algorithm: String,
    },
}

/// The algorithm of a [`VerifyKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KeyAlgorithm {
    /// RSA, signatures with PKCS#1 v1.5 padding over SHA-256.
    Rsa {
        /// Bits of the modulus.
        bits: usize,
    },
    /// ECDSA on NIST P-256 over SHA-256, signatures DER-encoded.
    EcdsaP256,
}

impl std::fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyAlgorithm::Rsa { bits } => write!(f, "RSA-{bits}"),
            KeyAlgorithm::EcdsaP256 => f.write_str("ECDSA P-256"),
        }
    }
}

#[derive(Clone, Debug)]
enum Inner {
    Rsa(rsa::RsaPublicKey),
    P256(p256::ecdsa::VerifyingKey),
}

/// A public key that checks payload signatures.
#[derive(Clone, Debug)]
pub struct VerifyKey {
    inner: Inner,
    algorithm: KeyAlgorithm,
    spki_sha256: [u8; 32],
}

impl VerifyKey {
    /// Every key in `bytes`: a PEM file (each `CERTIFICATE`, `PUBLIC KEY` and `RSA PUBLIC
    /// KEY` block, in order; text between blocks is ignored), one DER certificate or
    /// `SubjectPublicKeyInfo`, or a zip of such files (Android's `otacerts.zip`: every file
    /// entry, in the zip's order, each at most 1 MiB). A file with a private key, a key of
    /// another algorithm or curve, or an RSA key outside 2048..=4096 bits is refused whole.
    pub fn parse_all(bytes: &[u8]) -> Result<Vec<VerifyKey>, KeyError> {
        if bytes.starts_with(b"PK\x03\x04") {
            return from_zip(bytes);
        }
        parse_file(bytes)
    }

    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// SHA-256 of the key's DER `SubjectPublicKeyInfo` (`openssl pkey -pubin -outform DER |
    /// sha256sum`): names the key in reports.
    pub fn spki_sha256(&self) -> [u8; 32] {
        self.spki_sha256
    }

    /// Whether `signature` is this key's signature of the SHA-256 digest `digest`, as
    /// update_engine checks it: for RSA the PKCS#1 v1.5 encoding of the digest (DigestInfo
    /// with SHA-256's OID), the signature as long as the modulus; for ECDSA a strict DER
    /// `ECDSA-Sig-Value` with no trailing bytes (a high or a low `s` alike, as OpenSSL and
    /// BoringSSL accept).
    pub fn verify_sha256(&self, digest: &[u8; 32], signature: &[u8]) -> bool {
        match &self.inner {
            Inner::Rsa(k) => k
                .verify(rsa::Pkcs1v15Sign::new::<Sha256>(), digest, signature)
                .is_ok(),
            Inner::P256(k) => {
                use p256::ecdsa::signature::hazmat::PrehashVerifier;
                p256::ecdsa::Signature::from_der(signature)
                    .is_ok_and(|s| k.verify_prehash(digest, &s).is_ok())
            }
        }
    }
}

/// The keys of one file: PEM blocks, or one DER certificate or public key.
fn parse_file(bytes: &[u8]) -> Result<Vec<VerifyKey>, KeyError> {
    let text = std::str::from_utf8(bytes).ok();
    let Some(blocks) = text.map(pem_blocks).filter(|b| !b.is_empty()) else {
        return Ok(vec![from_der(bytes)?]);
    };
    let mut keys = Vec::new();
    let mut labels = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let index = i + 1;
        let label = block_label(block);
        if label.contains("PRIVATE KEY") {
            return Err(KeyError::PrivateKey {
                index,
                label: label.into(),
            });
        }
        if !matches!(label, "CERTIFICATE" | "PUBLIC KEY" | "RSA PUBLIC KEY") {
            labels.push(label.to_string());
            continue;
        }
        let (_, doc) =
            x509_cert::der::Document::from_pem(block).map_err(|source| KeyError::Pem {
                index,
                label: label.into(),
                source,
            })?;
        let der = doc.as_bytes();
        keys.push(match label {
            "CERTIFICATE" => from_certificate(der)?,
            "PUBLIC KEY" => from_spki_der(der)?,
            _ => from_pkcs1(der)?,
        });
    }
    if keys.is_empty() {
        return Err(KeyError::NoKeyBlock {
            labels: labels.join(", "),
        });
    }
    Ok(keys)
}

/// Largest entry of a zip of certificates read (a certificate is a few KiB).
const MAX_ZIP_ENTRY: u64 = 1 << 20;

/// Every key of every file entry of a zip (`otacerts.zip`).
fn from_zip(bytes: &[u8]) -> Result<Vec<VerifyKey>, KeyError> {
    use std::io::Read;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(KeyError::Zip)?;
    let mut keys = Vec::new();
    for i in 0..zip.len() {
        let e = zip.by_index(i).map_err(KeyError::Zip)?;
        if e.is_dir() {
            continue;
        }
        let name = e.name().map_err(KeyError::Zip)?.to_string();
        let mut buf = Vec::new();
        let read = |source| KeyError::ZipRead {
            name: name.clone(),
            source,
        };
        e.take(MAX_ZIP_ENTRY + 1)
            .read_to_end(&mut buf)
            .map_err(read)?;
        if buf.len() as u64 > MAX_ZIP_ENTRY {
            return Err(read(std::io::Error::other(format!(
                "larger than {MAX_ZIP_ENTRY} bytes"
            ))));
        }
        let found = parse_file(&buf).map_err(|e| KeyError::ZipEntry {
            name: name.clone(),
            source: Box::new(e),
        })?;
        keys.extend(found);
    }
    if keys.is_empty() {
        return Err(KeyError::EmptyZip);
    }
    Ok(keys)
}

/// The PEM blocks of `text`: each from a `-----BEGIN ` line to its `-----END ...-----`.
pub(crate) fn pem_blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(b) = rest.find("-----BEGIN ") {
        let from = &rest[b..];
        let Some(e) = from.find("-----END ") else {
            // An unterminated block: hand it to the decoder, which says what is wrong.
            out.push(from);
            break;
        };
        let tail = &from[e + 9..];
        let end = tail.find("-----").map_or(from.len(), |i| e + 9 + i + 5);
        out.push(&from[..end]);
        rest = &from[end..];
    }
    out
}

/// The label of a PEM block (`CERTIFICATE` of `-----BEGIN CERTIFICATE-----`).
fn block_label(block: &str) -> &str {
    let s = &block["-----BEGIN ".len()..];
    s.find("-----").map_or(s, |i| &s[..i]).trim()
}

/// A DER certificate, or else a DER `SubjectPublicKeyInfo`.
fn from_der(der: &[u8]) -> Result<VerifyKey, KeyError> {
    if Certificate::from_der(der).is_ok() {
        return from_certificate(der);
    }
    let spki = SubjectPublicKeyInfoOwned::from_der(der).map_err(KeyError::NotAKey)?;
    from_spki(&spki)
}

fn from_certificate(der: &[u8]) -> Result<VerifyKey, KeyError> {
    let cert = Certificate::from_der(der).map_err(KeyError::Certificate)?;
    from_spki(&cert.tbs_certificate.subject_public_key_info)
}

fn from_spki_der(der: &[u8]) -> Result<VerifyKey, KeyError> {
    from_spki(&SubjectPublicKeyInfoOwned::from_der(der).map_err(KeyError::PublicKey)?)
}

/// A PKCS#1 `RSAPublicKey`: wrapped in a `SubjectPublicKeyInfo` for its fingerprint.
fn from_pkcs1(der: &[u8]) -> Result<VerifyKey, KeyError> {
    let key = rsa::RsaPublicKey::from_pkcs1_der(der).map_err(KeyError::Rsa)?;
    let spki = SubjectPublicKeyInfoOwned {
        algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: RSA_ENCRYPTION,
            parameters: Some(x509_cert::der::asn1::Null.into()),
        },
        subject_public_key: x509_cert::der::asn1::BitString::from_bytes(der)
            .map_err(KeyError::PublicKey)?,
    };
    rsa_key(key, &spki)
}

fn fingerprint(spki: &SubjectPublicKeyInfoOwned) -> Result<[u8; 32], KeyError> {
    let der = spki.to_der().map_err(KeyError::PublicKey)?;
    Ok(Sha256::digest(der).into())
}

fn rsa_key(
    key: rsa::RsaPublicKey,
    spki: &SubjectPublicKeyInfoOwned,
) -> Result<VerifyKey, KeyError> {
    let bits = key.n().bits();
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(KeyError::RsaSize { bits });
    }
    Ok(VerifyKey {
        inner: Inner::Rsa(key),
        algorithm: KeyAlgorithm::Rsa { bits },
        spki_sha256: fingerprint(spki)?,
    })
}

fn from_spki(spki: &SubjectPublicKeyInfoOwned) -> Result<VerifyKey, KeyError> {
    let oid = spki.algorithm.oid;
    let point = spki.subject_public_key.raw_bytes();
    if oid == RSA_ENCRYPTION {
        let n = rsa_modulus_bits(point)?;
        if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&n) {
            return Err(KeyError::RsaSize { bits: n });
        }
        let key = rsa::RsaPublicKey::from_pkcs1_der(point).map_err(KeyError::Rsa)?;
        return rsa_key(key, spki);
    }
    if oid == EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
        if curve != Some(PRIME256V1) {
            let curve = curve.map_or("(not named)".to_string(), |c| name(CURVES, c));
            return Err(KeyError::Curve { curve });
        }
        let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(KeyError::EcPoint)?;
        return Ok(VerifyKey {
            inner: Inner::P256(key),
            algorithm: KeyAlgorithm::EcdsaP256,
            spki_sha256: fingerprint(spki)?,
        });
    }
    Err(KeyError::Unsupported {
        algorithm: name(KNOWN, oid),
    })
}

/// Bits of the modulus of a PKCS#1 `RSAPublicKey`, read before the key is built (the `rsa`
/// crate refuses moduli over 4096 bits without saying their size).
fn rsa_modulus_bits(der: &[u8]) -> Result<usize, KeyError> {
    let k = rsa::pkcs1::RsaPublicKey::from_der(der).map_err(|e| KeyError::Rsa(e.into()))?;
    let m = k.modulus.as_bytes();
    Ok(m.first()
        .map_or(0, |b| m.len() * 8 - b.leading_zeros() as usize))
}

/// `"Ed25519 (1.3.101.112)"`, or the bare OID when it is not in `table`.
fn name(table: &[(&str, &str)], oid: ObjectIdentifier) -> String {
    let s = oid.to_string();
    match table.iter().find(|(o, _)| *o == s) {
        Some((_, n)) => format!("{n} ({s})"),
        None => format!("OID {s}"),
    }
}

#[cfg(test)]
mod tests;
