//! Starting and stopping one replica: store, openraft, the two gRPC servers, the ops HTTP
//! endpoints, and the background loops (leader watcher, snapshot timer, periodic export,
//! join reconciler).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::TlsContext;
use bigfleet_mesh::{
    AuthzPolicy, Backoff, BackoffPolicy, ChannelConfig, GrpcMetrics, MeshServer, Role,
    RunningServer, ServerStackConfig, ServingStatus, Target,
};
use bigfleet_proto::service_names::{COORDINATOR, RAFT as RAFT_SERVICE};
use bigfleet_proto::v1alpha1::JoinRaftClusterRequest;
use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_telemetry::{MetricsRegistry, Readiness};
use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::args::{Args, dialable, parse_listen};
use crate::dr::SnapshotArchive;
use crate::metrics::Metrics;
use crate::network::{Network, RaftService};
use crate::raft_types::{CoordNode, NodeId, Raft, node_id_of, ordinal_of};
use crate::replica::{JOIN_API_ADDR_KEY, Replica, membership_settled};
use crate::service::CoordinatorService;
use crate::soft::SoftState;
use crate::store::Store;

/// Leader heartbeat. Elections must not fire on a 2-replica machine whose scheduler stalls a
/// task for tens of milliseconds, so the heartbeat sits well below the election window.
pub const HEARTBEAT_MS: u64 = 100;
/// Election timeout window. openraft makes a follower wait the leader lease (= the window's
/// maximum) plus its own timeout after the last heartbeat, so a dead leader is replaced
/// 0.75–1.0 s after it stopped (one vote round on loopback), leaving room under the 2 s
/// failover target for a split vote (docs/adr/0062).
pub const ELECTION_TIMEOUT_MS: (u64, u64) = (250, 500);
/// Snapshot at least this often when anything was applied (the original's 30 s).
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(30);
/// ... or after this many entries (the original's threshold).
pub const SNAPSHOT_THRESHOLD: u64 = 1024;
/// Chunk size of snapshot installs between replicas.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;
const JOIN_BACKOFF_MIN: Duration = Duration::from_secs(1);
const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(15);

/// Errors starting a replica.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("binding {what} {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("raft: {0}")]
    Raft(String),
    #[error(transparent)]
    Server(#[from] bigfleet_mesh::ServerError),
    #[error(transparent)]
    Telemetry(#[from] bigfleet_telemetry::TelemetryError),
}

/// A running replica.
pub struct Running {
    /// Coordinator gRPC address (bound).
    pub api_addr: SocketAddr,
    /// Raft gRPC address (bound).
    pub raft_addr: SocketAddr,
    pub node_id: NodeId,
    replica: Arc<Replica>,
    api: RunningServer,
    raft_server: RunningServer,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// The openraft handle (metrics, leadership) for tests and tools.
    pub fn raft(&self) -> &Raft {
        &self.replica.raft
    }

    /// Whether this replica currently leads.
    pub fn is_leader(&self) -> bool {
        self.replica.leader_term().is_ok()
    }

    /// Stops the loops, drains the Coordinator server, stops Raft and its server.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.stop.cancel();
        for t in self.tasks {
            t.abort();
        }
        let api = self.api.shutdown().await;
        if let Err(e) = self.replica.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        let raft = self.raft_server.shutdown().await;
        api?;
        raft?;
        Ok(())
    }
}

fn raft_config() -> Result<openraft::Config, StartError> {
    openraft::Config {
        cluster_name: "bigfleet-coordinator".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_TIMEOUT_MS.0,
        election_timeout_max: ELECTION_TIMEOUT_MS.1,
        install_snapshot_timeout: 5_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_THRESHOLD),
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        max_in_snapshot_log_to_keep: 1_000,
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Config(e.to_string()))
}

