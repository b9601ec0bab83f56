use super::*;
use bigfleet_model::{Host, Machine, MachineProfile};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// (state, cluster, type, capacity, price, penalty, priority, idle stamp).
type Shape = (u8, u8, u8, u8, u8, u8, i32, Option<i64>);

const STATES: [MachineState; 6] = [
    MachineState::Idle,
    MachineState::Speculative,
    MachineState::Creating,
    MachineState::Configuring,
    MachineState::Configured,
    MachineState::Draining,
];

fn machine(i: usize, s: &Shape) -> Machine {
    let (state, cluster, itype, cap, price, rp, prio, _) = *s;
    Machine {
        id: format!("m{i:03}"),
        state: STATES[state as usize],
        host: Host {
            provider: "p".into(),
            reference: format!("r{i}"),
        },
        cluster: if cluster == 0 {
            String::new()
        } else {
            format!("c{cluster}")
        },
        profile: MachineProfile {
            instance_type: format!("t{itype}"),
            capacity_type: CAPACITY_TYPES[1 + cap as usize],
            ..MachineProfile::default()
        },
        price_per_hour: f64::from(price),
        assigned_reclamation_penalty_dollars: f64::from(rp),
        assigned_priority: prio,
        assigned_need_fingerprint: if cluster == 0 {
            String::new()
        } else {
            format!("fp{}", prio % 2)
        },
        ..Machine::default()
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        0u8..6,
        0u8..4,
        0u8..3,
        0u8..4,
        0u8..3,
        0u8..2,
        0i32..4,
        prop::option::of(0i64..5),
    )
}

/// Builds the base and every lazily built list, as cycles would.
fn settle(fleet: &Fleet) -> &Base {
    let spec = BuildSpec {
        keys: Vec::new(),
        destinations: None,
        demand_vectors: Vec::new(),
        demand_clusters: Vec::new(),
        demand_names: &[],
        own_index: true,
        free_groups: true,
        par: Parallelism::Off,
    };
    let snap = Snapshot::build(fleet, spec);
    snap.idle_all_sorted();
    for t in 0..fleet.values.len() as u32 {
        snap.idle_type_sorted(t);
    }
    snap.base
}

/// The cached grouping with symbols and handles spelled out (group
/// numbers are not part of it: patches append groups).
fn canon_grouping(fleet: &Fleet, b: &Base) -> String {
    let g = b.grouping.get().expect("grouping built");
    let id = |h: u32| fleet.ids[h as usize].to_string();
    let group = |i: u32| {
        let gr = &g.groups[i as usize];
        let itype = g.shapes[gr.shape as usize].itype;
        let members: Vec<String> = gr.members.iter().map(|&h| id(h)).collect();
        let itype = if itype == NONE {
            ""
        } else {
            fleet.values.resolve(itype)
        };
        format!(
            "{:?}/{itype}/{:?}: {members:?}",
            gr.state, fleet.allocs[gr.alloc as usize]
        )
    };
    let mut clusters = BTreeMap::new();
    for (c, cg) in g.cluster_groups.iter().enumerate() {
        if !cg.is_empty() {
            let name = fleet.clusters.resolve(c as u32);
            let groups: Vec<String> = cg.iter().map(|&i| group(i)).collect();
            let bound = b.bound[c]
                .each_ref()
                .map(|l| l.iter().map(|&h| id(h)).collect::<Vec<_>>());
            clusters.insert(name, (groups, bound));
        }
    }
    let mut out = format!("{clusters:?}\n");
    let free: Vec<String> = g.free_groups.iter().map(|&i| group(i)).collect();
    out += &format!("free {free:?}\n");
    let mut own: Vec<String> = g
        .own_index
        .iter()
        .map(|((c, fp, gs), hs)| {
            let hs: Vec<String> = hs.iter().map(|&h| id(h)).collect();
            format!(
                "{} {} {} {hs:?}",
                fleet.clusters.resolve(*c),
                fleet.fps.resolve(*fp),
                if *gs == NONE {
                    ""
                } else {
                    fleet.groups.resolve(*gs)
                }
            )
        })
        .collect();
    own.sort();
    out += &format!("own {own:?}\n");
    let mut members: Vec<(String, String)> = Vec::new();
    for h in 0..fleet.recs.len() as u32 {
        let gi = g.group[h as usize];
        members.push((id(h), if gi == NONE { String::new() } else { group(gi) }));
    }
    out += &format!("member of {members:?}");
    out
}

