//! Channels to `unix:///path` and `http(s)://host:port` targets, TLS done with our own rustls
//! client config (so the client certificate reloads like the server's).

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::Service;

/// Where a client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `unix:///run/bigfleet/decide.sock` (or `unix:relative.sock`).
    Unix(PathBuf),
    /// `http://host:port`, `https://host:port` or bare `host:port`. `https` only records that
    /// the caller insists on TLS; whether TLS is used is decided by the process's TLS flags.
    Tcp {
        host: String,
        port: u16,
        require_tls: bool,
    },
}

/// A target string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid target {target:?}: {reason}")]
pub struct TargetError {
    pub target: String,
    pub reason: &'static str,
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| TargetError {
            target: s.to_owned(),
            reason,
        };
        if let Some(rest) = s
            .strip_prefix("unix://")
            .or_else(|| s.strip_prefix("unix:"))
        {
            if rest.is_empty() {
                return Err(err("empty socket path"));
            }
            return Ok(Target::Unix(PathBuf::from(rest)));
        }
        let (hostport, require_tls) = if let Some(r) = s.strip_prefix("https://") {
            (r, true)
        } else if let Some(r) = s.strip_prefix("http://") {
            (r, false)
        } else if s.contains("://") {
            return Err(err("unsupported scheme (use unix://, http:// or https://)"));
        } else {
            (s, false)
        };
        let hostport = hostport.trim_end_matches('/');
        let (host, port) = hostport
            .rsplit_once(':')
            .ok_or_else(|| err("missing port"))?;
        let port: u16 = port.parse().map_err(|_| err("invalid port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(err("missing host"));
        }
        Ok(Target::Tcp {
            host: host.to_owned(),
            port,
            require_tls,
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix://{}", p.display()),
            Target::Tcp {
                host,
                port,
                require_tls,
            } => {
                let scheme = if *require_tls { "https" } else { "http" };
                if host.contains(':') {
                    write!(f, "{scheme}://[{host}]:{port}")
                } else {
                    write!(f, "{scheme}://{host}:{port}")
                }
            }
        }
    }
}

/// How channels connect.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// mTLS for TCP targets (from `bigfleet_identity::TlsContext::client_config`); `None`:
    /// plaintext. Unix targets never use TLS.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Name to verify the server certificate against, when it differs from the target host.
    pub server_name: Option<String>,
    pub connect_timeout: Duration,
    /// HTTP/2 keepalive pings, so dead peers are noticed on idle long-lived streams.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// HTTP/2 receive windows (per stream, per connection) and the largest DATA frame
    /// the peer may send us. A provider's List is tens of MB: with the protocol's 64 KiB
    /// defaults it would stall for a window update every 64 KiB and arrive in 16 KiB
    /// frames. Windows are limits, not buffers: nothing is allocated up front.
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_frame: u32,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            tls: None,
            server_name: None,
            connect_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            stream_window: 16 << 20,
            connection_window: 32 << 20,
            max_frame: 1 << 20,
        }
    }
}

impl ChannelConfig {
    pub fn with_tls(mut self, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        self.tls = tls;
        self
    }
}

/// Errors building a channel.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error("target {0} requires tls but no --tls-* flags are configured")]
    TlsRequired(String),
    #[error("invalid tls server name {0:?}")]
    ServerName(String),
    #[error("connecting to {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("invalid endpoint: {0}")]
    Endpoint(#[source] tonic::transport::Error),
}

/// Connects now; fails if the target is unreachable.
pub async fn connect(target: &Target, cfg: &ChannelConfig) -> Result<Channel, ChannelError> {
    let (endpoint, connector) = prepare(target, cfg)?;
    endpoint
        .connect_with_connector(connector)
        .await
        .map_err(|source| ChannelError::Connect {
            target: target.to_string(),
            source,
        })
}

/// Connects on first use and reconnects as needed: services start without waiting for
/// their dependencies (a shard never blocks on the coordinator).
pub fn connect_lazy(target: &Target, cfg: &ChannelConfig) -> Result<Channel, ChannelError> {
    let (endpoint, connector) = prepare(target, cfg)?;
    Ok(endpoint.connect_with_connector_lazy(connector))
}

