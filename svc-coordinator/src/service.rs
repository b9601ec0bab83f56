//! The public `bigfleet.v1alpha1.Coordinator` service. Every RPC is leader-only. Check
//! order (as the original): leader first; ReportShard then validates the shard id before
//! binding it to the caller's identity; the admin and read RPCs check identity before
//! validating arguments.

use std::pin::Pin;
use std::sync::Arc;

use bigfleet_mesh::{Peer, PeerIdentity, peer_of};
use bigfleet_proto::v1alpha1::coordinator_server::{Coordinator, CoordinatorServer};
use bigfleet_proto::v1alpha1::{self as pb, snapshot_save_chunk};
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::fsm::{Command, DomainKey, Effect, FsmError, State};
use crate::replica::{CoordError, JOIN_API_ADDR_KEY, Replica, now_unix_ns};
use crate::soft::new_instruction_id;
use crate::transfers::{released_ids, verdict_of};

/// SnapshotSave frames after the metadata carry this much state each.
pub const SNAPSHOT_CHUNK: usize = 1 << 20;

/// The service handler (cheap to clone).
#[derive(Clone)]
pub struct CoordinatorService {
    replica: Arc<Replica>,
}

impl CoordinatorService {
    pub fn new(replica: Arc<Replica>) -> Self {
        Self { replica }
    }

    pub fn into_server(self) -> CoordinatorServer<Self> {
        bigfleet_mesh::with_message_limits!(CoordinatorServer::new(self))
    }

    fn pending_gauge(&self, shard: &str, n: usize) {
        self.replica
            .metrics
            .pending_instructions
            .with_label_values(&[shard])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    fn enqueue(&self, term: u64, shard: &str, domain: &DomainKey, assign: bool) {
        let n = {
            let mut soft = self.replica.soft.lock();
            soft.ensure_term(term);
            let ins = soft.enqueue_domain(shard, domain, assign, new_instruction_id());
            tracing::info!(
                shard,
                domain = %domain,
                assign,
                instruction = %ins.instruction_id,
                sequence = ins.sequence_number,
                "instruction queued"
            );
            soft.pending_len(shard)
        };
        self.pending_gauge(shard, n);
    }
}

impl CoordinatorService {
    /// A read RPC's answer from the replicated state: leadership and the caller are checked
    /// first (as every read RPC does), then `f` runs under the state's read lock.
    fn read_state<R, T>(
        &self,
        request: &Request<R>,
        f: impl FnOnce(&State) -> T,
    ) -> Result<T, CoordError> {
        self.replica.admit(require_reader(request))?;
        Ok(f(&self.replica.shared.read().state))
    }

