//! Decide's own cycle against a from-scratch one, and ingest against a busy cycle
//! (issue 17). In-crate, because the comparison reads the cycle's room.

use crate::RailsConfig;
use crate::edge;
use crate::shard::{Decide, DecideConfig};
use crate::testing::{MapSource, decide};
use bigfleet_decision::{CycleInput, CycleOptions, CycleOutput, Fleet, run_cycle};
use bigfleet_model::Machine;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

fn machine(i: usize, itype: u8, zone: u8, speculative: bool, price: u8) -> pb::Machine {
    let state = if speculative {
        pb::MachineState::Speculative
    } else {
        pb::MachineState::Idle
    };
    pb::Machine {
        id: format!("m{i}"),
        state: state as i32,
        host: (!speculative).then(|| pb::HostRef {
            provider: "test".into(),
            r#ref: format!("i-{i}"),
        }),
        instance_type: format!("t{itype}"),
        zone: format!("z{zone}"),
        capacity_type: pb::CapacityType::OnDemand as i32,
        price_per_hour: 0.1 + f64::from(price) / 10.0,
        resources: Some(pb::Resources {
            resources: [("cpu".to_owned(), "4".to_owned())].into_iter().collect(),
        }),
        ..Default::default()
    }
}

fn need(cpu: u8, priority: i32, itype: u8) -> pb::CapacityNeed {
    pb::CapacityNeed {
        requirements: vec![pb::NodeSelectorRequirement {
            key: "node.kubernetes.io/instance-type".into(),
            operator: pb::node_selector_requirement::Operator::In as i32,
            values: vec![format!("t{itype}")],
        }],
        aggregate_resources: [("cpu".to_owned(), cpu.to_string())].into_iter().collect(),
        priority,
        interruption_penalty_bucket: pb::PenaltyBucket::Zero as i32,
        reclamation_penalty_bucket: pb::PenaltyBucket::Zero as i32,
        ..Default::default()
    }
}

fn rollup(cluster: &str, needs: Vec<pb::CapacityNeed>, at: i64) -> mesh::ApplyRollupRequest {
    mesh::ApplyRollupRequest {
        received_at_unix_nanos: at,
        ..crate::testing::rollup_request(cluster, at, needs)
    }
}

