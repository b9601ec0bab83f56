//! Invariants over random fleets and demand.

use crate::common;
use bigfleet_decision::{Claim, CycleInput, CycleOptions, CycleOutput, run_cycle};
use bigfleet_model::{
    Action, ActionKind, CapacityType, INSTANCE_TYPE_KEY, Machine, MachineState, Need, Operator,
    PenaltyBucket, WhenUnsatisfiable, ZONE_KEY,
};
use common::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const STATES: [MachineState; 8] = [
    MachineState::Speculative,
    MachineState::Creating,
    MachineState::Idle,
    MachineState::Idle,
    MachineState::Configuring,
    MachineState::Configured,
    MachineState::Configured,
    MachineState::Draining,
];
const CAPS: [CapacityType; 4] = [
    CapacityType::OnDemand,
    CapacityType::Spot,
    CapacityType::BareMetal,
    CapacityType::Reserved,
];
const CLUSTERS: [&str; 3] = ["c1", "c2", "c3"];
const PRIOS: [i32; 5] = [0, 10, 100, 1000, 1_000_000];

#[derive(Debug, Clone)]
struct World {
    machines: Vec<Machine>,
    demand: Vec<Need>,
    idle_since: Vec<Option<i64>>,
    now: i64,
    not_ready: Vec<bool>,
}

fn arb_machine(i: usize) -> impl Strategy<Value = Machine> {
    (
        0..STATES.len(),
        0..3usize,
        0..3usize,
        0..4usize,
        0..3usize,
        prop::sample::select(vec![0.0, 1.0, 2.0, 5.0]),
        prop::sample::select(vec![0.0, 0.1]),
        0..CAPS.len(),
        (1..4i64, prop::bool::weighted(0.3)),
        (0..PRIOS.len(), 0..4u32, 0..4u32, 0..4usize),
    )
        .prop_map(
            move |(s, t, z, rack, c, price, prob, cap, (cpu, gpu), (p, ip, rp, stamp))| {
                let state = STATES[s];
                let mut m = machine(&format!("m{i:03}"), state)
                    .itype(["t1", "t2", "t3"][t])
                    .zone(["za", "zb", "zc"][z])
                    .label("rack", ["r1", "r2", "r3", "r4"][rack])
                    .price(price)
                    .prob(prob)
                    .cap(CAPS[cap])
                    .res(res(&[
                        ("cpu", &cpu.to_string()),
                        (GPU, if gpu { "8" } else { "0" }),
                    ]))
                    .prio(PRIOS[p])
                    .penalties(f64::from(1 << ip), f64::from(1 << rp));
                if matches!(
                    state,
                    MachineState::Configured | MachineState::Configuring | MachineState::Draining
                ) {
                    m = m.cluster(CLUSTERS[c]);
                }
                if stamp > 0 {
                    m = m.stamp(&format!("fp{stamp}"), &format!("g{stamp}"));
                }
                m.build()
            },
        )
}

fn arb_need() -> impl Strategy<Value = Need> {
    (
        0..3usize,
        1..8i64,
        0..3i64,
        0..PRIOS.len(),
        0..3u8,
        0..2u8,
        prop::option::weighted(0.4, 0..3usize),
        0..6usize,
        0..4usize,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(c, cpu, mu, p, ipb, rpb, pinned, topo, group, parked, gpu)| {
                let mut agg = vec![("cpu".to_owned(), cpu.to_string())];
                if gpu {
                    agg.push((GPU.to_owned(), "8".to_owned()));
                }
                let agg_ref: Vec<(&str, &str)> =
                    agg.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                let mut n = need(CLUSTERS[c], res(&agg_ref))
                    .prio(PRIOS[p])
                    .ipb(PenaltyBucket::from_ordinal(i32::from(ipb) + 3).unwrap())
                    .rpb(PenaltyBucket::from_ordinal(i32::from(rpb) + 3).unwrap())
                    .group(&format!("g{group}"))
                    .mu(units("cpu", mu));
                if let Some(t) = pinned {
                    n = n.req(req(
                        INSTANCE_TYPE_KEY,
                        Operator::In,
                        &[["t1", "t2", "t3"][t]],
                    ));
                }
                n = match topo {
                    0 => n.req(req(ZONE_KEY, Operator::Same, &[])),
                    1 => n.req(req("rack", Operator::Same, &[])),
                    2 => n.spread(ZONE_KEY, 1, WhenUnsatisfiable::DoNotSchedule),
                    3 => n.req(req(ZONE_KEY, Operator::NotIn, &["zc"])),
                    _ => n,
                };
                if parked {
                    n = n.parked();
                }
                n.build()
            },
        )
}