/// A base with symbols and handles spelled out, empty lists dropped.
fn canon(fleet: &Fleet, b: &Base) -> String {
    let id = |h: &u32| fleet.ids[*h as usize].to_string();
    let ids = |v: &[u32]| v.iter().map(id).collect::<Vec<_>>();
    let val = |v: u32| {
        if v == NONE {
            String::new()
        } else {
            fleet.values.resolve(v).to_owned()
        }
    };
    let mut types = BTreeMap::new();
    for (&(st, t), &i) in &b.type_index {
        let l = &b.type_lists[i as usize];
        if !l.is_empty() {
            let sorted = b.type_sorted[i as usize].get().map(|v| ids(v));
            types.insert((st, val(t)), (ids(l), b.type_min_prio[i as usize], sorted));
        }
    }
    let spec = b.spec.get().map(|sl| {
        let by_type: BTreeMap<_, _> = sl
            .by_type
            .iter()
            .map(|(t, (l, m))| (val(*t), (ids(l), *m)))
            .collect();
        (ids(&sl.all), sl.min_prio, by_type)
    });
    let mut bound = BTreeMap::new();
    let mut kpos = BTreeMap::new();
    for (c, lists) in b.bound.iter().enumerate() {
        for (s, l) in lists.iter().enumerate() {
            if !l.is_empty() {
                bound.insert((fleet.clusters.resolve(c as u32).to_owned(), s), ids(l));
            }
        }
    }
    for h in 0..fleet.recs.len() as u32 {
        kpos.insert(id(&h), b.kpos[h as usize]);
    }
    let by_state: Vec<_> = b.by_state.iter().map(|l| ids(l)).collect();
    format!(
        "states {by_state:?}\nmin {:?}\ntypes {types:?}\nidle sorted {:?}\nspec {spec:?}\n\
         bound {bound:?}\nkpos {kpos:?}\nidle min {:?}\nrank {:?}",
        b.min_prio,
        b.idle_sorted.get().map(|v| ids(v)),
        b.idle_min,
        b.rank,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A base patched with replaced records is the base a fresh fleet over
    /// the same machines builds.
    #[test]
    fn patched_base_equals_a_fresh_build(
        start in prop::collection::vec(shape(), 1..40),
        rounds in prop::collection::vec(prop::collection::vec((0usize..40, shape()), 0..10), 1..4),
    ) {
        let mut now = start.clone();
        let machines: Vec<Machine> = now.iter().enumerate().map(|(i, s)| machine(i, s)).collect();
        let stamps: Vec<Option<i64>> = now.iter().map(|s| s.7).collect();
        let mut fleet = Fleet::from_machines(&machines, &stamps).unwrap();
        settle(&fleet);
        for round in rounds {
            for (i, s) in round {
                let i = i % now.len();
                now[i] = s;
                fleet.upsert_with_idle_since(&machine(i, &s), s.7);
            }
            let b = settle(&fleet);
            let patched = canon(&fleet, b) + &canon_grouping(&fleet, b);
            let machines: Vec<Machine> = now.iter().enumerate().map(|(i, s)| machine(i, s)).collect();
            let stamps: Vec<Option<i64>> = now.iter().map(|s| s.7).collect();
            let fresh_fleet = Fleet::from_machines(&machines, &stamps).unwrap();
            let b = settle(&fresh_fleet);
            let fresh = canon(&fresh_fleet, b) + &canon_grouping(&fresh_fleet, b);
            prop_assert_eq!(patched, fresh);
        }
    }
}

#[test]
fn replacements_patch_the_cached_base_and_inserts_drop_it() {
    let shapes: Vec<Shape> = (0..8).map(|i| (0, 0, i % 2, 0, 1, 0, 0, None)).collect();
    let machines: Vec<Machine> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| machine(i, s))
        .collect();
    let mut fleet = Fleet::from_machines(&machines, &[]).unwrap();
    settle(&fleet);
    // An unchanged re-upsert keeps the base as it is.
    fleet.upsert_with_idle_since(&machines[3], None);
    assert!(fleet.base.get().is_some());
    // A change queues a patch.
    fleet.upsert_with_idle_since(&machine(3, &(4, 1, 0, 0, 1, 0, 2, None)), None);
    assert!(fleet.base.get().is_none());
    assert!(fleet.stale.take().is_some());
    settle(&fleet);
    // A new machine rebuilds.
    fleet.upsert_with_idle_since(&machine(99, &shapes[0]), None);
    assert!(fleet.base.get().is_none());
    assert!(fleet.stale.take().is_none());
}
