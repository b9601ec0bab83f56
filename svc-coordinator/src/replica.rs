//! One replica's shared machinery: leadership checks with the leader hint, proposing commands
//! with the apply timeout and outcome metrics, membership changes, fresh snapshots.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bigfleet_mesh::{ClassifyError, ErrorClass};
use openraft::ChangeMembers;
use openraft::ServerState;
use openraft::error::{ClientWriteError, RaftError};
use parking_lot::Mutex;
use tonic::Status;

use crate::fsm::{Command, Effect, FsmError};
use crate::metrics::{Metrics, OUTCOME_ERROR, OUTCOME_FSM_ERROR, OUTCOME_SUCCESS};
use crate::raft_types::{
    CoordNode, LogId, NodeId, Raft, RaftMetrics, SnapshotMeta, StoredMembership, node_id_of,
};
use crate::soft::SoftState;
use crate::store::{SharedState, Store};

/// Metadata key a joining replica uses to tell the leader its Coordinator address.
pub const JOIN_API_ADDR_KEY: &str = "x-bigfleet-coordinator-address";
/// Raft proposals that do not commit within this are answered UNAVAILABLE (the original's
/// apply timeout).
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a join waits for the joiner's log to catch up before it is promoted; a joiner
/// that has not caught up by then is refused (UNAVAILABLE) and retries, still a learner.
/// With adding and promoting (an [`APPLY_TIMEOUT`] each) it stays inside the joiner's 40 s
/// call deadline.
const LEARNER_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(25);

/// Everything a coordinator RPC can fail with. [`ClassifyError`] is its one mapping; gRPC
/// statuses come from `bigfleet_mesh` (leader hint in `bigfleet_mesh::LEADER_HINT_METADATA`,
/// generic INTERNAL messages).
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("coordinator: not leader")]
    NotLeader { leader_api_addr: Option<String> },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error(transparent)]
    Fsm(#[from] FsmError),
    #[error("coordinator: {0}")]
    Unavailable(String),
    #[error("coordinator: no snapshot taken yet")]
    NoSnapshot,
    #[error("internal: {0}")]
    Internal(String),
}

impl ClassifyError for CoordError {
    fn class(&self) -> ErrorClass {
        match self {
            CoordError::NotLeader { leader_api_addr } => ErrorClass::NotLeader {
                leader: leader_api_addr.clone(),
            },
            CoordError::InvalidArgument(_) => ErrorClass::InvalidArgument,
            CoordError::PermissionDenied(_) => ErrorClass::PermissionDenied,
            CoordError::Fsm(f) => match f {
                FsmError::ShardNotFound(_) => ErrorClass::NotFound,
                FsmError::ShardExists(_)
                | FsmError::DomainAlreadyAssigned { .. }
                | FsmError::ClusterAlreadyBound { .. } => ErrorClass::AlreadyExists,
                FsmError::Invalid(_) => ErrorClass::InvalidArgument,
            },
            CoordError::Unavailable(_) => ErrorClass::Unavailable,
            CoordError::NoSnapshot => ErrorClass::NotFound,
            CoordError::Internal(_) => ErrorClass::Internal,
        }
    }
}

impl From<CoordError> for Status {
    fn from(e: CoordError) -> Self {
        bigfleet_mesh::status_from(&e)
    }
}

pub fn now_unix_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// One replica.
pub struct Replica {
    pub raft: Raft,
    pub id: NodeId,
    /// This replica as it should appear in the membership.
    pub me: CoordNode,
    pub store: Store,
    pub shared: SharedState,
    pub metrics: Metrics,
    pub soft: Mutex<SoftState>,
    /// Port of the Coordinator listener, to derive a joiner's API address when it did not
    /// send one (identical args on every replica ⇒ the same port).
    pub api_port: u16,
    /// Held by the leader across one replica's whole add-and-promote: openraft refuses a
    /// membership change while another is in flight, so replicas joining together would
    /// otherwise fail each other's promotion and wait out a join backoff.
    pub membership_changes: tokio::sync::Mutex<()>,
}

impl Replica {
    /// The current term if this replica leads, else NotLeader with the leader's address.
    pub fn leader_term(&self) -> Result<u64, CoordError> {
        let m = self.raft.metrics().borrow().clone();
        if self.leads_in(&m) {
            return Ok(m.current_term);
        }
        Err(not_leader(&m))
    }

