//! The gateway's Prometheus metrics. Names follow the shard catalogue of the original
//! (`bigfleet_shard_*`, `docs/metrics.md`) where it has one; the rest share the prefix
//! because the gateway is part of the shard. A name is exported by one container of the shard
//! pod only (docs/metrics.md, checked by `tests/metrics_doc.rs`): where decide or execute keeps
//! the catalog name, the gateway's own measurement is `bigfleet_shard_gateway_*`.

use bigfleet_telemetry::{LATENCY_BUCKETS, MetricsRegistry, TelemetryError};
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

/// Lifecycle event labels of `bigfleet_shard_session_lifecycle_total`.
pub const INSTALLED: &str = "installed";
pub const REMOVED: &str = "removed";
pub const REPLACED: &str = "replaced";

/// Every metric the gateway records. Cheap to clone (handles share the series).
#[derive(Clone, Debug)]
pub struct GatewayMetrics {
    pub active_sessions: IntGauge,
    pub session_lifecycle: IntCounterVec,
    pub identity_rejected: IntCounter,
    /// Sessions refused before install, by reason (`invalid_hello`, `identity`,
    /// `max_sessions`, `decide_unavailable`, `hello_timeout`, `hello_too_large`).
    pub sessions_refused: IntCounterVec,
    pub rollups_received: IntCounter,
    pub rollups_accepted: IntCounter,
    pub rollups_quarantined: IntCounter,
    pub rollups_rejected: IntCounterVec,
    pub rollups_replaced: IntCounter,
    pub rollups_throttled: IntCounter,
    pub rollups_revalidation_skipped: IntCounter,
    pub rollup_apply_errors: IntCounter,
    pub outbox_dropped: IntCounterVec,
    pub request_bootstrap_seconds: Histogram,
    pub request_bootstrap: IntCounterVec,
    pub bootstrap_responses_unmatched: IntCounter,
    pub reclaims_sent: IntCounter,
    pub reclaim_acks: IntCounter,
}

impl GatewayMetrics {
    /// Registers every metric in `registry`.
    pub fn register(registry: &MetricsRegistry) -> Result<Self, TelemetryError> {
        Ok(Self {
            active_sessions: registry.int_gauge(
                "bigfleet_shard_active_sessions",
                "Live operator sessions at this gateway.",
            )?,
            session_lifecycle: registry.int_counter_vec(
                "bigfleet_shard_session_lifecycle_total",
                "Operator session events (installed, removed, replaced).",
                &["event"],
            )?,
            identity_rejected: registry.int_counter(
                "bigfleet_shard_session_identity_rejected_total",
                "Sessions refused because the client certificate does not name the Hello's cluster (security event).",
            )?,
            sessions_refused: registry.int_counter_vec(
                "bigfleet_shard_sessions_refused_total",
                "Session attempts refused before they were installed, by reason.",
                &["reason"],
            )?,
            rollups_received: registry.int_counter(
                "bigfleet_shard_rollups_received_total",
                "Roll-ups read from operator streams.",
            )?,
            rollups_accepted: registry.int_counter(
                "bigfleet_shard_rollups_accepted_total",
                "Roll-ups validated and applied by decide.",
            )?,
            rollups_quarantined: registry.int_counter(
                "bigfleet_shard_rollups_quarantined_total",
                "Roll-ups validated and held by decide's empty-roll-up quarantine.",
            )?,
            rollups_rejected: registry.int_counter_vec(
                "bigfleet_shard_rollups_rejected_total",
                "Roll-ups rejected whole at the trust boundary, by cluster and fixed reason (a ConvError label, cluster_mismatch or decide); the cluster keeps its previous demand.",
                &["cluster", "reason"],
            )?,
            rollups_replaced: registry.int_counter(
                "bigfleet_shard_rollups_replaced_total",
                "Queued roll-ups superseded by a newer one from the same session before processing.",
            )?,
            rollups_throttled: registry.int_counter(
                "bigfleet_shard_rollups_throttled_total",
                "Times a session's roll-up lane waited for the per-cluster rate limit.",
            )?,
            rollups_revalidation_skipped: registry.int_counter(
                "bigfleet_shard_gateway_rollups_revalidation_skipped_total",
                "Roll-ups identical to the session's last valid one, forwarded without validating them again (ADR-0113).",
            )?,
            rollup_apply_errors: registry.int_counter(
                "bigfleet_shard_rollup_apply_errors_total",
                "Valid roll-ups decide could not be reached to apply.",
            )?,
            outbox_dropped: registry.int_counter_vec(
                "bigfleet_shard_outbox_dropped_total",
                "Published frames not sent: coalesced (replaced by a newer frame with the same key), full (outbox at capacity), no_session (cluster not connected), closed (session ended with frames queued).",
                &["reason"],
            )?,
            request_bootstrap_seconds: registry.histogram(
                "bigfleet_shard_gateway_request_bootstrap_seconds",
                "BootstrapRequest round trip from the gateway to the operator and back (answered requests only; execute's bigfleet_shard_request_bootstrap_seconds times the whole call, timeouts included).",
                LATENCY_BUCKETS,
            )?,
            request_bootstrap: registry.int_counter_vec(
                "bigfleet_shard_request_bootstrap_total",
                "RequestBootstrap calls by outcome (blob, operator_error, timeout, no_session).",
                &["outcome"],
            )?,
            bootstrap_responses_unmatched: registry.int_counter(
                "bigfleet_shard_bootstrap_responses_unmatched_total",
                "Bootstrap responses dropped because no request with their id was waiting (late or unknown).",
            )?,
            reclaims_sent: registry.int_counter(
                "bigfleet_shard_reclaim_instructions_total",
                "Reclaim instructions handed to operator sessions.",
            )?,
            reclaim_acks: registry.int_counter(
                "bigfleet_shard_reclaim_acks_total",
                "Reclaim acknowledgements received from operators.",
            )?,
        })
    }

    /// Metrics in a private registry (tests, embedded use).
    pub fn unregistered() -> Self {
        Self::register(&MetricsRegistry::new()).expect("fresh registry has no name clashes")
    }

    pub(crate) fn lifecycle(&self, event: &str) {
        self.session_lifecycle.with_label_values(&[event]).inc();
    }

    pub(crate) fn refused(&self, reason: &str) {
        self.sessions_refused.with_label_values(&[reason]).inc();
    }

    pub(crate) fn dropped(&self, reason: &str, n: u64) {
        if n > 0 {
            self.outbox_dropped.with_label_values(&[reason]).inc_by(n);
        }
    }
}
