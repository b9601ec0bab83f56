//! bigfleet-shard-decide: the shard's brain (inventory, reconcile, cycle, action ledger).
//!
//! This crate only wires: the behaviour lives in `svc-shard-decide-core` (the
//! cycle, which never depends on the coordinator) and `bigfleet-coordclient`
//! (coordinator reporting, which never sees decide's internals). They meet
//! here, in [`coordinator::CoordView`], and run in separate tasks; with no
//! `--coordinator-addr` the client is not even constructed (static stability,
//! checked by `tests/architecture.rs`).
//!
//! [`start`] runs decide in-process and returns a [`Running`] handle (tests,
//! `bigfleet up`'s tests); [`run`] is the binary: flags → data dir lock and epoch
//! file ([`filemode`]) → start → wait for SIGTERM/SIGINT → drain.
//!
//! With `--etcd-endpoints` ([`EtcdMode`], ADR-0074) the epoch comes from etcd
//! instead of the epoch file, decide campaigns for the shard's leader lease
//! and hands out work only while it holds a term (stamping that term's epoch;
//! cycles, sessions, reads and metrics never pause), and the leader publishes
//! its Work endpoint for remote execute workers.

pub mod cli;
pub mod coordinator;
pub mod filemode;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_coordclient::{ClientConfig, CoordClient};
use bigfleet_identity::{Role, TlsContext};
use bigfleet_mesh::{
    AuthzPolicy, ChannelConfig, ClientStackConfig, GrpcMetrics, MeshServer, RetryPolicy,
    RunningServer, ServerStackConfig,
};
use bigfleet_proto::service_names;
use bigfleet_shardlease::{Campaign, EtcdConfig, EtcdShards, EtcdTls, LeaderGate};
use bigfleet_telemetry::{MetricsRegistry, Readiness};
use svc_shard_decide_core::publish::DEFAULT_EVENT_BUFFER;
use svc_shard_decide_core::{
    Decide, DecideConfig, DecideService, EpochSource, ProviderClient, Publisher, RailsConfig,
    ShardMetrics, forward_to_gateway,
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
    #[error("etcd: {0}")]
    Etcd(#[from] bigfleet_shardlease::ShardLeaseError),
    #[error("no epoch from etcd within {0:?} (last error: {1})")]
    EtcdStartup(Duration, bigfleet_shardlease::ShardLeaseError),
    #[error("owned domains: {0}")]
    Ownership(String),
}

/// etcd mode (`--etcd-endpoints`): epoch, leader lease and Work endpoint from etcd.
#[derive(Debug, Clone)]
pub struct EtcdMode {
    pub config: EtcdConfig,
    /// Published under `/bigfleet/shards/<id>/work` while leading; `None` derives it
    /// from the bound Work listener (nothing is published without one).
    pub work_endpoint: Option<String>,
    /// The leader key's value; `None`: `<hostname>-<pid>-<random>`.
    pub holder: Option<String>,
    /// Every epoch minted is above this (the last epoch file's value when a shard moves
    /// over from file mode, ADR-0073).
    pub epoch_floor: u64,
    /// How long start-up may wait for etcd to mint the process epoch.
    pub startup_timeout: Duration,
}

impl EtcdMode {
    pub fn new(config: EtcdConfig) -> Self {
        Self {
            config,
            work_endpoint: None,
            holder: None,
            epoch_floor: 0,
            startup_timeout: Duration::from_secs(60),
        }
    }
}

/// Coordinator reporting settings (only with `--coordinator-addr`).
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub addr: String,
    pub advertise_addr: String,
    pub report_interval: Duration,
    /// Where owned domains and transferred machines are saved before they are
    /// acked, and read back at start-up (ADR-0129); `None` keeps them in memory.
    pub ownership_file: Option<PathBuf>,
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
    /// Serve the work port in plaintext on a non-loopback address (`--insecure-plaintext`).
    pub insecure_plaintext: bool,
    /// Who may connect to `decide.sock` (this uid, plus `--socket-peer-gid`).
    pub local_peers: bigfleet_mesh::LocalPeers,
    pub coordinator: Option<CoordinatorConfig>,
    /// etcd mode; `None`: `decide.epoch` as given (the epoch file), always actuating.
    pub etcd: Option<EtcdMode>,
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
            insecure_plaintext: false,
            local_peers: bigfleet_mesh::LocalPeers::same_user(),
            coordinator: None,
            etcd: None,
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
    leader: Option<LeaderGate>,
    work_endpoint: Option<String>,
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

    /// The leader lease (etcd mode only).
    pub fn leader(&self) -> Option<&LeaderGate> {
        self.leader.as_ref()
    }

    /// The Work endpoint published in etcd while leading (etcd mode with a Work
    /// listener only).
    pub fn work_endpoint(&self) -> Option<&str> {
        self.work_endpoint.as_deref()
    }

    /// Resigns the leader lease (a standby takes over at once), stops the cycle,
    /// the gateway forwarder and the coordinator client, then drains both servers
    /// (workers' streams end; their actions are abandoned).
    pub async fn shutdown(self) -> Result<(), StartError> {
        if let Some(leader) = self.leader {
            leader.resign().await;
        }
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
    AuthzPolicy::deny_by_default().allow_service(service_names::WORK, &[Role::ShardExecute])
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

    // etcd mode: this process's own epoch is minted before anything runs (action ids
    // and coordinator reports carry it); each leadership term then mints its own,
    // higher one, delivered straight into the hand-out gate.
    let mut decide_config = config.decide.clone();
    let etcd = match &config.etcd {
        None => None,
        Some(mode) => {
            let shards = EtcdShards::connect(mode.config.clone()).await?;
            let epoch = startup_epoch(&shards, &decide_config.shard_id, mode).await?;
            let (epochs_tx, epochs_rx) = tokio::sync::watch::channel(None);
            decide_config.epoch = epoch;
            decide_config.epoch_source = EpochSource::Leased(epochs_rx);
            Some((shards, mode, epochs_tx))
        }
    };
    let (publisher, events) = Publisher::channel(DEFAULT_EVENT_BUFFER);
    let decide = Decide::new(
        decide_config.clone(),
        Arc::new(ProviderClient::new(provider)),
        publisher,
        metrics,
        config.readiness.clone(),
    )?;
    // A restarted shard owns what it last acked, from before its first cycle
    // (ADR-0129), not everything until the coordinator answers.
    if let Some(path) = config
        .coordinator
        .as_ref()
        .and_then(|c| c.ownership_file.as_deref())
        && let Some(o) = coordinator::load_ownership(path).map_err(StartError::Ownership)?
    {
        tracing::info!(
            shard = %decide_config.shard_id,
            domains = o.domains.len(),
            adopted = o.adopted.len(),
            released = o.released.len(),
            "owned domains restored"
        );
        decide.restore_ownership(o);
    }
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
        rate_limited_services: None,
        rate_limit_exempt_loopback: false,
        concurrency_limit: None,
        timeout: None,
    };
    let socket_path = config.socket_dir.join(DECIDE_SOCKET);
    let internal = MeshServer::new("shard-decide", stack(AuthzPolicy::allow_any_identity()))
        .unix(&socket_path)
        .local_peers(config.local_peers)
        .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
        .drain_deadline(config.drain_timeout)
        .add_service(svc.ingest_server())
        .add_service(svc.work_server())
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
                .insecure_plaintext(config.insecure_plaintext)
                // Execute workers' contract only: ingest and reads stay on the socket.
                .add_service(svc.work_server())
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

    // Campaign only once the Work listener is bound: the term's transaction publishes
    // its address.
    let (leader, work_endpoint) = match etcd {
        None => (None, None),
        Some((shards, mode, epochs_tx)) => {
            let work_endpoint = mode
                .work_endpoint
                .clone()
                .or_else(|| work_addr.map(|a| derive_work_endpoint(a, config.tls.is_some())));
            let mut campaign = Campaign::new(decide_config.shard_id.clone())
                .with_epoch_floor(mode.epoch_floor.max(decide_config.epoch));
            if let Some(h) = &mode.holder {
                campaign = campaign.with_holder(h.clone());
            }
            if let Some(ep) = &work_endpoint {
                campaign = campaign.with_work_endpoint(ep.clone());
            }
            tracing::info!(
                shard = %decide_config.shard_id,
                holder = %campaign.holder,
                work_endpoint = ?work_endpoint,
                "campaigning for the shard's leader lease; work is handed out only while leading"
            );
            (
                Some(shards.campaign_with(campaign, epochs_tx)),
                work_endpoint,
            )
        }
    };

    let coordinator_running = match &config.coordinator {
        None => false,
        Some(c) => {
            let channel = dial("coordinator", &c.addr, RetryPolicy::none())?;
            let client = CoordClient::new(
                ClientConfig {
                    shard_id: config.decide.shard_id.clone(),
                    shard_epoch: i64::try_from(decide_config.epoch).unwrap_or(i64::MAX),
                    advertise_address: c.advertise_addr.clone(),
                    report_interval: c.report_interval,
                },
                Arc::new(match &c.ownership_file {
                    Some(path) => CoordView::new(decide.clone()).with_state_file(path.clone()),
                    None => CoordView::new(decide.clone()),
                }),
                channel,
            )
            .with_redial({
                // A follower's NotLeader hint is dialled like the configured address.
                let channel_cfg = channel_cfg.clone();
                let stack = ClientStackConfig {
                    metrics: Some(client_metrics.clone()),
                    retry: RetryPolicy::none(),
                    attempt_timeout: None,
                };
                Arc::new(move |leader: &str| {
                    bigfleet_mesh::dial_lazy(leader, &channel_cfg, &stack)
                        .map_err(|e| e.to_string())
                })
            });
            let stop = stop.clone();
            // Its own task: nothing on the cycle's path waits for it.
            tasks.push(tokio::spawn(
                async move { client.run(stop.cancelled()).await },
            ));
            true
        }
    };
    tracing::info!(
        shard = %decide_config.shard_id,
        epoch = decide_config.epoch,
        etcd = leader.is_some(),
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
        leader,
        work_endpoint,
    })
}

