//! The NBD server: accept loop, fixed-newstyle negotiation, and per-connection threads.

use crate::conn;
use crate::device::SharedDevice;
use crate::net::{Listener, Stream, wait_readable};
use crate::proto::{self, *};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One named export.
pub struct Export {
    /// Name clients ask for; the empty name also selects the first export.
    pub name: String,
    pub description: String,
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
    /// Connections beyond this are closed at once.
    pub max_connections: usize,
    /// A client must finish negotiating within this time of each read.
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
    #[error("no exports configured")]
    NoExports,
    #[error("duplicate export name {0:?}")]
    DuplicateExport(String),
    #[error("export name longer than {} bytes", proto::MAX_STRING)]
    NameTooLong,
    #[error("max request {0} must be a multiple of the device block size {1}")]
    BadMaxRequest(u32, u32),
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
    pub fn stop(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        let _ = (&self.0.wake_tx).write(&[1]);
    }
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
    next_id: AtomicU64,
}

/// Result of negotiation.
enum Negotiated {
    Transmit(usize),
    Close,
}

impl Server {
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
            next_id: AtomicU64::new(0),
        })
    }

    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop.clone())
    }

    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stream>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
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
                    if self.conns().len() >= self.cfg.max_connections {
                        continue; // dropped: closed
                    }
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let Ok(ctl) = stream.try_clone() else {
                        continue;
                    };
                    self.conns().insert(id, ctl);
                    let spawned = std::thread::Builder::new()
                        .name(format!("nbd-conn-{id}"))
                        .spawn_scoped(s, move || {
                            self.serve_conn(stream);
                            self.conns().remove(&id);
                        });
                    if spawned.is_err() {
                        self.conns().remove(&id);
                    }
                }
            };
            // Stop intake on every connection; each finishes what is in flight, then closes.
            self.stop.flag.store(true, Ordering::SeqCst);
            for c in self.conns().values() {
                let _ = c.shutdown(Shutdown::Read);
            }
            let deadline = std::time::Instant::now() + self.cfg.stop_grace;
            while !self.conns().is_empty() && std::time::Instant::now() < deadline {
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
        self.serve_conn(stream)
    }

    fn serve_conn(&self, mut stream: Stream) {
        if stream.set_read_timeout(self.cfg.handshake_timeout).is_err() {
            return;
        }
        let idx = match self.negotiate(&mut stream) {
            Ok(Negotiated::Transmit(i)) => i,
            Ok(Negotiated::Close) | Err(_) => return,
        };
        if stream.set_read_timeout(None).is_err() {
            return;
        }
        if let Some(ex) = self.exports.get(idx) {
            conn::transmit(stream, ex, &self.cfg, &self.stop.flag);
        }
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

    /// Fixed-newstyle negotiation. Returns which export to serve, or that the client left.
    fn negotiate(&self, s: &mut Stream) -> io::Result<Negotiated> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        s.write_all(&hello)?;
        let mut cf = [0u8; 4];
        s.read_exact(&mut cf)?;
        let cflags = u32::from_be_bytes(cf);
        if cflags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Ok(Negotiated::Close); // spec: unknown client flags → disconnect
        }
        let no_zeroes = cflags & FLAG_C_NO_ZEROES != 0;
        // Option data we are willing to hold: a GO with a maximal name and many info requests.
        const MAX_OPT: u32 = 4 + proto::MAX_STRING as u32 + 2 + 2 * 64;
        loop {
            let mut hb = [0u8; OptionHeader::LEN];
            s.read_exact(&mut hb)?;
            let h = match OptionHeader::parse(&hb) {
                Ok(h) => h,
                Err(_) => return Ok(Negotiated::Close),
            };
            if h.len > MAX_OPT {
                if h.option == OPT_EXPORT_NAME {
                    return Ok(Negotiated::Close); // no error reply exists for this option
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
                return Ok(Negotiated::Close);
            }
            match h.option {
                OPT_EXPORT_NAME => {
                    let Some(i) = parse_export_name(&data).ok().and_then(|n| self.find(&n)) else {
                        return Ok(Negotiated::Close);
                    };
                    let ex = &self.exports[i];
                    let mut r = Vec::with_capacity(134);
                    r.extend_from_slice(&ex.device.geometry().size.to_be_bytes());
                    r.extend_from_slice(&self.tflags(ex).to_be_bytes());
                    if !no_zeroes {
                        r.extend_from_slice(&[0u8; 124]);
                    }
                    s.write_all(&r)?;
                    return Ok(Negotiated::Transmit(i));
                }
                OPT_ABORT => {
                    let _ = s.write_all(&option_reply(h.option, REP_ACK, &[]));
                    return Ok(Negotiated::Close);
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
                        return Ok(Negotiated::Transmit(i));
                    }
                }
                _ => reply_err(s, h.option, REP_ERR_UNSUP, "option not supported")?,
            }
        }
    }
}

fn reply_err(s: &mut Stream, option: u32, err: u32, msg: &str) -> io::Result<()> {
    s.write_all(&option_reply(option, err, msg.as_bytes()))
}

fn discard(s: &mut Stream, mut n: u64) -> io::Result<()> {
    let mut b = [0u8; 8192];
    while n > 0 {
        let k = n.min(b.len() as u64) as usize;
        s.read_exact(&mut b[..k])?;
        n -= k as u64;
    }
    Ok(())
}
