//! Owned domains (ADR-0128): the engine never names a machine another shard
//! owns, while foreign machines still count as facts.

use crate::common;
use bigfleet_decision::{CycleInput, CycleOptions, CycleOutput, Ownership};
use bigfleet_model::{ActionKind::*, CapacityType, Machine, MachineState::*, ZONE_KEY};
use common::*;

const MIN: i64 = 60_000_000_000;

fn cpu(n: i64) -> bigfleet_model::ResourceVector {
    units("cpu", n)
}

fn owning(ms: &[Machine], demand: &[bigfleet_model::Need], o: &Ownership) -> CycleOutput {
    run_with(
        CycleInput {
            ownership: Some(o),
            ..CycleInput::new(ms, demand)
        },
        &CycleOptions::default(),
    )
}

fn r1() -> Ownership {
    Ownership::of_domains([("rack", "r1")])
}

#[test]
fn foreign_idle_is_never_bootstrapped() {
    // The foreign machine is the cheaper one: without the fence it wins.
    let ms = vec![
        machine("cheap-r2", Idle)
            .label("rack", "r2")
            .price(1.0)
            .build(),
        machine("dear-r1", Idle)
            .label("rack", "r1")
            .price(5.0)
            .build(),
    ];
    let demand = [need("c1", cpu(1)).build()];
    assert_eq!(ids(&run(&ms, &demand), Bootstrap), ["cheap-r2"]);
    assert_eq!(ids(&owning(&ms, &demand, &r1()), Bootstrap), ["dear-r1"]);
}

#[test]
fn foreign_speculative_is_never_provisioned_and_the_gap_is_a_shortfall() {
    let ms = vec![machine("spec-r2", Speculative).label("rack", "r2").build()];
    let demand = [need("c1", cpu(1)).build()];
    assert_eq!(ids(&run(&ms, &demand), Provision), ["spec-r2"]);
    let out = owning(&ms, &demand, &r1());
    assert!(out.actions.is_empty(), "{:?}", out.actions);
    assert_eq!(out.shortfalls.len(), 1, "the unmet need is reported");
}

#[test]
fn foreign_bound_excess_is_not_reclaimed() {
    let ms = vec![
        machine("a-r1", Configured)
            .cluster("c1")
            .label("rack", "r1")
            .build(),
        machine("b-r2", Configured)
            .cluster("c1")
            .label("rack", "r2")
            .build(),
    ];
    assert_eq!(id_set(&run(&ms, &[]), Reclaim), ["a-r1", "b-r2"]);
    assert_eq!(ids(&owning(&ms, &[], &r1()), Reclaim), ["a-r1"]);
}

#[test]
fn foreign_bound_machine_still_credits_the_need() {
    // Read-only fact: the foreign machine serves c1, so nothing is acquired.
    let ms = vec![
        machine("b-r2", Configured)
            .cluster("c1")
            .label("rack", "r2")
            .build(),
        machine("idle-r1", Idle).label("rack", "r1").build(),
    ];
    let out = owning(&ms, &[need("c1", cpu(1)).build()], &r1());
    assert!(out.actions.is_empty(), "{:?}", out.actions);
}

#[test]
fn foreign_victims_are_never_preempted() {
    let ms = vec![
        machine("low-r2", Configured)
            .cluster("c2")
            .label("rack", "r2")
            .prio(0)
            .build(),
    ];
    let demand = [need("c1", cpu(1)).prio(1000).build()];
    assert_eq!(ids(&run(&ms, &demand), Preempt), ["low-r2"]);
    let out = owning(&ms, &demand, &r1());
    assert!(ids(&out, Preempt).is_empty());
    assert_eq!(out.shortfalls.len(), 1);
}

#[test]
fn foreign_idle_is_never_released() {
    let ms = vec![
        machine("a-r1", Idle)
            .label("rack", "r1")
            .cap(CapacityType::Spot)
            .build(),
        machine("b-r2", Idle)
            .label("rack", "r2")
            .cap(CapacityType::Spot)
            .build(),
    ];
    let stamps = vec![Some(0); 2];
    let out = run_with(
        CycleInput {
            idle_since: &stamps,
            now_unix_nanos: 30 * MIN,
            ownership: Some(&r1()),
            ..CycleInput::new(&ms, &[])
        },
        &CycleOptions::default(),
    );
    assert_eq!(ids(&out, Release), ["a-r1"]);
}

