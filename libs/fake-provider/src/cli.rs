//! The `bigfleet-fake-provider` command line: flags ([`Args`]) and [`run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bigfleet_telemetry::{LogArgs, TelemetryConfig};

use crate::metrics::ProviderMetrics;
use crate::server::{ServeOptions, spawn_tcp_with, spawn_uds_with};
use crate::{
    Catalog, Completion, FailureRates, FailureStyle, FakeProvider, OpKind, ProviderConfig,
    TransitionModel,
};

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn rate(s: &str) -> Result<f64, String> {
    let r: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&r) {
        Ok(r)
    } else {
        Err("a failure rate must be in [0, 1]".into())
    }
}

/// Flags of `bigfleet-fake-provider` (docs/flags.md). Every flag also reads
/// `BIGFLEET_<FLAG>`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "bigfleet-fake-provider",
    about = "An in-repo bigfleet.v1alpha1.CapacityProvider for tests, the local mesh and load tests"
)]
pub struct Args {
    /// TCP address to serve gRPC on (ignored when --socket is given).
    #[arg(long, env = "BIGFLEET_LISTEN", default_value = "127.0.0.1:7800")]
    pub listen: SocketAddr,
    /// Serve on this Unix socket instead of TCP.
    #[arg(long, env = "BIGFLEET_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Seed from this JSON catalog (format in the crate docs); default: the built-in one.
    #[arg(long, env = "BIGFLEET_CATALOG", conflicts_with = "generate")]
    pub catalog: Option<PathBuf>,
    /// Seed this many generated machines instead of a catalog.
    #[arg(long, env = "BIGFLEET_GENERATE")]
    pub generate: Option<u64>,
    /// Seed of the generator and of the failure dice.
    #[arg(long, env = "BIGFLEET_SEED", default_value_t = 1)]
    pub seed: u64,
    /// Transitions land at their target before the call returns (the default unless a
    /// --latency-* flag is given).
    #[arg(long, env = "BIGFLEET_INSTANT", conflicts_with_all = ["latency_create", "latency_configure", "latency_drain", "latency_delete"])]
    pub instant: bool,
    /// Creating dwell time (e.g. 2s); the other kinds stay instant unless set too.
    #[arg(long, env = "BIGFLEET_LATENCY_CREATE", value_parser = duration)]
    pub latency_create: Option<Duration>,
    #[arg(long, env = "BIGFLEET_LATENCY_CONFIGURE", value_parser = duration)]
    pub latency_configure: Option<Duration>,
    #[arg(long, env = "BIGFLEET_LATENCY_DRAIN", value_parser = duration)]
    pub latency_drain: Option<Duration>,
    #[arg(long, env = "BIGFLEET_LATENCY_DELETE", value_parser = duration)]
    pub latency_delete: Option<Duration>,
    /// Hold these kinds in their transitional state until the admin API completes them
    /// (repeatable: create, configure, drain, delete).
    #[arg(long, env = "BIGFLEET_STAGED", value_delimiter = ',')]
    pub staged: Vec<OpKind>,
    /// The original's ADR-0056: hold every Configure in CONFIGURING until the admin API marks it ready.
    #[arg(long, env = "BIGFLEET_READINESS_HOLD")]
    pub readiness_hold: bool,
    /// Every mutating call (Create, Configure, Drain, Delete) waits this long before it is
    /// handled, like a cloud API's round trip (independent of the transition latencies).
    #[arg(long, env = "BIGFLEET_RPC_LATENCY", value_parser = duration)]
    pub rpc_latency: Option<Duration>,
    /// Transitions still running after this long land in FAILED.
    #[arg(long, env = "BIGFLEET_TRANSITION_TIMEOUT", value_parser = duration)]
    pub transition_timeout: Option<Duration>,
    #[arg(long, env = "BIGFLEET_FAILURE_RATE_CREATE", value_parser = rate, default_value_t = 0.0)]
    pub failure_rate_create: f64,
    #[arg(long, env = "BIGFLEET_FAILURE_RATE_CONFIGURE", value_parser = rate, default_value_t = 0.0)]
    pub failure_rate_configure: f64,
    #[arg(long, env = "BIGFLEET_FAILURE_RATE_DRAIN", value_parser = rate, default_value_t = 0.0)]
    pub failure_rate_drain: f64,
    #[arg(long, env = "BIGFLEET_FAILURE_RATE_DELETE", value_parser = rate, default_value_t = 0.0)]
    pub failure_rate_delete: f64,
    /// How rate failures show: `reject` (INTERNAL, nothing changes) or `fail` (accepted,
    /// the machine lands in FAILED).
    #[arg(long, env = "BIGFLEET_FAILURE_STYLE", value_enum, default_value_t = FailureStyle::Reject)]
    pub failure_style: FailureStyle,
    /// Answer Delete with UNIMPLEMENTED, like a bare-metal provider.
    #[arg(long, env = "BIGFLEET_NO_DELETE")]
    pub no_delete: bool,
    /// Persist fencing high-water marks here and load them at start.
    #[arg(long, env = "BIGFLEET_FENCE_FILE")]
    pub fence_file: Option<PathBuf>,
    /// Append every accepted mutating call (its fencing token, new work or replay) to this
    /// JSON-lines file, across restarts (the `actuation` module; `bigfleet up --chaos` audits it).
    #[arg(long, env = "BIGFLEET_ACTUATION_LOG")]
    pub actuation_log: Option<PathBuf>,
    /// HTTP /metrics /healthz /readyz; `0` disables.
    #[arg(long, env = "BIGFLEET_METRICS_ADDR", default_value = "0")]
    pub metrics_addr: String,
    /// HTTP admin API over the test hooks (see the `admin` module); `0` disables.
    #[arg(long, env = "BIGFLEET_ADMIN_ADDR", default_value = "0")]
    pub admin_addr: String,
    #[command(flatten)]
    pub log: LogArgs,
}

