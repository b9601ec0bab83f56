//! The shard's authoritative machine inventory.
//!
//! Built for 500K machines in a few hundred MB: each machine is a fixed-size
//! record whose repeated strings (clusters, fingerprints, groups, provider
//! names) are interned symbols and whose hardware description (type, zone,
//! capacity type, resources, labels) and allocatable vector are shared table
//! entries. Records are indexed by the engine fleet's slot, so the machine id,
//! the id index and the idle-since stamps exist once (in the fleet) and an
//! update of a known machine needs no lookup. A full [`Machine`] is
//! materialised only on the slow paths that need one.
//!
//! Next to the records it maintains the engine's compact
//! [`bigfleet_decision::Fleet`] (upserted on every change, so a cycle reads a
//! ready inventory), idle-since stamps, reconcile marks and per-bucket counters
//! so summaries, gauges and AvailableCapacity hints never walk every machine.

use bigfleet_decision::Fleet;
use bigfleet_model::machine::{
    META_ASSIGNED_GROUP, META_ASSIGNED_INTERRUPTION_PENALTY, META_ASSIGNED_NEED_FINGERPRINT,
    META_ASSIGNED_PRIORITY, META_ASSIGNED_RECLAMATION_PENALTY,
};
use bigfleet_model::{
    CapacityType, Host, Machine, MachineProfile, MachineState, PenaltyBucket, ResourceVector,
    bucket_for_dollars,
};
use rustc_hash::{FxHashMap, FxHasher};
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// One cell of the inventory's count index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketKey {
    pub state: MachineState,
    pub capacity_type: CapacityType,
    /// Bucket of the assigned interruption penalty (Zero when unassigned).
    pub interruption_bucket: PenaltyBucket,
    pub instance_type: String,
    pub zone: String,
}

/// Coarse counts for reports (the coordinator's `ShardSummary`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InventorySummary {
    pub total: u64,
    /// Idle + Speculative.
    pub free: u64,
    pub by_state: BTreeMap<MachineState, u64>,
    pub by_instance_type: BTreeMap<String, u64>,
    pub by_zone: BTreeMap<String, u64>,
}

impl InventorySummary {
    /// Counts `n` machines in `state` with `profile`.
    fn add(&mut self, state: MachineState, profile: &MachineProfile, n: u64) {
        self.total += n;
        if matches!(state, MachineState::Idle | MachineState::Speculative) {
            self.free += n;
        }
        *self.by_state.entry(state).or_default() += n;
        *self
            .by_instance_type
            .entry(profile.instance_type.clone())
            .or_default() += n;
        *self.by_zone.entry(profile.zone.clone()).or_default() += n;
    }

    /// Uncounts one machine [`Self::add`] counted; a count that reaches zero goes, as
    /// if it had never been counted.
    fn remove(&mut self, state: MachineState, profile: &MachineProfile) {
        fn dec<K: Ord>(map: &mut BTreeMap<K, u64>, k: &K) {
            if let Some(n) = map.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    map.remove(k);
                }
            }
        }
        self.total -= 1;
        if matches!(state, MachineState::Idle | MachineState::Speculative) {
            self.free -= 1;
        }
        dec(&mut self.by_state, &state);
        dec(&mut self.by_instance_type, &profile.instance_type);
        dec(&mut self.by_zone, &profile.zone);
    }
}

/// Matching free supply for an AvailableCapacity hint.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FreeSupply {
    pub idle: u64,
    pub speculative: u64,
    /// Cheapest matching Idle machine, USD/h.
    pub cheapest_idle_price: Option<f64>,
}

/// A machine's binding and assignment as the shard holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assigned<'a> {
    pub cluster: &'a str,
    pub state: MachineState,
    pub priority: i32,
    pub interruption_penalty_dollars: f64,
    pub reclamation_penalty_dollars: f64,
    pub need_fingerprint: &'a str,
    pub group: &'a str,
}

/// The five well-known `shard_metadata` keys, in mask-bit order.
const META_KEYS: [&str; 5] = [
    META_ASSIGNED_PRIORITY,
    META_ASSIGNED_INTERRUPTION_PENALTY,
    META_ASSIGNED_RECLAMATION_PENALTY,
    META_ASSIGNED_NEED_FINGERPRINT,
    META_ASSIGNED_GROUP,
];

/// Symbol of the empty string.
const EMPTY: u32 = 0;

/// Owned string interning with stable ids; id 0 is "".
#[derive(Debug)]
struct Syms {
    map: FxHashMap<Box<str>, u32>,
    strs: Vec<Box<str>>,
}

impl Default for Syms {
    fn default() -> Self {
        let mut s = Syms {
            map: FxHashMap::default(),
            strs: Vec::new(),
        };
        s.intern("");
        s
    }
}

impl Syms {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.map.get(s) {
            return id;
        }
        let id = u32::try_from(self.strs.len()).expect("fewer than 2^32 symbols");
        self.map.insert(s.into(), id);
        self.strs.push(s.into());
        id
    }

    fn get(&self, s: &str) -> Option<u32> {
        self.map.get(s).copied()
    }

    fn resolve(&self, id: u32) -> &str {
        &self.strs[id as usize]
    }
}

