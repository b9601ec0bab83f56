//! The shard metric catalog (`docs/metrics.md`; names as the original's), registered once
//! per process.

use bigfleet_telemetry::{MetricsRegistry, TelemetryError};
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

/// 1 ms doubling up to ~16 s, plus 50, 75, 100, 150 and 200 ms: the cycle SLO (p99 ≤ 100
/// ms at 10,000 clusters) is a bucket bound, and quantiles near it are not smeared over a
/// 64–128 ms bucket.
fn cycle_buckets() -> Vec<f64> {
    let mut b: Vec<f64> = (0..15).map(|i| 0.001 * f64::from(1u32 << i)).collect();
    b.extend([0.05, 0.075, 0.1, 0.15, 0.2]);
    b.sort_by(f64::total_cmp);
    b
}

/// 10 ms doubling up to ~5.5 min: machine-lifecycle latencies.
fn lifecycle_buckets() -> Vec<f64> {
    (0..16).map(|i| 0.01 * f64::from(1u32 << i)).collect()
}

/// A phase of the cycle: the `phase` label of `bigfleet_shard_cycle_phase_duration_seconds`.
/// The one list of them, so the cycle that observes them and the benchmarks that read them
/// back cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CyclePhase {
    Reconcile,
    Snapread,
    Engine,
    Ledgers,
    Emit,
    Execute,
    /// Publishing the verdict table once the actions are enqueued (ADR-0134): after the
    /// cycle proper, outside `bigfleet_shard_cycle_duration_seconds`.
    Verdicts,
}

impl CyclePhase {
    /// Every phase, in the order a cycle runs them.
    pub const ALL: [CyclePhase; 7] = [
        CyclePhase::Reconcile,
        CyclePhase::Snapread,
        CyclePhase::Engine,
        CyclePhase::Ledgers,
        CyclePhase::Emit,
        CyclePhase::Execute,
        CyclePhase::Verdicts,
    ];

    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            CyclePhase::Reconcile => "reconcile",
            CyclePhase::Snapread => "snapread",
            CyclePhase::Engine => "engine",
            CyclePhase::Ledgers => "ledgers",
            CyclePhase::Emit => "emit",
            CyclePhase::Execute => "execute",
            CyclePhase::Verdicts => "verdicts",
        }
    }
}

/// Every shard metric decide owns. Cheap to clone (handles are shared).
#[derive(Clone)]
pub struct ShardMetrics {
    pub cycle_duration: Histogram,
    pub cycle_phase_duration: HistogramVec,
    pub provisioning_latency: Histogram,
    pub configure_phase: Histogram,
    pub drain_phase: Histogram,
    pub inventory_machines: IntGaugeVec,
    pub demand_machines: IntGaugeVec,
    pub shortfalls: IntGauge,
    pub shortfalls_aged: IntGaugeVec,
    pub actions_total: IntCounterVec,
    pub action_execute_outcomes: IntCounterVec,
    pub actions_deferred: IntCounter,
    pub actions_dropped: IntCounter,
    pub actions_deduped: IntCounter,
    pub action_queue_depth: IntGauge,
    pub execute_inflight: IntGauge,
    pub reclaims_capped: IntCounter,
    pub rollup_quarantined: IntGaugeVec,
    pub actions_suppressed: IntCounterVec,
    pub actuation_paused: IntGauge,
    pub actions_dryrun: IntCounterVec,
    pub idle_releases: IntCounter,
    pub machines_rejected: IntCounterVec,
    pub rollups_rejected: IntCounterVec,
    pub rollups_superseded: IntCounter,
    pub rollups_unchanged: IntCounter,
    pub cycle_wakeups: IntCounterVec,
    pub demand_to_decision: Histogram,
    pub removals_held: IntGauge,
    pub active_sessions: IntGauge,
    pub session_lifecycle: IntCounterVec,
    // Decide-specific (not in the reference catalog).
    pub cycles_total: IntCounter,
    pub reconcile_errors: IntCounter,
    pub retries_exhausted: IntCounter,
    pub inventory_age: prometheus::Gauge,
    pub actions_held_stale: IntCounterVec,
    pub events_dropped: IntCounter,
    pub work_streams: IntGauge,
}

