//! The leader's rebalancer end to end against the real `bigfleet-coordinator` binary: two
//! fake shards report — one short of a machine type, one with that type idle — and receive
//! the transfer's instructions in protocol order (donor releases first, recipient adopts
//! only after the donor's ack), across a restart of the leader mid-transfer.

mod common;

use std::time::{Duration, Instant};

use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::{self as pb};
use common::*;
use tonic::transport::Channel;

const WITHIN: Duration = Duration::from_secs(30);

fn replica(root: &std::path::Path) -> Replica {
    let mut r = Replica::new(root, "coord-0");
    r.extra = eager_rebalancing();
    r.extra
        .extend(["--rebalance-max-machines".to_owned(), "2".to_owned()]);
    r
}

async fn connect(r: &mut Replica) -> CoordinatorClient<Channel> {
    wait_leader(std::slice::from_mut(r), WITHIN).await;
    client(&r.api_addr()).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_supply_moves_in_two_phases_across_a_leader_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = replica(dir.path());
    r.spawn("");
    let mut c = connect(&mut r).await;

    let mut recipient = FakeShard::new("s0");
    recipient.summary = pb::ShardSummary {
        total_machines: 5,
        free_machines: 0,
        per_instance_type_counts: [("cpu".to_owned(), 5)].into(),
        ..Default::default()
    };
    recipient.shortfalls = vec![gpu_shortfall(), gpu_shortfall()];
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1", "m2", "m3"]);
    // Phase one arrives; the donor holds its ack so the leader can die mid-transfer.
    donor.answering = false;

    let start = Instant::now();
    loop {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !donor.transfers().is_empty() {
            break;
        }
        assert!(
            start.elapsed() < WITHIN,
            "timed out waiting: the donor is told to release\n{}",
            r.log_tail()
        );
    }
    let (release_id, release, term1) = donor.transfers()[0].clone();
    assert_eq!(release.from_shard_id, "s1");
    assert_eq!(release.to_shard_id, "s0");
    assert_eq!(release.machine_ids, ["*/gpu", "*/gpu"]);
    // The recipient is told nothing before the donor has released.
    assert!(recipient.transfers().is_empty(), "{:?}", recipient.seen);
    assert_eq!(
        r.metric("bigfleet_coordinator_rebalance_decisions_total{kind=\"transfer_ownership\"}")
            .await,
        Some(1.0)
    );

    // The leader dies mid-transfer and comes back; the donor now answers.
    r.kill();
    r.spawn("");
    let mut c = connect(&mut r).await;
    donor.answering = true;
    let delivered = donor.seen.len();
    let start = Instant::now();
    loop {
        let _ = recipient.report(&mut c).await;
        let _ = donor.report(&mut c).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if donor.seen.len() > delivered {
            break;
        }
        assert!(
            start.elapsed() < WITHIN,
            "timed out waiting: the release is redelivered by the restarted leader\n{}",
            r.log_tail()
        );
    }
    assert!(donor.transfers().iter().all(|(_, _, term)| *term >= term1));
    // Same instruction id: the transfer resumed from the replicated state, not re-decided.
    assert!(
        donor
            .transfers()
            .iter()
            .all(|(id, t, _)| *id == release_id && t.from_shard_id == "s1"),
        "{:?}",
        donor.transfers()
    );
    assert_eq!(
        r.metric("bigfleet_coordinator_rebalance_decisions_total{kind=\"transfer_ownership\"}")
            .await,
        Some(0.0)
    );

    // The donor's ack (sent with its next report) unlocks the adopt phase.
    let start = Instant::now();
    loop {
        donor.report(&mut c).await.unwrap();
        recipient.report(&mut c).await.unwrap();
        if !recipient.transfers().is_empty() {
            break;
        }
        assert!(
            start.elapsed() < WITHIN,
            "timed out waiting: the recipient adopts the released machines\n{}",
            r.log_tail()
        );
    }
    let (_, adopt, _) = recipient.transfers()[0].clone();
    assert_eq!(adopt.machine_ids, ["m1", "m2"]);
    assert_eq!(
        (adopt.from_shard_id.as_str(), adopt.to_shard_id.as_str()),
        ("s1", "s0")
    );
    assert_eq!(donor.idle, ["m3"]);

    // The recipient's ack finishes it; its shortfall is met and nothing more is decided.
    recipient.shortfalls.clear();
    let start = Instant::now();
    loop {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        let moved = r
            .metric("bigfleet_coordinator_rebalance_machines_moved_total")
            .await;
        if moved == Some(2.0) {
            break;
        }
        assert!(
            start.elapsed() < WITHIN,
            "timed out waiting: the transfer finishes\n{}",
            r.log_tail()
        );
    }
    assert_eq!(recipient.idle, ["m1", "m2"]);
    assert_eq!(
        r.metric(
            "bigfleet_coordinator_rebalance_transfers_finished_total{kind=\"transfer_ownership\",outcome=\"done\"}"
        )
        .await,
        Some(1.0)
    );
    // Nothing is pending any more for either shard.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let before = (recipient.seen.len(), donor.seen.len());
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        assert_eq!((recipient.seen.len(), donor.seen.len()), before);
    }
    assert_eq!(
        r.metric("bigfleet_coordinator_rebalance_transfers_in_flight")
            .await,
        Some(0.0)
    );
}

