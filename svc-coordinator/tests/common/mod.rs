//! Multi-process harness: replicas are the real `bigfleet-coordinator` binary on loopback;
//! an optional TCP proxy in front of each replica's Raft port lets a test cut its traffic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use bigfleet_testkit::wait_until;

use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::{self as pb};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::Channel;

/// Cluster tests start several processes each; running two at once on a 2-core machine
/// would only make elections flaky. This lock keeps them apart under `cargo test` (one
/// process); under nextest (a process per test) the `raft-cluster` test group in
/// `.config/nextest.toml` does.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

pub fn port() -> u16 {
    bigfleet_testkit::free_tcp_port().unwrap()
}

/// One replica process.
pub struct Replica {
    pub name: String,
    pub data_dir: PathBuf,
    pub api: u16,
    pub raft_bind: u16,
    /// What peers dial: the Raft port itself, or a proxy in front of it.
    pub raft_advertise: u16,
    pub metrics: u16,
    pub log: PathBuf,
    pub extra: Vec<String>,
    child: Option<Child>,
}

impl Replica {
    pub fn new(root: &Path, name: &str) -> Self {
        let raft = port();
        Self {
            name: name.to_owned(),
            data_dir: root.join(name).join("data"),
            api: port(),
            raft_bind: raft,
            raft_advertise: raft,
            metrics: port(),
            log: root.join(format!("{name}.log")),
            extra: Vec::new(),
            child: None,
        }
    }

    pub fn api_addr(&self) -> String {
        format!("127.0.0.1:{}", self.api)
    }

    pub fn spawn(&mut self, join: &str) {
        assert!(self.child.is_none(), "{} already running", self.name);
        std::fs::create_dir_all(self.data_dir.parent().unwrap()).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bigfleet-coordinator"));
        cmd.args([
            "--id",
            &self.name,
            "--listen",
            &format!("127.0.0.1:{}", self.api),
            "--raft-bind",
            &format!("127.0.0.1:{}", self.raft_bind),
            "--raft-advertise",
            &format!("127.0.0.1:{}", self.raft_advertise),
            "--metrics-addr",
            &format!("127.0.0.1:{}", self.metrics),
            "--data-dir",
            self.data_dir.to_str().unwrap(),
            "--bootstrap",
        ]);
        if !join.is_empty() {
            cmd.args(["--join-addr", join]);
        }
        cmd.args(&self.extra)
            .env("RUST_LOG", "warn,svc_coordinator=info")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn bigfleet-coordinator"));
    }

