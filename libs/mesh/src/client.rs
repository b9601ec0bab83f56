//! The client tower stack: trace propagation → metrics → retry → per-attempt timeout → channel.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::{Code, Status};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::backoff::{BackoffPolicy, Jitter};
use crate::channel::{ChannelConfig, ChannelError, Target, connect, connect_lazy};
use crate::error::BoxError;
use crate::layers::{format_grpc_timeout, parse_grpc_timeout, wrapping_layer};
use crate::metrics::{GrpcMetrics, MetricsLayer, grpc_status};

/// What generated clients are built on: `FooClient::new(channel)`. Cheap to clone, `Sync`.
///
/// Its error type is a concrete `Status` rather than a boxed `dyn Error`: tonic keeps the
/// code when converting, and futures using the channel stay provably `Send` (a trait-object
/// error type here trips a higher-ranked-lifetime limitation of the compiler as soon as a
/// call is made inside `tokio::spawn`).
pub type MeshChannel = BoxCloneSyncService<Request<Body>, Response<Body>, Status>;

/// Called before every attempt with the attempt number (0-based) and the request head, e.g.
/// to stamp an attempt header.
pub type AttemptHook = Arc<dyn Fn(u32, &mut http::request::Parts) + Send + Sync>;

/// Which failures are retried and how.
///
/// Only retryable codes are retried, attempts are bounded, and the wait between attempts is
/// exponential with jitter (a random point in the upper half of the window, so synchronized
/// clients spread out without ever retrying immediately). Retries never outlive the call's
/// own `grpc-timeout`.
#[derive(Clone)]
pub struct RetryPolicy {
    /// Total attempts including the first (1 = no retry).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f64,
    pub retry_on: Vec<Code>,
    /// Only these paths are retried by the tower layer (`None`: every request whose body is
    /// complete up front, i.e. unary and server-streaming calls).
    pub paths: Option<HashSet<String>>,
    pub on_attempt: Option<AttemptHook>,
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("multiplier", &self.multiplier)
            .field("retry_on", &self.retry_on)
            .field("paths", &self.paths)
            .field("on_attempt", &self.on_attempt.is_some())
            .finish()
    }
}

impl Default for RetryPolicy {
    /// 4 attempts, 50 ms doubling to at most 2 s, on UNAVAILABLE and DEADLINE_EXCEEDED.
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            multiplier: 2.0,
            retry_on: vec![Code::Unavailable, Code::DeadlineExceeded],
            paths: None,
            on_attempt: None,
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Also retry RESOURCE_EXHAUSTED (rate-limited or shed by the server).
    pub fn retry_resource_exhausted(mut self) -> Self {
        if !self.retry_on.contains(&Code::ResourceExhausted) {
            self.retry_on.push(Code::ResourceExhausted);
        }
        self
    }

