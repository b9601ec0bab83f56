//! A simulated cluster operator: the client side of `Shard/Session`.
//!
//! It behaves like the real operator on the wire: dials out (TCP, plaintext or mTLS with a
//! cluster certificate), sends Hello, sends a full-replacement roll-up immediately and then
//! every `rollup_interval` (single pending slot, latest wins), answers BootstrapRequests,
//! acknowledges ReclaimInstructions after "cordoning", applies NodeStateUpdates and
//! AvailableCapacityUpdates in arrival order, and reconnects with exponential backoff
//! (500 ms doubling to 30 s) and a fresh Hello after any failure.
//!
//! ```ignore
//! let op = Operator::spawn(OperatorConfig::new("cluster-a", "http://127.0.0.1:7780"));
//! op.wait_connected(Duration::from_secs(5)).await;
//! op.set_demand(Demand::typical());
//! let seen = op.nodes();          // machine id → last state the shard reported
//! op.shutdown().await;
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bigfleet_mesh::backoff::{self as mesh_backoff, BackoffPolicy};
use bigfleet_mesh::{ChannelConfig, Target};
use bigfleet_model::MachineState;
use bigfleet_proto::v1alpha1::shard_client::ShardClient;
use bigfleet_proto::v1alpha1::{
    BootstrapBlobResponse, BootstrapRequest, Hello, OperatorMessage, ReclaimAck,
    ReclaimInstruction, ShardMessage, operator_message, shard_message,
};
use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::demand::{Churn, Demand};
use crate::latency::LatencyRecorder;

/// Operator-side outbox of one-shot responses (bootstrap blobs, reclaim acks). When full,
/// new responses are dropped: the shard has timed out by then and will ask again.
pub const RESPONSE_OUTBOX: usize = 256;

/// How the operator answers BootstrapRequests.
#[derive(Debug, Clone, PartialEq)]
pub enum BootstrapBehavior {
    /// A stub `#cloud-config` blob naming the cluster and requirements, with this TTL.
    Blob { ttl_seconds: i64 },
    /// An error answer (e.g. the kubelet version is outside the skew window).
    Error(String),
    /// Answer after a delay (to exercise the shard's timeout and late-response handling).
    Delayed { delay: Duration, ttl_seconds: i64 },
    /// Never answer.
    Ignore,
}

/// Reconnect backoff: a window starting at `initial` that doubles after each failure up to
/// `max`, resets once a session is established; each wait is drawn from the upper half of
/// the window (equal jitter, seeded by the cluster id so a run is reproducible), so
/// thousands of emulated operators do not reconnect in lock-step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// As the workspace's backoff policy.
    pub fn policy(&self) -> BackoffPolicy {
        BackoffPolicy::new(self.initial, self.max)
    }
}

/// Everything an operator is configured with.
#[derive(Clone)]
pub struct OperatorConfig {
    pub cluster_id: String,
    /// `http://host:port`, `https://host:port` or `host:port`.
    pub target: String,
    /// Client TLS (a config presenting this cluster's certificate); `None`: plaintext.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Name to verify the shard's certificate against (default: the target host).
    pub server_name: Option<String>,
    /// Period of roll-ups after the immediate one on connect.
    pub rollup_interval: Duration,
    pub demand: Demand,
    pub churn: Option<Churn>,
    pub bootstrap: BootstrapBehavior,
    pub backoff: Backoff,
    pub protocol_version: String,
    /// Where roll-up acknowledgement latencies go (shared by many operators in a load test).
    pub latency: Option<LatencyRecorder>,
    /// Held from dialling until the hello is acknowledged, to bound concurrent connection
    /// set-ups in a load test.
    pub connect_gate: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for OperatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorConfig")
            .field("cluster_id", &self.cluster_id)
            .field("target", &self.target)
            .field("tls", &self.tls.is_some())
            .field("rollup_interval", &self.rollup_interval)
            .field("demand", &self.demand)
            .field("bootstrap", &self.bootstrap)
            .finish_non_exhaustive()
    }
}

