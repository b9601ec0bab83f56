//! The server tower stack, in one place.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tonic::body::Body;
use tower::limit::ConcurrencyLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceBuilder};

use crate::authz::AuthzPolicy;
use crate::error::BoxError;
use crate::layers::{
    AuthzCheck, CheckLayer, DeadlineLayer, ErrorMapLayer, IdentityCheck, RateLimitCheck, TraceLayer,
};
use crate::metrics::{GrpcMetrics, MetricsLayer};
use crate::rate_limit::{RateLimit, TokenBuckets};

/// The composed server stack, boxed so every service has the same type. The error type is
/// nominal: the error-mapping layer turns every failure into a status response.
pub type ServerStackService = BoxCloneService<Request<Body>, Response<Body>, BoxError>;

/// Names a set of bounds once: a trait with them as supertraits and a blanket impl for every
/// type meeting them, so each generic function or impl that needs the bounds writes one name.
macro_rules! bounds_alias {
    ($(#[$meta:meta])* $vis:vis trait $name:ident: $($bounds:tt)+) => {
        $(#[$meta])*
        $vis trait $name: $($bounds)+ {}
        impl<T: $($bounds)+> $name for T {}
    };
}
pub(crate) use bounds_alias;

bounds_alias! {
    /// What [`server_stack`] and [`MeshLayer`] wrap: a tonic router, or any infallible HTTP
    /// service like it.
    pub trait InnerService: Service<
            Request<Body>,
            Response = Response<Body>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
}

/// What a service configures about its server stack.
#[derive(Debug, Clone)]
pub struct ServerStackConfig {
    /// Server RPC metrics (`None`: not recorded, e.g. in small tests).
    pub metrics: Option<GrpcMetrics>,
    /// Set by [`crate::MeshServer`] from whether TLS is configured: under mTLS a TCP request
    /// without a verified client certificate is refused.
    pub mtls: bool,
    /// Who may call what (checked for mTLS callers only).
    pub authz: Arc<AuthzPolicy>,
    /// Per-identity token bucket (`None`: no limit); callers without an identity are keyed
    /// by source address, loopback-plaintext and Unix-socket callers are exempt.
    pub rate_limit: Option<RateLimit>,
    /// Which services the rate limit applies to (`None`: all but health and reflection).
    pub rate_limited_services: Option<Arc<[String]>>,
    /// Whether plaintext callers on loopback skip the rate limit.
    pub rate_limit_exempt_loopback: bool,
    /// Requests in flight across all connections before new ones are shed with
    /// RESOURCE_EXHAUSTED (`None`: unlimited).
    pub concurrency_limit: Option<usize>,
    /// Upper bound on the time to response headers (the caller's `grpc-timeout` may lower
    /// it); `None`: only the caller's deadline applies.
    pub timeout: Option<Duration>,
}

impl Default for ServerStackConfig {
    /// No metrics, plaintext, any identity allowed, no limits, no server timeout.
    fn default() -> Self {
        Self {
            metrics: None,
            mtls: false,
            authz: Arc::new(AuthzPolicy::allow_any_identity()),
            rate_limit: None,
            rate_limited_services: None,
            rate_limit_exempt_loopback: false,
            concurrency_limit: None,
            timeout: None,
        }
    }
}

/// Wraps `inner` (a tonic router) in the mesh's server middleware, outermost first.
///
/// The order is the contract (ADR-0002); each position is chosen for what the layers
/// *above* a layer must observe:
pub fn server_stack<S: InnerService>(inner: S, cfg: &ServerStackConfig) -> ServerStackService {
    let svc = ServiceBuilder::new()
        // 1. Trace, outermost: the span (child of the caller's `traceparent`) is current for
        //    everything below, so rejections logged by inner layers carry the trace id and a
        //    refused call still shows up in the caller's trace.
        .layer(TraceLayer)
        // 2. Metrics: above error mapping, so it sees the final gRPC code of every call —
        //    including UNAUTHENTICATED / PERMISSION_DENIED / RESOURCE_EXHAUSTED rejections —
        //    and times the whole response body.
        .layer(MetricsLayer::new(cfg.metrics.clone()))
        // 3. Error mapping: the single place where errors from the layers below (typed
        //    `MeshError`s, tower overload/timeout errors, anything unexpected) become status
        //    responses. Above it no layer handles errors.
        .layer(ErrorMapLayer)
        // 4. Identity: reads the peer identity computed once at the TLS handshake and puts a
        //    `Peer` (and `PeerIdentity`) into the request extensions. Under mTLS a request
        //    without a client certificate stops here with UNAUTHENTICATED.
        .layer(CheckLayer::new(IdentityCheck { mtls: cfg.mtls }))
        // 5. Authorization: needs the identity; runs before any limit so a caller that may
        //    not call this RPC cannot drain anybody's budget (PERMISSION_DENIED).
        .layer(CheckLayer::new(AuthzCheck {
            policy: Arc::clone(&cfg.authz),
        }))
        // 6. Per-identity rate limit: keyed by the authorized identity, so one noisy
        //    cluster is throttled (RESOURCE_EXHAUSTED) without hurting the others — and
        //    before the shared concurrency limit, so its excess never occupies slots.
        .layer(CheckLayer::new(RateLimitCheck {
            buckets: cfg.rate_limit.map(TokenBuckets::new),
            policy: Arc::clone(&cfg.authz),
            services: cfg.rate_limited_services.clone(),
            exempt_loopback_plaintext: cfg.rate_limit_exempt_loopback,
        }))
        // 7. Load shed + concurrency limit: a global cap on requests in flight. Shedding
        //    (fail fast with RESOURCE_EXHAUSTED) instead of queueing keeps latency bounded
        //    under overload and tells clients to back off.
        .option_layer(cfg.concurrency_limit.map(|_| LoadShedLayer::new()))
        .option_layer(cfg.concurrency_limit.map(ConcurrencyLimitLayer::new))
        // 8. Timeout, innermost: bounds only the handler (not time spent in the layers
        //    above) and releases the concurrency slot when it fires (DEADLINE_EXCEEDED).
        .layer(DeadlineLayer::new(cfg.timeout))
        .map_err(|never: Infallible| -> BoxError { match never {} })
        .service(inner);
    BoxCloneService::new(svc)
}

/// [`server_stack`] as a tower layer, for `tonic::transport::Server::builder().layer(..)`.
#[derive(Debug, Clone)]
pub struct MeshLayer {
    cfg: ServerStackConfig,
}

impl MeshLayer {
    pub fn new(cfg: ServerStackConfig) -> Self {
        Self { cfg }
    }
}

impl<S: InnerService> Layer<S> for MeshLayer {
    type Service = ServerStackService;

    fn layer(&self, inner: S) -> Self::Service {
        server_stack(inner, &self.cfg)
    }
}
