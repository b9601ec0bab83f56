//! Connection- and HTTP/2-level limits for every server, in one place (ADR-0102): what a
//! single TCP peer may cost a server before the first byte reaches a handler.

use std::time::Duration;

/// Limits applied by [`crate::MeshServer`] to every connection it accepts.
///
/// Two presets: [`ServerLimits::network`] for servers with a TCP listener (anyone on the
/// network can open connections) and [`ServerLimits::local`] for Unix-socket-only servers
/// (peers are processes of the same pod, checked by uid; their multiplexing is the mesh's
/// own traffic, e.g. thousands of concurrent roll-up forwards on one gateway → decide
/// connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: streams one connection may have open. A
    /// client past it waits (well-behaved) or gets its extra streams refused.
    pub max_concurrent_streams: u32,
    /// Streams a client may open and reset before the server accepted them (the
    /// CVE-2023-44487 "rapid reset" bound); past it the connection gets GOAWAY.
    pub max_pending_accept_reset_streams: usize,
    /// Streams the server may reset because of a client's protocol errors before it closes
    /// the connection.
    pub max_local_error_reset_streams: usize,
    /// Largest header list (HPACK-decoded bytes) a request may carry.
    pub max_header_list_size: u32,
    /// A connection is asked to go away (GOAWAY) after this age, so that rotated or revoked
    /// certificates stop being honoured within a bounded time and load rebalances
    /// (`None`: connections live forever — only for Unix sockets).
    pub max_connection_age: Option<Duration>,
    /// After the GOAWAY, in-flight streams get this long before the connection is closed.
    pub max_connection_age_grace: Duration,
    /// TCP keepalive probes after this much idle time (dead peers free their slot).
    pub tcp_keepalive: Option<Duration>,
    /// TLS handshakes in progress at once; further accepted sockets wait for a slot (the
    /// kernel's backlog absorbs bursts) instead of each costing a task and a buffer.
    pub max_concurrent_handshakes: usize,
    /// A client that opens TCP but does not finish the TLS handshake in time is dropped.
    pub handshake_timeout: Duration,
}

impl ServerLimits {
    /// Defaults for a server reachable over TCP.
    pub fn network() -> Self {
        Self {
            max_concurrent_streams: 512,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 256,
            max_header_list_size: 16 * 1024,
            max_connection_age: Some(Duration::from_secs(30 * 60)),
            max_connection_age_grace: Duration::from_secs(30),
            tcp_keepalive: Some(Duration::from_secs(60)),
            max_concurrent_handshakes: 256,
            handshake_timeout: Duration::from_secs(10),
        }
    }

    /// Defaults for a Unix-socket-only server (same-pod peers): streams are the mesh's own
    /// multiplexed calls, so the stream cap is high; reset and header bounds stay, since a
    /// buggy peer is still a peer to survive.
    pub fn local() -> Self {
        Self {
            max_concurrent_streams: 65_536,
            max_local_error_reset_streams: 4096,
            max_connection_age: None,
            tcp_keepalive: None,
            ..Self::network()
        }
    }

    /// Applies the HTTP/2 and connection settings to a tonic server builder.
    pub(crate) fn apply<L>(
        &self,
        builder: tonic::transport::Server<L>,
    ) -> tonic::transport::Server<L> {
        let builder = builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_max_pending_accept_reset_streams(Some(self.max_pending_accept_reset_streams))
            .http2_max_local_error_reset_streams(Some(self.max_local_error_reset_streams))
            .http2_max_header_list_size(self.max_header_list_size);
        match self.max_connection_age {
            Some(age) => builder
                .max_connection_age(age)
                .max_connection_age_grace(self.max_connection_age_grace),
            None => builder,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_servers_bound_every_dimension() {
        let n = ServerLimits::network();
        assert!(n.max_concurrent_streams <= 1024);
        assert!(n.max_pending_accept_reset_streams <= 100);
        assert!(n.max_connection_age.is_some());
        assert!(n.tcp_keepalive.is_some());
        assert!(n.max_concurrent_handshakes > 0);
    }

    #[test]
    fn local_servers_keep_the_protocol_bounds() {
        let l = ServerLimits::local();
        let n = ServerLimits::network();
        assert_eq!(
            l.max_pending_accept_reset_streams,
            n.max_pending_accept_reset_streams
        );
        assert_eq!(l.max_header_list_size, n.max_header_list_size);
        assert!(l.max_concurrent_streams > n.max_concurrent_streams);
    }
}