impl Args {
    /// The provider configuration these flags describe.
    pub fn provider_config(&self) -> ProviderConfig {
        let mut transitions = TransitionModel::instant();
        if !self.instant {
            for (kind, latency) in [
                (OpKind::Create, self.latency_create),
                (OpKind::Configure, self.latency_configure),
                (OpKind::Drain, self.latency_drain),
                (OpKind::Delete, self.latency_delete),
            ] {
                if let Some(d) = latency {
                    transitions.set(kind, Completion::After(d));
                }
            }
        }
        for kind in &self.staged {
            transitions.set(*kind, Completion::Staged);
        }
        ProviderConfig {
            transitions,
            hold_configuring_until_ready: self.readiness_hold,
            transition_timeout: self.transition_timeout,
            failure_rates: FailureRates {
                create: self.failure_rate_create,
                configure: self.failure_rate_configure,
                drain: self.failure_rate_drain,
                delete: self.failure_rate_delete,
            },
            failure_style: self.failure_style,
            delete_supported: !self.no_delete,
            seed: self.seed,
            ..ProviderConfig::default()
        }
    }

    /// The seeded provider (catalog, generator or built-in) with its fence file loaded.
    pub fn build_provider(&self) -> anyhow::Result<FakeProvider> {
        let config = self.provider_config();
        let catalog = match (&self.catalog, self.generate) {
            (Some(path), _) => Catalog::load(path)?,
            (None, Some(n)) => Catalog::generated(n, self.seed),
            (None, None) => Catalog::builtin(),
        };
        let provider = FakeProvider::from_catalog(&catalog, config)?;
        if let Some(path) = &self.fence_file {
            let n = provider.open_fence_file(path)?;
            tracing::info!(path = %path.display(), marks = n, "loaded fencing high-water marks");
        }
        if let Some(path) = &self.actuation_log {
            provider
                .open_actuation_log(path)
                .with_context(|| format!("actuation log {}", path.display()))?;
        }
        Ok(provider)
    }
}

/// `"0"` (or empty) means off.
fn optional_addr(flag: &str, value: &str) -> anyhow::Result<Option<SocketAddr>> {
    bigfleet_mesh::parse_optional_listen_addr(value)
        .map_err(|reason| anyhow::anyhow!("--{flag} {value:?}: {reason}"))
}

