//! NormalizeDemand (ADR-0041) scenarios: the original's published NormalizeDemand cases,
//! each asserted on the engine's output.

use crate::common;
use bigfleet_decision::normalize_demand;
use bigfleet_model::{MachineState::*, Need};
use common::*;

fn big_idle(id: &str) -> bigfleet_model::Machine {
    machine(id, Idle)
        .res(res(&[("cpu", "16"), ("memory", "128Gi")]))
        .build()
}

/// A gang of `pods` pods of (2 cpu, 16Gi) under Same(zone).
fn gang(cluster: &str, group: &str, pods: i64, arrival: i64) -> Need {
    need(
        cluster,
        res(&[
            ("cpu", &(2 * pods).to_string()),
            ("memory", &format!("{}Gi", 16 * pods)),
        ]),
    )
    .req(same_zone())
    .mu(res(&[("cpu", "2"), ("memory", "16Gi")]))
    .group(group)
    .arrival(arrival)
    .build()
}

/// Normalizes `demand` over a single [`big_idle`] machine.
fn normalize_on_big_idle(demand: &[Need]) -> Vec<Need> {
    normalize_demand(&[big_idle("m")], demand).unwrap()
}

/// Gangs `(group, pods, arrival)` of cluster `c1`, and what normalizing them gives.
fn normalize_c1_gangs(gangs: &[(&str, i64, i64)]) -> (Vec<Need>, Vec<Need>) {
    let demand: Vec<Need> = gangs
        .iter()
        .map(|&(group, pods, arrival)| gang("c1", group, pods, arrival))
        .collect();
    let out = normalize_on_big_idle(&demand);
    (demand, out)
}

#[test]
fn folds_same_size_gangs() {
    let (demand, out) = normalize_c1_gangs(&[
        ("g1", 4, 300),
        ("g2", 4, 100),
        ("g3", 4, 200),
        ("big", 12, 50),
    ]);
    assert_eq!(out.len(), 2);
    // Pass-through first: the 12-pod gang (24 cpu) cannot fit one machine.
    assert_eq!(out[0], demand[3]);
    assert!(out[0].profile.same_requirement().is_some());
    let f = &out[1];
    assert_eq!(f.cluster, "c1");
    assert_eq!(
        f.aggregate_resources,
        res(&[("cpu", "24"), ("memory", "192Gi")])
    );
    assert_eq!(f.min_unit, res(&[("cpu", "8"), ("memory", "64Gi")]));
    assert_eq!(f.arrival_unix_nanos, 100);
    assert_eq!(f.group, "");
    assert!(f.profile.same_requirement().is_none());
    assert!(!f.acquisition_parked);
    assert_eq!(f.profile.priority(), demand[0].profile.priority());
}

#[test]
fn different_sizes_fold_separately() {
    let (_, out) = normalize_c1_gangs(&[("g1", 4, 1), ("g2", 2, 1), ("g3", 4, 1), ("g4", 2, 1)]);
    assert_eq!(out.len(), 2);
    let mut aggs: Vec<_> = out.iter().map(|n| n.aggregate_resources.clone()).collect();
    aggs.sort_by_key(|a| a.get("cpu"));
    assert_eq!(aggs[0], res(&[("cpu", "8"), ("memory", "64Gi")]));
    assert_eq!(aggs[1], res(&[("cpu", "16"), ("memory", "128Gi")]));
    let mus: Vec<i64> = out.iter().map(|n| n.min_unit.get("cpu")).collect();
    assert!(mus.contains(&4000) && mus.contains(&8000));
}

#[test]
fn unfoldable_passes_through_with_same() {
    let (demand, out) = normalize_c1_gangs(&[("g", 12, 1)]);
    assert_eq!(out, demand);
}

#[test]
fn no_same_passthrough() {
    let demand = vec![
        need("c1", units("cpu", 2)).build(),
        need("c2", units("cpu", 3)).build(),
    ];
    assert_eq!(normalize_on_big_idle(&demand), demand);
}