fn arb_world() -> impl Strategy<Value = World> {
    (0..40usize)
        .prop_flat_map(|n| {
            (
                (0..n).map(arb_machine).collect::<Vec<_>>(),
                prop::collection::vec(arb_need(), 0..8),
                prop::collection::vec(prop::option::of(0..20i64), n),
                0..20i64,
                prop::collection::vec(prop::bool::weighted(0.2), 3),
            )
        })
        .prop_map(|(mut machines, mut demand, idle, now, not_ready)| {
            demand.sort_by(bigfleet_model::snapshot_order);
            // Stamp some machines with real demand (fingerprint, group) pairs so
            // own-incumbent rules and Creating credit are exercised.
            if !demand.is_empty() {
                for (i, m) in machines.iter_mut().enumerate() {
                    if !m.assigned_need_fingerprint.is_empty() && i % 2 == 0 {
                        let n = &demand[i % demand.len()];
                        m.assigned_need_fingerprint = n.fingerprint().to_owned();
                        m.assigned_group = n.group.clone();
                    }
                }
            }
            World {
                machines,
                demand,
                idle_since: idle
                    .into_iter()
                    .map(|o| o.map(|m| m * 60_000_000_000))
                    .collect(),
                now: now * 60_000_000_000,
                not_ready,
            }
        })
}

impl World {
    /// Creating machines are provisioned for the cluster of the need they carry.
    fn creating_destinations(&self) -> HashMap<String, String> {
        self.machines
            .iter()
            .filter(|m| m.state == MachineState::Creating)
            .filter_map(|m| {
                self.demand
                    .iter()
                    .find(|n| n.fingerprint() == m.assigned_need_fingerprint)
                    .map(|n| (m.id.clone(), n.cluster.clone()))
            })
            .collect()
    }

    /// The world's cluster readiness; clusters it does not know are ready.
    fn cluster_ready(&self) -> impl Fn(&str) -> bool + use<> {
        let not_ready = self.not_ready.clone();
        move |c: &str| {
            CLUSTERS
                .iter()
                .position(|x| *x == c)
                .is_none_or(|i| !not_ready[i])
        }
    }
}

fn cycle(w: &World, opts: &CycleOptions) -> CycleOutput {
    let dest = w.creating_destinations();
    let ready = w.cluster_ready();
    let input = CycleInput {
        idle_since: &w.idle_since,
        now_unix_nanos: w.now,
        cluster_ready: Some(&ready),
        creating_destinations: Some(&dest),
        ..CycleInput::new(&w.machines, &w.demand)
    };
    run_cycle(&input, opts).unwrap()
}

