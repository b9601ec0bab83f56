//! The shard side of `CrossShardDrain` (ADR-0137): another shard is short at a
//! priority this shard's machines of the type run below, and the coordinator
//! asks this shard, the donor, to drain up to n of them.
//!
//! The donor picks its victims with the engine's own Phase 2 score
//! (`bigfleet_decision::victim_score` with the shard's `Phase2Options`):
//! owned Configured machines of the selector's type whose assigned priority is
//! strictly below the preemptor's, best victim first, ties by machine id. The
//! chosen machines are remembered here and turned into `Reclaim` actions at
//! the head of every cycle's actions until each one has started draining, so
//! they cross the same rails as the engine's reclaims: the per-cluster reclaim
//! budget defers what does not fit (it stays here for the next cycle), the
//! kill switch and dry-run suppress them, a stale inventory holds them, and
//! hand-out fencing applies unchanged. Each carries Phase 2's drain grace for
//! its priority gap. Drained machines end as this shard's Idle supply, which a
//! later `TransferOwnership` moves; there is no adopt phase.
//!
//! Between the drain and that transfer the machine is *held*: for [`DRAIN_HOLD`]
//! after it was chosen, the cycle hands the engine an ownership in which the
//! machine is foreign, so the donor's own demand (the very demand it was drained
//! from) cannot bootstrap it straight back. It stays owned for everything else —
//! the donor's report counts it as Idle supply and a `TransferOwnership` selector
//! may release it. After the hold it is ordinary supply again, so a transfer that
//! never comes costs the donor only the hold.

use crate::inventory::Inventory;
use crate::ownership::{TransferVerdict, selectors};
use crate::shard::Decide;
use bigfleet_decision::{Ownership, drain_grace, victim_score};
use bigfleet_model::{Action, MachineState};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a drained machine is kept from the donor's own demand: long enough
/// for a few coordinator report rounds and the rebalancer's settle time to move
/// it, short enough that a transfer that never comes wastes little.
pub const DRAIN_HOLD: Duration = Duration::from_secs(120);

/// A machine chosen by a drain that has not started draining yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingDrain {
    pub machine_id: String,
    /// The cluster it was serving when chosen; the reclaim drains it out of this one.
    pub cluster: String,
    /// Phase 2's grace for the gap between the preemptor and the victim.
    pub grace: Duration,
    pub preemptor_priority: i32,
    /// The coordinator instruction that asked for it (logs only).
    pub instruction_id: String,
}

/// Drains chosen and not yet started, in the order they were chosen (best
/// victim of the oldest drain first: the order the budget keeps them in).
#[derive(Debug, Default)]
pub(crate) struct DrainBook {
    pending: Vec<PendingDrain>,
    /// Machine id → end of its hold (unix nanos).
    held: BTreeMap<String, i64>,
}

impl DrainBook {
    fn contains(&self, id: &str) -> bool {
        self.pending.iter().any(|d| d.machine_id == id)
    }
}

