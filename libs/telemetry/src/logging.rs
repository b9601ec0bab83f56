//! Process-wide tracing subscriber and the optional OpenTelemetry tracer.

use std::str::FromStr;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::TelemetryError;

/// The standard OTLP endpoint variable; export is on iff it is set and non-empty.
pub const OTEL_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Filter for what becomes OpenTelemetry spans (default `info`), independent of `RUST_LOG`
/// so quieting the logs does not silently cut traces.
pub const OTEL_FILTER_ENV: &str = "BIGFLEET_OTEL_FILTER";

/// Targets never turned into OTel spans: the transport stack underneath every RPC —
/// including the OTLP exporter's own requests, which would otherwise trace themselves.
const OTEL_NOISE: &str = "h2=off,hyper=off,hyper_util=off,tonic=off,tower=off,\
                          opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off";

/// Log line format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {other:?} (expected text or json)"
            )),
        }
    }
}

/// Logging flags shared by every binary (`#[command(flatten)] log: LogArgs`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log format on stderr; the filter comes from RUST_LOG (default info).
    #[arg(long = "log-format", env = "BIGFLEET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Everything [`init`] needs; build it with [`TelemetryConfig::from_env`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `service.name` of exported spans (e.g. `bigfleet-shard-decide`).
    pub service_name: String,
    pub log_format: LogFormat,
    /// `RUST_LOG` syntax.
    pub log_filter: String,
    /// OTLP/gRPC collector endpoint, e.g. `http://otel-collector:4317`; `None` ⇒ no export.
    pub otlp_endpoint: Option<String>,
    /// `RUST_LOG` syntax, for the OTel layer only.
    pub otel_filter: String,
}

impl TelemetryConfig {
    /// Reads `RUST_LOG`, `OTEL_EXPORTER_OTLP_ENDPOINT` and `BIGFLEET_OTEL_FILTER`.
    pub fn from_env(service_name: &str, log_format: LogFormat) -> Self {
        Self::from_lookup(service_name, log_format, |k| std::env::var(k).ok())
    }

    /// As [`TelemetryConfig::from_env`] with an injected environment (for tests).
    pub fn from_lookup(
        service_name: &str,
        log_format: LogFormat,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Self {
        let non_empty = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        Self {
            service_name: service_name.to_owned(),
            log_format,
            log_filter: non_empty("RUST_LOG").unwrap_or_else(|| "info".to_owned()),
            otlp_endpoint: non_empty(OTEL_ENDPOINT_ENV),
            otel_filter: non_empty(OTEL_FILTER_ENV).unwrap_or_else(|| "info".to_owned()),
        }
    }
}

/// Keeps the tracer provider alive; dropping it flushes and shuts the exporter down.
///
/// Drop it (or call [`TelemetryGuard::shutdown`]) before the tokio runtime ends, on a
/// multi-threaded runtime: the exporter needs the runtime's I/O driver to send the last batch.
#[derive(Debug)]
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes pending spans and stops the exporter.
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    fn shutdown_inner(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("opentelemetry shutdown: {e}");
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}

fn filter(spec: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::try_new(spec).map_err(|e| TelemetryError::Filter {
        filter: spec.to_owned(),
        reason: e.to_string(),
    })
}

/// Colour only for a person at a terminal: a log redirected to a file (`bigfleet up`'s child
/// logs, a container's log stream) must carry no escape sequences, and `NO_COLOR` (any value)
/// turns it off everywhere (no-color.org).
pub fn use_colour(stderr_is_terminal: bool, no_color_set: bool) -> bool {
    stderr_is_terminal && !no_color_set
}

/// Installs the global subscriber, the W3C propagator and, if configured, the OTLP tracer.
/// Call once, early in `main`, inside the tokio runtime (the OTLP exporter's channel is
/// created on it).
pub fn init(cfg: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    // The `service` label of `bigfleet_build_info` on this process's /metrics.
    crate::set_service_name(&cfg.service_name);
    // Always installed, so libraries using the global propagator speak the same W3C
    // `traceparent` as our own helpers even when export is off.
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());

    let fmt_filter = filter(&cfg.log_filter)?;
    let fmt_layer = match cfg.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(use_colour(
                std::io::IsTerminal::is_terminal(&std::io::stderr()),
                std::env::var_os("NO_COLOR").is_some(),
            ))
            .with_writer(std::io::stderr)
            .with_filter(fmt_filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(fmt_filter)
            .boxed(),
    };

