//! The seam between the cycle and the coordinator client: [`CoordView`]
//! implements `bigfleet_coordclient::ShardView` over decide's plain-data
//! accessors, converting to the coordinator's wire types here so neither side
//! knows the other.

use bigfleet_conv::{requirements_to_proto, resources_message};
use bigfleet_coordclient::ShardView;
use bigfleet_proto::v1alpha1 as pb;
use futures::future::BoxFuture;
use svc_shard_decide_core::Decide;

/// Decide as the coordinator client sees it.
#[derive(Debug, Clone)]
pub struct CoordView {
    decide: Decide,
}

impl CoordView {
    pub fn new(decide: Decide) -> Self {
        CoordView { decide }
    }
}

fn count(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl ShardView for CoordView {
    fn summary(&self) -> BoxFuture<'_, pb::ShardSummary> {
        Box::pin(async move {
            let s = self.decide.summary().await;
            pb::ShardSummary {
                total_machines: count(s.inventory.total),
                free_machines: count(s.inventory.free),
                per_instance_type_counts: s
                    .inventory
                    .by_instance_type
                    .into_iter()
                    .map(|(k, v)| (k, count(v)))
                    .collect(),
                per_zone_counts: s
                    .inventory
                    .by_zone
                    .into_iter()
                    .map(|(k, v)| (k, count(v)))
                    .collect(),
                provider_address: s.provider_address,
            }
        })
    }

    fn shortfalls(&self, limit: usize) -> Vec<pb::Shortfall> {
        self.decide
            .shortfalls(limit)
            .into_iter()
            .map(|e| pb::Shortfall {
                requirements: requirements_to_proto(e.profile.requirements()),
                deficit: resources_message(&e.deficit),
                priority: e.profile.priority(),
                age_cycles: i32::try_from(e.age_cycles).unwrap_or(i32::MAX),
                interruption_penalty_bucket: i32::from(e.interruption_bucket.ordinal()),
            })
            .collect()
    }

    fn observe_term(&self, term: i64) {
        self.decide.observe_coordinator_term(term);
    }

    fn assign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        if key.is_empty() {
            return Err("empty topology key".to_owned());
        }
        self.decide.assign_domain(key, value);
        Ok(())
    }

    fn unassign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        self.decide.unassign_domain(key, value);
        Ok(())
    }
}