fn full() -> CycleOptions {
    CycleOptions {
        verdicts: true,
        claims: true,
        ..CycleOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn one_action_per_machine_from_a_matching_stable_state(w in arb_world()) {
        let out = cycle(&w, &full());
        let by_id: HashMap<&str, &Machine> = w.machines.iter().map(|m| (m.id.as_str(), m)).collect();
        let mut seen = HashSet::new();
        for a in &out.actions {
            prop_assert!(seen.insert(a.machine_id()), "two actions for {}", a.machine_id());
            let m = by_id[a.machine_id()];
            prop_assert!(m.state.is_stable());
            prop_assert_eq!(m.state, a.kind().from_state(), "{}", a);
        }
        // No machine claimed twice, and claims only from creditable/acquirable states.
        let mut claimed = HashSet::new();
        for c in &out.claims {
            prop_assert!(claimed.insert(c.machine_id.clone()), "claimed twice: {}", c.machine_id);
            prop_assert!(matches!(
                c.state,
                MachineState::Configured | MachineState::Configuring | MachineState::Creating
                    | MachineState::Idle | MachineState::Speculative
            ));
        }
        let total: u32 = out.verdicts.iter().map(|v| v.claimed_machine_count).sum();
        prop_assert_eq!(total as usize, out.claims.len());
    }

    #[test]
    fn phase3_reclaims_exactly_unclaimed_configured_in_ready_clusters(w in arb_world()) {
        let out = cycle(&w, &full());
        let claimed: HashSet<&str> = out.claims.iter().map(|c: &Claim| c.machine_id.as_str()).collect();
        let preempted: HashSet<&str> = out.actions.iter()
            .filter(|a| a.kind() == ActionKind::Preempt).map(Action::machine_id).collect();
        let reclaimed: HashSet<&str> = out.actions.iter()
            .filter(|a| a.kind() == ActionKind::Reclaim).map(Action::machine_id).collect();
        for m in &w.machines {
            let ready = !w.not_ready[CLUSTERS.iter().position(|c| *c == m.cluster).unwrap_or(0)];
            let excess = m.state == MachineState::Configured
                && ready
                && !claimed.contains(m.id.as_str())
                && !preempted.contains(m.id.as_str());
            prop_assert_eq!(reclaimed.contains(m.id.as_str()), excess, "{}", m.id);
        }
        // Acquisitions are exactly the claimed Idle/Speculative machines.
        let acquired: HashSet<&str> = out.claims.iter()
            .filter(|c| matches!(c.state, MachineState::Idle | MachineState::Speculative))
            .map(|c| c.machine_id.as_str()).collect();
        let acts: HashSet<&str> = out.actions.iter()
            .filter(|a| matches!(a.kind(), ActionKind::Bootstrap | ActionKind::Provision))
            .map(Action::machine_id).collect();
        prop_assert_eq!(acquired, acts);
    }

    #[test]
    fn identical_across_thread_counts_and_input_order(w in arb_world(), seed in 0u64..1000) {
        let base = cycle(&w, &CycleOptions { threads: 1, ..full() });
        for t in [2, 4] {
            prop_assert_eq!(&cycle(&w, &CycleOptions { threads: t, ..full() }), &base);
        }
        // Shuffling the inventory (and its stamps alongside) changes nothing.
        let mut idx: Vec<usize> = (0..w.machines.len()).collect();
        let mut s = seed;
        for i in (1..idx.len()).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            idx.swap(i, (s >> 33) as usize % (i + 1));
        }
        let shuffled = World {
            machines: idx.iter().map(|&i| w.machines[i].clone()).collect(),
            idle_since: idx.iter().map(|&i| w.idle_since[i]).collect(),
            ..w.clone()
        };
        let mut a = cycle(&shuffled, &full());
        let mut b = base;
        a.stats.snapshot_bytes = 0;
        b.stats.snapshot_bytes = 0;
        prop_assert_eq!(a, b);
    }

    #[test]
    fn verdicts_on_or_off_identical_actions(w in arb_world()) {
        let on = cycle(&w, &full());
        let off = cycle(&w, &CycleOptions::default());
        prop_assert_eq!(&on.actions, &off.actions);
        prop_assert_eq!(&on.shortfalls, &off.shortfalls);
        prop_assert_eq!(&on.parking, &off.parking);
    }
}

