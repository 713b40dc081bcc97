//! Why a connect timed out: librados says ETIMEDOUT both when no monitor answers and when the
//! monitors answer but never let the client in (a wrong key, a user the cluster does not know,
//! monitors without quorum). After such a timeout the driver asks each monitor address of the
//! configuration directly: a live monitor greets a new connection at once with its messenger
//! banner (`ceph v2` or `ceph v027`); a dead host refuses or stays silent, and so does a stopped
//! monitor process, even though the kernel still accepts its TCP connections.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The monitor ports of the messenger v2 and v1 protocols, tried when an address has none.
const DEFAULT_PORTS: [u16; 2] = [3300, 6789];
/// At most this many addresses are probed, so a long list cannot stretch the error out.
const MAX_PROBES: usize = 6;

/// The addresses (`host:port`) named by a `mon_host` value: `10.0.0.1`, `10.0.0.1:6789`,
/// `[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]`, `mon-a,mon-b`, `[::1]:3300`, separated by
/// commas, semicolons or spaces. An address without a port stands for both default ports.
pub(super) fn addresses(mon_host: &str) -> Vec<String> {
    let mut out = Vec::new();
    for tok in split(mon_host) {
        let t = tok
            .strip_prefix("v2:")
            .or_else(|| tok.strip_prefix("v1:"))
            .unwrap_or(tok);
        // A nonce: `10.0.0.1:3300/0`.
        let t = t.split('/').next().unwrap_or(t);
        if t.is_empty() {
            continue;
        }
        if t.parse::<SocketAddr>().is_ok() {
            out.push(t.to_string());
        } else if let Ok(ip) = t
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            out.extend(DEFAULT_PORTS.map(|p| SocketAddr::new(ip, p).to_string()));
        } else if let Some((host, port)) = t.rsplit_once(':')
            && !host.contains(':')
            && port.parse::<u16>().is_ok()
        {
            out.push(t.to_string());
        } else if !t.contains(':') {
            out.extend(DEFAULT_PORTS.map(|p| format!("{t}:{p}")));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|a| seen.insert(a.clone()));
    out
}

/// The tokens of a `mon_host` value: split at separators, with the brackets of a `[v2:…,v1:…]`
/// group dropped but those of an IPv6 address (`[::1]:3300`) kept.
fn split(s: &str) -> impl Iterator<Item = &str> {
    s.split([',', ';', ' ', '\t']).map(|t| {
        let t = t
            .strip_prefix('[')
            .filter(|r| r.starts_with('v'))
            .unwrap_or(t);
        match t.strip_suffix(']') {
            Some(r) if r.starts_with('v') || !t.starts_with('[') => r,
            _ => t,
        }
    })
}

/// What probing a list of monitor addresses found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// A Ceph daemon answers at this address.
    Answers(String),
    /// None of these addresses answered (the first [`MAX_PROBES`]; `skipped` more not asked).
    Silent { asked: Vec<String>, skipped: usize },
}

/// Ask the first [`MAX_PROBES`] of `addrs` in turn, up to the first where a Ceph daemon
/// answers: one whose first bytes on a new connection are a messenger banner, within `wait`
/// for the connect and again for the banner.
pub(super) fn probe(addrs: &[String], wait: Duration) -> Probe {
    let asked = &addrs[..addrs.len().min(MAX_PROBES)];
    match asked.iter().find(|a| answers(a, wait)) {
        Some(a) => Probe::Answers(a.clone()),
        None => Probe::Silent {
            asked: asked.to_vec(),
            skipped: addrs.len() - asked.len(),
        },
    }
}

fn answers(addr: &str, wait: Duration) -> bool {
    let Ok(resolved) = addr.to_socket_addrs() else {
        return false;
    };
    resolved.into_iter().any(|sa| {
        let Ok(mut s) = TcpStream::connect_timeout(&sa, wait) else {
            return false;
        };
        if s.set_read_timeout(Some(wait)).is_err() {
            return false;
        }
        let mut b = [0u8; 6];
        s.read_exact(&mut b).is_ok() && &b == b"ceph v"
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn mon_host_forms() {
        assert_eq!(addresses("127.0.0.1:13390"), ["127.0.0.1:13390"]);
        assert_eq!(addresses("10.0.0.1"), ["10.0.0.1:3300", "10.0.0.1:6789"]);
        assert_eq!(
            addresses("[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0] [v2:10.0.0.2:3300/0]"),
            ["10.0.0.1:3300", "10.0.0.1:6789", "10.0.0.2:3300"]
        );
        assert_eq!(
            addresses("mon-a, mon-b:6789"),
            ["mon-a:3300", "mon-a:6789", "mon-b:6789"]
        );
        assert_eq!(addresses("[::1]:3300"), ["[::1]:3300"]);
        assert_eq!(addresses("::1"), ["[::1]:3300", "[::1]:6789"]);
        assert_eq!(addresses("[::1]"), ["[::1]:3300", "[::1]:6789"]);
        assert_eq!(addresses("v2:[::1]:3300/0"), ["[::1]:3300"]);
        assert!(addresses("").is_empty());
        assert!(addresses(" , ;").is_empty());
        // Repeats are asked once, in the order first named.
        assert_eq!(
            addresses("10.0.0.1, 10.0.0.1:3300"),
            ["10.0.0.1:3300", "10.0.0.1:6789"]
        );
    }

    #[test]
    fn a_banner_answers_a_silent_listener_does_not() {
        let live = TcpListener::bind("127.0.0.1:0").unwrap();
        let live_addr = live.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (mut s, _) = live.accept().unwrap();
            s.write_all(b"ceph v2\n").unwrap();
        });
        // Bound and listening, never accepting: the kernel completes the handshake, nothing
        // is ever sent, as with a stopped monitor.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let wait = Duration::from_millis(300);
        assert_eq!(
            probe(std::slice::from_ref(&silent_addr), wait),
            Probe::Silent {
                asked: vec![silent_addr.clone()],
                skipped: 0
            }
        );
        assert_eq!(
            probe(&[silent_addr, live_addr.clone()], wait),
            Probe::Answers(live_addr)
        );
        t.join().unwrap();
        // Nobody listening: refused.
        let gone = TcpListener::bind("127.0.0.1:0").unwrap();
        let gone_addr = gone.local_addr().unwrap().to_string();
        drop(gone);
        let many: Vec<String> = std::iter::repeat_n(gone_addr.clone(), MAX_PROBES + 2).collect();
        assert_eq!(
            probe(&many, wait),
            Probe::Silent {
                asked: many[..MAX_PROBES].to_vec(),
                skipped: 2
            }
        );
        assert_eq!(
            probe(&[], wait),
            Probe::Silent {
                asked: vec![],
                skipped: 0
            }
        );
    }
}
