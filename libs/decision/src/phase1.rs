//! Phase 1: assignment as a deterministic precedence-ordered pass.
//!
//! Pre-pass (priority desc, stable): credit bound supply — Configured, then
//! Configuring, then in-flight Creating machines provisioned for the need
//! (ADR-0022) — and, for Same needs, choose one domain per need with
//! acquirable consumption. Acquisition (precedence desc, stable): Idle, then
//! Speculative, through the basic / Same / spread finders. Because every need is
//! served after all needs of strictly higher precedence and equal precedence
//! never displaces, the reference broker's displacement and retries can never
//! fire here (ADR-0020); the result is the OCC outcome with commits in
//! precedence order.

use crate::context::Ctx;
use crate::demand::CompiledProfile;
use crate::intern::NONE;
use crate::qty::{self, Qty};
use crate::same::{AcqIndex, Scored};
use crate::snapshot::BOUND_STATES;
use bigfleet_model::{MachineState, effective_cost_dollars};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::cmp::Ordering;

/// One scored Same domain, for the verdict's top-K list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DomainCand {
    pub value: u32,
    pub coverage_per_mille: i32,
    pub satisfiable: bool,
}

/// What Phase 1 decided.
#[derive(Debug)]
pub(crate) struct Phase1 {
    /// Per machine rank: index of the claiming need, or `NONE`.
    pub owner: Vec<u32>,
    /// Per need: claimed ranks in claim order.
    pub claims: Vec<Vec<u32>>,
    /// Per need: residual deficit.
    pub remaining: Vec<Qty>,
    /// Per need: chosen Same domain (interned value) or `NONE`.
    pub domain: Vec<u32>,
    pub same_sat: Vec<bool>,
    /// Per need: Idle + Speculative machines claimed.
    pub acquired: Vec<u32>,
    /// Per need (only with verdicts): best-first scored domains.
    pub candidates: Vec<Vec<DomainCand>>,
}

/// Same-domain buckets of one need, in flat reusable arrays (no per-bucket
/// allocation): per bucket a domain value, a member count and three vectors
/// (total, creditable total, own creditable total).
#[derive(Debug, Default)]
struct Buckets {
    dims: usize,
    values: Vec<u32>,
    counts: Vec<u64>,
    total: Vec<i64>,
    cred: Vec<i64>,
    own: Vec<i64>,
    /// Dense value symbol → bucket index (`NONE` = none yet).
    of: Vec<u32>,
}

impl Buckets {
    fn new(dims: usize, values: usize) -> Self {
        Buckets {
            dims,
            of: vec![NONE; values],
            ..Buckets::default()
        }
    }

    fn reset(&mut self) {
        for v in &self.values {
            self.of[*v as usize] = NONE;
        }
        self.values.clear();
        self.counts.clear();
        self.total.clear();
        self.cred.clear();
        self.own.clear();
    }

    fn idx(&mut self, v: u32) -> usize {
        let mut i = self.of[v as usize];
        if i == NONE {
            i = self.values.len() as u32;
            self.of[v as usize] = i;
            self.values.push(v);
            self.counts.push(0);
            let d = self.dims;
            self.total.resize(self.total.len() + d, 0);
            self.cred.resize(self.cred.len() + d, 0);
            self.own.resize(self.own.len() + d, 0);
        }
        i as usize
    }

    fn span(&self, i: usize) -> std::ops::Range<usize> {
        i * self.dims..(i + 1) * self.dims
    }

    /// `n` machines of capacity `cap` in domain `v`; creditable ones also count
    /// as bound supply, own ones as the gang's own.
    fn add(&mut self, v: u32, cap: &[i64], n: u32, creditable: bool, own: bool) {
        let i = self.idx(v);
        let r = self.span(i);
        self.counts[i] += u64::from(n);
        qty::add_scaled(&mut self.total[r.clone()], cap, n);
        if creditable {
            qty::add_scaled(&mut self.cred[r.clone()], cap, n);
        }
        if own {
            qty::add_scaled(&mut self.own[r], cap, n);
        }
    }

