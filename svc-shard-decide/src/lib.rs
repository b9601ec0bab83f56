//! bigfleet-shard-decide: the shard's brain (inventory, reconcile, cycle, action ledger).
//!
//! This crate only wires: the behaviour lives in `svc-shard-decide-core` (the
//! cycle, which never depends on the coordinator) and `bigfleet-coordclient`
//! (coordinator reporting, which never sees decide's internals). They meet
//! here, in [`coordinator::CoordView`], and run in separate tasks; with no
//! `--coordinator-addr` the client is not even constructed (static stability,
//! ARCHITECTURE.md §5.1).
//!
//! [`start`] runs decide in-process and returns a [`Running`] handle (tests,
//! `bigfleet up`'s tests); [`run`] is the binary: flags → epoch file → start →
//! wait for SIGTERM/SIGINT → drain.

pub mod cli;
pub mod coordinator;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bigfleet_coordclient::{ClientConfig, CoordClient};
use bigfleet_identity::{Role, TlsContext};
use bigfleet_mesh::{
    AuthzPolicy, ChannelConfig, ClientStackConfig, GrpcMetrics, MeshServer, RetryPolicy,
    RunningServer, ServerStackConfig,
};
use bigfleet_proto::service_names;
use bigfleet_telemetry::{MetricsRegistry, Readiness};
use svc_shard_decide_core::publish::DEFAULT_EVENT_BUFFER;
use svc_shard_decide_core::{
    Decide, DecideConfig, DecideService, ProviderClient, Publisher, RailsConfig, ShardMetrics,
    forward_to_gateway,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::cli::Args;
pub use crate::coordinator::CoordView;

/// File name of decide's Unix socket inside the socket directory.
pub const DECIDE_SOCKET: &str = "decide.sock";
/// File name of the gateway's Unix socket inside the socket directory.
pub const GATEWAY_SOCKET: &str = "gateway.sock";

/// Errors starting decide.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("metrics: {0}")]
    Metrics(#[from] bigfleet_telemetry::TelemetryError),
    #[error("decide: {0}")]
    Decide(#[from] svc_shard_decide_core::DecideError),
    #[error("dialling {what}: {source}")]
    Dial {
        what: &'static str,
        #[source]
        source: bigfleet_mesh::ChannelError,
    },
    #[error("tls: {0}")]
    Tls(#[from] bigfleet_identity::TlsError),
    #[error("server: {0}")]
    Server(#[from] bigfleet_mesh::ServerError),
    #[error("invalid address {addr:?}: {reason}")]
    Address { addr: String, reason: String },
}

/// Coordinator reporting settings (only with `--coordinator-addr`).
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub addr: String,
    pub advertise_addr: String,
    pub report_interval: Duration,
}

/// Everything [`start`] needs.
#[derive(Debug, Clone)]
pub struct StartConfig {
    pub decide: DecideConfig,
    /// Where `decide.sock` is served (and `gateway.sock` dialled).
    pub socket_dir: PathBuf,
    /// Capacity provider URI.
    pub provider_addr: String,
    /// Gateway URI; default `unix://<socket_dir>/gateway.sock`.
    pub gateway_addr: Option<String>,
    /// TCP address for remote execute workers.
    pub work_listen: Option<SocketAddr>,
    pub tls: Option<TlsContext>,
    pub coordinator: Option<CoordinatorConfig>,
    pub registry: MetricsRegistry,
    /// Flipped ready after the first successful provider reconcile.
    pub readiness: Readiness,
    pub drain_timeout: Duration,
}

impl StartConfig {
    /// Defaults for a decide whose sockets live in `socket_dir`.
    pub fn new(socket_dir: impl Into<PathBuf>, provider_addr: impl Into<String>) -> Self {
        StartConfig {
            decide: DecideConfig::default(),
            socket_dir: socket_dir.into(),
            provider_addr: provider_addr.into(),
            gateway_addr: None,
            work_listen: None,
            tls: None,
            coordinator: None,
            registry: MetricsRegistry::new(),
            readiness: Readiness::not_ready(NOT_READY),
            drain_timeout: Duration::from_secs(10),
        }
    }

    fn gateway_target(&self) -> String {
        self.gateway_addr
            .clone()
            .unwrap_or_else(|| format!("unix://{}", self.socket_dir.join(GATEWAY_SOCKET).display()))
    }
}

/// The `/readyz` reason until the first provider reconcile succeeds.
pub const NOT_READY: &str = "first provider reconcile not yet complete";

/// A started decide.
pub struct Running {
    decide: Decide,
    internal: RunningServer,
    work: Option<RunningServer>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    socket_path: PathBuf,
    work_addr: Option<SocketAddr>,
    coordinator_running: bool,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("socket_path", &self.socket_path)
            .field("work_addr", &self.work_addr)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// The shard state (for tests and embedding).
    pub fn decide(&self) -> &Decide {
        &self.decide
    }

    /// Path of `decide.sock`.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Bound address of the remote-worker listener.
    pub fn work_addr(&self) -> Option<SocketAddr> {
        self.work_addr
    }

    /// Whether a coordinator client task was started.
    pub fn coordinator_running(&self) -> bool {
        self.coordinator_running
    }

    /// Stops the cycle, the gateway forwarder and the coordinator client, then
    /// drains both servers (workers' streams end; their actions are abandoned).
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.stop.cancel();
        let work = async {
            match self.work {
                Some(w) => w.shutdown().await,
                None => Ok(()),
            }
        };
        let (a, b) = tokio::join!(work, self.internal.shutdown());
        for t in self.tasks {
            let _ = t.await;
        }
        a?;
        b?;
        Ok(())
    }
}

/// Who may call what on the remote-worker port: only this shard's execute role.
fn work_policy() -> AuthzPolicy {
    AuthzPolicy::deny_by_default().allow_service(service_names::DECIDE, &[Role::ShardExecute])
}

/// Starts decide: `decide.sock` always, the worker port when `work_listen` is set,
/// the cycle loop, the gateway forwarder and (only with a coordinator address)
/// the coordinator client.
pub async fn start(config: StartConfig) -> Result<Running, StartError> {
    let metrics = ShardMetrics::register(&config.registry)?;
    let server_metrics = GrpcMetrics::server(&config.registry)?;
    let client_metrics = GrpcMetrics::client(&config.registry)?;
    let client_tls = config
        .tls
        .as_ref()
        .map(TlsContext::client_config)
        .transpose()?;
    let channel_cfg = ChannelConfig::default().with_tls(client_tls);
    let dial = |what: &'static str, target: &str, retry: RetryPolicy| {
        bigfleet_mesh::dial_lazy(
            target,
            &channel_cfg,
            &ClientStackConfig {
                metrics: Some(client_metrics.clone()),
                retry,
                attempt_timeout: None,
            },
        )
        .map_err(|source| StartError::Dial { what, source })
    };
    // Lists are reads: retrying them is safe. Publish is a stream the
    // forwarder redials itself; reports retry on the next tick.
    let provider = dial("provider", &config.provider_addr, RetryPolicy::default())?;
    let gateway = dial("gateway", &config.gateway_target(), RetryPolicy::none())?;

    let (publisher, events) = Publisher::channel(DEFAULT_EVENT_BUFFER);
    let decide = Decide::new(
        config.decide.clone(),
        Arc::new(ProviderClient::new(provider)),
        publisher,
        metrics,
        config.readiness.clone(),
    )?;
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    {
        let stop = stop.clone();
        let sink = Arc::new(decide.clone());
        tasks.push(tokio::spawn(async move {
            forward_to_gateway(gateway, events, sink, stop.cancelled()).await;
        }));
    }
    {
        let stop = stop.clone();
        let d = decide.clone();
        tasks.push(tokio::spawn(async move { d.run(stop.cancelled()).await }));
    }

    let svc = DecideService::new(decide.clone());
    let stack = |authz: AuthzPolicy| ServerStackConfig {
        metrics: Some(server_metrics.clone()),
        mtls: false, // set by MeshServer from its TLS config
        authz: Arc::new(authz),
        rate_limit: None,
        concurrency_limit: None,
        timeout: None,
    };
    let socket_path = config.socket_dir.join(DECIDE_SOCKET);
    let internal = MeshServer::new("shard-decide", stack(AuthzPolicy::allow_any_identity()))
        .unix(&socket_path)
        .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
        .drain_deadline(config.drain_timeout)
        .add_service(svc.decide_server())
        .add_service(svc.shard_read_server())
        .add_service(svc.shard_info_server())
        .start()
        .await;
    let internal = match internal {
        Ok(s) => s,
        Err(e) => {
            stop.cancel();
            return Err(e.into());
        }
    };
    let work = match config.work_listen {
        None => None,
        Some(addr) => {
            let tls = config
                .tls
                .as_ref()
                .map(TlsContext::server_config)
                .transpose()?;
            let started = MeshServer::new("shard-decide-work", stack(work_policy()))
                .tcp(addr)
                .tls(tls)
                .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
                .drain_deadline(config.drain_timeout)
                .add_service(svc.decide_server())
                .start()
                .await;
            match started {
                Ok(s) => Some(s),
                Err(e) => {
                    stop.cancel();
                    let _ = internal.shutdown().await;
                    return Err(e.into());
                }
            }
        }
    };
    let work_addr = work.as_ref().and_then(RunningServer::tcp_addr);

    let coordinator_running = match &config.coordinator {
        None => false,
        Some(c) => {
            let channel = dial("coordinator", &c.addr, RetryPolicy::none())?;
            let client = CoordClient::new(
                ClientConfig {
                    shard_id: config.decide.shard_id.clone(),
                    shard_epoch: i64::try_from(config.decide.epoch).unwrap_or(i64::MAX),
                    advertise_address: c.advertise_addr.clone(),
                    report_interval: c.report_interval,
                },
                Arc::new(CoordView::new(decide.clone())),
                channel,
            );
            let stop = stop.clone();
            // Its own task: nothing on the cycle's path waits for it.
            tasks.push(tokio::spawn(
                async move { client.run(stop.cancelled()).await },
            ));
            true
        }
    };
    tracing::info!(
        shard = %config.decide.shard_id,
        epoch = config.decide.epoch,
        socket = %socket_path.display(),
        work = ?work_addr,
        provider = %config.provider_addr,
        coordinator = ?config.coordinator.as_ref().map(|c| c.addr.as_str()),
        "shard decide started"
    );
    Ok(Running {
        decide,
        internal,
        work,
        stop,
        tasks,
        socket_path,
        work_addr,
        coordinator_running,
    })
}

/// Parses a listen address; `:7782` means every interface.
pub fn parse_listen(addr: &str) -> Result<SocketAddr, StartError> {
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_owned()
    };
    if let Ok(a) = full.parse() {
        return Ok(a);
    }
    full.to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| StartError::Address {
            addr: addr.to_owned(),
            reason: "expected host:port or :port".to_owned(),
        })
}

