//! Fuzzes a whole server session: arbitrary client bytes (negotiation and transmission) are fed
//! to a real server over a null device through a socket pair. The server must never panic or
//! hang; it answers or closes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use snapblk_nbd::{Export, Server, ServerConfig, SharedDevice, Stream};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let dev = snapblk::open("null:size=1M", 1).expect("null device");
        let device = Arc::new(SharedDevice::new(dev).expect("shared device"));
        let ex = Export { name: "x".into(), description: String::new(), device, read_only: false, multi_conn: true };
        let cfg = ServerConfig { handshake_timeout: Some(Duration::from_secs(1)), max_request: 1 << 20, ..Default::default() };
        Server::new(vec![ex], cfg).expect("server")
    })
}

fuzz_target!(|data: &[u8]| {
    let (mut client, srv) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || server().serve_connection(Stream::Unix(srv)));
    // The server writes its greeting first; read replies concurrently so it never blocks.
    let mut reader = client.try_clone().unwrap();
    let r = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    let _ = client.write_all(data);
    let _ = client.shutdown(Shutdown::Write);
    t.join().unwrap();
    let _ = client.shutdown(Shutdown::Both);
    r.join().unwrap();
});
