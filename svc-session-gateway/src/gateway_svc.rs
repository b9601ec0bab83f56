//! The gateway's internal contracts, one per audience (ADR-0101): how decide and the
//! execute workers reach operators.
//!
//! * `bigfleet.mesh.v1.Outbox` (decide publishes session frames): `gateway.sock` only.
//! * `bigfleet.mesh.v1.Relay` (execute workers ask for bootstrap blobs and deliver reclaim
//!   instructions): `gateway.sock`, and with mTLS only the public port for remote workers
//!   presenting `bigfleet://shard/<this shard>/execute`.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_mesh::{IntoStatus, Peer, PeerIdentity, peer_of};
use bigfleet_proto::mesh::v1::outbox_server::Outbox;
use bigfleet_proto::mesh::v1::relay_server::Relay;
use bigfleet_proto::mesh::v1::{
    BootstrapError, PublishSummary, RequestBootstrapRequest, RequestBootstrapResponse,
    SendReclaimRequest, SendReclaimResponse, SessionInfo, ShardEvent, StatusRequest,
    StatusResponse, request_bootstrap_response, shard_event,
};
use bigfleet_proto::v1alpha1::{BootstrapRequest, ReclaimInstruction, shard_message};
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};

use crate::error::SessionError;
use crate::outbox::Offer;
use crate::session::{QueueError, Session};
use crate::state::GatewayState;

/// The gateway's internal services (Outbox and Relay).
#[derive(Debug, Clone)]
pub struct GatewayService {
    gw: Arc<GatewayState>,
}

impl GatewayService {
    pub fn new(gw: Arc<GatewayState>) -> Self {
        Self { gw }
    }

    /// Relay callers: same-pod (Unix socket), or over mTLS exactly this shard's execute
    /// workers. A plaintext TCP caller has no identity to bind, so it is refused: a bootstrap
    /// blob or a drain order must never be one unauthenticated request away.
    fn authorize_relay<T>(&self, req: &Request<T>) -> Result<(), Status> {
        match peer_of(req) {
            None | Some(Peer::Local) => Ok(()),
            Some(Peer::Plaintext) => Err(Status::permission_denied(
                "bigfleet.mesh.v1.Relay needs mtls off the unix socket",
            )),
            Some(peer) => peer.ensure(&PeerIdentity::ShardExecute(
                self.gw.settings.shard_id.clone(),
            )),
        }
    }

    /// Outbox callers: decide, over the pod's Unix socket only.
    fn require_local<T>(req: &Request<T>) -> Result<(), Status> {
        match peer_of(req) {
            None | Some(Peer::Local) => Ok(()),
            Some(peer) => Err(Status::permission_denied(format!(
                "{peer} may not call bigfleet.mesh.v1.Outbox (unix socket only)"
            ))),
        }
    }
}

/// A fresh correlation id: 16 hex characters from the thread-local CSPRNG, so ids cannot be
/// guessed by an operator answering for requests it never received.
pub fn new_request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn bootstrap_failure(
    kind: BootstrapError,
    message: impl Into<String>,
    request_id: String,
) -> RequestBootstrapResponse {
    RequestBootstrapResponse {
        outcome: Some(request_bootstrap_response::Outcome::Error(kind as i32)),
        message: message.into(),
        ttl_seconds: 0,
        request_id,
    }
}

/// Forgets a pending bootstrap request if the caller goes away (its deadline passed), so
/// the entry does not linger until the session ends.
struct PendingBootstrap<'a> {
    session: &'a Session,
    id: &'a str,
}

impl Drop for PendingBootstrap<'_> {
    fn drop(&mut self) {
        self.session.cancel_bootstrap(self.id);
    }
}

#[tonic::async_trait]
impl Relay for GatewayService {
    async fn request_bootstrap(
        &self,
        request: Request<RequestBootstrapRequest>,
    ) -> Result<Response<RequestBootstrapResponse>, Status> {
        self.authorize_relay(&request)?;
        let gw = &self.gw;
        let req = request.into_inner();
        let outcome = |label: &str| {
            gw.metrics
                .request_bootstrap
                .with_label_values(&[label])
                .inc();
        };
        let no_session = |id: String| {
            outcome("no_session");
            Response::new(bootstrap_failure(
                BootstrapError::NoSession,
                format!("cluster {} has no session at this gateway", req.cluster_id),
                id,
            ))
        };
        let Some(session) = gw.registry.get(&req.cluster_id) else {
            return Ok(no_session(String::new()));
        };
        let timeout = match req.timeout_ms {
            0 => gw.settings.bootstrap_timeout,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let request_id = new_request_id();
        let frame = shard_message::Payload::BootstrapRequest(BootstrapRequest {
            request_id: request_id.clone(),
            requirements: req.requirements.clone(),
            cluster_id: req.cluster_id.clone(),
        });
        let rx = match session.begin_bootstrap(&request_id, frame) {
            Ok(rx) => rx,
            Err(QueueError::Closed) => return Ok(no_session(request_id)),
            Err(QueueError::Full) => {
                outcome("timeout");
                return Ok(Response::new(bootstrap_failure(
                    BootstrapError::Timeout,
                    SessionError::NotReading(req.cluster_id.clone()).to_string(),
                    request_id,
                )));
            }
        };
        let _pending = PendingBootstrap {
            session: &session,
            id: &request_id,
        };
        let started = Instant::now();
        tracing::debug!(
            cluster = %req.cluster_id,
            machine = %req.machine_id,
            need = %req.need_fingerprint,
            request_id = %request_id,
            "bootstrap requested"
        );
        let resp = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => {
                gw.metrics
                    .request_bootstrap_seconds
                    .observe(started.elapsed().as_secs_f64());
                if answer.error.is_empty() {
                    outcome("blob");
                    RequestBootstrapResponse {
                        outcome: Some(request_bootstrap_response::Outcome::Blob(answer.user_data)),
                        message: String::new(),
                        ttl_seconds: answer.ttl_seconds,
                        request_id: request_id.clone(),
                    }
                } else {
                    outcome("operator_error");
                    bootstrap_failure(
                        BootstrapError::OperatorError,
                        answer.error,
                        request_id.clone(),
                    )
                }
            }
            Ok(Err(_)) => {
                outcome("timeout");
                bootstrap_failure(
                    BootstrapError::Timeout,
                    "the session ended while waiting for the operator",
                    request_id.clone(),
                )
            }
            Err(_) => {
                outcome("timeout");
                bootstrap_failure(
                    BootstrapError::Timeout,
                    format!("the operator did not answer within {timeout:?}"),
                    request_id.clone(),
                )
            }
        };
        Ok(Response::new(resp))
    }