impl OperatorConfig {
    /// Plaintext, typical demand, roll-ups every 10 s, blobs with a 600 s TTL.
    pub fn new(cluster_id: &str, target: &str) -> Self {
        Self {
            cluster_id: cluster_id.to_owned(),
            target: target.to_owned(),
            tls: None,
            server_name: None,
            rollup_interval: Duration::from_secs(10),
            demand: Demand::typical(),
            churn: None,
            bootstrap: BootstrapBehavior::Blob { ttl_seconds: 600 },
            backoff: Backoff::default(),
            protocol_version: "v1alpha1".to_owned(),
            latency: None,
            connect_gate: None,
        }
    }
}

/// What the shard last said about one machine bound to this cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// `None` when the frame carried a state this client does not know.
    pub state: Option<MachineState>,
    pub node_name: String,
    pub provider_id: String,
    pub last_error: String,
    pub labels: BTreeMap<String, String>,
    /// Arrival order of the frame that set this view (1-based, per operator).
    pub seq: u64,
}

/// The latest AvailableCapacityUpdate per key.
#[derive(Debug, Clone, PartialEq)]
pub struct AvailableView {
    pub available_count: i32,
    pub confidence: i32,
    pub cost_per_hour: f64,
}

/// Counters of one operator (a snapshot).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct OperatorStats {
    pub connected: bool,
    /// Sessions established (hello acknowledged).
    pub sessions: u64,
    /// Dial or stream-open attempts that failed before a hello acknowledgement.
    pub connect_failures: u64,
    /// Established sessions that ended without a shutdown request.
    pub disconnects: u64,
    pub rollups_sent: u64,
    /// Roll-ups replaced in the operator's own pending slot before they were sent.
    pub rollups_coalesced: u64,
    pub hello_acks: u64,
    pub rollup_acks: u64,
    /// Acks saying a roll-up was rejected at the shard's trust boundary.
    pub rollups_rejected: u64,
    /// Acks saying a valid roll-up could not be applied.
    pub rollups_not_applied: u64,
    pub bootstrap_requests: u64,
    pub bootstrap_answers: u64,
    pub reclaim_instructions: u64,
    pub reclaimed_nodes: u64,
    pub node_updates: u64,
    pub available_updates: u64,
    pub responses_dropped: u64,
    pub last_coordinator_term: i64,
    pub last_shard_epoch: i64,
    /// The last stream error or rejection echo, for diagnostics.
    pub last_error: String,
}

impl OperatorStats {
    /// Everything that went wrong: failed connects, lost sessions, rejected or unapplied
    /// roll-ups, dropped responses.
    pub fn errors(&self) -> u64 {
        self.connect_failures
            + self.disconnects
            + self.rollups_rejected
            + self.rollups_not_applied
            + self.responses_dropped
    }
}

/// What went wrong in a fleet of operators' sessions, as every load report shows it
/// (flattened into the report: the JSON keys are the field names, `errors` the sum).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SessionErrors {
    /// Everything below, summed ([`OperatorStats::errors`] over the fleet).
    #[serde(rename = "errors")]
    pub total: u64,
    pub connect_failures: u64,
    pub disconnects: u64,
    pub rollups_rejected: u64,
    pub rollups_not_applied: u64,
    pub responses_dropped: u64,
}

impl SessionErrors {
    fn add(&mut self, s: &OperatorStats) {
        self.total += s.errors();
        self.connect_failures += s.connect_failures;
        self.disconnects += s.disconnects;
        self.rollups_rejected += s.rollups_rejected;
        self.rollups_not_applied += s.rollups_not_applied;
        self.responses_dropped += s.responses_dropped;
    }
}

/// Counters summed over a fleet of operators (a snapshot), as the load tests
/// read them once a second and at both ends of their measurement windows.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    pub(crate) connected: usize,
    /// Operators connected whose current session has had a roll-up acknowledged.
    pub(crate) connected_and_acked: usize,
    pub(crate) rollups_sent: u64,
    pub(crate) acks: u64,
    pub(crate) errors: SessionErrors,
    pub(crate) coalesced: u64,
    pub(crate) node_updates: u64,
    pub(crate) available_updates: u64,
    pub(crate) bootstrap_requests: u64,
    pub(crate) reclaim_instructions: u64,
}

