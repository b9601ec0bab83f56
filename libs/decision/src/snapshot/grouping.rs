//! Grouping machines by (state, cluster, shape, capacity) for a demand's
//! attribute keys, and keeping that grouping up to date under patches.

use super::*;

impl Grouping {
    pub(super) fn build(
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
    pub(super) fn group_cluster(&mut self, recs: &[Rec], base: &Base, c: usize) {
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
    pub(super) fn group_free(&mut self, fleet: &Fleet, base: &Base) {
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
    pub(super) fn index_own(&mut self, recs: &[Rec], base: &Base, c: usize) {
        let lists = &base.bound[c];
        for &h in lists[0].iter().chain(lists[1].iter()) {
            let r = &recs[h as usize];
            if r.assigned_fingerprint == NONE {
                continue;
            }
            self.own_index
                .entry((c as u32, r.assigned_fingerprint, r.assigned_group))
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
    pub(super) fn patch(
        &mut self,
        fleet: &Fleet,
        base: &Base,
        old: &Olds,
        handles: &[u32],
    ) -> bool {
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
            let reordered = o.price.to_bits() != n.price.to_bits()
                || o.assigned_reclamation_penalty.to_bits()
                    != n.assigned_reclamation_penalty.to_bits();
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
    pub(super) fn patch_own<'r>(
        &mut self,
        recs: &'r [Rec],
        base: &Base,
        was: impl Fn(u32) -> &'r Rec,
        handles: &[u32],
    ) {
        let own_key = |r: &Rec| {
            bound_key(r)
                .filter(|_| r.assigned_fingerprint != NONE)
                .map(|(c, _)| (c, r.assigned_fingerprint, r.assigned_group))
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
    pub(super) fn compact(&mut self) {
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
