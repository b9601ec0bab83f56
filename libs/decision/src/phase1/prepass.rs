//! Phase 1's pre-pass: bound supply credited to each need in priority order, and each
//! Same need's domain chosen by scoring its buckets (bound, creditable and own capacity
//! per domain against the need's deficit).

use super::acquire::domain_list;
use super::{ACQ_STATES, DomainCand, Phase1Pass};
use crate::intern::NONE;
use crate::qty::{self, Qty};
use crate::same::{AcqIndex, Scored};
use crate::snapshot::BOUND_STATES;
use bigfleet_model::MachineState;
use smallvec::SmallVec;
use std::cmp::Ordering;

/// Same-domain buckets of one need, in flat reusable arrays (no per-bucket
/// allocation): per bucket a domain value, a member count and three vectors
/// (total, creditable total, own creditable total).
#[derive(Debug, Default)]
pub(super) struct Buckets {
    pub(super) dims: usize,
    pub(super) values: Vec<u32>,
    pub(super) counts: Vec<u64>,
    pub(super) total: Vec<i64>,
    pub(super) cred: Vec<i64>,
    pub(super) own: Vec<i64>,
    /// Dense value symbol → bucket index (`NONE` = none yet).
    pub(super) of: Vec<u32>,
}

impl Buckets {
    pub(super) fn new(dims: usize, values: usize) -> Self {
        Buckets {
            dims,
            of: vec![NONE; values],
            ..Buckets::default()
        }
    }

    pub(super) fn reset(&mut self) {
        for v in &self.values {
            self.of[*v as usize] = NONE;
        }
        self.values.clear();
        self.counts.clear();
        self.total.clear();
        self.cred.clear();
        self.own.clear();
    }

    pub(super) fn idx(&mut self, v: u32) -> usize {
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

    pub(super) fn span(&self, i: usize) -> std::ops::Range<usize> {
        i * self.dims..(i + 1) * self.dims
    }

    /// `n` machines of capacity `cap` in domain `v`; creditable ones also count
    /// as bound supply, own ones as the gang's own.
    pub(super) fn add(&mut self, v: u32, cap: &[i64], n: u32, creditable: bool, own: bool) {
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
    pub(super) fn add_own(&mut self, v: u32, cap: &[i64]) {
        let i = self.idx(v);
        let r = self.span(i);
        qty::add_assign(&mut self.own[r], cap);
    }

    pub(super) fn len(&self) -> usize {
        self.values.len()
    }

    pub(super) fn scored(&self, i: usize, deficit: &[i64]) -> Scored {
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

impl<'c, 'a> Phase1Pass<'c, 'a> {
    // ---- pre-pass ----

    /// Bound groups of the need's cluster in `state` that match and fit MinUnit.
    pub(super) fn eligible_bound_groups(
        &self,
        i: u32,
        state: MachineState,
        domain: u32,
    ) -> Vec<u32> {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let cp = ctx.profile_of(i);
        snap.cluster_groups(dn.cluster)
            .iter()
            .copied()
            .filter(|&g| {
                let grp = &snap.grouping.groups[g as usize];
                grp.state == state
                    && self.group_available[g as usize] > 0
                    && cp.matches(snap, grp.shape)
                    && qty::covers(snap.alloc(grp.alloc), &dn.min_unit)
                    && (domain == NONE || snap.attr(grp.shape, cp.same_slot.unwrap_or(0)) == domain)
            })
            .collect()
    }

    /// In-flight Creating machines provisioned for this need (ADR-0022): same
    /// destination cluster and fingerprint (and group, for Same needs).
    pub(super) fn creating_for(&self, i: u32, with_group: bool) -> Vec<u32> {
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

    pub(super) fn credit_plain(&mut self, i: u32) {
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
    pub(super) fn take_acq(&mut self, i: u32) -> ((u32, Qty), AcqIndex) {
        let ctx = self.ctx;
        let snap = &ctx.snap;
        let dn = &ctx.needs[i as usize];
        let key = (dn.profile, dn.min_unit.clone());
        let cap =
            |g: u32| -> Qty { Qty::from_slice(snap.alloc(snap.grouping.groups[g as usize].alloc)) };
        let mut idx = match self.acq.remove(&key) {
            Some(idx) => idx,
            None => {
                let cp = ctx.profile_of(i);
                let slot = cp.same_slot.expect("Same profile");
                let groups = snap.grouping.free_groups.iter().copied().filter_map(|g| {
                    let grp = &snap.grouping.groups[g as usize];
                    let v = snap.attr(grp.shape, slot);
                    (v != NONE
                        && cp.pinned_allows(snap.grouping.shapes[grp.shape as usize].itype)
                        && cp.matches(snap, grp.shape)
                        && qty::covers(snap.alloc(grp.alloc), &dn.min_unit))
                    .then_some((g, v))
                });
                let mut idx = AcqIndex::build(snap.dims.len(), groups, self.consumed_log.len());
                for d in 0..idx.values.len() {
                    idx.recompute(d, &self.group_available, cap);
                }
                idx
            }
        };
        idx.refresh(&self.consumed_log, &self.group_available, cap);
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
    pub(super) fn seed_same(&mut self, i: u32) {
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
            .and_then(|k| snap.grouping.own_index.get(&k))
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
                let avail = self.group_available[g as usize];
                let grp = &snap.grouping.groups[g as usize];
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
    pub(super) fn better(&self, c: &Scored, b: &Scored) -> bool {
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
    pub(super) fn consume(&mut self, i: u32, v: u32) {
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
                self.group_available[g as usize] -= 1;
                self.group_dirty[g as usize] = true;
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
}