    /// Own-incumbent capacity only (the machine is already counted as creditable).
    fn add_own(&mut self, v: u32, cap: &[i64]) {
        let i = self.idx(v);
        let r = self.span(i);
        qty::add_assign(&mut self.own[r], cap);
    }

    fn len(&self) -> usize {
        self.values.len()
    }

    fn scored(&self, i: usize, deficit: &[i64]) -> Scored {
        let r = self.span(i);
        Scored::of(
            self.values[i],
            self.counts[i],
            &self.total[r.clone()],
            &self.cred[r.clone()],
            &self.own[r],
            deficit,
        )
    }
}

#[derive(Debug, Default)]
struct DomList {
    list: Vec<u32>,
    cursor: usize,
}

/// An acquisition pool: a materialised, matching-only list, or (for plain
/// needs over Idle) the snapshot's sorted bucket itself, filtered on the fly
/// so a need that takes a few machines never copies the bucket.
#[derive(Debug)]
enum PoolList<'c> {
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
struct Pool<'c> {
    list: PoolList<'c>,
    /// Every member matches the profile (otherwise check while walking).
    filtered: bool,
    cursor: usize,
    domains: Option<FxHashMap<u32, DomList>>,
}

pub(crate) struct Phase1Pass<'c, 'a> {
    ctx: &'c Ctx<'a>,
    out: Phase1,
    consumed: Vec<bool>,
    gavail: Vec<u32>,
    gcursor: Vec<u32>,
    /// Per group: some member was claimed or consumed other than by the
    /// in-order walk of [`Self::claim_merge`]'s one-group case. While clean,
    /// every member from the group's cursor on is unclaimed and unconsumed,
    /// so that walk can claim a whole run without reading `owner`.
    gdirty: Vec<bool>,
    pools: FxHashMap<(u8, u32), Pool<'c>>,
    /// Per (profile, MinUnit): acquirable supply aggregated per domain.
    acq: FxHashMap<(u32, Qty), AcqIndex>,
    /// Groups of machines virtually consumed so far (in order).
    consumed_log: Vec<u32>,
    buckets: Buckets,
    verdicts: bool,
    candidate_cap: usize,
}

/// Phase 1 `owner` of a machine another shard owns (ADR-0128): not
/// `NONE`, so it is never claimed, and never an index into the needs (only
/// Idle and Speculative machines carry it, which Phase 2 never reads).
pub(crate) const FOREIGN: u32 = NONE - 1;

const ACQ_STATES: [MachineState; 2] = [MachineState::Idle, MachineState::Speculative];

