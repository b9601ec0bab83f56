//! The action ledger: the bounded queue of decided actions and the set of
//! actions handed to execute workers (at most one per machine, shard-wide).

use bigfleet_model::{Action, ActionKind, ClusterId, MachineId};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// W3C trace context an action's work item carries: the trace of the roll-up
/// that caused it, else of the cycle that decided it (ADR-0080).
pub type TraceContext = Arc<HashMap<String, String>>;

/// Default bound of the action queue.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// An action waiting for a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedAction {
    pub action: Action,
    /// The cycle that decided it.
    pub cycle: u64,
    pub trace: TraceContext,
}

/// An action a worker holds.
#[derive(Debug, Clone)]
pub struct InFlight {
    pub action_id: String,
    /// The Work stream it was handed out on.
    pub stream: u64,
    pub action: Action,
    pub cycle: u64,
    pub trace: TraceContext,
    pub handed_at: Instant,
}

/// What one cycle's enqueue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnqueueStats {
    pub enqueued: usize,
    /// Already in flight, a duplicate, or no longer applicable.
    pub deduped: usize,
    /// The queue was full; they re-derive next cycle.
    pub dropped: usize,
}

/// Queue + in-flight set. Not synchronised: the owner wraps it in a mutex and
/// never holds that across an await.
#[derive(Debug)]
pub struct ActionLedger {
    queue: VecDeque<QueuedAction>,
    queued: FxHashSet<MachineId>,
    inflight: FxHashMap<MachineId, InFlight>,
    by_action: FxHashMap<String, MachineId>,
    capacity: usize,
    id_prefix: String,
    next_id: u64,
}

impl ActionLedger {
    /// `id_prefix` keeps action ids unique across restarts (e.g. the epoch).
    pub fn new(capacity: usize, id_prefix: impl Into<String>) -> Self {
        ActionLedger {
            queue: VecDeque::new(),
            queued: FxHashSet::default(),
            inflight: FxHashMap::default(),
            by_action: FxHashMap::default(),
            capacity: capacity.max(1),
            id_prefix: id_prefix.into(),
            next_id: 0,
        }
    }

    /// Replaces whatever is still queued with this cycle's actions: the queue
    /// always holds the latest decision, so withdrawn demand never runs from a
    /// stale entry. Machines with an action in flight, duplicates and actions
    /// failing `applicable` (the live-state re-check) are skipped; overflow is
    /// dropped and re-derives next cycle.
    pub fn replace_queue(
        &mut self,
        actions: Vec<Action>,
        cycle: u64,
        trace: TraceContext,
        applicable: impl Fn(&Action) -> bool,
    ) -> EnqueueStats {
        self.replace_queue_traced(actions, cycle, |_| trace.clone(), applicable)
    }

    /// As [`ActionLedger::replace_queue`], with each action's trace context chosen by
    /// `trace_of` — asked only for actions that are actually enqueued (ADR-0080).
    pub fn replace_queue_traced(
        &mut self,
        actions: Vec<Action>,
        cycle: u64,
        mut trace_of: impl FnMut(&Action) -> TraceContext,
        applicable: impl Fn(&Action) -> bool,
    ) -> EnqueueStats {
        self.queue.clear();
        self.queued.clear();
        let mut stats = EnqueueStats::default();
        for action in actions {
            let id = action.machine_id();
            if self.inflight.contains_key(id) || self.queued.contains(id) || !applicable(&action) {
                stats.deduped += 1;
                continue;
            }
            if self.queue.len() >= self.capacity {
                stats.dropped += 1;
                continue;
            }
            self.queued.insert(id.to_owned());
            let trace = trace_of(&action);
            self.queue.push_back(QueuedAction {
                action,
                cycle,
                trace,
            });
            stats.enqueued += 1;
        }
        stats
    }

