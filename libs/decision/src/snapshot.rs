//! The per-cycle inventory snapshot (ref §10.1).
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

use crate::cycle::Par;
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
pub(crate) use crate::fleet::FRec as Rec;

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
    pub(crate) g: Arc<Grouping>,
    live: usize,
    /// Clusters the demand names that no machine is bound to (ids after the fleet's).
    extra_clusters: Vec<&'a str>,
    extra_cluster_ids: FxHashMap<&'a str, u32>,
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

impl Base {
    fn build(fleet: &Fleet, par: &Par) -> Base {
        let n = fleet.len();
        let nfc = fleet.clusters.len();
        let recs: &[Rec] = &fleet.recs;
        let slots = recs.len();
        let mut rank = Vec::new();
        if !fleet.identity {
            rank = vec![NONE; slots];
            for (k, &h) in fleet.order.iter().enumerate() {
                rank[h as usize] = k as u32;
            }
        }
        let rank_of = |h: u32| if rank.is_empty() { h } else { rank[h as usize] };

        // One pass over the machines in id order — in parallel chunks merged in
        // chunk order, so every list stays in id order — building per-state
        // lists, (state, instance type) lists with their minimum assigned
        // priority, and per-cluster bound lists. Speculative is skipped.
        let ntypes = fleet.values.len() + 1;
        const TYPE_STATES: [MachineState; 2] = [MachineState::Idle, MachineState::Configured];
        struct Part {
            by_state: [Vec<u32>; 9],
            min_prio: [i32; 9],
            /// Dense (type, state) key → index into `types`.
            type_slot: Vec<u32>,
            types: Vec<(usize, Vec<u32>, i32)>,
            bound: FxHashMap<u32, [Vec<BoundEntry>; 2]>,
            idle_min: [i64; 5],
        }
        let pass = |chunk: &[u32]| -> Part {
            let mut p = Part {
                by_state: Default::default(),
                min_prio: [i32::MAX; 9],
                type_slot: vec![NONE; ntypes * 2],
                types: Vec::new(),
                bound: FxHashMap::default(),
                idle_min: [i64::MAX; 5],
            };
            for &h in chunk {
                if fleet.states[h as usize] == MachineState::Speculative {
                    continue;
                }
                let r = &recs[h as usize];
                let s = r.state as usize;
                p.by_state[s].push(h);
                if r.asg_prio < p.min_prio[s] {
                    p.min_prio[s] = r.asg_prio;
                }
                if let Some(si) = TYPE_STATES.iter().position(|t| *t == r.state) {
                    let itype = fleet.profiles[r.profile as usize].itype;
                    let t = if itype == NONE {
                        ntypes - 1
                    } else {
                        itype as usize
                    };
                    let k = t * 2 + si;
                    if p.type_slot[k] == NONE {
                        p.type_slot[k] = p.types.len() as u32;
                        p.types.push((k, Vec::new(), i32::MAX));
                    }
                    let e = &mut p.types[p.type_slot[k] as usize];
                    e.1.push(h);
                    e.2 = e.2.min(r.asg_prio);
                }
                match r.state {
                    MachineState::Configured | MachineState::Configuring if r.cluster != NONE => {
                        p.bound.entry(r.cluster).or_default()
                            [usize::from(r.state == MachineState::Configuring)]
                        .push(BoundEntry {
                            h,
                            price: r.price,
                            rp: r.asg_rp,
                        });
                    }
                    MachineState::Idle => {
                        let t = fleet.idle[h as usize];
                        let m = &mut p.idle_min[r.cap as usize];
                        if t != i64::MIN && t < *m {
                            *m = t;
                        }
                    }
                    _ => {}
                }
            }
            p
        };
        let parts: Vec<Part> = if par.on() && n >= 1 << 16 {
            use rayon::prelude::*;
            par.run(|| {
                let chunk = (n / (rayon::current_num_threads() * 4)).max(1 << 15);
                fleet.order.par_chunks(chunk).map(pass).collect()
            })
        } else {
            vec![pass(&fleet.order)]
        };
        let mut by_state: [Vec<u32>; 9] = Default::default();
        let mut type_index: FxHashMap<(u8, u32), u32> = FxHashMap::default();
        let mut type_lists: Vec<Vec<u32>> = Vec::new();
        let mut type_min_prio: Vec<i32> = Vec::new();
        let mut min_prio = [i32::MAX; 9];
        let mut idle_min = [i64::MAX; 5];
        let mut bound: Vec<[Vec<BoundEntry>; 2]> = (0..nfc).map(|_| Default::default()).collect();
        let mut type_slot: Vec<u32> = vec![NONE; ntypes * 2];
        for mut p in parts {
            for (st, list) in p.by_state.iter_mut().enumerate() {
                if by_state[st].is_empty() {
                    by_state[st] = std::mem::take(list);
                } else {
                    by_state[st].append(list);
                }
                min_prio[st] = min_prio[st].min(p.min_prio[st]);
            }
            for (m, pm) in idle_min.iter_mut().zip(p.idle_min) {
                *m = (*m).min(pm);
            }
            for (k, mut list, mp) in p.types {
                if type_slot[k] == NONE {
                    let t = k / 2;
                    let itype = if t == ntypes - 1 { NONE } else { t as u32 };
                    type_slot[k] = type_lists.len() as u32;
                    type_index.insert((TYPE_STATES[k % 2] as u8, itype), type_lists.len() as u32);
                    type_lists.push(Vec::new());
                    type_min_prio.push(i32::MAX);
                }
                let idx = type_slot[k] as usize;
                type_lists[idx].append(&mut list);
                type_min_prio[idx] = type_min_prio[idx].min(mp);
            }
            for (c, [mut a, mut b]) in p.bound {
                let e = &mut bound[c as usize];
                e[0].append(&mut a);
                e[1].append(&mut b);
            }
        }

        // Keep-priority order (price asc, reclamation penalty desc, id asc) from
        // the entries' inline keys; the lists arrive in id order.
        let sort_entries = |v: &mut Vec<BoundEntry>| keep_sort(v, &rank_of);
        if par.on() {
            use rayon::prelude::*;
            par.run(|| {
                bound.par_iter_mut().for_each(|e| {
                    sort_entries(&mut e[0]);
                    sort_entries(&mut e[1]);
                })
            });
        } else {
            for e in &mut bound {
                sort_entries(&mut e[0]);
                sort_entries(&mut e[1]);
            }
        }
        let mut kpos = vec![0u32; slots];
        for entries in &bound {
            for list in entries {
                for (pos, e) in list.iter().enumerate() {
                    kpos[e.h as usize] = pos as u32;
                }
            }
        }
        let bound: Vec<[Vec<u32>; 2]> = bound
            .into_iter()
            .map(|lists| lists.map(|l| l.iter().map(|e| e.h).collect()))
            .collect();
        let type_sorted = (0..type_lists.len()).map(|_| OnceLock::new()).collect();
        Base {
            by_state,
            min_prio,
            type_index,
            type_lists,
            type_min_prio,
            type_sorted,
            idle_sorted: OnceLock::new(),
            spec: OnceLock::new(),
            bound,
            rank,
            kpos,
            idle_min,
            fleet_bytes: fleet.heap_bytes(),
            grouping: GroupingCache::default(),
        }
    }