/// Builds the acquisition pool of one (state, profile): Idle by price asc, id
/// asc; Speculative by effective cost asc, id asc; pinned profiles draw only
/// from their instance types' buckets. Only matching machines are kept (the
/// finders would skip the others anyway).
pub(crate) fn build_pool(ctx: &Ctx<'_>, st: MachineState, cp: &CompiledProfile) -> Vec<u32> {
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
                *ec =
                    effective_cost_dollars(rec.price, rec.interruption_probability, cp.ip_dollars);
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
    pub(crate) fn new(ctx: &'c Ctx<'a>, verdicts: bool, candidate_cap: usize) -> Self {
        let n = ctx.needs.len();
        let snap = &ctx.snap;
        let mut pass = Phase1Pass {
            ctx,
            out: Phase1 {
                owner: vec![NONE; snap.slots()],
                claims: vec![Vec::new(); n],
                remaining: ctx.needs.iter().map(|d| d.aggregate.clone()).collect(),
                domain: vec![NONE; n],
                same_sat: vec![false; n],
                acquired: vec![0; n],
                candidates: vec![Vec::new(); if verdicts { n } else { 0 }],
            },
            consumed: vec![false; snap.slots()],
            gavail: snap
                .g
                .groups
                .iter()
                .map(|g| g.members.len() as u32)
                .collect(),
            gcursor: vec![0; snap.g.groups.len()],
            gdirty: vec![false; snap.g.groups.len()],
            pools: FxHashMap::default(),
            acq: FxHashMap::default(),
            consumed_log: Vec::new(),
            buckets: Buckets::new(snap.dims.len(), snap.fleet.values.len()),
            verdicts,
            candidate_cap,
        };
        pass.fence_foreign();
        pass
    }

    /// Takes another shard's Idle and Speculative machines out of reach
    /// before any need looks (ADR-0128): marked claimed by [`FOREIGN`], so
    /// every acquisition walk skips them, and their groups lose them from the
    /// available counts (and stop being claimed as one clean run). Foreign
    /// bound machines stay claimable: crediting them is read-only.
    fn fence_foreign(&mut self) {
        let ctx = self.ctx;
        if ctx.foreign.is_empty() {
            return;
        }
        let snap = &ctx.snap;
        for st in ACQ_STATES {
            for &r in snap.state_list(st) {
                if !ctx.is_foreign(r) {
                    continue;
                }
                self.out.owner[r as usize] = FOREIGN;
                let g = snap.group_of(r);
                if g != NONE {
                    self.gavail[g as usize] -= 1;
                    self.gdirty[g as usize] = true;
                }
            }
        }
    }

    pub(crate) fn run(mut self) -> Phase1 {
        let ctx = self.ctx;
        let n = ctx.needs.len();
        let mut order: Vec<u32> = (0..n as u32).collect();
        // Pre-pass: priority desc only, stable, so equal priorities keep demand order and the
        // pass is deterministic.
        order.sort_by_key(|&i| std::cmp::Reverse(ctx.profile_of(i).priority));
        for &i in &order {
            if ctx.profile_of(i).has_same() {
                self.seed_same(i);
            } else {
                self.credit_plain(i);
            }
        }
        // Acquisition: full precedence desc, stable on demand order (the
        // pre-pass order is already demand order within a priority).
        order.sort_by_key(|&i| std::cmp::Reverse(ctx.profile_of(i).prec));
        for &i in &order {
            if !qty::is_zero(&self.out.remaining[i as usize]) {
                self.acquire(i);
            }
        }
        self.out
    }

    // ---- claim bookkeeping ----

    /// Claims a member of a known group: capacity, state and group come from
    /// the group, sparing a random access to the machine record.
    fn claim_in_group(&mut self, i: u32, r: u32, g: u32) {
        let snap = &self.ctx.snap;
        let grp = &snap.g.groups[g as usize];
        self.gdirty[g as usize] = true;
        debug_assert_eq!(self.out.owner[r as usize], NONE, "machine claimed twice");
        self.out.owner[r as usize] = i;
        self.out.claims[i as usize].push(r);
        qty::sub_assign(&mut self.out.remaining[i as usize], snap.alloc(grp.alloc));
        if matches!(grp.state, MachineState::Idle | MachineState::Speculative) {
            self.out.acquired[i as usize] += 1;
        }
        if !self.consumed[r as usize] {
            self.gavail[g as usize] -= 1;
        }
    }

    fn claim(&mut self, i: u32, r: u32) {
        let snap = &self.ctx.snap;
        debug_assert_eq!(self.out.owner[r as usize], NONE, "machine claimed twice");
        self.out.owner[r as usize] = i;
        self.out.claims[i as usize].push(r);
        qty::sub_assign(&mut self.out.remaining[i as usize], snap.cap(r));
        let rec = snap.rec(r);
        if matches!(rec.state, MachineState::Idle | MachineState::Speculative) {
            self.out.acquired[i as usize] += 1;
        }
        let g = snap.group_of(r);
        if g != NONE {
            self.gdirty[g as usize] = true;
            if !self.consumed[r as usize] {
                self.gavail[g as usize] -= 1;
            }
        }
    }

    /// The clean one-group case of [`Self::claim_merge`]: claims the run of
    /// members from position `c` that covers need `i` (or all of them), with
    /// exactly the outcome of claiming them one by one.
    fn claim_run(&mut self, i: u32, g: u32, c: usize) {
        let snap = &self.ctx.snap;
        let grp = &snap.g.groups[g as usize];
        let cap = snap.alloc(grp.alloc);
        let remaining = &mut self.out.remaining[i as usize];
        let k = qty::units_to_cover(remaining, cap).min((grp.members.len() - c) as u64) as usize;
        if k == 0 {
            return;
        }
        let run = &grp.members[c..c + k];
        for &r in run {
            self.out.owner[r as usize] = i;
        }
        self.out.claims[i as usize].extend_from_slice(run);
        qty::sub_assign_times(remaining, cap, k as i64);
        if matches!(grp.state, MachineState::Idle | MachineState::Speculative) {
            self.out.acquired[i as usize] += k as u32;
        }
        self.gavail[g as usize] -= k as u32;
        self.gcursor[g as usize] = (c + k) as u32;
    }

    #[inline]
    fn unclaimed(&self, r: u32) -> bool {
        self.out.owner[r as usize] == NONE
    }

    #[inline]
    fn done(&self, i: u32) -> bool {
        qty::is_zero(&self.out.remaining[i as usize])
    }

    /// Claims from `groups` (all eligible for need `i`) in keep order — a merge
    /// by keep position — until the need is covered.
    fn claim_merge(&mut self, i: u32, groups: &[u32]) {
        let snap = &self.ctx.snap;
        if let [g] = groups {
            // One eligible group: its members are already in keep order.
            let g = *g;
            let members = &snap.g.groups[g as usize].members;
            let mut c = self.gcursor[g as usize] as usize;
            if !self.gdirty[g as usize] {
                self.claim_run(i, g, c);
                return;
            }
            // Every member is eligible, so everything before the walk position
            // ends up claimed and the cursor follows it.
            while c < members.len() && !self.done(i) {
                let r = members[c];
                if self.unclaimed(r) {
                    self.claim_in_group(i, r, g);
                }
                c += 1;
            }
            self.gcursor[g as usize] = c as u32;
            return;
        }
        loop {
            if self.done(i) {
                return;
            }
            let mut best: Option<(u32, u32)> = None; // (kpos, group)
            for &g in groups {
                let members = &snap.g.groups[g as usize].members;
                let mut c = self.gcursor[g as usize] as usize;
                while c < members.len() && !self.unclaimed(members[c]) {
                    c += 1;
                }
                self.gcursor[g as usize] = c as u32;
                if let Some(&r) = members.get(c) {
                    let k = snap.kpos(r);
                    if best.is_none_or(|(bk, _)| k < bk) {
                        best = Some((k, g));
                    }
                }
            }
            let Some((_, g)) = best else { return };
            let r = snap.g.groups[g as usize].members[self.gcursor[g as usize] as usize];
            self.claim_in_group(i, r, g);
        }
    }

    // ---- pre-pass ----

    /// Bound groups of the need's cluster in `state` that match and fit MinUnit.
    fn eligible_bound_groups(&self, i: u32, state: MachineState, domain: u32) -> Vec<u32> {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let cp = ctx.profile_of(i);
        snap.cluster_groups(dn.cluster)
            .iter()
            .copied()
            .filter(|&g| {
                let grp = &snap.g.groups[g as usize];
                grp.state == state
                    && self.gavail[g as usize] > 0
                    && cp.matches(snap, grp.shape)
                    && qty::covers(snap.alloc(grp.alloc), &dn.min_unit)
                    && (domain == NONE || snap.attr(grp.shape, cp.same_slot.unwrap_or(0)) == domain)
            })
            .collect()
    }

    /// In-flight Creating machines provisioned for this need (ADR-0022): same
    /// destination cluster and fingerprint (and group, for Same needs).
    fn creating_for(&self, i: u32, with_group: bool) -> Vec<u32> {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let cp = ctx.profile_of(i);
        let Some(fp) = snap.fleet.fps.get(cp.fingerprint()) else {
            return Vec::new();
        };
        let group = ctx.need(i).group.as_str();
        let gsym = if group.is_empty() {
            Some(NONE)
        } else {
            snap.fleet.groups.get(group)
        };
        snap.creating(dn.cluster)
            .iter()
            .copied()
            .filter(|&r| {
                let rec = snap.rec(r);
                self.unclaimed(r)
                    && rec.assigned_fingerprint == fp
                    && (!with_group || Some(rec.assigned_group) == gsym)
                    && cp.matches(snap, snap.shape(r))
                    && qty::covers(snap.cap(r), &dn.min_unit)
            })
            .collect()
    }

    fn credit_plain(&mut self, i: u32) {
        for st in BOUND_STATES {
            if self.done(i) {
                return;
            }
            let groups = self.eligible_bound_groups(i, st, NONE);
            self.claim_merge(i, &groups);
        }
        if !self.done(i) {
            for r in self.creating_for(i, false) {
                if self.done(i) {
                    break;
                }
                self.claim(i, r);
            }
        }
    }

    /// The refreshed acquirable index of need `i`'s (profile, MinUnit), taken out
    /// of the cache (put it back with `self.acq.insert`).
    fn take_acq(&mut self, i: u32) -> ((u32, Qty), AcqIndex) {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let key = (dn.profile, dn.min_unit.clone());
        let cap = |g: u32| -> Qty { Qty::from_slice(snap.alloc(snap.g.groups[g as usize].alloc)) };
        let mut idx = match self.acq.remove(&key) {
            Some(idx) => idx,
            None => {
                let cp = ctx.profile_of(i);
                let slot = cp.same_slot.expect("Same profile");
                let groups = snap.g.free_groups.iter().copied().filter_map(|g| {
                    let grp = &snap.g.groups[g as usize];
                    let v = snap.attr(grp.shape, slot);
                    (v != NONE
                        && cp.pinned_allows(snap.g.shapes[grp.shape as usize].itype)
                        && cp.matches(snap, grp.shape)
                        && qty::covers(snap.alloc(grp.alloc), &dn.min_unit))
                    .then_some((g, v))
                });
                let mut idx = AcqIndex::build(snap.dims.len(), groups, self.consumed_log.len());
                for d in 0..idx.values.len() {
                    idx.recompute(d, &self.gavail, cap);
                }
                idx
            }
        };
        idx.refresh(&self.consumed_log, &self.gavail, cap);
        (key, idx)
    }

    /// seedSameProfile: score every domain, record the choice, claim the chosen
    /// domain's creditable members (own incumbents first), then virtually
    /// consume its acquirable members so later needs rank what is left.
    ///
    /// Short-circuit (exact): when some domain's own incumbents alone cover the
    /// deficit, that domain is satisfiable with full bound and own coverage, so
    /// only domains that also reach full own coverage can win (rules 1, 2, 2b).
    /// Only those are scored, unless verdicts want every domain.
    fn seed_same(&mut self, i: u32) {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let need = ctx.need(i);
        let cp = ctx.profile_of(i);
        let slot = cp.same_slot.expect("Same profile");
        let deficit = self.out.remaining[i as usize].clone();
        self.buckets.reset();

        // Own incumbents: machines stamped for exactly this (fingerprint, group),
        // plus Creating machines provisioned for it (ADR-0022).
        let own_key = snap.fleet.fps.get(cp.fingerprint()).and_then(|fp| {
            let g = if need.group.is_empty() {
                Some(NONE)
            } else {
                snap.fleet.groups.get(&need.group)
            };
            g.map(|g| (dn.cluster, fp, g))
        });
        let own_list: &[u32] = own_key
            .and_then(|k| snap.g.own_index.get(&k))
            .map_or(&[], Vec::as_slice);
        let mut own_members: Vec<(u32, u32)> = Vec::new();
        for &r in own_list {
            let sh = snap.shape(r);
            if !self.unclaimed(r) || !cp.matches(snap, sh) {
                continue;
            }
            let v = snap.attr(sh, slot);
            if v == NONE || !qty::covers(snap.cap(r), &dn.min_unit) {
                continue;
            }
            own_members.push((r, v));
        }
        let creating_members: Vec<(u32, u32)> = self
            .creating_for(i, true)
            .into_iter()
            .map(|r| (r, snap.attr(snap.shape(r), slot)))
            .filter(|(_, v)| *v != NONE)
            .collect();

        let positive = deficit.iter().filter(|d| **d > 0).count();
        let mut only: Option<SmallVec<[u32; 4]>> = None;
        if !self.verdicts && positive > 0 {
            let mut own_tot: SmallVec<[(u32, Qty); 4]> = SmallVec::new();
            for &(r, v) in own_members.iter().chain(&creating_members) {
                match own_tot.iter_mut().find(|(d, _)| *d == v) {
                    Some((_, q)) => qty::add_assign(q, snap.cap(r)),
                    None => own_tot.push((v, SmallVec::from_slice(snap.cap(r)))),
                }
            }
            if own_tot.iter().any(|(_, q)| qty::covers(q, &deficit)) {
                let full = positive as f64;
                only = Some(
                    own_tot
                        .iter()
                        .filter(|(_, q)| qty::score(q, &deficit, true) == full)
                        .map(|(d, _)| *d)
                        .collect(),
                );
            }
        }
        let wanted = |v: u32| only.as_ref().is_none_or(|o| o.contains(&v));

        // Creditable half: bound groups of the cluster.
        {
            for &g in snap.cluster_groups(dn.cluster) {
                let avail = self.gavail[g as usize];
                let grp = &snap.g.groups[g as usize];
                if avail == 0 || !cp.matches(snap, grp.shape) {
                    continue;
                }
                let v = snap.attr(grp.shape, slot);
                let cap = snap.alloc(grp.alloc);
                if v == NONE || !wanted(v) || !qty::covers(cap, &dn.min_unit) {
                    continue;
                }
                self.buckets.add(v, cap, avail, true, false);
            }
        }
        for &(r, v) in &own_members {
            if wanted(v) {
                self.buckets.add_own(v, snap.cap(r));
            }
        }
        for &(r, v) in &creating_members {
            if wanted(v) {
                self.buckets.add(v, snap.cap(r), 1, true, true);
            }
        }
        // Acquirable half: shard-wide Idle/Speculative not claimed or consumed,
        // added to the domains that already have buckets; acquirable-only
        // domains are ranked from the index without buckets.
        let mut acq = if dn.parked {
            None
        } else {
            Some(self.take_acq(i))
        };
        if let Some((_, idx)) = &acq {
            for k in 0..self.buckets.len() {
                let v = self.buckets.values[k];
                if let Some(&d) = idx.dom_of.get(&v) {
                    let d = d as usize;
                    let r = self.buckets.span(k);
                    self.buckets.counts[k] += idx.count[d];
                    qty::add_assign(&mut self.buckets.total[r], idx.total(d));
                }
            }
        }
        let mut best: Option<Scored> = None;
        let mut all: Vec<Scored> = Vec::new();
        for k in 0..self.buckets.len() {
            if self.buckets.counts[k] == 0 {
                continue;
            }
            let c = self.buckets.scored(k, &deficit);
            if best.is_none_or(|b| self.better(&c, &b)) {
                best = Some(c);
            }
            if self.verdicts {
                all.push(c);
            }
        }
        if let Some((_, idx)) = &mut acq {
            let of = &self.buckets.of;
            let has_bucket = |v: u32| of[v as usize] != NONE;
            let restricted = |v: u32| only.as_ref().is_some_and(|o| !o.contains(&v));
            if self.verdicts {
                let this = &*self;
                all.extend(
                    idx.top_k(&deficit, self.candidate_cap.max(1), has_bucket, |a, b| {
                        this.better(a, b)
                    }),
                );
            }
            if only.is_none() {
                let this = &*self;
                if let Some(c) = idx.best(
                    &deficit,
                    |v| has_bucket(v) || restricted(v),
                    |a, b| this.better(a, b),
                ) && best.is_none_or(|b| self.better(&c, &b))
                {
                    best = Some(c);
                }
            }
        }
        if let Some((key, idx)) = acq {
            self.acq.insert(key, idx);
        }
        if self.verdicts {
            for c in &all {
                if best.is_none_or(|b| self.better(c, &b)) {
                    best = Some(*c);
                }
            }
            all.sort_by(|a, b| {
                if self.better(a, b) {
                    Ordering::Less
                } else if self.better(b, a) {
                    Ordering::Greater
                } else {
                    Ordering::Equal
                }
            });
            self.out.candidates[i as usize] = all
                .iter()
                .take(self.candidate_cap)
                .map(|c| DomainCand {
                    value: c.value,
                    coverage_per_mille: if positive == 0 {
                        1000
                    } else {
                        ((c.cov / positive as f64) * 1000.0)
                            .floor()
                            .clamp(0.0, 1000.0) as i32
                    },
                    satisfiable: c.sat,
                })
                .collect();
        }
        let Some(best) = best else { return };
        let v = best.value;
        self.out.domain[i as usize] = v;
        self.out.same_sat[i as usize] = best.sat;

        // Claim the chosen domain's creditable members, own incumbents first
        // (each side in keep order), under stop-when-covered.
        for &(r, d) in own_members.iter().chain(&creating_members) {
            if self.done(i) {
                break;
            }
            if d == v && self.unclaimed(r) {
                self.claim(i, r);
            }
        }
        for st in BOUND_STATES {
            if self.done(i) {
                break;
            }
            let groups = self.eligible_bound_groups(i, st, v);
            self.claim_merge(i, &groups);
        }
        if !self.done(i) && !dn.parked {
            self.consume(i, v);
        }
    }

    /// ChooseSameBucket's strict total order: is `c` better than `b`?
    fn better(&self, c: &Scored, b: &Scored) -> bool {
        // 1. satisfiable beats unsatisfiable.
        if c.sat != b.sat {
            return c.sat;
        }
        if c.sat {
            // 2. more of the gang's bound supply; 2b. more of its own machines.
            if c.cred != b.cred {
                return c.cred > b.cred;
            }
            if c.own != b.own {
                return c.own > b.own;
            }
        }
        // 3. least over-commitment when satisfiable, most coverage otherwise.
        if c.s != b.s {
            return if c.sat { c.s < b.s } else { c.s > b.s };
        }
        // 5. switch domains only for strictly more bound supply.
        if c.cred != b.cred {
            return c.cred > b.cred;
        }
        // 6. larger count, then the lexicographically smaller value.
        if c.count != b.count {
            return c.count > b.count;
        }
        let snap = &self.ctx.snap;
        snap.value_name(c.value) < snap.value_name(b.value)
    }

    /// ConsumeAcquirable: virtually take the chosen domain's acquirable members,
    /// in acquisition order (Idle pool, then Speculative pool), until the
    /// residual is covered.
    fn consume(&mut self, i: u32, v: u32) {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let mut rem = self.out.remaining[i as usize].clone();
        for st in ACQ_STATES {
            let mut pool = self.take_pool(st, dn.profile);
            let list = domain_list(&mut pool, snap, ctx.profile_of(i), v);
            for &r in &list.list {
                if !self.unclaimed(r) || self.consumed[r as usize] {
                    continue;
                }
                let cap = snap.cap(r);
                if !qty::covers(cap, &dn.min_unit) {
                    continue;
                }
                self.consumed[r as usize] = true;
                let g = snap.group_of(r);
                self.gavail[g as usize] -= 1;
                self.gdirty[g as usize] = true;
                self.consumed_log.push(g);
                qty::sub_assign(&mut rem, cap);
                if qty::is_zero(&rem) {
                    break;
                }
            }
            self.put_pool(st, dn.profile, pool);
            if qty::is_zero(&rem) {
                return;
            }
        }
    }

    // ---- acquisition ----

    fn take_pool(&mut self, st: MachineState, cp_id: u32) -> Pool<'c> {
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

    fn put_pool(&mut self, st: MachineState, cp: u32, pool: Pool<'c>) {
        self.pools.insert((st as u8, cp), pool);
    }

    fn acquire(&mut self, i: u32) {
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
    fn find_basic(&self, i: u32, pool: &mut Pool<'c>) -> Vec<u32> {
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

    fn take_greedy(&self, i: u32, list: &[u32]) -> Vec<u32> {
        self.take_greedy_checked(i, list, None)
    }

    fn take_greedy_checked(
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
    fn find_same(&self, i: u32, pool: &mut Pool<'c>, v: u32) -> Vec<u32> {
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
    fn find_same_fallback(&self, i: u32, pool: &Pool<'c>) -> Vec<u32> {
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
    fn find_spread(&self, i: u32, pool: &Pool<'c>, slot: usize, max_skew: i32) -> Vec<u32> {
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
fn domain_list<'p>(
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
