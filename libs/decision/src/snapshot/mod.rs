//! The per-cycle inventory snapshot.
//!
//! Gathered from the [`Fleet`]'s fixed-size records in machine id order (one
//! pass, no string reads) plus sorts of `u32` index permutations. Machines are
//! addressed by *rank* = position in id order, so every "ties end on ascending
//! machine id" rule is an integer comparison.
//!
//! Matching is memoised by *shape*: the tuple (instance type, value of every
//! attribute key the demand mentions). Machines with equal shapes match the
//! same profiles, so a profile is evaluated once per shape, not per machine.
//!
//! Machines are also grouped by (state, cluster, shape, capacity): every member
//! of a group matches the same profiles and covers the same minimum units,
//! which turns per-machine scans in crediting and Same-domain scoring into
//! per-group arithmetic.

use crate::context::Parallelism;
use crate::fleet::{Change, Fleet};
use crate::intern::NONE;
use crate::qty::{Dims, Qty};
use crate::scoring::ReleasePolicy;
use bigfleet_model::CapacityType;
use bigfleet_model::{ClusterId, MachineId, MachineState, ResourceVector};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock};

/// The hot record of one machine, borrowed from the fleet (indexed by handle).
pub(crate) use crate::fleet::MachineRecord as Rec;

mod base;
mod grouping;
mod patch;
use patch::{ORPHAN_SLACK, Olds, bound_key, splice};
#[cfg(test)]
mod tests;

/// Attribute tuple shared by machines that match exactly the same profiles.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    /// The instance-type field (value symbol; `NONE` when empty).
    pub itype: u32,
}

/// Machines with equal (state, cluster, shape, capacity), in walk order
/// (keep order for bound states, id order otherwise).
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub state: MachineState,
    pub shape: u32,
    pub alloc: u32,
    pub members: Vec<u32>,
}

/// The bound states, in crediting order (index = slot in [`ClusterView::bound`]).
pub(crate) const BOUND_STATES: [MachineState; 2] =
    [MachineState::Configured, MachineState::Configuring];

/// The demand-key-dependent half of a snapshot: machine shapes and the
/// (state, cluster, shape, capacity) groups with the per-cluster bound lists.
/// It depends on the fleet and on which attribute keys the demand mentions
/// (and on whether free groups and the own-machine index are wanted), so the
/// fleet's [`Base`] keeps the last one built and a cycle whose demand asks the
/// same reuses it instead of walking every bound machine again.
#[derive(Debug)]
pub(crate) struct Grouping {
    /// What this grouping was built for: the demand's attribute keys, free groups, own index.
    key: (Vec<Box<str>>, bool, bool),
    /// Shape of each fleet machine profile.
    shape_of_profile: Vec<u32>,
    pub shapes: Vec<Shape>,
    /// Flat `shapes.len() × keys.len()` attribute values (`NONE` = absent).
    shape_attrs: Vec<u32>,
    /// Per handle: group (`NONE` for machines in no group).
    group: Vec<u32>,
    pub groups: Vec<Group>,
    /// Idle and Speculative groups.
    pub free_groups: Vec<u32>,
    /// Per fleet cluster: groups of Configured then Configuring machines.
    cluster_groups: Vec<Vec<u32>>,
    /// (cluster, stamped fingerprint, stamped group) of bound machines → ranks
    /// in (Configured, Configuring) keep order. Built only for Same demand.
    pub own_index: FxHashMap<(u32, u32, u32), Vec<u32>>,
    /// Groups emptied by patches (kept so group numbers stay valid).
    orphans: usize,
}

