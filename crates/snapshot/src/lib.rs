//! Snapshot device (base + COW), crash-safe in-place merge, I/O scheduler.
