//! In-process doubles of the coordinator and of a shard's read services, with canned data,
//! for svc-inspect's tests, the `bigfleet` CLI's tests and the coordinator client's tests
//! (feature `doubles`): the one double of each of these contracts. They serve
//! through the real mesh server, so mTLS and the ADR-0060 identity matrix apply exactly as
//! the policies below say.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_mesh::{
    AuthzPolicy, MeshServer, Role, RunningServer, ServerError, ServerStackConfig, not_leader_status,
};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::coordinator_info_server::{CoordinatorInfo, CoordinatorInfoServer};
use bigfleet_proto::mesh::v1::shard_info_server::{ShardInfo, ShardInfoServer};
use bigfleet_proto::service_names;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_server::{Coordinator, CoordinatorServer};
use bigfleet_proto::v1alpha1::shard_read_server::{ShardRead, ShardReadServer};
use futures::Stream;
use parking_lot::{Mutex, MutexGuard};
use tonic::{Request, Response, Status};

use crate::grpc::{NeedsStream, READERS, needs_stream};

/// Snapshot data frames of the double are this small so reassembly is exercised.
pub const SNAPSHOT_CHUNK: usize = 4;

/// The coordinator's identity matrix (the roles table of docs/security.md).
pub fn coordinator_policy() -> AuthzPolicy {
    let m = |rpc: &str| format!("/{}/{rpc}", service_names::COORDINATOR);
    let mut p = AuthzPolicy::deny_by_default().allow_method(&m("ReportShard"), &[Role::Shard]);
    for rpc in [
        "AssignDomain",
        "UnassignDomain",
        "RemoveShard",
        "JoinRaftCluster",
        "SnapshotSave",
    ] {
        p = p.allow_method(&m(rpc), &[Role::Admin]);
    }
    for rpc in [
        "ListShards",
        "ListDomainAssignments",
        "ListShardReports",
        "ListQuotas",
        "ListProviders",
    ] {
        p = p.allow_method(&m(rpc), READERS);
    }
    p.allow_service(service_names::COORDINATOR_INFO, READERS)
}

/// A shard's read services: readonly or admin.
pub fn shard_read_policy() -> AuthzPolicy {
    AuthzPolicy::deny_by_default()
        .allow_service(service_names::SHARD_READ, READERS)
        .allow_service(service_names::SHARD_INFO, READERS)
}

/// What the coordinator double holds and answers.
#[derive(Debug, Clone, Default)]
pub struct CoordinatorState {
    pub shards: Vec<pb::ShardRegistryEntry>,
    pub reports: Vec<pb::ShardReportSnapshot>,
    pub domains: Vec<pb::DomainAssignment>,
    /// Set: every RPC answers FAILED_PRECONDITION "coordinator: not leader" with this
    /// address as the leader hint (empty: no hint).
    pub follower_of: Option<String>,
    /// `(meta_json, state)` served by SnapshotSave; `None`: NOT_FOUND.
    pub snapshot: Option<(Vec<u8>, Vec<u8>)>,
    /// Names of the RPCs that reached the handler (past the identity checks).
    pub calls: Vec<String>,
    /// What `CoordinatorInfo/ListTransfers` answers (before its shard filter).
    pub transfers: mesh::ListTransfersResponse,
    /// Every `ShardReport` that reached the handler, those refused as a follower included.
    pub received_reports: Vec<pb::ShardReport>,
    /// How ReportShard answers, one entry a report, in order; when empty it acknowledges
    /// with no instructions (term 0).
    pub report_answers: VecDeque<Result<pb::ReportAck, Status>>,
}

/// A coordinator with canned, mutable state.
#[derive(Debug, Clone, Default)]
pub struct CoordinatorDouble {
    state: Arc<Mutex<CoordinatorState>>,
}

