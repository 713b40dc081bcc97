//! libblkio 1.x compatible C ABI (libblkio.so.1) over snapblk.