/// A recipient that cannot adopt (a shard without the handler answers REJECTED_INVALID,
/// ADR-0032) gets nothing, and the donor is told to take its machines back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_adopt_returns_the_machines_to_the_donor() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = replica(dir.path());
    r.spawn("");
    let mut c = connect(&mut r).await;
    let mut recipient = FakeShard::short_of_gpus("s0", 1);
    recipient.refuse_adopt = true;
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1"]);
    let start = Instant::now();
    loop {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        let failed = r
            .metric(
                "bigfleet_coordinator_rebalance_transfers_finished_total{kind=\"transfer_ownership\",outcome=\"failed\"}",
            )
            .await;
        if failed == Some(1.0) {
            break;
        }
        assert!(
            start.elapsed() < WITHIN,
            "timed out waiting for the failed transfer\n{}",
            r.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let donor_side: Vec<_> = donor
        .transfers()
        .into_iter()
        .map(|(_, t, _)| (t.from_shard_id, t.to_shard_id, t.machine_ids))
        .collect();
    assert_eq!(
        donor_side.last().unwrap(),
        &("s0".to_owned(), "s1".to_owned(), vec!["m1".to_owned()]),
        "{donor_side:?}"
    );
    assert_eq!(donor.idle, ["m1"]);
    assert!(recipient.idle.is_empty());
    assert_eq!(
        r.metric("bigfleet_coordinator_rebalance_machines_moved_total")
            .await,
        Some(0.0)
    );
}

/// Only the shard a phase addresses can answer it: a forged ack from a third shard moves
/// nothing, and the donor keeps being asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_from_another_shard_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = replica(dir.path());
    r.spawn("");
    let mut c = connect(&mut r).await;
    let mut recipient = FakeShard::short_of_gpus("s0", 1);
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1"]);
    donor.answering = false;
    let mut other = FakeShard::new("s2");
    let start = Instant::now();
    while donor.transfers().is_empty() {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        other.report(&mut c).await.unwrap();
        assert!(start.elapsed() < WITHIN, "no release\n{}", r.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (release_id, _, _) = donor.transfers()[0].clone();
    other.acks.push(pb::InstructAck {
        instruction_id: release_id.clone(),
        outcome: pb::instruct_ack::Outcome::Accepted as i32,
        reason: "released: m1".into(),
    });
    other.report(&mut c).await.unwrap();
    for _ in 0..3 {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(recipient.transfers().is_empty(), "{:?}", recipient.seen);
    assert!(other.seen.is_empty(), "{:?}", other.seen);
    assert_eq!(donor.transfers().last().unwrap().0, release_id);
    assert!(
        r.log_tail()
            .contains("transfer ack from a shard the instruction was not for")
    );
}