/// Identical plain needs that differ only in precedence (and cluster).
fn arb_ladder() -> impl Strategy<Value = (Vec<Machine>, Vec<Need>)> {
    (
        prop::collection::vec(
            (
                0..2usize,
                prop::sample::select(vec![0.0, 1.0, 3.0]),
                1..3i64,
            ),
            0..20,
        ),
        prop::collection::vec((0..PRIOS.len(), 0..3u8), 2..6),
        1..6i64,
    )
        .prop_map(|(ms, ns, cpu)| {
            let machines = ms
                .iter()
                .enumerate()
                .map(|(i, (s, price, c))| {
                    machine(
                        &format!("m{i:02}"),
                        [MachineState::Idle, MachineState::Speculative][*s],
                    )
                    .price(*price)
                    .res(units("cpu", *c))
                    .build()
                })
                .collect();
            let demand = ns
                .iter()
                .enumerate()
                .map(|(k, (p, b))| {
                    need(&format!("c{k}"), units("cpu", cpu))
                        .prio(PRIOS[*p])
                        .ipb(PenaltyBucket::from_ordinal(i32::from(*b) + 3).unwrap())
                        .build()
                })
                .collect();
            (machines, demand)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn higher_precedence_is_never_worse_off((machines, demand) in arb_ladder()) {
        let out = run_cycle(&CycleInput::new(&machines, &demand), &full()).unwrap();
        for (a, va) in demand.iter().zip(&out.verdicts) {
            for (b, vb) in demand.iter().zip(&out.verdicts) {
                if a.profile.precedence() > b.profile.precedence() {
                    prop_assert!(
                        va.residual_deficit.get("cpu") <= vb.residual_deficit.get("cpu"),
                        "{:?} ({:?}) worse off than {:?} ({:?})",
                        a.profile.precedence(), va.residual_deficit,
                        b.profile.precedence(), vb.residual_deficit
                    );
                    prop_assert!(!vb.satisfied || va.satisfied);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn incremental_fleet_equals_fresh_inventory(w in arb_world(), seed in 0u64..1000) {
        use bigfleet_decision::Fleet;
        let base = cycle(&w, &full());
        // Build the fleet the way a shard does: machines arrive in some order,
        // some first in a stale version, some never-to-stay extras appear and
        // are removed again.
        let mut fleet = Fleet::new();
        let mut s = seed;
        let mut rnd = |n: usize| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as usize % n.max(1)
        };
        let mut order: Vec<usize> = (0..w.machines.len()).collect();
        for i in (1..order.len()).rev() {
            let j = rnd(i + 1);
            order.swap(i, j);
        }
        for (k, &i) in order.iter().enumerate() {
            let m = &w.machines[i];
            if k % 3 == 0 {
                let mut stale = m.clone();
                stale.state = MachineState::Idle;
                stale.cluster.clear();
                stale.price_per_hour += 1.0;
                stale.profile.labels.insert("stale".into(), "yes".into());
                fleet.upsert(&stale, 7);
            }
            if k % 4 == 0 {
                let mut extra = m.clone();
                extra.id = format!("{}-extra", m.id);
                fleet.upsert(&extra, 0);
            }
        }
        for &i in &order {
            let m = &w.machines[i];
            fleet.upsert_with_idle_since(m, w.idle_since[i]);
            fleet.remove(&format!("{}-extra", m.id));
        }
        let ready = w.cluster_ready();
        let dest = w.creating_destinations();
        let input = CycleInput {
            now_unix_nanos: w.now,
            cluster_ready: Some(&ready),
            creating_destinations: Some(&dest),
            ..CycleInput::with_fleet(&fleet, &w.demand)
        };
        let mut got = run_cycle(&input, &full()).unwrap();
        let mut want = base;
        got.stats.snapshot_bytes = 0;
        want.stats.snapshot_bytes = 0;
        prop_assert_eq!(got, want);
    }
}

/// One fleet mutation: upsert machine `i` (with an idle-since stamp) or remove it.
fn arb_mutation() -> impl Strategy<Value = (Machine, Option<i64>, bool)> {
    (0..48usize)
        .prop_flat_map(|i| {
            (
                arb_machine(i),
                prop::option::of(0..20i64),
                prop::bool::weighted(0.25),
            )
        })
        .prop_map(|(m, stamp, remove)| (m, stamp.map(|s| s * 60_000_000_000), remove))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// The fleet caches its demand-independent snapshot lists between cycles;
    /// mutating it between cycles must give exactly what a freshly built fleet
    /// over the same machines gives, with verdicts on and off (which read the
    /// lazily listed Speculative machines differently).
    #[test]
    fn mutated_fleet_across_cycles_equals_fresh_fleet(
        w in arb_world(),
        rounds in prop::collection::vec(prop::collection::vec(arb_mutation(), 0..12), 3),
    ) {
        mutate_across_cycles(&w, rounds, true)?;
    }

    /// Replacing known machines (no inserts or removals) patches the cached
    /// lists instead of rebuilding them; the cycles must not tell the difference.
    #[test]
    fn replaced_machines_across_cycles_equal_fresh_fleet(
        w in arb_world(),
        rounds in prop::collection::vec(prop::collection::vec(arb_mutation(), 0..12), 3),
    ) {
        mutate_across_cycles(&w, rounds, false)?;
    }
}

/// Runs cycles over one fleet mutated between them (`inserts`: also adds and
/// removes machines; otherwise only replaces known ones) and compares each
/// with a fresh fleet over the same machines, with verdicts on and off (which
/// read the lazily listed Speculative machines differently).
fn mutate_across_cycles(
    w: &World,
    rounds: Vec<Vec<(Machine, Option<i64>, bool)>>,
    inserts: bool,
) -> Result<(), TestCaseError> {
    use bigfleet_decision::Fleet;
    use std::collections::BTreeMap;
    let mut live: BTreeMap<String, (Machine, Option<i64>)> = w
        .machines
        .iter()
        .zip(&w.idle_since)
        .map(|(m, s)| (m.id.clone(), (m.clone(), *s)))
        .collect();
    let mut fleet = Fleet::from_machines(&w.machines, &w.idle_since).unwrap();
    let check = |fleet: &Fleet, live: &BTreeMap<String, (Machine, Option<i64>)>| {
        let machines: Vec<Machine> = live.values().map(|(m, _)| m.clone()).collect();
        let stamps: Vec<Option<i64>> = live.values().map(|(_, s)| *s).collect();
        let fresh = Fleet::from_machines(&machines, &stamps).unwrap();
        // Demands over different attribute keys in turn, so the cached
        // grouping is replaced and rebuilt between cycles over one fleet.
        let half = &w.demand[..w.demand.len() / 2];
        let demands: [&[Need]; 4] = [&w.demand, half, &[], &w.demand];
        let runs = demands.iter().flat_map(|d| {
            [
                full(),
                CycleOptions::default(),
                CycleOptions {
                    threads: 2,
                    ..full()
                },
            ]
            .map(|o| (*d, o))
        });
        for (demand, opts) in runs {
            let input = |f| CycleInput {
                now_unix_nanos: w.now,
                ..CycleInput::with_fleet(f, demand)
            };
            let mut got = run_cycle(&input(fleet), &opts).unwrap();
            let mut want = run_cycle(&input(&fresh), &opts).unwrap();
            got.stats.snapshot_bytes = 0;
            want.stats.snapshot_bytes = 0;
            if got != want {
                return Err(format!("{opts:?}: {got:?} != {want:?}"));
            }
        }
        Ok(())
    };
    check(&fleet, &live).map_err(TestCaseError::fail)?;
    for muts in rounds {
        for (m, stamp, remove) in muts {
            if !inserts && !live.contains_key(&m.id) {
                continue;
            }
            if remove && inserts {
                prop_assert_eq!(fleet.remove(&m.id), live.remove(&m.id).is_some());
            } else {
                fleet.upsert_with_idle_since(&m, stamp);
                live.insert(m.id.clone(), (m, stamp));
            }
        }
        check(&fleet, &live).map_err(TestCaseError::fail)?;
    }
    Ok(())
}

fn arb_ownership() -> impl Strategy<Value = bigfleet_decision::Ownership> {
    (
        prop::collection::btree_set(
            prop::sample::select(vec![
                ("rack", "r1"),
                ("rack", "r2"),
                ("rack", "r3"),
                (ZONE_KEY, "za"),
                (ZONE_KEY, "zc"),
            ]),
            0..3,
        ),
        prop::collection::btree_set(0..40usize, 0..6),
        prop::collection::btree_set(0..40usize, 0..6),
    )
        .prop_map(|(domains, adopted, released)| {
            let mut o = bigfleet_decision::Ownership::of_domains(domains);
            o.adopted = adopted.into_iter().map(|i| format!("m{i:03}")).collect();
            o.released = released.into_iter().map(|i| format!("m{i:03}")).collect();
            o
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// ADR-0128: no action ever names a machine outside the owned set, on
    /// either inventory path, and no foreign Idle or Speculative machine is
    /// ever claimed.
    #[test]
    fn no_action_names_a_foreign_machine(w in arb_world(), o in arb_ownership()) {
        let by_id: HashMap<&str, &Machine> = w.machines.iter().map(|m| (m.id.as_str(), m)).collect();
        let mut fleet = bigfleet_decision::Fleet::new();
        for (m, s) in w.machines.iter().zip(&w.idle_since) {
            fleet.upsert_with_idle_since(m, *s);
        }
        let ready = |_: &str| true;
        let slice = CycleInput {
            idle_since: &w.idle_since,
            now_unix_nanos: w.now,
            cluster_ready: Some(&ready),
            ownership: Some(&o),
            ..CycleInput::new(&w.machines, &w.demand)
        };
        let fast = CycleInput {
            now_unix_nanos: w.now,
            cluster_ready: Some(&ready),
            ownership: Some(&o),
            ..CycleInput::with_fleet(&fleet, &w.demand)
        };
        let a = run_cycle(&slice, &full()).unwrap();
        let b = run_cycle(&fast, &full()).unwrap();
        prop_assert_eq!(&a.actions, &b.actions);
        for a in &a.actions {
            let m = by_id[a.machine_id()];
            prop_assert!(o.owns(&m.id, &m.profile), "{} names foreign {}", a, m.id);
        }
        for c in &a.claims {
            let m = by_id[c.machine_id.as_str()];
            if matches!(c.state, MachineState::Idle | MachineState::Speculative) {
                prop_assert!(o.owns(&m.id, &m.profile), "claimed foreign {}", m.id);
            }
        }
    }
}
