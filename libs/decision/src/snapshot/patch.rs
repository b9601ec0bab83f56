//! Patching a base in place after machine records changed: each touched list
//! is edited (binary-searched removals, one merge), so the cost follows the
//! changes, not the fleet. Equal to a fresh build (property-tested).

use super::*;

/// Emptied groups a patched grouping tolerates beyond half of all before it
/// compacts (none in unit tests, so they compact every time).
pub(super) const ORPHAN_SLACK: usize = if cfg!(test) { 0 } else { 64 };

/// The records a patch replaces, as the base saw them, with a bitset so the
/// comparisons of a patch read unchanged machines without hashing.
pub(super) struct Olds {
    map: FxHashMap<u32, (Rec, i64)>,
    changed: Vec<u64>,
}

impl Olds {
    pub(super) fn new(map: FxHashMap<u32, (Rec, i64)>, slots: usize) -> Olds {
        let mut changed = vec![0u64; slots.div_ceil(64)];
        for &h in map.keys() {
            changed[h as usize / 64] |= 1 << (h % 64);
        }
        Olds { map, changed }
    }

    /// The record of `h` as the base saw it.
    #[inline]
    pub(super) fn rec<'a>(&'a self, recs: &'a [Rec], h: u32) -> &'a Rec {
        if self.changed[h as usize / 64] & (1 << (h % 64)) != 0 {
            &self.map[&h].0
        } else {
            &recs[h as usize]
        }
    }
}

/// The cluster and [`BOUND_STATES`] slot of a machine bound to a cluster.
pub(super) fn bound_key(r: &Rec) -> Option<(u32, u8)> {
    match r.state {
        MachineState::Configured | MachineState::Configuring if r.cluster != NONE => {
            Some((r.cluster, u8::from(r.state == MachineState::Configuring)))
        }
        _ => None,
    }
}

/// A list of a [`Base`] a patch edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ListId {
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
pub(super) struct ListEdit {
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
pub(super) fn splice<'r>(
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
pub(super) fn patched_min(min: i32, e: &ListEdit, list: &[u32], prio: impl Fn(u32) -> i32) -> i32 {
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
                        && o.assigned_priority != n.assigned_priority
                    {
                        let e = edits.entry(l).or_default();
                        e.add_min = e.add_min.min(n.assigned_priority);
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
                    e.add_min = e.add_min.min(n.assigned_priority);
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
            let rekeyed = repriced
                || o.assigned_reclamation_penalty.to_bits()
                    != n.assigned_reclamation_penalty.to_bits();
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
        let prio = |h: u32| recs[h as usize].assigned_priority;
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
