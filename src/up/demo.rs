//! `bigfleet up --shards N` with N above one: a multi-shard fleet that shows a transfer
//! (ADR-0139). One fake provider serves every shard; shard `i` owns zone `fake-z<i>`; the
//! only GPU machines (Idle) sit in shard-1's zone, and shard-0's simulated clusters ask
//! for GPUs while the other shards' clusters ask for nothing. The coordinator's
//! rebalancer, tuned to act within a few report intervals, moves Idle GPU machines from
//! shard-1 to shard-0 by `TransferOwnership`, and shard-0's shortfall clears.
//!
//! Only the built-in catalog gets the demo: `--catalog`, `--machines` and `--provider`
//! keep their own machines (and one provider per shard), and one shard is unchanged.

use std::collections::BTreeMap;
use std::time::Duration;

use bigfleet_fake_provider::{CapacityKind, Catalog, Pool, StateCounts, ZONE_LABEL};
use bigfleet_loadtest::{Demand, NeedSpec};
use bigfleet_proto::mesh::v1 as meshpb;
use bigfleet_proto::v1alpha1 as pb;
use svc_inspect::view::TransfersView;

use super::UpArgs;
use super::UpError;
use super::local::Mesh;

/// The topology label each shard's domain is a value of.
pub const ZONE_KEY: &str = ZONE_LABEL;
/// The GPU type only shard-1's zone has.
pub const GPU_TYPE: &str = "bm.gpu.h100.8";
/// Idle GPU machines in shard-1's zone: two racks.
pub const GPU_MACHINES: u32 = 16;

/// Whether `args` ask for the demo: several shards over the built-in catalog.
pub fn enabled(args: &UpArgs) -> bool {
    args.shards > 1 && args.provider.is_none() && args.catalog.is_none() && args.machines.is_none()
}

/// Shard `i`'s zone.
pub fn zone_of(shard: usize) -> String {
    format!("fake-z{shard}")
}

/// One catalog for the shared provider: the fleet's only machines are GPU machines, all
/// Idle, in shard-1's zone. Nothing else is Idle anywhere, so shard-1's GPUs are the only
/// free supply and the transfer the rebalancer starts is the one that helps (a shortfall
/// without an instance-type requirement takes whatever the donor has Idle).
pub fn catalog() -> Catalog {
    let base = Catalog::builtin();
    let gpu = Pool {
        name: "gpu-z1".to_owned(),
        instance_type: GPU_TYPE.to_owned(),
        capacity_type: CapacityKind::BareMetal,
        zones: vec![zone_of(1)],
        price_per_hour: 0.0,
        interruption_probability: 0.0,
        labels: BTreeMap::new(),
        rack_size: Some(8),
        clusters: Vec::new(),
        counts: StateCounts {
            idle: GPU_MACHINES,
            ..StateCounts::default()
        },
    };
    Catalog {
        pools: vec![gpu],
        ..base
    }
}

/// Cluster `i`'s demand in the demo: one GPU pod of eight GPUs (one machine) on each of
/// shard-0's clusters; nothing elsewhere, so no other shard competes for the GPUs.
pub fn demand_for(i: usize, shards: usize) -> Demand {
    if super::operators::shard_of(i, shards) == 0 {
        Demand::new(vec![NeedSpec::gpu(1, 8, 1000)])
    } else {
        Demand::empty()
    }
}

/// The coordinator's rebalancer, tuned to act within a few report intervals (the shards
/// report every 2 s under `up`): a round every 500 ms on shortfalls one cycle old and seen
/// for a second, reports up to a minute old, then `extra` (e.g. the settle and cool-down).
/// The multi-shard tests start their meshes with it too.
pub fn quick_rebalancer_flags(extra: &[&str]) -> Vec<String> {
    [
        "--rebalance-interval",
        "500ms",
        "--rebalance-min-age-cycles",
        "1",
        "--rebalance-min-persist",
        "1s",
        "--rebalance-report-max-age",
        "1m",
    ]
    .iter()
    .chain(extra)
    .map(|s| (*s).to_owned())
    .collect()
}

