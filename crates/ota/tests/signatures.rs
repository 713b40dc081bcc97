//! Payload and metadata signatures made by an independent signer: the `openssl` CLI makes RSA
//! (2048, 3072, 4096 bits) and EC P-256 keys and self-signed certificates, and signs the byte
//! ranges update_engine's format says each signature covers (the test cuts them from the
//! payload itself; OpenSSL hashes them); the payload writer lays the payload out in
//! delta_generator's two passes (placeholder signatures of the final sizes, then the real ones).
//! The verifier must accept them with the right key, whatever form the key file takes, and
//! refuse another key, a flipped bit in the signed bytes or in a signature, truncated blobs
//! and keys of unsupported kinds.

use std::path::Path;

use snapblk_ota::testing::{Built, Encoding, PayloadBuilder, Unsigned, extract_to_memory};
use snapblk_ota::{
    KeyAlgorithm, KeyError, OtaError, Payload, SignatureReport, SignatureStatus, VerifyKey,
};
use snapblk_testsupport::openssl::{self, Key};
use snapblk_testsupport::{TempDir, path_str, pattern, tool_ok};

/// Padded signature size for a key: the modulus' bytes for RSA, 72 (the largest DER
/// signature) for P-256, as delta_generator's `EVP_PKEY_size`.
fn padded(spec: &str) -> usize {
    match spec.split_once(':') {
        Some(("rsa", bits)) => bits.parse::<usize>().unwrap() / 8,
        Some(("ec", "P-256")) => 72,
        _ => panic!("{spec}"),
    }
}

fn built() -> Built {
    let mut sys = pattern(3 * 4096 + 100, 7);
    sys[4096..8192].fill(0);
    PayloadBuilder::new()
        .partition("system", &sys, 1, &[Encoding::Xz, Encoding::Replace])
        .partition("vendor", &pattern(8192, 9), 2, &[Encoding::Bz])
        .build()
}

/// `built()` signed by `keys` (private key files, with their specs), one signature each,
/// with a metadata signature when `metadata`.
fn signed(dir: &Path, keys: &[(&Path, &str)], metadata: bool) -> (Unsigned, Vec<u8>) {
    let sizes: Vec<usize> = keys.iter().map(|(_, s)| padded(s)).collect();
    let u = built().unsigned(&sizes, metadata);
    // The metadata by `pkeyutl` over OpenSSL's digest, the payload by `dgst -sign`.
    let (meta, payload) = u.messages();
    let m: Vec<Vec<u8>> = keys
        .iter()
        .map(|(k, _)| openssl::sign_digest(dir, k, &meta))
        .collect();
    let p: Vec<Vec<u8>> = keys
        .iter()
        .map(|(k, _)| openssl::sign(dir, k, &payload))
        .collect();
    let bytes = u.fill(if metadata { &m } else { &[] }, &p);
    (u, bytes)
}

fn load(path: &Path) -> Vec<VerifyKey> {
    VerifyKey::parse_all(&std::fs::read(path).unwrap()).unwrap()
}

fn check(bytes: &[u8], keys: &[VerifyKey]) -> SignatureReport {
    let p = Payload::from_bytes(bytes.to_vec()).unwrap();
    let d = p.signature_digests(true, &mut |_| {}).unwrap();
    assert_eq!(d.file, Some(sha256(bytes)));
    p.verify_signatures(keys, Some(&d)).unwrap()
}

fn sha256(b: &[u8]) -> [u8; 32] {
    snapblk_ota::testing::sha256(b).try_into().unwrap()
}

fn verified(signatures: usize, signature: usize, key: usize) -> SignatureStatus {
    SignatureStatus::Verified {
        signatures,
        signature,
        key,
    }
}

