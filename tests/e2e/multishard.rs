//! Many shards as one fleet (issue #21, ADR-0128..0130), with real processes: two shards
//! over one shared fake provider, each owning one zone, and the coordinator leader's
//! rebalancer moving Idle GPU machines from shard-1's zone to shard-0's GPU shortfall by
//! `TransferOwnership`. Every observation checks, from both shards' saved owned sets, that
//! no machine is ever owned by two shards.

use std::collections::BTreeSet;
use std::time::Duration;

use bigfleet::up::local::{FakeSeed, ProviderSpec};
use bigfleet_mesh::RetryPolicy;
use bigfleet_proto::v1alpha1 as pb;
use svc_inspect::coordinator::{CoordinatorClient, CoordinatorConfig};

use crate::harness::{Scenario, gpu_units, wait_until};

const ZONE: &str = "topology.kubernetes.io/zone";
const GPU_TYPE: &str = "bm.gpu.8";

/// Zone fake-1a (shard-0's) has CPU machines only; zone fake-1b (shard-1's) has the only
/// GPU machines, all Idle.
const CATALOG: &str = r#"{
  "provider": "fake",
  "instance_types": {
    "bm.gpu.8": {"resources": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}},
    "s.small.8": {"resources": {"cpu": "8", "memory": "32Gi"}}
  },
  "pools": [
    {"name": "cpu", "instance_type": "s.small.8", "capacity_type": "reserved",
     "zones": ["fake-1a"], "price_per_hour": 0.2, "counts": {"idle": 2}},
    {"name": "gpu", "instance_type": "bm.gpu.8", "capacity_type": "bare_metal",
     "zones": ["fake-1b"], "counts": {"idle": 4}}
  ]
}"#;

/// Two shards, one provider, a rebalancer that acts within a few report intervals.
async fn two_shards() -> Scenario {
    let catalog = bigfleet_fake_provider::Catalog::from_json(CATALOG).expect("catalog");
    Scenario::start("small-gpu.json", |spec| {
        spec.shards = 2;
        spec.shared_provider = true;
        spec.provider = ProviderSpec::Fake(vec![FakeSeed::Catalog(Box::new(catalog))]);
        spec.coordinator_flags = [
            "--rebalance-interval",
            "500ms",
            "--rebalance-min-age-cycles",
            "1",
            "--rebalance-min-persist",
            "1s",
            "--rebalance-settle",
            "10m",
            "--rebalance-report-max-age",
            "1m",
        ]
        .map(String::from)
        .to_vec();
    })
    .await
}

fn coordinator(sc: &Scenario) -> CoordinatorClient {
    let c = sc.mesh().ports().coordinator.clone().expect("coordinator");
    CoordinatorClient::new(CoordinatorConfig {
        addr: format!("http://{}", c.grpc),
        tls: None,
        timeout: Some(Duration::from_secs(5)),
        retry: RetryPolicy::none(),
    })
    .expect("coordinator client")
}

/// A shard's owned set (ADR-0128): domains, plus adopted, minus released machines.
struct Ownership {
    domains: BTreeSet<(String, String)>,
    adopted: BTreeSet<String>,
    released: BTreeSet<String>,
}

/// Shard `i`'s owned set as it saved it (the decide writes it before acking); no file yet
/// means it owns everything.
fn owned_set(sc: &Scenario, i: usize) -> Ownership {
    let path = sc.mesh().ports().shards[i]
        .data_dir
        .join(svc_shard_decide::coordinator::OWNERSHIP_FILE_NAME);
    let o = svc_shard_decide::coordinator::load_ownership(&path)
        .expect("readable owned set")
        .unwrap_or_default();
    Ownership {
        domains: o.domains,
        adopted: o.adopted,
        released: o.released,
    }
}

fn owns(o: &Ownership, m: &pb::Machine) -> bool {
    if o.released.contains(&m.id) {
        return false;
    }
    o.adopted.contains(&m.id)
        || o.domains.is_empty()
        || o.domains.iter().any(|(k, v)| k == ZONE && *v == m.zone)
}

/// Every machine's owners now; panics when one has two (the invariant of ADR-0128).
async fn owners(sc: &Scenario) -> Vec<(pb::Machine, Vec<usize>)> {
    let machines = sc.machines().await;
    let sets = [owned_set(sc, 0), owned_set(sc, 1)];
    machines
        .into_iter()
        .map(|m| {
            let who: Vec<usize> = (0..2).filter(|&i| owns(&sets[i], &m)).collect();
            assert!(
                who.len() <= 1,
                "machine {} ({}, {}) owned by shards {who:?}",
                m.id,
                m.instance_type,
                m.zone
            );
            (m, who)
        })
        .collect()
}