    /// Hands the next applicable action to `stream`, marking it in flight.
    /// Returns it with its fresh action id, and how many queued actions were
    /// discarded on the way because they stopped being applicable.
    pub fn hand_out(
        &mut self,
        stream: u64,
        applicable: impl Fn(&Action) -> bool,
    ) -> (Option<InFlight>, usize) {
        let mut moot = 0;
        while let Some(q) = self.queue.pop_front() {
            let machine = q.action.machine_id().to_owned();
            self.queued.remove(&machine);
            if self.inflight.contains_key(&machine) || !applicable(&q.action) {
                moot += 1;
                continue;
            }
            self.next_id += 1;
            let action_id = format!("{}-{}", self.id_prefix, self.next_id);
            let f = InFlight {
                action_id: action_id.clone(),
                stream,
                action: q.action,
                cycle: q.cycle,
                trace: q.trace,
                handed_at: Instant::now(),
            };
            self.by_action.insert(action_id, machine.clone());
            self.inflight.insert(machine, f.clone());
            return (Some(f), moot);
        }
        (None, moot)
    }

    /// Whether a worker holds an action for `machine` (reconcile skips it).
    pub fn is_in_flight(&self, machine: &str) -> bool {
        self.inflight.contains_key(machine)
    }

    /// The action in flight for `machine`.
    pub fn in_flight(&self, machine: &str) -> Option<&InFlight> {
        self.inflight.get(machine)
    }

    /// Ends an action (worker reported Done). `None` for unknown or abandoned ids.
    pub fn complete(&mut self, action_id: &str) -> Option<InFlight> {
        let machine = self.by_action.remove(action_id)?;
        self.inflight.remove(&machine)
    }

    /// Frees every action handed out on `stream` (the stream ended).
    pub fn abandon_stream(&mut self, stream: u64) -> Vec<InFlight> {
        let ids: Vec<String> = self
            .inflight
            .values()
            .filter(|f| f.stream == stream)
            .map(|f| f.action_id.clone())
            .collect();
        ids.iter().filter_map(|id| self.complete(id)).collect()
    }

    /// Destinations of in-flight Provisions, by machine (engine input, so a
    /// Creating machine counts as supply for the cluster it is created for).
    pub fn creating_destinations(&self) -> HashMap<MachineId, ClusterId> {
        self.inflight
            .values()
            .filter(|f| f.action.kind() == ActionKind::Provision)
            .map(|f| {
                (
                    f.action.machine_id().to_owned(),
                    f.action.cluster().to_owned(),
                )
            })
            .collect()
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }

    /// Queued actions, front first.
    pub fn queued(&self) -> impl Iterator<Item = &QueuedAction> {
        self.queue.iter()
    }

