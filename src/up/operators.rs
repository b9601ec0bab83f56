//! Simulated operators for `bigfleet up`: one per cluster, each dialling its shard's
//! gateway (cluster `i` ⇒ shard `i mod shards`) with a realistic, churning demand.

use std::time::Duration;

use bigfleet_loadtest::{Churn, Demand, NeedSpec, Operator, OperatorConfig, OperatorHandle};

use super::UpError;
use super::local::Mesh;

/// `cluster-0`, `cluster-1`, ... (the names the built-in catalog binds machines to).
pub fn cluster_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("cluster-{i}")).collect()
}

/// The shard serving cluster index `i`.
pub fn shard_of(i: usize, shards: usize) -> usize {
    i % shards.max(1)
}

/// Clusters (by index) served by `shard`.
pub fn clusters_of(shard: usize, shards: usize, clusters: usize) -> Vec<usize> {
    (0..clusters)
        .filter(|&i| shard_of(i, shards) == shard)
        .collect()
}

/// Cluster `i`'s workloads: CPU services and a GPU job everywhere, plus a Same-rack
/// training gang on every fourth cluster (starting with the second).
pub fn demand_for(i: usize) -> Demand {
    let mut d = Demand::typical();
    if i % 4 == 1 {
        d.needs
            .push(NeedSpec::rack_gang(&format!("train-{i}"), 4, 8, 2000));
    }
    d
}

/// How the simulated operators behave.
#[derive(Debug, Clone)]
pub struct OperatorPlan {
    pub rollup_interval: Duration,
    pub churn: Option<Churn>,
    /// The multi-shard demo's demand ([`super::demo::demand_for`]) instead of
    /// [`demand_for`].
    pub multi_shard_demo: bool,
}

impl Default for OperatorPlan {
    fn default() -> Self {
        Self {
            rollup_interval: Duration::from_secs(5),
            churn: Some(Churn {
                probability: 0.3,
                spread: 0.25,
            }),
            multi_shard_demo: false,
        }
    }
}

/// Starts operators for the first `count` of `clusters` clusters.
pub fn spawn(
    mesh: &Mesh,
    clusters: usize,
    count: usize,
    plan: &OperatorPlan,
) -> Result<Vec<OperatorHandle>, UpError> {
    let shards = mesh.ports().shards.len();
    let ids = cluster_ids(clusters);
    let mut out = Vec::new();
    for (i, id) in ids.iter().enumerate().take(count) {
        let mut cfg = OperatorConfig::new(id, &mesh.gateway_target(shard_of(i, shards)));
        cfg.tls = mesh.client_tls(&format!("cluster/{id}"))?;
        cfg.rollup_interval = plan.rollup_interval;
        cfg.demand = if plan.multi_shard_demo {
            super::demo::demand_for(i, shards)
        } else {
            demand_for(i)
        };
        cfg.churn = plan.churn;
        out.push(Operator::spawn(cfg));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_spread_over_shards() {
        assert_eq!(clusters_of(0, 2, 5), [0, 2, 4]);
        assert_eq!(clusters_of(1, 2, 5), [1, 3]);
        assert_eq!(shard_of(7, 1), 0);
        assert_eq!(cluster_ids(2), ["cluster-0", "cluster-1"]);
    }

    #[test]
    fn every_fourth_cluster_trains_on_one_rack() {
        assert_eq!(demand_for(0).needs.len(), 3);
        let d = demand_for(1);
        assert_eq!(d.needs.len(), 4);
        let r = d.rollup("cluster-1", 1);
        assert!(bigfleet_conv::rollup_from_proto(&r).is_ok());
        assert_eq!(r.needs[3].group, "train-1");
    }
}
