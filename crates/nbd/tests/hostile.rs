//! Malformed and hostile clients: each gets an error reply or a closed connection, the server
//! never crashes, memory stays bounded, and other clients keep being served correctly.

mod common;
use common::*;
use snapblk_nbd::ConnAction;
use snapblk_nbd::ServerConfig;
use snapblk_nbd::proto::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const SIZE: usize = 8 << 20;

/// A well-behaved client reads a range and checks it, proving the server still works.
fn healthy(addr: &str, data: &[u8]) {
    let mut c = Client::connect(addr, "disk");
    assert_eq!(c.size, data.len() as u64);
    for off in [0usize, 12345 * 8, data.len() - 65536] {
        let got = c.read(off as u64, 65536).unwrap();
        assert!(got == data[off..off + 65536], "data at {off} differs");
    }
    c.send(CMD_DISC, 0, 0, 0, 0, &[]);
    assert!(c.closed());
}

#[test]
fn malformed_negotiation_gets_errors_or_close() {
    let (srv, _img, data, _dir) = serve_image(SIZE, 11, true);

    // Unknown client flags: disconnect.
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    let mut c = Client::raw(s);
    assert!(c.closed());

    // Bad option magic: disconnect.
    let mut s = Client::greet(&srv.addr);
    s.write_all(&[0x55; 16]).unwrap();
    assert!(Client::raw(s).closed());

    // One connection walks through every error path and still gets served at the end.
    let mut s = Client::greet(&srv.addr);
    Client::send_opt(&mut s, OPT_INFO, &vec![0u8; 100_000]); // oversized: skipped
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_TOO_BIG);
    let mut bad_go = GoRequest {
        name: "disk".into(),
        infos: vec![],
    }
    .encode();
    bad_go[0..4].copy_from_slice(&1000u32.to_be_bytes()); // name length past the data
    Client::send_opt(&mut s, OPT_GO, &bad_go);
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_INVALID);
    Client::send_opt(
        &mut s,
        OPT_GO,
        &GoRequest {
            name: "nope".into(),
            infos: vec![],
        }
        .encode(),
    );
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_UNKNOWN);
    Client::send_opt(&mut s, 999, b"xyz");
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_UNSUP);
    Client::send_opt(&mut s, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_UNSUP);
    Client::send_opt(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_UNSUP);
    Client::send_opt(&mut s, OPT_LIST, b"junk");
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ERR_INVALID);
    Client::send_opt(&mut s, OPT_LIST, &[]);
    let (_, ty, d) = Client::read_opt_reply(&mut s);
    assert_eq!(ty, REP_SERVER);
    assert_eq!(&d[4..8], b"disk");
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ACK);
    Client::send_opt(
        &mut s,
        OPT_INFO,
        &GoRequest {
            name: "".into(),
            infos: vec![INFO_NAME, INFO_DESCRIPTION],
        }
        .encode(),
    );
    let mut kinds = Vec::new();
    loop {
        let (_, ty, d) = Client::read_opt_reply(&mut s);
        if ty == REP_ACK {
            break;
        }
        assert_eq!(ty, REP_INFO);
        kinds.push(u16::from_be_bytes([d[0], d[1]]));
    }
    assert_eq!(
        kinds,
        vec![INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    // OPT_EXPORT_NAME (old style) still works after all that.
    Client::send_opt(&mut s, OPT_EXPORT_NAME, b"disk");
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), SIZE as u64);
    let flags = u16::from_be_bytes([r[8], r[9]]);
    assert_ne!(flags & TF_READ_ONLY, 0);
    let mut c = Client {
        s,
        size: SIZE as u64,
        flags,
    };
    assert!(c.read(0, 4096).unwrap() == data[..4096]);

    // EXPORT_NAME of an unknown export or with a huge length: disconnect (no error reply exists).
    let mut s = Client::greet(&srv.addr);
    Client::send_opt(&mut s, OPT_EXPORT_NAME, b"nope");
    assert!(Client::raw(s).closed());
    let mut s = Client::greet(&srv.addr);
    let mut h = IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    h.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&h).unwrap();
    assert!(Client::raw(s).closed());

    // ABORT is acknowledged, then the connection closes.
    let mut s = Client::greet(&srv.addr);
    Client::send_opt(&mut s, OPT_ABORT, &[]);
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ACK);
    assert!(Client::raw(s).closed());

    healthy(&srv.addr, &data);
    srv.stop();
}

