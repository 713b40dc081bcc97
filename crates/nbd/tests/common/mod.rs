//! Shared helpers for the NBD server tests: an in-process server over a real file device and a
//! tiny raw protocol client for the hostile-input tests. Temp dirs, test images and the external
//! tools (which fail the test when missing) come from snapblk-testsupport, re-exported here.

#![allow(dead_code)]

use snapblk_nbd::proto::*;
use snapblk_nbd::{
    ConnAction, ConnEvent, EventHook, Export, Listener, Server, ServerConfig, SharedDevice,
    StopHandle,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::thread::JoinHandle;
use std::time::Duration;

pub use snapblk_testsupport::*;

/// A pattern image (`len` bytes, `seed`) in a fresh temp dir, served as export `disk` on a
/// loopback TCP port: `(server, image path, image bytes, dir)`; keep `dir` alive while the test
/// uses the image.
pub fn serve_image(
    len: usize,
    seed: u64,
    read_only: bool,
) -> (TestServer, PathBuf, Vec<u8>, TempDir) {
    serve_image_cfg(len, seed, read_only, ServerConfig::default())
}

pub fn serve_image_cfg(
    len: usize,
    seed: u64,
    read_only: bool,
    cfg: ServerConfig,
) -> (TestServer, PathBuf, Vec<u8>, TempDir) {
    let dir = TempDir::new("nbd-test");
    let (img, data) = write_image(dir.path(), "a.img", len, seed);
    let srv = TestServer::start_cfg(path_str(&img), read_only, "127.0.0.1:0", cfg);
    (srv, img, data, dir)
}

/// A connection event as the server's hook reported it (the reason as its message).
#[derive(Debug, Clone)]
pub struct Event {
    pub id: u64,
    pub peer: String,
    pub action: ConnAction,
    pub export: Option<String>,
    pub reason: Option<String>,
}

/// The next event with `action` (others are skipped), waiting at most `limit`.
pub fn next_event(rx: &Receiver<Event>, action: ConnAction, limit: Duration) -> Event {
    let end = std::time::Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if e.action == action => return e,
            Ok(_) => {}
            Err(e) => panic!("no {action} event within {limit:?}: {e}"),
        }
    }
}

pub struct TestServer {
    pub addr: String,
    pub uri: String,
    stop: StopHandle,
    th: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Serve the device `spec` as export `disk` on a fresh loopback port (or unix socket).
    pub fn start(spec: &str, read_only: bool, bind: &str) -> TestServer {
        Self::start_cfg(spec, read_only, bind, ServerConfig::default())
    }

    pub fn start_cfg(spec: &str, read_only: bool, bind: &str, cfg: ServerConfig) -> TestServer {
        let dev = snapblk::open(spec, 1).unwrap_or_else(|e| panic!("open {spec}: {e}"));
        Self::start_device(dev, read_only, bind, cfg)
    }

    /// Serve a started device (e.g. one over a test driver) as export `disk`.
    pub fn start_device(
        dev: snapblk_core::Blkio,
        read_only: bool,
        bind: &str,
        cfg: ServerConfig,
    ) -> TestServer {
        Self::start_hooked(dev, read_only, bind, cfg, None)
    }

    /// Like [`TestServer::start_cfg`], and every connection event arrives on the receiver.
    pub fn start_events(
        spec: &str,
        read_only: bool,
        cfg: ServerConfig,
    ) -> (TestServer, Receiver<Event>) {
        let dev = snapblk::open(spec, 1).unwrap_or_else(|e| panic!("open {spec}: {e}"));
        let (tx, rx) = channel();
        let hook: EventHook = Box::new(move |e: &ConnEvent| {
            let _ = tx.send(Event {
                id: e.id,
                peer: e.peer.clone(),
                action: e.action,
                export: e.export.clone(),
                reason: e.reason.as_ref().map(|r| r.to_string()),
            });
        });
        let srv = Self::start_hooked(dev, read_only, "127.0.0.1:0", cfg, Some(hook));
        (srv, rx)
    }

