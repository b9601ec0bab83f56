//! Shared fixtures: the fake capacity provider served over a Unix socket, and a decide
//! instance serving its gRPC API on another one.

use bigfleet_fake_provider::{FakeProvider, ListFault, ProviderConfig, ServerHandle, spawn_uds};
use bigfleet_mesh::BareServer;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::ingest_client::IngestClient;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::Readiness;
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use svc_shard_decide_core::shard::Clock;
use svc_shard_decide_core::{
    Decide, DecideConfig, DecideService, ProviderClient, Publisher, RailsConfig, ShardMetrics, edge,
};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Status;
use tonic::transport::{Channel, Endpoint, Server};

/// A channel to a Unix socket.
pub fn uds_channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::from_static("http://local.invalid").connect_with_connector_lazy(tower::service_fn(
        move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        },
    ))
}

/// An empty provider (the one fake, `bigfleet-fake-provider`); tests add machines with
/// `add_machine`, change them behind decide's back with `update_machine` /
/// `remove_machine`, and script hostile Lists with `script_lists`.
pub fn provider() -> Arc<FakeProvider> {
    Arc::new(FakeProvider::new(ProviderConfig::default()))
}

/// The provider's List fails until `clear_list_script`: more failures than any test lists
/// and more than the client's retries.
pub fn list_down(p: &FakeProvider) {
    p.script_lists(std::iter::repeat_n(ListFault::Unavailable, 1000));
}

/// Serves `p` on a fresh socket in `dir`; returns the path and the server (stops on drop).
pub async fn serve_provider(dir: &Path, p: Arc<FakeProvider>) -> (PathBuf, ServerHandle) {
    let path = dir.join("provider.sock");
    let server = spawn_uds(&path, p).await.expect("serve the fake provider");
    (path, server)
}

/// A valid provider record.
#[allow(unused_imports)] // each test binary uses a different subset
pub use svc_shard_decide_core::testing::provider_machine as pm;

/// `n` Idle machines, the `i`th named `name(i)`.
pub fn idle_fleet(n: usize, name: impl Fn(usize) -> String) -> impl Iterator<Item = pb::Machine> {
    (0..n).map(move |i| pm(&name(i), pb::MachineState::Idle, ""))
}

/// A need for `cpu` cores on m5.xlarge machines.
pub fn need(cpu: u32, priority: i32) -> pb::CapacityNeed {
    svc_shard_decide_core::testing::need_on("m5.xlarge", cpu, priority)
}

pub fn rollup(cluster: &str, needs: Vec<pb::CapacityNeed>) -> mesh::ApplyRollupRequest {
    svc_shard_decide_core::testing::rollup_request(cluster, 1, needs)
}

pub struct Harness {
    /// Holds the sockets' temp dir for as long as the harness lives.
    _dir: tempfile::TempDir,
    pub provider: Arc<FakeProvider>,
    pub decide: Decide,
    pub events: svc_shard_decide_core::Events,
    pub decide_sock: PathBuf,
    pub readiness: Readiness,
    _provider_server: ServerHandle,
    _decide_server: BareServer,
}

impl Harness {
    pub async fn start(cfg: DecideConfig) -> Harness {
        Self::start_with(cfg, provider()).await
    }

    /// A harness whose provider starts out listing `machines`.
    pub async fn listing(
        cfg: DecideConfig,
        machines: impl IntoIterator<Item = pb::Machine>,
    ) -> Harness {
        let provider = provider();
        for m in machines {
            provider.add_machine(m).unwrap();
        }
        Self::start_with(cfg, provider).await
    }

    pub async fn start_with(cfg: DecideConfig, provider: Arc<FakeProvider>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let (provider_sock, provider_server) = serve_provider(dir.path(), provider.clone()).await;
        let (publisher, events) = Publisher::channel(100_000);
        let readiness = Readiness::not_ready("first provider reconcile not yet complete");
        let decide = Decide::new(
            cfg,
            Arc::new(ProviderClient::new(bigfleet_mesh::client_stack(
                uds_channel(&provider_sock),
                &bigfleet_mesh::ClientStackConfig::default(),
            ))),
            publisher,
            ShardMetrics::unregistered(),
            readiness.clone(),
        )
        .unwrap();
        let decide_sock = dir.path().join("decide.sock");
        let listener = UnixListener::bind(&decide_sock).unwrap();
        let svc = DecideService::new(decide.clone());
        let decide_server = BareServer::spawn(
            Server::builder()
                .add_service(svc.ingest_server())
                .add_service(svc.work_server())
                .add_service(svc.shard_read_server())
                .add_service(svc.shard_info_server()),
            UnixListenerStream::new(listener),
        );
        Harness {
            _dir: dir,
            provider,
            decide,
            events,
            decide_sock,
            readiness,
            _provider_server: provider_server,
            _decide_server: decide_server,
        }
    }

