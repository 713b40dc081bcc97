//! snapblk-snapshot: the snapshot device of snapblk — what Android's snapuserd does, as a library.
//!
//! * [`SnapshotDriver`] presents the *new* image computed from a base device and an Android COW
//!   file, as a snapblk-core [`Driver`](snapblk_core::Driver) (so the C ABI, exports and bench can
//!   open it). Each request becomes a plan of [`Segment`]s (base range, COW payload, zeros, XOR)
//!   that is executed with as few copies as possible; compressed payloads go through a bounded
//!   cache of decoded units. An optional writable overlay appends writes to the COW.
//! * [`merge()`] writes the new image into the base in place, in the COW's merge order, with the
//!   scratch area and `num_merge_ops` counter exactly where Android keeps them, so an interruption
//!   at any instant resumes correctly. Reads through the device stay correct during the merge.
//! * [`sched`] is the I/O scheduler all base/COW I/O goes through (foreground / merge /
//!   readahead classes with BFQ-like budgets).
//! * `fault` is a fault-injection disk (and driver): seeded read, write and flush errors,
//!   latency on a virtual clock, and power loss at any instant. It, `synth` (synthetic
//!   cases), `fuzzing` (fuzz entry points) and `rng` exist only with the `test-utils` feature.
//! * [`record`] records the block ranges the device serves after start and replays such a list
//!   as in-device readahead (driver properties `record`, `record-secs`, `readahead`).

#![warn(missing_docs)]

pub mod cowrecord;
pub mod cowsrc;
pub mod dev;
pub mod driver;
pub mod error;
#[cfg(feature = "test-utils")]
pub mod fault;
// Fuzz entry points (cargo-fuzz targets and the mutation smoke test share them).
#[cfg(feature = "test-utils")]
pub mod fuzzing;
pub mod queue;
pub mod record;
#[cfg(any(test, feature = "test-utils"))]
pub mod rng;
pub mod sched;

pub use error::{Result, SnapError};
pub mod io;
pub mod map;
pub mod merge;
pub mod merge_task;
pub mod overlay;
pub mod precheck;
pub mod snapshot;
#[cfg(feature = "test-utils")]
pub mod synth;

pub use driver::SnapshotDriver;
pub use map::{Codec, MapOp, OpKind, Payload, Segment, SnapshotMap};
pub use merge::{MergeOptions, MergeProgress, MergeReport, MergeStep, merge};
pub use precheck::{PrecheckReport, precheck};
pub use snapshot::{CowLayout, Decoder, Snapshot, SnapshotConfig, SnapshotParts};