    /// Restricts the tower retry layer to these RPC paths (the idempotent ones).
    pub fn only_paths<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.paths = Some(paths.into_iter().map(Into::into).collect());
        self
    }

    pub fn with_attempt_hook(
        mut self,
        hook: impl Fn(u32, &mut http::request::Parts) + Send + Sync + 'static,
    ) -> Self {
        self.on_attempt = Some(Arc::new(hook));
        self
    }

    pub fn is_retryable(&self, code: Code) -> bool {
        self.retry_on.contains(&code)
    }

    fn applies_to(&self, path: &str) -> bool {
        self.max_attempts > 1 && self.paths.as_ref().is_none_or(|p| p.contains(path))
    }

    /// The wait before retry number `retry` (1 = first retry): [`BackoffPolicy`] with
    /// equal jitter.
    pub fn backoff(&self, retry: u32) -> Duration {
        self.backoff_policy().delay(retry.saturating_sub(1))
    }

    /// This policy's waits as a [`BackoffPolicy`] (retry 0 there is retry 1 here).
    pub fn backoff_policy(&self) -> BackoffPolicy {
        BackoffPolicy::new(self.initial_backoff, self.max_backoff)
            .with_multiplier(self.multiplier)
            .with_jitter(Jitter::Equal)
    }

    /// Retries a typed call: `attempt` builds and sends attempt *n* (0-based), so each
    /// attempt can differ — provider calls re-stamp their fencing token with
    /// `sequence_base + n`, which the tower layer (it only sees encoded bytes) cannot do.
    /// Use a channel without tower-level retries for such calls, or attempts multiply.
    pub async fn run<T, F, Fut>(&self, attempt: F) -> Result<T, Status>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.run_with(attempt, |s: &Status| Some(s.code()), |_, _, _| {})
            .await
            .map_err(|e| e.last)
    }

    /// [`run`](Self::run) for callers whose attempts can fail with more than a status:
    /// `code` names the gRPC code of an error (`None`: never retried, e.g. a local failure
    /// to build the request), and `on_retry(retry, &error, wait)` is told about every retry
    /// before its backoff (metrics, logs). The error says how many attempts were made, so
    /// a caller can tell "gave up after n" from "refused at once".
    pub async fn run_with<T, E, F, Fut>(
        &self,
        mut attempt: F,
        code: impl Fn(&E) -> Option<Code>,
        mut on_retry: impl FnMut(u32, &E, Duration),
    ) -> Result<T, Attempts<E>>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut n = 0;
        loop {
            match attempt(n).await {
                Ok(v) => return Ok(v),
                Err(err)
                    if n + 1 < self.max_attempts.max(1)
                        && code(&err).is_some_and(|c| self.is_retryable(c)) =>
                {
                    n += 1;
                    let wait = self.backoff(n);
                    tracing::debug!(attempt = n, code = ?code(&err), ?wait, "retrying call");
                    on_retry(n, &err, wait);
                    tokio::time::sleep(wait).await;
                }
                Err(last) => {
                    return Err(Attempts {
                        last,
                        attempts: n + 1,
                    });
                }
            }
        }
    }
}

/// How a [`RetryPolicy::run_with`] call ended without a value: its last error and the
/// attempts made (1 when the first error was not retryable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempts<E> {
    pub last: E,
    pub attempts: u32,
}

/// What the client stack does around a channel.
#[derive(Debug, Clone, Default)]
pub struct ClientStackConfig {
    /// Client RPC metrics (`GrpcMetrics::client`); `None`: not recorded.
    pub metrics: Option<GrpcMetrics>,
    pub retry: RetryPolicy,
    /// Bound on each attempt (also sent as `grpc-timeout` when tighter than the caller's).
    pub attempt_timeout: Option<Duration>,
}

/// Wraps a channel in the mesh's client middleware, outermost first.
pub fn client_stack<S>(channel: S, cfg: &ClientStackConfig) -> MeshChannel
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let svc = ServiceBuilder::new()
        // 0. Trace propagation: the current span's context goes out as `traceparent` once;
        //    every retry carries the same parent.
        .layer(TracePropagationLayer)
        // 1. Metrics, outside retry: one observation per logical call with its final code
        //    and total latency; retries are counted separately by the retry layer.
        .layer(MetricsLayer::new(cfg.metrics.clone()))
        // 2. Retry: re-sends on retryable codes with jittered exponential backoff, bounded by
        //    attempts and the call's deadline.
        .layer(RetryLayer {
            policy: Arc::new(cfg.retry.clone()),
            metrics: cfg.metrics.clone(),
        })
        // 3. Per-attempt timeout, inside retry, so a hung attempt is abandoned and retried
        //    instead of eating the whole deadline.
        .layer(AttemptTimeoutLayer {
            timeout: cfg.attempt_timeout,
        })
        // 4. The channel (UDS, TCP or TCP+mTLS).
        .service(channel);
    BoxCloneSyncService::new(svc.map_err(to_status))
}

/// Connects now and wraps the channel in [`client_stack`].
pub async fn dial(
    target: &str,
    channel: &ChannelConfig,
    stack: &ClientStackConfig,
) -> Result<MeshChannel, ChannelError> {
    let target: Target = target.parse()?;
    Ok(client_stack(connect(&target, channel).await?, stack))
}

