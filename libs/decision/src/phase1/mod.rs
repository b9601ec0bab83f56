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
//!
//! This module holds the pass, its output and the claim bookkeeping both halves share;
//! `prepass` credits bound supply and picks Same domains, `acquire` takes Idle and
//! Speculative machines from the pools.

mod acquire;
mod prepass;

use crate::context::Ctx;
use crate::intern::NONE;
use crate::qty::{self, Qty};
use crate::same::AcqIndex;
use acquire::Pool;
use bigfleet_model::MachineState;
use prepass::Buckets;
use rustc_hash::FxHashMap;

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

pub(crate) struct Phase1Pass<'c, 'a> {
    ctx: &'c Ctx<'a>,
    out: Phase1,
    consumed: Vec<bool>,
    group_available: Vec<u32>,
    group_cursor: Vec<u32>,
    /// Per group: some member was claimed or consumed other than by the
    /// in-order walk of [`Self::claim_merge`]'s one-group case. While clean,
    /// every member from the group's cursor on is unclaimed and unconsumed,
    /// so that walk can claim a whole run without reading `owner`.
    group_dirty: Vec<bool>,
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
            group_available: snap
                .grouping
                .groups
                .iter()
                .map(|g| g.members.len() as u32)
                .collect(),
            group_cursor: vec![0; snap.grouping.groups.len()],
            group_dirty: vec![false; snap.grouping.groups.len()],
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
                    self.group_available[g as usize] -= 1;
                    self.group_dirty[g as usize] = true;
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
        order.sort_by_key(|&i| std::cmp::Reverse(ctx.profile_of(i).precedence));
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
        let grp = &snap.grouping.groups[g as usize];
        self.group_dirty[g as usize] = true;
        debug_assert_eq!(self.out.owner[r as usize], NONE, "machine claimed twice");
        self.out.owner[r as usize] = i;
        self.out.claims[i as usize].push(r);
        qty::sub_assign(&mut self.out.remaining[i as usize], snap.alloc(grp.alloc));
        if matches!(grp.state, MachineState::Idle | MachineState::Speculative) {
            self.out.acquired[i as usize] += 1;
        }
        if !self.consumed[r as usize] {
            self.group_available[g as usize] -= 1;
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
            self.group_dirty[g as usize] = true;
            if !self.consumed[r as usize] {
                self.group_available[g as usize] -= 1;
            }
        }
    }

    /// The clean one-group case of [`Self::claim_merge`]: claims the run of
    /// members from position `c` that covers need `i` (or all of them), with
    /// exactly the outcome of claiming them one by one.
    fn claim_run(&mut self, i: u32, g: u32, c: usize) {
        let snap = &self.ctx.snap;
        let grp = &snap.grouping.groups[g as usize];
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
        self.group_available[g as usize] -= k as u32;
        self.group_cursor[g as usize] = (c + k) as u32;
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
            let members = &snap.grouping.groups[g as usize].members;
            let mut c = self.group_cursor[g as usize] as usize;
            if !self.group_dirty[g as usize] {
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
            self.group_cursor[g as usize] = c as u32;
            return;
        }
        loop {
            if self.done(i) {
                return;
            }
            let mut best: Option<(u32, u32)> = None; // (kpos, group)
            for &g in groups {
                let members = &snap.grouping.groups[g as usize].members;
                let mut c = self.group_cursor[g as usize] as usize;
                while c < members.len() && !self.unclaimed(members[c]) {
                    c += 1;
                }
                self.group_cursor[g as usize] = c as u32;
                if let Some(&r) = members.get(c) {
                    let k = snap.kpos(r);
                    if best.is_none_or(|(bk, _)| k < bk) {
                        best = Some((k, g));
                    }
                }
            }
            let Some((_, g)) = best else { return };
            let r =
                snap.grouping.groups[g as usize].members[self.group_cursor[g as usize] as usize];
            self.claim_in_group(i, r, g);
        }
    }
}
