//! Two `bigfleet-shard-decide` PROCESSES of one shard on one real etcd
//! (`--etcd-endpoints`): only the leader hands out work; killing it (SIGKILL) lets the
//! standby take over within the lease TTL + 2 s under a higher epoch, which the fake
//! provider uses to fence the dead leader's token; the published Work endpoint follows.
//! And one process through an etcd outage: a blip changes nothing, a freeze longer than
//! the TTL pauses only the hand-out, and it resumes under a higher epoch.

mod fixtures;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_fake_provider::{FakeProvider, ProviderConfig, ServerHandle, spawn_uds};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::ingest_client::IngestClient;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use bigfleet_shardlease::testing::EtcdServer;
use bigfleet_shardlease::{EtcdConfig, EtcdShards};
use fixtures::{channel, idle, rollup};
use tokio::sync::mpsc;
use tonic::transport::Channel;

const SHARD: &str = "shard-e";

/// A decide process, SIGKILLed on drop.
struct DecideProc {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl DecideProc {
    /// `{dir}` in an extra argument stands for the process's socket directory.
    fn spawn(etcd: &EtcdServer, provider: &str, ttl_secs: u64, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let extra: Vec<String> = extra
            .iter()
            .map(|a| a.replace("{dir}", &dir.path().display().to_string()))
            .collect();
        let log = std::fs::File::create(dir.path().join("decide.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_bigfleet-shard-decide"))
            .arg(format!("--shard-id={SHARD}"))
            .arg(format!("--socket-dir={}", dir.path().display()))
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--provider-addr={provider}"))
            .arg(format!("--etcd-endpoints={}", etcd.endpoints().join(",")))
            .arg(format!("--etcd-lease-ttl={ttl_secs}s"))
            .args(["--metrics-addr=0", "--cycle-interval=200ms"])
            .args(&extra)
            .env("RUST_LOG", "info,bigfleet_shardlease=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn bigfleet-shard-decide");
        Self {
            child: Some(child),
            dir,
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("decide.sock")
    }

    fn uri(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("decide.log")).unwrap_or_default()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The gateway's contract on decide.sock (roll-ups).
    fn ingest(&self) -> IngestClient<Channel> {
        IngestClient::new(channel(&self.uri()))
    }

    /// Waits for decide.sock to answer and returns a Work client.
    async fn ready(&self) -> WorkClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.socket().exists() {
                let mut info = ShardInfoClient::new(channel(&self.uri()));
                if info.describe(mesh::DescribeShardRequest {}).await.is_ok() {
                    return WorkClient::new(channel(&self.uri()));
                }
            }
            assert!(
                Instant::now() < deadline,
                "decide did not come up; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn describe(&self) -> mesh::ShardDescription {
        ShardInfoClient::new(channel(&self.uri()))
            .describe(mesh::DescribeShardRequest {})
            .await
            .unwrap()
            .into_inner()
    }
}

impl Drop for DecideProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An execute worker on a Work stream.
struct Worker {
    tx: mpsc::Sender<mesh::WorkerMessage>,
    items: tonic::Streaming<mesh::WorkItem>,
}

impl Worker {
    async fn connect(client: &mut WorkClient<Channel>, credits: u32) -> Worker {
        let (tx, rx) = mpsc::channel(16);
        let hello = mesh::worker_message::Msg::Hello(mesh::worker_message::Hello {
            worker_id: "w".into(),
            shard_id: SHARD.into(),
        });
        tx.send(mesh::WorkerMessage { msg: Some(hello) })
            .await
            .unwrap();
        let items = client
            .pull(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let w = Worker { tx, items };
        w.credit(credits).await;
        w
    }

    async fn credit(&self, n: u32) {
        let credit = mesh::worker_message::Msg::Credit(mesh::worker_message::Credit { n });
        self.tx
            .send(mesh::WorkerMessage { msg: Some(credit) })
            .await
            .unwrap();
    }

    async fn next(&mut self, wait: Duration) -> Option<mesh::WorkItem> {
        tokio::time::timeout(wait, self.items.message())
            .await
            .ok()
            .and_then(|r| r.ok().flatten())
    }
}

async fn provider(dir: &Path, machines: usize) -> (Arc<FakeProvider>, ServerHandle) {
    let p = Arc::new(FakeProvider::new(ProviderConfig::default()));
    for i in 0..machines {
        p.add_machine(idle(&format!("m{i}"))).unwrap();
    }
    let server = spawn_uds(&dir.join("provider.sock"), p.clone())
        .await
        .unwrap();
    (p, server)
}

fn fencing(item: &mesh::WorkItem) -> (i64, i64) {
    let f = item.fencing.as_ref().unwrap();
    (f.epoch, f.sequence_base)
}

fn machine_of(item: &mesh::WorkItem) -> String {
    item.action.as_ref().unwrap().machine_id.clone()
}

fn configure(machine: &str, (epoch, sequence): (i64, i64)) -> pb::ConfigureRequest {
    pb::ConfigureRequest {
        machine_id: machine.to_owned(),
        cluster_id: "c1".into(),
        shard_id: SHARD.into(),
        shard_epoch: epoch,
        sequence_number: sequence,
        ..Default::default()
    }
}

async fn work_watcher(etcd: &EtcdServer) -> bigfleet_shardlease::WorkEndpointWatcher {
    let mut cfg = EtcdConfig::new(etcd.endpoints());
    cfg.lease_ttl = Duration::from_secs(2);
    EtcdShards::connect(cfg)
        .await
        .unwrap()
        .watch_work_endpoint(SHARD)
}

#[tokio::test]
async fn only_the_leader_hands_out_and_a_standby_takes_over_fencing_the_old_one() {
    let Some(etcd) = EtcdServer::start_or_skip().await else {
        return;
    };
    let ttl = 2;
    let tmp = tempfile::tempdir().unwrap();
    let (_fake, provider_server) = provider(tmp.path(), 1).await;
    let provider_uri = provider_server.target();
    let watcher = work_watcher(&etcd).await;

    // Each publishes its own decide.sock as the Work endpoint, so the endpoint names
    // the process.
    let advertise = ["--work-advertise=unix://{dir}/decide.sock"];
    let a = DecideProc::spawn(&etcd, &provider_uri, ttl, &advertise);
    let mut ca = a.ready().await;
    let b = DecideProc::spawn(&etcd, &provider_uri, ttl, &advertise);
    let mut cb = b.ready().await;
    for p in [&a, &b] {
        p.ingest().apply_rollup(rollup(1)).await.unwrap();
    }
    let mut wa = Worker::connect(&mut ca, 10).await;
    let mut wb = Worker::connect(&mut cb, 10).await;

    // Exactly one of them hands out the one action.
    let (first, leader_is_a) = tokio::select! {
        Some(i) = wa.next(Duration::from_secs(10)) => (i, true),
        Some(i) = wb.next(Duration::from_secs(10)) => (i, false),
        else => panic!("nobody handed out work; logs:\n{}\n---\n{}", a.log(), b.log()),
    };
    let (mut leader, standby, mut standby_worker) =
        if leader_is_a { (a, b, wb) } else { (b, a, wa) };
    assert!(
        standby_worker.next(Duration::from_secs(1)).await.is_none(),
        "the standby handed out work too"
    );
    assert_eq!(machine_of(&first), "m0");
    // The standby is not idle: it reconciles and decides, it just does not hand out.
    let c0 = standby.describe().await.cycle;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        standby.describe().await.cycle > c0,
        "standby stopped cycling"
    );
    assert_eq!(
        watcher.wait_for_endpoint(Duration::from_secs(2)).await,
        Some(leader.uri()),
        "the leader's Work endpoint is published"
    );