    #[inline]
    fn rank(&self, h: u32) -> u32 {
        if self.rank.is_empty() {
            h
        } else {
            self.rank[h as usize]
        }
    }

    fn sort_price(&self, recs: &[Rec], v: &mut [u32]) {
        v.sort_by(|a, b| {
            recs[*a as usize]
                .price
                .total_cmp(&recs[*b as usize].price)
                .then(self.rank(*a).cmp(&self.rank(*b)))
        });
    }

    fn spec(&self, fleet: &Fleet) -> &SpecLists {
        self.spec.get_or_init(|| {
            let mut sl = SpecLists {
                min_prio: i32::MAX,
                ..SpecLists::default()
            };
            for &h in &fleet.order {
                if fleet.states[h as usize] == MachineState::Speculative {
                    let r = &fleet.recs[h as usize];
                    sl.all.push(h);
                    sl.min_prio = sl.min_prio.min(r.asg_prio);
                    let itype = fleet.profiles[r.profile as usize].itype;
                    let e = sl.by_type.entry(itype).or_insert((Vec::new(), i32::MAX));
                    e.0.push(h);
                    e.1 = e.1.min(r.asg_prio);
                }
            }
            sl
        })
    }
}

/// Emptied groups a patched grouping tolerates beyond half of all before it
/// compacts (none in unit tests, so they compact every time).
const ORPHAN_SLACK: usize = if cfg!(test) { 0 } else { 64 };

/// The records a patch replaces, as the base saw them, with a bitset so the
/// comparisons of a patch read unchanged machines without hashing.
struct Olds {
    map: FxHashMap<u32, (Rec, i64)>,
    changed: Vec<u64>,
}

impl Olds {
    fn new(map: FxHashMap<u32, (Rec, i64)>, slots: usize) -> Olds {
        let mut changed = vec![0u64; slots.div_ceil(64)];
        for &h in map.keys() {
            changed[h as usize / 64] |= 1 << (h % 64);
        }
        Olds { map, changed }
    }

    /// The record of `h` as the base saw it.
    #[inline]
    fn rec<'a>(&'a self, recs: &'a [Rec], h: u32) -> &'a Rec {
        if self.changed[h as usize / 64] & (1 << (h % 64)) != 0 {
            &self.map[&h].0
        } else {
            &recs[h as usize]
        }
    }
}

/// The cluster and [`BOUND_STATES`] slot of a machine bound to a cluster.
fn bound_key(r: &Rec) -> Option<(u32, u8)> {
    match r.state {
        MachineState::Configured | MachineState::Configuring if r.cluster != NONE => {
            Some((r.cluster, u8::from(r.state == MachineState::Configuring)))
        }
        _ => None,
    }
}

/// A list of a [`Base`] a patch edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ListId {
    /// `by_state[state]` (id order).
    State(u8),
    /// `type_lists[i]` (id order).
    Type(u32),
    /// `bound[cluster][slot]` (keep order).
    Bound(u32, u8),
    /// `idle_sorted` (price order), when built.
    IdleSorted,
    /// `type_sorted[i]` (price order), when built.
    TypeSorted(u32),
    /// `spec.all` (id order), when listed.
    Spec,
    /// `spec.by_type[itype]` (id order), when listed.
    SpecType(u32),
}

/// What a patch does to one list: machines leaving, machines arriving, and
/// what it must know to keep the list's minimum assigned priority exact.
#[derive(Debug)]
struct ListEdit {
    gone: Vec<u32>,
    add: Vec<u32>,
    /// A machine carrying the old minimum left (or changed its priority).
    lost_min: bool,
    /// Least priority of the machines arriving or staying with a new priority.
    add_min: i32,
}

impl Default for ListEdit {
    fn default() -> Self {
        ListEdit {
            gone: Vec::new(),
            add: Vec::new(),
            lost_min: false,
            add_min: i32::MAX,
        }
    }
}

