//! Same-domain choice (ChooseSameBucket rules 1–6, ADR-0042/0051), incumbency
//! (M77h) and the precedence outcomes of the reference broker, at engine level.

use crate::common;
use bigfleet_model::{ActionKind::*, Machine, MachineState::*, Need, PenaltyBucket};
use common::*;

fn cpu(n: i64) -> bigfleet_model::ResourceVector {
    units("cpu", n)
}

fn gang(group: &str, n: i64) -> Need {
    same_zone_gang("c1", cpu(n), group).build()
}

fn bound(prefix: &str, zone: &str, n: usize, stamp: Option<&Need>) -> Vec<Machine> {
    fleet(prefix, n, Configured, |m| {
        let m = m.cluster("c1").zone(zone);
        match stamp {
            Some(s) => m.serving(s),
            None => m,
        }
    })
}

fn idle(prefix: &str, zone: &str, n: usize) -> Vec<Machine> {
    fleet(prefix, n, Idle, |m| m.zone(zone))
}

#[test]
fn gang_own_breaks_coverage_tie_either_order() {
    for (own_zone, other_zone) in [("zone-x", "zone-y"), ("zone-y", "zone-x")] {
        let g1 = gang("g1", 3);
        let g2 = gang("g2", 3); // an unrelated gang of the same class, not in demand
        let mut ms = bound("own", own_zone, 3, Some(&g1));
        ms.extend(bound("mix", own_zone, 3, Some(&g2)));
        ms.extend(bound("other", other_zone, 3, Some(&g2)));
        let out = run_verdicts(&ms, std::slice::from_ref(&g1));
        // The own domain wins on rule 2b although its total (6) is larger than
        // the unrelated domain's (3), which rule 3 alone would prefer.
        assert_eq!(out.verdicts[0].same_domain, own_zone);
        let mut reclaimed = id_set(&out, Reclaim);
        reclaimed.sort();
        assert_eq!(
            reclaimed,
            ["mix-0", "mix-1", "mix-2", "other-0", "other-1", "other-2"]
        );
    }
}

#[test]
fn gang_own_does_not_override_creditable() {
    let g = gang("g", 3);
    let mut ms = bound("own", "zone-a", 1, Some(&g));
    ms.extend(idle("i", "zone-a", 4));
    ms.extend(bound("b", "zone-b", 3, None));
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    // zone-b holds the whole gang in bound supply (cred 1.0 > 1/3): rule 2 first.
    assert_eq!(out.verdicts[0].same_domain, "zone-b");
    assert!(ids(&out, Bootstrap).is_empty());
    assert_eq!(ids(&out, Reclaim), ["own-0"]);
}

#[test]
fn no_gang_own_falls_through_to_slack() {
    let g = gang("g", 3);
    let mut ms = bound("a", "zone-a", 3, None);
    ms.extend(idle("ai", "zone-a", 3));
    ms.extend(bound("b", "zone-b", 3, None));
    ms.extend(idle("bi", "zone-b", 1));
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    // Equal bound coverage, no own machines: the smaller joint total (4 < 6) wins.
    assert_eq!(out.verdicts[0].same_domain, "zone-b");
    assert_eq!(id_set(&out, Reclaim), ["a-0", "a-1", "a-2"]);
}

#[test]
fn run_cycle_gang_own_attribution_picks_own_domain() {
    let g1 = gang("g1", 3);
    let g2 = gang("g2", 3);
    let mut ms = bound("a", "zone-a", 3, Some(&g2));
    ms.extend(bound("b", "zone-b", 3, Some(&g1)));
    let out = run_verdicts(&ms, &[g1, g2]);
    assert!(out.actions.is_empty(), "{:?}", out.actions);
    assert_eq!(out.verdicts[0].same_domain, "zone-b");
    assert_eq!(out.verdicts[1].same_domain, "zone-a");
}

#[test]
fn incumbent_kept_over_matured_equivalent() {
    let g = gang("g", 2);
    let mut ms = bound("g-aaa", "zone-a", 1, None);
    ms.extend(
        ["g-mmm", "g-nnn"]
            .iter()
            .map(|id| machine(id, Configured).cluster("c1").serving(&g).build()),
    );
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    // Keep order alone would claim {g-aaa-0, g-mmm}; own-first keeps the serving pair.
    assert_eq!(ids(&out, Reclaim), ["g-aaa-0"]);
    assert_eq!(out.verdicts[0].claimed_machine_count, 2);
}

#[test]
fn claimed_set_stable_across_maturation() {
    let g = gang("g", 2);
    let own: Vec<Machine> = ["g-mmm", "g-nnn"]
        .iter()
        .map(|id| machine(id, Configured).cluster("c1").serving(&g).build())
        .collect();
    // Cycle 1: the newcomer is still Configuring.
    let mut ms = own.clone();
    ms.push(machine("g-aaa", Configuring).cluster("c1").build());
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    assert!(out.actions.is_empty());
    // Cycle 2: it matured; the claimed set does not move, the newcomer is excess.
    let mut ms = own;
    ms.push(machine("g-aaa", Configured).cluster("c1").build());
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    assert_eq!(ids(&out, Reclaim), ["g-aaa"]);
}