/// Whether this replica may form a new cluster: asked to, nothing on disk, and — when it
/// is one of a StatefulSet that joins through --join-addr — ordinal 0 (a name without an
/// ordinal is a hand-run single replica and may).
pub fn effective_bootstrap(args: &Args, has_state: bool) -> bool {
    if !args.bootstrap || has_state {
        return false;
    }
    if args.join_addrs().is_empty() {
        return true;
    }
    ordinal_of(&args.id).is_none_or(|o| o == 0)
}

fn bind(what: &'static str, s: &str) -> Result<TcpListener, StartError> {
    let addr = parse_listen(s).map_err(StartError::Config)?;
    bigfleet_mesh::bind_tcp(addr).map_err(|source| StartError::Bind { what, addr, source })
}

/// `/readyz`'s reason while this replica sees no Raft leader.
pub const NO_LEADER: &str = "no raft leader observed";

/// Starts a replica and returns once it serves (it may not have a leader yet), with metrics
/// in a registry of its own and a readiness nobody serves: for tests and tools.
pub async fn start(args: Args) -> Result<Running, StartError> {
    start_with(
        args,
        MetricsRegistry::new(),
        Readiness::not_ready(NO_LEADER),
    )
    .await
}

/// As [`start`], registering metrics in `registry` and keeping `readiness` ready while the
/// replica sees a leader: the binary's ops endpoint (`--metrics-addr`) serves both.
pub async fn start_with(
    args: Args,
    registry: MetricsRegistry,
    readiness: Readiness,
) -> Result<Running, StartError> {
    let tls = args.service.tls_context()?;
    let store = Store::open(&args.data_dir)?;
    let has_state = store.has_state()?;

    let raft_listener = bind("raft", &args.raft_bind)?;
    let api_listener = bind("coordinator", &args.listen)?;
    let raft_addr = raft_listener
        .local_addr()
        .map_err(|e| StartError::Config(e.to_string()))?;
    let api_addr = api_listener
        .local_addr()
        .map_err(|e| StartError::Config(e.to_string()))?;
    let raft_advertise = args
        .raft_advertise
        .clone()
        .unwrap_or_else(|| dialable(raft_addr));
    let advertise_host = raft_advertise
        .rsplit_once(':')
        .map_or(raft_advertise.as_str(), |(h, _)| h)
        .to_owned();
    let me = CoordNode {
        name: args.id.clone(),
        raft_addr: raft_advertise.clone(),
        api_addr: format!("{advertise_host}:{}", api_addr.port()),
    };
    let id = node_id_of(&args.id);

    let metrics = Metrics::register(&registry)?;
    let grpc_metrics = GrpcMetrics::server(&registry)?;
    let raft = Raft::new(
        id,
        Arc::new(raft_config()?),
        Network::new(id, tls.as_ref().map(TlsContext::client_config).transpose()?),
        store.log_store(),
        store.state_machine(),
    )
    .await
    .map_err(|e| StartError::Raft(e.to_string()))?;

    let replica = Arc::new(Replica {
        raft: raft.clone(),
        id,
        me: me.clone(),
        shared: store.shared(),
        store,
        metrics: metrics.clone(),
        soft: parking_lot::Mutex::new(SoftState::default()),
        api_port: api_addr.port(),
        membership_changes: tokio::sync::Mutex::new(()),
    });

    // The Raft port: the process's mTLS config, and only coordinator replicas may call it
    // (the handler then binds the sender's node id to the certificate, ADR-0100).
    let raft_server = MeshServer::new(
        "coordinator-raft",
        ServerStackConfig {
            metrics: Some(grpc_metrics.clone()),
            authz: Arc::new(
                AuthzPolicy::deny_by_default().allow_service(RAFT_SERVICE, &[Role::Coordinator]),
            ),
            ..ServerStackConfig::default()
        },
    )
    .tcp_listener(raft_listener)
    .tls(tls.as_ref().map(TlsContext::server_config).transpose()?)
    .insecure_plaintext(args.service.tls.insecure_plaintext)
    .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
    .drain_deadline(Duration::from_secs(2))
    .add_service(RaftService::new(raft.clone()).into_server())
    .start()
    .await?;

    if effective_bootstrap(&args, has_state) {
        tracing::info!(node = %args.id, "bootstrapping a single-voter cluster");
        raft.initialize(BTreeMap::from([(id, me.clone())]))
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
    } else if args.bootstrap && !has_state {
        tracing::info!(node = %args.id, "not ordinal 0: joining instead of bootstrapping");
    }

    let api = MeshServer::new(
        "coordinator",
        ServerStackConfig {
            metrics: Some(grpc_metrics),
            mtls: tls.is_some(),
            // Roles are checked in the handlers, after the leader check (the original's
            // order); the layer still refuses certificates without a valid identity.
            authz: Arc::new(AuthzPolicy::allow_any_identity()),
            ..ServerStackConfig::default()
        },
    )
    .tcp_listener(api_listener)
    .tls(tls.as_ref().map(TlsContext::server_config).transpose()?)
    .insecure_plaintext(args.service.tls.insecure_plaintext)
    .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
    .drain_deadline(args.service.drain_timeout)
    .add_service_with_status(
        CoordinatorService::new(Arc::clone(&replica)).into_server(),
        ServingStatus::NotServing,
    )
    .add_service(crate::info::CoordinatorInfoService::new(Arc::clone(&replica)).into_server())
    .start()
    .await?;

    let stop = CancellationToken::new();

    let mut tasks = vec![
        tokio::spawn(watch_leader(
            Arc::clone(&replica),
            api.health().clone(),
            readiness,
            stop.clone(),
        )),
        tokio::spawn(snapshot_timer(Arc::clone(&replica), stop.clone())),
        tokio::spawn(join_loop(
            Arc::clone(&replica),
            args.join_addrs(),
            tls.as_ref().map(TlsContext::client_config).transpose()?,
            stop.clone(),
        )),
    ];
    tasks.push(tokio::spawn(crate::rebalancer::run(
        Arc::clone(&replica),
        crate::rebalancer::Config {
            policy: args.rebalance_policy(),
            interval: args.rebalance_interval,
            report_max_age: args.rebalance_report_max_age,
        },
        stop.clone(),
    )));
    if let Some(dir) = args.snapshot_export_dir.clone() {
        tasks.push(tokio::spawn(export_loop(
            Arc::clone(&replica),
            dir,
            args.export_interval(),
            stop.clone(),
        )));
    }
    tracing::info!(
        node = %args.id,
        raft_id = id,
        api = %api_addr,
        raft = %raft_addr,
        advertise = %raft_advertise,
        "coordinator replica started"
    );
    Ok(Running {
        api_addr,
        raft_addr,
        node_id: id,
        replica,
        api,
        raft_server,
        stop,
        tasks,
    })
}

