//! bigfleet-inspect: the read-only fleet view (gRPC, JSON API, dashboard).
//!
//! It discovers shards through the coordinator's `ListShards` (any replica; calls follow the
//! leader hint), asks every shard concurrently — with a per-shard timeout — for its
//! `ShardInfo.Describe` counts and its `ShardRead.InspectNeeds` verdicts (ADR-0061), merges
//! that with the coordinator's `ListShardReports` and `ListDomainAssignments`, caches each
//! answer for `--cache-ttl`, and serves it three ways:
//!
//! * gRPC `bigfleet.v1alpha1.ShardRead` fleet-wide (same messages as a shard; cluster filter
//!   and limit honoured; rows in priority ↓ arrival ↑ cluster ↑ order across shards) and
//!   `bigfleet.mesh.v1.Inspect.FleetSummary` — under mTLS for readonly and admin only
//!   ([`grpc::authz_policy`]); health and reflection on ([`grpc`]);
//! * a JSON API under `/api/v1` ([`http`]);
//! * a server-rendered dashboard ([`http`], maud templates in `pages`) with a time axis: a
//!   sampler keeps bounded fleet, per-shard and per-cluster history ([`history`]), drawn
//!   as inline SVG sparklines; pages refresh in place through one small script served by
//!   inspect itself and stay complete without it (ADR-0136).
//!
//! A shard or the coordinator being down never fails a whole answer: the unreachable party
//! is reported next to the rest ([`fleet`]).
//!
//! Entry points: [`Args`] + [`run`] for the binary (and `bigfleet svc inspect`), [`start`]
//! with a [`Config`] for tests and `bigfleet up`.

mod cache;
mod chart;
pub mod cli;
pub mod coordinator;
#[cfg(feature = "doubles")]
pub mod doubles;
mod error;
#[cfg(test)]
mod fixtures;
pub mod fleet;
pub mod grpc;
pub mod history;
mod html;
pub mod http;
pub mod http_guard;
pub mod merge;
mod pages;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_mesh::{GrpcMetrics, MeshServer, RetryPolicy, RunningServer, ServerStackConfig};
use bigfleet_proto::mesh::v1::inspect_server::InspectServer;
use bigfleet_proto::v1alpha1::shard_read_server::ShardReadServer;
use bigfleet_telemetry::MetricsRegistry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use cli::Args;
pub use error::InspectError;

use crate::coordinator::{CoordinatorClient, CoordinatorConfig};
use crate::fleet::{Fleet, FleetConfig, FleetMetrics};

/// Everything [`start`] needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub coordinator_addr: String,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    /// Where inspect's metrics go: the binary's ops endpoint (`--metrics-addr`) serves it.
    pub registry: MetricsRegistry,
    pub cache_ttl: Duration,
    pub shard_timeout: Duration,
    pub drain_timeout: Duration,
    /// mTLS on the gRPC server and towards coordinator and shards; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// Serve plaintext gRPC, and HTTP without a token, on non-loopback addresses.
    pub insecure_plaintext: bool,
    /// Bearer token for the HTTP port (`--http-token-file`).
    pub http_token: Option<String>,
    /// HTTP request budget and in-flight cap.
    pub http_rate: bigfleet_mesh::RateLimit,
    pub http_max_in_flight: usize,
    /// Between history samples; zero: no sampling.
    pub sample_interval: Duration,
    /// Bounds of the sampled history.
    pub history: history::Limits,
    /// Between in-place refreshes of live dashboard pages; zero (or under a second): never.
    pub page_refresh: Duration,
}

impl Config {
    pub fn from_args(args: &Args) -> Result<Self, InspectError> {
        Ok(Self {
            coordinator_addr: args.coordinator_addr.clone(),
            grpc_listen: cli::parse_listen(&args.listen)?,
            http_listen: cli::parse_listen(&args.http_listen)?,
            registry: MetricsRegistry::new(),
            cache_ttl: args.cache_ttl,
            shard_timeout: args.shard_timeout,
            drain_timeout: args.service.drain_timeout,
            tls: args.service.tls.resolve()?,
            insecure_plaintext: args.service.tls.insecure_plaintext,
            http_token: args
                .http_token_file
                .as_deref()
                .map(http_guard::read_token_file)
                .transpose()
                .map_err(InspectError::InvalidArgument)?,
            http_rate: bigfleet_mesh::RateLimit {
                per_second: args.http_rate.max(0.1),
                burst: (args.http_rate * 2.0).ceil().max(1.0) as u32,
            },
            http_max_in_flight: args.http_max_in_flight,
            sample_interval: args.sample_interval,
            history: history::Limits {
                samples: args.history_samples.max(1),
                max_shards: args.history_max_shards,
                max_clusters: args.history_max_clusters,
            },
            page_refresh: args.page_refresh,
        })
    }

    /// Loopback on free ports, no metrics port, plaintext, no history sampling: for tests
    /// and local meshes.
    pub fn local(coordinator_addr: &str) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            coordinator_addr: coordinator_addr.to_owned(),
            grpc_listen: any,
            http_listen: any,
            registry: MetricsRegistry::new(),
            cache_ttl: Duration::from_secs(2),
            shard_timeout: Duration::from_secs(3),
            drain_timeout: Duration::from_secs(5),
            tls: None,
            insecure_plaintext: false,
            http_token: None,
            http_rate: http_guard::DEFAULT_HTTP_RATE,
            http_max_in_flight: http_guard::DEFAULT_HTTP_CONCURRENCY,
            // Off: a sampler's own coordinator and shard calls would show up in tests that
            // count calls; tests that want history turn it on.
            sample_interval: Duration::ZERO,
            history: history::Limits::default(),
            page_refresh: Duration::from_secs(pages::REFRESH_SECONDS),
        }
    }
}

