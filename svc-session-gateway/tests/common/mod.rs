//! A gateway and a Decide double over a Unix socket, plus a raw operator client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_fake_provider::{Catalog, FakeProvider, ProviderConfig, ServerHandle};
use bigfleet_identity::TlsContext;
use bigfleet_loadtest::decide_stub::{DecideStub, StubConfig, StubState};
use bigfleet_mesh::{ChannelConfig, RunningServer, Target};
use bigfleet_proto::mesh::v1 as meshpb;
use bigfleet_proto::mesh::v1::outbox_client::OutboxClient;
use bigfleet_proto::mesh::v1::relay_client::RelayClient;
use bigfleet_proto::v1alpha1::shard_client::ShardClient;
use bigfleet_proto::v1alpha1::{
    Acknowledgement, BootstrapRequest, Hello, OperatorMessage, ShardMessage, operator_message,
    shard_message,
};
use svc_session_gateway::{GatewayConfig, GatewaySettings, RollupRate, Running};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

pub const EPOCH: i64 = 42;
pub const TERM: i64 = 7;

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub stub: Arc<StubState>,
    pub stub_server: Option<RunningServer>,
    pub gateway: Option<Running>,
    pub addr: SocketAddr,
}

pub struct Options {
    pub settings: GatewaySettings,
    pub stub: StubConfig,
    pub tls: Option<TlsContext>,
    pub listen: SocketAddr,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            settings: GatewaySettings {
                // Most tests send roll-ups back to back; the rate limit has its own test.
                rollup_rate: RollupRate {
                    per_second: 0.0,
                    burst: 1,
                },
                ..GatewaySettings::default()
            },
            stub: StubConfig {
                shard_epoch: EPOCH,
                coordinator_term: TERM,
                ..StubConfig::default()
            },
            tls: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

impl Harness {
    pub async fn start(opts: Options) -> Self {
        let dir = bigfleet_testkit::temp_dir("bfgw").unwrap();
        let stub = DecideStub::new(opts.stub);
        let state = stub.state();
        let stub_server = stub
            .serve_unix(&dir.path().join("decide.sock"))
            .await
            .unwrap();
        let mut cfg = GatewayConfig::new(dir.path());
        cfg.settings = opts.settings;
        cfg.tls = opts.tls;
        cfg.listen = Some(opts.listen);
        cfg.drain_timeout = Duration::from_secs(2);
        let gateway = svc_session_gateway::start(cfg).await.unwrap();
        let addr = gateway.public_addr().unwrap();
        Self {
            dir,
            stub: state,
            stub_server: Some(stub_server),
            gateway: Some(gateway),
            addr,
        }
    }

    pub fn gw(&self) -> &Running {
        self.gateway.as_ref().unwrap()
    }

