//! Work hand-out: the action ledger, the reclaim budget spent where actions
//! leave decide, worker Done reports and Transitions.
//!
//! Everything here lives in one room, [`WorkRoom`], behind the work lock (level 2,
//! [`crate::locks`]). Hand-outs and transitions take the inventory first.

use crate::actions::{ActionLedger, InFlight};
use crate::errors::DecideError;
use crate::rails::{ReclaimBudget, kind_label};
use crate::shard::{Decide, applicable};
use bigfleet_model::{Action, ActionKind, Host, Machine, MachineState, check_transition};
use rustc_hash::FxHashMap;
use std::time::Instant;

/// The work room: what is queued and in flight, and what starting it costs.
#[derive(Debug)]
pub(crate) struct WorkRoom {
    pub(crate) ledger: ActionLedger,
    /// Per-cluster reclaim tokens over wall-clock time (ADR-0105).
    pub(crate) reclaim_budget: ReclaimBudget,
    /// When a machine entered Configuring / Draining (phase histograms).
    phase_started: FxHashMap<String, Instant>,
}

impl WorkRoom {
    pub(crate) fn new(ledger: ActionLedger) -> Self {
        WorkRoom {
            ledger,
            reclaim_budget: ReclaimBudget::new(),
            phase_started: FxHashMap::default(),
        }
    }
}

/// One action handed to a worker, with the fencing range its provider calls use.
#[derive(Debug, Clone)]
pub struct WorkGrant {
    /// Unique id of this hand-out; Transition and Done refer to it.
    pub action_id: String,
    pub action: Action,
    /// The machine as decide held it when handing the action out.
    pub machine: Option<Machine>,
    pub shard_id: String,
    /// The epoch of the term that allowed the hand-out.
    pub epoch: u64,
    /// Fencing sequence numbers `[sequence_base, sequence_limit)` reserved for it.
    pub sequence_base: u64,
    pub sequence_limit: u64,
    /// The cycle that decided it.
    pub cycle: u64,
    /// W3C trace context of the roll-up behind it (ADR-0080).
    pub trace_context: Vec<(String, String)>,
}

/// A worker's report that a machine it holds an action for changed state.
#[derive(Debug, Clone)]
pub struct Transition {
    pub machine_id: String,
    /// The hand-out the change belongs to; must be the machine's action in flight.
    pub action_id: String,
    /// The state the worker saw (compare and swap with decide's).
    pub from: MachineState,
    pub to: MachineState,
    pub patch: MachinePatch,
    /// Short reason for logs.
    pub reason: String,
}

/// Attribute changes that go with a transition; `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct MachinePatch {
    pub cluster: Option<String>,
    pub host: Option<Host>,
    pub assigned_priority: Option<i32>,
    pub assigned_interruption_penalty_dollars: Option<f64>,
    pub assigned_reclamation_penalty_dollars: Option<f64>,
    pub assigned_need_fingerprint: Option<String>,
    pub assigned_group: Option<String>,
    pub last_error: Option<String>,
    /// Replaces the machine's shard metadata when not empty.
    pub shard_metadata: std::collections::BTreeMap<String, String>,
    /// The provider's view of the machine (price, probability, allocatable, labels,
    /// and the host unless `host` is set).
    pub provider_view: Option<Machine>,
}

