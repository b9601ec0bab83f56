//! gRPC faces of decide, one per audience (ADR-0101): `bigfleet.mesh.v1.Ingest`
//! (the gateway, Unix socket only), `bigfleet.mesh.v1.Work` (execute workers),
//! `bigfleet.v1alpha1.ShardRead` (per-need verdicts) and
//! `bigfleet.mesh.v1.ShardInfo` (counts for the gateway / svc-inspect).

use crate::ledgers::VerdictRow;
use crate::shard::{Decide, DecideError};
use bigfleet_conv::{need_to_proto, resources_message};
use bigfleet_mesh::{ClassifyError, ErrorClass};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::ingest_server::IngestServer;
use bigfleet_proto::mesh::v1::shard_info_server::ShardInfoServer;
use bigfleet_proto::mesh::v1::work_server::WorkServer;
use bigfleet_proto::mesh::v1::worker_message::Msg;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_server::ShardReadServer;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Decide's errors in `bigfleet_mesh`'s one map (codes, generic INTERNAL messages).
impl ClassifyError for DecideError {
    fn class(&self) -> ErrorClass {
        match self {
            DecideError::UnknownMachine(_) => ErrorClass::NotFound,
            DecideError::Stale(_) => ErrorClass::Aborted,
            DecideError::Invalid(_) | DecideError::Rollup(_) => ErrorClass::InvalidArgument,
            DecideError::AuditLog { .. } => ErrorClass::Internal,
            DecideError::NotReady(_) => ErrorClass::Unavailable,
        }
    }
}

/// The one place decide's errors become gRPC statuses.
impl From<DecideError> for Status {
    fn from(e: DecideError) -> Self {
        let mut status = bigfleet_mesh::status_from(&e);
        if let DecideError::Rollup(conv) = &e {
            // The fixed reason travels beside the message so the gateway can count the
            // rejection by it without parsing text (ADR-0104).
            status.metadata_mut().insert(
                bigfleet_conv::REJECT_REASON_METADATA,
                tonic::metadata::MetadataValue::from_static(conv.reason()),
            );
        }
        status
    }
}

#[cfg(test)]
mod error_mapping_tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn decide_errors_keep_their_codes_and_hide_internals() {
        let cases = [
            (DecideError::UnknownMachine("m1".into()), Code::NotFound),
            (DecideError::Stale("state differs".into()), Code::Aborted),
            (DecideError::Invalid("x".into()), Code::InvalidArgument),
            (
                DecideError::Rollup(bigfleet_conv::ConvError::EmptyClusterId),
                Code::InvalidArgument,
            ),
            (DecideError::NotReady("warming".into()), Code::Unavailable),
        ];
        for (err, code) in cases {
            let msg = err.to_string();
            let status = Status::from(err);
            assert_eq!((status.code(), status.message()), (code, msg.as_str()));
        }
        let status = Status::from(DecideError::Rollup(
            bigfleet_conv::ConvError::EmptyClusterId,
        ));
        assert!(
            status
                .metadata()
                .get(bigfleet_conv::REJECT_REASON_METADATA)
                .is_some()
        );
        let status = Status::from(DecideError::AuditLog {
            path: "/var/lib/bigfleet/audit.log".into(),
            source: std::io::Error::other("disk full"),
        });
        assert_eq!(status.code(), Code::Internal);
        assert!(
            status
                .message()
                .starts_with(bigfleet_mesh::INTERNAL_MESSAGE)
                && !status.message().contains("audit"),
            "{}",
            status.message()
        );
    }
}

/// Buffered WorkItems per stream; credits bound what is outstanding anyway.
const WORK_STREAM_BUFFER: usize = 256;

/// The tonic services of one decide instance.
#[derive(Clone, Debug)]
pub struct DecideService {
    decide: Decide,
}

impl DecideService {
    pub fn new(decide: Decide) -> Self {
        DecideService { decide }
    }