/// Assigns fake-1a to shard-0 and fake-1b to shard-1 and waits until both shards saved
/// their domain (so neither owns everything any more).
async fn assign_zones(sc: &Scenario) {
    let coord = coordinator(sc);
    for (zone, shard) in [("fake-1a", "shard-0"), ("fake-1b", "shard-1")] {
        wait_until(Duration::from_secs(30), "domain assigned", async || {
            coord.assign_domain(ZONE, zone, shard).await
        })
        .await;
    }
    wait_until(
        Duration::from_secs(30),
        "both shards own their zone",
        async || {
            let (a, b) = (owned_set(sc, 0), owned_set(sc, 1));
            a.domains.contains(&(ZONE.to_owned(), "fake-1a".to_owned()))
                && b.domains.contains(&(ZONE.to_owned(), "fake-1b".to_owned()))
        },
    )
    .await;
}

/// Waits until shard-0 owns at least `want` GPU machines (adopted from shard-1), checking
/// single ownership at every observation; returns the adopted ids.
async fn gpus_moved(sc: &Scenario, want: usize, what: &str) -> BTreeSet<String> {
    wait_until(Duration::from_secs(90), what, async || {
        let now = owners(sc).await;
        let on0: BTreeSet<String> = now
            .iter()
            .filter(|(m, who)| m.instance_type == GPU_TYPE && who == &[0])
            .map(|(m, _)| m.id.clone())
            .collect();
        if on0.len() >= want {
            Ok(on0)
        } else {
            Err(format!("shard-0 owns {} GPU machines", on0.len()))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn multishard_transfer_clears_a_shortfall_from_another_shards_idle_supply() {
    let mut sc = two_shards().await;
    assign_zones(&sc).await;
    // Before any demand nobody owns another's zone.
    let before = owners(&sc).await;
    assert!(
        before
            .iter()
            .all(|(m, who)| who == &[if m.zone == "fake-1a" { 0 } else { 1 }]),
        "{before:?}"
    );

    // Shard-0's cluster asks for GPUs; only shard-1's zone has them.
    sc.operator("c0", gpu_units(2, 100));
    let moved = gpus_moved(&sc, 1, "a GPU machine adopted by shard-0").await;
    let released = owned_set(&sc, 1).released;
    assert!(
        moved.iter().all(|id| released.contains(id)),
        "adopted {moved:?} but shard-1 released {released:?}"
    );

    // The shortfall clears: shard-0 acts on the adopted machines for c0.
    wait_until(
        Duration::from_secs(90),
        "an adopted GPU machine bound to c0",
        async || {
            let now = owners(&sc).await;
            now.iter()
                .any(|(m, who)| who == &[0] && m.instance_type == GPU_TYPE && m.cluster == "c0")
                .then_some(())
        },
    )
    .await;
    // Everything has exactly one owner once the transfer is done.
    for (m, who) in owners(&sc).await {
        assert_eq!(who.len(), 1, "machine {} owners {who:?}", m.id);
    }
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn multishard_coordinator_restart_mid_transfer_keeps_one_owner() {
    let mut sc = two_shards().await;
    assign_zones(&sc).await;
    sc.operator("c0", gpu_units(2, 100));
    // Mid-transfer: shard-1 released machines that shard-0 has not adopted yet, or the
    // first adoption just happened; either way the coordinator goes down now.
    wait_until(
        Duration::from_secs(90),
        "shard-1 released a GPU machine",
        async || {
            owners(&sc).await;
            !owned_set(&sc, 1).released.is_empty()
        },
    )
    .await;
    sc.mesh_mut()
        .kill("coordinator")
        .await
        .expect("kill coordinator");
    // Shards keep working alone; no machine gains a second owner meanwhile.
    owners(&sc).await;
    sc.mesh_mut()
        .restart("coordinator")
        .await
        .expect("restart coordinator");
    let released = owned_set(&sc, 1).released;
    // The released machines end up owned by shard-0 (the transfer completes after the
    // restart) and nobody else.
    wait_until(
        Duration::from_secs(120),
        "every released machine adopted",
        async || {
            let now = owners(&sc).await;
            let missing: Vec<&str> = now
                .iter()
                .filter(|(m, who)| released.contains(&m.id) && who != &[0])
                .map(|(m, _)| m.id.as_str())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet adopted: {missing:?}"))
            }
        },
    )
    .await;
    sc.finish().await;
}

/// A donor restarted after saving a selector release but before its ack reached the
/// coordinator answers the redelivered instruction with the machines it released then,
/// saved with its owned set under the instruction id (ADR-0137), and releases nothing
/// new: every machine it released is adopted by the recipient, none is left unowned.
#[tokio::test(flavor = "multi_thread")]
async fn multishard_shard_restart_mid_transfer_resumes_it() {
    let mut sc = two_shards().await;
    assign_zones(&sc).await;
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
    wait_until(
        Duration::from_secs(120),
        "every released machine adopted after the restarts",
        async || {
            let now = owners(&sc).await;
            let missing: Vec<&str> = now
                .iter()
                .filter(|(m, who)| released.contains(&m.id) && who != &[0])
                .map(|(m, _)| m.id.as_str())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet adopted: {missing:?}"))
            }
        },
    )
    .await;
    sc.finish().await;
}
