//! Phase 1 scenarios: the original's published acquisition cases (ADR-0020's precedence
//! order), each asserted on the engine's output.

use crate::common;
use bigfleet_model::{Action, ActionKind::*, MachineState::*, PenaltyBucket, WhenUnsatisfiable};
use common::*;

fn cpu(n: i64) -> bigfleet_model::ResourceVector {
    units("cpu", n)
}

#[test]
fn idle_only() {
    let ms = fleet("i", 4, Idle, |m| m.price(1.0));
    let out = run(&ms, &[need("c1", cpu(3)).build()]);
    assert_eq!(ids(&out, Bootstrap), ["i-0", "i-1", "i-2"]);
    assert_eq!(out.actions.len(), 3);
    assert!(out.shortfalls.is_empty());
    assert_eq!(out.stats.unsatisfied, 0);
    for a in &out.actions {
        assert_eq!(a.cluster(), "c1");
        assert_eq!(a.reason(), "phase1.idle");
    }
}

#[test]
fn speculative_fallback_prefers_cheapest() {
    let ms = vec![
        machine("od", Speculative).price(6.0).build(),
        machine("spot", Speculative).price(1.0).prob(0.0).build(),
    ];
    let out = run(&ms, &[need("c1", cpu(1)).build()]);
    assert_eq!(ids(&out, Provision), ["spot"]);
    assert_eq!(out.actions.len(), 1);
    assert_eq!(out.actions[0].reason(), "phase1.speculative");
}

#[test]
fn high_penalty_prefers_on_demand() {
    let ms = vec![
        machine("od", Speculative).price(6.0).build(),
        machine("spot", Speculative).price(1.80).prob(0.10).build(),
    ];
    // $8,388,608 interruption penalty: spot costs 1.80 + 838,860.8 per hour.
    let n = need("c1", cpu(1)).ipb(PenaltyBucket::B8388608).build();
    assert_eq!(ids(&run(&ms, &[n]), Provision), ["od"]);
    // At a $5 penalty the spot slot wins (2.30 < 6.00).
    let n = need("c1", cpu(1)).ipb(PenaltyBucket::B4).build();
    assert_eq!(ids(&run(&ms, &[n]), Provision), ["spot"]);
    // At $64 on-demand wins again (1.80 + 6.4 > 6.00).
    let n = need("c1", cpu(1)).ipb(PenaltyBucket::B64).build();
    assert_eq!(ids(&run(&ms, &[n]), Provision), ["od"]);
}

#[test]
fn pinned_penalty_with_zero_probability_is_its_price() {
    // 0 × ∞ = 0: a never-interrupted slot keeps its price under a Pinned penalty.
    let ms = vec![
        machine("a-risky", Speculative)
            .price(0.5)
            .prob(0.01)
            .build(),
        machine("b-safe", Speculative).price(9.0).prob(0.0).build(),
        machine("c-safe", Speculative).price(3.0).prob(0.0).build(),
    ];
    let n = need("c1", cpu(2)).ipb(PenaltyBucket::Pinned).build();
    assert_eq!(ids(&run(&ms, &[n]), Provision), ["c-safe", "b-safe"]);
}

#[test]
fn idle_beats_speculative() {
    let ms = vec![
        machine("idle", Idle).price(6.0).build(),
        machine("spec", Speculative).price(1.0).build(),
    ];
    let out = run(&ms, &[need("c1", cpu(1)).build()]);
    assert_eq!(ids(&out, Bootstrap), ["idle"]);
    assert!(ids(&out, Provision).is_empty());
}

#[test]
fn idle_then_speculative_for_the_residual() {
    let ms = vec![
        machine("idle", Idle).price(6.0).build(),
        machine("spec-1", Speculative).price(2.0).build(),
        machine("spec-2", Speculative).price(1.0).build(),
    ];
    let out = run(&ms, &[need("c1", cpu(2)).build()]);
    assert_eq!(ids(&out, Bootstrap), ["idle"]);
    assert_eq!(ids(&out, Provision), ["spec-2"]);
}

