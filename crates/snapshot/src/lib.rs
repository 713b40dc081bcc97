//! snapblk-snapshot: the snapshot device of snapblk — what Android's snapuserd does, as a library.
//!
//! * [`SnapshotDriver`] presents the *new* image computed from a base device and an Android COW
//!   file, as a snapblk-core [`Driver`](snapblk_core::Driver) (so the C ABI, exports and bench can
//!   open it). Each request becomes a plan of [`Segment`]s (base range, COW payload, zeros, XOR)
//!   that is executed with as few copies as possible; compressed payloads go through a bounded
//!   cache of decoded units. An optional writable overlay appends writes to the COW.
//! * A [`Snapshot`] is opened from files ([`open_files`], with an [`OpenMode`]) or from any
//!   [`BlockDev`]s ([`open_devs`]); [`Snapshot::open`] takes [`SnapshotParts`] built by hand (a
//!   [`SnapshotMap`], a [`CowLayout`], a [`Decoder`] such as [`CowDecoder`]). [`load_verifier`]
//!   loads the COW record that lets it check every block it serves.
//! * [`merge()`] writes the new image into the base in place, in the COW's merge order, with the
//!   scratch area and `num_merge_ops` counter exactly where Android keeps them, so an interruption
//!   at any instant resumes correctly. Reads through the device stay correct during the merge.
//!   [`precheck()`] reads everything a merge will need before it writes; a [`MergeTask`] runs the
//!   merge while the device serves.
//! * [`Scheduler`] is the I/O scheduler all base/COW I/O goes through (foreground / merge /
//!   readahead classes with BFQ-like budgets, [`SchedConfig`]).
//! * [`Activity`] records the block ranges the device serves after start and replays such a list
//!   as in-device readahead (driver properties `record`, `record-secs`, `readahead`).
//!
//! Modules are private and the API is re-exported here, except the test scaffolding, public
//! only with the `test-utils` feature and kept in namespaces of its own so it never reads as API:
//! `fault` is a fault-injection disk (and driver) — seeded read, write and flush errors, latency
//! on a virtual clock, and power loss at any instant; `synth` builds synthetic cases; `fuzzing`
//! holds the fuzz entry points. They draw from `snapblk_core::rng::Rng`.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod childdev;
mod cowrecord;
mod cowsrc;
mod dev;
mod driver;
mod error;
#[cfg(feature = "test-utils")]
pub mod fault;
// Fuzz entry points (cargo-fuzz targets and the mutation smoke test share them).
#[cfg(feature = "test-utils")]
pub mod fuzzing;
mod io;
mod map;
mod merge;
mod merge_task;
mod overlay;
mod precheck;
mod queue;
mod record;
mod reserve;
mod sched;
mod snapshot;
mod stash;
#[cfg(feature = "test-utils")]
pub mod synth;

pub use childdev::{BASE_QUEUES, BlkioDev, DeviceOpener};
pub use cowrecord::{load_verifier, load_verifier_dev};
pub use cowsrc::{CowDecoder, OpenMode, open_dev_base, open_devs, open_files, open_files_sized};
pub use dev::{BlockDev, FileDev, GrownView};
pub use driver::SnapshotDriver;
pub use error::{Result, SnapError};
pub use io::{CacheStats, Dev};
pub use map::{Codec, MapOp, MergeView, OpKind, Payload, Segment, SnapshotMap};
pub use merge::{KEEP_DECODED, MergeOptions, MergeProgress, MergeReport, MergeStep, merge};
pub use merge_task::{MergeControlError, MergeState, MergeStats, MergeTask};
pub use precheck::{PrecheckReport, precheck};
pub use record::{
    Activity, DEFAULT_RECORD_SECS, ReadaheadStats, RecordError, RecordStats, ReplayState,
};
pub use sched::{ClassStats, Clock, SchedConfig, SchedStats, Scheduler};
pub use snapshot::{
    CowLayout, Decoder, MAX_SCRATCH_SIZE, Scratch, Snapshot, SnapshotConfig, SnapshotParts,
};
pub use stash::Stash;
