//! A shard around the worker: the Decide and Gateway doubles and the real
//! fake provider, each on a Unix socket in a temp dir.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_fake_provider::{FakeProvider, ProviderConfig, ServerHandle, spawn_uds};
use bigfleet_model::{Machine as ModelMachine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::wait_until;
use svc_shard_execute::doubles::{DecideDouble, GatewayDouble, Served};
use svc_shard_execute::{Config, ExecConfig, RetryPolicy};
use tempfile::TempDir;

pub const SHARD: &str = "shard-a";
pub const EPOCH: i64 = 3;
pub const FP: &str = "fp-gpu";
/// How long any test waits for the worker.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct Mesh {
    pub dir: TempDir,
    pub decide: DecideDouble,
    pub decide_srv: Option<Served>,
    pub gateway: GatewayDouble,
    pub gateway_srv: Served,
    pub provider: Arc<FakeProvider>,
    pub provider_srv: ServerHandle,
}

pub async fn mesh(config: ProviderConfig) -> Mesh {
    let dir = tempfile::Builder::new()
        .prefix("bf-exec")
        .tempdir()
        .unwrap();
    let decide = DecideDouble::new(SHARD, EPOCH);
    let decide_srv = decide.serve_uds(&dir.path().join("decide.sock")).unwrap();
    let gateway = GatewayDouble::default();
    let gateway_srv = gateway.serve_uds(&dir.path().join("gateway.sock")).unwrap();
    let provider = Arc::new(FakeProvider::new(config));
    let provider_srv = spawn_uds(&dir.path().join("provider.sock"), Arc::clone(&provider))
        .await
        .unwrap();
    Mesh {
        dir,
        decide,
        decide_srv: Some(decide_srv),
        gateway,
        gateway_srv,
        provider,
        provider_srv,
    }
}

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

impl Mesh {
    pub fn decide_uri(&self) -> String {
        format!("unix://{}", self.dir.path().join("decide.sock").display())
    }

    /// A worker config for this mesh.
    pub fn config(&self, worker: &str, concurrency: u32) -> Config {
        let mut cfg = Config::new(
            &self.decide_uri(),
            &self.gateway_srv.uri(),
            &self.provider_srv.target(),
        );
        cfg.shard_id = SHARD.to_owned();
        cfg.worker_id = worker.to_owned();
        cfg.concurrency = concurrency;
        cfg.exec = fast_exec();
        cfg.drain_timeout = Duration::from_secs(5);
        cfg
    }

    /// The machine in both decide's inventory and the provider.
    pub fn seed(&self, m: pb::Machine) {
        self.decide.insert_machine(&m).unwrap();
        self.provider.add_machine(m).unwrap();
    }

    pub fn provider_state(&self, id: &str) -> pb::MachineState {
        pb::MachineState::try_from(self.provider.get(id).unwrap().state).unwrap()
    }

    pub fn decide_state(&self, id: &str) -> MachineState {
        self.decide.state_of(id).unwrap()
    }

    pub async fn wait_dones(&self, n: usize) {
        wait_until(WAIT, "dones", async || {
            let have = self.decide.done_count();
            if have >= n {
                Ok(())
            } else {
                Err(format!("{have} of {n}: {:?}", self.decide.dones()))
            }
        })
        .await;
    }
}

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
            assigned_need_fingerprint: FP.to_owned(),
            ..ModelMachine::default()
        };
        m.shard_metadata = assigned.encode_shard_metadata().into_iter().collect();
    }
    m
}

pub fn acquire(kind: mesh::ActionKind, id: &str, cluster: &str) -> mesh::Action {
    mesh::Action {
        kind: kind as i32,
        machine_id: id.to_owned(),
        cluster_id: cluster.to_owned(),
        need_fingerprint: FP.to_owned(),
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

pub fn provision(id: &str, cluster: &str) -> mesh::Action {
    acquire(mesh::ActionKind::Provision, id, cluster)
}

pub fn bootstrap(id: &str, cluster: &str) -> mesh::Action {
    acquire(mesh::ActionKind::Bootstrap, id, cluster)
}

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

pub fn release(id: &str) -> mesh::Action {
    mesh::Action {
        kind: mesh::ActionKind::Release as i32,
        machine_id: id.to_owned(),
        ..mesh::Action::default()
    }
}
