//! The NeedsTable: each cluster's latest full-replacement demand.

use bigfleet_conv::{ConvError, Limit};
use bigfleet_model::{ClusterId, Need, Profile, snapshot_order};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// Demand rows per cluster plus first-seen arrival stamps.
#[derive(Debug, Default)]
pub struct NeedsTable {
    /// Ordered by cluster id so the flattened snapshot breaks the last sort
    /// tie (cluster asc) for free.
    clusters: BTreeMap<ClusterId, Vec<Need>>,
    /// First time each (cluster, fingerprint) was seen in an applied roll-up.
    /// Survives re-sends of the same demand (the age clock keeps running) and
    /// is pruned when the fingerprint leaves the cluster's demand.
    first_seen: FxHashMap<ClusterId, FxHashMap<String, i64>>,
    snapshot: Option<Arc<Vec<Need>>>,
    rows: usize,
    /// Distinct resource names over every cluster's demand, with how many clusters name
    /// each: the per-shard dimension bound (ADR-0104) is checked against it. Small (that
    /// bound caps it), so an ordered map.
    dims: BTreeMap<String, u32>,
    /// Each cluster's distinct resource names, sorted.
    cluster_dims: FxHashMap<ClusterId, Vec<String>>,
    profiles: SharedProfiles,
}

/// One `Arc<Profile>` per fingerprint across every cluster's demand. Each roll-up
/// decodes its own copies; sharing them lets the engine, whose profile registry looks
/// an `Arc` up by address before it hashes a fingerprint, compile each profile once
/// a cycle at the cost of an address lookup per need (issue 17).
#[derive(Debug)]
struct SharedProfiles {
    by_fingerprint: FxHashMap<String, Arc<Profile>>,
    /// Size at which profiles no demand holds any more are swept out: twice the live
    /// count after the last sweep, so the map stays within twice what is in use.
    sweep_at: usize,
}

impl Default for SharedProfiles {
    fn default() -> Self {
        SharedProfiles {
            by_fingerprint: FxHashMap::default(),
            sweep_at: SharedProfiles::MIN_SWEEP,
        }
    }
}

impl SharedProfiles {
    const MIN_SWEEP: usize = 1024;

    fn share(&mut self, profile: &Arc<Profile>) -> Arc<Profile> {
        if let Some(shared) = self.by_fingerprint.get(profile.fingerprint()) {
            return Arc::clone(shared);
        }
        if self.by_fingerprint.len() >= self.sweep_at {
            // Held only here: no row, snapshot or verdict table carries it.
            self.by_fingerprint.retain(|_, p| Arc::strong_count(p) > 1);
            self.sweep_at = (2 * self.by_fingerprint.len()).max(Self::MIN_SWEEP);
        }
        self.by_fingerprint
            .insert(profile.fingerprint().to_owned(), Arc::clone(profile));
        Arc::clone(profile)
    }
}

/// The distinct resource names of `needs` (aggregates and min units), sorted.
fn distinct_names(needs: &[Need]) -> Vec<&str> {
    bigfleet_model::distinct_names(
        needs
            .iter()
            .flat_map(|n| [&n.aggregate_resources, &n.min_unit]),
    )
}