#[test]
fn hostile_requests_get_errors_and_cannot_hurt_others() {
    let (srv, img, data, _dir) = serve_image(SIZE, 12, false);
    let mut c = Client::connect(&srv.addr, "disk");
    let size = SIZE as u64;
    assert_eq!(c.read(size - 4096, 8192), Err(EINVAL), "read past the end");
    assert_eq!(c.read(u64::MAX - 100, 4096), Err(EINVAL), "offset overflow");
    assert_eq!(c.read(0, (32 << 20) + 4096), Err(EINVAL), "oversized read");
    assert_eq!(c.read(0, 0), Ok(vec![]), "empty read");
    assert_eq!(c.simple(42, 0, 0, 0, &[]), EINVAL, "unknown command");
    assert_eq!(
        c.simple(CMD_READ, 1 << 9, 0, 512, &[]),
        EINVAL,
        "unknown flag"
    );
    assert_eq!(
        c.simple(CMD_WRITE, 0, size - 512, 1024, &[0u8; 1024]),
        ENOSPC,
        "write past the end"
    );
    assert_eq!(c.simple(CMD_WRITE_ZEROES, 0, size, 4096, &[]), ENOSPC);
    assert_eq!(c.simple(CMD_TRIM, 0, size - 1, 4096, &[]), EINVAL);
    // The connection stayed in sync (the refused write's payload was consumed).
    assert!(c.read(4096, 4096).unwrap() == data[4096..8192]);
    // Several requests in flight at once, answered by cookie.
    for i in 0..32u64 {
        c.send(CMD_READ, 0, 1000 + i, i * 65536, 65536, &[]);
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..32 {
        let (err, cookie) = c.reply().unwrap();
        assert_eq!(err, 0);
        let i = cookie - 1000;
        let mut d = vec![0u8; 65536];
        c.s.read_exact(&mut d).unwrap();
        assert!(
            d == data[(i * 65536) as usize..((i + 1) * 65536) as usize],
            "pipelined read {i}"
        );
        assert!(seen.insert(cookie));
    }
    // An oversized write cannot be resynchronised: that connection is closed.
    c.send(CMD_WRITE, 0, 1, 0, (32 << 20) + 512, &[]);
    assert!(c.closed());

    // Bad request magic: closed.
    let mut c = Client::connect(&srv.addr, "disk");
    c.s.write_all(&[0xee; 28]).unwrap();
    assert!(c.closed());

    // Abrupt disconnects: mid-header, mid-payload, and with replies never read.
    let mut c = Client::connect(&srv.addr, "disk");
    c.s.write_all(
        &RequestHeader {
            flags: 0,
            cmd: CMD_READ,
            cookie: 1,
            offset: 0,
            len: 4096,
        }
        .encode()[..11],
    )
    .unwrap();
    drop(c);
    let mut c = Client::connect(&srv.addr, "disk");
    c.send(CMD_WRITE, 0, 1, 0, 1 << 20, &[0x77; 1000]);
    drop(c);
    let mut c = Client::connect(&srv.addr, "disk");
    for i in 0..64 {
        c.send(CMD_READ, 0, i, 0, 1 << 20, &[]);
    }
    drop(c);

    // A flooding client that never reads its replies pins bounded memory and does not stall
    // others: 400 × 8 MiB of reads requested, while another client is served normally.
    let mut flood = Client::connect(&srv.addr, "disk");
    flood.flood_reads(400, 8 << 20);
    healthy(&srv.addr, &data);
    drop(flood);

    // The partial write above was never applied (its payload never arrived).
    assert!(std::fs::read(&img).unwrap()[..1000] == data[..1000]);
    healthy(&srv.addr, &data);
    srv.stop();
}

#[test]
fn writes_refused_on_read_only_export_keep_the_stream_in_sync() {
    let (srv, img, data, _dir) = serve_image(1 << 20, 13, true);
    let mut c = Client::connect(&srv.addr, "disk");
    assert_ne!(c.flags & TF_READ_ONLY, 0);
    assert_eq!(c.simple(CMD_WRITE, 0, 0, 4096, &[1u8; 4096]), EPERM);
    assert_eq!(c.simple(CMD_TRIM, 0, 0, 4096, &[]), EPERM);
    assert_eq!(c.simple(CMD_WRITE_ZEROES, 0, 0, 4096, &[]), EPERM);
    assert_eq!(c.simple(CMD_FLUSH, 0, 0, 0, &[]), 0);
    assert!(c.read(0, 4096).unwrap() == data[..4096]);
    srv.stop();
    assert!(std::fs::read(&img).unwrap() == data);
}

#[test]
fn random_garbage_never_kills_the_server() {
    let (srv, _img, data, _dir) = serve_image(SIZE, 14, false);
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        let n = (rnd() % 300) as usize;
        let junk: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
        if round % 2 == 0 {
            // Garbage during negotiation.
            let mut s = Client::greet(&srv.addr);
            let _ = s.write_all(&junk);
        } else {
            // Garbage after a successful GO, sometimes starting with a valid request magic.
            let mut c = Client::connect(&srv.addr, "disk");
            let mut b = junk;
            if round % 4 == 1 && b.len() >= 4 {
                b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            }
            let _ = c.s.write_all(&b);
        }
    }
    // Garbage may have written to the writable export; just check the server still serves.
    let mut c = Client::connect(&srv.addr, "disk");
    assert!(c.read(0, 4096).is_ok());
    drop(c);
    let _ = data;
    srv.stop();
}

