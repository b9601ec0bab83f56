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
use rustc_hash::FxHashMap;
use std::cmp::Ordering;
use std::collections::BTreeMap;
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
    /// How many aggregate and min-unit entries name each resource, so the engine gets
    /// the demand's dimensions without reading every row (`CycleInput::demand_dimensions`).
    name_counts: BTreeMap<String, u32>,
    /// `name_counts`' keys.
    names: Vec<String>,
}

/// Adds (or takes away) the resource names `needs` carry; whether the set of names changed.
fn count_names(counts: &mut BTreeMap<String, u32>, needs: &[Need], add: bool) -> bool {
    let mut changed = false;
    for (name, _) in needs
        .iter()
        .flat_map(|n| n.aggregate_resources.iter().chain(n.min_unit.iter()))
    {
        if add {
            let c = counts.entry(name.to_owned()).or_insert_with(|| {
                changed = true;
                0
            });
            *c += 1;
        } else if let Some(c) = counts.get_mut(name) {
            *c -= 1;
            if *c == 0 {
                counts.remove(name);
                changed = true;
            }
        }
    }
    changed
}

/// One changed cluster: where its old rows sat (their priority and arrival) and its
/// rows now (empty: withdrawn).
#[derive(Debug)]
struct Change {
    cluster: String,
    old: Vec<(i32, i64)>,
    new: Vec<Need>,
}

type Changes = Vec<Change>;

/// The snapshot order, total within one cluster: ties of [`snapshot_order`]
/// (same cluster, priority and arrival) keep roll-up order, carried as `index`.
fn stable_cmp(a: (&Need, usize), b: (&Need, usize)) -> Ordering {
    snapshot_order(a.0, b.0).then(a.1.cmp(&b.1))
}

/// [`snapshot_order`] of `row` against a row of `cluster` with this priority and arrival.
fn order_against(row: &Need, priority: i32, arrival: i64, cluster: &str) -> Ordering {
    priority
        .cmp(&row.priority())
        .then(row.arrival_unix_nanos.cmp(&arrival))
        .then_with(|| row.cluster.as_str().cmp(cluster))
}

/// `base` with every listed cluster's rows replaced by the listed ones (moved, not cloned).
///
/// Rows that tie in [`snapshot_order`] share a cluster, so a changed cluster's old rows
/// are found by binary search on their (priority, arrival, cluster), and each new row's
/// place likewise: the work is one pass of moves plus a few searches per changed row,
/// with no per-row hashing or comparing of the clusters that did not change.
fn patch(base: Vec<Need>, changes: &Changes) -> Vec<Need> {
    // Index ranges of the rows that leave, merged and in order.
    let mut gone: Vec<(usize, usize)> = Vec::new();
    for c in changes {
        for &(priority, arrival) in &c.old {
            let lo = base.partition_point(|r| {
                order_against(r, priority, arrival, &c.cluster) == Ordering::Less
            });
            let hi = lo
                + base[lo..].partition_point(|r| {
                    order_against(r, priority, arrival, &c.cluster) == Ordering::Equal
                });
            if lo < hi {
                gone.push((lo, hi));
            }
        }
    }
    gone.sort_unstable();
    // The new rows, in snapshot order (roll-up order breaks ties within a cluster),
    // each with the index of the first base row that goes after it. A new row never
    // ties with a kept row: a tie needs the same cluster, and a cluster's rows are
    // either all kept or all replaced.
    let mut fresh: Vec<(Need, usize)> = Vec::new();
    for c in changes {
        fresh.extend(c.new.iter().cloned().enumerate().map(|(i, n)| (n, i)));
    }
    fresh.sort_by(|a, b| stable_cmp((&a.0, a.1), (&b.0, b.1)));
    let fresh: Vec<(usize, Need)> = fresh
        .into_iter()
        .map(|(n, _)| {
            let at = base.partition_point(|r| snapshot_order(r, &n) == Ordering::Less);
            (at, n)
        })
        .collect();
    let mut fresh = fresh.into_iter().peekable();
    let mut out = Vec::with_capacity(base.len() + fresh.len());
    let mut gone = gone.into_iter().peekable();
    for (i, n) in base.into_iter().enumerate() {
        while let Some((_, f)) = fresh.next_if(|(at, _)| *at <= i) {
            out.push(f);
        }
        while gone.next_if(|&(_, hi)| hi <= i).is_some() {}
        if gone.peek().is_some_and(|&(lo, _)| lo <= i) {
            continue;
        }
        out.push(n);
    }
    out.extend(fresh.map(|(_, f)| f));
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
        let mut names_changed = false;
        let now: Changes = changes
            .clusters
            .iter()
            .map(|c| {
                let old = match &c.needs[..] {
                    [] => self.by_cluster.remove(&c.cluster),
                    new => self.by_cluster.insert(c.cluster.clone(), new.to_vec()),
                };
                names_changed |= count_names(&mut self.name_counts, &c.needs, true);
                names_changed |=
                    count_names(&mut self.name_counts, old.as_deref().unwrap_or(&[]), false);
                let mut old: Vec<(i32, i64)> = old
                    .iter()
                    .flatten()
                    .map(|n| (n.priority(), n.arrival_unix_nanos))
                    .collect();
                old.sort_unstable();
                old.dedup();
                Change {
                    cluster: c.cluster.clone(),
                    old,
                    new: c.needs.clone(),
                }
            })
            .collect();
        if names_changed {
            self.names = self.name_counts.keys().cloned().collect();
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

    /// Every resource name the rows' aggregates and min units carry, sorted.
    pub fn dimensions(&self) -> &[String] {
        &self.names
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
    use proptest::prelude::*;

    /// The needs table's test need, with resources naming a dimension of its own besides
    /// cpu, so the kept dimension set changes as demand comes and goes.
    fn need(prio: i32, tag: &str) -> Need {
        let mut n = crate::needs::tests::need(prio, tag);
        n.aggregate_resources = bigfleet_model::ResourceVector::from_milli([
            ("cpu".to_owned(), 1000),
            (format!("r-{tag}"), 1),
        ]);
        n.min_unit = bigfleet_model::ResourceVector::from_milli([(format!("u-{tag}"), 1)]);
        n
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
                let mut names: Vec<String> = scratch
                    .iter()
                    .flat_map(|n| n.aggregate_resources.iter().chain(n.min_unit.iter()))
                    .map(|(name, _)| name.to_owned())
                    .collect();
                names.sort_unstable();
                names.dedup();
                prop_assert_eq!(v.dimensions(), names.as_slice());
            }
            drop(reader);
        }
    }
}
