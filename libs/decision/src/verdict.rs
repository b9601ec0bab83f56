//! Per-need verdicts (ADR-0061 + amendment): observation only, computed from
//! the phases' results after they finished, so they cannot change any claim.
//! Reasons follow the seed's taxonomy (ADR-0115, superseding ADR-0025's
//! precedence).

use crate::context::Ctx;
use crate::demand::Src;
use crate::intern::NONE;
use crate::phase1::Phase1;
use crate::phase2::Phase2;
use crate::qty::{self, Qty};
use bigfleet_model::{MachineState, Need, ResourceVector, wire_enum};
use rustc_hash::FxHashMap;
use serde::Serialize;

wire_enum! {
    /// Why a need is unmet (wire enum `UnmetReason` ordinals).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
    pub enum UnmetReason {
        /// Also used for satisfied needs.
        Unspecified = 0,
        /// Matching supply exists but is held: by needs at least as important, by
        /// this need itself (it holds every matching machine and is still short),
        /// by machines in transit (Configuring, Creating, Draining, Deleting), or
        /// by victims Phase 2 picked that are still draining (ADR-0115).
        PriorityStarved = 1,
        /// No machine matching the profile and fitting MinUnit exists in any state
        /// but Failed, whoever holds it (`matching_supply` is then all zero).
        NoMatchingSupply = 2,
        /// A Same need with no satisfiable domain (checked before every supply
        /// reason, as the seed's Tier 1 defines it).
        TopologyUnsatisfiable = 3,
        /// Phase 2 picked victims for the need and it is still short after them.
        PreemptionExhausted = 4,
    }
}

/// Matching, MinUnit-fitting machines per state, each count capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct MatchingSupply {
    pub idle: u32,
    pub configured: u32,
    pub speculative: u32,
    /// At least one count hit the cap.
    pub capped: bool,
}

impl MatchingSupply {
    pub fn is_empty(&self) -> bool {
        self.idle == 0 && self.configured == 0 && self.speculative == 0
    }
}

/// What Phase 2 picked for the need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreemptionSummary {
    pub victims_found: u32,
    pub capacity_freed: ResourceVector,
}

/// One scored Same domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DomainCoverage {
    pub domain: String,
    /// Capped coverage of the residual, 0..=1000.
    pub coverage_per_mille: i32,
    pub satisfiable: bool,
}

/// Which demand row(s) a verdict is about.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum VerdictSource {
    /// A row of the input demand, by index.
    Demand(usize),
    /// A need NormalizeDemand folded from these input rows.
    Folded { need: Need, members: Vec<usize> },
}

/// The engine's verdict on one (normalized) need this cycle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NeedVerdict {
    pub source: VerdictSource,
    pub satisfied: bool,
    /// Phase 1's residual (empty when satisfied).
    pub residual_deficit: ResourceVector,
    pub claimed_machine_count: u32,
    pub bootstrap_count: u32,
    pub provision_count: u32,
    pub same_domain: String,
    pub same_satisfiable: bool,
    pub acquisition_parked: bool,
    pub parked_age_cycles: u32,
    pub unmet_reason: UnmetReason,
    /// Only when unsatisfied.
    pub matching_supply: Option<MatchingSupply>,
    /// Only when Phase 2 picked victims.
    pub preemption: Option<PreemptionSummary>,
    /// Best first, capped.
    pub same_candidates: Vec<DomainCoverage>,
}

/// Index of a state in matching-supply counts.
fn supply_slot(st: MachineState) -> Option<usize> {
    match st {
        MachineState::Idle => Some(0),
        MachineState::Configured => Some(1),
        MachineState::Speculative => Some(2),
        _ => None,
    }
}

/// States whose matching machines are supply in transit: not counted in
/// `matching_supply`, but they exist, so the need is not NO_MATCHING_SUPPLY
/// (ADR-0115). Failed machines are not supply.
const TRANSIT_STATES: [MachineState; 4] = [
    MachineState::Configuring,
    MachineState::Creating,
    MachineState::Draining,
    MachineState::Deleting,
];

/// Whether any machine in a [`TRANSIT_STATES`] state matches and fits MinUnit.
/// Only asked when the three counted states hold none, which is rare.
fn matching_in_transit(ctx: &Ctx<'_>, cp_id: u32, mu: &[i64]) -> bool {
    let snap = &ctx.snap;
    let cp = &ctx.profiles.compiled[cp_id as usize];
    TRANSIT_STATES.iter().any(|&st| {
        snap.state_list(st)
            .iter()
            .any(|&r| cp.matches(snap, snap.shape(r)) && qty::covers(snap.cap(r), mu))
    })
}

/// Matching, MinUnit-fitting machines per state (Idle, Configured,
/// Speculative), uncapped; one pass over the machine groups.
fn matching_counts(ctx: &Ctx<'_>, cp_id: u32, mu: &[i64]) -> [u64; 3] {
    let snap = &ctx.snap;
    let cp = &ctx.profiles.compiled[cp_id as usize];
    let mut counts = [0u64; 3];
    for g in &snap.grouping.groups {
        let Some(k) = supply_slot(g.state) else {
            continue;
        };
        if cp.matches(snap, g.shape) && qty::covers(snap.alloc(g.alloc), mu) {
            counts[k] += g.members.len() as u64;
        }
    }
    counts
}