/// Greet and ask for export `disk` with OPT_GO: the client, or the error reply type and message.
fn try_go(addr: &str) -> Result<Client, (u32, String)> {
    let mut s = Client::greet(addr);
    let go = GoRequest {
        name: "disk".into(),
        infos: vec![],
    };
    Client::send_opt(&mut s, OPT_GO, &go.encode());
    let (mut size, mut flags) = (0, 0);
    loop {
        let (_, ty, d) = Client::read_opt_reply(&mut s);
        match ty {
            REP_ACK => return Ok(Client { s, size, flags }),
            REP_INFO if u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT => {
                size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                flags = u16::from_be_bytes([d[10], d[11]]);
            }
            REP_INFO => {}
            err => return Err((err, String::from_utf8_lossy(&d).into_owned())),
        }
    }
}

/// Negotiates an export, retrying while the server is at its connection limit (slots of
/// clients that just left are freed asynchronously); fails after 10 s.
fn go_when_free(addr: &str) -> Client {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match try_go(addr) {
            Ok(c) => return c,
            Err((REP_ERR_SHUTDOWN, _)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connection slots never freed: {e:?}"),
        }
    }
}

#[test]
fn idle_handshakes_time_out_and_connection_limit_holds() {
    let cfg = ServerConfig {
        handshake_timeout: Some(Duration::from_millis(300)),
        max_connections: 3,
        ..ServerConfig::default()
    };
    let (srv, _img, data, _dir) = serve_image_cfg(SIZE, 15, true, cfg);
    // A silent client is dropped after the timeout.
    let mut idle = Client::raw(Client::greet(&srv.addr));
    assert!(idle.closed());
    // Fill the connection limit; the next one is refused. The client sees the idle
    // connection closed a moment before the server frees its slot, so each of these
    // waits for a free slot rather than assuming one.
    let a = go_when_free(&srv.addr);
    let b = go_when_free(&srv.addr);
    let c = go_when_free(&srv.addr);
    assert!(matches!(try_go(&srv.addr), Err((REP_ERR_SHUTDOWN, _))));
    drop((a, b, c));
    // Slots free up once those clients leave.
    drop(go_when_free(&srv.addr));
    healthy(&srv.addr, &data);
    srv.stop();
}

