//! Two `bigfleet-shard-decide` PROCESSES of one shard on one real etcd
//! (`--etcd-endpoints`): only the leader hands out work; killing it (SIGKILL) lets the
//! standby take over within the lease TTL + 2 s under a higher epoch, which the fake
//! provider uses to fence the dead leader's token; the published Work endpoint follows.
//! And one process through an etcd outage: a blip changes nothing, a freeze longer than
//! the TTL pauses only the hand-out, and it resumes under a higher epoch.

use crate::fixtures;

use std::time::{Duration, Instant};

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use bigfleet_shardlease::testing::EtcdServer;
use bigfleet_shardlease::{EtcdConfig, EtcdShards};
use fixtures::{DecideProc, channel, provider, rollup};
use svc_shard_decide_core::testing::TestWorker;
use tonic::transport::Channel;

const SHARD: &str = "shard-e";

/// A decide of this test's shard on `etcd`, in a directory of its own; `{dir}` in an
/// extra argument stands for that directory (its socket directory).
fn spawn(etcd: &EtcdServer, provider: &str, ttl_secs: u64, extra: &[&str]) -> DecideProc {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let mut args = vec![
        format!("--etcd-endpoints={}", etcd.endpoints().join(",")),
        format!("--etcd-lease-ttl={ttl_secs}s"),
    ];
    args.extend(
        extra
            .iter()
            .map(|a| a.replace("{dir}", &path.display().to_string())),
    );
    let log = path.join("decide.log");
    let rust_log = "info,bigfleet_shardlease=debug";
    DecideProc::spawn(
        SHARD,
        path,
        &path.join("data"),
        provider,
        &log,
        &args,
        rust_log,
    )
    .owning(dir)
}

/// Waits for `d`'s decide.sock to answer and returns a Work client.
async fn work_client(d: &DecideProc) -> WorkClient<Channel> {
    d.ready().await;
    WorkClient::new(channel(&d.uri()))
}

/// A worker of this test's shard on `client`'s Work stream, asking for `credits` items.
async fn worker(client: &mut WorkClient<Channel>, credits: u32) -> TestWorker {
    let w = TestWorker::connect(client, "w", SHARD).await;
    w.credit(credits).await;
    w
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
    let (_fake, provider_server) = provider(tmp.path(), 1, None).await;
    let provider_uri = provider_server.target();
    let watcher = work_watcher(&etcd).await;

    // Each publishes its own decide.sock as the Work endpoint, so the endpoint names
    // the process.
    let advertise = ["--work-advertise=unix://{dir}/decide.sock"];
    let a = spawn(&etcd, &provider_uri, ttl, &advertise);
    let mut ca = work_client(&a).await;
    let b = spawn(&etcd, &provider_uri, ttl, &advertise);
    let mut cb = work_client(&b).await;
    for p in [&a, &b] {
        p.ingest().apply_rollup(rollup(1)).await.unwrap();
    }
    let mut wa = worker(&mut ca, 10).await;
    let mut wb = worker(&mut cb, 10).await;

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
    let (_fake, provider_server) = provider(tmp.path(), 4, None).await;
    let watcher = work_watcher(&etcd).await;
    // Remote workers reach it over TCP; the endpoint is derived from the listener.
    let d = spawn(
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
    let mut w = worker(&mut remote, 1).await;
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
