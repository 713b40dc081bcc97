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
//!
//! Modules are private and the server's API is re-exported here. One module is public:
//! [`proto`], the wire protocol's constants (named as in the NBD specification, e.g.
//! `proto::CMD_READ`, `proto::EIO`, which would be unclear or clash at the root) and its
//! message parsers, for clients: the integration tests speak the protocol through it, and the
//! fuzz targets parse through it.

#![warn(missing_docs)]
#![warn(unreachable_pub, unnameable_types)]

mod buf;
mod conn;
mod device;
mod events;
mod net;
pub mod proto;
mod server;
mod signals;

pub use device::{DeviceError, Geometry, SharedDevice};
pub use events::{ConnAction, ConnEvent, ConnReason, EventHook};
pub use net::{DEFAULT_PORT, Listener, Stream};
pub use server::{Export, Server, ServerConfig, ServerError, StopHandle};
pub use signals::TermSignals;
