//! One decision cycle: snapshot → NormalizeDemand → parking stamps → Phase 1 →
//! Phase 2 → Phase 3 → shortfall seeds (+ verdicts). Pure: the only clock is
//! the injected `now`.

use crate::EngineError;
use crate::context::{Ctx, Parallelism, pool_for};
use crate::fleet::Fleet;
use crate::ownership::Ownership;
use crate::parking::{ParkingLedger, ParkingObservation, parking_key};
use crate::phase1::{Phase1, Phase1Pass};
use crate::qty::{self, Qty};
use crate::scoring::{Phase2Options, ReleasePolicy};
use crate::verdict::{self, NeedVerdict};
use crate::{phase2, phase3};
use bigfleet_model::{
    Action, Assignment, ClusterId, Machine, MachineId, MachineState, Need, Profile, ResourceVector,
};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// Cap on each per-state count of a verdict's matching supply (ADR-0025).
pub const MATCHING_SUPPLY_CAP: u32 = 1000;
/// How many scored Same domains a verdict keeps (ADR-0025).
pub const SAME_CANDIDATE_CAP: usize = 5;

/// Everything one cycle reads. Borrowed: the engine allocates no copy of the
/// inventory or the demand.
#[derive(Clone, Copy)]
pub struct CycleInput<'a> {
    /// The shard's incrementally maintained inventory (the fast path). When
    /// set, `machines` and `idle_since` must be empty.
    pub fleet: Option<&'a Fleet>,
    /// Convenience inventory: a machine slice, turned into a temporary
    /// [`Fleet`] every call (any order; duplicate ids are an error).
    pub machines: &'a [Machine],
    /// Idle-since stamps (UNIX nanos) aligned with `machines`; empty = none known.
    pub idle_since: &'a [Option<i64>],
    /// Destination clusters of in-flight Provisions (Creating machines), by
    /// machine id, from the shard's action ledger (ADR-0022).
    pub creating_destinations: Option<&'a HashMap<MachineId, ClusterId>>,
    /// The NeedsTable snapshot: priority desc, arrival asc, cluster asc.
    pub demand: &'a [Need],
    pub now_unix_nanos: i64,
    /// The shard's parking ledger (read-only here; update it with [`CycleOutput::parking`]).
    pub parking: Option<&'a ParkingLedger>,
    /// First-rollup gate: may Phase 3 reclaim in this cluster? `None` = every cluster.
    pub cluster_ready: Option<&'a (dyn Fn(&str) -> bool + Sync)>,
    /// The machines this shard may act on (ADR-0128); `None` = every machine.
    /// Foreign machines stay facts: no action ever names one.
    pub ownership: Option<&'a Ownership>,
    /// Every resource name the demand's aggregates and min units carry, when the
    /// caller keeps that set as demand changes (it saves reading every vector each
    /// cycle). Exactly that set: a missing name is an error, an extra one a
    /// dimension nobody asked for. `None`: the engine reads the vectors.
    pub demand_dimensions: Option<&'a [String]>,
}

impl<'a> CycleInput<'a> {
    /// Over a fleet (the shard's fast path).
    pub fn with_fleet(fleet: &'a Fleet, demand: &'a [Need]) -> Self {
        CycleInput {
            fleet: Some(fleet),
            ..CycleInput::new(&[], demand)
        }
    }

    /// Over a machine slice (tests, tools).
    pub fn new(machines: &'a [Machine], demand: &'a [Need]) -> Self {
        CycleInput {
            fleet: None,
            machines,
            idle_since: &[],
            creating_destinations: None,
            demand,
            now_unix_nanos: 0,
            parking: None,
            cluster_ready: None,
            ownership: None,
            demand_dimensions: None,
        }
    }
}

/// Per-cycle knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct CycleOptions {
    /// Compute per-need verdicts (observation only).
    pub verdicts: bool,
    /// 1 = strictly sequential; 0 = the caller's rayon pool; n = a cached pool
    /// of n threads. Output is identical for every value.
    pub threads: usize,
    pub phase2: Phase2Options,
    pub release: ReleasePolicy,
    pub matching_supply_cap: u32,
    pub same_candidate_cap: usize,
    /// Report Phase 1's claimed set in [`CycleOutput::claims`] (debugging aid).
    pub claims: bool,
}

impl Default for CycleOptions {
    fn default() -> Self {
        CycleOptions {
            verdicts: false,
            threads: 1,
            phase2: Phase2Options::default(),
            release: ReleasePolicy::default(),
            matching_supply_cap: MATCHING_SUPPLY_CAP,
            same_candidate_cap: SAME_CANDIDATE_CAP,
            claims: false,
        }
    }
}