#[test]
fn no_op_when_satisfied() {
    let mut ms = fleet("cfg", 3, Configured, |m| m.cluster("c1"));
    ms.extend(fleet("i", 3, Idle, |m| m));
    let out = run(&ms, &[need("c1", cpu(3)).build()]);
    assert!(out.actions.is_empty(), "{:?}", out.actions);
}

#[test]
fn configuring_credits_immediately() {
    let mut ms = fleet("cfg", 2, Configuring, |m| m.cluster("c1"));
    ms.extend(fleet("i", 3, Idle, |m| m));
    let out = run(&ms, &[need("c1", cpu(3)).build()]);
    assert_eq!(ids(&out, Bootstrap), ["i-0"]);
}

#[test]
fn partial_stockout() {
    let ms = fleet("i", 2, Idle, |m| m);
    let out = run_verdicts(&ms, &[need("c1", cpu(5)).build()]);
    assert_eq!(ids(&out, Bootstrap).len(), 2);
    assert_eq!(out.shortfalls.len(), 1);
    assert_eq!(out.shortfalls[0].deficit, cpu(3));
    assert_eq!(out.verdicts[0].residual_deficit, cpu(3));
    assert!(!out.verdicts[0].satisfied);
}

#[test]
fn high_priority_wins_contested_pool() {
    let ms = fleet("i", 2, Idle, |m| m);
    let low = need("low", cpu(2)).prio(0).build();
    let high = need("high", cpu(2)).prio(1_000_000).build();
    // Regardless of the order the rows arrive in.
    for demand in [
        vec![low.clone(), high.clone()],
        vec![high.clone(), low.clone()],
    ] {
        let out = run_verdicts(&ms, &demand);
        let bs = actions_of(&out, Bootstrap);
        assert_eq!(bs.len(), 2);
        assert!(bs.iter().all(|a| a.cluster() == "high"));
        assert_eq!(out.shortfalls.len(), 1);
        assert_eq!(out.shortfalls[0].profile.priority(), 0);
    }
}

#[test]
fn many_needs_sharing_fingerprint_distributes_across_needs() {
    let mut ms = fleet("bound", 5, Configured, |m| m.cluster("c1"));
    ms.extend(fleet("idle", 25, Idle, |m| m));
    let demand: Vec<_> = (0..30)
        .map(|g| need("c1", cpu(1)).group(&format!("g{g:02}")).build())
        .collect();
    let out = run_verdicts(&ms, &demand);
    assert_eq!(ids(&out, Bootstrap).len(), 25);
    assert_eq!(out.stats.unsatisfied, 0);
    assert!(
        out.verdicts
            .iter()
            .all(|v| v.satisfied && v.claimed_machine_count == 1)
    );
}

#[test]
fn dense_machine_one_absorbs_many_pods() {
    let dense = res(&[("cpu", "16"), ("memory", "32Gi")]);
    let ms = vec![
        machine("dense", Configured)
            .cluster("c1")
            .alloc(dense)
            .build(),
    ];
    // 10 pods of (1 cpu, 4Gi): 10 cpu fits, 40Gi does not.
    let n = need("c1", res(&[("cpu", "10"), ("memory", "40Gi")]))
        .mu(res(&[("cpu", "1"), ("memory", "4Gi")]))
        .build();
    let out = run_verdicts(&ms, &[n]);
    assert!(out.actions.is_empty());
    assert_eq!(out.verdicts[0].residual_deficit, res(&[("memory", "8Gi")]));
    assert_eq!(out.verdicts[0].claimed_machine_count, 1);
}

#[test]
fn min_unit_skips_small_machines() {
    let ms = vec![
        machine("a-small", Idle)
            .price(1.0)
            .res(units("cpu", 2))
            .build(),
        machine("b-big", Idle)
            .price(5.0)
            .res(units("cpu", 8))
            .build(),
    ];
    let n = need("c1", cpu(8)).mu(cpu(4)).build();
    assert_eq!(ids(&run(&ms, &[n]), Bootstrap), ["b-big"]);
}

