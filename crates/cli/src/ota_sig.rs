//! `--key` of `snapblk ota info | extract | apply`: the keys given, the signature check (one
//! read of the payload, which also gives FILE_HASH), and how its result is printed.

use std::path::PathBuf;

use anyhow::{Context, Result};
use snapblk_ota::{Digests, Ota, SignatureReport, SignatureStatus, VerifyKey};

use crate::progress::Progress;

/// The keys of every `--key FILE`, in order (a PEM file may hold several).
pub struct Keys(Vec<(PathBuf, VerifyKey)>);

impl Keys {
    /// Read and parse every file; a file that is not a usable key is the command's error.
    pub fn load(files: &[PathBuf]) -> Result<Keys> {
        let mut keys = Vec::new();
        for f in files {
            let bytes = std::fs::read(f).with_context(|| format!("--key {}", f.display()))?;
            let parsed =
                VerifyKey::parse_all(&bytes).with_context(|| format!("--key {}", f.display()))?;
            keys.extend(parsed.into_iter().map(|k| (f.clone(), k)));
        }
        Ok(Keys(keys))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn keys(&self) -> Vec<VerifyKey> {
        self.0.iter().map(|(_, k)| k.clone()).collect()
    }

    /// `FILE (RSA-2048, sha256 0123456789abcdef…)` of key `i`.
    fn name(&self, i: usize) -> String {
        match self.0.get(i) {
            Some((f, k)) => format!(
                "{} ({}, key sha256 {}…)",
                f.display(),
                k.algorithm(),
                &snapblk_ota::hex(&k.spki_sha256())[..16]
            ),
            None => format!("key {i}"),
        }
    }

    /// The keys, for `--json`: file, algorithm and SHA-256 of the `SubjectPublicKeyInfo`.
    pub fn json(&self) -> serde_json::Value {
        self.0
            .iter()
            .map(|(f, k)| {
                serde_json::json!({
                    "file": f,
                    "algorithm": k.algorithm(),
                    "spki_sha256": snapblk_ota::hex(&k.spki_sha256()),
                })
            })
            .collect()
    }
}

/// The signatures' state: checked with `keys` (one read of the payload up to its signature
/// blob, or all of it with `file`, whose SHA-256 is then returned too), or, without keys, only
/// described (reads the two signature blobs).
pub fn check(ota: &Ota, keys: &Keys, file: bool) -> Result<(SignatureReport, Option<[u8; 32]>)> {
    let payload = ota.payload();
    if keys.is_empty() {
        return Ok((payload.signature_status()?, None));
    }
    let len = if file {
        payload.len()
    } else {
        payload
            .signatures_range()
            .map_or(payload.metadata_size(), |(at, _)| at)
    };
    let bar = Progress::bytes(len, "check signature");
    let digests: snapblk_ota::Result<Digests> =
        payload.signature_digests(file, &mut |n| bar.inc(n));
    bar.finish();
    let digests = digests?;
    Ok((
        payload.verify_signatures(&keys.keys(), Some(&digests))?,
        digests.file,
    ))
}

/// What `extract` and `apply` do with the signatures before anything is written: with keys,
/// refuse a payload whose signatures do not verify; without, say once on stderr that a signed
/// payload's signatures were not checked. Returns the report and the whole payload's SHA-256
/// when `file` asked for it (and keys were given).
pub fn require(ota: &Ota, keys: &Keys, file: bool) -> Result<(SignatureReport, Option<[u8; 32]>)> {
    let (report, digest) = check(ota, keys, file)?;
    if keys.is_empty() {
        if report.is_signed() {
            errln!(
                "snapblk: note: the payload is signed; its signatures were not checked (give --key CERT)"
            )?;
        }
    } else {
        report.require_verified()?;
    }
    Ok((report, digest))
}

/// The signature report for `--json`: both statuses and the keys their `key` indexes.
pub fn json(report: &SignatureReport, keys: &Keys) -> serde_json::Value {
    serde_json::json!({
        "metadata": report.metadata,
        "payload": report.payload,
        "keys": keys.json(),
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// One status in words: `unsigned`, `signed (N signatures), not checked (give --key)`,
/// `verified with KEY ...`, `MISMATCH: ...`, `MALFORMED: ...`.
pub fn status_text(s: &SignatureStatus, keys: &Keys) -> String {
    match s {
        SignatureStatus::Unsigned => "unsigned".into(),
        SignatureStatus::NotChecked { signatures } => format!(
            "signed ({signatures} signature{}), not checked (give --key)",
            plural(*signatures)
        ),
        SignatureStatus::Verified {
            signatures,
            signature,
            key,
        } => format!(
            "verified with {}, signature {} of {signatures}",
            keys.name(*key),
            signature + 1
        ),
        SignatureStatus::Mismatch { signatures } => format!(
            "MISMATCH: none of its {signatures} signature{} verifies with the {} key{} given",
            plural(*signatures),
            keys.0.len(),
            plural(keys.0.len())
        ),
        SignatureStatus::Malformed { problem } => format!("MALFORMED: {problem}"),
    }
}

/// A failure whose report was already printed (as JSON): `verdict` prints no second document.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Reported(#[from] pub snapblk_ota::OtaError);