    pub fn target(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Both internal contracts over gateway.sock (how decide and sidecar workers call it).
    pub async fn gateway_client(&self) -> InternalClient {
        let target = Target::Unix(self.gw().socket_path().to_path_buf());
        let ch = bigfleet_mesh::connect(&target, &ChannelConfig::default())
            .await
            .unwrap();
        InternalClient {
            outbox: OutboxClient::new(ch.clone()),
            relay: RelayClient::new(ch),
        }
    }

    /// Decide holds `cluster`'s first roll-up (timestamp 1), the last known good one, and
    /// has been sent nothing else.
    pub fn assert_only_the_first_rollup_forwarded(&self, cluster: &str) {
        let held = self.stub.rollup(cluster).map(|r| r.timestamp_unix_nanos);
        assert_eq!(held, Some(1), "last-known-good kept");
        let applied = self.stub.applied.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(applied, 1, "never forwarded");
    }

    /// Waits for every session to be removed.
    pub async fn wait_no_sessions(&self) {
        bigfleet_testkit::wait_until(WAIT, "the session to be removed", async || {
            self.gw().active_sessions() == 0
        })
        .await;
    }

    pub async fn stop(mut self) {
        if let Some(g) = self.gateway.take() {
            g.shutdown().await.unwrap();
        }
        if let Some(s) = self.stub_server.take() {
            s.shutdown().await.unwrap();
        }
    }
}

/// The operator side of a session, frame by frame.
pub struct RawSession {
    pub tx: mpsc::Sender<OperatorMessage>,
    pub rx: Streaming<ShardMessage>,
}

pub fn hello(cluster: &str) -> OperatorMessage {
    OperatorMessage {
        payload: Some(operator_message::Payload::Hello(Hello {
            cluster_id: cluster.to_owned(),
            protocol_version: "v1alpha1".to_owned(),
        })),
    }
}

pub fn msg(p: operator_message::Payload) -> OperatorMessage {
    OperatorMessage { payload: Some(p) }
}

pub async fn channel(target: &str, tls: Option<&TlsContext>) -> Channel {
    let cfg = ChannelConfig::default().with_tls(tls.map(|t| t.client_config().unwrap()));
    bigfleet_mesh::connect(&target.parse().unwrap(), &cfg)
        .await
        .unwrap()
}

/// Opens a session whose first frame is `first`.
pub async fn open_with(channel: Channel, first: OperatorMessage) -> Result<RawSession, Status> {
    let (tx, rx) = mpsc::channel(64);
    tx.send(first).await.unwrap();
    let mut client = ShardClient::new(channel);
    let resp = client.session(ReceiverStream::new(rx)).await?;
    Ok(RawSession {
        tx,
        rx: resp.into_inner(),
    })
}

/// Opens a session that must be refused (`why` names the case), checks the refusal's
/// `code` and that its message contains `says`, and returns it.
pub async fn refused_open(
    channel: Channel,
    first: OperatorMessage,
    why: &str,
    code: tonic::Code,
    says: &str,
) -> Status {
    let Err(err) = open_with(channel, first).await else {
        panic!("{why}: the session was opened");
    };
    assert_eq!(err.code(), code, "{why}: {err:?}");
    assert!(err.message().contains(says), "{why}: {}", err.message());
    err
}

/// A RequestBootstrap for `cluster` that waits up to `timeout_ms` (0: the gateway's
/// default).
pub fn ask_bootstrap(cluster: &str, timeout_ms: u32) -> meshpb::RequestBootstrapRequest {
    meshpb::RequestBootstrapRequest {
        cluster_id: cluster.into(),
        timeout_ms,
        ..Default::default()
    }
}

/// How long [`RawSession::next`] waits for a frame the gateway sends at once.
pub const FRAME_WAIT: Duration = Duration::from_secs(5);

/// Opens a plaintext session for `cluster` and reads the hello ack.
pub async fn open(target: &str, cluster: &str) -> RawSession {
    let mut s = open_with(channel(target, None).await, hello(cluster))
        .await
        .unwrap();
    let ack = s.next_ack().await;
    assert_eq!(ack.echo, "hello");
    s
}

impl RawSession {
    pub async fn send(&self, m: OperatorMessage) {
        self.tx.send(m).await.unwrap();
    }

    /// The next frame (fails the test after [`FRAME_WAIT`]).
    pub async fn next(&mut self) -> Result<Option<ShardMessage>, Status> {
        self.next_within(FRAME_WAIT).await
    }

    /// The next frame, failing the test after `wait`: for frames that follow slow work.
    pub async fn next_within(&mut self, wait: Duration) -> Result<Option<ShardMessage>, Status> {
        tokio::time::timeout(wait, self.rx.message())
            .await
            .unwrap_or_else(|_| panic!("no frame within {wait:?}"))
    }

    pub async fn next_payload(&mut self) -> shard_message::Payload {
        self.next_payload_within(FRAME_WAIT).await
    }

    pub async fn next_payload_within(&mut self, wait: Duration) -> shard_message::Payload {
        self.next_within(wait)
            .await
            .unwrap()
            .expect("stream ended")
            .payload
            .expect("empty frame")
    }

    pub async fn next_bootstrap_request(&mut self) -> BootstrapRequest {
        match self.next_payload().await {
            shard_message::Payload::BootstrapRequest(r) => r,
            other => panic!("expected a bootstrap request, got {other:?}"),
        }
    }

    pub async fn next_ack(&mut self) -> Acknowledgement {
        self.next_ack_within(FRAME_WAIT).await
    }

    pub async fn next_ack_within(&mut self, wait: Duration) -> Acknowledgement {
        match self.next_payload_within(wait).await {
            shard_message::Payload::Ack(a) => a,
            other => panic!("expected an ack, got {other:?}"),
        }
    }

