//! Phase 2: priority preemption for Phase 1's residual.

use crate::context::Ctx;
use crate::intern::NONE;
use crate::phase1::Phase1;
use crate::qty::{self, Qty};
use crate::scoring::{Phase2Options, drain_grace, victim_score};
use bigfleet_model::{Action, MachineState};
use rustc_hash::FxHashMap;

/// One need still short after Phase 2.
#[derive(Debug, Clone)]
pub(crate) struct Unresolved {
    pub need: u32,
    pub deficit: Qty,
}

/// What Phase 2 did for one need (observation only).
#[derive(Debug, Clone, Default)]
pub(crate) struct Preemption {
    pub victims: u32,
    pub freed: Option<Qty>,
}

#[derive(Debug, Default)]
pub(crate) struct Phase2 {
    pub actions: Vec<Action>,
    pub unresolved: Vec<Unresolved>,
    /// Per need.
    pub preemption: Vec<Preemption>,
    /// Per machine rank: picked as a victim.
    pub taken: Vec<bool>,
}

/// Scored victim candidates for (profile, preemptor priority): Configured
/// machines of the pinned types (or all), strictly lower assigned priority,
/// matching; best victim first, ties by id.
fn candidates(ctx: &Ctx<'_>, cp_id: u32, prio: i32, opts: &Phase2Options) -> Vec<u32> {
    let snap = &ctx.snap;
    let cp = &ctx.profiles.compiled[cp_id as usize];
    let st = MachineState::Configured;
    // Min-priority short-circuit: nothing in the pool can be a victim.
    let no_victims = match &cp.pinned {
        Some(ts) => ts.iter().all(|t| snap.type_min_prio(st, *t) >= prio),
        None => snap.min_prio[st as usize] >= prio,
    };
    if no_victims {
        return Vec::new();
    }
    let keep = |r: &u32| {
        let rec = snap.rec(*r);
        rec.assigned_priority < prio && !ctx.is_foreign(*r) && cp.matches(snap, snap.shape(*r))
    };
    let pool: Vec<u32> = match &cp.pinned {
        Some(ts) => ts
            .iter()
            .flat_map(|t| snap.type_list(st, *t).iter().copied())
            .filter(keep)
            .collect(),
        None => snap.state_list(st).iter().copied().filter(keep).collect(),
    };
    let mut scored: Vec<(f64, u32)> = pool
        .into_iter()
        .map(|r| {
            let rec = snap.rec(r);
            (
                victim_score(
                    prio,
                    rec.assigned_priority,
                    rec.assigned_interruption_penalty,
                    rec.assigned_reclamation_penalty,
                    opts.estimated_drain,
                    &opts.weights,
                ),
                r,
            )
        })
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(snap.rank(a.1).cmp(&snap.rank(b.1)))
    });
    scored.into_iter().map(|(_, r)| r).collect()
}

pub(crate) fn run(ctx: &Ctx<'_>, p1: &Phase1, opts: &Phase2Options) -> Phase2 {
    let snap = &ctx.snap;
    let n = ctx.needs.len();
    let mut out = Phase2 {
        preemption: vec![Preemption::default(); n],
        taken: vec![false; snap.slots()],
        ..Phase2::default()
    };
    let mut unsat: Vec<u32> = (0..n as u32)
        .filter(|&i| !qty::is_zero(&p1.remaining[i as usize]))
        .collect();
    if unsat.is_empty() {
        return out;
    }
    // Highest preemptor priority gets first refusal.
    unsat.sort_by_key(|&i| std::cmp::Reverse(ctx.profile_of(i).priority));
    let eligible = |i: u32| {
        let dn = &ctx.needs[i as usize];
        let cp = ctx.profile_of(i);
        !(dn.parked || cp.has_same() && p1.domain[i as usize] == NONE)
    };

    // Score candidate lists for every distinct (profile, priority) up front, in
    // parallel when allowed; each list is a pure function of its key.
    let mut keys: Vec<(u32, i32)> = unsat
        .iter()
        .filter(|&&i| eligible(i))
        .map(|&i| (ctx.needs[i as usize].profile, ctx.profile_of(i).priority))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let lists: Vec<Vec<u32>> = if ctx.par.on() && keys.len() > 1 {
        use rayon::prelude::*;
        ctx.par.run(|| {
            keys.par_iter()
                .map(|&(cp, prio)| candidates(ctx, cp, prio, opts))
                .collect()
        })
    } else {
        keys.iter()
            .map(|&(cp, prio)| candidates(ctx, cp, prio, opts))
            .collect()
    };
    let cache: FxHashMap<(u32, i32), &Vec<u32>> = keys.iter().copied().zip(lists.iter()).collect();

    let taken = &mut out.taken;
    for &i in &unsat {
        let dn = &ctx.needs[i as usize];
        let cp = ctx.profile_of(i);
        let deficit = &p1.remaining[i as usize];
        if !eligible(i) {
            out.unresolved.push(Unresolved {
                need: i,
                deficit: deficit.clone(),
            });
            continue;
        }
        let prio = cp.priority;
        let list = cache[&(dn.profile, prio)];
        let domain = p1.domain[i as usize];
        let mut rem = deficit.clone();
        let mut freed = snap.dims.zero();
        let mut picked = 0u32;
        for &r in list {
            if taken[r as usize] {
                continue;
            }
            let rec = snap.rec(r);
            let cap = snap.cap(r);
            if !qty::covers(cap, &dn.min_unit) {
                continue;
            }
            if let Some(slot) = cp.same_slot
                && snap.attr(snap.shape(r), slot) != domain
            {
                continue;
            }
            // A machine Phase 1 credited to a need at least as important as the
            // preemptor is not a victim, whatever its stale stamp says (ADR-0024).
            let owner = p1.owner[r as usize];
            if owner != NONE && ctx.profile_of(owner).priority >= prio {
                continue;
            }
            taken[r as usize] = true;
            picked += 1;
            qty::sub_assign(&mut rem, cap);
            qty::add_assign(&mut freed, cap);
            out.actions.push(Action::Preempt {
                machine_id: snap.id(r).to_owned(),
                cluster: snap.cluster_name(rec.cluster).to_owned(),
                grace: drain_grace(prio, rec.assigned_priority),
                preemptor_priority: prio,
            });
            if qty::is_zero(&rem) {
                break;
            }
        }
        out.preemption[i as usize] = Preemption {
            victims: picked,
            freed: (picked > 0).then_some(freed),
        };
        if !qty::is_zero(&rem) {
            out.unresolved.push(Unresolved {
                need: i,
                deficit: rem,
            });
        }
    }
    out
}
