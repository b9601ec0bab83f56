//! A shard restarted mid-transfer (issue #21, ADR-0129, ADR-0137), with real processes: two
//! shards over one shared fake provider, each owning one zone, and the coordinator leader's
//! rebalancer moving Idle GPU machines from shard-1's zone to shard-0's GPU shortfall by
//! `TransferOwnership`. Every observation checks, from both shards' saved owned sets, that
//! no machine is ever owned by two shards. The three-shard tests (`threeshard.rs`) cover a
//! transfer clearing a shortfall and a coordinator killed mid-transfer.

use std::time::Duration;

use bigfleet::up::demo::quick_rebalancer_flags;
use bigfleet::up::local::{FakeSeed, ProviderSpec};

use crate::harness::{Scenario, gpu_units, wait_until};
use crate::ownership::{
    all_owned_by, assign_zones, cpu_pool, gpu_pool, owned_set, owners, zoned_catalog,
};

/// Two shards, one provider, a rebalancer that acts within a few report intervals.
async fn two_shards() -> Scenario {
    // Zone fake-1a (shard-0's) has CPU machines only; zone fake-1b (shard-1's) has the only
    // GPU machines, all Idle.
    let catalog = zoned_catalog(&[cpu_pool("cpu", "fake-1a"), gpu_pool("fake-1b")]);
    Scenario::start("small-gpu.json", |spec| {
        spec.shards = 2;
        spec.shared_provider = true;
        spec.provider = ProviderSpec::Fake(vec![FakeSeed::Catalog(Box::new(catalog))]);
        spec.coordinator_flags = quick_rebalancer_flags(&["--rebalance-settle", "10m"]);
    })
    .await
}

/// A donor restarted after saving a selector release but before its ack reached the
/// coordinator answers the redelivered instruction with the machines it released then,
/// saved with its owned set under the instruction id (ADR-0137), and releases nothing
/// new: every machine it released is adopted by the recipient, none is left unowned.
#[tokio::test(flavor = "multi_thread")]
async fn multishard_shard_restart_mid_transfer_resumes_it() {
    let mut sc = two_shards().await;
    assign_zones(&sc, &[("fake-1a", 0), ("fake-1b", 1)]).await;
    sc.operator("c0", gpu_units(2, 100));
    wait_until(
        Duration::from_secs(90),
        "shard-1 released a GPU machine",
        async || {
            owners(&sc).await;
            !owned_set(&sc, 1).released.is_empty()
        },
    )
    .await;
    // Both halves restart: the donor must not take back what it released (its owned set is
    // read back at start-up), the recipient must still adopt it.
    for child in ["shard-1-decide", "shard-0-decide"] {
        sc.mesh_mut().restart(child).await.expect("restart decide");
        owners(&sc).await;
    }
    let released = owned_set(&sc, 1).released;
    assert!(!released.is_empty(), "the donor forgot its release");
    all_owned_by(
        &sc,
        &released,
        0,
        "every released machine adopted after the restarts",
    )
    .await;
    sc.finish().await;
}
