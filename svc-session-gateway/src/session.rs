//! One operator session's shared state and its outbound frame stream.
//!
//! Memory matters here (10,000 idle sessions per gateway), so a session is one small
//! allocation: no per-session channels, tasks only while there is work, and queues that
//! allocate on first use and free their storage once drained. The receive pump, the roll-up lane, the Gateway service and the
//! outbound stream all meet in [`SessionInner`] behind one short-held mutex.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bigfleet_proto::v1alpha1::{
    Acknowledgement, BootstrapBlobResponse, ClusterCapacityNeeds, ShardMessage, shard_message,
};
use bigfleet_telemetry::propagation::TRACEPARENT;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::codegen::http::{HeaderMap, HeaderValue};

use crate::metrics::GatewayMetrics;
use crate::outbox::{Offer, Outbox};

/// Control frames (acks, bootstrap requests, reclaim instructions) waiting to be written.
/// They are small and rare; a full queue means the operator stopped reading.
pub const CONTROL_CAPACITY: usize = 256;
/// Bootstrap requests one session may have outstanding.
pub const MAX_PENDING_BOOTSTRAPS: usize = 1024;

/// The Acknowledgement echo of a Hello.
pub const ECHO_HELLO: &str = "hello";
/// The Acknowledgement echo of an applied (or quarantined) roll-up.
pub const ECHO_ROLLUP: &str = "rollup";
/// Echo prefix of a roll-up rejected at the trust boundary; the reason follows. Operators
/// only log echoes, so this tells them what is wrong without ending the stream.
pub const ECHO_ROLLUP_REJECTED: &str = "rollup rejected: ";
/// Echo prefix of a valid roll-up that could not be applied (decide unreachable).
pub const ECHO_ROLLUP_NOT_APPLIED: &str = "rollup not applied: ";

/// SessionClosed reasons.
pub const REASON_REPLACED: &str = "replaced";
pub const REASON_CLIENT_CLOSED: &str = "client_closed";
pub const REASON_ERROR: &str = "error";
pub const REASON_SHUTDOWN: &str = "shutdown";

/// Token bucket for the per-cluster roll-up rate limit.
#[derive(Debug, Clone, Copy)]
pub struct RollupRate {
    pub per_second: f64,
    pub burst: u32,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn full(rate: RollupRate) -> Self {
        Self {
            tokens: f64::from(rate.burst.max(1)),
            last: Instant::now(),
        }
    }

    /// Takes a token, or says how long until one is available.
    fn take(&mut self, rate: RollupRate) -> Result<(), Duration> {
        if rate.per_second <= 0.0 {
            return Ok(()); // rate limiting disabled
        }
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(f64::from(rate.burst.max(1)));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / rate.per_second,
            ))
        }
    }
}

/// A roll-up waiting in the lane.
#[derive(Debug)]
pub struct PendingRollup {
    pub rollup: ClusterCapacityNeeds,
    pub received_at_unix_nanos: i64,
}

/// What the lane worker should do next.
#[derive(Debug)]
pub enum LaneStep {
    /// Process this roll-up.
    Process(PendingRollup),
    /// The rate limit allows the next roll-up only after this wait.
    Wait(Duration),
    /// Nothing queued: the worker has been marked stopped and must exit.
    Idle,
}

/// Why a control frame could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueError {
    /// The session has ended.
    Closed,
    /// The operator is not reading (control queue or pending table at capacity).
    Full,
}

/// The part of a session behind the mutex.
struct SessionInner {
    control: VecDeque<ShardMessage>,
    outbox: Outbox<ShardMessage>,
    /// Published frames are held back until the hello Ack is queued, so the operator always
    /// sees the Ack before the resync.
    outbox_open: bool,
    waker: Option<Waker>,
    /// Set when the session ends; the outbound stream yields it (if any) and finishes.
    end: Option<Option<Status>>,
    ended: bool,
    /// Why the session ended (reported to decide in SessionClosed).
    reason: &'static str,
    pending_rollup: Option<PendingRollup>,
    lane_running: bool,
    bucket: Bucket,
    bootstraps: HashMap<String, oneshot::Sender<BootstrapBlobResponse>>,
    /// Fingerprint of the last roll-up of this session that passed validation.
    last_valid: Option<bigfleet_conv::RollupFingerprint>,
}

