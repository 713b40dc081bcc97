//! Page-cache residency, readahead record and replay.