    async fn send_reclaim(
        &self,
        request: Request<SendReclaimRequest>,
    ) -> Result<Response<SendReclaimResponse>, Status> {
        self.authorize_relay(&request)?;
        let req = request.into_inner();
        let undelivered = Response::new(SendReclaimResponse {
            delivered: false,
            instruction_id: String::new(),
        });
        let Some(session) = self.gw.registry.get(&req.cluster_id) else {
            return Ok(undelivered);
        };
        let instruction_id = new_request_id();
        let frame = shard_message::Payload::ReclaimInstruction(ReclaimInstruction {
            instruction_id: instruction_id.clone(),
            nodes: req.nodes,
            grace_period_seconds: req.grace_period_seconds,
            preemptor_priority: req.preemptor_priority,
        });
        match session.send_control(frame) {
            Ok(()) => {
                self.gw.metrics.reclaims_sent.inc();
                tracing::debug!(cluster = %req.cluster_id, machine = %req.machine_id, instruction_id = %instruction_id, "reclaim instruction sent");
                Ok(Response::new(SendReclaimResponse {
                    delivered: true,
                    instruction_id,
                }))
            }
            Err(QueueError::Closed) => Ok(undelivered),
            Err(QueueError::Full) => Err(SessionError::NotReading(req.cluster_id).into_status()),
        }
    }
}

#[tonic::async_trait]
impl Outbox for GatewayService {
    async fn publish(
        &self,
        request: Request<Streaming<ShardEvent>>,
    ) -> Result<Response<PublishSummary>, Status> {
        Self::require_local(&request)?;
        let gw = &self.gw;
        let mut stream = request.into_inner();
        let mut summary = PublishSummary::default();
        loop {
            let next = tokio::select! {
                () = gw.shutdown.cancelled() => break,
                next = stream.message() => next,
            };
            let Some(event) = next? else { break };
            summary.received += 1;
            let (payload, frame_key) = match event.frame {
                Some(shard_event::Frame::NodeStateUpdate(u)) => {
                    let key = u.supersedes_key.clone();
                    (shard_message::Payload::NodeStateUpdate(u), key)
                }
                Some(shard_event::Frame::AvailableCapacity(a)) => {
                    let key = a.supersedes_key.clone();
                    (shard_message::Payload::AvailableCapacity(a), key)
                }
                None => continue,
            };
            let key = if event.supersedes_key.is_empty() {
                frame_key
            } else {
                event.supersedes_key
            };
            let Some(session) = gw.registry.get(&event.cluster_id) else {
                summary.dropped_no_session += 1;
                gw.metrics.dropped("no_session", 1);
                continue;
            };
            match session.publish(&key, payload) {
                Ok(Offer::Queued) => summary.queued += 1,
                Ok(Offer::Coalesced) => {
                    summary.queued += 1;
                    summary.coalesced += 1;
                    gw.metrics.dropped("coalesced", 1);
                }
                Ok(Offer::Full) => {
                    summary.dropped_outbox_full += 1;
                    gw.metrics.dropped("full", 1);
                }
                Err(_) => {
                    summary.dropped_no_session += 1;
                    gw.metrics.dropped("no_session", 1);
                }
            }
        }
        Ok(Response::new(summary))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        Self::require_local(&request)?;
        let gw = &self.gw;
        let sessions = if request.get_ref().include_sessions {
            gw.registry
                .snapshot()
                .iter()
                .map(|s| SessionInfo {
                    cluster_id: s.cluster.to_string(),
                    session_id: s.id,
                    opened_at_unix_nanos: s.opened_at_unix_nanos,
                    last_rollup_unix_nanos: s
                        .last_rollup_unix_nanos
                        .load(std::sync::atomic::Ordering::Relaxed),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(StatusResponse {
            active_sessions: u32::try_from(gw.registry.count()).unwrap_or(u32::MAX),
            shard_epoch: gw.decide.epoch_term().0,
            sessions,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_16_hex_and_fresh() {
        let a = new_request_id();
        let b = new_request_id();
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
