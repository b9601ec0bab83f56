//! The shard's coordinator reporting client; knows the shard only through the
//! [`ShardView`] trait.
//!
//! The shard's hot path never depends on this crate (static stability, hard
//! rule 1): the binary implements [`ShardView`] over its own state, wires a
//! [`CoordClient`] in and runs [`CoordClient::run`] in its own task. A report
//! failing, or the coordinator being gone for good, changes nothing for the
//! cycle.
//!
//! Every `report_interval` the client sends `ReportShard` (summary, top
//! shortfalls, the acks of earlier instructions, the advertise address — the
//! coordinator self-registers the shard from it) and handles the returned
//! instructions with the shard's instruction fencing:
//!
//! * a reply whose term is below the high-water mark is dropped whole (it is
//!   redelivered by the real leader);
//! * an instruction already applied is re-acked `ACCEPTED`
//!   ("duplicate-redelivery") and not applied again;
//! * an instruction with a term below the mark is `REJECTED_STALE` (equal
//!   terms are accepted, higher terms raise the mark);
//! * a payload the shard cannot apply is `REJECTED_INVALID`, a handler error
//!   `FAILED`, anything else `ACCEPTED`;
//! * the transfer hooks (`TransferOwnership`, `ReassignSpeculative`,
//!   `CrossShardDrain`) get the instruction id: the in-memory de-duplication
//!   here is lost on a restart, so a shard that chose machines for an
//!   instruction keeps its own record of the answer (ADR-0137).
//!
//! Acks go out with the next report; if that report fails they are queued again.
//!
//! With several coordinator replicas a follower answers a report with
//! `NotLeader` and the leader's address in `bigfleet_mesh::LEADER_HINT_METADATA`;
//! a client built [`CoordClient::with_redial`] re-sends the report to that
//! leader at once and keeps reporting there until it fails, then starts again
//! from the configured address — never stuck on a follower until a restart.

use bigfleet_mesh::{MeshChannel, leader_hint};
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::coordinator_instruction::Payload;
use bigfleet_proto::v1alpha1::instruct_ack::Outcome;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Default `--report-interval`.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(30);
/// How many applied instruction ids are remembered for de-duplication.
pub const DONE_MEMORY: usize = 10_000;
/// Most shortfalls one report carries (the paper's per-shard bound).
pub const MAX_SHORTFALLS: usize = 100;
/// Deadline of one ReportShard call.
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the client needs from the shard, and the hooks instructions act on.
/// Implemented by the binary over the shard's own state.
pub trait ShardView: Send + Sync + 'static {
    /// The bounded inventory summary.
    fn summary(&self) -> BoxFuture<'_, pb::ShardSummary>;
    /// Unresolved shortfalls, priority desc then older first.
    fn shortfalls(&self, limit: usize) -> Vec<pb::Shortfall>;
    /// The coordinator-term high-water mark moved up (the shard echoes it in
    /// operator acknowledgements).
    fn observe_term(&self, term: i64);
    /// Adds a topology domain to the shard's owned set (idempotent).
    fn assign_domain(&self, key: &str, value: &str) -> Result<(), String>;
    /// Removes a topology domain from the owned set (idempotent).
    fn unassign_domain(&self, key: &str, value: &str) -> Result<(), String>;
    /// One half of `TransferOwnership` (ADR-0129): the donor releases, the
    /// recipient adopts. `instruction_id` names the instruction, so a shard
    /// can answer its redelivery after a restart with what it did the first
    /// time (ADR-0137). The default keeps ADR-0032's rejection.
    fn transfer_ownership(&self, instruction_id: &str, t: &pb::TransferOwnership) -> Applied {
        let _ = (instruction_id, t);
        Applied::Invalid(UNSUPPORTED.to_owned())
    }
    /// One half of `ReassignSpeculative`: release tokens (`*`, `*/<type>`) ask
    /// this shard, the donor, to give up that many Speculative slots; machine ids
    /// ask it to own them (the recipient adopting, or a donor taking back what the
    /// recipient refused). Default: unsupported.
    fn reassign_speculative(&self, instruction_id: &str, r: &pb::ReassignSpeculative) -> Applied {
        let _ = (instruction_id, r);
        Applied::Invalid(UNSUPPORTED.to_owned())
    }
    /// `CrossShardDrain` (ADR-0137): this shard, the donor, reclaims up to one
    /// machine per selector (`*`, `*/<type>`) running demand below
    /// `preemptor_priority`, through its own victim scoring and rails, and
    /// answers `DoneWith("released: id1,id2")` naming the machines it started
    /// draining (possibly none). Default: unsupported.
    fn cross_shard_drain(&self, instruction_id: &str, d: &pb::CrossShardDrain) -> Applied {
        let _ = (instruction_id, d);
        Applied::Invalid(UNSUPPORTED.to_owned())
    }
}