#[test]
fn requirements_filter_supply() {
    let ms = vec![
        machine("a", Idle).itype("cpu-small").build(),
        machine("b", Idle).itype("gpu-large").build(),
        machine("c", Idle).itype("gpu-large").zone("zone-b").build(),
    ];
    let n = need("c1", cpu(2)).req(pin("gpu-large")).build();
    assert_eq!(ids(&run(&ms, &[n]), Bootstrap), ["b", "c"]);
    let n = need("c1", cpu(2))
        .req(req(
            bigfleet_model::ZONE_KEY,
            bigfleet_model::Operator::NotIn,
            &["zone-b"],
        ))
        .build();
    assert_eq!(ids(&run(&ms, &[n]), Bootstrap), ["a", "b"]);
}

// ---- Same ----

fn zoned(prefix: &str, zone: &str, n: usize, price: f64) -> Vec<bigfleet_model::Machine> {
    fleet(prefix, n, Idle, |m| m.zone(zone).price(price))
}

/// Idle machines over zones `zone-a`, `zone-b`, …: entry `i` of `spec` is `(count, price)` for
/// the `i`-th zone, whose machines are named `a-0`, `a-1`, … (`b-…` for the second zone).
fn zones(spec: &[(usize, f64)]) -> Vec<bigfleet_model::Machine> {
    spec.iter()
        .zip('a'..)
        .flat_map(|(&(n, price), z)| zoned(&z.to_string(), &format!("zone-{z}"), n, price))
        .collect()
}

#[test]
fn same_picks_one_zone() {
    let ms = zones(&[(3, 1.0), (3, 1.0)]);
    let out = run(&ms, &[same_zone_gang("c1", cpu(3), "g").build()]);
    let got = id_set(&out, Bootstrap);
    assert_eq!(got.len(), 3);
    let first = got[0].chars().next().unwrap();
    assert!(got.iter().all(|i| i.starts_with(first)), "{got:?}");
}

#[test]
fn same_picks_atomic_satisfiable_zone() {
    let ms = zones(&[(2, 1.0), (4, 5.0)]);
    let out = run(&ms, &[same_zone_gang("c1", cpu(4), "g").build()]);
    assert_eq!(id_set(&out, Bootstrap), ["b-0", "b-1", "b-2", "b-3"]);
}

#[test]
fn same_falls_back_to_largest_bucket_with_shortfall() {
    let ms = zones(&[(3, 1.0), (3, 1.0)]);
    let out = run_verdicts(&ms, &[same_zone_gang("c1", cpu(5), "g").build()]);
    let got = id_set(&out, Bootstrap);
    // Equal coverage and count: the lexicographically smaller domain.
    assert_eq!(got, ["a-0", "a-1", "a-2"]);
    let v = &out.verdicts[0];
    assert_eq!(v.residual_deficit, cpu(2));
    assert_eq!(v.same_domain, "zone-a");
    assert!(!v.same_satisfiable);
    assert_eq!(out.shortfalls[0].deficit, cpu(2));
}

#[test]
fn same_density_aware_machine_count() {
    // 8 pods of 1 cpu on machines with room for 100 pods: one machine, not 8.
    let mut ms = fleet("a", 3, Idle, |m| m.zone("zone-a").res(cpu(100)));
    ms.extend(fleet("b", 3, Idle, |m| m.zone("zone-b").res(cpu(100))));
    let n = same_zone_gang("c1", cpu(8), "g").mu(cpu(1)).build();
    // A foldable gang (fits one machine) becomes a plain need; either way one machine.
    assert_eq!(ids(&run(&ms, &[n]), Bootstrap).len(), 1);
    // A gang too big to fold still counts by vector, not by pod: 150 cpu -> 2 machines.
    let n = same_zone_gang("c1", cpu(150), "g").mu(cpu(1)).build();
    let got = id_set(&run(&ms, &[n]), Bootstrap);
    assert_eq!(got, ["a-0", "a-1"]);
}

