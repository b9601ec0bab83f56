//! bigfleet-shard-execute: the worker pool that runs actions against the provider.
//!
//! A worker opens decide's `Work` stream (Unix socket in the shard pod, or TCP
//! with mTLS as role `shard/<id>/execute` from a separate Deployment), keeps
//! `--concurrency` actions in flight with credits, and runs each action's
//! flow ([`flows`]): Provision, Bootstrap, Reclaim / Preempt and Release,
//! reporting every state change to decide (the only authority on machine
//! state), fetching bootstrap blobs and delivering reclaim instructions
//! through the session gateway, and calling the capacity provider with
//! fencing tokens stamped from the work item. When decide goes away the
//! stream's actions are abandoned (decide re-derives them) and the worker
//! reconnects with backoff. With `--etcd-endpoints` the decide address is
//! not configured but discovered: the worker follows the Work endpoint the
//! shard's current leader publishes in etcd ([`follow`]).
//!
//! * [`Args`] / [`run`]: the binary's flags (docs/flags.md) and main loop.
//! * [`start`] / [`Running`]: the same service in-process, for tests and
//!   `bigfleet up`.
//! * [`links`]: the small traits the flows run against ([`DecideLink`],
//!   [`GatewayLink`], [`ProviderLink`]) and their gRPC implementations.
//! * `doubles` (feature `testing`, dev-dependencies only): in-process Decide
//!   and Gateway doubles for tests and the `execute-bench` binary.

pub mod connect;
#[cfg(any(test, feature = "testing"))]
pub mod doubles;
pub mod fence;
pub mod flows;
pub mod follow;
pub mod links;
pub mod metrics;
pub mod outcome;
pub mod pool;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::{PeerIdentity, TlsContext};
use bigfleet_mesh::{GrpcMetrics, ServiceFlags};
use bigfleet_shardlease::{EtcdConfig, EtcdShards, EtcdTls, WorkEndpointWatcher};
use bigfleet_telemetry::{MetricsRegistry, Readiness};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use bigfleet_mesh::RetryPolicy;
pub use connect::ConnectError;
pub use flows::{ExecConfig, Executor, Report};
pub use links::{DecideLink, GatewayLink, GrpcDecide, GrpcGateway, GrpcProvider, ProviderLink};
pub use metrics::ExecuteMetrics;
pub use outcome::Outcome;
pub use pool::{PoolConfig, run_pool};

/// `/readyz`'s reason until a Work stream to decide is open.
const NOT_STREAMING: &str = "no work stream to decide yet";

/// Bound of one Transition call to decide (a local, fast service).
pub(crate) const TRANSITION_TIMEOUT: Duration = Duration::from_secs(10);

/// Command-line flags of `bigfleet-shard-execute` (docs/flags.md).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "bigfleet-shard-execute",
    version,
    about = "The shard's worker pool: pulls actions from decide and runs them against the provider."
)]
pub struct Args {
    /// Shard this worker serves; decide refuses a worker of another shard.
    #[arg(long, env = "BIGFLEET_SHARD_ID", default_value = "shard-0")]
    pub shard_id: String,
    /// Decide's Work endpoint: unix:///path, http://host:port or https://host:port (mTLS).
    #[arg(
        long,
        env = "BIGFLEET_DECIDE_ADDR",
        default_value = "unix:///run/bigfleet/decide.sock"
    )]
    pub decide_addr: String,
    /// The session gateway, for RequestBootstrap and SendReclaim.
    #[arg(
        long,
        env = "BIGFLEET_GATEWAY_ADDR",
        default_value = "unix:///run/bigfleet/gateway.sock"
    )]
    pub gateway_addr: String,
    /// The capacity provider.
    #[arg(long, env = "BIGFLEET_PROVIDER_ADDR")]
    pub provider_addr: String,
    /// Actions in flight at most.
    #[arg(long, env = "BIGFLEET_CONCURRENCY", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub concurrency: u32,
    /// Budget of one action, independent of decide's cycles.
    #[arg(long, env = "BIGFLEET_ACTION_TIMEOUT", default_value = "30s",
          value_parser = humantime::parse_duration)]
    pub action_timeout: Duration,
    /// etcd endpoints (comma-separated): discover and follow the Work endpoint of this
    /// shard's current leader instead of --decide-addr.
    #[arg(long, env = "BIGFLEET_ETCD_ENDPOINTS")]
    pub etcd_endpoints: Option<String>,
    /// CA bundle verifying etcd's server certificate (enables TLS towards etcd).
    #[arg(long, env = "BIGFLEET_ETCD_CA")]
    pub etcd_ca: Option<std::path::PathBuf>,
    /// Client certificate for etcd (with --etcd-key; needs --etcd-ca).
    #[arg(long, env = "BIGFLEET_ETCD_CERT")]
    pub etcd_cert: Option<std::path::PathBuf>,
    /// Client key for etcd (with --etcd-cert).
    #[arg(long, env = "BIGFLEET_ETCD_KEY")]
    pub etcd_key: Option<std::path::PathBuf>,
    /// HTTP /metrics /healthz /readyz; `0` disables.
    #[arg(long, env = "BIGFLEET_METRICS_ADDR", default_value = ":8782")]
    pub metrics_addr: String,
    /// `--drain-timeout` (how long running actions may take to finish after SIGTERM), TLS
    /// and log flags, alike in every service.
    #[command(flatten)]
    pub service: ServiceFlags,
}

