//! Three replicas as separate processes on loopback: ordinal bootstrap + join, commits,
//! leader failover, a follower restarted on new ports, a partitioned follower, and
//! snapshot save → offline restore → a new cluster.

use crate::common;

use std::time::{Duration, Instant};

use bigfleet_mesh::leader_hint;
use bigfleet_proto::v1alpha1::{self as pb, snapshot_save_chunk};
use bigfleet_testkit::wait_until;
use common::*;
use svc_coordinator::{SnapshotArchive, restore_snapshot};
use tonic::Code;

const FORM: Duration = Duration::from_secs(20);

fn replicas(root: &std::path::Path) -> Vec<Replica> {
    (0..3)
        .map(|i| Replica::new(root, &format!("coord-{i}")))
        .collect()
}

fn spawn_all(rs: &mut [Replica]) {
    let join = join_list(rs);
    for r in rs.iter_mut() {
        r.spawn(&join);
    }
}

async fn domains_metric(r: &Replica) -> Option<f64> {
    r.metric("bigfleet_coordinator_state_entries{table=\"domains\"}")
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_commit_failover_and_rejoin_on_new_ports() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let mut rs = replicas(dir.path());
    spawn_all(&mut rs);
    wait_formed(&mut rs, 3, FORM).await;
    let leader = wait_leader(&mut rs, FORM).await;
    let leader_addr = rs[leader].api_addr();

    // Followers refuse with FAILED_PRECONDITION and point at the leader.
    let follower = (leader + 1) % 3;
    let mut fc = client(&rs[follower].api_addr()).await.unwrap();
    let err = fc
        .assign_domain(assign("rack", "r0", "s0"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(err.message(), "coordinator: not leader");
    assert_eq!(leader_hint(&err), Some(leader_addr.clone()));

    // Writes: three shards self-register through ReportShard, then domains are pinned.
    let mut lc = client(&leader_addr).await.unwrap();
    for s in ["s0", "s1", "s2"] {
        let ack = lc.report_shard(report(s, 1)).await.unwrap().into_inner();
        assert!(ack.acknowledged);
        assert!(ack.coordinator_term > 0);
    }
    for i in 0..6 {
        lc.assign_domain(assign("rack", &format!("r{i}"), &format!("s{}", i % 3)))
            .await
            .unwrap();
    }
    let conflict = lc
        .assign_domain(assign("rack", "r0", "s1"))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    let want_shards = shards_of(&leader_addr).await;
    let want_domains = domains_of(&leader_addr).await;
    assert_eq!(want_shards.len(), 3);
    assert_eq!(want_shards[1], ("s1".into(), "s1.shards:7780".into()));
    assert_eq!(want_domains.len(), 6);

    // The pinned domain rides back to its shard as an instruction.
    let ack = lc.report_shard(report("s0", 2)).await.unwrap().into_inner();
    let domains: Vec<_> = ack
        .instructions
        .iter()
        .map(|i| match &i.payload {
            Some(pb::coordinator_instruction::Payload::AssignDomain(a)) => a.topology_value.clone(),
            other => panic!("unexpected payload {other:?}"),
        })
        .collect();
    assert_eq!(domains, ["r0", "r3"]);
    assert!(
        ack.instructions
            .iter()
            .all(|i| i.coordinator_term == ack.coordinator_term)
    );

    // Kill the leader: a new one must answer within 2 s with every committed write.
    rs[leader].kill();
    let killed = Instant::now();
    // How fast is a benchmark's question (docs/benchmarks.md, `coordinator failover`), not
    // a timed assertion that a loaded 2-core CI box could fail: this test asserts *that* a
    // new leader takes over with every committed write.
    let new_leader = wait_leader(&mut rs, FORM).await;
    eprintln!("leader failover: {:?}", killed.elapsed());
    assert_ne!(new_leader, leader);
    let new_addr = rs[new_leader].api_addr();
    assert_eq!(shards_of(&new_addr).await, want_shards);
    assert_eq!(domains_of(&new_addr).await, want_domains);
    let mut nc = client(&new_addr).await.unwrap();
    nc.assign_domain(assign("rack", "r6", "s0")).await.unwrap();

    // The old leader comes back as a follower on entirely new ports; the join reconciler
    // rewrites its address and it catches up.
    rs[leader].move_ports();
    let join = join_list(&rs);
    rs[leader].spawn(&join);
    let healed = &rs[leader];
    wait_until(
        FORM,
        "restarted replica ready with the new write",
        async || healed.ready().await && domains_metric(healed).await == Some(7.0),
    )
    .await;

    // Prove it is a voter at its new address: with the third replica gone, the leader
    // commits only if the restarted one acknowledges.
    let third = 3 - leader - new_leader;
    rs[third].kill();
    let mut nc = client(&new_addr).await.unwrap();
    nc.assign_domain(assign("rack", "r7", "s1"))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "commit with the healed voter failed: {e}\n{}",
                dump_logs(&mut rs)
            )
        });
    let healed = &rs[leader];
    wait_until(
        Duration::from_secs(5),
        "healed replica applies the write",
        async || domains_metric(healed).await == Some(8.0),
    )
    .await;
    let applied = rs[new_leader]
        .metric("bigfleet_coordinator_apply_total{outcome=\"success\"}")
        .await
        .unwrap();
    assert!(applied >= 2.0, "apply_total success = {applied}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_follower_catches_up() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        proxies.push(Proxy::start().await);
    }
    let mut rs = replicas(dir.path());
    for (r, p) in rs.iter_mut().zip(&proxies) {
        p.set_target(r.raft_bind);
        r.raft_advertise = p.port;
    }
    spawn_all(&mut rs);
    wait_formed(&mut rs, 3, FORM).await;
    let leader = wait_leader(&mut rs, FORM).await;
    let leader_addr = rs[leader].api_addr();
    let mut lc = client(&leader_addr).await.unwrap();
    lc.report_shard(report("s1", 1)).await.unwrap();
    lc.assign_domain(assign("zone", "a", "s1")).await.unwrap();
    let f = (leader + 1) % 3;
    let follower = &rs[f];
    wait_until(FORM, "follower caught up before the cut", async || {
        domains_metric(follower).await == Some(1.0)
    })
    .await;

    proxies[f].set_cut(true);
    // The majority keeps committing without it.
    for i in 0..5 {
        let l = wait_leader(&mut rs, FORM).await;
        let mut lc = client(&rs[l].api_addr()).await.unwrap();
        lc.assign_domain(assign("zone", &format!("b{i}"), "s1"))
            .await
            .unwrap_or_else(|e| panic!("majority commit failed: {e}\n{}", dump_logs(&mut rs)));
    }
    // A negative check needs some time to be wrong in: give replication a chance.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        domains_metric(&rs[f]).await,
        Some(1.0),
        "a cut-off follower must not see new writes"
    );

    proxies[f].set_cut(false);
    let follower = &rs[f];
    wait_until(
        FORM,
        "follower catches up after the partition",
        async || domains_metric(follower).await == Some(6.0),
    )
    .await;
    let l = wait_leader(&mut rs, FORM).await;
    assert_eq!(domains_of(&rs[l].api_addr()).await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_save_offline_restore_new_cluster() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();

    // A single replica with periodic export.
    let mut solo = Replica::new(dir.path(), "coord-0");
    let export_dir = dir.path().join("exports");
    solo.extra = vec![
        "--snapshot-export-dir".into(),
        export_dir.to_str().unwrap().into(),
        "--snapshot-export-interval".into(),
        "300ms".into(),
    ];
    solo.spawn("");
    wait_leader(std::slice::from_mut(&mut solo), FORM).await;
    let addr = solo.api_addr();
    let mut c = client(&addr).await.unwrap();
    for s in ["a", "b"] {
        c.report_shard(report(s, 1)).await.unwrap();
    }
    c.assign_domain(assign("rack", "r1", "a")).await.unwrap();
    c.assign_domain(assign("rack", "r2", "b")).await.unwrap();
    c.unassign_domain(pb::UnassignDomainRequest {
        topology_key: "rack".into(),
        topology_value: "r2".into(),
    })
    .await
    .unwrap();
    let want_shards = shards_of(&addr).await;
    let want_domains = domains_of(&addr).await;

    // SnapshotSave: metadata first, then data.
    let mut stream = c
        .snapshot_save(pb::SnapshotSaveRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut meta = None;
    let mut state = Vec::new();
    while let Some(frame) = stream.message().await.unwrap() {
        match frame.payload.unwrap() {
            snapshot_save_chunk::Payload::MetaJson(m) => {
                assert!(
                    meta.is_none() && state.is_empty(),
                    "meta must come first, once"
                );
                meta = Some(m);
            }
            snapshot_save_chunk::Payload::Data(d) => {
                assert!(meta.is_some(), "data before meta");
                state.extend(d);
            }
        }
    }
    let archive = SnapshotArchive::from_parts(&meta.unwrap(), state).unwrap();
    let file = dir.path().join("backup.snap");
    archive.write_file(&file).unwrap();

    // The periodic export produced the same state behind an atomic `latest`.
    let latest = export_dir.join("latest");
    wait_until(Duration::from_secs(10), "periodic export", async || {
        SnapshotArchive::read(&latest).is_ok_and(|a| a.state == archive.state)
    })
    .await;
    let snap_term = archive.meta.last_log_id.unwrap().leader_id.term;
    solo.kill();

    // Offline restore into ordinal 0 of a brand-new cluster; the others start empty.
    let root = dir.path().join("new");
    let mut rs = replicas(&root);
    let report = restore_snapshot(
        &rs[0].data_dir,
        "coord-0",
        &format!("127.0.0.1:{}", rs[0].raft_advertise),
        &file,
    )
    .unwrap();
    assert_eq!((report.shards, report.domains), (2, 1));
    spawn_all(&mut rs);
    wait_formed(&mut rs, 3, FORM).await;
    let leader = wait_leader(&mut rs, FORM).await;
    let laddr = rs[leader].api_addr();
    assert_eq!(shards_of(&laddr).await, want_shards);
    assert_eq!(domains_of(&laddr).await, want_domains);
    let term = rs[leader]
        .metric("bigfleet_coordinator_raft_term")
        .await
        .unwrap();
    assert!(
        term > snap_term as f64,
        "term {term} must move past the snapshot's {snap_term}"
    );
    // The new cluster takes writes, and followers got the restored state.
    let mut c = client(&laddr).await.unwrap();
    c.assign_domain(assign("rack", "r3", "b")).await.unwrap();
    for r in &rs {
        wait_until(FORM, "every replica has the restored state", async || {
            domains_metric(r).await == Some(2.0)
        })
        .await;
    }
}

/// The Raft port over mTLS (ADR-0100): three replicas with `coordinator/<id>` certificates
/// form a group through ordinal bootstrap + join, and elect a new leader when the leader dies
/// — every vote and append crossing the mTLS Raft port with the sender bound to its
/// certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_form_and_fail_over_over_mtls() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let ca = bigfleet_testkit::TestCa::new("raft-mtls").unwrap();
    let mut rs = replicas(dir.path());
    for r in rs.iter_mut() {
        let p = ca
            .write_role_bundle(&pki, &format!("coordinator/{}", r.name))
            .unwrap();
        r.extra = vec![
            "--tls-cert".into(),
            p.cert.display().to_string(),
            "--tls-key".into(),
            p.key.display().to_string(),
            "--tls-ca".into(),
            p.ca.display().to_string(),
        ];
    }
    spawn_all(&mut rs);
    wait_formed(&mut rs, 3, FORM).await;
    let is_leader = |r: &Replica| {
        let m = r.metrics;
        async move { metric(m, "bigfleet_coordinator_is_leader").await == Some(1.0) }
    };
    let mut leader = None;
    for (i, r) in rs.iter().enumerate() {
        if is_leader(r).await {
            leader = Some(i);
        }
    }
    let leader = leader.unwrap_or_else(|| panic!("no leader\n{}", dump_logs(&mut rs)));
    rs[leader].kill();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    wait_until(
        FORM,
        "a new leader among the survivors over mTLS",
        async || {
            for &i in &survivors {
                if is_leader(&rs[i]).await {
                    return Ok(());
                }
            }
            // The replicas' own logs say why, should the election never settle.
            Err(dump_logs(&mut rs))
        },
    )
    .await;
}