impl CoordinatorDouble {
    pub fn new(state: CoordinatorState) -> Self {
        Self {
            state: Arc::new(Mutex::new(state)),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, CoordinatorState> {
        self.state.lock()
    }

    /// Records the call and applies the leader-only rule.
    fn enter(&self, rpc: &str) -> Result<MutexGuard<'_, CoordinatorState>, Status> {
        Self::admit(self.state.lock(), rpc)
    }

    /// [`Self::enter`] on a guard the caller already holds: ReportShard records the report
    /// first, so a follower's refusals are counted too.
    fn admit<'a>(
        mut st: MutexGuard<'a, CoordinatorState>,
        rpc: &str,
    ) -> Result<MutexGuard<'a, CoordinatorState>, Status> {
        if let Some(leader) = &st.follower_of {
            return Err(not_leader_status("coordinator: not leader", Some(leader)));
        }
        st.calls.push(rpc.to_owned());
        Ok(st)
    }

    /// An RPC the double does not serve: recorded like any other (and still leader-only),
    /// then UNIMPLEMENTED with `why`.
    fn unimplemented<T>(&self, rpc: &str, why: &str) -> Result<T, Status> {
        drop(self.enter(rpc)?);
        Err(Status::unimplemented(why.to_owned()))
    }

    /// Serves on 127.0.0.1 (free port), mTLS when `tls` is given, with the matrix enforced.
    pub async fn serve(
        &self,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<RunningServer, ServerError> {
        MeshServer::new("coordinator-double", stack(coordinator_policy()))
            .tcp(SocketAddr::from(([127, 0, 0, 1], 0)))
            .tls(tls)
            .drain_deadline(Duration::from_secs(1))
            .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
            .add_service(CoordinatorServer::new(self.clone()))
            .add_service(CoordinatorInfoServer::new(self.clone()))
            .start()
            .await
    }
}

fn stack(policy: AuthzPolicy) -> ServerStackConfig {
    ServerStackConfig {
        authz: Arc::new(policy),
        ..ServerStackConfig::default()
    }
}

