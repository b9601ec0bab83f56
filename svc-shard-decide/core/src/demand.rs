//! The cycle's own view of demand, kept up to date by what changed (issue 17).
//!
//! Ingest owns the authoritative [`crate::needs::NeedsTable`]; a cycle takes only the
//! clusters whose demand changed since the last cycle ([`DemandChanges`]) and patches
//! this view: the changed clusters' rows leave the sorted snapshot and their new
//! rows are merged in. Unchanged clusters cost one move per row, never a sort, a
//! conversion or a clone. The snapshot order is the NeedsTable's (priority desc,
//! arrival asc, cluster asc, then each cluster's roll-up order), which the
//! property tests compare against a from-scratch sort.

use bigfleet_model::{Need, snapshot_order};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Clusters whose demand in force changed since the last take, with their rows
/// now (empty: withdrawn) and when the first of those changes was accepted.
#[derive(Debug, Default)]
pub struct DemandChanges {
    pub clusters: Vec<ClusterChange>,
}

#[derive(Debug)]
pub struct ClusterChange {
    pub cluster: String,
    pub needs: Vec<Need>,
    /// When the first change since the last take was accepted (demand-to-decision).
    pub accepted_at: Instant,
}

impl DemandChanges {
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }
}

/// Per-cluster demand and the flattened, ordered snapshot the engine reads.
#[derive(Debug, Default)]
pub struct DemandView {
    by_cluster: FxHashMap<String, Vec<Need>>,
    /// Shared with the verdict table built over it; a cycle with no change reuses it.
    sorted: Arc<Vec<Need>>,
}

/// The snapshot order, total within one cluster: ties of [`snapshot_order`]
/// (same cluster, priority and arrival) keep roll-up order, carried as `index`.
fn stable_cmp(a: (&Need, usize), b: (&Need, usize)) -> Ordering {
    snapshot_order(a.0, b.0).then(a.1.cmp(&b.1))
}

impl DemandView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `changes`: each listed cluster's rows are replaced by its new ones.
    pub fn apply(&mut self, changes: &DemandChanges) {
        if changes.is_empty() {
            return;
        }
        let changed: FxHashSet<&str> = changes
            .clusters
            .iter()
            .map(|c| c.cluster.as_str())
            .collect();
        // The new rows, in snapshot order. Within a cluster, roll-up order breaks ties.
        let mut fresh: Vec<(Need, usize)> = Vec::new();
        for c in &changes.clusters {
            fresh.extend(c.needs.iter().cloned().enumerate().map(|(i, n)| (n, i)));
            if c.needs.is_empty() {
                self.by_cluster.remove(&c.cluster);
            } else {
                self.by_cluster.insert(c.cluster.clone(), c.needs.clone());
            }
        }
        fresh.sort_by(|a, b| stable_cmp((&a.0, a.1), (&b.0, b.1)));
        // Kept rows are already in order; the two runs never tie (a tie needs the
        // same cluster, and a cluster is in exactly one of them).
        // Moved when no verdict table holds the old snapshot any more, cloned otherwise.
        let old = match Arc::try_unwrap(std::mem::take(&mut self.sorted)) {
            Ok(v) => v,
            Err(shared) => shared
                .iter()
                .filter(|n| !changed.contains(n.cluster.as_str()))
                .cloned()
                .collect(),
        };
        let mut out = Vec::with_capacity(old.len() + fresh.len());
        let mut fresh = fresh.into_iter().map(|(n, _)| n).peekable();
        for n in old {
            if changed.contains(n.cluster.as_str()) {
                continue;
            }
            while let Some(f) = fresh.next_if(|f| snapshot_order(f, &n) == Ordering::Less) {
                out.push(f);
            }
            out.push(n);
        }
        out.extend(fresh);
        self.sorted = Arc::new(out);
    }

    /// Every row, in snapshot order.
    pub fn sorted(&self) -> &Arc<Vec<Need>> {
        &self.sorted
    }

    /// One cluster's rows in roll-up order (empty when it has none).
    pub fn needs_of(&self, cluster: &str) -> &[Need] {
        self.by_cluster.get(cluster).map_or(&[], Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::needs::NeedsTable;
    use bigfleet_model::{Operator, PenaltyBucket, Profile, Requirement};
    use proptest::prelude::*;

    fn need(prio: i32, tag: &str) -> Need {
        let req = Requirement::new("tag", Operator::In, [tag.to_owned()]);
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

    /// Takes what changed from `table` the way ingest hands it to the cycle.
    fn changes(table: &NeedsTable, clusters: &[&str]) -> DemandChanges {
        DemandChanges {
            clusters: clusters
                .iter()
                .map(|c| ClusterChange {
                    cluster: (*c).to_owned(),
                    needs: table.needs_of(c).to_vec(),
                    accepted_at: Instant::now(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_changed_cluster_moves_and_the_rest_keeps_its_place() {
        let mut t = NeedsTable::new();
        let mut v = DemandView::new();
        t.replace("a", vec![need(5, "a1"), need(5, "a2")], 100);
        t.replace("b", vec![need(9, "b1")], 100);
        v.apply(&changes(&t, &["a", "b"]));
        assert_eq!(v.sorted().as_slice(), t.snapshot().as_slice());
        t.replace("a", vec![need(10, "a3"), need(5, "a1")], 200);
        v.apply(&changes(&t, &["a"]));
        assert_eq!(v.sorted().as_slice(), t.snapshot().as_slice());
        assert_eq!(v.needs_of("a").len(), 2);
        t.replace("b", vec![], 300);
        v.apply(&changes(&t, &["b"]));
        assert_eq!(v.sorted().as_slice(), t.snapshot().as_slice());
        assert!(v.needs_of("b").is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("BIGFLEET_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128),
            ..ProptestConfig::default()
        })]

        /// After any sequence of replacements (changed, identical, withdrawn), the
        /// patched view is exactly the from-scratch sort of the same table.
        #[test]
        fn patched_view_equals_from_scratch_snapshot(
            steps in prop::collection::vec(
                prop::collection::vec((0usize..6, prop::collection::vec((0i32..3, 0u8..4), 0..4)), 1..4),
                1..12,
            ),
        ) {
            let names = ["a", "b", "c", "d", "e", "f"];
            let mut t = NeedsTable::new();
            let mut v = DemandView::new();
            for (round, step) in steps.into_iter().enumerate() {
                let mut touched: Vec<&str> = Vec::new();
                for (c, rows) in step {
                    let needs = rows.iter().map(|(p, tag)| need(*p, &format!("t{tag}"))).collect();
                    t.replace(names[c], needs, 100 * round as i64);
                    if !touched.contains(&names[c]) {
                        touched.push(names[c]);
                    }
                }
                v.apply(&changes(&t, &touched));
                let scratch = t.snapshot();
                prop_assert_eq!(v.sorted().as_slice(), scratch.as_slice());
                prop_assert_eq!(v.len(), t.len());
            }
        }
    }
}