    /// Work and Transition over mTLS must come from this shard's execute
    /// role (`bigfleet://shard/<id>/execute`); Unix-socket and plaintext
    /// callers skip the check.
    fn bind_worker<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match bigfleet_mesh::peer_of(request) {
            Some(peer) => peer.ensure(&bigfleet_mesh::PeerIdentity::ShardExecute(
                self.decide.config().shard_id.clone(),
            )),
            None => Ok(()),
        }
    }

    /// Ingest comes from the gateway over the pod's Unix socket and nowhere
    /// else: a TCP caller of any identity is refused, even if a listener were
    /// ever misconfigured to serve the contract.
    fn require_local<T>(request: &Request<T>) -> Result<(), Status> {
        match bigfleet_mesh::peer_of(request) {
            None | Some(bigfleet_mesh::Peer::Local) => Ok(()),
            Some(peer) => Err(Status::permission_denied(format!(
                "{peer} may not call bigfleet.mesh.v1.Ingest (unix socket only)"
            ))),
        }
    }

    /// `bigfleet.mesh.v1.Ingest` with 256 MiB message limits (roll-ups).
    pub fn ingest_server(&self) -> IngestServer<DecideService> {
        bigfleet_mesh::with_message_limits!(IngestServer::new(self.clone()))
    }

    /// `bigfleet.mesh.v1.Work` with 256 MiB message limits.
    pub fn work_server(&self) -> WorkServer<DecideService> {
        bigfleet_mesh::with_message_limits!(WorkServer::new(self.clone()))
    }

    /// `bigfleet.v1alpha1.ShardRead` with 256 MiB message limits.
    pub fn shard_read_server(&self) -> ShardReadServer<DecideService> {
        bigfleet_mesh::with_message_limits!(ShardReadServer::new(self.clone()))
    }

    /// `bigfleet.mesh.v1.ShardInfo`.
    pub fn shard_info_server(&self) -> ShardInfoServer<DecideService> {
        ShardInfoServer::new(self.clone())
    }
}

#[tonic::async_trait]
impl mesh::ingest_server::Ingest for DecideService {
    async fn apply_rollup(
        &self,
        request: Request<mesh::ApplyRollupRequest>,
    ) -> Result<Response<mesh::ApplyRollupResponse>, Status> {
        Self::require_local(&request)?;
        Ok(Response::new(crate::edge::apply_rollup(
            &self.decide,
            request.get_ref(),
        )?))
    }

    async fn session_opened(
        &self,
        request: Request<mesh::SessionOpenedRequest>,
    ) -> Result<Response<mesh::SessionOpenedResponse>, Status> {
        Self::require_local(&request)?;
        Ok(Response::new(
            crate::edge::session_opened(&self.decide, request.get_ref()).await?,
        ))
    }

    async fn session_closed(
        &self,
        request: Request<mesh::SessionClosedRequest>,
    ) -> Result<Response<mesh::SessionClosedResponse>, Status> {
        Self::require_local(&request)?;
        crate::edge::session_closed(&self.decide, request.get_ref());
        Ok(Response::new(mesh::SessionClosedResponse {}))
    }
}

#[tonic::async_trait]
impl mesh::work_server::Work for DecideService {
    type PullStream = ReceiverStream<Result<mesh::WorkItem, Status>>;

