//! `bigfleet.v1alpha1.Shard/Session`: Hello first, identity binding, one session per
//! cluster, the receive pump and the roll-up lane.

use std::sync::Arc;

use bigfleet_mesh::{IntoStatus, Peer, PeerIdentity, peer_of};
use bigfleet_proto::mesh::v1::{
    ApplyRollupRequest, RollupOutcome, SessionClosedRequest, SessionOpenedRequest,
};
use bigfleet_proto::v1alpha1::shard_server::Shard;
use bigfleet_proto::v1alpha1::{OperatorMessage, operator_message};
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::error::SessionError;
use crate::session::{
    ECHO_HELLO, ECHO_ROLLUP, ECHO_ROLLUP_NOT_APPLIED, ECHO_ROLLUP_REJECTED, LaneStep,
    PendingRollup, REASON_CLIENT_CLOSED, REASON_ERROR, REASON_REPLACED, Session, SessionStream,
};
use crate::state::GatewayState;

/// The public session service.
#[derive(Debug, Clone)]
pub struct ShardService {
    gw: Arc<GatewayState>,
}

impl ShardService {
    pub fn new(gw: Arc<GatewayState>) -> Self {
        Self { gw }
    }

    fn refuse(&self, reason: &str, err: SessionError) -> Status {
        self.gw.metrics.refused(reason);
        err.into_status()
    }

    /// Binds the Hello's cluster to the client certificate (mTLS only).
    fn bind_identity(&self, peer: Option<&Peer>, cluster: &str) -> Result<(), Status> {
        let Some(peer) = peer else {
            return Ok(()); // not behind the mesh stack: no TLS facts, nothing to bind
        };
        match peer.ensure(&PeerIdentity::Cluster(cluster.to_owned())) {
            Ok(()) => Ok(()),
            Err(denied) => {
                self.gw.metrics.identity_rejected.inc();
                tracing::error!(
                    cluster = %cluster,
                    peer = %peer,
                    reason = denied.message(),
                    "session refused: client certificate does not match the hello (possible impersonation)"
                );
                Err(self.refuse(
                    "identity",
                    SessionError::Identity(denied.message().to_owned()),
                ))
            }
        }
    }
}

#[tonic::async_trait]
impl Shard for ShardService {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<OperatorMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        let gw = &self.gw;
        let peer = peer_of(&request).cloned();
        let operator_trace = request.metadata().clone();
        let mut inbound = request.into_inner();

        // 1. Hello first.
        let first = match tokio::time::timeout(gw.settings.hello_timeout, inbound.message()).await {
            Err(_) => {
                return Err(self.refuse(
                    "hello_timeout",
                    SessionError::HelloTimeout(gw.settings.hello_timeout),
                ));
            }
            Ok(Err(status)) => {
                // The first-frame bound fails the body at the length prefix (session_server).
                if status.code() == tonic::Code::ResourceExhausted {
                    self.gw.metrics.refused("hello_too_large");
                }
                return Err(status);
            }
            Ok(Ok(None)) => return Err(self.refuse("invalid_hello", SessionError::NoHello)),
            Ok(Ok(Some(msg))) => msg,
        };
        let hello = match first.payload {
            Some(operator_message::Payload::Hello(h)) => h,
            other => {
                let got = payload_name(other.as_ref());
                return Err(self.refuse("invalid_hello", SessionError::NotHello { got }));
            }
        };
        if hello.cluster_id.is_empty() {
            return Err(self.refuse("invalid_hello", SessionError::EmptyClusterId));
        }
        // The same alphabet an identity SAN may carry (so an mTLS cluster always passes),
        // bounded: the id becomes a metric label and a log field for the session's life.
        let plain = hello.cluster_id.len() <= 253
            && hello
                .cluster_id
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%'));
        if !plain {
            return Err(self.refuse("invalid_hello", SessionError::BadClusterId));
        }
        let cluster = hello.cluster_id;

        // 2. The certificate must name that cluster.
        self.bind_identity(peer.as_ref(), &cluster)?;
        if gw.shutdown.is_cancelled() {
            return Err(self.refuse("shutdown", SessionError::ShuttingDown));
        }

