//! Phase 1's acquisition: Idle, then Speculative machines taken for each need in
//! precedence order from per-(state, profile) pools, through the basic, Same and spread
//! finders.

use super::{ACQ_STATES, Phase1Pass};
use crate::context::Ctx;
use crate::demand::CompiledProfile;
use crate::intern::NONE;
use crate::qty::{self, Qty};
use bigfleet_model::{MachineState, effective_cost_dollars};
use rustc_hash::FxHashMap;

#[derive(Debug, Default)]
pub(super) struct DomList {
    pub(super) list: Vec<u32>,
    pub(super) cursor: usize,
}

/// An acquisition pool: a materialised, matching-only list, or (for plain
/// needs over Idle) the snapshot's sorted bucket itself, filtered on the fly
/// so a need that takes a few machines never copies the bucket.
#[derive(Debug)]
pub(super) enum PoolList<'c> {
    Owned(Vec<u32>),
    Borrowed(&'c [u32]),
}

impl std::ops::Deref for PoolList<'_> {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        match self {
            PoolList::Owned(v) => v,
            PoolList::Borrowed(s) => s,
        }
    }
}

#[derive(Debug)]
pub(super) struct Pool<'c> {
    pub(super) list: PoolList<'c>,
    /// Every member matches the profile (otherwise check while walking).
    pub(super) filtered: bool,
    pub(super) cursor: usize,
    pub(super) domains: Option<FxHashMap<u32, DomList>>,
}

/// Builds the acquisition pool of one (state, profile): Idle by price asc, id
/// asc; Speculative by effective cost asc, id asc; pinned profiles draw only
/// from their instance types' buckets. Only matching machines are kept (the
/// finders would skip the others anyway).
pub(super) fn build_pool(ctx: &Ctx<'_>, st: MachineState, cp: &CompiledProfile) -> Vec<u32> {
    let snap = &ctx.snap;
    let keep = |r: &u32| cp.matches(snap, snap.shape(*r));
    match st {
        MachineState::Idle => match &cp.pinned {
            Some(ts) if ts.len() == 1 => snap
                .idle_type_sorted(ts[0])
                .iter()
                .copied()
                .filter(keep)
                .collect(),
            Some(ts) => {
                let mut v: Vec<u32> = ts
                    .iter()
                    .flat_map(|t| snap.idle_type_sorted(*t).iter().copied())
                    .filter(keep)
                    .collect();
                snap.sort_price(&mut v);
                v
            }
            None => snap
                .idle_all_sorted()
                .iter()
                .copied()
                .filter(keep)
                .collect(),
        },
        _ => {
            let mut v: Vec<(f64, u32)> = match &cp.pinned {
                Some(ts) => ts
                    .iter()
                    .flat_map(|t| snap.type_list(st, *t).iter().copied())
                    .filter(keep)
                    .map(|r| (0.0, r))
                    .collect(),
                None => snap
                    .state_list(st)
                    .iter()
                    .copied()
                    .filter(keep)
                    .map(|r| (0.0, r))
                    .collect(),
            };
            for (ec, r) in &mut v {
                let rec = snap.rec(*r);
                *ec = effective_cost_dollars(
                    rec.price,
                    rec.interruption_probability,
                    cp.interruption_penalty_dollars,
                );
            }
            v.sort_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(snap.rank(a.1).cmp(&snap.rank(b.1)))
            });
            v.into_iter().map(|(_, r)| r).collect()
        }
    }
}

impl<'c, 'a> Phase1Pass<'c, 'a> {
    // ---- acquisition ----