    /// Applies the shard's acks of transfer instructions (ADR-0130) before answering, so
    /// the next phase's instruction can ride on this very answer. A Raft failure fails the
    /// report: the shard re-sends its acks with the next one, so no ack is lost.
    async fn apply_transfer_acks(&self, id: &str, report: &pb::ShardReport) -> Result<(), Status> {
        for ack in &report.instruction_acks {
            let Some(verdict) = verdict_of(ack.outcome) else {
                continue;
            };
            let Some(t) = self
                .replica
                .shared
                .read()
                .state
                .transfer_by_instruction(&ack.instruction_id)
            else {
                continue;
            };
            // Only the shard the phase addressed can answer it.
            if t.target() != Some(id) {
                tracing::warn!(shard = id, transfer = %t.id, instruction = %ack.instruction_id, "transfer ack from a shard the instruction was not for; ignored");
                continue;
            }
            let cmd = Command::AckTransfer {
                transfer_id: t.id.clone(),
                instruction_id: ack.instruction_id.clone(),
                verdict,
                machine_ids: released_ids(&ack.reason),
                next_instruction_id: new_instruction_id(),
                reason: ack.reason.clone(),
                at_unix_ns: now_unix_ns(),
            };
            match self.replica.apply(cmd).await {
                Ok(Effect::Transfer(t)) => {
                    crate::rebalancer::record_step(&self.replica.metrics, id, &t);
                }
                Ok(_) => {}
                Err(CoordError::Fsm(e)) => {
                    tracing::warn!(shard = id, transfer = %t.id, error = %e, "transfer ack refused");
                }
                Err(e) => return Err(CoordError::Unavailable(e.to_string()).into()),
            }
        }
        let n = self.replica.shared.read().state.active_transfers().len();
        self.replica
            .metrics
            .rebalance_in_flight
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        Ok(())
    }
}

fn peer<T>(req: &Request<T>) -> Peer {
    // A request that did not pass the mesh stack (in-process tests) is plaintext.
    peer_of(req).cloned().unwrap_or(Peer::Plaintext)
}

fn require_admin<T>(req: &Request<T>) -> Result<(), CoordError> {
    match peer(req) {
        Peer::Plaintext | Peer::Local | Peer::Verified(PeerIdentity::Admin) => Ok(()),
        Peer::Verified(id) => Err(CoordError::PermissionDenied(format!(
            "{id} may not call this rpc (requires bigfleet://admin)"
        ))),
        Peer::Invalid(e) => Err(CoordError::PermissionDenied(e.to_string())),
    }
}

/// JoinRaftCluster: admin tooling, or the replica itself — `coordinator/<id>` may join only
/// as `<id>` (ADR-0100), so one replica's certificate cannot enrol another node.
fn require_admin_or_replica<T>(req: &Request<T>, node_id: &str) -> Result<(), CoordError> {
    match peer(req) {
        Peer::Verified(PeerIdentity::Coordinator(name)) if name == node_id => Ok(()),
        Peer::Verified(PeerIdentity::Coordinator(name)) => Err(CoordError::PermissionDenied(
            format!("bigfleet://coordinator/{name} may not join the group as {node_id:?}"),
        )),
        _ => require_admin(req),
    }
}

/// The public reads' rule, shared with the internal transfer read: readonly or admin.
pub(crate) fn require_reader<T>(req: &Request<T>) -> Result<(), CoordError> {
    match peer(req) {
        Peer::Plaintext
        | Peer::Local
        | Peer::Verified(PeerIdentity::Admin | PeerIdentity::Readonly) => Ok(()),
        Peer::Verified(id) => Err(CoordError::PermissionDenied(format!(
            "{id} may not call this rpc (requires bigfleet://readonly or bigfleet://admin)"
        ))),
        Peer::Invalid(e) => Err(CoordError::PermissionDenied(e.to_string())),
    }
}

/// The first SnapshotSave frame: openraft's snapshot metadata (what our restore reads),
/// plus the top-level keys of the original's snapshot meta — `Version`, `ID`, `Index`,
/// `Term`, `Size` — so the original's CLI, which decodes this JSON as its own snapshot
/// meta, reports the real index and term instead of zeros (issue 18). The key sets do not
/// collide, even case-insensitively, and each decoder ignores the other's keys.
pub fn snapshot_meta_json(
    meta: &crate::raft_types::SnapshotMeta,
    size: usize,
) -> Result<Vec<u8>, CoordError> {
    let mut value = serde_json::to_value(meta).map_err(|e| CoordError::Internal(e.to_string()))?;
    let obj = value
        .as_object_mut()
        .ok_or_else(|| CoordError::Internal("snapshot meta is not a json object".into()))?;
    let (index, term) = meta
        .last_log_id
        .map_or((0, 0), |l| (l.index, l.leader_id.term));
    obj.insert("Version".into(), 1.into());
    obj.insert("ID".into(), meta.snapshot_id.clone().into());
    obj.insert("Index".into(), index.into());
    obj.insert("Term".into(), term.into());
    obj.insert("Size".into(), size.into());
    serde_json::to_vec(&value).map_err(|e| CoordError::Internal(e.to_string()))
}

fn required(field: &str, v: &str) -> Result<(), CoordError> {
    if v.is_empty() {
        Err(CoordError::InvalidArgument(format!("{field} is required")))
    } else {
        Ok(())
    }
}

/// The domain an Assign/UnassignDomain request names; both halves are required.
fn domain_of(key: String, value: String) -> Result<DomainKey, CoordError> {
    required("topology_key", &key)?;
    required("topology_value", &value)?;
    Ok(DomainKey::new(key, value))
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotSaveChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn report_shard(
        &self,
        request: Request<pb::ShardReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let term = self.replica.leader_term()?;
        let report = request.get_ref();
        let id = report.shard_id.as_str();
        required("shard_id", id)?;
        peer(&request).ensure(&PeerIdentity::Shard(id.to_owned()))?;

        if !self.replica.shared.read().state.has_shard(id) {
            let cmd = Command::AddShard {
                shard_id: id.to_owned(),
                address: report.shard_address.clone(),
                registered_at_unix_ns: now_unix_ns(),
            };
            match self.replica.apply(cmd).await {
                Ok(_) => {
                    tracing::info!(shard = id, address = %report.shard_address, "shard registered")
                }
                // Two reports raced; the other one registered it.
                Err(CoordError::Fsm(FsmError::ShardExists(_))) => {}
                Err(CoordError::Fsm(e)) => {
                    return Err(CoordError::InvalidArgument(e.to_string()).into());
                }
                // The shard retries on its next tick.
                Err(e) => return Err(CoordError::Unavailable(e.to_string()).into()),
            }
        }
        let now = now_unix_ns();
        self.replica.shared.write().state.mark_heartbeat(id, now);
        self.apply_transfer_acks(id, report).await?;

        let (mut instructions, pending) = {
            let mut soft = self.replica.soft.lock();
            soft.ensure_term(term);
            let outcome = soft.record_report(report, now);
            if !outcome.accepted {
                tracing::debug!(
                    shard = id,
                    cycle = report.cycle,
                    "out-of-order report; summary kept"
                );
            }
            let mut out = soft.pending(id);
            // Transfer phases live in the FSM: whichever replica leads redelivers the same
            // instruction id until the shard acknowledges it.
            for t in self.replica.shared.read().state.active_transfers() {
                if t.target() == Some(id)
                    && let Some(payload) = t.payload()
                {
                    out.push(pb::CoordinatorInstruction {
                        coordinator_term: i64::try_from(term).unwrap_or(i64::MAX),
                        sequence_number: soft.sequence_for(&t.instruction_id),
                        instruction_id: t.instruction_id.clone(),
                        payload: Some(payload),
                    });
                }
            }
            let n = out.len();
            (out, n)
        };
        instructions.sort_by_key(|i| i.sequence_number);
        self.pending_gauge(id, pending);
        self.replica
            .metrics
            .raft_term
            .set(i64::try_from(term).unwrap_or(i64::MAX));
        Ok(Response::new(pb::ReportAck {
            coordinator_term: i64::try_from(term).unwrap_or(i64::MAX),
            acknowledged: true,
            instructions,
        }))
    }

    async fn assign_domain(
        &self,
        request: Request<pb::AssignDomainRequest>,
    ) -> Result<Response<pb::AssignDomainResponse>, Status> {
        self.replica.admit(require_admin(&request))?;
        let r = request.into_inner();
        let domain = domain_of(r.topology_key, r.topology_value)?;
        required("shard_id", &r.shard_id)?;
        self.replica
            .apply(Command::AssignDomain {
                domain: domain.clone(),
                shard_id: r.shard_id.clone(),
            })
            .await?;
        // Re-read the term: the write committed under the term this replica leads now.
        let term = self.replica.leader_term()?;
        self.enqueue(term, &r.shard_id, &domain, true);
        Ok(Response::new(pb::AssignDomainResponse {}))
    }

    async fn unassign_domain(
        &self,
        request: Request<pb::UnassignDomainRequest>,
    ) -> Result<Response<pb::UnassignDomainResponse>, Status> {
        self.replica.admit(require_admin(&request))?;
        let r = request.into_inner();
        let domain = domain_of(r.topology_key, r.topology_value)?;
        let effect = self
            .replica
            .apply(Command::UnassignDomain {
                domain: domain.clone(),
            })
            .await?;
        if let Effect::DomainUnassigned {
            previous_owner: Some(owner),
        } = effect
        {
            let term = self.replica.leader_term()?;
            self.enqueue(term, &owner, &domain, false);
        }
        Ok(Response::new(pb::UnassignDomainResponse {}))
    }

    async fn remove_shard(
        &self,
        request: Request<pb::RemoveShardRequest>,
    ) -> Result<Response<pb::RemoveShardResponse>, Status> {
        self.replica.admit(require_admin(&request))?;
        let id = request.into_inner().shard_id;
        required("shard_id", &id)?;
        self.replica
            .apply(Command::RemoveShard {
                shard_id: id.clone(),
            })
            .await?;
        self.replica.soft.lock().remove_shard(&id);
        let _ = self
            .replica
            .metrics
            .pending_instructions
            .remove_label_values(&[&id]);
        tracing::info!(shard = %id, "shard removed");
        Ok(Response::new(pb::RemoveShardResponse {}))
    }

    async fn list_shards(
        &self,
        request: Request<pb::ListShardsRequest>,
    ) -> Result<Response<pb::ListShardsResponse>, Status> {
        let shards = self.read_state(&request, |st| {
            st.shards()
                .into_iter()
                .map(|s| pb::ShardRegistryEntry {
                    shard_id: s.id,
                    address: s.address,
                    registered_at_unix_ns: s.registered_at_unix_ns,
                    last_heartbeat_unix_ns: s.last_heartbeat_unix_ns,
                })
                .collect()
        })?;
        Ok(Response::new(pb::ListShardsResponse { shards }))
    }

    async fn list_domain_assignments(
        &self,
        request: Request<pb::ListDomainAssignmentsRequest>,
    ) -> Result<Response<pb::ListDomainAssignmentsResponse>, Status> {
        let assignments = self.read_state(&request, |st| {
            st.domain_assignments()
                .into_iter()
                .map(|a| pb::DomainAssignment {
                    topology_key: a.domain.key,
                    topology_value: a.domain.value,
                    shard_id: a.shard_id,
                })
                .collect()
        })?;
        Ok(Response::new(pb::ListDomainAssignmentsResponse {
            assignments,
        }))
    }

    async fn list_shard_reports(
        &self,
        request: Request<pb::ListShardReportsRequest>,
    ) -> Result<Response<pb::ListShardReportsResponse>, Status> {
        let term = self.replica.admit(require_reader(&request))?;
        let filter = request.get_ref().shard_id.clone();
        let reports = {
            let mut soft = self.replica.soft.lock();
            soft.ensure_term(term);
            soft.reports((!filter.is_empty()).then_some(filter.as_str()))
        };
        let reports = reports
            .into_iter()
            .map(|(id, r)| pb::ShardReportSnapshot {
                shard_id: id,
                cycle: r.cycle,
                received_at_unix_ns: r.received_at_unix_ns,
                summary: r.summary,
                shortfalls: r.shortfalls,
            })
            .collect();
        Ok(Response::new(pb::ListShardReportsResponse { reports }))
    }

    async fn join_raft_cluster(
        &self,
        request: Request<pb::JoinRaftClusterRequest>,
    ) -> Result<Response<pb::JoinRaftClusterResponse>, Status> {
        self.replica.admit(require_admin_or_replica(
            &request,
            &request.get_ref().node_id,
        ))?;
        let api_addr = request
            .metadata()
            .get(JOIN_API_ADDR_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let r = request.into_inner();
        required("node_id", &r.node_id)?;
        required("raft_address", &r.raft_address)?;
        // Older callers do not send their Coordinator address: assume the joiner's Raft host
        // and our own Coordinator port (replicas run with identical args).
        let api_addr = api_addr.unwrap_or_else(|| {
            let host = r
                .raft_address
                .rsplit_once(':')
                .map_or(r.raft_address.as_str(), |(h, _)| h);
            format!("{host}:{}", self.replica.api_port)
        });
        self.replica
            .add_voter(&r.node_id, &r.raft_address, &api_addr)
            .await?;
        Ok(Response::new(pb::JoinRaftClusterResponse {}))
    }

    type SnapshotSaveStream = ChunkStream;

    async fn snapshot_save(
        &self,
        request: Request<pb::SnapshotSaveRequest>,
    ) -> Result<Response<Self::SnapshotSaveStream>, Status> {
        self.replica.admit(require_admin(&request))?;
        let (meta, data) = self.replica.fresh_snapshot().await?;
        let meta_json = snapshot_meta_json(&meta, data.len())?;
        tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "streaming snapshot");
        let mut frames = vec![Ok(pb::SnapshotSaveChunk {
            payload: Some(snapshot_save_chunk::Payload::MetaJson(meta_json)),
        })];
        frames.extend(data.chunks(SNAPSHOT_CHUNK).map(|c| {
            Ok(pb::SnapshotSaveChunk {
                payload: Some(snapshot_save_chunk::Payload::Data(c.to_vec())),
            })
        }));
        Ok(Response::new(Box::pin(tokio_stream::iter(frames))))
    }

    async fn list_quotas(
        &self,
        _request: Request<pb::ListQuotasRequest>,
    ) -> Result<Response<pb::ListQuotasResponse>, Status> {
        Err(Status::unimplemented(
            "coordinator: ListQuotas was removed (quotas are no longer coordinator state)",
        ))
    }

    async fn list_providers(
        &self,
        _request: Request<pb::ListProvidersRequest>,
    ) -> Result<Response<pb::ListProvidersResponse>, Status> {
        Err(Status::unimplemented(
            "coordinator: ListProviders was removed (the provider registry is gone)",
        ))
    }
}

#[cfg(test)]
mod snapshot_meta_tests {
    use super::*;
    use crate::raft_types::{SnapshotMeta, StoredMembership};

    /// The original's CLI decodes the first frame into hashicorp/raft's `SnapshotMeta`
    /// (Go field names, matched case-insensitively) and prints its Index and Term.
    #[derive(serde::Deserialize)]
    struct OriginalMeta {
        #[serde(rename = "ID")]
        id: String,
        #[serde(rename = "Index")]
        index: u64,
        #[serde(rename = "Term")]
        term: u64,
        #[serde(rename = "Size")]
        size: i64,
    }

    #[test]
    fn the_first_frame_reads_right_in_both_tools() {
        let meta = SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(7, 1),
                42,
            )),
            last_membership: StoredMembership::default(),
            snapshot_id: "7-42-abc".into(),
        };
        let json = snapshot_meta_json(&meta, 1234).unwrap();
        let theirs: OriginalMeta = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            (theirs.id.as_str(), theirs.index, theirs.term, theirs.size),
            ("7-42-abc", 42, 7, 1234)
        );
        // Ours still decodes it (restore reads the archive's meta with openraft's type).
        let ours: SnapshotMeta = serde_json::from_slice(&json).unwrap();
        assert_eq!(ours, meta);
    }
}
