//! Work hand-out: the action ledger, the reclaim budget spent where actions
//! leave decide, worker Done reports and Transitions.
//!
//! Everything here lives in one room, [`WorkRoom`], behind the work lock (level 2,
//! [`crate::locks`]). Hand-outs and transitions take the inventory first.

use crate::actions::{ActionLedger, InFlight};
use crate::errors::DecideError;
use crate::rails::{ReclaimBudget, kind_label};
use crate::shard::{Decide, applicable, machine_view};
use bigfleet_conv::{action_to_proto, machine_from_proto, machine_state_from_proto};
use bigfleet_model::{ActionKind, Host, Machine, MachineState, check_transition};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
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

impl Decide {
    /// Hands the next queued action to `stream`, or `None` when nothing is
    /// queued or hand-outs are paused (no leadership term). Re-checks the
    /// machine's live state first.
    pub async fn hand_out(&self, stream: u64) -> Option<mesh::WorkItem> {
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
        let machine = inv.get(f.action.machine_id()).map(|m| machine_view(&m));
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
        Some(mesh::WorkItem {
            action_id: f.action_id.clone(),
            action: Some(action_to_proto(&f.action)),
            machine,
            fencing: Some(mesh::Fencing {
                shard_id: inner.cfg.shard_id.clone(),
                epoch: i64::try_from(epoch).unwrap_or(i64::MAX),
                sequence_base: i64::try_from(base.base).unwrap_or(i64::MAX),
                sequence_limit: i64::try_from(base.base.saturating_add(base.spacing))
                    .unwrap_or(i64::MAX),
            }),
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

    /// A worker finished an action: free the machine, count and audit the outcome.
    pub fn done(&self, done: &mesh::worker_message::Done) {
        let Some(f) = self.inner.work.lock().ledger.complete(&done.action_id) else {
            tracing::debug!(action = %done.action_id, "done for an unknown or abandoned action");
            return;
        };
        self.finish(&f, &done.outcome);
    }

    fn finish(&self, f: &InFlight, outcome: &str) {
        let outcome = if outcome.is_empty() { "other" } else { outcome };
        self.inner
            .metrics
            .action_execute_outcomes
            .with_label_values(&[kind_label(f.action.kind()), outcome])
            .inc();
        self.audit(f.cycle, &f.action, outcome);
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

    /// A worker reports a state change of a machine it holds an action for.
    pub async fn transition(
        &self,
        req: &mesh::TransitionRequest,
    ) -> Result<pb::Machine, DecideError> {
        let inner = &self.inner;
        let from = machine_state_from_proto(req.from_state)
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        let to = machine_state_from_proto(req.to_state)
            .map_err(|e| DecideError::Invalid(e.to_string()))?;
        let patch = req.patch.clone().unwrap_or_default();
        let view = match &patch.provider_view {
            Some(v) => Some(machine_from_proto(v).map_err(|e| {
                inner
                    .metrics
                    .machines_rejected
                    .with_label_values(&[e.reason()])
                    .inc();
                DecideError::Invalid(format!("provider_view: {e}"))
            })?),
            None => None,
        };
        let now = self.now();
        debug_assert_eq!(
            crate::locks::tracked_held(),
            0,
            "inventory is the outermost lock"
        );
        let mut inv = inner.inventory.write().await;
        let cur = inv
            .get(&req.machine_id)
            .ok_or_else(|| DecideError::UnknownMachine(req.machine_id.clone()))?;
        match inner.work.lock().ledger.in_flight(&req.machine_id) {
            Some(f) if f.action_id == req.action_id => {}
            _ => {
                return Err(DecideError::Stale(format!(
                    "action {:?} is not in flight for machine {:?}",
                    req.action_id, req.machine_id
                )));
            }
        }
        if cur.state != from {
            return Err(DecideError::Stale(format!(
                "machine {:?} is {}, not {from}",
                req.machine_id, cur.state
            )));
        }
        check_transition(from, to).map_err(|e| DecideError::Invalid(e.to_string()))?;
        let mut next = cur.clone();
        let cur_cluster = cur.cluster;
        apply_patch(&mut next, to, &patch, view)?;
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
        tracing::debug!(machine = %next.id, %from, %to, reason = %req.reason, "transition applied");
        self.observe_phases(&next, from, to, now);
        Ok(machine_view(&next))
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

/// Applies a worker's patch for a transition into `to`.
fn apply_patch(
    m: &mut Machine,
    to: MachineState,
    patch: &mesh::MachinePatch,
    view: Option<Machine>,
) -> Result<(), DecideError> {
    m.state = to;
    if let Some(v) = view {
        m.price_per_hour = v.price_per_hour;
        m.interruption_probability = v.interruption_probability;
        m.allocatable = v.allocatable;
        m.profile.labels = v.profile.labels;
        if patch.host.is_none() {
            m.host = v.host;
        }
    }
    if let Some(h) = &patch.host {
        m.host = Host {
            provider: h.provider.clone(),
            reference: h.r#ref.clone(),
        };
    }
    if let Some(c) = &patch.cluster {
        m.cluster.clone_from(c);
    }
    if let Some(p) = patch.assigned_priority {
        m.assigned_priority = p;
    }
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
    if let Some(fp) = &patch.assigned_need_fingerprint {
        m.assigned_need_fingerprint.clone_from(fp);
    }
    if let Some(g) = &patch.assigned_group {
        m.assigned_group.clone_from(g);
    }
    if let Some(e) = &patch.last_error {
        m.last_error.clone_from(e);
    }
    if !patch.shard_metadata.is_empty() {
        m.shard_metadata = patch
            .shard_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
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
