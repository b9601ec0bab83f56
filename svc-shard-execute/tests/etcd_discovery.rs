//! `--etcd-endpoints`: the worker discovers decide through the Work endpoint the shard's
//! leader publishes in a real etcd, and follows it when another decide takes over — even
//! while the old decide is still up and its stream healthy.

use crate::common;

use std::time::{Duration, Instant};

use bigfleet_fake_provider::ProviderConfig;
use bigfleet_model::MachineState::*;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_shardlease::testing::EtcdServer;
use bigfleet_shardlease::{Campaign, EtcdConfig, EtcdShards, LeaderGate};
use common::*;
use svc_shard_execute::doubles::DecideDouble;
use svc_shard_execute::start;

async fn leading(gate: &LeaderGate, within: Duration) {
    let mut rx = gate.is_actuating();
    tokio::time::timeout(within, rx.wait_for(|a| *a))
        .await
        .expect("term won")
        .unwrap();
}

#[tokio::test]
async fn workers_follow_the_shard_leader_through_etcd() {
    let Some(etcd) = EtcdServer::start_or_skip().await else {
        return;
    };
    let ttl = 2;
    let mut etcd_cfg = EtcdConfig::new(etcd.endpoints());
    etcd_cfg.lease_ttl = Duration::from_secs(ttl);

    // Decide A (epoch 3, the mesh's double) and decide B (epoch 9), both serving.
    let m = mesh(ProviderConfig::default()).await;
    let b = DecideDouble::new(SHARD, 9);
    let b_srv = b.serve_uds(&m.dir.path().join("decide-b.sock")).unwrap();
    for id in ["idle-1", "idle-2"] {
        let machine = machine(id, Idle, "");
        b.insert_machine(&machine).unwrap();
        m.seed(machine);
    }

    // A leads and publishes its endpoint; B stands by with its own.
    let shards = EtcdShards::connect(etcd_cfg.clone()).await.unwrap();
    let gate_a = shards.campaign(Campaign::new(SHARD).with_work_endpoint(m.decide_uri()));
    leading(&gate_a, Duration::from_secs(5)).await;
    let gate_b = EtcdShards::connect(etcd_cfg.clone())
        .await
        .unwrap()
        .campaign(Campaign::new(SHARD).with_work_endpoint(b_srv.uri()));

    // The static address is ignored in etcd mode.
    let mut cfg = m.config("w1", 4);
    cfg.decide_addr = "unix:///nonexistent/decide.sock".to_owned();
    cfg.etcd = Some(etcd_cfg);
    let running = start(cfg).await.unwrap();

    m.decide.enqueue(bootstrap("idle-1", "c1"));
    m.wait_dones(1).await;
    assert_eq!(m.decide.dones()[0].outcome, "success");
    assert_eq!(running.discovered_decide(), Some(m.decide_uri()));
    assert_eq!(m.provider.fence_mark(SHARD, "idle-1").unwrap().epoch, EPOCH);

    // A loses its lease (crashed lease holder); its server stays up. B takes over and the
    // worker moves to it.
    let lost = Instant::now();
    drop(gate_a);
    b.enqueue(bootstrap("idle-2", "c1"));
    bigfleet_testkit::wait_until(
        Duration::from_secs(ttl + 3),
        "the worker to serve decide B",
        async || {
            if b.done_count() >= 1 {
                Ok(())
            } else {
                Err(format!("streams at B: {:?}", b.streams()))
            }
        },
    )
    .await;
    eprintln!(
        "worker served the new leader {:?} after the old one lost its lease",
        lost.elapsed()
    );
    assert!(gate_b.current().is_some());
    assert_eq!(running.discovered_decide(), Some(b_srv.uri()));
    assert_eq!(b.dones()[0].outcome, "success");
    // The stream to A was closed when the worker moved.
    assert!(
        m.decide.streams().iter().all(|s| !s.open),
        "{:?}",
        m.decide.streams()
    );
    // B's higher epoch is what the provider now holds for its machine; a late call under
    // A's epoch is fenced.
    assert_eq!(m.provider.fence_mark(SHARD, "idle-2").unwrap().epoch, 9);
    let zombie = m.provider.configure(&pb::ConfigureRequest {
        machine_id: "idle-2".into(),
        cluster_id: "c1".into(),
        shard_id: SHARD.into(),
        shard_epoch: EPOCH,
        sequence_number: i64::MAX,
        ..Default::default()
    });
    assert_eq!(zombie.unwrap_err().code(), tonic::Code::FailedPrecondition);

    running.shutdown().await;
    b.end_streams();
    b_srv.stop().await;
}
