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
///
/// The verdict table published after a cycle shares that cycle's snapshot, so the next
/// cycle cannot patch it in place. Instead the view keeps the snapshot before it too
/// (generation n-1, free again once table n replaced table n-1) with the changes that
/// led from it to generation n: the next cycle replays those and its own onto that
/// buffer, moving rows instead of cloning 30,000 of them, and no row is freed and
/// re-allocated. Only when a reader still holds the old table is the current snapshot
/// copied.
#[derive(Debug, Default)]
pub struct DemandView {
    by_cluster: FxHashMap<String, Vec<Need>>,
    /// Shared with the verdict table built over it; a cycle with no change reuses it.
    sorted: Arc<Vec<Need>>,
    /// The snapshot before `sorted`, and the changes that turned it into `sorted`.
    previous: Option<(Arc<Vec<Need>>, Changes)>,
}

/// Clusters and their rows now (empty: withdrawn).
type Changes = Vec<(String, Vec<Need>)>;

/// The snapshot order, total within one cluster: ties of [`snapshot_order`]
/// (same cluster, priority and arrival) keep roll-up order, carried as `index`.
fn stable_cmp(a: (&Need, usize), b: (&Need, usize)) -> Ordering {
    snapshot_order(a.0, b.0).then(a.1.cmp(&b.1))
}

/// `base` with every listed cluster's rows replaced by the listed ones (moved, not cloned).
fn patch(base: Vec<Need>, changes: &Changes) -> Vec<Need> {
    let changed: FxHashSet<&str> = changes.iter().map(|(c, _)| c.as_str()).collect();
    // The new rows, in snapshot order. Within a cluster, roll-up order breaks ties.
    let mut fresh: Vec<(Need, usize)> = Vec::new();
    for (_, needs) in changes {
        fresh.extend(needs.iter().cloned().enumerate().map(|(i, n)| (n, i)));
    }
    fresh.sort_by(|a, b| stable_cmp((&a.0, a.1), (&b.0, b.1)));
    // Kept rows are already in order; the two runs never tie (a tie needs the same
    // cluster, and a cluster is in exactly one of them).
    let mut out = Vec::with_capacity(base.len() + fresh.len());
    let mut fresh = fresh.into_iter().map(|(n, _)| n).peekable();
    for n in base {
        if changed.contains(n.cluster.as_str()) {
            continue;
        }
        while let Some(f) = fresh.next_if(|f| snapshot_order(f, &n) == Ordering::Less) {
            out.push(f);
        }
        out.push(n);
    }
    out.extend(fresh);
    out
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
        let now: Changes = changes
            .clusters
            .iter()
            .map(|c| (c.cluster.clone(), c.needs.clone()))
            .collect();
        for (cluster, needs) in &now {
            if needs.is_empty() {
                self.by_cluster.remove(cluster);
            } else {
                self.by_cluster.insert(cluster.clone(), needs.clone());
            }
        }
        let current = std::mem::take(&mut self.sorted);
        let base = match self.previous.take() {
            // Generation n-1 is ours again: replay n-1 → n, then apply n → n+1 below.
            Some((older, led_here)) => match Arc::try_unwrap(older) {
                Ok(v) => patch(v, &led_here),
                Err(_) => current.as_ref().clone(),
            },
            None => current.as_ref().clone(),
        };
        self.sorted = Arc::new(patch(base, &now));
        self.previous = Some((current, now));
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
                (
                    prop::collection::vec((0usize..6, prop::collection::vec((0i32..3, 0u8..4), 0..4)), 0..4),
                    any::<bool>(),
                ),
                1..12,
            ),
        ) {
            let names = ["a", "b", "c", "d", "e", "f"];
            let mut t = NeedsTable::new();
            let mut v = DemandView::new();
            // A reader (an InspectNeeds call) may still hold an older snapshot.
            let mut reader: Option<Arc<Vec<Need>>> = None;
            for (round, (step, hold)) in steps.into_iter().enumerate() {
                reader = hold.then(|| Arc::clone(v.sorted())).or(reader.filter(|_| round % 3 != 0));
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
            drop(reader);
        }
    }
}