/// A table of shared values with stable ids (profiles, allocatable vectors).
#[derive(Debug)]
struct Table<T> {
    index: FxHashMap<u64, SmallVec<[u32; 1]>>,
    items: Vec<T>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            index: FxHashMap::default(),
            items: Vec::new(),
        }
    }
}

impl<T: PartialEq + Clone> Table<T> {
    fn intern(&mut self, hash: u64, v: &T) -> u32 {
        let slots = self.index.entry(hash).or_default();
        if let Some(&id) = slots.iter().find(|&&id| self.items[id as usize] == *v) {
            return id;
        }
        let id = u32::try_from(self.items.len()).expect("fewer than 2^32 table entries");
        self.items.push(v.clone());
        slots.push(id);
        id
    }
}

fn hash_of(f: impl FnOnce(&mut FxHasher)) -> u64 {
    let mut h = FxHasher::default();
    f(&mut h);
    h.finish()
}

fn profile_hash(p: &MachineProfile) -> u64 {
    hash_of(|h| {
        p.instance_type.hash(h);
        p.zone.hash(h);
        p.capacity_type.hash(h);
        p.resources.hash(h);
        p.labels.hash(h);
    })
}

/// `shard_metadata` entries kept verbatim.
type ExtraMeta = Box<[(Box<str>, Box<str>)]>;

/// One machine, compactly (see the module docs).
#[derive(Debug, Clone, Default)]
struct Rec {
    /// `None` together with `host_ref_is_id` set means "the machine id".
    host_ref: Option<Box<str>>,
    price: f64,
    prob: f64,
    assigned_interruption_penalty: f64,
    assigned_reclamation_penalty: f64,
    assigned_priority: i32,
    host_provider: u32,
    cluster: u32,
    profile: u32,
    alloc: u32,
    assigned_fingerprint: u32,
    group: u32,
    state: MachineState,
    host_ref_is_id: bool,
    /// Which of [`META_KEYS`] were present with exactly their re-encoded value.
    meta_mask: u8,
}

/// The parts of a machine most records do not have, kept beside the records
/// (by slot) so the common record stays small.
#[derive(Debug, Clone, Default, PartialEq)]
struct Rare {
    last_error: Option<Box<str>>,
    /// `shard_metadata` entries that cannot be rebuilt from the assigned fields.
    extra_meta: Option<ExtraMeta>,
}

impl Rec {
    /// What a free slot holds (no heap, no cluster, counted nowhere).
    fn vacant() -> Rec {
        Rec::default()
    }
}

/// Counter cell: (state, interruption bucket, profile id).
type Cell = (MachineState, PenaltyBucket, u32);

/// Where a machine's effective allocatable lives: the allocatable table, or its
/// profile's resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Shape {
    Allocatable(u32),
    Resources(u32),
}

/// The inventory. Not synchronised: the owner wraps it in a lock.
#[derive(Debug, Default)]
pub struct Inventory {
    /// By fleet slot (a free slot holds [`Rec::vacant`]).
    recs: Vec<Rec>,
    /// By slot, only for machines that have some.
    rare: FxHashMap<u32, Rare>,
    /// Reconcile generation that last saw each machine (removal walk), by slot.
    seen: Vec<u32>,
    syms: Syms,
    profiles: Table<MachineProfile>,
    allocs: Table<ResourceVector>,
    cells: FxHashMap<Cell, u64>,
    /// Idle prices per profile: price bits → count. Prices are finite and
    /// non-negative (ingest validates), so bit order is numeric order.
    idle_prices: FxHashMap<u32, BTreeMap<u64, u64>>,
    configured_by_cluster: FxHashMap<u32, u64>,
    /// Per cluster, its Configured and Draining machines by state and effective
    /// allocatable (see [`Inventory::shape`]): the rails read Draining counts
    /// (reclaims in flight) and what the Configured machines provide (ADR-0105).
    bound_shapes: FxHashMap<u32, FxHashMap<(MachineState, Shape), u64>>,
    fleet: Fleet,
}

