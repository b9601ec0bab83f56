//! The server builder: tonic on TCP (plaintext or mTLS) and/or a Unix socket, with health,
//! reflection, the mesh stack and a bounded graceful shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tower::Service;

use crate::conn::MeshConn;
use crate::limits::ServerLimits;
use crate::local::{LocalPeers, SocketDirError, prepare_socket_dir, restrict_socket_file};
use crate::metrics::GrpcMetrics;
use crate::stack::{MeshLayer, ServerStackConfig, bounds_alias};

/// Message size limit for every server and client, both directions (256 MiB): full
/// inventories and roll-ups of the largest fleets fit in one message. The one definition in
/// the repository: decide core and the fake provider re-export it, every generated client
/// and server takes it through [`with_message_limits!`](crate::with_message_limits).
pub const MAX_MESSAGE_SIZE: usize = 256 * 1024 * 1024;

/// How long a shutdown waits for in-flight calls and streams before closing connections.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// Applies [`MAX_MESSAGE_SIZE`] in both directions to a tonic-generated server or client
/// (tonic's defaults are 4 MiB decoding and unlimited encoding, per service):
///
/// ```ignore
/// let svc = bigfleet_mesh::with_message_limits!(DecideServer::new(handler));
/// let client = bigfleet_mesh::with_message_limits!(DecideClient::new(channel));
/// ```
#[macro_export]
macro_rules! with_message_limits {
    ($svc:expr) => {
        $svc.max_decoding_message_size($crate::MAX_MESSAGE_SIZE)
            .max_encoding_message_size($crate::MAX_MESSAGE_SIZE)
    };
}

bounds_alias! {
    /// A tonic-generated service [`MeshServer`] can route: what tonic's router asks of it.
    pub trait RoutableService: Service<
            Request<Body>,
            Error = Infallible,
            Response: axum::response::IntoResponse,
            Future: Send + 'static,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static
}