impl ShardMetrics {
    pub fn register(r: &MetricsRegistry) -> Result<Self, TelemetryError> {
        let m = ShardMetrics {
            cycle_duration: r.histogram(
                "bigfleet_shard_cycle_duration_seconds",
                "Duration of one decision cycle.",
                &cycle_buckets(),
            )?,
            cycle_phase_duration: r.histogram_vec(
                "bigfleet_shard_cycle_phase_duration_seconds",
                "Duration of each phase of a cycle: reconcile, snapread, engine, ledgers, emit, execute; then verdicts (publishing the verdict table once the actions are enqueued, outside bigfleet_shard_cycle_duration_seconds).",
                &["phase"],
                &cycle_buckets(),
            )?,
            provisioning_latency: r.histogram(
                "bigfleet_shard_provisioning_latency_seconds",
                "First roll-up sighting of a (cluster, fingerprint) to a machine Configured for it.",
                &lifecycle_buckets(),
            )?,
            configure_phase: r.histogram(
                "bigfleet_shard_configure_phase_seconds",
                "Idle->Configuring to Configured.",
                &lifecycle_buckets(),
            )?,
            drain_phase: r.histogram(
                "bigfleet_shard_drain_phase_seconds",
                "Configured->Draining to Idle.",
                &lifecycle_buckets(),
            )?,
            inventory_machines: r.int_gauge_vec(
                "bigfleet_shard_inventory_machines",
                "Machines in the inventory.",
                &["state", "capacity_type", "interruption_penalty_bucket"],
            )?,
            demand_machines: r.int_gauge_vec(
                "bigfleet_shard_demand_machines",
                "Need rows per interruption penalty bucket.",
                &["interruption_penalty_bucket"],
            )?,
            shortfalls: r.int_gauge("bigfleet_shard_shortfalls", "Unresolved shortfalls.")?,
            shortfalls_aged: r.int_gauge_vec(
                "bigfleet_shard_shortfalls_aged",
                "Unresolved shortfalls by seconds unresolved.",
                &["bucket"],
            )?,
            actions_total: r.int_counter_vec(
                "bigfleet_shard_actions_total",
                "Actions emitted for execution.",
                &["kind"],
            )?,
            action_execute_outcomes: r.int_counter_vec(
                "bigfleet_shard_decide_action_outcomes_total",
                "Actions decide saw finish, by kind and the outcome the worker reported (abandoned: the worker went away).",
                &["kind", "outcome"],
            )?,
            actions_deferred: r.int_counter(
                "bigfleet_shard_actions_deferred_total",
                "Actions cut by --max-actions-per-cycle.",
            )?,
            actions_dropped: r.int_counter(
                "bigfleet_shard_actions_dropped_total",
                "Actions dropped because the action queue was full.",
            )?,
            actions_deduped: r.int_counter(
                "bigfleet_shard_actions_deduped_total",
                "Actions skipped: already in flight or no longer applicable.",
            )?,
            action_queue_depth: r.int_gauge(
                "bigfleet_shard_action_queue_depth",
                "Actions waiting for a worker.",
            )?,
            execute_inflight: r.int_gauge(
                "bigfleet_shard_execute_inflight",
                "Actions handed to workers and not yet done.",
            )?,
            reclaims_capped: r.int_counter(
                "bigfleet_shard_reclaims_capped_total",
                "Reclaims deferred by the per-cluster reclaim budget over wall-clock time.",
            )?,
            rollup_quarantined: r.int_gauge_vec(
                "bigfleet_shard_rollup_quarantined",
                "Consecutive held roll-ups per cluster.",
                &["cluster"],
            )?,
            actions_suppressed: r.int_counter_vec(
                "bigfleet_shard_actions_suppressed_total",
                "Actions suppressed by the kill switch.",
                &["kind"],
            )?,
            actuation_paused: r.int_gauge(
                "bigfleet_shard_actuation_paused",
                "1 while the kill switch is on.",
            )?,
            actions_dryrun: r.int_counter_vec(
                "bigfleet_shard_actions_dryrun_total",
                "Actions reported but not executed in dry-run mode.",
                &["kind"],
            )?,
            idle_releases: r.int_counter(
                "bigfleet_shard_idle_releases_total",
                "Idle machines released back to Speculative.",
            )?,
            machines_rejected: r.int_counter_vec(
                "bigfleet_shard_machines_rejected_total",
                "Provider records rejected at ingest.",
                &["reason"],
            )?,
            rollups_rejected: r.int_counter_vec(
                "bigfleet_shard_decide_rollups_rejected_total",
                "Roll-ups rejected at decide's ingest, by cluster and fixed reason (a ConvError label); the gateway's bigfleet_shard_rollups_rejected_total counts these too, as reason decide or the reason decide gave.",
                &["cluster", "reason"],
            )?,
            removals_held: r.int_gauge(
                "bigfleet_shard_removals_held",
                "Machines the last full provider List left out whose removal is held (a possible provider restart, truncated answer or unattributable record).",
            )?,
            rollups_superseded: r.int_counter(
                "bigfleet_shard_rollups_superseded_total",
                "Roll-ups dropped because a newer session of the same cluster replaced the one that sent them.",
            )?,
            rollups_unchanged: r.int_counter(
                "bigfleet_shard_rollups_unchanged_total",
                "Roll-ups identical to the demand in force (same fingerprint): answered without applying demand or waking a cycle.",
            )?,
            cycle_wakeups: r.int_counter_vec(
                "bigfleet_shard_cycle_wakeups_total",
                "Requests for an early cycle, by cause (rollup: demand changed; abandoned: a worker went away; follow_up: a truncated cycle). Wake-ups within --wake-interval fold into one cycle.",
                &["cause"],
            )?,
            demand_to_decision: r.histogram(
                "bigfleet_shard_demand_to_decision_seconds",
                "From accepting a roll-up that changed a cluster's demand to the end of the first cycle that decided on it (one sample per cluster per cycle, from its earliest change).",
                &cycle_buckets(),
            )?,
            active_sessions: r.int_gauge(
                "bigfleet_shard_decide_active_sessions",
                "Operator sessions decide knows to be live (the gateway's count is bigfleet_shard_active_sessions).",
            )?,
            session_lifecycle: r.int_counter_vec(
                "bigfleet_shard_decide_session_lifecycle_total",
                "Session events decide received from the gateway (the gateway's count is bigfleet_shard_session_lifecycle_total).",
                &["event"],
            )?,
            cycles_total: r.int_counter("bigfleet_shard_cycles_total", "Decision cycles run.")?,
            retries_exhausted: r.int_counter(
                "bigfleet_shard_phase1_occ_retries_exhausted_total",
                "Needs with demand that Phase 1 committed nothing to while matching supply existed, held by others (contention-bound, not catalog-bound, unsatisfied); counted per cycle (ADR-0118).",
            )?,
            inventory_age: r.gauge(
                "bigfleet_shard_inventory_age_seconds",
                "Seconds since the provider List the last cycle decided on succeeded; grows while Lists fail (ADR-0118).",
            )?,
            actions_held_stale: r.int_counter_vec(
                "bigfleet_shard_actions_held_stale_total",
                "Actions a cycle on stale inventory (provider List failing) held back: everything but Bootstrap and Provision (ADR-0118).",
                &["kind"],
            )?,
            reconcile_errors: r.int_counter(
                "bigfleet_shard_reconcile_errors_total",
                "Failed provider reconciles (the cycle skips deciding).",
            )?,
            events_dropped: r.int_counter(
                "bigfleet_shard_events_dropped_total",
                "Session frames dropped before reaching the gateway.",
            )?,
            work_streams: r.int_gauge(
                "bigfleet_shard_work_streams",
                "Connected execute-worker streams.",
            )?,
        };
        Ok(m)
    }

