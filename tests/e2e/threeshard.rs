//! Three shards as one fleet (issue #21), with real processes over one shared fake provider
//! whose actuation log records which shard's fencing token touched each machine: shard-0
//! owns zone fake-1a, shard-1 fake-1b (the only GPU machines), shard-2 fake-1c. A GPU
//! shortfall on shard-0 is cleared from shard-1's Idle supply (shard-2 is never involved),
//! and the coordinator killed mid-transfer leaves every machine with one owner and the
//! transfer completing after it is back; a high-priority shortfall with no free supply
//! anywhere makes the coordinator ask shard-1 for a `CrossShardDrain`, which shard-1 carries
//! out with its own drain grace and reclaim budget.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bigfleet::up::demo::quick_rebalancer_flags;
use bigfleet::up::local::{FakeSeed, ProviderSpec};
use bigfleet_fake_provider::Catalog;
use bigfleet_fake_provider::actuation::read_actuation_log;
use bigfleet_proto::mesh::v1 as meshpb;
use bigfleet_proto::v1alpha1 as pb;

use crate::harness::{Scenario, gpu_units, wait_until};
use crate::ownership::{
    all_owned_by, assign_zones, cpu_pool, cpu_pool_of, gpu_pool, owned_set, owners, zoned_catalog,
};

const GPU_TYPE: &str = "bm.gpu.8";
const ZONES: [(&str, usize); 3] = [("fake-1a", 0), ("fake-1b", 1), ("fake-1c", 2)];

/// CPU machines in fake-1a and fake-1c, the only GPU machines (all Idle) in fake-1b. Shard-2
/// has more free machines (six CPU) than shard-1 has GPUs (four), so the coordinator asks it
/// first for shard-0's GPU shortfall, which pins no instance type: it must give nothing
/// (ADR-0142).
fn catalog() -> Catalog {
    zoned_catalog(&[
        cpu_pool("cpu-a", "fake-1a"),
        gpu_pool("fake-1b"),
        cpu_pool_of("cpu-c", "fake-1c", 6),
    ])
}

/// Three shards over one audited provider seeded from `catalog`, zones assigned, and a
/// rebalancer that acts within a few report intervals (plus `coordinator_flags`).
async fn three_shards(
    catalog: Catalog,
    coordinator_flags: &[&str],
    decide_flags: &[&str],
) -> Scenario {
    let coordinator_flags = quick_rebalancer_flags(coordinator_flags);
    let decide_flags: Vec<String> = decide_flags.iter().map(|s| (*s).to_owned()).collect();
    let sc = Scenario::start("small-gpu.json", move |spec| {
        spec.shards = 3;
        spec.shared_provider = true;
        spec.provider_audit = true;
        spec.provider = ProviderSpec::Fake(vec![FakeSeed::Catalog(Box::new(catalog))]);
        spec.decide_flags.extend(decide_flags);
        spec.coordinator_flags = coordinator_flags;
    })
    .await;
    assign_zones(&sc, &ZONES).await;
    sc
}

/// The shard a machine's zone belongs to.
fn zone_owner(m: &pb::Machine) -> usize {
    ZONES
        .iter()
        .find(|(z, _)| *z == m.zone)
        .map(|(_, s)| *s)
        .expect("a zone of the catalog")
}

fn shard_index(token: &str) -> Option<usize> {
    token.strip_prefix("shard-").and_then(|n| n.parse().ok())
}

/// The provider's actuation log against ownership: per machine, the shards whose tokens
/// acted on it, in the order the provider accepted them, are its zone's shard and then —
/// only for a machine that moved — the shard owning it now, never interleaved. So no shard
/// ever acted on a machine it did not own, before or after the move.
async fn check_actuations(sc: &Scenario) {
    let now: BTreeMap<String, (pb::Machine, Vec<usize>)> = owners(sc)
        .await
        .into_iter()
        .map(|(m, who)| (m.id.clone(), (m, who)))
        .collect();
    let logs = sc.mesh().actuation_logs();
    assert_eq!(logs.len(), 1, "one shared, audited provider");
    let log = read_actuation_log(&logs[0]).expect("actuation log");
    assert!(!log.is_empty(), "the provider recorded no actuation");
    let mut actors: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for a in log.iter().filter(|a| !a.replay) {
        let shard = shard_index(&a.shard)
            .unwrap_or_else(|| panic!("unfenced or unknown token on {}: {a:?}", a.machine));
        let seq = actors.entry(a.machine.as_str()).or_default();
        if seq.last() != Some(&shard) {
            seq.push(shard);
        }
    }
    for (machine, seq) in actors {
        let (m, who) = &now[machine];
        let first = zone_owner(m);
        let allowed: Vec<usize> = if who.as_slice() == [first] || who.is_empty() {
            vec![first]
        } else {
            vec![first, who[0]]
        };
        // `seq` has no repeats in a row, so "in `allowed`'s order" rules out any back and forth.
        let at = |s: &usize| allowed.iter().position(|a| a == s);
        let in_order =
            seq.iter().all(|s| at(s).is_some()) && seq.windows(2).all(|w| at(&w[0]) < at(&w[1]));
        assert!(
            in_order,
            "machine {machine} ({}) was acted on by shards {seq:?}; its zone is shard-{first}'s \
             and it is owned by {who:?} now",
            m.zone
        );
    }
}