#[test]
fn openssl_signatures_verify_with_the_key_in_every_form() {
    let d = TempDir::new("ota-sig");
    for (name, spec, bits) in [
        ("rsa2048", "rsa:2048", Some(2048)),
        ("rsa3072", "rsa:3072", Some(3072)),
        ("rsa4096", "rsa:4096", Some(4096)),
        ("p256", "ec:P-256", None),
    ] {
        let k = openssl::key(d.path(), name, spec);
        let (_, bytes) = signed(d.path(), &[(&k.private, spec)], true);
        let fp = tool_ok(
            "sh",
            &["-c", &format!("sha256sum < {}", path_str(&k.public_der))],
        );
        for file in [&k.cert_pem, &k.cert_der, &k.public_pem, &k.public_der] {
            let keys = load(file);
            assert_eq!(keys.len(), 1, "{file:?}");
            let alg = match bits {
                Some(bits) => KeyAlgorithm::Rsa { bits },
                None => KeyAlgorithm::EcdsaP256,
            };
            assert_eq!(keys[0].algorithm(), alg, "{file:?}");
            assert!(fp.starts_with(&snapblk_ota::hex(&keys[0].spki_sha256())));
            let r = check(&bytes, &keys);
            assert_eq!(r.metadata, verified(1, 0, 0), "{name} {file:?}");
            assert_eq!(r.payload, verified(1, 0, 0), "{name} {file:?}");
            r.require_verified().unwrap();
        }
        // The signature blob changes nothing else: the payload extracts as before.
        let p = Payload::from_bytes(bytes.clone()).unwrap();
        let plain = Payload::from_bytes(built().to_bytes()).unwrap();
        assert_eq!(
            extract_to_memory(&p, None, 2).unwrap(),
            extract_to_memory(&plain, None, 2).unwrap()
        );
        // Without keys: present, not checked.
        let r = p.signature_status().unwrap();
        assert_eq!(r.payload, SignatureStatus::NotChecked { signatures: 1 });
        assert_eq!(r.metadata, SignatureStatus::NotChecked { signatures: 1 });
        assert!(r.is_signed());
        let e = r.require_verified().unwrap_err();
        assert_eq!(
            e.to_string(),
            "the payload signature does not verify: no key was given"
        );
    }
}

#[test]
fn a_set_passes_when_one_signature_verifies_with_one_key() {
    let d = TempDir::new("ota-sig");
    let rsa = openssl::key(d.path(), "rsa", "rsa:2048");
    let ec = openssl::key(d.path(), "ec", "ec:P-256");
    let other = openssl::key(d.path(), "other", "rsa:2048");
    let (_, bytes) = signed(
        d.path(),
        &[(&rsa.private, "rsa:2048"), (&ec.private, "ec:P-256")],
        true,
    );
    let r = check(&bytes, &load(&ec.cert_pem));
    assert_eq!(r.payload, verified(2, 1, 0));
    assert_eq!(r.metadata, verified(2, 1, 0));
    let keys: Vec<VerifyKey> = [&other.cert_pem, &rsa.public_pem]
        .iter()
        .flat_map(|p| load(p))
        .collect();
    let r = check(&bytes, &keys);
    assert_eq!(r.payload, verified(2, 0, 1));
    // Both certificates in one PEM file (text between the blocks is ignored): two keys.
    let both = d.join("both.pem");
    let text = format!(
        "other:\n{}\nsigner:\n{}",
        std::fs::read_to_string(&other.cert_pem).unwrap(),
        std::fs::read_to_string(&ec.public_pem).unwrap()
    );
    std::fs::write(&both, text).unwrap();
    let keys = load(&both);
    assert_eq!(keys.len(), 2);
    assert_eq!(check(&bytes, &keys).payload, verified(2, 1, 1));
    // A zip of certificates, as Android's /system/etc/security/otacerts.zip (Info-ZIP's zip,
    // deflated): every entry's keys, in order.
    let zip = d.join("otacerts.zip");
    let (a, b) = (d.join("a.x509.pem"), d.join("b.x509.pem"));
    std::fs::copy(&other.cert_pem, &a).unwrap();
    std::fs::copy(&ec.cert_pem, &b).unwrap();
    tool_ok(
        "zip",
        &["-j", "-q", path_str(&zip), path_str(&a), path_str(&b)],
    );
    let keys = load(&zip);
    assert_eq!(keys.len(), 2);
    assert_eq!(check(&bytes, &keys).payload, verified(2, 1, 1));
    let junk = d.join("README");
    std::fs::write(&junk, "not a certificate").unwrap();
    tool_ok("zip", &["-j", "-q", path_str(&zip), path_str(&junk)]);
    let e = VerifyKey::parse_all(&std::fs::read(&zip).unwrap()).unwrap_err();
    assert!(
        matches!(&e, KeyError::ZipEntry { name, .. } if name == "README"),
        "{e}"
    );
    // A payload without a metadata signature: the payload signature alone is enough.
    let (_, bytes) = signed(d.path(), &[(&rsa.private, "rsa:2048")], false);
    let r = check(&bytes, &load(&rsa.cert_pem));
    assert_eq!(r.metadata, SignatureStatus::Unsigned);
    assert_eq!(r.payload, verified(1, 0, 0));
    r.require_verified().unwrap();
}