    pub(super) fn take_pool(&mut self, st: MachineState, cp_id: u32) -> Pool<'c> {
        if let Some(p) = self.pools.remove(&(st as u8, cp_id)) {
            return p;
        }
        let ctx: &'c Ctx<'a> = self.ctx;
        let snap = &ctx.snap;
        let cp = &ctx.profiles.compiled[cp_id as usize];
        let plain = !cp.has_same() && cp.spread.is_none();
        let borrowed = match (&cp.pinned, st) {
            (Some(ts), MachineState::Idle) if plain && ts.len() == 1 => {
                Some(snap.idle_type_sorted(ts[0]))
            }
            (None, MachineState::Idle) if plain => Some(snap.idle_all_sorted()),
            _ => None,
        };
        match borrowed {
            Some(list) => Pool {
                list: PoolList::Borrowed(list),
                filtered: false,
                cursor: 0,
                domains: None,
            },
            None => Pool {
                list: PoolList::Owned(build_pool(ctx, st, cp)),
                filtered: true,
                cursor: 0,
                domains: None,
            },
        }
    }

    pub(super) fn put_pool(&mut self, st: MachineState, cp: u32, pool: Pool<'c>) {
        self.pools.insert((st as u8, cp), pool);
    }

    pub(super) fn acquire(&mut self, i: u32) {
        let ctx = self.ctx;
        let dn = &ctx.needs[i as usize];
        let cp = ctx.profile_of(i);
        for st in ACQ_STATES {
            if self.done(i) {
                return;
            }
            if cp.has_same() && dn.parked {
                return;
            }
            let mut pool = self.take_pool(st, dn.profile);
            let cands = if cp.has_same() {
                let d = self.out.domain[i as usize];
                if d != NONE {
                    self.find_same(i, &mut pool, d)
                } else {
                    self.find_same_fallback(i, &pool)
                }
            } else if let Some((slot, skew)) = cp.spread {
                self.find_spread(i, &pool, slot, skew)
            } else {
                self.find_basic(i, &mut pool)
            };
            self.put_pool(st, dn.profile, pool);
            for r in cands {
                self.claim(i, r);
            }
        }
    }

    /// Greedy walk in pool order: unclaimed, MinUnit-fitting machines until the
    /// deficit is covered.
    pub(super) fn find_basic(&self, i: u32, pool: &mut Pool<'c>) -> Vec<u32> {
        let snap = &self.ctx.snap;
        let cp = self.ctx.profile_of(i);
        // Claimed and non-matching machines stay so for the whole cycle.
        while pool.cursor < pool.list.len() {
            let r = pool.list[pool.cursor];
            if self.unclaimed(r) && (pool.filtered || cp.matches(snap, snap.shape(r))) {
                break;
            }
            pool.cursor += 1;
        }
        let check = (!pool.filtered).then_some(cp);
        self.take_greedy_checked(i, &pool.list[pool.cursor..], check)
    }

    pub(super) fn take_greedy(&self, i: u32, list: &[u32]) -> Vec<u32> {
        self.take_greedy_checked(i, list, None)
    }

    pub(super) fn take_greedy_checked(
        &self,
        i: u32,
        list: &[u32],
        check: Option<&CompiledProfile>,
    ) -> Vec<u32> {
        let snap = &self.ctx.snap;
        let mu = &self.ctx.needs[i as usize].min_unit;
        let mut rem = self.out.remaining[i as usize].clone();
        let mut out = Vec::new();
        if qty::is_zero(&rem) {
            return out;
        }
        for &r in list {
            if !self.unclaimed(r) || check.is_some_and(|cp| !cp.matches(snap, snap.shape(r))) {
                continue;
            }
            let cap = snap.cap(r);
            if !qty::covers(cap, mu) {
                continue;
            }
            out.push(r);
            qty::sub_assign(&mut rem, cap);
            if qty::is_zero(&rem) {
                break;
            }
        }
        out
    }

    /// FindSame with a recorded domain: pool order within the domain.
    pub(super) fn find_same(&self, i: u32, pool: &mut Pool<'c>, v: u32) -> Vec<u32> {
        let snap = &self.ctx.snap;
        let list = domain_list(pool, snap, self.ctx.profile_of(i), v);
        while list.cursor < list.list.len() && !self.unclaimed(list.list[list.cursor]) {
            list.cursor += 1;
        }
        let start = list.cursor;
        self.take_greedy(i, &list.list[start..])
    }

    /// FindSame without a recorded domain: best bucket by atomic coverage, then
    /// head price, then value, so the choice is the
    /// one with the most whole machines and, among those, the cheapest.
    pub(super) fn find_same_fallback(&self, i: u32, pool: &Pool<'c>) -> Vec<u32> {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let slot = ctx.profile_of(i).same_slot.expect("Same profile");
        let deficit = &self.out.remaining[i as usize];
        struct Fb {
            value: u32,
            avail: u64,
            capsum: Qty,
            head_price: f64,
        }
        let mut fbs: Vec<Fb> = Vec::new();
        let mut idx: FxHashMap<u32, usize> = FxHashMap::default();
        for &r in pool.list.iter() {
            if !self.unclaimed(r) {
                continue;
            }
            let v = snap.attr(snap.shape(r), slot);
            let cap = snap.cap(r);
            if v == NONE || !qty::covers(cap, &dn.min_unit) {
                continue;
            }
            let price = snap.rec(r).price;
            let k = *idx.entry(v).or_insert_with(|| {
                fbs.push(Fb {
                    value: v,
                    avail: 0,
                    capsum: snap.dims.zero(),
                    head_price: price,
                });
                fbs.len() - 1
            });
            fbs[k].avail += 1;
            qty::add_assign(&mut fbs[k].capsum, cap);
        }
        let better = |a: &Fb, b: &Fb| -> bool {
            let (aa, ba) = (
                qty::covers(&a.capsum, deficit),
                qty::covers(&b.capsum, deficit),
            );
            if aa != ba {
                return aa;
            }
            if !aa && a.avail != b.avail {
                return a.avail > b.avail;
            }
            if a.head_price != b.head_price {
                return a.head_price < b.head_price;
            }
            snap.value_name(a.value) < snap.value_name(b.value)
        };
        let Some(win) = fbs
            .iter()
            .reduce(|best, c| if better(c, best) { c } else { best })
        else {
            return Vec::new();
        };
        let v = win.value;
        let in_domain: Vec<u32> = pool
            .list
            .iter()
            .copied()
            .filter(|&r| snap.attr(snap.shape(r), slot) == v)
            .collect();
        self.take_greedy(i, &in_domain)
    }

    /// FindSpread: DoNotSchedule spread over one pool; counts only this proposal.
    pub(super) fn find_spread(
        &self,
        i: u32,
        pool: &Pool<'c>,
        slot: usize,
        max_skew: i32,
    ) -> Vec<u32> {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let skew = i64::from(max_skew.max(1));
        let mut values: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut idx: FxHashMap<u32, usize> = FxHashMap::default();
        for &r in pool.list.iter() {
            if !self.unclaimed(r) {
                continue;
            }
            let v = snap.attr(snap.shape(r), slot);
            if v == NONE || !qty::covers(snap.cap(r), &dn.min_unit) {
                continue;
            }
            let k = *idx.entry(v).or_insert_with(|| {
                values.push((v, Vec::new()));
                values.len() - 1
            });
            values[k].1.push(r);
        }
        let mut counts = vec![0i64; values.len()];
        let mut heads = vec![0usize; values.len()];
        let mut rem = self.out.remaining[i as usize].clone();
        let mut out = Vec::new();
        while !qty::is_zero(&rem) {
            let Some(min) = counts.iter().copied().min() else {
                break;
            };
            let mut pick: Option<usize> = None;
            for k in 0..values.len() {
                if heads[k] >= values[k].1.len() || counts[k] > min + skew - 1 {
                    continue;
                }
                let better = match pick {
                    None => true,
                    Some(p) => {
                        let (pc, kc) = (
                            snap.rec(values[p].1[heads[p]]).price,
                            snap.rec(values[k].1[heads[k]]).price,
                        );
                        kc < pc
                            || (kc == pc
                                && snap.value_name(values[k].0) < snap.value_name(values[p].0))
                    }
                };
                if better {
                    pick = Some(k);
                }
            }
            let Some(k) = pick else { break };
            let r = values[k].1[heads[k]];
            heads[k] += 1;
            counts[k] += 1;
            qty::sub_assign(&mut rem, snap.cap(r));
            out.push(r);
        }
        out
    }
}

/// The pool's members with attribute value `v` for the profile's Same key, in
/// pool order (split once per pool).
pub(super) fn domain_list<'p>(
    pool: &'p mut Pool<'_>,
    snap: &crate::snapshot::Snapshot<'_>,
    cp: &CompiledProfile,
    v: u32,
) -> &'p mut DomList {
    let slot = cp.same_slot.expect("Same profile");
    let domains = pool.domains.get_or_insert_with(|| {
        let mut m: FxHashMap<u32, DomList> = FxHashMap::default();
        for &r in pool.list.iter() {
            let val = snap.attr(snap.shape(r), slot);
            if val != NONE {
                m.entry(val).or_default().list.push(r);
            }
        }
        m
    });
    domains.entry(v).or_default()
}
