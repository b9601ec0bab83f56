//! Demand compiled against one snapshot: profiles with shape-memoised matching,
//! needs with dense vectors.

use crate::intern::NONE;
use crate::qty::Qty;
use crate::snapshot::Snapshot;
use bigfleet_model::{
    Need, Operator, Precedence, Profile, pinned_instance_types, same_requirement, strict_spread,
};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Every attribute key a demand slice mentions (requirements and spread), sorted.
pub(crate) fn demand_keys<'a>(needs: impl IntoIterator<Item = &'a Need>) -> Vec<&'a str> {
    let mut seen: FxHashMap<*const Profile, ()> = FxHashMap::default();
    let mut keys: Vec<&'a str> = Vec::new();
    for n in needs {
        if seen.insert(Arc::as_ptr(&n.profile), ()).is_some() {
            continue;
        }
        for r in n.profile.requirements() {
            keys.push(r.key());
        }
        for s in n.profile.spread() {
            keys.push(&s.topology_key);
        }
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// One compiled requirement.
#[derive(Debug, Clone)]
struct CReq {
    slot: usize,
    op: Operator,
    /// Interned values that exist in the snapshot, sorted.
    vals: SmallVec<[u32; 4]>,
    /// The requirement listed at least one value (even if none exists).
    listed: bool,
}

impl CReq {
    fn matches(&self, attr: u32) -> bool {
        let present = attr != NONE;
        let listed_here = || self.vals.binary_search(&attr).is_ok();
        match self.op {
            Operator::In => present && listed_here(),
            Operator::NotIn => !present || !listed_here(),
            Operator::Exists => present,
            Operator::DoesNotExist => !present,
            Operator::Same => present && (!self.listed || listed_here()),
            Operator::Unspecified => false,
        }
    }
}

/// A profile compiled against the snapshot.
#[derive(Debug)]
pub(crate) struct CompiledProfile {
    pub profile: Arc<Profile>,
    reqs: Vec<CReq>,
    /// Interned pinned instance types that exist (`Some(empty)`: pinned to
    /// types nobody has).
    pub pinned: Option<SmallVec<[u32; 4]>>,
    /// Attribute slot of the first Same requirement.
    pub same_slot: Option<usize>,
    /// Slot and max skew of the first DoNotSchedule spread.
    pub spread: Option<(usize, i32)>,
    pub precedence: Precedence,
    pub priority: i32,
    /// Upper bound of the interruption bucket, in dollars.
    pub interruption_penalty_dollars: f64,
    /// Per shape: 0 unknown, 1 no, 2 yes.
    memo: Vec<AtomicU8>,
}

impl CompiledProfile {
    pub(crate) fn compile(profile: Arc<Profile>, snap: &Snapshot<'_>) -> CompiledProfile {
        let slot = |key: &str| {
            snap.keys
                .binary_search(&key)
                .expect("demand keys were collected before the snapshot")
        };
        let reqs = profile
            .requirements()
            .iter()
            .map(|r| {
                let mut vals: SmallVec<[u32; 4]> =
                    r.values().iter().filter_map(|v| snap.value_id(v)).collect();
                vals.sort_unstable();
                CReq {
                    slot: slot(r.key()),
                    op: r.operator(),
                    vals,
                    listed: !r.values().is_empty(),
                }
            })
            .collect();
        let pinned = pinned_instance_types(profile.requirements()).map(|ts| {
            let mut v: SmallVec<[u32; 4]> = ts.iter().filter_map(|t| snap.value_id(t)).collect();
            v.sort_unstable();
            v.dedup();
            v
        });
        let same_slot = same_requirement(profile.requirements()).map(|r| slot(r.key()));
        let spread = strict_spread(profile.spread()).map(|s| (slot(&s.topology_key), s.max_skew));
        CompiledProfile {
            precedence: profile.precedence(),
            priority: profile.priority(),
            interruption_penalty_dollars: profile.interruption_penalty_dollars(),
            memo: (0..snap.grouping.shapes.len())
                .map(|_| AtomicU8::new(0))
                .collect(),
            reqs,
            pinned,
            same_slot,
            spread,
            profile,
        }
    }

    /// MatchProfile for every machine of a shape, memoised.
    #[inline]
    pub(crate) fn matches(&self, snap: &Snapshot<'_>, shape: u32) -> bool {
        let cell = &self.memo[shape as usize];
        match cell.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let attrs = snap.attrs(shape);
                let ok = self.reqs.iter().all(|r| r.matches(attrs[r.slot]));
                // A pure function of (profile, shape): racing writers store the same value.
                cell.store(if ok { 2 } else { 1 }, Ordering::Relaxed);
                ok
            }
        }
    }

    /// Whether an instance type passes the pinned-type pool filter.
    #[inline]
    pub(crate) fn pinned_allows(&self, itype: u32) -> bool {
        match &self.pinned {
            None => true,
            Some(ts) => ts.binary_search(&itype).is_ok(),
        }
    }

    pub(crate) fn has_same(&self) -> bool {
        self.same_slot.is_some()
    }

    pub(crate) fn fingerprint(&self) -> &str {
        self.profile.fingerprint()
    }
}

/// Where a compiled need came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    /// Index into the input demand slice.
    Input(u32),
    /// Index into the cycle's folded needs.
    Folded(u32),
}

/// A need compiled against the snapshot.
#[derive(Debug, Clone)]
pub(crate) struct CompiledNeed {
    pub src: Src,
    /// Index into [`Profiles::compiled`].
    pub profile: u32,
    /// Dense cluster id in the snapshot.
    pub cluster: u32,
    /// The whole demand of the need, dense over the cycle's dimensions.
    pub aggregate: Qty,
    /// The smallest piece a machine must hold (the need's `min_unit`), dense.
    pub min_unit: Qty,
    /// Acquisition is parked this cycle (`parking.rs`): Phase 1 claims no Idle or
    /// Speculative machine for the need and Phase 2 preempts nothing for it.
    pub parked: bool,
}

/// Registry of compiled profiles, deduplicated by `Arc` identity then fingerprint.
#[derive(Default)]
pub(crate) struct Profiles {
    pub compiled: Vec<CompiledProfile>,
    /// Keyed by `Arc` address (as an integer so the registry stays `Sync`).
    by_ptr: FxHashMap<usize, u32>,
    by_fp: FxHashMap<String, u32>,
}

impl Profiles {
    pub(crate) fn intern(&mut self, profile: &Arc<Profile>, snap: &Snapshot<'_>) -> u32 {
        let ptr = Arc::as_ptr(profile) as usize;
        if let Some(&id) = self.by_ptr.get(&ptr) {
            return id;
        }
        let id = match self.by_fp.get(profile.fingerprint()) {
            Some(&id) => id,
            None => {
                let id = self.compiled.len() as u32;
                self.compiled
                    .push(CompiledProfile::compile(profile.clone(), snap));
                self.by_fp.insert(profile.fingerprint().to_owned(), id);
                id
            }
        };
        self.by_ptr.insert(ptr, id);
        id
    }
}
