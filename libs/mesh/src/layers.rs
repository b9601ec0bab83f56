//! The server-side tower layers (composed in order by [`crate::server_stack`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tonic::body::Body;
use tower::{Layer, Service};
use tracing::Instrument;

use crate::authz::{AuthzPolicy, HEALTH_SERVICE, REFLECTION_SERVICES};
use crate::conn::{ConnInfo, PeerCert, Transport};
use crate::error::{BoxError, MeshError, status_from_box_error};
use crate::peer::Peer;
use crate::rate_limit::TokenBuckets;

/// Writes the `Layer` impl of a layer whose service is the inner service plus a copy of the
/// layer's fields: `wrapping_layer!(FooLayer => FooService { a, b })`.
macro_rules! wrapping_layer {
    ($layer:ident => $service:ident { $($field:ident),* $(,)? }) => {
        impl<S> ::tower::Layer<S> for $layer {
            type Service = $service<S>;

            fn layer(&self, inner: S) -> Self::Service {
                $service {
                    inner,
                    $($field: self.$field.clone(),)*
                }
            }
        }
    };
}
pub(crate) use wrapping_layer;

// === Trace ===

/// Opens one `grpc.server` span per request whose parent is the caller's `traceparent`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceLayer;

wrapping_layer!(TraceLayer => TraceService {});

#[derive(Debug, Clone)]
pub struct TraceService<S> {
    inner: S,
}

impl<S> Service<Request<Body>> for TraceService<S>
where
    S: Service<Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tracing::instrument::Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let path = req.uri().path();
        let (service, method) = crate::metrics::split_path(path);
        let span = tracing::info_span!(
            "grpc.server",
            otel.name = %path,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
        );
        bigfleet_telemetry::propagation::set_parent_from_headers(&span, req.headers());
        let fut = span.in_scope(|| self.inner.call(req));
        fut.instrument(span)
    }
}

// === Error mapping ===

/// Turns every error from the layers below into a trailers-only gRPC status response, so
/// nothing above (metrics, trace, tonic, hyper) ever sees a raw error.
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorMapLayer;

wrapping_layer!(ErrorMapLayer => ErrorMapService {});

#[derive(Debug, Clone)]
pub struct ErrorMapService<S> {
    inner: S,
}

impl<S> Service<Request<Body>> for ErrorMapService<S>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ErrorMapFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // A readiness error (e.g. a broken inner service) is reported on the call instead;
        // returning it here would tear down the whole connection.
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        ErrorMapFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    pub struct ErrorMapFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, E> Future for ErrorMapFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(match ready!(self.project().inner.poll(cx)) {
            Ok(resp) => resp,
            Err(err) => {
                let status = status_from_box_error(err.into());
                tracing::debug!(code = ?status.code(), message = status.message(), "request rejected");
                status.into_http()
            }
        }))
    }
}

// === Request checks (identity, authorization, rate limit) ===

/// A synchronous admission check: inspects (and may annotate) a request, or rejects it.
pub trait RequestCheck: Clone + Send + Sync + 'static {
    fn check(&self, req: &mut Request<Body>) -> Result<(), MeshError>;
}

/// Runs a [`RequestCheck`] before the inner service.
#[derive(Debug, Clone)]
pub struct CheckLayer<C> {
    check: C,
}

impl<C> CheckLayer<C> {
    pub fn new(check: C) -> Self {
        Self { check }
    }
}

impl<S, C: Clone> Layer<S> for CheckLayer<C> {
    type Service = CheckService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CheckService {
            inner,
            check: self.check.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CheckService<S, C> {
    inner: S,
    check: C,
}

impl<S, C> Service<Request<Body>> for CheckService<S, C>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = BoxError>,
    C: RequestCheck,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = CheckFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        match self.check.check(&mut req) {
            Ok(()) => CheckFuture::Inner {
                fut: self.inner.call(req),
            },
            Err(e) => CheckFuture::Rejected { error: Some(e) },
        }
    }
}

