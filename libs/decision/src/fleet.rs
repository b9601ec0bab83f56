//! The compact, incrementally maintained inventory the engine reads (ADR-0021).
//!
//! A shard keeps one [`Fleet`] next to its authoritative records and upserts a
//! machine whenever it changes; strings (ids, clusters, instance types, label
//! sets, fingerprints, groups) and capacity vectors are interned once there, so
//! a cycle's snapshot is a gather of fixed-size records in id order with no
//! string or heap-pointer reads. Idle-since stamps live here too, with the
//! reference semantics: stamped on every entry into Idle, kept across Idle→Idle
//! updates, cleared on leaving Idle.

use crate::EngineError;
use crate::intern::NONE;
use bigfleet_model::{CapacityType, Machine, MachineProfile, MachineState, ResourceVector};
use hashbrown::HashTable;
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, OnceLock};

/// Owned string interning with stable ids.
#[derive(Debug, Default, Clone)]
pub(crate) struct SymTable {
    map: FxHashMap<Box<str>, u32>,
    strs: Vec<Box<str>>,
}

impl SymTable {
    pub(crate) fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.map.get(s) {
            return id;
        }
        let id = u32::try_from(self.strs.len()).expect("fewer than 2^32 symbols");
        self.map.insert(s.into(), id);
        self.strs.push(s.into());
        id
    }

    /// Interns a non-empty string; `NONE` for "".
    pub(crate) fn intern_opt(&mut self, s: &str) -> u32 {
        if s.is_empty() { NONE } else { self.intern(s) }
    }

    pub(crate) fn get(&self, s: &str) -> Option<u32> {
        self.map.get(s).copied()
    }

    pub(crate) fn resolve(&self, id: u32) -> &str {
        &self.strs[id as usize]
    }

    pub(crate) fn len(&self) -> usize {
        self.strs.len()
    }

    fn heap_bytes(&self) -> usize {
        let strs: usize = self.strs.iter().map(|s| s.len()).sum();
        2 * strs + self.map.len() * 24 + self.strs.len() * 16
    }
}

/// A machine profile with interned parts (what matching reads).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct FleetProfile {
    /// Instance-type field (value symbol, `NONE` when empty).
    pub itype: u32,
    /// Zone field (value symbol, `NONE` when empty).
    pub zone: u32,
    pub cap: CapacityType,
    /// Labels as (key, value symbol), sorted by key.
    pub labels: Vec<(Box<str>, u32)>,
}

impl FleetProfile {
    /// Attribute lookup with the model's rule: the instance-type and zone keys
    /// read the dedicated fields when set, everything else the labels.
    pub(crate) fn attribute(&self, key: &str) -> u32 {
        if key == bigfleet_model::INSTANCE_TYPE_KEY && self.itype != NONE {
            return self.itype;
        }
        if key == bigfleet_model::ZONE_KEY && self.zone != NONE {
            return self.zone;
        }
        match self.labels.binary_search_by(|(k, _)| (**k).cmp(key)) {
            Ok(i) => self.labels[i].1,
            Err(_) => NONE,
        }
    }
}

/// The per-machine record kept by the fleet (56 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MachineRecord {
    pub price: f64,
    pub interruption_probability: f64,
    /// What the machine's current need stamped on it: penalty dollars and priority.
    pub assigned_interruption_penalty: f64,
    pub assigned_reclamation_penalty: f64,
    pub assigned_priority: i32,
    pub cluster: u32,
    pub profile: u32,
    pub alloc: u32,
    /// Stamped need fingerprint / group (symbols, `NONE` when empty).
    pub assigned_fingerprint: u32,
    pub assigned_group: u32,
    pub state: MachineState,
    pub cap: CapacityType,
}