#[test]
fn another_key_or_a_flipped_bit_is_a_mismatch() {
    let d = TempDir::new("ota-sig");
    for spec in ["rsa:2048", "ec:P-256"] {
        let k = openssl::key(d.path(), "k", spec);
        let other = openssl::key(d.path(), "o", spec);
        let (u, bytes) = signed(d.path(), &[(&k.private, spec)], true);
        let keys = load(&k.cert_pem);
        let mismatch = SignatureStatus::Mismatch { signatures: 1 };
        // Another key of the same kind.
        let r = check(&bytes, &load(&other.cert_pem));
        assert_eq!((&r.metadata, &r.payload), (&mismatch, &mismatch), "{spec}");
        let e = r.require_verified().unwrap_err();
        assert!(
            matches!(
                e,
                OtaError::NotAuthentic {
                    which: "payload",
                    ..
                }
            ),
            "{e}"
        );
        // A bit of a data blob: the payload signature fails, the metadata one still holds.
        let ds = u.data_start();
        let mut b = bytes.clone();
        b[ds + 10] ^= 0x10;
        let r = check(&b, &keys);
        assert_eq!((&r.metadata, &r.payload), (&verified(1, 0, 0), &mismatch));
        assert!(r.require_verified().is_err());
        // A bit of the manifest (a partition name): both fail.
        let mut b = bytes.clone();
        let at = b.windows(6).position(|w| w == b"vendor").unwrap();
        b[at] ^= 1;
        let r = check(&b, &keys);
        assert_eq!((&r.metadata, &r.payload), (&mismatch, &mismatch));
        // A bit of the payload signature's own bytes, and of the metadata signature's (each
        // blob ends with its signature's data, then the 5 bytes of unpadded_signature_size).
        let sig_data = |end: usize| end - 5 - padded(spec);
        let mut b = bytes.clone();
        let at = sig_data(b.len()) + 20;
        b[at] ^= 0x01;
        let r = check(&b, &keys);
        assert_eq!((&r.metadata, &r.payload), (&verified(1, 0, 0), &mismatch));
        let mut b = bytes.clone();
        b[sig_data(ds) + 20] ^= 0x80;
        let r = check(&b, &keys);
        assert_eq!((&r.metadata, &r.payload), (&mismatch, &verified(1, 0, 0)));
        let e = r.require_verified().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the metadata signature does not verify"),
            "{e}"
        );
    }
}

