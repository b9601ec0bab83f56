//! Phase 2 scenarios: the original's published preemption cases (victim scoring, grace,
//! ADR-0024's spared machines), each asserted on the engine's output.

use crate::common;
use bigfleet_decision::UnmetReason;
use bigfleet_model::{Action, ActionKind::*, Machine, MachineState::*, Need};
use common::*;
use std::time::Duration;

fn gpu(n: i64) -> bigfleet_model::ResourceVector {
    units(GPU, n)
}

fn gpu_box(id: &str, state: bigfleet_model::MachineState, gpus: i64) -> M {
    machine(id, state).itype("gpu8").res(gpu(gpus))
}

/// A Configured 8-GPU machine in `cluster` at assigned priority `prio`.
fn victim(id: &str, cluster: &str, prio: i32) -> Machine {
    gpu_box(id, Configured, 8)
        .cluster(cluster)
        .prio(prio)
        .build()
}

/// `n` `victim`s named `<prefix>-<i>`.
fn victims(prefix: &str, cluster: &str, n: usize, prio: i32) -> Vec<Machine> {
    (0..n)
        .map(|i| victim(&format!("{prefix}-{i}"), cluster, prio))
        .collect()
}

fn preempts(out: &bigfleet_decision::CycleOutput) -> Vec<(&str, &str, Duration, i32)> {
    out.actions
        .iter()
        .filter_map(|a| match a {
            Action::Preempt {
                machine_id,
                cluster,
                grace,
                preemptor_priority,
            } => Some((
                machine_id.as_str(),
                cluster.as_str(),
                *grace,
                *preemptor_priority,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn no_op_when_all_resolved() {
    let mut ms = victims("v", "batch", 2, 0);
    ms.extend(fleet("i", 2, Idle, |m| m.itype("gpu8").res(gpu(8))));
    let out = run(&ms, &[need("train", gpu(16)).prio(1_000_000).build()]);
    assert!(preempts(&out).is_empty());
    assert_eq!(ids(&out, Bootstrap).len(), 2);
}

#[test]
fn priority_inversion_preempts() {
    let ms = victims("v", "batch", 4, 400_000);
    let batch = need("batch", gpu(32)).prio(400_000).build();
    let train = need("train", gpu(32)).prio(1_000_000).build();
    let out = run_verdicts(&ms, &[train, batch]);
    let p = preempts(&out);
    assert_eq!(p.len(), 4);
    for (_, cluster, grace, prio) in &p {
        assert_eq!(*cluster, "batch");
        assert_eq!(*grace, Duration::from_secs(30));
        assert_eq!(*prio, 1_000_000);
    }
    assert!(
        out.shortfalls.is_empty(),
        "preemption covers the whole deficit"
    );
    let pre = out.verdicts[0].preemption.as_ref().unwrap();
    assert_eq!(pre.victims_found, 4);
    assert_eq!(pre.capacity_freed, gpu(32));
    // Preempted, not also reclaimed.
    assert!(ids(&out, Reclaim).is_empty());
}

#[test]
fn refuses_to_preempt_equal_or_higher() {
    let mut ms = victims("eq", "batch", 1, 1_000_000);
    ms.extend(victims("hi", "batch", 1, 2_000_000));
    let train = need("train", gpu(16)).prio(1_000_000).build();
    let out = run_verdicts(&ms, &[train]);
    assert!(preempts(&out).is_empty());
    assert_eq!(out.shortfalls[0].deficit, gpu(16));
    assert_eq!(out.verdicts[0].unmet_reason, UnmetReason::PriorityStarved);
}

#[test]
fn prefers_lower_interruption_penalty() {
    let ms = vec![
        gpu_box("a-dear", Configured, 8)
            .cluster("batch")
            .penalties(8192.0, 1.0)
            .build(),
        gpu_box("b-cheap", Configured, 8)
            .cluster("batch")
            .penalties(1.0, 1.0)
            .build(),
    ];
    let out = run(&ms, &[need("train", gpu(8)).prio(100).build()]);
    assert_eq!(ids(&out, Preempt), ["b-cheap"]);
}

#[test]
fn prefers_lower_priority_victim() {
    let ms = vec![victim("a", "batch", 50), victim("b", "batch", 10)];
    let out = run(&ms, &[need("train", gpu(8)).prio(100).build()]);
    assert_eq!(ids(&out, Preempt), ["b"]);
}

#[test]
fn grace_period_matches_gap() {
    let ms = vec![
        victim("v-a", "b", 0),
        victim("v-b", "b", 400_000),
        victim("v-c", "b", 800_000),
        victim("v-d", "b", 950_000),
    ];
    let out = run(&ms, &[need("train", gpu(32)).prio(1_000_000).build()]);
    let mut graces: Vec<(String, u64)> = preempts(&out)
        .iter()
        .map(|(id, _, g, _)| (id.to_string(), g.as_secs()))
        .collect();
    graces.sort();
    assert_eq!(
        graces,
        [
            ("v-a".to_owned(), 10),
            ("v-b".to_owned(), 30),
            ("v-c".to_owned(), 120),
            ("v-d".to_owned(), 600),
        ]
    );
    // Best victim (largest gap) first.
    assert_eq!(preempts(&out)[0].0, "v-a");
}

#[test]
fn victim_below_min_unit_never_selected() {
    let mut ms: Vec<Machine> = (0..4)
        .map(|i| {
            gpu_box(&format!("small-{i}"), Configured, 4)
                .cluster("b")
                .build()
        })
        .collect();
    ms.push(gpu_box("big", Configured, 8).cluster("b").build());
    let n = need("train", gpu(16)).mu(gpu(8)).prio(100).build();
    let out = run_verdicts(&ms, &[n]);
    assert_eq!(ids(&out, Preempt), ["big"]);
    assert_eq!(out.shortfalls[0].deficit, gpu(8));
    assert_eq!(
        out.verdicts[0].unmet_reason,
        UnmetReason::PreemptionExhausted
    );
}

fn zoned_victims(zone: &str, n: usize) -> Vec<Machine> {
    (0..n)
        .map(|i| {
            gpu_box(&format!("v{zone}-{i}"), Configured, 8)
                .zone(zone)
                .cluster("batch")
                .build()
        })
        .collect()
}

#[test]
fn same_confined_to_chosen_domain() {
    let mut ms = zoned_victims("zone-b", 4);
    ms.push(gpu_box("i-a", Idle, 8).zone("zone-a").build());
    let g = same_zone_gang("train", gpu(16), "g").prio(100).build();
    let out = run_verdicts(&ms, &[g]);
    assert_eq!(out.verdicts[0].same_domain, "zone-a");
    assert_eq!(ids(&out, Bootstrap), ["i-a"]);
    assert!(preempts(&out).is_empty(), "zone-b victims are off-domain");
}

#[test]
fn same_no_domain_choice_skips_preemption() {
    let ms = zoned_victims("zone-a", 4);
    let g = same_zone_gang("train", gpu(16), "g").prio(100).build();
    let out = run_verdicts(&ms, &[g]);
    assert_eq!(out.verdicts[0].same_domain, "");
    assert!(out.actions.iter().all(|a| a.kind() == Reclaim));
    assert_eq!(out.shortfalls[0].deficit, gpu(16));
}

#[test]
fn parked_need_no_preempt() {
    let mut ms = zoned_victims("zone-a", 4);
    ms.push(gpu_box("i-a", Idle, 8).zone("zone-a").build());
    let g = same_zone_gang("train", gpu(16), "g")
        .prio(100)
        .parked()
        .build();
    let out = run(&ms, &[g]);
    assert!(preempts(&out).is_empty());
    assert!(ids(&out, Bootstrap).is_empty());
}

#[test]
fn same_gang_behind_lower_priority_holders_preempts_in_domain() {
    let mut ms = zoned_victims("zone-a", 4);
    ms.extend(zoned_victims("zone-b", 4));
    ms.push(gpu_box("i-a0", Idle, 8).zone("zone-a").build());
    ms.push(gpu_box("i-a1", Idle, 8).zone("zone-a").build());
    ms.push(gpu_box("i-b0", Idle, 8).zone("zone-b").build());
    let batch = need("batch", gpu(64)).prio(10).build();
    let g = same_zone_gang("train", gpu(32), "g")
        .prio(1_000_000)
        .build();
    let out = run_verdicts(&ms, &[g, batch]);
    assert_eq!(out.verdicts[0].same_domain, "zone-a");
    assert_eq!(id_set(&out, Bootstrap), ["i-a0", "i-a1"]);
    let p = preempts(&out);
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|(id, ..)| id.starts_with("vzone-a")), "{p:?}");
}

#[test]
fn multiple_preemptors_resolved_by_priority() {
    let ms = victims("v", "batch", 1, 0);
    let mid = need("mid", gpu(8)).prio(500_000).build();
    let top = need("top", gpu(8)).prio(1_000_000).build();
    let out = run_verdicts(&ms, &[mid, top]);
    let p = preempts(&out);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].3, 1_000_000);
    assert_eq!(out.shortfalls.len(), 1);
    assert_eq!(out.shortfalls[0].profile.priority(), 500_000);
}

#[test]
fn victim_credited_to_a_need_at_least_as_important_is_spared() {
    // Stamped low (stale), but Phase 1 credits it to batch's 2M need this cycle.
    let ms = victims("v", "batch", 1, 0);
    let batch = need("batch", gpu(8)).prio(2_000_000).build();
    let train = need("train", gpu(8)).prio(1_000_000).build();
    let out = run_verdicts(&ms, &[batch.clone(), train.clone()]);
    assert!(preempts(&out).is_empty());
    // Credited to a lower need, it is a victim (cross-cluster inversion).
    let batch_low = need("batch", gpu(8)).prio(10).build();
    let out = run_verdicts(&ms, &[train, batch_low]);
    assert_eq!(ids(&out, Preempt), ["v-0"]);
}

#[test]
fn pinned_short_circuit_finds_no_victims() {
    let ms = victims("v", "b", 3, 5_000_000);
    let n = need("train", gpu(8)).req(pin("gpu8")).prio(100).build();
    let out = run_verdicts(&ms, std::slice::from_ref(&n));
    assert!(preempts(&out).is_empty());
    let n2: Need = need("train", gpu(8))
        .req(pin("gpu8"))
        .prio(6_000_000)
        .build();
    assert_eq!(ids(&run(&ms, &[n2]), Preempt), ["v-0"]);
}
