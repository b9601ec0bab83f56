//! A Prometheus registry with typed registration helpers.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::TelemetryError;

/// Latency buckets in seconds for RPC and cycle histograms: 0.5 ms to 10 s, dense where the
/// hot paths live (sub-10 ms decisions, tens-of-ms provider calls).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One registry per process, cloned into every component that owns metrics. Cloning is
/// cheap (the underlying registry is shared). Registering the same name twice is an error —
/// create each metric once and pass the handle around.
#[derive(Clone, Default)]
pub struct MetricsRegistry {
    registry: Registry,
}

impl std::fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsRegistry").finish_non_exhaustive()
    }
}

impl MetricsRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The underlying registry, for collectors these helpers do not cover.
    pub fn prometheus(&self) -> &Registry {
        &self.registry
    }

    /// Registers any collector and hands it back.
    pub fn register<C: Collector + Clone + 'static>(&self, c: C) -> Result<C, TelemetryError> {
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    pub fn int_counter(&self, name: &str, help: &str) -> Result<IntCounter, TelemetryError> {
        self.register(IntCounter::with_opts(Opts::new(name, help))?)
    }

    pub fn int_counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, TelemetryError> {
        self.register(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    pub fn int_gauge(&self, name: &str, help: &str) -> Result<IntGauge, TelemetryError> {
        self.register(IntGauge::with_opts(Opts::new(name, help))?)
    }

    pub fn int_gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, TelemetryError> {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    pub fn gauge(&self, name: &str, help: &str) -> Result<Gauge, TelemetryError> {
        self.register(Gauge::with_opts(Opts::new(name, help))?)
    }

    pub fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<GaugeVec, TelemetryError> {
        self.register(GaugeVec::new(Opts::new(name, help), labels)?)
    }

    pub fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
    ) -> Result<Histogram, TelemetryError> {
        self.register(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        )?)
    }

    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> Result<HistogramVec, TelemetryError> {
        self.register(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            labels,
        )?)
    }

    /// Everything registered, in the Prometheus text exposition format.
    pub fn encode_text(&self) -> Result<String, TelemetryError> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        // The text encoder only writes UTF-8 (names are validated, values are numbers).
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_show_up_in_the_text_format() {
        let reg = MetricsRegistry::new();
        let c = reg
            .int_counter_vec("rollups_total", "roll-ups by outcome", &["outcome"])
            .unwrap();
        c.with_label_values(&["accepted"]).inc_by(3);
        let g = reg.int_gauge("sessions_active", "open sessions").unwrap();
        g.set(7);
        let h = reg
            .histogram("cycle_seconds", "cycle time", LATENCY_BUCKETS)
            .unwrap();
        h.observe(0.003);
        let text = reg.encode_text().unwrap();
        assert!(
            text.contains("rollups_total{outcome=\"accepted\"} 3"),
            "{text}"
        );
        assert!(text.contains("sessions_active 7"), "{text}");
        assert!(
            text.contains("cycle_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cycle_seconds_bucket{le=\"0.0025\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("# HELP sessions_active open sessions"),
            "{text}"
        );
    }

    #[test]
    fn duplicate_names_are_refused() {
        let reg = MetricsRegistry::new();
        reg.int_counter("x_total", "x").unwrap();
        assert!(matches!(
            reg.int_counter("x_total", "x"),
            Err(TelemetryError::Metrics(_))
        ));
        assert!(reg.int_counter("bad name", "x").is_err());
    }

    #[test]
    fn clones_share_one_registry() {
        let reg = MetricsRegistry::new();
        let other = reg.clone();
        other.gauge("temperature", "t").unwrap().set(1.5);
        assert!(reg.encode_text().unwrap().contains("temperature 1.5"));
    }
}

/// The label value for a caller-supplied id that has not passed validation: the id itself
/// when it is short, printable ASCII without quoting characters, otherwise `"invalid"`.
/// Keeps attacker-chosen strings (and the series they would create) out of metric labels.
pub fn id_label(id: &str) -> &str {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok { id } else { "invalid" }
}

#[cfg(test)]
mod id_label_tests {
    use super::id_label;

    #[test]
    fn only_plain_short_ids_become_labels() {
        assert_eq!(id_label("cluster-a_1.x"), "cluster-a_1.x");
        for bad in ["", "a\"b", "a b", "x\n", &"y".repeat(64), "a/b"] {
            assert_eq!(id_label(bad), "invalid", "{bad:?}");
        }
    }
}
