//! Phase 3 scenarios: shrink-only reclaim, first-rollup gate, idle release
//! (ADR-0023; the first-roll-up gate is the original's ADR-0036).

use crate::common;
use bigfleet_decision::{CycleInput, CycleOptions, RECLAIM_GRACE};
use bigfleet_model::{Action, ActionKind::*, CapacityType, Machine, MachineState::*};
use common::*;
use std::time::Duration;

fn cpu(n: i64) -> bigfleet_model::ResourceVector {
    units("cpu", n)
}

fn cfg(prefix: &str, n: usize) -> Vec<Machine> {
    fleet(prefix, n, Configured, |m| m.cluster("c1"))
}

#[test]
fn all_excess_when_no_needs() {
    let ms = cfg("m", 3);
    let out = run(&ms, &[]);
    assert_eq!(id_set(&out, Reclaim), ["m-0", "m-1", "m-2"]);
    for a in &out.actions {
        let Action::Reclaim { cluster, grace, .. } = a else {
            panic!("{a:?}")
        };
        assert_eq!(cluster, "c1");
        assert_eq!(*grace, Duration::from_secs(600));
        assert_eq!(a.preemptor_priority(), 0);
        assert_eq!(a.reason(), "phase3.excess");
    }
    assert_eq!(RECLAIM_GRACE, Duration::from_secs(600));
}

#[test]
fn no_op_when_exactly_met() {
    let ms = cfg("m", 3);
    assert!(run(&ms, &[need("c1", cpu(3)).build()]).actions.is_empty());
}

#[test]
fn reclaims_cheapest_first_means_keep_the_cheapest() {
    let mut ms = fleet("od", 3, Configured, |m| m.cluster("c1").price(6.0));
    ms.extend(fleet("bm", 2, Configured, |m| {
        m.cluster("c1").price(0.0).cap(CapacityType::BareMetal)
    }));
    let out = run(&ms, &[need("c1", cpu(3)).build()]);
    let r = id_set(&out, Reclaim);
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|id| id.starts_with("od")), "{r:?}");
}

#[test]
fn emission_is_least_valuable_first() {
    let ms = vec![
        machine("a", Configured).cluster("c1").price(2.0).build(),
        machine("b", Configured).cluster("c1").price(9.0).build(),
        machine("c", Configured)
            .cluster("c1")
            .price(5.0)
            .penalties(0.0, 10.0)
            .build(),
        machine("d", Configured).cluster("c1").price(5.0).build(),
    ];
    assert_eq!(ids(&run(&ms, &[]), Reclaim), ["b", "d", "c", "a"]);
}

#[test]
fn tiebreak_by_reclamation_penalty() {
    let ms = vec![
        machine("keep", Configured)
            .cluster("c1")
            .penalties(0.0, 5000.0)
            .build(),
        machine("zero", Configured)
            .cluster("c1")
            .penalties(0.0, 0.0)
            .build(),
    ];
    let out = run(&ms, &[need("c1", cpu(1)).build()]);
    assert_eq!(ids(&out, Reclaim), ["zero"]);
}

#[test]
fn keeps_by_match_profile_not_fingerprint() {
    // Bootstrapped for some other profile, but it matches this one: it is kept.
    let ms = vec![
        machine("m", Configured)
            .cluster("c1")
            .itype("big")
            .stamp("p=9|something-else", "")
            .build(),
    ];
    let n = need("c1", cpu(1)).req(pin("big")).build();
    assert!(run(&ms, &[n]).actions.is_empty());
    let other = need("c1", cpu(1)).req(pin("small")).build();
    assert_eq!(ids(&run(&ms, &[other]), Reclaim), ["m"]);
}

#[test]
fn per_profile_matching() {
    let ms = cfg("m", 4);
    let out = run(&ms, &[need("c1", cpu(1)).build()]);
    assert_eq!(ids(&out, Reclaim).len(), 3);
}

#[test]
fn conservation() {
    let ms = cfg("m", 10);
    let out = run_verdicts(&ms, &[need("c1", cpu(4)).build()]);
    assert_eq!(ids(&out, Reclaim).len(), 6);
    assert_eq!(out.verdicts[0].claimed_machine_count, 4);
}

