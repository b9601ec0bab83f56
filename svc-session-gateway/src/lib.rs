//! bigfleet-session-gateway: terminates operator Shard/Session streams.
//!
//! The only service a cluster operator talks to. It serves, on the shard's public port:
//!
//! * `bigfleet.v1alpha1.Shard/Session` — Hello first (INVALID_ARGUMENT otherwise), the
//!   Hello's cluster bound to the client certificate under mTLS (PERMISSION_DENIED,
//!   counted), one session per cluster (a newer one replaces and closes the older), a
//!   receive pump that never waits on slow work, and a one-slot latest-wins roll-up lane per
//!   session that validates at the trust boundary (`bigfleet-conv`) and hands roll-ups to
//!   decide, rate-limited per cluster.
//! * `bigfleet.v1alpha1.ShardRead` and `bigfleet.mesh.v1.ShardInfo`, answered by decide.
//! * `bigfleet.mesh.v1.Relay` for remote execute workers — only with mTLS, only to
//!   `shard/<this shard>/execute`.
//!
//! and on `<socket-dir>/gateway.sock` (same-pod callers): `Relay` for sidecar workers
//! (bootstrap pulls matched by request id, reclaim instructions) and `Outbox` for decide
//! (published frames coalesced per `supersedes_key` in a bounded per-cluster outbox).
//!
//! [`run`] is the binary; [`start`] runs the same gateway in-process (tests, `bigfleet up`'s
//! tests) and returns a [`Running`] handle.

pub mod cli;
mod decide;
mod error;
mod gateway_svc;
mod metrics;
mod outbox;
mod read_proxy;
mod registry;
mod session;
mod session_server;
mod shard_svc;
mod state;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::{Role, TlsContext};
use bigfleet_mesh::{AuthzPolicy, GrpcMetrics, MeshServer, RunningServer, ServerStackConfig};
use bigfleet_proto::mesh::v1::outbox_server::OutboxServer;
use bigfleet_proto::mesh::v1::relay_server::RelayServer;
use bigfleet_proto::mesh::v1::shard_info_server::ShardInfoServer;
use bigfleet_proto::service_names;
use bigfleet_proto::v1alpha1::shard_read_server::ShardReadServer;
use bigfleet_telemetry::MetricsRegistry;

pub use crate::cli::Args;
pub use crate::error::{SessionError, StartError};
pub use crate::gateway_svc::new_request_id;
pub use crate::metrics::GatewayMetrics;
pub use crate::outbox::{Offer, Outbox};
pub use crate::session::{
    CONTROL_CAPACITY, ECHO_HELLO, ECHO_ROLLUP, ECHO_ROLLUP_NOT_APPLIED, ECHO_ROLLUP_REJECTED,
    RollupRate,
};
pub use crate::state::GatewaySettings;

use crate::decide::DecideLink;
use crate::state::GatewayState;

/// File name of the gateway's Unix socket inside the socket directory.
pub const GATEWAY_SOCKET: &str = "gateway.sock";
/// File name of decide's Unix socket inside the socket directory.
pub const DECIDE_SOCKET: &str = "decide.sock";

/// Everything [`start`] needs.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub settings: GatewaySettings,
    /// Public TCP address; `None` serves only the Unix socket.
    pub listen: Option<SocketAddr>,
    /// Where `gateway.sock` is served (and, unless `decide_addr` says otherwise, where
    /// `decide.sock` is dialled).
    pub socket_dir: PathBuf,
    /// Decide's address; default `unix://<socket_dir>/decide.sock`.
    pub decide_addr: Option<String>,
    /// mTLS on the public port (`None`: plaintext).
    pub tls: Option<TlsContext>,
    /// Plaintext on a non-loopback public address (`--insecure-plaintext`).
    pub insecure_plaintext: bool,
    /// Who may connect to `gateway.sock` (this uid, plus `--socket-peer-gid`).
    pub local_peers: bigfleet_mesh::LocalPeers,
    /// Global concurrency limit before requests are shed (RESOURCE_EXHAUSTED).
    pub max_concurrent_requests: usize,
    /// How long shutdown waits for connections to drain.
    pub drain_timeout: Duration,
    /// Where the gateway's metrics are registered.
    pub registry: MetricsRegistry,
}

impl GatewayConfig {
    /// Defaults for a gateway whose sockets live in `socket_dir`, public port on
    /// `127.0.0.1:0`.
    pub fn new(socket_dir: impl Into<PathBuf>) -> Self {
        Self {
            settings: GatewaySettings::default(),
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            socket_dir: socket_dir.into(),
            decide_addr: None,
            tls: None,
            insecure_plaintext: false,
            local_peers: bigfleet_mesh::LocalPeers::same_user(),
            max_concurrent_requests: 4096,
            drain_timeout: Duration::from_secs(10),
            registry: MetricsRegistry::new(),
        }
    }

    fn decide_target(&self) -> String {
        self.decide_addr
            .clone()
            .unwrap_or_else(|| format!("unix://{}", self.socket_dir.join(DECIDE_SOCKET).display()))
    }
}

