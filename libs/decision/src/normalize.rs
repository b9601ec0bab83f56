//! NormalizeDemand (ADR-0041): fold co-location gangs that fit on one
//! machine into plain aggregate needs.

use crate::context::Ctx;
use crate::demand::{CompiledNeed, Src};
use crate::qty::{self, Qty};
use bigfleet_model::{Need, Operator, Profile};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Canonical aggregate class: `name=milli;` per named dimension in name order,
/// so `"16Gi"` and `"17179869184"` are the same class.
pub(crate) fn class_key(need: &Need) -> String {
    let mut s = String::new();
    for (n, v) in need.aggregate_resources.iter() {
        s.push_str(n);
        s.push('=');
        s.push_str(&v.to_string());
        s.push(';');
    }
    s
}

/// The profile without its (first) Same requirement, everything else kept.
pub(crate) fn strip_same(p: &Profile) -> Profile {
    let mut dropped = false;
    let reqs = p
        .requirements()
        .iter()
        .filter(|r| {
            if !dropped && r.operator() == Operator::Same {
                dropped = true;
                false
            } else {
                true
            }
        })
        .cloned()
        .collect();
    Profile::new(
        reqs,
        p.spread().to_vec(),
        p.priority(),
        p.interruption_bucket(),
        p.reclamation_bucket(),
    )
}

struct Fold {
    profile: Arc<Profile>,
    members: Vec<u32>,
    arrival: i64,
}

fn earliest_nonzero(a: i64, b: i64) -> i64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

impl<'a> Ctx<'a> {
    /// A need is foldable when some machine matching its (Same-carrying) profile
    /// can hold the whole aggregate: bound to its cluster (Configured or
    /// Configuring), or shard-wide Idle/Speculative. Cluster half first.
    fn foldable(
        &self,
        dn: &CompiledNeed,
        cluster_memo: &mut FxHashMap<(u32, u32, Qty), bool>,
        shard_memo: &mut FxHashMap<(u32, Qty), bool>,
    ) -> bool {
        let snap = &self.snap;
        let cp = &self.profiles.compiled[dn.profile as usize];
        let fits = |g: u32| {
            let g = &snap.grouping.groups[g as usize];
            cp.matches(snap, g.shape) && qty::covers(snap.alloc(g.alloc), &dn.aggregate)
        };
        let ck = (dn.cluster, dn.profile, dn.aggregate.clone());
        let cluster_half = *cluster_memo
            .entry(ck)
            .or_insert_with(|| snap.cluster_groups(dn.cluster).iter().any(|&g| fits(g)));
        if cluster_half {
            return true;
        }
        *shard_memo
            .entry((dn.profile, dn.aggregate.clone()))
            .or_insert_with(|| {
                snap.grouping.free_groups.iter().any(|&g| {
                    let itype =
                        snap.grouping.shapes[snap.grouping.groups[g as usize].shape as usize].itype;
                    cp.pinned_allows(itype) && fits(g)
                })
            })
    }

    /// Replaces `self.needs` (input order) with the normalized demand:
    /// pass-through needs in input order, then one folded need per
    /// (cluster, stripped fingerprint, aggregate class), sorted by that key.
    pub(crate) fn normalize(&mut self) {
        if !self
            .needs
            .iter()
            .any(|d| self.profiles.compiled[d.profile as usize].has_same())
        {
            return;
        }
        let mut cluster_memo = FxHashMap::default();
        let mut shard_memo = FxHashMap::default();
        let mut pass: Vec<CompiledNeed> = Vec::with_capacity(self.needs.len());
        let mut folds: FxHashMap<(&'a str, String, String), Fold> = FxHashMap::default();
        // Stripped profiles, per original profile and deduplicated by fingerprint.
        let mut stripped: FxHashMap<u32, Arc<Profile>> = FxHashMap::default();
        let mut stripped_by_fp: FxHashMap<String, Arc<Profile>> = FxHashMap::default();
        let needs = std::mem::take(&mut self.needs);
        for dn in needs {
            let cp = &self.profiles.compiled[dn.profile as usize];
            if !cp.has_same() || !self.foldable(&dn, &mut cluster_memo, &mut shard_memo) {
                pass.push(dn);
                continue;
            }
            let Src::Input(i) = dn.src else {
                unreachable!("only input needs are normalized")
            };
            let need: &'a Need = &self.input[i as usize];
            let sp = stripped
                .entry(dn.profile)
                .or_insert_with(|| {
                    let p = strip_same(&cp.profile);
                    stripped_by_fp
                        .entry(p.fingerprint().to_owned())
                        .or_insert_with(|| Arc::new(p))
                        .clone()
                })
                .clone();
            let key = (
                need.cluster.as_str(),
                sp.fingerprint().to_owned(),
                class_key(need),
            );
            let f = folds.entry(key).or_insert_with(|| Fold {
                profile: sp.clone(),
                members: Vec::new(),
                arrival: 0,
            });
            f.members.push(i);
            f.arrival = earliest_nonzero(f.arrival, need.arrival_unix_nanos);
        }
        let mut folds: Vec<_> = folds.into_iter().collect();
        folds.sort_by(|a, b| a.0.cmp(&b.0));
        for ((_, _, _), fold) in folds {
            let first: &'a Need = &self.input[fold.members[0] as usize];
            let count = fold.members.len() as i64;
            let profile = fold.profile;
            let need = Need {
                cluster: first.cluster.clone(),
                profile: profile.clone(),
                aggregate_resources: first.aggregate_resources.scale(count),
                min_unit: first.aggregate_resources.clone(),
                arrival_unix_nanos: fold.arrival,
                group: String::new(),
                acquisition_parked: false,
            };
            let cp = self.profiles.intern(&profile, &self.snap);
            let mu = self.snap.dense(&first.aggregate_resources);
            let mut agg = self.snap.dims.zero();
            qty::add_scaled(&mut agg, &mu, fold.members.len() as u32);
            let cluster = self
                .snap
                .cluster_id(&first.cluster)
                .expect("demand clusters are known");
            pass.push(CompiledNeed {
                src: Src::Folded(self.folded.len() as u32),
                profile: cp,
                cluster,
                aggregate: agg,
                min_unit: mu,
                parked: false,
            });
            self.folded.push(need);
            self.fold_members.push(fold.members);
        }
        self.needs = pass;
    }
}
