//! Action history: a bounded, in-memory ring of what became of recent actions
//! (ADR-0125), so an operator can ask "what did BigFleet do to my cluster in the
//! last hour, and why?" without reading the audit log.
//!
//! An action enters the ring once, when its fate is known: a worker reported it
//! done (succeeded, failed, abandoned, …), or the cycle that decided it did not
//! hand it out (suppressed while actuation is paused, dry-run, held while the
//! inventory is stale). Actions still queued or in flight are not history yet.
//! The ring is the same stream as the audit log (both are written from one
//! place per outcome) but bounded and queryable; it does not survive a restart.
//!
//! Timing is on decide's clock (Unix nanoseconds): `decided_at` is when the
//! deciding cycle handed its actions to the rails, `started_at` when a worker
//! took the action (zero when none did), `finished_at` when its fate was known.

use crate::actions::InFlight;
use crate::rails::AuditRecord;
use crate::shard::Decide;
use bigfleet_model::{Action, ActionKind};
use std::collections::VecDeque;
use std::time::Duration;

/// Default bound of the ring ([`crate::DecideConfig::action_history`]).
pub const DEFAULT_ACTION_HISTORY: usize = 10_000;

/// Cycle decision times kept to date finished actions; a queued action is never
/// older than the latest cycle (the queue is replaced every cycle), and one in
/// flight rarely outlives a few dozen.
const CYCLE_TIMES: usize = 256;

/// Most records one query returns when it names no limit.
pub const DEFAULT_QUERY_LIMIT: usize = 100;

/// One action and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionRecord {
    /// Position in the shard's history since the process started; strictly
    /// increasing, so `after_seq` polling never misses or repeats a record.
    pub seq: u64,
    /// The cycle that decided it.
    pub cycle: u64,
    pub kind: ActionKind,
    pub machine: String,
    /// The destination (Bootstrap, Provision) or the machine's current cluster
    /// (Reclaim, Preempt); empty for Release.
    pub cluster: String,
    /// Fingerprint of the need an acquisition serves; empty otherwise.
    pub need_fingerprint: String,
    /// Co-location group of that need.
    pub group: String,
    /// The need's priority (acquisitions) or the preemptor's (Preempt).
    pub priority: i32,
    /// Drain grace of Reclaim and Preempt.
    pub grace: Option<Duration>,
    /// The work item's id when a worker took it; empty otherwise.
    pub action_id: String,
    /// `succeeded`, `abandoned`, `suppressed`, `dryrun`, `held_stale`, or the
    /// label of the failure a worker reported (`fenced`, `provider_error`, …).
    pub outcome: String,
    pub decided_at_unix_nanos: i64,
    /// Zero when no worker took it.
    pub started_at_unix_nanos: i64,
    pub finished_at_unix_nanos: i64,
}

/// Workers report the execute metric's label (`success`, as the original's
/// `outcome` label has it); the history and its readers say `succeeded`.
fn history_outcome(reported: &str) -> &str {
    match reported {
        "success" => "succeeded",
        other => other,
    }
}

impl ActionRecord {
    /// The stable tag of why the engine chose it (`phase1.idle`, `phase3.excess`, …).
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }

    /// From hand-out to the worker's report; zero when no worker took it.
    pub fn run_nanos(&self) -> i64 {
        if self.started_at_unix_nanos == 0 {
            0
        } else {
            (self.finished_at_unix_nanos - self.started_at_unix_nanos).max(0)
        }
    }

    fn new(cycle: u64, action: &Action, outcome: &str) -> Self {
        let assignment = action.assignment();
        ActionRecord {
            seq: 0,
            cycle,
            kind: action.kind(),
            machine: action.machine_id().to_owned(),
            cluster: action.cluster().to_owned(),
            need_fingerprint: assignment
                .map(|a| a.need_fingerprint.clone())
                .unwrap_or_default(),
            group: assignment.map(|a| a.group.clone()).unwrap_or_default(),
            priority: assignment.map_or(action.preemptor_priority(), |a| a.priority),
            grace: action.grace(),
            action_id: String::new(),
            outcome: history_outcome(outcome).to_owned(),
            decided_at_unix_nanos: 0,
            started_at_unix_nanos: 0,
            finished_at_unix_nanos: 0,
        }
    }
}

