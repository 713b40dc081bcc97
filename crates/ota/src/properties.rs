//! `payload_properties.txt`: `KEY=VALUE` lines written beside the payload by the OTA tools.
//! `FILE_HASH` / `FILE_SIZE` are the base64 SHA-256 and the size of the whole payload,
//! `METADATA_HASH` / `METADATA_SIZE` those of its metadata (header + manifest). Other keys
//! (`POWERWASH`, `SWITCH_SLOT_ON_REBOOT`, ... in streaming OTAs) are ignored.

use base64::Engine;

use crate::error::{OtaError, Result};
use crate::payload::Payload;

/// The four checkable values of `payload_properties.txt`, each absent when the file lacks it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Properties {
    /// `FILE_HASH`: SHA-256 of the whole payload.
    pub file_hash: Option<[u8; 32]>,
    /// `FILE_SIZE`: payload size in bytes.
    pub file_size: Option<u64>,
    /// `METADATA_HASH`: SHA-256 of the header and manifest.
    pub metadata_hash: Option<[u8; 32]>,
    /// `METADATA_SIZE`: size of the header and manifest.
    pub metadata_size: Option<u64>,
}

/// The outcome for one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// Present and equal to the payload's.
    Matched,
    /// Not in the file.
    Absent,
    /// Present, not compared (`FILE_HASH` without a full read).
    NotChecked,
}

/// What a check of [`Properties`] against a payload found (a mismatch is an error instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PropertiesReport {
    /// `FILE_SIZE`.
    pub file_size: Check,
    /// `FILE_HASH`.
    pub file_hash: Check,
    /// `METADATA_SIZE`.
    pub metadata_size: Check,
    /// `METADATA_HASH`.
    pub metadata_hash: Check,
}

fn hex(b: &[u8]) -> String {
    crate::hex(b)
}

impl Properties {
    /// Parse the file's text.
    pub fn parse(text: &str) -> Result<Properties> {
        let mut p = Properties::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem: String| OtaError::PropertiesSyntax {
                line: i + 1,
                problem,
            };
            let Some((k, v)) = line.split_once('=') else {
                return Err(bad("no '=' in the line".into()));
            };
            let hash = |v: &str| -> Result<[u8; 32]> {
                let b = base64::engine::general_purpose::STANDARD
                    .decode(v)
                    .map_err(|_| bad(format!("{k} is not base64")))?;
                b.try_into()
                    .map_err(|b: Vec<u8>| bad(format!("{k} has {} bytes, not 32", b.len())))
            };
            let size = |v: &str| -> Result<u64> {
                v.parse()
                    .map_err(|_| bad(format!("{k} is not a byte count")))
            };
            match k.trim() {
                "FILE_HASH" => p.file_hash = Some(hash(v.trim())?),
                "FILE_SIZE" => p.file_size = Some(size(v.trim())?),
                "METADATA_HASH" => p.metadata_hash = Some(hash(v.trim())?),
                "METADATA_SIZE" => p.metadata_size = Some(size(v.trim())?),
                _ => {}
            }
        }
        Ok(p)
    }

    /// Check the sizes and `METADATA_HASH` against `payload` (reads only the metadata);
    /// `FILE_HASH`, when present, is reported [`Check::NotChecked`].
    pub fn check_metadata(&self, payload: &Payload) -> Result<PropertiesReport> {
        let eq = |key: &'static str, want: Option<u64>, have: u64| match want {
            None => Ok(Check::Absent),
            Some(w) if w == have => Ok(Check::Matched),
            Some(w) => Err(OtaError::PropertiesMismatch {
                key,
                expected: w.to_string(),
                found: have.to_string(),
            }),
        };
        let file_size = eq("FILE_SIZE", self.file_size, payload.len())?;
        let metadata_size = eq("METADATA_SIZE", self.metadata_size, payload.metadata_size())?;
        let metadata_hash = match self.metadata_hash {
            None => Check::Absent,
            Some(w) => {
                let have = payload.metadata_sha256()?;
                if have != w {
                    return Err(OtaError::PropertiesMismatch {
                        key: "METADATA_HASH",
                        expected: hex(&w),
                        found: hex(&have),
                    });
                }
                Check::Matched
            }
        };
        Ok(PropertiesReport {
            file_size,
            file_hash: if self.file_hash.is_some() {
                Check::NotChecked
            } else {
                Check::Absent
            },
            metadata_size,
            metadata_hash,
        })
    }

    /// Check `FILE_HASH` against `payload` (one sequential read of the whole payload;
    /// `progress` gets the bytes of each chunk).
    pub fn check_file_hash(
        &self,
        payload: &Payload,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Check> {
        if self.file_hash.is_none() {
            return Ok(Check::Absent);
        }
        self.check_file_digest(&payload.file_sha256(progress)?)
    }

    /// Check `FILE_HASH` against `have`, the whole payload's SHA-256 computed elsewhere (e.g.
    /// [`Digests::file`](crate::Digests::file), from the pass that checks the signatures).
    pub fn check_file_digest(&self, have: &[u8; 32]) -> Result<Check> {
        let Some(w) = self.file_hash else {
            return Ok(Check::Absent);
        };
        if *have != w {
            return Err(OtaError::PropertiesMismatch {
                key: "FILE_HASH",
                expected: hex(&w),
                found: hex(have),
            });
        }
        Ok(Check::Matched)
    }

    /// The file's text for `payload` (all four values), as the OTA tools write it.
    pub fn render(payload: &Payload) -> Result<String> {
        let b64 = |h: &[u8]| base64::engine::general_purpose::STANDARD.encode(h);
        Ok(format!(
            "FILE_HASH={}\nFILE_SIZE={}\nMETADATA_HASH={}\nMETADATA_SIZE={}\n",
            b64(&payload.file_sha256(&mut |_| {})?),
            payload.len(),
            b64(&payload.metadata_sha256()?),
            payload.metadata_size()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_four_keys_and_ignores_others() {
        let h = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let t = format!("FILE_HASH={h}\nFILE_SIZE=10\nPOWERWASH=1\n\nMETADATA_SIZE=5\n");
        let p = Properties::parse(&t).unwrap();
        assert_eq!(p.file_hash, Some([7; 32]));
        assert_eq!(p.file_size, Some(10));
        assert_eq!(p.metadata_size, Some(5));
        assert_eq!(p.metadata_hash, None);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let e = Properties::parse("FILE_SIZE=1\nnonsense\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "payload_properties.txt line 2: no '=' in the line"
        );
        let e = Properties::parse("FILE_HASH=AAAA\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "payload_properties.txt line 1: FILE_HASH has 3 bytes, not 32"
        );
        let e = Properties::parse("FILE_SIZE=-3\n").unwrap_err();
        assert!(e.to_string().contains("not a byte count"), "{e}");
    }
}
