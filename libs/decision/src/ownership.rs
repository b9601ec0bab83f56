//! Which machines of the inventory this shard may act on (ADR-0128).
//!
//! A shard's inventory can hold machines another shard owns: the provider
//! lists everything in its scope, and ownership is per topology domain. Those
//! machines stay in the snapshot as facts (a foreign machine bound to one of
//! this shard's clusters still credits its need), but no phase picks one:
//! Phase 1 never acquires a foreign Idle or Speculative machine, Phase 2 never
//! preempts and Phase 3 never reclaims or releases a foreign machine.

use crate::fleet::Fleet;
use crate::intern::NONE;
use bigfleet_model::MachineProfile;
use std::collections::BTreeSet;

/// The owned part of the inventory: topology domains plus the per-machine
/// exceptions that transfers create. The default owns everything (the
/// single-shard case).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Owned topology domains as (label key, value); empty = every domain.
    pub domains: BTreeSet<(String, String)>,
    /// Machines adopted from another shard: owned whatever their domain.
    pub adopted: BTreeSet<String>,
    /// Machines released to another shard: foreign whatever their domain.
    /// Wins over `adopted` (a release is the later, safer fact).
    pub released: BTreeSet<String>,
}

impl Ownership {
    /// Owns every machine.
    pub fn everything() -> Self {
        Ownership::default()
    }

    /// Owns the machines of these domains.
    pub fn of_domains<K: Into<String>, V: Into<String>>(
        domains: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Ownership {
            domains: domains
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            ..Ownership::default()
        }
    }

    /// True when no machine can be foreign (the engine then skips the pass).
    pub fn is_everything(&self) -> bool {
        self.domains.is_empty() && self.released.is_empty()
    }

    /// Whether the shard owns the machine `id` with this profile.
    pub fn owns(&self, id: &str, profile: &MachineProfile) -> bool {
        if self.released.contains(id) {
            return false;
        }
        if self.domains.is_empty() || self.adopted.contains(id) {
            return true;
        }
        self.domains
            .iter()
            .any(|(k, v)| profile.attribute(k) == Some(v.as_str()))
    }

    /// Per fleet slot: is the machine foreign? Empty when nothing is foreign.
    /// Domain membership is decided once per interned profile.
    pub(crate) fn foreign_slots(&self, fleet: &Fleet) -> Vec<bool> {
        if self.is_everything() {
            return Vec::new();
        }
        let domains: Vec<(&str, u32)> = self
            .domains
            .iter()
            .filter_map(|(k, v)| fleet.values.get(v).map(|s| (k.as_str(), s)))
            .collect();
        let in_domain: Vec<bool> = fleet
            .profiles
            .iter()
            .map(|p| {
                self.domains.is_empty()
                    || domains
                        .iter()
                        .any(|&(k, s)| s != NONE && p.attribute(k) == s)
            })
            .collect();
        let mut foreign = vec![false; fleet.slot_count()];
        let mut any = false;
        for (slot, f) in foreign.iter_mut().enumerate() {
            let Some(id) = fleet.id_at_slot(slot as u32) else {
                continue;
            };
            let owned = if self.released.contains(id) {
                false
            } else {
                in_domain[fleet.recs[slot].profile as usize] || self.adopted.contains(id)
            };
            *f = !owned;
            any |= *f;
        }
        if any { foreign } else { Vec::new() }
    }
}