impl Totals {
    pub(crate) fn of(ops: &[OperatorHandle]) -> Self {
        let mut t = Totals::default();
        for s in ops.iter().map(OperatorHandle::stats) {
            t.connected += usize::from(s.connected);
            t.connected_and_acked += usize::from(s.connected && s.rollup_acks > 0);
            t.rollups_sent += s.rollups_sent;
            t.acks += s.rollup_acks;
            t.errors.add(&s);
            t.coalesced += s.rollups_coalesced;
            t.node_updates += s.node_updates;
            t.available_updates += s.available_updates;
            t.bootstrap_requests += s.bootstrap_requests;
            t.reclaim_instructions += s.reclaim_instructions;
        }
        t
    }

    /// Frames the shard pushed to operators besides acks (node states, capacity hints,
    /// bootstrap requests, reclaim instructions).
    pub(crate) fn pushes(&self) -> u64 {
        self.node_updates
            + self.available_updates
            + self.bootstrap_requests
            + self.reclaim_instructions
    }

    /// [`OperatorStats::errors`] over the fleet.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.total
    }
}

struct Shared {
    cfg: OperatorConfig,
    stats: Mutex<OperatorStats>,
    nodes: Mutex<BTreeMap<String, NodeView>>,
    available: Mutex<BTreeMap<String, AvailableView>>,
    demand: Mutex<Demand>,
    demand_changed: Notify,
    connected: watch::Sender<bool>,
    stop: CancellationToken,
}

/// A running simulated operator.
pub struct OperatorHandle {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for OperatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorHandle")
            .field("cluster", &self.shared.cfg.cluster_id)
            .finish_non_exhaustive()
    }
}

/// Entry point of the simulated operator.
#[derive(Debug)]
pub struct Operator;

impl Operator {
    /// Starts the operator's connection loop on the current tokio runtime.
    pub fn spawn(config: OperatorConfig) -> OperatorHandle {
        let (connected, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            demand: Mutex::new(config.demand.clone()),
            cfg: config,
            stats: Mutex::new(OperatorStats::default()),
            nodes: Mutex::new(BTreeMap::new()),
            available: Mutex::new(BTreeMap::new()),
            demand_changed: Notify::new(),
            connected,
            stop: CancellationToken::new(),
        });
        let task = tokio::spawn(run(Arc::clone(&shared)));
        OperatorHandle { shared, task }
    }
}

impl OperatorHandle {
    pub fn cluster_id(&self) -> &str {
        &self.shared.cfg.cluster_id
    }

    /// Replaces the cluster's demand; a roll-up goes out right away when connected.
    pub fn set_demand(&self, demand: Demand) {
        *self.shared.demand.lock() = demand;
        self.shared.demand_changed.notify_one();
    }

    pub fn demand(&self) -> Demand {
        self.shared.demand.lock().clone()
    }

    pub fn stats(&self) -> OperatorStats {
        self.shared.stats.lock().clone()
    }

    /// Machine id → what the shard last reported about it.
    pub fn nodes(&self) -> BTreeMap<String, NodeView> {
        self.shared.nodes.lock().clone()
    }

    /// Supersedes key → latest capacity hint.
    pub fn available(&self) -> BTreeMap<String, AvailableView> {
        self.shared.available.lock().clone()
    }

    pub fn is_connected(&self) -> bool {
        *self.shared.connected.borrow()
    }

    /// Waits until a session is established (hello acknowledged); `false` on timeout.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.shared.connected.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Polls `check` against the stats until it holds; `false` on timeout.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&OperatorStats) -> bool,
    ) -> bool {
        let every = Duration::from_millis(10);
        let Ok(held) = mesh_backoff::poll_until(timeout, every, async || {
            Ok::<_, Infallible>(check(&self.stats()).then_some(()))
        })
        .await;
        held.is_some()
    }

    /// Closes the session and stops reconnecting.
    pub async fn shutdown(self) {
        self.shared.stop.cancel();
        let _ = self.task.await;
    }

    /// Signals shutdown without waiting (for stopping thousands at once).
    pub fn stop(&self) {
        self.shared.stop.cancel();
    }

    /// Waits for the operator's task after [`OperatorHandle::stop`].
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

/// How one connection attempt ended.
enum SessionEnd {
    /// Stop requested.
    Stopped,
    /// Failed before the hello was acknowledged.
    ConnectFailed(String),
    /// An established session ended.
    Lost(String),
}

