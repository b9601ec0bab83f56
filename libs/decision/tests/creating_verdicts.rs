//! In-flight Creating credit (ADR-0052 / ADR-0022), verdicts (ADR-0061),
//! shortfall summing and the parking ledger, through whole cycles.

use crate::common;
use bigfleet_decision::{
    CycleInput, CycleOptions, ParkingLedger, UnmetReason, VerdictSource, parking_key,
};
use bigfleet_model::{ActionKind::*, Machine, MachineState::*, Need};
use common::*;
use std::collections::HashMap;

fn cpu(n: i64) -> bigfleet_model::ResourceVector {
    units("cpu", n)
}

fn with_destinations(
    ms: &[Machine],
    demand: &[Need],
    dest: &HashMap<String, String>,
) -> bigfleet_decision::CycleOutput {
    let input = CycleInput {
        creating_destinations: Some(dest),
        ..CycleInput::new(ms, demand)
    };
    run_with(
        input,
        &CycleOptions {
            verdicts: true,
            ..CycleOptions::default()
        },
    )
}

#[test]
fn creating_machine_credits_its_need_no_over_acquire() {
    let n = need("c1", cpu(2)).build();
    let mut ms = vec![machine("creating", Creating).serving(&n).build()];
    ms.extend(fleet("spec", 3, Speculative, |m| m));
    let dest = HashMap::from([("creating".to_owned(), "c1".to_owned())]);
    let out = with_destinations(&ms, std::slice::from_ref(&n), &dest);
    // One unit is already being created for c1: provision exactly one more.
    assert_eq!(ids(&out, Provision), ["spec-0"]);
    assert_eq!(out.verdicts[0].claimed_machine_count, 2);
    // The Creating machine itself never gets an action.
    assert!(out.actions.iter().all(|a| a.machine_id() != "creating"));
}

#[test]
fn creating_without_known_destination_is_not_credited() {
    let n = need("c1", cpu(1)).build();
    let mut ms = vec![machine("creating", Creating).serving(&n).build()];
    ms.extend(fleet("spec", 2, Speculative, |m| m));
    let out = with_destinations(&ms, std::slice::from_ref(&n), &HashMap::new());
    assert_eq!(ids(&out, Provision), ["spec-0"]);
    let other = HashMap::from([("creating".to_owned(), "c2".to_owned())]);
    let out = with_destinations(&ms, std::slice::from_ref(&n), &other);
    assert_eq!(ids(&out, Provision), ["spec-0"]);
}

#[test]
fn creating_credit_needs_the_same_fingerprint() {
    let n = need("c1", cpu(1)).build();
    let other = need("c1", cpu(1)).prio(7).build();
    let ms = vec![
        machine("creating", Creating).serving(&other).build(),
        machine("spec", Speculative).build(),
    ];
    let dest = HashMap::from([("creating".to_owned(), "c1".to_owned())]);
    let out = with_destinations(&ms, std::slice::from_ref(&n), &dest);
    assert_eq!(ids(&out, Provision), ["spec"]);
}

#[test]
fn creating_credits_a_gang_only_with_its_group() {
    let g = same_zone_gang("c1", cpu(2), "g1").build();
    let ms = vec![
        machine("creating", Creating).serving(&g).build(),
        machine("spec-a", Speculative).build(),
        machine("spec-b", Speculative).build(),
    ];
    let dest = HashMap::from([("creating".to_owned(), "c1".to_owned())]);
    let out = with_destinations(&ms, std::slice::from_ref(&g), &dest);
    assert_eq!(ids(&out, Provision), ["spec-a"]);
    assert_eq!(out.verdicts[0].same_domain, "zone-a");
    let other_group = same_zone_gang("c1", cpu(2), "g2").build();
    let out = with_destinations(&ms, std::slice::from_ref(&other_group), &dest);
    assert_eq!(id_set(&out, Provision), ["spec-a", "spec-b"]);
}

// ---- verdicts ----

#[test]
fn satisfied_verdict_counts() {
    let mut ms = fleet("cfg", 1, Configured, |m| m.cluster("c1"));
    ms.extend(fleet("i", 1, Idle, |m| m));
    ms.extend(fleet("s", 1, Speculative, |m| m));
    let out = run_verdicts(&ms, &[need("c1", cpu(3)).build()]);
    let v = &out.verdicts[0];
    assert!(v.satisfied);
    assert_eq!(v.source, VerdictSource::Demand(0));
    assert_eq!(
        (
            v.claimed_machine_count,
            v.bootstrap_count,
            v.provision_count
        ),
        (3, 1, 1)
    );
    assert_eq!(v.unmet_reason, UnmetReason::Unspecified);
    assert!(v.matching_supply.is_none() && v.preemption.is_none());
    assert!(v.residual_deficit.is_empty());
}

#[test]
fn reason_no_matching_supply() {
    let ms = fleet("i", 3, Idle, |m| m.itype("cpu"));
    let out = run_verdicts(&ms, &[need("c1", cpu(1)).req(pin("gpu")).build()]);
    let v = &out.verdicts[0];
    assert_eq!(v.unmet_reason, UnmetReason::NoMatchingSupply);
    assert!(v.matching_supply.unwrap().is_empty());
}