/// One live (or just ended) operator session.
pub struct Session {
    pub id: u64,
    pub cluster: Arc<str>,
    pub opened_at_unix_nanos: i64,
    pub last_rollup_unix_nanos: AtomicI64,
    /// Cancelled when the session ends for any reason; the receive pump and lane stop.
    pub closed: CancellationToken,
    rate: RollupRate,
    inner: Mutex<SessionInner>,
    metrics: GatewayMetrics,
    /// The operator's W3C trace context from the Session call, if it sent one: each
    /// roll-up's span is its child. Boxed because almost no session carries one.
    operator_trace: OnceLock<Box<HeaderMap>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub fn new(
        id: u64,
        cluster: &str,
        outbox_capacity: usize,
        rate: RollupRate,
        metrics: GatewayMetrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            id,
            cluster: Arc::from(cluster),
            opened_at_unix_nanos: crate::unix_nanos(),
            last_rollup_unix_nanos: AtomicI64::new(0),
            closed: CancellationToken::new(),
            rate,
            inner: Mutex::new(SessionInner {
                control: VecDeque::new(),
                outbox: Outbox::new(outbox_capacity),
                outbox_open: false,
                waker: None,
                end: None,
                ended: false,
                reason: "",
                pending_rollup: None,
                lane_running: false,
                bucket: Bucket::full(rate),
                bootstraps: HashMap::new(),
                last_valid: None,
            }),
            metrics,
            operator_trace: OnceLock::new(),
        })
    }

    /// Whether a roll-up with fingerprint `fp` already passed validation on this session
    /// (operators re-send unchanged demand on an interval; ADR-0113).
    pub fn validated_before(&self, fp: bigfleet_conv::RollupFingerprint) -> bool {
        self.inner.lock().last_valid == Some(fp)
    }

    /// Remembers that the roll-up with fingerprint `fp` passed validation.
    pub fn mark_validated(&self, fp: bigfleet_conv::RollupFingerprint) {
        self.inner.lock().last_valid = Some(fp);
    }

    /// Keeps the trace context the operator opened the session with (`traceparent` /
    /// `tracestate` only); nothing is kept when it sent none.
    pub fn set_operator_trace(&self, metadata: &tonic::metadata::MetadataMap) {
        let value = |key: &str| {
            metadata
                .get(key)
                .and_then(|v| HeaderValue::from_bytes(v.as_encoded_bytes()).ok())
        };
        let Some(parent) = value(TRACEPARENT) else {
            return;
        };
        let mut kept = HeaderMap::new();
        kept.insert(TRACEPARENT, parent);
        if let Some(state) = value("tracestate") {
            kept.insert("tracestate", state);
        }
        let _ = self.operator_trace.set(Box::new(kept));
    }

    /// The span one roll-up is processed in: a child of the operator's context when the
    /// session carried one, otherwise the root of a new trace (never the long-lived
    /// session's, which would glue every roll-up of a session into one trace).
    pub fn rollup_span(&self, rows: usize) -> tracing::Span {
        let span = tracing::info_span!(
            parent: None,
            "rollup",
            otel.name = "gateway rollup",
            cluster = %self.cluster,
            session = self.id,
            rows,
        );
        if let Some(parent) = self.operator_trace.get() {
            bigfleet_telemetry::propagation::set_parent_from_headers(&span, parent);
        }
        span
    }

    /// Carries the rate-limit budget over from the session this one replaces, so
    /// reconnecting is no way around the per-cluster limit.
    pub fn inherit_rate_budget(&self, previous: &Session) {
        let bucket = previous.inner.lock().bucket;
        self.inner.lock().bucket = bucket;
    }

    /// The outbound half of the stream. Call once.
    pub fn outbound(self: &Arc<Self>) -> SessionStream {
        SessionStream {
            session: Arc::clone(self),
        }
    }

    /// Queues a control frame (acks, bootstrap requests, reclaim instructions).
    pub fn send_control(&self, msg: shard_message::Payload) -> Result<(), QueueError> {
        let mut inner = self.inner.lock();
        if inner.end.is_some() || inner.ended {
            return Err(QueueError::Closed);
        }
        if inner.control.len() >= CONTROL_CAPACITY {
            return Err(QueueError::Full);
        }
        inner.control.push_back(ShardMessage { payload: Some(msg) });
        wake(&mut inner);
        Ok(())
    }

    /// Queues an Acknowledgement.
    pub fn ack(&self, echo: impl Into<String>, coordinator_term: i64, shard_epoch: i64) {
        let payload = shard_message::Payload::Ack(Acknowledgement {
            echo: echo.into(),
            coordinator_term,
            shard_epoch,
        });
        if let Err(e) = self.send_control(payload) {
            tracing::debug!(cluster = %self.cluster, error = ?e, "acknowledgement not queued");
        }
    }

    /// Lets published frames flow (after the hello Ack is queued).
    pub fn open_outbox(&self) {
        let mut inner = self.inner.lock();
        inner.outbox_open = true;
        wake(&mut inner);
    }

    /// Offers a published frame to the coalescing outbox.
    pub fn publish(&self, key: &str, msg: shard_message::Payload) -> Result<Offer, QueueError> {
        let mut inner = self.inner.lock();
        if inner.end.is_some() || inner.ended {
            return Err(QueueError::Closed);
        }
        let offer = inner.outbox.offer(key, ShardMessage { payload: Some(msg) });
        if offer == Offer::Queued {
            wake(&mut inner);
        }
        Ok(offer)
    }

    /// Puts a roll-up in the one-slot lane. Returns whether a queued roll-up was replaced
    /// and whether the caller must start a lane worker (none is running).
    pub fn offer_rollup(&self, rollup: PendingRollup) -> (bool, bool) {
        let mut inner = self.inner.lock();
        let replaced = inner.pending_rollup.replace(rollup).is_some();
        let start = !inner.lane_running;
        inner.lane_running = true;
        (replaced, start)
    }

    /// The lane worker's next step; see [`LaneStep`]. A rate-limit token is only spent
    /// when there is a roll-up to process.
    pub fn next_lane_step(&self) -> LaneStep {
        let mut inner = self.inner.lock();
        if inner.pending_rollup.is_none() || inner.ended || inner.end.is_some() {
            inner.lane_running = false;
            inner.pending_rollup = None;
            return LaneStep::Idle;
        }
        let rate = self.rate;
        match inner.bucket.take(rate) {
            Ok(()) => LaneStep::Process(inner.pending_rollup.take().expect("checked above")),
            Err(wait) => LaneStep::Wait(wait),
        }
    }

    /// Registers a bootstrap request and queues its frame.
    pub fn begin_bootstrap(
        &self,
        request_id: &str,
        frame: shard_message::Payload,
    ) -> Result<oneshot::Receiver<BootstrapBlobResponse>, QueueError> {
        let mut inner = self.inner.lock();
        if inner.end.is_some() || inner.ended {
            return Err(QueueError::Closed);
        }
        if inner.control.len() >= CONTROL_CAPACITY
            || inner.bootstraps.len() >= MAX_PENDING_BOOTSTRAPS
        {
            return Err(QueueError::Full);
        }
        let (tx, rx) = oneshot::channel();
        inner.bootstraps.insert(request_id.to_owned(), tx);
        inner.control.push_back(ShardMessage {
            payload: Some(frame),
        });
        wake(&mut inner);
        Ok(rx)
    }

    /// Forgets a bootstrap request (timed out), so a late answer is dropped.
    pub fn cancel_bootstrap(&self, request_id: &str) {
        self.inner.lock().bootstraps.remove(request_id);
    }

    /// Hands an operator's answer to the waiting request; `false` when none waits (late or
    /// unknown id).
    pub fn complete_bootstrap(&self, response: BootstrapBlobResponse) -> bool {
        let waiter = self.inner.lock().bootstraps.remove(&response.request_id);
        match waiter {
            Some(tx) => tx.send(response).is_ok(),
            None => false,
        }
    }

    /// Ends the session: the outbound stream yields `status` (or just finishes) and the pump
    /// and lane stop. Queued frames are dropped; waiting bootstrap requests fail at once.
    /// Idempotent: the first call decides the reason and status.
    pub fn end(&self, reason: &'static str, status: Option<Status>) {
        let dropped = {
            let mut inner = self.inner.lock();
            if inner.end.is_some() || inner.ended {
                return;
            }
            inner.end = Some(status);
            inner.reason = reason;
            inner.pending_rollup = None;
            inner.bootstraps.clear();
            inner.control.clear();
            let dropped = inner.outbox.clear();
            wake(&mut inner);
            dropped
        };
        self.metrics.dropped("closed", dropped as u64);
        self.closed.cancel();
    }

    /// Why the session ended (`replaced`, `client_closed`, `error`, `shutdown`); empty
    /// while it is live.
    pub fn end_reason(&self) -> &'static str {
        self.inner.lock().reason
    }

    #[cfg(test)]
    pub(crate) fn queued_outbox(&self) -> usize {
        self.inner.lock().outbox.len()
    }
}

