//! Proptest-based fuzzing of the decoders: arbitrary prost messages, arbitrary
//! bytes decoded through prost, and bit-flipped valid encodings must never
//! make a conversion panic, and whatever is accepted must re-encode to
//! something accepted identically.

use bigfleet_conv::*;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use proptest::prelude::*;
use prost::Message;
use std::collections::HashMap;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z]{1,4}",
        "[a-z|;:,/.]{0,5}",
        ".{0,8}",
    ]
}

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,4}(\\.[0-9]{0,3})?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?",
        "[-+]?[0-9.]{0,30}([eE][-+]?[0-9]{0,22})?[a-zA-Z]{0,2}",
        ".{0,10}",
    ]
}

fn enum_value() -> impl Strategy<Value = i32> {
    prop_oneof![-2i32..32, any::<i32>()]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0f64..10.0,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        any::<f64>(),
    ]
}

fn quantity_map() -> impl Strategy<Value = HashMap<String, String>> {
    proptest::collection::hash_map(text(), quantity(), 0..4)
}

fn requirement() -> impl Strategy<Value = pb::NodeSelectorRequirement> {
    (
        text(),
        enum_value(),
        proptest::collection::vec(text(), 0..3),
    )
        .prop_map(|(key, operator, values)| pb::NodeSelectorRequirement {
            key,
            operator,
            values,
        })
}

fn capacity_need() -> impl Strategy<Value = pb::CapacityNeed> {
    (
        proptest::collection::vec(requirement(), 0..4),
        quantity_map(),
        any::<i32>(),
        proptest::collection::vec(
            (text(), any::<i32>(), enum_value()).prop_map(|(k, s, w)| pb::TopologySpread {
                topology_key: k,
                max_skew: s,
                when_unsatisfiable: w,
            }),
            0..3,
        ),
        (enum_value(), enum_value()),
        quantity_map(),
        text(),
    )
        .prop_map(
            |(requirements, agg, priority, spread, (ipb, rpb), min_unit, group)| pb::CapacityNeed {
                requirements,
                aggregate_resources: agg,
                priority,
                spread,
                interruption_penalty_bucket: ipb,
                reclamation_penalty_bucket: rpb,
                min_unit,
                group,
            },
        )
}

fn rollup() -> impl Strategy<Value = pb::ClusterCapacityNeeds> {
    (
        text(),
        any::<i64>(),
        proptest::collection::vec(capacity_need(), 0..4),
    )
        .prop_map(|(cluster_id, ts, needs)| pb::ClusterCapacityNeeds {
            cluster_id,
            timestamp_unix_nanos: ts,
            needs,
        })
}

fn resources_msg() -> impl Strategy<Value = Option<pb::Resources>> {
    proptest::option::of(quantity_map().prop_map(|m| pb::Resources {
        resources: m.into_iter().collect(),
    }))
}