    pub fn client(&self) -> WorkClient<Channel> {
        WorkClient::new(uds_channel(&self.decide_sock))
    }

    /// The gateway's contract (roll-ups, session events) on decide.sock.
    pub fn ingest(&self) -> IngestClient<Channel> {
        IngestClient::new(uds_channel(&self.decide_sock))
    }

    /// Every frame published so far.
    pub fn drain_events(&mut self) -> Vec<mesh::ShardEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }
}

/// Rails off, queue large: the engine's answer is what executes.
pub fn cfg_rails_off() -> DecideConfig {
    DecideConfig {
        rails: RailsConfig::off(),
        engine_threads: 1,
        queue_capacity: 100_000,
        ..DecideConfig::default()
    }
}

#[allow(unused_imports)] // each test binary uses a different subset
pub use svc_shard_decide_core::testing::TestWorker;

/// A transition request for an item's machine.
pub fn transition(
    item: &mesh::WorkItem,
    from: pb::MachineState,
    to: pb::MachineState,
    patch: mesh::MachinePatch,
) -> mesh::TransitionRequest {
    mesh::TransitionRequest {
        machine_id: item.action.as_ref().unwrap().machine_id.clone(),
        from_state: from as i32,
        to_state: to as i32,
        patch: Some(patch),
        reason: "test".into(),
        action_id: item.action_id.clone(),
    }
}

/// The worker reports over the Work API that `item`'s machine went `from` → `to`;
/// decide's machine after the change.
pub async fn report(
    client: &mut WorkClient<Channel>,
    item: &mesh::WorkItem,
    from: pb::MachineState,
    to: pb::MachineState,
    patch: mesh::MachinePatch,
) -> Result<pb::Machine, Status> {
    let answer = client.transition(transition(item, from, to, patch)).await?;
    Ok(answer
        .into_inner()
        .machine
        .expect("a transition answers with the machine"))
}

/// The worker starts a reclaim over the Work API: `item`'s machine Configured → Draining.
pub async fn begin_drain(
    client: &mut WorkClient<Channel>,
    item: &mesh::WorkItem,
) -> Result<pb::Machine, Status> {
    use pb::MachineState as S;
    report(client, item, S::Configured, S::Draining, Default::default()).await
}

/// The worker starts a provision: `item`'s machine Idle → Configuring into `cluster`,
/// for the need its action names.
pub async fn start_configuring(
    client: &mut WorkClient<Channel>,
    item: &mesh::WorkItem,
    cluster: &str,
) -> Result<pb::Machine, Status> {
    let patch = mesh::MachinePatch {
        cluster: Some(cluster.to_owned()),
        assigned_need_fingerprint: Some(item.action.as_ref().unwrap().need_fingerprint.clone()),
        ..Default::default()
    };
    report(
        client,
        item,
        pb::MachineState::Idle,
        pb::MachineState::Configuring,
        patch,
    )
    .await
}

/// The provider as a map the test edits, listed in process (no socket): for tests
/// that drive `Decide` directly on a simulated clock.
#[allow(unused_imports)] // each test binary uses a different subset
pub use svc_shard_decide_core::testing::MapSource;

/// A decide over `source` whose clock reads `clock` (nanoseconds since the epoch).
pub fn decide_on_clock(
    cfg: DecideConfig,
    source: impl svc_shard_decide_core::MachineSource,
    clock: &Arc<AtomicI64>,
) -> Decide {
    let c = Arc::clone(clock);
    let clock: Clock = Arc::new(move || c.load(Ordering::SeqCst));
    svc_shard_decide_core::testing::decide_on_clock(cfg, Arc::new(source), clock)
}

/// The simulated worker starts a reclaim: Configured → Draining, at decide and at the
/// provider.
pub async fn start_draining(d: &Decide, source: &MapSource, item: &mesh::WorkItem) {
    use pb::MachineState as S;
    worker_moves(d, source, item, S::Configured, S::Draining).await;
}

/// The simulated worker finishes a reclaim: Draining → Idle and unbound, at decide and
/// at the provider.
pub async fn finish_draining(d: &Decide, source: &MapSource, item: &mesh::WorkItem) {
    use pb::MachineState as S;
    worker_moves(d, source, item, S::Draining, S::Idle).await;
}

/// The worker's transition with no patch, reported to decide and then made at the
/// provider (which, like a real one, drops the assignment of an Idle machine).
async fn worker_moves(
    d: &Decide,
    source: &MapSource,
    item: &mesh::WorkItem,
    from: pb::MachineState,
    to: pb::MachineState,
) {
    let request = transition(item, from, to, mesh::MachinePatch::default());
    edge::transition(d, &request).await.unwrap();
    source.update(&request.machine_id, |m| {
        m.state = to as i32;
        if to == pb::MachineState::Idle {
            m.cluster.clear();
            m.shard_metadata.clear();
        }
    });
}
