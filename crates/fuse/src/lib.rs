//! FUSE export: a snapblk device as a loop-mountable file.