/// A transfer survives a real failover: the donor is told to release by one leader, that
/// leader dies before the donor answers, and the next leader redelivers the same instruction
/// (under its higher term), takes the donor's ack and only then tells the recipient to adopt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_resumes_on_the_new_leader_after_failover() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let mut rs = replicas(dir.path());
    for r in rs.iter_mut() {
        r.extra = eager_rebalancing();
    }
    spawn_all(&mut rs);
    wait_formed(&mut rs, 3, FORM).await;
    let leader = wait_leader(&mut rs, FORM).await;
    let mut c = client(&rs[leader].api_addr()).await.unwrap();

    let mut recipient = FakeShard::short_of_gpus("s0", 1);
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1", "m2"]);
    donor.answering = false;
    wait_until(FORM, "a release instruction", async || {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        if donor.transfers().is_empty() {
            Err(dump_logs(&mut rs))
        } else {
            Ok(())
        }
    })
    .await;
    let (release_id, _, term1) = donor.transfers()[0].clone();

    rs[leader].kill();
    let new_leader = wait_leader(&mut rs, FORM).await;
    assert_ne!(new_leader, leader);
    let mut c = client(&rs[new_leader].api_addr()).await.unwrap();
    donor.answering = true;
    wait_until(FORM, "an adopt instruction after failover", async || {
        // A report may land while the new leader is still settling; the shard just retries.
        let _ = donor.report(&mut c).await;
        let _ = recipient.report(&mut c).await;
        if recipient.transfers().is_empty() {
            Err(dump_logs(&mut rs))
        } else {
            Ok(())
        }
    })
    .await;
    let after: Vec<_> = donor
        .transfers()
        .into_iter()
        .filter(|(_, _, term)| *term > term1)
        .collect();
    assert!(!after.is_empty(), "{:?}", donor.transfers());
    assert!(
        after.iter().all(|(id, _, _)| *id == release_id),
        "{after:?}"
    );
    let (_, adopt, _) = recipient.transfers()[0].clone();
    assert_eq!(adopt.machine_ids, ["m1"]);
    assert_eq!(
        (adopt.from_shard_id.as_str(), adopt.to_shard_id.as_str()),
        ("s1", "s0")
    );
}
