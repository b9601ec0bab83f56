//! What this shard may act on (ADR-0128) and the shard side of the transfer
//! protocol (ADR-0129).
//!
//! Ownership is the coordinator's domain assignment plus per-machine
//! exceptions left by `TransferOwnership`: the donor *releases* idle machines
//! (they become facts it never acts on again), the recipient *adopts* them
//! only when the coordinator tells it the donor acked. The cycle copies the
//! set at its start, so an Assign/Unassign or a transfer takes effect on the
//! next cycle without a restart. Nothing here waits on the coordinator.

use crate::shard::Decide;
use bigfleet_decision::Ownership;
use bigfleet_model::{MachineState, NotASelector, ReleaseSelector};
use std::collections::BTreeSet;

/// What applying a transfer half did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferVerdict {
    /// Applied (or already applied): ack ACCEPTED.
    Done,
    /// Not now (a cycle is running, or a named machine has an action queued or
    /// in flight): leave it unacked so the coordinator redelivers it.
    Busy(String),
    /// Cannot be applied as asked (unknown, not Idle, or not owned): nothing
    /// changed.
    Refused(String),
    /// A selector release (`*`, `*/<instance type>`) chose and released these
    /// machines (possibly none).
    Released(Vec<String>),
}

/// The release selectors of a release payload (ADR-0130, ADR-0142): `Ok(None)` when it
/// names machine ids only; `Err` when it mixes the two or a `*` token does not parse.
pub(crate) fn selectors(ids: &[String]) -> Result<Option<Vec<ReleaseSelector>>, String> {
    let asks = ids.iter().filter(|t| t.starts_with('*')).count();
    if asks == 0 {
        return Ok(None);
    }
    if asks != ids.len() {
        return Err("selectors mixed with machine ids".to_owned());
    }
    ids.iter()
        .map(|t| t.parse().map_err(|e: NotASelector| e.to_string()))
        .collect::<Result<_, _>>()
        .map(Some)
}

impl Decide {
    /// The cycle room and a read of the inventory, taken without waiting: a
    /// transfer half or a drain decided between cycles, so no cycle decided on
    /// the old ownership can still act on what it changes. `Err(Busy)` while a
    /// cycle runs or a sync writes the inventory (the instruction is redelivered).
    pub(crate) fn between_cycles(
        &self,
    ) -> Result<
        (
            tokio::sync::MutexGuard<'_, crate::cycle::CycleRoom>,
            tokio::sync::RwLockReadGuard<'_, crate::inventory::Inventory>,
        ),
        TransferVerdict,
    > {
        let Ok(cycle) = self.inner.cycle_room.try_lock() else {
            return Err(TransferVerdict::Busy("a cycle is running".to_owned()));
        };
        let Ok(inv) = self.inner.inventory.try_read() else {
            return Err(TransferVerdict::Busy(
                "inventory is being synced".to_owned(),
            ));
        };
        Ok((cycle, inv))
    }

    /// The machines this shard may act on, as the next cycle will see them.
    pub fn ownership(&self) -> Ownership {
        self.inner.ownership.lock().clone()
    }

    /// Topology domains (key, value) the coordinator assigned to this shard;
    /// empty means "everything" (single-shard mode).
    pub fn owned_domains(&self) -> BTreeSet<(String, String)> {
        self.inner.ownership.lock().domains.clone()
    }

    /// Adds a domain; idempotent. Returns whether it was new.
    pub fn assign_domain(&self, key: &str, value: &str) -> bool {
        self.inner
            .ownership
            .lock()
            .domains
            .insert((key.to_owned(), value.to_owned()))
    }

    /// Removes a domain; idempotent. Returns whether it was present.
    pub fn unassign_domain(&self, key: &str, value: &str) -> bool {
        self.inner
            .ownership
            .lock()
            .domains
            .remove(&(key.to_owned(), value.to_owned()))
    }

