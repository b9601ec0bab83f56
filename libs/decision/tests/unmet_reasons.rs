//! Edge cases of the unmet-reason taxonomy (ADR-0115) the golden scenarios do
//! not reach: supply in transit, Failed machines, and a need whose own claims
//! are all the matching supply there is.

use crate::common;
use bigfleet_decision::UnmetReason;
use bigfleet_model::MachineState::{self, *};
use common::*;

fn gpu(id: &str, state: MachineState) -> M {
    machine(id, state).itype("gpu-8x").res(units(GPU, 8))
}

fn gpu_need() -> bigfleet_model::Need {
    need("c1", units(GPU, 8)).req(pin("gpu-8x")).build()
}

#[test]
fn supply_in_transit_exists() {
    // The only matching machines are on their way somewhere (leaving another
    // cluster, being created, being joined): not counted per state, but they
    // exist, so the need is held, not out of stock.
    for state in [Draining, Creating, Configuring, Deleting] {
        let mut m = gpu("g", state);
        if matches!(state, Draining | Configuring) {
            m = m.cluster("other");
        }
        let out = run_verdicts(&[m.build()], &[gpu_need()]);
        let v = &out.verdicts[0];
        assert_eq!(v.unmet_reason, UnmetReason::PriorityStarved, "{state}");
        assert!(v.matching_supply.unwrap().is_empty(), "{state}");
    }
}

#[test]
fn failed_machines_are_not_supply() {
    let mut m = gpu("g", Failed).build();
    m.last_error = "configure failed".into();
    let out = run_verdicts(&[m], &[gpu_need()]);
    assert_eq!(out.verdicts[0].unmet_reason, UnmetReason::NoMatchingSupply);
}

#[test]
fn a_need_holding_all_matching_supply_is_held_not_out_of_stock() {
    // Two machines, both bound to the need; it wants three.
    let n = need("c1", units(GPU, 24)).req(pin("gpu-8x")).build();
    let ms: Vec<_> = ["g0", "g1"]
        .iter()
        .map(|id| gpu(id, Configured).cluster("c1").serving(&n).build())
        .collect();
    let out = run_verdicts(&ms, &[n]);
    let v = &out.verdicts[0];
    assert_eq!(v.claimed_machine_count, 2);
    assert_eq!(v.matching_supply.unwrap().configured, 2);
    assert_eq!(v.unmet_reason, UnmetReason::PriorityStarved);
}

#[test]
fn topology_comes_before_supply_reasons() {
    // No GPU machine at all: a Same gang has no satisfiable domain (Tier 1).
    let ms = fleet("c", 2, Idle, |m| m);
    let g = need("c1", units(GPU, 8))
        .req(pin("gpu-8x"))
        .req(same_zone())
        .group("g")
        .build();
    let out = run_verdicts(&ms, &[g]);
    let v = &out.verdicts[0];
    assert_eq!(v.unmet_reason, UnmetReason::TopologyUnsatisfiable);
    assert!(v.same_candidates.is_empty());
    assert!(v.matching_supply.unwrap().is_empty());
}
