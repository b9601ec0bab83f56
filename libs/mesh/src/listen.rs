//! Listen addresses as every service's flags write them, and the one way they are bound.
//!
//! `:port` means every interface of both families: it parses to `[::]:port`, which
//! [`bind_tcp`] (re-exported from `bigfleet-telemetry`, whose ops server binds too) opens
//! dual-stack, falling back to `0.0.0.0` on a host without IPv6 (docs/adr/0123).

use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};

use bigfleet_telemetry::{MetricsRegistry, OpsServer, Readiness};

pub use bigfleet_telemetry::bind_tcp;

/// Parses `host:port`, or `:port` for every interface (`[::]:port`, dual-stack once bound
/// with [`bind_tcp`]); a host name resolves to its first address. The error is the reason
/// only, so each service wraps it in its own error type.
pub fn parse_listen_addr(addr: &str) -> Result<SocketAddr, String> {
    if let Some(port) = addr.strip_prefix(':') {
        let port = port
            .parse::<u16>()
            .map_err(|e| format!("expected host:port or :port ({e})"))?;
        return Ok(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port));
    }
    if let Ok(a) = addr.parse() {
        return Ok(a);
    }
    addr.to_socket_addrs()
        .map_err(|e| format!("expected host:port or :port ({e})"))?
        .next()
        .ok_or_else(|| "resolves to no address".to_owned())
}

/// [`parse_listen_addr`] for a listener that may be turned off: `0` (or nothing) means
/// none, as `--metrics-addr 0` does in every service.
pub fn parse_optional_listen_addr(addr: &str) -> Result<Option<SocketAddr>, String> {
    match addr.trim() {
        "" | "0" => Ok(None),
        a => parse_listen_addr(a).map(Some),
    }
}

/// Why the ops server a `--metrics-addr` flag names did not start.
#[derive(Debug, thiserror::Error)]
pub enum OpsFlagError {
    #[error("invalid --metrics-addr {addr:?}: {reason}")]
    Address { addr: String, reason: String },
    #[error("serving metrics on {addr}: {source}")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Starts the `/metrics` `/healthz` `/readyz` server at the address a `--metrics-addr` flag
/// gives (`0` turns it off), so every service reads the flag the same way.
pub async fn start_ops_server(
    flag: &str,
    registry: MetricsRegistry,
    readiness: Readiness,
) -> Result<OpsServer, OpsFlagError> {
    let addr = parse_optional_listen_addr(flag).map_err(|reason| OpsFlagError::Address {
        addr: flag.to_owned(),
        reason,
    })?;
    OpsServer::start(addr, registry, readiness)
        .await
        .map_err(|source| OpsFlagError::Serve {
            addr: flag.to_owned(),
            source,
        })
}

/// A peer address as the rest of the mesh reasons about it: an IPv4 client of a dual-stack
/// listener arrives as `::ffff:a.b.c.d`, which is not `is_loopback()` and would key rate
/// limits apart from the same client on an IPv4 listener, so it is mapped back to IPv4.
pub(crate) fn canonical_peer(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn port_only_means_every_interface_of_both_families() {
        assert_eq!(
            parse_listen_addr(":7780").unwrap(),
            "[::]:7780".parse().unwrap()
        );
    }

    #[test]
    fn zero_or_nothing_turns_a_listener_off() {
        assert_eq!(parse_optional_listen_addr("0").unwrap(), None);
        assert_eq!(parse_optional_listen_addr(" ").unwrap(), None);
        assert_eq!(
            parse_optional_listen_addr(":8780").unwrap(),
            Some("[::]:8780".parse().unwrap())
        );
        assert!(parse_optional_listen_addr("nope").is_err());
    }

    #[tokio::test]
    async fn the_metrics_flag_starts_the_ops_server_or_says_why_not() {
        let off = start_ops_server("0", MetricsRegistry::new(), Readiness::ready())
            .await
            .unwrap();
        assert_eq!(off.addr(), None);
        off.stop().await;

        let on = start_ops_server("127.0.0.1:0", MetricsRegistry::new(), Readiness::ready())
            .await
            .unwrap();
        assert!(on.addr().is_some_and(|a| a.port() != 0));
        on.stop().await;

        let bad = start_ops_server("nope", MetricsRegistry::new(), Readiness::ready())
            .await
            .unwrap_err();
        assert!(matches!(bad, OpsFlagError::Address { .. }), "{bad}");
        assert!(
            bad.to_string()
                .starts_with("invalid --metrics-addr \"nope\""),
            "{bad}"
        );
    }

    #[test]
    fn explicit_and_resolved_hosts() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("0.0.0.0:9").unwrap(),
            "0.0.0.0:9".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:9").unwrap(),
            "[::1]:9".parse().unwrap()
        );
        assert!(parse_listen_addr("localhost:1").unwrap().ip().is_loopback());
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_listen_addr("no-port").is_err());
        assert!(parse_listen_addr(":x").is_err());
        assert!(parse_listen_addr(":70000").is_err());
    }

    #[test]
    fn v4_mapped_peers_read_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5".parse().unwrap();
        assert!(!mapped.ip().is_loopback());
        let p = canonical_peer(mapped);
        assert_eq!(p, "127.0.0.1:5".parse().unwrap());
        assert!(p.ip().is_loopback());
        let v6: SocketAddr = "[::1]:5".parse().unwrap();
        assert_eq!(canonical_peer(v6), v6);
    }

    /// Whether the host has an IPv6 loopback (`::1` listed in /proc/net/if_inet6).
    fn has_ipv6_loopback() -> bool {
        std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|t| {
            t.lines()
                .any(|l| l.starts_with("00000000000000000000000000000001"))
        })
    }

    async fn round_trip(listener: &tokio::net::TcpListener, to: SocketAddr) {
        let (client, server) = tokio::join!(tokio::net::TcpStream::connect(to), listener.accept());
        let mut client = client.unwrap_or_else(|e| panic!("connect {to}: {e}"));
        let (mut conn, peer) = server.unwrap();
        assert_eq!(peer.ip().to_canonical(), to.ip(), "accepted from {peer}");
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        conn.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"x");
    }

    #[tokio::test]
    async fn port_only_listener_accepts_ipv4_and_ipv6() {
        if !has_ipv6_loopback() {
            println!("skipped: no IPv6 loopback on this host (::1 not in /proc/net/if_inet6)");
            return;
        }
        let listener = bind_tcp(parse_listen_addr(":0").unwrap()).unwrap();
        let local = listener.local_addr().unwrap();
        assert!(local.is_ipv6() && local.ip().is_unspecified(), "{local}");
        // Set on the socket, not inherited from the host's net.ipv6.bindv6only.
        assert!(!socket2::SockRef::from(&listener).only_v6().unwrap());
        let port = local.port();
        round_trip(&listener, SocketAddr::from(([127, 0, 0, 1], port))).await;
        round_trip(&listener, format!("[::1]:{port}").parse().unwrap()).await;
    }
}