    /// Donor half of a transfer: stop owning these Idle machines. All or
    /// nothing. Serialized with the cycle (it takes the cycle room without
    /// waiting), so no cycle decided on the old ownership can still act on a
    /// released machine: a machine with a queued or in-flight action is
    /// `Busy`, and the queue only changes inside a cycle.
    pub fn release_machines(&self, ids: &[String]) -> TransferVerdict {
        self.release_in_state(ids, MachineState::Idle)
    }

    /// Donor half of `ReassignSpeculative`: stop owning these Speculative slots
    /// (the same rules as [`Self::release_machines`], for slots nothing runs on).
    pub fn release_speculative(&self, ids: &[String]) -> TransferVerdict {
        self.release_in_state(ids, MachineState::Speculative)
    }

    fn release_in_state(&self, ids: &[String], state: MachineState) -> TransferVerdict {
        if ids.is_empty() {
            return TransferVerdict::Refused("no machine ids".to_owned());
        }
        let (_cycle, inv) = match self.between_cycles() {
            Ok(guards) => guards,
            Err(busy) => return busy,
        };
        let owned = self.ownership();
        let wanted = match selectors(ids) {
            Ok(w) => w,
            Err(e) => return TransferVerdict::Refused(e),
        };
        if let Some(wanted) = wanted {
            let chosen = {
                let work = self.inner.work.lock();
                let busy = work.ledger.machines_with_actions();
                // Owned, in `state` and action-free, in id order; each selector takes one.
                let mut free: Vec<bigfleet_model::Machine> = inv
                    .ids()
                    .filter(|id| inv.state_of(id) == Some(state))
                    .filter(|id| !busy.contains(id))
                    .filter_map(|id| inv.get(id))
                    .filter(|m| owned.owns(&m.id, &m.profile))
                    .collect();
                free.sort_by(|a, b| a.id.cmp(&b.id));
                let mut chosen = Vec::new();
                for want in &wanted {
                    if let Some(i) = free.iter().position(|m| want.fits(m)) {
                        chosen.push(free.remove(i).id);
                    }
                }
                chosen
            };
            drop(inv);
            let mut o = self.inner.ownership.lock();
            for id in &chosen {
                o.adopted.remove(id);
                o.released.insert(id.clone());
            }
            return TransferVerdict::Released(chosen);
        }
        let mut todo = Vec::new();
        for id in ids {
            if owned.released.contains(id) {
                continue;
            }
            let Some(m) = inv.get(id) else {
                return TransferVerdict::Refused(format!("unknown machine {id}"));
            };
            if !owned.owns(id, &m.profile) {
                return TransferVerdict::Refused(format!("machine {id} is not owned here"));
            }
            if m.state != state {
                return TransferVerdict::Refused(format!(
                    "machine {id} is {}, not {state}",
                    m.state
                ));
            }
            todo.push(id.clone());
        }
        {
            let work = self.inner.work.lock();
            let busy = work.ledger.machines_with_actions();
            if let Some(id) = todo.iter().find(|id| busy.contains(id.as_str())) {
                return TransferVerdict::Busy(format!("machine {id} has an action pending"));
            }
        }
        drop(inv);
        let mut o = self.inner.ownership.lock();
        for id in todo {
            o.adopted.remove(&id);
            o.released.insert(id);
        }
        TransferVerdict::Done
    }

    /// Recipient half of a transfer: own these machines whatever their
    /// domain. The coordinator sends it only after the donor acked its
    /// release (ADR-0129), so the machine is never live in two shards.
    pub fn adopt_machines(&self, ids: &[String]) -> TransferVerdict {
        if ids.is_empty() {
            return TransferVerdict::Refused("no machine ids".to_owned());
        }
        let mut o = self.inner.ownership.lock();
        for id in ids {
            o.released.remove(id);
            o.adopted.insert(id.clone());
        }
        TransferVerdict::Done
    }
}

impl Decide {
    /// Replaces the owned set (a saved one, read back at start-up before the
    /// first cycle, so a restarted shard never owns more than it did).
    pub fn restore_ownership(&self, ownership: Ownership) {
        *self.inner.ownership.lock() = ownership;
    }
}
