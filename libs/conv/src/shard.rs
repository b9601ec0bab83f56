//! Model → `shard.proto` frames the shard sends to operators.

use crate::capacity::requirements_to_proto;
use crate::provider::{machine_state_to_proto, resources_message};
use bigfleet_model::{Action, INSTANCE_TYPE_KEY, Machine, Requirement, ZONE_KEY};
use bigfleet_proto::v1alpha1 as pb;

/// The coalescing key of a machine's updates: a newer frame with the same key
/// replaces a queued older one.
pub fn node_supersedes_key(machine_id: &str) -> String {
    format!("node:{machine_id}")
}

/// The update sent to `cluster_id`'s operator after a transition of a machine
/// bound to it. The caller passes the cluster captured BEFORE the transition,
/// so Draining → Idle still reaches the old cluster. Labels are the machine's
/// labels plus the instance-type and zone labels; resources are the effective
/// allocatable.
pub fn node_state_update(machine: &Machine, cluster_id: &str) -> pb::NodeStateUpdate {
    let p = &machine.profile;
    let mut labels: std::collections::HashMap<String, String> = p
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !p.instance_type.is_empty() {
        labels.insert(INSTANCE_TYPE_KEY.to_owned(), p.instance_type.clone());
    }
    if !p.zone.is_empty() {
        labels.insert(ZONE_KEY.to_owned(), p.zone.clone());
    }
    pb::NodeStateUpdate {
        supersedes_key: node_supersedes_key(&machine.id),
        machine_id: machine.id.clone(),
        cluster_id: cluster_id.to_owned(),
        state: machine_state_to_proto(machine.state),
        node_name: String::new(),
        provider_id: machine.host.reference.clone(),
        last_error: machine.last_error.clone(),
        labels,
        resources: resources_message(machine.effective_allocatable()),
        taints: Vec::new(),
    }
}

/// The operator-side half of a Reclaim or Preempt: cordon and drain the
/// machine's node within the action's grace. `None` for other kinds.
pub fn reclaim_instruction(
    action: &Action,
    instruction_id: impl Into<String>,
) -> Option<pb::ReclaimInstruction> {
    let grace = action.grace()?;
    Some(pb::ReclaimInstruction {
        instruction_id: instruction_id.into(),
        nodes: vec![action.machine_id().to_owned()],
        grace_period_seconds: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        preemptor_priority: action.preemptor_priority(),
    })
}

/// The bootstrap-blob request for a machine joining `cluster_id`.
pub fn bootstrap_request(
    request_id: impl Into<String>,
    cluster_id: impl Into<String>,
    requirements: &[Requirement],
) -> pb::BootstrapRequest {
    pb::BootstrapRequest {
        request_id: request_id.into(),
        requirements: requirements_to_proto(requirements),
        cluster_id: cluster_id.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::{MachineState, Operator, ResourceVector};
    use std::time::Duration;

    #[test]
    fn node_state_update_fields() {
        let mut m = Machine {
            id: "m-1".into(),
            state: MachineState::Draining,
            cluster: "c1".into(),
            last_error: String::new(),
            ..Machine::default()
        };
        m.host.reference = "i-123".into();
        m.profile.instance_type = "gpu.8x".into();
        m.profile.zone = "zone-a".into();
        m.profile.labels.insert("rack".into(), "r1".into());
        m.profile.resources = ResourceVector::from_milli([("cpu", 96_000)]);
        m.allocatable = ResourceVector::from_milli([("cpu", 94_500)]);
        let u = node_state_update(&m, "old-cluster");
        assert_eq!(u.supersedes_key, "node:m-1");
        assert_eq!(u.machine_id, "m-1");
        assert_eq!(u.cluster_id, "old-cluster");
        assert_eq!(u.state, 6);
        assert_eq!(u.provider_id, "i-123");
        assert_eq!(u.labels[INSTANCE_TYPE_KEY], "gpu.8x");
        assert_eq!(u.labels[ZONE_KEY], "zone-a");
        assert_eq!(u.labels["rack"], "r1");
        assert_eq!(u.resources.unwrap().resources["cpu"], "94500m");
    }

    #[test]
    fn reclaim_instruction_only_for_drains() {
        let preempt = Action::Preempt {
            machine_id: "m-2".into(),
            cluster: "batch".into(),
            grace: Duration::from_secs(30),
            preemptor_priority: 1_000_000,
        };
        let r = reclaim_instruction(&preempt, "abcd").unwrap();
        assert_eq!(r.instruction_id, "abcd");
        assert_eq!(r.nodes, ["m-2"]);
        assert_eq!(r.grace_period_seconds, 30);
        assert_eq!(r.preemptor_priority, 1_000_000);
        let reclaim = Action::Reclaim {
            machine_id: "m-3".into(),
            cluster: "c".into(),
            grace: Duration::from_secs(600),
        };
        let r = reclaim_instruction(&reclaim, "x").unwrap();
        assert_eq!((r.grace_period_seconds, r.preemptor_priority), (600, 0));
        assert!(
            reclaim_instruction(
                &Action::Release {
                    machine_id: "m".into()
                },
                "y"
            )
            .is_none()
        );
    }

    #[test]
    fn bootstrap_request_carries_requirements() {
        let reqs = [Requirement::new("rack", Operator::In, ["r2", "r1"])];
        let b = bootstrap_request("id-1", "c1", &reqs);
        assert_eq!(b.request_id, "id-1");
        assert_eq!(b.cluster_id, "c1");
        assert_eq!(b.requirements[0].values, ["r1", "r2"]);
        assert_eq!(b.requirements[0].operator, 1);
        assert_eq!(
            crate::capacity::requirements_from_proto(&b.requirements).unwrap(),
            reqs
        );
    }
}
