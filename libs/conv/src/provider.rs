//! `provider.proto` ↔ model: machine records, states, capacity types.

use crate::capacity::{resources_at, resources_to_map};
use crate::error::ConvError;
use bigfleet_model::{CapacityType, Host, Machine, MachineProfile, MachineState, ResourceVector};
use bigfleet_proto::v1alpha1 as pb;

/// A wire `MachineState` ordinal.
pub fn machine_state_from_proto(value: i32) -> Result<MachineState, ConvError> {
    MachineState::from_ordinal(value).ok_or_else(|| ConvError::EnumOutOfRange {
        path: "state".to_owned(),
        enum_name: "MachineState",
        value,
    })
}

/// The wire ordinal of a state.
pub fn machine_state_to_proto(state: MachineState) -> i32 {
    i32::from(state.ordinal())
}

/// Converts a provider record (List/Get/TransitionAck) and enforces the
/// machine invariants: provider ingest "rejects loudly". Every error's
/// [`ConvError::reason`] is `price`, `interruption_probability` or `structural`.
/// Field-level problems (unknown enum, bad quantity, missing instance type)
/// are structural. `shard_metadata` is carried raw; decode it with
/// [`Machine::apply_shard_metadata`] for newly seen records.
pub fn machine_from_proto(m: &pb::Machine) -> Result<Machine, ConvError> {
    machine_from_proto_owned(m.clone())
}

/// [`machine_from_proto`] taking the record by value: its strings and maps
/// move into the model instead of being copied (reconcile decodes thousands
/// of records a cycle and drops the wire form right after).
pub fn machine_from_proto_owned(m: pb::Machine) -> Result<Machine, ConvError> {
    // Everything that can fail reads the record; only then do its fields move.
    let checked = check_fields(&m).map_err(|e| ConvError::InvalidMachine {
        id: m.id.clone(),
        source: Box::new(e),
    })?;
    let machine = into_machine(m, checked);
    machine.invariant()?;
    Ok(machine)
}

/// The parts of a record that need parsing, parsed.
struct Checked {
    state: MachineState,
    capacity_type: CapacityType,
    resources: ResourceVector,
    allocatable: ResourceVector,
}

fn check_fields(m: &pb::Machine) -> Result<Checked, ConvError> {
    let state = machine_state_from_proto(m.state)?;
    let capacity_type =
        CapacityType::from_ordinal(m.capacity_type).ok_or_else(|| ConvError::EnumOutOfRange {
            path: "capacity_type".to_owned(),
            enum_name: "CapacityType",
            value: m.capacity_type,
        })?;
    // Required by the provider contract: it is the primary matching attribute
    // and the key of the engine's per-type buckets.
    if m.instance_type.is_empty() {
        return Err(ConvError::EmptyField {
            path: "instance_type".to_owned(),
        });
    }
    Ok(Checked {
        state,
        capacity_type,
        resources: optional_resources("resources", m.resources.as_ref())?,
        allocatable: optional_resources("allocatable", m.allocatable.as_ref())?,
    })
}

fn into_machine(m: pb::Machine, c: Checked) -> Machine {
    let host = m
        .host
        .map(|h| Host {
            provider: h.provider,
            reference: h.r#ref,
        })
        .unwrap_or_default();
    Machine {
        id: m.id,
        state: c.state,
        host,
        cluster: m.cluster,
        profile: MachineProfile {
            instance_type: m.instance_type,
            zone: m.zone,
            capacity_type: c.capacity_type,
            resources: c.resources,
            labels: m.labels,
        },
        price_per_hour: m.price_per_hour,
        interruption_probability: m.interruption_probability,
        last_error: m.last_error,
        allocatable: c.allocatable,
        shard_metadata: m.shard_metadata,
        ..Machine::default()
    }
}

fn optional_resources(path: &str, r: Option<&pb::Resources>) -> Result<ResourceVector, ConvError> {
    match r {
        Some(r) => resources_at(path, &r.resources),
        None => Ok(ResourceVector::new()),
    }
}

