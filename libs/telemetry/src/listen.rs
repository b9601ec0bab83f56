//! Binding TCP listeners: the IPv6 wildcard `[::]` binds dual-stack, with an IPv4
//! fallback on hosts without IPv6.
//!
//! This lives here, below `bigfleet-mesh`, because the ops server binds its port too and
//! the mesh depends on this crate; the mesh re-exports [`bind_tcp`] next to its parser of
//! listen flags (`:port` ⇒ `[::]:port`), and every service binds through it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// The accept queue length tokio's own `TcpListener::bind` asks for.
const BACKLOG: i32 = 1024;

/// Binds a TCP listener on `addr` (port 0 picks one); call it inside a tokio runtime.
///
/// `[::]` accepts IPv4 and IPv6 on one socket (`IPV6_V6ONLY` off, whatever the host's
/// `net.ipv6.bindv6only` default), so IPv6-only and dual-stack clusters can reach the
/// pod; on a host without IPv6 it falls back to `0.0.0.0`. Any other address binds as
/// given.
pub fn bind_tcp(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::from_std(bind_with(addr, open)?)
}

fn bind_with(
    addr: SocketAddr,
    open: impl Fn(SocketAddr) -> io::Result<Socket>,
) -> io::Result<std::net::TcpListener> {
    if addr.ip() != IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        return open(addr).map(Into::into);
    }
    match open(addr) {
        Ok(socket) => Ok(socket.into()),
        // These would fail on 0.0.0.0 just the same; falling back would hide the cause.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied
            ) =>
        {
            Err(e)
        }
        Err(e) => {
            tracing::info!(
                port = addr.port(),
                error = %e,
                "cannot listen on [::] (no IPv6 on this host?); listening on 0.0.0.0 only"
            );
            open(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port())).map(Into::into)
        }
    }
}

fn open(addr: SocketAddr) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    // As std and tokio do on Unix: a restarted server rebinds past TIME_WAIT connections.
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WILDCARD_V6: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);

    /// Stands in for a kernel without IPv6: `socket(AF_INET6, …)` fails.
    fn no_ipv6(addr: SocketAddr) -> io::Result<Socket> {
        if addr.is_ipv6() {
            Err(io::Error::from_raw_os_error(EAFNOSUPPORT))
        } else {
            open(addr)
        }
    }

    /// Linux's EAFNOSUPPORT; any error other than "in use"/"denied" takes the fallback.
    const EAFNOSUPPORT: i32 = 97;

    #[test]
    fn wildcard_v6_falls_back_to_ipv4_without_ipv6() {
        let l = bind_with(WILDCARD_V6, no_ipv6).unwrap();
        let local = l.local_addr().unwrap();
        assert_eq!(local.ip(), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        assert_ne!(local.port(), 0);
    }

    #[test]
    fn address_in_use_is_not_hidden_by_the_fallback() {
        let in_use = |_: SocketAddr| -> io::Result<Socket> {
            Err(io::Error::from(io::ErrorKind::AddrInUse))
        };
        let err = bind_with(WILDCARD_V6, in_use).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn explicit_addresses_never_fall_back() {
        let fails = |_: SocketAddr| -> io::Result<Socket> {
            Err(io::Error::from(io::ErrorKind::AddrNotAvailable))
        };
        let specific: SocketAddr = "[::1]:0".parse().unwrap();
        assert!(bind_with(specific, fails).is_err());
        let v4 = bind_with("127.0.0.1:0".parse().unwrap(), open).unwrap();
        assert!(v4.local_addr().unwrap().ip().is_loopback());
    }
}
