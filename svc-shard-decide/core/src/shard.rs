//! The shard's state and its read accessors. What mutates it lives in one module per
//! job — `intake` (roll-ups, sessions), `sync` (provider
//! reconcile), `cycle` (the decision cycle), `work` (hand-out,
//! Done, Transition) — each over its own room, locked in the order written in
//! [`crate::locks`] (ADR-0112).

use crate::actions::{ActionLedger, DEFAULT_QUEUE_CAPACITY};
use crate::actuation::{ActuationGate, EpochSource};
use crate::cycle::CycleRoom;
use crate::intake::Intake;
use crate::inventory::{Inventory, InventorySummary};
use crate::ledgers::{HintCache, ProvisioningClock, ShortfallEntry, ShortfallLedger, VerdictTable};
use crate::locks::{Level, Ordered, OrderedRw};
use crate::metrics::ShardMetrics;
use crate::publish::Publisher;
use crate::rails::{AuditLog, QuarantineGuard, RailsConfig};
use crate::reconcile::{MachineSource, MergeCounts};
use crate::sync::SyncRoom;
use crate::work::WorkRoom;
use bigfleet_conv::RollupLimits;
use bigfleet_conv::machine_to_proto;
use bigfleet_decision::{ParkingTiming, ReleasePolicy};
use bigfleet_fencing::SequenceMinter;
use bigfleet_model::{Action, Machine, MachineState};
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::Readiness;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

pub use crate::errors::{CycleError, DecideError};

/// Default of [`DecideConfig::wake_interval`].
pub const DEFAULT_WAKE_INTERVAL_MS: u64 = 250;
/// Default smallest relative change of an AvailableCapacity count worth a frame (ADR-0127).
pub const DEFAULT_AVAILABLE_CAPACITY_MIN_CHANGE: f64 = 0.1;

#[derive(Debug, Clone)]
pub struct DecideConfig {
    pub shard_id: String,
    /// This process's fencing epoch (strictly increasing across restarts). With a
    /// leased [`EpochSource`] it still names the process (action ids, coordinator
    /// reports) while each term's own, higher epoch is what work items carry.
    pub epoch: u64,
    /// Where hand-outs get their epoch, and whether they may happen at all.
    pub epoch_source: EpochSource,
    /// Longest time between cycles (each cycle restarts it).
    pub cycle_interval: Duration,
    /// Shortest time between the start of a cycle and one a wake-up asks for (changed
    /// demand, abandoned work): wake-ups within it fold into one cycle (ADR-0111).
    pub wake_interval: Duration,
    pub incremental_reconcile: bool,
    /// In incremental mode, how often a full List (which sees removals) replaces the
    /// incremental one.
    pub full_list_interval: Duration,
    pub available_capacity_interval: Duration,
    /// Smallest relative change of an AvailableCapacity count worth a frame (ADR-0127).
    pub available_capacity_min_change: f64,
    pub rails: RailsConfig,
    /// Acquisition-parking thresholds, in time (ADR-0105).
    pub parking: ParkingTiming,
    /// Bound of the action queue.
    pub queue_capacity: usize,
    /// Bound of the recent-actions ring (ADR-0125); zero keeps none.
    pub action_history: usize,
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
    /// Cycles whose duration histograms are not observed (the first full List of a cold
    /// start is not what the cycle SLO measures); counters are unaffected.
    pub metrics_warmup_cycles: u64,
}

impl Default for DecideConfig {
    fn default() -> Self {
        DecideConfig {
            shard_id: "shard-0".to_owned(),
            epoch: 1,
            epoch_source: EpochSource::Fixed,
            cycle_interval: Duration::from_secs(1),
            wake_interval: Duration::from_millis(DEFAULT_WAKE_INTERVAL_MS),
            incremental_reconcile: false,
            full_list_interval: Duration::from_secs(60),
            available_capacity_interval: Duration::from_secs(5),
            available_capacity_min_change: DEFAULT_AVAILABLE_CAPACITY_MIN_CHANGE,
            rails: RailsConfig::default(),
            parking: ParkingTiming::default(),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            action_history: crate::history::DEFAULT_ACTION_HISTORY,
            engine_threads: 0,
            release: ReleasePolicy::default(),
            provider_address: String::new(),
            removals: crate::reconcile::RemovalPolicy::default(),
            rollup_limits: RollupLimits::default(),
            max_shard_dimensions: RollupLimits::DEFAULT_MAX_SHARD_DIMENSIONS,
            phase2: bigfleet_decision::Phase2Options::default(),
            metrics_warmup_cycles: 0,
        }
    }
}
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
    /// The provider List failed: decided on the last-known inventory (ADR-0118).
    pub stale: bool,
    /// Actions a stale cycle held back (everything but Bootstrap and Provision).
    pub held_stale: usize,
}