/// Removes `gone` from `list` and merges in `add`, in one pass. `list` is
/// sorted by `order` over the records the base saw (`was`); it ends sorted by
/// `order` over the current records (`now`). The two agree on every machine not
/// leaving or arriving, so a leaver is found by binary search with its old
/// record, and an arrival's place is where its new record sorts among the old
/// ones.
fn splice<'r>(
    list: &mut Vec<u32>,
    gone: &[u32],
    add: &mut [u32],
    order: impl Fn(&Rec, u32, &Rec, u32) -> Ordering,
    was: impl Fn(u32) -> &'r Rec,
    now: impl Fn(u32) -> &'r Rec,
) {
    if gone.is_empty() && add.is_empty() {
        return;
    }
    let mut drops: Vec<usize> = gone
        .iter()
        .map(|&h| {
            list.binary_search_by(|&x| order(was(x), x, was(h), h))
                .ok()
                .filter(|&i| list[i] == h)
                .or_else(|| list.iter().position(|&x| x == h))
                .expect("a patched machine is in the list it leaves")
        })
        .collect();
    drops.sort_unstable();
    add.sort_unstable_by(|&a, &b| order(now(a), a, now(b), b));
    let places: Vec<usize> = add
        .iter()
        .map(|&h| list.partition_point(|&x| order(was(x), x, now(h), h) == Ordering::Less))
        .collect();
    // Copy the runs between drops and arrivals once into the new list.
    let mut out = Vec::with_capacity(list.len() + add.len() - drops.len());
    let (mut i, mut d, mut a) = (0, 0, 0);
    loop {
        let next_drop = drops.get(d).copied().unwrap_or(usize::MAX);
        let next_add = places.get(a).copied().unwrap_or(usize::MAX);
        let stop = next_drop.min(next_add).min(list.len());
        out.extend_from_slice(&list[i..stop]);
        i = stop;
        if next_add == i {
            out.push(add[a]);
            a += 1;
        } else if next_drop == i {
            d += 1;
            i += 1;
        } else {
            break;
        }
    }
    *list = out;
}

/// The exact new minimum of a list whose old minimum was `min` after `e`.
fn patched_min(min: i32, e: &ListEdit, list: &[u32], prio: impl Fn(u32) -> i32) -> i32 {
    if !e.lost_min || e.add_min <= min {
        return min.min(e.add_min);
    }
    let mut m = e.add_min;
    for &h in list {
        let p = prio(h);
        if p == min {
            return min;
        }
        m = m.min(p);
    }
    m
}