#[test]
fn dense_machine_one_covers_many() {
    let mut ms = vec![
        machine("dense", Configured)
            .cluster("c1")
            .res(res(&[("cpu", "64"), ("memory", "256Gi")]))
            .build(),
    ];
    ms.extend(fleet("small", 3, Configured, |m| {
        m.cluster("c1")
            .price(1.0)
            .res(res(&[("cpu", "4"), ("memory", "16Gi")]))
    }));
    let n = need("c1", res(&[("cpu", "40"), ("memory", "100Gi")]))
        .mu(res(&[("cpu", "1"), ("memory", "1Gi")]))
        .build();
    let out = run(&ms, &[n]);
    assert_eq!(id_set(&out, Reclaim), ["small-0", "small-1", "small-2"]);
}

fn gang(n: i64) -> bigfleet_model::Need {
    same_zone_gang("c1", cpu(n), "g").build()
}

fn zcfg(prefix: &str, zone: &str, n: usize) -> Vec<Machine> {
    fleet(prefix, n, Configured, |m| m.cluster("c1").zone(zone))
}

#[test]
fn same_keeps_chosen_domain_reclaims_scatter() {
    let mut ms = zcfg("a", "zone-a", 3);
    ms.extend(zcfg("b", "zone-b", 1));
    let out = run(&ms, &[gang(3)]);
    assert_eq!(ids(&out, Reclaim), ["b-0"]);
}

#[test]
fn same_no_satisfiable_domain_keeps_one_bucket_only() {
    let mut ms = zcfg("a", "zone-a", 2);
    ms.extend(zcfg("b", "zone-b", 2));
    let out = run_verdicts(&ms, &[gang(4)]);
    assert_eq!(id_set(&out, Reclaim), ["b-0", "b-1"]);
    assert_eq!(out.verdicts[0].same_domain, "zone-a");
    assert_eq!(out.shortfalls[0].deficit, cpu(2));
}

#[test]
fn same_configuring_anchors_the_domain() {
    let g = gang(3);
    let mut ms = zcfg("a", "zone-a", 3);
    ms.extend(fleet("b", 3, Configuring, |m| {
        m.cluster("c1").zone("zone-b").serving(&g)
    }));
    let out = run_verdicts(&ms, &[g]);
    assert_eq!(out.verdicts[0].same_domain, "zone-b");
    assert_eq!(id_set(&out, Reclaim), ["a-0", "a-1", "a-2"]);
}

#[test]
fn same_acquirable_fold_consumes() {
    let mut ms = zcfg("a", "zone-a", 2);
    ms.extend(fleet("ai", 2, Idle, |m| m.zone("zone-a")));
    ms.extend(zcfg("b", "zone-b", 1));
    let out = run(&ms, &[gang(4)]);
    assert_eq!(ids(&out, Reclaim), ["b-0"]);
    assert_eq!(id_set(&out, Bootstrap), ["ai-0", "ai-1"]);
}

#[test]
fn same_prefers_serving_creditable_domain() {
    let mut ms = fleet("ai", 3, Idle, |m| m.zone("zone-a"));
    ms.extend(zcfg("b", "zone-b", 3));
    let out = run(&ms, &[gang(3)]);
    assert!(out.actions.is_empty(), "{:?}", out.actions);
}

// ---- first-rollup gate ----

#[test]
fn gate_no_rollup_no_reclaim() {
    let ms = cfg("m", 100);
    let ready = |_: &str| false;
    let input = CycleInput {
        cluster_ready: Some(&ready),
        ..CycleInput::new(&ms, &[])
    };
    let out = run_with(input, &CycleOptions::default());
    assert!(ids(&out, Reclaim).is_empty());
}

#[test]
fn gate_after_empty_rollup_reclaims_all() {
    let ms = cfg("m", 50);
    let ready = |c: &str| c == "c1";
    let input = CycleInput {
        cluster_ready: Some(&ready),
        ..CycleInput::new(&ms, &[])
    };
    assert_eq!(
        ids(&run_with(input, &CycleOptions::default()), Reclaim).len(),
        50
    );
}