/// Totals of one reconcile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileStats {
    pub counts: MergeCounts,
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

pub(crate) fn system_clock() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}
pub(crate) struct Inner {
    pub(crate) cfg: DecideConfig,
    pub(crate) actuation: ActuationGate,
    /// Level 0: the outermost lock, never taken with an ordered lock held.
    pub(crate) inventory: tokio::sync::RwLock<Inventory>,
    /// Level 1.
    pub(crate) intake: Ordered<Intake>,
    /// Level 2.
    pub(crate) work: Ordered<WorkRoom>,
    /// Level 3.
    pub(crate) sync: Ordered<SyncRoom>,
    // Leaves: taken alone.
    pub(crate) verdicts: OrderedRw<Arc<VerdictTable>>,
    pub(crate) shortfalls: Ordered<ShortfallLedger>,
    pub(crate) hints: Ordered<HintCache>,
    pub(crate) provisioning: Ordered<ProvisioningClock>,
    /// Owned domains and transferred machines (ADR-0128); see `ownership.rs`.
    pub(crate) ownership: Ordered<bigfleet_decision::Ownership>,
    /// Cross-shard drains chosen and not started (ADR-0137); see `drain.rs`.
    pub(crate) drains: Ordered<crate::drain::DrainBook>,
    pub(crate) audit: Option<Ordered<AuditLog>>,
    /// Recent actions and their outcomes (ADR-0125).
    pub(crate) history: Ordered<crate::history::ActionHistory>,
    /// The cycle's own state; holding it is what makes a cycle the only one running.
    pub(crate) cycle_room: Arc<tokio::sync::Mutex<CycleRoom>>,
    pub(crate) work_ready: Notify,
    pub(crate) wake: Notify,
    pub(crate) minter: SequenceMinter,
    pub(crate) source: Arc<dyn MachineSource>,
    pub(crate) publisher: Publisher,
    pub(crate) metrics: ShardMetrics,
    pub(crate) readiness: Readiness,
    pub(crate) ready: AtomicBool,
    /// When the last successful provider List started (clock nanos; 0 = never).
    pub(crate) listed_at: AtomicI64,
    /// Known machines the last full List left out whose removal is held.
    pub(crate) removals_held: AtomicU64,
    pub(crate) cycle: AtomicU64,
    coordinator_term: AtomicI64,
    pub(crate) generation: AtomicU64,
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

pub(crate) fn label_capacity_type(c: bigfleet_model::CapacityType) -> &'static str {
    pb::CapacityType::try_from(i32::from(c.ordinal()))
        .map_or("CAPACITY_TYPE_UNSPECIFIED", |c| c.as_str_name())
}