#[test]
fn three_idle_domain_beats_two_configured_for_five() {
    let g = gang("g", 5);
    let mut ms = bound("a", "zone-a", 2, None);
    ms.extend(idle("bi", "zone-b", 3));
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    assert_eq!(out.verdicts[0].same_domain, "zone-b");
    assert_eq!(id_set(&out, Bootstrap), ["bi-0", "bi-1", "bi-2"]);
    assert_eq!(id_set(&out, Reclaim), ["a-0", "a-1"]);
    assert_eq!(out.shortfalls[0].deficit, cpu(2));
}

#[test]
fn same_candidates_are_scored_best_first() {
    let g = gang("g", 4);
    let mut ms = idle("a", "zone-a", 2);
    ms.extend(idle("b", "zone-b", 4));
    ms.extend(idle("c", "zone-c", 1));
    let out = run_verdicts(&ms, std::slice::from_ref(&g));
    let cands: Vec<(String, i32, bool)> = out.verdicts[0]
        .same_candidates
        .iter()
        .map(|c| (c.domain.clone(), c.coverage_per_mille, c.satisfiable))
        .collect();
    assert_eq!(
        cands,
        [
            ("zone-b".to_owned(), 1000, true),
            ("zone-a".to_owned(), 500, false),
            ("zone-c".to_owned(), 250, false),
        ]
    );
}

// ---- precedence outcomes (the reference broker's pins, engine level) ----

/// Whether every Bootstrap in `out` is for `cluster`.
fn bootstraps_only_for(out: &bigfleet_decision::CycleOutput, cluster: &str) -> bool {
    actions_of(out, Bootstrap)
        .iter()
        .all(|a| a.cluster() == cluster)
}

#[test]
fn equal_precedence_first_mover_wins() {
    let ms = idle("i", "zone-a", 2);
    let a = need("ca", cpu(2)).prio(5).build();
    let b = need("cb", cpu(2)).prio(5).build();
    let out = run(&ms, &[a.clone(), b.clone()]);
    assert!(bootstraps_only_for(&out, "ca"));
    let out = run(&ms, &[b, a]);
    assert!(bootstraps_only_for(&out, "cb"));
}

#[test]
fn penalty_bucket_breaks_priority_tie() {
    let ms = idle("i", "zone-a", 2);
    let low_ipb = need("ca", cpu(2)).prio(5).ipb(PenaltyBucket::B2).build();
    let high_ipb = need("cb", cpu(2)).prio(5).ipb(PenaltyBucket::B8).build();
    let out = run(&ms, &[low_ipb.clone(), high_ipb.clone()]);
    assert!(bootstraps_only_for(&out, "cb"));
    // The reclamation bucket breaks a tie of both.
    let low_rpb = need("ca", cpu(2)).prio(5).rpb(PenaltyBucket::B2).build();
    let high_rpb = need("cb", cpu(2)).prio(5).rpb(PenaltyBucket::B4).build();
    let out = run(&ms, &[low_rpb, high_rpb]);
    assert!(bootstraps_only_for(&out, "cb"));
}

#[test]
fn gang_takes_its_whole_domain_before_a_lower_plain_need() {
    let mut ms = fleet("a", 3, Idle, |m| m.zone("zone-a").price(1.0));
    ms.extend(fleet("b", 2, Idle, |m| m.zone("zone-b").price(5.0)));
    let plain = need("c2", cpu(2)).prio(10).build();
    let g = same_zone_gang("c1", cpu(3), "g").prio(100).build();
    let out = run(&ms, &[plain, g]);
    let to = |c: &str| -> Vec<String> {
        let mut v: Vec<String> = actions_of(&out, Bootstrap)
            .iter()
            .filter(|a| a.cluster() == c)
            .map(|a| a.machine_id().to_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(to("c1"), ["a-0", "a-1", "a-2"]);
    assert_eq!(to("c2"), ["b-0", "b-1"]);
}

#[test]
fn gang_commits_partially_behind_a_higher_incumbent() {
    // Concentrate-then-park: the domain lost one machine to a higher need; the
    // gang still takes what is left of its domain (ambiguity 9).
    let ms = fleet("a", 3, Idle, |m| m.zone("zone-a"));
    let high = need("c2", cpu(1)).prio(100).build();
    let g = same_zone_gang("c1", cpu(3), "g").prio(10).build();
    let out = run_verdicts(&ms, &[high, g]);
    assert_eq!(ids(&out, Bootstrap).len(), 3);
    let v = &out.verdicts[1];
    assert_eq!(v.claimed_machine_count, 2);
    assert_eq!(v.residual_deficit, cpu(1));
    assert!(v.same_satisfiable);
    assert_eq!(
        v.unmet_reason,
        bigfleet_decision::UnmetReason::PriorityStarved
    );
}
