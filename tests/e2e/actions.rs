//! The action history tells what a shard actually did (issue 20): a scenario run through
//! the real gateway, decide, execute and fake provider, then `RecentActions` read from the
//! shard's public port and fleet-wide through inspect, compared with the provider's own
//! record of the machines.

use std::collections::BTreeSet;
use std::time::Duration;

use bigfleet_loadtest::Demand;
use bigfleet_proto::mesh::v1 as meshpb;
use bigfleet_proto::v1alpha1 as pb;
use pb::MachineState as S;

use crate::harness::*;

/// `RecentActions` of shard 0 (its public port) or of the fleet (inspect), as `readonly`.
async fn recent_actions(sc: &Scenario, through_inspect: bool) -> meshpb::RecentActionsResponse {
    let mesh = sc.mesh();
    let scheme = if mesh.spec().tls { "https" } else { "http" };
    let req = meshpb::RecentActionsRequest {
        cluster_id: "cluster-h".into(),
        limit: 100,
        ..Default::default()
    };
    if through_inspect {
        let p = mesh.ports().inspect.as_ref().expect("inspect runs");
        let ch = mesh
            .channel(&format!("{scheme}://{}", p.grpc), "readonly")
            .await
            .expect("dial inspect");
        let mut c =
            bigfleet_mesh::with_message_limits!(meshpb::inspect_client::InspectClient::new(ch));
        c.recent_actions(req)
            .await
            .expect("Inspect.RecentActions")
            .into_inner()
    } else {
        let ch = mesh
            .channel(&mesh.gateway_target(0), "readonly")
            .await
            .expect("dial the gateway");
        let mut c = bigfleet_mesh::with_message_limits!(
            meshpb::shard_info_client::ShardInfoClient::new(ch)
        );
        c.recent_actions(req)
            .await
            .expect("ShardInfo.RecentActions")
            .into_inner()
    }
}

/// Four GPU machines bootstrapped for a cluster, then reclaimed when it withdraws its
/// demand: the history lists exactly those eight actions, newest first, each with the
/// reason the engine gave, the machine the provider moved and a finished outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_action_history_is_what_the_shard_did_in_order_with_reasons() {
    let mut sc = Scenario::start("small-gpu.json", |spec| {
        // No reclaim budget: the withdrawal drains at once instead of one per 10 minutes.
        spec.decide_flags = vec![
            "--cycle-interval".into(),
            "100ms".into(),
            "--reclaim-budget-fraction=0".into(),
        ];
    })
    .await;
    let op = sc.operator("cluster-h", gpu_units(4, 1000));
    let configured = sc
        .wait_for(4, S::Configured, "cluster-h", Duration::from_secs(60))
        .await;
    sc.operators[op].set_demand(Demand::empty());
    sc.wait_for(16, S::Idle, "", Duration::from_secs(60)).await;

    // The records are written when a worker reports; wait until all eight finished.
    let shard = wait_until(
        Duration::from_secs(30),
        "eight finished actions",
        || async {
            let r = recent_actions(&sc, false).await;
            let finished = r
                .actions
                .iter()
                .filter(|a| a.finished_at_unix_nanos > 0)
                .count();
            if finished == 8 && r.actions.len() == 8 {
                Ok(r)
            } else {
                Err(format!("{} records, {finished} finished", r.actions.len()))
            }
        },
    )
    .await;
    let a = &shard.actions;
    // Newest first: the four reclaims, then the four bootstraps.
    let kinds: Vec<(&str, &str)> = a
        .iter()
        .map(|r| (r.kind.as_str(), r.reason.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            vec![("reclaim", "phase3.excess"); 4],
            vec![("bootstrap", "phase1.idle"); 4]
        ]
        .concat(),
        "{a:#?}"
    );
    for r in a {
        assert_eq!(r.outcome, "succeeded", "{r:?}");
        assert_eq!(r.cluster_id, "cluster-h", "{r:?}");
        assert_eq!(r.shard_id, "shard-0", "{r:?}");
        assert!(!r.action_id.is_empty(), "a worker ran it: {r:?}");
        assert!(
            r.decided_at_unix_nanos <= r.started_at_unix_nanos
                && r.started_at_unix_nanos <= r.finished_at_unix_nanos,
            "{r:?}"
        );
    }
    // The machines are the ones the provider configured, each bootstrapped then reclaimed.
    let ids = |kind: &str| -> BTreeSet<String> {
        a.iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.machine_id.clone())
            .collect()
    };
    assert_eq!(ids("bootstrap"), configured);
    assert_eq!(ids("reclaim"), configured);
    // The bootstraps carry the need they served; ordering is by finish time, then seq.
    assert!(
        a.iter()
            .filter(|r| r.kind == "bootstrap")
            .all(|r| !r.need_fingerprint.is_empty() && r.priority == 1000),
        "{a:#?}"
    );
    assert!(
        a.windows(2)
            .all(|w| (w[0].finished_at_unix_nanos, w[0].seq)
                > (w[1].finished_at_unix_nanos, w[1].seq)),
        "newest first: {a:#?}"
    );
    // No machine is reclaimed while its bootstrap still runs. (Across machines the order may
    // interleave: the operator sees a machine configured, and drops its demand, a moment
    // before the worker reports the bootstrap finished.)
    let at = |kind: &str, machine: &str, when: fn(&meshpb::ActionRecord) -> i64| {
        a.iter()
            .find(|r| r.kind == kind && r.machine_id == machine)
            .map(when)
            .unwrap_or_else(|| panic!("no {kind} of {machine}: {a:#?}"))
    };
    for m in &configured {
        let bootstrapped = at("bootstrap", m, |r| r.finished_at_unix_nanos);
        let reclaim_decided = at("reclaim", m, |r| r.decided_at_unix_nanos);
        assert!(bootstrapped < reclaim_decided, "{m}: {a:#?}");
    }

    // Inspect's fleet-wide answer is the same records.
    let fleet = recent_actions(&sc, true).await;
    let key = |r: &meshpb::ActionRecord| (r.shard_id.clone(), r.seq, r.machine_id.clone());
    assert_eq!(
        fleet.actions.iter().map(key).collect::<Vec<_>>(),
        shard.actions.iter().map(key).collect::<Vec<_>>()
    );
    sc.finish().await;
}
