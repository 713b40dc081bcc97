//! NBD server export for snapblk devices.
//!
//! [`Server`] speaks the fixed-newstyle NBD protocol (the one qemu, libnbd and the kernel client
//! use) over TCP or unix sockets and serves one or more named [`Export`]s, each backed by a
//! started snapblk device wrapped in a [`SharedDevice`]. Every connection leases its own device
//! queue and keeps many requests in flight on it, so concurrent clients scale with the device and
//! never share a queue. Negotiation supports `OPT_GO`, `OPT_INFO`, `OPT_LIST`, `OPT_ABORT` and
//! `OPT_EXPORT_NAME` with block-size constraints; transmission supports READ, WRITE, FLUSH,
//! TRIM, WRITE_ZEROES (with NO_HOLE / FAST_ZERO), DISC and FUA, with simple replies only.
//!
//! Hostile input is bounded everywhere: option data and request payloads have maximum sizes,
//! a connection can pin only a fixed number of bytes, malformed headers close that connection
//! only, and the whole negotiation has one deadline. A client over the connection limit gets a
//! proper refusal. Every connection's fate (accepted, refused, dropped, closed, and why) goes to
//! an event hook ([`Server::on_event`]); the library itself never prints.

#![warn(missing_docs)]

mod buf;
mod conn;
pub mod device;
pub mod events;
pub mod net;
pub mod proto;
pub mod server;
pub mod signals;

pub use device::{DeviceError, Geometry, SharedDevice};
pub use events::{ConnAction, ConnEvent, ConnReason, EventHook};
pub use net::{DEFAULT_PORT, Listener};
pub use server::{Export, Server, ServerConfig, ServerError, StopHandle};