/// The immutable inventory snapshot of one cycle, gathered from a [`Fleet`].
pub struct Snapshot<'a> {
    pub(crate) fleet: &'a Fleet,
    /// The fleet's cached demand-independent lists (see [`Base`]).
    base: &'a Base,
    /// Machine records by handle (fleet slot; dead slots included).
    pub(crate) recs: &'a [Rec],
    /// Shapes and groups (shared with the fleet's cache; see [`Grouping`]).
    pub(crate) grouping: Arc<Grouping>,
    live: usize,
    /// Clusters the demand names that no machine is bound to (ids after the fleet's).
    extra_clusters: Vec<&'a str>,
    extra_cluster_ids: FxHashMap<&'a str, u32>,
    /// The cluster id of each `BuildSpec::demand_clusters` entry, in order.
    pub(crate) demand_cluster_ids: Vec<u32>,
    /// Attribute keys the demand mentions; index = slot in shape attribute tuples.
    pub(crate) keys: Vec<&'a str>,
    pub(crate) dims: Dims<'a>,
    /// Flat `allocs × dims` dense capacities (indexed by fleet alloc symbol).
    pub(crate) alloc_dense: Vec<i64>,
    /// Which of the base's sorted Idle buckets this cycle read (memory report).
    type_sorted_used: Vec<AtomicBool>,
    idle_sorted_used: AtomicBool,
    /// Speculative machines are listed lazily (see [`Self::state_list`]).
    lazy_spec: bool,
    pub(crate) min_prio: [i32; 9],
    /// Per cluster (the fleet's, then the demand's extra ones): in-flight
    /// Creating machines provisioned for it, keep order.
    creating: Vec<Vec<u32>>,
}

/// Speculative machines in id order, all and per instance type, with their
/// minimum assigned priorities.
#[derive(Debug, Default, Clone)]
struct SpecLists {
    all: Vec<u32>,
    min_prio: i32,
    by_type: FxHashMap<u32, (Vec<u32>, i32)>,
}

/// The part of a snapshot that depends on the fleet alone: per-state
/// and (state, instance type) lists in id order with their minimum assigned
/// priorities, per-cluster bound machines in keep order, ranks and keep
/// positions, the price-sorted Idle buckets, and the earliest idle-since stamp
/// per capacity type. The fleet keeps it until its next mutation, so a cycle
/// over an unchanged fleet skips the inventory pass and every sort.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    /// Speculative is left empty here: most of a cloud fleet, read only by
    /// some acquisition pools, so it is listed on first use (`spec`).
    by_state: [Vec<u32>; 9],
    min_prio: [i32; 9],
    /// (state ordinal, instance type) → index into `type_lists` (Idle and
    /// Configured only; Speculative lives in `spec`).
    type_index: FxHashMap<(u8, u32), u32>,
    type_lists: Vec<Vec<u32>>,
    type_min_prio: Vec<i32>,
    type_sorted: Vec<OnceLock<Vec<u32>>>,
    idle_sorted: OnceLock<Vec<u32>>,
    spec: OnceLock<SpecLists>,
    /// Per fleet cluster: Configured and Configuring machines in keep order
    /// (sorted from inline-key entries, kept as bare handles: this lives as
    /// long as the fleet version).
    bound: Vec<[Vec<u32>; 2]>,
    /// Per handle: rank in machine id order (empty when slot == rank) and
    /// position in the (cluster, state) keep order.
    rank: Vec<u32>,
    kpos: Vec<u32>,
    /// Earliest idle-since stamp of stamped Idle machines, by capacity type
    /// ordinal (`i64::MAX` = none).
    idle_min: [i64; 5],
    fleet_bytes: usize,
    /// The last grouping built over this fleet version.
    grouping: GroupingCache,
}

/// The fleet's one-entry [`Grouping`] cache (cloning a fleet shares it).
#[derive(Debug, Default)]
struct GroupingCache(Mutex<Option<Arc<Grouping>>>);

impl Clone for GroupingCache {
    fn clone(&self) -> Self {
        GroupingCache(Mutex::new(self.get()))
    }
}

impl GroupingCache {
    fn get(&self) -> Option<Arc<Grouping>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn take(&self) -> Option<Arc<Grouping>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn put(&self, g: Arc<Grouping>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
    }
}

const CAPACITY_TYPES: [CapacityType; 5] = [
    CapacityType::Unspecified,
    CapacityType::BareMetal,
    CapacityType::Reserved,
    CapacityType::OnDemand,
    CapacityType::Spot,
];

