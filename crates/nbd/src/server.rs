//! The NBD server: accept loop, fixed-newstyle negotiation, and per-connection threads.

use crate::conn;
use crate::device::SharedDevice;
use crate::events::{ConnAction, ConnEvent, ConnReason, EventHook};
use crate::net::{Listener, Stream, wait_readable};
use crate::proto::{self, *};
use snapblk_core::sync::lock;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One named export.
pub struct Export {
    /// Name clients ask for; the empty name also selects the first export.
    pub name: String,
    /// Free text sent with `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION` (at most
    /// [`MAX_STRING`] bytes).
    pub description: String,
    /// The started device served; several exports may share one.
    pub device: Arc<SharedDevice>,
    /// Refuse writes even if the device accepts them.
    pub read_only: bool,
    /// Advertise `NBD_FLAG_CAN_MULTI_CONN`: a flush on any connection makes every connection's
    /// completed writes durable. True for drivers whose flush is device-wide (files).
    pub multi_conn: bool,
}

/// Server limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest READ/WRITE payload; larger reads get EINVAL, larger writes close the connection
    /// (their payload cannot be skipped safely).
    pub max_request: u32,
    /// Connections served at once. A client beyond this is refused: it gets the greeting and
    /// `NBD_REP_ERR_SHUTDOWN` "server at its connection limit (N)" for its options, then the
    /// connection is closed (within `handshake_timeout`).
    pub max_connections: usize,
    /// Refusals (see `max_connections`) in progress at once; clients beyond this while the
    /// server is full are closed at once without a reply, so a flood of connections cannot tie
    /// up more than this many threads.
    pub max_refusals: usize,
    /// Deadline for the whole negotiation, from accepting the connection to the client's choice
    /// of export (a client trickling bytes does not extend it); a client that has not finished
    /// by then is dropped. `None`: no deadline.
    pub handshake_timeout: Option<Duration>,
    /// Requests in flight per connection.
    pub max_inflight: usize,
    /// Payload bytes in flight per connection (bounds memory a client can pin).
    pub max_inflight_bytes: usize,
    /// On stop, how long connections may take to send their last replies before their sockets
    /// are shut down (a client that stopped reading would otherwise block the stop forever).
    pub stop_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_request: 32 << 20,
            max_connections: 64,
            max_refusals: 16,
            handshake_timeout: Some(Duration::from_secs(10)),
            max_inflight: 64,
            max_inflight_bytes: 64 << 20,
            stop_grace: Duration::from_secs(10),
        }
    }
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// [`Server::new`] got an empty export list.
    #[error("no exports configured")]
    NoExports,
    /// Two exports have the same name (the name).
    #[error("duplicate export name {0:?}")]
    DuplicateExport(String),
    /// An export name or description is longer than [`MAX_STRING`].
    #[error("export name longer than {} bytes", proto::MAX_STRING)]
    NameTooLong,
    /// [`ServerConfig::max_request`] (first) is not a multiple of an export's device block
    /// size (second), so a maximal request could not be aligned.
    #[error("max request {0} must be a multiple of the device block size {1}")]
    BadMaxRequest(u32, u32),
    /// Creating the stop-wakeup socket pair failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

pub(crate) struct StopState {
    pub(crate) flag: AtomicBool,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

/// Stops a running [`Server::run`] from any thread (e.g. a signal handler thread).
#[derive(Clone)]
pub struct StopHandle(Arc<StopState>);

impl StopHandle {
    /// Ask the server to stop: the accept loop wakes and returns, connections finish their
    /// in-flight replies (within [`ServerConfig::stop_grace`]) and close.
    pub fn stop(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        let _ = (&self.0.wake_tx).write(&[1]);
    }
    /// Whether [`StopHandle::stop`] has been called.
    pub fn is_stopped(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }
}

/// An NBD server over a set of exports.
pub struct Server {
    exports: Vec<Export>,
    cfg: ServerConfig,
    stop: Arc<StopState>,
    conns: Mutex<HashMap<u64, Stream>>,
    /// Connections over the limit being refused (not counted in `conns`).
    refusing: Mutex<HashMap<u64, Stream>>,
    next_id: AtomicU64,
    hook: Option<EventHook>,
}

/// Options answered while refusing a client before the connection is closed anyway.
const MAX_REFUSED_OPTIONS: usize = 16;

/// A stream whose reads and writes all end at one deadline (negotiation): each call gets the
/// time left, so a client trickling one byte at a time cannot extend it.
struct Deadlined<'a> {
    s: &'a mut Stream,
    end: Option<Instant>,
}