    /// Machines with an action queued or in flight: what a transfer or a drain
    /// must leave alone until the action is over.
    pub fn machines_with_actions(&self) -> std::collections::BTreeSet<&str> {
        self.queue
            .iter()
            .map(|q| q.action.machine_id())
            .chain(self.inflight.keys().map(String::as_str))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(id: &str) -> Action {
        Action::Release {
            machine_id: id.to_owned(),
        }
    }

    /// Replaces the queue with `actions`, all applicable, under no trace.
    fn enqueue(l: &mut ActionLedger, actions: Vec<Action>, cycle: u64) -> EnqueueStats {
        l.replace_queue(actions, cycle, TraceContext::default(), |_| true)
    }

    #[test]
    fn each_enqueued_action_gets_its_own_trace_and_skipped_ones_ask_for_none() {
        let mut l = ActionLedger::new(1, "e1");
        let mut asked = Vec::new();
        let s = l.replace_queue_traced(
            vec![release("a"), release("a"), release("b"), release("c")],
            1,
            |a| {
                asked.push(a.machine_id().to_owned());
                Arc::new(HashMap::from([("m".to_owned(), a.machine_id().to_owned())]))
            },
            |a| a.machine_id() != "c",
        );
        assert_eq!((s.enqueued, s.deduped, s.dropped), (1, 2, 1));
        assert_eq!(
            asked,
            ["a"],
            "duplicates, inapplicable and dropped ones are not traced"
        );
        let (f, _) = l.hand_out(1, |_| true);
        assert_eq!(f.unwrap().trace.get("m").map(String::as_str), Some("a"));
    }

    #[test]
    fn one_action_per_machine_in_flight() {
        let mut l = ActionLedger::new(10, "e1");
        let s = enqueue(&mut l, vec![release("a"), release("a"), release("b")], 1);
        assert_eq!(
            s,
            EnqueueStats {
                enqueued: 2,
                deduped: 1,
                dropped: 0
            }
        );
        let (a, _) = l.hand_out(1, |_| true);
        let a = a.unwrap();
        assert_eq!(a.action.machine_id(), "a");
        assert!(l.is_in_flight("a"));
        // The next cycle re-derives "a": deduped while in flight.
        let s = enqueue(&mut l, vec![release("a"), release("b")], 2);
        assert_eq!(
            s,
            EnqueueStats {
                enqueued: 1,
                deduped: 1,
                dropped: 0
            }
        );
        let (b, _) = l.hand_out(2, |_| true);
        assert_eq!(b.unwrap().action.machine_id(), "b");
        assert_eq!(l.hand_out(2, |_| true).0.map(|f| f.action_id), None);
        assert!(l.complete(&a.action_id).is_some());
        assert!(l.complete(&a.action_id).is_none());
        assert!(!l.is_in_flight("a"));
    }

    #[test]
    fn bounded_queue_drops_overflow() {
        let mut l = ActionLedger::new(2, "e1");
        let s = enqueue(&mut l, vec![release("a"), release("b"), release("c")], 1);
        assert_eq!(s.dropped, 1);
        assert_eq!(l.queue_len(), 2);
    }

    #[test]
    fn hand_out_rechecks_and_skips_moot() {
        let mut l = ActionLedger::new(10, "e1");
        enqueue(&mut l, vec![release("a"), release("b")], 1);
        let (f, moot) = l.hand_out(1, |a| a.machine_id() != "a");
        assert_eq!(f.unwrap().action.machine_id(), "b");
        assert_eq!(moot, 1);
        assert_eq!(l.queue_len(), 0);
    }

    #[test]
    fn abandoning_a_stream_frees_only_its_machines() {
        let mut l = ActionLedger::new(10, "e1");
        enqueue(&mut l, vec![release("a"), release("b"), release("c")], 1);
        let a = l.hand_out(1, |_| true).0.unwrap();
        let b = l.hand_out(2, |_| true).0.unwrap();
        let c = l.hand_out(1, |_| true).0.unwrap();
        let freed = l.abandon_stream(1);
        let mut ids: Vec<_> = freed
            .iter()
            .map(|f| f.action.machine_id().to_owned())
            .collect();
        ids.sort();
        assert_eq!(ids, ["a", "c"]);
        assert!(l.is_in_flight("b"));
        assert!(
            l.complete(&a.action_id).is_none(),
            "abandoned ids are unknown"
        );
        assert!(l.complete(&c.action_id).is_none());
        assert!(l.complete(&b.action_id).is_some());
    }

    #[test]
    fn creating_destinations_come_from_in_flight_provisions() {
        let mut l = ActionLedger::new(10, "e1");
        let assignment = bigfleet_model::Assignment {
            need_fingerprint: "fp".into(),
            group: String::new(),
            priority: 1,
            interruption_penalty_dollars: 0.0,
            reclamation_penalty_dollars: 0.0,
            requirements: vec![],
        };
        enqueue(
            &mut l,
            vec![
                Action::Provision {
                    machine_id: "s1".into(),
                    cluster: "c9".into(),
                    assignment,
                },
                release("x"),
            ],
            1,
        );
        l.hand_out(1, |_| true);
        l.hand_out(1, |_| true);
        let d = l.creating_destinations();
        assert_eq!(d.len(), 1);
        assert_eq!(d["s1"], "c9");
    }
}