    async fn pull(
        &self,
        request: Request<Streaming<mesh::WorkerMessage>>,
    ) -> Result<Response<Self::PullStream>, Status> {
        self.bind_worker(&request)?;
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(mesh::WorkerMessage {
                msg: Some(Msg::Hello(h)),
            }) => h,
            _ => return Err(Status::invalid_argument("the first frame must be a Hello")),
        };
        let shard = &self.decide.config().shard_id;
        if !hello.shard_id.is_empty() && hello.shard_id != *shard {
            return Err(Status::invalid_argument(format!(
                "worker serves shard {:?}, this is {shard:?}",
                hello.shard_id
            )));
        }
        let stream = self
            .decide
            .inner
            .next_stream
            .fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(WORK_STREAM_BUFFER);
        tracing::info!(worker = %hello.worker_id, stream, "execute worker connected");
        tokio::spawn(serve_worker(
            self.decide.clone(),
            stream,
            hello.worker_id,
            inbound,
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn transition(
        &self,
        request: Request<mesh::TransitionRequest>,
    ) -> Result<Response<mesh::TransitionResponse>, Status> {
        self.bind_worker(&request)?;
        let machine = crate::edge::transition(&self.decide, request.get_ref()).await?;
        Ok(Response::new(mesh::TransitionResponse {
            machine: Some(machine),
        }))
    }
}

/// One worker's stream: hands out one action per credit, takes Done reports,
/// and abandons whatever the worker still held when the stream ends.
async fn serve_worker(
    decide: Decide,
    stream: u64,
    worker: String,
    mut inbound: Streaming<mesh::WorkerMessage>,
    tx: mpsc::Sender<Result<mesh::WorkItem, Status>>,
) {
    let metrics = decide.metrics().clone();
    metrics.work_streams.inc();
    let mut credits: u64 = 0;
    'stream: loop {
        // Registered before looking at the queue, so an enqueue between the
        // look and the wait is not missed.
        let notified = decide.inner.work_ready.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Likewise for the actuation gate: a term that begins after the look wakes us.
        let mut gate = decide.inner.actuation.subscribe();
        while credits > 0 {
            let Some(item) = crate::edge::hand_out(&decide, stream).await else {
                break;
            };
            credits -= 1;
            if tx.send(Ok(item)).await.is_err() {
                break 'stream;
            }
        }
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(m)) => match m.msg {
                    Some(Msg::Credit(c)) => credits = credits.saturating_add(u64::from(c.n)),
                    Some(Msg::Done(d)) => crate::edge::done(&decide, &d),
                    Some(Msg::Hello(_)) | None => {}
                },
                Ok(None) => break,
                Err(e) => {
                    tracing::info!(worker = %worker, stream, error = %e, "work stream broke");
                    break;
                }
            },
            () = &mut notified, if credits > 0 => {}
            () = crate::actuation::changed(&mut gate), if credits > 0 => {}
            () = tx.closed() => break,
        }
    }
    let freed = decide.abandon_stream(stream);
    metrics.work_streams.dec();
    tracing::info!(worker = %worker, stream, abandoned = freed, "execute worker disconnected");
}

fn need_view(row: &VerdictRow) -> pb::NeedView {
    let v = &row.verdict;
    let need = row.need();
    let count = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    pb::NeedView {
        need: Some(need_to_proto(need)),
        cluster_id: need.cluster.clone(),
        arrival_unix_nanos: need.arrival_unix_nanos,
        profile_fingerprint: need.fingerprint().to_owned(),
        satisfied: v.satisfied,
        residual_deficit: if v.satisfied {
            None
        } else {
            resources_message(&v.residual_deficit)
        },
        claimed_machine_count: count(v.claimed_machine_count),
        bootstrap_count: count(v.bootstrap_count),
        provision_count: count(v.provision_count),
        same_domain: v.same_domain.clone(),
        same_satisfiable: v.same_satisfiable,
        acquisition_parked: v.acquisition_parked,
        parked_age_cycles: count(v.parked_age_cycles),
        age_cycles_unmet: count(row.age_cycles_unmet),
        unmet_reason: i32::from(v.unmet_reason.ordinal()),
        matching_supply: v.matching_supply.map(|s| pb::MatchingSupply {
            idle: count(s.idle),
            configured: count(s.configured),
            speculative: count(s.speculative),
            capped: s.capped,
        }),
        preemption: v
            .preemption
            .as_ref()
            .filter(|p| p.victims_found > 0)
            .map(|p| pb::PreemptionSummary {
                victims_found: count(p.victims_found),
                capacity_freed: resources_message(&p.capacity_freed),
            }),
        same_candidates: v
            .same_candidates
            .iter()
            .map(|d| pb::DomainCoverage {
                domain: d.domain.clone(),
                coverage_per_mille: d.coverage_per_mille,
                satisfiable: d.satisfiable,
            })
            .collect(),
    }
}