/// The wire form of a machine record (what a provider returns). Assigned*
/// fields have no wire fields of their own: they travel in `shard_metadata`,
/// copied as-is.
pub fn machine_to_proto(m: &Machine) -> pb::Machine {
    pb::Machine {
        id: m.id.clone(),
        state: machine_state_to_proto(m.state),
        host: (!m.host.is_empty()).then(|| pb::HostRef {
            provider: m.host.provider.clone(),
            r#ref: m.host.reference.clone(),
        }),
        instance_type: m.profile.instance_type.clone(),
        zone: m.profile.zone.clone(),
        capacity_type: i32::from(m.profile.capacity_type.ordinal()),
        price_per_hour: m.price_per_hour,
        interruption_probability: m.interruption_probability,
        resources: resources_message(&m.profile.resources),
        labels: m
            .profile
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        last_error: m.last_error.clone(),
        allocatable: resources_message(&m.allocatable),
        cluster: m.cluster.clone(),
        shard_metadata: m
            .shard_metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// `None` for an empty vector, so "allocatable unset" survives a round trip.
pub fn resources_message(v: &ResourceVector) -> Option<pb::Resources> {
    (!v.is_empty()).then(|| pb::Resources {
        resources: resources_to_map(v),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::{InvariantError, StructuralViolation};

    fn configured() -> pb::Machine {
        pb::Machine {
            id: "m-1".into(),
            state: 5,
            host: Some(pb::HostRef {
                provider: "fake".into(),
                r#ref: "i-1".into(),
            }),
            instance_type: "gpu.8x".into(),
            zone: "zone-a".into(),
            capacity_type: 3,
            price_per_hour: 6.0,
            interruption_probability: 0.0,
            resources: Some(pb::Resources {
                resources: std::collections::BTreeMap::from([(
                    "nvidia.com/gpu".into(),
                    "8".into(),
                )]),
            }),
            labels: std::collections::BTreeMap::from([("rack".into(), "r1".into())]),
            last_error: String::new(),
            allocatable: None,
            cluster: "c1".into(),
            shard_metadata: std::collections::BTreeMap::from([(
                "bigfleet.lucy.sh/assigned-priority".into(),
                "7".into(),
            )]),
        }
    }

    fn reason_of(edit: impl FnOnce(&mut pb::Machine)) -> (&'static str, ConvError) {
        let mut m = configured();
        edit(&mut m);
        let err = machine_from_proto(&m).unwrap_err();
        (err.reason(), err)
    }

    #[test]
    fn converts_a_good_record() {
        let m = machine_from_proto(&configured()).unwrap();
        assert_eq!(m.state, MachineState::Configured);
        assert_eq!(m.host.reference, "i-1");
        assert_eq!(m.profile.capacity_type, CapacityType::OnDemand);
        assert_eq!(m.profile.resources.get("nvidia.com/gpu"), 8_000);
        assert_eq!(m.effective_allocatable().get("nvidia.com/gpu"), 8_000);
        assert_eq!(m.profile.labels["rack"], "r1");
        assert_eq!(m.shard_metadata["bigfleet.lucy.sh/assigned-priority"], "7");
        // Metadata is carried raw; decoding is the shard's decision.
        assert_eq!(m.assigned_priority, 0);
        assert_eq!(machine_to_proto(&m), configured());
    }

    #[test]
    fn invariant_rejections_carry_their_reason() {
        for (edit, want) in [
            (
                Box::new(|m: &mut pb::Machine| m.price_per_hour = f64::NAN)
                    as Box<dyn FnOnce(&mut pb::Machine)>,
                "price",
            ),
            (
                Box::new(|m: &mut pb::Machine| m.price_per_hour = -1.0),
                "price",
            ),
            (
                Box::new(|m: &mut pb::Machine| m.interruption_probability = 1.5),
                "interruption_probability",
            ),
            (
                Box::new(|m: &mut pb::Machine| m.interruption_probability = f64::NAN),
                "interruption_probability",
            ),
            (
                Box::new(|m: &mut pb::Machine| m.cluster.clear()),
                "structural",
            ),
            (Box::new(|m: &mut pb::Machine| m.host = None), "structural"),
            (Box::new(|m: &mut pb::Machine| m.state = 0), "structural"),
            (Box::new(|m: &mut pb::Machine| m.id.clear()), "structural"),
            (Box::new(|m: &mut pb::Machine| m.state = 8), "structural"),
            (Box::new(|m: &mut pb::Machine| m.state = 1), "structural"),
        ] {
            let (reason, err) = reason_of(edit);
            assert_eq!(reason, want, "{err}");
            assert!(matches!(err, ConvError::Invariant(_)), "{err:?}");
        }
        let (_, err) = reason_of(|m| m.cluster.clear());
        assert_eq!(
            err,
            ConvError::Invariant(InvariantError::Structural {
                id: "m-1".into(),
                violation: StructuralViolation::ClusterRequired(MachineState::Configured)
            })
        );
    }

    #[test]
    fn unreadable_fields_are_structural() {
        for (edit, path) in [
            (
                Box::new(|m: &mut pb::Machine| m.state = 9) as Box<dyn FnOnce(&mut pb::Machine)>,
                "state",
            ),
            (Box::new(|m: &mut pb::Machine| m.state = -3), "state"),
            (
                Box::new(|m: &mut pb::Machine| m.capacity_type = 5),
                "capacity_type",
            ),
            (
                Box::new(|m: &mut pb::Machine| m.instance_type.clear()),
                "instance_type",
            ),
            (
                Box::new(|m: &mut pb::Machine| {
                    m.resources
                        .as_mut()
                        .unwrap()
                        .resources
                        .insert("cpu".into(), "x".into());
                }),
                "resources[\"cpu\"]",
            ),
            (
                Box::new(|m: &mut pb::Machine| {
                    m.allocatable = Some(pb::Resources {
                        resources: std::collections::BTreeMap::from([(
                            "memory".into(),
                            "-1Gi".into(),
                        )]),
                    });
                }),
                "allocatable[\"memory\"]",
            ),
        ] {
            let (reason, err) = reason_of(edit);
            assert_eq!(reason, "structural", "{err}");
            assert_eq!(err.path(), Some(path));
            assert!(matches!(&err, ConvError::InvalidMachine { id, .. } if id == "m-1"));
            assert!(err.to_string().contains("m-1"));
        }
    }

    #[test]
    fn speculative_and_failed_shapes() {
        let spec = pb::Machine {
            id: "s-1".into(),
            state: 1,
            instance_type: "cpu.4x".into(),
            capacity_type: 4,
            price_per_hour: 0.4,
            interruption_probability: 0.05,
            ..pb::Machine::default()
        };
        let m = machine_from_proto(&spec).unwrap();
        assert!(m.host.is_empty() && m.allocatable.is_empty());
        assert_eq!(machine_to_proto(&m), spec);
        let failed = pb::Machine {
            state: 8,
            last_error: "create timed out".into(),
            ..spec.clone()
        };
        assert_eq!(
            machine_from_proto(&failed).unwrap().state,
            MachineState::Failed
        );
        let failed_silent = pb::Machine { state: 8, ..spec };
        assert_eq!(
            machine_from_proto(&failed_silent).unwrap_err().reason(),
            "structural"
        );
    }

    #[test]
    fn state_enum_helpers() {
        for s in MachineState::ALL {
            assert_eq!(machine_state_from_proto(machine_state_to_proto(s)), Ok(s));
        }
        assert_eq!(
            machine_state_from_proto(9).unwrap_err().reason(),
            "enum_out_of_range"
        );
    }
}
