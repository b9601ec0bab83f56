//! The worker's Prometheus metrics (names as in `docs/metrics.md`). A name is exported by
//! one container of the shard pod only (docs/metrics.md): where decide keeps the catalog name
//! (in-flight ledger, phase histograms over every machine), the worker's own measurement is
//! `bigfleet_shard_execute_*`.

use bigfleet_model::ActionKind;
use bigfleet_telemetry::{MetricsRegistry, TelemetryError};
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

use crate::outcome::Outcome;

/// Phase durations run from milliseconds (instant providers) to the length
/// of a PDB-bound drain, so the buckets reach well past the action timeout.
pub const PHASE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// The `kind` label: the original's action kind names.
pub fn kind_label(kind: Option<ActionKind>) -> &'static str {
    match kind {
        Some(ActionKind::Bootstrap) => "Bootstrap",
        Some(ActionKind::Provision) => "Provision",
        Some(ActionKind::Reclaim) => "Reclaim",
        Some(ActionKind::Preempt) => "Preempt",
        Some(ActionKind::Release) => "Delete",
        None => "Unspecified",
    }
}

/// Handles to every metric of one worker pool.
#[derive(Clone, Debug)]
pub struct ExecuteMetrics {
    /// `bigfleet_shard_execute_pool_inflight` (decide's ledger is `bigfleet_shard_execute_inflight`).
    pub inflight: IntGauge,
    /// `bigfleet_shard_action_execute_outcomes_total{kind,outcome}`.
    pub outcomes: IntCounterVec,
    /// `bigfleet_shard_execute_configure_phase_seconds`: Idle→Configuring to Configured.
    pub configure_phase: Histogram,
    /// `bigfleet_shard_request_bootstrap_seconds`: the blob round trip.
    pub request_bootstrap: Histogram,
    /// `bigfleet_shard_execute_drain_phase_seconds`: Configured→Draining to Idle.
    pub drain_phase: Histogram,
    /// `bigfleet_shard_execute_provider_retries_total{rpc}`: re-stamped retries.
    pub provider_retries: IntCounterVec,
    /// `bigfleet_shard_execute_stream_reconnects_total`: Work streams re-opened.
    pub stream_reconnects: IntCounter,
}

impl ExecuteMetrics {
    pub fn register(registry: &MetricsRegistry) -> Result<Self, TelemetryError> {
        Ok(Self {
            inflight: registry.int_gauge(
                "bigfleet_shard_execute_pool_inflight",
                "Actions this worker pool is running (decide's bigfleet_shard_execute_inflight counts every pool's).",
            )?,
            outcomes: registry.int_counter_vec(
                "bigfleet_shard_action_execute_outcomes_total",
                "Executed actions by kind and classified outcome.",
                &["kind", "outcome"],
            )?,
            configure_phase: registry.histogram(
                "bigfleet_shard_execute_configure_phase_seconds",
                "Idle→Configuring to Configured inside a bootstrap this worker ran, when the provider configures synchronously (decide's bigfleet_shard_configure_phase_seconds sees every machine).",
                PHASE_BUCKETS,
            )?,
            request_bootstrap: registry.histogram(
                "bigfleet_shard_request_bootstrap_seconds",
                "Bootstrap blob round trip through the gateway.",
                PHASE_BUCKETS,
            )?,
            drain_phase: registry.histogram(
                "bigfleet_shard_execute_drain_phase_seconds",
                "Configured→Draining to Idle inside a drain this worker ran, when the provider drains synchronously (decide's bigfleet_shard_drain_phase_seconds sees every machine).",
                PHASE_BUCKETS,
            )?,
            provider_retries: registry.int_counter_vec(
                "bigfleet_shard_execute_provider_retries_total",
                "Provider calls retried (re-stamped) after a retryable error.",
                &["rpc"],
            )?,
            stream_reconnects: registry.int_counter(
                "bigfleet_shard_execute_stream_reconnects_total",
                "Work streams to decide opened after the first.",
            )?,
        })
    }

    /// Metrics in a private registry, for tests and tools that do not export.
    pub fn detached() -> Self {
        Self::register(&MetricsRegistry::new()).expect("a fresh registry has no name clashes")
    }

    pub fn count(&self, kind: Option<ActionKind>, outcome: Outcome) {
        self.outcomes
            .with_label_values(&[kind_label(kind), outcome.as_str()])
            .inc();
    }

    pub fn outcome_count(&self, kind: Option<ActionKind>, outcome: Outcome) -> u64 {
        self.outcomes
            .with_label_values(&[kind_label(kind), outcome.as_str()])
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_the_reference_names() {
        let registry = MetricsRegistry::new();
        let m = ExecuteMetrics::register(&registry).unwrap();
        m.count(Some(ActionKind::Release), Outcome::Fenced);
        m.inflight.set(3);
        m.drain_phase.observe(0.2);
        let text = registry.encode_text().unwrap();
        for needle in [
            "bigfleet_shard_execute_pool_inflight 3",
            "bigfleet_shard_action_execute_outcomes_total{kind=\"Delete\",outcome=\"fenced\"} 1",
            "bigfleet_shard_execute_drain_phase_seconds_count 1",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        assert_eq!(
            m.outcome_count(Some(ActionKind::Release), Outcome::Fenced),
            1
        );
        // A second pool in the same registry would clash: each pool owns its registry.
        assert!(ExecuteMetrics::register(&registry).is_err());
    }
}