/// Reason of the ack for an instruction this shard does not implement.
pub const UNSUPPORTED: &str = "instruction not supported by this shard";

/// What a [`ShardView`] hook did with one instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Acked `ACCEPTED` and remembered (a redelivery is not applied again).
    Done,
    /// As `Done`, with this reason on the ack — and on every re-ack of a
    /// redelivery (a donor's "released: id1,id2", ADR-0129/ADR-0130).
    DoneWith(String),
    /// Not acked and not remembered: the coordinator redelivers it and the
    /// shard tries again (the shard was mid-cycle, or a machine was busy).
    Deferred(String),
    /// Acked `REJECTED_INVALID`: cannot be applied as asked.
    Invalid(String),
    /// Acked `FAILED`.
    Failed(String),
}

/// Static facts of the reporting shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    pub shard_id: String,
    /// This process's fencing epoch (logged by the coordinator).
    pub shard_epoch: i64,
    /// The address operators dial; the coordinator registers it on first sight.
    pub advertise_address: String,
    pub report_interval: Duration,
}

/// Why one report failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("report_shard: {0}")]
    Rpc(#[from] tonic::Status),
}

/// What one successful report brought back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportOutcome {
    /// The reply's term was below the high-water mark: everything ignored.
    pub stale_reply: bool,
    /// Acks queued for the next report, one per instruction handled.
    pub acks: Vec<pb::InstructAck>,
}

#[derive(Default)]
struct State {
    term_hwm: i64,
    cycle: i64,
    pending_acks: Vec<pb::InstructAck>,
    /// Applied ids with the reason their ACCEPTED ack carried ("" = none).
    done: HashMap<String, String>,
    done_order: VecDeque<String>,
}

impl State {
    fn remember(&mut self, id: &str) {
        self.remember_with(id, String::new());
    }

    fn remember_with(&mut self, id: &str, reason: String) {
        if self.done.insert(id.to_owned(), reason).is_none() {
            self.done_order.push_back(id.to_owned());
            if self.done_order.len() > DONE_MEMORY
                && let Some(old) = self.done_order.pop_front()
            {
                self.done.remove(&old);
            }
        }
    }
}

/// Dials a coordinator replica named by a leader hint (the binary passes its
/// mesh `dial_lazy` with the same TLS and client stack).
pub type Redial = Arc<dyn Fn(&str) -> Result<MeshChannel, String> + Send + Sync>;

/// The reporting client.
pub struct CoordClient<V: ShardView> {
    cfg: ClientConfig,
    view: Arc<V>,
    /// The configured address (any replica, or a service in front of them).
    home: CoordinatorClient<MeshChannel>,
    /// The leader a follower pointed at, while it answers.
    leader: Mutex<Option<(String, CoordinatorClient<MeshChannel>)>>,
    redial: Option<Redial>,
    state: Mutex<State>,
}

fn ack(id: &str, outcome: Outcome, reason: &str) -> pb::InstructAck {
    pb::InstructAck {
        instruction_id: id.to_owned(),
        outcome: outcome as i32,
        reason: reason.to_owned(),
    }
}