impl Base {
    /// Brings this base up to date with records replaced since it was built
    /// (same machines in the same slots; inserts and removals rebuild). Each
    /// touched list is edited in place (binary-searched removals, one merge),
    /// so the cost follows the changes and the touched lists' lengths, not the
    /// fleet. Equal to a fresh build (property-tested); the demand grouping
    /// over the old lists is dropped and rebuilt on demand.
    pub(crate) fn patch(&mut self, fleet: &Fleet, changes: Vec<Change>) {
        let recs: &[Rec] = &fleet.recs;
        // The first change of a slot holds what this base saw of it.
        let mut old: FxHashMap<u32, (Rec, i64)> = FxHashMap::default();
        for c in changes {
            old.entry(c.slot).or_insert((c.rec, c.idle));
        }
        old.retain(|&h, (r, t)| recs[h as usize] != *r || fleet.idle[h as usize] != *t);
        if old.is_empty() {
            return;
        }
        let old = Olds::new(old, recs.len());
        let grouping = self.grouping.take();
        let was = |h: u32| old.rec(recs, h);
        let itype = |r: &Rec| fleet.profiles[r.profile as usize].itype;
        let type_key = |r: &Rec| match r.state {
            MachineState::Idle | MachineState::Configured => Some((r.state as u8, itype(r))),
            _ => None,
        };
        let spec_listed = self.spec.get().is_some();
        let mut edits: FxHashMap<ListId, ListEdit> = FxHashMap::default();
        // Moves `h` between `from` and `to` (the same list when only its key or
        // priority changed), keeping track of the list minimum.
        let mut edit =
            |from: Option<ListId>, to: Option<ListId>, h: u32, o: &Rec, n: &Rec, rekey: bool| {
                if from == to && !rekey {
                    if let Some(l) = from
                        && o.asg_prio != n.asg_prio
                    {
                        let e = edits.entry(l).or_default();
                        e.add_min = e.add_min.min(n.asg_prio);
                        e.lost_min = true;
                    }
                    return;
                }
                if let Some(l) = from {
                    let e = edits.entry(l).or_default();
                    e.gone.push(h);
                    e.lost_min = true;
                }
                if let Some(l) = to {
                    let e = edits.entry(l).or_default();
                    e.add.push(h);
                    e.add_min = e.add_min.min(n.asg_prio);
                }
            };
        let mut new_types: Vec<(u8, u32)> = Vec::new();
        let mut idle_lost = [false; 5];
        let mut idle_add = [i64::MAX; 5];
        let mut handles: Vec<u32> = old.map.keys().copied().collect();
        handles.sort_unstable();
        for &h in &handles {
            let (o, t_old) = old.map[&h];
            let o = &o;
            let n = &recs[h as usize];
            let t_new = fleet.idle[h as usize];
            let spec = MachineState::Speculative;
            let st = |r: &Rec| (r.state != spec).then_some(ListId::State(r.state as u8));
            edit(st(o), st(n), h, o, n, false);
            let ty = |r: &Rec, new: &mut Vec<(u8, u32)>| {
                type_key(r).map(|k| match self.type_index.get(&k) {
                    Some(&i) => ListId::Type(i),
                    None => {
                        let i = self.type_lists.len() as u32
                            + new.iter().position(|x| *x == k).unwrap_or_else(|| {
                                new.push(k);
                                new.len() - 1
                            }) as u32;
                        ListId::Type(i)
                    }
                })
            };
            let (to, tn) = (ty(o, &mut new_types), ty(n, &mut new_types));
            edit(to, tn, h, o, n, false);
            let repriced = o.price.to_bits() != n.price.to_bits();
            if self.idle_sorted.get().is_some() {
                let idle = |r: &Rec| (r.state == MachineState::Idle).then_some(ListId::IdleSorted);
                edit(idle(o), idle(n), h, o, n, repriced);
            }
            let sorted = |l: Option<ListId>| match l {
                Some(ListId::Type(i))
                    if self
                        .type_sorted
                        .get(i as usize)
                        .is_some_and(|c| c.get().is_some()) =>
                {
                    Some(ListId::TypeSorted(i))
                }
                _ => None,
            };
            edit(sorted(to), sorted(tn), h, o, n, repriced);
            let rekeyed = repriced || o.asg_rp.to_bits() != n.asg_rp.to_bits();
            let bound = |r: &Rec| bound_key(r).map(|(c, s)| ListId::Bound(c, s));
            edit(bound(o), bound(n), h, o, n, rekeyed);
            if spec_listed {
                let sp = |r: &Rec| (r.state == spec).then_some(ListId::Spec);
                edit(sp(o), sp(n), h, o, n, false);
                let spt = |r: &Rec| (r.state == spec).then(|| ListId::SpecType(itype(r)));
                edit(spt(o), spt(n), h, o, n, false);
            }
            if o.state == MachineState::Idle && t_old != i64::MIN {
                idle_lost[o.cap as usize] |= t_old == self.idle_min[o.cap as usize];
            }
            if n.state == MachineState::Idle && t_new != i64::MIN {
                let m = &mut idle_add[n.cap as usize];
                *m = (*m).min(t_new);
            }
        }
        for k in new_types {
            self.type_index.insert(k, self.type_lists.len() as u32);
            self.type_lists.push(Vec::new());
            self.type_min_prio.push(i32::MAX);
            self.type_sorted.push(OnceLock::new());
        }
        if self.bound.len() < fleet.clusters.len() {
            self.bound
                .resize_with(fleet.clusters.len(), Default::default);
        }

        // Ranks do not change under replacements; taken out so the lists can
        // be edited while the comparators read them.
        let ranks = std::mem::take(&mut self.rank);
        let rank = |h: u32| {
            if ranks.is_empty() {
                h
            } else {
                ranks[h as usize]
            }
        };
        let by_rank = |_: &Rec, a: u32, _: &Rec, b: u32| rank(a).cmp(&rank(b));
        let by_price = |ra: &Rec, a: u32, rb: &Rec, b: u32| {
            ra.price.total_cmp(&rb.price).then(rank(a).cmp(&rank(b)))
        };
        let by_keep = |ra: &Rec, a: u32, rb: &Rec, b: u32| keep_cmp(ra, rank(a), rb, rank(b));
        let now = |h: u32| &recs[h as usize];
        let prio = |h: u32| recs[h as usize].asg_prio;
        let mut touched_bound: Vec<(u32, u8)> = Vec::new();
        for (id, mut e) in edits {
            match id {
                ListId::State(s) => {
                    let l = &mut self.by_state[s as usize];
                    splice(l, &e.gone, &mut e.add, by_rank, was, now);
                    self.min_prio[s as usize] = patched_min(self.min_prio[s as usize], &e, l, prio);
                }
                ListId::Type(i) => {
                    let l = &mut self.type_lists[i as usize];
                    splice(l, &e.gone, &mut e.add, by_rank, was, now);
                    let m = &mut self.type_min_prio[i as usize];
                    *m = patched_min(*m, &e, l, prio);
                }
                ListId::Bound(c, s) => {
                    let l = &mut self.bound[c as usize][s as usize];
                    splice(l, &e.gone, &mut e.add, by_keep, was, now);
                    touched_bound.push((c, s));
                }
                ListId::IdleSorted => {
                    if let Some(l) = self.idle_sorted.get_mut() {
                        splice(l, &e.gone, &mut e.add, by_price, was, now);
                    }
                }
                ListId::TypeSorted(i) => {
                    if let Some(l) = self.type_sorted[i as usize].get_mut() {
                        splice(l, &e.gone, &mut e.add, by_price, was, now);
                    }
                }
                ListId::Spec => {
                    if let Some(sl) = self.spec.get_mut() {
                        splice(&mut sl.all, &e.gone, &mut e.add, by_rank, was, now);
                        sl.min_prio = patched_min(sl.min_prio, &e, &sl.all, prio);
                    }
                }
                ListId::SpecType(t) => {
                    if let Some(sl) = self.spec.get_mut() {
                        let entry = sl.by_type.entry(t).or_insert((Vec::new(), i32::MAX));
                        splice(&mut entry.0, &e.gone, &mut e.add, by_rank, was, now);
                        entry.1 = patched_min(entry.1, &e, &entry.0, prio);
                        if entry.0.is_empty() {
                            sl.by_type.remove(&t);
                        }
                    }
                }
            }
        }
        // Keep positions: renumber the edited lists; a machine no longer bound
        // gets the 0 a fresh build leaves.
        for &h in &handles {
            if bound_key(&recs[h as usize]).is_none() {
                self.kpos[h as usize] = 0;
            }
        }
        for (c, s) in touched_bound {
            for (pos, &h) in self.bound[c as usize][s as usize].iter().enumerate() {
                self.kpos[h as usize] = pos as u32;
            }
        }
        // Earliest idle-since per capacity type, rescanning Idle only when the
        // machine holding the minimum left and nothing earlier arrived.
        for cap in 0..CAPACITY_TYPES.len() {
            let min = self.idle_min[cap];
            if !idle_lost[cap] || idle_add[cap] <= min {
                self.idle_min[cap] = min.min(idle_add[cap]);
                continue;
            }
            let mut m = idle_add[cap];
            for &h in &self.by_state[MachineState::Idle as usize] {
                let t = fleet.idle[h as usize];
                if recs[h as usize].cap as usize == cap && t != i64::MIN {
                    if t == min {
                        m = min;
                        break;
                    }
                    m = m.min(t);
                }
            }
            self.idle_min[cap] = m;
        }
        self.rank = ranks;

        // The cached demand grouping follows the same changes.
        if let Some(mut g) = grouping
            && Arc::get_mut(&mut g).is_some_and(|g| g.patch(fleet, self, &old, &handles))
        {
            self.grouping.put(g);
        }
    }
}

