//! NBD server export (and client driver) for snapblk devices.