/// Errors starting or running a server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("server {0} has no listener (configure tcp and/or unix)")]
    NoListener(String),
    #[error("binding tcp {addr}: {source}")]
    BindTcp {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "refusing to serve plaintext gRPC on {addr}: anyone who can reach it could call it without an identity; configure --tls-cert/--tls-key/--tls-ca, bind a loopback address, or pass --insecure-plaintext to accept the exposure"
    )]
    PlaintextRefused { addr: SocketAddr },
    #[error(transparent)]
    SocketDir(#[from] SocketDirError),
    #[error("binding unix socket {path}: {source}")]
    BindUnix {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building reflection service: {0}")]
    Reflection(String),
    #[error("grpc server: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("server task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

enum TcpBind {
    Addr(SocketAddr),
    Listener(TcpListener),
}

/// Builds a gRPC server. Health (`grpc.health.v1`) and reflection (v1 and v1alpha) are
/// always served; every added service starts SERVING unless added with a status.
///
/// ```ignore
/// let server = MeshServer::new("shard-decide", stack_cfg)
///     .tcp("0.0.0.0:7782".parse()?)
///     .unix(run_dir.join("decide.sock"))
///     .tls(tls.map(|t| t.server_config()).transpose()?)
///     .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
///     .add_service(with_message_limits!(DecideServer::new(decide)));
/// let running = server.start().await?;
/// running.run_until_signal().await?;
/// ```
pub struct MeshServer {
    name: String,
    tcp: Option<TcpBind>,
    unix: Option<PathBuf>,
    tls: Option<Arc<rustls::ServerConfig>>,
    stack: ServerStackConfig,
    routes: RoutesBuilder,
    services: Vec<(String, ServingStatus)>,
    descriptor_sets: Vec<&'static [u8]>,
    health: HealthReporter,
    drain_deadline: Duration,
    limits: Option<ServerLimits>,
    insecure_plaintext: bool,
    local_peers: LocalPeers,
}

impl MeshServer {
    /// `name` labels logs (e.g. `shard-decide`).
    pub fn new(name: &str, stack: ServerStackConfig) -> Self {
        let (health, health_service) = tonic_health::server::health_reporter();
        let mut routes = RoutesBuilder::default();
        routes.add_service(health_service);
        Self {
            name: name.to_owned(),
            tcp: None,
            unix: None,
            tls: None,
            stack,
            routes,
            services: Vec::new(),
            descriptor_sets: Vec::new(),
            health,
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
            limits: None,
            insecure_plaintext: false,
            local_peers: LocalPeers::same_user(),
        }
    }

    /// Connection and HTTP/2 limits (default: [`ServerLimits::network`] when a TCP listener
    /// is configured, [`ServerLimits::local`] for Unix-socket-only servers).
    pub fn limits(mut self, limits: ServerLimits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Allows plaintext TCP on a non-loopback address (`--insecure-plaintext`). Without it,
    /// [`MeshServer::start`] refuses such a listener; with it, start-up logs one WARN line
    /// naming what is exposed.
    pub fn insecure_plaintext(mut self, allow: bool) -> Self {
        self.insecure_plaintext = allow;
        self
    }

    /// Who may connect to the Unix socket (default: this process's uid only).
    pub fn local_peers(mut self, peers: LocalPeers) -> Self {
        self.local_peers = peers;
        self
    }

    /// Listens on `addr` (port 0 picks a free port; see [`RunningServer::tcp_addr`]).
    pub fn tcp(mut self, addr: SocketAddr) -> Self {
        self.tcp = Some(TcpBind::Addr(addr));
        self
    }

    /// Serves on an already-bound listener.
    pub fn tcp_listener(mut self, listener: TcpListener) -> Self {
        self.tcp = Some(TcpBind::Listener(listener));
        self
    }

    /// Also listens on a Unix socket (a stale socket file at `path` is replaced; the parent
    /// directory is created 0750 or checked, see [`prepare_socket_dir`]; the socket is 0660
    /// and only [`MeshServer::local_peers`] may connect).
    pub fn unix(mut self, path: impl Into<PathBuf>) -> Self {
        self.unix = Some(path.into());
        self
    }

    /// mTLS on the TCP listener (`None`: plaintext). The config should come from
    /// `bigfleet_identity::TlsContext::server_config` (client certs required, reloadable
    /// leaf). Unix sockets never use TLS.
    pub fn tls(mut self, config: Option<Arc<rustls::ServerConfig>>) -> Self {
        self.tls = config;
        self
    }

    /// An encoded `FileDescriptorSet` to serve through reflection.
    pub fn descriptor_set(mut self, set: &'static [u8]) -> Self {
        self.descriptor_sets.push(set);
        self
    }

    /// How long shutdown waits before closing connections (default 10 s).
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    /// The health handle, before start (e.g. to mark a service NOT_SERVING from the outset).
    pub fn health(&self) -> &HealthReporter {
        &self.health
    }

    /// Adds a service reported SERVING.
    pub fn add_service<S: RoutableService>(self, svc: S) -> Self {
        self.add_service_with_status(svc, ServingStatus::Serving)
    }

    /// Adds a service with an initial health status (a coordinator starts NOT_SERVING until
    /// it sees a leader).
    pub fn add_service_with_status<S: RoutableService>(
        mut self,
        svc: S,
        status: ServingStatus,
    ) -> Self {
        self.services.push((S::NAME.to_owned(), status));
        self.routes.add_service(svc);
        self
    }

    /// Binds the listeners and starts serving in the background.
    pub async fn start(mut self) -> Result<RunningServer, ServerError> {
        if self.tcp.is_none() && self.unix.is_none() {
            return Err(ServerError::NoListener(self.name));
        }
        let limits = self.limits.clone().unwrap_or_else(|| {
            if self.tcp.is_some() {
                ServerLimits::network()
            } else {
                ServerLimits::local()
            }
        });
        self.add_reflection()?;
        for (name, status) in &self.services {
            self.health.set_service_status(name, *status).await;
        }

        let drain = CancellationToken::new();
        let kill = CancellationToken::new();
        let (tx, rx) = mpsc::channel::<Result<MeshConn, std::io::Error>>(256);
        let mut acceptors = Vec::new();

        let tcp_addr = match self.tcp.take() {
            None => None,
            Some(bind) => {
                let listener = match bind {
                    TcpBind::Listener(l) => l,
                    TcpBind::Addr(addr) => crate::bind_tcp(addr)
                        .map_err(|source| ServerError::BindTcp { addr, source })?,
                };
                let addr = listener
                    .local_addr()
                    .map_err(|source| ServerError::BindTcp {
                        addr: "0.0.0.0:0".parse().expect("literal address"),
                        source,
                    })?;
                self.check_plaintext(addr)?;
                let acceptor = self.tls.clone().map(TlsAcceptor::from);
                acceptors.push(tokio::spawn(accept_tcp(
                    listener,
                    acceptor,
                    TcpAccept {
                        limits: limits.clone(),
                        metrics: self.stack.metrics.clone(),
                        tx: tx.clone(),
                        drain: drain.clone(),
                        kill: kill.clone(),
                    },
                )));
                Some(addr)
            }
        };
        let unix_path = match self.unix.take() {
            None => None,
            Some(path) => {
                let listener = bind_unix(&path)?;
                acceptors.push(tokio::spawn(accept_unix(
                    listener,
                    self.local_peers,
                    self.stack.metrics.clone(),
                    tx.clone(),
                    drain.clone(),
                    kill.clone(),
                )));
                Some(path)
            }
        };
        drop(tx);

        let mut stack = self.stack.clone();
        stack.mtls = self.tls.is_some();
        let builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)));
        let router = limits
            .apply(builder)
            .layer(MeshLayer::new(stack))
            .add_routes(self.routes.routes());
        let signal = drain.clone();
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(ReceiverStream::new(rx), signal.cancelled_owned())
                .await
        });
        tracing::info!(
            server = %self.name,
            tcp = ?tcp_addr,
            unix = ?unix_path,
            mtls = self.tls.is_some(),
            "grpc server started"
        );
        Ok(RunningServer {
            name: self.name,
            tcp_addr,
            unix_path,
            health: self.health,
            services: self.services.into_iter().map(|(n, _)| n).collect(),
            drain,
            kill,
            task,
            acceptors,
            drain_deadline: self.drain_deadline,
        })
    }

    /// Plaintext TCP is for loopback; anywhere else it needs the explicit opt-in, and then
    /// says loudly what anyone on the network can now call.
    fn check_plaintext(&self, addr: SocketAddr) -> Result<(), ServerError> {
        if self.tls.is_some() || addr.ip().is_loopback() {
            return Ok(());
        }
        if !self.insecure_plaintext {
            return Err(ServerError::PlaintextRefused { addr });
        }
        tracing::warn!(
            server = %self.name,
            %addr,
            services = %self.services.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(","),
            "--insecure-plaintext: serving without TLS on a non-loopback address; anyone who can reach it can call these services with no identity and read or forge their traffic"
        );
        Ok(())
    }

    fn add_reflection(&mut self) -> Result<(), ServerError> {
        // Both reflection versions advertise both reflection services (each builder would
        // otherwise list only itself), so `list` looks the same to every client.
        let builder = || {
            let mut b = tonic_reflection::server::Builder::configure()
                .include_reflection_service(false)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(
                    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
                )
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
            for set in &self.descriptor_sets {
                b = b.register_encoded_file_descriptor_set(set);
            }
            // A descriptor set usually describes more services than this server hosts (the
            // proto crate ships one set for the whole mesh); advertise only what is served so
            // `grpcurl list` tells the truth.
            for name in [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            ]
            .into_iter()
            .chain(self.services.iter().map(|(n, _)| n.as_str()))
            {
                b = b.with_service_name(name);
            }
            b
        };
        let v1 = builder()
            .build_v1()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        // grpcurl 1.8 only speaks v1alpha.
        let v1alpha = builder()
            .build_v1alpha()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        self.routes.add_service(v1);
        self.routes.add_service(v1alpha);
        Ok(())
    }
}

