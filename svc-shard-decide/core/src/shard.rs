//! The shard's state and everything that mutates it: roll-up ingest, session
//! events, reconcile, the cycle, worker transitions and hand-outs.

use crate::actions::{ActionLedger, DEFAULT_QUEUE_CAPACITY, InFlight};
use crate::actuation::{ActuationGate, EpochSource};
use crate::inventory::{Inventory, InventorySummary};
use crate::ledgers::{
    AGE_BUCKETS, HintCache, HintValue, ProvisioningClock, ShortfallEntry, ShortfallLedger,
    VerdictTable,
};
use crate::metrics::ShardMetrics;
use crate::publish::{Publisher, SessionSink};
use crate::rails::{
    Admission, AuditLog, AuditRecord, QuarantineGuard, RailsConfig, ReclaimBudget, kind_label,
};
use crate::reconcile::{MachineSource, MergeReport, merge};
use crate::trace::{RollupTraces, current_trace_context};
use bigfleet_conv::RollupLimits;
use bigfleet_conv::{
    ConvError, action_to_proto, machine_from_proto, machine_state_from_proto, machine_to_proto,
    node_state_update, requirements_to_proto, rollup_from_proto_with,
};
use bigfleet_decision::{
    CycleInput, CycleOptions, ParkingLedger, ParkingTiming, ReleasePolicy, run_cycle,
};
use bigfleet_fencing::SequenceMinter;
use bigfleet_model::{Action, ActionKind, Host, Machine, MachineState, check_transition};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::Readiness;
use parking_lot::{Mutex, RwLock};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

/// Everything decide is configured with (the binary maps flags onto it).
#[derive(Debug, Clone)]
pub struct DecideConfig {
    pub shard_id: String,
    /// This process's fencing epoch (strictly increasing across restarts). With a
    /// leased [`EpochSource`] it still names the process (action ids, coordinator
    /// reports) while each term's own, higher epoch is what work items carry.
    pub epoch: u64,
    /// Where hand-outs get their epoch, and whether they may happen at all.
    pub epoch_source: EpochSource,
    pub cycle_interval: Duration,
    pub incremental_reconcile: bool,
    pub available_capacity_interval: Duration,
    pub rails: RailsConfig,
    /// Acquisition-parking thresholds, in time (ADR-0105).
    pub parking: ParkingTiming,
    /// Bound of the action queue.
    pub queue_capacity: usize,
    /// Engine threads (1 = sequential, 0 = the global rayon pool).
    pub engine_threads: usize,
    pub release: ReleasePolicy,
    /// The provider address, reported to the coordinator.
    pub provider_address: String,
    /// When a full List may remove machines (ADR-0106).
    pub removals: crate::reconcile::RemovalPolicy,
    /// Shape bounds and priority ceiling every roll-up is validated against (ADR-0104).
    pub rollup_limits: RollupLimits,
    /// Distinct resource names over every cluster's demand (ADR-0104).
    pub max_shard_dimensions: usize,
    /// Phase 2 victim scoring (weights and the drain estimate); the formula is fixed.
    pub phase2: bigfleet_decision::Phase2Options,
}

impl Default for DecideConfig {
    fn default() -> Self {
        DecideConfig {
            shard_id: "shard-0".to_owned(),
            epoch: 1,
            epoch_source: EpochSource::Fixed,
            cycle_interval: Duration::from_secs(1),
            incremental_reconcile: false,
            available_capacity_interval: Duration::from_secs(5),
            rails: RailsConfig::default(),
            parking: ParkingTiming::default(),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            engine_threads: 0,
            release: ReleasePolicy::default(),
            provider_address: String::new(),
            removals: crate::reconcile::RemovalPolicy::default(),
            rollup_limits: RollupLimits::default(),
            max_shard_dimensions: RollupLimits::DEFAULT_MAX_SHARD_DIMENSIONS,
            phase2: bigfleet_decision::Phase2Options::default(),
        }
    }
}

/// Errors of decide's operations; [`crate::service`] maps them to gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("machine {0:?} is not in the inventory")]
    UnknownMachine(String),
    /// The caller's view is out of date (state differs, action not in flight).
    #[error("stale: {0}")]
    Stale(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("roll-up rejected: {0}")]
    Rollup(#[source] ConvError),
    /// Decide cannot judge the request yet (retry later).
    #[error("not ready: {0}")]
    NotReady(String),
    #[error("opening audit log {path}: {source}")]
    AuditLog {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why a cycle did not decide.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    #[error("provider reconcile failed: {0}")]
    Reconcile(#[source] tonic::Status),
    #[error("engine: {0}")]
    Engine(#[from] bigfleet_decision::EngineError),
    #[error("cycle task failed: {0}")]
    Join(String),
}

/// What one cycle did (returned for tests, logs and benchmarks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleReport {
    pub cycle: u64,
    pub machines: usize,
    pub needs: usize,
    /// Actions the engine decided.
    pub decided: usize,
    pub enqueued: usize,
    pub deduped: usize,
    pub dropped: usize,
    pub suppressed: usize,
    pub dry_run: usize,
    pub capped: usize,
    pub deferred: usize,
    pub follow_up: bool,
    pub hints_sent: usize,
    pub shortfalls: usize,
}

/// Totals of one reconcile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileStats {
    pub listed: usize,
    pub inserted: usize,
    pub updated: usize,
    pub removed: usize,
    pub fast_path: usize,
    pub skipped_in_flight: usize,
    pub rejected: usize,
    pub incremental: bool,
    /// The provider's List round trip (to record boundaries).
    pub list_time: Duration,
    /// Merging into the inventory (including waiting for the write lock).
    pub merge_time: Duration,
}

/// Coarse inventory counts for the coordinator (plain data; the binary
/// converts it to the wire `ShardSummary`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SummaryView {
    pub inventory: InventorySummary,
    pub provider_address: String,
}

/// Clock of decide: UNIX nanos. Injectable for tests.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

fn system_clock() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

