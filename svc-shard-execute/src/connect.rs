//! Client channels from address URIs (`unix:///abs/path.sock`,
//! `http://host:port`, `https://host:port`) through libs/mesh.
//!
//! Channels are lazy: nothing is dialled until the first call, and a broken
//! connection is re-dialled on the next call, which is what the Work
//! stream's reconnect loop relies on. Every channel goes through the mesh
//! client stack (trace propagation, client RPC metrics) with its tower-level
//! retries off: provider retries must re-stamp their fencing sequence, which
//! only the flows can do (`RetryPolicy::run_with`), Transition is a
//! compare-and-swap whose lost answer the flow must see, and the Work stream
//! reconnects on its own.

use std::time::Duration;

use bigfleet_identity::TlsContext;
use bigfleet_mesh::{
    ChannelConfig, ChannelError, ClientStackConfig, GrpcMetrics, MeshChannel, RetryPolicy, Target,
};

/// HTTP/2 keepalive, shorter than the mesh default: a decide that vanished
/// without a FIN must end the Work stream quickly so its actions are
/// re-derived and this worker reconnects.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A bad address or TLS setup.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("address {addr:?}: {source}")]
    Channel {
        addr: String,
        #[source]
        source: ChannelError,
    },
    #[error("tls: {0}")]
    Tls(#[from] bigfleet_identity::TlsError),
}

/// A lazy channel to `addr` in the mesh client stack, recording client RPC
/// metrics into `metrics` when given. With TLS configured every TCP edge uses
/// mTLS (all-or-nothing per process); Unix sockets never do.
pub fn channel(
    addr: &str,
    tls: Option<&TlsContext>,
    metrics: Option<&GrpcMetrics>,
) -> Result<MeshChannel, ConnectError> {
    let wrap = |source: ChannelError| ConnectError::Channel {
        addr: addr.to_owned(),
        source,
    };
    let target: Target = addr.parse().map_err(|e| wrap(ChannelError::Target(e)))?;
    let cfg = ChannelConfig {
        keepalive_interval: KEEPALIVE_INTERVAL,
        keepalive_timeout: KEEPALIVE_TIMEOUT,
        ..ChannelConfig::default()
    }
    .with_tls(tls.map(TlsContext::client_config).transpose()?);
    let channel = bigfleet_mesh::connect_lazy(&target, &cfg).map_err(wrap)?;
    Ok(bigfleet_mesh::client_stack(
        channel,
        &ClientStackConfig {
            metrics: metrics.cloned(),
            retry: RetryPolicy::none(),
            attempt_timeout: None,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepts_the_three_schemes_and_rejects_others() {
        assert!(channel("unix:///run/bigfleet/decide.sock", None, None).is_ok());
        assert!(channel("http://127.0.0.1:7782", None, None).is_ok());
        assert!(matches!(
            channel("https://127.0.0.1:7782", None, None),
            Err(ConnectError::Channel {
                source: ChannelError::TlsRequired(_),
                ..
            })
        ));
        for bad_addr in ["", "unix://", "tcp://x:1"] {
            assert!(channel(bad_addr, None, None).is_err(), "{bad_addr}");
        }
    }
}