/// The engine's compact inventory. See the module docs.
#[derive(Debug, Default, Clone)]
pub struct Fleet {
    pub(crate) recs: Vec<MachineRecord>,
    /// `recs[slot].state`, packed, so a pass can skip records by state without
    /// touching them.
    pub(crate) states: Vec<MachineState>,
    pub(crate) ids: Vec<Box<str>>,
    pub(crate) idle: Vec<i64>,
    live: Vec<bool>,
    free: Vec<u32>,
    /// Live slots, found by the hash of their id (the table stores 4 bytes a
    /// machine; the id itself lives once, in `ids`).
    index: HashTable<u32>,
    /// Live slots in machine id order (rank → slot).
    pub(crate) order: Vec<u32>,
    /// `order` is `0..n`: slot == rank (no dead slots, slots in id order).
    pub(crate) identity: bool,
    pub(crate) clusters: SymTable,
    pub(crate) values: SymTable,
    pub(crate) fps: SymTable,
    pub(crate) groups: SymTable,
    pub(crate) profiles: Vec<FleetProfile>,
    profile_index: FxHashMap<FleetProfile, u32>,
    pub(crate) allocs: Vec<ResourceVector>,
    alloc_index: FxHashMap<ResourceVector, u32>,
    /// The demand-independent part of the snapshot, built by the first cycle
    /// after a mutation and reused by every cycle until the next one.
    pub(crate) base: OnceLock<Box<crate::snapshot::Base>>,
    /// A base that records replaced since were built against, with what it saw
    /// of them: the next snapshot patches it instead of rebuilding (ADR-0133).
    pub(crate) stale: StaleBase,
}

/// A record replaced after the cached base was built: its slot and the record
/// and idle-since stamp the base saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change {
    pub slot: u32,
    pub rec: MachineRecord,
    pub idle: i64,
}

/// The cached base waiting for its patch, with the replacements since.
#[derive(Debug, Default)]
pub(crate) struct StaleBase(Mutex<Option<(Box<crate::snapshot::Base>, Vec<Change>)>>);

impl Clone for StaleBase {
    fn clone(&self) -> Self {
        StaleBase(Mutex::new(
            self.0.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        ))
    }
}

impl StaleBase {
    /// Takes the stale base and its changes (for the patch).
    pub(crate) fn take(&self) -> Option<(Box<crate::snapshot::Base>, Vec<Change>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn slot(&mut self) -> &mut Option<(Box<crate::snapshot::Base>, Vec<Change>)> {
        self.0.get_mut().unwrap_or_else(|e| e.into_inner())
    }
}

/// Replacements a stale base takes before a rebuild is cheaper than patching.
fn patch_limit(machines: usize) -> usize {
    (machines / 16).max(64)
}

fn hash_id(id: &str) -> u64 {
    let mut h = FxHasher::default();
    id.hash(&mut h);
    h.finish()
}

fn sane_price(p: f64) -> f64 {
    if p > 0.0 {
        p
    } else if p.is_nan() {
        f64::INFINITY
    } else {
        0.0
    }
}

fn sane_prob(p: f64) -> f64 {
    if p.is_nan() { 1.0 } else { p.clamp(0.0, 1.0) }
}

impl Fleet {
    pub fn new() -> Fleet {
        Fleet {
            identity: true,
            ..Fleet::default()
        }
    }

    /// Builds a fleet from a machine slice in one go (any order), with optional
    /// idle-since stamps aligned with it.
    pub fn from_machines(
        machines: &[Machine],
        idle_since: &[Option<i64>],
    ) -> Result<Fleet, EngineError> {
        if !idle_since.is_empty() && idle_since.len() != machines.len() {
            return Err(EngineError::IdleSinceLength {
                machines: machines.len(),
                stamps: idle_since.len(),
            });
        }
        if u32::try_from(machines.len()).is_err() {
            return Err(EngineError::TooManyMachines(machines.len()));
        }
        let mut f = Fleet::new();
        f.recs.reserve(machines.len());
        f.ids.reserve(machines.len());
        f.idle.reserve(machines.len());
        f.live.reserve(machines.len());
        f.index.reserve(machines.len(), |_| 0);
        // Slots are assigned in id order, so a fresh fleet's slot is its rank.
        let sorted = machines.windows(2).all(|w| w[0].id < w[1].id);
        let perm: Vec<usize> = if sorted {
            (0..machines.len()).collect()
        } else {
            let mut p: Vec<usize> = (0..machines.len()).collect();
            p.sort_by(|a, b| machines[*a].id.cmp(&machines[*b].id));
            p
        };
        for (slot, &i) in perm.iter().enumerate() {
            let m = &machines[i];
            let slot = slot as u32;
            let h = hash_id(&m.id);
            if f.slot_of(&m.id).is_some() {
                return Err(EngineError::DuplicateMachineId(m.id.clone()));
            }
            let rec = f.record(m);
            f.states.push(rec.state);
            f.recs.push(rec);
            f.ids.push(m.id.as_str().into());
            let ids = &f.ids;
            f.index
                .insert_unique(h, slot, |&s| hash_id(&ids[s as usize]));
            f.idle
                .push(idle_since.get(i).copied().flatten().unwrap_or(i64::MIN));
            f.live.push(true);
        }
        f.order = (0..machines.len() as u32).collect();
        f.identity = true;
        Ok(f)
    }

