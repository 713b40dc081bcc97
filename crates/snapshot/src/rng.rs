//! The deterministic PRNG that fault schedules and generated workloads are drawn from: the one of
//! [`snapblk_core::rng`], re-exported so that `snapblk_snapshot::rng::Rng` keeps working.

pub use snapblk_core::rng::Rng;