/// Startup failures.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
    #[error("metrics: {0}")]
    Metrics(#[from] bigfleet_telemetry::TelemetryError),
    #[error("--etcd-*: {0}")]
    EtcdFlags(String),
    #[error("etcd: {0}")]
    Etcd(#[from] bigfleet_shardlease::ShardLeaseError),
    #[error(
        "certificate identity {found} cannot serve shard {shard}: expected shard/{shard}/execute"
    )]
    WrongIdentity { found: String, shard: String },
    #[error("certificate identity: {0}")]
    Identity(#[from] bigfleet_identity::IdentityError),
}

/// Everything [`start`] needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub shard_id: String,
    pub worker_id: String,
    pub decide_addr: String,
    pub gateway_addr: String,
    pub provider_addr: String,
    pub concurrency: u32,
    pub exec: ExecConfig,
    pub drain_timeout: Duration,
    /// Where the worker's metrics go: the binary's ops endpoint serves it.
    pub registry: MetricsRegistry,
    /// The `/readyz` of the binary's ops endpoint: ready while a Work stream to decide is open.
    pub readiness: Readiness,
    /// mTLS on `https` addresses.
    pub tls: Option<TlsContext>,
    /// Discover decide in etcd (`decide_addr` is then unused).
    pub etcd: Option<EtcdConfig>,
}

impl Config {
    /// Defaults for everything but the three addresses.
    pub fn new(decide_addr: &str, gateway_addr: &str, provider_addr: &str) -> Self {
        Self {
            shard_id: "shard-0".to_owned(),
            worker_id: default_worker_id(),
            decide_addr: decide_addr.to_owned(),
            gateway_addr: gateway_addr.to_owned(),
            provider_addr: provider_addr.to_owned(),
            concurrency: 64,
            exec: ExecConfig::default(),
            drain_timeout: Duration::from_secs(10),
            registry: MetricsRegistry::new(),
            readiness: Readiness::not_ready(NOT_STREAMING),
            tls: None,
            etcd: None,
        }
    }
}

/// `<hostname>-<pid>`: unique among a shard's workers (pod names are).
pub fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "execute".to_owned());
    format!("{host}-{}", std::process::id())
}

impl Args {
    /// The etcd settings the flags describe (`None` without `--etcd-endpoints`).
    pub fn etcd_config(&self) -> Result<Option<EtcdConfig>, StartError> {
        let Some(list) = self.etcd_endpoints.as_deref() else {
            return Ok(None);
        };
        let endpoints = EtcdConfig::parse_endpoints(list);
        if endpoints.is_empty() {
            return Err(StartError::EtcdFlags(
                "--etcd-endpoints is empty".to_owned(),
            ));
        }
        let mut cfg = EtcdConfig::new(endpoints);
        cfg.tls = match (&self.etcd_ca, &self.etcd_cert, &self.etcd_key) {
            (None, None, None) => None,
            (Some(ca), cert, key) => Some(EtcdTls {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, _, _) => {
                return Err(StartError::EtcdFlags(
                    "--etcd-cert/--etcd-key need --etcd-ca".to_owned(),
                ));
            }
        };
        cfg.timing()
            .map_err(|e| StartError::EtcdFlags(e.to_string()))?;
        let tls = &self.service.tls;
        let mesh_mtls = tls.resolve().is_ok_and(|f| f.is_some());
        cfg.check_transport(mesh_mtls, tls.insecure_plaintext)
            .map_err(StartError::EtcdFlags)?;
        Ok(Some(cfg))
    }

    pub fn config(&self) -> Result<Config, StartError> {
        let etcd = self.etcd_config()?;
        let tls = self
            .service
            .tls
            .resolve()?
            .map(|files| TlsContext::load(&files))
            .transpose()?;
        let mut cfg = Config::new(&self.decide_addr, &self.gateway_addr, &self.provider_addr);
        cfg.shard_id.clone_from(&self.shard_id);
        cfg.concurrency = self.concurrency;
        cfg.exec.action_timeout = self.action_timeout;
        cfg.drain_timeout = self.service.drain_timeout;
        cfg.tls = tls;
        cfg.etcd = etcd;
        Ok(cfg)
    }
}

/// A worker pool running in this process.
#[derive(Debug)]
pub struct Running {
    registry: MetricsRegistry,
    metrics: ExecuteMetrics,
    shutdown: CancellationToken,
    pool: JoinHandle<()>,
    /// etcd mode: the Work endpoint the pool follows.
    watcher: Option<WorkEndpointWatcher>,
}

impl Running {
    pub fn registry(&self) -> &MetricsRegistry {
        &self.registry
    }

