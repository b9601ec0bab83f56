//! A Prometheus registry with typed registration helpers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::core::Collector;
use prometheus::proto::MetricType;
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
    /// What was registered, vectors without children included (a gather leaves those out).
    described: Arc<Mutex<Vec<MetricDescription>>>,
}

/// One registered metric family as `docs/metrics.md` lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricDescription {
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: &'static str,
    /// Variable and constant label names, in declaration order.
    pub labels: Vec<String>,
    pub help: String,
}

fn kind_name(t: MetricType) -> &'static str {
    match t {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    }
}

impl std::fmt::Debug for MetricsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsRegistry").finish_non_exhaustive()
    }
}

/// The registry's constructors for metrics described by plain `Opts` (name and help): per
/// kind, one without labels and one labelled family, registered the same way.
macro_rules! opts_metrics {
    ($($scalar:ident: $Scalar:ident, $family:ident: $Family:ident;)+) => {
        $(
            pub fn $scalar(&self, name: &str, help: &str) -> Result<$Scalar, TelemetryError> {
                self.register($Scalar::with_opts(Opts::new(name, help))?)
            }

            pub fn $family(
                &self,
                name: &str,
                help: &str,
                labels: &[&str],
            ) -> Result<$Family, TelemetryError> {
                self.register($Family::new(Opts::new(name, help), labels)?)
            }
        )+
    };
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
        self.register_boxed(Box::new(c.clone()))?;
        Ok(c)
    }

    /// Registers a collector that cannot be cloned (it is owned by the registry).
    pub fn register_boxed(&self, c: Box<dyn Collector>) -> Result<(), TelemetryError> {
        let kinds: HashMap<String, MetricType> = c
            .collect()
            .iter()
            .map(|f| (f.name().to_owned(), f.get_field_type()))
            .collect();
        let described: Vec<MetricDescription> = c
            .desc()
            .into_iter()
            .map(|d| MetricDescription {
                name: d.fq_name.clone(),
                kind: kinds.get(&d.fq_name).copied().map_or("untyped", kind_name),
                labels: d
                    .const_label_pairs
                    .iter()
                    .map(|p| p.name().to_owned())
                    .chain(d.variable_labels.iter().cloned())
                    .collect(),
                help: d.help.clone(),
            })
            .collect();
        self.registry.register(c)?;
        self.described
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(described);
        Ok(())
    }

    /// Every metric family registered so far, sorted by name.
    pub fn described(&self) -> Vec<MetricDescription> {
        let mut v = self
            .described
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        v.sort();
        v
    }

    /// Whether a family of that name is registered.
    pub fn has(&self, name: &str) -> bool {
        self.described
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|d| d.name == name)
    }

    opts_metrics! {
        int_counter: IntCounter, int_counter_vec: IntCounterVec;
        int_gauge: IntGauge, int_gauge_vec: IntGaugeVec;
        gauge: Gauge, gauge_vec: GaugeVec;
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
    fn registrations_are_described_children_or_not() {
        let reg = MetricsRegistry::new();
        reg.int_counter_vec("b_total", "b things", &["kind", "outcome"])
            .unwrap();
        reg.histogram("a_seconds", "a time", LATENCY_BUCKETS)
            .unwrap();
        reg.gauge("c", "c level").unwrap();
        assert!(reg.int_counter("b_total", "again").is_err());
        let d = reg.described();
        let rows: Vec<_> = d
            .iter()
            .map(|d| (d.name.as_str(), d.kind, d.labels.join(","), d.help.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("a_seconds", "histogram", String::new(), "a time"),
                ("b_total", "counter", "kind,outcome".to_owned(), "b things"),
                ("c", "gauge", String::new(), "c level"),
            ]
        );
        assert!(reg.has("c") && !reg.has("d"));
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