async fn run(shared: Arc<Shared>) {
    let mut backoff = mesh_backoff::Backoff::seeded(
        shared.cfg.backoff.policy(),
        seed_of(&shared.cfg.cluster_id) ^ BACKOFF_SEED,
    );
    let mut source = RollupSource::new(&shared.cfg.cluster_id);
    loop {
        if shared.stop.is_cancelled() {
            break;
        }
        let end = session(&shared, &mut source).await;
        shared.connected.send_replace(false);
        {
            let mut st = shared.stats.lock();
            st.connected = false;
            match &end {
                SessionEnd::Stopped => {}
                SessionEnd::ConnectFailed(e) => {
                    st.connect_failures += 1;
                    st.last_error.clone_from(e);
                }
                SessionEnd::Lost(e) => {
                    st.disconnects += 1;
                    st.last_error.clone_from(e);
                }
            }
        }
        match end {
            SessionEnd::Stopped => break,
            SessionEnd::Lost(e) => {
                tracing::debug!(cluster = %shared.cfg.cluster_id, error = %e, "session lost; reconnecting");
                backoff.reset();
            }
            SessionEnd::ConnectFailed(e) => {
                tracing::debug!(cluster = %shared.cfg.cluster_id, error = %e, "connect failed");
            }
        }
        let wait = backoff.next_delay();
        tokio::select! {
            () = shared.stop.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Keeps the backoff's draws apart from the roll-up source's, which use the same cluster seed.
const BACKOFF_SEED: u64 = 0x6261_636b_6f66_6621;

fn seed_of(cluster: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    cluster.hash(&mut h);
    h.finish()
}

async fn session(shared: &Arc<Shared>, source: &mut RollupSource) -> SessionEnd {
    let cfg = &shared.cfg;
    // Released once the hello is acknowledged (or when this attempt ends).
    let mut permit = match &cfg.connect_gate {
        None => None,
        Some(gate) => tokio::select! {
            () = shared.stop.cancelled() => return SessionEnd::Stopped,
            p = Arc::clone(gate).acquire_owned() => p.ok(),
        },
    };
    let target: Target = match cfg.target.parse() {
        Ok(t) => t,
        Err(e) => return SessionEnd::ConnectFailed(e.to_string()),
    };
    let channel_cfg = ChannelConfig {
        tls: cfg.tls.clone(),
        server_name: cfg.server_name.clone(),
        ..ChannelConfig::default()
    };
    let channel = tokio::select! {
        () = shared.stop.cancelled() => return SessionEnd::Stopped,
        c = bigfleet_mesh::connect(&target, &channel_cfg) => match c {
            Ok(c) => c,
            Err(e) => return SessionEnd::ConnectFailed(e.to_string()),
        },
    };
    let mut client = bigfleet_mesh::with_message_limits!(ShardClient::new(channel));

    let out = Arc::new(OutQueue::default());
    out.push_response(OperatorMessage {
        payload: Some(operator_message::Payload::Hello(Hello {
            cluster_id: cfg.cluster_id.clone(),
            protocol_version: cfg.protocol_version.clone(),
        })),
    });
    let opened = tokio::select! {
        () = shared.stop.cancelled() => return SessionEnd::Stopped,
        r = client.session(OutStream { queue: Arc::clone(&out) }) => r,
    };
    let mut inbound = match opened {
        Ok(resp) => resp.into_inner(),
        Err(status) => {
            return SessionEnd::ConnectFailed(format!("{:?}: {}", status.code(), status.message()));
        }
    };

    let mut established = false;
    // Once immediately on connect, then periodically.
    let mut tick = tokio::time::interval(cfg.rollup_interval.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.stop.cancelled() => {
                out.close();
                return SessionEnd::Stopped;
            }
            _ = tick.tick(), if established => send_rollup(shared, &out, source),
            () = shared.demand_changed.notified(), if established => send_rollup(shared, &out, source),
            msg = inbound.message() => match msg {
                Ok(Some(msg)) => {
                    if handle(shared, &out, msg) && !established {
                        established = true;
                        drop(permit.take());
                        {
                            let mut st = shared.stats.lock();
                            st.sessions += 1;
                            st.connected = true;
                        }
                        shared.connected.send_replace(true);
                        tick.reset_immediately();
                    }
                }
                Ok(None) => {
                    let e = "stream closed by the shard".to_owned();
                    return if established { SessionEnd::Lost(e) } else { SessionEnd::ConnectFailed(e) };
                }
                Err(status) => {
                    let e = format!("{:?}: {}", status.code(), status.message());
                    return if established { SessionEnd::Lost(e) } else { SessionEnd::ConnectFailed(e) };
                }
            },
        }
    }
}

/// Builds roll-ups, reusing the last one when the demand did not change (building runs
/// the domain conversion, which thousands of simulated operators should not repeat).
struct RollupSource {
    rng: StdRng,
    last: Option<(Demand, bigfleet_proto::v1alpha1::ClusterCapacityNeeds)>,
}

impl RollupSource {
    fn new(cluster: &str) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed_of(cluster)),
            last: None,
        }
    }

    fn next(&mut self, shared: &Shared) -> bigfleet_proto::v1alpha1::ClusterCapacityNeeds {
        let base = shared.demand.lock().clone();
        let demand = match shared.cfg.churn {
            Some(churn) => churn.apply(&base, &mut self.rng),
            None => base,
        };
        let now = now_unix_nanos();
        match &mut self.last {
            Some((d, r)) if *d == demand => {
                r.timestamp_unix_nanos = now;
                r.clone()
            }
            _ => {
                let r = demand.rollup(&shared.cfg.cluster_id, now);
                self.last = Some((demand, r.clone()));
                r
            }
        }
    }
}