    fn slot_of(&self, id: &str) -> Option<u32> {
        self.index
            .find(hash_id(id), |&s| &*self.ids[s as usize] == id)
            .copied()
    }

    fn rank_of(&self, id: &str) -> Result<usize, usize> {
        self.order
            .binary_search_by(|s| (*self.ids[*s as usize]).cmp(id))
    }

    fn intern_profile(&mut self, p: &MachineProfile) -> u32 {
        let labels = p
            .labels
            .iter()
            .map(|(k, v)| (Box::<str>::from(k.as_str()), self.values.intern(v)))
            .collect();
        let fp = FleetProfile {
            itype: self.values.intern_opt(&p.instance_type),
            zone: self.values.intern_opt(&p.zone),
            cap: p.capacity_type,
            labels,
        };
        if let Some(&id) = self.profile_index.get(&fp) {
            return id;
        }
        let id = self.profiles.len() as u32;
        self.profiles.push(fp.clone());
        self.profile_index.insert(fp, id);
        id
    }

    fn intern_alloc(&mut self, a: &ResourceVector) -> u32 {
        if let Some(&id) = self.alloc_index.get(a) {
            return id;
        }
        let id = self.allocs.len() as u32;
        self.allocs.push(a.clone());
        self.alloc_index.insert(a.clone(), id);
        id
    }

    fn record(&mut self, m: &Machine) -> MachineRecord {
        MachineRecord {
            profile: self.intern_profile(&m.profile),
            alloc: self.intern_alloc(m.effective_allocatable()),
            ..self.record_without_hardware(m)
        }
    }

    /// Everything of a record but the interned profile and allocatable.
    fn record_without_hardware(&mut self, m: &Machine) -> MachineRecord {
        MachineRecord {
            price: sane_price(m.price_per_hour),
            interruption_probability: sane_prob(m.interruption_probability),
            assigned_interruption_penalty: sane_price(m.assigned_interruption_penalty_dollars),
            assigned_reclamation_penalty: sane_price(m.assigned_reclamation_penalty_dollars),
            assigned_priority: m.assigned_priority,
            cluster: self.clusters.intern_opt(&m.cluster),
            profile: NONE,
            alloc: NONE,
            assigned_fingerprint: self.fps.intern_opt(&m.assigned_need_fingerprint),
            assigned_group: self.groups.intern_opt(&m.assigned_group),
            state: m.state,
            cap: m.profile.capacity_type,
        }
    }

    /// Inserts or replaces a machine, stamping idle-since with `now` when it
    /// enters Idle (an Idle→Idle update keeps the original stamp).
    pub fn upsert(&mut self, m: &Machine, now_unix_nanos: i64) {
        let rec = self.record(m);
        let was_idle = self
            .slot_of(&m.id)
            .is_some_and(|s| self.recs[s as usize].state == MachineState::Idle);
        let stamp = match (m.state == MachineState::Idle, was_idle) {
            (true, true) => None, // keep
            (true, false) => Some(now_unix_nanos),
            (false, _) => Some(i64::MIN),
        };
        let (slot, old) = self.put(&m.id, rec);
        if let Some(t) = stamp {
            self.idle[slot as usize] = t;
        }
        self.replaced(slot, old);
    }

    /// Inserts or replaces a machine with an explicit idle-since stamp (e.g.
    /// restored after a restart). Returns its slot.
    pub fn upsert_with_idle_since(&mut self, m: &Machine, idle_since: Option<i64>) -> u32 {
        let rec = self.record(m);
        let (slot, old) = self.put(&m.id, rec);
        self.idle[slot as usize] = idle_since.unwrap_or(i64::MIN);
        self.replaced(slot, old);
        slot
    }

    // ---- slot addressing ----
    //
    // An owner that keeps its own per-machine data (the shard's inventory)
    // indexes it by the fleet's slot, so the machine id and the id index exist
    // once and an update of a known machine needs no lookup at all. Slots are
    // stable while the machine lives; a removed machine's slot is reused.

    /// The slot of a live machine.
    pub fn slot(&self, id: &str) -> Option<u32> {
        self.slot_of(id)
    }

    /// Slots in use or free (one past the highest slot).
    pub fn slot_count(&self) -> usize {
        self.recs.len()
    }

    /// The id of the machine in `slot`, when one lives there.
    pub fn id_at_slot(&self, slot: u32) -> Option<&str> {
        let s = slot as usize;
        (s < self.live.len() && self.live[s]).then(|| &*self.ids[s])
    }

