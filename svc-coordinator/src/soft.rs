//! Leader-local soft state: each shard's latest report and its queue of instructions waiting
//! for an acknowledgement. Never replicated — it is stale within one report interval, and a
//! new leader rebuilds it from the next reports. Instructions are fenced by (term, sequence):
//! the sequence restarts with every term this replica leads.

use std::collections::{BTreeMap, HashMap};

use bigfleet_proto::v1alpha1::{
    self as pb, CoordinatorInstruction, ShardSummary, Shortfall, coordinator_instruction::Payload,
};

use crate::fsm::DomainKey;

/// Bound on one shard's pending queue. A shard that stops acknowledging must not grow the
/// leader's memory without limit; past the bound the oldest instruction is dropped (a
/// redelivery of a domain change is re-issued by re-running the admin command).
pub const MAX_PENDING_PER_SHARD: usize = 256;

/// The leader's copy of one shard's latest report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSnapshot {
    pub shard_epoch: i64,
    pub cycle: i64,
    pub received_at_unix_ns: i64,
    pub summary: Option<ShardSummary>,
    /// Shortfalls with `requirements` dropped (only their size matters to the coordinator).
    pub shortfalls: Vec<Shortfall>,
    /// Per shortfall, in order: what the rebalancer keeps of it.
    pub needs: Vec<crate::rebalance::Shortage>,
}

#[derive(Debug, Default)]
struct ShardSoft {
    report: Option<ReportSnapshot>,
    /// Keyed by sequence number, so iteration is already in wire order.
    pending: BTreeMap<i64, CoordinatorInstruction>,
}

/// What one report changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOutcome {
    /// False when the report was older than (or the same as) the one already held.
    pub accepted: bool,
    pub cleared: usize,
}

/// All shards' soft state for the term this replica leads.
#[derive(Debug, Default)]
pub struct SoftState {
    term: u64,
    next_sequence: i64,
    shards: HashMap<String, ShardSoft>,
    /// Sequence numbers given to transfer instructions (which live in the FSM) this term.
    transfer_sequences: HashMap<String, i64>,
}