    /// A private registry, for tests and embedded use.
    pub fn unregistered() -> Self {
        Self::register(&MetricsRegistry::new()).expect("fresh registry")
    }
}

#[cfg(test)]
mod bucket_tests {
    #[test]
    fn cycle_buckets_rise_and_hold_the_slo_bound() {
        let b = super::cycle_buckets();
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        assert!(b.contains(&0.1), "{b:?}");
        assert_eq!(b.len(), 20);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The original's metric catalog (docs/metrics.md lists it) minus the OCC / dead metrics of the
    /// reference engine and the names another container of the shard pod exports
    /// (one name per meaning per pod, docs/metrics.md): the gateway's session and
    /// roll-up rejection counters, execute's outcome counter and bootstrap round trip.
    const CATALOG: &[&str] = &[
        "bigfleet_shard_cycle_duration_seconds",
        "bigfleet_shard_cycle_phase_duration_seconds",
        "bigfleet_shard_provisioning_latency_seconds",
        "bigfleet_shard_configure_phase_seconds",
        "bigfleet_shard_drain_phase_seconds",
        "bigfleet_shard_inventory_machines",
        "bigfleet_shard_demand_machines",
        "bigfleet_shard_shortfalls",
        "bigfleet_shard_shortfalls_aged",
        "bigfleet_shard_actions_total",
        "bigfleet_shard_actions_deferred_total",
        "bigfleet_shard_actions_dropped_total",
        "bigfleet_shard_actions_deduped_total",
        "bigfleet_shard_action_queue_depth",
        "bigfleet_shard_execute_inflight",
        "bigfleet_shard_reclaims_capped_total",
        "bigfleet_shard_rollup_quarantined",
        "bigfleet_shard_actions_suppressed_total",
        "bigfleet_shard_actuation_paused",
        "bigfleet_shard_actions_dryrun_total",
        "bigfleet_shard_idle_releases_total",
        "bigfleet_shard_machines_rejected_total",
        "bigfleet_shard_rollups_superseded_total",
        "bigfleet_shard_removals_held",
    ];

    #[test]
    fn the_catalog_is_registered_under_its_reference_names() {
        let registry = MetricsRegistry::new();
        let m = ShardMetrics::register(&registry).unwrap();
        // Label vectors only show up once a child exists.
        m.cycle_phase_duration
            .with_label_values(&[CyclePhase::Engine.as_str()])
            .observe(0.1);
        m.inventory_machines
            .with_label_values(&["idle", "x", "y"])
            .set(1);
        m.demand_machines.with_label_values(&["b"]).set(1);
        m.shortfalls_aged.with_label_values(&["1-9"]).set(1);
        m.actions_total.with_label_values(&["Reclaim"]).inc();
        m.action_execute_outcomes
            .with_label_values(&["Reclaim", "success"])
            .inc();
        m.rollup_quarantined.with_label_values(&["c"]).set(1);
        m.actions_suppressed.with_label_values(&["Reclaim"]).inc();
        m.actions_dryrun.with_label_values(&["Reclaim"]).inc();
        m.machines_rejected.with_label_values(&["price"]).inc();
        m.rollups_rejected
            .with_label_values(&["c", "limit_needs"])
            .inc();
        m.session_lifecycle.with_label_values(&["installed"]).inc();
        let names: BTreeSet<String> = registry
            .prometheus()
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        let missing: Vec<_> = CATALOG.iter().filter(|n| !names.contains(**n)).collect();
        assert!(missing.is_empty(), "not registered: {missing:?}");
        let text = registry.encode_text().unwrap();
        assert!(text.contains("bigfleet_shard_cycle_duration_seconds_bucket{le=\"0.001\"}"));
        assert!(text.contains("bigfleet_shard_cycle_duration_seconds_bucket{le=\"16.384\"}"));
        // A second registration of the same catalog is refused, not duplicated.
        assert!(ShardMetrics::register(&registry).is_err());
    }
}
