//! The shard side of `CrossShardDrain` (ADR-0137): victims chosen by Phase 2's
//! score among lower-priority machines only, reclaimed through the normal action
//! path with Phase 2's drain grace, and held back — not lost — by the reclaim
//! budget. Simulated clock, in-process provider.

use crate::common;

use bigfleet_model::machine::{
    META_ASSIGNED_INTERRUPTION_PENALTY, META_ASSIGNED_PRIORITY, META_ASSIGNED_RECLAMATION_PENALTY,
};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use common::{finish_draining, pm, start_draining};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use svc_shard_decide_core::{Decide, DecideConfig, RailsConfig, TransferVerdict, edge};

const SEC: i64 = 1_000_000_000;
/// Any fixed start does.
const T0: i64 = 1_795_737_600 * SEC;
/// A preemptor this far above priority-10 victims gets Phase 2's shortest grace.
const URGENT: i32 = 2_000_000;

type Source = common::MapSource;

/// A Configured machine of cluster c1 serving demand of `priority` (no roll-up
/// of c1 ever arrives, so Phase 3 never reclaims it on its own).
fn serving(id: &str, priority: i32) -> pb::Machine {
    let mut m = pm(id, pb::MachineState::Configured, "c1");
    m.capacity_type = pb::CapacityType::Reserved as i32;
    m.shard_metadata = [
        (META_ASSIGNED_PRIORITY, priority.to_string()),
        (META_ASSIGNED_INTERRUPTION_PENALTY, "8".to_owned()),
        (META_ASSIGNED_RECLAMATION_PENALTY, "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    m
}

fn decide(rails: RailsConfig, source: &Source, clock: &Arc<AtomicI64>) -> Decide {
    let cfg = DecideConfig {
        rails,
        engine_threads: 1,
        queue_capacity: 1_000,
        ..DecideConfig::default()
    };
    common::decide_on_clock(cfg, source.clone(), clock)
}

fn selectors(token: &str, n: usize) -> Vec<String> {
    vec![token.to_owned(); n]
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn pending(d: &Decide) -> Vec<String> {
    d.pending_drains()
        .into_iter()
        .map(|p| p.machine_id)
        .collect()
}

/// Every action handed out now: (kind, machine, grace seconds).
async fn hand_out_all(d: &Decide) -> Vec<mesh::WorkItem> {
    let mut out = Vec::new();
    while let Some(item) = edge::hand_out(d, 1).await {
        out.push(item);
    }
    out
}

fn kind_machine_grace(item: &mesh::WorkItem) -> (i32, String, i64) {
    let a = item.action.as_ref().unwrap();
    (a.kind, a.machine_id.clone(), a.grace_seconds)
}

#[tokio::test]
async fn a_drain_takes_only_lower_priority_victims_best_first() {
    let source = Source::default();
    source.put(serving("a-mid", 500));
    source.put(serving("b-low", 10));
    source.put(serving("c-high", 5_000));
    source.put(serving("d-equal", 1_000));
    let mut other = serving("e-other-type", 10);
    other.instance_type = "c5.large".into();
    source.put(other);
    source.put(pm("f-idle", pb::MachineState::Idle, ""));
    let clock = Arc::new(AtomicI64::new(T0));
    let d = decide(RailsConfig::off(), &source, &clock);
    // Before the first listing it cannot know what it has: asked again later.
    assert!(matches!(
        d.drain_machines("early", &selectors("*/m5.xlarge", 1), 1_000),
        TransferVerdict::Busy(_)
    ));
    d.run_cycle().await.unwrap();
    // Four asked, two below the preemptor: the bigger priority gap first (Phase 2's
    // score), not id order; equal and higher priorities, Idle machines and other
    // types are never victims.
    assert_eq!(
        d.drain_machines("d1", &selectors("*/m5.xlarge", 4), 1_000),
        TransferVerdict::Released(ids(&["b-low", "a-mid"]))
    );
    assert_eq!(pending(&d), ["b-low", "a-mid"]);
    // A shortfall that lacks GPUs drains none of these CPU machines (ADR-0142).
    assert_eq!(
        d.drain_machines("d1-gpu", &selectors("*?needs=nvidia.com/gpu", 3), 1_000),
        TransferVerdict::Released(vec![])
    );
    // A machine already chosen is not chosen twice; "*" takes any type.
    assert_eq!(
        d.drain_machines("d2", &selectors("*", 3), 1_000),
        TransferVerdict::Released(ids(&["e-other-type"]))
    );
    // Nothing eligible left: an empty choice, not an error.
    assert_eq!(
        d.drain_machines("d3", &selectors("*", 1), 1_000),
        TransferVerdict::Released(vec![])
    );
    assert!(matches!(
        d.drain_machines("d4", &ids(&["a-mid"]), 1_000),
        TransferVerdict::Refused(_)
    ));
    // The next cycle hands the victims out as reclaims, best victim first.
    let r = d.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 3);
    let handed: Vec<String> = hand_out_all(&d)
        .await
        .iter()
        .map(|i| kind_machine_grace(i).1)
        .collect();
    assert_eq!(handed, ["b-low", "a-mid", "e-other-type"]);
}

#[tokio::test]
async fn drained_machines_are_reclaimed_with_phase2_grace() {
    let source = Source::default();
    source.put(serving("v1", 10));
    source.put(serving("v2", 900_000));
    let clock = Arc::new(AtomicI64::new(T0));
    let d = decide(RailsConfig::off(), &source, &clock);
    d.run_cycle().await.unwrap();
    assert_eq!(
        d.drain_machines("d1", &selectors("*/m5.xlarge", 2), URGENT),
        TransferVerdict::Released(ids(&["v1", "v2"]))
    );
    d.run_cycle().await.unwrap();
    let items = hand_out_all(&d).await;
    let reclaim = mesh::ActionKind::Reclaim as i32;
    // Gaps above 900,000 (1,999,990 and 1,100,000): Phase 2's 10 s.
    assert_eq!(
        items.iter().map(kind_machine_grace).collect::<Vec<_>>(),
        [(reclaim, "v1".into(), 10), (reclaim, "v2".into(), 10)]
    );
    // A smaller gap gets Phase 2's longer grace.
    source.put(serving("v3", 10));
    d.run_cycle().await.unwrap();
    assert_eq!(
        d.drain_machines("d2", &selectors("*", 1), 200_000),
        TransferVerdict::Released(ids(&["v3"]))
    );
    d.run_cycle().await.unwrap();
    let items = hand_out_all(&d).await;
    assert_eq!(
        items.iter().map(kind_machine_grace).collect::<Vec<_>>(),
        [(reclaim, "v3".into(), 120)]
    );
    assert_eq!(
        bigfleet_decision::drain_grace(200_000, 10),
        Duration::from_secs(120)
    );
}

#[tokio::test]
async fn the_reclaim_budget_defers_a_drain_without_losing_it() {
    let source = Source::default();
    for id in ["m1", "m2", "m3"] {
        source.put(serving(id, 10));
    }
    let clock = Arc::new(AtomicI64::new(T0));
    // Three machines in c1: a budget of one reclaim per window.
    let rails = RailsConfig {
        reclaim_budget_fraction: 0.05,
        reclaim_budget_window: Duration::from_secs(600),
        ..RailsConfig::off()
    };
    let d = decide(rails, &source, &clock);
    d.run_cycle().await.unwrap();
    assert_eq!(
        d.drain_machines("d1", &selectors("*/m5.xlarge", 2), URGENT),
        TransferVerdict::Released(ids(&["m1", "m2"]))
    );
    let r = d.run_cycle().await.unwrap();
    assert_eq!((r.enqueued, r.capped), (1, 1), "one fits the budget");
    let items = hand_out_all(&d).await;
    assert_eq!(items.len(), 1);
    assert_eq!(kind_machine_grace(&items[0]).1, "m1");
    start_draining(&d, &source, &items[0]).await;
    // The budget is spent for the window: m2 waits, still pending.
    clock.fetch_add(SEC, Ordering::SeqCst);
    let r = d.run_cycle().await.unwrap();
    assert_eq!((r.enqueued, r.capped), (0, 1));
    assert!(hand_out_all(&d).await.is_empty());
    assert_eq!(pending(&d), ["m2"], "m1 started draining; m2 is deferred");
    // m1 finishes and the window passes: m2 goes.
    finish_draining(&d, &source, &items[0]).await;
    clock.fetch_add(600 * SEC, Ordering::SeqCst);
    let r = d.run_cycle().await.unwrap();
    assert_eq!((r.enqueued, r.capped), (1, 0));
    let items = hand_out_all(&d).await;
    assert_eq!(kind_machine_grace(&items[0]).1, "m2");
    start_draining(&d, &source, &items[0]).await;
    d.run_cycle().await.unwrap();
    assert!(pending(&d).is_empty(), "every drain started");
}

/// The machine the donor drained waits for its transfer: for `DRAIN_HOLD` the
/// donor's own demand (the demand it was drained from) cannot bootstrap it back,
/// though the donor still owns it and reports it as Idle supply. After the hold
/// it is ordinary supply again.
#[tokio::test]
async fn a_drained_machine_is_held_from_the_donors_own_demand_until_the_hold_ends() {
    let source = Source::default();
    source.put(serving("v", 10));
    let clock = Arc::new(AtomicI64::new(T0));
    let d = decide(RailsConfig::off(), &source, &clock);
    edge::apply_rollup(&d, &common::rollup("c1", vec![common::need(4, 10)])).unwrap();
    d.run_cycle().await.unwrap();
    assert_eq!(
        d.drain_machines("d1", &selectors("*/m5.xlarge", 1), URGENT),
        TransferVerdict::Released(ids(&["v"]))
    );
    assert_eq!(d.held_drains(), ["v"]);
    d.run_cycle().await.unwrap();
    let items = hand_out_all(&d).await;
    assert_eq!(items.len(), 1, "the drain's reclaim");
    start_draining(&d, &source, &items[0]).await;
    finish_draining(&d, &source, &items[0]).await;
    d.done(&items[0].action_id, "succeeded");
    // c1 still wants the machine; during the hold the cycle leaves it alone.
    clock.fetch_add(SEC, Ordering::SeqCst);
    d.run_cycle().await.unwrap();
    assert!(
        hand_out_all(&d).await.is_empty(),
        "a held machine was handed back to the demand it was drained from"
    );
    let s = d.summary().await;
    assert_eq!(s.inventory.free, 1, "held supply is still reported as Idle");
    // The hold ends: it is ordinary supply again and c1 gets it back.
    clock.fetch_add(
        i64::try_from(svc_shard_decide_core::drain::DRAIN_HOLD.as_nanos()).unwrap(),
        Ordering::SeqCst,
    );
    assert!(d.held_drains().is_empty());
    d.run_cycle().await.unwrap();
    let items = hand_out_all(&d).await;
    assert_eq!(
        items.iter().map(kind_machine_grace).collect::<Vec<_>>(),
        [(mesh::ActionKind::Bootstrap as i32, "v".into(), 0)]
    );
}