fn wake(inner: &mut SessionInner) {
    if let Some(w) = inner.waker.take() {
        w.wake();
    }
}

/// The frames written to the operator: control frames first, then coalesced published
/// frames, and finally the session's end status. Dropping it (the client went away) ends
/// the session.
pub struct SessionStream {
    session: Arc<Session>,
}

impl futures::Stream for SessionStream {
    type Item = Result<ShardMessage, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut inner = self.session.inner.lock();
        if inner.ended {
            return Poll::Ready(None);
        }
        if let Some(end) = inner.end.take() {
            inner.ended = true;
            return Poll::Ready(end.map(Err));
        }
        if let Some(msg) = inner.control.pop_front() {
            return Poll::Ready(Some(Ok(msg)));
        }
        if inner.outbox_open
            && let Some(msg) = inner.outbox.pop()
        {
            return Poll::Ready(Some(Ok(msg)));
        }
        // Drained: an idle session keeps no queue memory (an ack every couple of seconds
        // re-allocating is far cheaper than 10,000 sessions each holding it).
        if inner.control.capacity() > 0 {
            inner.control = VecDeque::new();
        }
        if !inner
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            inner.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for SessionStream {
    fn drop(&mut self) {
        // hyper drops the response body when the client disconnects or resets the stream.
        self.session.end(REASON_CLIENT_CLOSED, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_proto::v1alpha1::NodeStateUpdate;
    use futures::StreamExt;

    fn session() -> Arc<Session> {
        Session::new(
            1,
            "c1",
            8,
            RollupRate {
                per_second: 0.0,
                burst: 1,
            },
            GatewayMetrics::unregistered(),
        )
    }

    fn node(key: &str, state: i32) -> shard_message::Payload {
        shard_message::Payload::NodeStateUpdate(NodeStateUpdate {
            supersedes_key: key.into(),
            state,
            ..Default::default()
        })
    }

    fn rollup(ts: i64) -> PendingRollup {
        PendingRollup {
            rollup: ClusterCapacityNeeds {
                cluster_id: "c1".into(),
                timestamp_unix_nanos: ts,
                needs: vec![],
            },
            received_at_unix_nanos: ts,
        }
    }

    #[tokio::test]
    async fn control_first_and_outbox_only_after_the_hello_ack() {
        let s = session();
        let mut out = s.outbound();
        s.publish("node:a", node("node:a", 1)).unwrap();
        s.publish("node:a", node("node:a", 2)).unwrap();
        // Nothing may be sent before the hello Ack.
        assert!(futures::poll!(out.next()).is_pending());
        s.ack(ECHO_HELLO, 3, 7);
        s.open_outbox();
        let first = out.next().await.unwrap().unwrap();
        assert!(
            matches!(first.payload, Some(shard_message::Payload::Ack(ref a)) if a.echo == "hello" && a.shard_epoch == 7 && a.coordinator_term == 3)
        );
        let second = out.next().await.unwrap().unwrap();
        assert!(
            matches!(second.payload, Some(shard_message::Payload::NodeStateUpdate(ref u)) if u.state == 2),
            "only the newest frame per key: {second:?}"
        );
        assert!(futures::poll!(out.next()).is_pending());
        assert_eq!(
            s.inner.lock().control.capacity(),
            0,
            "a drained control queue holds no memory"
        );
        s.end(REASON_REPLACED, Some(Status::aborted("replaced")));
        let end = out.next().await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Aborted);
        assert!(out.next().await.is_none());
        assert!(s.closed.is_cancelled());
        assert_eq!(s.send_control(node("x", 1)), Err(QueueError::Closed));
    }

    #[test]
    fn lane_is_one_slot_latest_wins() {
        let s = session();
        assert_eq!(
            s.offer_rollup(rollup(1)),
            (false, true),
            "first offer starts a worker"
        );
        assert_eq!(
            s.offer_rollup(rollup(2)),
            (true, false),
            "second replaces the first"
        );
        match s.next_lane_step() {
            LaneStep::Process(p) => assert_eq!(p.rollup.timestamp_unix_nanos, 2),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(s.next_lane_step(), LaneStep::Idle));
        assert_eq!(
            s.offer_rollup(rollup(3)),
            (false, true),
            "worker stopped; restart"
        );
    }

    #[test]
    fn only_the_operators_w3c_context_is_kept() {
        let s = session();
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert("x-other", "1".parse().unwrap());
        s.set_operator_trace(&md);
        assert!(
            s.operator_trace.get().is_none(),
            "no traceparent, nothing kept"
        );

        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        md.insert(TRACEPARENT, parent.parse().unwrap());
        md.insert("tracestate", "k=v".parse().unwrap());
        s.set_operator_trace(&md);
        let kept = s.operator_trace.get().expect("kept");
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.get(TRACEPARENT).unwrap(), parent);
        assert_eq!(kept.get("tracestate").unwrap(), "k=v");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_makes_the_lane_wait() {
        let s = Session::new(
            1,
            "c1",
            8,
            RollupRate {
                per_second: 2.0,
                burst: 1,
            },
            GatewayMetrics::unregistered(),
        );
        s.offer_rollup(rollup(1));
        assert!(matches!(s.next_lane_step(), LaneStep::Process(_)));
        s.offer_rollup(rollup(2));
        match s.next_lane_step() {
            LaneStep::Wait(d) => assert!(
                d > Duration::from_millis(400) && d <= Duration::from_millis(500),
                "{d:?}"
            ),
            other => panic!("unexpected {other:?}"),
        }
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(matches!(s.next_lane_step(), LaneStep::Process(_)));
    }

    #[tokio::test]
    async fn bootstrap_answers_match_by_id_and_late_ones_are_dropped() {
        let s = session();
        let payload = |id: &str| {
            shard_message::Payload::BootstrapRequest(bigfleet_proto::v1alpha1::BootstrapRequest {
                request_id: id.into(),
                ..Default::default()
            })
        };
        let rx = s.begin_bootstrap("aaaa", payload("aaaa")).unwrap();
        let answer = |id: &str| BootstrapBlobResponse {
            request_id: id.into(),
            user_data: id.as_bytes().to_vec(),
            ..Default::default()
        };
        assert!(
            !s.complete_bootstrap(answer("bbbb")),
            "unknown id is dropped"
        );
        assert!(s.complete_bootstrap(answer("aaaa")));
        assert_eq!(rx.await.unwrap().user_data, b"aaaa");
        let _rx = s.begin_bootstrap("cccc", payload("cccc")).unwrap();
        s.cancel_bootstrap("cccc");
        assert!(
            !s.complete_bootstrap(answer("cccc")),
            "late answer is dropped"
        );
        // Ending the session fails waiting requests at once.
        let rx = s.begin_bootstrap("dddd", payload("dddd")).unwrap();
        s.end(REASON_ERROR, None);
        assert!(rx.await.is_err());
    }

    #[test]
    fn control_queue_is_bounded() {
        let s = session();
        for _ in 0..CONTROL_CAPACITY {
            s.send_control(node("k", 1)).unwrap();
        }
        assert_eq!(s.send_control(node("k", 1)), Err(QueueError::Full));
    }

    #[test]
    fn ending_drops_queued_frames() {
        let s = session();
        s.publish("a", node("a", 1)).unwrap();
        s.publish("b", node("b", 1)).unwrap();
        assert_eq!(s.queued_outbox(), 2);
        s.end(REASON_SHUTDOWN, None);
        assert_eq!(s.queued_outbox(), 0);
        assert_eq!(s.end_reason(), REASON_SHUTDOWN);
        assert_eq!(s.publish("c", node("c", 1)), Err(QueueError::Closed));
    }
}
