//! Need: one cluster's aggregate demand for one profile (and group).

use crate::machine::ClusterId;
use crate::profile::Profile;
use crate::resources::ResourceVector;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

/// One NeedsTable row. There is no count: the number of machines is the
/// engine's output (ADR-0027).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Need {
    pub cluster: ClusterId,
    /// Shared, immutable aggregation key.
    pub profile: Arc<Profile>,
    /// Sum of the per-replica requests aggregated into this need.
    pub aggregate_resources: ResourceVector,
    /// Per-dimension max of the atomic units: every machine counted for this
    /// need must cover it on its own.
    pub min_unit: ResourceVector,
    /// Age clock; 0 means unknown.
    pub arrival_unix_nanos: i64,
    /// Opaque co-location identity (`""` for plain needs); equality only.
    pub group: String,
    /// Shard-local parking flag, set per cycle; never on the wire.
    pub acquisition_parked: bool,
}

impl Need {
    /// A need with empty resources, arrival 0, no group, not parked.
    pub fn new(cluster: impl Into<ClusterId>, profile: impl Into<Arc<Profile>>) -> Need {
        Need {
            cluster: cluster.into(),
            profile: profile.into(),
            aggregate_resources: ResourceVector::new(),
            min_unit: ResourceVector::new(),
            arrival_unix_nanos: 0,
            group: String::new(),
            acquisition_parked: false,
        }
    }

    pub fn priority(&self) -> i32 {
        self.profile.priority()
    }

    pub fn fingerprint(&self) -> &str {
        self.profile.fingerprint()
    }
}

/// The NeedsTable snapshot order: priority desc, arrival asc (older first),
/// cluster asc. Use with a STABLE sort so ties keep each cluster's slice order.
pub fn snapshot_order(a: &Need, b: &Need) -> Ordering {
    b.priority()
        .cmp(&a.priority())
        .then(a.arrival_unix_nanos.cmp(&b.arrival_unix_nanos))
        .then_with(|| a.cluster.cmp(&b.cluster))
}

/// The shared roll-up primitive: groups by (cluster, fingerprint, group), sums
/// aggregate resources, takes the per-dimension max of min units and the
/// earliest non-zero arrival. Output is in first-seen order; the first member
/// of each group supplies the profile and the parked flag.
pub fn aggregate(needs: impl IntoIterator<Item = Need>) -> Vec<Need> {
    let mut out: Vec<Need> = Vec::new();
    let mut index: HashMap<(ClusterId, String, String), usize> = HashMap::new();
    for need in needs {
        let key = (
            need.cluster.clone(),
            need.fingerprint().to_owned(),
            need.group.clone(),
        );
        match index.get(&key) {
            Some(&i) => {
                let acc = &mut out[i];
                acc.aggregate_resources
                    .add_assign(&need.aggregate_resources);
                acc.min_unit = acc.min_unit.max(&need.min_unit);
                acc.arrival_unix_nanos =
                    earliest_nonzero(acc.arrival_unix_nanos, need.arrival_unix_nanos);
            }
            None => {
                index.insert(key, out.len());
                out.push(need);
            }
        }
    }
    out
}

fn earliest_nonzero(a: i64, b: i64) -> i64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::PenaltyBucket;

    fn profile(prio: i32) -> Arc<Profile> {
        Arc::new(Profile::new(
            vec![],
            vec![],
            prio,
            PenaltyBucket::Zero,
            PenaltyBucket::Zero,
        ))
    }

    fn need(cluster: &str, prio: i32, arrival: i64, group: &str, cpu: i64) -> Need {
        Need {
            aggregate_resources: ResourceVector::from_milli([("cpu", cpu)]),
            min_unit: ResourceVector::from_milli([("cpu", cpu / 2)]),
            arrival_unix_nanos: arrival,
            group: group.into(),
            ..Need::new(cluster, profile(prio))
        }
    }

    #[test]
    fn aggregate_groups_by_cluster_fingerprint_group() {
        let out = aggregate([
            need("a", 1, 0, "", 1000),
            need("b", 1, 5, "", 1000),
            need("a", 1, 9, "", 4000),
            need("a", 1, 3, "", 2000),
            need("a", 1, 1, "g", 1000),
            need("a", 2, 1, "", 1000),
        ]);
        let summary: Vec<_> = out
            .iter()
            .map(|n| {
                (
                    n.cluster.as_str(),
                    n.priority(),
                    n.group.as_str(),
                    n.aggregate_resources.get("cpu"),
                    n.min_unit.get("cpu"),
                    n.arrival_unix_nanos,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("a", 1, "", 7000, 2000, 3),
                ("b", 1, "", 1000, 500, 5),
                ("a", 1, "g", 1000, 500, 1),
                ("a", 2, "", 1000, 500, 1),
            ]
        );
    }

    #[test]
    fn snapshot_order_priority_arrival_cluster_and_stable() {
        let mut rows = [
            need("b", 1, 10, "first", 1),
            need("a", 1, 10, "", 1),
            need("b", 1, 10, "second", 1),
            need("z", 5, 99, "", 1),
            need("a", 1, 2, "", 1),
        ];
        rows.sort_by(snapshot_order);
        let order: Vec<_> = rows
            .iter()
            .map(|n| {
                (
                    n.cluster.as_str(),
                    n.priority(),
                    n.arrival_unix_nanos,
                    n.group.as_str(),
                )
            })
            .collect();
        assert_eq!(
            order,
            [
                ("z", 5, 99, ""),
                ("a", 1, 2, ""),
                ("a", 1, 10, ""),
                ("b", 1, 10, "first"),
                ("b", 1, 10, "second"),
            ]
        );
    }
}
