//! Sockets: TCP and unix listeners behind one type, and the wakeable wait the accept loop uses.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// Default NBD port.
pub const DEFAULT_PORT: u16 = 10809;

/// A connected client socket.
pub enum Stream {
    /// A TCP connection.
    Tcp(TcpStream),
    /// A unix-socket connection (also one end of a socket pair, for tests and fuzzing).
    Unix(UnixStream),
}

impl Stream {
    /// A second handle on the same socket (one thread reads, another writes).
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    /// Shut down one or both directions of the socket.
    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }
    /// Bound every blocking read (`None`: no bound).
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    /// Bound every blocking write (`None`: no bound).
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
    /// Who is on the other end, for logs: `HOST:PORT` for TCP, `unix:pid=N` for a unix socket
    /// (the peer's pid from `SO_PEERCRED`, or plain `unix` when the kernel does not say).
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp:unknown".into()),
            Stream::Unix(s) => match peer_pid(s.as_raw_fd()) {
                Some(pid) => format!("unix:pid={pid}"),
                None => "unix".into(),
            },
        }
    }
    fn prepare(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                // Replies are batched by the writer; Nagle would only add latency.
                s.set_nodelay(true)
            }
            Stream::Unix(s) => s.set_nonblocking(false),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The pid of a unix socket's peer (`SO_PEERCRED`), if the kernel reports one.
fn peer_pid(fd: RawFd) -> Option<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid, exclusively borrowed ucred and `len` holds its exact size, as
    // SO_PEERCRED requires; `fd` is an open socket owned by the caller for the whole call.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

/// A listening socket.
pub enum Listener {
    /// Listening on a TCP address (non-blocking).
    Tcp(TcpListener),
    /// Listening on a unix socket path; the socket file is removed on drop.
    Unix {
        /// The bound socket (non-blocking).
        listener: UnixListener,
        /// The socket file's path.
        path: PathBuf,
    },
}

impl Listener {
    /// Bind `spec`: `unix:/path`, `HOST:PORT`, `:PORT` or `PORT` (the last two on 127.0.0.1, so
    /// nothing is exposed beyond the host unless an address is given explicitly).
    pub fn bind(spec: &str) -> io::Result<Listener> {
        if let Some(path) = spec.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            // Replace a stale socket left by a killed server, but never another kind of file.
            if let Ok(m) = std::fs::symlink_metadata(&path) {
                if m.file_type().is_socket() {
                    if UnixStream::connect(&path).is_ok() {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            "socket is in use by a live server",
                        ));
                    }
                    std::fs::remove_file(&path)?;
                } else {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "path exists and is not a socket",
                    ));
                }
            }
            let listener = UnixListener::bind(&path)?;
            listener.set_nonblocking(true)?;
            return Ok(Listener::Unix { listener, path });
        }
        let addrs: Vec<SocketAddr> = if let Ok(port) = spec.trim_start_matches(':').parse::<u16>() {
            vec![SocketAddr::from(([127, 0, 0, 1], port))]
        } else {
            spec.to_socket_addrs()?.collect()
        };
        let l = TcpListener::bind(&addrs[..])?;
        l.set_nonblocking(true)?;
        Ok(Listener::Tcp(l))
    }

    /// `HOST:PORT` or `unix:/path`, with the port actually bound.
    pub fn address(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Listener::Unix { path, .. } => format!("unix:{}", path.display()),
        }
    }

    /// An NBD URI for the default export (`nbd://…` or `nbd+unix://…`).
    pub fn uri(&self, export: &str) -> String {
        match self {
            Listener::Tcp(l) => match l.local_addr() {
                Ok(SocketAddr::V6(a)) => format!("nbd://[{}]:{}/{export}", a.ip(), a.port()),
                Ok(a) => format!("nbd://{a}/{export}"),
                Err(_) => String::new(),
            },
            Listener::Unix { path, .. } => {
                format!("nbd+unix:///{export}?socket={}", path.display())
            }
        }
    }

    /// Accept one pending connection (`WouldBlock` when none).
    pub fn accept(&self) -> io::Result<Stream> {
        let s = match self {
            Listener::Tcp(l) => Stream::Tcp(l.accept()?.0),
            Listener::Unix { listener, .. } => Stream::Unix(listener.accept()?.0),
        };
        s.prepare()?;
        Ok(s)
    }

    /// The listening socket, for `poll`.
    pub(crate) fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix { listener, .. } => listener.as_raw_fd(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Wait until one of `fds` is readable or `timeout` passes. Returns which fds are readable.
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `p` is a valid, exclusively borrowed array of `p.len()` pollfd structs for the call.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(p.iter().map(|x| x.revents != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_port_binds_loopback() {
        let l = Listener::bind("0").unwrap();
        assert!(l.address().starts_with("127.0.0.1:"), "{}", l.address());
        let l = Listener::bind(":0").unwrap();
        assert!(l.address().starts_with("127.0.0.1:"));
        assert!(l.uri("x").starts_with("nbd://127.0.0.1:"));
    }

    #[test]
    fn unix_socket_replaces_only_stale_sockets() {
        let dir = std::env::temp_dir().join(format!("snapblk-nbd-net-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s");
        let spec = format!("unix:{}", p.display());
        let l = Listener::bind(&spec).unwrap();
        assert!(
            Listener::bind(&spec).is_err(),
            "live socket must not be stolen"
        );
        drop(l);
        assert!(!p.exists());
        std::fs::write(&p, b"x").unwrap();
        assert!(
            Listener::bind(&spec).is_err(),
            "regular file must not be removed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
