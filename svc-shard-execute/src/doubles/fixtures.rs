//! Machines and work items as decide hands them out, and flow timeouts short
//! enough for tests, shared by this crate's unit tests and its tests against
//! the real fake provider.

use std::collections::BTreeMap;
use std::time::Duration;

use bigfleet_model::{Machine as ModelMachine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;

use crate::{ExecConfig, RetryPolicy};

/// The need every fixture machine and acquire item is planned for.
pub const NEED_FINGERPRINT: &str = "fp-gpu";

/// A provider record of an 8-GPU on-demand machine in `state`: with a host
/// once it has hardware, and assigned to [`NEED_FINGERPRINT`] when it
/// belongs to a `cluster`.
pub fn machine(id: &str, state: MachineState, cluster: &str) -> pb::Machine {
    let has_host = !matches!(state, MachineState::Speculative | MachineState::Creating);
    let mut m = pb::Machine {
        id: id.to_owned(),
        state: i32::from(state.ordinal()),
        host: has_host.then(|| pb::HostRef {
            provider: "fake".into(),
            r#ref: id.to_owned(),
        }),
        instance_type: "gpu.8x".into(),
        zone: "zone-a".into(),
        capacity_type: pb::CapacityType::OnDemand as i32,
        price_per_hour: 2.5,
        interruption_probability: 0.01,
        resources: Some(pb::Resources {
            resources: BTreeMap::from([("nvidia.com/gpu".to_owned(), "8".to_owned())]),
        }),
        cluster: cluster.to_owned(),
        ..pb::Machine::default()
    };
    if !cluster.is_empty() {
        let assigned = ModelMachine {
            assigned_priority: 100,
            assigned_need_fingerprint: NEED_FINGERPRINT.to_owned(),
            ..ModelMachine::default()
        };
        m.shard_metadata = assigned.encode_shard_metadata().into_iter().collect();
    }
    m
}

/// A Provision or Bootstrap of `id` for `cluster`, planned for
/// [`NEED_FINGERPRINT`] on the `gpu.8x` instance type.
pub fn acquire(kind: mesh::ActionKind, id: &str, cluster: &str) -> mesh::Action {
    mesh::Action {
        kind: kind as i32,
        machine_id: id.to_owned(),
        cluster_id: cluster.to_owned(),
        need_fingerprint: NEED_FINGERPRINT.to_owned(),
        group: String::new(),
        priority: 500,
        interruption_penalty_dollars: 8.0,
        reclamation_penalty_dollars: 2.0,
        requirements: vec![pb::NodeSelectorRequirement {
            key: "node.kubernetes.io/instance-type".into(),
            operator: 1,
            values: vec!["gpu.8x".into()],
        }],
        ..mesh::Action::default()
    }
}

/// A Reclaim or Preempt of `id` out of `cluster`, without a grace period.
pub fn drain(kind: mesh::ActionKind, id: &str, cluster: &str, preemptor: i32) -> mesh::Action {
    mesh::Action {
        kind: kind as i32,
        machine_id: id.to_owned(),
        cluster_id: cluster.to_owned(),
        grace_seconds: 0,
        preemptor_priority: preemptor,
        ..mesh::Action::default()
    }
}

/// The flows' timeouts and retry backoff cut down so tests finish quickly: a 300 ms
/// blob wait, four attempts a few milliseconds apart.
pub fn fast_exec() -> ExecConfig {
    ExecConfig {
        action_timeout: Duration::from_secs(5),
        bootstrap_timeout: Duration::from_millis(300),
        call_timeout: Duration::from_secs(2),
        cleanup_timeout: Duration::from_secs(2),
        retry: RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(10),
            ..RetryPolicy::default()
        },
    }
}

/// A Release of `id`.
pub fn release(id: &str) -> mesh::Action {
    mesh::Action {
        kind: mesh::ActionKind::Release as i32,
        machine_id: id.to_owned(),
        ..mesh::Action::default()
    }
}