fn send_rollup(shared: &Shared, out: &OutQueue, source: &mut RollupSource) {
    let rollup = source.next(shared);
    let replaced = out.push_rollup(OperatorMessage {
        payload: Some(operator_message::Payload::Rollup(rollup)),
    });
    let mut st = shared.stats.lock();
    st.rollups_sent += 1;
    if replaced {
        st.rollups_coalesced += 1;
    }
}

/// Handles one shard frame; returns `true` for a hello acknowledgement.
fn handle(shared: &Shared, out: &Arc<OutQueue>, msg: ShardMessage) -> bool {
    let cfg = &shared.cfg;
    match msg.payload {
        Some(shard_message::Payload::Ack(ack)) => {
            let mut st = shared.stats.lock();
            st.last_coordinator_term = ack.coordinator_term;
            st.last_shard_epoch = ack.shard_epoch;
            match ack.echo.as_str() {
                "hello" => {
                    st.hello_acks += 1;
                    return true;
                }
                "rollup" => {
                    st.rollup_acks += 1;
                    drop(st);
                    out.rollup_answered(cfg.latency.as_ref());
                }
                other => {
                    if other.starts_with("rollup rejected") {
                        st.rollups_rejected += 1;
                    } else {
                        st.rollups_not_applied += 1;
                    }
                    st.last_error = other.to_owned();
                    drop(st);
                    out.rollup_answered(None);
                }
            }
        }
        Some(shard_message::Payload::BootstrapRequest(req)) => {
            shared.stats.lock().bootstrap_requests += 1;
            answer_bootstrap(shared, out, req);
        }
        Some(shard_message::Payload::ReclaimInstruction(ins)) => {
            let ack = reclaim_ack(&ins);
            {
                let mut st = shared.stats.lock();
                st.reclaim_instructions += 1;
                st.reclaimed_nodes += ins.nodes.len() as u64;
            }
            // Cordoning is instant here; the ack follows it, as the real operator's does.
            if !out.push_response(ack) {
                shared.stats.lock().responses_dropped += 1;
            }
        }
        Some(shard_message::Payload::NodeStateUpdate(u)) => {
            let seq = {
                let mut st = shared.stats.lock();
                st.node_updates += 1;
                st.node_updates
            };
            let view = NodeView {
                state: MachineState::from_ordinal(u.state),
                node_name: u.node_name,
                provider_id: u.provider_id,
                last_error: u.last_error,
                labels: u.labels.into_iter().collect(),
                seq,
            };
            shared.nodes.lock().insert(u.machine_id, view);
        }
        Some(shard_message::Payload::AvailableCapacity(a)) => {
            shared.stats.lock().available_updates += 1;
            shared.available.lock().insert(
                a.supersedes_key,
                AvailableView {
                    available_count: a.available_count,
                    confidence: a.confidence,
                    cost_per_hour: a.cost_per_hour,
                },
            );
        }
        None => {}
    }
    false
}