/// As [`dial`], connecting on first use (must be called inside the tokio runtime).
pub fn dial_lazy(
    target: &str,
    channel: &ChannelConfig,
    stack: &ClientStackConfig,
) -> Result<MeshChannel, ChannelError> {
    let target: Target = target.parse()?;
    Ok(client_stack(connect_lazy(&target, channel)?, stack))
}

// === Trace propagation ===

#[derive(Debug, Clone, Copy)]
struct TracePropagationLayer;

wrapping_layer!(TracePropagationLayer => TracePropagation {});

#[derive(Debug, Clone)]
struct TracePropagation<S> {
    inner: S,
}

impl<S> Service<Request<Body>> for TracePropagation<S>
where
    S: Service<Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        if !req
            .headers()
            .contains_key(bigfleet_telemetry::propagation::TRACEPARENT)
        {
            bigfleet_telemetry::propagation::inject_current_span(req.headers_mut());
        }
        self.inner.call(req)
    }
}

// === Retry ===

#[derive(Clone)]
struct RetryLayer {
    policy: Arc<RetryPolicy>,
    metrics: Option<GrpcMetrics>,
}

wrapping_layer!(RetryLayer => Retry { policy, metrics });

#[derive(Clone)]
struct Retry<S> {
    inner: S,
    policy: Arc<RetryPolicy>,
    metrics: Option<GrpcMetrics>,
}

impl<S> Service<Request<Body>> for Retry<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Every attempt drives its own clone to readiness (`oneshot`): the channel is a
        // cheap handle and attempts are sequential.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let policy = Arc::clone(&self.policy);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let path = req.uri().path().to_owned();
            if !policy.applies_to(&path) {
                return single_attempt(inner, req, &policy).await;
            }
            let deadline = parse_grpc_timeout(req.headers()).map(|d| Instant::now() + d);
            let (mut parts, body) = req.into_parts();
            let frames = match buffer_if_ready(body) {
                Buffered::Complete(frames) => frames,
                Buffered::Streaming(body) => {
                    // A client stream cannot be replayed: send it once.
                    return single_attempt(inner, Request::from_parts(parts, body), &policy).await;
                }
            };
            let mut attempt: u32 = 0;
            loop {
                if let Some(hook) = &policy.on_attempt {
                    hook(attempt, &mut parts);
                }
                if let Some(deadline) = deadline {
                    let left = deadline.saturating_duration_since(Instant::now());
                    parts.headers.insert(
                        "grpc-timeout",
                        format_grpc_timeout(left).parse().expect("ascii"),
                    );
                }
                let req = Request::from_parts(parts.clone(), replay(&frames));
                let result = inner.clone().oneshot(req).await;
                let code = match &result {
                    Ok(resp) => grpc_status(resp.headers()),
                    Err(err) => Some(error_code(err)),
                };
                let retry = attempt + 1 < policy.max_attempts
                    && code.is_some_and(|c| policy.is_retryable(c));
                if !retry {
                    return result.map_err(into_status_error);
                }
                attempt += 1;
                let wait = policy.backoff(attempt);
                if deadline.is_some_and(|d| Instant::now() + wait >= d) {
                    return result.map_err(into_status_error);
                }
                let code = code.unwrap_or(Code::Unknown);
                if let Some(m) = &metrics {
                    m.record_retry(&path, code);
                }
                tracing::debug!(path = %path, attempt, ?code, ?wait, "retrying rpc");
                tokio::time::sleep(wait).await;
            }
        })
    }
}

async fn single_attempt<S>(
    inner: S,
    mut req: Request<Body>,
    policy: &RetryPolicy,
) -> Result<Response<Body>, BoxError>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = BoxError>,
{
    if let Some(hook) = &policy.on_attempt {
        let (mut parts, body) = req.into_parts();
        hook(0, &mut parts);
        req = Request::from_parts(parts, body);
    }
    inner.oneshot(req).await.map_err(into_status_error)
}

/// Normalises a transport error into a `Status` (connection refused ⇒ UNAVAILABLE etc.) so
/// every layer above and the generated client see a proper code.
fn into_status_error(err: BoxError) -> BoxError {
    if err.is::<Status>() {
        return err;
    }
    Box::new(to_status(err))
}