#[tonic::async_trait]
impl CoordinatorInfo for CoordinatorDouble {
    async fn list_transfers(
        &self,
        request: Request<mesh::ListTransfersRequest>,
    ) -> Result<Response<mesh::ListTransfersResponse>, Status> {
        let shard = request.into_inner().shard_id;
        let st = self.enter("ListTransfers")?;
        let mut out = st.transfers.clone();
        if !shard.is_empty() {
            let involves =
                |t: &mesh::TransferInfo| t.donor_shard_id == shard || t.recipient_shard_id == shard;
            out.active.retain(involves);
            out.recent.retain(involves);
            out.shards.retain(|s| s.shard_id == shard);
        }
        Ok(Response::new(out))
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotSaveChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for CoordinatorDouble {
    async fn report_shard(
        &self,
        request: Request<pb::ShardReport>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let mut st = self.state.lock();
        st.received_reports.push(request.into_inner());
        let mut st = Self::admit(st, "ReportShard")?;
        st.report_answers
            .pop_front()
            .unwrap_or_else(|| {
                Ok(pb::ReportAck {
                    acknowledged: true,
                    ..Default::default()
                })
            })
            .map(Response::new)
    }

    async fn assign_domain(
        &self,
        request: Request<pb::AssignDomainRequest>,
    ) -> Result<Response<pb::AssignDomainResponse>, Status> {
        let r = request.into_inner();
        let mut st = self.enter("AssignDomain")?;
        if r.topology_key.is_empty() || r.topology_value.is_empty() || r.shard_id.is_empty() {
            return Err(Status::invalid_argument(
                "topology_key, topology_value and shard_id are required",
            ));
        }
        if !st.shards.iter().any(|s| s.shard_id == r.shard_id) {
            return Err(Status::not_found(format!("shard {} not found", r.shard_id)));
        }
        if let Some(d) = st
            .domains
            .iter()
            .find(|d| d.topology_key == r.topology_key && d.topology_value == r.topology_value)
        {
            if d.shard_id == r.shard_id {
                return Ok(Response::new(pb::AssignDomainResponse {}));
            }
            return Err(Status::already_exists(format!(
                "domain {}={} is assigned to shard {}",
                r.topology_key, r.topology_value, d.shard_id
            )));
        }
        st.domains.push(pb::DomainAssignment {
            topology_key: r.topology_key,
            topology_value: r.topology_value,
            shard_id: r.shard_id,
        });
        Ok(Response::new(pb::AssignDomainResponse {}))
    }

    async fn unassign_domain(
        &self,
        request: Request<pb::UnassignDomainRequest>,
    ) -> Result<Response<pb::UnassignDomainResponse>, Status> {
        let r = request.into_inner();
        let mut st = self.enter("UnassignDomain")?;
        st.domains.retain(|d| {
            !(d.topology_key == r.topology_key && d.topology_value == r.topology_value)
        });
        Ok(Response::new(pb::UnassignDomainResponse {}))
    }

    async fn remove_shard(
        &self,
        request: Request<pb::RemoveShardRequest>,
    ) -> Result<Response<pb::RemoveShardResponse>, Status> {
        let r = request.into_inner();
        let mut st = self.enter("RemoveShard")?;
        let before = st.shards.len();
        st.shards.retain(|s| s.shard_id != r.shard_id);
        if st.shards.len() == before {
            return Err(Status::not_found(format!("shard {} not found", r.shard_id)));
        }
        st.domains.retain(|d| d.shard_id != r.shard_id);
        st.reports.retain(|d| d.shard_id != r.shard_id);
        Ok(Response::new(pb::RemoveShardResponse {}))
    }

    async fn list_shards(
        &self,
        _: Request<pb::ListShardsRequest>,
    ) -> Result<Response<pb::ListShardsResponse>, Status> {
        let st = self.enter("ListShards")?;
        let mut shards = st.shards.clone();
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(Response::new(pb::ListShardsResponse { shards }))
    }

    async fn list_domain_assignments(
        &self,
        _: Request<pb::ListDomainAssignmentsRequest>,
    ) -> Result<Response<pb::ListDomainAssignmentsResponse>, Status> {
        let st = self.enter("ListDomainAssignments")?;
        let mut assignments = st.domains.clone();
        assignments.sort_by(|a, b| {
            (&a.shard_id, &a.topology_key, &a.topology_value).cmp(&(
                &b.shard_id,
                &b.topology_key,
                &b.topology_value,
            ))
        });
        Ok(Response::new(pb::ListDomainAssignmentsResponse {
            assignments,
        }))
    }

    async fn list_shard_reports(
        &self,
        request: Request<pb::ListShardReportsRequest>,
    ) -> Result<Response<pb::ListShardReportsResponse>, Status> {
        let filter = request.into_inner().shard_id;
        let st = self.enter("ListShardReports")?;
        let mut reports: Vec<_> = st
            .reports
            .iter()
            .filter(|r| filter.is_empty() || r.shard_id == filter)
            .cloned()
            .collect();
        reports.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(Response::new(pb::ListShardReportsResponse { reports }))
    }

    async fn join_raft_cluster(
        &self,
        _: Request<pb::JoinRaftClusterRequest>,
    ) -> Result<Response<pb::JoinRaftClusterResponse>, Status> {
        self.unimplemented("JoinRaftCluster", "the double has no raft group")
    }

    type SnapshotSaveStream = SnapshotStream;

    async fn snapshot_save(
        &self,
        _: Request<pb::SnapshotSaveRequest>,
    ) -> Result<Response<Self::SnapshotSaveStream>, Status> {
        let st = self.enter("SnapshotSave")?;
        let Some((meta, data)) = st.snapshot.clone() else {
            return Err(Status::not_found("no snapshot yet"));
        };
        let mut frames = vec![Ok(pb::SnapshotSaveChunk {
            payload: Some(pb::snapshot_save_chunk::Payload::MetaJson(meta)),
        })];
        frames.extend(data.chunks(SNAPSHOT_CHUNK).map(|c| {
            Ok(pb::SnapshotSaveChunk {
                payload: Some(pb::snapshot_save_chunk::Payload::Data(c.to_vec())),
            })
        }));
        Ok(Response::new(Box::pin(tokio_stream::iter(frames))))
    }

    async fn list_quotas(
        &self,
        _: Request<pb::ListQuotasRequest>,
    ) -> Result<Response<pb::ListQuotasResponse>, Status> {
        self.unimplemented("ListQuotas", "removed in the current revision")
    }

    async fn list_providers(
        &self,
        _: Request<pb::ListProvidersRequest>,
    ) -> Result<Response<pb::ListProvidersResponse>, Status> {
        self.unimplemented("ListProviders", "removed in the current revision")
    }
}

/// A shard's read side with canned verdicts, behaving like a real shard: header first,
/// cluster filter, limit, rows in priority ↓ arrival ↑ cluster ↑ order.
#[derive(Debug, Clone, Default)]
pub struct ShardDouble {
    pub shard_id: String,
    /// `cycle` and `computed_at_unix_nanos` are served as given; `total_needs` is computed.
    pub header: pb::InspectNeedsHeader,
    /// In any order.
    pub needs: Vec<pb::NeedView>,
    /// `None`: ShardInfo answers UNIMPLEMENTED (a gateway without it).
    pub description: Option<mesh::ShardDescription>,
    /// Delay before answering anything (to exercise timeouts).
    pub delay: Option<Duration>,
    /// Served by RecentActions (filtered as a shard does; newest first by finish time).
    pub actions: Vec<mesh::ActionRecord>,
    /// Served by ListMachines (filtered and paged as a shard does).
    pub machines: Vec<mesh::MachineRow>,
}

impl ShardDouble {
    /// A shard without ShardInfo whose cycle `cycle`, computed at `computed_at_unix_nanos`,
    /// judged `needs`.
    pub fn with_verdicts(
        shard_id: &str,
        cycle: i64,
        computed_at_unix_nanos: i64,
        needs: Vec<pb::NeedView>,
    ) -> Self {
        Self {
            shard_id: shard_id.into(),
            header: pb::InspectNeedsHeader {
                cycle,
                computed_at_unix_nanos,
                total_needs: 0,
            },
            needs,
            ..Default::default()
        }
    }

    /// Serves ShardRead and ShardInfo on 127.0.0.1 (free port), mTLS when `tls` is given.
    pub async fn serve(
        self,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<RunningServer, ServerError> {
        MeshServer::new("shard-double", stack(shard_read_policy()))
            .tcp(SocketAddr::from(([127, 0, 0, 1], 0)))
            .tls(tls)
            .drain_deadline(Duration::from_secs(1))
            .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
            .add_service(ShardReadServer::new(self.clone()))
            .add_service(ShardInfoServer::new(self))
            .start()
            .await
    }

    async fn pause(&self) {
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
    }
}

#[tonic::async_trait]
impl ShardRead for ShardDouble {
    type InspectNeedsStream = NeedsStream;

    async fn inspect_needs(
        &self,
        request: Request<pb::InspectNeedsRequest>,
    ) -> Result<Response<Self::InspectNeedsStream>, Status> {
        self.pause().await;
        let r = request.into_inner();
        let mut rows: Vec<pb::NeedView> = self
            .needs
            .iter()
            .filter(|n| r.cluster_id.is_empty() || n.cluster_id == r.cluster_id)
            .cloned()
            .collect();
        let prio = |n: &pb::NeedView| n.need.as_ref().map_or(0, |n| n.priority);
        rows.sort_by(|a, b| {
            prio(b)
                .cmp(&prio(a))
                .then(a.arrival_unix_nanos.cmp(&b.arrival_unix_nanos))
                .then_with(|| a.cluster_id.cmp(&b.cluster_id))
        });
        let header = pb::InspectNeedsHeader {
            total_needs: i32::try_from(rows.len()).unwrap_or(i32::MAX),
            ..self.header
        };
        if r.limit > 0 {
            rows.truncate(usize::try_from(r.limit).unwrap_or(usize::MAX));
        }
        Ok(Response::new(needs_stream(header, rows)))
    }
}

#[tonic::async_trait]
impl ShardInfo for ShardDouble {
    async fn describe(
        &self,
        _: Request<mesh::DescribeShardRequest>,
    ) -> Result<Response<mesh::ShardDescription>, Status> {
        self.pause().await;
        match &self.description {
            Some(d) => Ok(Response::new(d.clone())),
            None => Err(Status::unimplemented("ShardInfo is not served here")),
        }
    }

    async fn recent_actions(
        &self,
        request: Request<mesh::RecentActionsRequest>,
    ) -> Result<Response<mesh::RecentActionsResponse>, Status> {
        self.pause().await;
        if self.description.is_none() {
            return Err(Status::unimplemented("ShardInfo is not served here"));
        }
        let r = request.into_inner();
        let mut rows: Vec<mesh::ActionRecord> = self
            .actions
            .iter()
            .filter(|a| {
                (r.cluster_id.is_empty() || a.cluster_id == r.cluster_id)
                    && a.finished_at_unix_nanos >= r.since_unix_nanos
                    && a.seq > r.after_seq
            })
            .cloned()
            .collect();
        rows.sort_by(|a, b| {
            (b.finished_at_unix_nanos, b.seq).cmp(&(a.finished_at_unix_nanos, a.seq))
        });
        rows.truncate(match r.limit {
            0 => 100,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        });
        Ok(Response::new(mesh::RecentActionsResponse {
            actions: rows,
            capacity: 10_000,
            recorded: self.actions.iter().map(|a| a.seq).max().unwrap_or(0),
            unreachable: Vec::new(),
        }))
    }

    async fn list_machines(
        &self,
        request: Request<mesh::ListMachinesRequest>,
    ) -> Result<Response<mesh::ListMachinesResponse>, Status> {
        self.pause().await;
        if self.description.is_none() {
            return Err(Status::unimplemented("ShardInfo is not served here"));
        }
        let r = request.into_inner();
        let id = |m: &mesh::MachineRow| m.machine.as_ref().map_or(String::new(), |m| m.id.clone());
        let mut rows: Vec<mesh::MachineRow> = self
            .machines
            .iter()
            .filter(|m| {
                let rec = m.machine.clone().unwrap_or_default();
                (r.cluster_id.is_empty() || rec.cluster == r.cluster_id)
                    && (r.states.is_empty() || r.states.contains(&rec.state))
            })
            .cloned()
            .collect();
        let total = rows.len() as u64;
        rows.retain(|m| id(m) > r.after_machine_id);
        rows.sort_by_key(|m| id(m));
        let limit = match r.limit {
            0 => 500,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let next = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(id).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(mesh::ListMachinesResponse {
            machines: rows,
            total_matching: total,
            next_after_machine_id: next,
            unreachable: Vec::new(),
        }))
    }
}

/// A need row with a verdict (satisfied when `reason` is `None`).
pub fn need(
    cluster: &str,
    priority: i32,
    arrival: i64,
    reason: Option<pb::UnmetReason>,
) -> pb::NeedView {
    let satisfied = reason.is_none();
    pb::NeedView {
        need: Some(pb::CapacityNeed {
            priority,
            aggregate_resources: [("cpu".to_owned(), "8".to_owned())].into(),
            ..Default::default()
        }),
        cluster_id: cluster.to_owned(),
        arrival_unix_nanos: arrival,
        profile_fingerprint: format!("fp-{cluster}-{priority}-{arrival}"),
        satisfied,
        residual_deficit: (!satisfied).then(|| pb::Resources {
            resources: [("cpu".to_owned(), "4".to_owned())].into(),
        }),
        claimed_machine_count: if satisfied { 1 } else { 0 },
        unmet_reason: reason.map_or(0, |r| r as i32),
        matching_supply: (!satisfied).then_some(pb::MatchingSupply {
            idle: 0,
            configured: 3,
            speculative: 0,
            capped: false,
        }),
        ..Default::default()
    }
}

/// A shard whose ShardInfo serves `actions` and `machines` and that holds no verdicts.
pub fn records_shard(
    shard_id: &str,
    actions: Vec<mesh::ActionRecord>,
    machines: Vec<mesh::MachineRow>,
) -> ShardDouble {
    ShardDouble {
        shard_id: shard_id.into(),
        description: Some(mesh::ShardDescription {
            shard_id: shard_id.into(),
            ..Default::default()
        }),
        actions,
        machines,
        ..Default::default()
    }
}

/// An idle-capacity transfer of two GPU machines (`m-201`, `m-202`) from s2 to s1, in
/// `phase`; a non-empty `pending` instruction is s1's to acknowledge.
pub fn gpu_transfer(id: &str, phase: &str, pending: &str, moved: u32) -> mesh::TransferInfo {
    mesh::TransferInfo {
        transfer_id: id.into(),
        kind: "idle".into(),
        phase: phase.into(),
        donor_shard_id: "s2".into(),
        recipient_shard_id: "s1".into(),
        instance_type: "gpu".into(),
        count: 2,
        priority: 100,
        machine_ids: vec!["m-201".into(), "m-202".into()],
        moved,
        pending_instruction_id: pending.into(),
        pending_shard_id: if pending.is_empty() { "" } else { "s1" }.into(),
        started_at_unix_ns: 1_700_000_000_000_000_000,
        updated_at_unix_ns: 1_700_000_030_000_000_000,
        reason: String::new(),
    }
}

/// One transfer in its adopt phase and one finished (s2 gives s1 two GPU machines), with
/// s1 owning a zone and waiting to acknowledge the adopt.
pub fn sample_transfers() -> mesh::ListTransfersResponse {
    mesh::ListTransfersResponse {
        active: vec![gpu_transfer("t-2", "adopt", "9b24f1087cda4ea8", 0)],
        recent: vec![gpu_transfer("t-1", "done", "", 2)],
        shards: vec![
            mesh::ShardOwnership {
                shard_id: "s1".into(),
                domains: vec![mesh::OwnedDomain {
                    topology_key: "topology.kubernetes.io/zone".into(),
                    topology_value: "eu-west-1a".into(),
                }],
                pending_instruction_ids: vec!["9b24f1087cda4ea8".into()],
            },
            mesh::ShardOwnership {
                shard_id: "s2".into(),
                domains: vec![mesh::OwnedDomain {
                    topology_key: "topology.kubernetes.io/zone".into(),
                    topology_value: "eu-west-1b".into(),
                }],
                pending_instruction_ids: Vec::new(),
            },
        ],
    }
}

/// A registry entry for a shard served at `addr`.
pub fn registry_entry(shard_id: &str, addr: SocketAddr) -> pb::ShardRegistryEntry {
    pb::ShardRegistryEntry {
        shard_id: shard_id.to_owned(),
        address: addr.to_string(),
        registered_at_unix_ns: 1,
        last_heartbeat_unix_ns: crate::fleet::now_unix_nanos(),
    }
}
