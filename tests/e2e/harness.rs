//! Shared plumbing of the end-to-end tests: a mesh of real `bigfleet svc` children in a
//! temp dir (the library's `bigfleet::up::local`), simulated operators, polling helpers,
//! and the children's logs printed when a test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use bigfleet::up::local::{FakeSeed, Mesh, MeshSpec, ProviderSpec, state_name};
use bigfleet_loadtest::{Demand, NeedSpec, Operator, OperatorConfig, OperatorHandle};
use bigfleet_proto::v1alpha1 as pb;

pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_bigfleet"))
}

pub fn catalog(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/catalogs")
        .join(name)
}

/// GPU pods of 8 GPUs (one machine each with the test catalogs) at `priority`.
pub fn gpu_units(units: u32, priority: i32) -> Demand {
    Demand::new(vec![NeedSpec::gpu(units, 8, priority)])
}

/// A mesh of real processes plus the operators a scenario starts.
pub struct Scenario {
    pub mesh: Option<Mesh>,
    pub operators: Vec<OperatorHandle>,
    dir: tempfile::TempDir,
}

impl Scenario {
    /// One shard over a fake provider seeded from `tests/catalogs/<catalog>`, with
    /// coordinator and inspect, decide cycling every 200 ms; `tweak` adjusts the spec.
    pub async fn start(catalog_file: &str, tweak: impl FnOnce(&mut MeshSpec)) -> Scenario {
        let dir = tempfile::Builder::new()
            .prefix("bf-e2e-")
            .tempdir()
            .expect("temp dir");
        let mut spec = MeshSpec::new(exe(), dir.path().join("run"));
        spec.provider = ProviderSpec::Fake(vec![FakeSeed::File(catalog(catalog_file))]);
        spec.decide_flags = vec!["--cycle-interval".into(), "200ms".into()];
        spec.env = vec![("RUST_LOG".into(), "info".into())];
        spec.ready_timeout = Duration::from_secs(120);
        spec.stop_timeout = Duration::from_secs(10);
        tweak(&mut spec);
        let mesh = match Mesh::start(spec).await {
            Ok(m) => m,
            Err(e) => panic!("mesh did not start: {e}"),
        };
        Scenario {
            mesh: Some(mesh),
            operators: Vec::new(),
            dir,
        }
    }

    pub fn mesh(&self) -> &Mesh {
        self.mesh.as_ref().expect("mesh running")
    }

    pub fn mesh_mut(&mut self) -> &mut Mesh {
        self.mesh.as_mut().expect("mesh running")
    }

    /// An operator for `cluster` on shard `shard`'s gateway (roll-ups every second, no
    /// churn); returns its index in `operators`.
    pub fn operator(&mut self, cluster: &str, demand: Demand) -> usize {
        let target = self.mesh().gateway_target(0);
        self.operator_at(cluster, &target, demand)
    }

    /// An operator for `cluster` dialling `target`.
    pub fn operator_at(&mut self, cluster: &str, target: &str, demand: Demand) -> usize {
        let mut cfg = OperatorConfig::new(cluster, target);
        cfg.rollup_interval = Duration::from_secs(1);
        cfg.demand = demand;
        cfg.tls = self
            .mesh()
            .client_tls(&format!("cluster/{cluster}"))
            .expect("tls");
        self.operators.push(Operator::spawn(cfg));
        self.operators.len() - 1
    }

    /// Every machine of shard 0's provider.
    pub async fn machines(&self) -> Vec<pb::Machine> {
        self.mesh().list_machines(0).await.expect("provider List")
    }

    /// Machines in `state` bound to `cluster` (any cluster when empty).
    pub async fn count(&self, state: pb::MachineState, cluster: &str) -> usize {
        self.ids(state, cluster).await.len()
    }

    /// Ids of the machines in `state` bound to `cluster` (any cluster when empty).
    pub async fn ids(&self, state: pb::MachineState, cluster: &str) -> BTreeSet<String> {
        in_state(&self.machines().await, state, cluster)
    }

    /// Waits up to `within` until exactly `n` machines are in `state` for `cluster` (any
    /// cluster when empty) and returns their ids; the panic shows every machine's state.
    pub async fn wait_for(
        &self,
        n: usize,
        state: pb::MachineState,
        cluster: &str,
        within: Duration,
    ) -> BTreeSet<String> {
        let what = format!("{n} {} in {cluster:?}", state_name(state as i32));
        wait_until(within, &what, async || {
            let m = self.machines().await;
            let ids = in_state(&m, state, cluster);
            if ids.len() == n {
                Ok(ids)
            } else {
                Err(format!("{} of them: {:?}", ids.len(), states(&m)))
            }
        })
        .await
    }

    /// `InspectNeeds` of `cluster` straight from shard 0's public port.
    pub async fn needs(&self, cluster: &str) -> Vec<pb::NeedView> {
        self.mesh()
            .inspect_needs(0, cluster)
            .await
            .expect("InspectNeeds")
            .1
    }

    /// A decide metric summed over label matches.
    pub async fn metric(&self, child: &str, name: &str, with: &[(&str, &str)]) -> f64 {
        let m = self.mesh().metrics(child).await.expect("metrics");
        bigfleet::up::probe::sum(&m, name, with)
    }

    /// Stops operators and the mesh (graceful); asserts every child stopped.
    pub async fn finish(mut self) {
        for o in self.operators.drain(..) {
            o.shutdown().await;
        }
        let mesh = self.mesh.take().expect("mesh running");
        let statuses = mesh.shutdown().await;
        for (name, status) in statuses {
            assert!(status.is_some(), "{name} still running after shutdown");
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The temp dir goes away with us: show what the children said.
            let logs = self.dir.path().join("run/logs");
            if let Ok(entries) = std::fs::read_dir(&logs) {
                for e in entries.flatten() {
                    let tail = bigfleet::up::child::tail_lines(&e.path(), 25);
                    eprintln!("----- {} -----", e.path().display());
                    for l in tail {
                        eprintln!("{l}");
                    }
                }
            }
        }
        // Children are killed on drop (kill_on_drop) if the test did not finish().
    }
}

pub use bigfleet_testkit::wait_until;

/// Ids of `machines` in `state` bound to `cluster` (any cluster when empty).
pub fn in_state(
    machines: &[pb::Machine],
    state: pb::MachineState,
    cluster: &str,
) -> BTreeSet<String> {
    machines
        .iter()
        .filter(|m| m.state == state as i32 && (cluster.is_empty() || m.cluster == cluster))
        .map(|m| m.id.clone())
        .collect()
}

/// `id → (STATE, cluster)` of a machine list.
pub fn states(machines: &[pb::Machine]) -> BTreeMap<String, (String, String)> {
    machines
        .iter()
        .map(|m| (m.id.clone(), (state_name(m.state), m.cluster.clone())))
        .collect()
}

/// A resource quantity of a `Resources` message (empty string when absent).
pub fn quantity(r: &Option<pb::Resources>, name: &str) -> String {
    r.as_ref()
        .and_then(|r| r.resources.get(name).cloned())
        .unwrap_or_default()
}

/// Every `*grpc*` key of a `bigfleet up` ports file, as (json path, address).
pub fn grpc_endpoints(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{path}.{k}");
                if k.contains("grpc")
                    && let Some(s) = x.as_str()
                {
                    out.push((p.clone(), s.to_owned()));
                }
                grpc_endpoints(x, &p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                grpc_endpoints(x, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}