    /// The next ack, passing over the node and capacity updates a real decide pushes
    /// whenever its cycle runs (they may come before the ack of a roll-up sent after them).
    pub async fn next_ack_among_pushes(&mut self) -> Acknowledgement {
        loop {
            match self.next_payload().await {
                shard_message::Payload::Ack(a) => return a,
                shard_message::Payload::NodeStateUpdate(_)
                | shard_message::Payload::AvailableCapacity(_) => {}
                other => panic!("expected an ack or a push, got {other:?}"),
            }
        }
    }
}

/// The fake provider's built-in catalog served on `<dir>/provider.sock`, and a decide
/// configuration dialling it (for the caller to adjust and start).
pub async fn decide_over_builtin_provider(
    dir: &std::path::Path,
) -> (svc_shard_decide::StartConfig, ServerHandle) {
    let provider = Arc::new(
        FakeProvider::from_catalog(&Catalog::builtin(), ProviderConfig::default()).unwrap(),
    );
    let provider_sock = dir.join("provider.sock");
    let provider_srv = bigfleet_fake_provider::spawn_uds(&provider_sock, provider)
        .await
        .unwrap();
    let decide =
        svc_shard_decide::StartConfig::new(dir, format!("unix://{}", provider_sock.display()));
    (decide, provider_srv)
}

/// A decide-published node state for `machine` in `cluster`, keyed like decide keys it.
pub fn node_event(cluster: &str, machine: &str, state: i32) -> meshpb::ShardEvent {
    let key = format!("node:{machine}");
    meshpb::ShardEvent {
        cluster_id: cluster.into(),
        supersedes_key: key.clone(),
        frame: Some(meshpb::shard_event::Frame::NodeStateUpdate(
            bigfleet_proto::v1alpha1::NodeStateUpdate {
                supersedes_key: key,
                machine_id: machine.into(),
                cluster_id: cluster.into(),
                state,
                ..Default::default()
            },
        )),
    }
}

/// How long a test waits for the gateway to catch up.
pub const WAIT: Duration = Duration::from_secs(5);

/// The gateway's `Outbox` (decide's contract) and `Relay` (execute workers') over one
/// Unix-socket channel, so a test can play both same-pod callers.
#[derive(Clone)]
pub struct InternalClient {
    pub outbox: OutboxClient<Channel>,
    pub relay: RelayClient<Channel>,
}

impl InternalClient {
    pub async fn publish(
        &mut self,
        req: impl tonic::IntoStreamingRequest<Message = meshpb::ShardEvent>,
    ) -> Result<tonic::Response<meshpb::PublishSummary>, tonic::Status> {
        self.outbox.publish(req).await
    }

    pub async fn status(
        &mut self,
        req: impl tonic::IntoRequest<meshpb::StatusRequest>,
    ) -> Result<tonic::Response<meshpb::StatusResponse>, tonic::Status> {
        self.outbox.status(req).await
    }

    pub async fn request_bootstrap(
        &mut self,
        req: impl tonic::IntoRequest<meshpb::RequestBootstrapRequest>,
    ) -> Result<tonic::Response<meshpb::RequestBootstrapResponse>, tonic::Status> {
        self.relay.request_bootstrap(req).await
    }

    /// A RequestBootstrap that must be answered (any outcome).
    pub async fn bootstrap(
        &mut self,
        req: meshpb::RequestBootstrapRequest,
    ) -> meshpb::RequestBootstrapResponse {
        self.request_bootstrap(req).await.unwrap().into_inner()
    }

    /// [`Self::bootstrap`] left running, so the test can play the operator that answers it.
    pub fn bootstrap_in_background(
        &self,
        req: meshpb::RequestBootstrapRequest,
    ) -> tokio::task::JoinHandle<meshpb::RequestBootstrapResponse> {
        let mut caller = self.clone();
        tokio::spawn(async move { caller.bootstrap(req).await })
    }

    pub async fn send_reclaim(
        &mut self,
        req: impl tonic::IntoRequest<meshpb::SendReclaimRequest>,
    ) -> Result<tonic::Response<meshpb::SendReclaimResponse>, tonic::Status> {
        self.relay.send_reclaim(req).await
    }
}
