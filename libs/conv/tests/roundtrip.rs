//! Property tests: every converted message survives model → proto → model unchanged.

use bigfleet_conv::*;
use bigfleet_model::{
    Action, Assignment, CapacityType, Host, Machine, MachineProfile, MachineState, Need, Operator,
    PenaltyBucket, Profile, Requirement, ResourceVector, TopologySpread, WhenUnsatisfiable,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn token() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9.-]{0,6}[a-z0-9])?"
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        token(),
        (token(), token()).prop_map(|(p, n)| format!("{p}/{n}")),
        Just("node.kubernetes.io/instance-type".to_owned()),
        Just("topology.kubernetes.io/zone".to_owned()),
    ]
}

fn requirement() -> impl Strategy<Value = Requirement> {
    (key(), 1u8..=5, proptest::collection::vec(token(), 1..4)).prop_map(|(k, op, values)| {
        let op = Operator::from_ordinal(op.into()).unwrap();
        let values = match op {
            Operator::Exists | Operator::DoesNotExist => vec![],
            _ => values,
        };
        Requirement::new(k, op, values)
    })
}

fn spread() -> impl Strategy<Value = TopologySpread> {
    (key(), 1i32..10, 0u8..3).prop_map(|(k, skew, w)| TopologySpread {
        topology_key: k,
        max_skew: skew,
        when_unsatisfiable: WhenUnsatisfiable::from_ordinal(w.into()).unwrap(),
    })
}

fn bucket() -> impl Strategy<Value = PenaltyBucket> {
    (0i32..28).prop_map(|b| PenaltyBucket::from_ordinal(b).unwrap())
}

fn profile() -> impl Strategy<Value = Profile> {
    (
        proptest::collection::vec(requirement(), 0..4),
        proptest::collection::vec(spread(), 0..3),
        any::<i32>(),
        bucket(),
        bucket(),
    )
        .prop_map(|(r, s, p, i, c)| Profile::new(r, s, p, i, c))
}

fn resources() -> impl Strategy<Value = ResourceVector> {
    proptest::collection::vec(
        (
            prop_oneof![
                Just("cpu".to_owned()),
                Just("memory".to_owned()),
                Just("nvidia.com/gpu".to_owned()),
                token()
            ],
            0i64..i64::MAX / 8,
        ),
        0..4,
    )
    .prop_map(ResourceVector::from_milli)
}

fn need(cluster: String) -> impl Strategy<Value = Need> {
    (profile(), resources(), resources(), ".{0,6}").prop_map(move |(p, agg, min, group)| Need {
        aggregate_resources: agg,
        min_unit: min,
        group,
        ..Need::new(cluster.clone(), p)
    })
}

fn rollup() -> impl Strategy<Value = Rollup> {
    (token(), any::<i64>()).prop_flat_map(|(cluster, ts)| {
        proptest::collection::vec(need(cluster.clone()), 0..5).prop_map(move |needs| Rollup {
            cluster: cluster.clone(),
            timestamp_unix_nanos: ts,
            needs,
        })
    })
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(key(), ".{0,6}", 0..4)
}

/// A machine that satisfies the invariants, in any non-Unspecified state.
/// Assigned* fields stay at their defaults: on the wire they travel only in
/// `shard_metadata`.
fn machine() -> impl Strategy<Value = Machine> {
    (
        (token(), 1i32..=8, token(), token(), token(), token()),
        (token(), 0i32..5, 0.0f64..1e6, 0.0f64..=1.0),
        (resources(), resources(), labels(), labels(), ".{1,10}"),
    )
        .prop_map(
            |(
                (id, state, host_ref, cluster, instance_type, zone),
                (provider, ct, price, prob),
                (res, alloc, labels, metadata, error),
            )| {
                let state = MachineState::from_ordinal(state).unwrap();
                let hosted = !matches!(state, MachineState::Speculative | MachineState::Creating);
                let bound = matches!(
                    state,
                    MachineState::Configuring | MachineState::Configured | MachineState::Draining
                );
                Machine {
                    id,
                    state,
                    host: if hosted {
                        Host {
                            provider,
                            reference: host_ref,
                        }
                    } else {
                        Host::default()
                    },
                    cluster: if bound { cluster } else { String::new() },
                    profile: MachineProfile {
                        instance_type,
                        zone,
                        capacity_type: CapacityType::from_ordinal(ct).unwrap(),
                        resources: res,
                        labels,
                    },
                    price_per_hour: price,
                    interruption_probability: prob,
                    last_error: if state == MachineState::Failed {
                        error
                    } else {
                        String::new()
                    },
                    allocatable: alloc,
                    shard_metadata: metadata,
                    ..Machine::default()
                }
            },
        )
}

fn assignment() -> impl Strategy<Value = Assignment> {
    (profile(), ".{0,6}").prop_map(|(p, g)| Assignment::new(Arc::new(p), g))
}

fn action() -> impl Strategy<Value = Action> {
    let grace = (0u64..100_000).prop_map(Duration::from_secs);
    prop_oneof![
        (token(), token(), assignment()).prop_map(|(m, c, a)| Action::Bootstrap {
            machine_id: m,
            cluster: c,
            assignment: a
        }),
        (token(), token(), assignment()).prop_map(|(m, c, a)| Action::Provision {
            machine_id: m,
            cluster: c,
            assignment: a
        }),
        (token(), token(), grace.clone()).prop_map(|(m, c, g)| Action::Reclaim {
            machine_id: m,
            cluster: c,
            grace: g
        }),
        (token(), token(), grace, any::<i32>()).prop_map(|(m, c, g, p)| Action::Preempt {
            machine_id: m,
            cluster: c,
            grace: g,
            preemptor_priority: p
        }),
        token().prop_map(|m| Action::Release { machine_id: m }),
    ]
}

proptest! {
    #[test]
    fn rollup_round_trips(r in rollup()) {
        let wire = rollup_to_proto(&r);
        prop_assert_eq!(rollup_from_proto(&wire), Ok(r));
    }

    #[test]
    fn need_round_trips(n in need("c".to_owned())) {
        let wire = need_to_proto(&n);
        let back = need_from_proto("c", &wire).unwrap();
        prop_assert_eq!(back.fingerprint(), n.fingerprint());
        prop_assert_eq!(back, n);
    }

    #[test]
    fn machine_round_trips(m in machine()) {
        prop_assert_eq!(m.invariant(), Ok(()));
        let wire = machine_to_proto(&m);
        prop_assert_eq!(machine_from_proto(&wire), Ok(m));
    }

    #[test]
    fn action_round_trips(a in action()) {
        let wire = action_to_proto(&a);
        prop_assert_eq!(action_from_proto(&wire), Ok(a));
    }

    #[test]
    fn requirements_round_trip(reqs in proptest::collection::vec(requirement(), 0..5)) {
        let wire = requirements_to_proto(&reqs);
        prop_assert_eq!(requirements_from_proto(&wire), Ok(reqs));
    }

    #[test]
    fn node_state_update_reflects_the_machine(m in machine()) {
        let u = node_state_update(&m, "dest");
        prop_assert_eq!(u.machine_id, m.id.clone());
        prop_assert_eq!(machine_state_from_proto(u.state), Ok(m.state));
        let res = u.resources.map(|r| r.resources).unwrap_or_default();
        let parsed = ResourceVector::parse(&res).unwrap();
        prop_assert_eq!(&parsed, m.effective_allocatable());
    }
}
