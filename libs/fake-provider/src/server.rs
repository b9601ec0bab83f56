//! Serving the fake over TCP or a Unix socket (with gRPC health and reflection), and
//! dialling any provider by URI.
//!
//! A plain tonic router (health, reflection v1 and v1alpha so grpcurl 1.8 can list and
//! describe) on a [`BareServer`]: the fake stands in for an out-of-tree provider, which
//! carries none of the mesh's server stack.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bigfleet_mesh::{BareServer, ChannelConfig, ChannelError, Target, TargetError};
use bigfleet_proto::service_names::CAPACITY_PROVIDER;
use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};

use crate::metrics::ProviderMetrics;
use crate::{FakeProvider, FakeProviderService, MAX_MESSAGE_SIZE};

/// HTTP/2 windows big enough that a 100 MB List is not throttled by flow control.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;
/// Largest DATA frame a peer may send us: big Lists travel in fewer frames, while other
/// calls on the same connection wait at most one 1 MiB frame.
const MAX_FRAME: u32 = 1 << 20;

/// Where a spawned server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// A running server. Dropping it (or [`ServerHandle::shutdown`]) stops it.
#[derive(Debug)]
pub struct ServerHandle {
    bound: Bound,
    server: BareServer,
}

impl ServerHandle {
    pub fn bound(&self) -> &Bound {
        &self.bound
    }

    /// The address clients pass to [`connect`]: `http://ip:port` or `unix:///path`.
    pub fn target(&self) -> String {
        match &self.bound {
            Bound::Tcp(a) => format!("http://{a}"),
            Bound::Unix(p) => format!("unix://{}", p.display()),
        }
    }

    /// Stops accepting, lets in-flight calls finish and waits for the server task.
    pub async fn shutdown(self) {
        if let Err(e) = self.server.stop().await {
            tracing::warn!(error = %e, "provider server ended with an error");
        }
    }

    /// Waits until the server stops on its own (an error) — for `run`.
    pub async fn wait(self) -> Result<(), tonic::transport::Error> {
        self.server.wait().await
    }
}

/// Options for a spawned server.
#[derive(Clone, Default)]
pub struct ServeOptions {
    pub metrics: Option<ProviderMetrics>,
    /// Delay before every mutating call is handled (`--rpc-latency`).
    pub rpc_latency: std::time::Duration,
}

fn builder() -> Server {
    Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
}

fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(CAPACITY_PROVIDER)
        .with_service_name("grpc.health.v1.Health")
}

async fn router(
    provider: Arc<FakeProvider>,
    opts: ServeOptions,
) -> std::io::Result<tonic::transport::server::Router> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<FakeProviderService>().await;
    let reflection =
        |e: tonic_reflection::server::Error| std::io::Error::other(format!("reflection: {e}"));
    let v1 = reflection_builder().build_v1().map_err(reflection)?;
    let v1alpha = reflection_builder().build_v1alpha().map_err(reflection)?;
    Ok(builder()
        .add_service(health)
        .add_service(v1)
        .add_service(v1alpha)
        .add_service(FakeProviderService::with_options(
            provider,
            opts.metrics,
            opts.rpc_latency,
        )))
}

/// Serves `provider` on `addr` (port 0 picks a free one).
pub async fn spawn_tcp(
    addr: SocketAddr,
    provider: Arc<FakeProvider>,
) -> std::io::Result<ServerHandle> {
    spawn_tcp_with(addr, provider, ServeOptions::default()).await
}

pub async fn spawn_tcp_with(
    addr: SocketAddr,
    provider: Arc<FakeProvider>,
    opts: ServeOptions,
) -> std::io::Result<ServerHandle> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let router = router(provider, opts).await?;
    // Small answers must not wait for a delayed ACK (Nagle adds ~40 ms per call).
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = BareServer::spawn(router, incoming);
    tracing::info!(addr = %local, "fake provider serving over tcp");
    Ok(ServerHandle {
        bound: Bound::Tcp(local),
        server,
    })
}

/// Serves `provider` on a Unix socket at `path` (a stale socket file there is replaced).
pub async fn spawn_uds(path: &Path, provider: Arc<FakeProvider>) -> std::io::Result<ServerHandle> {
    spawn_uds_with(path, provider, ServeOptions::default()).await
}

pub async fn spawn_uds_with(
    path: &Path,
    provider: Arc<FakeProvider>,
    opts: ServeOptions,
) -> std::io::Result<ServerHandle> {
    remove_stale_socket(path)?;
    let listener = UnixListener::bind(path)?;
    let router = router(provider, opts).await?;
    let server = BareServer::spawn(router, UnixListenerStream::new(listener));
    tracing::info!(socket = %path.display(), "fake provider serving over a unix socket");
    Ok(ServerHandle {
        bound: Bound::Unix(path.to_owned()),
        server,
    })
}

fn remove_stale_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Failure to dial a provider.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid provider address: {0}")]
    Target(#[from] TargetError),
    #[error("provider {0}")]
    Channel(#[from] ChannelError),
}

/// Dials a provider in plaintext: `unix:///path/x.sock`, `http://host:port` or bare
/// `host:port`. Message limits are 256 MiB both ways.
pub async fn connect(target: &str) -> Result<CapacityProviderClient<Channel>, ConnectError> {
    connect_with(target, &ChannelConfig::default()).await
}

/// [`connect`] with the mesh's channel settings: `cfg.tls` for mTLS on TCP (an
/// `https://` target insists on it), `cfg.server_name` when the certificate names another
/// host.
pub async fn connect_with(
    target: &str,
    cfg: &ChannelConfig,
) -> Result<CapacityProviderClient<Channel>, ConnectError> {
    let channel = channel_with(target, cfg).await?;
    Ok(CapacityProviderClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE))
}

/// The raw channel behind [`connect`].
pub async fn channel(target: &str) -> Result<Channel, ConnectError> {
    channel_with(target, &ChannelConfig::default()).await
}

/// The raw channel behind [`connect_with`]: the mesh's one dialer
/// ([`bigfleet_mesh::connect`]), whose HTTP/2 windows already suit 100 MB Lists.
pub async fn channel_with(target: &str, cfg: &ChannelConfig) -> Result<Channel, ConnectError> {
    let target: Target = target.parse()?;
    Ok(bigfleet_mesh::connect(&target, cfg).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dialling_errors_name_the_target_and_the_cause() {
        let bad = connect("ftp://127.0.0.1:1").await.unwrap_err();
        assert!(matches!(bad, ConnectError::Target(_)), "{bad}");
        assert!(bad.to_string().contains("unsupported scheme"), "{bad}");
        // An https:// target insists on TLS: no silent plaintext.
        let plain = connect("https://127.0.0.1:1").await.unwrap_err();
        assert!(
            matches!(plain, ConnectError::Channel(ChannelError::TlsRequired(_))),
            "{plain}"
        );
        let gone = connect("unix:///nonexistent/bigfleet/p.sock")
            .await
            .unwrap_err();
        assert!(matches!(gone, ConnectError::Channel(_)), "{gone}");
        assert!(
            gone.to_string().contains("/nonexistent/bigfleet/p.sock"),
            "{gone}"
        );
    }

    #[tokio::test]
    async fn refuses_to_replace_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-socket");
        std::fs::write(&path, b"keep me").unwrap();
        let err = spawn_uds(&path, Arc::new(FakeProvider::new(Default::default())))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }
}