#[test]
fn same_zone_gangs_skip_foreign_group_members() {
    // Zone a has two cheap machines, one of them foreign; zone b two dearer
    // owned ones. A two-machine Same-zone gang must land in zone b.
    let mut ms = fleet("za", 2, Idle, |m| {
        m.zone("za").price(1.0).label("rack", "r1")
    });
    ms[1].profile.labels.insert("rack".into(), "r2".into());
    ms.extend(fleet("zb", 2, Idle, |m| {
        m.zone("zb").price(3.0).label("rack", "r1")
    }));
    let demand = [need("c1", cpu(2)).req(same_zone()).build()];
    let free = id_set(&run(&ms, &demand), Bootstrap);
    assert_eq!(free, ["za-0", "za-1"]);
    let fenced = id_set(&owning(&ms, &demand, &r1()), Bootstrap);
    assert_eq!(fenced, ["zb-0", "zb-1"]);
}

#[test]
fn zone_keys_are_domains_too() {
    let ms = vec![
        machine("a", Idle).zone("za").build(),
        machine("b", Idle).zone("zb").build(),
    ];
    let o = Ownership::of_domains([(ZONE_KEY, "zb")]);
    assert_eq!(
        ids(&owning(&ms, &[need("c1", cpu(1)).build()], &o), Bootstrap),
        ["b"]
    );
}

#[test]
fn adopted_and_released_machines_override_the_domain() {
    let ms = vec![
        machine("r1-gone", Idle)
            .label("rack", "r1")
            .price(1.0)
            .build(),
        machine("r2-adopted", Idle)
            .label("rack", "r2")
            .price(2.0)
            .build(),
        machine("r2-other", Idle)
            .label("rack", "r2")
            .price(0.5)
            .build(),
    ];
    let mut o = r1();
    o.released.insert("r1-gone".into());
    o.adopted.insert("r2-adopted".into());
    let demand = [need("c1", cpu(1)).build()];
    assert_eq!(ids(&owning(&ms, &demand, &o), Bootstrap), ["r2-adopted"]);
    // A release wins over an adoption of the same machine.
    o.released.insert("r2-adopted".into());
    assert!(owning(&ms, &demand, &o).actions.is_empty());
}

#[test]
fn owning_everything_is_the_single_shard_cycle() {
    let ms = vec![
        machine("a", Idle).label("rack", "r2").build(),
        machine("b", Configured).cluster("c9").build(),
    ];
    let demand = [need("c1", cpu(1)).build()];
    assert!(Ownership::everything().is_everything());
    assert_eq!(
        owning(&ms, &demand, &Ownership::everything()).actions,
        run(&ms, &demand).actions
    );
}

#[test]
fn owns_reads_the_profile_like_matching() {
    let m = machine("x", Idle).zone("za").label("rack", "r1").build();
    assert!(r1().owns("x", &m.profile));
    assert!(Ownership::of_domains([(ZONE_KEY, "za")]).owns("x", &m.profile));
    assert!(!Ownership::of_domains([("rack", "r2")]).owns("x", &m.profile));
    assert!(Ownership::everything().owns("x", &m.profile));
}

#[test]
fn foreign_supply_explains_the_need_as_held_by_someone_else() {
    // ADR-0115: supply that exists but is held — here by another shard — is
    // PRIORITY_STARVED, and it is counted in the verdict's matching supply.
    let ms = vec![machine("idle-r2", Idle).label("rack", "r2").build()];
    let demand = [need("c1", cpu(1)).build()];
    let out = run_with(
        CycleInput {
            ownership: Some(&r1()),
            ..CycleInput::new(&ms, &demand)
        },
        &CycleOptions {
            verdicts: true,
            ..CycleOptions::default()
        },
    );
    let v = &out.verdicts[0];
    assert!(!v.satisfied);
    assert_eq!(
        v.unmet_reason,
        bigfleet_decision::UnmetReason::PriorityStarved
    );
    assert_eq!(v.matching_supply.as_ref().map(|s| s.idle), Some(1));
}
