//! Drivers for snapblk-core: io_uring, sync (pread/pwrite), null.