impl<'a> Snapshot<'a> {
    pub(crate) fn build(fleet: &'a Fleet, spec: BuildSpec<'a>) -> Snapshot<'a> {
        let base: &'a Base = fleet.base.get_or_init(|| match fleet.stale.take() {
            Some((mut base, changes)) => {
                base.patch(fleet, changes);
                base
            }
            None => Box::new(Base::build(fleet, &spec.par)),
        });
        let n = fleet.len();
        let nfc = fleet.clusters.len() as u32;
        let mut extra_clusters: Vec<&'a str> = Vec::new();
        let mut extra_cluster_ids: FxHashMap<&'a str, u32> = FxHashMap::default();
        let mut cluster_id = |name: &'a str| -> u32 {
            if let Some(c) = fleet.clusters.get(name) {
                return c;
            }
            *extra_cluster_ids.entry(name).or_insert_with(|| {
                extra_clusters.push(name);
                nfc + extra_clusters.len() as u32 - 1
            })
        };
        // Rows of one cluster often sit together (same priority and arrival): comparing
        // with the previous name is cheaper than hashing it again.
        let mut demand_cluster_ids = Vec::with_capacity(spec.demand_clusters.len());
        let mut last: Option<(&str, u32)> = None;
        for &c in &spec.demand_clusters {
            let id = match last {
                Some((name, id)) if name == c => id,
                _ => cluster_id(c),
            };
            last = Some((c, id));
            demand_cluster_ids.push(id);
        }

        let recs: &'a [Rec] = &fleet.recs;
        let key: (Vec<Box<str>>, bool, bool) = (
            spec.keys.iter().map(|k| Box::from(*k)).collect(),
            spec.free_groups,
            spec.own_index,
        );
        let g = match base.grouping.get().filter(|g| g.key == key) {
            Some(g) => g,
            None => {
                let g = Arc::new(Grouping::build(fleet, base, &spec.keys, key));
                base.grouping.put(g.clone());
                g
            }
        };

        // Dimensions and dense capacities, per fleet capacity symbol.
        let dims = Dims::collect_with(
            fleet
                .allocs
                .iter()
                .chain(spec.demand_vectors.iter().copied()),
            spec.demand_names.iter().map(String::as_str),
        );
        let mut alloc_dense = Vec::with_capacity(fleet.allocs.len() * dims.len());
        for a in &fleet.allocs {
            alloc_dense.extend_from_slice(&dims.dense_capacity(a));
        }

        // In-flight Creating machines take their destination cluster (ADR-0022),
        // in id order.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        if let Some(dest) = spec.destinations.filter(|d| !d.is_empty()) {
            for &h in &base.by_state[MachineState::Creating as usize] {
                if let Some(c) = dest.get(&*fleet.ids[h as usize])
                    && !c.is_empty()
                {
                    pairs.push((cluster_id(c), h));
                }
            }
        }
        let n_clusters = nfc as usize + extra_clusters.len();
        let mut creating: Vec<Vec<u32>> = vec![Vec::new(); n_clusters];
        for (c, h) in pairs {
            creating[c as usize].push(h);
        }
        for list in &mut creating {
            list.sort_by(|a, b| {
                keep_cmp(
                    &recs[*a as usize],
                    base.rank(*a),
                    &recs[*b as usize],
                    base.rank(*b),
                )
            });
        }
        // Speculative slots are most of a cloud fleet and only acquisition
        // pools of short needs read them: list them on first use instead,
        // unless Same scoring or verdicts need their groups now.
        let lazy_spec = !spec.free_groups;
        let mut min_prio = base.min_prio;
        if !lazy_spec {
            min_prio[MachineState::Speculative as usize] = base.spec(fleet).min_prio;
        }

        Snapshot {
            fleet,
            base,
            recs,
            grouping: g,
            live: n,
            extra_clusters,
            extra_cluster_ids,
            demand_cluster_ids,
            keys: spec.keys,
            dims,
            alloc_dense,
            type_sorted_used: (0..base.type_lists.len())
                .map(|_| AtomicBool::new(false))
                .collect(),
            idle_sorted_used: AtomicBool::new(false),
            lazy_spec,
            min_prio,
            creating,
        }
    }

    /// Bound groups of a cluster (Configured, then Configuring); empty for a
    /// cluster no machine is bound to.
    pub(crate) fn cluster_groups(&self, c: u32) -> &[u32] {
        self.grouping
            .cluster_groups
            .get(c as usize)
            .map_or(&[], |v| v.as_slice())
    }

    /// Machines bound to a cluster in one of [`BOUND_STATES`] (by slot), keep order.
    pub(crate) fn bound(&self, c: u32, slot: usize) -> &[u32] {
        self.base
            .bound
            .get(c as usize)
            .map_or(&[], |v| v[slot].as_slice())
    }

    /// Clusters that may have bound machines (ids `0..n`).
    pub(crate) fn bound_clusters(&self) -> u32 {
        self.base.bound.len() as u32
    }

    /// In-flight Creating machines provisioned for a cluster, keep order.
    pub(crate) fn creating(&self, c: u32) -> &[u32] {
        self.creating.get(c as usize).map_or(&[], |v| v.as_slice())
    }

    /// Number of machines.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Size of per-handle arrays (live and dead fleet slots).
    pub(crate) fn slots(&self) -> usize {
        self.recs.len()
    }

    /// The machine id of a handle.
    #[inline]
    pub(crate) fn id(&self, h: u32) -> &'a str {
        &self.fleet.ids[h as usize]
    }

    #[inline]
    pub(crate) fn rec(&self, h: u32) -> &'a Rec {
        &self.recs[h as usize]
    }

    /// Shape of a machine.
    #[inline]
    pub(crate) fn shape(&self, h: u32) -> u32 {
        self.grouping.shape_of_profile[self.recs[h as usize].profile as usize]
    }

    /// Position in machine id order (the universal tie-break).
    #[inline]
    pub(crate) fn rank(&self, h: u32) -> u32 {
        self.base.rank(h)
    }

    /// Group of an Idle, Speculative, Configured or Configuring machine.
    #[inline]
    pub(crate) fn group_of(&self, h: u32) -> u32 {
        self.grouping.group[h as usize]
    }

    /// Position in the (cluster, state) keep order of a bound machine.
    #[inline]
    pub(crate) fn kpos(&self, h: u32) -> u32 {
        self.base.kpos[h as usize]
    }

    /// Dense capacity of an interned allocation.
    #[inline]
    pub(crate) fn alloc(&self, alloc: u32) -> &[i64] {
        let d = self.dims.len();
        &self.alloc_dense[alloc as usize * d..(alloc as usize + 1) * d]
    }

    /// Dense capacity of a machine.
    #[inline]
    pub(crate) fn cap(&self, h: u32) -> &[i64] {
        self.alloc(self.recs[h as usize].alloc)
    }

    /// Value of attribute slot `slot` for a shape (`NONE` when absent).
    #[inline]
    pub(crate) fn attr(&self, shape: u32, slot: usize) -> u32 {
        self.grouping.shape_attrs[shape as usize * self.keys.len() + slot]
    }

    pub(crate) fn attrs(&self, shape: u32) -> &[u32] {
        let k = self.keys.len();
        &self.grouping.shape_attrs[shape as usize * k..(shape as usize + 1) * k]
    }

    pub(crate) fn cluster_name(&self, c: u32) -> &'a str {
        let nfc = self.fleet.clusters.len() as u32;
        if c < nfc {
            self.fleet.clusters.resolve(c)
        } else {
            self.extra_clusters[(c - nfc) as usize]
        }
    }

    /// Cluster id of a name the fleet or the demand knows.
    pub(crate) fn cluster_id(&self, name: &str) -> Option<u32> {
        self.fleet
            .clusters
            .get(name)
            .or_else(|| self.extra_cluster_ids.get(name).copied())
    }

    pub(crate) fn value_name(&self, v: u32) -> &'a str {
        self.fleet.values.resolve(v)
    }

    pub(crate) fn value_id(&self, s: &str) -> Option<u32> {
        self.fleet.values.get(s)
    }

    pub(crate) fn dense(&self, v: &ResourceVector) -> Qty {
        self.dims.dense(v)
    }

    /// Machines of one state in id order.
    pub(crate) fn state_list(&self, state: MachineState) -> &'a [u32] {
        if state == MachineState::Speculative {
            return &self.base.spec(self.fleet).all;
        }
        &self.base.by_state[state as usize]
    }

    /// The (state, instance type) list in id order (empty when none).
    pub(crate) fn type_list(&self, state: MachineState, itype: u32) -> &'a [u32] {
        if state == MachineState::Speculative {
            return self
                .base
                .spec(self.fleet)
                .by_type
                .get(&itype)
                .map_or(&[], |e| e.0.as_slice());
        }
        match self.base.type_index.get(&(state as u8, itype)) {
            Some(&i) => &self.base.type_lists[i as usize],
            None => &[],
        }
    }

    /// Minimum assigned priority of (state, instance type); `i32::MAX` when
    /// empty (and for Speculative while it is listed lazily).
    pub(crate) fn type_min_prio(&self, state: MachineState, itype: u32) -> i32 {
        if state == MachineState::Speculative {
            if self.lazy_spec {
                return i32::MAX;
            }
            return self
                .base
                .spec(self.fleet)
                .by_type
                .get(&itype)
                .map_or(i32::MAX, |e| e.1);
        }
        match self.base.type_index.get(&(state as u8, itype)) {
            Some(&i) => self.base.type_min_prio[i as usize],
            None => i32::MAX,
        }
    }

    /// Idle machines of one instance type sorted by price asc, id asc (built
    /// once per fleet version).
    pub(crate) fn idle_type_sorted(&self, itype: u32) -> &'a [u32] {
        let base: &'a Base = self.base;
        match base.type_index.get(&(MachineState::Idle as u8, itype)) {
            Some(&i) => {
                self.type_sorted_used[i as usize].store(true, AtomicOrdering::Relaxed);
                base.type_sorted[i as usize].get_or_init(|| {
                    let mut v = base.type_lists[i as usize].clone();
                    base.sort_price(self.recs, &mut v);
                    v
                })
            }
            None => &[],
        }
    }

    /// Every Idle machine sorted by price asc, id asc (built once per fleet version).
    pub(crate) fn idle_all_sorted(&self) -> &'a [u32] {
        let base: &'a Base = self.base;
        self.idle_sorted_used.store(true, AtomicOrdering::Relaxed);
        base.idle_sorted.get_or_init(|| {
            let mut v = base.by_state[MachineState::Idle as usize].clone();
            base.sort_price(self.recs, &mut v);
            v
        })
    }

    pub(crate) fn sort_price(&self, v: &mut [u32]) {
        self.base.sort_price(self.recs, v);
    }

    /// Idle-since stamp of a machine.
    pub(crate) fn idle_since(&self, h: u32) -> Option<i64> {
        let t = self.fleet.idle[h as usize];
        (t != i64::MIN).then_some(t)
    }

    /// Whether some stamped Idle machine may have held past its capacity
    /// type's release hold at `now` (false lets Phase 3 skip the Idle scan).
    pub(crate) fn idle_release_due(&self, policy: &ReleasePolicy, now_unix_nanos: i64) -> bool {
        CAPACITY_TYPES.iter().any(|&c| {
            let since = self.base.idle_min[c as usize];
            since != i64::MAX
                && policy.hold(c).is_some_and(|hold| {
                    i128::from(now_unix_nanos) - i128::from(since) >= hold.as_nanos() as i128
                })
        })
    }

    /// Approximate heap bytes held by the snapshot (for the memory report):
    /// the lists this cycle reads, counted as if gathered for it alone.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let v32 = |v: &Vec<u32>| v.len() * size_of::<u32>();
        let base = self.base;
        let slots = self.recs.len();
        let mut b = base.fleet_bytes;
        let g = &self.grouping;
        b += (base.rank.len() + g.group.len() + slots) * 4;
        b += g.shapes.len() * size_of::<Shape>() + g.shape_attrs.len() * 4;
        b += self.alloc_dense.len() * 8;
        b += base.by_state.iter().map(v32).sum::<usize>();
        b += base.type_lists.iter().map(v32).sum::<usize>();
        let mut ntypes = base.type_lists.len();
        if !self.lazy_spec {
            let sl = base.spec(self.fleet);
            b += v32(&sl.all);
            b += sl.by_type.values().map(|e| v32(&e.0)).sum::<usize>();
            ntypes += sl.by_type.len();
        }
        b += ntypes * 16 + ntypes * 4;
        b += self
            .type_sorted_used
            .iter()
            .zip(&base.type_lists)
            .filter(|(u, _)| u.load(AtomicOrdering::Relaxed))
            .map(|(_, l)| v32(l))
            .sum::<usize>();
        if self.idle_sorted_used.load(AtomicOrdering::Relaxed) {
            b += v32(&base.by_state[MachineState::Idle as usize]);
        }
        for (lists, groups) in base.bound.iter().zip(&g.cluster_groups) {
            b += v32(&lists[0]) + v32(&lists[1]) + v32(groups);
        }
        b += self.creating.iter().map(v32).sum::<usize>();
        b += g.groups.iter().map(|g| v32(&g.members)).sum::<usize>();
        b += g.groups.len() * size_of::<Group>();
        b += g
            .own_index
            .values()
            .map(|v| v32(v) + size_of::<(u32, u32, u32, Vec<u32>)>())
            .sum::<usize>();
        b
    }
}

