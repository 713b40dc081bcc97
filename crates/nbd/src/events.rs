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
    #[error("negotiation not finished within the {} deadline", Secs(*.0))]
    NegotiationTimeout(Duration),
    #[error("client disconnected during negotiation")]
    LeftDuringNegotiation,
    #[error("client ended negotiation (NBD_OPT_ABORT)")]
    Aborted,
    #[error("protocol error during negotiation")]
    Protocol(#[source] ProtoError),
    #[error("unknown client flags {0:#x}")]
    ClientFlags(u32),
    #[error("NBD_OPT_EXPORT_NAME for an unknown export {0:?}")]
    UnknownExport(String),
    #[error("NBD_OPT_EXPORT_NAME with an invalid name")]
    BadExportName(#[source] ProtoError),
    #[error("NBD_OPT_EXPORT_NAME with {0} bytes of data")]
    ExportNameTooLong(u32),
    #[error("socket error during negotiation")]
    NegotiationIo(#[source] io::Error),
    // Refusals.
    #[error("server at its connection limit ({0})")]
    ConnectionLimit(usize),
    #[error(
        "server at its connection limit ({limit}) and already refusing {refusing} clients: \
         closed without a reply"
    )]
    RefusalsBusy { limit: usize, refusing: usize },
    #[error("server is shutting down")]
    ShuttingDown,
    #[error("could not start a thread for the connection")]
    Spawn(#[source] io::Error),
    // Transmission.
    #[error("client disconnected (NBD_CMD_DISC)")]
    Disc,
    #[error("client closed the connection")]
    ClientClosed,
    #[error("server stopped")]
    Stopped,
    #[error("malformed request")]
    BadRequest(#[source] ProtoError),
    #[error("write of {len} bytes is over the {max}-byte request limit")]
    WriteTooBig { len: u32, max: u32 },
    #[error("socket error")]
    Io(#[source] io::Error),
    #[error("no device queue for the connection")]
    Lease(#[source] DeviceError),
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
    pub action: ConnAction,
    /// The export name, once the client has chosen one.
    pub export: Option<String>,
    /// Why (absent for [`ConnAction::Accepted`]).
    pub reason: Option<ConnReason>,
}

/// The hook [`Server::on_event`](crate::Server::on_event) installs; called on the connection's
/// own thread (or the accept loop), so it should be quick.
pub type EventHook = Box<dyn Fn(&ConnEvent) + Send + Sync>;
