//! `snapblk remote put|get|stat`: publish and fetch COW files, images and OTAs on S3 (or any
//! S3-compatible store such as Ceph RGW), checked by SHA-256. Credentials and endpoint come
//! from the AWS environment (docs/remote.md).

use anyhow::{Context, Result};
use clap::Subcommand;
use snapblk_remote::{RemoteConfig, RemoteObject};
use std::path::PathBuf;

use crate::outfile::AtomicFile;

/// One line on stdout; a write error is the command's error.
macro_rules! say {
    ($($t:tt)*) => {{
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($t)*), true)?;
    }};
}

#[derive(Subcommand)]
pub enum RemoteCmd {
    /// Upload FILE to URL (s3://BUCKET/KEY) with one PUT signed with the file's SHA-256 (the
    /// server refuses bytes that arrive different); the digest is stored with the object. A
    /// file larger than `--part-size` goes up as a multipart upload, each part signed with its
    /// own SHA-256, and is aborted (no parts left behind) if any step fails.
    Put {
        /// The local file (a COW, an image, an OTA).
        file: PathBuf,
        /// Where: s3://BUCKET/KEY.
        url: String,
        /// Part size of a multipart upload, 5M to 5G (larger when the file would need more
        /// than 10,000 parts); files up to this size go up in one PUT.
        #[arg(long, default_value = "64M", value_parser = snapblk_core::parse_size)]
        part_size: u64,
    },
    /// Download URL to FILE, which appears only once every byte has arrived and matched the
    /// SHA-256 stored by `put` (objects without one are fetched unchecked, and said so).
    Get {
        /// s3://BUCKET/KEY or an http(s) URL.
        url: String,
        /// The local file to write (replaced atomically).
        file: PathBuf,
    },
    /// Print an object's size and ETag (one HEAD).
    Stat {
        /// s3://BUCKET/KEY or an http(s) URL.
        url: String,
    },
}

pub fn run(c: RemoteCmd) -> Result<()> {
    let mut cfg = RemoteConfig::from_env()?;
    match c {
        RemoteCmd::Put {
            file,
            url,
            part_size,
        } => {
            cfg.part_size = part_size;
            let r = snapblk_remote::put_file(&cfg, &url, &file)?;
            let parts = if r.parts > 1 {
                format!(" in {} parts", r.parts)
            } else {
                String::new()
            };
            say!(
                "{url}: {} bytes{parts}, sha256 {}, etag {}",
                r.bytes,
                r.sha256,
                r.etag.as_deref().unwrap_or("-")
            );
        }
        RemoteCmd::Get { url, file } => {
            let out = AtomicFile::create(&file)?;
            let mut w = std::io::BufWriter::new(out.file());
            let r = snapblk_remote::get_to(&cfg, &url, &mut w)?;
            std::io::Write::flush(&mut w).with_context(|| format!("write {}", file.display()))?;
            drop(w);
            out.commit()?;
            let how = if r.checked {
                "matches the recorded sha256"
            } else {
                "no recorded sha256 to check"
            };
            say!(
                "{}: {} bytes, sha256 {} ({how})",
                file.display(),
                r.bytes,
                r.sha256
            );
        }
        RemoteCmd::Stat { url } => {
            let o = RemoteObject::open(&url, &cfg)?;
            say!("{url}: {} bytes, etag {}", o.len(), o.etag().unwrap_or("-"));
        }
    }
    Ok(())
}