impl Decide {
    /// Hands the next queued action to `stream`, or `None` when nothing is
    /// queued or hand-outs are paused (no leadership term). Re-checks the
    /// machine's live state first.
    pub async fn hand_out(&self, stream: u64) -> Option<WorkGrant> {
        let inner = &self.inner;
        // Read once: the item carries exactly the epoch of the term that allowed it.
        let epoch = inner.actuation.actuating_epoch()?;
        debug_assert_eq!(
            crate::locks::tracked_held(),
            0,
            "inventory is the outermost lock"
        );
        let inv = inner.inventory.read().await;
        // The reclaim budget is checked and spent here, where an action leaves decide
        // (ADR-0105): whatever the cycles queued, no window ever starts more reclaims
        // of a cluster than its budget.
        let now = self.now();
        let rails = &inner.cfg.rails;
        let mut room = inner.work.lock();
        let work = &mut *room;
        let budget = &mut work.reclaim_budget;
        budget.expire(now, rails.reclaim_budget_window);
        let over_budget = std::cell::Cell::new(0usize);
        let (f, moot) = work.ledger.hand_out(stream, |a| {
            if !applicable(&inv, a) {
                return false;
            }
            let admitted = budget.admits(rails, a, &*inv);
            if !admitted {
                over_budget.set(over_budget.get() + 1);
            }
            admitted
        });
        if let Some(f) = &f
            && f.action.kind() == ActionKind::Reclaim
            && rails.budget_enabled()
        {
            budget.spend(f.action.cluster(), f.action.machine_id(), now);
        }
        drop(room);
        let over_budget = over_budget.get();
        inner
            .metrics
            .actions_deduped
            .inc_by((moot - over_budget) as u64);
        if over_budget > 0 {
            // Re-derived by a later cycle, which defers them (and logs) while the budget is spent.
            inner.metrics.reclaims_capped.inc_by(over_budget as u64);
        }
        let f = f?;
        let machine = inv.get(f.action.machine_id());
        drop(inv);
        let base = match inner.minter.next_base() {
            Ok(b) => b,
            Err(e) => {
                // Cannot happen within an epoch's lifetime (2^48 actions); refuse
                // rather than reuse sequence numbers.
                tracing::error!(error = %e, "sequence space exhausted");
                inner.work.lock().ledger.complete(&f.action_id);
                return None;
            }
        };
        let kind = kind_label(f.action.kind());
        inner.metrics.actions_total.with_label_values(&[kind]).inc();
        self.refresh_ledger_gauges();
        Some(WorkGrant {
            action_id: f.action_id.clone(),
            action: f.action.clone(),
            machine,
            shard_id: inner.cfg.shard_id.clone(),
            epoch,
            sequence_base: base.base,
            sequence_limit: base.base.saturating_add(base.spacing),
            cycle: f.cycle,
            trace_context: f
                .trace
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }

    pub(crate) fn refresh_ledger_gauges(&self) {
        let (q, f) = self.action_counts();
        self.inner.metrics.action_queue_depth.set(q as i64);
        self.inner.metrics.execute_inflight.set(f as i64);
    }

    /// A worker finished hand-out `action_id` with `outcome` (a label such as
    /// `success`, `fenced`, `provider_error`): free the machine, count and audit it.
    pub fn done(&self, action_id: &str, outcome: &str) {
        let Some(f) = self.inner.work.lock().ledger.complete(action_id) else {
            tracing::debug!(action = %action_id, "done for an unknown or abandoned action");
            return;
        };
        self.finish(&f, outcome);
    }

    fn finish(&self, f: &InFlight, outcome: &str) {
        let outcome = if outcome.is_empty() { "other" } else { outcome };
        self.inner
            .metrics
            .action_execute_outcomes
            .with_label_values(&[kind_label(f.action.kind()), outcome])
            .inc();
        self.audit_in_flight(f, outcome);
        self.refresh_ledger_gauges();
    }

    /// A Work stream ended: its unfinished actions are abandoned and their
    /// machines become eligible again (the next cycle re-derives them).
    pub fn abandon_stream(&self, stream: u64) -> usize {
        let freed = self.inner.work.lock().ledger.abandon_stream(stream);
        for f in &freed {
            tracing::info!(action = %f.action_id, machine = %f.action.machine_id(), "worker went away; action abandoned");
            self.finish(f, "abandoned");
        }
        if !freed.is_empty() {
            self.inner
                .metrics
                .cycle_wakeups
                .with_label_values(&["abandoned"])
                .inc();
            self.wake();
        }
        freed.len()
    }

    /// A worker reports a state change of a machine it holds an action for; returns
    /// the machine as decide now holds it.
    pub async fn transition(&self, req: Transition) -> Result<Machine, DecideError> {
        let inner = &self.inner;
        let Transition {
            machine_id,
            action_id,
            from,
            to,
            patch,
            reason,
        } = req;
        let now = self.now();
        debug_assert_eq!(
            crate::locks::tracked_held(),
            0,
            "inventory is the outermost lock"
        );
        let mut inv = inner.inventory.write().await;
        let cur = inv
            .get(&machine_id)
            .ok_or_else(|| DecideError::UnknownMachine(machine_id.clone()))?;
        match inner.work.lock().ledger.in_flight(&machine_id) {
            Some(f) if f.action_id == action_id => {}
            _ => {
                return Err(DecideError::Stale(format!(
                    "action {action_id:?} is not in flight for machine {machine_id:?}"
                )));
            }
        }
        if cur.state != from {
            return Err(DecideError::Stale(format!(
                "machine {machine_id:?} is {}, not {from}",
                cur.state
            )));
        }
        check_transition(from, to).map_err(|e| DecideError::Invalid(e.to_string()))?;
        let mut next = cur.clone();
        let cur_cluster = cur.cluster;
        apply_patch(&mut next, to, patch)?;
        next.invariant()
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        let prev_cluster = cur_cluster;
        inv.upsert(next.clone(), now);
        inner.sync.lock().local_changes.record(&next.id);
        // Route with the binding captured before the change, so Draining →
        // Idle still reaches the cluster the node is leaving. Published with
        // the write lock held: frames leave in the order the inventory
        // changed, so a concurrent merge or resync cannot overtake this one.
        let notify = if prev_cluster.is_empty() {
            next.cluster.clone()
        } else {
            prev_cluster
        };
        if !notify.is_empty() {
            self.publish_node(&next, &notify);
        }
        drop(inv);
        tracing::debug!(machine = %next.id, %from, %to, reason = %reason, "transition applied");
        self.observe_phases(&next, from, to, now);
        Ok(next)
    }

    fn observe_phases(&self, m: &Machine, from: MachineState, to: MachineState, now: i64) {
        use MachineState::*;
        let inner = &self.inner;
        let mut work = inner.work.lock();
        let started = &mut work.phase_started;
        match (from, to) {
            (Idle, Configuring) | (Configured, Draining) => {
                started.insert(m.id.clone(), Instant::now());
            }
            (Configuring, Configured) => {
                if let Some(t) = started.remove(&m.id) {
                    inner
                        .metrics
                        .configure_phase
                        .observe(t.elapsed().as_secs_f64());
                }
                if let Some(d) = inner.provisioning.lock().observe_configured(
                    &m.cluster,
                    &m.assigned_need_fingerprint,
                    now,
                ) {
                    inner.metrics.provisioning_latency.observe(d.as_secs_f64());
                }
            }
            (Draining, Idle) => {
                if let Some(t) = started.remove(&m.id) {
                    inner.metrics.drain_phase.observe(t.elapsed().as_secs_f64());
                }
            }
            (Deleting, Speculative) => inner.metrics.idle_releases.inc(),
            (_, Failed) | (Configuring, Idle) => {
                started.remove(&m.id);
            }
            _ => {}
        }
    }
}

/// Replaces `field` with what a patch sets; a field the patch leaves out keeps its value.
fn overwrite<T>(field: &mut T, patched: Option<T>) {
    if let Some(v) = patched {
        *field = v;
    }
}

/// Applies a worker's patch for a transition into `to`.
fn apply_patch(m: &mut Machine, to: MachineState, patch: MachinePatch) -> Result<(), DecideError> {
    m.state = to;
    if let Some(v) = patch.provider_view {
        m.price_per_hour = v.price_per_hour;
        m.interruption_probability = v.interruption_probability;
        m.allocatable = v.allocatable;
        m.profile.labels = v.profile.labels;
        if patch.host.is_none() {
            m.host = v.host;
        }
    }
    overwrite(&mut m.host, patch.host);
    overwrite(&mut m.cluster, patch.cluster);
    overwrite(&mut m.assigned_priority, patch.assigned_priority);
    for (value, field) in [
        (
            patch.assigned_interruption_penalty_dollars,
            &mut m.assigned_interruption_penalty_dollars,
        ),
        (
            patch.assigned_reclamation_penalty_dollars,
            &mut m.assigned_reclamation_penalty_dollars,
        ),
    ] {
        if let Some(d) = value {
            if d.is_nan() || d < 0.0 {
                return Err(DecideError::Invalid(format!(
                    "penalty dollars {d} must be non-negative"
                )));
            }
            *field = d;
        }
    }
    overwrite(
        &mut m.assigned_need_fingerprint,
        patch.assigned_need_fingerprint,
    );
    overwrite(&mut m.assigned_group, patch.assigned_group);
    overwrite(&mut m.last_error, patch.last_error);
    if !patch.shard_metadata.is_empty() {
        m.shard_metadata = patch.shard_metadata;
    }
    if matches!(to, MachineState::Idle | MachineState::Speculative) {
        m.clear_assignment();
        m.shard_metadata.clear();
    }
    if to == MachineState::Speculative {
        // Delete released the hardware; only the quota slot remains.
        m.host = Host::default();
    }
    if to == MachineState::Failed && m.last_error.is_empty() {
        return Err(DecideError::Invalid(
            "a transition into FAILED needs last_error".to_owned(),
        ));
    }
    Ok(())
}