pub(crate) struct Inner {
    pub(crate) cfg: DecideConfig,
    pub(crate) actuation: ActuationGate,
    pub(crate) inventory: tokio::sync::RwLock<Inventory>,
    needs: Mutex<crate::needs::NeedsTable>,
    guard: Mutex<QuarantineGuard>,
    first_rollup: RwLock<FxHashSet<String>>,
    /// Per cluster, the trace of the roll-up that last changed its demand (ADR-0080).
    rollup_traces: Mutex<RollupTraces>,
    parking: Mutex<ParkingLedger>,
    /// Per-cluster reclaim tokens over wall-clock time (ADR-0105).
    reclaim_budget: Mutex<ReclaimBudget>,
    shortfalls: Mutex<ShortfallLedger>,
    verdicts: RwLock<Arc<VerdictTable>>,
    hints: Mutex<HintCache>,
    sessions: Mutex<FxHashMap<String, u64>>,
    provisioning: Mutex<ProvisioningClock>,
    /// When a machine entered Configuring / Draining (phase histograms).
    phase_started: Mutex<FxHashMap<String, Instant>>,
    pub(crate) ledger: Mutex<ActionLedger>,
    pub(crate) work_ready: Notify,
    wake: Notify,
    audit: Option<Mutex<AuditLog>>,
    minter: SequenceMinter,
    source: Arc<dyn MachineSource>,
    publisher: Publisher,
    pub(crate) metrics: ShardMetrics,
    readiness: Readiness,
    ready: AtomicBool,
    cycle: AtomicU64,
    coordinator_term: AtomicI64,
    domains: Mutex<BTreeSet<(String, String)>>,
    cursor: Mutex<Vec<u8>>,
    /// Inventory positions of the last full listing, in listing order.
    list_order: Mutex<Vec<u32>>,
    removal_guard: Mutex<crate::reconcile::RemovalGuard>,
    generation: AtomicU64,
    /// Worker transitions a provider listing may not reflect yet.
    local_changes: Mutex<LocalChanges>,
    cycle_lock: tokio::sync::Mutex<()>,
    pub(crate) next_stream: AtomicU64,
    clock: Clock,
}

/// The shard's decision service. Cheap to clone; every clone is the same shard.
#[derive(Clone)]
pub struct Decide {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Decide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decide")
            .field("shard_id", &self.inner.cfg.shard_id)
            .field("epoch", &self.inner.cfg.epoch)
            .finish_non_exhaustive()
    }
}

fn label_capacity_type(c: bigfleet_model::CapacityType) -> &'static str {
    pb::CapacityType::try_from(i32::from(c.ordinal()))
        .map_or("CAPACITY_TYPE_UNSPECIFIED", |c| c.as_str_name())
}

fn label_bucket(b: bigfleet_model::PenaltyBucket) -> &'static str {
    pb::PenaltyBucket::try_from(i32::from(b.ordinal()))
        .map_or("PENALTY_BUCKET_UNSPECIFIED", |b| b.as_str_name())
}

/// Worker transitions stamped in the order they were applied, so reconcile
/// can tell which ones a listing may predate.
///
/// The provider is listed before the merge takes the inventory lock, and a
/// worker can finish an action in between: its Done clears the in-flight
/// mark, so the in-flight check alone lets the merge write the listing's
/// older record over the transition — a Configured machine back to Idle (and
/// a second action for it), or a machine that moved clusters back to its old
/// binding, which the state-only fast path then never corrects.
#[derive(Debug, Default)]
pub(crate) struct LocalChanges {
    clock: u64,
    stamps: FxHashMap<String, u64>,
}

impl LocalChanges {
    /// Stamps a transition of `id`; call with the inventory write lock held.
    pub(crate) fn record(&mut self, id: &str) {
        self.clock += 1;
        self.stamps.insert(id.to_owned(), self.clock);
    }

    /// The fence of a listing that starts now: transitions stamped after it
    /// may be missing from that listing.
    pub(crate) fn fence(&self) -> u64 {
        self.clock
    }

    /// Whether `id` changed after a listing fenced at `fence` started.
    pub(crate) fn newer_than(&self, id: &str, fence: u64) -> bool {
        self.stamps.get(id).is_some_and(|&s| s > fence)
    }

    /// Forgets the transitions a listing fenced at `fence` already covers.
    pub(crate) fn settle(&mut self, fence: u64) {
        self.stamps.retain(|_, s| *s > fence);
    }
}

/// The live-state re-check: is the machine still where the action starts?
fn applicable(inv: &Inventory, action: &Action) -> bool {
    let Some(pos) = inv.position(action.machine_id()) else {
        return false;
    };
    if inv.state_at(pos) != action.kind().from_state() {
        return false;
    }
    match action {
        Action::Reclaim { cluster, .. } | Action::Preempt { cluster, .. } => {
            inv.cluster_of(action.machine_id()) == Some(cluster.as_str())
        }
        _ => true,
    }
}

/// The wire form of a machine as decide holds it, with its assignment in
/// `shard_metadata` under the keys the Configure call uses.
pub fn machine_view(m: &Machine) -> pb::Machine {
    let mut out = machine_to_proto(m);
    if !m.cluster.is_empty() {
        out.shard_metadata.extend(m.encode_shard_metadata());
    }
    out
}

impl Decide {
    /// A decide instance reading machines from `source` and publishing session
    /// frames through `publisher`. Nothing runs until [`Decide::run`] or
    /// [`Decide::run_cycle`] is called.
    pub fn new(
        cfg: DecideConfig,
        source: Arc<dyn MachineSource>,
        publisher: Publisher,
        metrics: ShardMetrics,
        readiness: Readiness,
    ) -> Result<Self, DecideError> {
        Self::with_clock(
            cfg,
            source,
            publisher,
            metrics,
            readiness,
            Arc::new(system_clock),
        )
    }

    /// As [`Decide::new`] with an injected clock (UNIX nanos).
    pub fn with_clock(
        cfg: DecideConfig,
        source: Arc<dyn MachineSource>,
        publisher: Publisher,
        metrics: ShardMetrics,
        readiness: Readiness,
        clock: Clock,
    ) -> Result<Self, DecideError> {
        let audit = match &cfg.rails.audit_log {
            Some(p) => Some(Mutex::new(AuditLog::open(p).map_err(|source| {
                DecideError::AuditLog {
                    path: p.display().to_string(),
                    source,
                }
            })?)),
            None => None,
        };
        metrics
            .actuation_paused
            .set(i64::from(cfg.rails.actuation_paused));
        let publisher = publisher.with_drop_counter(metrics.events_dropped.clone());
        let inner = Inner {
            actuation: ActuationGate::new(cfg.epoch, &cfg.epoch_source),
            inventory: tokio::sync::RwLock::new(Inventory::new()),
            needs: Mutex::new(crate::needs::NeedsTable::new()),
            guard: Mutex::new(QuarantineGuard::new(cfg.rails.empty_rollup_guard)),
            first_rollup: RwLock::new(FxHashSet::default()),
            rollup_traces: Mutex::new(RollupTraces::default()),
            parking: Mutex::new(ParkingLedger::with_timing(cfg.parking)),
            reclaim_budget: Mutex::new(ReclaimBudget::new()),
            shortfalls: Mutex::new(ShortfallLedger::default()),
            verdicts: RwLock::new(Arc::new(VerdictTable::default())),
            hints: Mutex::new(HintCache::new(cfg.available_capacity_interval)),
            sessions: Mutex::new(FxHashMap::default()),
            provisioning: Mutex::new(ProvisioningClock::default()),
            phase_started: Mutex::new(FxHashMap::default()),
            ledger: Mutex::new(ActionLedger::new(
                cfg.queue_capacity,
                format!("e{}", cfg.epoch),
            )),
            work_ready: Notify::new(),
            wake: Notify::new(),
            audit,
            minter: SequenceMinter::default(),
            source,
            publisher,
            metrics,
            readiness,
            ready: AtomicBool::new(false),
            cycle: AtomicU64::new(0),
            coordinator_term: AtomicI64::new(0),
            domains: Mutex::new(BTreeSet::new()),
            cursor: Mutex::new(Vec::new()),
            list_order: Mutex::new(Vec::new()),
            removal_guard: Mutex::new(crate::reconcile::RemovalGuard::new(cfg.removals.clone())),
            generation: AtomicU64::new(0),
            local_changes: Mutex::new(LocalChanges::default()),
            cycle_lock: tokio::sync::Mutex::new(()),
            next_stream: AtomicU64::new(1),
            clock,
            cfg,
        };
        Ok(Decide {
            inner: Arc::new(inner),
        })
    }