#[test]
fn gate_is_per_cluster() {
    let mut ms = cfg("m", 3);
    ms.extend(fleet("x", 2, Configured, |m| m.cluster("c2")));
    let ready = |c: &str| c == "c2";
    let input = CycleInput {
        cluster_ready: Some(&ready),
        ..CycleInput::new(&ms, &[])
    };
    let out = run_with(input, &CycleOptions::default());
    assert_eq!(id_set(&out, Reclaim), ["x-0", "x-1"]);
    assert!(out.actions.iter().all(|a| a.cluster() == "c2"));
}

// ---- idle release ----

const MIN: i64 = 60_000_000_000;

fn release_fleet() -> (Vec<Machine>, Vec<Option<i64>>) {
    let ms = vec![
        machine("bm", Idle).cap(CapacityType::BareMetal).build(),
        machine("od", Idle).cap(CapacityType::OnDemand).build(),
        machine("res", Idle).cap(CapacityType::Reserved).build(),
        machine("spot", Idle).cap(CapacityType::Spot).build(),
        machine("unspec", Idle)
            .cap(CapacityType::Unspecified)
            .build(),
    ];
    let stamps = vec![Some(0); ms.len()];
    (ms, stamps)
}

fn released_at(
    ms: &[Machine],
    stamps: &[Option<i64>],
    demand: &[bigfleet_model::Need],
    now: i64,
) -> Vec<String> {
    let input = CycleInput {
        idle_since: stamps,
        now_unix_nanos: now,
        ..CycleInput::new(ms, demand)
    };
    ids(&run_with(input, &CycleOptions::default()), Release)
}

#[test]
fn release_spot_after_one_minute() {
    let (ms, st) = release_fleet();
    assert!(released_at(&ms, &st, &[], 59 * 1_000_000_000).is_empty());
    assert_eq!(released_at(&ms, &st, &[], 2 * MIN), ["spot"]);
}

#[test]
fn release_on_demand_after_ten_minutes_in_id_order() {
    let (ms, st) = release_fleet();
    assert_eq!(released_at(&ms, &st, &[], 11 * MIN), ["od", "spot"]);
}

#[test]
fn release_never_for_bare_metal_reserved_unspecified() {
    let (ms, st) = release_fleet();
    let r = released_at(&ms, &st, &[], 1_000_000 * MIN);
    assert_eq!(r, ["od", "spot"]);
}

#[test]
fn release_skips_claimed_and_unstamped() {
    let (ms, mut st) = release_fleet();
    // One cpu of demand claims the cheapest Idle machine by id: "bm"... make it
    // match only the spot machine.
    let n = need("c1", cpu(1))
        .req(req(
            "node.kubernetes.io/instance-type",
            bigfleet_model::Operator::Exists,
            &[],
        ))
        .build();
    let spot_only: Vec<Machine> = ms
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if m.id != "spot" {
                m.profile.instance_type.clear();
            }
            m
        })
        .collect();
    assert_eq!(released_at(&spot_only, &st, &[n], 11 * MIN), ["od"]);
    st[1] = None; // od has no stamp
    assert!(released_at(&ms, &st, &[], 11 * MIN) == ["spot"]);
}

#[test]
fn reclaim_and_release_coexist() {
    let (mut ms, mut st) = release_fleet();
    ms.push(machine("z-cfg", Configured).cluster("c1").build());
    st.push(None);
    let input = CycleInput {
        idle_since: &st,
        now_unix_nanos: 11 * MIN,
        ..CycleInput::new(&ms, &[])
    };
    let out = run_with(input, &CycleOptions::default());
    let kinds: Vec<_> = out
        .actions
        .iter()
        .map(|a| (a.kind(), a.machine_id()))
        .collect();
    assert_eq!(
        kinds,
        [(Reclaim, "z-cfg"), (Release, "od"), (Release, "spot")]
    );
}