/// The demo's rebalancer: [`quick_rebalancer_flags`] with a 4 s settle and a 30 s
/// cool-down.
pub fn coordinator_flags() -> Vec<String> {
    quick_rebalancer_flags(&["--rebalance-settle", "4s", "--rebalance-cooldown", "30s"])
}

/// Channels to every coordinator replica, the first one first.
async fn coordinator_channels(
    mesh: &Mesh,
    role: &str,
) -> Result<Vec<bigfleet_mesh::MeshChannel>, UpError> {
    let p = mesh.ports();
    let scheme = if mesh.pki().is_some() {
        "https"
    } else {
        "http"
    };
    let mut out = Vec::new();
    for c in p.coordinator.iter().chain(&p.coordinators) {
        out.push(
            mesh.channel(&format!("{scheme}://{}", c.grpc), role)
                .await?,
        );
    }
    if out.is_empty() {
        return Err(UpError::Config("the demo needs a coordinator".into()));
    }
    Ok(out)
}

/// The coordinator's transfer picture, from whichever replica leads.
pub async fn transfers(mesh: &Mesh) -> Result<TransfersView, UpError> {
    let mut last = String::from("no coordinator answered");
    for ch in coordinator_channels(mesh, "readonly").await? {
        let mut c = bigfleet_mesh::with_message_limits!(
            meshpb::coordinator_info_client::CoordinatorInfoClient::new(ch)
        );
        match c
            .list_transfers(meshpb::ListTransfersRequest::default())
            .await
        {
            Ok(r) => return Ok(TransfersView::from_proto(&r.into_inner())),
            Err(e) => last = format!("ListTransfers: {e}"),
        }
    }
    Err(UpError::Rpc(last))
}

/// Gives shard `i` zone `fake-z<i>` and waits until every shard has acknowledged its
/// domain (no instruction pending), so no machine has two owners once demand arrives.
pub async fn assign_zones(mesh: &Mesh, within: Duration) -> Result<(), UpError> {
    let shards = mesh.ports().shards.len();
    let mut assigned = vec![false; shards];
    let every = Duration::from_millis(250);
    let settled = bigfleet_mesh::poll_until(within, every, async || {
        for (i, done) in assigned.iter_mut().enumerate() {
            if *done {
                continue;
            }
            for ch in coordinator_channels(mesh, "admin").await? {
                let mut c = bigfleet_mesh::with_message_limits!(
                    pb::coordinator_client::CoordinatorClient::new(ch)
                );
                let req = pb::AssignDomainRequest {
                    topology_key: ZONE_KEY.to_owned(),
                    topology_value: zone_of(i),
                    shard_id: format!("shard-{i}"),
                };
                // NOT_FOUND until the shard's first report registers it; FAILED_PRECONDITION
                // from a follower.
                if c.assign_domain(req).await.is_ok() {
                    *done = true;
                    break;
                }
            }
        }
        let acknowledged = assigned.iter().all(|d| *d)
            && transfers(mesh).await.is_ok_and(|v| {
                v.shards.len() == shards
                    && v.shards
                        .iter()
                        .all(|s| s.domains.len() == 1 && s.pending_instruction_ids.is_empty())
            });
        Ok::<_, UpError>(acknowledged.then_some(()))
    })
    .await?;
    settled.ok_or_else(|| {
        UpError::Config(format!(
            "the shards did not take their zones within {} (assigned: {assigned:?})",
            humantime::format_duration(within)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_only_machines_are_idle_gpus_in_shard_ones_zone() {
        let c = catalog();
        c.validate().unwrap();
        assert_eq!(c.pools.len(), 1);
        let p = &c.pools[0];
        assert_eq!(
            (p.instance_type.as_str(), p.zones.clone(), p.counts.total()),
            (GPU_TYPE, vec![zone_of(1)], u64::from(GPU_MACHINES))
        );
        assert_eq!(p.counts.idle, GPU_MACHINES);
    }

    #[test]
    fn only_shard_zeros_clusters_ask_for_gpus() {
        // Four clusters over three shards: 0 and 3 are shard-0's.
        for i in [0, 3] {
            assert!(matches!(demand_for(i, 3).needs[..], [NeedSpec::Gpu { .. }]));
        }
        for i in [1, 2] {
            assert!(demand_for(i, 3).needs.is_empty());
        }
    }
}