fn bind_unix(path: &Path) -> Result<UnixListener, ServerError> {
    let err = |source| ServerError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        prepare_socket_dir(dir)?;
    }
    // A socket file left by a previous run would make bind fail with AddrInUse.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    restrict_socket_file(path).map_err(err)?;
    Ok(listener)
}

type ConnSender = mpsc::Sender<Result<MeshConn, std::io::Error>>;

/// What the TCP accept loop needs besides the listener.
struct TcpAccept {
    limits: ServerLimits,
    metrics: Option<GrpcMetrics>,
    tx: ConnSender,
    drain: CancellationToken,
    kill: CancellationToken,
}

async fn accept_tcp(listener: TcpListener, tls: Option<TlsAcceptor>, ctx: TcpAccept) {
    let TcpAccept {
        limits,
        metrics,
        tx,
        drain,
        kill,
    } = ctx;
    let handshakes = Arc::new(tokio::sync::Semaphore::new(
        limits.max_concurrent_handshakes.max(1),
    ));
    let keepalive = limits
        .tcp_keepalive
        .map(|idle| socket2::TcpKeepalive::new().with_time(idle));
    loop {
        let (stream, remote) = tokio::select! {
            _ = drain.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "tcp accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        if let Some(k) = &keepalive {
            let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(k);
        }
        match &tls {
            None => {
                if tx.send(Ok(MeshConn::tcp(stream, &kill))).await.is_err() {
                    return;
                }
            }
            Some(acceptor) => {
                // Handshakes run concurrently so one slow client cannot stall the others, but
                // only so many at once: past that the accept loop waits and the kernel's
                // backlog holds the rest, so a handshake flood costs no unbounded tasks.
                let permit = tokio::select! {
                    _ = drain.cancelled() => return,
                    p = Arc::clone(&handshakes).acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let kill = kill.clone();
                let metrics = metrics.clone();
                let timeout = limits.handshake_timeout;
                tokio::spawn(async move {
                    let outcome = tokio::time::timeout(timeout, acceptor.accept(stream)).await;
                    drop(permit);
                    match outcome {
                        Ok(Ok(tls)) => {
                            let _ = tx.send(Ok(MeshConn::tls(tls, &kill))).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%remote, error = %e, "tls handshake failed");
                            if let Some(m) = &metrics {
                                m.record_rejected_connection("tls_handshake");
                            }
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "tls handshake timed out");
                            if let Some(m) = &metrics {
                                m.record_rejected_connection("tls_handshake_timeout");
                            }
                        }
                    }
                });
            }
        }
    }
}

