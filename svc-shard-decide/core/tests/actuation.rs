//! The actuation gate: with a leased epoch source only the hand-out of work pauses
//! between terms — cycles, roll-ups and reads go on — and each term's items carry that
//! term's epoch.

use crate::common;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::v1alpha1 as pb;
use common::*;
use std::time::Duration;
use svc_shard_decide_core::edge;
use svc_shard_decide_core::{DecideConfig, EpochSource};
use tokio::sync::watch;

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(3);

#[tokio::test]
async fn hand_out_follows_the_leased_terms() {
    let (terms, rx) = watch::channel(None);
    let cfg = DecideConfig {
        epoch: 4,
        epoch_source: EpochSource::Leased(rx),
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, idle_fleet(6, |i| format!("i{i}"))).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(24, 50)])).unwrap();
    // No term: the cycle still decides and queues.
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 6);
    assert_eq!(h.decide.actuating_epoch(), None);
    assert_eq!(
        h.decide.epoch(),
        4,
        "reports carry the process epoch before any term"
    );

    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(2).await;
    assert!(w.next(SHORT).await.is_none(), "standby hands out nothing");
    // Reads keep working while paused.
    let d = ShardInfoClient::new(uds_channel(&h.decide_sock))
        .describe(mesh::DescribeShardRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((d.cycle, d.shard_epoch), (1, 4));

    // A term begins: the waiting stream wakes without any new cycle or credit.
    terms.send_replace(Some(7));
    let a = w.next(LONG).await.expect("hand-out resumed");
    let b = w.next(LONG).await.expect("second credit");
    for item in [&a, &b] {
        assert_eq!(item.fencing.as_ref().unwrap().epoch, 7);
    }
    assert_eq!(h.decide.epoch(), 7);

    // The term ends: cycles go on, hand-outs stop at once.
    terms.send_replace(None);
    w.credit(2).await;
    assert!(w.next(SHORT).await.is_none());
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.cycle, 2);
    assert_eq!(h.decide.epoch(), 7, "between terms: the last term's epoch");

    // A new, higher term: items carry it.
    terms.send_replace(Some(9));
    let c = w.next(LONG).await.expect("resumed under the new term");
    assert_eq!(c.fencing.as_ref().unwrap().epoch, 9);
    // Action ids keep the process epoch, so they stay unique across restarts.
    assert!(c.action_id.starts_with("e4"), "{}", c.action_id);
}

#[tokio::test]
async fn a_fixed_source_always_hands_out_under_the_process_epoch() {
    let cfg = DecideConfig {
        epoch: 12,
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, [pm("i0", pb::MachineState::Idle, "")]).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 50)])).unwrap();
    h.decide.run_cycle().await.unwrap();
    assert_eq!(h.decide.actuating_epoch(), Some(12));
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1).await;
    let item = w.next(LONG).await.unwrap();
    assert_eq!(item.fencing.unwrap().epoch, 12);
}