#[test]
fn reason_priority_starved_with_capped_supply() {
    let ms = fleet("i", 5, Idle, |m| m);
    let hi = need("hi", cpu(5)).prio(10).build();
    let lo = need("lo", cpu(1)).prio(1).build();
    let opts = CycleOptions {
        verdicts: true,
        matching_supply_cap: 3,
        ..CycleOptions::default()
    };
    let out = run_with(CycleInput::new(&ms, &[hi, lo]), &opts);
    let v = &out.verdicts[1];
    assert_eq!(v.unmet_reason, UnmetReason::PriorityStarved);
    let s = v.matching_supply.unwrap();
    assert_eq!(
        (s.idle, s.configured, s.speculative, s.capped),
        (3, 0, 0, true)
    );
}

#[test]
fn reason_topology_unsatisfiable() {
    let mut ms = fleet("a", 2, Idle, |m| m.zone("zone-a"));
    ms.extend(fleet("b", 2, Idle, |m| m.zone("zone-b")));
    let g = same_zone_gang("c1", cpu(3), "g").build();
    let out = run_verdicts(&ms, &[g]);
    let v = &out.verdicts[0];
    assert_eq!(v.unmet_reason, UnmetReason::TopologyUnsatisfiable);
    assert!(!v.same_satisfiable);
    assert_eq!(v.same_domain, "zone-a");
    assert_eq!(v.same_candidates.len(), 2);
    assert_eq!(v.same_candidates[0].coverage_per_mille, 666);
}

#[test]
fn verdicts_do_not_change_actions() {
    let mut ms = fleet("a", 2, Idle, |m| m.zone("zone-a"));
    ms.extend(fleet("b", 5, Configured, |m| {
        m.zone("zone-b").cluster("c2").prio(3)
    }));
    let demand = vec![
        same_zone_gang("c1", cpu(3), "g").prio(9).build(),
        need("c2", cpu(2)).prio(3).build(),
        need("c3", cpu(2)).prio(5).build(),
    ];
    let on = run_verdicts(&ms, &demand);
    let off = run(&ms, &demand);
    assert_eq!(on.actions, off.actions);
    assert_eq!(on.shortfalls, off.shortfalls);
    assert!(off.verdicts.is_empty());
    assert_eq!(on.verdicts.len(), 3);
}

// ---- shortfalls ----

#[test]
fn shortfalls_are_summed_per_fingerprint() {
    let ms = fleet("a", 1, Idle, |m| m.zone("zone-a"));
    let g1 = same_zone_gang("c1", cpu(3), "g1").build();
    let g2 = same_zone_gang("c1", cpu(2), "g2").build();
    let other = need("c2", cpu(4)).prio(1).build();
    let out = run(&ms, &[other, g1, g2]);
    assert_eq!(out.shortfalls.len(), 2);
    let gang_seed = out
        .shortfalls
        .iter()
        .find(|s| s.profile.same_requirement().is_some())
        .unwrap();
    // The priority-1 need takes the only machine; both gangs (same fingerprint,
    // different groups) are fully short: 3 + 2 summed into one seed.
    assert_eq!(gang_seed.deficit, cpu(5));
    let plain = out
        .shortfalls
        .iter()
        .find(|s| s.profile.priority() == 1)
        .unwrap();
    assert_eq!(plain.deficit, cpu(3));
}

// ---- parking through cycles ----

#[test]
fn structurally_unsatisfiable_gang_parks_after_eight_and_reprobes() {
    let g = same_zone_gang("c1", cpu(5), "g").build();
    let key = parking_key("c1", "g", g.fingerprint());
    // No machine can ever hold the gang in one zone and none is free: the
    // bound assembly (2 in zone-a) is all there is.
    let ms = fleet("a", 2, Configured, |m| m.cluster("c1").zone("zone-a"));
    let mut ledger = ParkingLedger::new();
    let mut parked_cycles = Vec::new();
    for cycle in 0..34 {
        let input = CycleInput {
            parking: Some(&ledger),
            ..CycleInput::new(&ms, std::slice::from_ref(&g))
        };
        let out = run_with(
            input,
            &CycleOptions {
                verdicts: true,
                ..CycleOptions::default()
            },
        );
        assert!(out.actions.is_empty(), "cycle {cycle}: {:?}", out.actions);
        let v = &out.verdicts[0];
        if v.acquisition_parked {
            parked_cycles.push(cycle);
        }
        assert_eq!(v.parked_age_cycles, ledger.age(&key));
        assert_eq!(out.parking.len(), 1);
        assert!(!out.parking[0].progress);
        ledger.observe(&out.parking);
    }
    let expected: Vec<i32> = (8..34).filter(|c| *c != 32).collect();
    assert_eq!(parked_cycles, expected);
}

#[test]
fn progress_keeps_a_gang_unparked() {
    let g = same_zone_gang("c1", cpu(5), "g").build();
    let ms = fleet("a", 2, Idle, |m| m.zone("zone-a"));
    let out = run(&ms, std::slice::from_ref(&g));
    assert_eq!(out.parking.len(), 1);
    assert!(out.parking[0].progress, "it acquired machines this cycle");
}