fn quiet_cfg() -> DecideConfig {
    DecideConfig {
        rails: RailsConfig::off(),
        engine_threads: 1,
        ..DecideConfig::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The engine over what the cycle keeps between cycles (patched fleet, patched demand
/// view) and over the same facts rebuilt from scratch (a fresh fleet, a full sort of
/// the demand table).
async fn both_ways(d: &Decide, now: i64) -> (CycleOutput, CycleOutput) {
    let room = d.inner.cycle_room.lock().await;
    let inv = d.inner.inventory.read().await;
    let scratch_demand = d.inner.intake.lock().needs.snapshot();
    let opts = CycleOptions {
        verdicts: true,
        ..CycleOptions::default()
    };
    let kept = room.demand.sorted();
    let incremental = run_cycle(
        &CycleInput {
            now_unix_nanos: now,
            ..CycleInput::with_fleet(inv.fleet(), kept)
        },
        &opts,
    )
    .expect("incremental cycle");
    let machines: Vec<Machine> = inv.ids().filter_map(|id| inv.get(id)).collect();
    let stamps: Vec<Option<i64>> = machines.iter().map(|m| inv.idle_since_of(&m.id)).collect();
    let fresh = Fleet::from_machines(&machines, &stamps).expect("fresh fleet");
    let scratch = run_cycle(
        &CycleInput {
            now_unix_nanos: now,
            ..CycleInput::with_fleet(&fresh, &scratch_demand)
        },
        &opts,
    )
    .expect("from-scratch cycle");
    (incremental, scratch)
}

/// One step: roll-ups (per cluster: new demand, the last one again, or a withdrawal)
/// and fleet changes (machine i re-listed with a new shape, or dropped).
type Step = (
    Vec<(usize, u8, Vec<(u8, i32, u8)>)>,
    Vec<(usize, u8, u8, bool, u8)>,
);

fn step() -> impl Strategy<Value = Step> {
    (
        prop::collection::vec(
            (
                0usize..4,
                0u8..3,
                prop::collection::vec((1u8..12, 0i32..3, 0u8..2), 0..4),
            ),
            0..4,
        ),
        prop::collection::vec((0usize..10, 0u8..2, 0u8..2, any::<bool>(), 0u8..3), 0..4),
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("BIGFLEET_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    /// For any sequence of roll-ups (changed, identical, withdrawn) and fleet changes,
    /// what the cycle keeps between cycles gives exactly the engine output (actions,
    /// verdicts, shortfalls) of a cycle over the same facts built from scratch.
    #[test]
    fn incremental_cycles_equal_from_scratch_cycles(steps in prop::collection::vec(step(), 1..8)) {
        let rt = runtime();
        let source = Arc::new(MapSource::default());
        for i in 0..8 {
            source.put(machine(i, (i % 2) as u8, (i % 2) as u8, i % 3 == 0, 0));
        }
        let d = decide(quiet_cfg(), Arc::clone(&source));
        let clusters = ["a", "b", "c", "d"];
        let mut last: Vec<Option<Vec<pb::CapacityNeed>>> = vec![None; clusters.len()];
        for (round, (rollups, fleet)) in steps.into_iter().enumerate() {
            let at = 1_000 + round as i64;
            for (c, kind, rows) in rollups {
                let needs = match (kind, &last[c]) {
                    (0, Some(prev)) => prev.clone(),
                    (1, _) => Vec::new(),
                    _ => rows.iter().map(|&(cpu, p, t)| need(cpu, p, t)).collect(),
                };
                last[c] = Some(needs.clone());
                let resp = edge::apply_rollup(&d, &rollup(clusters[c], needs, at));
                prop_assert!(resp.is_ok(), "{resp:?}");
            }
            for &(i, t, z, spec, price) in &fleet {
                source.remove(&format!("m{i}"));
                if price < 2 {
                    source.put(machine(i, t, z, spec, price));
                }
            }
            let report = rt.block_on(d.run_cycle());
            prop_assert!(report.is_ok(), "{report:?}");
            let (incremental, scratch) = rt.block_on(both_ways(&d, at));
            prop_assert_eq!(&incremental.actions, &scratch.actions);
            prop_assert_eq!(&incremental.verdicts, &scratch.verdicts);
            prop_assert_eq!(&incremental.shortfalls, &scratch.shortfalls);
        }
    }
}

#[test]
fn an_identical_resend_neither_applies_demand_nor_wakes_a_cycle() {
    let rt = runtime();
    let source = Arc::new(MapSource::default());
    source.put(machine(0, 0, 0, false, 0));
    let d = decide(quiet_cfg(), Arc::clone(&source));
    let m = d.metrics().clone();
    let wakeups = || m.cycle_wakeups.with_label_values(&["rollup"]).get();
    let demand = vec![need(4, 1, 0), need(2, 0, 1)];
    let first = edge::apply_rollup(&d, &rollup("a", demand.clone(), 10)).expect("first");
    assert_eq!(first.outcome, mesh::RollupOutcome::Accepted as i32);
    assert_eq!((wakeups(), m.rollups_unchanged.get()), (1, 0));
    rt.block_on(d.run_cycle()).expect("cycle");
    // Same demand, a later operator timestamp and gateway arrival: recognised.
    let again = edge::apply_rollup(&d, &rollup("a", demand.clone(), 20)).expect("again");
    assert_eq!(again.outcome, mesh::RollupOutcome::Accepted as i32);
    assert_eq!(again.need_rows, 2);
    assert_eq!((wakeups(), m.rollups_unchanged.get()), (1, 1));
    // Nothing for the next cycle to take: the demand view keeps its snapshot.
    assert!(d.inner.intake.lock().take().demand.is_empty());
    // A real change wakes again.
    edge::apply_rollup(&d, &rollup("a", vec![need(4, 1, 0)], 30)).expect("changed");
    assert_eq!((wakeups(), m.rollups_unchanged.get()), (2, 1));
}

#[test]
fn a_resend_after_a_held_drop_is_judged_again() {
    let rt = runtime();
    let source = Arc::new(MapSource::default());
    let d = decide(
        DecideConfig {
            rails: RailsConfig::default(),
            engine_threads: 1,
            ..DecideConfig::default()
        },
        Arc::clone(&source),
    );
    rt.block_on(d.run_cycle()).expect("first reconcile");
    let big: Vec<_> = (0..12).map(|i| need(4, i, 0)).collect();
    edge::apply_rollup(&d, &rollup("a", big.clone(), 1)).expect("big");
    let drop = edge::apply_rollup(&d, &rollup("a", vec![], 2)).expect("drop");
    assert_eq!(drop.outcome, mesh::RollupOutcome::Quarantined as i32);
    // The re-send of the demand in force resets the count of consecutive drops, so it
    // must not be answered from the fingerprint.
    edge::apply_rollup(&d, &rollup("a", big, 3)).expect("resend");
    assert_eq!(d.metrics().rollups_unchanged.get(), 0);
    assert_eq!(d.inner.intake.lock().guard.held("a"), 0);
}

/// ApplyRollup on a blocking thread, so a call stuck on a lock fails the test (after a
/// bound far beyond any honest ack) instead of hanging it.
async fn ack_within_bound(
    d: &Decide,
    req: mesh::ApplyRollupRequest,
) -> Result<mesh::ApplyRollupResponse, &'static str> {
    let d = d.clone();
    let call = tokio::task::spawn_blocking(move || edge::apply_rollup(&d, &req));
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(Ok(resp))) => Ok(resp),
        Ok(Ok(Err(_))) => Err("rejected"),
        Ok(Err(_)) => Err("panicked"),
        Err(_) => Err("timed out"),
    }
}

#[test]
fn acks_stay_fast_while_a_cycle_is_stuck_in_a_slow_list() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let gate = Arc::new(Semaphore::new(1));
        let source = Arc::new(MapSource::gated(Arc::clone(&gate)));
        source.put(machine(0, 0, 0, false, 0));
        let d = decide(quiet_cfg(), Arc::clone(&source));
        d.run_cycle().await.expect("first cycle");
        // The first List left a wake-up behind; the next List blocks until the test
        // lets it go.
        source.list_started().await;
        let cycle = tokio::spawn({
            let d = d.clone();
            async move { d.run_cycle().await }
        });
        source.list_started().await;
        for i in 0..200 {
            let ack = ack_within_bound(&d, rollup(&format!("c{i}"), vec![need(4, 1, 0)], 5))
                .await
                .expect("ApplyRollup waited for the stuck cycle");
            assert_eq!(ack.outcome, mesh::RollupOutcome::Accepted as i32);
        }
        assert!(!cycle.is_finished(), "the cycle is still inside its List");
        // The same while a cycle holds the inventory and its room (an engine run).
        gate.add_permits(1);
        let report = cycle.await.expect("join").expect("cycle");
        assert_eq!(
            report.needs, 200,
            "the stuck cycle took what arrived during its List"
        );
        let room = d.inner.cycle_room.lock().await;
        let inv = d.inner.inventory.write().await;
        let ack = ack_within_bound(&d, rollup("late", vec![need(4, 1, 0)], 6))
            .await
            .expect("ApplyRollup waited for the engine's locks");
        assert_eq!(ack.outcome, mesh::RollupOutcome::Accepted as i32);
        drop((inv, room));
    });
}