impl Deadlined<'_> {
    fn arm(&self) -> io::Result<()> {
        let Some(end) = self.end else { return Ok(()) };
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.s.set_read_timeout(Some(left))?;
        self.s.set_write_timeout(Some(left))
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.s.read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Server {
    /// A server over `exports`, checked (unique names, lengths, `max_request` alignment);
    /// nothing is served until [`Server::run`] or [`Server::serve_connection`].
    pub fn new(exports: Vec<Export>, cfg: ServerConfig) -> Result<Server, ServerError> {
        if exports.is_empty() {
            return Err(ServerError::NoExports);
        }
        for (i, e) in exports.iter().enumerate() {
            if e.name.len() > proto::MAX_STRING || e.description.len() > proto::MAX_STRING {
                return Err(ServerError::NameTooLong);
            }
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(ServerError::DuplicateExport(e.name.clone()));
            }
            let min = e.device.geometry().min_block;
            if !cfg.max_request.is_multiple_of(min) {
                return Err(ServerError::BadMaxRequest(cfg.max_request, min));
            }
        }
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        Ok(Server {
            exports,
            cfg,
            stop: Arc::new(StopState {
                flag: AtomicBool::new(false),
                wake_tx,
                wake_rx,
            }),
            conns: Mutex::new(HashMap::new()),
            refusing: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            hook: None,
        })
    }

    /// Report every connection's events (accepted, refused, dropped, closed, with the reason)
    /// to `hook`. The library never logs by itself.
    pub fn on_event(mut self, hook: impl Fn(&ConnEvent) + Send + Sync + 'static) -> Server {
        self.hook = Some(Box::new(hook));
        self
    }

    fn event(
        &self,
        id: u64,
        peer: &str,
        action: ConnAction,
        export: Option<&str>,
        reason: Option<ConnReason>,
    ) {
        if let Some(h) = &self.hook {
            h(&ConnEvent {
                id,
                peer: peer.to_owned(),
                action,
                export: export.map(str::to_owned),
                reason,
            });
        }
    }

    /// The end of a connection, with its reason (which decides the action).
    fn ended(&self, id: u64, peer: &str, export: Option<&str>, reason: ConnReason) {
        self.event(id, peer, reason.action(), export, Some(reason));
    }

    /// A handle that stops [`Server::run`] from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    /// The exports, in the order given to [`Server::new`].
    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Stream>> {
        lock(&self.conns)
    }

    fn refusing(&self) -> MutexGuard<'_, HashMap<u64, Stream>> {
        lock(&self.refusing)
    }

    /// Serve clients on `listener` until [`StopHandle::stop`]; then let every connection finish
    /// its requests in flight (replies sent, writes flushed) and return.
    pub fn run(&self, listener: &Listener) -> io::Result<()> {
        std::thread::scope(|s| {
            let res = loop {
                if self.stop.flag.load(Ordering::SeqCst) {
                    break Ok(());
                }
                let ready = match wait_readable(
                    &[listener.fd(), self.stop.wake_rx.as_raw_fd()],
                    Duration::from_secs(1),
                ) {
                    Ok(r) => r,
                    Err(e) => break Err(e),
                };
                if !ready[0] {
                    continue;
                }
                loop {
                    let stream = match listener.accept() {
                        Ok(st) => st,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        // Per-connection failures (e.g. ECONNABORTED, EMFILE) must not end the server.
                        Err(_) => break,
                    };
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let peer = stream.peer();
                    let full = self.conns().len() >= self.cfg.max_connections;
                    if full {
                        let refusing = self.refusing().len();
                        if refusing >= self.cfg.max_refusals {
                            drop(stream);
                            let limit = self.cfg.max_connections;
                            let why = ConnReason::RefusalsBusy { limit, refusing };
                            self.ended(id, &peer, None, why);
                            continue;
                        }
                    }
                    let ctl = match stream.try_clone() {
                        Ok(c) => c,
                        Err(e) => {
                            self.ended(id, &peer, None, ConnReason::Io(e));
                            continue;
                        }
                    };
                    let map = if full { &self.refusing } else { &self.conns };
                    lock(map).insert(id, ctl);
                    let p = peer.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("nbd-conn-{id}"))
                        .spawn_scoped(s, move || {
                            if full {
                                self.refuse_conn(id, &p, stream);
                            } else {
                                self.serve_conn(id, &p, stream);
                            }
                            lock(map).remove(&id);
                        });
                    if let Err(e) = spawned {
                        if let Some(c) = lock(map).remove(&id) {
                            let _ = c.shutdown(Shutdown::Both);
                        }
                        self.ended(id, &peer, None, ConnReason::Spawn(e));
                    }
                }
            };
            // Stop intake on every connection; each finishes what is in flight, then closes.
            self.stop.flag.store(true, Ordering::SeqCst);
            for c in self.refusing().values() {
                let _ = c.shutdown(Shutdown::Both);
            }
            for c in self.conns().values() {
                let _ = c.shutdown(Shutdown::Read);
            }
            let deadline = Instant::now() + self.cfg.stop_grace;
            while !(self.conns().is_empty() && self.refusing().is_empty())
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Whoever is left is not reading its replies: cut it off so its threads end.
            for c in self.conns().values() {
                let _ = c.shutdown(Shutdown::Both);
            }
            res
        })
    }

    /// Serve one already-connected client (negotiation, then transmission) on the calling
    /// thread; for socket activation, inetd-style use and fuzzing. Not counted against
    /// `max_connections` and not interrupted by [`StopHandle::stop`] until it reads again.
    pub fn serve_connection(&self, stream: Stream) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let peer = stream.peer();
        self.serve_conn(id, &peer, stream)
    }

    fn deadline(&self) -> Option<Instant> {
        self.cfg.handshake_timeout.map(|t| Instant::now() + t)
    }

    fn serve_conn(&self, id: u64, peer: &str, mut stream: Stream) {
        let end = self.deadline();
        let negotiated = self.negotiate(&mut Deadlined {
            s: &mut stream,
            end,
        });
        let ex = match negotiated.map(|i| self.exports.get(i)) {
            Ok(Some(ex)) => ex,
            Ok(None) => return, // cannot happen: negotiate returns an index it found
            Err(why) => return self.ended(id, peer, None, why),
        };
        let name = Some(ex.name.as_str());
        if let Err(e) = stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
        {
            return self.ended(id, peer, name, ConnReason::Io(e));
        }
        self.event(id, peer, ConnAction::Accepted, name, None);
        let why = conn::transmit(stream, ex, &self.cfg, &self.stop.flag);
        self.ended(id, peer, name, why);
    }

    /// Turn away a client over the connection limit with a proper NBD refusal, bounded by the
    /// negotiation deadline, and report it (however the client behaves meanwhile).
    fn refuse_conn(&self, id: u64, peer: &str, mut stream: Stream) {
        let why = ConnReason::ConnectionLimit(self.cfg.max_connections);
        let msg = why.to_string();
        let end = self.deadline();
        let _ = self.refuse(
            &mut Deadlined {
                s: &mut stream,
                end,
            },
            &msg,
        );
        self.ended(id, peer, None, why);
    }

    /// The greeting, then `NBD_REP_ERR_SHUTDOWN` with `msg` for every option until the client
    /// gives up (`NBD_OPT_ABORT`, disconnect), sends `NBD_OPT_EXPORT_NAME` (which has no error
    /// reply), or [`MAX_REFUSED_OPTIONS`] options.
    fn refuse(&self, s: &mut Deadlined, msg: &str) -> Result<(), ConnReason> {
        self.greet(s)?;
        for _ in 0..MAX_REFUSED_OPTIONS {
            let mut hb = [0u8; OptionHeader::LEN];
            s.read_exact(&mut hb).map_err(|e| self.neg_io(e))?;
            let h = OptionHeader::parse(&hb).map_err(ConnReason::Protocol)?;
            // Read the data (bounded by the deadline) so that closing does not reset the
            // connection before the client has read the reply.
            discard(s, h.len as u64).map_err(|e| self.neg_io(e))?;
            match h.option {
                OPT_EXPORT_NAME => return Ok(()),
                OPT_ABORT => {
                    let _ = s.write_all(&option_reply(h.option, REP_ACK, &[]));
                    return Ok(());
                }
                o => reply_err(s, o, REP_ERR_SHUTDOWN, msg).map_err(|e| self.neg_io(e))?,
            }
        }
        Ok(())
    }

    /// Why negotiation ended on a socket error.
    fn neg_io(&self, e: io::Error) -> ConnReason {
        use io::ErrorKind::*;
        if self.stop.flag.load(Ordering::SeqCst) {
            return ConnReason::Stopped;
        }
        match (e.kind(), self.cfg.handshake_timeout) {
            (TimedOut | WouldBlock, Some(t)) => ConnReason::NegotiationTimeout(t),
            (UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe, _) => {
                ConnReason::LeftDuringNegotiation
            }
            _ => ConnReason::NegotiationIo(e),
        }
    }

    /// Send the greeting and read the client's flags; returns whether the client asked for
    /// `NO_ZEROES`.
    fn greet(&self, s: &mut Deadlined) -> Result<bool, ConnReason> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        s.write_all(&hello).map_err(|e| self.neg_io(e))?;
        let mut cf = [0u8; 4];
        s.read_exact(&mut cf).map_err(|e| self.neg_io(e))?;
        let cflags = u32::from_be_bytes(cf);
        if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(ConnReason::ClientFlags(cflags)); // spec: unknown client flags → disconnect
        }
        Ok(cflags & FLAG_C_NO_ZEROES != 0)
    }

    fn find(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return Some(0);
        }
        self.exports.iter().position(|e| e.name == name)
    }

    fn tflags(&self, ex: &Export) -> u16 {
        let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_FUA;
        if ex.read_only || ex.device.geometry().read_only {
            f |= TF_READ_ONLY;
        } else {
            f |= TF_SEND_TRIM | TF_SEND_WRITE_ZEROES | TF_SEND_FAST_ZERO;
        }
        if ex.multi_conn {
            f |= TF_CAN_MULTI_CONN;
        }
        f
    }

    /// Fixed-newstyle negotiation. Returns which export to serve, or why the connection ends.
    fn negotiate(&self, s: &mut Deadlined) -> Result<usize, ConnReason> {
        let no_zeroes = self.greet(s)?;
        let res = self.options(s, no_zeroes);
        res.map_err(|e| match e {
            Ended::Io(e) => self.neg_io(e),
            Ended::Why(w) => w,
        })
    }

    fn options(&self, s: &mut Deadlined, no_zeroes: bool) -> Result<usize, Ended> {
        // Option data we are willing to hold: a GO with a maximal name and many info requests.
        const MAX_OPT: u32 = 4 + proto::MAX_STRING as u32 + 2 + 2 * 64;
        loop {
            let mut hb = [0u8; OptionHeader::LEN];
            s.read_exact(&mut hb)?;
            let h = OptionHeader::parse(&hb).map_err(|e| Ended::Why(ConnReason::Protocol(e)))?;
            if h.len > MAX_OPT {
                if h.option == OPT_EXPORT_NAME {
                    // No error reply exists for this option.
                    return Err(Ended::Why(ConnReason::ExportNameTooLong(h.len)));
                }
                discard(s, h.len as u64)?;
                reply_err(s, h.option, REP_ERR_TOO_BIG, "option data too large")?;
                continue;
            }
            let mut data = vec![0u8; h.len as usize];
            s.read_exact(&mut data)?;
            if self.stop.flag.load(Ordering::SeqCst) {
                if h.option != OPT_EXPORT_NAME {
                    let _ = reply_err(s, h.option, REP_ERR_SHUTDOWN, "server is shutting down");
                }
                return Err(Ended::Why(ConnReason::ShuttingDown));
            }
            match h.option {
                OPT_EXPORT_NAME => {
                    let name = parse_export_name(&data)
                        .map_err(|e| Ended::Why(ConnReason::BadExportName(e)))?;
                    let Some(i) = self.find(&name) else {
                        return Err(Ended::Why(ConnReason::UnknownExport(name)));
                    };
                    let ex = &self.exports[i];
                    let mut r = Vec::with_capacity(134);
                    r.extend_from_slice(&ex.device.geometry().size.to_be_bytes());
                    r.extend_from_slice(&self.tflags(ex).to_be_bytes());
                    if !no_zeroes {
                        r.extend_from_slice(&[0u8; 124]);
                    }
                    s.write_all(&r)?;
                    return Ok(i);
                }
                OPT_ABORT => {
                    let _ = s.write_all(&option_reply(h.option, REP_ACK, &[]));
                    return Err(Ended::Why(ConnReason::Aborted));
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        reply_err(s, h.option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                        continue;
                    }
                    let mut r = Vec::new();
                    for e in &self.exports {
                        r.extend(option_reply(
                            h.option,
                            REP_SERVER,
                            &rep_server(&e.name, &e.description),
                        ));
                    }
                    r.extend(option_reply(h.option, REP_ACK, &[]));
                    s.write_all(&r)?;
                }
                OPT_INFO | OPT_GO => {
                    let req = match GoRequest::parse(&data) {
                        Ok(r) => r,
                        Err(e) => {
                            reply_err(s, h.option, REP_ERR_INVALID, &e.to_string())?;
                            continue;
                        }
                    };
                    let Some(i) = self.find(&req.name) else {
                        reply_err(s, h.option, REP_ERR_UNKNOWN, "no such export")?;
                        continue;
                    };
                    let ex = &self.exports[i];
                    let g = ex.device.geometry();
                    let mut r =
                        option_reply(h.option, REP_INFO, &info_export(g.size, self.tflags(ex)));
                    if req.infos.contains(&INFO_NAME) {
                        r.extend(option_reply(
                            h.option,
                            REP_INFO,
                            &info_string(INFO_NAME, &ex.name),
                        ));
                    }
                    if req.infos.contains(&INFO_DESCRIPTION) && !ex.description.is_empty() {
                        r.extend(option_reply(
                            h.option,
                            REP_INFO,
                            &info_string(INFO_DESCRIPTION, &ex.description),
                        ));
                    }
                    // Sent even when not asked for (the protocol allows it) so clients learn the
                    // maximum payload.
                    let bs = info_block_size(g.min_block, g.preferred_block, self.cfg.max_request);
                    r.extend(option_reply(h.option, REP_INFO, &bs));
                    r.extend(option_reply(h.option, REP_ACK, &[]));
                    s.write_all(&r)?;
                    if h.option == OPT_GO {
                        return Ok(i);
                    }
                }
                _ => reply_err(s, h.option, REP_ERR_UNSUP, "option not supported")?,
            }
        }
    }
}

/// How option haggling ended without an export.
enum Ended {
    Io(io::Error),
    Why(ConnReason),
}

impl From<io::Error> for Ended {
    fn from(e: io::Error) -> Self {
        Ended::Io(e)
    }
}

fn reply_err(s: &mut Deadlined, option: u32, err: u32, msg: &str) -> io::Result<()> {
    s.write_all(&option_reply(option, err, msg.as_bytes()))
}

fn discard(s: &mut Deadlined, mut n: u64) -> io::Result<()> {
    let mut b = [0u8; 8192];
    while n > 0 {
        let k = n.min(b.len() as u64) as usize;
        s.read_exact(&mut b[..k])?;
        n -= k as u64;
    }
    Ok(())
}