pin_project! {
    #[project = CheckFutureProj]
    pub enum CheckFuture<F> {
        Inner { #[pin] fut: F },
        Rejected { error: Option<MeshError> },
    }
}

impl<F> Future for CheckFuture<F>
where
    F: Future<Output = Result<Response<Body>, BoxError>>,
{
    type Output = Result<Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CheckFutureProj::Inner { fut } => fut.poll(cx),
            CheckFutureProj::Rejected { error } => Poll::Ready(Err(Box::new(
                error.take().expect("CheckFuture polled after completion"),
            ))),
        }
    }
}

/// Turns the connection's TLS facts into a [`Peer`] request extension (plus the bare
/// [`bigfleet_identity::PeerIdentity`] when verified). Under mTLS a request without a client
/// certificate is UNAUTHENTICATED.
#[derive(Debug, Clone)]
pub struct IdentityCheck {
    pub mtls: bool,
}

impl RequestCheck for IdentityCheck {
    fn check(&self, req: &mut Request<Body>) -> Result<(), MeshError> {
        let unauthenticated = |why: &str| Err(MeshError::Unauthenticated(why.to_owned()));
        let peer = match req.extensions().get::<ConnInfo>() {
            None if self.mtls => {
                return unauthenticated("no connection identity on an mtls server");
            }
            None => Peer::Plaintext,
            Some(info) => match (info.transport, &*info.peer_cert) {
                (Transport::Unix, _) => Peer::Local,
                (Transport::Tcp, _) if self.mtls => {
                    return unauthenticated("plaintext connection to an mtls server");
                }
                (Transport::Tcp, _) => Peer::Plaintext,
                (Transport::Tls, PeerCert::None | PeerCert::Missing) => {
                    return unauthenticated("client certificate required");
                }
                (Transport::Tls, PeerCert::Verified(Ok(id))) => Peer::Verified(id.clone()),
                (Transport::Tls, PeerCert::Verified(Err(e))) => Peer::Invalid(e.clone()),
            },
        };
        if let Peer::Verified(id) = &peer {
            req.extensions_mut().insert(id.clone());
        }
        req.extensions_mut().insert(peer);
        Ok(())
    }
}

/// Applies the service's [`AuthzPolicy`] to the [`Peer`] the identity check established.
#[derive(Debug, Clone)]
pub struct AuthzCheck {
    pub policy: Arc<AuthzPolicy>,
}

impl RequestCheck for AuthzCheck {
    fn check(&self, req: &mut Request<Body>) -> Result<(), MeshError> {
        let peer = req.extensions().get::<Peer>().ok_or_else(|| {
            MeshError::Unauthenticated("identity layer missing from the stack".to_owned())
        })?;
        self.policy.check(req.uri().path(), peer)
    }
}

/// One token bucket per caller identity; open services (health, reflection) are exempt so
/// probes never starve real traffic or get refused.
#[derive(Debug, Clone)]
pub struct RateLimitCheck {
    pub buckets: Option<TokenBuckets>,
    pub policy: Arc<AuthzPolicy>,
    /// Only these services are limited (`None`: every service but health and reflection).
    pub services: Option<Arc<[String]>>,
    /// Plaintext callers on loopback are not limited (a local mesh, or a load generator
    /// speaking for thousands of clusters from one address).
    pub exempt_loopback_plaintext: bool,
}

impl RequestCheck for RateLimitCheck {
    fn check(&self, req: &mut Request<Body>) -> Result<(), MeshError> {
        let Some(buckets) = &self.buckets else {
            return Ok(());
        };
        let path = req.uri().path();
        let service = crate::authz::service_of(path);
        // Probes and tooling are never throttled.
        if service == HEALTH_SERVICE || REFLECTION_SERVICES.contains(&service) {
            return Ok(());
        }
        if let Some(only) = &self.services
            && !only.iter().any(|s| s == service)
        {
            return Ok(());
        }
        let remote = req
            .extensions()
            .get::<ConnInfo>()
            .and_then(|i| i.remote_addr);
        let peer = req.extensions().get::<Peer>();
        // Same-pod callers are the shard itself: no budget.
        let local = match peer {
            Some(Peer::Local) => true,
            Some(Peer::Plaintext) => {
                self.exempt_loopback_plaintext && remote.is_none_or(|a| a.ip().is_loopback())
            }
            _ => false,
        };
        if local {
            return Ok(());
        }
        let key = peer.map_or_else(|| "unknown".to_owned(), |p| p.key(remote));
        if buckets.try_acquire(&key) {
            Ok(())
        } else {
            Err(MeshError::RateLimited(key))
        }
    }
}