    /// The idle-since stamp of the machine in a live slot.
    pub fn idle_since_at_slot(&self, slot: u32) -> Option<i64> {
        let t = self.idle[slot as usize];
        (t != i64::MIN).then_some(t)
    }

    /// Replaces the machine in a live `slot` (which must hold `m.id`). With
    /// `same_hardware` the caller vouches that its profile and allocatable are
    /// those already stored, so they are not interned again (a state change,
    /// the common update, costs no hashing and no allocation).
    pub fn replace_at_slot(
        &mut self,
        slot: u32,
        m: &Machine,
        idle_since: Option<i64>,
        same_hardware: bool,
    ) {
        let s = slot as usize;
        debug_assert!(
            self.live[s] && *self.ids[s] == *m.id,
            "slot holds the machine"
        );
        let rec = if same_hardware {
            let old = self.recs[s];
            MachineRecord {
                profile: old.profile,
                alloc: old.alloc,
                ..self.record_without_hardware(m)
            }
        } else {
            self.record(m)
        };
        let old = Change {
            slot,
            rec: self.recs[s],
            idle: self.idle[s],
        };
        self.recs[s] = rec;
        self.states[s] = rec.state;
        self.idle[s] = idle_since.unwrap_or(i64::MIN);
        self.replaced(slot, Some(old));
    }

    /// Keeps the cached snapshot base usable after a machine in `slot` was
    /// replaced (`old` = what it was; `None` = newly inserted, which rebuilds):
    /// an unchanged record keeps the base as it is, a changed one is queued for
    /// the next snapshot to patch in, and too many changes rebuild.
    fn replaced(&mut self, slot: u32, old: Option<Change>) {
        let Some(old) = old else {
            self.drop_base();
            return;
        };
        let s = slot as usize;
        if old.rec == self.recs[s] && old.idle == self.idle[s] {
            return;
        }
        let limit = patch_limit(self.order.len());
        if let Some(base) = self.base.take() {
            *self.stale.slot() = Some((base, vec![old]));
        } else if let Some((_, changes)) = self.stale.slot() {
            if changes.len() >= limit {
                *self.stale.slot() = None;
            } else {
                changes.push(old);
            }
        }
    }

    /// Forgets every cached snapshot part (the id set changed).
    fn drop_base(&mut self) {
        self.base.take();
        *self.stale.slot() = None;
    }

    /// Stores `rec` under `id`; returns the slot and, for a machine already
    /// present, what it replaced.
    fn put(&mut self, id: &str, rec: MachineRecord) -> (u32, Option<Change>) {
        if let Some(s) = self.slot_of(id) {
            let old = Change {
                slot: s,
                rec: self.recs[s as usize],
                idle: self.idle[s as usize],
            };
            self.recs[s as usize] = rec;
            self.states[s as usize] = rec.state;
            return (s, Some(old));
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.recs[s as usize] = rec;
                self.states[s as usize] = rec.state;
                self.ids[s as usize] = id.into();
                self.idle[s as usize] = i64::MIN;
                self.live[s as usize] = true;
                s
            }
            None => {
                self.states.push(rec.state);
                self.recs.push(rec);
                self.ids.push(id.into());
                self.idle.push(i64::MIN);
                self.live.push(true);
                (self.recs.len() - 1) as u32
            }
        };
        let ids = &self.ids;
        self.index
            .insert_unique(hash_id(id), slot, |&s| hash_id(&ids[s as usize]));
        let pos = self.rank_of(id).unwrap_err();
        self.identity = self.identity && pos == self.order.len() && slot as usize == pos;
        self.order.insert(pos, slot);
        (slot, None)
    }