#[test]
fn foldability_tiers() {
    let shape = res(&[("cpu", "16"), ("memory", "128Gi")]);
    let demand = vec![gang("c1", "g", 4, 1)];
    let folded = |ms: Vec<bigfleet_model::Machine>| {
        normalize_demand(&ms, &demand).unwrap()[0]
            .profile
            .same_requirement()
            .is_none()
    };
    assert!(folded(vec![machine("m", Idle).res(shape.clone()).build()]));
    assert!(folded(vec![
        machine("m", Speculative).res(shape.clone()).build()
    ]));
    assert!(folded(vec![
        machine("m", Configured)
            .cluster("c1")
            .res(shape.clone())
            .build()
    ]));
    assert!(folded(vec![
        machine("m", Configuring)
            .cluster("c1")
            .res(shape.clone())
            .build()
    ]));
    // Another cluster's bound machine says nothing about this cluster.
    assert!(!folded(vec![
        machine("m", Configured)
            .cluster("c2")
            .res(shape.clone())
            .build()
    ]));
    // Too small, or not matching the Same key (no zone), does not fold.
    assert!(!folded(vec![
        machine("m", Idle).res(units("cpu", 64)).build()
    ]));
    assert!(!folded(vec![
        machine("m", Idle).zone("").res(shape.clone()).build()
    ]));
    // Draining/Failed machines are not supply.
    assert!(!folded(vec![
        machine("m", Draining).cluster("c1").res(shape).build()
    ]));
}

#[test]
fn ordering_and_cluster_separation() {
    let plain = need("c9", units("cpu", 1)).build();
    let demand = vec![
        gang("c2", "x", 4, 1),
        plain.clone(),
        gang("c1", "y", 4, 1),
        gang("c2", "z", 4, 1),
        gang("c1", "w", 2, 1),
    ];
    let out = normalize_on_big_idle(&demand);
    assert_eq!(out[0], plain);
    let keys: Vec<(String, i64)> = out[1..]
        .iter()
        .map(|n| (n.cluster.clone(), n.aggregate_resources.get("cpu")))
        .collect();
    // Sorted by cluster, then fingerprint, then aggregate class ("cpu=16000" < "cpu=4000").
    assert_eq!(
        keys,
        [
            ("c1".to_owned(), 4000),
            ("c1".to_owned(), 8000),
            ("c2".to_owned(), 16000),
        ]
    );
    assert_eq!(normalize_on_big_idle(&demand), out, "deterministic");
}

#[test]
fn pinned_gang_folds_only_on_its_instance_types() {
    let ms = vec![
        machine("m", Idle)
            .itype("huge")
            .res(res(&[("cpu", "16"), ("memory", "128Gi")]))
            .build(),
    ];
    let mut g = gang("c1", "g", 4, 1);
    let base = g.profile.clone();
    let with_pin = |t: &str| {
        let p = bigfleet_model::Profile::new(
            base.requirements()
                .iter()
                .cloned()
                .chain([pin(t)])
                .collect(),
            vec![],
            0,
            base.interruption_bucket(),
            base.reclamation_bucket(),
        );
        std::sync::Arc::new(p)
    };
    g.profile = with_pin("tiny");
    let out = normalize_demand(&ms, std::slice::from_ref(&g)).unwrap();
    assert!(out[0].profile.same_requirement().is_some());
    g.profile = with_pin("huge");
    let out = normalize_demand(&ms, std::slice::from_ref(&g)).unwrap();
    assert!(out[0].profile.same_requirement().is_none());
}

#[test]
fn folded_demand_is_acquired_as_plain_need() {
    let ms = vec![big_idle("m1"), big_idle("m2")];
    let demand = vec![gang("c1", "g1", 8, 1), gang("c1", "g2", 8, 1)];
    let out = run_verdicts(&ms, &demand);
    // Each 8-pod gang (16 cpu, 128Gi) needs a whole machine.
    assert_eq!(out.actions.len(), 2);
    assert_eq!(out.verdicts.len(), 1);
    match &out.verdicts[0].source {
        bigfleet_decision::VerdictSource::Folded { members, need } => {
            assert_eq!(members, &vec![0, 1]);
            assert_eq!(need.min_unit, res(&[("cpu", "16"), ("memory", "128Gi")]));
        }
        other => panic!("expected a folded verdict, got {other:?}"),
    }
    // Folded needs are plain: their actions carry no group.
    assert!(
        out.actions
            .iter()
            .all(|a| a.assignment().unwrap().group.is_empty())
    );
}