/// Mirrors Raft metrics into gauges, health and readiness; counts leader changes.
async fn watch_leader(
    replica: Arc<Replica>,
    health: bigfleet_mesh::HealthReporter,
    readiness: Readiness,
    stop: CancellationToken,
) {
    let mut rx = replica.raft.metrics();
    let mut last_leader: Option<Option<NodeId>> = None;
    loop {
        let m = rx.borrow_and_update().clone();
        let mx = &replica.metrics;
        mx.raft_term
            .set(i64::try_from(m.current_term).unwrap_or(i64::MAX));
        mx.is_leader
            .set(i64::from(m.current_leader == Some(replica.id)));
        mx.last_applied_index.set(
            m.last_applied
                .map_or(0, |l| i64::try_from(l.index).unwrap_or(i64::MAX)),
        );
        mx.voters.set(
            i64::try_from(m.membership_config.membership().voter_ids().count()).unwrap_or(i64::MAX),
        );
        mx.membership_settled.set(i64::from(membership_settled(
            &m.membership_config,
            m.last_applied,
        )));
        let (shards, clusters, domains) = replica.shared.read().state.sizes();
        for (table, n) in [
            ("shards", shards),
            ("clusters", clusters),
            ("domains", domains),
        ] {
            mx.state_entries
                .with_label_values(&[table])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if last_leader != Some(m.current_leader) {
            if last_leader.is_some() {
                mx.leader_changes.inc();
            }
            last_leader = Some(m.current_leader);
            tracing::info!(leader = ?m.current_leader, term = m.current_term, "raft leader changed");
            match m.current_leader {
                Some(_) => {
                    health
                        .set_service_status(COORDINATOR, ServingStatus::Serving)
                        .await;
                    readiness.set_ready();
                }
                None => {
                    health
                        .set_service_status(COORDINATOR, ServingStatus::NotServing)
                        .await;
                    readiness.set_not_ready(NO_LEADER);
                }
            }
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Time-based snapshots (openraft's policy covers the entry-count threshold).
async fn snapshot_timer(replica: Arc<Replica>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(SNAPSHOT_INTERVAL) => {}
            () = stop.cancelled() => return,
        }
        let m = replica.raft.metrics().borrow().clone();
        if m.last_applied > m.snapshot
            && let Err(e) = replica.raft.trigger().snapshot().await
        {
            tracing::warn!(error = %e, "periodic snapshot");
        }
    }
}

/// Leader-only periodic export to `dir`.
async fn export_loop(
    replica: Arc<Replica>,
    dir: std::path::PathBuf,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stop.cancelled() => return,
        }
        if replica.leader_term().is_err() {
            continue;
        }
        let outcome = match replica.fresh_snapshot().await {
            Err(e) => Err(e.to_string()),
            Ok((meta, state)) => {
                let dir = dir.clone();
                let name = replica.me.name.clone();
                tokio::task::spawn_blocking(move || {
                    SnapshotArchive { meta, state }.export_to(&dir, &name)
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            }
        };
        match outcome {
            Ok(path) => {
                replica
                    .metrics
                    .snapshot_exports
                    .with_label_values(&["success"])
                    .inc();
                tracing::info!(path = %path.display(), "snapshot exported");
            }
            Err(e) => {
                replica
                    .metrics
                    .snapshot_exports
                    .with_label_values(&["error"])
                    .inc();
                tracing::warn!(error = %e, "snapshot export failed");
            }
        }
    }
}

/// Runs until this replica is a voter at its current address under a live leader: joins
/// through --join-addr (following leader hints), or — as the leader — rewrites its own
/// entry after a restart at a new address.
async fn join_loop(
    replica: Arc<Replica>,
    join_addrs: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(BackoffPolicy::new(JOIN_BACKOFF_MIN, JOIN_BACKOFF_MAX));
    loop {
        if stop.is_cancelled() {
            return;
        }
        if replica.membership_current() {
            tracing::info!("membership current: voter at the advertised address");
            return;
        }
        let attempt = if replica.leader_term().is_ok() {
            let me = &replica.me;
            replica
                .add_voter(&me.name, &me.raft_addr, &me.api_addr)
                .await
                .map_err(|e| e.to_string())
        } else if !join_addrs.is_empty() {
            // Attempted whether or not a leader is visible: a fresh replica sees none until
            // it has been added.
            join_via(&replica, &join_addrs, tls.clone()).await
        } else {
            Err("no leader yet".into())
        };
        match attempt {
            Ok(()) => {
                // The membership change reaches this replica through replication.
                let _ = replica
                    .raft
                    .wait(Some(Duration::from_secs(3)))
                    .metrics(|_| replica.membership_current(), "membership current")
                    .await;
                backoff.reset();
                continue;
            }
            Err(e) => {
                let retry_in = backoff.next_delay();
                tracing::info!(error = %e, ?retry_in, "join attempt failed");
                tokio::select! {
                    () = tokio::time::sleep(retry_in) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

fn target(addr: &str, tls: bool) -> Result<Target, String> {
    let with_scheme = if addr.contains("://") {
        addr.to_owned()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    with_scheme.parse::<Target>().map_err(|e| e.to_string())
}

/// Calls JoinRaftCluster on each address in turn, following one leader hint per address.
async fn join_via(
    replica: &Replica,
    addrs: &[String],
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(), String> {
    let mut last = String::from("no join address answered");
    for addr in addrs {
        let mut next = Some(addr.clone());
        let mut hops = 0;
        while let Some(a) = next.take() {
            hops += 1;
            match join_once(replica, &a, tls.clone()).await {
                Ok(()) => {
                    tracing::info!(via = %a, "joined the raft cluster");
                    return Ok(());
                }
                Err(JoinFailure::NotLeader(Some(hint))) if hops < 3 && hint != a => {
                    next = Some(hint);
                }
                Err(e) => last = format!("{a}: {e}"),
            }
        }
    }
    Err(last)
}

#[derive(Debug, thiserror::Error)]
enum JoinFailure {
    #[error("not leader (hint {0:?})")]
    NotLeader(Option<String>),
    #[error("{0}")]
    Other(String),
}

async fn join_once(
    replica: &Replica,
    addr: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(), JoinFailure> {
    let t = target(addr, tls.is_some()).map_err(JoinFailure::Other)?;
    let cfg = ChannelConfig {
        connect_timeout: Duration::from_secs(2),
        ..ChannelConfig::default()
    }
    .with_tls(tls);
    let channel = bigfleet_mesh::connect(&t, &cfg)
        .await
        .map_err(|e| JoinFailure::Other(e.to_string()))?;
    let mut client = bigfleet_mesh::with_message_limits!(CoordinatorClient::new(channel));
    let mut req = tonic::Request::new(JoinRaftClusterRequest {
        node_id: replica.me.name.clone(),
        raft_address: replica.me.raft_addr.clone(),
    });
    req.set_timeout(Duration::from_secs(40));
    if let Ok(v) = MetadataValue::try_from(replica.me.api_addr.as_str()) {
        req.metadata_mut().insert(JOIN_API_ADDR_KEY, v);
    }
    match client.join_raft_cluster(req).await {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::FailedPrecondition => {
            Err(JoinFailure::NotLeader(bigfleet_mesh::leader_hint(&s)))
        }
        Err(s) => Err(JoinFailure::Other(format!("{}: {}", s.code(), s.message()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::CoordError;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["x"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap()
    }

    #[test]
    fn only_ordinal_zero_bootstraps_when_joining() {
        let join = ["--bootstrap", "--join-addr", "c:7790"];
        let with = |id: &str| {
            let mut e = vec!["--id", id];
            e.extend_from_slice(&join);
            args(&e)
        };
        assert!(effective_bootstrap(&with("coord-0"), false));
        assert!(!effective_bootstrap(&with("coord-1"), false));
        assert!(
            !effective_bootstrap(&with("coord-0"), true),
            "never over existing state"
        );
        assert!(effective_bootstrap(&with("solo"), false));
        // Without --join-addr a plain --bootstrap works whatever the name (dev runs).
        assert!(effective_bootstrap(
            &args(&["--id", "node-1", "--bootstrap"]),
            false
        ));
        assert!(!effective_bootstrap(&args(&["--id", "coord-0"]), false));
    }

    /// coord-0 bootstrapped alone and leading, and a port nobody listens on any more.
    async fn alone_with_a_dead_port(dir: &std::path::Path) -> (Running, String) {
        let data = dir.join("data");
        let running = start(args(&[
            "--id",
            "coord-0",
            "--listen",
            "127.0.0.1:0",
            "--raft-bind",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--bootstrap",
        ]))
        .await
        .unwrap();
        let me = running.node_id;
        running
            .raft()
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.current_leader == Some(me), "a leader")
            .await
            .unwrap();
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        (running, dead)
    }

    /// A leader deposed while it waits for a joiner to catch up answers the join at once
    /// (NotLeader, which the joiner follows), not after the 25 s catch-up timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deposed_leader_answers_a_waiting_join_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (running, dead) = alone_with_a_dead_port(dir.path()).await;
        let replica = running.replica.clone();
        let join = tokio::spawn({
            let replica = replica.clone();
            async move { replica.add_voter("coord-9", &dead, "127.0.0.1:9").await }
        });
        let joiner = node_id_of("coord-9");
        let m = replica
            .raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(
                |m| {
                    m.membership_config.membership().get_node(&joiner).is_some()
                        && m.last_applied.map(|l| l.index) == m.last_log_index
                },
                "the learner added and applied",
            )
            .await
            .unwrap();
        // Another candidate with a newer term and the whole log: granted once coord-0's
        // leader lease (one maximum election timeout) has run out, which deposes it.
        let vote = openraft::raft::VoteRequest::new(
            openraft::Vote::new(m.current_term + 1, joiner),
            m.last_applied,
        );
        let deposed = tokio::time::timeout(Duration::from_secs(10), async {
            while !replica.raft.vote(vote.clone()).await.unwrap().vote_granted {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(deposed.is_ok(), "coord-0 never granted the vote");
        let answer = tokio::time::timeout(Duration::from_secs(5), join)
            .await
            .expect("the join answered within 5 s of the leader being deposed")
            .unwrap();
        // NotLeader, or UNAVAILABLE when coord-0 (the only voter) was elected again before
        // the waiting join saw it deposed.
        assert!(
            matches!(
                answer,
                Err(CoordError::NotLeader { .. } | CoordError::Unavailable(_))
            ),
            "{answer:?}"
        );
        running.shutdown().await.unwrap();
    }

    /// A joiner nobody can reach stays a learner however often it retries: promoting it
    /// would make every commit of a one-voter group wait for it (the joint configuration's
    /// quorum needs both).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_joiner_is_never_promoted() {
        let dir = tempfile::tempdir().unwrap();
        let (running, dead) = alone_with_a_dead_port(dir.path()).await;
        let me = running.node_id;
        let replica = running.replica.clone();
        for attempt in 0..2 {
            let join = tokio::time::timeout(
                Duration::from_secs(1),
                replica.add_voter("coord-9", &dead, "127.0.0.1:9"),
            )
            .await;
            assert!(join.is_err(), "attempt {attempt} finished: {join:?}");
        }
        // The learner's entry may still be on its way into the metrics on a loaded machine.
        let joiner = node_id_of("coord-9");
        let m = replica
            .raft
            .wait(Some(Duration::from_secs(5)))
            .metrics(
                |m| m.membership_config.membership().get_node(&joiner).is_some(),
                "the joiner kept as a learner",
            )
            .await
            .unwrap();
        let voters: Vec<_> = m.membership_config.membership().voter_ids().collect();
        assert_eq!(voters, vec![me], "the joiner must not be promoted");
        // The group still commits on its own.
        tokio::time::timeout(
            Duration::from_secs(3),
            replica.apply(crate::fsm::Command::AddShard {
                shard_id: "s1".into(),
                address: "s1.shards:7780".into(),
                registered_at_unix_ns: 1,
            }),
        )
        .await
        .expect("a commit within 3 s")
        .expect("applied");
        running.shutdown().await.unwrap();
    }

    #[test]
    fn join_targets_get_a_scheme() {
        assert_eq!(target("a:1", false).unwrap().to_string(), "http://a:1");
        assert_eq!(target("a:1", true).unwrap().to_string(), "https://a:1");
        assert_eq!(
            target("http://a:1", false).unwrap().to_string(),
            "http://a:1"
        );
        assert!(target("nope", false).is_err());
    }
}