        // 3. One session per cluster: install, replacing (and closing) an older one.
        let session = Session::new(
            gw.registry.next_session_id(),
            &cluster,
            gw.settings.outbox_capacity,
            gw.settings.rollup_rate,
            gw.metrics.clone(),
        );
        session.set_operator_trace(&operator_trace);
        let mut guard = InstallGuard {
            gw: Arc::clone(gw),
            session: Arc::clone(&session),
            armed: true,
        };
        match gw.registry.install(Arc::clone(&session)) {
            Err(cap) => {
                guard.armed = false;
                tracing::warn!(cluster = %cluster, max = cap.max_sessions, "session refused: at capacity");
                return Err(self.refuse(
                    "max_sessions",
                    SessionError::AtCapacity {
                        max_sessions: cap.max_sessions,
                    },
                ));
            }
            Ok(Some(old)) => {
                session.inherit_rate_budget(&old);
                tracing::info!(cluster = %cluster, old = old.id, new = session.id, "session replaced");
                old.end(
                    REASON_REPLACED,
                    Some(
                        SessionError::Replaced {
                            cluster: cluster.clone(),
                        }
                        .into_status(),
                    ),
                );
            }
            Ok(None) => {}
        }

        // 4. Tell decide (which resyncs the cluster's node states through Publish), then ack.
        let opened = gw
            .decide
            .session_opened(SessionOpenedRequest {
                cluster_id: cluster.clone(),
                session_id: session.id,
                protocol_version: hello.protocol_version.clone(),
            })
            .await;
        let opened = match opened {
            Ok(o) => o,
            Err(status) => {
                tracing::warn!(cluster = %cluster, error = %status.message(), "session refused: decide did not take SessionOpened");
                // The guard removes the half-installed session.
                return Err(self.refuse(
                    "decide_unavailable",
                    SessionError::DecideUnavailable(status.message().to_owned()),
                ));
            }
        };
        session.ack(ECHO_HELLO, opened.coordinator_term, opened.shard_epoch);
        session.open_outbox();
        guard.armed = false;
        tracing::info!(
            cluster = %cluster,
            session = session.id,
            protocol = %hello.protocol_version,
            resync = opened.resync_machines,
            "session open"
        );

        let outbound = session.outbound();
        tokio::spawn(pump(Arc::clone(gw), session, inbound));
        Ok(Response::new(outbound))
    }
}

/// Undoes a half-finished install if the handler fails or is cancelled (the client went
/// away during SessionOpened).
struct InstallGuard {
    gw: Arc<GatewayState>,
    session: Arc<Session>,
    armed: bool,
}

impl Drop for InstallGuard {
    fn drop(&mut self) {
        if self.armed {
            self.session.end(REASON_ERROR, None);
            self.gw.registry.remove(&self.session);
            report_closed(&self.gw, &self.session);
        }
    }
}

fn payload_name(p: Option<&operator_message::Payload>) -> &'static str {
    match p {
        None => "an empty frame",
        Some(operator_message::Payload::Hello(_)) => "hello",
        Some(operator_message::Payload::Rollup(_)) => "rollup",
        Some(operator_message::Payload::BootstrapResponse(_)) => "bootstrap_response",
        Some(operator_message::Payload::ReclaimAck(_)) => "reclaim_ack",
    }
}

/// The receive pump: reads operator frames and never waits on slow work. Bootstrap answers,
/// reclaim acks and re-Hellos are handled inline; roll-ups go to the session's lane.
async fn pump(
    gw: Arc<GatewayState>,
    session: Arc<Session>,
    mut inbound: Streaming<OperatorMessage>,
) {
    loop {
        let next = tokio::select! {
            biased;
            () = session.closed.cancelled() => break,
            next = inbound.message() => next,
        };
        match next {
            Ok(Some(msg)) => {
                if let Err(err) = handle_frame(&gw, &session, msg) {
                    tracing::warn!(cluster = %session.cluster, error = %err, "ending session");
                    session.end(REASON_ERROR, Some(err.into_status()));
                }
            }
            Ok(None) => {
                session.end(REASON_CLIENT_CLOSED, None);
            }
            Err(status) => {
                let reason = if status.code() == Code::Cancelled {
                    REASON_CLIENT_CLOSED
                } else {
                    REASON_ERROR
                };
                tracing::debug!(cluster = %session.cluster, error = %status, "session stream failed");
                session.end(reason, None);
            }
        }
    }
    let removed = gw.registry.remove(&session);
    tracing::info!(
        cluster = %session.cluster,
        session = session.id,
        reason = session.end_reason(),
        removed,
        "session closed"
    );
    report_closed(&gw, &session);
}