fn to_status(err: BoxError) -> Status {
    let err = match err.downcast::<Status>() {
        Ok(status) => return *status,
        Err(err) => err,
    };
    // tonic's channel enforces the caller's `grpc-timeout` itself and would report expiry
    // as CANCELLED; for the caller it is its deadline passing.
    if caused_by::<tonic::TimeoutExpired>(err.as_ref()) {
        return Status::deadline_exceeded(err.to_string());
    }
    Status::from_error(err)
}

fn caused_by<E: std::error::Error + 'static>(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(e) = source {
        if e.is::<E>() {
            return true;
        }
        source = e.source();
    }
    false
}

fn error_code(err: &BoxError) -> Code {
    if let Some(s) = err.downcast_ref::<Status>() {
        return s.code();
    }
    if caused_by::<tonic::TimeoutExpired>(err.as_ref()) {
        return Code::DeadlineExceeded;
    }
    // Walk the chain the way tonic does; anything unrecognised is a transport failure.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err.as_ref());
    while let Some(e) = source {
        if let Some(s) = e.downcast_ref::<Status>() {
            return s.code();
        }
        source = e.source();
    }
    Code::Unavailable
}

enum Buffered {
    Complete(Vec<Frame<Bytes>>),
    Streaming(Body),
}

/// Takes every frame the body has *ready now*. A unary (or server-streaming) request body
/// is complete at once; a client stream is not, and gets passed through unbuffered.
fn buffer_if_ready(mut body: Body) -> Buffered {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut frames = Vec::new();
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => frames.push(frame),
            Poll::Ready(None) => return Buffered::Complete(frames),
            Poll::Ready(Some(Err(status))) => {
                // Surface the error on the single attempt.
                return Buffered::Streaming(Body::new(PrefixedBody {
                    prefix: frames.into(),
                    rest: Body::new(ErrBody(Some(status))),
                }));
            }
            Poll::Pending => {
                return Buffered::Streaming(Body::new(PrefixedBody {
                    prefix: frames.into(),
                    rest: body,
                }));
            }
        }
    }
}

fn replay(frames: &[Frame<Bytes>]) -> Body {
    let copy: VecDeque<Frame<Bytes>> = frames
        .iter()
        .map(|f| match f.data_ref() {
            Some(d) => Frame::data(d.clone()),
            None => Frame::trailers(f.trailers_ref().cloned().unwrap_or_default()),
        })
        .collect();
    Body::new(PrefixedBody {
        prefix: copy,
        rest: Body::empty(),
    })
}

pin_project! {
    struct PrefixedBody {
        prefix: VecDeque<Frame<Bytes>>,
        #[pin]
        rest: Body,
    }
}

impl HttpBody for PrefixedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.project();
        if let Some(frame) = this.prefix.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        this.rest.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.rest.is_end_stream()
    }
}

struct ErrBody(Option<Status>);

impl HttpBody for ErrBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}

// === Per-attempt timeout ===

#[derive(Debug, Clone, Copy)]
struct AttemptTimeoutLayer {
    timeout: Option<Duration>,
}

wrapping_layer!(AttemptTimeoutLayer => AttemptTimeout { timeout });

#[derive(Debug, Clone)]
struct AttemptTimeout<S> {
    inner: S,
    timeout: Option<Duration>,
}