    pub fn metrics(&self) -> &ExecuteMetrics {
        &self.metrics
    }

    /// The decide Work endpoint currently published in etcd (etcd mode only).
    pub fn discovered_decide(&self) -> Option<String> {
        self.watcher.as_ref().and_then(WorkEndpointWatcher::current)
    }

    /// Graceful stop: no new work, running actions finish and report (up to
    /// the drain timeout), then the stream closes.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        if let Err(e) = self.pool.await {
            tracing::error!(error = %e, "worker pool task failed");
        }
    }

    /// Stops like a crash: running actions are dropped mid-flight without
    /// reporting, and the stream is reset. For tests of decide's abandonment.
    pub async fn abort(self) {
        self.pool.abort();
        let _ = self.pool.await;
    }
}

/// Where the worker finds decide.
enum DecideSource {
    /// `--decide-addr`.
    Static(GrpcDecide),
    /// The shard leader's Work endpoint in etcd.
    Discovered(WorkEndpointWatcher),
}

/// Connects (lazily) and starts the pool. The Work stream is opened in the background and
/// re-opened whenever it ends.
pub async fn start(cfg: Config) -> Result<Running, StartError> {
    if let Some(tls) = &cfg.tls {
        match tls.own_identity()? {
            PeerIdentity::ShardExecute(id) | PeerIdentity::Shard(id) if id == cfg.shard_id => {}
            other => {
                return Err(StartError::WrongIdentity {
                    found: format!("{other:?}"),
                    shard: cfg.shard_id.clone(),
                });
            }
        }
    }
    let tls = cfg.tls.as_ref();
    let registry = cfg.registry.clone();
    let metrics = ExecuteMetrics::register(&registry)?;
    let client_metrics = GrpcMetrics::client(&registry)?;
    // Everything that can fail on bad configuration happens before anything is spawned.
    let source = match &cfg.etcd {
        None => {
            let channel = connect::channel(&cfg.decide_addr, tls, Some(&client_metrics))?;
            DecideSource::Static(GrpcDecide::new(channel, TRANSITION_TIMEOUT))
        }
        Some(etcd) => {
            let shards = EtcdShards::connect(etcd.clone()).await?;
            DecideSource::Discovered(shards.watch_work_endpoint(&cfg.shard_id))
        }
    };
    let gateway = GrpcGateway::new(connect::channel(
        &cfg.gateway_addr,
        tls,
        Some(&client_metrics),
    )?);
    let provider = GrpcProvider::new(connect::channel(
        &cfg.provider_addr,
        tls,
        Some(&client_metrics),
    )?);

    let readiness = cfg.readiness.clone();

    let pool_cfg = PoolConfig {
        worker_id: cfg.worker_id.clone(),
        shard_id: cfg.shard_id.clone(),
        concurrency: cfg.concurrency,
        drain_timeout: cfg.drain_timeout,
        ..PoolConfig::default()
    };
    let shutdown = CancellationToken::new();
    let make = {
        let metrics = metrics.clone();
        let exec = cfg.exec.clone();
        move |decide: GrpcDecide| {
            Arc::new(Executor::new(
                decide,
                gateway.clone(),
                provider.clone(),
                metrics.clone(),
                exec.clone(),
            ))
        }
    };
    let (pool, watcher) = match source {
        DecideSource::Static(decide) => {
            let client = decide.client();
            let pool = tokio::spawn(run_pool(
                client,
                make(decide),
                pool_cfg,
                shutdown.clone(),
                readiness,
            ));
            (pool, None)
        }
        DecideSource::Discovered(watcher) => {
            let pool = tokio::spawn(follow::follow_decide(
                watcher.subscribe(),
                cfg.tls.clone(),
                client_metrics,
                make,
                pool_cfg,
                shutdown.clone(),
                readiness,
            ));
            (pool, Some(watcher))
        }
    };
    tracing::info!(
        worker_id = %cfg.worker_id,
        shard_id = %cfg.shard_id,
        decide = %if cfg.etcd.is_some() { "discovered in etcd" } else { cfg.decide_addr.as_str() },
        gateway = %cfg.gateway_addr,
        provider = %cfg.provider_addr,
        concurrency = cfg.concurrency,
        "starting execute worker pool"
    );
    Ok(Running {
        registry,
        metrics,
        shutdown,
        pool,
        watcher,
    })
}

