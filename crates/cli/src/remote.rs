//! `snapblk remote put|get|stat`: publish and fetch COW files, images and OTAs on S3 (or any
//! S3-compatible store such as Ceph RGW), checked by SHA-256. Credentials and endpoint come
//! from the AWS environment (docs/remote.md).

use anyhow::{Context, Result};
use clap::Subcommand;
use snapblk_loadgen::signal_name;
use snapblk_nbd::TermSignals;
use snapblk_remote::{RemoteConfig, RemoteError, RemoteObject};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

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
    /// file larger than `--part-size` goes up as a multipart upload, `--jobs` parts at once,
    /// each signed with its own SHA-256, and is aborted (no parts left behind) if any step
    /// fails. SIGINT, SIGTERM or SIGHUP stops the upload, aborts it and exits with 128 + the
    /// signal; the object is only ever completed from every part.
    Put {
        /// The local file (a COW, an image, an OTA).
        file: PathBuf,
        /// Where: s3://BUCKET/KEY.
        url: String,
        /// Part size of a multipart upload, 5M to 5G (larger when the file would need more
        /// than 10,000 parts); files up to this size go up in one PUT.
        #[arg(long, default_value = "64M", value_parser = snapblk_core::parse_size)]
        part_size: u64,
        /// Parts of a multipart upload sent at once, each on its own connection (1 to 64).
        /// Parts stream from the file: memory does not grow with the part size.
        #[arg(long, default_value_t = snapblk_remote::DEFAULT_PUT_JOBS)]
        jobs: usize,
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
            jobs,
        } => {
            cfg.part_size = part_size;
            cfg.put_jobs = jobs;
            put(&cfg, &url, &file)?;
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

/// A repeated signal sooner than this after the first is the same interrupt delivered twice
/// (`timeout` signals its child and then its process group), not a request to quit at once.
const QUIT_AFTER: Duration = Duration::from_secs(1);

/// `remote put` with SIGINT/SIGTERM/SIGHUP caught: the first one stops the upload (an open
/// multipart upload is aborted, so no parts stay stored and billed) and the command exits with
/// 128 + the signal and one line; another one at least [`QUIT_AFTER`] later exits at once, in
/// case the abort hangs on a dead endpoint. SIGKILL cannot be caught: a bucket lifecycle rule
/// (`AbortIncompleteMultipartUpload`) removes what such an upload leaves (docs/remote.md).
fn put(cfg: &RemoteConfig, url: &str, file: &Path) -> Result<()> {
    // Before any thread exists: the upload's threads inherit the mask, so only the watcher
    // below takes these signals.
    let sigs = TermSignals::block_with_hangup().context("blocking SIGINT/SIGTERM/SIGHUP")?;
    let stop = Arc::new(AtomicBool::new(false));
    let signal = Arc::new(AtomicI32::new(0));
    let (st, sg) = (stop.clone(), signal.clone());
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first: Option<Instant> = None;
            loop {
                let Some(s) = sigs.wait(Duration::from_secs(3600)) else {
                    continue;
                };
                match first {
                    None => {
                        first = Some(Instant::now());
                        sg.store(s, Ordering::SeqCst);
                        st.store(true, Ordering::SeqCst);
                    }
                    Some(t) if t.elapsed() < QUIT_AFTER => {}
                    Some(_) => {
                        // Nobody to report a failure to in this thread.
                        let _ = errln!(
                            "snapblk: {}: quitting without waiting for the abort; an open multipart upload stays until the bucket's lifecycle rule removes it",
                            signal_name(s)
                        );
                        std::process::exit(128 + sg.load(Ordering::SeqCst));
                    }
                }
            }
        })
        .context("starting the signal thread")?;
    let r = snapblk_remote::put_file_until(cfg, url, file, &stop);
    let sig = signal.load(Ordering::SeqCst);
    let r = match r {
        Ok(r) => r,
        Err(e) if sig != 0 => {
            let e = match e {
                RemoteError::Stopped { .. } => anyhow::Error::new(e),
                e => anyhow::Error::new(e).context("stopping"),
            };
            // The exit status says it already if stderr is gone.
            let _ = errln!("snapblk: {}: {e:#}", signal_name(sig));
            std::process::exit(128 + sig);
        }
        Err(e) => return Err(e.into()),
    };
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
    if sig != 0 {
        let _ = errln!(
            "snapblk: {}: arrived once every part was stored; the object is complete",
            signal_name(sig)
        );
        std::process::exit(128 + sig);
    }
    Ok(())
}