    /// SIGKILL: no graceful anything, like a node dying.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// How the process ended, if it was started and has exited on its own (`None` while
    /// it runs or after [`Replica::kill`]).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Moves the replica to fresh ports (as a pod restarted with a new IP would).
    pub fn move_ports(&mut self) {
        self.api = port();
        self.raft_bind = port();
        self.raft_advertise = self.raft_bind;
        self.metrics = port();
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub async fn metric(&self, name: &str) -> Option<f64> {
        metric(self.metrics, name).await
    }

    pub async fn ready(&self) -> bool {
        http_get(self.metrics, "/readyz")
            .await
            .is_some_and(|(code, _)| code == 200)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn join_list(rs: &[Replica]) -> String {
    rs.iter()
        .map(Replica::api_addr)
        .collect::<Vec<_>>()
        .join(",")
}

/// Every replica's log for a failure message: the whole log of a replica that died on its
/// own (its error is at the top and a backtrace would push it out of any tail), the last
/// lines of the others.
pub fn dump_logs(rs: &mut [Replica]) -> String {
    rs.iter_mut()
        .map(|r| match r.exited() {
            Some(status) => format!(
                "===== {} EXITED ({status}); whole log =====\n{}",
                r.name,
                std::fs::read_to_string(&r.log).unwrap_or_default()
            ),
            None => format!("===== {} =====\n{}", r.name, r.log_tail()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Fails at once, with the dead replica's whole log, when a replica that should be running
/// has exited: waiting out a formation deadline would only hide why.
pub fn assert_none_died(rs: &mut [Replica]) {
    if rs.iter_mut().any(|r| r.exited().is_some()) {
        panic!("a replica exited on its own\n{}", dump_logs(rs));
    }
}

/// Minimal HTTP/1.0 GET on a loopback port: (status, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    bigfleet_testkit::http_request(([127, 0, 0, 1], port).into(), path, &[]).await
}

/// A sample's value from /metrics; `name` may include labels, e.g. `x{table="shards"}`.
pub async fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, body) = http_get(port, "/metrics").await?;
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

pub async fn client(addr: &str) -> Option<CoordinatorClient<Channel>> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .ok()?;
    Some(CoordinatorClient::new(ch))
}

/// Index of the running replica that answers a leader-only read.
pub async fn leader_of(rs: &[Replica]) -> Option<usize> {
    for (i, r) in rs.iter().enumerate() {
        if !r.running() {
            continue;
        }
        if let Some(mut c) = client(&r.api_addr()).await
            && c.list_shards(pb::ListShardsRequest {}).await.is_ok()
        {
            return Some(i);
        }
    }
    None
}

pub async fn wait_leader(rs: &mut [Replica], within: Duration) -> usize {
    wait_until(within, "a leader", async || match leader_of(rs).await {
        Some(i) => Ok(i),
        None => {
            assert_none_died(rs);
            Err(format!("none yet\n{}", dump_logs(rs)))
        }
    })
    .await
}

/// Waits until every running replica is ready and counts `voters` voters in a settled
/// membership: a joint configuration also counts three voters, but killing a leader then can
/// leave the survivors without a quorum.
pub async fn wait_formed(rs: &mut [Replica], voters: usize, within: Duration) {
    let what = format!("the cluster to form with {voters} voters");
    wait_until(within, &what, async || {
        assert_none_died(rs);
        let mut behind = Vec::new();
        for r in rs.iter().filter(|r| r.running()) {
            let (ready, v, settled) = (
                r.ready().await,
                r.metric("bigfleet_coordinator_raft_voters").await,
                r.metric("bigfleet_coordinator_raft_membership_settled")
                    .await,
            );
            if !(ready && v == Some(voters as f64) && settled == Some(1.0)) {
                behind.push(format!(
                    "{} ready {ready}, voters {v:?}, settled {settled:?}",
                    r.name
                ));
            }
        }
        if behind.is_empty() {
            Ok(())
        } else {
            Err(format!("{}\n{}", behind.join("; "), dump_logs(rs)))
        }
    })
    .await
}

pub fn report(shard: &str, cycle: i64) -> pb::ShardReport {
    pb::ShardReport {
        shard_id: shard.to_owned(),
        cycle,
        shard_epoch: 1,
        shard_address: format!("{shard}.shards:7780"),
        summary: Some(pb::ShardSummary {
            total_machines: 10,
            free_machines: 4,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn assign(key: &str, value: &str, shard: &str) -> pb::AssignDomainRequest {
    pb::AssignDomainRequest {
        topology_key: key.to_owned(),
        topology_value: value.to_owned(),
        shard_id: shard.to_owned(),
    }
}

pub async fn shards_of(addr: &str) -> Vec<(String, String)> {
    let mut c = client(addr).await.expect("connect");
    c.list_shards(pb::ListShardsRequest {})
        .await
        .expect("list shards")
        .into_inner()
        .shards
        .into_iter()
        .map(|s| (s.shard_id, s.address))
        .collect()
}

pub async fn domains_of(addr: &str) -> Vec<(String, String, String)> {
    let mut c = client(addr).await.expect("connect");
    c.list_domain_assignments(pb::ListDomainAssignmentsRequest {})
        .await
        .expect("list domains")
        .into_inner()
        .assignments
        .into_iter()
        .map(|a| (a.shard_id, a.topology_key, a.topology_value))
        .collect()
}

/// A TCP proxy that can be cut: while cut, new connections are closed at once and existing
/// ones are torn down — the replica behind it receives no Raft traffic.
pub struct Proxy {
    pub port: u16,
    cut: watch::Sender<bool>,
    target: Arc<AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Binds now (before the replicas' ports are picked, so no replica is handed the
    /// proxy's port); forwards to the port given with [`Proxy::set_target`].
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = Arc::new(AtomicU16::new(0));
        let target_in_task = Arc::clone(&target);
        let port = listener.local_addr().unwrap().port();
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut rx = cut_rx.clone();
                let target = target_in_task.load(Ordering::Relaxed);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Self {
            port,
            cut,
            target,
            task,
        }
    }

    pub fn set_target(&self, port: u16) {
        self.target.store(port, Ordering::Relaxed);
    }

    pub fn set_cut(&self, cut: bool) {
        let _ = self.cut.send(cut);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A shard that reports over and over and answers transfer instructions like a real one
/// would (ADR-0130): releases on `from_shard_id == me`, adopts on `to_shard_id == me`.
pub struct FakeShard {
    pub id: &'static str,
    pub cycle: i64,
    pub summary: pb::ShardSummary,
    pub shortfalls: Vec<pb::Shortfall>,
    pub acks: Vec<pb::InstructAck>,
    /// Idle machine ids the shard can release.
    pub idle: Vec<String>,
    /// Every instruction received, in order (redeliveries included).
    pub seen: Vec<pb::CoordinatorInstruction>,
    /// Whether to answer instructions (false: receive but do not ack yet).
    pub answering: bool,
    /// Answer adopt instructions REJECTED_INVALID (as a shard without the handler does).
    pub refuse_adopt: bool,
}

impl FakeShard {
    pub fn new(id: &'static str) -> Self {
        Self {
            id,
            cycle: 0,
            summary: pb::ShardSummary::default(),
            shortfalls: Vec::new(),
            acks: Vec::new(),
            idle: Vec::new(),
            seen: Vec::new(),
            answering: true,
            refuse_adopt: false,
        }
    }

    /// A shard with `shortfalls` unmet GPU needs ([`gpu_shortfall`]).
    pub fn short_of_gpus(id: &'static str, shortfalls: usize) -> Self {
        Self {
            shortfalls: vec![gpu_shortfall(); shortfalls],
            ..Self::new(id)
        }
    }

    /// A shard whose only machines are the GPU machines `idle`, all free to give.
    pub fn with_idle_gpus(id: &'static str, idle: &[&str]) -> Self {
        let n = i32::try_from(idle.len()).unwrap();
        Self {
            summary: pb::ShardSummary {
                total_machines: n,
                free_machines: n,
                per_instance_type_counts: [("gpu".to_owned(), n)].into(),
                ..Default::default()
            },
            idle: idle.iter().map(|m| (*m).to_owned()).collect(),
            ..Self::new(id)
        }
    }

    pub async fn report(
        &mut self,
        c: &mut CoordinatorClient<Channel>,
    ) -> Result<(), tonic::Status> {
        self.cycle += 1;
        let req = pb::ShardReport {
            shard_id: self.id.into(),
            cycle: self.cycle,
            shard_epoch: 1,
            shard_address: format!("{}.shards:7780", self.id),
            summary: Some(self.summary.clone()),
            shortfalls: self.shortfalls.clone(),
            instruction_acks: self.acks.clone(),
            ..Default::default()
        };
        let ack = c.report_shard(req).await?.into_inner();
        // Acks were delivered (the coordinator applied them before answering).
        self.acks.clear();
        for ins in ack.instructions {
            self.seen.push(ins.clone());
            if !self.answering {
                continue;
            }
            let reason = match &ins.payload {
                Some(pb::coordinator_instruction::Payload::TransferOwnership(t))
                    if t.from_shard_id == self.id =>
                {
                    let n = t.machine_ids.len().min(self.idle.len());
                    let released: Vec<String> = self.idle.drain(..n).collect();
                    format!("released: {}", released.join(","))
                }
                Some(pb::coordinator_instruction::Payload::TransferOwnership(t))
                    if t.to_shard_id == self.id && self.refuse_adopt =>
                {
                    self.acks.push(pb::InstructAck {
                        instruction_id: ins.instruction_id.clone(),
                        outcome: pb::instruct_ack::Outcome::RejectedInvalid as i32,
                        reason: "instruction not supported by this shard".into(),
                    });
                    continue;
                }
                Some(pb::coordinator_instruction::Payload::TransferOwnership(t))
                    if t.to_shard_id == self.id =>
                {
                    self.idle.extend(t.machine_ids.iter().cloned());
                    String::new()
                }
                _ => continue,
            };
            self.acks.push(pb::InstructAck {
                instruction_id: ins.instruction_id.clone(),
                outcome: pb::instruct_ack::Outcome::Accepted as i32,
                reason,
            });
        }
        Ok(())
    }

    pub fn transfers(&self) -> Vec<(String, pb::TransferOwnership, i64)> {
        self.seen
            .iter()
            .filter_map(|i| match &i.payload {
                Some(pb::coordinator_instruction::Payload::TransferOwnership(t)) => {
                    Some((i.instruction_id.clone(), t.clone(), i.coordinator_term))
                }
                _ => None,
            })
            .collect()
    }
}

/// Flags that make a replica's rebalancer act within a test's patience: a round every
/// 200 ms, on shortfalls two cycles old, without waiting for them to persist.
pub fn eager_rebalancing() -> Vec<String> {
    [
        "--rebalance-interval",
        "200ms",
        "--rebalance-min-age-cycles",
        "2",
        "--rebalance-min-persist",
        "0s",
    ]
    .map(String::from)
    .to_vec()
}

pub fn gpu_shortfall() -> pb::Shortfall {
    pb::Shortfall {
        requirements: vec![pb::NodeSelectorRequirement {
            key: "node.kubernetes.io/instance-type".into(),
            operator: pb::node_selector_requirement::Operator::In as i32,
            values: vec!["gpu".into()],
        }],
        priority: 100,
        age_cycles: 5,
        ..Default::default()
    }
}

/// One bootstrapped replica, in process, serving mTLS, with the CA and scratch directory
/// that issue its callers' identities.
pub struct MtlsSolo {
    pub dir: tempfile::TempDir,
    pub ca: bigfleet_testkit::TestCa,
    pub running: svc_coordinator::Running,
}

impl MtlsSolo {
    /// Started under the admin identity (replicas call JoinRaftCluster on each other) and
    /// returned once it leads.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = bigfleet_testkit::TestCa::new("test-ca").unwrap();
        let running = solo_over_mtls(dir.path(), &ca).await;
        Self { dir, ca, running }
    }

    /// Certificate files of a caller with `role`'s identity (`readonly`, `shard/s1`, ...).
    pub fn role(&self, role: &str) -> bigfleet_testkit::TlsPaths {
        self.ca.write_role_bundle(self.dir.path(), role).unwrap()
    }

    /// Certificate files of a caller whose leaf is `spec` (odd identities), named `stem`.
    pub fn leaf(
        &self,
        stem: &str,
        spec: &bigfleet_testkit::LeafSpec,
    ) -> bigfleet_testkit::TlsPaths {
        let cert = self.ca.issue(spec).unwrap();
        self.ca.write_bundle(self.dir.path(), stem, &cert).unwrap()
    }

    /// A channel to the replica as the identity in `paths`.
    pub async fn channel(&self, paths: &bigfleet_testkit::TlsPaths) -> tonic::transport::Channel {
        mtls_channel(self.running.api_addr, paths).await
    }
}

async fn solo_over_mtls(dir: &Path, ca: &bigfleet_testkit::TestCa) -> svc_coordinator::Running {
    use clap::Parser;
    let server = ca.write_role_bundle(dir, "admin").unwrap();
    let data = dir.join("data");
    let args = svc_coordinator::Args::try_parse_from([
        "bigfleet-coordinator",
        "--id",
        "solo",
        "--bootstrap",
        "--listen",
        "127.0.0.1:0",
        "--raft-bind",
        "127.0.0.1:0",
        "--metrics-addr",
        "0",
        "--data-dir",
        data.to_str().unwrap(),
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        server.key.to_str().unwrap(),
        "--tls-ca",
        server.ca.to_str().unwrap(),
    ])
    .unwrap();
    let running = svc_coordinator::start(args).await.unwrap();
    bigfleet_testkit::wait_until(Duration::from_secs(10), "a leader", async || {
        running.is_leader()
    })
    .await;
    running
}

/// A call's status code, `Ok` for an answer.
pub fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Code {
    r.map_or_else(|s| s.code(), |_| tonic::Code::Ok)
}

/// A channel to the replica at `addr` over mTLS as the identity in `paths`.
pub async fn mtls_channel(
    addr: std::net::SocketAddr,
    paths: &bigfleet_testkit::TlsPaths,
) -> tonic::transport::Channel {
    let files = bigfleet_identity::TlsFiles::new(&paths.cert, &paths.key, &paths.ca);
    let tls = bigfleet_identity::TlsContext::load(&files)
        .unwrap()
        .client_config()
        .unwrap();
    let t: bigfleet_mesh::Target = format!("https://127.0.0.1:{}", addr.port())
        .parse()
        .unwrap();
    bigfleet_mesh::connect(
        &t,
        &bigfleet_mesh::ChannelConfig::default().with_tls(Some(tls)),
    )
    .await
    .unwrap()
}