impl SoftState {
    /// Drops everything if `term` is not the term the state was built under: after a
    /// failover (or a re-election of this replica) queues and reports start afresh.
    pub fn ensure_term(&mut self, term: u64) {
        if self.term != term {
            *self = SoftState {
                term,
                ..SoftState::default()
            };
        }
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// Records a report: stores summary and shortfalls unless the report is out of order,
    /// and clears the acknowledged instructions (any outcome clears: a rejected
    /// instruction would be rejected again). Reports order by (shard_epoch, cycle); a report
    /// with cycle 1 always wins because it comes from a freshly started shard process.
    pub fn record_report(&mut self, report: &pb::ShardReport, now_unix_ns: i64) -> ReportOutcome {
        let soft = self.shards.entry(report.shard_id.clone()).or_default();
        let accepted = match &soft.report {
            None => true,
            Some(_) if report.cycle == 1 => true,
            Some(prev) => (report.shard_epoch, report.cycle) > (prev.shard_epoch, prev.cycle),
        };
        if accepted {
            soft.report = Some(ReportSnapshot {
                shard_epoch: report.shard_epoch,
                cycle: report.cycle,
                received_at_unix_ns: now_unix_ns,
                summary: report.summary.clone(),
                shortfalls: report
                    .shortfalls
                    .iter()
                    .map(|s| Shortfall {
                        requirements: Vec::new(),
                        ..s.clone()
                    })
                    .collect(),
                needs: report
                    .shortfalls
                    .iter()
                    .map(crate::rebalance::Shortage::of)
                    .collect(),
            });
        }
        let before = soft.pending.len();
        if !report.instruction_acks.is_empty() {
            soft.pending.retain(|_, ins| {
                !report
                    .instruction_acks
                    .iter()
                    .any(|a| a.instruction_id == ins.instruction_id)
            });
        }
        ReportOutcome {
            accepted,
            cleared: before - soft.pending.len(),
        }
    }

    /// Pending instructions of a shard, in sequence order.
    pub fn pending(&self, shard: &str) -> Vec<CoordinatorInstruction> {
        self.shards
            .get(shard)
            .map(|s| s.pending.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn pending_len(&self, shard: &str) -> usize {
        self.shards.get(shard).map_or(0, |s| s.pending.len())
    }

    /// Queues a domain change for a shard. An older pending change of the same domain is
    /// superseded (only the latest intent matters), which also keeps the queue bounded by
    /// the shard's domain count in practice; [`MAX_PENDING_PER_SHARD`] is the hard cap.
    pub fn enqueue_domain(
        &mut self,
        shard: &str,
        domain: &DomainKey,
        assign: bool,
        instruction_id: String,
    ) -> CoordinatorInstruction {
        self.next_sequence += 1;
        let payload = if assign {
            Payload::AssignDomain(pb::AssignDomain {
                topology_key: domain.key.clone(),
                topology_value: domain.value.clone(),
            })
        } else {
            Payload::UnassignDomain(pb::UnassignDomain {
                topology_key: domain.key.clone(),
                topology_value: domain.value.clone(),
            })
        };
        let ins = CoordinatorInstruction {
            coordinator_term: i64::try_from(self.term).unwrap_or(i64::MAX),
            sequence_number: self.next_sequence,
            instruction_id,
            payload: Some(payload),
        };
        let soft = self.shards.entry(shard.to_owned()).or_default();
        soft.pending
            .retain(|_, old| domain_of(old).as_ref() != Some(domain));
        soft.pending.insert(ins.sequence_number, ins.clone());
        while soft.pending.len() > MAX_PENDING_PER_SHARD {
            if let Some((_, dropped)) = soft.pending.pop_first() {
                tracing::warn!(shard, instruction = %dropped.instruction_id, "pending instruction queue full; dropped the oldest");
            }
        }
        ins
    }

    /// The sequence number of a transfer instruction in this term: assigned on first
    /// delivery, the same on every redelivery.
    pub fn sequence_for(&mut self, instruction_id: &str) -> i64 {
        if let Some(s) = self.transfer_sequences.get(instruction_id) {
            return *s;
        }
        self.next_sequence += 1;
        self.transfer_sequences
            .insert(instruction_id.to_owned(), self.next_sequence);
        self.next_sequence
    }

    /// Forgets sequence numbers of instructions no longer delivered.
    pub fn retain_transfer_sequences(&mut self, live: &std::collections::BTreeSet<String>) {
        self.transfer_sequences.retain(|id, _| live.contains(id));
    }

    /// Forgets a removed shard.
    pub fn remove_shard(&mut self, shard: &str) {
        self.shards.remove(shard);
    }

    /// Latest reports, sorted by shard id, optionally of one shard.
    pub fn reports(&self, only: Option<&str>) -> Vec<(String, ReportSnapshot)> {
        let mut out: Vec<(String, ReportSnapshot)> = self
            .shards
            .iter()
            .filter(|(id, _)| only.is_none_or(|o| o == id.as_str()))
            .filter_map(|(id, s)| s.report.clone().map(|r| (id.clone(), r)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

fn domain_of(ins: &CoordinatorInstruction) -> Option<DomainKey> {
    match &ins.payload {
        Some(Payload::AssignDomain(a)) => Some(DomainKey::new(&a.topology_key, &a.topology_value)),
        Some(Payload::UnassignDomain(u)) => {
            Some(DomainKey::new(&u.topology_key, &u.topology_value))
        }
        _ => None,
    }
}

/// A fresh 16-hex-digit instruction id.
pub fn new_instruction_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::InstructAck;

    fn report(shard: &str, epoch: i64, cycle: i64, total: i32) -> pb::ShardReport {
        pb::ShardReport {
            shard_id: shard.into(),
            cycle,
            shard_epoch: epoch,
            summary: Some(ShardSummary {
                total_machines: total,
                ..Default::default()
            }),
            shortfalls: vec![Shortfall {
                requirements: vec![pb::NodeSelectorRequirement::default()],
                priority: 7,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn total(s: &SoftState, shard: &str) -> i32 {
        s.reports(Some(shard))[0]
            .1
            .summary
            .as_ref()
            .unwrap()
            .total_machines
    }

    #[test]
    fn out_of_order_reports_are_discarded() {
        let mut s = SoftState::default();
        s.ensure_term(3);
        assert!(s.record_report(&report("s1", 1, 5, 50), 1).accepted);
        assert!(!s.record_report(&report("s1", 1, 4, 40), 2).accepted);
        assert!(!s.record_report(&report("s1", 1, 5, 41), 2).accepted);
        assert_eq!(total(&s, "s1"), 50);
        assert!(s.record_report(&report("s1", 1, 6, 60), 3).accepted);
        // A restarted shard (higher epoch, or cycle 1) is taken even with a lower cycle.
        assert!(s.record_report(&report("s1", 2, 2, 20), 4).accepted);
        assert!(s.record_report(&report("s1", 2, 1, 10), 5).accepted);
        assert_eq!(total(&s, "s1"), 10);
        let (_, snap) = &s.reports(None)[0];
        assert!(snap.shortfalls[0].requirements.is_empty());
        assert_eq!(snap.shortfalls[0].priority, 7);
        assert_eq!(snap.received_at_unix_ns, 5);
        let kept: Vec<_> = snap
            .needs
            .iter()
            .map(|n| {
                (
                    n.instance_type.as_str(),
                    n.priority,
                    n.age_cycles,
                    n.selector.as_str(),
                )
            })
            .collect();
        assert_eq!(kept, [("", 7, 0, "*")]);
    }

    #[test]
    fn transfer_sequences_are_stable_within_a_term() {
        let mut s = SoftState::default();
        s.ensure_term(2);
        let a = s.enqueue_domain("s1", &DomainKey::new("rack", "r1"), true, "d".into());
        let t = s.sequence_for("t1");
        assert!(t > a.sequence_number);
        assert_eq!(s.sequence_for("t1"), t);
        assert!(s.sequence_for("t2") > t);
        s.ensure_term(3);
        assert_eq!(s.sequence_for("t2"), 1);
    }

    #[test]
    fn instructions_are_sequenced_acked_and_superseded() {
        let mut s = SoftState::default();
        s.ensure_term(4);
        let r1 = DomainKey::new("rack", "r1");
        let r2 = DomainKey::new("rack", "r2");
        let a = s.enqueue_domain("s1", &r1, true, "a".into());
        let b = s.enqueue_domain("s1", &r2, true, "b".into());
        assert_eq!((a.coordinator_term, a.sequence_number), (4, 1));
        assert_eq!(b.sequence_number, 2);
        // Unassigning r1 supersedes the pending assign of r1.
        let c = s.enqueue_domain("s1", &r1, false, "c".into());
        let ids: Vec<_> = s
            .pending("s1")
            .into_iter()
            .map(|i| i.instruction_id)
            .collect();
        assert_eq!(ids, ["b", "c"]);
        assert_eq!(c.sequence_number, 3);

        let mut rep = report("s1", 1, 1, 1);
        rep.instruction_acks = vec![InstructAck {
            instruction_id: "b".into(),
            outcome: pb::instruct_ack::Outcome::RejectedStale as i32,
            reason: String::new(),
        }];
        assert_eq!(s.record_report(&rep, 1).cleared, 1);
        assert_eq!(s.pending_len("s1"), 1);

        // A new term wipes the queue and restarts the sequence.
        s.ensure_term(5);
        assert_eq!(s.pending_len("s1"), 0);
        let d = s.enqueue_domain("s1", &r2, true, "d".into());
        assert_eq!((d.coordinator_term, d.sequence_number), (5, 1));
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut s = SoftState::default();
        s.ensure_term(1);
        for i in 0..(MAX_PENDING_PER_SHARD + 10) {
            s.enqueue_domain(
                "s1",
                &DomainKey::new("rack", i.to_string()),
                true,
                new_instruction_id(),
            );
        }
        assert_eq!(s.pending_len("s1"), MAX_PENDING_PER_SHARD);
        let p = s.pending("s1");
        assert!(
            p.windows(2)
                .all(|w| w[0].sequence_number < w[1].sequence_number)
        );
        assert_eq!(p[0].sequence_number, 11);
    }

    #[test]
    fn instruction_ids_are_16_hex() {
        let id = new_instruction_id();
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