impl Grouping {
    fn build(
        fleet: &Fleet,
        base: &Base,
        keys: &[&str],
        key: (Vec<Box<str>>, bool, bool),
    ) -> Grouping {
        // Shapes: one per distinct (instance type, demand-key attributes) over
        // the fleet's machine profiles.
        let mut shapes: Vec<Shape> = Vec::new();
        let mut shape_attrs: Vec<u32> = Vec::new();
        let mut shape_map: FxHashMap<SmallVec<[u32; 6]>, u32> = FxHashMap::default();
        let shape_of_profile: Vec<u32> = fleet
            .profiles
            .iter()
            .map(|p| {
                let mut key: SmallVec<[u32; 6]> = SmallVec::new();
                key.push(p.itype);
                key.extend(keys.iter().map(|k| p.attribute(k)));
                *shape_map.entry(key).or_insert_with_key(|key| {
                    shapes.push(Shape { itype: p.itype });
                    shape_attrs.extend_from_slice(&key[1..]);
                    (shapes.len() - 1) as u32
                })
            })
            .collect();
        let mut g = Grouping {
            key,
            shape_of_profile,
            shapes,
            shape_attrs,
            group: vec![NONE; fleet.recs.len()],
            groups: Vec::new(),
            free_groups: Vec::new(),
            cluster_groups: Vec::with_capacity(base.bound.len()),
            own_index: FxHashMap::default(),
            orphans: 0,
        };
        for c in 0..base.bound.len() {
            g.cluster_groups.push(Vec::new());
            g.group_cluster(&fleet.recs, base, c);
        }
        // Free-machine groups feed Same scoring, foldability and verdict supply
        // counts only; plain demand never reads them.
        if g.key.1 {
            g.group_free(fleet, base);
        }
        if g.key.2 {
            for c in 0..base.bound.len() {
                g.index_own(&fleet.recs, base, c);
            }
        }
        g
    }

    /// Groups cluster `c`'s bound machines from the base's keep-ordered lists.
    /// Neighbours in keep order usually share (shape, capacity), so the
    /// previous group is tried before the map.
    fn group_cluster(&mut self, recs: &[Rec], base: &Base, c: usize) {
        let mut gmap: FxHashMap<(u8, u32, u32), u32> = FxHashMap::default();
        let mut cgroups = Vec::new();
        for (slot, list) in base.bound[c].iter().enumerate() {
            let state = BOUND_STATES[slot];
            let mut prev: (u32, u32, u32) = (NONE, NONE, NONE); // (shape, alloc, group)
            for &h in list {
                let r = &recs[h as usize];
                let (sh, alloc) = (self.shape_of_profile[r.profile as usize], r.alloc);
                let g = if prev.2 != NONE && prev.0 == sh && prev.1 == alloc {
                    prev.2
                } else {
                    let groups = &mut self.groups;
                    let g = *gmap.entry((state as u8, sh, alloc)).or_insert_with(|| {
                        groups.push(Group {
                            state,
                            shape: sh,
                            alloc,
                            members: Vec::new(),
                        });
                        cgroups.push((groups.len() - 1) as u32);
                        (groups.len() - 1) as u32
                    });
                    prev = (sh, alloc, g);
                    g
                };
                self.groups[g as usize].members.push(h);
                self.group[h as usize] = g;
            }
        }
        self.cluster_groups[c] = cgroups;
    }

    /// Groups the Idle and Speculative machines (id order).
    fn group_free(&mut self, fleet: &Fleet, base: &Base) {
        let recs: &[Rec] = &fleet.recs;
        let mut gmap: FxHashMap<(u8, u32, u32), u32> = FxHashMap::default();
        for st in [MachineState::Idle, MachineState::Speculative] {
            let list: &[u32] = if st == MachineState::Speculative {
                &base.spec(fleet).all
            } else {
                &base.by_state[st as usize]
            };
            let mut prev: (u32, u32, u32) = (NONE, NONE, NONE); // (shape, alloc, group)
            for &h in list {
                let r = &recs[h as usize];
                let sh = self.shape_of_profile[r.profile as usize];
                let g = if prev.2 != NONE && prev.0 == sh && prev.1 == r.alloc {
                    prev.2
                } else {
                    let (groups, free) = (&mut self.groups, &mut self.free_groups);
                    let g = *gmap.entry((st as u8, sh, r.alloc)).or_insert_with(|| {
                        groups.push(Group {
                            state: st,
                            shape: sh,
                            alloc: r.alloc,
                            members: Vec::new(),
                        });
                        free.push((groups.len() - 1) as u32);
                        (groups.len() - 1) as u32
                    });
                    prev = (sh, r.alloc, g);
                    g
                };
                self.groups[g as usize].members.push(h);
                self.group[h as usize] = g;
            }
        }
    }

    /// Adds cluster `c`'s stamped bound machines to the own-machine index.
    fn index_own(&mut self, recs: &[Rec], base: &Base, c: usize) {
        let lists = &base.bound[c];
        for &h in lists[0].iter().chain(lists[1].iter()) {
            let r = &recs[h as usize];
            if r.fp == NONE {
                continue;
            }
            self.own_index
                .entry((c as u32, r.fp, r.gstamp))
                .or_default()
                .push(h);
        }
    }