impl<S> Service<Request<Body>> for AttemptTimeout<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        let Some(limit) = self.timeout else {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        };
        // Tell the server too, so it can stop working on an attempt we have abandoned.
        let caller = parse_grpc_timeout(req.headers());
        if caller.is_none_or(|c| c > limit) {
            req.headers_mut().insert(
                "grpc-timeout",
                format_grpc_timeout(limit).parse().expect("ascii"),
            );
        }
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Box::new(Status::deadline_exceeded(format!(
                    "attempt timed out after {limit:?}"
                ))) as BoxError),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let p = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            ..RetryPolicy::default()
        };
        for _ in 0..200 {
            let b1 = p.backoff(1);
            assert!(
                b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100),
                "{b1:?}"
            );
            let b3 = p.backoff(3);
            assert!(
                b3 >= Duration::from_millis(200) && b3 <= Duration::from_millis(400),
                "{b3:?}"
            );
            let b10 = p.backoff(10);
            assert!(b10 >= Duration::from_millis(500) && b10 <= Duration::from_millis(1000));
            assert!(p.backoff(u32::MAX) <= Duration::from_millis(1000));
        }
        let distinct: HashSet<_> = (0..50).map(|_| p.backoff(2)).collect();
        assert!(distinct.len() > 1, "jitter must vary");
    }

    #[tokio::test(start_paused = true)]
    async fn run_retries_only_retryable_codes_and_stops_at_the_bound() {
        let p = RetryPolicy::default();
        let mut seen = Vec::new();
        let r: Result<(), Status> = p
            .run(|n| {
                seen.push(n);
                async { Err(Status::unavailable("down")) }
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::Unavailable);
        assert_eq!(seen, vec![0, 1, 2, 3]);

        let mut calls = 0;
        let r: Result<(), Status> = p
            .run(|_| {
                calls += 1;
                async { Err(Status::failed_precondition("fenced")) }
            })
            .await;
        assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);
        assert_eq!(calls, 1);

        let r = p
            .run(|n| async move {
                if n < 2 {
                    Err(Status::deadline_exceeded("slow"))
                } else {
                    Ok(n)
                }
            })
            .await;
        assert_eq!(r.unwrap(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn run_with_reports_retries_and_attempts_and_never_retries_uncoded_errors() {
        let p = RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        };
        let code = |e: &Result<Status, &str>| e.as_ref().ok().map(Status::code);
        let mut retries = Vec::new();
        let r: Result<(), _> = p
            .run_with(
                |_| async { Err(Ok(Status::unavailable("down"))) },
                code,
                |n, _, wait| retries.push((n, wait)),
            )
            .await;
        let err = r.unwrap_err();
        assert_eq!(err.attempts, 3);
        assert_eq!(err.last.unwrap().code(), Code::Unavailable);
        assert_eq!(retries.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2]);
        assert!(
            retries
                .iter()
                .all(|(n, w)| *w <= p.initial_backoff * 2u32.pow(*n - 1))
        );

        // An error without a code (here: a local failure) is final on the first attempt.
        let mut calls = 0;
        let r: Result<(), _> = p
            .run_with(
                |_| {
                    calls += 1;
                    async { Err(Err("no token left")) }
                },
                code,
                |_, _, _| panic!("not retried"),
            )
            .await;
        let err = r.unwrap_err();
        assert_eq!(err.attempts, 1);
        assert_eq!(err.last.unwrap_err(), "no token left");
        assert_eq!(calls, 1);
    }

    #[tokio::test]
    async fn only_bodies_complete_up_front_are_buffered() {
        use http_body_util::BodyExt;
        let full = Body::new(http_body_util::Full::new(Bytes::from_static(b"abc")));
        let Buffered::Complete(frames) = buffer_if_ready(full) else {
            panic!("a full body is complete");
        };
        assert_eq!(frames.len(), 1);
        let again = replay(&frames).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abc");
        assert_eq!(
            &replay(&frames).collect().await.unwrap().to_bytes()[..],
            b"abc"
        );

        // A client stream with one message sent so far: passed through, nothing lost.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Status>>(4);
        tx.try_send(Ok(Frame::data(Bytes::from_static(b"first"))))
            .unwrap();
        let body = Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let Buffered::Streaming(body) = buffer_if_ready(body) else {
            panic!("an open stream is not buffered");
        };
        tx.try_send(Ok(Frame::data(Bytes::from_static(b"-second"))))
            .unwrap();
        drop(tx);
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"first-second");
    }

    #[test]
    fn resource_exhausted_is_opt_in() {
        assert!(!RetryPolicy::default().is_retryable(Code::ResourceExhausted));
        assert!(
            RetryPolicy::default()
                .retry_resource_exhausted()
                .is_retryable(Code::ResourceExhausted)
        );
        let p = RetryPolicy::default().only_paths(["/a.B/C"]);
        assert!(p.applies_to("/a.B/C"));
        assert!(!p.applies_to("/a.B/D"));
        assert!(!RetryPolicy::none().applies_to("/a.B/C"));
    }
}
