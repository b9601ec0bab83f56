//! Prometheus metrics of the fake provider (`--metrics-addr`).

use std::time::Duration;

use bigfleet_telemetry::{LATENCY_BUCKETS, MetricsRegistry, TelemetryError};
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use crate::FakeProvider;

/// Handles to every metric; clones share them.
#[derive(Clone)]
pub struct ProviderMetrics {
    requests: IntCounterVec,
    list_machines: IntCounter,
    list_seconds: Histogram,
    machines: IntGaugeVec,
    revision: IntGauge,
    fence_marks: IntGauge,
}

impl ProviderMetrics {
    pub fn register(registry: &MetricsRegistry) -> Result<Self, TelemetryError> {
        Ok(Self {
            requests: registry.int_counter_vec(
                "bigfleet_fake_provider_requests_total",
                "provider calls by rpc and grpc status code",
                &["rpc", "code"],
            )?,
            list_machines: registry.int_counter(
                "bigfleet_fake_provider_list_machines_total",
                "machines returned by List calls",
            )?,
            list_seconds: registry.histogram(
                "bigfleet_fake_provider_list_encode_seconds",
                "time to select and encode one List answer",
                LATENCY_BUCKETS,
            )?,
            machines: registry.int_gauge_vec(
                "bigfleet_fake_provider_machines",
                "machines by state",
                &["state"],
            )?,
            revision: registry.int_gauge(
                "bigfleet_fake_provider_revision_offset",
                "mutations since the provider started (revision minus the first revision)",
            )?,
            fence_marks: registry.int_gauge(
                "bigfleet_fake_provider_fence_marks",
                "fencing high-water marks held",
            )?,
        })
    }

    pub(crate) fn observe(&self, rpc: &str, code: tonic::Code) {
        self.requests
            .with_label_values(&[rpc, &format!("{code:?}")])
            .inc();
    }

    pub(crate) fn observe_list(&self, machines: usize, took: Duration) {
        self.list_machines.inc_by(machines as u64);
        self.list_seconds.observe(took.as_secs_f64());
    }

    /// Copies the store's counts into the gauges (called periodically).
    pub fn refresh(&self, provider: &FakeProvider, first_revision: u64) {
        let stats = provider.stats();
        for (state, n) in &stats.by_state {
            self.machines.with_label_values(&[state]).set(*n as i64);
        }
        self.revision
            .set(stats.revision.saturating_sub(first_revision) as i64);
        self.fence_marks.set(stats.fence_marks as i64);
    }
}
