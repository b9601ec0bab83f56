//! Who owns which machine in a multi-shard mesh, read from each shard's saved owned set
//! (ADR-0128/0129: decide writes it before acking any change), and the coordinator admin
//! calls that set up zone ownership. Shared by the multi-shard end-to-end tests.

use std::collections::BTreeSet;
use std::time::Duration;

use bigfleet_mesh::RetryPolicy;
use bigfleet_proto::v1alpha1 as pb;
use svc_inspect::coordinator::{CoordinatorClient, CoordinatorConfig};

use crate::harness::{Scenario, wait_until};

/// The topology key the tests assign domains by.
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// The multi-shard tests' fake-provider catalog: the GPU type `bm.gpu.8` (8 GPUs) and the
/// CPU type `s.small.8`, stocked by `pools` ([`cpu_pool`], [`gpu_pool`]).
pub fn zoned_catalog(pools: &[serde_json::Value]) -> bigfleet_fake_provider::Catalog {
    let catalog = serde_json::json!({
        "provider": "fake",
        "instance_types": {
            "bm.gpu.8": {"resources": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}},
            "s.small.8": {"resources": {"cpu": "8", "memory": "32Gi"}}
        },
        "pools": pools,
    });
    bigfleet_fake_provider::Catalog::from_json(&catalog.to_string()).expect("catalog")
}

/// Two Idle reserved CPU machines in `zone`.
pub fn cpu_pool(name: &str, zone: &str) -> serde_json::Value {
    cpu_pool_of(name, zone, 2)
}

/// `idle` Idle reserved CPU machines in `zone`.
pub fn cpu_pool_of(name: &str, zone: &str, idle: u32) -> serde_json::Value {
    serde_json::json!({"name": name, "instance_type": "s.small.8", "capacity_type": "reserved",
        "zones": [zone], "price_per_hour": 0.2, "counts": {"idle": idle}})
}

/// Four Idle bare-metal GPU machines in `zone`.
pub fn gpu_pool(zone: &str) -> serde_json::Value {
    serde_json::json!({"name": "gpu", "instance_type": "bm.gpu.8", "capacity_type": "bare_metal",
        "zones": [zone], "counts": {"idle": 4}})
}

/// An admin client of the mesh's coordinator.
pub fn coordinator(sc: &Scenario) -> CoordinatorClient {
    let c = sc.mesh().ports().coordinator.clone().expect("coordinator");
    CoordinatorClient::new(CoordinatorConfig {
        addr: format!("http://{}", c.grpc),
        tls: None,
        timeout: Some(Duration::from_secs(5)),
        retry: RetryPolicy::none(),
    })
    .expect("coordinator client")
}

/// A shard's owned set: domains, plus adopted, minus released machines.
#[derive(Debug, Default)]
pub struct Owned {
    pub domains: BTreeSet<(String, String)>,
    pub adopted: BTreeSet<String>,
    pub released: BTreeSet<String>,
}

impl Owned {
    /// Whether this set holds `m` (a release wins over an adoption; no domains = all).
    pub fn owns(&self, m: &pb::Machine) -> bool {
        if self.released.contains(&m.id) {
            return false;
        }
        self.adopted.contains(&m.id)
            || self.domains.is_empty()
            || self.domains.iter().any(|(k, v)| k == ZONE && *v == m.zone)
    }
}

/// Shard `i`'s owned set as it last saved it; no file yet means it owns everything.
pub fn owned_set(sc: &Scenario, i: usize) -> Owned {
    let path = sc.mesh().ports().shards[i]
        .data_dir
        .join(svc_shard_decide::coordinator::OWNERSHIP_FILE_NAME);
    let o = svc_shard_decide::coordinator::load_ownership(&path)
        .expect("readable owned set")
        .unwrap_or_default();
    Owned {
        domains: o.domains,
        adopted: o.adopted,
        released: o.released,
    }
}

/// Every machine with the shards that own it now; panics when one has two owners.
pub async fn owners(sc: &Scenario) -> Vec<(pb::Machine, Vec<usize>)> {
    let machines = sc.machines().await;
    let shards = sc.mesh().ports().shards.len();
    let sets: Vec<Owned> = (0..shards).map(|i| owned_set(sc, i)).collect();
    machines
        .into_iter()
        .map(|m| {
            let who: Vec<usize> = (0..shards).filter(|&i| sets[i].owns(&m)).collect();
            assert!(
                who.len() <= 1,
                "machine {} ({}, {}, {}) owned by shards {who:?}",
                m.id,
                m.instance_type,
                m.zone,
                m.cluster
            );
            (m, who)
        })
        .collect()
}

/// Assigns each `(zone, shard index)` and waits until every shard saved its zone, so no
/// shard owns everything any more.
pub async fn assign_zones(sc: &Scenario, zones: &[(&str, usize)]) {
    let coord = coordinator(sc);
    for (zone, shard) in zones {
        let shard_id = format!("shard-{shard}");
        wait_until(Duration::from_secs(30), "domain assigned", async || {
            coord.assign_domain(ZONE, zone, &shard_id).await
        })
        .await;
    }
    wait_until(
        Duration::from_secs(30),
        "every shard owns its zone",
        async || {
            let missing: Vec<&str> = zones
                .iter()
                .filter(|(zone, shard)| {
                    !owned_set(sc, *shard)
                        .domains
                        .contains(&(ZONE.to_owned(), (*zone).to_owned()))
                })
                .map(|(zone, _)| *zone)
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet saved: {missing:?}"))
            }
        },
    )
    .await;
}

/// Waits until every machine in `ids` is owned by shard `to` and nobody else, checking
/// single ownership at every observation.
pub async fn all_owned_by(sc: &Scenario, ids: &BTreeSet<String>, to: usize, what: &str) {
    wait_until(Duration::from_secs(120), what, async || {
        let now = owners(sc).await;
        let missing: Vec<&str> = now
            .iter()
            .filter(|(m, who)| ids.contains(&m.id) && who != &[to])
            .map(|(m, _)| m.id.as_str())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("not yet owned by shard-{to}: {missing:?}"))
        }
    })
    .await;
}