/// Tells decide a session ended, in the background (decide ignores it when a newer session
/// of the cluster is already open).
fn report_closed(gw: &Arc<GatewayState>, session: &Arc<Session>) {
    let gw = Arc::clone(gw);
    let req = SessionClosedRequest {
        cluster_id: session.cluster.to_string(),
        session_id: session.id,
        reason: match session.end_reason() {
            "" => REASON_ERROR.to_owned(),
            r => r.to_owned(),
        },
    };
    tokio::spawn(async move {
        if let Err(status) = gw.decide.session_closed(req).await {
            tracing::debug!(error = %status.message(), "SessionClosed not delivered to decide");
        }
    });
}

fn handle_frame(
    gw: &Arc<GatewayState>,
    session: &Arc<Session>,
    msg: OperatorMessage,
) -> Result<(), SessionError> {
    match msg.payload {
        Some(operator_message::Payload::Hello(hello)) => {
            if *hello.cluster_id != *session.cluster {
                return Err(SessionError::ClusterChanged {
                    session: session.cluster.to_string(),
                    got: hello.cluster_id,
                });
            }
            let (epoch, term) = gw.decide.epoch_term();
            session.ack(ECHO_HELLO, term, epoch);
        }
        Some(operator_message::Payload::Rollup(rollup)) => {
            let now = crate::unix_nanos();
            gw.metrics.rollups_received.inc();
            session
                .last_rollup_unix_nanos
                .store(now, std::sync::atomic::Ordering::Relaxed);
            let (replaced, start) = session.offer_rollup(PendingRollup {
                rollup,
                received_at_unix_nanos: now,
            });
            if replaced {
                gw.metrics.rollups_replaced.inc();
            }
            if start {
                tokio::spawn(lane(Arc::clone(gw), Arc::clone(session)));
            }
        }
        Some(operator_message::Payload::BootstrapResponse(resp)) => {
            let id = resp.request_id.clone();
            if !session.complete_bootstrap(resp) {
                gw.metrics.bootstrap_responses_unmatched.inc();
                tracing::debug!(cluster = %session.cluster, request_id = %id, "bootstrap response dropped: no request waiting (late or unknown id)");
            }
        }
        Some(operator_message::Payload::ReclaimAck(ack)) => {
            gw.metrics.reclaim_acks.inc();
            tracing::debug!(
                cluster = %session.cluster,
                instruction_id = %ack.instruction_id,
                nodes_started = ack.nodes_started,
                "reclaim acknowledged"
            );
        }
        None => {
            tracing::debug!(cluster = %session.cluster, "empty operator frame ignored");
        }
    }
    Ok(())
}

/// The roll-up lane worker: runs while the session has a roll-up queued, validates it at the
/// trust boundary and hands it to decide. Newer roll-ups replace a queued one meanwhile, so
/// a slow decide or the rate limit only ever costs staleness, never a backlog.
async fn lane(gw: Arc<GatewayState>, session: Arc<Session>) {
    loop {
        match session.next_lane_step() {
            LaneStep::Idle => return,
            LaneStep::Wait(wait) => {
                gw.metrics.rollups_throttled.inc();
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = session.closed.cancelled() => {}
                }
            }
            LaneStep::Process(pending) => {
                let span = session.rollup_span(pending.rollup.needs.len());
                process_rollup(&gw, &session, pending)
                    .instrument(span)
                    .await;
            }
        }
    }
}