    /// Whether `m` says this replica leads.
    fn leads_in(&self, m: &RaftMetrics) -> bool {
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Admits a call that `may_call` (the caller's role check) rules on: leadership comes
    /// first, so a follower answers every caller, whatever its role, with the leader hint
    /// (the original's order). Returns the term this replica leads in.
    pub fn admit(&self, may_call: Result<(), CoordError>) -> Result<u64, CoordError> {
        let term = self.leader_term()?;
        may_call?;
        Ok(term)
    }

    /// Proposes a command and waits (up to [`APPLY_TIMEOUT`]) for it to commit and apply.
    pub async fn apply(&self, cmd: Command) -> Result<Effect, CoordError> {
        let res = tokio::time::timeout(APPLY_TIMEOUT, self.raft.client_write(cmd)).await;
        match res {
            Err(_) => {
                self.metrics.apply(OUTCOME_ERROR);
                Err(CoordError::Unavailable(format!(
                    "apply not committed within {APPLY_TIMEOUT:?}"
                )))
            }
            Ok(Err(e)) => {
                self.metrics.apply(OUTCOME_ERROR);
                Err(write_failed(e))
            }
            Ok(Ok(resp)) => match resp.data.0 {
                Some(Ok(effect)) => {
                    self.metrics.apply(OUTCOME_SUCCESS);
                    Ok(effect)
                }
                Some(Err(fsm)) => {
                    self.metrics.apply(OUTCOME_FSM_ERROR);
                    Err(CoordError::Fsm(fsm))
                }
                None => {
                    self.metrics.apply(OUTCOME_ERROR);
                    Err(CoordError::Internal(
                        "command applied without a result".into(),
                    ))
                }
            },
        }
    }

    /// Makes `name` a voter at (`raft_addr`, `api_addr`): adds it as a learner (waiting for
    /// it to catch up) and promotes it, or rewrites the address of an existing member.
    /// Idempotent.
    pub async fn add_voter(
        &self,
        name: &str,
        raft_addr: &str,
        api_addr: &str,
    ) -> Result<(), CoordError> {
        let _one_change_at_a_time = self.membership_changes.lock().await;
        let id = node_id_of(name);
        let node = CoordNode {
            name: name.to_owned(),
            raft_addr: raft_addr.to_owned(),
            api_addr: api_addr.to_owned(),
        };
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let m = membership.membership();
        let is_voter = m.voter_ids().any(|v| v == id);
        let existing = m.get_node(&id).cloned();
        let unavailable = |e: String| CoordError::Unavailable(e);
        if existing.as_ref() != Some(&node) && existing.is_some() {
            tracing::info!(node = name, raft_addr, api_addr, "rewriting member address");
            tokio::time::timeout(
                APPLY_TIMEOUT,
                self.raft.change_membership(
                    ChangeMembers::SetNodes(BTreeMap::from([(id, node.clone())])),
                    false,
                ),
            )
            .await
            .map_err(|_| unavailable("membership change timed out".into()))?
            .map_err(write_failed)?;
        }
        if !is_voter {
            // Also when it is a learner already (an earlier attempt that timed out): it is
            // promoted only once it has acknowledged the entry that (re-)added it. openraft's
            // own blocking add counts a learner within 5,000 entries as caught up, which on a
            // young log is true of one nobody can reach; promoting that one would put every
            // commit behind it (a one-voter group's joint configuration needs both) until it
            // answers.
            tracing::info!(node = name, raft_addr, "adding learner");
            let added = tokio::time::timeout(APPLY_TIMEOUT, self.raft.add_learner(id, node, false))
                .await
                .map_err(|_| unavailable("adding the learner timed out".into()))?
                .map_err(write_failed)?;
            let upto = added.log_id.index;
            let term = added.log_id.leader_id.term;
            let caught_up =
                |m: &RaftMetrics| learner_matched(m, id).is_some_and(|l| l.index >= upto);
            // A leader deposed meanwhile answers at once with the hint, so the joiner
            // follows it to the new leader instead of waiting out the catch-up timeout. The
            // term, not just the state, is watched: metrics updates coalesce, so a leader
            // deposed and re-elected at once may never be seen as a follower.
            let m = self
                .raft
                .wait(Some(LEARNER_CATCH_UP_TIMEOUT))
                .metrics(
                    |m| caught_up(m) || m.current_term != term || !self.leads_in(m),
                    "learner caught up or leadership changed",
                )
                .await
                .map_err(|_| unavailable("learner did not catch up in time".into()))?;
            if !caught_up(&m) {
                return Err(if self.leads_in(&m) {
                    unavailable("re-elected while the learner caught up".into())
                } else {
                    not_leader(&m)
                });
            }
            tracing::info!(node = name, "promoting to voter");
            tokio::time::timeout(
                APPLY_TIMEOUT,
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false),
            )
            .await
            .map_err(|_| unavailable("membership change timed out".into()))?
            .map_err(write_failed)?;
        }
        Ok(())
    }

    /// Whether the cluster has a leader and lists this replica as a voter at its current
    /// addresses: the join reconciler's exit condition.
    pub fn membership_current(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        let mem = m.membership_config.membership();
        m.current_leader.is_some()
            && mem.voter_ids().any(|v| v == self.id)
            && mem.get_node(&self.id) == Some(&self.me)
    }

    /// The leader's snapshot, refreshed first when the stored one misses applied entries (a
    /// backup that silently lacks recent writes is worse than a failed call).
    pub async fn fresh_snapshot(&self) -> Result<(SnapshotMeta, Vec<u8>), CoordError> {
        let applied = self.raft.metrics().borrow().last_applied;
        let stored = self
            .store
            .current_snapshot()
            .map_err(|e| CoordError::Internal(e.to_string()))?;
        if let Some((meta, data)) = &stored
            && meta.last_log_id >= applied
        {
            return Ok((meta.clone(), data.clone()));
        }
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| CoordError::Unavailable(e.to_string()))?;
        self.raft
            .wait(Some(APPLY_TIMEOUT))
            .metrics(
                |m| m.snapshot >= applied,
                "snapshot covering applied entries",
            )
            .await
            .map_err(|e| CoordError::Unavailable(e.to_string()))?;
        self.store
            .current_snapshot()
            .map_err(|e| CoordError::Internal(e.to_string()))?
            .ok_or(CoordError::NoSnapshot)
    }
}

