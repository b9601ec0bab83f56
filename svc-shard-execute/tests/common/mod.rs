//! A shard around the worker: the Decide and Gateway doubles and the real
//! fake provider, each on a Unix socket in a temp dir.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_fake_provider::{FakeProvider, ProviderConfig, ServerHandle, spawn_uds};
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::wait_until;
// Each test binary uses its own subset, as with the rest of this module.
use svc_shard_execute::Config;
#[allow(unused_imports)]
pub use svc_shard_execute::doubles::fixtures::{acquire, drain, fast_exec, machine, release};
use svc_shard_execute::doubles::{DecideDouble, GatewayDouble, Served};
use tempfile::TempDir;

pub const SHARD: &str = "shard-a";
pub const EPOCH: i64 = 3;
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

pub fn provision(id: &str, cluster: &str) -> mesh::Action {
    acquire(mesh::ActionKind::Provision, id, cluster)
}

pub fn bootstrap(id: &str, cluster: &str) -> mesh::Action {
    acquire(mesh::ActionKind::Bootstrap, id, cluster)
}
