//! The action history (ADR-0125) end to end: a real decide cycle, an execute worker on
//! the Work stream, and `ShardInfo.RecentActions` / `ShardInfo.ListMachines` answering
//! what actually happened.

use crate::common;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::wait_until;
use common::*;
use std::time::Duration;
use svc_shard_decide_core::{DecideConfig, RailsConfig, edge};

const LONG: Duration = Duration::from_secs(3);

async fn recent(h: &Harness, req: mesh::RecentActionsRequest) -> mesh::RecentActionsResponse {
    ShardInfoClient::new(uds_channel(&h.decide_sock))
        .recent_actions(req)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn recent_actions_say_what_workers_did_newest_first_with_reasons() {
    let h = Harness::listing(cfg_rails_off(), idle_fleet(2, |i| format!("i{i:03}"))).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(8, 50)])).unwrap();
    assert_eq!(h.decide.run_cycle().await.unwrap().enqueued, 2);
    assert!(
        recent(&h, Default::default()).await.actions.is_empty(),
        "queued is not history yet"
    );

    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(2).await;
    let first = w.next(LONG).await.unwrap();
    let second = w.next(LONG).await.unwrap();
    w.done(&first.action_id, "succeeded").await;
    w.done(&second.action_id, "failed").await;
    wait_until(LONG, "both reported", async || {
        h.decide.action_counts() == (0, 0)
    })
    .await;

    let got = recent(&h, Default::default()).await;
    assert_eq!((got.capacity, got.recorded), (10_000, 2));
    let summary: Vec<(&str, &str, &str, &str, &str, &str)> = got
        .actions
        .iter()
        .map(|a| {
            (
                a.action_id.as_str(),
                a.outcome.as_str(),
                a.kind.as_str(),
                a.reason.as_str(),
                a.cluster_id.as_str(),
                a.shard_id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                second.action_id.as_str(),
                "failed",
                "bootstrap",
                "phase1.idle",
                "c1",
                "shard-0"
            ),
            (
                first.action_id.as_str(),
                "succeeded",
                "bootstrap",
                "phase1.idle",
                "c1",
                "shard-0"
            ),
        ],
        "newest first"
    );
    for (a, item) in got.actions.iter().zip([&second, &first]) {
        let action = item.action.as_ref().unwrap();
        assert_eq!(a.machine_id, action.machine_id);
        assert_eq!(a.need_fingerprint, action.need_fingerprint);
        assert!(!a.need_fingerprint.is_empty());
        assert_eq!(a.priority, 50);
        assert_eq!(a.cycle, 1);
        assert!(
            a.decided_at_unix_nanos > 0
                && a.decided_at_unix_nanos <= a.started_at_unix_nanos
                && a.started_at_unix_nanos <= a.finished_at_unix_nanos,
            "{a:?}"
        );
        assert_eq!(
            a.run_nanos,
            a.finished_at_unix_nanos - a.started_at_unix_nanos
        );
    }
    assert!(got.actions[0].seq > got.actions[1].seq);

    // Filters: another cluster, a poll after the newest, a limit, a future `since`.
    let none = recent(
        &h,
        mesh::RecentActionsRequest {
            cluster_id: "c2".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(none.actions.is_empty());
    let after = recent(
        &h,
        mesh::RecentActionsRequest {
            after_seq: got.actions[1].seq,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(after.actions.len(), 1);
    assert_eq!(after.actions[0].outcome, "failed");
    let one = recent(
        &h,
        mesh::RecentActionsRequest {
            limit: 1,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(one.actions.len(), 1);
    let later = recent(
        &h,
        mesh::RecentActionsRequest {
            since_unix_nanos: got.actions[0].finished_at_unix_nanos + 1,
            ..Default::default()
        },
    )
    .await;
    assert!(later.actions.is_empty());
}

#[tokio::test]
async fn actions_decide_does_not_hand_out_are_history_too_and_the_ring_is_bounded() {
    let cfg = DecideConfig {
        rails: RailsConfig {
            actuation_paused: true,
            ..RailsConfig::off()
        },
        action_history: 2,
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, idle_fleet(3, |i| format!("i{i:03}"))).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(12, 50)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!((r.suppressed, r.enqueued), (3, 0));
    let got = recent(&h, Default::default()).await;
    assert_eq!((got.capacity, got.recorded), (2, 3));
    assert_eq!(got.actions.len(), 2, "bounded to two");
    for a in &got.actions {
        assert_eq!(
            (
                a.outcome.as_str(),
                a.reason.as_str(),
                a.started_at_unix_nanos,
                a.run_nanos
            ),
            ("suppressed", "phase1.idle", 0, 0)
        );
        assert!(a.action_id.is_empty());
    }
    assert_eq!(got.actions[0].seq, 3);
    assert_eq!(got.actions[1].seq, 2);
}

#[tokio::test]
async fn list_machines_pages_in_id_order_with_filters() {
    let configured = pm("c-000", pb::MachineState::Configured, "c1");
    let machines = idle_fleet(5, |i| format!("i{i:03}")).chain([configured]);
    let h = Harness::listing(cfg_rails_off(), machines).await;
    h.decide.run_cycle().await.unwrap();
    let mut info = ShardInfoClient::new(uds_channel(&h.decide_sock));
    let ids = |r: &mesh::ListMachinesResponse| -> Vec<String> {
        r.machines
            .iter()
            .map(|m| m.machine.as_ref().unwrap().id.clone())
            .collect()
    };
    let page = info
        .list_machines(mesh::ListMachinesRequest {
            limit: 4,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&page), ["c-000", "i000", "i001", "i002"]);
    assert_eq!(
        (page.total_matching, page.next_after_machine_id.as_str()),
        (6, "i002")
    );
    assert!(page.machines.iter().all(|m| m.shard_id == "shard-0"));
    let rest = info
        .list_machines(mesh::ListMachinesRequest {
            limit: 4,
            after_machine_id: page.next_after_machine_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&rest), ["i003", "i004"]);
    assert!(rest.next_after_machine_id.is_empty());

    let c1 = info
        .list_machines(mesh::ListMachinesRequest {
            cluster_id: "c1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&c1), ["c-000"]);
    assert_eq!(
        c1.machines[0].machine.as_ref().unwrap().state,
        pb::MachineState::Configured as i32
    );
    let idle = info
        .list_machines(mesh::ListMachinesRequest {
            states: vec![pb::MachineState::Idle as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(idle.total_matching, 5);
    assert!(idle.machines.iter().all(|m| m.idle_since_unix_nanos > 0));
    let bad = info
        .list_machines(mesh::ListMachinesRequest {
            states: vec![99],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}