/// Which records a query wants. Records come back newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Only this cluster's; empty for all.
    pub cluster: String,
    /// Only records finished at or after this time (Unix nanos); zero for all.
    pub since_unix_nanos: i64,
    /// Only records with a larger `seq` (for polling); zero for all.
    pub after_seq: u64,
    /// Most records; zero means [`DEFAULT_QUERY_LIMIT`].
    pub limit: usize,
}

/// The ring. Not synchronised: decide wraps it in a leaf lock.
#[derive(Debug)]
pub struct ActionHistory {
    ring: VecDeque<ActionRecord>,
    capacity: usize,
    next_seq: u64,
    cycles: VecDeque<(u64, i64)>,
}

impl ActionHistory {
    /// A ring of at most `capacity` records; zero keeps none.
    pub fn new(capacity: usize) -> Self {
        ActionHistory {
            ring: VecDeque::with_capacity(capacity.min(1024)),
            capacity,
            next_seq: 1,
            cycles: VecDeque::with_capacity(CYCLE_TIMES),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Records ever pushed (including those the bound has since evicted).
    pub fn recorded(&self) -> u64 {
        self.next_seq - 1
    }

    /// Notes when `cycle` decided its actions.
    pub fn cycle_decided(&mut self, cycle: u64, at_unix_nanos: i64) {
        if self.cycles.len() == CYCLE_TIMES {
            self.cycles.pop_front();
        }
        self.cycles.push_back((cycle, at_unix_nanos));
    }

    /// When `cycle` decided, if it is recent enough to be remembered.
    pub fn decided_at(&self, cycle: u64) -> Option<i64> {
        self.cycles
            .iter()
            .rev()
            .find(|(c, _)| *c == cycle)
            .map(|(_, at)| *at)
    }

    /// Appends `record` (its `seq` is assigned here), evicting the oldest when full.
    pub fn push(&mut self, mut record: ActionRecord) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.capacity == 0 {
            return seq;
        }
        if self.ring.len() == self.capacity {
            self.ring.pop_front();
        }
        record.seq = seq;
        self.ring.push_back(record);
        seq
    }

    /// The records `q` selects, newest first.
    pub fn query(&self, q: &HistoryQuery) -> Vec<ActionRecord> {
        let limit = if q.limit == 0 {
            DEFAULT_QUERY_LIMIT
        } else {
            q.limit
        };
        self.ring
            .iter()
            .rev()
            // Seq and finish time both grow along the ring: stop at the first too old.
            .take_while(|r| r.seq > q.after_seq && r.finished_at_unix_nanos >= q.since_unix_nanos)
            .filter(|r| q.cluster.is_empty() || r.cluster == q.cluster)
            .take(limit)
            .cloned()
            .collect()
    }
}

impl Decide {
    /// Records an action the cycle did not hand out (`f` is `None`) or one a worker
    /// finished.
    pub(crate) fn record_action(
        &self,
        cycle: u64,
        action: &Action,
        outcome: &str,
        f: Option<&InFlight>,
    ) {
        let now = self.now();
        let mut rec = ActionRecord::new(cycle, action, outcome);
        rec.finished_at_unix_nanos = now;
        if let Some(f) = f {
            rec.action_id.clone_from(&f.action_id);
            let ran = i64::try_from(f.handed_at.elapsed().as_nanos()).unwrap_or(i64::MAX);
            rec.started_at_unix_nanos = now.saturating_sub(ran);
        }
        let mut history = self.inner.history.lock();
        rec.decided_at_unix_nanos = history.decided_at(cycle).unwrap_or(if f.is_some() {
            rec.started_at_unix_nanos
        } else {
            now
        });
        // Stamped under the lock so finish times grow with seq (queries rely on it).
        rec.finished_at_unix_nanos = rec.finished_at_unix_nanos.max(
            history
                .ring
                .back()
                .map_or(i64::MIN, |r| r.finished_at_unix_nanos),
        );
        history.push(rec);
    }

    /// A worker's report on `f`: history and the audit log.
    pub(crate) fn audit_in_flight(&self, f: &InFlight, outcome: &str) {
        self.record_action(f.cycle, &f.action, outcome, Some(f));
        if let Some(log) = &self.inner.audit {
            log.lock()
                .write(&AuditRecord::new(f.cycle, &f.action, outcome));
        }
    }

    /// Recent actions, newest first.
    pub fn recent_actions(&self, q: &HistoryQuery) -> Vec<ActionRecord> {
        self.inner.history.lock().query(q)
    }