/// The decide settings the flags describe (epoch supplied by the caller).
pub fn decide_config(args: &Args, epoch: u64) -> DecideConfig {
    DecideConfig {
        shard_id: args.shard_id.clone(),
        epoch,
        cycle_interval: args.cycle_interval,
        incremental_reconcile: args.incremental_reconcile,
        available_capacity_interval: args.available_capacity_interval,
        rails: RailsConfig {
            actuation_paused: args.actuation_paused,
            dry_run: args.dry_run,
            reclaim_cap_fraction: args.reclaim_cap_fraction,
            empty_rollup_guard: args.empty_rollup_guard,
            max_actions_per_cycle: args.max_actions_per_cycle,
            audit_log: args.audit_log.clone(),
        },
        provider_address: args.provider_addr.clone(),
        ..DecideConfig::default()
    }
}

/// The binary: serves until SIGTERM/SIGINT, then drains.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.etcd_endpoints.is_some() {
        anyhow::bail!(
            "--etcd-endpoints is not supported by this build yet; run without it (epoch file in --data-dir)"
        );
    }
    if !(args.reclaim_cap_fraction >= 0.0 && args.reclaim_cap_fraction <= 1.0) {
        anyhow::bail!("--reclaim-cap-fraction must be within [0, 1]");
    }
    let tls = match args.tls.resolve()? {
        None => None,
        Some(files) => Some(TlsContext::load(&files)?),
    };
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating data dir {}", args.data_dir.display()))?;
    let epoch_path = args.data_dir.join(bigfleet_fencing::EPOCH_FILE_NAME);
    // Every start fences strictly above every previous incarnation.
    let epoch = bigfleet_fencing::advance_epoch_file(&epoch_path)?;
    tracing::info!(epoch, path = %epoch_path.display(), "fencing epoch advanced");

    let registry = MetricsRegistry::new();
    let readiness = Readiness::not_ready(NOT_READY);
    let ops_stop = CancellationToken::new();
    let ops = if args.metrics_addr == "0" {
        None
    } else {
        let addr = parse_listen(&args.metrics_addr)?;
        let stop = ops_stop.clone();
        let (_, task) = bigfleet_telemetry::spawn_ops_server(
            addr,
            registry.clone(),
            readiness.clone(),
            async move { stop.cancelled().await },
        )
        .await
        .with_context(|| format!("serving metrics on {addr}"))?;
        Some(task)
    };
    let coordinator = args
        .coordinator_addr
        .as_ref()
        .map(|addr| CoordinatorConfig {
            addr: addr.clone(),
            advertise_addr: args.advertise_addr.clone().unwrap_or_default(),
            report_interval: args.report_interval,
        });
    let config = StartConfig {
        decide: decide_config(&args, epoch),
        socket_dir: args.socket_dir.clone(),
        provider_addr: args.provider_addr.clone(),
        gateway_addr: None,
        work_listen: args.work_listen.as_deref().map(parse_listen).transpose()?,
        tls,
        coordinator,
        registry,
        readiness: readiness.clone(),
        drain_timeout: args.drain_timeout,
    };
    let running = start(config).await?;
    let signal = bigfleet_mesh::shutdown_signal().await;
    readiness.set_not_ready("draining");
    if let Err(e) = signal {
        tracing::error!(error = %e, "cannot listen for signals; stopping");
    }
    running.shutdown().await?;
    ops_stop.cancel();
    if let Some(task) = ops {
        let _ = task.await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_mesh::{Peer, PeerIdentity};
    use clap::Parser;

    #[test]
    fn work_port_admits_only_execute_workers() {
        let p = work_policy();
        let work = "/bigfleet.mesh.v1.Decide/Work";
        let exec = Peer::Verified(PeerIdentity::ShardExecute("shard-0".into()));
        let cluster = Peer::Verified(PeerIdentity::Cluster("c".into()));
        assert!(p.check(work, &exec).is_ok());
        assert!(p.check(work, &cluster).is_err());
        assert!(
            p.check("/bigfleet.v1alpha1.ShardRead/InspectNeeds", &exec)
                .is_err()
        );
    }

    #[test]
    fn flags_map_onto_the_core_config() {
        let a = Args::try_parse_from([
            "d",
            "--provider-addr=unix:///p.sock",
            "--shard-id=shard-3",
            "--dry-run",
            "--reclaim-cap-fraction=0.1",
            "--max-actions-per-cycle=7",
            "--cycle-interval=250ms",
        ])
        .unwrap();
        let c = decide_config(&a, 9);
        assert_eq!((c.shard_id.as_str(), c.epoch), ("shard-3", 9));
        assert!(c.rails.dry_run && !c.rails.actuation_paused);
        assert_eq!(c.rails.reclaim_cap_fraction, 0.1);
        assert_eq!(c.rails.max_actions_per_cycle, 7);
        assert_eq!(c.cycle_interval, Duration::from_millis(250));
        assert_eq!(c.provider_address, "unix:///p.sock");
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen(":7782").unwrap().port(), 7782);
        assert!(parse_listen("127.0.0.1:0").unwrap().ip().is_loopback());
        assert!(parse_listen("nonsense").is_err());
    }
}
