//! Building a snapshot base from the fleet: the demand-independent, sorted
//! per-state lists a cycle reads.

use super::*;

impl Base {
    pub(super) fn build(fleet: &Fleet, par: &Parallelism) -> Base {
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
                if r.assigned_priority < p.min_prio[s] {
                    p.min_prio[s] = r.assigned_priority;
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
                    e.2 = e.2.min(r.assigned_priority);
                }
                match r.state {
                    MachineState::Configured | MachineState::Configuring if r.cluster != NONE => {
                        p.bound.entry(r.cluster).or_default()
                            [usize::from(r.state == MachineState::Configuring)]
                        .push(BoundEntry {
                            h,
                            price: r.price,
                            rp: r.assigned_reclamation_penalty,
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
    pub(super) fn rank(&self, h: u32) -> u32 {
        if self.rank.is_empty() {
            h
        } else {
            self.rank[h as usize]
        }
    }

    pub(super) fn sort_price(&self, recs: &[Rec], v: &mut [u32]) {
        v.sort_by(|a, b| {
            recs[*a as usize]
                .price
                .total_cmp(&recs[*b as usize].price)
                .then(self.rank(*a).cmp(&self.rank(*b)))
        });
    }

    pub(super) fn spec(&self, fleet: &Fleet) -> &SpecLists {
        self.spec.get_or_init(|| {
            let mut sl = SpecLists {
                min_prio: i32::MAX,
                ..SpecLists::default()
            };
            for &h in &fleet.order {
                if fleet.states[h as usize] == MachineState::Speculative {
                    let r = &fleet.recs[h as usize];
                    sl.all.push(h);
                    sl.min_prio = sl.min_prio.min(r.assigned_priority);
                    let itype = fleet.profiles[r.profile as usize].itype;
                    let e = sl.by_type.entry(itype).or_insert((Vec::new(), i32::MAX));
                    e.0.push(h);
                    e.1 = e.1.min(r.assigned_priority);
                }
            }
            sl
        })
    }
}