    fn start_hooked(
        dev: snapblk_core::Blkio,
        read_only: bool,
        bind: &str,
        cfg: ServerConfig,
        hook: Option<EventHook>,
    ) -> TestServer {
        let dev = Arc::new(SharedDevice::new(dev).unwrap());
        let ex = Export {
            name: "disk".into(),
            description: "test disk".into(),
            device: dev,
            read_only,
            multi_conn: true,
        };
        let mut server = Server::new(vec![ex], cfg).unwrap();
        if let Some(h) = hook {
            server = server.on_event(h);
        }
        let listener = Listener::bind(bind).unwrap();
        let addr = listener.address();
        let uri = listener.uri("disk");
        let stop = server.stop_handle();
        let th = std::thread::spawn(move || server.run(&listener).unwrap());
        TestServer {
            addr,
            uri,
            stop,
            th: Some(th),
        }
    }

    /// Stop the server and wait until every connection has finished.
    pub fn stop(mut self) {
        self.stop.stop();
        if let Some(t) = self.th.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.th.take() {
            let _ = t.join();
        }
    }
}

/// A raw protocol client (fixed newstyle, simple replies).
pub struct Client {
    pub s: TcpStream,
    pub size: u64,
    pub flags: u16,
}

impl Client {
    /// Wrap a stream that has not finished negotiation (size and flags unknown).
    pub fn raw(s: TcpStream) -> Client {
        Client {
            s,
            size: 0,
            flags: 0,
        }
    }

    /// Connect and read the server greeting; returns the stream positioned at option haggling.
    pub fn greet(addr: &str) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], &NBDMAGIC.to_be_bytes());
        assert_eq!(&hello[8..16], &IHAVEOPT.to_be_bytes());
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        s
    }

    pub fn send_opt(s: &mut TcpStream, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        s.write_all(&b).unwrap();
    }

    /// Read one option reply: (option, reply type, data).
    pub fn read_opt_reply(s: &mut TcpStream) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        assert_eq!(&h[..8], &OPT_REPLY_MAGIC.to_be_bytes());
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let ty = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        assert!(len < 1 << 20);
        let mut d = vec![0u8; len as usize];
        s.read_exact(&mut d).unwrap();
        (opt, ty, d)
    }

    /// Full handshake with NBD_OPT_GO.
    pub fn connect(addr: &str, name: &str) -> Client {
        let mut s = Self::greet(addr);
        let go = GoRequest {
            name: name.into(),
            infos: vec![INFO_BLOCK_SIZE],
        };
        Self::send_opt(&mut s, OPT_GO, &go.encode());
        let (mut size, mut flags) = (0, 0);
        loop {
            let (opt, ty, d) = Self::read_opt_reply(&mut s);
            assert_eq!(opt, OPT_GO);
            match ty {
                REP_ACK => break,
                REP_INFO if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                    size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes([d[10], d[11]]);
                }
                REP_INFO => {}
                other => panic!("GO failed: {other:#x} {}", String::from_utf8_lossy(&d)),
            }
        }
        Client { s, size, flags }
    }

    pub fn send(
        &mut self,
        cmd: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) {
        let h = RequestHeader {
            flags,
            cmd,
            cookie,
            offset,
            len,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
    }

    /// Read a simple reply header: (error, cookie).
    pub fn reply(&mut self) -> std::io::Result<(u32, u64)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        assert_eq!(&h[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        Ok((
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
        ))
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.send(CMD_READ, 0, 7, offset, len, &[]);
        let (err, cookie) = self.reply().unwrap();
        assert_eq!(cookie, 7);
        if err != 0 {
            return Err(err);
        }
        let mut d = vec![0u8; len as usize];
        self.s.read_exact(&mut d).unwrap();
        Ok(d)
    }

    pub fn simple(&mut self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> u32 {
        self.send(cmd, flags, 9, offset, len, payload);
        let (err, cookie) = self.reply().unwrap();
        assert_eq!(cookie, 9);
        err
    }

    /// Whether the server has closed the connection (EOF within the timeout).
    pub fn closed(&mut self) -> bool {
        self.s
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }

    /// Pipeline `count` reads of `len` bytes each without ever reading a reply, until the server
    /// stops reading (a 5 s write timeout: back-pressure). Returns how many were sent.
    pub fn flood_reads(&mut self, count: u64, len: u32) -> u64 {
        self.s
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        for i in 0..count {
            let h = RequestHeader {
                flags: 0,
                cmd: CMD_READ,
                cookie: i,
                offset: 0,
                len,
            };
            if self.s.write_all(&h.encode()).is_err() {
                return i;
            }
        }
        count
    }
}
