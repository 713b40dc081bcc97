//! snapblk facade: driver registry and device specs.
