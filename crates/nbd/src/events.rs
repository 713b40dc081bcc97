//! Connection events: what happened to each client connection and why, reported to the hook set
//! with [`Server::on_event`](crate::Server::on_event). The library never prints; the caller
//! decides how to log them (`snapblk serve` prints one line on stderr and, with `--json`, one
//! JSON line on stdout per event).
//!
//! Every connection ends with exactly one of [`ConnAction::Refused`], [`ConnAction::Dropped`] or
//! [`ConnAction::Closed`]; a connection that finished negotiating also reports
//! [`ConnAction::Accepted`] before that.

use crate::device::DeviceError;
use crate::proto::ProtoError;
use std::fmt;
use std::io;
use std::time::Duration;

/// What happened to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnAction {
    /// Negotiation finished: the client is being served an export.
    Accepted,
    /// The server turned the client away with an error reply (connection limit, shutdown).
    Refused,
    /// The connection was cut before it was served (negotiation deadline, protocol error, the
    /// client leaving during negotiation, ...).
    Dropped,
    /// A connection ended normally: a served client left, the server stopped, or the client
    /// ended negotiation itself (`NBD_OPT_ABORT`).
    Closed,
}

impl ConnAction {
    /// The lower-case word used in logs and in `snapblk serve --json` (`accepted`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ConnAction::Accepted => "accepted",
            ConnAction::Refused => "refused",
            ConnAction::Dropped => "dropped",
            ConnAction::Closed => "closed",
        }
    }
}

impl fmt::Display for ConnAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Seconds for messages: `10 s`, `0.5 s`.
pub(crate) struct Secs(pub Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} s", self.0.as_secs_f64())
    }
}

/// Why a connection was refused, dropped or closed. The cause of an I/O or protocol failure is
/// the [`source`](std::error::Error::source), not part of the message.
#[derive(Debug, thiserror::Error)]
pub enum ConnReason {
    // Negotiation.
    /// Negotiation took longer than [`ServerConfig::handshake_timeout`](crate::ServerConfig::handshake_timeout)
    /// (the deadline).
    #[error("negotiation not finished within the {} deadline", Secs(*.0))]
    NegotiationTimeout(Duration),
    /// The client closed its socket before choosing an export.
    #[error("client disconnected during negotiation")]
    LeftDuringNegotiation,
    /// The client sent `NBD_OPT_ABORT`.
    #[error("client ended negotiation (NBD_OPT_ABORT)")]
    Aborted,
    /// An option header or option data was malformed.
    #[error("protocol error during negotiation")]
    Protocol(#[source] ProtoError),
    /// The client's handshake flags contain bits the server does not know (the flags).
    #[error("unknown client flags {0:#x}")]
    ClientFlags(u32),
    /// `NBD_OPT_EXPORT_NAME` named no export (the name); that option cannot carry an error
    /// reply, so the connection is cut.
    #[error("NBD_OPT_EXPORT_NAME for an unknown export {0:?}")]
    UnknownExport(String),
    /// The `NBD_OPT_EXPORT_NAME` data is not a valid name.
    #[error("NBD_OPT_EXPORT_NAME with an invalid name")]
    BadExportName(#[source] ProtoError),
    /// The `NBD_OPT_EXPORT_NAME` data is longer than the protocol allows (its length).
    #[error("NBD_OPT_EXPORT_NAME with {0} bytes of data")]
    ExportNameTooLong(u32),
    /// Reading or writing the socket failed during negotiation.
    #[error("socket error during negotiation")]
    NegotiationIo(#[source] io::Error),
    // Refusals.
    /// [`ServerConfig::max_connections`](crate::ServerConfig::max_connections) clients are
    /// already served (the limit); the client got an error reply.
    #[error("server at its connection limit ({0})")]
    ConnectionLimit(usize),
    #[error(
        "server at its connection limit ({limit}) and already refusing {refusing} clients: \
         closed without a reply"
    )]
    /// Over the connection limit while
    /// [`ServerConfig::max_refusals`](crate::ServerConfig::max_refusals) refusals are already in
    /// progress: closed without a reply.
    RefusalsBusy {
        /// The connection limit.
        limit: usize,
        /// Refusals in progress.
        refusing: usize,
    },
    /// The server is stopping; the client got `NBD_REP_ERR_SHUTDOWN`.
    #[error("server is shutting down")]
    ShuttingDown,
    /// No thread could be started to serve the connection (or to read its requests).
    #[error("could not start a thread for the connection")]
    Spawn(#[source] io::Error),
    // Transmission.
    /// The client sent `NBD_CMD_DISC`.
    #[error("client disconnected (NBD_CMD_DISC)")]
    Disc,
    /// The client closed its socket during transmission.
    #[error("client closed the connection")]
    ClientClosed,
    /// The server was stopped ([`StopHandle::stop`](crate::StopHandle::stop)).
    #[error("server stopped")]
    Stopped,
    /// A request header was malformed (e.g. bad magic); the stream cannot be resynchronised.
    #[error("malformed request")]
    BadRequest(#[source] ProtoError),
    /// A write's payload is over [`ServerConfig::max_request`](crate::ServerConfig::max_request);
    /// it cannot be skipped safely, so the connection is closed.
    #[error("write of {len} bytes is over the {max}-byte request limit")]
    WriteTooBig {
        /// The write's length in bytes.
        len: u32,
        /// The limit in bytes.
        max: u32,
    },
    /// A socket operation failed outside negotiation: setting the socket up for a connection, or
    /// reading or writing it during transmission.
    #[error("socket error")]
    Io(#[source] io::Error),
    /// No device queue could be leased for the connection.
    #[error("no device queue for the connection")]
    Lease(#[source] DeviceError),
    /// The device queue failed as a whole (not one request: those get error replies).
    #[error("device queue failed")]
    Device(#[source] snapblk_core::Error),
}

impl ConnReason {
    /// The action a connection that ended for this reason reports.
    pub fn action(&self) -> ConnAction {
        match self {
            ConnReason::ConnectionLimit(_)
            | ConnReason::RefusalsBusy { .. }
            | ConnReason::ShuttingDown => ConnAction::Refused,
            ConnReason::Aborted
            | ConnReason::Disc
            | ConnReason::ClientClosed
            | ConnReason::Stopped => ConnAction::Closed,
            _ => ConnAction::Dropped,
        }
    }
}

/// One event of one connection.
#[derive(Debug)]
pub struct ConnEvent {
    /// The server's number for the connection (the same in all of its events).
    pub id: u64,
    /// `HOST:PORT`, or `unix:pid=N` / `unix` for unix sockets.
    pub peer: String,
    /// What happened.
    pub action: ConnAction,
    /// The export name, once the client has chosen one.
    pub export: Option<String>,
    /// Why (absent for [`ConnAction::Accepted`]).
    pub reason: Option<ConnReason>,
}

/// The hook [`Server::on_event`](crate::Server::on_event) installs; called on the connection's
/// own thread (or the accept loop), so it should be quick.
pub type EventHook = Box<dyn Fn(&ConnEvent) + Send + Sync>;