/// Everything about the demand the snapshot must know up front.
pub(crate) struct BuildSpec<'a> {
    pub keys: Vec<&'a str>,
    pub destinations: Option<&'a HashMap<MachineId, ClusterId>>,
    /// Need aggregates and min units (their dimensions must exist).
    pub demand_vectors: Vec<&'a ResourceVector>,
    /// Resource names the demand uses, when the caller keeps them (then
    /// `demand_vectors` may be empty).
    pub demand_names: &'a [String],
    /// Clusters the demand names.
    pub demand_clusters: Vec<&'a str>,
    /// Build the own-machine index (only Same needs use it).
    pub own_index: bool,
    /// Build groups of Idle/Speculative machines (Same demand or verdicts).
    pub free_groups: bool,
    pub par: Parallelism,
}

/// A bound machine with its keep-order keys inline, so the sort reads these
/// entries sequentially instead of chasing records.
#[derive(Debug, Clone, Copy)]
struct BoundEntry {
    h: u32,
    price: f64,
    rp: f64,
}

fn entry_cmp(a: &BoundEntry, b: &BoundEntry, rank_of: &impl Fn(u32) -> u32) -> Ordering {
    a.price
        .total_cmp(&b.price)
        .then(b.rp.total_cmp(&a.rp))
        .then(rank_of(a.h).cmp(&rank_of(b.h)))
}