fn capped(counts: [u64; 3], cap: u32) -> MatchingSupply {
    let c = |v: u64| v.min(u64::from(cap)) as u32;
    MatchingSupply {
        idle: c(counts[0]),
        configured: c(counts[1]),
        speculative: c(counts[2]),
        capped: counts.iter().any(|c| *c >= u64::from(cap)),
    }
}

pub(crate) fn build(
    ctx: &Ctx<'_>,
    p1: &Phase1,
    p2: &Phase2,
    parked_ages: &[u32],
    supply_cap: u32,
) -> Vec<NeedVerdict> {
    let snap = &ctx.snap;
    let n = ctx.needs.len();
    let unresolved: FxHashMap<u32, &Qty> =
        p2.unresolved.iter().map(|u| (u.need, &u.deficit)).collect();
    // Matching supply per distinct (profile, MinUnit) of unsatisfied needs.
    let mut keys: Vec<(u32, Qty)> = (0..n)
        .filter(|&i| !qty::is_zero(&p1.remaining[i]))
        .map(|i| (ctx.needs[i].profile, ctx.needs[i].min_unit.clone()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    // Per key: the counted states, and whether any matching machine exists at
    // all (the counted states or one in transit).
    let count = |cp: u32, mu: &Qty| {
        let c = matching_counts(ctx, cp, mu);
        let exists = c.iter().any(|n| *n > 0) || matching_in_transit(ctx, cp, mu);
        (c, exists)
    };
    let supplies: Vec<([u64; 3], bool)> = if ctx.par.on() && keys.len() > 1 {
        use rayon::prelude::*;
        ctx.par
            .run(|| keys.par_iter().map(|(cp, mu)| count(*cp, mu)).collect())
    } else {
        keys.iter().map(|(cp, mu)| count(*cp, mu)).collect()
    };
    let supply: FxHashMap<(u32, &Qty), ([u64; 3], bool)> = keys
        .iter()
        .zip(supplies)
        .map(|((cp, mu), s)| ((*cp, mu), s))
        .collect();

    (0..n)
        .map(|i| {
            let dn = &ctx.needs[i];
            let cp = &ctx.profiles.compiled[dn.profile as usize];
            let claims = &p1.claims[i];
            let count_state = |st: MachineState| {
                claims.iter().filter(|&&r| snap.rec(r).state == st).count() as u32
            };
            let satisfied = qty::is_zero(&p1.remaining[i]);
            let pre = &p2.preemption[i];
            let found = (!satisfied).then(|| supply[&(dn.profile, &dn.min_unit)]);
            let matching = found.map(|(c, _)| capped(c, supply_cap));
            // The seed's taxonomy (ADR-0115): Tier 1 first (a Same need with no
            // satisfiable domain), then Tier 2 split by whether matching supply
            // exists in any state, whoever holds it (this need included), and
            // whether Phase 2's picks fell short.
            let unmet_reason = if satisfied {
                UnmetReason::Unspecified
            } else if cp.has_same() && !p1.same_sat[i] {
                UnmetReason::TopologyUnsatisfiable
            } else if !found.is_some_and(|(_, exists)| exists) {
                UnmetReason::NoMatchingSupply
            } else if pre.victims > 0 && unresolved.contains_key(&(i as u32)) {
                UnmetReason::PreemptionExhausted
            } else {
                UnmetReason::PriorityStarved
            };
            let source = match dn.src {
                Src::Input(k) => VerdictSource::Demand(k as usize),
                Src::Folded(f) => VerdictSource::Folded {
                    need: ctx.folded[f as usize].clone(),
                    members: ctx.fold_members[f as usize]
                        .iter()
                        .map(|m| *m as usize)
                        .collect(),
                },
            };
            let domain = p1.domain[i];
            NeedVerdict {
                source,
                satisfied,
                residual_deficit: if satisfied {
                    ResourceVector::new()
                } else {
                    snap.dims.to_vector(&p1.remaining[i])
                },
                claimed_machine_count: claims.len() as u32,
                bootstrap_count: count_state(MachineState::Idle),
                provision_count: count_state(MachineState::Speculative),
                same_domain: if domain == NONE {
                    String::new()
                } else {
                    snap.value_name(domain).to_owned()
                },
                same_satisfiable: p1.same_sat[i],
                acquisition_parked: dn.parked,
                parked_age_cycles: parked_ages.get(i).copied().unwrap_or(0),
                unmet_reason,
                matching_supply: matching,
                preemption: pre.freed.as_ref().map(|f| PreemptionSummary {
                    victims_found: pre.victims,
                    capacity_freed: snap.dims.to_vector(f),
                }),
                same_candidates: p1
                    .candidates
                    .get(i)
                    .map(|cs| {
                        cs.iter()
                            .map(|c| DomainCoverage {
                                domain: snap.value_name(c.value).to_owned(),
                                coverage_per_mille: c.coverage_per_mille,
                                satisfiable: c.satisfiable,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect()
}