fn machine() -> impl Strategy<Value = pb::Machine> {
    (
        (
            text(),
            enum_value(),
            proptest::option::of((text(), text())),
            text(),
            text(),
        ),
        (enum_value(), float(), float()),
        (resources_msg(), resources_msg()),
        (
            proptest::collection::btree_map(text(), text(), 0..3),
            text(),
            text(),
            proptest::collection::btree_map(text(), text(), 0..3),
        ),
    )
        .prop_map(
            |(
                (id, state, host, instance_type, zone),
                (capacity_type, price, prob),
                (resources, allocatable),
                (labels, last_error, cluster, shard_metadata),
            )| pb::Machine {
                id,
                state,
                host: host.map(|(provider, r)| pb::HostRef { provider, r#ref: r }),
                instance_type,
                zone,
                capacity_type,
                price_per_hour: price,
                interruption_probability: prob,
                resources,
                labels,
                last_error,
                allocatable,
                cluster,
                shard_metadata,
            },
        )
}

fn action() -> impl Strategy<Value = mesh::Action> {
    (
        (enum_value(), text(), text(), text(), text(), any::<i32>()),
        (float(), float(), any::<i64>(), any::<i32>()),
        (proptest::collection::vec(requirement(), 0..3), text()),
    )
        .prop_map(
            |(
                (kind, machine_id, cluster_id, fp, group, priority),
                (ip, rp, grace, preemptor),
                (requirements, reason),
            )| mesh::Action {
                kind,
                machine_id,
                cluster_id,
                need_fingerprint: fp,
                group,
                priority,
                interruption_penalty_dollars: ip,
                reclamation_penalty_dollars: rp,
                grace_seconds: grace,
                preemptor_priority: preemptor,
                requirements,
                reason,
            },
        )
}

const MACHINE_REASONS: [&str; 3] = ["price", "interruption_probability", "structural"];

fn check_rollup(msg: &pb::ClusterCapacityNeeds) -> Result<(), TestCaseError> {
    match rollup_from_proto(msg) {
        Ok(r) => {
            prop_assert_eq!(r.needs.len(), msg.needs.len());
            prop_assert_eq!(rollup_from_proto(&rollup_to_proto(&r)), Ok(r));
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            // Every roll-up rejection is counted under one of the fixed labels.
            prop_assert_eq!(ConvError::rollup_reason_label(e.reason()), Some(e.reason()));
            if let Some(i) = e.need_index() {
                prop_assert!(i < msg.needs.len());
            }
        }
    }
    Ok(())
}

fn check_machine(msg: &pb::Machine) -> Result<(), TestCaseError> {
    match machine_from_proto(msg) {
        Ok(m) => {
            prop_assert_eq!(m.invariant(), Ok(()));
            prop_assert_eq!(machine_from_proto(&machine_to_proto(&m)), Ok(m));
        }
        Err(e) => prop_assert!(MACHINE_REASONS.contains(&e.reason()), "{e:?}"),
    }
    Ok(())
}

fn check_action(msg: &mesh::Action) -> Result<(), TestCaseError> {
    if let Ok(a) = action_from_proto(msg) {
        prop_assert_eq!(action_from_proto(&action_to_proto(&a)), Ok(a));
    }
    Ok(())
}

fn check_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(m) = pb::ClusterCapacityNeeds::decode(bytes) {
        check_rollup(&m)?;
    }
    if let Ok(m) = pb::Machine::decode(bytes) {
        check_machine(&m)?;
    }
    if let Ok(list) = pb::MachineList::decode(bytes) {
        for m in &list.machines {
            check_machine(m)?;
        }
    }
    if let Ok(ack) = pb::TransitionAck::decode(bytes)
        && let Some(m) = &ack.machine
    {
        check_machine(m)?;
    }
    if let Ok(a) = mesh::Action::decode(bytes) {
        check_action(&a)?;
    }
    if let Ok(w) = mesh::WorkItem::decode(bytes) {
        if let Some(a) = &w.action {
            check_action(a)?;
        }
        if let Some(m) = &w.machine {
            check_machine(m)?;
        }
    }
    if let Ok(op) = pb::OperatorMessage::decode(bytes)
        && let Some(pb::operator_message::Payload::Rollup(r)) = &op.payload
    {
        check_rollup(r)?;
    }
    if let Ok(b) = pb::BootstrapRequest::decode(bytes) {
        let _ = requirements_from_proto(&b.requirements);
    }
    Ok(())
}

/// Flips bytes of an encoding at pseudo-random positions.
fn mutate(mut bytes: Vec<u8>, flips: &[(usize, u8)]) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(pos, x) in flips {
            let i = pos % bytes.len();
            bytes[i] ^= x;
        }
    }
    bytes
}

/// Cases per property: 512 in the test suite (a short, fixed run); set
/// `BIGFLEET_FUZZ_CASES` for a long run (docs/benchmarks.md, "fuzzing").
fn fuzz_cases() -> u32 {
    std::env::var("BIGFLEET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: fuzz_cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_rollups_never_panic(msg in rollup()) {
        check_rollup(&msg)?;
    }

    #[test]
    fn arbitrary_machines_never_panic(msg in machine()) {
        check_machine(&msg)?;
    }

    #[test]
    fn arbitrary_actions_never_panic(msg in action()) {
        check_action(&msg)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        check_bytes(&bytes)?;
    }

    #[test]
    fn mutated_encodings_never_panic(
        r in rollup(),
        m in machine(),
        a in action(),
        flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..4),
    ) {
        check_bytes(&mutate(r.encode_to_vec(), &flips))?;
        check_bytes(&mutate(m.encode_to_vec(), &flips))?;
        check_bytes(&mutate(a.encode_to_vec(), &flips))?;
        let op = pb::OperatorMessage { payload: Some(pb::operator_message::Payload::Rollup(r)) };
        check_bytes(&mutate(op.encode_to_vec(), &flips))?;
    }
}

/// A hand-picked corpus of hostile encodings that must decode-and-convert safely.
#[test]
fn hostile_corpus() {
    let huge_exponent = pb::ClusterCapacityNeeds {
        cluster_id: "c".into(),
        timestamp_unix_nanos: i64::MIN,
        needs: vec![pb::CapacityNeed {
            aggregate_resources: HashMap::from([
                ("cpu".into(), "9".repeat(5000)),
                ("mem".into(), format!("1e{}", "9".repeat(100))),
            ]),
            ..pb::CapacityNeed::default()
        }],
    };
    // The 5,000-byte quantity is over the string bound; without bounds the quantity
    // parser itself must still refuse it without panicking.
    assert_eq!(
        rollup_from_proto(&huge_exponent).unwrap_err().reason(),
        "limit_string_bytes"
    );
    assert_eq!(
        rollup_from_proto_with(&huge_exponent, &RollupLimits::UNBOUNDED)
            .unwrap_err()
            .reason(),
        "quantity"
    );
    let deep = pb::Machine {
        id: "x".repeat(100_000),
        state: i32::MIN,
        ..pb::Machine::default()
    };
    assert_eq!(
        machine_from_proto(&deep).unwrap_err().reason(),
        "structural"
    );
    for bytes in [
        &[0xff_u8; 64][..],
        &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        &[],
    ] {
        check_bytes(bytes).unwrap();
    }
}