fn now_unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl<V: ShardView> CoordClient<V> {
    /// A client over a mesh channel (`bigfleet_mesh::dial_lazy`: connected on
    /// first use, so an unreachable coordinator only makes reports fail).
    pub fn new(cfg: ClientConfig, view: Arc<V>, channel: MeshChannel) -> Self {
        CoordClient {
            cfg,
            view,
            home: bigfleet_mesh::with_message_limits!(CoordinatorClient::new(channel)),
            leader: Mutex::new(None),
            redial: None,
            state: Mutex::new(State::default()),
        }
    }

    /// Follows leader hints: a report a follower refuses with `NotLeader` and
    /// a hint is re-sent at once to the hinted leader, and later reports go
    /// there while it answers; any other failure there falls back to the
    /// configured address for the next report. Without it a hint only fails
    /// the report.
    #[must_use]
    pub fn with_redial(mut self, redial: Redial) -> Self {
        self.redial = Some(redial);
        self
    }

    /// The leader address reports currently go to, when a hint moved them.
    pub fn hinted_leader(&self) -> Option<String> {
        self.leader.lock().as_ref().map(|(a, _)| a.clone())
    }

    fn current(&self) -> CoordinatorClient<MeshChannel> {
        match &*self.leader.lock() {
            Some((_, c)) => c.clone(),
            None => self.home.clone(),
        }
    }

    /// Sends one report, following at most one leader hint.
    async fn send(&self, report: &pb::ShardReport) -> Result<pb::ReportAck, tonic::Status> {
        let call = |mut client: CoordinatorClient<MeshChannel>| {
            let mut req = tonic::Request::new(report.clone());
            req.set_timeout(REPORT_TIMEOUT);
            async move {
                client
                    .report_shard(req)
                    .await
                    .map(tonic::Response::into_inner)
            }
        };
        let status = match call(self.current()).await {
            Ok(ack) => return Ok(ack),
            Err(status) => status,
        };
        let (Some(redial), Some(hint)) = (&self.redial, leader_hint(&status)) else {
            if self.leader.lock().take().is_some() {
                tracing::info!(shard = %self.cfg.shard_id, "hinted coordinator leader failed; back to the configured address");
            }
            return Err(status);
        };
        let client = match redial(&hint) {
            Ok(ch) => bigfleet_mesh::with_message_limits!(CoordinatorClient::new(ch)),
            Err(e) => {
                tracing::warn!(shard = %self.cfg.shard_id, leader = %hint, error = %e, "cannot dial the hinted coordinator leader");
                *self.leader.lock() = None;
                return Err(status);
            }
        };
        tracing::info!(shard = %self.cfg.shard_id, leader = %hint, "following the coordinator leader hint");
        *self.leader.lock() = Some((hint, client.clone()));
        let result = call(client).await;
        if result.is_err() {
            *self.leader.lock() = None;
        }
        result
    }

    /// The coordinator-term high-water mark.
    pub fn term_hwm(&self) -> i64 {
        self.state.lock().term_hwm
    }

    /// Acks waiting for the next report.
    pub fn pending_acks(&self) -> Vec<pb::InstructAck> {
        self.state.lock().pending_acks.clone()
    }

    /// Reports now, then every `report_interval`, until `shutdown` resolves.
    /// Failures are logged and retried on the next tick; they never stop the shard.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticker = tokio::time::interval(self.cfg.report_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.report_once().await {
                Ok(o) if o.stale_reply => {
                    tracing::warn!(shard = %self.cfg.shard_id, "coordinator reply below the term high-water mark; ignored");
                }
                Ok(o) => {
                    if !o.acks.is_empty() {
                        tracing::info!(shard = %self.cfg.shard_id, instructions = o.acks.len(), "coordinator instructions handled");
                    }
                }
                Err(e) => {
                    tracing::warn!(shard = %self.cfg.shard_id, error = %e, "coordinator report failed; the shard carries on");
                }
            }
        }
    }

    /// One ReportShard round trip.
    pub async fn report_once(&self) -> Result<ReportOutcome, CoordError> {
        let (cycle, acks) = {
            let mut st = self.state.lock();
            st.cycle += 1;
            (st.cycle, std::mem::take(&mut st.pending_acks))
        };
        let summary = self.view.summary().await;
        let report = pb::ShardReport {
            shard_id: self.cfg.shard_id.clone(),
            cycle,
            timestamp_unix_nanos: now_unix_nanos(),
            shard_epoch: self.cfg.shard_epoch,
            summary: Some(summary),
            shortfalls: self.view.shortfalls(MAX_SHORTFALLS),
            instruction_acks: acks.clone(),
            shard_address: self.cfg.advertise_address.clone(),
        };
        match self.send(&report).await {
            Ok(reply) => Ok(self.handle_reply(&reply)),
            Err(status) => {
                // Not delivered: the acks go out with the next report.
                let mut st = self.state.lock();
                let newer = std::mem::take(&mut st.pending_acks);
                st.pending_acks = acks;
                st.pending_acks.extend(newer);
                Err(CoordError::Rpc(status))
            }
        }
    }

    /// Applies one reply's instructions with term fencing and de-duplication.
    pub fn handle_reply(&self, reply: &pb::ReportAck) -> ReportOutcome {
        let mut st = self.state.lock();
        if reply.coordinator_term > 0 && reply.coordinator_term < st.term_hwm {
            return ReportOutcome {
                stale_reply: true,
                acks: Vec::new(),
            };
        }
        self.raise_term(&mut st, reply.coordinator_term);
        let mut instructions: Vec<&pb::CoordinatorInstruction> =
            reply.instructions.iter().collect();
        instructions.sort_by_key(|i| i.sequence_number);
        let mut acks = Vec::with_capacity(instructions.len());
        for i in instructions {
            if let Some(a) = self.handle_instruction(&mut st, i) {
                acks.push(a);
            }
        }
        st.pending_acks.extend(acks.iter().cloned());
        ReportOutcome {
            stale_reply: false,
            acks,
        }
    }

    fn raise_term(&self, st: &mut State, term: i64) {
        if term > st.term_hwm {
            st.term_hwm = term;
            self.view.observe_term(term);
        }
    }

    /// The ack (or, deferred, none until the redelivery) for what a hook did.
    fn applied(&self, st: &mut State, id: &str, applied: Applied) -> Option<pb::InstructAck> {
        match applied {
            Applied::Done => {
                st.remember(id);
                Some(ack(id, Outcome::Accepted, ""))
            }
            Applied::DoneWith(why) => {
                st.remember_with(id, why.clone());
                Some(ack(id, Outcome::Accepted, &why))
            }
            Applied::Deferred(why) => {
                tracing::info!(shard = %self.cfg.shard_id, instruction = id, reason = %why, "instruction deferred to its redelivery");
                None
            }
            Applied::Invalid(why) => Some(ack(id, Outcome::RejectedInvalid, &why)),
            Applied::Failed(why) => Some(ack(id, Outcome::Failed, &why)),
        }
    }

    fn handle_instruction(
        &self,
        st: &mut State,
        i: &pb::CoordinatorInstruction,
    ) -> Option<pb::InstructAck> {
        let id = i.instruction_id.as_str();
        if id.is_empty() {
            return Some(ack(id, Outcome::RejectedInvalid, "empty instruction_id"));
        }
        if let Some(reason) = st.done.get(id) {
            // Same answer as the first time when it said something (a release list).
            let reason = if reason.is_empty() {
                "duplicate-redelivery"
            } else {
                reason.as_str()
            };
            return Some(ack(id, Outcome::Accepted, reason));
        }
        if i.coordinator_term < st.term_hwm {
            return Some(ack(
                id,
                Outcome::RejectedStale,
                &format!(
                    "term {} below high-water mark {}",
                    i.coordinator_term, st.term_hwm
                ),
            ));
        }
        self.raise_term(st, i.coordinator_term);
        let result = match &i.payload {
            Some(Payload::AssignDomain(d)) => {
                self.view.assign_domain(&d.topology_key, &d.topology_value)
            }
            Some(Payload::UnassignDomain(d)) => self
                .view
                .unassign_domain(&d.topology_key, &d.topology_value),
            Some(Payload::TransferOwnership(t)) => {
                return self.applied(st, id, self.view.transfer_ownership(id, t));
            }
            Some(Payload::ReassignSpeculative(r)) => {
                return self.applied(st, id, self.view.reassign_speculative(id, r));
            }
            Some(Payload::CrossShardDrain(d)) => {
                return self.applied(st, id, self.view.cross_shard_drain(id, d));
            }
            None => {
                return Some(ack(
                    id,
                    Outcome::RejectedInvalid,
                    "unknown or empty payload",
                ));
            }
        };
        match result {
            Ok(()) => {
                st.remember(id);
                Some(ack(id, Outcome::Accepted, ""))
            }
            Err(e) => Some(ack(id, Outcome::Failed, &e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[derive(Default)]
    pub(crate) struct FakeView {
        pub domains: Mutex<BTreeSet<(String, String)>>,
        pub assigns: Mutex<u32>,
        pub term: Mutex<i64>,
        /// Verdicts the transfer hook returns in turn; empty = the default.
        pub transfer_script: Mutex<VecDeque<Applied>>,
        pub transfers: Mutex<u32>,
        pub speculative: Mutex<Vec<Vec<String>>>,
        /// Verdicts the drain hook returns in turn; empty = the default.
        pub drain_script: Mutex<VecDeque<Applied>>,
        /// (instruction id, selectors, preemptor priority) of each drain applied.
        pub drains: Mutex<Vec<(String, Vec<String>, i32)>>,
        /// Instruction ids the transfer hook was called with.
        pub transfer_ids: Mutex<Vec<String>>,
    }

    impl ShardView for FakeView {
        fn summary(&self) -> BoxFuture<'_, pb::ShardSummary> {
            Box::pin(async {
                pb::ShardSummary {
                    total_machines: 3,
                    ..Default::default()
                }
            })
        }
        fn shortfalls(&self, _limit: usize) -> Vec<pb::Shortfall> {
            Vec::new()
        }
        fn observe_term(&self, term: i64) {
            *self.term.lock() = term;
        }
        fn assign_domain(&self, key: &str, value: &str) -> Result<(), String> {
            if key.is_empty() {
                return Err("empty topology key".into());
            }
            *self.assigns.lock() += 1;
            self.domains.lock().insert((key.into(), value.into()));
            Ok(())
        }
        fn unassign_domain(&self, key: &str, value: &str) -> Result<(), String> {
            self.domains.lock().remove(&(key.into(), value.into()));
            Ok(())
        }
        fn reassign_speculative(&self, _id: &str, r: &pb::ReassignSpeculative) -> Applied {
            self.speculative.lock().push(r.machine_ids.clone());
            Applied::DoneWith("released: s-1".into())
        }

        fn transfer_ownership(&self, id: &str, _t: &pb::TransferOwnership) -> Applied {
            *self.transfers.lock() += 1;
            self.transfer_ids.lock().push(id.to_owned());
            self.transfer_script
                .lock()
                .pop_front()
                .unwrap_or(Applied::Invalid(UNSUPPORTED.into()))
        }

        fn cross_shard_drain(&self, id: &str, d: &pb::CrossShardDrain) -> Applied {
            let Some(verdict) = self.drain_script.lock().pop_front() else {
                return Applied::Invalid(UNSUPPORTED.into());
            };
            self.drains
                .lock()
                .push((id.to_owned(), d.machine_ids.clone(), d.preemptor_priority));
            verdict
        }
    }

    fn transfer(id: &str, term: i64) -> pb::CoordinatorInstruction {
        pb::CoordinatorInstruction {
            coordinator_term: term,
            sequence_number: 1,
            instruction_id: id.into(),
            payload: Some(Payload::TransferOwnership(pb::TransferOwnership {
                machine_ids: vec!["m1".into()],
                from_shard_id: "s".into(),
                to_shard_id: "t".into(),
            })),
        }
    }

    #[tokio::test]
    async fn transfer_deferred_until_applied_then_applied_once() {
        let view = Arc::new(FakeView::default());
        view.transfer_script
            .lock()
            .extend([Applied::Deferred("cycle".into()), Applied::Done]);
        let c = client(view.clone());
        let reply = |term| pb::ReportAck {
            coordinator_term: term,
            acknowledged: true,
            instructions: vec![transfer("t1", term)],
        };
        // Deferred: no ack, so the coordinator keeps redelivering it.
        let o = c.handle_reply(&reply(3));
        assert!(o.acks.is_empty() && c.pending_acks().is_empty());
        // The redelivery applies it.
        let o = c.handle_reply(&reply(3));
        assert_eq!(outcomes(&o), [("t1".to_owned(), Outcome::Accepted as i32)]);
        // Redelivered again before the ack reached the coordinator: not re-applied.
        let o = c.handle_reply(&reply(3));
        assert_eq!(o.acks[0].reason, "duplicate-redelivery");
        assert_eq!(*view.transfers.lock(), 2);
        // A refusal is acked and not remembered; a stale term never reaches the hook.
        view.transfer_script
            .lock()
            .push_back(Applied::Failed("m1 is Configured, not Idle".into()));
        let o = c.handle_reply(&pb::ReportAck {
            coordinator_term: 4,
            acknowledged: true,
            instructions: vec![transfer("t2", 4)],
        });
        assert_eq!(o.acks.len(), 1);
        assert_eq!(o.acks[0].outcome, Outcome::Failed as i32);
        let o = c.handle_reply(&pb::ReportAck {
            coordinator_term: 4,
            acknowledged: true,
            instructions: vec![transfer("t-old", 2)],
        });
        assert_eq!(o.acks[0].outcome, Outcome::RejectedStale as i32);
        assert_eq!(*view.transfers.lock(), 3);
        // A release that names what it chose is re-acked with the same list.
        view.transfer_script
            .lock()
            .push_back(Applied::DoneWith("released: m1,m2".into()));
        for _ in 0..2 {
            let o = c.handle_reply(&pb::ReportAck {
                coordinator_term: 4,
                acknowledged: true,
                instructions: vec![transfer("t3", 4)],
            });
            assert_eq!(outcomes(&o), [("t3".to_owned(), Outcome::Accepted as i32)]);
            assert_eq!(o.acks[0].reason, "released: m1,m2");
        }
        assert_eq!(*view.transfers.lock(), 4, "applied once");
    }

    fn client(view: Arc<FakeView>) -> CoordClient<FakeView> {
        let channel = bigfleet_mesh::client_stack(
            tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy(),
            &bigfleet_mesh::ClientStackConfig::default(),
        );
        CoordClient::new(
            ClientConfig {
                shard_id: "s".into(),
                shard_epoch: 1,
                advertise_address: "a:7780".into(),
                report_interval: DEFAULT_REPORT_INTERVAL,
            },
            view,
            channel,
        )
    }

    pub(crate) fn assign(id: &str, term: i64, seq: i64, key: &str) -> pb::CoordinatorInstruction {
        pb::CoordinatorInstruction {
            coordinator_term: term,
            sequence_number: seq,
            instruction_id: id.into(),
            payload: Some(Payload::AssignDomain(pb::AssignDomain {
                topology_key: key.into(),
                topology_value: "r1".into(),
            })),
        }
    }

    fn outcomes(o: &ReportOutcome) -> Vec<(String, i32)> {
        o.acks
            .iter()
            .map(|a| (a.instruction_id.clone(), a.outcome))
            .collect()
    }

    /// ReassignSpeculative reaches the shard's hook once; a redelivery gets the same
    /// answer (the released ids) without applying it again.
    #[tokio::test]
    async fn reassign_speculative_reaches_the_view_once() {
        let view = Arc::new(FakeView::default());
        let c = client(view.clone());
        let reassign = pb::CoordinatorInstruction {
            coordinator_term: 3,
            sequence_number: 1,
            instruction_id: "r".into(),
            payload: Some(Payload::ReassignSpeculative(pb::ReassignSpeculative {
                machine_ids: vec!["*/m5.large".into()],
            })),
        };
        for _ in 0..2 {
            let o = c.handle_reply(&pb::ReportAck {
                coordinator_term: 3,
                acknowledged: true,
                instructions: vec![reassign.clone()],
            });
            assert_eq!(o.acks.len(), 1);
            assert_eq!(o.acks[0].outcome, Outcome::Accepted as i32);
            assert_eq!(o.acks[0].reason, "released: s-1");
        }
        assert_eq!(*view.speculative.lock(), [vec!["*/m5.large".to_owned()]]);
    }

    /// CrossShardDrain reaches the shard's hook with its instruction id, once; a
    /// deferral leaves it unacked; a redelivery is re-acked with the same list.
    #[tokio::test]
    async fn cross_shard_drain_reaches_the_view_once_with_its_id() {
        let view = Arc::new(FakeView::default());
        view.drain_script.lock().extend([
            Applied::Deferred("a cycle is running".into()),
            Applied::DoneWith("released: v1,v2".into()),
        ]);
        let c = client(view.clone());
        let drain = pb::CoordinatorInstruction {
            coordinator_term: 3,
            sequence_number: 1,
            instruction_id: "d1".into(),
            payload: Some(Payload::CrossShardDrain(pb::CrossShardDrain {
                machine_ids: vec!["*/m5.large".into(); 2],
                preemptor_priority: 2_000_000,
            })),
        };
        let reply = || pb::ReportAck {
            coordinator_term: 3,
            acknowledged: true,
            instructions: vec![drain.clone()],
        };
        assert!(
            c.handle_reply(&reply()).acks.is_empty(),
            "deferred: unacked"
        );
        for _ in 0..2 {
            let o = c.handle_reply(&reply());
            assert_eq!(outcomes(&o), [("d1".to_owned(), Outcome::Accepted as i32)]);
            assert_eq!(o.acks[0].reason, "released: v1,v2");
        }
        assert_eq!(
            *view.drains.lock(),
            [
                ("d1".to_owned(), vec!["*/m5.large".to_owned(); 2], 2_000_000),
                ("d1".to_owned(), vec!["*/m5.large".to_owned(); 2], 2_000_000),
            ],
            "the deferred try and the applied one; the redelivery after it is not applied"
        );
        // The transfer hook gets its instruction id too.
        view.transfer_script.lock().push_back(Applied::Done);
        c.handle_reply(&pb::ReportAck {
            coordinator_term: 3,
            acknowledged: true,
            instructions: vec![transfer("t9", 3)],
        });
        assert_eq!(*view.transfer_ids.lock(), ["t9"]);
    }

    #[tokio::test]
    async fn fencing_dedup_and_outcomes() {
        let view = Arc::new(FakeView::default());
        let c = client(view.clone());
        let o = c.handle_reply(&pb::ReportAck {
            coordinator_term: 5,
            acknowledged: true,
            instructions: vec![
                assign("b", 5, 2, "rack"),
                assign("a", 5, 1, "rack"),
                assign("bad", 5, 3, ""),
                pb::CoordinatorInstruction {
                    coordinator_term: 5,
                    sequence_number: 4,
                    instruction_id: "x".into(),
                    payload: Some(Payload::CrossShardDrain(pb::CrossShardDrain::default())),
                },
                pb::CoordinatorInstruction {
                    coordinator_term: 5,
                    sequence_number: 5,
                    instruction_id: "y".into(),
                    payload: None,
                },
            ],
        });
        assert_eq!(
            outcomes(&o),
            [
                ("a".to_owned(), Outcome::Accepted as i32),
                ("b".to_owned(), Outcome::Accepted as i32),
                ("bad".to_owned(), Outcome::Failed as i32),
                ("x".to_owned(), Outcome::RejectedInvalid as i32),
                ("y".to_owned(), Outcome::RejectedInvalid as i32),
            ]
        );
        assert_eq!((c.term_hwm(), *view.term.lock()), (5, 5));
        // Redelivered: re-acked, not re-applied.
        let o = c.handle_reply(&pb::ReportAck {
            coordinator_term: 5,
            acknowledged: true,
            instructions: vec![assign("a", 5, 1, "rack")],
        });
        assert_eq!(o.acks[0].outcome, Outcome::Accepted as i32);
        assert_eq!(o.acks[0].reason, "duplicate-redelivery");
        assert_eq!(*view.assigns.lock(), 2);
        // A stale instruction inside a current reply.
        let o = c.handle_reply(&pb::ReportAck {
            coordinator_term: 6,
            acknowledged: true,
            instructions: vec![assign("old", 4, 9, "rack"), assign("new", 7, 10, "zone")],
        });
        assert_eq!(o.acks[0].outcome, Outcome::RejectedStale as i32);
        assert_eq!(o.acks[1].outcome, Outcome::Accepted as i32);
        assert_eq!(
            c.term_hwm(),
            7,
            "an instruction's higher term raises the mark"
        );
        // A whole reply from an older term is dropped.
        let o = c.handle_reply(&pb::ReportAck {
            coordinator_term: 6,
            acknowledged: true,
            instructions: vec![assign("late", 6, 11, "rack")],
        });
        assert!(o.stale_reply && o.acks.is_empty());
        assert_eq!(c.pending_acks().len(), 5 + 1 + 2);
    }

    #[test]
    fn done_memory_is_bounded() {
        let mut st = State::default();
        for i in 0..DONE_MEMORY + 5 {
            st.remember(&i.to_string());
        }
        assert_eq!(st.done.len(), DONE_MEMORY);
        assert!(!st.done.contains_key("0"));
        assert!(st.done.contains_key(&(DONE_MEMORY + 4).to_string()));
    }
}