type InspectStream =
    Pin<Box<dyn futures::Stream<Item = Result<pb::InspectNeedsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::shard_read_server::ShardRead for DecideService {
    type InspectNeedsStream = InspectStream;

    async fn inspect_needs(
        &self,
        request: Request<pb::InspectNeedsRequest>,
    ) -> Result<Response<Self::InspectNeedsStream>, Status> {
        let req = request.into_inner();
        let limit = usize::try_from(req.limit)
            .map_err(|_| Status::invalid_argument("limit must not be negative"))?;
        let table = self.decide.verdicts();
        let (total, rows) = table.select(&req.cluster_id, limit);
        let mut frames = Vec::with_capacity(rows.len() + 1);
        frames.push(Ok(pb::InspectNeedsResponse {
            frame: Some(pb::inspect_needs_response::Frame::Header(
                pb::InspectNeedsHeader {
                    cycle: i64::try_from(table.cycle).unwrap_or(i64::MAX),
                    computed_at_unix_nanos: table.computed_at_unix_nanos,
                    total_needs: i32::try_from(total).unwrap_or(i32::MAX),
                },
            )),
        }));
        frames.extend(rows.into_iter().map(|r| {
            Ok(pb::InspectNeedsResponse {
                frame: Some(pb::inspect_needs_response::Frame::Need(need_view(r))),
            })
        }));
        let mut response =
            Response::new(Box::pin(futures::stream::iter(frames)) as Self::InspectNeedsStream);
        // How fresh the inventory behind the verdicts is travels as response metadata
        // (the public header message stays the original's, ADR-0118).
        let md = response.metadata_mut();
        md.insert(
            INVENTORY_LISTED_AT_METADATA,
            tonic::metadata::MetadataValue::from(table.inventory_listed_at_unix_nanos),
        );
        md.insert(
            INVENTORY_STALE_METADATA,
            tonic::metadata::MetadataValue::from_static(if table.inventory_stale {
                "true"
            } else {
                "false"
            }),
        );
        Ok(response)
    }
}

/// InspectNeeds response metadata: when the List behind the verdicts' inventory started
/// (Unix nanos; 0 = never).
pub const INVENTORY_LISTED_AT_METADATA: &str = "bigfleet-inventory-listed-at-unix-nanos";
/// InspectNeeds response metadata: `true` when the cycle's List failed and it decided on
/// the last-known inventory.
pub const INVENTORY_STALE_METADATA: &str = "bigfleet-inventory-stale";

#[tonic::async_trait]
impl mesh::shard_info_server::ShardInfo for DecideService {
    async fn describe(
        &self,
        _request: Request<mesh::DescribeShardRequest>,
    ) -> Result<Response<mesh::ShardDescription>, Status> {
        let d = &self.decide;
        let by_state = d
            .machines_by_state()
            .await
            .into_iter()
            .map(|(s, n)| {
                let name = pb::MachineState::try_from(i32::from(s.ordinal()))
                    .map_or("MACHINE_STATE_UNSPECIFIED", |s| s.as_str_name());
                (name.to_owned(), i32::try_from(n).unwrap_or(i32::MAX))
            })
            .collect();
        let verdicts = d.verdicts();
        let (_, inflight) = d.action_counts();
        Ok(Response::new(mesh::ShardDescription {
            shard_id: d.config().shard_id.clone(),
            shard_epoch: i64::try_from(d.epoch()).unwrap_or(i64::MAX),
            cycle: i64::try_from(d.cycle_count()).unwrap_or(i64::MAX),
            machines_by_state: by_state,
            sessions: u32::try_from(d.connected_clusters().len()).unwrap_or(u32::MAX),
            needs: i32::try_from(d.need_rows()).unwrap_or(i32::MAX),
            unmet_needs: i32::try_from(verdicts.unmet()).unwrap_or(i32::MAX),
            actions_in_flight: i32::try_from(inflight).unwrap_or(i32::MAX),
            inventory_stale: verdicts.inventory_stale,
            inventory_listed_at_unix_nanos: verdicts.inventory_listed_at_unix_nanos,
            removals_held: i32::try_from(d.removals_held()).unwrap_or(i32::MAX),
        }))
    }

    async fn recent_actions(
        &self,
        request: Request<mesh::RecentActionsRequest>,
    ) -> Result<Response<mesh::RecentActionsResponse>, Status> {
        let req = request.into_inner();
        let d = &self.decide;
        let (_, capacity, recorded) = d.history_size();
        let records = d.recent_actions(&crate::history::HistoryQuery {
            cluster: req.cluster_id,
            since_unix_nanos: req.since_unix_nanos,
            after_seq: req.after_seq,
            limit: usize::try_from(req.limit).unwrap_or(usize::MAX),
        });
        let shard = &d.config().shard_id;
        Ok(Response::new(mesh::RecentActionsResponse {
            actions: records
                .iter()
                .map(|r| action_record_to_proto(shard, r))
                .collect(),
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            recorded,
            unreachable: Vec::new(),
        }))
    }