fn reclaim_ack(ins: &ReclaimInstruction) -> OperatorMessage {
    OperatorMessage {
        payload: Some(operator_message::Payload::ReclaimAck(ReclaimAck {
            instruction_id: ins.instruction_id.clone(),
            nodes_started: i32::try_from(ins.nodes.len()).unwrap_or(i32::MAX),
        })),
    }
}

/// The stub renderer's blob: a cloud-config comment naming the cluster and requirements.
pub fn render_blob(req: &BootstrapRequest) -> Vec<u8> {
    let mut s = format!(
        "#cloud-config\n# bigfleet bootstrap for cluster {}\n",
        req.cluster_id
    );
    for r in &req.requirements {
        s.push_str(&format!("# {} {} {:?}\n", r.key, r.operator, r.values));
    }
    s.into_bytes()
}

fn answer_bootstrap(shared: &Shared, out: &Arc<OutQueue>, req: BootstrapRequest) {
    let response = |user_data: Vec<u8>, ttl_seconds: i64, error: String| OperatorMessage {
        payload: Some(operator_message::Payload::BootstrapResponse(
            BootstrapBlobResponse {
                request_id: req.request_id.clone(),
                user_data,
                ttl_seconds,
                error,
            },
        )),
    };
    let msg = match &shared.cfg.bootstrap {
        BootstrapBehavior::Ignore => return,
        BootstrapBehavior::Blob { ttl_seconds } => {
            response(render_blob(&req), *ttl_seconds, String::new())
        }
        BootstrapBehavior::Error(e) => response(Vec::new(), 0, e.clone()),
        BootstrapBehavior::Delayed { delay, ttl_seconds } => {
            let msg = response(render_blob(&req), *ttl_seconds, String::new());
            let delay = *delay;
            let out = out.handle();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(out) = out.upgrade() {
                    out.push_response(msg);
                }
            });
            shared.stats.lock().bootstrap_answers += 1;
            return;
        }
    };
    if out.push_response(msg) {
        shared.stats.lock().bootstrap_answers += 1;
    } else {
        shared.stats.lock().responses_dropped += 1;
    }
}

fn now_unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The operator's send side: one-shot responses in order (bounded, drop-newest) and a
/// single pending roll-up slot (a newer roll-up replaces an unsent one).
#[derive(Default)]
struct OutQueue {
    inner: Mutex<OutInner>,
}

#[derive(Default)]
struct OutInner {
    responses: VecDeque<OperatorMessage>,
    rollup: Option<OperatorMessage>,
    /// When each sent roll-up left, oldest first, for acknowledgement latency.
    sent_at: VecDeque<Instant>,
    waker: Option<Waker>,
    closed: bool,
}

/// Roll-ups awaiting an ack that are remembered for latency; older ones (replaced at the
/// shard, so never acknowledged) are forgotten.
const MAX_TRACKED_ROLLUPS: usize = 16;

impl OutQueue {
    fn handle(self: &Arc<Self>) -> std::sync::Weak<Self> {
        Arc::downgrade(self)
    }

    fn push_response(&self, msg: OperatorMessage) -> bool {
        let mut inner = self.inner.lock();
        if inner.closed || inner.responses.len() >= RESPONSE_OUTBOX {
            return false;
        }
        inner.responses.push_back(msg);
        if let Some(w) = inner.waker.take() {
            w.wake();
        }
        true
    }

    /// Returns whether an unsent roll-up was replaced.
    fn push_rollup(&self, msg: OperatorMessage) -> bool {
        let mut inner = self.inner.lock();
        let replaced = inner.rollup.replace(msg).is_some();
        if let Some(w) = inner.waker.take() {
            w.wake();
        }
        replaced
    }

    /// A roll-up was answered: record the latency of the oldest unanswered one.
    fn rollup_answered(&self, latency: Option<&LatencyRecorder>) {
        let sent = self.inner.lock().sent_at.pop_front();
        if let (Some(sent), Some(rec)) = (sent, latency) {
            rec.record(sent.elapsed());
        }
    }

    fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        if let Some(w) = inner.waker.take() {
            w.wake();
        }
    }
}

struct OutStream {
    queue: Arc<OutQueue>,
}

impl futures::Stream for OutStream {
    type Item = OperatorMessage;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<OperatorMessage>> {
        let mut inner = self.queue.inner.lock();
        if let Some(msg) = inner.responses.pop_front() {
            return Poll::Ready(Some(msg));
        }
        if let Some(msg) = inner.rollup.take() {
            if inner.sent_at.len() >= MAX_TRACKED_ROLLUPS {
                inner.sent_at.pop_front();
            }
            inner.sent_at.push_back(Instant::now());
            return Poll::Ready(Some(msg));
        }
        if inner.closed {
            return Poll::Ready(None);
        }
        inner.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_errors_sum_every_kind_and_flatten_into_a_report() {
        let op = |n: u64| OperatorStats {
            connect_failures: n,
            disconnects: 2 * n,
            rollups_rejected: 3 * n,
            rollups_not_applied: 4 * n,
            responses_dropped: 5 * n,
            rollups_coalesced: 100,
            ..OperatorStats::default()
        };
        let mut e = SessionErrors::default();
        e.add(&op(1));
        e.add(&op(10));
        assert_eq!(e.total, 15 * 11, "coalescing is not an error");
        #[derive(serde::Serialize)]
        struct Report {
            sessions: u32,
            #[serde(flatten)]
            errors: SessionErrors,
        }
        let v = serde_json::to_value(Report {
            sessions: 2,
            errors: e,
        })
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "sessions": 2,
                "errors": 165,
                "connect_failures": 11,
                "disconnects": 22,
                "rollups_rejected": 33,
                "rollups_not_applied": 44,
                "responses_dropped": 55,
            })
        );
    }

    #[test]
    fn backoff_doubles_from_500ms_to_30s() {
        let p = Backoff::default().policy();
        let windows: Vec<_> = (0..8).map(|n| p.ceiling(n).as_millis()).collect();
        assert_eq!(windows, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        assert_eq!(p.ceiling(1000), Duration::from_secs(30));
        // Equal jitter: never sooner than half the window.
        assert_eq!(p.floor(0), Duration::from_millis(250));
    }

    #[test]
    fn blob_names_the_cluster() {
        let blob = render_blob(&BootstrapRequest {
            request_id: "x".into(),
            requirements: vec![],
            cluster_id: "c9".into(),
        });
        let text = String::from_utf8(blob).unwrap();
        assert!(text.starts_with("#cloud-config\n"));
        assert!(text.contains("cluster c9"));
    }

    #[tokio::test]
    async fn outbound_queue_sends_responses_first_and_keeps_one_rollup() {
        use futures::StreamExt;
        let q = Arc::new(OutQueue::default());
        let mut s = OutStream {
            queue: Arc::clone(&q),
        };
        let rollup = |ts| OperatorMessage {
            payload: Some(operator_message::Payload::Rollup(
                bigfleet_proto::v1alpha1::ClusterCapacityNeeds {
                    cluster_id: "c".into(),
                    timestamp_unix_nanos: ts,
                    needs: vec![],
                },
            )),
        };
        assert!(!q.push_rollup(rollup(1)));
        assert!(q.push_rollup(rollup(2)), "second replaces the unsent first");
        assert!(q.push_response(reclaim_ack(&ReclaimInstruction {
            instruction_id: "i".into(),
            nodes: vec!["n".into()],
            ..Default::default()
        })));
        let first = s.next().await.unwrap();
        assert!(matches!(
            first.payload,
            Some(operator_message::Payload::ReclaimAck(_))
        ));
        let second = s.next().await.unwrap();
        assert!(
            matches!(second.payload, Some(operator_message::Payload::Rollup(ref r)) if r.timestamp_unix_nanos == 2)
        );
        assert!(futures::poll!(s.next()).is_pending());
        q.close();
        assert!(s.next().await.is_none());
        for _ in 0..RESPONSE_OUTBOX {
            q.inner.lock().closed = false;
            q.push_response(reclaim_ack(&ReclaimInstruction::default()));
        }
        assert!(
            !q.push_response(reclaim_ack(&ReclaimInstruction::default())),
            "bounded"
        );
    }
}
