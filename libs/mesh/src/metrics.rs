//! Per-RPC counters and latency histograms, for servers and clients alike.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bigfleet_telemetry::{LATENCY_BUCKETS, MetricsRegistry, TelemetryError};
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use prometheus::{HistogramVec, IntCounterVec};
use tonic::body::Body;
use tonic::{Code, Status};
use tower::Service;

use crate::error::{BoxError, code_label};
use crate::layers::wrapping_layer;

/// Counters and histograms for one side (server or client) of every RPC in a process.
/// Register once per registry and clone the handle into every stack.
#[derive(Debug, Clone)]
pub struct GrpcMetrics {
    started: IntCounterVec,
    handled: IntCounterVec,
    latency: HistogramVec,
    retries: Option<IntCounterVec>,
    rejected_connections: Option<IntCounterVec>,
}

impl GrpcMetrics {
    /// `grpc_server_started_total`, `grpc_server_handled_total{grpc_code}` and
    /// `grpc_server_handling_seconds`, labelled by `grpc_service` and `grpc_method`.
    pub fn server(registry: &MetricsRegistry) -> Result<Self, TelemetryError> {
        let mut m = Self::register(registry, "server", "handled by this server", false)?;
        m.rejected_connections = Some(registry.int_counter_vec(
            "bigfleet_server_rejected_connections_total",
            "Connections closed before any request: a Unix-socket peer with the wrong uid, a failed or timed-out TLS handshake",
            &["reason"],
        )?);
        Ok(m)
    }

    /// The `grpc_client_*` equivalents, plus `grpc_client_retries_total{grpc_code}` (the code
    /// that caused each retry).
    pub fn client(registry: &MetricsRegistry) -> Result<Self, TelemetryError> {
        Self::register(registry, "client", "made by this process", true)
    }

    fn register(
        registry: &MetricsRegistry,
        side: &str,
        what: &str,
        with_retries: bool,
    ) -> Result<Self, TelemetryError> {
        let labels = ["grpc_service", "grpc_method"];
        let with_code = ["grpc_service", "grpc_method", "grpc_code"];
        Ok(Self {
            started: registry.int_counter_vec(
                &format!("grpc_{side}_started_total"),
                &format!("RPCs started, {what}"),
                &labels,
            )?,
            handled: registry.int_counter_vec(
                &format!("grpc_{side}_handled_total"),
                &format!("RPCs completed, {what}, by status code"),
                &with_code,
            )?,
            latency: registry.histogram_vec(
                &format!("grpc_{side}_handling_seconds"),
                &format!("RPC duration until the last response byte, {what}"),
                &labels,
                LATENCY_BUCKETS,
            )?,
            retries: if with_retries {
                Some(registry.int_counter_vec(
                    "grpc_client_retries_total",
                    "RPC attempts retried, by the status code that caused the retry",
                    &with_code,
                )?)
            } else {
                None
            },
            rejected_connections: None,
        })
    }

    /// Counts a connection closed before its first request (`reason`: a fixed label).
    pub(crate) fn record_rejected_connection(&self, reason: &'static str) {
        if let Some(r) = &self.rejected_connections {
            r.with_label_values(&[reason]).inc();
        }
    }

    pub(crate) fn record_retry(&self, path: &str, code: Code) {
        if let Some(r) = &self.retries {
            let (service, method) = split_path(path);
            r.with_label_values(&[service, method, code_label(code)])
                .inc();
        }
    }
}

/// `/pkg.Service/Method` ⇒ (`pkg.Service`, `Method`).
pub(crate) fn split_path(path: &str) -> (&str, &str) {
    path.trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("unknown", "unknown"))
}

/// Records one RPC exactly once, whenever it ends (success, error, or the body dropped).
struct Recorder {
    metrics: GrpcMetrics,
    path: String,
    start: Instant,
    done: bool,
}

impl Recorder {
    fn finish(&mut self, code: Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        // Unknown paths come from callers: labelling them verbatim would let any client grow
        // the series set without bound, so they share one label.
        let (service, method) = if code == Code::Unimplemented {
            ("unknown", "unknown")
        } else {
            split_path(&self.path)
        };
        self.metrics
            .handled
            .with_label_values(&[service, method, code_label(code)])
            .inc();
        self.metrics
            .latency
            .with_label_values(&[service, method])
            .observe(self.start.elapsed().as_secs_f64());
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A stream dropped before its trailers: the caller went away.
        self.finish(Code::Cancelled);
    }
}

/// Counts and times every RPC passing through.
#[derive(Debug, Clone)]
pub struct MetricsLayer {
    metrics: Option<GrpcMetrics>,
}

impl MetricsLayer {
    pub fn new(metrics: Option<GrpcMetrics>) -> Self {
        Self { metrics }
    }
}

wrapping_layer!(MetricsLayer => MetricsService { metrics });

#[derive(Debug, Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Option<GrpcMetrics>,
}

impl<S, ReqBody> Service<Request<ReqBody>> for MetricsService<S>
where
    S: Service<Request<ReqBody>, Response = Response<Body>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = MetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let recorder = self.metrics.as_ref().map(|m| {
            let path = req.uri().path().to_owned();
            let (service, method) = split_path(&path);
            m.started.with_label_values(&[service, method]).inc();
            Recorder {
                metrics: m.clone(),
                path,
                start: Instant::now(),
                done: false,
            }
        });
        MetricsFuture {
            inner: self.inner.call(req),
            recorder,
        }
    }
}

pin_project! {
    pub struct MetricsFuture<F> {
        #[pin]
        inner: F,
        recorder: Option<Recorder>,
    }
}

impl<F, E> Future for MetricsFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx)).map_err(Into::into);
        let Some(mut recorder) = this.recorder.take() else {
            return Poll::Ready(result);
        };
        Poll::Ready(match result {
            Err(err) => {
                let code = err
                    .downcast_ref::<Status>()
                    .map(Status::code)
                    .unwrap_or(Code::Unknown);
                recorder.finish(code);
                Err(err)
            }
            Ok(resp) => {
                // Trailers-only responses (every error a server returns before any message)
                // carry the status in the headers; otherwise it arrives in the trailers.
                let header_code = grpc_status(resp.headers());
                if let Some(code) = header_code {
                    // Nothing follows a trailers-only response (hyper may never poll its
                    // empty body), so it is complete now.
                    recorder.finish(code);
                    return Poll::Ready(Ok(resp));
                }
                Ok(resp.map(|body| {
                    Body::new(MetricsBody {
                        inner: body,
                        recorder,
                    })
                }))
            }
        })
    }
}

pub(crate) fn grpc_status(headers: &HeaderMap) -> Option<Code> {
    headers
        .get("grpc-status")
        .map(|v| Code::from_bytes(v.as_bytes()))
}

pin_project! {
    struct MetricsBody {
        #[pin]
        inner: Body,
        recorder: Recorder,
    }
}

impl HttpBody for MetricsBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(code) = f.trailers_ref().and_then(grpc_status) {
                    this.recorder.finish(code);
                }
            }
            Some(Err(status)) => this.recorder.finish(status.code()),
            // Ended without trailers: not a valid gRPC response.
            None => this.recorder.finish(Code::Unknown),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(
            split_path("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
        assert_eq!(split_path("garbage"), ("unknown", "unknown"));
    }

    #[test]
    fn both_sides_register_in_one_registry_once() {
        let reg = MetricsRegistry::new();
        GrpcMetrics::server(&reg).unwrap();
        GrpcMetrics::client(&reg).unwrap();
        assert!(GrpcMetrics::server(&reg).is_err());
    }
}