/// Runs the worker pool until SIGTERM/SIGINT, then drains: not ready, running actions
/// finish and report, the ops endpoint stops.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let ops = bigfleet_mesh::binary::Ops::start(&args.metrics_addr, NOT_STREAMING).await?;
    let mut cfg = args.config()?;
    cfg.registry = ops.registry.clone();
    cfg.readiness = ops.readiness.clone();
    let running = start(cfg).await?;
    ops.drain_on_signal(async {
        running.shutdown().await;
        anyhow::Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_and_defaults_match_the_contract() {
        let args = Args::try_parse_from(["x", "--provider-addr", "unix:///tmp/p.sock"]).unwrap();
        assert_eq!(args.shard_id, "shard-0");
        assert_eq!(args.decide_addr, "unix:///run/bigfleet/decide.sock");
        assert_eq!(args.gateway_addr, "unix:///run/bigfleet/gateway.sock");
        assert_eq!(args.concurrency, 64);
        assert_eq!(args.action_timeout, Duration::from_secs(30));
        assert_eq!(args.metrics_addr, ":8782");
        let cfg = args.config().unwrap();
        assert_eq!(cfg.exec.action_timeout, Duration::from_secs(30));
        assert_eq!(cfg.drain_timeout, Duration::from_secs(10));
        assert!(cfg.tls.is_none());

        // --provider-addr is required; concurrency must be positive.
        assert!(Args::try_parse_from(["x"]).is_err());
        assert!(Args::try_parse_from(["x", "--provider-addr", "p", "--concurrency", "0"]).is_err());
        let args = Args::try_parse_from([
            "x",
            "--provider-addr",
            "p",
            "--action-timeout",
            "1500ms",
            "--metrics-addr",
            "0",
            "--drain-timeout",
            "2s",
            "--log-format",
            "json",
        ])
        .unwrap();
        assert_eq!(
            args.service.log.log_format,
            bigfleet_telemetry::LogFormat::Json
        );
        let cfg = args.config().unwrap();
        assert_eq!(cfg.exec.action_timeout, Duration::from_millis(1500));
        assert_eq!(cfg.drain_timeout, Duration::from_secs(2));
    }

    #[test]
    fn partial_tls_and_etcd_are_startup_errors() {
        let args =
            Args::try_parse_from(["x", "--provider-addr", "p", "--tls-cert", "/c.pem"]).unwrap();
        assert!(matches!(args.config(), Err(StartError::Tls(_))));
        let parse = |extra: &[&str]| {
            Args::try_parse_from(["x", "--provider-addr", "p"].iter().chain(extra).copied())
                .unwrap()
        };
        for bad in [
            &["--etcd-endpoints", " , "][..],
            &[
                "--etcd-endpoints",
                "h:2379",
                "--etcd-cert",
                "/c.pem",
                "--etcd-key",
                "/k.pem",
            ],
            &[
                "--etcd-endpoints",
                "h:2379",
                "--etcd-ca",
                "/ca.pem",
                "--etcd-key",
                "/k.pem",
            ],
        ] {
            assert!(
                matches!(parse(bad).config(), Err(StartError::EtcdFlags(_))),
                "{bad:?}"
            );
        }
        let cfg = parse(&["--etcd-endpoints", "h:2379,i:2379", "--etcd-ca", "/ca.pem"])
            .config()
            .unwrap();
        let etcd = cfg.etcd.unwrap();
        assert_eq!(etcd.endpoints, ["h:2379", "i:2379"]);
        assert_eq!(etcd.tls.unwrap().ca, std::path::PathBuf::from("/ca.pem"));
        assert!(parse(&[]).config().unwrap().etcd.is_none());
    }
}