async fn accept_unix(
    listener: UnixListener,
    peers: LocalPeers,
    metrics: Option<GrpcMetrics>,
    tx: ConnSender,
    drain: CancellationToken,
    kill: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            _ = drain.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "unix accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // File modes keep strangers off the socket; the kernel's word on who connected is
        // the second lock, and the one that holds if a mode is ever loosened by hand.
        match stream.peer_cred() {
            Ok(cred) if peers.allows(cred.uid(), cred.gid()) => {}
            Ok(cred) => {
                tracing::warn!(
                    peer_uid = cred.uid(),
                    peer_gid = cred.gid(),
                    peer_pid = ?cred.pid(),
                    "unix socket peer refused: not this process's uid or the configured group"
                );
                if let Some(m) = &metrics {
                    m.record_rejected_connection("peer_uid");
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "unix socket peer credentials unavailable; refused");
                if let Some(m) = &metrics {
                    m.record_rejected_connection("peer_cred_unavailable");
                }
                continue;
            }
        }
        if tx.send(Ok(MeshConn::unix(stream, &kill))).await.is_err() {
            return;
        }
    }
}

/// A started server. Dropping it does not stop the server; call [`RunningServer::shutdown`]
/// (or [`RunningServer::run_until_signal`]).
pub struct RunningServer {
    name: String,
    tcp_addr: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
    health: HealthReporter,
    services: Vec<String>,
    drain: CancellationToken,
    kill: CancellationToken,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    acceptors: Vec<JoinHandle<()>>,
    drain_deadline: Duration,
}

impl RunningServer {
    /// The bound TCP address (with the real port when 0 was requested).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// Flip per-service health (`set_service_status(name, ServingStatus::NotServing)` or
    /// `set_serving::<FooServer<_>>()`).
    pub fn health(&self) -> &HealthReporter {
        &self.health
    }

    /// Cancelled when shutdown begins. Long-lived streams (sessions, work pulls) should end
    /// when it fires, so the drain completes before the deadline.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.drain.clone()
    }

    /// Graceful shutdown: health turns NOT_SERVING, listeners close, in-flight calls get
    /// until the drain deadline, then remaining connections are closed.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        let RunningServer {
            name,
            unix_path,
            health,
            services,
            drain,
            kill,
            mut task,
            acceptors,
            drain_deadline,
            ..
        } = self;
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        for s in &services {
            health
                .set_service_status(s, ServingStatus::NotServing)
                .await;
        }
        tracing::info!(server = %name, deadline = ?drain_deadline, "draining grpc server");
        drain.cancel();
        for a in acceptors {
            let _ = a.await;
        }
        let result = match tokio::time::timeout(drain_deadline, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                tracing::warn!(server = %name, "drain deadline passed; closing remaining connections");
                kill.cancel();
                match tokio::time::timeout(Duration::from_secs(5), &mut task).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        task.abort();
                        Ok(Ok(()))
                    }
                }
            }
        };
        if let Some(path) = &unix_path {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!(server = %name, "grpc server stopped");
        result??;
        Ok(())
    }

    /// Serves until SIGTERM or SIGINT, then shuts down gracefully.
    pub async fn run_until_signal(self) -> Result<(), ServerError> {
        self.run_until(stop_signal()).await
    }

    /// Serves until `stop` resolves (or the server fails), then shuts down gracefully.
    pub async fn run_until(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServerError> {
        tokio::select! {
            () = stop => self.shutdown().await,
            joined = &mut self.task => {
                // The server ended by itself: nothing to drain.
                if let Some(path) = &self.unix_path {
                    let _ = std::fs::remove_file(path);
                }
                joined??;
                Ok(())
            }
        }
    }
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (Ctrl-C) and logs which: the one way every
/// process here waits to be stopped. A handler that cannot be installed is logged and the
/// other signal still works: the process keeps serving rather than stop for want of one.
pub async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM; only SIGINT stops this process");
                std::future::pending::<()>().await;
            }
        }
    };
    let int = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT; only SIGTERM stops this process");
            std::future::pending::<()>().await;
        }
    };
    let name = tokio::select! {
        () = term => "SIGTERM",
        () = int => "SIGINT",
    };
    tracing::info!(signal = name, "stop signal received");
}