    /// Moves the machines a base patch changed between groups: out of the
    /// group they were in (binary search with their old keys), into the group
    /// of their new (state, shape, capacity) in their cluster or among the free
    /// machines (created when missing), then re-orders each touched family of
    /// groups by first appearance, as a fresh build walks them. Groups left
    /// empty are dropped from their family and compacted away once they are
    /// half of all. False when the fleet gained profiles (a fresh build
    /// re-shapes).
    fn patch(&mut self, fleet: &Fleet, base: &Base, old: &Olds, handles: &[u32]) -> bool {
        if self.shape_of_profile.len() != fleet.profiles.len()
            || self.group.len() != fleet.recs.len()
        {
            return false;
        }
        let recs: &[Rec] = &fleet.recs;
        let was = |h: u32| old.rec(recs, h);
        let rank = |h: u32| base.rank(h);
        let now = |h: u32| &recs[h as usize];
        let by_keep = |ra: &Rec, a: u32, rb: &Rec, b: u32| keep_cmp(ra, rank(a), rb, rank(b));
        let by_rank = |_: &Rec, a: u32, _: &Rec, b: u32| rank(a).cmp(&rank(b));
        let free_on = self.key.1;
        // Family of a record: its cluster's bound groups, or the free groups.
        let family = |r: &Rec| -> Option<u32> {
            let free = free_on && matches!(r.state, MachineState::Idle | MachineState::Speculative);
            bound_key(r)
                .map(|(c, _)| c)
                .or_else(|| free.then_some(NONE))
        };
        let key = |r: &Rec| (r.state, self.shape_of_profile[r.profile as usize], r.alloc);
        let mut gone: FxHashMap<u32, Vec<u32>> = FxHashMap::default();
        let mut arriving: Vec<(u32, (MachineState, u32, u32), u32)> = Vec::new();
        let mut families: Vec<u32> = Vec::new();
        for &h in handles {
            let (o, n) = (was(h), &recs[h as usize]);
            let (fo, f_new) = (family(o), family(n));
            let reordered =
                o.price.to_bits() != n.price.to_bits() || o.asg_rp.to_bits() != n.asg_rp.to_bits();
            if fo == f_new && key(o) == key(n) && (fo == Some(NONE) || !reordered) {
                continue;
            }
            if let Some(f) = fo {
                gone.entry(self.group[h as usize]).or_default().push(h);
                families.push(f);
            }
            self.group[h as usize] = NONE;
            if let Some(f) = f_new {
                arriving.push((f, key(n), h));
                families.push(f);
            }
        }
        for (g, hs) in gone {
            let bound = BOUND_STATES.contains(&self.groups[g as usize].state);
            let members = &mut self.groups[g as usize].members;
            if bound {
                splice(members, &hs, &mut [], by_keep, was, now);
            } else {
                splice(members, &hs, &mut [], by_rank, was, now);
            }
        }
        if self.cluster_groups.len() < base.bound.len() {
            self.cluster_groups.resize_with(base.bound.len(), Vec::new);
        }
        arriving.sort_unstable_by_key(|a| (a.0, a.1.0 as u8, a.1.1, a.1.2));
        for run in arriving.chunk_by(|a, b| a.0 == b.0 && a.1 == b.1) {
            let (f, (state, shape, alloc), _) = run[0];
            let list = if f == NONE {
                &mut self.free_groups
            } else {
                &mut self.cluster_groups[f as usize]
            };
            let groups = &mut self.groups;
            let g = match list.iter().copied().find(|&g| {
                let gr = &groups[g as usize];
                (gr.state, gr.shape, gr.alloc) == (state, shape, alloc)
            }) {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        state,
                        shape,
                        alloc,
                        members: Vec::new(),
                    });
                    list.push((groups.len() - 1) as u32);
                    (groups.len() - 1) as u32
                }
            };
            let mut add: Vec<u32> = run.iter().map(|a| a.2).collect();
            for &h in &add {
                self.group[h as usize] = g;
            }
            let members = &mut self.groups[g as usize].members;
            if f == NONE {
                splice(members, &[], &mut add, by_rank, was, now);
            } else {
                splice(members, &[], &mut add, by_keep, was, now);
            }
        }
        // Families in first-appearance order: bound groups by (state, keep
        // position of the first member), free ones by (state, id order).
        families.sort_unstable();
        families.dedup();
        for f in families {
            let groups = &self.groups;
            let list = if f == NONE {
                &mut self.free_groups
            } else {
                &mut self.cluster_groups[f as usize]
            };
            let before = list.len();
            list.retain(|&g| !groups[g as usize].members.is_empty());
            self.orphans += before - list.len();
            list.sort_by_key(|&g| {
                let gr = &groups[g as usize];
                let first = gr.members[0];
                let pos = if f == NONE {
                    rank(first)
                } else {
                    base.kpos[first as usize]
                };
                (
                    gr.state != MachineState::Configured && gr.state != MachineState::Idle,
                    pos,
                )
            });
        }
        if self.key.2 {
            self.patch_own(recs, base, was, handles);
        }
        if self.orphans > self.groups.len() / 2 + ORPHAN_SLACK {
            self.compact();
        }
        true
    }

    /// Moves changed machines between own-index entries; an entry lists its
    /// machines Configured first, each state in keep order.
    fn patch_own<'r>(
        &mut self,
        recs: &'r [Rec],
        base: &Base,
        was: impl Fn(u32) -> &'r Rec,
        handles: &[u32],
    ) {
        let own_key = |r: &Rec| {
            bound_key(r)
                .filter(|_| r.fp != NONE)
                .map(|(c, _)| (c, r.fp, r.gstamp))
        };
        for &h in handles {
            if let Some(k) = own_key(was(h))
                && let Some(v) = self.own_index.get_mut(&k)
            {
                v.retain(|&x| x != h);
                if v.is_empty() {
                    self.own_index.remove(&k);
                }
            }
        }
        let pos = |x: u32| {
            let configuring = recs[x as usize].state == MachineState::Configuring;
            (configuring, base.kpos[x as usize])
        };
        for &h in handles {
            if let Some(k) = own_key(&recs[h as usize]) {
                let v = self.own_index.entry(k).or_default();
                let at = v.partition_point(|&x| pos(x) < pos(h));
                v.insert(at, h);
            }
        }
    }

    /// Drops the groups patches emptied and renumbers the rest (every live
    /// group has a member; an emptied one has none).
    fn compact(&mut self) {
        let mut remap = vec![NONE; self.groups.len()];
        let mut kept = Vec::with_capacity(self.groups.len() - self.orphans);
        for (i, g) in std::mem::take(&mut self.groups).into_iter().enumerate() {
            if !g.members.is_empty() {
                remap[i] = kept.len() as u32;
                kept.push(g);
            }
        }
        self.groups = kept;
        for g in self.group.iter_mut().filter(|g| **g != NONE) {
            *g = remap[*g as usize];
        }
        for list in self
            .cluster_groups
            .iter_mut()
            .chain([&mut self.free_groups])
        {
            for g in list.iter_mut() {
                *g = remap[*g as usize];
            }
        }
        self.orphans = 0;
    }
}

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
        for c in &spec.demand_clusters {
            cluster_id(c);
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
        let dims = Dims::collect(
            fleet
                .allocs
                .iter()
                .chain(spec.demand_vectors.iter().copied()),
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
            g,
            live: n,
            extra_clusters,
            extra_cluster_ids,
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
        self.g
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
        self.g.shape_of_profile[self.recs[h as usize].profile as usize]
    }

    /// Position in machine id order (the universal tie-break).
    #[inline]
    pub(crate) fn rank(&self, h: u32) -> u32 {
        self.base.rank(h)
    }

    /// Group of an Idle, Speculative, Configured or Configuring machine.
    #[inline]
    pub(crate) fn group_of(&self, h: u32) -> u32 {
        self.g.group[h as usize]
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
        self.g.shape_attrs[shape as usize * self.keys.len() + slot]
    }

    pub(crate) fn attrs(&self, shape: u32) -> &[u32] {
        let k = self.keys.len();
        &self.g.shape_attrs[shape as usize * k..(shape as usize + 1) * k]
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
        let g = &self.g;
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
    /// Clusters the demand names.
    pub demand_clusters: Vec<&'a str>,
    /// Build the own-machine index (only Same needs use it).
    pub own_index: bool,
    /// Build groups of Idle/Speculative machines (Same demand or verdicts).
    pub free_groups: bool,
    pub par: Par,
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
        .then(b.asg_rp.total_cmp(&a.asg_rp))
        .then(ra.cmp(&rb))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::{Host, Machine, MachineProfile};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// (state, cluster, type, capacity, price, penalty, priority, idle stamp).
    type Shape = (u8, u8, u8, u8, u8, u8, i32, Option<i64>);

    const STATES: [MachineState; 6] = [
        MachineState::Idle,
        MachineState::Speculative,
        MachineState::Creating,
        MachineState::Configuring,
        MachineState::Configured,
        MachineState::Draining,
    ];

    fn machine(i: usize, s: &Shape) -> Machine {
        let (state, cluster, itype, cap, price, rp, prio, _) = *s;
        Machine {
            id: format!("m{i:03}"),
            state: STATES[state as usize],
            host: Host {
                provider: "p".into(),
                reference: format!("r{i}"),
            },
            cluster: if cluster == 0 {
                String::new()
            } else {
                format!("c{cluster}")
            },
            profile: MachineProfile {
                instance_type: format!("t{itype}"),
                capacity_type: CAPACITY_TYPES[1 + cap as usize],
                ..MachineProfile::default()
            },
            price_per_hour: f64::from(price),
            assigned_reclamation_penalty_dollars: f64::from(rp),
            assigned_priority: prio,
            assigned_need_fingerprint: if cluster == 0 {
                String::new()
            } else {
                format!("fp{}", prio % 2)
            },
            ..Machine::default()
        }
    }

    fn shape() -> impl Strategy<Value = Shape> {
        (
            0u8..6,
            0u8..4,
            0u8..3,
            0u8..4,
            0u8..3,
            0u8..2,
            0i32..4,
            prop::option::of(0i64..5),
        )
    }

    /// Builds the base and every lazily built list, as cycles would.
    fn settle(fleet: &Fleet) -> &Base {
        let spec = BuildSpec {
            keys: Vec::new(),
            destinations: None,
            demand_vectors: Vec::new(),
            demand_clusters: Vec::new(),
            own_index: true,
            free_groups: true,
            par: Par::Off,
        };
        let snap = Snapshot::build(fleet, spec);
        snap.idle_all_sorted();
        for t in 0..fleet.values.len() as u32 {
            snap.idle_type_sorted(t);
        }
        snap.base
    }

    /// The cached grouping with symbols and handles spelled out (group
    /// numbers are not part of it: patches append groups).
    fn canon_grouping(fleet: &Fleet, b: &Base) -> String {
        let g = b.grouping.get().expect("grouping built");
        let id = |h: u32| fleet.ids[h as usize].to_string();
        let group = |i: u32| {
            let gr = &g.groups[i as usize];
            let itype = g.shapes[gr.shape as usize].itype;
            let members: Vec<String> = gr.members.iter().map(|&h| id(h)).collect();
            let itype = if itype == NONE {
                ""
            } else {
                fleet.values.resolve(itype)
            };
            format!(
                "{:?}/{itype}/{:?}: {members:?}",
                gr.state, fleet.allocs[gr.alloc as usize]
            )
        };
        let mut clusters = BTreeMap::new();
        for (c, cg) in g.cluster_groups.iter().enumerate() {
            if !cg.is_empty() {
                let name = fleet.clusters.resolve(c as u32);
                let groups: Vec<String> = cg.iter().map(|&i| group(i)).collect();
                let bound = b.bound[c]
                    .each_ref()
                    .map(|l| l.iter().map(|&h| id(h)).collect::<Vec<_>>());
                clusters.insert(name, (groups, bound));
            }
        }
        let mut out = format!("{clusters:?}\n");
        let free: Vec<String> = g.free_groups.iter().map(|&i| group(i)).collect();
        out += &format!("free {free:?}\n");
        let mut own: Vec<String> = g
            .own_index
            .iter()
            .map(|((c, fp, gs), hs)| {
                let hs: Vec<String> = hs.iter().map(|&h| id(h)).collect();
                format!(
                    "{} {} {} {hs:?}",
                    fleet.clusters.resolve(*c),
                    fleet.fps.resolve(*fp),
                    if *gs == NONE {
                        ""
                    } else {
                        fleet.groups.resolve(*gs)
                    }
                )
            })
            .collect();
        own.sort();
        out += &format!("own {own:?}\n");
        let mut members: Vec<(String, String)> = Vec::new();
        for h in 0..fleet.recs.len() as u32 {
            let gi = g.group[h as usize];
            members.push((id(h), if gi == NONE { String::new() } else { group(gi) }));
        }
        out += &format!("member of {members:?}");
        out
    }

    /// A base with symbols and handles spelled out, empty lists dropped.
    fn canon(fleet: &Fleet, b: &Base) -> String {
        let id = |h: &u32| fleet.ids[*h as usize].to_string();
        let ids = |v: &[u32]| v.iter().map(id).collect::<Vec<_>>();
        let val = |v: u32| {
            if v == NONE {
                String::new()
            } else {
                fleet.values.resolve(v).to_owned()
            }
        };
        let mut types = BTreeMap::new();
        for (&(st, t), &i) in &b.type_index {
            let l = &b.type_lists[i as usize];
            if !l.is_empty() {
                let sorted = b.type_sorted[i as usize].get().map(|v| ids(v));
                types.insert((st, val(t)), (ids(l), b.type_min_prio[i as usize], sorted));
            }
        }
        let spec = b.spec.get().map(|sl| {
            let by_type: BTreeMap<_, _> = sl
                .by_type
                .iter()
                .map(|(t, (l, m))| (val(*t), (ids(l), *m)))
                .collect();
            (ids(&sl.all), sl.min_prio, by_type)
        });
        let mut bound = BTreeMap::new();
        let mut kpos = BTreeMap::new();
        for (c, lists) in b.bound.iter().enumerate() {
            for (s, l) in lists.iter().enumerate() {
                if !l.is_empty() {
                    bound.insert((fleet.clusters.resolve(c as u32).to_owned(), s), ids(l));
                }
            }
        }
        for h in 0..fleet.recs.len() as u32 {
            kpos.insert(id(&h), b.kpos[h as usize]);
        }
        let by_state: Vec<_> = b.by_state.iter().map(|l| ids(l)).collect();
        format!(
            "states {by_state:?}\nmin {:?}\ntypes {types:?}\nidle sorted {:?}\nspec {spec:?}\n\
             bound {bound:?}\nkpos {kpos:?}\nidle min {:?}\nrank {:?}",
            b.min_prio,
            b.idle_sorted.get().map(|v| ids(v)),
            b.idle_min,
            b.rank,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// A base patched with replaced records is the base a fresh fleet over
        /// the same machines builds.
        #[test]
        fn patched_base_equals_a_fresh_build(
            start in prop::collection::vec(shape(), 1..40),
            rounds in prop::collection::vec(prop::collection::vec((0usize..40, shape()), 0..10), 1..4),
        ) {
            let mut now = start.clone();
            let machines: Vec<Machine> = now.iter().enumerate().map(|(i, s)| machine(i, s)).collect();
            let stamps: Vec<Option<i64>> = now.iter().map(|s| s.7).collect();
            let mut fleet = Fleet::from_machines(&machines, &stamps).unwrap();
            settle(&fleet);
            for round in rounds {
                for (i, s) in round {
                    let i = i % now.len();
                    now[i] = s;
                    fleet.upsert_with_idle_since(&machine(i, &s), s.7);
                }
                let b = settle(&fleet);
                let patched = canon(&fleet, b) + &canon_grouping(&fleet, b);
                let machines: Vec<Machine> = now.iter().enumerate().map(|(i, s)| machine(i, s)).collect();
                let stamps: Vec<Option<i64>> = now.iter().map(|s| s.7).collect();
                let fresh_fleet = Fleet::from_machines(&machines, &stamps).unwrap();
                let b = settle(&fresh_fleet);
                let fresh = canon(&fresh_fleet, b) + &canon_grouping(&fresh_fleet, b);
                prop_assert_eq!(patched, fresh);
            }
        }
    }

    #[test]
    fn replacements_patch_the_cached_base_and_inserts_drop_it() {
        let shapes: Vec<Shape> = (0..8).map(|i| (0, 0, i % 2, 0, 1, 0, 0, None)).collect();
        let machines: Vec<Machine> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| machine(i, s))
            .collect();
        let mut fleet = Fleet::from_machines(&machines, &[]).unwrap();
        settle(&fleet);
        // An unchanged re-upsert keeps the base as it is.
        fleet.upsert_with_idle_since(&machines[3], None);
        assert!(fleet.base.get().is_some());
        // A change queues a patch.
        fleet.upsert_with_idle_since(&machine(3, &(4, 1, 0, 0, 1, 0, 2, None)), None);
        assert!(fleet.base.get().is_none());
        assert!(fleet.stale.take().is_some());
        settle(&fleet);
        // A new machine rebuilds.
        fleet.upsert_with_idle_since(&machine(99, &shapes[0]), None);
        assert!(fleet.base.get().is_none());
        assert!(fleet.stale.take().is_none());
    }
}
