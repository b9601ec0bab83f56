//! Listen addresses as every service's flags write them.

use std::net::{SocketAddr, ToSocketAddrs};

/// Parses `host:port`, or `:port` for every interface; a host name resolves to its first
/// address. The error is the reason only, so each service wraps it in its own error type.
pub fn parse_listen_addr(addr: &str) -> Result<SocketAddr, String> {
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_owned()
    };
    if let Ok(a) = full.parse() {
        return Ok(a);
    }
    full.to_socket_addrs()
        .map_err(|e| format!("expected host:port or :port ({e})"))?
        .next()
        .ok_or_else(|| "resolves to no address".to_owned())
}

#[cfg(test)]
mod tests {
    use super::parse_listen_addr;

    #[test]
    fn port_only_means_every_interface() {
        assert_eq!(
            parse_listen_addr(":7780").unwrap(),
            "0.0.0.0:7780".parse().unwrap()
        );
    }

    #[test]
    fn explicit_and_resolved_hosts() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert!(parse_listen_addr("localhost:1").unwrap().ip().is_loopback());
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_listen_addr("no-port").is_err());
        assert!(parse_listen_addr(":x").is_err());
    }
}