#[test]
fn ec_padding_is_ignored_and_high_s_accepted() {
    use p256::ecdsa::Signature;
    let d = TempDir::new("ota-sig");
    let k = openssl::key(d.path(), "ec", "ec:P-256");
    let keys = load(&k.public_pem);
    let u = built().unsigned(&[72], true);
    let (meta, payload) = u.messages();
    let m = openssl::sign(d.path(), &k.private, &meta);
    let p = openssl::sign(d.path(), &k.private, &payload);
    // Both forms of s verify, as OpenSSL's and BoringSSL's ECDSA_verify accept them.
    let flip = |der: &[u8]| {
        let s = Signature::from_der(der).unwrap();
        let (r, sv) = s.split_scalars();
        Signature::from_scalars(r.to_bytes(), (-*sv).to_bytes())
            .unwrap()
            .to_der()
            .as_bytes()
            .to_vec()
    };
    for (m, p) in [(m.clone(), p.clone()), (flip(&m), flip(&p))] {
        let r = check(&u.fill(&[m], &[p]), &keys);
        assert_eq!(r.payload, verified(1, 0, 0));
        assert_eq!(r.metadata, verified(1, 0, 0));
    }
    // A zero byte of padding counted as part of the DER signature (unpadded_signature_size
    // one more than its length; room for 73 bytes so that there always is one): trailing
    // bytes, which a strict DER parser refuses.
    let u = built().unsigned(&[73], true);
    let (meta, payload) = u.messages();
    let m = openssl::sign(d.path(), &k.private, &meta);
    let p = openssl::sign(d.path(), &k.private, &payload);
    let mut b = u.fill(&[m], std::slice::from_ref(&p));
    assert_eq!(check(&b, &keys).payload, verified(1, 0, 0));
    // Bytes of the padding past unpadded_signature_size are not part of the signature (the
    // blob ends with the padded data, then the 5 bytes of unpadded_signature_size).
    let n = b.len();
    b[n - 6] = 0x55;
    assert_eq!(check(&b, &keys).payload, verified(1, 0, 0));
    let set = snapblk_ota::testing::signature_set(std::slice::from_ref(&p), &[73]);
    let mut msg: snapblk_ota::Signatures = prost::Message::decode(set.as_slice()).unwrap();
    msg.signatures[0].unpadded_signature_size = Some(p.len() as u32 + 1);
    let blob = prost::Message::encode_to_vec(&msg);
    let at = b.len() - blob.len();
    b[at..].copy_from_slice(&blob);
    assert_eq!(
        check(&b, &keys).payload,
        SignatureStatus::Mismatch { signatures: 1 }
    );
}

/// The payload status of `b` with its manifest replaced by `manifest` (the signatures no
/// longer cover it: only the blob's own form matters to the caller).
fn rebuilt_check(
    b: &[u8],
    manifest: &snapblk_ota::DeltaArchiveManifest,
    keys: &[VerifyKey],
) -> SignatureStatus {
    let m = u64::from_be_bytes(b[12..20].try_into().unwrap()) as usize;
    let enc = prost::Message::encode_to_vec(manifest);
    let mut out = b[..12].to_vec();
    out.extend_from_slice(&(enc.len() as u64).to_be_bytes());
    out.extend_from_slice(&b[20..24]);
    out.extend_from_slice(&enc);
    out.extend_from_slice(&b[24 + m..]);
    check(&out, keys).payload
}

#[test]
fn truncated_or_malformed_blobs_are_refused() {
    let d = TempDir::new("ota-sig");
    let k = openssl::key(d.path(), "rsa", "rsa:2048");
    let (_, bytes) = signed(d.path(), &[(&k.private, "rsa:2048")], true);
    let keys = load(&k.cert_pem);
    // The file cut inside the payload signature blob: refused when opened.
    let e = Payload::from_bytes(bytes[..bytes.len() - 9].to_vec()).unwrap_err();
    assert!(
        matches!(
            e,
            OtaError::PastEnd {
                what: "payload signature",
                ..
            }
        ),
        "{e}"
    );
    // The manifest naming a shorter blob: the message does not decode.
    let mut manifest = Payload::from_bytes(bytes.clone())
        .unwrap()
        .manifest()
        .clone();
    manifest.signatures_size = Some(manifest.signatures_size.unwrap() - 9);
    assert_eq!(
        rebuilt_check(&bytes, &manifest, &keys),
        SignatureStatus::Malformed {
            problem: "the Signatures message does not decode".into()
        }
    );
    // Unsigned payloads: nothing to verify, and `require_verified` says so.
    let r = check(&built().to_bytes(), &keys);
    assert_eq!(r.payload, SignatureStatus::Unsigned);
    assert_eq!(r.metadata, SignatureStatus::Unsigned);
    assert!(!r.is_signed());
    assert_eq!(
        r.require_verified().unwrap_err().to_string(),
        "the payload signature does not verify: the payload has none"
    );
}