/// A residual that Phase 2 could not free, summed per profile fingerprint (ADR-0026).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShortfallSeed {
    pub profile: Arc<Profile>,
    pub deficit: ResourceVector,
}

/// One machine Phase 1 attributed to a need (its only supply attribution).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Claim {
    pub machine_id: MachineId,
    /// Index into the normalized demand (= the verdict index).
    pub need: usize,
    pub state: MachineState,
}

/// Counters for metrics and benchmarks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CycleStats {
    pub machines: usize,
    pub needs: usize,
    pub normalized_needs: usize,
    pub folded_needs: usize,
    pub bootstraps: usize,
    pub provisions: usize,
    pub preempts: usize,
    pub reclaims: usize,
    pub releases: usize,
    pub unsatisfied: usize,
    pub unresolved: usize,
    pub snapshot_bytes: usize,
}

/// What one cycle decided.
#[derive(Debug, Clone, PartialEq)]
pub struct CycleOutput {
    /// Phase 1 (per need in normalized demand order: Bootstraps, then
    /// Provisions), then Phase 2 Preempts, then Phase 3 Reclaims and Releases.
    pub actions: Vec<Action>,
    /// Per normalized need, in normalized demand order (empty unless enabled).
    pub verdicts: Vec<NeedVerdict>,
    pub shortfalls: Vec<ShortfallSeed>,
    /// Feed to [`ParkingLedger::observe`].
    pub parking: Vec<ParkingObservation>,
    /// Phase 1's claimed set, per need in claim order (empty unless enabled).
    pub claims: Vec<Claim>,
    pub stats: CycleStats,
}

/// Runs one decision cycle.
pub fn run_cycle(input: &CycleInput<'_>, opts: &CycleOptions) -> Result<CycleOutput, EngineError> {
    let par = match opts.threads {
        1 => Parallelism::Off,
        0 if rayon::current_num_threads() > 1 => Parallelism::Current,
        0 => Parallelism::Off,
        t => Parallelism::Pool(pool_for(t)),
    };
    run_inner(input, opts, par)
}

