use super::*;
use snapblk_testsupport::errors;

#[test]
fn wrapped_causes_are_sources_not_text() {
    let der = || Certificate::from_der(&[0x30, 0x03, 0x02]).unwrap_err();
    errors::assert_cause_is_source(
        &KeyError::Pem {
            index: 1,
            label: "CERTIFICATE".into(),
            source: der(),
        },
        None,
    );
    errors::assert_cause_is_source(&KeyError::NotAKey(der()), None);
    errors::assert_cause_is_source(&KeyError::Certificate(der()), None);
    errors::assert_cause_is_source(&KeyError::PublicKey(der()), None);
    let pkcs1 = rsa::RsaPublicKey::from_pkcs1_der(&[1, 2, 3]).unwrap_err();
    errors::assert_cause_is_source(&KeyError::Rsa(pkcs1), None);
    let one = rsa::BigUint::from(1u8);
    let n = rsa::BigUint::from_bytes_be(&[0xc5; 256]);
    let weak = rsa::RsaPublicKey::new(n, one).unwrap_err();
    errors::assert_cause_is_source(&KeyError::RsaKey(weak), None);
    let point = p256::ecdsa::VerifyingKey::from_sec1_bytes(&[4, 1, 2]).unwrap_err();
    errors::assert_cause_is_source(&KeyError::EcPoint(point), None);
    let zip = zip::ZipArchive::new(std::io::Cursor::new(b"PK\x03\x04junk")).unwrap_err();
    errors::assert_cause_is_source(&KeyError::Zip(zip), None);
    errors::assert_cause_is_source(
        &KeyError::ZipRead {
            name: "a.pem".into(),
            source: std::io::Error::other("disk on fire"),
        },
        Some("disk on fire"),
    );
    let line = errors::assert_cause_is_source(
        &KeyError::ZipEntry {
            name: "a.pem".into(),
            source: Box::new(KeyError::RsaSize { bits: 1024 }),
        },
        None,
    );
    assert_eq!(
        line,
        "a.pem in the zip of certificates: RSA key of 1024 bits: only 2048 to 4096 bits are supported"
    );
}

#[test]
fn pem_blocks_are_cut_at_their_end_lines() {
    let text = "junk\n-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\nmore\n\
                -----BEGIN PUBLIC KEY-----\nBB==\n-----END PUBLIC KEY-----";
    let b = pem_blocks(text);
    assert_eq!(b.len(), 2);
    assert!(b[0].starts_with("-----BEGIN CERTIFICATE") && b[0].ends_with("CERTIFICATE-----"));
    assert_eq!(block_label(b[0]), "CERTIFICATE");
    assert_eq!(block_label(b[1]), "PUBLIC KEY");
    assert!(b[1].ends_with("-----END PUBLIC KEY-----"));
    // An unterminated block goes to the decoder whole.
    let b = pem_blocks("-----BEGIN PUBLIC KEY-----\nAA==\n");
    assert_eq!(b.len(), 1);
    assert!(pem_blocks("no pem here").is_empty());
}

#[test]
fn rsa_sizes_outside_the_range_are_named() {
    // A 8192-bit modulus (the rsa crate would refuse it without saying its size).
    let n = rsa::BigUint::from_bytes_be(&[0xc5; 1024]);
    let e = rsa::BigUint::from(65537u32);
    let der = rsa::pkcs1::RsaPublicKey {
        modulus: rsa::pkcs1::UintRef::new(&n.to_bytes_be()).unwrap(),
        public_exponent: rsa::pkcs1::UintRef::new(&e.to_bytes_be()).unwrap(),
    }
    .to_der()
    .unwrap();
    assert_eq!(rsa_modulus_bits(&der).unwrap(), 8192);
    let spki = SubjectPublicKeyInfoOwned {
        algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: RSA_ENCRYPTION,
            parameters: Some(x509_cert::der::asn1::Null.into()),
        },
        subject_public_key: x509_cert::der::asn1::BitString::from_bytes(&der).unwrap(),
    };
    let e = from_spki(&spki).unwrap_err();
    assert_eq!(
        e.to_string(),
        "RSA key of 8192 bits: only 2048 to 4096 bits are supported"
    );
    // An unknown algorithm is named by its OID.
    let other = SubjectPublicKeyInfoOwned {
        algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: ObjectIdentifier::new_unwrap("1.2.3.4"),
            parameters: None,
        },
        subject_public_key: x509_cert::der::asn1::BitString::from_bytes(&[1]).unwrap(),
    };
    assert_eq!(
        from_spki(&other).unwrap_err().to_string(),
        "OID 1.2.3.4 key: only RSA (PKCS#1 v1.5 signatures) and ECDSA P-256 keys are supported"
    );
}