    /// (records held, bound, records ever written).
    pub fn history_size(&self) -> (usize, usize, u64) {
        let h = self.inner.history.lock();
        (h.len(), h.capacity(), h.recorded())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::Assignment;

    fn rec(cluster: &str, finished: i64) -> ActionRecord {
        let action = Action::Reclaim {
            machine_id: format!("m-{finished}"),
            cluster: cluster.into(),
            grace: Duration::from_secs(30),
        };
        let mut r = ActionRecord::new(1, &action, "succeeded");
        r.finished_at_unix_nanos = finished;
        r
    }

    /// A worker's `success` reads as the documented `succeeded`; failure labels pass through.
    #[test]
    fn worker_outcomes_read_in_the_history_s_words() {
        let action = Action::Reclaim {
            machine_id: "m".into(),
            cluster: "c".into(),
            grace: Duration::from_secs(30),
        };
        assert_eq!(
            ActionRecord::new(1, &action, "success").outcome,
            "succeeded"
        );
        assert_eq!(ActionRecord::new(1, &action, "fenced").outcome, "fenced");
        assert_eq!(
            ActionRecord::new(1, &action, "abandoned").outcome,
            "abandoned"
        );
    }

    #[test]
    fn ring_is_bounded_and_answers_newest_first() {
        let mut h = ActionHistory::new(3);
        for t in 1..=5 {
            h.push(rec("a", t));
        }
        assert_eq!((h.len(), h.recorded()), (3, 5));
        let got: Vec<(i64, u64)> = h
            .query(&HistoryQuery::default())
            .iter()
            .map(|r| (r.finished_at_unix_nanos, r.seq))
            .collect();
        assert_eq!(got, vec![(5, 5), (4, 4), (3, 3)]);
    }

    #[test]
    fn query_filters_by_cluster_time_seq_and_limit() {
        let mut h = ActionHistory::new(100);
        for t in 1..=10 {
            h.push(rec(if t % 2 == 0 { "even" } else { "odd" }, t * 10));
        }
        let q = |cluster: &str, since, after_seq, limit| HistoryQuery {
            cluster: cluster.into(),
            since_unix_nanos: since,
            after_seq,
            limit,
        };
        let times = |q: HistoryQuery| -> Vec<i64> {
            h.query(&q)
                .iter()
                .map(|r| r.finished_at_unix_nanos)
                .collect()
        };
        assert_eq!(times(q("even", 0, 0, 0)), vec![100, 80, 60, 40, 20]);
        assert_eq!(times(q("", 75, 0, 0)), vec![100, 90, 80]);
        assert_eq!(times(q("", 0, 8, 0)), vec![100, 90]);
        assert_eq!(times(q("odd", 0, 0, 2)), vec![90, 70]);
        assert!(times(q("none", 0, 0, 0)).is_empty());
    }

    #[test]
    fn zero_capacity_keeps_nothing_but_counts() {
        let mut h = ActionHistory::new(0);
        h.push(rec("a", 1));
        assert!(h.is_empty());
        assert_eq!(h.recorded(), 1);
    }

    #[test]
    fn cycle_times_are_bounded_and_found() {
        let mut h = ActionHistory::new(1);
        for c in 0..(CYCLE_TIMES as u64 + 10) {
            h.cycle_decided(c, c as i64 * 100);
        }
        assert_eq!(h.decided_at(9), None, "evicted");
        assert_eq!(
            h.decided_at(CYCLE_TIMES as u64 + 9),
            Some((CYCLE_TIMES as i64 + 9) * 100)
        );
    }

    #[test]
    fn records_carry_the_need_of_acquisitions() {
        let action = Action::Bootstrap {
            machine_id: "m1".into(),
            cluster: "c1".into(),
            assignment: Assignment {
                need_fingerprint: "fp".into(),
                group: "g".into(),
                priority: 7,
                interruption_penalty_dollars: 0.0,
                reclamation_penalty_dollars: 0.0,
                requirements: vec![],
            },
        };
        let r = ActionRecord::new(3, &action, "succeeded");
        assert_eq!(
            (
                r.need_fingerprint.as_str(),
                r.group.as_str(),
                r.priority,
                r.reason()
            ),
            ("fp", "g", 7, "phase1.idle")
        );
        assert_eq!(r.grace, None);
    }
}
