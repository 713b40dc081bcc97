//! ublk export: a snapblk device as a Linux block device.
