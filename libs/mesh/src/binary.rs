//! What a service binary does around the service it starts, alike in every binary: its
//! telemetry and mTLS come from the shared [`ServiceFlags`], its `/metrics` `/healthz` `/readyz`
//! endpoint runs from before the start until after the drain, and SIGTERM or SIGINT marks
//! it not ready before the service drains ([`Ops`]).

use std::future::Future;

use bigfleet_identity::{TlsContext, TlsError};
use bigfleet_telemetry::{
    MetricsRegistry, OpsServer, Readiness, TelemetryConfig, TelemetryError, TelemetryGuard,
};

use crate::{OpsFlagError, ServiceFlags, start_ops_server, stop_signal};

/// The `/readyz` reason while a service drains.
pub const DRAINING: &str = "draining";

impl ServiceFlags {
    /// The telemetry of binary `binary` (its `service.name`) with this `--log-format`, the
    /// rest from the environment.
    pub fn telemetry_config(&self, binary: &str) -> TelemetryConfig {
        TelemetryConfig::from_env(binary, self.log.log_format)
    }

    /// Installs [`ServiceFlags::telemetry_config`]; keep the guard until the service ends.
    pub fn init_telemetry(&self, binary: &str) -> Result<TelemetryGuard, TelemetryError> {
        bigfleet_telemetry::init(&self.telemetry_config(binary))
    }

    /// The process's mTLS from the `--tls-*` flags, loaded; `None` when none are set
    /// (plaintext), an error when only some are or the files do not load.
    pub fn tls_context(&self) -> Result<Option<TlsContext>, TlsError> {
        self.tls
            .resolve()?
            .as_ref()
            .map(TlsContext::load)
            .transpose()
    }
}

/// A service binary's ops endpoint: the registry its metrics go to and the readiness its
/// `/readyz` reports, served on its `--metrics-addr` for as long as it runs.
#[derive(Debug)]
pub struct Ops {
    pub registry: MetricsRegistry,
    pub readiness: Readiness,
    server: OpsServer,
}

impl Ops {
    /// Serves the endpoint on `metrics_addr` (`0` turns it off), not ready for `reason`
    /// until the service says otherwise.
    pub async fn start(metrics_addr: &str, reason: &str) -> Result<Self, OpsFlagError> {
        let registry = MetricsRegistry::new();
        let readiness = Readiness::not_ready(reason);
        let server = start_ops_server(metrics_addr, registry.clone(), readiness.clone()).await?;
        Ok(Self {
            registry,
            readiness,
            server,
        })
    }

    /// Where the endpoint listens (`None` when `--metrics-addr 0` turned it off).
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.server.addr()
    }

    /// Waits for SIGTERM or SIGINT, then as [`Ops::drain_after`]: the one way every
    /// service binary stops.
    pub async fn drain_on_signal<E>(
        self,
        drain: impl Future<Output = Result<(), E>>,
    ) -> Result<(), E> {
        self.drain_after(stop_signal(), drain).await
    }

    /// Once `stop` resolves: not ready ([`DRAINING`]) so traffic moves away, then `drain`
    /// (the service's shutdown), then the endpoint stops. A failed drain returns its error
    /// at once.
    pub async fn drain_after<E>(
        self,
        stop: impl Future<Output = ()>,
        drain: impl Future<Output = Result<(), E>>,
    ) -> Result<(), E> {
        stop.await;
        self.readiness.set_draining(DRAINING);
        drain.await?;
        self.server.stop().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_takes_the_binary_name_and_log_format() {
        let flags = ServiceFlags {
            drain_timeout: std::time::Duration::from_secs(1),
            tls: bigfleet_identity::TlsFlags::default(),
            log: bigfleet_telemetry::LogArgs {
                log_format: bigfleet_telemetry::LogFormat::Json,
            },
        };
        let cfg = flags.telemetry_config("bigfleet-x");
        assert_eq!(cfg.service_name, "bigfleet-x");
        assert_eq!(cfg.log_format, bigfleet_telemetry::LogFormat::Json);
    }

    #[test]
    fn tls_loads_from_all_of_the_files_or_none() {
        let plain = ServiceFlags {
            drain_timeout: std::time::Duration::from_secs(1),
            tls: bigfleet_identity::TlsFlags::default(),
            log: bigfleet_telemetry::LogArgs::default(),
        };
        assert!(plain.tls_context().unwrap().is_none());

        let dir = tempfile::tempdir().unwrap();
        let ca = bigfleet_testkit::TestCa::new("binary test ca").unwrap();
        let paths = ca.write_role_bundle(dir.path(), "admin").unwrap();
        let with = |key: Option<std::path::PathBuf>| ServiceFlags {
            tls: bigfleet_identity::TlsFlags {
                cert: Some(paths.cert.clone()),
                key,
                ca: Some(paths.ca.clone()),
                ..bigfleet_identity::TlsFlags::default()
            },
            ..plain.clone()
        };
        assert!(
            with(Some(paths.key.clone()))
                .tls_context()
                .unwrap()
                .is_some()
        );
        assert!(
            with(None).tls_context().is_err(),
            "a partial set is refused"
        );
        assert!(
            with(Some(dir.path().join("missing.key")))
                .tls_context()
                .is_err(),
            "files that do not load are refused"
        );
    }

    #[tokio::test]
    async fn readiness_drops_before_the_drain_and_the_endpoint_outlives_it() {
        let ops = Ops::start("127.0.0.1:0", "starting").await.unwrap();
        let addr = ops.server.addr().unwrap();
        assert_eq!(ops.readiness.status(), Err("starting".to_owned()));
        ops.readiness.set_ready();
        let readiness = ops.readiness.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let drain = async {
            // The service drains while probes still reach the endpoint and see it draining,
            // even if one of its loops (a leader watch, a reconnecting stream) says ready.
            readiness.set_ready();
            assert_eq!(readiness.status(), Err(DRAINING.to_owned()));
            assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
            Ok::<(), String>(())
        };
        stop_tx.send(()).unwrap();
        let stop = async {
            let _ = stop_rx.await;
        };
        ops.drain_after(stop, drain).await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_failed_drain_is_returned() {
        let ops = Ops::start("0", "starting").await.unwrap();
        let r = ops
            .drain_after(async {}, async { Err::<(), _>("stuck") })
            .await;
        assert_eq!(r, Err("stuck"));
    }
}