    pub fn config(&self) -> &DecideConfig {
        &self.inner.cfg
    }

    /// The epoch reports carry: the current term's under a leased source, else the
    /// process's own.
    pub fn epoch(&self) -> u64 {
        self.inner.actuation.reported_epoch()
    }

    /// The epoch a hand-out would carry now; `None` while hand-outs are paused (a
    /// leased source between terms).
    pub fn actuating_epoch(&self) -> Option<u64> {
        self.inner.actuation.actuating_epoch()
    }

    pub fn metrics(&self) -> &ShardMetrics {
        &self.inner.metrics
    }

    /// Decision cycles completed so far (0 before the first).
    pub fn cycle_count(&self) -> u64 {
        self.inner.cycle.load(Ordering::Acquire)
    }

    /// Latched after the first successful reconcile; never waits for the coordinator.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    fn now(&self) -> i64 {
        (self.inner.clock)()
    }

    /// Asks for a cycle soon; wake-ups coalesce into at most one extra cycle.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    // ----- coordinator-facing state (plain data; no coordinator types) -----

    /// Highest coordinator term seen (0 without a coordinator).
    pub fn coordinator_term(&self) -> i64 {
        self.inner.coordinator_term.load(Ordering::Acquire)
    }

    /// Raises the coordinator-term high-water mark; returns the mark after.
    pub fn observe_coordinator_term(&self, term: i64) -> i64 {
        self.inner
            .coordinator_term
            .fetch_max(term, Ordering::AcqRel)
            .max(term)
    }

    /// Topology domains (key, value) the coordinator assigned to this shard;
    /// empty means "everything" (single-shard mode).
    pub fn owned_domains(&self) -> BTreeSet<(String, String)> {
        self.inner.domains.lock().clone()
    }

    /// Adds a domain; idempotent. Returns whether it was new.
    pub fn assign_domain(&self, key: &str, value: &str) -> bool {
        self.inner
            .domains
            .lock()
            .insert((key.to_owned(), value.to_owned()))
    }

    /// Removes a domain; idempotent. Returns whether it was present.
    pub fn unassign_domain(&self, key: &str, value: &str) -> bool {
        self.inner
            .domains
            .lock()
            .remove(&(key.to_owned(), value.to_owned()))
    }

    /// Inventory counts for reports.
    pub async fn summary(&self) -> SummaryView {
        SummaryView {
            inventory: self.inner.inventory.read().await.summary(),
            provider_address: self.inner.cfg.provider_address.clone(),
        }
    }

    /// The top `limit` shortfalls: priority desc, older first.
    pub fn shortfalls(&self, limit: usize) -> Vec<ShortfallEntry> {
        self.inner.shortfalls.lock().top(limit)
    }

    /// The latest need-verdict table (cycle 0 before the first cycle).
    pub fn verdicts(&self) -> Arc<VerdictTable> {
        self.inner.verdicts.read().clone()
    }

    /// Demand rows in force over every cluster.
    pub fn need_rows(&self) -> usize {
        self.inner.needs.lock().len()
    }

    /// One cluster's demand in force, in roll-up order (empty when it has none).
    pub fn cluster_needs(&self, cluster: &str) -> Vec<bigfleet_model::Need> {
        self.inner.needs.lock().needs_of(cluster).to_vec()
    }

    /// Distinct resource names over every cluster's demand in force.
    pub fn demand_dimensions(&self) -> usize {
        self.inner.needs.lock().dimensions()
    }

    /// Clusters with a live session.
    pub fn connected_clusters(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.sessions.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Actions queued / in flight.
    pub fn action_counts(&self) -> (usize, usize) {
        let l = self.inner.ledger.lock();
        (l.queue_len(), l.inflight_len())
    }

    /// A copy of one machine.
    pub async fn machine(&self, id: &str) -> Option<Machine> {
        self.inner.inventory.read().await.get(id)
    }

    /// Machines per state.
    pub async fn machines_by_state(&self) -> BTreeMap<MachineState, u64> {
        self.inner.inventory.read().await.summary().by_state
    }

    // ----- ingest -----

    /// The single ingest point for demand: clears the cluster's first-roll-up
    /// gate, applies the quarantine, replaces the cluster's demand and wakes
    /// the cycle.
    pub fn apply_rollup(
        &self,
        req: &mesh::ApplyRollupRequest,
    ) -> Result<mesh::ApplyRollupResponse, DecideError> {
        let inner = &self.inner;
        // A roll-up from a replaced session may still be in flight when the newer session's
        // first roll-up has landed; applying it would overwrite newer demand with older
        // (issue 16). Session ids grow across gateway restarts (clock-seeded), and the
        // gateway reports SessionOpened before it forwards any roll-up of that session.
        if let Some(cluster) = req.rollup.as_ref().map(|r| r.cluster_id.as_str())
            && req.session_id != 0
            && let Some(&current) = inner.sessions.lock().get(cluster)
            && current > req.session_id
        {
            inner.metrics.rollups_superseded.inc();
            tracing::info!(
                cluster = %bigfleet_telemetry::clip(cluster),
                session = req.session_id,
                current,
                "roll-up from a replaced session dropped"
            );
            return Ok(mesh::ApplyRollupResponse {
                outcome: mesh::RollupOutcome::Superseded as i32,
                detail: format!(
                    "session {} was replaced by session {current}",
                    req.session_id
                ),
                shard_epoch: self.epoch_i64(),
                coordinator_term: self.coordinator_term(),
                ..Default::default()
            });
        }
        let wire = req.rollup.clone().unwrap_or_default();
        let rejected = |e: ConvError| {
            if !wire.cluster_id.is_empty() {
                inner
                    .metrics
                    .rollups_rejected
                    .with_label_values(&[
                        bigfleet_telemetry::id_label(&wire.cluster_id),
                        e.reason(),
                    ])
                    .inc();
            }
            tracing::warn!(
                cluster = %bigfleet_telemetry::clip(&wire.cluster_id),
                error = %bigfleet_telemetry::clip(&e.to_string()),
                "roll-up rejected"
            );
            DecideError::Rollup(e)
        };
        let config = self.config();
        let rollup = rollup_from_proto_with(&wire, &config.rollup_limits).map_err(rejected)?;
        // The shard-wide dimension bound (ADR-0104), before the roll-up has any effect
        // (first-roll-up gate, quarantine); checked again under the lock that replaces the
        // demand, so two clusters' roll-ups cannot pass it together.
        inner
            .needs
            .lock()
            .check_dimensions(&rollup.cluster, &rollup.needs, config.max_shard_dimensions)
            .map_err(rejected)?;
        let cluster = rollup.cluster.clone();
        let rows = rollup.needs.len();
        let totals = crate::rails::requested_totals(&rollup.needs);
        let (admission, held, opens_gate) = {
            let mut g = inner.guard.lock();
            let accepted_before = g.accepted(&cluster);
            let a = g.admit(&cluster, rows, &totals);
            (a, g.held(&cluster), a.opens_gate(accepted_before))
        };
        if admission == Admission::Unjudged {
            // Before the first reconcile decide has no baseline for a cluster it has not
            // heard from since it started (ADR-0105); the operator re-sends on its interval.
            tracing::info!(cluster = %bigfleet_telemetry::clip(&cluster), rows, "roll-up before the first provider reconcile; not judged");
            return Err(DecideError::NotReady(
                "the quarantine baseline is rebuilt from the first provider reconcile; re-send"
                    .to_owned(),
            ));
        }
        // Any roll-up proves the operator reported (ADR-0036); a held one opens the gate
        // only while earlier demand of this process stays in force (ADR-0105).
        if opens_gate {
            inner.first_rollup.write().insert(cluster.clone());
        }
        inner
            .metrics
            .rollup_quarantined
            .with_label_values(&[&cluster])
            .set(i64::from(held));
        let mut resp = mesh::ApplyRollupResponse {
            shard_epoch: self.epoch_i64(),
            coordinator_term: self.coordinator_term(),
            ..Default::default()
        };
        match admission {
            Admission::Hold(n) => {
                tracing::warn!(cluster = %cluster, rows, held = n, "roll-up drops most demand; quarantined");
                resp.outcome = mesh::RollupOutcome::Quarantined as i32;
                resp.detail = format!(
                    "held {n} consecutive drop(s); {} more confirmation(s) apply it",
                    crate::rails::QUARANTINE_CONFIRMATIONS - n
                );
                resp.need_rows =
                    i32::try_from(inner.needs.lock().rows_of(&cluster)).unwrap_or(i32::MAX);
                return Ok(resp);
            }
            Admission::AcceptConfirmed => {
                tracing::warn!(cluster = %cluster, rows, "demand drop confirmed by consecutive roll-ups; applying");
            }
            // Unjudged returned above.
            Admission::Accept | Admission::Unjudged => {}
        }
        let now = self.now();
        let received = if req.received_at_unix_nanos > 0 {
            req.received_at_unix_nanos
        } else {
            now
        };
        let fps: Vec<String> = rollup
            .needs
            .iter()
            .map(|n| n.fingerprint().to_owned())
            .collect();
        // The roll-up's trace (the ApplyRollup server span) is remembered only when this
        // roll-up changed the cluster's demand; only a traced roll-up pays for the compare.
        let trace = current_trace_context();
        let (in_force, changed) = {
            let mut needs = inner.needs.lock();
            needs
                .check_dimensions(&cluster, &rollup.needs, config.max_shard_dimensions)
                .map_err(rejected)?;
            let before = (!trace.is_empty()).then(|| needs.needs_of(&cluster).to_vec());
            let in_force = needs.replace(&cluster, rollup.needs, received);
            let changed = before.is_some_and(|b| b.as_slice() != needs.needs_of(&cluster));
            (in_force, changed)
        };
        if changed {
            inner
                .rollup_traces
                .lock()
                .record(&cluster, trace, Instant::now());
        }
        inner
            .provisioning
            .lock()
            .observe_demand(&cluster, fps.iter().map(String::as_str), now);
        resp.outcome = mesh::RollupOutcome::Accepted as i32;
        resp.need_rows = i32::try_from(in_force).unwrap_or(i32::MAX);
        self.wake();
        Ok(resp)
    }

    fn epoch_i64(&self) -> i64 {
        i64::try_from(self.epoch()).unwrap_or(i64::MAX)
    }

    /// A session became live: mark the cluster connected and resync every
    /// machine bound to it.
    pub async fn session_opened(
        &self,
        req: &mesh::SessionOpenedRequest,
    ) -> mesh::SessionOpenedResponse {
        let inner = &self.inner;
        {
            let mut s = inner.sessions.lock();
            let event = match s.insert(req.cluster_id.clone(), req.session_id) {
                Some(prev) if prev != req.session_id => "replaced",
                Some(_) => "reopened",
                None => "installed",
            };
            if event != "reopened" {
                inner
                    .metrics
                    .session_lifecycle
                    .with_label_values(&[event])
                    .inc();
            }
            inner.metrics.active_sessions.set(s.len() as i64);
        }
        inner.hints.lock().forget(&req.cluster_id);
        let inv = inner.inventory.read().await;
        let mut n: i32 = 0;
        for m in inv.bound_to(&req.cluster_id) {
            self.publish_node(&m, &req.cluster_id);
            n += 1;
        }
        tracing::info!(cluster = %req.cluster_id, session = req.session_id, protocol = %req.protocol_version, resync = n, "session opened");
        mesh::SessionOpenedResponse {
            shard_epoch: self.epoch_i64(),
            coordinator_term: self.coordinator_term(),
            resync_machines: n,
        }
    }

    /// A session ended: forget the cluster's hint state (a stale close for a
    /// replaced session is ignored).
    pub fn session_closed(&self, req: &mesh::SessionClosedRequest) {
        let inner = &self.inner;
        let mut s = inner.sessions.lock();
        match s.get(&req.cluster_id) {
            Some(&cur) if cur > req.session_id => {
                tracing::debug!(cluster = %req.cluster_id, session = req.session_id, current = cur, "ignoring close of a replaced session");
                return;
            }
            Some(_) => {
                s.remove(&req.cluster_id);
                inner
                    .metrics
                    .session_lifecycle
                    .with_label_values(&["removed"])
                    .inc();
            }
            None => {}
        }
        inner.metrics.active_sessions.set(s.len() as i64);
        drop(s);
        inner.hints.lock().forget(&req.cluster_id);
        tracing::info!(cluster = %req.cluster_id, session = req.session_id, reason = %req.reason, "session closed");
    }

    fn publish_node(&self, m: &Machine, cluster: &str) {
        self.publish_frame(cluster, node_state_update(m, cluster));
    }

    fn publish_frame(&self, cluster: &str, frame: pb::NodeStateUpdate) {
        self.inner.publisher.publish(mesh::ShardEvent {
            cluster_id: cluster.to_owned(),
            supersedes_key: frame.supersedes_key.clone(),
            frame: Some(mesh::shard_event::Frame::NodeStateUpdate(frame)),
        });
    }

    // ----- reconcile -----

    /// Lists the provider and merges the answer into the inventory.
    pub async fn reconcile(&self) -> Result<ReconcileStats, tonic::Status> {
        let inner = &self.inner;
        let incremental = inner.cfg.incremental_reconcile;
        let since = if incremental {
            inner.cursor.lock().clone()
        } else {
            Vec::new()
        };
        let fence = inner.local_changes.lock().fence();
        let t = Instant::now();
        let list = inner.source.list(since.clone()).await?;
        let list_time = t.elapsed();
        let t = Instant::now();
        // A listing without a cursor is complete, so removals are visible even
        // in incremental mode (cold start).
        let full = !incremental || since.is_empty();
        let this = self.clone();
        let report = tokio::task::spawn_blocking(move || {
            let inner = &this.inner;
            // Never 0, the mark of a machine not seen yet.
            let generation = (inner.generation.fetch_add(1, Ordering::AcqRel)
                % u64::from(u32::MAX - 1)) as u32
                + 1;
            let now = this.now();
            let mut inv = inner.inventory.blocking_write();
            let ledger = inner.ledger.lock();
            let mut order = inner.list_order.lock();
            let mut scratch = Vec::new();
            // Incremental deltas are small and unordered: no hint for them.
            let order: &mut Vec<u32> = if full { &mut order } else { &mut scratch };
            let mut changes = inner.local_changes.lock();
            let mut removals = inner.removal_guard.lock();
            let mut r = merge(
                &mut inv,
                &list.machines,
                full,
                generation,
                now,
                |id| ledger.is_in_flight(id) || changes.newer_than(id, fence),
                order,
                &mut removals,
            );
            drop(removals);
            changes.settle(fence);
            drop(changes);
            drop(ledger);
            // Published before the lock is released, so no transition applied
            // after this merge can have its frame overtaken by an older one.
            for (cluster, frame) in std::mem::take(&mut r.notify) {
                this.publish_frame(&cluster, frame);
            }
            drop(inv);
            (r, list.revision)
        })
        .await
        .map_err(|e| tonic::Status::internal(format!("reconcile task: {e}")))?;
        let (r, revision) = report;
        let merge_time = t.elapsed();
        if incremental {
            *inner.cursor.lock() = revision;
        }
        let stats = ReconcileStats {
            listed: r.listed,
            inserted: r.inserted,
            updated: r.updated,
            removed: r.removed,
            fast_path: r.fast_path,
            skipped_in_flight: r.skipped_in_flight,
            rejected: r.rejected.len(),
            incremental: !full,
            list_time,
            merge_time,
        };
        tracing::debug!(
            listed = stats.listed,
            changed = stats.updated + stats.inserted + stats.removed,
            list_ms = list_time.as_secs_f64() * 1e3,
            merge_ms = merge_time.as_secs_f64() * 1e3,
            "reconciled"
        );
        self.after_merge(r);
        self.refresh_quarantine_holdings().await;
        if !inner.ready.swap(true, Ordering::AcqRel) {
            inner.readiness.set_ready();
            tracing::info!(
                machines = stats.listed,
                "first provider reconcile complete; ready"
            );
        }
        Ok(stats)
    }

    /// Gives the quarantine what each cluster's Configured machines provide: its
    /// baseline for clusters not heard from since the start, and its "big enough to
    /// matter" test (ADR-0105).
    async fn refresh_quarantine_holdings(&self) {
        if !self.inner.guard.lock().enabled() {
            return;
        }
        let holdings = crate::rails::holdings(&*self.inner.inventory.read().await);
        self.inner.guard.lock().refresh_holdings(holdings);
    }

    fn after_merge(&self, r: MergeReport) {
        let inner = &self.inner;
        match r.held {
            Some((reason, n)) => {
                inner.metrics.removals_held.set(n as i64);
                tracing::warn!(
                    machines = n,
                    reason = reason.label(),
                    detail = ?reason,
                    "provider List left machines out; removal held (they keep their last known state)"
                );
            }
            None => inner.metrics.removals_held.set(0),
        }
        for reason in &r.rejected {
            inner
                .metrics
                .machines_rejected
                .with_label_values(&[reason])
                .inc();
        }
        let now = self.now();
        let mut prov = inner.provisioning.lock();
        for (cluster, fp) in &r.configured {
            if let Some(d) = prov.observe_configured(cluster, fp, now) {
                inner.metrics.provisioning_latency.observe(d.as_secs_f64());
            }
        }
    }

    // ----- the cycle -----

    /// Runs cycles until `shutdown` resolves: every `cycle_interval`, and soon
    /// after each wake-up (accepted roll-ups, truncated cycles).
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticker = tokio::time::interval(self.inner.cfg.cycle_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = ticker.tick() => {}
                () = self.inner.wake.notified() => {}
            }
            match self.run_cycle().await {
                Ok(r) if r.follow_up => self.wake(),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cycle skipped"),
            }
        }
    }

    /// One cycle: reconcile → snapshot → engine → ledgers → hints → rails → enqueue.
    pub async fn run_cycle(&self) -> Result<CycleReport, CycleError> {
        let _one_at_a_time = self.inner.cycle_lock.lock().await;
        let started = Instant::now();
        let m = &self.inner.metrics;
        let t = Instant::now();
        let rec = self.reconcile().await;
        m.cycle_phase_duration
            .with_label_values(&["reconcile"])
            .observe(t.elapsed().as_secs_f64());
        if let Err(e) = rec {
            m.reconcile_errors.inc();
            // Deciding against a stale view wastes actions; the next tick retries.
            return Err(CycleError::Reconcile(e));
        }
        let this = self.clone();
        let span = tracing::info_span!("decide_cycle", shard = %self.inner.cfg.shard_id);
        let report = tokio::task::spawn_blocking(move || this.decide_blocking(span))
            .await
            .map_err(|e| CycleError::Join(e.to_string()))??;
        m.cycles_total.inc();
        m.cycle_duration.observe(started.elapsed().as_secs_f64());
        self.inner.work_ready.notify_waiters();
        Ok(report)
    }

    fn decide_blocking(&self, span: tracing::Span) -> Result<CycleReport, CycleError> {
        let _entered = span.enter();
        let trace = current_trace_context();
        let inner = &self.inner;
        let m = &inner.metrics;
        let now = self.now();
        let t = Instant::now();
        let inv = inner.inventory.blocking_read();
        let demand = inner.needs.lock().snapshot();
        let parking = {
            let mut p = inner.parking.lock();
            p.prepare(now);
            p.clone()
        };
        let gate = inner.first_rollup.read().clone();
        let ready = move |c: &str| gate.contains(c);
        let destinations = inner.ledger.lock().creating_destinations();
        m.cycle_phase_duration
            .with_label_values(&["snapread"])
            .observe(t.elapsed().as_secs_f64());

        let t = Instant::now();
        let input = CycleInput {
            creating_destinations: Some(&destinations),
            demand: &demand,
            now_unix_nanos: now,
            parking: Some(&parking),
            cluster_ready: Some(&ready),
            ..CycleInput::with_fleet(inv.fleet(), &demand)
        };
        let opts = CycleOptions {
            verdicts: true,
            threads: inner.cfg.engine_threads,
            release: inner.cfg.release,
            phase2: inner.cfg.phase2,
            ..CycleOptions::default()
        };
        let out = run_cycle(&input, &opts)?;
        m.cycle_phase_duration
            .with_label_values(&["engine"])
            .observe(t.elapsed().as_secs_f64());
        let cycle = inner.cycle.fetch_add(1, Ordering::AcqRel) + 1;

        inner.parking.lock().observe_at(&out.parking, now);
        let shortfall_count = {
            let mut s = inner.shortfalls.lock();
            s.record(&out.shortfalls, now);
            let aged = s.aged(now);
            for (label, n) in AGE_BUCKETS.iter().zip(aged) {
                m.shortfalls_aged.with_label_values(&[label]).set(n as i64);
            }
            m.shortfalls.set(s.len() as i64);
            s.len()
        };
        let prev = self.verdicts();
        let table = VerdictTable::build(&prev, cycle, now, &demand, out.verdicts);
        *inner.verdicts.write() = Arc::new(table);

        let t = Instant::now();
        let hints_sent = self.emit_hints(&inv);
        m.cycle_phase_duration
            .with_label_values(&["emit"])
            .observe(t.elapsed().as_secs_f64());

        let t = Instant::now();
        let decided = out.actions.len();
        let rails = {
            let mut budget = inner.reclaim_budget.lock();
            budget.expire(now, inner.cfg.rails.reclaim_budget_window);
            let rails = crate::rails::apply(&inner.cfg.rails, out.actions, &budget, &*inv);
            for d in &rails.deferrals {
                if budget.should_log(&d.cluster, now) {
                    tracing::info!(
                        cycle,
                        cluster = %bigfleet_telemetry::clip(&d.cluster),
                        deferred = d.deferred,
                        budget = d.budget,
                        in_use = d.in_use,
                        window_seconds = inner.cfg.rails.reclaim_budget_window.as_secs_f64(),
                        "reclaims over the cluster's budget deferred (at most one such line a minute per cluster)"
                    );
                }
            }
            budget.retain_logged(|c| rails.deferrals.iter().any(|d| d.cluster == c));
            rails
        };
        for a in &rails.suppressed {
            m.actions_suppressed
                .with_label_values(&[kind_label(a.kind())])
                .inc();
            self.audit(cycle, a, "suppressed");
        }
        if !rails.suppressed.is_empty() {
            tracing::info!(
                cycle,
                suppressed = rails.suppressed.len(),
                "actuation paused; actions suppressed"
            );
        }
        for a in &rails.dry_run {
            m.actions_dryrun
                .with_label_values(&[kind_label(a.kind())])
                .inc();
            tracing::info!(
                cycle,
                kind = kind_label(a.kind()),
                machine = %a.machine_id(),
                cluster = %a.cluster(),
                reason = a.kind().reason(),
                grace_seconds = a.grace().map_or(0.0, |g| g.as_secs_f64()),
                "dry-run action"
            );
            self.audit(cycle, a, "dryrun");
        }
        m.reclaims_capped.inc_by(rails.capped as u64);
        m.actions_deferred.inc_by(rails.deferred as u64);
        let mut traces = inner
            .rollup_traces
            .lock()
            .for_cycle(cycle, Instant::now(), trace);
        let stats = inner.ledger.lock().replace_queue_traced(
            rails.execute,
            cycle,
            |a| traces.of(a),
            |a| applicable(&inv, a),
        );
        m.actions_deduped.inc_by(stats.deduped as u64);
        m.actions_dropped.inc_by(stats.dropped as u64);
        m.cycle_phase_duration
            .with_label_values(&["execute"])
            .observe(t.elapsed().as_secs_f64());
        m.actuation_paused
            .set(i64::from(inner.cfg.rails.actuation_paused));
        self.export_gauges(&inv, &demand);
        let (queued, inflight) = self.action_counts();
        m.action_queue_depth.set(queued as i64);
        m.execute_inflight.set(inflight as i64);

        Ok(CycleReport {
            cycle,
            machines: inv.len(),
            needs: demand.len(),
            decided,
            enqueued: stats.enqueued,
            deduped: stats.deduped,
            dropped: stats.dropped,
            suppressed: rails.suppressed.len(),
            dry_run: rails.dry_run.len(),
            capped: rails.capped,
            deferred: rails.deferred,
            follow_up: rails.follow_up,
            hints_sent,
            shortfalls: shortfall_count,
        })
    }

    fn audit(&self, cycle: u64, action: &Action, outcome: &str) {
        if let Some(log) = &self.inner.audit {
            log.lock().write(&AuditRecord::new(cycle, action, outcome));
        }
    }

    fn export_gauges(&self, inv: &Inventory, demand: &[bigfleet_model::Need]) {
        let m = &self.inner.metrics;
        let mut cells: BTreeMap<(&'static str, &'static str, &'static str), i64> = BTreeMap::new();
        for (k, n) in &inv.buckets() {
            *cells
                .entry((
                    k.state.as_str(),
                    label_capacity_type(k.capacity_type),
                    label_bucket(k.interruption_bucket),
                ))
                .or_default() += *n as i64;
        }
        m.inventory_machines.reset();
        for ((s, c, b), n) in cells {
            m.inventory_machines.with_label_values(&[s, c, b]).set(n);
        }
        let mut rows: BTreeMap<&'static str, i64> = BTreeMap::new();
        for n in demand {
            *rows
                .entry(label_bucket(n.profile.interruption_bucket()))
                .or_default() += 1;
        }
        m.demand_machines.reset();
        for (b, n) in rows {
            m.demand_machines.with_label_values(&[b]).set(n);
        }
    }

    /// One AvailableCapacity hint per (connected cluster, demanded
    /// fingerprint), sent only when its value changed and the key's rate
    /// limit allows.
    fn emit_hints(&self, inv: &Inventory) -> usize {
        let inner = &self.inner;
        let sessions: Vec<String> = inner.sessions.lock().keys().cloned().collect();
        if sessions.is_empty() {
            return 0;
        }
        let now = Instant::now();
        let needs = inner.needs.lock();
        let mut hints = inner.hints.lock();
        let mut sent = 0;
        for cluster in sessions {
            let mut seen: FxHashSet<&str> = FxHashSet::default();
            for n in needs.needs_of(&cluster) {
                let fp = n.fingerprint();
                if !seen.insert(fp) {
                    continue;
                }
                let supply = inv.free_supply(n.profile.pinned_instance_types());
                let confidence = if supply.idle > 0 {
                    pb::available_capacity_update::Confidence::High
                } else if supply.speculative > 0 {
                    pb::available_capacity_update::Confidence::Medium
                } else {
                    pb::available_capacity_update::Confidence::None
                };
                let value = HintValue {
                    count: i32::try_from(supply.idle + supply.speculative).unwrap_or(i32::MAX),
                    confidence: confidence as i32,
                    cost_per_hour: supply.cheapest_idle_price.unwrap_or(0.0),
                };
                if !hints.should_emit(&cluster, fp, value, now) {
                    continue;
                }
                let key = format!("available:{fp}");
                let frame = pb::AvailableCapacityUpdate {
                    supersedes_key: key.clone(),
                    requirements: requirements_to_proto(n.profile.requirements()),
                    resources: None,
                    available_count: value.count,
                    confidence: value.confidence,
                    cost_per_hour: value.cost_per_hour,
                };
                inner.publisher.publish(mesh::ShardEvent {
                    cluster_id: cluster.clone(),
                    supersedes_key: key,
                    frame: Some(mesh::shard_event::Frame::AvailableCapacity(frame)),
                });
                sent += 1;
            }
            hints.retain(&cluster, |fp| seen.contains(fp));
        }
        sent
    }

    // ----- workers -----

    /// Hands the next queued action to `stream`, or `None` when nothing is
    /// queued or hand-outs are paused (no leadership term). Re-checks the
    /// machine's live state first.
    pub async fn hand_out(&self, stream: u64) -> Option<mesh::WorkItem> {
        let inner = &self.inner;
        // Read once: the item carries exactly the epoch of the term that allowed it.
        let epoch = inner.actuation.actuating_epoch()?;
        let inv = inner.inventory.read().await;
        // The reclaim budget is checked and spent here, where an action leaves decide
        // (ADR-0105): whatever the cycles queued, no window ever starts more reclaims
        // of a cluster than its budget.
        let now = self.now();
        let rails = &inner.cfg.rails;
        let mut budget = inner.reclaim_budget.lock();
        budget.expire(now, rails.reclaim_budget_window);
        let over_budget = std::cell::Cell::new(0usize);
        let (f, moot) = inner.ledger.lock().hand_out(stream, |a| {
            if !applicable(&inv, a) {
                return false;
            }
            let admitted = budget.admits(rails, a, &*inv);
            if !admitted {
                over_budget.set(over_budget.get() + 1);
            }
            admitted
        });
        if let Some(f) = &f
            && f.action.kind() == ActionKind::Reclaim
            && rails.budget_enabled()
        {
            budget.spend(f.action.cluster(), f.action.machine_id(), now);
        }
        drop(budget);
        let over_budget = over_budget.get();
        inner
            .metrics
            .actions_deduped
            .inc_by((moot - over_budget) as u64);
        if over_budget > 0 {
            // Re-derived by a later cycle, which defers them (and logs) while the budget is spent.
            inner.metrics.reclaims_capped.inc_by(over_budget as u64);
        }
        let f = f?;
        let machine = inv.get(f.action.machine_id()).map(|m| machine_view(&m));
        drop(inv);
        let base = match inner.minter.next_base() {
            Ok(b) => b,
            Err(e) => {
                // Cannot happen within an epoch's lifetime (2^48 actions); refuse
                // rather than reuse sequence numbers.
                tracing::error!(error = %e, "sequence space exhausted");
                inner.ledger.lock().complete(&f.action_id);
                return None;
            }
        };
        let kind = kind_label(f.action.kind());
        inner.metrics.actions_total.with_label_values(&[kind]).inc();
        self.refresh_ledger_gauges();
        Some(mesh::WorkItem {
            action_id: f.action_id.clone(),
            action: Some(action_to_proto(&f.action)),
            machine,
            fencing: Some(mesh::Fencing {
                shard_id: inner.cfg.shard_id.clone(),
                epoch: i64::try_from(epoch).unwrap_or(i64::MAX),
                sequence_base: i64::try_from(base.base).unwrap_or(i64::MAX),
                sequence_limit: i64::try_from(base.base.saturating_add(base.spacing))
                    .unwrap_or(i64::MAX),
            }),
            cycle: f.cycle,
            trace_context: f
                .trace
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }

    fn refresh_ledger_gauges(&self) {
        let (q, f) = self.action_counts();
        self.inner.metrics.action_queue_depth.set(q as i64);
        self.inner.metrics.execute_inflight.set(f as i64);
    }

    /// A worker finished an action: free the machine, count and audit the outcome.
    pub fn done(&self, done: &mesh::worker_message::Done) {
        let Some(f) = self.inner.ledger.lock().complete(&done.action_id) else {
            tracing::debug!(action = %done.action_id, "done for an unknown or abandoned action");
            return;
        };
        self.finish(&f, &done.outcome);
    }

    fn finish(&self, f: &InFlight, outcome: &str) {
        let outcome = if outcome.is_empty() { "other" } else { outcome };
        self.inner
            .metrics
            .action_execute_outcomes
            .with_label_values(&[kind_label(f.action.kind()), outcome])
            .inc();
        self.audit(f.cycle, &f.action, outcome);
        self.refresh_ledger_gauges();
    }

    /// A Work stream ended: its unfinished actions are abandoned and their
    /// machines become eligible again (the next cycle re-derives them).
    pub fn abandon_stream(&self, stream: u64) -> usize {
        let freed = self.inner.ledger.lock().abandon_stream(stream);
        for f in &freed {
            tracing::info!(action = %f.action_id, machine = %f.action.machine_id(), "worker went away; action abandoned");
            self.finish(f, "abandoned");
        }
        if !freed.is_empty() {
            self.wake();
        }
        freed.len()
    }

    /// A worker reports a state change of a machine it holds an action for.
    pub async fn transition(
        &self,
        req: &mesh::TransitionRequest,
    ) -> Result<pb::Machine, DecideError> {
        let inner = &self.inner;
        let from = machine_state_from_proto(req.from_state)
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        let to = machine_state_from_proto(req.to_state)
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        let patch = req.patch.clone().unwrap_or_default();
        let view = match &patch.provider_view {
            Some(v) => Some(machine_from_proto(v).map_err(|e| {
                inner
                    .metrics
                    .machines_rejected
                    .with_label_values(&[e.reason()])
                    .inc();
                DecideError::Invalid(format!("provider_view: {e}"))
            })?),
            None => None,
        };
        let now = self.now();
        let mut inv = inner.inventory.write().await;
        let cur = inv
            .get(&req.machine_id)
            .ok_or_else(|| DecideError::UnknownMachine(req.machine_id.clone()))?;
        match inner.ledger.lock().in_flight(&req.machine_id) {
            Some(f) if f.action_id == req.action_id => {}
            _ => {
                return Err(DecideError::Stale(format!(
                    "action {:?} is not in flight for machine {:?}",
                    req.action_id, req.machine_id
                )));
            }
        }
        if cur.state != from {
            return Err(DecideError::Stale(format!(
                "machine {:?} is {}, not {from}",
                req.machine_id, cur.state
            )));
        }
        check_transition(from, to).map_err(|e| DecideError::Invalid(e.to_string()))?;
        let mut next = cur.clone();
        let cur_cluster = cur.cluster;
        apply_patch(&mut next, to, &patch, view)?;
        next.invariant()
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        let prev_cluster = cur_cluster;
        inv.upsert(next.clone(), now);
        inner.local_changes.lock().record(&next.id);
        // Route with the binding captured before the change, so Draining →
        // Idle still reaches the cluster the node is leaving. Published with
        // the write lock held: frames leave in the order the inventory
        // changed, so a concurrent merge or resync cannot overtake this one.
        let notify = if prev_cluster.is_empty() {
            next.cluster.clone()
        } else {
            prev_cluster
        };
        if !notify.is_empty() {
            self.publish_node(&next, &notify);
        }
        drop(inv);
        tracing::debug!(machine = %next.id, %from, %to, reason = %req.reason, "transition applied");
        self.observe_phases(&next, from, to, now);
        Ok(machine_view(&next))
    }

    fn observe_phases(&self, m: &Machine, from: MachineState, to: MachineState, now: i64) {
        use MachineState::*;
        let inner = &self.inner;
        let mut started = inner.phase_started.lock();
        match (from, to) {
            (Idle, Configuring) | (Configured, Draining) => {
                started.insert(m.id.clone(), Instant::now());
            }
            (Configuring, Configured) => {
                if let Some(t) = started.remove(&m.id) {
                    inner
                        .metrics
                        .configure_phase
                        .observe(t.elapsed().as_secs_f64());
                }
                if let Some(d) = inner.provisioning.lock().observe_configured(
                    &m.cluster,
                    &m.assigned_need_fingerprint,
                    now,
                ) {
                    inner.metrics.provisioning_latency.observe(d.as_secs_f64());
                }
            }
            (Draining, Idle) => {
                if let Some(t) = started.remove(&m.id) {
                    inner.metrics.drain_phase.observe(t.elapsed().as_secs_f64());
                }
            }
            (Deleting, Speculative) => inner.metrics.idle_releases.inc(),
            (_, Failed) | (Configuring, Idle) => {
                started.remove(&m.id);
            }
            _ => {}
        }
    }
}

/// Applies a worker's patch for a transition into `to`.
fn apply_patch(
    m: &mut Machine,
    to: MachineState,
    patch: &mesh::MachinePatch,
    view: Option<Machine>,
) -> Result<(), DecideError> {
    m.state = to;
    if let Some(v) = view {
        m.price_per_hour = v.price_per_hour;
        m.interruption_probability = v.interruption_probability;
        m.allocatable = v.allocatable;
        m.profile.labels = v.profile.labels;
        if patch.host.is_none() {
            m.host = v.host;
        }
    }
    if let Some(h) = &patch.host {
        m.host = Host {
            provider: h.provider.clone(),
            reference: h.r#ref.clone(),
        };
    }
    if let Some(c) = &patch.cluster {
        m.cluster.clone_from(c);
    }
    if let Some(p) = patch.assigned_priority {
        m.assigned_priority = p;
    }
    for (value, field) in [
        (
            patch.assigned_interruption_penalty_dollars,
            &mut m.assigned_interruption_penalty_dollars,
        ),
        (
            patch.assigned_reclamation_penalty_dollars,
            &mut m.assigned_reclamation_penalty_dollars,
        ),
    ] {
        if let Some(d) = value {
            if d.is_nan() || d < 0.0 {
                return Err(DecideError::Invalid(format!(
                    "penalty dollars {d} must be non-negative"
                )));
            }
            *field = d;
        }
    }
    if let Some(fp) = &patch.assigned_need_fingerprint {
        m.assigned_need_fingerprint.clone_from(fp);
    }
    if let Some(g) = &patch.assigned_group {
        m.assigned_group.clone_from(g);
    }
    if let Some(e) = &patch.last_error {
        m.last_error.clone_from(e);
    }
    if !patch.shard_metadata.is_empty() {
        m.shard_metadata = patch
            .shard_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
    if matches!(to, MachineState::Idle | MachineState::Speculative) {
        m.clear_assignment();
        m.shard_metadata.clear();
    }
    if to == MachineState::Speculative {
        // Delete released the hardware; only the quota slot remains.
        m.host = Host::default();
    }
    if to == MachineState::Failed && m.last_error.is_empty() {
        return Err(DecideError::Invalid(
            "a transition into FAILED needs last_error".to_owned(),
        ));
    }
    Ok(())
}

impl SessionSink for Decide {
    fn sessions_live(&self, sessions: Vec<(String, u64)>) {
        let mut s = self.inner.sessions.lock();
        let live: FxHashMap<String, u64> = sessions.into_iter().collect();
        // Only the gateway knows which sessions exist; replace our view.
        *s = live;
        self.inner.metrics.active_sessions.set(s.len() as i64);
    }
}
