//! Fleet-wide recent actions and machine lists (ADR-0125): svc-inspect fans
//! `ShardInfo.RecentActions` / `ShardInfo.ListMachines` out to every shard and merges
//! them, on gRPC (`bigfleet.mesh.v1.Inspect`) and as JSON under `/api/v1`.

use crate::common;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_client::InspectClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::tools::tool;
use common::{Harness, Options, get_json, http_get, shoot_and_expect};
use svc_inspect::doubles::records_shard;
use svc_inspect::http::{ActionsResponse, MachinesResponse};
use tonic::Code;
use tonic::transport::Channel;

fn action(
    shard: &str,
    seq: u64,
    cluster: &str,
    finished: i64,
    outcome: &str,
) -> mesh::ActionRecord {
    mesh::ActionRecord {
        shard_id: shard.into(),
        seq,
        kind: "bootstrap".into(),
        reason: "phase1.idle".into(),
        machine_id: format!("{shard}-m{seq}"),
        cluster_id: cluster.into(),
        outcome: outcome.into(),
        decided_at_unix_nanos: finished - 10,
        started_at_unix_nanos: finished - 5,
        finished_at_unix_nanos: finished,
        run_nanos: 5,
        ..Default::default()
    }
}

fn machine(shard: &str, id: &str, state: pb::MachineState, cluster: &str) -> mesh::MachineRow {
    mesh::MachineRow {
        shard_id: shard.into(),
        machine: Some(pb::Machine {
            id: id.into(),
            state: state as i32,
            cluster: cluster.into(),
            instance_type: "m.large".into(),
            price_per_hour: 0.5,
            ..Default::default()
        }),
        idle_since_unix_nanos: 0,
    }
}

async fn harness() -> Harness {
    Harness::start(Options {
        shards: vec![
            records_shard(
                "sa",
                vec![
                    action("sa", 1, "c1", 100, "succeeded"),
                    action("sa", 2, "c2", 300, "failed"),
                ],
                vec![
                    machine("sa", "m-1", pb::MachineState::Idle, ""),
                    machine("sa", "m-4", pb::MachineState::Configured, "c1"),
                ],
            ),
            records_shard(
                "sb",
                vec![
                    action("sb", 7, "c1", 200, "succeeded"),
                    action("sb", 8, "c1", 400, "suppressed"),
                ],
                vec![
                    machine("sb", "m-2", pb::MachineState::Configured, "c1"),
                    machine("sb", "m-3", pb::MachineState::Idle, ""),
                ],
            ),
        ],
        // s3 is registered and down.
        with_dead_shard: true,
        ..Options::default()
    })
    .await
}

fn finished(r: &mesh::RecentActionsResponse) -> Vec<(&str, i64)> {
    r.actions
        .iter()
        .map(|a| (a.shard_id.as_str(), a.finished_at_unix_nanos))
        .collect()
}

async fn recent_actions(
    c: &mut InspectClient<Channel>,
    req: mesh::RecentActionsRequest,
) -> Result<mesh::RecentActionsResponse, tonic::Status> {
    Ok(c.recent_actions(req).await?.into_inner())
}

async fn list_machines(
    c: &mut InspectClient<Channel>,
    req: mesh::ListMachinesRequest,
) -> mesh::ListMachinesResponse {
    c.list_machines(req).await.unwrap().into_inner()
}

