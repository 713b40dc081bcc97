//! Keys, certificates and signatures made by the `openssl` command-line tool (OpenSSL 3): the
//! independent signer of the OTA signature tests. Files go into a directory the caller owns.

use std::path::{Path, PathBuf};

use crate::{path_str, tool_ok};

/// A key pair made by `openssl genpkey`, with its public key and a self-signed certificate,
/// each in PEM and DER.
#[derive(Clone, Debug)]
pub struct Key {
    /// The private key (PEM, PKCS#8).
    pub private: PathBuf,
    /// `SubjectPublicKeyInfo`, PEM (`openssl pkey -pubout`).
    pub public_pem: PathBuf,
    /// `SubjectPublicKeyInfo`, DER.
    pub public_der: PathBuf,
    /// Self-signed X.509 certificate, PEM (`openssl req -x509`).
    pub cert_pem: PathBuf,
    /// The certificate, DER.
    pub cert_der: PathBuf,
}

/// `genpkey` arguments for `spec`: `rsa:BITS`, `rsa-pss:BITS`, `ec:CURVE` (e.g. `ec:P-256`),
/// `ed25519`.
fn genpkey_args(spec: &str) -> Vec<String> {
    let (alg, arg) = spec.split_once(':').unwrap_or((spec, ""));
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect();
    match alg {
        "rsa" => v(&[
            "-algorithm",
            "RSA",
            "-pkeyopt",
            &format!("rsa_keygen_bits:{arg}"),
        ]),
        "rsa-pss" => v(&[
            "-algorithm",
            "RSA-PSS",
            "-pkeyopt",
            &format!("rsa_keygen_bits:{arg}"),
        ]),
        "ec" => v(&[
            "-algorithm",
            "EC",
            "-pkeyopt",
            &format!("ec_paramgen_curve:{arg}"),
        ]),
        "ed25519" => v(&["-algorithm", "ED25519"]),
        _ => panic!("unknown key spec {spec}"),
    }
}

/// Make key `name` in `dir` as `spec` says (`rsa:BITS`, `rsa-pss:BITS`, `ec:CURVE` such as
/// `ec:P-256`, `ed25519`): `NAME.key`, `NAME.pub.pem`, `NAME.pub.der`, `NAME.crt.pem`,
/// `NAME.crt.der`.
pub fn key(dir: &Path, name: &str, spec: &str) -> Key {
    let p = |ext: &str| dir.join(format!("{name}.{ext}"));
    let k = Key {
        private: p("key"),
        public_pem: p("pub.pem"),
        public_der: p("pub.der"),
        cert_pem: p("crt.pem"),
        cert_der: p("crt.der"),
    };
    let mut args = vec!["genpkey".to_string()];
    args.extend(genpkey_args(spec));
    args.extend(["-out".into(), path_str(&k.private).into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tool_ok("openssl", &args);
    let key = path_str(&k.private);
    tool_ok(
        "openssl",
        &[
            "pkey",
            "-in",
            key,
            "-pubout",
            "-out",
            path_str(&k.public_pem),
        ],
    );
    let der = [
        "-pubout",
        "-outform",
        "DER",
        "-out",
        path_str(&k.public_der),
    ];
    tool_ok("openssl", &[&["pkey", "-in", key][..], &der].concat());
    let subj = format!("/CN=snapblk test {name}");
    tool_ok(
        "openssl",
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            key,
            "-subj",
            &subj,
            "-days",
            "2",
            "-out",
            path_str(&k.cert_pem),
        ],
    );
    tool_ok(
        "openssl",
        &[
            "x509",
            "-in",
            path_str(&k.cert_pem),
            "-outform",
            "DER",
            "-out",
            path_str(&k.cert_der),
        ],
    );
    k
}

/// `openssl dgst -sha256 -sign KEY` of `message` (OpenSSL hashes it): PKCS#1 v1.5 for an RSA
/// key, a DER ECDSA signature for an EC key.
pub fn sign(dir: &Path, key: &Path, message: &[u8]) -> Vec<u8> {
    let (m, s) = (dir.join("message"), dir.join("signature"));
    std::fs::write(&m, message).unwrap();
    tool_ok(
        "openssl",
        &[
            "dgst",
            "-sha256",
            "-sign",
            path_str(key),
            "-out",
            path_str(&s),
            path_str(&m),
        ],
    );
    std::fs::read(&s).unwrap()
}

/// The same signature made the other way: `openssl dgst -sha256 -binary` hashes `message`,
/// then `openssl pkeyutl -sign -pkeyopt digest:sha256` signs that digest.
pub fn sign_digest(dir: &Path, key: &Path, message: &[u8]) -> Vec<u8> {
    let (m, h, s) = (
        dir.join("message"),
        dir.join("digest"),
        dir.join("signature"),
    );
    std::fs::write(&m, message).unwrap();
    tool_ok(
        "openssl",
        &[
            "dgst",
            "-sha256",
            "-binary",
            "-out",
            path_str(&h),
            path_str(&m),
        ],
    );
    tool_ok(
        "openssl",
        &[
            "pkeyutl",
            "-sign",
            "-inkey",
            path_str(key),
            "-pkeyopt",
            "digest:sha256",
            "-in",
            path_str(&h),
            "-out",
            path_str(&s),
        ],
    );
    std::fs::read(&s).unwrap()
}