    // The leader dies without a word.
    let killed = Instant::now();
    leader.kill();
    let second = standby_worker
        .next(Duration::from_secs(ttl + 2))
        .await
        .unwrap_or_else(|| panic!("no takeover within ttl + 2s; log:\n{}", standby.log()));
    let took = killed.elapsed();
    eprintln!("takeover after {took:?}");
    assert!(took <= Duration::from_secs(ttl + 2));
    assert_eq!(
        machine_of(&second),
        "m0",
        "the dead leader's action is re-derived"
    );
    let (old, new) = (fencing(&first), fencing(&second));
    assert!(new.0 > old.0, "epoch {} after {}", new.0, old.0);
    let mut rx = watcher.subscribe();
    let standby_uri = standby.uri();
    tokio::time::timeout(
        Duration::from_secs(2),
        rx.wait_for(|e| e.as_deref() == Some(standby_uri.as_str())),
    )
    .await
    .expect("the new leader's endpoint is published")
    .unwrap();

    // At the provider: the new leader's call goes through, and a late call stamped by
    // the dead leader (a zombie worker still holding its item) is fenced.
    let mut provider = CapacityProviderClient::new(channel(&provider_uri));
    provider.configure(configure("m0", new)).await.unwrap();
    let err = provider.configure(configure("m0", old)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    drop(standby);
    provider_server.shutdown().await;
}

#[tokio::test]
async fn etcd_outage_pauses_only_the_hand_out_and_resumes_with_a_higher_epoch() {
    let Some(etcd) = EtcdServer::start_or_skip().await else {
        return;
    };
    let ttl = 3;
    let tmp = tempfile::tempdir().unwrap();
    let (_fake, provider_server) = provider(tmp.path(), 4).await;
    let watcher = work_watcher(&etcd).await;
    // Remote workers reach it over TCP; the endpoint is derived from the listener.
    let d = DecideProc::spawn(
        &etcd,
        &provider_server.target(),
        ttl,
        &["--work-listen=127.0.0.1:0"],
    );
    d.ready().await;
    d.ingest().apply_rollup(rollup(4)).await.unwrap();
    let endpoint = watcher
        .wait_for_endpoint(Duration::from_secs(5))
        .await
        .expect("work endpoint published");
    assert!(endpoint.starts_with("http://127.0.0.1:"), "{endpoint}");
    let mut remote = WorkClient::new(channel(&endpoint));
    let mut w = Worker::connect(&mut remote, 1).await;
    let first = w
        .next(Duration::from_secs(10))
        .await
        .expect("leader hands out");
    let e1 = fencing(&first).0;

    // A blip well inside the TTL changes nothing.
    etcd.pause();
    tokio::time::sleep(Duration::from_millis(500)).await;
    etcd.resume();
    w.credit(1).await;
    let same = w.next(Duration::from_secs(2)).await.expect("still leading");
    assert_eq!(fencing(&same).0, e1);

    // Frozen longer than the TTL: hand-outs stop, everything else goes on.
    etcd.pause();
    let frozen = Instant::now();
    tokio::time::sleep(Duration::from_secs(ttl)).await;
    w.credit(1).await;
    let before = d.describe().await;
    assert!(
        w.next(Duration::from_millis(1500)).await.is_none(),
        "handed out work without a provable lease"
    );
    let after = d.describe().await;
    assert!(after.cycle > before.cycle, "cycles continue while paused");
    assert!(frozen.elapsed() > Duration::from_secs(ttl));
    etcd.resume();

    // Back: a new term, a higher epoch, and the waiting credit is served.
    let resumed = w
        .next(Duration::from_secs(ttl + 3))
        .await
        .unwrap_or_else(|| panic!("no hand-out after etcd came back; log:\n{}", d.log()));
    assert!(
        fencing(&resumed).0 > e1,
        "{} after {e1}",
        fencing(&resumed).0
    );
    assert!(d.describe().await.shard_epoch > e1);
    drop(d);
    provider_server.shutdown().await;
}