/// H2: the negotiation has one deadline, not one per read. A client sending one byte every
/// 100 ms never waits 0.5 s for a read, yet must be dropped about 0.5 s after connecting (the
/// whole option takes over 6 s to trickle in).
#[test]
fn a_trickling_client_is_dropped_at_the_negotiation_deadline() {
    let cfg = ServerConfig {
        handshake_timeout: Some(Duration::from_millis(500)),
        ..ServerConfig::default()
    };
    let dir = TempDir::new("nbd-trickle");
    let (img, data) = write_image(dir.path(), "a.img", SIZE, 21);
    let (srv, events) = TestServer::start_events(path_str(&img), true, cfg);
    let t0 = std::time::Instant::now();
    let mut s = Client::greet(&srv.addr);
    let me = s.local_addr().unwrap().to_string();
    let go = GoRequest {
        name: "d".repeat(40),
        infos: vec![],
    }
    .encode();
    let mut msg = IHAVEOPT.to_be_bytes().to_vec();
    msg.extend_from_slice(&OPT_GO.to_be_bytes());
    msg.extend_from_slice(&(go.len() as u32).to_be_bytes());
    msg.extend_from_slice(&go);
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut closed = false;
    for b in &msg {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        let mut r = [0u8; 64];
        match s.read(&mut r) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => panic!("the server answered a trickled option: {:?}", &r[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
        // Generous bound (10 x the deadline); no lower bound is asserted.
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "client trickling one byte per 100 ms still negotiating after {:?}",
            t0.elapsed()
        );
    }
    assert!(closed, "the whole option trickled in without a drop");
    let e = next_event(&events, ConnAction::Dropped, Duration::from_secs(10));
    assert_eq!(e.peer, me);
    assert_eq!(
        e.reason.as_deref(),
        Some("negotiation not finished within the 0.5 s deadline")
    );
    healthy(&srv.addr, &data);
    srv.stop();
}

/// A client over the connection limit gets the greeting, NBD_REP_ERR_SHUTDOWN with a message
/// for its options and an ACK for NBD_OPT_ABORT, then the connection closes; a refused client
/// that goes silent is closed at the deadline. Each is reported once, as are the accepted
/// connection and its end.
#[test]
fn a_client_over_the_limit_is_refused_with_a_message() {
    let cfg = ServerConfig {
        handshake_timeout: Some(Duration::from_millis(500)),
        max_connections: 1,
        ..ServerConfig::default()
    };
    let dir = TempDir::new("nbd-refuse");
    let (img, data) = write_image(dir.path(), "a.img", SIZE, 22);
    let (srv, events) = TestServer::start_events(path_str(&img), true, cfg);
    let mut a = Client::connect(&srv.addr, "disk");
    let e = next_event(&events, ConnAction::Accepted, Duration::from_secs(10));
    assert_eq!(e.peer, a.s.local_addr().unwrap().to_string());
    assert_eq!(e.export.as_deref(), Some("disk"));
    assert_eq!(e.reason, None);

    let mut s = Client::greet(&srv.addr);
    let me = s.local_addr().unwrap().to_string();
    for (opt, data) in [
        (OPT_STRUCTURED_REPLY, vec![]),
        (
            OPT_GO,
            GoRequest {
                name: "disk".into(),
                infos: vec![],
            }
            .encode(),
        ),
    ] {
        Client::send_opt(&mut s, opt, &data);
        let (o, ty, msg) = Client::read_opt_reply(&mut s);
        assert_eq!((o, ty), (opt, REP_ERR_SHUTDOWN));
        assert_eq!(
            String::from_utf8_lossy(&msg),
            "server at its connection limit (1)"
        );
    }
    Client::send_opt(&mut s, OPT_ABORT, &[]);
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ACK);
    assert!(Client::raw(s).closed());
    let e = next_event(&events, ConnAction::Refused, Duration::from_secs(10));
    assert_eq!(e.peer, me);
    assert_eq!(
        e.reason.as_deref(),
        Some("server at its connection limit (1)")
    );

    // Silent after the greeting: closed at the deadline, still reported as refused.
    let mut silent = Client::raw(Client::greet(&srv.addr));
    assert!(silent.closed());
    let e = next_event(&events, ConnAction::Refused, Duration::from_secs(10));
    assert_eq!(e.peer, silent.s.local_addr().unwrap().to_string());

    // The served client was never disturbed; its leaving is reported and frees the slot.
    assert!(a.read(0, 4096).unwrap() == data[..4096]);
    a.send(CMD_DISC, 0, 0, 0, 0, &[]);
    assert!(a.closed());
    let e = next_event(&events, ConnAction::Closed, Duration::from_secs(10));
    assert_eq!(
        e.reason.as_deref(),
        Some("client disconnected (NBD_CMD_DISC)")
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while try_go(&srv.addr).is_err() {
        assert!(std::time::Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    srv.stop();
}

/// Refusals take a thread each for up to the deadline, so only `max_refusals` run at once; a
/// client beyond that is closed at once, and that is reported too.
#[test]
fn refusals_in_progress_are_bounded() {
    let cfg = ServerConfig {
        handshake_timeout: Some(Duration::from_secs(5)),
        max_connections: 1,
        max_refusals: 1,
        ..ServerConfig::default()
    };
    let dir = TempDir::new("nbd-refuse-bound");
    let (img, _data) = write_image(dir.path(), "a.img", SIZE, 23);
    let (srv, events) = TestServer::start_events(path_str(&img), true, cfg);
    let _a = Client::connect(&srv.addr, "disk");
    let _held = Client::greet(&srv.addr); // being refused, silent
    let mut c = TcpStream::connect(&srv.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 18];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)), "no greeting");
    let e = next_event(&events, ConnAction::Refused, Duration::from_secs(10));
    assert_eq!(e.peer, c.local_addr().unwrap().to_string());
    assert_eq!(
        e.reason.as_deref(),
        Some(
            "server at its connection limit (1) and already refusing 1 clients: closed without \
             a reply"
        )
    );
    srv.stop();
}