    async fn list_machines(
        &self,
        request: Request<mesh::ListMachinesRequest>,
    ) -> Result<Response<mesh::ListMachinesResponse>, Status> {
        let req = request.into_inner();
        let d = &self.decide;
        let MachinePage { rows, total, next } = {
            let inv = d.inner.inventory.read().await;
            machine_page(&inv, &req)?
        };
        let shard = &d.config().shard_id;
        Ok(Response::new(mesh::ListMachinesResponse {
            machines: rows
                .iter()
                .map(|(m, idle_since)| mesh::MachineRow {
                    shard_id: shard.clone(),
                    machine: Some(crate::shard::machine_view(m)),
                    idle_since_unix_nanos: *idle_since,
                })
                .collect(),
            total_matching: total,
            next_after_machine_id: next,
            unreachable: Vec::new(),
        }))
    }
}

/// Most machines one ListMachines page carries, and the page size when none is asked.
const MAX_MACHINE_PAGE: usize = 5000;
const DEFAULT_MACHINE_PAGE: usize = 500;

/// A history record as the mesh sees it.
pub fn action_record_to_proto(
    shard_id: &str,
    r: &crate::history::ActionRecord,
) -> mesh::ActionRecord {
    mesh::ActionRecord {
        shard_id: shard_id.to_owned(),
        seq: r.seq,
        cycle: i64::try_from(r.cycle).unwrap_or(i64::MAX),
        kind: r.kind.as_str().to_owned(),
        reason: r.reason().to_owned(),
        machine_id: r.machine.clone(),
        cluster_id: r.cluster.clone(),
        need_fingerprint: r.need_fingerprint.clone(),
        group: r.group.clone(),
        priority: r.priority,
        grace_seconds: r.grace.map_or(0.0, |g| g.as_secs_f64()),
        action_id: r.action_id.clone(),
        outcome: r.outcome.clone(),
        decided_at_unix_nanos: r.decided_at_unix_nanos,
        started_at_unix_nanos: r.started_at_unix_nanos,
        finished_at_unix_nanos: r.finished_at_unix_nanos,
        run_nanos: r.run_nanos(),
    }
}

/// One ListMachines page before conversion.
pub(crate) struct MachinePage {
    /// Machines in id order, each with its idle-since time (0 unless Idle).
    rows: Vec<(bigfleet_model::Machine, i64)>,
    /// Machines matching the filters, all pages.
    total: u64,
    /// The id to continue after; empty on the last page.
    next: String,
}

/// One page of `inv` in id order.
pub(crate) fn machine_page(
    inv: &crate::inventory::Inventory,
    req: &mesh::ListMachinesRequest,
) -> Result<MachinePage, Status> {
    let states = req
        .states
        .iter()
        .map(|&s| bigfleet_conv::machine_state_from_proto(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let limit = match req.limit {
        0 => DEFAULT_MACHINE_PAGE,
        n => usize::try_from(n)
            .unwrap_or(MAX_MACHINE_PAGE)
            .min(MAX_MACHINE_PAGE),
    };
    let matches = |id: &str| {
        (states.is_empty() || inv.state_of(id).is_some_and(|s| states.contains(&s)))
            && (req.cluster_id.is_empty() || inv.cluster_of(id) == Some(req.cluster_id.as_str()))
    };
    let mut total = 0u64;
    let mut ids: Vec<&str> = inv
        .ids()
        .filter(|id| matches(id))
        .inspect(|_| total += 1)
        .filter(|id| *id > req.after_machine_id.as_str())
        .collect();
    // Only the page (and one more, to know whether another follows) needs ordering.
    if ids.len() > limit + 1 {
        ids.select_nth_unstable(limit);
        ids.truncate(limit + 1);
    }
    ids.sort_unstable();
    let more = ids.len() > limit;
    ids.truncate(limit);
    let next = if more {
        ids.last().map(|s| (*s).to_owned()).unwrap_or_default()
    } else {
        String::new()
    };
    let rows = ids
        .iter()
        .filter_map(|id| inv.get(id).map(|m| (m, inv.idle_since_of(id).unwrap_or(0))))
        .collect();
    Ok(MachinePage { rows, total, next })
}