#[test]
fn hints_sweep_every_cluster_once_per_interval_and_changed_clusters_in_between() {
    let rt = runtime();
    let source = Arc::new(MapSource::default());
    source.put(machine(0, 0, 0, false, 0));
    let d = decide(
        DecideConfig {
            available_capacity_interval: Duration::from_millis(300),
            ..quiet_cfg()
        },
        Arc::clone(&source),
    );
    rt.block_on(async {
        d.run_cycle().await.expect("first reconcile");
        for (i, c) in ["c1", "c2"].into_iter().enumerate() {
            edge::session_opened(
                &d,
                &mesh::SessionOpenedRequest {
                    cluster_id: c.into(),
                    session_id: 1 + i as u64,
                    protocol_version: String::new(),
                },
            )
            .await
            .expect("session opened");
        }
        // More than the shard has, so the need stays unmet and its hint stays put.
        edge::apply_rollup(&d, &rollup("c1", vec![need(64, 1, 0)], 1)).expect("c1");
        assert_eq!(d.run_cycle().await.expect("sweep").hints_sent, 1);
        edge::apply_rollup(&d, &rollup("c2", vec![need(64, 1, 0)], 2)).expect("c2");
        assert_eq!(
            d.run_cycle().await.expect("partial").hints_sent,
            1,
            "c2's demand changed: evaluated before the next sweep"
        );
        // Supply changes: every hint's value changes, but nobody's demand did.
        source.put(machine(1, 0, 0, false, 0));
        assert_eq!(d.run_cycle().await.expect("quiet").hints_sent, 0);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(
            d.run_cycle().await.expect("sweep").hints_sent,
            2,
            "the sweep carries the new supply to both clusters"
        );
    });
}