// === Deadline ===

/// Bounds the time to the response headers by the smaller of the configured timeout and the
/// caller's `grpc-timeout`. (For streaming RPCs that covers producing the stream, not its
/// lifetime.)
#[derive(Debug, Clone, Copy)]
pub struct DeadlineLayer {
    timeout: Option<Duration>,
}

impl DeadlineLayer {
    pub fn new(timeout: Option<Duration>) -> Self {
        Self { timeout }
    }
}

wrapping_layer!(DeadlineLayer => DeadlineService { timeout });

#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
    timeout: Option<Duration>,
}

impl<S> Service<Request<Body>> for DeadlineService<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // tonic's server runs its own `grpc-timeout` timer outside every layer and reports
        // expiry as CANCELLED; finishing a millisecond earlier (one timer tick) lets this
        // layer answer first with the DEADLINE_EXCEEDED callers expect.
        let caller =
            parse_grpc_timeout(req.headers()).map(|d| d.saturating_sub(Duration::from_millis(1)));
        let limit = match (self.timeout, caller) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let fut = self.inner.call(req);
        match limit {
            None => DeadlineFuture::Unbounded { fut },
            Some(limit) => DeadlineFuture::Bounded {
                fut: tokio::time::timeout(limit, fut),
                limit,
            },
        }
    }
}

pin_project! {
    #[project = DeadlineFutureProj]
    pub enum DeadlineFuture<F> {
        Unbounded { #[pin] fut: F },
        Bounded { #[pin] fut: tokio::time::Timeout<F>, limit: Duration },
    }
}

impl<F> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<Response<Body>, BoxError>>,
{
    type Output = Result<Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            DeadlineFutureProj::Unbounded { fut } => fut.poll(cx),
            DeadlineFutureProj::Bounded { fut, limit } => match ready!(fut.poll(cx)) {
                Ok(result) => Poll::Ready(result),
                Err(_) => Poll::Ready(Err(Box::new(MeshError::Timeout(*limit)))),
            },
        }
    }
}

/// The `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).
pub(crate) fn parse_grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Formats a duration as a `grpc-timeout` value (millisecond precision, rounded up so a
/// deadline is never shortened to zero).
pub(crate) fn format_grpc_timeout(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", d.as_secs().min(99_999_999))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", v.parse().unwrap());
        h
    }

    #[test]
    fn grpc_timeout_units() {
        let cases = [
            ("5S", Some(Duration::from_secs(5))),
            ("250m", Some(Duration::from_millis(250))),
            ("2M", Some(Duration::from_secs(120))),
            ("1H", Some(Duration::from_secs(3600))),
            ("7u", Some(Duration::from_micros(7))),
            ("9n", Some(Duration::from_nanos(9))),
            ("5", None),
            ("123456789S", None),
            ("xS", None),
        ];
        for (value, want) in cases {
            assert_eq!(parse_grpc_timeout(&headers(value)), want, "{value}");
        }
        assert_eq!(parse_grpc_timeout(&http::HeaderMap::new()), None);
    }

    #[test]
    fn grpc_timeout_formatting_round_trips_and_rounds_up() {
        for d in [
            Duration::from_millis(1),
            Duration::from_millis(1500),
            Duration::from_secs(30),
        ] {
            assert_eq!(
                parse_grpc_timeout(&headers(&format_grpc_timeout(d))),
                Some(d)
            );
        }
        assert_eq!(format_grpc_timeout(Duration::from_micros(10)), "1m");
        assert_eq!(format_grpc_timeout(Duration::from_secs(200_000)), "200000S");
    }
}