/// Every way negotiation can fail is reported as "dropped" with its reason; NBD_OPT_ABORT is a
/// normal "closed".
#[test]
fn negotiation_endings_are_reported_with_their_reason() {
    let cfg = ServerConfig {
        handshake_timeout: Some(Duration::from_secs(5)),
        ..ServerConfig::default()
    };
    let dir = TempDir::new("nbd-neg-events");
    let (img, _data) = write_image(dir.path(), "a.img", SIZE, 24);
    let (srv, events) = TestServer::start_events(path_str(&img), true, cfg);
    let next = |want: ConnAction| {
        let e = next_event(&events, want, Duration::from_secs(10));
        (e.peer, e.reason.unwrap_or_default())
    };
    let local = |s: &TcpStream| s.local_addr().unwrap().to_string();

    let mut s = TcpStream::connect(&srv.addr).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    let me = local(&s);
    assert!(Client::raw(s).closed());
    assert_eq!(
        next(ConnAction::Dropped),
        (me, "unknown client flags 0xffffffff".into())
    );

    let mut s = Client::greet(&srv.addr);
    s.write_all(&[0x55; 16]).unwrap();
    let me = local(&s);
    assert!(Client::raw(s).closed());
    assert_eq!(
        next(ConnAction::Dropped),
        (me, "protocol error during negotiation".into())
    );

    let s = Client::greet(&srv.addr);
    let me = local(&s);
    drop(s);
    assert_eq!(
        next(ConnAction::Dropped),
        (me, "client disconnected during negotiation".into())
    );

    let mut s = Client::greet(&srv.addr);
    Client::send_opt(&mut s, OPT_EXPORT_NAME, b"nope");
    let me = local(&s);
    assert!(Client::raw(s).closed());
    assert_eq!(
        next(ConnAction::Dropped),
        (
            me,
            "NBD_OPT_EXPORT_NAME for an unknown export \"nope\"".into()
        )
    );

    let mut s = Client::greet(&srv.addr);
    Client::send_opt(&mut s, OPT_ABORT, &[]);
    assert_eq!(Client::read_opt_reply(&mut s).1, REP_ACK);
    let me = local(&s);
    assert!(Client::raw(s).closed());
    assert_eq!(
        next(ConnAction::Closed),
        (me, "client ended negotiation (NBD_OPT_ABORT)".into())
    );
    srv.stop();
}
#[test]
fn sixteen_concurrent_clients_read_and_verify() {
    let (srv, _img, data, _dir) = serve_image(SIZE, 16, true);
    let data = std::sync::Arc::new(data);
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let (addr, data) = (srv.addr.clone(), data.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(&addr, "disk");
                let mut seed = t + 1;
                let mut next = move || {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    seed >> 11
                };
                let mut checked = 0usize;
                // 8 batches of 8 pipelined random reads.
                for _ in 0..8 {
                    let reqs: Vec<(u64, u32)> = (0..8)
                        .map(|_| {
                            let len = ((next() % 64) as u32 + 1) * 4096;
                            let off = next() % (data.len() as u64 - len as u64);
                            (off, len)
                        })
                        .collect();
                    for (i, (off, len)) in reqs.iter().enumerate() {
                        c.send(CMD_READ, 0, i as u64, *off, *len, &[]);
                    }
                    for _ in 0..reqs.len() {
                        let (err, cookie) = c.reply().unwrap();
                        assert_eq!(err, 0);
                        let (off, len) = reqs[cookie as usize];
                        let mut d = vec![0u8; len as usize];
                        c.s.read_exact(&mut d).unwrap();
                        assert!(
                            d == data[off as usize..(off + len as u64) as usize],
                            "client {t} read {off}+{len}"
                        );
                        checked += len as usize;
                    }
                }
                checked
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(total > 0);
    srv.stop();
}

#[test]
fn stop_completes_even_if_a_client_never_reads_its_replies() {
    let cfg = ServerConfig {
        stop_grace: Duration::from_millis(500),
        ..ServerConfig::default()
    };
    let (srv, _img, _data, _dir) = serve_image_cfg(SIZE, 17, true, cfg);
    let mut stuck = Client::connect(&srv.addr, "disk");
    stuck.flood_reads(200, 8 << 20);
    // Give the server time to fill the socket with replies and block writing.
    std::thread::sleep(Duration::from_millis(300));
    // Not a speed assertion: without the grace cut-off, stop() never returns at all; the
    // generous watchdog turns that hang into a failure.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        srv.stop();
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).is_ok(),
        "server stop hung on a client that never reads"
    );
    drop(stuck);
}