/// A refused proposal or membership change: NotLeader (with the new leader's address, so
/// the caller follows it) when leadership moved under it, else UNAVAILABLE.
fn write_failed(e: RaftError<NodeId, ClientWriteError<NodeId, CoordNode>>) -> CoordError {
    match e.forward_to_leader() {
        Some(f) => CoordError::NotLeader {
            leader_api_addr: f
                .leader_node
                .as_ref()
                .map(|n| n.api_addr.clone())
                .filter(|a| !a.is_empty()),
        },
        None => CoordError::Unavailable(e.to_string()),
    }
}

/// NotLeader with the address of the leader `m` knows of, if any.
fn not_leader(m: &RaftMetrics) -> CoordError {
    let hint = m.current_leader.and_then(|l| {
        m.membership_config
            .membership()
            .get_node(&l)
            .map(|n| n.api_addr.clone())
            .filter(|a| !a.is_empty())
    });
    CoordError::NotLeader {
        leader_api_addr: hint,
    }
}

/// The last log entry `learner` has acknowledged to this replica, while it leads.
fn learner_matched(metrics: &RaftMetrics, learner: NodeId) -> Option<LogId> {
    *metrics.replication.as_ref()?.get(&learner)?
}

/// Whether `membership` is a single configuration (not a joint change) that this replica has
/// applied. Only then is taking one voter down safe in a three-voter group: in the joint
/// configuration of a promotion from two voters to three, a quorum needs both old voters,
/// so losing either stalls elections until it returns.
pub fn membership_settled(membership: &StoredMembership, last_applied: Option<LogId>) -> bool {
    membership.membership().get_joint_config().len() == 1 && *membership.log_id() <= last_applied
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_mesh::leader_hint;
    use tonic::Code;

    #[test]
    fn not_leader_carries_the_hint() {
        let not_leader = |leader_api_addr: Option<&str>| {
            Status::from(CoordError::NotLeader {
                leader_api_addr: leader_api_addr.map(str::to_owned),
            })
        };
        let s = not_leader(Some("10.0.0.2:7790"));
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "coordinator: not leader")
        );
        assert_eq!(leader_hint(&s).as_deref(), Some("10.0.0.2:7790"));
        assert_eq!(leader_hint(&not_leader(None)), None);
    }

    #[test]
    fn a_write_refused_for_lost_leadership_is_not_leader_with_the_new_leaders_address() {
        let forward = |leader_node: Option<CoordNode>| {
            write_failed(RaftError::APIError(ClientWriteError::ForwardToLeader(
                openraft::error::ForwardToLeader {
                    leader_id: leader_node.as_ref().map(|_| 2),
                    leader_node,
                },
            )))
        };
        let c2 = CoordNode {
            name: "coord-2".into(),
            raft_addr: "10.0.0.2:7791".into(),
            api_addr: "10.0.0.2:7790".into(),
        };
        let s = Status::from(forward(Some(c2)));
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(leader_hint(&s).as_deref(), Some("10.0.0.2:7790"));
        let s = Status::from(forward(None));
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(leader_hint(&s), None);
        let fatal = write_failed(RaftError::Fatal(openraft::error::Fatal::Stopped));
        assert_eq!(Status::from(fatal).code(), Code::Unavailable);
    }

    #[test]
    fn a_membership_settles_once_it_is_one_applied_configuration() {
        let log_id = |index| Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index));
        let node = |n: u64| {
            (
                n,
                CoordNode {
                    name: format!("coord-{n}"),
                    raft_addr: format!("10.0.0.{n}:7791"),
                    api_addr: format!("10.0.0.{n}:7790"),
                },
            )
        };
        let nodes = || BTreeMap::from([node(1), node(2), node(3)]);
        let config = |voters: &[&[u64]]| {
            let configs = voters.iter().map(|c| c.iter().copied().collect()).collect();
            openraft::Membership::new(configs, nodes())
        };
        // Promoting the third voter: {1,2} → joint {1,2} & {1,2,3} → {1,2,3}.
        let joint = StoredMembership::new(log_id(6), config(&[&[1, 2], &[1, 2, 3]]));
        let uniform = StoredMembership::new(log_id(7), config(&[&[1, 2, 3]]));
        assert_eq!(joint.membership().voter_ids().count(), 3);
        assert!(!membership_settled(&joint, log_id(6)), "joint change");
        assert!(!membership_settled(&uniform, log_id(6)), "not yet applied");
        assert!(membership_settled(&uniform, log_id(7)));
        assert!(membership_settled(&uniform, log_id(9)));
        assert!(!membership_settled(&uniform, None));
    }

    #[test]
    fn fsm_errors_map_to_codes() {
        let code = |e: FsmError| Status::from(CoordError::Fsm(e)).code();
        assert_eq!(code(FsmError::ShardNotFound("s".into())), Code::NotFound);
        assert_eq!(
            code(FsmError::DomainAlreadyAssigned {
                domain: crate::fsm::DomainKey::new("k", "v"),
                owner: "s".into()
            }),
            Code::AlreadyExists
        );
        assert_eq!(code(FsmError::Invalid("x".into())), Code::InvalidArgument);
        assert_eq!(
            Status::from(CoordError::Unavailable("x".into())).code(),
            Code::Unavailable
        );
        assert_eq!(Status::from(CoordError::NoSnapshot).code(), Code::NotFound);
    }

    #[test]
    fn wire_messages_stay_and_internals_do_not_leak() {
        let s = Status::from(CoordError::Unavailable("apply timed out".into()));
        assert_eq!(s.message(), "coordinator: apply timed out");
        let s = Status::from(CoordError::NoSnapshot);
        assert_eq!(s.message(), "coordinator: no snapshot taken yet");
        let s = Status::from(CoordError::Internal(
            "redb: /var/lib/coord/db torn page".into(),
        ));
        assert_eq!(s.code(), Code::Internal);
        assert!(
            s.message().starts_with(bigfleet_mesh::INTERNAL_MESSAGE)
                && !s.message().contains("redb"),
            "{}",
            s.message()
        );
    }
}
