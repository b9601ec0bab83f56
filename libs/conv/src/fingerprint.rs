//! The fingerprint of a wire roll-up's demand: what decide compares to
//! recognise an identical re-send without converting it (issue 17, ADR-0111).
//!
//! Every field that reaches the demand is hashed; the operator's
//! `timestamp_unix_nanos` (informational) is not. Map entries are combined
//! order-independently, because two decodings of the same bytes may iterate a
//! `HashMap` differently. The destructuring below names every field, so a
//! field added to the proto fails to compile here until it is hashed.

use bigfleet_proto::v1alpha1 as pb;
use std::hash::{DefaultHasher, Hash, Hasher};

/// 128 bits of a roll-up's demand (two independently salted SipHash streams): a
/// false "identical" needs a collision between two roll-ups of one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RollupFingerprint(pub u128);

/// Two hashers fed the same bytes under different salts.
struct Pair(DefaultHasher, DefaultHasher);

impl Pair {
    fn new() -> Self {
        let mut a = DefaultHasher::new();
        let mut b = DefaultHasher::new();
        0x6269_6766_6c65_6574u64.hash(&mut a);
        0x726f_6c6c_7570_7321u64.hash(&mut b);
        Pair(a, b)
    }

    fn put(&mut self, v: impl Hash) {
        v.hash(&mut self.0);
        v.hash(&mut self.1);
    }

    fn finish(&self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }

    /// A map's entries, independent of iteration order.
    fn map<'a>(&mut self, m: impl IntoIterator<Item = (&'a String, &'a String)>) {
        let mut sum = 0u128;
        let mut n = 0u64;
        for (k, v) in m {
            let mut e = Pair::new();
            e.put(k);
            e.put(v);
            sum = sum.wrapping_add(e.finish());
            n += 1;
        }
        self.put(n);
        self.put(sum);
    }
}

/// The fingerprint of `rollup`'s cluster id and needs, in wire order.
pub fn rollup_fingerprint(rollup: &pb::ClusterCapacityNeeds) -> RollupFingerprint {
    let pb::ClusterCapacityNeeds {
        cluster_id,
        timestamp_unix_nanos: _,
        needs,
    } = rollup;
    let mut h = Pair::new();
    h.put(cluster_id);
    h.put(needs.len());
    for need in needs {
        let pb::CapacityNeed {
            requirements,
            aggregate_resources,
            priority,
            spread,
            interruption_penalty_bucket,
            reclamation_penalty_bucket,
            min_unit,
            group,
        } = need;
        h.put(requirements.len());
        for r in requirements {
            let pb::NodeSelectorRequirement {
                key,
                operator,
                values,
            } = r;
            h.put(key);
            h.put(operator);
            h.put(values);
        }
        h.map(aggregate_resources);
        h.put(priority);
        h.put(spread.len());
        for s in spread {
            let pb::TopologySpread {
                topology_key,
                max_skew,
                when_unsatisfiable,
            } = s;
            h.put(topology_key);
            h.put(max_skew);
            h.put(when_unsatisfiable);
        }
        h.put(interruption_penalty_bucket);
        h.put(reclamation_penalty_bucket);
        h.map(min_unit);
        h.put(group);
    }
    RollupFingerprint(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need() -> pb::CapacityNeed {
        pb::CapacityNeed {
            requirements: vec![pb::NodeSelectorRequirement {
                key: "topology.kubernetes.io/zone".into(),
                operator: pb::node_selector_requirement::Operator::In as i32,
                values: vec!["a".into(), "b".into()],
            }],
            aggregate_resources: [("cpu", "4"), ("memory", "8Gi"), ("pods", "3")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            priority: 10,
            spread: vec![pb::TopologySpread {
                topology_key: "zone".into(),
                max_skew: 1,
                when_unsatisfiable: 1,
            }],
            interruption_penalty_bucket: 2,
            reclamation_penalty_bucket: 3,
            min_unit: [("cpu", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            group: "g".into(),
        }
    }

    fn rollup(needs: Vec<pb::CapacityNeed>) -> pb::ClusterCapacityNeeds {
        pb::ClusterCapacityNeeds {
            cluster_id: "c1".into(),
            timestamp_unix_nanos: 5,
            needs,
        }
    }

    #[test]
    fn the_operator_timestamp_and_map_order_do_not_count() {
        let a = rollup(vec![need(), need()]);
        let mut b = a.clone();
        b.timestamp_unix_nanos = 99;
        // Rebuild the maps in reverse insertion order (a different HashMap layout).
        for n in &mut b.needs {
            let mut entries: Vec<_> = n.aggregate_resources.drain().collect();
            entries.reverse();
            n.aggregate_resources = entries.into_iter().collect();
        }
        assert_eq!(rollup_fingerprint(&a), rollup_fingerprint(&b));
    }

    #[test]
    fn every_demand_field_counts() {
        let base = rollup_fingerprint(&rollup(vec![need()]));
        type Edit = fn(&mut pb::ClusterCapacityNeeds);
        let edits: [(&str, Edit); 14] = [
            ("cluster", |r| r.cluster_id.push('x')),
            ("need added", |r| r.needs.push(need())),
            ("needs withdrawn", |r| r.needs.clear()),
            ("requirement key", |r| {
                r.needs[0].requirements[0].key.push('x')
            }),
            ("operator", |r| r.needs[0].requirements[0].operator = 2),
            ("values", |r| {
                r.needs[0].requirements[0]
                    .values
                    .pop()
                    .map(drop)
                    .unwrap_or(())
            }),
            ("aggregate value", |r| {
                r.needs[0]
                    .aggregate_resources
                    .insert("cpu".into(), "5".into());
            }),
            ("aggregate entry moved between maps", |r| {
                let v = r.needs[0]
                    .aggregate_resources
                    .remove("pods")
                    .unwrap_or_default();
                r.needs[0].min_unit.insert("pods".into(), v);
            }),
            ("priority", |r| r.needs[0].priority += 1),
            ("spread skew", |r| r.needs[0].spread[0].max_skew = 2),
            ("spread when", |r| {
                r.needs[0].spread[0].when_unsatisfiable = 2
            }),
            ("interruption bucket", |r| {
                r.needs[0].interruption_penalty_bucket = 1
            }),
            ("reclamation bucket", |r| {
                r.needs[0].reclamation_penalty_bucket = 1
            }),
            ("group", |r| r.needs[0].group.clear()),
        ];
        for (what, edit) in edits {
            let mut r = rollup(vec![need()]);
            edit(&mut r);
            assert_ne!(
                rollup_fingerprint(&r),
                base,
                "{what} must change the fingerprint"
            );
        }
    }

    #[test]
    fn need_order_counts() {
        let mut second = need();
        second.priority = 1;
        let a = rollup(vec![need(), second.clone()]);
        let b = rollup(vec![second, need()]);
        assert_ne!(rollup_fingerprint(&a), rollup_fingerprint(&b));
    }
}