fn run_inner(
    input: &CycleInput<'_>,
    opts: &CycleOptions,
    par: Parallelism,
) -> Result<CycleOutput, EngineError> {
    let owned;
    let fleet = match input.fleet {
        Some(f) => {
            if !input.machines.is_empty() || !input.idle_since.is_empty() {
                return Err(EngineError::TwoInventories);
            }
            f
        }
        None => {
            owned = Fleet::from_machines(input.machines, input.idle_since)?;
            &owned
        }
    };
    let mut ctx = Ctx::compile(fleet, input, par, opts.verdicts);
    ctx.normalize();
    let parked_ages = stamp_parked(&mut ctx, input.parking);

    let p1 = Phase1Pass::new(&ctx, opts.verdicts, opts.same_candidate_cap).run();
    let parking = parking_observations(&ctx, &p1);
    let p2 = phase2::run(&ctx, &p1, &opts.phase2);
    let all_ready = |_: &str| true;
    let ready: &(dyn Fn(&str) -> bool + Sync) = input.cluster_ready.unwrap_or(&all_ready);
    let p3 = phase3::run(&ctx, &p1, &p2, ready, &opts.release, input.now_unix_nanos);

    let mut actions = phase1_actions(&ctx, &p1);
    let (bootstraps, provisions) = count_kinds(&actions);
    let preempts = p2.actions.len();
    actions.extend(p2.actions.iter().cloned());
    let reclaims = p3
        .iter()
        .filter(|a| matches!(a, Action::Reclaim { .. }))
        .count();
    let releases = p3.len() - reclaims;
    actions.extend(p3);

    let shortfalls = shortfall_seeds(&ctx, &p2);
    let verdicts = if opts.verdicts {
        verdict::build(&ctx, &p1, &p2, &parked_ages, opts.matching_supply_cap)
    } else {
        Vec::new()
    };
    let claims = if opts.claims {
        p1.claims
            .iter()
            .enumerate()
            .flat_map(|(need, rs)| {
                let snap = &ctx.snap;
                rs.iter().map(move |&r| Claim {
                    machine_id: snap.id(r).to_owned(),
                    need,
                    state: snap.rec(r).state,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let stats = CycleStats {
        machines: ctx.snap.len(),
        needs: input.demand.len(),
        normalized_needs: ctx.needs.len(),
        folded_needs: ctx.folded.len(),
        bootstraps,
        provisions,
        preempts,
        reclaims,
        releases,
        unsatisfied: p1.remaining.iter().filter(|r| !qty::is_zero(r)).count(),
        unresolved: p2.unresolved.len(),
        snapshot_bytes: ctx.snap.heap_bytes(),
    };
    Ok(CycleOutput {
        actions,
        verdicts,
        shortfalls,
        parking,
        claims,
        stats,
    })
}

fn count_kinds(actions: &[Action]) -> (usize, usize) {
    let b = actions
        .iter()
        .filter(|a| matches!(a, Action::Bootstrap { .. }))
        .count();
    (b, actions.len() - b)
}

/// Marks Same needs parked by the ledger (or by the caller) and returns each
/// need's parking age.
fn stamp_parked(ctx: &mut Ctx<'_>, ledger: Option<&ParkingLedger>) -> Vec<u32> {
    let mut ages = vec![0u32; ctx.needs.len()];
    for (i, age_out) in ages.iter_mut().enumerate() {
        let has_same = ctx.profile_of(i as u32).has_same();
        let need = ctx.need(i as u32);
        let mut parked = has_same && need.acquisition_parked;
        if has_same && let Some(l) = ledger.filter(|l| !l.is_empty()) {
            let key = parking_key(&need.cluster, &need.group, need.fingerprint());
            *age_out = l.age(&key);
            // The ledger's own rule: cycles, or time for a timed ledger (ADR-0105).
            parked |= l.is_parked(&key);
        }
        ctx.needs[i].parked = parked;
    }
    ages
}

fn parking_observations(ctx: &Ctx<'_>, p1: &Phase1) -> Vec<ParkingObservation> {
    (0..ctx.needs.len())
        .filter(|&i| ctx.profile_of(i as u32).has_same() && !qty::is_zero(&p1.remaining[i]))
        .map(|i| {
            let need = ctx.need(i as u32);
            ParkingObservation {
                key: parking_key(&need.cluster, &need.group, need.fingerprint()),
                progress: p1.acquired[i] > 0 || p1.same_sat[i],
            }
        })
        .collect()
}

fn phase1_actions(ctx: &Ctx<'_>, p1: &Phase1) -> Vec<Action> {
    let snap = &ctx.snap;
    let mut out = Vec::new();
    for i in 0..ctx.needs.len() {
        let claims = &p1.claims[i];
        // `acquired` counts exactly the Idle and Speculative claims, so a need
        // covered by bound supply alone (most of a steady fleet) emits nothing
        // and its claim list is not walked.
        if p1.acquired[i] == 0 {
            continue;
        }
        let need = ctx.need(i as u32);
        let assignment = Assignment::new(&need.profile, need.group.clone());
        for st in [MachineState::Idle, MachineState::Speculative] {
            for &r in claims {
                if snap.rec(r).state != st {
                    continue;
                }
                let machine_id = snap.id(r).to_owned();
                let cluster = need.cluster.clone();
                let assignment = assignment.clone();
                out.push(if st == MachineState::Idle {
                    Action::Bootstrap {
                        machine_id,
                        cluster,
                        assignment,
                    }
                } else {
                    Action::Provision {
                        machine_id,
                        cluster,
                        assignment,
                    }
                });
            }
        }
    }
    out
}

fn shortfall_seeds(ctx: &Ctx<'_>, p2: &phase2::Phase2) -> Vec<ShortfallSeed> {
    let mut order: Vec<(Arc<Profile>, Qty)> = Vec::new();
    let mut by_fp: FxHashMap<&str, usize> = FxHashMap::default();
    for u in &p2.unresolved {
        let cp = ctx.profile_of(u.need);
        match by_fp.get(cp.fingerprint()) {
            Some(&k) => qty::add_assign(&mut order[k].1, &u.deficit),
            None => {
                by_fp.insert(cp.fingerprint(), order.len());
                order.push((cp.profile.clone(), u.deficit.clone()));
            }
        }
    }
    order
        .into_iter()
        .map(|(profile, d)| ShortfallSeed {
            profile,
            deficit: ctx.snap.dims.to_vector(&d),
        })
        .collect()
}

/// NormalizeDemand on its own (ADR-0041): the demand the phases would see.
pub fn normalize_demand(machines: &[Machine], demand: &[Need]) -> Result<Vec<Need>, EngineError> {
    let input = CycleInput::new(machines, demand);
    let fleet = Fleet::from_machines(machines, &[])?;
    let mut ctx = Ctx::compile(&fleet, &input, Parallelism::Off, false);
    ctx.normalize();
    Ok((0..ctx.needs.len())
        .map(|i| ctx.need(i as u32).clone())
        .collect())
}
