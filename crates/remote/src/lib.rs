//! snapblk-remote: remote objects as read-only byte sources.
//!
//! * [`RemoteObject`]: an object at `s3://BUCKET/KEY` (S3, Ceph RGW, any S3-compatible store;
//!   SigV4-signed when credentials are set) or `http(s)://…` (a public object or a presigned
//!   URL), read by position through ranged GETs into a bounded block cache, pinned to the
//!   version it was opened at (its ETag, sent as `If-Match`, or else its Last-Modified date).
//!   It implements the positional I/O family ([`snapblk_core::ReadAt`]), so a COW reader, a
//!   snapshot and the OTA payload reader read it like a file.
//! * [`RemoteDriver`]: the same as the read-only `s3` / `http` driver of device specs.
//! * [`put_file`] / [`get_to`]: whole-object publish and fetch, checked by SHA-256; a file
//!   larger than [`RemoteConfig::part_size`] goes up as an S3 multipart upload,
//!   [`RemoteConfig::put_jobs`] parts at once, aborted on failure or when the caller stops it
//!   ([`put_file_until`]).
//! * [`sigv4`]: the request signer (AWS Signature Version 4), public for its test vectors and
//!   for tools that sign their own requests.
//!
//! Configuration: [`RemoteConfig::from_env`] reads `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ENDPOINT_URL(_S3)`, `AWS_REGION` and
//! `SNAPBLK_REMOTE_ALLOW_UNPINNED` (read an object that has neither ETag nor Last-Modified).
//! HTTPS trusts the system's CA store; `SSL_CERT_FILE` points it at another bundle (a private
//! CA). Errors ([`RemoteError`]) are one line each: denied credentials, a missing object, a
//! changed object, an unreachable endpoint.
#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod cache;
mod config;
mod driver;
mod error;
mod http;
mod multipart;
mod object;
mod pool;
mod queue;
pub mod sigv4;
mod transfer;

pub use config::{
    DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_BYTES, DEFAULT_PART_SIZE, DEFAULT_PUT_JOBS,
    DEFAULT_READAHEAD_BLOCKS, DEFAULT_RETRIES, DEFAULT_TIMEOUT, MAX_PUT_JOBS, READ_WORKERS,
    RemoteConfig, Target, is_remote,
};
pub use driver::RemoteDriver;
pub use error::{RemoteError, Result, TransportError};
pub use http::{parse_content_range, s3_error_code, status_error};
pub use multipart::{MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE};
pub use object::{RemoteObject, RemoteStats};
pub use transfer::{SHA256_META, TransferReport, get_to, put_file, put_file_until};