#[tokio::test]
async fn recent_actions_merge_newest_first_over_shards() {
    let h = harness().await;
    let mut c = InspectClient::connect(h.grpc_uri()).await.unwrap();
    let all = recent_actions(&mut c, mesh::RecentActionsRequest::default())
        .await
        .unwrap();
    assert_eq!(
        finished(&all),
        [("sb", 400), ("sa", 300), ("sb", 200), ("sa", 100)]
    );
    assert_eq!(all.actions[0].outcome, "suppressed");
    assert_eq!(all.actions[1].reason, "phase1.idle");
    assert_eq!(all.unreachable.len(), 1);
    assert_eq!(all.unreachable[0].shard_id, "s3");

    // Filters: what each finds (newest first), and how many shards did not answer (when
    // only sa is asked, the dead s3 is not).
    let by_cluster = mesh::RecentActionsRequest {
        cluster_id: "c1".into(),
        limit: 2,
        ..Default::default()
    };
    let by_shard = mesh::RecentActionsRequest {
        shard_id: "sa".into(),
        since_unix_nanos: 150,
        ..Default::default()
    };
    for (req, want, down) in [
        (by_cluster, vec![("sb", 400), ("sb", 200)], 1),
        (by_shard, vec![("sa", 300)], 0),
    ] {
        let got = recent_actions(&mut c, req.clone()).await.unwrap();
        assert_eq!(
            (finished(&got), got.unreachable.len()),
            (want, down),
            "{req:?}"
        );
    }

    let unknown = recent_actions(
        &mut c,
        mesh::RecentActionsRequest {
            shard_id: "nope".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    let (status, v): (_, ActionsResponse) = get_json(&h, "/api/v1/actions?cluster=c1").await;
    assert_eq!(status, 200);
    let got: Vec<(&str, &str, &str)> = v
        .actions
        .iter()
        .map(|a| (a.shard_id.as_str(), a.outcome.as_str(), a.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("sb", "suppressed", "phase1.idle"),
            ("sb", "succeeded", "phase1.idle"),
            ("sa", "succeeded", "phase1.idle")
        ]
    );
    assert_eq!(v.unreachable.len(), 1);
    // `since` is a duration back from now: every canned record is far older.
    let (_, v): (_, ActionsResponse) = get_json(&h, "/api/v1/actions?since=1h").await;
    assert!(v.actions.is_empty(), "{v:?}");
    let (status, _, _) = http_get(h.inspect().http_addr(), "/api/v1/actions?since=soon").await;
    assert_eq!(status, 400);
    h.shutdown().await;
}

#[tokio::test]
async fn machines_merge_in_id_order_and_page_over_shards() {
    let h = harness().await;
    let mut c = InspectClient::connect(h.grpc_uri()).await.unwrap();
    let ids = |r: &mesh::ListMachinesResponse| -> Vec<(String, String)> {
        r.machines
            .iter()
            .map(|m| (m.shard_id.clone(), m.machine.as_ref().unwrap().id.clone()))
            .collect()
    };
    let first = list_machines(
        &mut c,
        mesh::ListMachinesRequest {
            limit: 3,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ids(&first),
        [
            ("sa".to_owned(), "m-1".to_owned()),
            ("sb".to_owned(), "m-2".to_owned()),
            ("sb".to_owned(), "m-3".to_owned())
        ]
    );
    assert_eq!(
        (first.total_matching, first.next_after_machine_id.as_str()),
        (4, "m-3")
    );
    assert_eq!(first.unreachable.len(), 1);
    let second = list_machines(
        &mut c,
        mesh::ListMachinesRequest {
            limit: 3,
            after_machine_id: first.next_after_machine_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids(&second), [("sa".to_owned(), "m-4".to_owned())]);
    assert!(second.next_after_machine_id.is_empty());

    let (status, v): (_, MachinesResponse) =
        get_json(&h, "/api/v1/machines?state=configured&cluster=c1").await;
    assert_eq!(status, 200);
    let got: Vec<(&str, &str, &str)> = v
        .machines
        .iter()
        .map(|m| (m.id.as_str(), m.state.as_str(), m.shard_id.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("m-2", "MACHINE_STATE_CONFIGURED", "sb"),
            ("m-4", "MACHINE_STATE_CONFIGURED", "sa")
        ]
    );
    assert_eq!(v.total_matching, 2);
    let (status, _, _) = http_get(h.inspect().http_addr(), "/api/v1/machines?state=sleepy").await;
    assert_eq!(status, 400);
    h.shutdown().await;
}

#[tokio::test]
async fn dashboard_pages_list_actions_and_machines() {
    let h = harness().await;
    let addr = h.inspect().http_addr();
    let (status, _, body) = http_get(addr, "/actions?cluster=c1").await;
    assert_eq!(status, 200, "{body}");
    let at = |needle: &str| {
        body.find(needle)
            .unwrap_or_else(|| panic!("{needle} missing: {body}"))
    };
    // Newest first: sb's suppressed (400), sb's succeeded (200), sa's succeeded (100).
    assert!(at("sb-m8") < at("sb-m7") && at("sb-m7") < at("sa-m1"));
    assert!(!body.contains("sa-m2"), "c2's action is filtered out");
    assert!(body.contains("phase1.idle") && body.contains("did not answer"));

    let (status, _, body) = http_get(addr, "/machines?limit=3&state=idle,configured").await;
    assert_eq!(status, 200, "{body}");
    for id in ["m-1", "m-2", "m-3"] {
        assert!(body.contains(&format!(">{id}<")), "{id}: {body}");
    }
    assert!(!body.contains(">m-4<"));
    assert!(
        body.contains("/machines?after=m-3&amp;state=idle%2Cconfigured&amp;limit=3"),
        "{body}"
    );
    let (status, _, _) = http_get(addr, "/machines?state=sleepy").await;
    assert_eq!(status, 400);
    h.shutdown().await;
}

#[tokio::test]
async fn headless_chromium_renders_the_actions_and_machines_pages() {
    let Some(bin) = tool("BIGFLEET_CHROMIUM") else {
        return;
    };
    let h = harness().await;
    let base = format!("http://{}", h.inspect().http_addr());
    shoot_and_expect(
        &bin,
        &format!("{base}/actions"),
        "dashboard-actions.png",
        &["Recent actions", "sb-m8", "suppressed", "phase1.idle", "s3"],
    )
    .await;
    shoot_and_expect(
        &bin,
        &format!("{base}/machines"),
        "dashboard-machines.png",
        &["Machines", "m-1", "m-4", "CONFIGURED", "4 machines match"],
    )
    .await;
    h.shutdown().await;
}