impl Decide {
    /// Donor half of `CrossShardDrain`: choose up to one victim per selector
    /// (`*`, `*/<type>`, with what the shortfall lacks and must match: ADR-0142)
    /// among owned Configured machines that fit it and serve demand of
    /// priority strictly below `preemptor_priority`, ranked by Phase 2's victim
    /// score, and have them reclaimed through the normal action path (see the
    /// module docs). Returns the chosen ids, possibly none. `Busy` while a
    /// cycle runs or before the first provider listing; `Refused` for a
    /// payload that is not all selectors.
    pub fn drain_machines(
        &self,
        instruction_id: &str,
        tokens: &[String],
        preemptor_priority: i32,
    ) -> TransferVerdict {
        if tokens.is_empty() {
            return TransferVerdict::Refused("no selectors".to_owned());
        }
        let Ok(Some(wanted)) = selectors(tokens) else {
            return TransferVerdict::Refused("a drain names selectors (*, */<type>) only".into());
        };
        // An empty inventory would answer "nothing to drain" for a shard that has plenty.
        if !self.is_ready() {
            return TransferVerdict::Busy("inventory not listed yet".to_owned());
        }
        let (_cycle, inv) = match self.between_cycles() {
            Ok(guards) => guards,
            Err(busy) => return busy,
        };
        let owned = self.ownership();
        let opts = self.inner.cfg.phase2;
        let mut scored: Vec<(f64, bigfleet_model::Machine)> = {
            let work = self.inner.work.lock();
            let busy = work.ledger.machines_with_actions();
            let pending = self.inner.drains.lock();
            inv.ids()
                .filter(|id| inv.state_of(id) == Some(MachineState::Configured))
                .filter(|id| !busy.contains(id) && !pending.contains(id))
                .filter_map(|id| inv.get(id))
                .filter(|m| {
                    m.assigned_priority < preemptor_priority && owned.owns(&m.id, &m.profile)
                })
                .map(|m| {
                    let score = victim_score(
                        preemptor_priority,
                        m.assigned_priority,
                        m.assigned_interruption_penalty_dollars,
                        m.assigned_reclamation_penalty_dollars,
                        opts.estimated_drain,
                        &opts.weights,
                    );
                    (score, m)
                })
                .collect()
        };
        drop(inv);
        // Best victim first, as Phase 2 ranks them; ties by id.
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
        let mut chosen = Vec::new();
        for want in &wanted {
            if let Some(i) = scored.iter().position(|(_, m)| want.fits(m)) {
                chosen.push(scored.remove(i).1);
            }
        }
        let ids: Vec<String> = chosen.iter().map(|m| m.id.clone()).collect();
        let until = self
            .now()
            .saturating_add(i64::try_from(DRAIN_HOLD.as_nanos()).unwrap_or(i64::MAX));
        let mut book = self.inner.drains.lock();
        for id in &ids {
            book.held.insert(id.clone(), until);
        }
        for m in chosen {
            book.pending.push(PendingDrain {
                grace: drain_grace(preemptor_priority, m.assigned_priority),
                machine_id: m.id,
                cluster: m.cluster,
                preemptor_priority,
                instruction_id: instruction_id.to_owned(),
            });
        }
        drop(book);
        tracing::info!(
            instruction = instruction_id,
            preemptor_priority,
            asked = tokens.len(),
            chosen = ids.len(),
            "cross-shard drain: victims chosen"
        );
        TransferVerdict::Released(ids)
    }

    /// Drops the drains `instruction_id` chose (its answer could not be saved,
    /// so it is not acked as done and nothing may drain for it).
    pub fn forget_drains(&self, instruction_id: &str) {
        self.inner
            .drains
            .lock()
            .pending
            .retain(|d| d.instruction_id != instruction_id);
    }

    /// Machines a drain is holding back from this shard's own demand now.
    pub fn held_drains(&self) -> Vec<String> {
        let now = self.now();
        let book = self.inner.drains.lock();
        book.held
            .iter()
            .filter(|&(_, &until)| until > now)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The ownership the cycle's engine sees: `owned` with every held drained
    /// machine made foreign (module docs); `None` when nothing is held. Expired
    /// holds are forgotten here.
    pub(crate) fn engine_ownership(&self, owned: &Ownership, now: i64) -> Option<Ownership> {
        let mut book = self.inner.drains.lock();
        book.held.retain(|_, until| *until > now);
        if book.held.is_empty() {
            return None;
        }
        let mut o = owned.clone();
        o.released.extend(book.held.keys().cloned());
        Some(o)
    }

    /// Drains chosen and not started yet, in the order they were chosen.
    pub fn pending_drains(&self) -> Vec<PendingDrain> {
        self.inner.drains.lock().pending.clone()
    }

    /// The cycle's part: forgets drains whose machine is no longer an owned
    /// Configured member of the cluster it was chosen in (it started draining,
    /// finished, moved or vanished) and returns a `Reclaim` for each of the
    /// rest, followed by the engine's `actions` minus any other action on the
    /// same machines. A drain the rails defer stays for the next cycle.
    pub(crate) fn with_drains(
        &self,
        inv: &Inventory,
        ownership: &Ownership,
        actions: Vec<Action>,
    ) -> Vec<Action> {
        let mut book = self.inner.drains.lock();
        if book.pending.is_empty() {
            return actions;
        }
        book.pending.retain(|d| {
            let id = d.machine_id.as_str();
            inv.state_of(id) == Some(MachineState::Configured)
                && inv.cluster_of(id) == Some(d.cluster.as_str())
                && inv.get(id).is_some_and(|m| ownership.owns(id, &m.profile))
        });
        let mut out: Vec<Action> = book
            .pending
            .iter()
            .map(|d| Action::Reclaim {
                machine_id: d.machine_id.clone(),
                cluster: d.cluster.clone(),
                grace: d.grace,
            })
            .collect();
        out.extend(
            actions
                .into_iter()
                .filter(|a| !book.contains(a.machine_id())),
        );
        out
    }
}