pub(crate) fn label_bucket(b: bigfleet_model::PenaltyBucket) -> &'static str {
    pb::PenaltyBucket::try_from(i32::from(b.ordinal()))
        .map_or("PENALTY_BUCKET_UNSPECIFIED", |b| b.as_str_name())
}
/// The live-state re-check: is the machine still where the action starts?
pub(crate) fn applicable(inv: &Inventory, action: &Action) -> bool {
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
            Some(p) => Some(Ordered::new(
                Level::Leaf,
                "audit",
                AuditLog::open(p).map_err(|source| DecideError::AuditLog {
                    path: p.display().to_string(),
                    source,
                })?,
            )),
            None => None,
        };
        metrics
            .actuation_paused
            .set(i64::from(cfg.rails.actuation_paused));
        let publisher = publisher.with_drop_counter(metrics.events_dropped.clone());
        let inner = Inner {
            actuation: ActuationGate::new(cfg.epoch, &cfg.epoch_source),
            inventory: tokio::sync::RwLock::new(Inventory::new()),
            intake: Ordered::new(
                Level::Intake,
                "intake",
                Intake::new(QuarantineGuard::new(cfg.rails.empty_rollup_guard)),
            ),
            work: Ordered::new(
                Level::Work,
                "work",
                WorkRoom::new(ActionLedger::new(
                    cfg.queue_capacity,
                    format!("e{}", cfg.epoch),
                )),
            ),
            sync: Ordered::new(Level::Sync, "sync", SyncRoom::new(cfg.removals.clone())),
            verdicts: OrderedRw::new(Level::Leaf, "verdicts", Arc::new(VerdictTable::default())),
            shortfalls: Ordered::new(Level::Leaf, "shortfalls", ShortfallLedger::default()),
            hints: Ordered::new(
                Level::Leaf,
                "hints",
                HintCache::with_min_change(
                    cfg.available_capacity_interval,
                    cfg.available_capacity_min_change,
                ),
            ),
            provisioning: Ordered::new(Level::Leaf, "provisioning", ProvisioningClock::default()),
            ownership: Ordered::new(
                Level::Leaf,
                "domains",
                bigfleet_decision::Ownership::everything(),
            ),
            drains: Ordered::new(Level::Leaf, "drains", Default::default()),
            audit,
            history: Ordered::new(
                Level::Leaf,
                "history",
                crate::history::ActionHistory::new(cfg.action_history),
            ),
            cycle_room: Arc::new(tokio::sync::Mutex::new(CycleRoom::new(cfg.parking))),
            work_ready: Notify::new(),
            wake: Notify::new(),
            minter: SequenceMinter::default(),
            source,
            publisher,
            metrics,
            readiness,
            ready: AtomicBool::new(false),
            listed_at: AtomicI64::new(0),
            removals_held: AtomicU64::new(0),
            cycle: AtomicU64::new(0),
            coordinator_term: AtomicI64::new(0),
            generation: AtomicU64::new(0),
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

    /// Known machines the last full provider List left out whose removal is held (0 when
    /// the Lists agree with the inventory).
    pub fn removals_held(&self) -> u64 {
        self.inner.removals_held.load(Ordering::Acquire)
    }

    /// Decision cycles completed so far (0 before the first).
    pub fn cycle_count(&self) -> u64 {
        self.inner.cycle.load(Ordering::Acquire)
    }

    /// Latched after the first successful reconcile; never waits for the coordinator.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    pub(crate) fn now(&self) -> i64 {
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

    /// Inventory counts for reports: the machines this shard owns (ADR-0128), so
    /// the coordinator's rebalancer sees each shard's own supply.
    pub async fn summary(&self) -> SummaryView {
        debug_assert_eq!(
            crate::locks::tracked_held(),
            0,
            "inventory is the outermost lock"
        );
        let owned = self.ownership();
        SummaryView {
            inventory: self.inner.inventory.read().await.summary_owned(&owned),
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
        self.inner.intake.lock().needs.len()
    }

    /// One cluster's demand in force, in roll-up order (empty when it has none).
    pub fn cluster_needs(&self, cluster: &str) -> Vec<bigfleet_model::Need> {
        self.inner.intake.lock().needs.needs_of(cluster).to_vec()
    }

    /// Distinct resource names over every cluster's demand in force.
    pub fn demand_dimensions(&self) -> usize {
        self.inner.intake.lock().needs.dimensions()
    }

    /// Clusters with a live session.
    pub fn connected_clusters(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.intake.lock().sessions.keys().cloned().collect();
        v.sort();
        v
    }

    /// Actions queued / in flight.
    pub fn action_counts(&self) -> (usize, usize) {
        let w = self.inner.work.lock();
        (w.ledger.queue_len(), w.ledger.inflight_len())
    }

    /// A copy of one machine.
    pub async fn machine(&self, id: &str) -> Option<Machine> {
        self.inner.inventory.read().await.get(id)
    }

    /// Machines per state.
    pub async fn machines_by_state(&self) -> BTreeMap<MachineState, u64> {
        self.inner.inventory.read().await.summary().by_state
    }

    pub(crate) fn epoch_i64(&self) -> i64 {
        i64::try_from(self.epoch()).unwrap_or(i64::MAX)
    }
}
