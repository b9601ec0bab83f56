//! The compiled cycle every phase reads ([`Ctx`]: the snapshot, the compiled
//! profiles and the normalized demand) and where its parallel sections run
//! ([`Parallelism`]). Its own module so the phases depend on it, not on the cycle
//! driver in `cycle.rs`.

use crate::cycle::CycleInput;
use crate::demand::{self, CompiledNeed, CompiledProfile, Profiles, Src};
use crate::fleet::Fleet;
use crate::snapshot::{BuildSpec, Snapshot};
use bigfleet_model::Need;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The compiled cycle shared by every phase.
pub(crate) struct Ctx<'a> {
    pub snap: Snapshot<'a>,
    pub profiles: Profiles,
    pub input: &'a [Need],
    pub folded: Vec<Need>,
    pub fold_members: Vec<Vec<u32>>,
    /// Normalized demand.
    pub needs: Vec<CompiledNeed>,
    pub par: Parallelism,
    /// Per machine slot: owned by another shard (ADR-0128); empty = none is.
    pub foreign: Vec<bool>,
}

/// Where a cycle's parallel sections run. The cycle itself stays on the
/// caller's thread: handing every cycle to a pool thread costs a wake-up, which
/// on a busy 2-core machine is worth more than a quiet cycle.
#[derive(Clone, Default)]
pub(crate) enum Parallelism {
    /// Strictly sequential.
    #[default]
    Off,
    /// The rayon pool the caller runs in.
    Current,
    /// A pool of the requested size.
    Pool(Arc<rayon::ThreadPool>),
}

impl Parallelism {
    pub(crate) fn on(&self) -> bool {
        !matches!(self, Parallelism::Off)
    }

    /// Runs `f`, whose rayon iterators then use this cycle's pool.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            Parallelism::Pool(p) => p.install(f),
            Parallelism::Off | Parallelism::Current => f(),
        }
    }
}

impl<'a> Ctx<'a> {
    pub(crate) fn need(&self, i: u32) -> &Need {
        match self.needs[i as usize].src {
            Src::Input(k) => &self.input[k as usize],
            Src::Folded(f) => &self.folded[f as usize],
        }
    }

    /// Whether machine `h` belongs to another shard: never acquired,
    /// preempted, reclaimed or released here.
    #[inline]
    pub(crate) fn is_foreign(&self, h: u32) -> bool {
        self.foreign.get(h as usize).copied().unwrap_or(false)
    }

    #[inline]
    pub(crate) fn profile_of(&self, i: u32) -> &CompiledProfile {
        &self.profiles.compiled[self.needs[i as usize].profile as usize]
    }

    /// Snapshot + compiled (not yet normalized) demand.
    pub(crate) fn compile(
        fleet: &'a Fleet,
        input: &CycleInput<'a>,
        par: Parallelism,
        verdicts: bool,
    ) -> Ctx<'a> {
        let demand = input.demand;
        let keys = demand::demand_keys(demand);
        let any_same = demand
            .iter()
            .any(|n| n.profile.same_requirement().is_some());
        #[cfg(debug_assertions)]
        if let Some(names) = input.demand_dimensions {
            check_dimensions(demand, names);
        }
        let demand_vectors = match input.demand_dimensions {
            Some(_) => Vec::new(),
            None => demand
                .iter()
                .flat_map(|n| [&n.aggregate_resources, &n.min_unit])
                .collect(),
        };
        let snap = Snapshot::build(
            fleet,
            BuildSpec {
                keys,
                destinations: input.creating_destinations,
                demand_vectors,
                demand_names: input.demand_dimensions.unwrap_or_default(),
                demand_clusters: demand.iter().map(|n| n.cluster.as_str()).collect(),
                own_index: any_same,
                free_groups: any_same || verdicts,
                par: par.clone(),
            },
        );
        let mut profiles = Profiles::default();
        let mut needs = Vec::with_capacity(demand.len());
        for (k, n) in demand.iter().enumerate() {
            let cp = profiles.intern(&n.profile, &snap);
            needs.push(CompiledNeed {
                src: Src::Input(k as u32),
                profile: cp,
                cluster: snap.demand_cluster_ids[k],
                aggregate: snap.dense(&n.aggregate_resources),
                min_unit: snap.dense(&n.min_unit),
                parked: false,
            });
        }
        Ctx {
            snap,
            profiles,
            input: demand,
            folded: Vec::new(),
            fold_members: Vec::new(),
            needs,
            par,
            foreign: input
                .ownership
                .map(|o| o.foreign_slots(fleet))
                .unwrap_or_default(),
        }
    }
}

/// A caller's kept dimension set must be exactly what the demand names (debug builds:
/// every test that passes one checks it).
#[cfg(debug_assertions)]
fn check_dimensions(demand: &[Need], names: &[String]) {
    let mut seen: Vec<&str> = demand
        .iter()
        .flat_map(|n| n.aggregate_resources.iter().chain(n.min_unit.iter()))
        .map(|(name, _)| name)
        .collect();
    seen.sort_unstable();
    seen.dedup();
    let mut kept: Vec<&str> = names.iter().map(String::as_str).collect();
    kept.sort_unstable();
    assert_eq!(
        kept, seen,
        "CycleInput::demand_dimensions differs from the demand's names"
    );
}

pub(crate) fn pool_for(threads: usize) -> Arc<rayon::ThreadPool> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut pools = pools.lock().unwrap_or_else(|e| e.into_inner());
    pools
        .entry(threads)
        .or_insert_with(|| {
            Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("bigfleet-decide-{i}"))
                    .build()
                    .expect("thread pool"),
            )
        })
        .clone()
}
