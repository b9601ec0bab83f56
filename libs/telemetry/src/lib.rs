//! Tracing subscriber, OpenTelemetry OTLP export, Prometheus registry and the /metrics /healthz /readyz router.
//!
//! * [`init`] installs the process-wide `tracing` subscriber (text or JSON to stderr,
//!   `RUST_LOG`-style filter), the W3C trace-context propagator and — only when
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set — an OpenTelemetry tracer exporting over OTLP/gRPC.
//! * [`propagation`] moves trace context in and out of HTTP headers / tonic metadata; the
//!   mesh's trace layer and clients use it so one trace spans every hop.
//! * [`MetricsRegistry`] wraps a Prometheus registry with typed registration helpers.
//! * [`OpsServer`] serves [`ops_router`]: `/metrics`, `/healthz` and `/readyz` (driven by a
//!   [`Readiness`] handle) on a plain HTTP port, until the service has drained; the router adds the `process_*` family and
//!   `bigfleet_build_info{version, git_sha, service}` ([`MetricsRegistry::register_process_metrics`])
//!   to the registry it serves, so every service exports them.
//! * [`bind_tcp`] binds every TCP listener: `[::]` dual-stack, `0.0.0.0` without IPv6.

mod listen;
mod logging;
mod metrics;
mod ops;
mod process;
pub mod propagation;

pub use listen::bind_tcp;
pub use logging::{
    LogArgs, LogFormat, MAX_ECHOED_CHARS, OTEL_ENDPOINT_ENV, OTEL_FILTER_ENV, TelemetryConfig,
    TelemetryGuard, clip, init,
};
pub use metrics::{LATENCY_BUCKETS, MetricDescription, MetricsRegistry, id_label};
pub use ops::{OpsServer, Readiness, ops_router};
pub use process::{BUILD_INFO, GIT_SHA, VERSION, service_name, set_service_name};

/// Errors setting up telemetry or registering metrics.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter {filter:?}: {reason}")]
    Filter { filter: String, reason: String },
    #[error("a global tracing subscriber is already installed")]
    AlreadyInitialised,
    #[error("otlp exporter: {0}")]
    Otlp(String),
    #[error("metric registration: {0}")]
    Metrics(#[from] prometheus::Error),
}