/// A started gateway.
pub struct Running {
    public: Option<RunningServer>,
    internal: RunningServer,
    gw: Arc<GatewayState>,
    public_addr: Option<SocketAddr>,
    socket_path: PathBuf,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("public_addr", &self.public_addr)
            .field("socket_path", &self.socket_path)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// The bound public address (real port when 0 was asked for).
    pub fn public_addr(&self) -> Option<SocketAddr> {
        self.public_addr
    }

    /// Path of `gateway.sock`.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    pub fn metrics(&self) -> &GatewayMetrics {
        &self.gw.metrics
    }

    /// Live sessions right now.
    pub fn active_sessions(&self) -> usize {
        self.gw.registry.count()
    }

    /// Graceful drain: new sessions are refused, every session ends with UNAVAILABLE (so
    /// operators reconnect), Publish streams finish, then both servers drain.
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.gw.shutdown.cancel();
        let ended = shard_svc::end_all_for_shutdown(&self.gw);
        tracing::info!(sessions = ended, "ended operator sessions for shutdown");
        let public = async {
            match self.public {
                Some(p) => p.shutdown().await,
                None => Ok(()),
            }
        };
        let (a, b) = tokio::join!(public, self.internal.shutdown());
        a?;
        b?;
        Ok(())
    }
}

/// Authorization on the public port. `Shard` is open to every CA-verified caller because the
/// session handler binds the Hello to the certificate itself — that is where a mismatch,
/// or a certificate with zero or several identities, is counted as a security event.
fn public_policy() -> AuthzPolicy {
    AuthzPolicy::deny_by_default()
        .open_service(service_names::SHARD)
        .allow_service(service_names::SHARD_READ, &[Role::Readonly, Role::Admin])
        .allow_service(service_names::SHARD_INFO, &[Role::Readonly, Role::Admin])
        .allow_service(service_names::RELAY, &[Role::ShardExecute])
}

/// Starts the gateway: `gateway.sock` always, the public port when `listen` is set.
pub async fn start(config: GatewayConfig) -> Result<Running, StartError> {
    let metrics = GatewayMetrics::register(&config.registry)?;
    let grpc_metrics = GrpcMetrics::server(&config.registry)?;
    let decide = DecideLink::dial(&config.decide_target())?;
    let gw = GatewayState::new(config.settings.clone(), decide, metrics);

    let internal_svc = gateway_svc::GatewayService::new(Arc::clone(&gw));
    let relay = || bigfleet_mesh::with_message_limits!(RelayServer::new(internal_svc.clone()));
    let stack = |authz: AuthzPolicy| ServerStackConfig {
        metrics: Some(grpc_metrics.clone()),
        mtls: false, // set by MeshServer from its TLS config
        authz: Arc::new(authz),
        rate_limit: None,
        rate_limited_services: None,
        rate_limit_exempt_loopback: false,
        concurrency_limit: Some(config.max_concurrent_requests.max(1)),
        timeout: None,
    };

    let socket_path = config.socket_dir.join(GATEWAY_SOCKET);
    let internal = MeshServer::new(
        "session-gateway-internal",
        stack(AuthzPolicy::allow_any_identity()),
    )
    .unix(&socket_path)
    .local_peers(config.local_peers)
    .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
    .drain_deadline(config.drain_timeout)
    .add_service(bigfleet_mesh::with_message_limits!(OutboxServer::new(
        internal_svc.clone()
    )))
    .add_service(relay())
    .start()
    .await?;

    let public = match config.listen {
        None => None,
        Some(addr) => {
            let tls = config
                .tls
                .as_ref()
                .map(TlsContext::server_config)
                .transpose()?;
            let read = read_proxy::ReadProxy::new(Arc::clone(&gw));
            // Remote workers' Relay only under mTLS: in plaintext there is no identity to
            // bind it to, so the public port does not serve it at all.
            let relay = tls.is_some().then(relay);
            // Session opens are budgeted per cluster identity, or per source address for a
            // caller that has none yet; reads and the relay are not (their callers are few
            // and authenticated).
            let public_stack = ServerStackConfig {
                rate_limit: config.settings.session_open_rate,
                rate_limited_services: Some(Arc::from(vec![service_names::SHARD.to_owned()])),
                // `bigfleet up`'s simulated operators and load generators open thousands
                // of sessions from loopback; only plaintext off loopback needs the
                // per-source budget.
                rate_limit_exempt_loopback: true,
                ..stack(public_policy())
            };
            let server = MeshServer::new("session-gateway", public_stack)
                .tcp(addr)
                .tls(tls)
                .insecure_plaintext(config.insecure_plaintext)
                .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
                .drain_deadline(config.drain_timeout)
                .add_service(session_server::SessionServer::new(
                    shard_svc::ShardService::new(Arc::clone(&gw)),
                    config.settings.max_hello_bytes,
                    config.settings.max_rollup_bytes,
                ))
                .add_service(bigfleet_mesh::with_message_limits!(ShardReadServer::new(
                    read.clone()
                )))
                .add_service(bigfleet_mesh::with_message_limits!(ShardInfoServer::new(
                    read
                )));
            let server = match relay {
                Some(r) => server.add_service(r),
                None => server,
            };
            match server.start().await {
                Ok(s) => Some(s),
                Err(e) => {
                    let _ = internal.shutdown().await;
                    return Err(e.into());
                }
            }
        }
    };
    let public_addr = public.as_ref().and_then(RunningServer::tcp_addr);
    tracing::info!(
        shard = %config.settings.shard_id,
        public = ?public_addr,
        socket = %socket_path.display(),
        decide = %config.decide_target(),
        mtls = config.tls.is_some(),
        "session gateway started"
    );
    Ok(Running {
        public,
        internal,
        gw,
        public_addr,
        socket_path,
    })
}