impl NeedsTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces `cluster`'s demand with `needs` (nothing merges). Needs whose
    /// fingerprint is new to the cluster get `received_at` as arrival; known
    /// fingerprints keep their first-seen time. An empty list withdraws the
    /// cluster. Returns the rows now in force for the cluster.
    pub fn replace(&mut self, cluster: &str, mut needs: Vec<Need>, received_at: i64) -> usize {
        self.snapshot = None;
        self.account_dimensions(cluster, &needs);
        let seen = self.first_seen.entry(cluster.to_owned()).or_default();
        let mut next: FxHashMap<String, i64> = FxHashMap::default();
        for n in &mut needs {
            let fp = n.fingerprint();
            let arrival = next
                .get(fp)
                .or_else(|| seen.get(fp))
                .copied()
                .unwrap_or(received_at);
            next.insert(fp.to_owned(), arrival);
            n.arrival_unix_nanos = arrival;
            n.profile = self.profiles.share(&n.profile);
            n.cluster = cluster.to_owned();
            n.acquisition_parked = false;
        }
        let old = match needs.is_empty() {
            true => {
                self.first_seen.remove(cluster);
                self.clusters.remove(cluster)
            }
            false => {
                *seen = next;
                self.clusters.insert(cluster.to_owned(), needs)
            }
        };
        self.rows = self.rows - old.map_or(0, |v| v.len()) + self.rows_of(cluster);
        self.rows_of(cluster)
    }

    /// Distinct resource names over every cluster's demand.
    pub fn dimensions(&self) -> usize {
        self.dims.len()
    }

    /// Whether replacing `cluster`'s demand with `needs` keeps the shard within `max`
    /// distinct resource names. Names only this cluster uses leave with its old demand;
    /// the error names the first entry (wire order, names sorted within a map) that would
    /// cross the bound.
    pub fn check_dimensions(
        &self,
        cluster: &str,
        needs: &[Need],
        max: usize,
    ) -> Result<(), ConvError> {
        let own: &[String] = self.cluster_dims.get(cluster).map_or(&[], Vec::as_slice);
        let is_own = |name: &str| own.binary_search_by(|o| o.as_str().cmp(name)).is_ok();
        let elsewhere = |name: &str| {
            let clusters = self.dims.get(name).copied().unwrap_or(0);
            clusters > u32::from(is_own(name))
        };
        // Names other clusters use: they stay whatever this cluster sends.
        let kept = self.dims.len() - own.iter().filter(|o| !elsewhere(o)).count();
        // Bounded by the return below: at most max + 1 names are ever inserted.
        let mut added: HashSet<&str> = HashSet::new();
        for (i, n) in needs.iter().enumerate() {
            let maps = [
                ("aggregate_resources", &n.aggregate_resources),
                ("min_unit", &n.min_unit),
            ];
            for (field, v) in maps {
                for (name, _) in v.iter() {
                    if !elsewhere(name) && added.insert(name) && kept + added.len() > max {
                        return Err(ConvError::LimitExceeded {
                            limit: Limit::ShardDimensions,
                            path: format!("needs[{i}].{field}[{name:?}]"),
                            value: kept + added.len(),
                            max,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves the dimension counts from `cluster`'s old demand to `needs`.
    fn account_dimensions(&mut self, cluster: &str, needs: &[Need]) {
        if let Some(old) = self.cluster_dims.remove(cluster) {
            for name in old {
                if let Some(c) = self.dims.get_mut(&name) {
                    *c -= 1;
                    if *c == 0 {
                        self.dims.remove(&name);
                    }
                }
            }
        }
        let names: Vec<String> = distinct_names(needs)
            .into_iter()
            .map(str::to_owned)
            .collect();
        if names.is_empty() {
            return;
        }
        for name in &names {
            *self.dims.entry(name.clone()).or_insert(0) += 1;
        }
        self.cluster_dims.insert(cluster.to_owned(), names);
    }

    pub fn rows_of(&self, cluster: &str) -> usize {
        self.clusters.get(cluster).map_or(0, Vec::len)
    }

    /// One cluster's rows in roll-up order (empty when it has none).
    pub fn needs_of(&self, cluster: &str) -> &[Need] {
        self.clusters.get(cluster).map_or(&[], Vec::as_slice)
    }

    /// Total rows over every cluster.
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Clusters with demand.
    pub fn clusters(&self) -> impl Iterator<Item = (&str, &[Need])> {
        self.clusters
            .iter()
            .map(|(c, n)| (c.as_str(), n.as_slice()))
    }

    /// All rows, stable-sorted priority desc, arrival asc, cluster asc (ties
    /// keep each cluster's roll-up order). Cached until the next replace.
    pub fn snapshot(&mut self) -> Arc<Vec<Need>> {
        if let Some(s) = &self.snapshot {
            return s.clone();
        }
        let flat: Vec<&Need> = self.clusters.values().flatten().collect();
        // Sort a permutation, then gather once: moving ~100-byte rows around
        // during the sort costs far more than sorting indices.
        let mut perm: Vec<u32> = (0..flat.len() as u32).collect();
        perm.sort_by(|&a, &b| snapshot_order(flat[a as usize], flat[b as usize]));
        let snap = Arc::new(perm.iter().map(|&i| flat[i as usize].clone()).collect());
        self.snapshot = Some(Arc::clone(&snap));
        snap
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bigfleet_model::{PenaltyBucket, Profile};

    /// A need with one `tag In [tag]` requirement at `prio`, nothing else set.
    pub(crate) fn need(prio: i32, tag: &str) -> Need {
        let req =
            bigfleet_model::Requirement::new("tag", bigfleet_model::Operator::In, [tag.to_owned()]);
        Need::new(
            "",
            Profile::new(
                vec![req],
                vec![],
                prio,
                PenaltyBucket::Zero,
                PenaltyBucket::Zero,
            ),
        )
    }

    #[test]
    fn equal_profiles_share_one_arc_and_unused_ones_are_swept() {
        let mut t = NeedsTable::new();
        t.replace("a", vec![need(5, "x"), need(5, "y")], 1);
        t.replace("b", vec![need(5, "x")], 1);
        let (a, b) = (t.needs_of("a"), t.needs_of("b"));
        assert!(Arc::ptr_eq(&a[0].profile, &b[0].profile));
        assert!(!Arc::ptr_eq(&a[0].profile, &a[1].profile));
        // Profiles no demand holds any more leave once the map reaches its sweep size.
        for i in 0..3 * SharedProfiles::MIN_SWEEP {
            t.replace("churn", vec![need(1, &format!("c{i}"))], 2);
        }
        let kept = t.profiles.by_fingerprint.len();
        assert!(
            kept <= 2 * SharedProfiles::MIN_SWEEP,
            "{kept} profiles kept"
        );
        assert!(Arc::ptr_eq(
            &t.needs_of("a")[0].profile,
            &t.needs_of("b")[0].profile
        ));
    }

    fn order(s: &[Need]) -> Vec<(String, String)> {
        s.iter()
            .map(|n| {
                (
                    n.cluster.clone(),
                    n.profile.requirements()[0].values()[0].clone(),
                )
            })
            .collect()
    }

    #[test]
    fn snapshot_orders_priority_arrival_cluster() {
        let mut t = NeedsTable::new();
        t.replace("b", vec![need(5, "b1"), need(9, "b2")], 100);
        t.replace("a", vec![need(5, "a1"), need(5, "a2")], 100);
        t.replace("c", vec![need(5, "c1")], 50);
        let s = t.snapshot();
        let got = order(&s);
        let want = [
            ("b", "b2"),
            ("c", "c1"),
            ("a", "a1"),
            ("a", "a2"),
            ("b", "b1"),
        ];
        assert_eq!(
            got,
            want.map(|(c, n)| (c.to_owned(), n.to_owned())).to_vec()
        );
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn arrival_is_first_seen_per_fingerprint() {
        let mut t = NeedsTable::new();
        t.replace("a", vec![need(1, "x")], 100);
        t.replace("a", vec![need(1, "x"), need(1, "y")], 200);
        let s = t.snapshot();
        let arrivals: Vec<_> = s.iter().map(|n| n.arrival_unix_nanos).collect();
        assert_eq!(arrivals, [100, 200]);
        // Withdrawn then re-requested: a fresh arrival.
        t.replace("a", vec![need(1, "y")], 300);
        t.replace("a", vec![need(1, "x"), need(1, "y")], 400);
        let s = t.snapshot();
        let mut arrivals: Vec<_> = s
            .iter()
            .map(|n| {
                (
                    n.profile.requirements()[0].values()[0].clone(),
                    n.arrival_unix_nanos,
                )
            })
            .collect();
        arrivals.sort();
        assert_eq!(arrivals, [("x".to_owned(), 400), ("y".to_owned(), 200)]);
    }

    #[test]
    fn full_replacement_and_withdrawal() {
        let mut t = NeedsTable::new();
        assert_eq!(t.replace("a", vec![need(1, "x"), need(2, "y")], 1), 2);
        assert_eq!(t.replace("a", vec![need(3, "z")], 2), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(order(&t.snapshot()), [("a".to_owned(), "z".to_owned())]);
        assert_eq!(t.replace("a", vec![], 3), 0);
        assert!(t.is_empty());
        assert!(t.snapshot().is_empty());
        assert_eq!(t.clusters().count(), 0);
    }

    fn with_dims(tag: &str, names: &[&str]) -> Need {
        let mut n = need(1, tag);
        n.aggregate_resources =
            bigfleet_model::ResourceVector::from_milli(names.iter().map(|d| (*d, 1)));
        n
    }

    #[test]
    fn dimensions_are_counted_across_clusters_and_leave_with_their_demand() {
        let mut t = NeedsTable::new();
        t.replace("a", vec![with_dims("x", &["cpu", "memory"])], 1);
        t.replace("b", vec![with_dims("x", &["cpu", "nvidia.com/gpu"])], 1);
        assert_eq!(t.dimensions(), 3);
        // b alone names the gpu: replacing b without it frees it.
        t.replace("b", vec![with_dims("x", &["cpu"])], 2);
        assert_eq!(t.dimensions(), 2);
        t.replace("a", vec![], 3);
        assert_eq!(t.dimensions(), 1);
        t.replace("b", vec![], 3);
        assert_eq!(t.dimensions(), 0);
    }

    #[test]
    fn the_shard_dimension_bound_names_the_entry_that_crosses_it() {
        let mut t = NeedsTable::new();
        t.replace("a", vec![with_dims("x", &["cpu", "memory"])], 1);
        let b = vec![
            with_dims("x", &["cpu"]),
            with_dims("y", &["example.com/a", "example.com/b"]),
        ];
        // cpu is shared, so b adds two names: 4 in all.
        assert!(t.check_dimensions("b", &b, 4).is_ok());
        let err = t.check_dimensions("b", &b, 3).unwrap_err();
        assert_eq!(
            err,
            ConvError::LimitExceeded {
                limit: Limit::ShardDimensions,
                path: "needs[1].aggregate_resources[\"example.com/b\"]".into(),
                value: 4,
                max: 3,
            }
        );
        assert_eq!(err.reason(), "limit_shard_dimensions");
        // A cluster's own names do not count twice when it re-sends them, and names only
        // it used are freed by its replacement.
        t.replace("b", b.clone(), 2);
        assert!(t.check_dimensions("b", &b, 4).is_ok());
        let swap = vec![with_dims("x", &["example.com/c", "example.com/d"])];
        assert!(t.check_dimensions("b", &swap, 4).is_ok());
        assert!(t.check_dimensions("a", &[], 0).is_ok());
    }
    #[test]
    fn snapshot_cache_invalidated_by_replace() {
        let mut t = NeedsTable::new();
        t.replace("a", vec![need(1, "x")], 1);
        let s1 = t.snapshot();
        assert!(Arc::ptr_eq(&s1, &t.snapshot()));
        t.replace("a", vec![need(1, "y")], 1);
        assert!(!Arc::ptr_eq(&s1, &t.snapshot()));
    }
}