#[test]
fn blobs_after_the_payload_signature_are_refused() {
    // Every blob must lie before the payload signature blob, inside the bytes it signs (as
    // update_engine reads them): a manifest naming the signature blob at the start of the
    // data area leaves the blobs after it, and the plans refuse the first one.
    let mut b = built();
    b.manifest.signatures_offset = Some(0);
    b.manifest.signatures_size = Some(10);
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    for e in [
        p.plan_extract(None).map(|_| ()).unwrap_err(),
        p.plan_apply(None, false).map(|_| ()).unwrap_err(),
    ] {
        assert_eq!(
            snapblk_core::Chain(&e).to_string(),
            "partition system, op 0: data blob at 0+".to_string()
                + &b.manifest.partitions[0].operations[0]
                    .data_length()
                    .to_string()
                + " runs past the payload signature blob at 0 of the data area"
        );
    }
    // The last blob running 10 bytes into the signature blob: refused too.
    b.manifest.signatures_offset = Some(b.data.len() as u64 - 10);
    b.manifest.signatures_size = Some(10);
    let p = Payload::from_bytes(b.to_bytes()).unwrap();
    let e = p.plan_extract(None).map(|_| ()).unwrap_err();
    assert!(e.to_string().starts_with("partition vendor, op "), "{e}");
    // Blobs that end where the signature blob starts (the generator's layout) are fine.
    let u = built().unsigned(&[256], false);
    let p = Payload::from_bytes(u.bytes).unwrap();
    p.plan_extract(None).unwrap();
}

#[test]
fn unsupported_keys_are_refused_by_name() {
    let d = TempDir::new("ota-sig");
    let err = |p: &Path| VerifyKey::parse_all(&std::fs::read(p).unwrap()).unwrap_err();
    let ed = openssl::key(d.path(), "ed", "ed25519");
    for f in [&ed.cert_pem, &ed.public_pem, &ed.cert_der] {
        let e = err(f);
        assert_eq!(
            e.to_string(),
            "Ed25519 (1.3.101.112) key: only RSA (PKCS#1 v1.5 signatures) and ECDSA P-256 keys are supported"
        );
    }
    let pss = openssl::key(d.path(), "pss", "rsa-pss:2048");
    assert!(
        matches!(err(&pss.cert_pem), KeyError::Unsupported { algorithm } if algorithm == "RSA-PSS (1.2.840.113549.1.1.10)")
    );
    let p384 = openssl::key(d.path(), "p384", "ec:P-384");
    assert_eq!(
        err(&p384.cert_pem).to_string(),
        "EC key on curve P-384 (1.3.132.0.34): only P-256 (prime256v1) is supported"
    );
    let small = openssl::key(d.path(), "small", "rsa:1024");
    assert_eq!(
        err(&small.public_pem).to_string(),
        "RSA key of 1024 bits: only 2048 to 4096 bits are supported"
    );
    let e = err(&small.private);
    assert!(
        matches!(&e, KeyError::PrivateKey { index: 1, label } if label == "PRIVATE KEY"),
        "{e}"
    );
    let junk = d.join("junk");
    std::fs::write(&junk, b"not a key at all").unwrap();
    assert!(matches!(err(&junk), KeyError::NotAKey(_)));
    std::fs::write(
        &junk,
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    assert!(matches!(err(&junk), KeyError::Pem { index: 1, .. }));
    // PKCS#1 "RSA PUBLIC KEY": the same key, the same fingerprint as its SPKI form.
    let rsa = openssl::key(d.path(), "rsa", "rsa:2048");
    let pkcs1 = d.join("rsa.pkcs1.pem");
    tool_ok(
        "openssl",
        &[
            "rsa",
            "-in",
            path_str(&rsa.private),
            "-RSAPublicKey_out",
            "-out",
            path_str(&pkcs1),
        ],
    );
    assert!(
        std::fs::read_to_string(&pkcs1)
            .unwrap()
            .starts_with("-----BEGIN RSA PUBLIC KEY-----")
    );
    assert_eq!(
        load(&pkcs1)[0].spki_sha256(),
        load(&rsa.cert_der)[0].spki_sha256()
    );
}

#[test]
fn key_helper_makes_what_it_says() {
    // The openssl helper's certificates are X.509 PEM and DER of the key they name.
    let d = TempDir::new("ota-sig");
    let k: Key = openssl::key(d.path(), "rsa", "rsa:2048");
    let text = tool_ok(
        "openssl",
        &[
            "x509",
            "-in",
            path_str(&k.cert_der),
            "-inform",
            "DER",
            "-noout",
            "-text",
        ],
    );
    assert!(
        text.contains("rsaEncryption") && text.contains("2048 bit"),
        "{text}"
    );
}