/// Shard-0's GPU machines (adopted from shard-1).
async fn gpus_on_shard0(sc: &Scenario) -> BTreeSet<String> {
    owners(sc)
        .await
        .into_iter()
        .filter(|(m, who)| m.instance_type == GPU_TYPE && who == &[0])
        .map(|(m, _)| m.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn threeshard_transfer_clears_a_shortfall_and_survives_a_coordinator_kill_mid_transfer() {
    // Shard-2's two empty answers (idle, then speculative) do not count against the
    // default window of four starts (ADR-0142).
    let mut sc = three_shards(catalog(), &["--rebalance-settle", "3s"], &[]).await;
    let before = owners(&sc).await;
    assert!(
        before.iter().all(|(m, who)| who == &[zone_owner(m)]),
        "{before:?}"
    );

    // Shard-0's cluster asks for a GPU; only shard-1's zone has them, all Idle.
    sc.operator("c0", gpu_units(1, 100));
    let first = wait_until(
        Duration::from_secs(90),
        "a GPU machine adopted by shard-0 and bound to c0",
        async || {
            let now = owners(&sc).await;
            let bound: BTreeSet<String> = now
                .iter()
                .filter(|(m, who)| who == &[0] && m.instance_type == GPU_TYPE && m.cluster == "c0")
                .map(|(m, _)| m.id.clone())
                .collect();
            if bound.is_empty() {
                Err(format!(
                    "shard-0 owns GPUs {:?}, none bound yet",
                    now.iter()
                        .filter(|(m, who)| who == &[0] && m.instance_type == GPU_TYPE)
                        .map(|(m, _)| m.id.as_str())
                        .collect::<Vec<_>>()
                ))
            } else {
                Ok(bound)
            }
        },
    )
    .await;
    let released = owned_set(&sc, 1).released;
    assert!(
        first.is_subset(&released),
        "adopted {first:?} but shard-1 released {released:?}"
    );
    let bystander = owned_set(&sc, 2);
    assert!(
        bystander.released.is_empty() && bystander.adopted.is_empty(),
        "shard-2 has no GPU and must not take part: {bystander:?}"
    );

    // A second cluster of shard-0 needs two more: the next transfer starts, and the
    // coordinator dies as soon as shard-1 releases for it.
    let released_before = owned_set(&sc, 1).released;
    sc.operator("c0b", gpu_units(2, 100));
    let fresh = wait_until(
        Duration::from_secs(90),
        "shard-1 released another GPU machine",
        async || {
            owners(&sc).await;
            let now = owned_set(&sc, 1).released;
            let fresh: BTreeSet<String> = now.difference(&released_before).cloned().collect();
            if fresh.is_empty() {
                Err(format!("released {now:?}"))
            } else {
                Ok(fresh)
            }
        },
    )
    .await;
    let adopted_at_kill = owned_set(&sc, 0).adopted;
    sc.mesh_mut()
        .kill("coordinator")
        .await
        .expect("kill coordinator");
    eprintln!(
        "coordinator killed with {:?} released by shard-1, of which shard-0 had adopted {:?}",
        fresh,
        fresh.intersection(&adopted_at_kill).collect::<Vec<_>>()
    );
    // The shards carry on alone; no machine gains a second owner meanwhile.
    for _ in 0..3 {
        owners(&sc).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sc.mesh_mut()
        .restart("coordinator")
        .await
        .expect("restart coordinator");

    // The transfer completes after the restart: everything shard-1 released ends up owned
    // by shard-0 alone, and shard-0 uses it.
    let released = owned_set(&sc, 1).released;
    all_owned_by(
        &sc,
        &released,
        0,
        "every released machine adopted after the restart",
    )
    .await;
    wait_until(
        Duration::from_secs(90),
        "three GPU machines bound to shard-0's clusters",
        async || {
            let now = owners(&sc).await;
            let n = now
                .iter()
                .filter(|(m, who)| {
                    who == &[0]
                        && m.instance_type == GPU_TYPE
                        && (m.cluster == "c0" || m.cluster == "c0b")
                })
                .count();
            if n >= 3 {
                Ok(())
            } else {
                Err(format!("{n} bound"))
            }
        },
    )
    .await;
    for (m, who) in owners(&sc).await {
        assert_eq!(who.len(), 1, "machine {} owners {who:?}", m.id);
    }
    assert!(gpus_on_shard0(&sc).await.len() >= 3);
    check_actuations(&sc).await;
    sc.finish().await;
}

/// `RecentActions` of `cluster` from shard `i`'s public port.
async fn recent_actions(sc: &Scenario, i: usize, cluster: &str) -> Vec<meshpb::ActionRecord> {
    let mesh = sc.mesh();
    let ch = mesh
        .channel(&mesh.gateway_target(i), "readonly")
        .await
        .expect("dial the gateway");
    let mut c =
        bigfleet_mesh::with_message_limits!(meshpb::shard_info_client::ShardInfoClient::new(ch));
    c.recent_actions(meshpb::RecentActionsRequest {
        cluster_id: cluster.into(),
        limit: 100,
        ..Default::default()
    })
    .await
    .expect("ShardInfo.RecentActions")
    .into_inner()
    .actions
}

/// Drains shard `i` answered by choosing at least one victim, from its decide's log.
fn drains_with_victims(sc: &Scenario, i: usize) -> usize {
    let log = sc.mesh().log_dir().join(format!("shard-{i}-decide.log"));
    std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("cross-shard drain: victims chosen") && !l.contains("chosen=0"))
        .count()
}

/// Machines of `cluster` that are Configured now.
async fn configured_in(sc: &Scenario, cluster: &str) -> usize {
    sc.count(pb::MachineState::Configured, cluster).await
}

/// Only the four GPU machines, in shard-1's zone: once shard-1's cluster holds them all, no
/// shard has anything free (the other zones are empty), so only a drain can help shard-0.
fn gpu_only_catalog() -> Catalog {
    zoned_catalog(&[gpu_pool("fake-1b")])
}

#[tokio::test(flavor = "multi_thread")]
async fn threeshard_cross_shard_drain_honours_the_donors_grace_and_reclaim_budget() {
    // Reclaim budget per cluster: max(1, ⌊0.05 × 4⌋) = 1 per 10-minute window, so within
    // this test shard-1 may reclaim at most one of c1's machines, however often it is asked;
    // a 1 s cool-down lets the coordinator ask again and again.
    // On a loaded machine a stale shard-1 report ("4 free") can cost an empty idle
    // transfer, and the drained machine a speculative attempt before the idle transfer
    // that moves it; the empty ones do not count against the default window of four
    // starts (ADR-0142), so the second drain is not held back.
    let mut sc = three_shards(
        gpu_only_catalog(),
        &["--rebalance-settle", "1s", "--rebalance-cooldown", "1s"],
        &[
            "--reclaim-budget-fraction=0.05",
            "--reclaim-budget-window=10m",
        ],
    )
    .await;
    // Shard-1's own low-priority cluster takes every GPU machine.
    let c1 = sc.mesh().gateway_target(1);
    sc.operator_at("c1", &c1, gpu_units(4, 10));
    wait_until(
        Duration::from_secs(90),
        "c1 holds all four GPU machines",
        async || {
            owners(&sc).await;
            let n = configured_in(&sc, "c1").await;
            if n == 4 { Ok(()) } else { Err(format!("{n}")) }
        },
    )
    .await;

    // Shard-0 needs a GPU at a priority above --rebalance-drain-min-priority (1,000,000):
    // nothing is free anywhere, so the coordinator asks shard-1 to drain, repeatedly while
    // shard-0 stays short.
    const PREEMPTOR: i32 = 2_000_000;
    // Two machines wanted: the first drain's machine is held from c1, reported as shard-1's
    // Idle supply and moved by a transfer (ADR-0137); the second drain finds c1's reclaim
    // budget (one per window) spent.
    sc.operator("c0", gpu_units(2, PREEMPTOR));
    let finished_drains = async || {
        sc.metric(
            "coordinator",
            "bigfleet_coordinator_rebalance_transfers_finished_total",
            &[("kind", "cross_shard_drain")],
        )
        .await
    };
    wait_until(
        Duration::from_secs(120),
        "shard-1 asked to drain twice, one of c1's machines reclaimed and moved to c0",
        async || {
            owners(&sc).await;
            let drains = finished_drains().await;
            let asked = drains_with_victims(&sc, 1);
            let reclaims = recent_actions(&sc, 1, "c1")
                .await
                .into_iter()
                .filter(|a| a.kind == "reclaim" || a.kind == "preempt")
                .count();
            let in_c0 = configured_in(&sc, "c0").await;
            if asked >= 2 && reclaims >= 1 && in_c0 >= 1 {
                Ok(())
            } else {
                Err(format!(
                    "{drains} drains finished, {asked} chose victims on shard-1, \
                     {reclaims} reclaims in c1, {in_c0} machines in c0"
                ))
            }
        },
    )
    .await;

    // Asked twice or more, shard-1 reclaimed one machine of c1 — its budget — and
    // gave it its own drain grace for this priority gap (Phase 3's excess reclaims get 600 s).
    let reclaims: Vec<meshpb::ActionRecord> = recent_actions(&sc, 1, "c1")
        .await
        .into_iter()
        .filter(|a| a.kind == "reclaim" || a.kind == "preempt")
        .collect();
    assert_eq!(
        reclaims.len(),
        1,
        "one reclaim within the budget: {reclaims:?}"
    );
    let grace = bigfleet_decision::drain_grace(PREEMPTOR, 10);
    assert_eq!(
        reclaims[0].grace_seconds,
        grace.as_secs_f64(),
        "{reclaims:?}"
    );
    assert_eq!(grace, Duration::from_secs(10));
    // Every machine still has one owner.
    for (m, who) in owners(&sc).await {
        assert_eq!(who.len(), 1, "machine {} owners {who:?}", m.id);
    }
    check_actuations(&sc).await;
    sc.finish().await;
}