/// Sorts bound entries that are in id order into keep order. A cluster's bound
/// machines carry few distinct (price, reclamation penalty) pairs, so a stable
/// bucket pass over those keys (O(n), id order kept inside each bucket) replaces
/// a comparison sort; many distinct keys fall back to sorting.
fn keep_sort(v: &mut Vec<BoundEntry>, rank_of: &impl Fn(u32) -> u32) {
    const MAX_KEYS: usize = 32;
    if v.len() < 64 {
        v.sort_by(|a, b| entry_cmp(a, b, rank_of));
        return;
    }
    let mut keys: SmallVec<[(f64, f64); MAX_KEYS]> = SmallVec::new();
    let mut slot_of: Vec<u8> = Vec::with_capacity(v.len());
    let mut last = usize::MAX;
    for e in v.iter() {
        let same =
            |x: &(f64, f64)| x.0.to_bits() == e.price.to_bits() && x.1.to_bits() == e.rp.to_bits();
        let i = if last != usize::MAX && same(&keys[last]) {
            last
        } else if let Some(i) = keys.iter().position(same) {
            i
        } else if keys.len() < MAX_KEYS {
            keys.push((e.price, e.rp));
            keys.len() - 1
        } else {
            v.sort_by(|a, b| entry_cmp(a, b, rank_of));
            return;
        };
        last = i;
        slot_of.push(i as u8);
    }
    if keys.len() == 1 {
        return;
    }
    let mut order: SmallVec<[usize; MAX_KEYS]> = (0..keys.len()).collect();
    order.sort_by(|a, b| {
        keys[*a]
            .0
            .total_cmp(&keys[*b].0)
            .then(keys[*b].1.total_cmp(&keys[*a].1))
    });
    let mut start = [0usize; MAX_KEYS];
    let mut counts = [0usize; MAX_KEYS];
    for &s in &slot_of {
        counts[s as usize] += 1;
    }
    let mut acc = 0;
    for &k in &order {
        start[k] = acc;
        acc += counts[k];
    }
    let mut out = v.clone();
    for (e, &s) in v.iter().zip(&slot_of) {
        out[start[s as usize]] = *e;
        start[s as usize] += 1;
    }
    *v = out;
}

/// Keep-priority order: price asc, assigned reclamation penalty desc, id asc.
#[inline]
pub(crate) fn keep_cmp(a: &Rec, ra: u32, b: &Rec, rb: u32) -> Ordering {
    a.price
        .total_cmp(&b.price)
        .then(
            b.assigned_reclamation_penalty
                .total_cmp(&a.assigned_reclamation_penalty),
        )
        .then(ra.cmp(&rb))
}