/// Runs the fake provider until SIGINT/SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let _telemetry = bigfleet_telemetry::init(&TelemetryConfig::from_env(
        "bigfleet-fake-provider",
        args.log.log_format,
    ))?;
    // The ops endpoint as every BigFleet binary serves it: not ready while the catalog seeds.
    let ops = bigfleet_mesh::binary::Ops::start(&args.metrics_addr, "seeding machines").await?;
    let admin_addr = optional_addr("admin-addr", &args.admin_addr)?;
    let started = std::time::Instant::now();
    let provider = Arc::new(args.build_provider()?);
    tracing::info!(
        machines = provider.len(),
        seconds = started.elapsed().as_secs_f64(),
        "seeded"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let mut opts = ServeOptions {
        rpc_latency: args.rpc_latency.unwrap_or_default(),
        ..ServeOptions::default()
    };
    if ops.addr().is_some() {
        let metrics = ProviderMetrics::register(&ops.registry)?;
        let first_revision = provider.revision();
        let (p, m) = (provider.clone(), metrics.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                m.refresh(&p, first_revision);
            }
        });
        opts.metrics = Some(metrics);
    }
    if let Some(addr) = admin_addr {
        let listener = bigfleet_mesh::bind_tcp(addr)?;
        tracing::info!(addr = %listener.local_addr()?, "admin api");
        let router = crate::admin::admin_router(provider.clone());
        let shutdown = stopped();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(error = %e, "admin api stopped");
            }
        });
    }

    let server = match &args.socket {
        Some(path) => spawn_uds_with(path, provider.clone(), opts).await?,
        None => spawn_tcp_with(args.listen, provider.clone(), opts).await?,
    };
    ops.readiness.set_ready();
    ops.drain_on_signal(async {
        let _ = stop_tx.send(true);
        server.shutdown().await;
        if let Some(path) = &args.socket {
            let _ = std::fs::remove_file(path);
        }
        anyhow::Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("bigfleet-fake-provider").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_are_instant_on_loopback() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.listen, "127.0.0.1:7800".parse().unwrap());
        assert_eq!(a.provider_config().transitions, TransitionModel::instant());
        assert!(a.provider_config().delete_supported);
        assert_eq!(a.metrics_addr, "0");
        assert_eq!(optional_addr("admin-addr", &a.admin_addr).unwrap(), None);
        // Read as every BigFleet binary reads a listen flag: `:port` is every interface,
        // IPv6 and IPv4 alike; a bad value names the flag.
        assert_eq!(
            optional_addr("admin-addr", ":7801").unwrap(),
            Some("[::]:7801".parse().unwrap())
        );
        let err = optional_addr("admin-addr", "nope").unwrap_err().to_string();
        assert!(err.starts_with("--admin-addr \"nope\""), "{err}");
    }

    #[test]
    fn latencies_staging_and_failures() {
        let a = parse(&[
            "--latency-create",
            "2s",
            "--latency-drain",
            "150ms",
            "--staged",
            "configure",
            "--failure-rate-configure",
            "0.25",
            "--failure-style",
            "fail",
            "--no-delete",
        ])
        .unwrap();
        let c = a.provider_config();
        assert_eq!(
            c.transitions.create,
            Completion::After(Duration::from_secs(2))
        );
        assert_eq!(
            c.transitions.drain,
            Completion::After(Duration::from_millis(150))
        );
        assert_eq!(c.transitions.configure, Completion::Staged);
        assert_eq!(c.transitions.delete, Completion::Instant);
        assert_eq!(c.failure_rates.configure, 0.25);
        assert_eq!(c.failure_style, FailureStyle::Fail);
        assert!(!c.delete_supported);
    }

    #[test]
    fn rpc_latency_is_independent_of_transitions() {
        let a = parse(&["--rpc-latency", "50ms"]).unwrap();
        assert_eq!(a.rpc_latency, Some(Duration::from_millis(50)));
        assert_eq!(a.provider_config().transitions, TransitionModel::instant());
        assert_eq!(parse(&[]).unwrap().rpc_latency, None);
    }

    #[test]
    fn rejects_bad_combinations() {
        assert!(parse(&["--instant", "--latency-create", "1s"]).is_err());
        assert!(parse(&["--catalog", "x.json", "--generate", "10"]).is_err());
        assert!(parse(&["--failure-rate-create", "1.5"]).is_err());
    }
}