/// Rejection label of a roll-up naming another cluster than its session's.
pub const REJECT_CLUSTER_MISMATCH: &str = "cluster_mismatch";
/// Rejection label of a roll-up decide refused without naming a known reason.
pub const REJECT_BY_DECIDE: &str = "decide";

async fn process_rollup(gw: &GatewayState, session: &Session, pending: PendingRollup) {
    let cluster = &*session.cluster;
    let rollup = pending.rollup;
    // `label` is a fixed reason (ADR-0104), never text from the roll-up.
    let reject = |label: &'static str, reason: String| {
        gw.metrics
            .rollups_rejected
            .with_label_values(&[cluster, label])
            .inc();
        // The reason can quote the operator's own strings: bounded in logs and frames.
        let reason = bigfleet_telemetry::clip(&reason);
        tracing::warn!(cluster = %cluster, error = %reason, "roll-up rejected; the cluster keeps its previous demand");
        let (epoch, term) = gw.decide.epoch_term();
        session.ack(format!("{ECHO_ROLLUP_REJECTED}{reason}"), term, epoch);
    };
    if !rollup.cluster_id.is_empty() && rollup.cluster_id != cluster {
        return reject(
            REJECT_CLUSTER_MISMATCH,
            format!(
                "cluster_id {:?} does not match the session's cluster {cluster:?}",
                bigfleet_telemetry::clip(&rollup.cluster_id)
            ),
        );
    }
    // Validated once per distinct roll-up of a session: an identical re-send (the common
    // case) passed these exact checks already (ADR-0113).
    let fp = bigfleet_conv::rollup_fingerprint(&rollup);
    if session.validated_before(fp) {
        gw.metrics.rollups_revalidation_skipped.inc();
    } else {
        if let Err(e) = bigfleet_conv::rollup_from_proto_with(&rollup, &gw.settings.rollup_limits) {
            return reject(e.reason(), e.to_string());
        }
        session.mark_validated(fp);
    }
    let result = gw
        .decide
        .apply_rollup(ApplyRollupRequest {
            rollup: Some(rollup),
            received_at_unix_nanos: pending.received_at_unix_nanos,
            session_id: session.id,
        })
        .await;
    match result {
        Ok(resp) => {
            if resp.outcome == RollupOutcome::Superseded as i32 {
                // This session was replaced while the roll-up was on its way; the newer
                // session's demand stands and this stream is ending anyway.
                tracing::debug!(cluster = %cluster, detail = %resp.detail, "roll-up of a replaced session not applied");
                return;
            }
            if resp.outcome == RollupOutcome::Quarantined as i32 {
                gw.metrics.rollups_quarantined.inc();
                tracing::info!(cluster = %cluster, detail = %resp.detail, "roll-up quarantined by decide");
            } else {
                gw.metrics.rollups_accepted.inc();
            }
            session.ack(ECHO_ROLLUP, resp.coordinator_term, resp.shard_epoch);
        }
        Err(status) if status.code() == Code::InvalidArgument => {
            // Decide names its reason in the status metadata; only a label of the fixed set
            // is used as one.
            let label = status
                .metadata()
                .get(bigfleet_conv::REJECT_REASON_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(bigfleet_conv::ConvError::rollup_reason_label)
                .unwrap_or(REJECT_BY_DECIDE);
            reject(label, format!("decide: {}", status.message()));
        }
        Err(status) => {
            gw.metrics.rollup_apply_errors.inc();
            tracing::warn!(cluster = %cluster, error = %status.message(), "roll-up not applied: decide unavailable");
            let (epoch, term) = gw.decide.epoch_term();
            session.ack(
                format!(
                    "{ECHO_ROLLUP_NOT_APPLIED}decide unavailable: {}",
                    status.message()
                ),
                term,
                epoch,
            );
        }
    }
}

/// Ends every session for the drain; used by [`crate::Running::shutdown`].
pub(crate) fn end_all_for_shutdown(gw: &GatewayState) -> usize {
    gw.registry
        .end_all(&SessionError::ShuttingDown.into_status())
}
