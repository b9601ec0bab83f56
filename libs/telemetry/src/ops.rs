//! The plain-HTTP operations endpoints every process serves: `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::task::JoinHandle;

use crate::MetricsRegistry;

/// Content type of the Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether the process should receive traffic. Starts not ready with a reason; the service
/// flips it (either way — a coordinator loses readiness when it stops seeing a leader) until
/// it drains, which is for good. Clones share state.
#[derive(Debug, Clone)]
pub struct Readiness {
    state: Arc<RwLock<Phase>>,
}

#[derive(Debug)]
enum Phase {
    Ready,
    /// Not ready, and why (shown in the 503 body).
    NotReady(String),
    /// Stopping: not ready whatever the service's loops still say.
    Draining(String),
}

impl Readiness {
    /// Not ready yet, with the reason probes will see.
    pub fn not_ready(reason: impl Into<String>) -> Self {
        Self {
            state: Arc::new(RwLock::new(Phase::NotReady(reason.into()))),
        }
    }

    /// Ready from the start (processes with nothing to wait for).
    pub fn ready() -> Self {
        Self {
            state: Arc::new(RwLock::new(Phase::Ready)),
        }
    }

    /// Ready, unless draining.
    pub fn set_ready(&self) {
        self.set(Phase::Ready);
    }

    /// Not ready for `reason`, unless draining (which keeps its own reason).
    pub fn set_not_ready(&self, reason: impl Into<String>) {
        self.set(Phase::NotReady(reason.into()));
    }

    /// Not ready for good, for `reason`: the process is stopping. A loop of the service that
    /// has not stopped yet (a leader watch, a stream that reconnects) cannot make it ready
    /// again and draw traffic to a process that is going away.
    pub fn set_draining(&self, reason: impl Into<String>) {
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = Phase::Draining(reason.into());
    }

    fn set(&self, next: Phase) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if !matches!(*state, Phase::Draining(_)) {
            *state = next;
        }
    }

    pub fn is_ready(&self) -> bool {
        self.status().is_ok()
    }

    /// `Ok` when ready, else the reason.
    pub fn status(&self) -> Result<(), String> {
        match &*self.state.read().unwrap_or_else(|e| e.into_inner()) {
            Phase::Ready => Ok(()),
            Phase::NotReady(reason) | Phase::Draining(reason) => Err(reason.clone()),
        }
    }
}

#[derive(Clone)]
struct OpsState {
    registry: MetricsRegistry,
    readiness: Readiness,
}

/// `/metrics` (Prometheus text), `/healthz` (200 while the process serves HTTP at all) and
/// `/readyz` (200 when `readiness` says so, else 503 with the reason). Merge more routes into
/// the returned router if a service needs them.
///
/// Adds the `process_*` family and `bigfleet_build_info` (service: [`crate::service_name`])
/// to `registry` unless it has them already.
pub fn ops_router(registry: MetricsRegistry, readiness: Readiness) -> Router {
    if let Err(e) = registry.register_process_metrics(crate::service_name()) {
        tracing::warn!(error = %e, "process and build-info metrics not registered");
    }
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(OpsState {
            registry,
            readiness,
        })
}

async fn metrics(State(s): State<OpsState>) -> Response {
    match s.registry.encode_text() {
        Ok(text) => ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<OpsState>) -> Response {
    match s.readiness.status() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

/// The ops server of a service binary, started by [`OpsServer::start`] and stopped by
/// [`OpsServer::stop`] after the service has drained, so `/metrics` stays readable to the
/// end.
#[derive(Debug)]
pub struct OpsServer {
    addr: Option<SocketAddr>,
    // Sending (or dropping the sender) ends the server's graceful shutdown wait.
    stop: tokio::sync::oneshot::Sender<()>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl OpsServer {
    /// Serves the ops router on `addr`, or nothing when `addr` is `None` (`--metrics-addr 0`).
    pub async fn start(
        addr: Option<SocketAddr>,
        registry: MetricsRegistry,
        readiness: Readiness,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let Some(addr) = addr else {
            return Ok(Self {
                addr: None,
                stop,
                task: None,
            });
        };
        let listener = crate::bind_tcp(addr)?;
        let local = listener.local_addr()?;
        tracing::info!(addr = %local, "serving /metrics /healthz /readyz");
        let task = tokio::spawn(async move {
            axum::serve(listener, ops_router(registry, readiness))
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Self {
            addr: Some(local),
            stop,
            task: Some(task),
        })
    }

    /// The bound address, `None` when disabled.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Finishes in-flight requests and waits for the server task.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get_path(router: &Router, path: &str) -> (StatusCode, String, Option<String>) {
        let resp = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap(), ct)
    }

    #[tokio::test]
    async fn ops_server_serves_until_stopped_and_none_when_disabled() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let disabled = OpsServer::start(None, MetricsRegistry::new(), Readiness::ready())
            .await
            .unwrap();
        assert_eq!(disabled.addr(), None);
        disabled.stop().await;

        let server = OpsServer::start(
            Some("127.0.0.1:0".parse().unwrap()),
            MetricsRegistry::new(),
            Readiness::ready(),
        )
        .await
        .unwrap();
        let addr = server.addr().expect("bound");
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        conn.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
        assert!(reply.ends_with("ok\n"), "{reply}");

        server.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn readiness_flips_both_ways_and_health_stays_up() {
        let readiness = Readiness::not_ready("first provider reconcile not yet complete");
        let router = ops_router(MetricsRegistry::new(), readiness.clone());

        let (status, body, _) = get_path(&router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "first provider reconcile not yet complete\n");
        assert_eq!(get_path(&router, "/healthz").await.0, StatusCode::OK);

        readiness.set_ready();
        assert!(readiness.is_ready());
        let (status, body, _) = get_path(&router, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));

        readiness.set_not_ready("no leader");
        let (status, body, _) = get_path(&router, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "no leader\n")
        );
        assert_eq!(get_path(&router, "/healthz").await.0, StatusCode::OK);
    }

    #[test]
    fn draining_is_for_good() {
        let readiness = Readiness::ready();
        readiness.set_draining("draining");
        // A service loop that has not stopped yet saw its leader again, or its stream back.
        readiness.set_ready();
        readiness.set_not_ready("no leader");
        assert_eq!(readiness.status(), Err("draining".to_owned()));
    }

    #[tokio::test]
    async fn metrics_are_exposed_as_prometheus_text() {
        let registry = MetricsRegistry::new();
        let c = registry.int_counter("cycles_total", "cycles run").unwrap();
        let router = ops_router(registry, Readiness::ready());
        c.inc();
        c.inc();
        let (status, body, ct) = get_path(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ct.as_deref(), Some(PROMETHEUS_TEXT));
        assert!(body.contains("# TYPE cycles_total counter"), "{body}");
        assert!(body.contains("cycles_total 2"), "{body}");
        assert!(body.contains("bigfleet_build_info{"), "{body}");
        #[cfg(target_os = "linux")]
        assert!(
            body.contains("# TYPE process_cpu_seconds_total counter"),
            "{body}"
        );
        assert_eq!(get_path(&router, "/nope").await.0, StatusCode::NOT_FOUND);
    }
}