#[test]
fn same_two_needs_land_in_different_zones() {
    // Acquirable consumption: the first gang consumes zone-a's Idle supply, so
    // the second ranks what is left and anchors to zone-b in the same cycle.
    let ms = zones(&[(3, 1.0), (3, 1.0)]);
    let hi = same_zone_gang("c1", cpu(3), "hi").prio(2_000_000).build();
    let lo = same_zone_gang("c1", cpu(3), "lo").prio(1_000_000).build();
    let out = run_verdicts(&ms, &[hi, lo]);
    let bs = actions_of(&out, Bootstrap);
    assert_eq!(bs.len(), 6);
    let group_of = |id: &str| {
        bs.iter()
            .find(|a| a.machine_id() == id)
            .and_then(|a| a.assignment())
            .map(|a| a.group.clone())
            .unwrap()
    };
    assert!(["a-0", "a-1", "a-2"].iter().all(|i| group_of(i) == "hi"));
    assert!(["b-0", "b-1", "b-2"].iter().all(|i| group_of(i) == "lo"));
    assert_eq!(out.verdicts[0].same_domain, "zone-a");
    assert_eq!(out.verdicts[1].same_domain, "zone-b");
}

#[test]
fn same_parked_need_acquires_nothing_but_keeps_its_assembly() {
    let mut ms = fleet("cfg", 2, Configured, |m| m.cluster("c1").zone("zone-a"));
    ms.extend(zoned("i", "zone-a", 3, 1.0));
    let n = same_zone_gang("c1", cpu(4), "g").parked().build();
    let out = run_verdicts(&ms, &[n]);
    assert!(ids(&out, Bootstrap).is_empty());
    assert!(
        ids(&out, Reclaim).is_empty(),
        "parked gang keeps its credited assembly"
    );
    assert_eq!(out.verdicts[0].claimed_machine_count, 2);
    assert!(out.verdicts[0].acquisition_parked);
    assert_eq!(out.shortfalls[0].deficit, cpu(2));
}

// ---- DoNotSchedule spread ----

fn spread_need(n: i64, skew: i32, mode: WhenUnsatisfiable) -> bigfleet_model::Need {
    need("c1", cpu(n))
        .spread(bigfleet_model::ZONE_KEY, skew, mode)
        .build()
}

fn per_zone(out: &bigfleet_decision::CycleOutput) -> [usize; 3] {
    let mut c = [0; 3];
    for a in out
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Bootstrap { .. }))
    {
        c[(a.machine_id().as_bytes()[0] - b'a') as usize] += 1;
    }
    c
}

#[test]
fn spread_even_across_three_zones() {
    let ms = zones(&[(4, 1.0), (4, 1.0), (4, 1.0)]);
    let out = run(&ms, &[spread_need(6, 1, WhenUnsatisfiable::DoNotSchedule)]);
    assert_eq!(per_zone(&out), [2, 2, 2]);
}

#[test]
fn spread_short_zone_caps_the_picks() {
    let ms = zones(&[(1, 1.0), (5, 1.0), (5, 1.0)]);
    let out = run_verdicts(&ms, &[spread_need(6, 1, WhenUnsatisfiable::DoNotSchedule)]);
    assert_eq!(per_zone(&out), [1, 2, 2]);
    assert_eq!(out.verdicts[0].residual_deficit, cpu(1));
}

#[test]
fn spread_max_skew_two() {
    let ms = zones(&[(5, 1.0), (5, 2.0)]);
    let out = run(&ms, &[spread_need(8, 2, WhenUnsatisfiable::DoNotSchedule)]);
    let [a, b, _] = per_zone(&out);
    assert_eq!(a + b, 8);
    assert!(a.abs_diff(b) <= 2, "{a}/{b}");
}

#[test]
fn spread_schedule_anyway_is_not_enforced() {
    let ms = zones(&[(5, 1.0), (5, 9.0)]);
    let out = run(&ms, &[spread_need(4, 1, WhenUnsatisfiable::ScheduleAnyway)]);
    assert_eq!(per_zone(&out), [4, 0, 0]);
}

#[test]
fn spread_cheap_zone_does_not_take_everything() {
    let ms = zones(&[(4, 1.0), (4, 9.0)]);
    let out = run(&ms, &[spread_need(4, 1, WhenUnsatisfiable::DoNotSchedule)]);
    assert_eq!(per_zone(&out), [2, 2, 0]);
}