/// A started svc-inspect.
pub struct Running {
    grpc: RunningServer,
    http_addr: SocketAddr,
    http_task: JoinHandle<std::io::Result<()>>,
    sampler: Option<JoinHandle<()>>,
    stop: CancellationToken,
    drain_timeout: Duration,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("grpc_addr", &self.grpc.tcp_addr())
            .field("http_addr", &self.http_addr)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.tcp_addr().expect("inspect always listens on tcp")
    }

    /// The bound dashboard / JSON API address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Stops accepting, drains in-flight calls until the drain timeout, and returns.
    pub async fn shutdown(self) -> Result<(), InspectError> {
        self.stop.cancel();
        let grpc = self.grpc.shutdown().await;
        if let Some(sampler) = self.sampler
            && let Err(e) = sampler.await
        {
            tracing::warn!(error = %e, "history sampler task failed");
        }
        match tokio::time::timeout(self.drain_timeout, self.http_task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "http server ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "http server task failed"),
            Err(_) => tracing::warn!("http server did not drain in time"),
        }
        grpc.map_err(InspectError::from)
    }
}

/// Binds every listener and starts serving in the background.
pub async fn start(config: Config) -> Result<Running, InspectError> {
    let tls = config.tls.as_ref().map(TlsContext::load).transpose()?;
    let server_tls = tls.as_ref().map(TlsContext::server_config).transpose()?;
    let client_tls = tls.as_ref().map(TlsContext::client_config).transpose()?;

    let registry = &config.registry;
    let grpc_metrics = GrpcMetrics::server(registry)?;
    let fleet_metrics = FleetMetrics::register(registry)?;

    let coordinator = CoordinatorClient::new(CoordinatorConfig {
        addr: config.coordinator_addr.clone(),
        tls: client_tls.clone(),
        timeout: Some(config.shard_timeout),
        // The cache refreshes on the next request anyway; a retry only delays the page that
        // reports the coordinator down.
        retry: RetryPolicy::none(),
    })?;
    let fleet = Arc::new(Fleet::new(
        coordinator,
        FleetConfig {
            shard_timeout: config.shard_timeout,
            cache_ttl: config.cache_ttl,
            tls: client_tls,
        },
        Some(fleet_metrics),
    ));

    let svc = grpc::InspectGrpc::new(Arc::clone(&fleet));
    let stack = ServerStackConfig {
        metrics: Some(grpc_metrics),
        authz: Arc::new(grpc::authz_policy()),
        ..ServerStackConfig::default()
    };
    // Refuse an exposed, unauthenticated dashboard before anything is bound.
    if !config.http_listen.ip().is_loopback()
        && config.http_token.is_none()
        && !config.insecure_plaintext
    {
        return Err(InspectError::HttpExposed {
            addr: config.http_listen,
        });
    }
    let grpc = MeshServer::new("inspect", stack)
        .tcp(config.grpc_listen)
        .tls(server_tls)
        .insecure_plaintext(config.insecure_plaintext)
        .drain_deadline(config.drain_timeout)
        .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
        .add_service(bigfleet_mesh::with_message_limits!(ShardReadServer::new(
            svc.clone()
        )))
        .add_service(bigfleet_mesh::with_message_limits!(InspectServer::new(svc)))
        .start()
        .await?;

    let stop = CancellationToken::new();
    let listener = bigfleet_mesh::bind_tcp(config.http_listen).map_err(InspectError::Http)?;
    let http_addr = listener.local_addr().map_err(InspectError::Http)?;
    if !http_addr.ip().is_loopback() && config.http_token.is_none() {
        tracing::warn!(
            addr = %http_addr,
            "--insecure-plaintext: dashboard and JSON API served without a token on a non-loopback address; anyone who can reach it can read the whole fleet"
        );
    }
    let guard = http_guard::HttpGuard::new(
        config.http_token.clone(),
        config.http_rate,
        config.http_max_in_flight,
    );
    let history = Arc::new(history::History::new(
        config.history,
        config.sample_interval,
    ));
    let sampler = history::spawn_sampler(Arc::clone(&fleet), Arc::clone(&history), stop.clone());
    let router = http::router(Arc::clone(&fleet), history, config.page_refresh).layer(
        axum::middleware::from_fn_with_state(guard, http_guard::guard),
    );
    let http_stop = stop.clone();
    let http_task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(http_stop.cancelled_owned())
            .await
    });

    tracing::info!(
        grpc = %grpc.tcp_addr().map(|a| a.to_string()).unwrap_or_default(),
        http = %http_addr,
        coordinator = %config.coordinator_addr,
        mtls = tls.is_some(),
        "inspect serving"
    );
    Ok(Running {
        grpc,
        http_addr,
        http_task,
        sampler,
        stop,
        drain_timeout: config.drain_timeout,
    })
}

/// Runs the service until SIGTERM or SIGINT, then drains: not ready, in-flight calls and
/// pages finish, the ops endpoint stops.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let ops = bigfleet_mesh::binary::Ops::start(&args.metrics_addr, "inspect starting").await?;
    let mut config = Config::from_args(&args)?;
    config.registry = ops.registry.clone();
    let running = start(config).await?;
    ops.readiness.set_ready();
    ops.drain_on_signal(running.shutdown()).await?;
    Ok(())
}