impl Inventory {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.fleet.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fleet.is_empty()
    }

    /// The engine's compact view of the same machines.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Position of a machine (its fleet slot: stable while it lives).
    pub fn position(&self, id: &str) -> Option<usize> {
        self.fleet.slot(id).map(|s| s as usize)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.position(id).is_some()
    }

    pub fn state_at(&self, pos: usize) -> MachineState {
        self.recs[pos].state
    }

    /// The id at a position, if a machine lives there.
    pub fn id_at(&self, pos: usize) -> Option<&str> {
        u32::try_from(pos)
            .ok()
            .and_then(|s| self.fleet.id_at_slot(s))
    }

    /// Positions holding a machine.
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.recs.len()).filter(|&p| self.id_at(p).is_some())
    }

    /// What reconcile needs to keep the shard's own assignment: cluster,
    /// state, priority, both penalties, fingerprint, group.
    pub fn assignment_at(&self, pos: usize) -> Assigned<'_> {
        let r = &self.recs[pos];
        Assigned {
            cluster: self.syms.resolve(r.cluster),
            state: r.state,
            priority: r.assigned_priority,
            interruption_penalty_dollars: r.assigned_interruption_penalty,
            reclamation_penalty_dollars: r.assigned_reclamation_penalty,
            need_fingerprint: self.syms.resolve(r.assigned_fingerprint),
            group: self.syms.resolve(r.group),
        }
    }

    pub fn state_of(&self, id: &str) -> Option<MachineState> {
        self.position(id).map(|p| self.recs[p].state)
    }

    pub fn cluster_of(&self, id: &str) -> Option<&str> {
        self.position(id)
            .map(|p| self.syms.resolve(self.recs[p].cluster))
    }

    /// A full copy of one machine.
    pub fn get(&self, id: &str) -> Option<Machine> {
        self.position(id).map(|p| self.materialize(p))
    }

    pub fn idle_since_of(&self, id: &str) -> Option<i64> {
        self.fleet.idle_since(id)
    }

    /// Machine ids, in storage order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        (0..self.fleet.slot_count() as u32).filter_map(|s| self.fleet.id_at_slot(s))
    }

    fn materialize(&self, pos: usize) -> Machine {
        let r = &self.recs[pos];
        let rare = self.rare.get(&(pos as u32));
        let id = self.id_at(pos).expect("a live position");
        let reference = match (&r.host_ref, r.host_ref_is_id) {
            (Some(h), _) => h.to_string(),
            (None, true) => id.to_owned(),
            (None, false) => String::new(),
        };
        let mut m = Machine {
            id: id.to_owned(),
            state: r.state,
            host: Host {
                provider: self.syms.resolve(r.host_provider).to_owned(),
                reference,
            },
            cluster: self.syms.resolve(r.cluster).to_owned(),
            profile: self.profiles.items[r.profile as usize].clone(),
            price_per_hour: r.price,
            interruption_probability: r.prob,
            last_error: rare
                .and_then(|x| x.last_error.as_deref())
                .unwrap_or_default()
                .to_owned(),
            assigned_priority: r.assigned_priority,
            assigned_interruption_penalty_dollars: r.assigned_interruption_penalty,
            assigned_reclamation_penalty_dollars: r.assigned_reclamation_penalty,
            assigned_need_fingerprint: self.syms.resolve(r.assigned_fingerprint).to_owned(),
            assigned_group: self.syms.resolve(r.group).to_owned(),
            allocatable: self.allocs.items[r.alloc as usize].clone(),
            shard_metadata: BTreeMap::new(),
        };
        if r.meta_mask != 0 {
            let encoded = m.encode_shard_metadata();
            for (bit, key) in META_KEYS.iter().enumerate() {
                if r.meta_mask & (1 << bit) != 0 {
                    m.shard_metadata
                        .insert((*key).to_owned(), encoded[*key].clone());
                }
            }
        }
        for (k, v) in rare
            .and_then(|x| x.extra_meta.as_deref())
            .unwrap_or_default()
        {
            m.shard_metadata.insert(k.to_string(), v.to_string());
        }
        m
    }

    /// `like` is the record being replaced: when the hardware description
    /// did not change (the common case: a state change), its table entries are
    /// reused without hashing. Also says whether the hardware is unchanged.
    fn compact(&mut self, m: &Machine, like: Option<usize>) -> (Rec, Rare, bool) {
        let prev = like.map(|p| (self.recs[p].profile, self.recs[p].alloc));
        let (profile, same_profile) = match prev {
            Some((id, _)) if self.profiles.items[id as usize] == m.profile => (id, true),
            _ => (
                self.profiles.intern(profile_hash(&m.profile), &m.profile),
                false,
            ),
        };
        let (alloc, same_alloc) = match prev {
            Some((_, id)) if self.allocs.items[id as usize] == m.allocatable => (id, true),
            _ => (
                self.allocs
                    .intern(hash_of(|h| m.allocatable.hash(h)), &m.allocatable),
                false,
            ),
        };
        let (host_ref, host_ref_is_id) = if m.host.reference.is_empty() {
            (None, false)
        } else if m.host.reference == m.id {
            (None, true)
        } else {
            (Some(m.host.reference.as_str().into()), false)
        };
        let mut meta_mask = 0u8;
        let mut extra: Vec<(Box<str>, Box<str>)> = Vec::new();
        if !m.shard_metadata.is_empty() {
            let encoded = m.encode_shard_metadata();
            for (k, v) in &m.shard_metadata {
                match META_KEYS.iter().position(|key| key == k) {
                    Some(bit) if encoded[k.as_str()] == *v => meta_mask |= 1 << bit,
                    _ => extra.push((k.as_str().into(), v.as_str().into())),
                }
            }
        }
        let rec = Rec {
            host_ref,
            price: m.price_per_hour,
            prob: m.interruption_probability,
            assigned_interruption_penalty: m.assigned_interruption_penalty_dollars,
            assigned_reclamation_penalty: m.assigned_reclamation_penalty_dollars,
            assigned_priority: m.assigned_priority,
            host_provider: self.syms.intern(&m.host.provider),
            cluster: self.syms.intern(&m.cluster),
            profile,
            alloc,
            assigned_fingerprint: self.syms.intern(&m.assigned_need_fingerprint),
            group: self.syms.intern(&m.assigned_group),
            state: m.state,
            host_ref_is_id,
            meta_mask,
        };
        let rare = Rare {
            last_error: (!m.last_error.is_empty()).then(|| m.last_error.as_str().into()),
            extra_meta: (!extra.is_empty()).then(|| extra.into_boxed_slice()),
        };
        (rec, rare, same_profile && same_alloc)
    }

    fn set_rare(&mut self, p: usize, rare: Rare) {
        if rare == Rare::default() {
            self.rare.remove(&(p as u32));
        } else {
            self.rare.insert(p as u32, rare);
        }
    }

    /// Adds a machine it does not hold yet, or replaces the record it holds.
    /// Returns the previous state when it replaced one.
    pub fn upsert(&mut self, machine: Machine, now_unix_nanos: i64) -> Option<MachineState> {
        let pos = self.position(&machine.id);
        self.upsert_at(pos, machine, now_unix_nanos)
    }

    /// [`Inventory::upsert`] when the caller already knows the position
    /// (`None` for a machine not held yet).
    pub fn upsert_at(
        &mut self,
        pos: Option<usize>,
        machine: Machine,
        now_unix_nanos: i64,
    ) -> Option<MachineState> {
        debug_assert_eq!(pos, self.position(&machine.id));
        match pos {
            Some(p) => {
                let (rec, rare, same_hardware) = self.compact(&machine, Some(p));
                let before = self.recs[p].state;
                self.account(p, -1);
                self.recs[p] = rec;
                self.set_rare(p, rare);
                let idle = restamp(
                    before,
                    machine.state,
                    self.fleet.idle_since_at_slot(p as u32),
                    now_unix_nanos,
                );
                self.account(p, 1);
                self.fleet
                    .replace_at_slot(p as u32, &machine, idle, same_hardware);
                Some(before)
            }
            None => {
                self.insert(machine, now_unix_nanos);
                None
            }
        }
    }

    /// Adds a machine it does not hold yet; returns its position.
    pub fn insert(&mut self, machine: Machine, now_unix_nanos: i64) -> usize {
        debug_assert!(!self.contains(&machine.id));
        let (rec, rare, _) = self.compact(&machine, None);
        let idle = (machine.state == MachineState::Idle).then_some(now_unix_nanos);
        let p = self.fleet.upsert_with_idle_since(&machine, idle) as usize;
        if p == self.recs.len() {
            self.recs.push(rec);
            self.seen.push(0);
        } else {
            self.recs[p] = rec;
            self.seen[p] = 0;
        }
        self.set_rare(p, rare);
        self.account(p, 1);
        p
    }

    /// Mutates one machine (a materialised copy, stored back), keeping every
    /// index right. Returns the closure's result, or `None` when unknown.
    pub fn update<R>(
        &mut self,
        id: &str,
        now_unix_nanos: i64,
        f: impl FnOnce(&mut Machine) -> R,
    ) -> Option<R> {
        let p = self.position(id)?;
        let mut m = self.materialize(p);
        let r = f(&mut m);
        debug_assert_eq!(m.id, id, "update must not change the id");
        self.upsert_at(Some(p), m, now_unix_nanos);
        Some(r)
    }

    /// Marks the machine at `pos` as listed in reconcile generation `generation`.
    pub fn mark_seen(&mut self, pos: usize, generation: u32) {
        self.seen[pos] = generation;
    }

    /// The removal walk: drops every machine not seen in `generation` for
    /// which `keep` is false. Returns the removed records.
    pub fn remove_unseen(&mut self, generation: u32, keep: impl Fn(&str) -> bool) -> Vec<Machine> {
        let mut removed = Vec::new();
        for p in 0..self.recs.len() {
            if self.seen[p] != generation && self.id_at(p).is_some_and(|id| !keep(id)) {
                removed.push(self.remove_at(p));
            }
        }
        removed
    }

    /// Ids of machines not seen in listing `generation` for which `keep` is false (the
    /// candidates a full List would remove).
    pub fn unseen_ids(&self, generation: u32, keep: impl Fn(&str) -> bool) -> Vec<String> {
        (0..self.recs.len())
            .filter(|&p| self.seen[p] != generation)
            .filter_map(|p| self.id_at(p))
            .filter(|id| !keep(id))
            .map(str::to_owned)
            .collect()
    }

    /// Removes machines by id (unknown ids are ignored).
    pub fn remove(&mut self, ids: &[&str]) -> Vec<Machine> {
        ids.iter()
            .filter_map(|id| self.position(id).map(|p| self.remove_at(p)))
            .collect()
    }

    fn remove_at(&mut self, p: usize) -> Machine {
        let m = self.materialize(p);
        self.account(p, -1);
        self.fleet.remove(&m.id);
        self.recs[p] = Rec::vacant();
        self.rare.remove(&(p as u32));
        self.seen[p] = 0;
        m
    }

    /// A record's effective allocatable, as a table id: its allocatable, or its
    /// profile's resources when the provider reported none (as
    /// `Machine::effective_allocatable`).
    fn shape(&self, r: &Rec) -> Shape {
        if self.allocs.items[r.alloc as usize].is_empty() {
            Shape::Resources(r.profile)
        } else {
            Shape::Allocatable(r.alloc)
        }
    }

    /// Adds (`sign = 1`) or removes (`-1`) machine `p`'s contribution to the counters.
    fn account(&mut self, p: usize, sign: i64) {
        let r = &self.recs[p];
        let cell = (
            r.state,
            bucket_for_dollars(r.assigned_interruption_penalty),
            r.profile,
        );
        bump(&mut self.cells, cell, sign);
        if r.state == MachineState::Idle {
            let prices = self.idle_prices.entry(r.profile).or_default();
            bump(prices, r.price.max(0.0).to_bits(), sign);
            if prices.is_empty() {
                self.idle_prices.remove(&r.profile);
            }
        }
        if r.state == MachineState::Configured {
            bump(&mut self.configured_by_cluster, r.cluster, sign);
        }
        if matches!(r.state, MachineState::Configured | MachineState::Draining) {
            let shape = self.shape(r);
            let shapes = self.bound_shapes.entry(r.cluster).or_default();
            bump(shapes, (r.state, shape), sign);
            if shapes.is_empty() {
                self.bound_shapes.remove(&r.cluster);
            }
        }
    }

    /// Per-bucket counts (state, capacity type, interruption bucket, type, zone).
    pub fn buckets(&self) -> Vec<(BucketKey, u64)> {
        let mut out: FxHashMap<BucketKey, u64> = FxHashMap::default();
        for (&(state, ipb, profile), &n) in &self.cells {
            let p = &self.profiles.items[profile as usize];
            *out.entry(BucketKey {
                state,
                capacity_type: p.capacity_type,
                interruption_bucket: ipb,
                instance_type: p.instance_type.clone(),
                zone: p.zone.clone(),
            })
            .or_default() += n;
        }
        out.into_iter().collect()
    }

    /// Configured machines bound to `cluster` (the reclaim cap's C).
    pub fn configured_in(&self, cluster: &str) -> u64 {
        self.syms
            .get(cluster)
            .and_then(|c| self.configured_by_cluster.get(&c))
            .copied()
            .unwrap_or(0)
    }

    /// Draining machines bound to `cluster` (reclaims in flight, for the reclaim budget).
    pub fn draining_in(&self, cluster: &str) -> u64 {
        self.syms
            .get(cluster)
            .and_then(|c| self.bound_shapes.get(&c))
            .map_or(0, |shapes| {
                shapes
                    .iter()
                    .filter(|((state, _), _)| *state == MachineState::Draining)
                    .map(|(_, n)| *n)
                    .sum()
            })
    }

    /// (cluster, allocatable, count) over every cluster's Configured machines,
    /// grouped by allocatable shape (what the quarantine's baseline reads).
    pub fn configured_shapes(&self) -> impl Iterator<Item = (&str, &ResourceVector, u64)> + '_ {
        self.bound_shapes.iter().flat_map(move |(&c, shapes)| {
            shapes
                .iter()
                .filter(|((state, _), _)| *state == MachineState::Configured)
                .map(move |(&(_, shape), &n)| {
                    let alloc = match shape {
                        Shape::Allocatable(a) => &self.allocs.items[a as usize],
                        Shape::Resources(p) => &self.profiles.items[p as usize].resources,
                    };
                    (self.syms.resolve(c), alloc, n)
                })
        })
    }

    /// Machines in `state`.
    pub fn count_state(&self, state: MachineState) -> u64 {
        self.cells
            .iter()
            .filter(|(k, _)| k.0 == state)
            .map(|(_, v)| *v)
            .sum()
    }

    pub fn summary(&self) -> InventorySummary {
        let mut s = InventorySummary::default();
        for (&(state, _, profile), &n) in &self.cells {
            s.add(state, &self.profiles.items[profile as usize], n);
        }
        s
    }

    /// [`Self::summary`] over the machines `owned` lets this shard act on: what its
    /// reports advertise to the coordinator's rebalancer. Counting a shared
    /// provider's foreign machines would make every shard advertise the same free
    /// supply, and the rebalancer pick donors that own nothing.
    ///
    /// It runs on every report, under the inventory's read lock, so it never walks
    /// the machines: the domain half of `Ownership::owns` is decided once per
    /// interned profile over the aggregated cells, then only the (few) transferred
    /// machines are looked up by id.
    pub fn summary_owned(&self, owned: &bigfleet_decision::Ownership) -> InventorySummary {
        if owned.is_everything() {
            return self.summary();
        }
        let in_domain: Vec<bool> = self
            .profiles
            .items
            .iter()
            .map(|p| {
                owned.domains.is_empty()
                    || owned
                        .domains
                        .iter()
                        .any(|(k, v)| p.attribute(k) == Some(v.as_str()))
            })
            .collect();
        let mut s = InventorySummary::default();
        for (&(state, _, profile), &n) in &self.cells {
            if in_domain[profile as usize] {
                s.add(state, &self.profiles.items[profile as usize], n);
            }
        }
        // A release wins over the domain and over an adoption.
        for id in &owned.released {
            if let Some(pos) = self.position(id) {
                let r = &self.recs[pos];
                if in_domain[r.profile as usize] {
                    s.remove(r.state, &self.profiles.items[r.profile as usize]);
                }
            }
        }
        for id in owned.adopted.difference(&owned.released) {
            if let Some(pos) = self.position(id) {
                let r = &self.recs[pos];
                if !in_domain[r.profile as usize] {
                    s.add(r.state, &self.profiles.items[r.profile as usize], 1);
                }
            }
        }
        s
    }

    /// Idle and Speculative machines whose instance type is one of `types`
    /// (every type when `None`), and the cheapest such Idle price.
    pub fn free_supply(&self, types: Option<&[String]>) -> FreeSupply {
        let wanted = |profile: u32| {
            let t = &self.profiles.items[profile as usize].instance_type;
            types.is_none_or(|ts| ts.iter().any(|x| x == t))
        };
        let mut out = FreeSupply::default();
        for (&(state, _, profile), &n) in &self.cells {
            match state {
                MachineState::Idle if wanted(profile) => out.idle += n,
                MachineState::Speculative if wanted(profile) => out.speculative += n,
                _ => {}
            }
        }
        for (&profile, prices) in &self.idle_prices {
            if !wanted(profile) {
                continue;
            }
            if let Some((&bits, _)) = prices.iter().next() {
                let p = f64::from_bits(bits);
                out.cheapest_idle_price =
                    Some(out.cheapest_idle_price.map_or(p, |c: f64| c.min(p)));
            }
        }
        out
    }

    /// Machines bound to `cluster` (resync after a session opens).
    pub fn bound_to(&self, cluster: &str) -> Vec<Machine> {
        let Some(c) = self.syms.get(cluster).filter(|&c| c != EMPTY) else {
            return Vec::new();
        };
        self.live()
            .filter(|&p| self.recs[p].cluster == c)
            .map(|p| self.materialize(p))
            .collect()
    }
}