/// Parses a listen address; `:7780` means every interface of both families (`[::]`).
pub fn parse_listen(addr: &str) -> Result<SocketAddr, StartError> {
    bigfleet_mesh::parse_listen_addr(addr).map_err(|reason| StartError::Address {
        addr: addr.to_owned(),
        reason,
    })
}

/// The binary: serves until SIGTERM/SIGINT, then drains.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let tls = args.service.tls_context()?;
    let ops = bigfleet_mesh::binary::Ops::start(&args.metrics_addr, "gateway starting").await?;
    let config = GatewayConfig {
        settings: GatewaySettings {
            shard_id: args.shard_id.clone(),
            max_sessions: args.max_sessions,
            rollup_rate: RollupRate {
                per_second: args.rollup_rate,
                burst: burst_for(args.rollup_rate),
            },
            bootstrap_timeout: args.bootstrap_timeout,
            outbox_capacity: args.outbox_capacity,
            hello_timeout: args.hello_timeout,
            max_rollup_bytes: args.max_rollup_bytes,
            session_open_rate: (args.session_open_rate > 0.0).then(|| bigfleet_mesh::RateLimit {
                per_second: args.session_open_rate,
                burst: (args.session_open_rate * 10.0).ceil().max(1.0) as u32,
            }),
            rollup_limits: args.rollup_limits.limits(),
            ..GatewaySettings::default()
        },
        listen: Some(parse_listen(&args.listen)?),
        socket_dir: args.socket_dir.clone(),
        decide_addr: None,
        tls,
        insecure_plaintext: args.service.tls.insecure_plaintext,
        local_peers: bigfleet_mesh::LocalPeers::same_user().with_group(args.socket_peer_gid),
        max_concurrent_requests: args.max_concurrent_requests,
        drain_timeout: args.service.drain_timeout,
        registry: ops.registry.clone(),
    };
    let running = start(config).await?;
    ops.readiness.set_ready();
    ops.drain_on_signal(running.shutdown()).await?;
    Ok(())
}

/// The documented burst: twice the sustained rate (`--rollup-rate 2` ⇒ burst 4), at least 1.
pub fn burst_for(rate: f64) -> u32 {
    let b = (rate * 2.0).ceil();
    if b.is_finite() && b >= 1.0 {
        b.min(f64::from(u32::MAX)) as u32
    } else {
        1
    }
}

/// Now as Unix epoch nanoseconds (0 if the clock is before 1970).
pub(crate) fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen(":7780").unwrap(),
            "[::]:7780".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            parse_listen("127.0.0.1:9").unwrap(),
            "127.0.0.1:9".parse::<SocketAddr>().unwrap()
        );
        assert!(parse_listen("nonsense").is_err());
    }

    #[test]
    fn burst_is_twice_the_rate() {
        assert_eq!(burst_for(2.0), 4);
        assert_eq!(burst_for(0.2), 1);
        assert_eq!(burst_for(0.0), 1);
    }

    #[test]
    fn public_policy_roles() {
        use bigfleet_mesh::{Peer, PeerIdentity};
        let p = public_policy();
        let cluster = Peer::Verified(PeerIdentity::Cluster("a".into()));
        let ro = Peer::Verified(PeerIdentity::Readonly);
        let exec = Peer::Verified(PeerIdentity::ShardExecute("shard-0".into()));
        let invalid = Peer::Invalid(bigfleet_identity::IdentityError::SanCount { found: 0 });
        let session = "/bigfleet.v1alpha1.Shard/Session";
        let needs = "/bigfleet.v1alpha1.ShardRead/InspectNeeds";
        let boot = "/bigfleet.mesh.v1.Relay/RequestBootstrap";
        assert!(p.check(session, &cluster).is_ok());
        assert!(p.check(session, &invalid).is_ok(), "the handler counts it");
        assert!(p.check(needs, &ro).is_ok());
        assert!(p.check(needs, &cluster).is_err());
        assert!(p.check(boot, &exec).is_ok());
        assert!(p.check(boot, &cluster).is_err());
        assert!(p.check(boot, &ro).is_err());
    }
}
