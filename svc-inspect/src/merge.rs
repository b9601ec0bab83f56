//! Fleet-wide row order: priority (high first), then arrival (early first), then cluster id
//! — the order every shard streams in — with the shard id and fingerprint as final
//! tie-breakers so the merged list is deterministic.

use std::cmp::Ordering;

use bigfleet_proto::v1alpha1::NeedView;

/// A need row and the shard that streamed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardRow {
    pub shard_id: String,
    pub view: NeedView,
}

fn priority(v: &NeedView) -> i32 {
    v.need.as_ref().map_or(0, |n| n.priority)
}

/// The InspectNeeds order, extended with deterministic tie-breakers.
pub fn row_order(a: &ShardRow, b: &ShardRow) -> Ordering {
    priority(&b.view)
        .cmp(&priority(&a.view))
        .then(a.view.arrival_unix_nanos.cmp(&b.view.arrival_unix_nanos))
        .then_with(|| a.view.cluster_id.cmp(&b.view.cluster_id))
        .then_with(|| a.shard_id.cmp(&b.shard_id))
        .then_with(|| a.view.profile_fingerprint.cmp(&b.view.profile_fingerprint))
}

/// Merges per-shard rows into fleet order and keeps at most `limit` rows (0: all). Each
/// shard's own list may arrive in any order; it is sorted here rather than trusted.
pub fn merge(per_shard: Vec<Vec<ShardRow>>, limit: usize) -> Vec<ShardRow> {
    let mut all: Vec<ShardRow> = per_shard.into_iter().flatten().collect();
    all.sort_by(row_order);
    if limit > 0 {
        all.truncate(limit);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_proto::v1alpha1::CapacityNeed;
    use proptest::prelude::*;

    fn row(shard: &str, cluster: &str, prio: i32, arrival: i64) -> ShardRow {
        ShardRow {
            shard_id: shard.into(),
            view: NeedView {
                need: Some(CapacityNeed {
                    priority: prio,
                    ..Default::default()
                }),
                cluster_id: cluster.into(),
                arrival_unix_nanos: arrival,
                ..Default::default()
            },
        }
    }

    fn key(r: &ShardRow) -> (String, i32, i64) {
        (
            r.view.cluster_id.clone(),
            priority(&r.view),
            r.view.arrival_unix_nanos,
        )
    }

    #[test]
    fn priority_then_arrival_then_cluster_across_shards() {
        let a = vec![row("s1", "b", 10, 5), row("s1", "a", 1, 1)];
        let b = vec![
            row("s2", "a", 10, 5),
            row("s2", "z", 10, 2),
            row("s2", "c", 50, 9),
        ];
        let merged = merge(vec![a, b], 0);
        let keys: Vec<_> = merged.iter().map(key).collect();
        assert_eq!(
            keys,
            vec![
                ("c".into(), 50, 9),
                ("z".into(), 10, 2),
                ("a".into(), 10, 5),
                ("b".into(), 10, 5),
                ("a".into(), 1, 1),
            ]
        );
    }

    #[test]
    fn limit_keeps_the_head() {
        let merged = merge(vec![vec![row("s1", "a", 1, 1), row("s1", "a", 9, 1)]], 1);
        assert_eq!(merged.len(), 1);
        assert_eq!(priority(&merged[0].view), 9);
    }

    proptest! {
        #[test]
        fn merged_rows_are_sorted_and_complete(
            rows in proptest::collection::vec((0u8..3, 0u8..4, -3i32..3, 0i64..5), 0..40),
            limit in 0usize..10,
        ) {
            let mut per_shard: Vec<Vec<ShardRow>> = vec![Vec::new(); 3];
            for (s, c, p, t) in &rows {
                per_shard[*s as usize].push(row(&format!("s{s}"), &format!("c{c}"), *p, *t));
            }
            let merged = merge(per_shard, limit);
            let expected = if limit == 0 { rows.len() } else { limit.min(rows.len()) };
            prop_assert_eq!(merged.len(), expected);
            for w in merged.windows(2) {
                prop_assert_ne!(row_order(&w[0], &w[1]), Ordering::Greater);
            }
            // The kept rows are the best ones: nothing dropped ranks before the last kept.
            if let Some(last) = merged.last() {
                let dropped = rows.len() - merged.len();
                let better_than_last = rows
                    .iter()
                    .map(|(s, c, p, t)| row(&format!("s{s}"), &format!("c{c}"), *p, *t))
                    .filter(|r| row_order(r, last) == Ordering::Less)
                    .count();
                prop_assert!(better_than_last < merged.len() || dropped == 0);
            }
        }
    }
}