/// Mints this process's epoch in etcd, retrying (etcd may still be coming up) until
/// `mode.startup_timeout`.
async fn startup_epoch(
    shards: &EtcdShards,
    shard_id: &str,
    mode: &EtcdMode,
) -> Result<u64, StartError> {
    let deadline = tokio::time::Instant::now() + mode.startup_timeout;
    let mut backoff = bigfleet_mesh::Backoff::new(bigfleet_mesh::BackoffPolicy::new(
        Duration::from_millis(100),
        Duration::from_secs(2),
    ));
    loop {
        let pause = backoff.next_delay();
        match shards.next_epoch(shard_id, mode.epoch_floor).await {
            Ok(grant) => {
                tracing::info!(shard = %shard_id, epoch = grant.epoch, "process epoch minted in etcd");
                return Ok(grant.epoch);
            }
            // Never retried: a corrupt epoch must be repaired by hand.
            Err(e @ bigfleet_shardlease::ShardLeaseError::CorruptEpoch { .. })
            | Err(e @ bigfleet_shardlease::ShardLeaseError::EpochOverflow { .. }) => {
                return Err(e.into());
            }
            Err(e) if tokio::time::Instant::now() + pause > deadline => {
                return Err(StartError::EtcdStartup(mode.startup_timeout, e));
            }
            Err(e) => {
                tracing::warn!(shard = %shard_id, error = %e, "cannot mint an epoch in etcd yet; retrying");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// The Work endpoint to publish for a listener bound to `addr`: its own IP unless it
/// listens on every interface, then `$POD_IP`, then the hostname.
pub fn derive_work_endpoint(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = if addr.ip().is_unspecified() {
        std::env::var("POD_IP")
            .ok()
            .filter(|ip| !ip.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "localhost".to_owned())
    } else {
        addr.ip().to_string()
    };
    // A bare IPv6 address needs brackets in a URI.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    format!("{scheme}://{host}:{}", addr.port())
}

/// The etcd settings the flags describe (`None` without `--etcd-endpoints`).
pub fn etcd_mode(args: &Args) -> anyhow::Result<Option<EtcdMode>> {
    let Some(list) = args.etcd_endpoints.as_deref() else {
        return Ok(None);
    };
    let endpoints = EtcdConfig::parse_endpoints(list);
    if endpoints.is_empty() {
        anyhow::bail!("--etcd-endpoints is empty");
    }
    let mut config = EtcdConfig::new(endpoints);
    config.lease_ttl = args.etcd_lease_ttl;
    config.tls = match (&args.etcd_ca, &args.etcd_cert, &args.etcd_key) {
        (None, None, None) => None,
        (Some(ca), cert, key) => Some(EtcdTls {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
        }),
        (None, _, _) => anyhow::bail!("--etcd-cert/--etcd-key need --etcd-ca"),
    };
    config
        .timing()
        .map_err(|e| anyhow::anyhow!("--etcd-*: {e}"))?;
    let mesh_mtls = args.service.tls.resolve()?.is_some();
    config
        .check_transport(mesh_mtls, args.service.tls.insecure_plaintext)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut mode = EtcdMode::new(config);
    mode.work_endpoint = args.work_advertise.clone();
    // A shard moving over from the epoch file continues above its last file epoch.
    let epoch_path = args.data_dir.join(bigfleet_fencing::EPOCH_FILE_NAME);
    mode.epoch_floor = bigfleet_fencing::read_epoch_file(&epoch_path)?.unwrap_or(0);
    Ok(Some(mode))
}

/// Parses a listen address; `:7782` means every interface.
pub fn parse_listen(addr: &str) -> Result<SocketAddr, StartError> {
    bigfleet_mesh::parse_listen_addr(addr).map_err(|reason| StartError::Address {
        addr: addr.to_owned(),
        reason,
    })
}

/// The decide settings the flags describe (epoch supplied by the caller).
pub fn decide_config(args: &Args, epoch: u64) -> DecideConfig {
    DecideConfig {
        shard_id: args.shard_id.clone(),
        epoch,
        cycle_interval: args.cycle_interval,
        wake_interval: args.wake_interval,
        metrics_warmup_cycles: args.metrics_warmup_cycles,
        incremental_reconcile: args.incremental_reconcile,
        full_list_interval: args.full_list_interval,
        available_capacity_interval: args.available_capacity_interval,
        available_capacity_min_change: args.available_capacity_min_change,
        rails: RailsConfig {
            actuation_paused: args.actuation_paused,
            dry_run: args.dry_run,
            reclaim_budget_fraction: args
                .reclaim_cap_fraction
                .unwrap_or(args.reclaim_budget_fraction),
            reclaim_budget_window: args.reclaim_budget_window,
            empty_rollup_guard: args.empty_rollup_guard,
            max_actions_per_cycle: args.max_actions_per_cycle,
            audit_log: args.audit_log.clone(),
        },
        provider_address: args.provider_addr.clone(),
        phase2: bigfleet_decision::Phase2Options {
            weights: bigfleet_decision::VictimWeights {
                priority: args.victim_weight_priority,
                drain_speed: args.victim_weight_drain_speed,
                interruption: args.victim_weight_interruption,
                reclamation: args.victim_weight_reclamation,
            },
            estimated_drain: args.estimated_drain,
        },
        removals: svc_shard_decide_core::reconcile::RemovalPolicy {
            max_unconfirmed: args.removal_hold_count,
            max_unconfirmed_fraction: args.removal_hold_fraction.clamp(0.0, 1.0),
            confirmations: args.removal_confirmations.max(1),
            min_hold: args.removal_min_hold,
        },
        rollup_limits: args.rollup_limits.limits(),
        max_shard_dimensions: args.max_shard_resource_dimensions,
        action_history: args.action_history,
        ..DecideConfig::default()
    }
}

/// The binary: serves until SIGTERM/SIGINT, then drains.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let etcd = etcd_mode(&args)?;
    if let Some(f) = args.reclaim_cap_fraction {
        if !(0.0..=1.0).contains(&f) {
            anyhow::bail!("--reclaim-cap-fraction must be within [0, 1]");
        }
        tracing::warn!(
            fraction = f,
            "--reclaim-cap-fraction is deprecated: it now sets --reclaim-budget-fraction, a budget per --reclaim-budget-window (default 10m) rather than per cycle (ADR-0105)"
        );
    }
    if !(0.0..=1.0).contains(&args.reclaim_budget_fraction) {
        anyhow::bail!("--reclaim-budget-fraction must be within [0, 1]");
    }
    if args.reclaim_budget_window.is_zero() {
        anyhow::bail!(
            "--reclaim-budget-window must be positive (use --reclaim-budget-fraction=0 to disable the budget)"
        );
    }
    let tls = args.service.tls_context()?;
    // Epoch-file mode: every start fences strictly above every previous incarnation, even
    // one whose epoch file was lost, and the data dir's lock (held until run() returns)
    // keeps a second decide off it (ADR-0103).
    let (epoch, data_dir_lock) = if etcd.is_some() {
        // Minted in etcd by start(); no volume needed.
        (0, None)
    } else {
        let claimed = filemode::claim_data_dir(&args.data_dir).await?;
        (claimed.epoch, Some(claimed.lock))
    };

    let ops = bigfleet_mesh::binary::Ops::start(&args.metrics_addr, NOT_READY).await?;
    let coordinator = args
        .coordinator_addr
        .as_ref()
        .map(|addr| CoordinatorConfig {
            addr: addr.clone(),
            advertise_addr: args.advertise_addr.clone().unwrap_or_default(),
            report_interval: args.report_interval,
            ownership_file: Some(args.data_dir.join(coordinator::OWNERSHIP_FILE_NAME)),
        });
    let config = StartConfig {
        decide: decide_config(&args, epoch),
        socket_dir: args.socket_dir.clone(),
        provider_addr: args.provider_addr.clone(),
        gateway_addr: None,
        work_listen: args.work_listen.as_deref().map(parse_listen).transpose()?,
        tls,
        insecure_plaintext: args.service.tls.insecure_plaintext,
        local_peers: bigfleet_mesh::LocalPeers::same_user().with_group(args.socket_peer_gid),
        coordinator,
        etcd,
        registry: ops.registry.clone(),
        readiness: ops.readiness.clone(),
        drain_timeout: args.service.drain_timeout,
    };
    let running = start(config).await?;
    ops.drain_on_signal(running.shutdown()).await?;
    // Only now may another decide take the data dir.
    drop(data_dir_lock);
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
        let work = "/bigfleet.mesh.v1.Work/Pull";
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
            "--victim-weight-priority=2.5",
            "--victim-weight-reclamation=0",
            "--estimated-drain=90s",
        ])
        .unwrap();
        let c = decide_config(&a, 9);
        assert_eq!(c.phase2.weights.priority, 2.5);
        assert_eq!(c.phase2.weights.reclamation, 0.0);
        assert_eq!(
            c.phase2.weights.drain_speed, 0.1,
            "defaults stay the original's"
        );
        assert_eq!(c.phase2.estimated_drain, Duration::from_secs(90));
        assert_eq!((c.shard_id.as_str(), c.epoch), ("shard-3", 9));
        assert!(c.rails.dry_run && !c.rails.actuation_paused);
        assert_eq!(c.rails.reclaim_budget_fraction, 0.1);
        assert_eq!(c.rails.max_actions_per_cycle, 7);
        assert_eq!(c.cycle_interval, Duration::from_millis(250));
        assert_eq!(c.provider_address, "unix:///p.sock");
    }

    #[test]
    fn work_endpoints_are_derived_from_the_listener() {
        assert_eq!(
            derive_work_endpoint("10.1.2.3:7782".parse().unwrap(), true),
            "https://10.1.2.3:7782"
        );
        assert_eq!(
            derive_work_endpoint("[::1]:7782".parse().unwrap(), false),
            "http://[::1]:7782"
        );
        // Every interface: some name others can dial, never 0.0.0.0.
        let ep = derive_work_endpoint("0.0.0.0:7782".parse().unwrap(), false);
        assert!(ep.starts_with("http://") && ep.ends_with(":7782"), "{ep}");
        assert!(!ep.contains("0.0.0.0"), "{ep}");
    }

    #[test]
    fn etcd_flags_map_onto_the_etcd_mode() {
        let dir = tempfile::tempdir().unwrap();
        let data = format!("--data-dir={}", dir.path().display());
        let base = ["d", "--provider-addr=p", data.as_str()];
        let parse = |extra: &[&str]| {
            Args::try_parse_from(base.iter().chain(extra.iter()).copied()).unwrap()
        };
        assert!(etcd_mode(&parse(&[])).unwrap().is_none());

        let m = etcd_mode(&parse(&[
            "--etcd-endpoints=a:2379, b:2379",
            "--etcd-lease-ttl=4s",
            "--etcd-ca=/ca.pem",
            "--work-advertise=https://decide-0.shards:7782",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(m.config.endpoints, ["a:2379", "b:2379"]);
        assert_eq!(m.config.lease_ttl, Duration::from_secs(4));
        assert_eq!(m.config.tls.as_ref().unwrap().ca, PathBuf::from("/ca.pem"));
        assert_eq!(
            m.work_endpoint.as_deref(),
            Some("https://decide-0.shards:7782")
        );
        assert_eq!(m.epoch_floor, 0, "no epoch file");

        // A shard that ran with the epoch file continues above it.
        std::fs::write(dir.path().join(bigfleet_fencing::EPOCH_FILE_NAME), "41\n").unwrap();
        let m = etcd_mode(&parse(&["--etcd-endpoints=a:2379"]))
            .unwrap()
            .unwrap();
        assert_eq!(m.epoch_floor, 41);

        for bad in [
            &["--etcd-endpoints=,"][..],
            &["--etcd-endpoints=a:1", "--etcd-lease-ttl=1s"],
            &[
                "--etcd-endpoints=a:1",
                "--etcd-cert=/c.pem",
                "--etcd-key=/k.pem",
            ],
            &[
                "--etcd-endpoints=a:1",
                "--etcd-ca=/ca.pem",
                "--etcd-cert=/c.pem",
            ],
            // The mesh runs mTLS, etcd would not (ADR-0102).
            &[
                "--etcd-endpoints=a:1",
                "--tls-cert=/t.crt",
                "--tls-key=/t.key",
                "--tls-ca=/t-ca.crt",
            ],
        ] {
            assert!(etcd_mode(&parse(bad)).is_err(), "{bad:?}");
        }
        let explicit = etcd_mode(&parse(&[
            "--etcd-endpoints=a:1",
            "--tls-cert=/t.crt",
            "--tls-key=/t.key",
            "--tls-ca=/t-ca.crt",
            "--insecure-plaintext",
        ]));
        assert!(
            explicit.is_ok(),
            "--insecure-plaintext accepts plaintext etcd"
        );
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen(":7782").unwrap().port(), 7782);
        assert!(parse_listen("127.0.0.1:0").unwrap().ip().is_loopback());
        assert!(parse_listen("nonsense").is_err());
    }
}
