//! The internal `bigfleet.mesh.v1.CoordinatorInfo` service (ADR-0139): the transfer picture
//! — transfers in flight, the recent finished ones the replicated state keeps, each shard's
//! domains and unacknowledged instructions — for `bigfleet shards`, the dashboard and
//! `bigfleet up`. Served next to the public service on the same listener, leader-only,
//! readable by the readonly and admin identities like the public reads.

use std::sync::Arc;

use bigfleet_proto::mesh::v1::coordinator_info_server::{CoordinatorInfo, CoordinatorInfoServer};
use bigfleet_proto::mesh::v1::{self as mpb};
use tonic::{Request, Response, Status};

use crate::replica::Replica;
use crate::service::require_reader;
use crate::transfers::Transfer;

/// The service handler (cheap to clone).
#[derive(Clone)]
pub struct CoordinatorInfoService {
    replica: Arc<Replica>,
}

impl CoordinatorInfoService {
    pub fn new(replica: Arc<Replica>) -> Self {
        Self { replica }
    }

    pub fn into_server(self) -> CoordinatorInfoServer<Self> {
        bigfleet_mesh::with_message_limits!(CoordinatorInfoServer::new(self))
    }
}

/// The wire form of one transfer.
pub fn transfer_info(t: &Transfer) -> mpb::TransferInfo {
    let pending = t.target().is_some();
    mpb::TransferInfo {
        transfer_id: t.id.clone(),
        kind: kind_label(t).to_owned(),
        phase: t.phase.label().to_owned(),
        donor_shard_id: t.donor.clone(),
        recipient_shard_id: t.recipient.clone(),
        instance_type: t.instance_type.clone(),
        count: t.count,
        priority: t.priority,
        machine_ids: t.machine_ids.clone(),
        moved: u32::try_from(t.moved()).unwrap_or(u32::MAX),
        pending_instruction_id: if pending {
            t.instruction_id.clone()
        } else {
            String::new()
        },
        pending_shard_id: t.target().unwrap_or_default().to_owned(),
        started_at_unix_ns: t.started_at_unix_ns,
        updated_at_unix_ns: t.updated_at_unix_ns,
        reason: t.reason.clone(),
    }
}

fn kind_label(t: &Transfer) -> &'static str {
    use crate::transfers::TransferKind;
    match t.kind {
        TransferKind::Idle => "idle",
        TransferKind::Speculative => "speculative",
        TransferKind::Drain => "drain",
    }
}

fn involves(t: &Transfer, shard: &str) -> bool {
    shard.is_empty() || t.donor == shard || t.recipient == shard
}

#[tonic::async_trait]
impl CoordinatorInfo for CoordinatorInfoService {
    async fn list_transfers(
        &self,
        request: Request<mpb::ListTransfersRequest>,
    ) -> Result<Response<mpb::ListTransfersResponse>, Status> {
        let term = self.replica.admit(require_reader(&request))?;
        let filter = request.into_inner().shard_id;
        let (active, recent, shards) = {
            let shared = self.replica.shared.read();
            let st = &shared.state;
            let active = st.active_transfers();
            let shards: Vec<(String, Vec<mpb::OwnedDomain>)> = st
                .shards()
                .into_iter()
                .filter(|s| filter.is_empty() || s.id == filter)
                .map(|s| {
                    let domains = st
                        .domains_for_shard(&s.id)
                        .into_iter()
                        .map(|d| mpb::OwnedDomain {
                            topology_key: d.key,
                            topology_value: d.value,
                        })
                        .collect();
                    (s.id, domains)
                })
                .collect();
            (active, st.recent_transfers(), shards)
        };
        let shards = {
            let mut soft = self.replica.soft.lock();
            soft.ensure_term(term);
            shards
                .into_iter()
                .map(|(id, domains)| {
                    let mut pending: Vec<String> = soft
                        .pending(&id)
                        .into_iter()
                        .map(|i| i.instruction_id)
                        .collect();
                    pending.extend(
                        active
                            .iter()
                            .filter(|t| t.target() == Some(id.as_str()))
                            .map(|t| t.instruction_id.clone()),
                    );
                    mpb::ShardOwnership {
                        shard_id: id,
                        domains,
                        pending_instruction_ids: pending,
                    }
                })
                .collect()
        };
        Ok(Response::new(mpb::ListTransfersResponse {
            active: active
                .iter()
                .filter(|t| involves(t, &filter))
                .map(transfer_info)
                .collect(),
            recent: recent
                .iter()
                .rev()
                .filter(|t| involves(t, &filter))
                .map(transfer_info)
                .collect(),
            shards,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfers::{Phase, TransferKind};

    fn transfer(phase: Phase) -> Transfer {
        Transfer {
            id: "t1".into(),
            kind: TransferKind::Idle,
            donor: "s1".into(),
            recipient: "s0".into(),
            instance_type: "gpu".into(),
            count: 2,
            priority: 500,
            phase,
            instruction_id: "i1".into(),
            machine_ids: vec!["m1".into(), "m2".into()],
            started_at_unix_ns: 10,
            updated_at_unix_ns: 20,
            reason: String::new(),
            selectors: Vec::new(),
        }
    }

    /// An active transfer names its pending instruction and target; a finished one has
    /// nothing pending and counts what moved.
    #[test]
    fn pending_and_moved_follow_the_phase() {
        for (phase, want) in [
            (Phase::Adopt, ("idle", "adopt", "i1", "s0", 0)),
            (Phase::Done, ("idle", "done", "", "", 2)),
        ] {
            let got = transfer_info(&transfer(phase));
            assert_eq!(
                (
                    got.kind.as_str(),
                    got.phase.as_str(),
                    got.pending_instruction_id.as_str(),
                    got.pending_shard_id.as_str(),
                    got.moved,
                ),
                want
            );
        }
    }

    #[test]
    fn the_shard_filter_matches_either_end() {
        let t = transfer(Phase::Release);
        assert!(involves(&t, "") && involves(&t, "s0") && involves(&t, "s1"));
        assert!(!involves(&t, "s2"));
    }
}