fn prepare(target: &Target, cfg: &ChannelConfig) -> Result<(Endpoint, Connector), ChannelError> {
    let (uri, connector) = match target {
        // The authority is only a label for a Unix socket.
        Target::Unix(path) => (
            "http://localhost".to_owned(),
            Connector::Unix(Arc::new(path.clone())),
        ),
        Target::Tcp {
            host,
            port,
            require_tls,
        } => {
            if *require_tls && cfg.tls.is_none() {
                return Err(ChannelError::TlsRequired(target.to_string()));
            }
            let tls = match &cfg.tls {
                None => None,
                Some(config) => {
                    let name = cfg.server_name.clone().unwrap_or_else(|| host.clone());
                    let server_name = ServerName::try_from(name.clone())
                        .map_err(|_| ChannelError::ServerName(name))?;
                    Some((TlsConnector::from(Arc::clone(config)), server_name))
                }
            };
            // Always `http://` towards tonic: TLS happens inside our connector, and tonic
            // refuses `https://` without its own TLS config.
            let authority = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            (
                format!("http://{authority}"),
                Connector::Tcp(Arc::new(TcpTarget { authority, tls })),
            )
        }
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(ChannelError::Endpoint)?
        .connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(cfg.keepalive_interval)
        .keep_alive_timeout(cfg.keepalive_timeout)
        .keep_alive_while_idle(true)
        .initial_stream_window_size(cfg.stream_window)
        .initial_connection_window_size(cfg.connection_window)
        .max_frame_size(cfg.max_frame);
    Ok((endpoint, connector))
}

struct TcpTarget {
    authority: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

#[derive(Clone)]
enum Connector {
    Unix(Arc<PathBuf>),
    Tcp(Arc<TcpTarget>),
}

impl Service<Uri> for Connector {
    type Response = TokioIo<ClientStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<ClientStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let stream = match this {
                Connector::Unix(path) => ClientStream::Unix(UnixStream::connect(&*path).await?),
                Connector::Tcp(target) => {
                    let tcp = TcpStream::connect(&target.authority).await?;
                    tcp.set_nodelay(true)?;
                    match &target.tls {
                        None => ClientStream::Tcp(tcp),
                        Some((connector, name)) => {
                            ClientStream::Tls(Box::new(connector.connect(name.clone(), tcp).await?))
                        }
                    }
                }
            };
            Ok(TokioIo::new(stream))
        })
    }
}

/// A client connection of any transport.
pub enum ClientStream {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Unix(s) => s.is_write_vectored(),
            ClientStream::Tcp(s) => s.is_write_vectored(),
            ClientStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Unix(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            "unix:///run/x/decide.sock".parse::<Target>().unwrap(),
            Target::Unix("/run/x/decide.sock".into())
        );
        assert_eq!(
            "unix:rel.sock".parse::<Target>().unwrap(),
            Target::Unix("rel.sock".into())
        );
        assert_eq!(
            "http://127.0.0.1:7790".parse::<Target>().unwrap(),
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 7790,
                require_tls: false
            }
        );
        assert_eq!(
            "https://coord.ns.svc:7790/".parse::<Target>().unwrap(),
            Target::Tcp {
                host: "coord.ns.svc".into(),
                port: 7790,
                require_tls: true
            }
        );
        assert_eq!(
            "[::1]:80".parse::<Target>().unwrap(),
            Target::Tcp {
                host: "::1".into(),
                port: 80,
                require_tls: false
            }
        );
        for bad in [
            "unix://",
            "ftp://x:1",
            "host",
            "host:port",
            ":80",
            "http://:1",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }

    #[test]
    fn targets_display_round_trip() {
        for t in [
            "unix:///a/b.sock",
            "http://h:1",
            "https://h:2",
            "http://[::1]:3",
        ] {
            assert_eq!(t.parse::<Target>().unwrap().to_string(), t);
        }
    }

    #[test]
    fn https_without_tls_is_refused() {
        let t: Target = "https://h:1".parse().unwrap();
        assert!(matches!(
            connect_lazy(&t, &ChannelConfig::default()),
            Err(ChannelError::TlsRequired(_))
        ));
    }
}