    /// Removes a machine; false when unknown.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some(slot) = self.slot_of(id) else {
            return false;
        };
        self.drop_base();
        if let Ok(pos) = self.rank_of(id) {
            self.order.remove(pos);
        }
        if let Ok(e) = self.index.find_entry(hash_id(id), |&s| s == slot) {
            e.remove();
        }
        self.live[slot as usize] = false;
        self.states[slot as usize] = MachineState::Unspecified;
        self.ids[slot as usize] = "".into();
        self.free.push(slot);
        self.identity = false;
        true
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.slot_of(id).is_some()
    }

    /// The idle-since stamp of a machine.
    pub fn idle_since(&self, id: &str) -> Option<i64> {
        let t = self.idle[self.slot_of(id)? as usize];
        (t != i64::MIN).then_some(t)
    }

    /// Machine ids in id order.
    pub fn ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.order.iter().map(|s| &*self.ids[*s as usize])
    }

    /// Approximate heap bytes held by the fleet.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let ids: usize = self.ids.iter().map(|s| s.len() + 16).sum();
        self.recs.len() * size_of::<MachineRecord>()
            + self.states.len()
            + ids
            + self.idle.len() * 8
            + self.live.len()
            + self.order.len() * 4
            + self.index.capacity() * (size_of::<u32>() + 1)
            + self.clusters.heap_bytes()
            + self.values.heap_bytes()
            + self.fps.heap_bytes()
            + self.groups.heap_bytes()
            + self.profiles.len() * 96
            + self.allocs.len() * 96
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::Host;

    fn m(id: &str, state: MachineState) -> Machine {
        Machine {
            id: id.into(),
            state,
            host: Host {
                provider: "p".into(),
                reference: id.into(),
            },
            ..Machine::default()
        }
    }

    #[test]
    fn keeps_id_order_across_inserts_and_removes() {
        let mut f = Fleet::new();
        for id in ["m5", "m1", "m9", "m3"] {
            f.upsert(&m(id, MachineState::Idle), 1);
        }
        assert_eq!(f.ids().collect::<Vec<_>>(), ["m1", "m3", "m5", "m9"]);
        assert!(f.remove("m3"));
        assert!(!f.remove("m3"));
        f.upsert(&m("m4", MachineState::Idle), 2);
        assert_eq!(f.ids().collect::<Vec<_>>(), ["m1", "m4", "m5", "m9"]);
        assert_eq!(f.len(), 4);
        assert!(f.contains("m4") && !f.contains("m3"));
    }

    #[test]
    fn idle_since_semantics() {
        let mut f = Fleet::new();
        f.upsert(&m("a", MachineState::Idle), 10);
        assert_eq!(f.idle_since("a"), Some(10));
        // Idle → Idle keeps the original stamp.
        f.upsert(&m("a", MachineState::Idle), 20);
        assert_eq!(f.idle_since("a"), Some(10));
        // Leaving Idle clears it; re-entering stamps anew.
        f.upsert(&m("a", MachineState::Configuring), 30);
        assert_eq!(f.idle_since("a"), None);
        f.upsert(&m("a", MachineState::Idle), 40);
        assert_eq!(f.idle_since("a"), Some(40));
        f.upsert_with_idle_since(&m("a", MachineState::Idle), Some(5));
        assert_eq!(f.idle_since("a"), Some(5));
    }

    #[test]
    fn slot_addressing_matches_id_addressing() {
        let mut f = Fleet::new();
        let a = f.upsert_with_idle_since(&m("a", MachineState::Idle), Some(7));
        let b = f.upsert_with_idle_since(&m("b", MachineState::Idle), None);
        assert_eq!(f.slot("a"), Some(a));
        assert_eq!(f.id_at_slot(b), Some("b"));
        assert_eq!(f.idle_since_at_slot(a), Some(7));
        let mut moved = m("a", MachineState::Configured);
        moved.cluster = "c1".into();
        f.replace_at_slot(a, &moved, None, true);
        // The same as replacing by id with full interning.
        let mut fresh = Fleet::new();
        fresh.upsert_with_idle_since(&moved, None);
        fresh.upsert_with_idle_since(&m("b", MachineState::Idle), None);
        assert_eq!(
            f.recs[a as usize],
            fresh.recs[fresh.slot("a").unwrap() as usize]
        );
        assert_eq!(f.idle_since("a"), None);
        assert!(f.remove("a"));
        assert_eq!(f.id_at_slot(a), None);
        assert_eq!(f.slot_count(), 2);
        // A removed machine's slot is reused.
        assert_eq!(
            f.upsert_with_idle_since(&m("c", MachineState::Idle), None),
            a
        );
    }

    #[test]
    fn from_machines_rejects_duplicates_and_sorts() {
        let ms = vec![m("b", MachineState::Idle), m("a", MachineState::Idle)];
        let f = Fleet::from_machines(&ms, &[]).unwrap();
        assert_eq!(f.ids().collect::<Vec<_>>(), ["a", "b"]);
        let dup = vec![m("a", MachineState::Idle), m("a", MachineState::Idle)];
        assert_eq!(
            Fleet::from_machines(&dup, &[]).unwrap_err(),
            EngineError::DuplicateMachineId("a".into())
        );
    }
}