    let (otel_layer, provider) = match &cfg.otlp_endpoint {
        None => (None, None),
        Some(endpoint) => {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(TelemetryError::Otlp(
                    "otlp export must be initialised inside the tokio runtime".to_owned(),
                ));
            }
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| TelemetryError::Otlp(e.to_string()))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name(cfg.service_name.clone())
                        .build(),
                )
                .build();
            opentelemetry::global::set_tracer_provider(provider.clone());
            let tracer = provider.tracer(cfg.service_name.clone());
            let otel_filter = filter(&format!("{},{OTEL_NOISE}", cfg.otel_filter))?;
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(otel_filter);
            (Some(layer), Some(provider))
        }
    };

    tracing_subscriber::registry()
        .with(fmt_layer)
        .with(otel_layer)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInitialised)?;
    if let Some(endpoint) = &cfg.otlp_endpoint {
        tracing::info!(endpoint = %endpoint, service = %cfg.service_name, "exporting traces over otlp");
    }
    Ok(TelemetryGuard { provider })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(env: &[(&str, &str)]) -> TelemetryConfig {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        TelemetryConfig::from_lookup("svc", LogFormat::Json, |k| env.get(k).cloned())
    }

    #[test]
    fn export_is_off_unless_the_endpoint_is_set() {
        let c = cfg(&[]);
        assert_eq!(c.otlp_endpoint, None);
        assert_eq!(c.log_filter, "info");
        assert_eq!(c.otel_filter, "info");
        assert_eq!(cfg(&[(OTEL_ENDPOINT_ENV, "  ")]).otlp_endpoint, None);
        let c = cfg(&[
            (OTEL_ENDPOINT_ENV, "http://collector:4317"),
            ("RUST_LOG", "warn,bigfleet=debug"),
            (OTEL_FILTER_ENV, "debug"),
        ]);
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://collector:4317"));
        assert_eq!(c.log_filter, "warn,bigfleet=debug");
        assert_eq!(c.otel_filter, "debug");
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn log_format_parses() {
        assert_eq!("JSON".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("text".parse::<LogFormat>().unwrap(), LogFormat::Text);
        assert!("xml".parse::<LogFormat>().is_err());
    }

    #[test]
    fn bad_filters_are_reported_not_ignored() {
        let mut c = cfg(&[]);
        c.log_filter = "=[".to_owned();
        assert!(matches!(init(&c), Err(TelemetryError::Filter { .. })));
    }

    #[test]
    fn otlp_needs_a_runtime() {
        let c = cfg(&[(OTEL_ENDPOINT_ENV, "http://127.0.0.1:1")]);
        assert!(matches!(init(&c), Err(TelemetryError::Otlp(_))));
    }
}

/// Longest caller-supplied string written verbatim into a log line or an error message.
pub const MAX_ECHOED_CHARS: usize = 128;

/// A caller-supplied string as it may appear in logs and error frames: at most
/// [`MAX_ECHOED_CHARS`] characters, control characters replaced, and the original length
/// noted when cut. An attacker-sized id must not become an attacker-sized log line (or a
/// terminal escape sequence in somebody's log viewer).
pub fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    let clean = |c: char| if c.is_control() { '\u{fffd}' } else { c };
    let short = s.chars().count() <= MAX_ECHOED_CHARS;
    if short && !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out: String = s.chars().take(MAX_ECHOED_CHARS).map(clean).collect();
    if !short {
        out.push_str(&format!("…({} bytes)", s.len()));
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod clip_tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, false));
        assert!(!use_colour(false, false), "a file or pipe gets no escapes");
        assert!(!use_colour(true, true), "NO_COLOR wins");
    }

    #[test]
    fn short_clean_strings_pass_untouched() {
        assert!(matches!(
            clip("cluster-a"),
            std::borrow::Cow::Borrowed("cluster-a")
        ));
    }

    #[test]
    fn long_strings_are_cut_and_say_how_long_they_were() {
        let long = "x".repeat(10_000);
        let c = clip(&long);
        assert!(c.chars().count() < MAX_ECHOED_CHARS + 30, "{}", c.len());
        assert!(c.ends_with("…(10000 bytes)"));
    }

    #[test]
    fn control_characters_never_reach_the_log() {
        let c = clip("a\u{1b}[31mred\n");
        assert!(!c.chars().any(char::is_control), "{c:?}");
    }
}
