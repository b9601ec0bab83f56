//! The leader's rebalancer end to end against the real `bigfleet-coordinator` binary: two
//! fake shards report — one short of a machine type, one with that type idle — and receive
//! the transfer's instructions in protocol order (donor releases first, recipient adopts
//! only after the donor's ack), across a restart of the leader mid-transfer.

use crate::common;

use std::time::Duration;

use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::{self as pb};
use bigfleet_testkit::wait_until;
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

/// A `wait_until` verdict whose "not yet" carries the replica's log, so a timeout shows it.
fn progress(r: &Replica, done: bool) -> Result<(), String> {
    if done {
        Ok(())
    } else {
        Err(format!("not yet; replica log:\n{}", r.log_tail()))
    }
}

/// A leading replica that rebalances eagerly (its data in the returned directory), and a
/// client of it.
async fn eager_leader() -> (tempfile::TempDir, Replica, CoordinatorClient<Channel>) {
    let dir = tempfile::tempdir().unwrap();
    let mut r = replica(dir.path());
    r.spawn("");
    let c = connect(&mut r).await;
    (dir, r, c)
}

async fn connect(r: &mut Replica) -> CoordinatorClient<Channel> {
    wait_leader(std::slice::from_mut(r), WITHIN).await;
    client(&r.api_addr()).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_supply_moves_in_two_phases_across_a_leader_restart() {
    let (_dir, mut r, mut c) = eager_leader().await;

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

    wait_until(WITHIN, "the donor to be told to release", async || {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        progress(&r, !donor.transfers().is_empty())
    })
    .await;
    let (release_id, release, term1) = donor.transfers()[0].clone();
    assert_eq!(release.from_shard_id, "s1");
    assert_eq!(release.to_shard_id, "s0");
    assert_eq!(release.machine_ids, ["*/gpu", "*/gpu"]);
    // The recipient is told nothing before the donor has released.
    assert!(recipient.transfers().is_empty(), "{:?}", recipient.seen);
    // The rebalancer counts a decision once its Raft write returns, which may be a moment
    // after a report already carried the committed instruction: wait for the count, then
    // check it is exactly one.
    let decisions = wait_until(WITHIN, "the decision to be counted", async || {
        let n = r
            .metric("bigfleet_coordinator_rebalance_decisions_total{kind=\"transfer_ownership\"}")
            .await;
        n.filter(|n| *n >= 1.0)
    })
    .await;
    assert_eq!(decisions, 1.0);

    // The leader dies mid-transfer and comes back; the donor now answers.
    r.kill();
    r.spawn("");
    let mut c = connect(&mut r).await;
    donor.answering = true;
    let delivered = donor.seen.len();
    wait_until(
        WITHIN,
        "the release to be redelivered by the restarted leader",
        async || {
            let _ = recipient.report(&mut c).await;
            let _ = donor.report(&mut c).await;
            progress(&r, donor.seen.len() > delivered)
        },
    )
    .await;
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
    wait_until(
        WITHIN,
        "the recipient to adopt the released machines",
        async || {
            donor.report(&mut c).await.unwrap();
            recipient.report(&mut c).await.unwrap();
            progress(&r, !recipient.transfers().is_empty())
        },
    )
    .await;
    let (_, adopt, _) = recipient.transfers()[0].clone();
    assert_eq!(adopt.machine_ids, ["m1", "m2"]);
    assert_eq!(
        (adopt.from_shard_id.as_str(), adopt.to_shard_id.as_str()),
        ("s1", "s0")
    );
    assert_eq!(donor.idle, ["m3"]);

    // The recipient's ack finishes it; its shortfall is met and nothing more is decided.
    recipient.shortfalls.clear();
    wait_until(WITHIN, "the transfer to finish", async || {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        let moved = r
            .metric("bigfleet_coordinator_rebalance_machines_moved_total")
            .await;
        progress(&r, moved == Some(2.0))
    })
    .await;
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
    let (_dir, r, mut c) = eager_leader().await;
    let mut recipient = FakeShard::short_of_gpus("s0", 1);
    recipient.refuse_adopt = true;
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1"]);
    wait_until(WITHIN, "the failed transfer", async || {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        let failed = r
            .metric(
                "bigfleet_coordinator_rebalance_transfers_finished_total{kind=\"transfer_ownership\",outcome=\"failed\"}",
            )
            .await;
        progress(&r, failed == Some(1.0))
    })
    .await;
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
    let (_dir, r, mut c) = eager_leader().await;
    let mut recipient = FakeShard::short_of_gpus("s0", 1);
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1"]);
    donor.answering = false;
    let mut other = FakeShard::new("s2");
    wait_until(WITHIN, "a release", async || {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        other.report(&mut c).await.unwrap();
        progress(&r, !donor.transfers().is_empty())
    })
    .await;
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