/// Idle-since: stamped on entry into Idle, kept while Idle, cleared otherwise.
fn restamp(before: MachineState, after: MachineState, was: Option<i64>, now: i64) -> Option<i64> {
    match (before == MachineState::Idle, after == MachineState::Idle) {
        (_, false) => None,
        (false, true) => Some(now),
        (true, true) => Some(was.unwrap_or(now)),
    }
}

fn bump<K: Eq + Hash>(map: &mut impl CountMap<K>, key: K, sign: i64) {
    map.bump(key, sign);
}

/// The map types the counters live in.
trait CountMap<K> {
    fn bump(&mut self, key: K, sign: i64);
}

impl<K: Eq + Hash> CountMap<K> for FxHashMap<K, u64> {
    fn bump(&mut self, key: K, sign: i64) {
        if sign > 0 {
            *self.entry(key).or_default() += sign as u64;
        } else if let Some(v) = self.get_mut(&key) {
            *v = v.saturating_sub(sign.unsigned_abs());
            if *v == 0 {
                self.remove(&key);
            }
        }
    }
}

impl<K: Ord> CountMap<K> for BTreeMap<K, u64> {
    fn bump(&mut self, key: K, sign: i64) {
        if sign > 0 {
            *self.entry(key).or_default() += sign as u64;
        } else if let Some(v) = self.get_mut(&key) {
            *v = v.saturating_sub(sign.unsigned_abs());
            if *v == 0 {
                self.remove(&key);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn machine(id: &str, state: MachineState) -> Machine {
        let mut m = Machine {
            id: id.into(),
            state,
            price_per_hour: 1.0,
            ..Machine::default()
        };
        m.profile.instance_type = "m5".into();
        m.profile.zone = "z1".into();
        m.profile.capacity_type = CapacityType::OnDemand;
        if !matches!(state, MachineState::Speculative | MachineState::Creating) {
            m.host = Host {
                provider: "fake".into(),
                reference: id.into(),
            };
        }
        if matches!(state, MachineState::Configured | MachineState::Draining) {
            m.cluster = "c1".into();
        }
        if state == MachineState::Failed {
            m.last_error = "x".into();
        }
        m
    }

    /// Recomputes every counter from scratch and compares; checks the index.
    fn check_counters(inv: &Inventory) {
        let mut fresh = Inventory::new();
        let all: Vec<(usize, Machine)> = inv.live().map(|p| (p, inv.materialize(p))).collect();
        for (_, m) in &all {
            fresh.upsert(m.clone(), 0);
        }
        let norm = |i: &Inventory| {
            let mut b = i.buckets();
            b.sort_by(|a, b| format!("{:?}", a.0).cmp(&format!("{:?}", b.0)));
            b
        };
        assert_eq!(norm(inv), norm(&fresh));
        assert_eq!(inv.summary(), fresh.summary());
        assert_eq!(inv.free_supply(None), fresh.free_supply(None));
        assert_eq!(all.len(), inv.len());
        for (p, m) in &all {
            assert_eq!(inv.position(&m.id), Some(*p));
            assert_eq!(inv.id_at(*p), Some(m.id.as_str()));
            assert_eq!(
                inv.configured_in(&m.cluster),
                fresh.configured_in(&m.cluster)
            );
            assert_eq!(inv.draining_in(&m.cluster), fresh.draining_in(&m.cluster));
        }
        let shapes = |i: &Inventory| {
            let mut v: Vec<(String, ResourceVector, u64)> = i
                .configured_shapes()
                .map(|(c, a, n)| (c.to_owned(), a.clone(), n))
                .collect();
            v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
            v
        };
        assert_eq!(shapes(inv), shapes(&fresh));
        // Free slots hold vacant records, counted nowhere.
        for p in (0..inv.recs.len()).filter(|&p| inv.id_at(p).is_none()) {
            assert_eq!(inv.recs[p].state, MachineState::Unspecified);
            assert_eq!(inv.recs[p].cluster, EMPTY);
            assert!(!inv.rare.contains_key(&(p as u32)));
        }
    }

    #[test]
    fn the_per_machine_record_stays_small() {
        // 500K machines × this is most of decide's memory (issue 4: ≤ 300 MB
        // with 50K needs); rare fields live beside the records.
        assert!(
            std::mem::size_of::<Rec>() <= 80,
            "{}",
            std::mem::size_of::<Rec>()
        );
    }

    #[test]
    fn records_round_trip_exactly() {
        let mut m = machine("a", MachineState::Configured);
        m.host.reference = "i-123".into();
        m.assigned_priority = 7;
        m.assigned_interruption_penalty_dollars = f64::INFINITY;
        m.assigned_need_fingerprint = "fp".into();
        m.assigned_group = "g\0x".into();
        m.profile.labels.insert("rack".into(), "r1".into());
        m.allocatable = ResourceVector::from_milli([("cpu", 3_500)]);
        m.shard_metadata = m.encode_shard_metadata();
        // Not reproducible from the assigned fields: kept verbatim.
        m.shard_metadata
            .insert(META_ASSIGNED_PRIORITY.into(), "007".into());
        m.shard_metadata.insert("x/opaque".into(), "\tv".into());
        let mut inv = Inventory::new();
        inv.upsert(m.clone(), 0);
        assert_eq!(inv.get("a").unwrap(), m);
        let mut f = machine("f", MachineState::Failed);
        f.host = Host::default();
        inv.upsert(f.clone(), 0);
        assert_eq!(inv.get("f").unwrap(), f);
    }

    #[test]
    fn upsert_update_remove_keep_counters() {
        let mut inv = Inventory::new();
        inv.upsert(machine("b", MachineState::Idle), 10);
        inv.upsert(machine("a", MachineState::Configured), 10);
        inv.upsert(machine("c", MachineState::Speculative), 10);
        assert_eq!(inv.idle_since_of("b"), Some(10));
        assert_eq!(inv.configured_in("c1"), 1);
        check_counters(&inv);

        inv.update("b", 20, |m| {
            m.state = MachineState::Configuring;
            m.cluster = "c1".into();
        });
        assert_eq!(inv.idle_since_of("b"), None);
        inv.update("b", 30, |m| m.state = MachineState::Configured);
        assert_eq!(inv.configured_in("c1"), 2);
        check_counters(&inv);

        inv.update("a", 40, |m| {
            m.state = MachineState::Idle;
            m.cluster.clear();
        });
        assert_eq!(inv.idle_since_of("a"), Some(40));
        // Staying Idle keeps the original stamp.
        inv.update("a", 50, |m| m.price_per_hour = 0.5);
        assert_eq!(inv.idle_since_of("a"), Some(40));
        assert_eq!(inv.free_supply(None).cheapest_idle_price, Some(0.5));
        check_counters(&inv);

        let removed = inv.remove(&["a", "zzz"]);
        assert_eq!(removed.len(), 1);
        assert_eq!(inv.len(), 2);
        assert!(inv.get("a").is_none());
        check_counters(&inv);
    }

    #[test]
    fn free_supply_filters_by_pinned_types() {
        let mut inv = Inventory::new();
        let mut big = machine("g1", MachineState::Idle);
        big.profile.instance_type = "p4".into();
        big.price_per_hour = 30.0;
        inv.upsert(big, 0);
        inv.upsert(machine("m1", MachineState::Idle), 0);
        inv.upsert(machine("m2", MachineState::Speculative), 0);
        let all = inv.free_supply(None);
        assert_eq!((all.idle, all.speculative), (2, 1));
        assert_eq!(all.cheapest_idle_price, Some(1.0));
        let p4 = inv.free_supply(Some(&["p4".to_owned()]));
        assert_eq!((p4.idle, p4.speculative), (1, 0));
        assert_eq!(p4.cheapest_idle_price, Some(30.0));
        let none = inv.free_supply(Some(&["x".to_owned()]));
        assert_eq!(none, FreeSupply::default());
    }

    #[test]
    fn removal_walk_spares_seen_and_kept() {
        let mut inv = Inventory::new();
        for id in ["a", "b", "c", "d", "e"] {
            inv.upsert(machine(id, MachineState::Idle), 0);
        }
        for id in ["a", "c"] {
            let p = inv.position(id).unwrap();
            inv.mark_seen(p, 7);
        }
        let mut removed: Vec<String> = inv
            .remove_unseen(7, |id| id == "d")
            .into_iter()
            .map(|m| m.id)
            .collect();
        removed.sort();
        assert_eq!(removed, ["b", "e"]);
        let mut left: Vec<&str> = inv.ids().collect();
        left.sort_unstable();
        assert_eq!(left, ["a", "c", "d"]);
        check_counters(&inv);
    }

    /// An inventory of `machine`s, each in the zone given with it.
    fn zoned(machines: &[(&str, MachineState, &str)]) -> Inventory {
        let mut inv = Inventory::new();
        for &(id, state, zone) in machines {
            let mut m = machine(id, state);
            m.profile.zone = zone.into();
            inv.upsert(m, 0);
        }
        inv
    }

    #[test]
    fn summary_counts_free_and_dimensions() {
        let inv = zoned(&[
            ("a", MachineState::Idle, "z1"),
            ("b", MachineState::Speculative, "z1"),
            ("c", MachineState::Configured, "z2"),
        ]);
        let s = inv.summary();
        assert_eq!((s.total, s.free), (3, 2));
        assert_eq!(s.by_zone["z1"], 2);
        assert_eq!(s.by_zone["z2"], 1);
        assert_eq!(s.by_instance_type["m5"], 3);
        assert_eq!(inv.bound_to("c1").len(), 1);
        assert!(inv.bound_to("").is_empty());
    }

    #[test]
    fn owned_summary_counts_only_what_the_shard_may_act_on() {
        let inv = zoned(&[
            ("a", MachineState::Idle, "z1"),
            ("b", MachineState::Idle, "z1"),
            ("c", MachineState::Idle, "z2"),
            ("d", MachineState::Configured, "z2"),
        ]);
        let everything = bigfleet_decision::Ownership::default();
        assert_eq!(inv.summary_owned(&everything), inv.summary());
        let mut owned = bigfleet_decision::Ownership::default();
        owned.domains.insert((
            bigfleet_model::requirement::ZONE_KEY.to_owned(),
            "z1".to_owned(),
        ));
        owned.released.insert("b".to_owned());
        owned.adopted.insert("d".to_owned());
        let s = inv.summary_owned(&owned);
        // a (z1), d (adopted); not b (released) nor c (z2).
        assert_eq!((s.total, s.free), (2, 1));
        assert_eq!(s.by_zone["z1"], 1);
        assert_eq!(s.by_zone["z2"], 1);
        assert_eq!(s.by_state[&MachineState::Configured], 1);
    }

    proptest! {
        /// The precomputed summary agrees with `Ownership::owns` machine by machine.
        #[test]
        fn owned_summary_matches_owns(
            zones in proptest::collection::vec((0u8..3, 0usize..3), 1..30),
            domains in proptest::collection::btree_set(0u8..3, 0..3),
            released in proptest::collection::btree_set(0usize..30, 0..5),
            adopted in proptest::collection::btree_set(0usize..30, 0..5),
        ) {
            let mut inv = Inventory::new();
            let mut all = Vec::new();
            let states = [MachineState::Idle, MachineState::Configured, MachineState::Speculative];
            for (i, (z, st)) in zones.iter().enumerate() {
                let mut m = machine(&format!("m{i}"), states[*st]);
                m.profile.zone = format!("z{z}");
                all.push(m.clone());
                inv.upsert(m, 0);
            }
            let mut owned = bigfleet_decision::Ownership::default();
            for z in &domains {
                owned.domains.insert((
                    bigfleet_model::requirement::ZONE_KEY.to_owned(),
                    format!("z{z}"),
                ));
            }
            owned.released = released.iter().map(|i| format!("m{i}")).collect();
            owned.adopted = adopted.iter().map(|i| format!("m{i}")).collect();
            let mut recount = Inventory::new();
            for m in all.iter().filter(|m| owned.owns(&m.id, &m.profile)) {
                recount.upsert(m.clone(), 0);
            }
            prop_assert_eq!(inv.summary_owned(&owned), recount.summary());
        }

        #[test]
        fn counters_match_recount_after_any_ops(ops in proptest::collection::vec((0u8..6, 0u8..20, 0u8..9), 1..80)) {
            let mut inv = Inventory::new();
            for (op, id, st) in ops {
                let id = format!("m{id}");
                let state = MachineState::from_ordinal(i32::from(st.max(1))).unwrap();
                match op {
                    0..=2 => { inv.upsert(machine(&id, state), 1); }
                    3 => { inv.update(&id, 2, |m| { m.state = state; m.price_per_hour = f64::from(st); }); }
                    4 => { inv.remove(&[id.as_str()]); }
                    _ => {
                        let generation = u32::from(st) + 1;
                        for p in 0..inv.len() / 2 { inv.mark_seen(p, generation); }
                        inv.remove_unseen(generation, |_| false);
                    }
                }
                check_counters(&inv);
            }
        }
    }
}
