//! Tracing subscriber, OpenTelemetry OTLP export, Prometheus registry and the /metrics /healthz /readyz router.
