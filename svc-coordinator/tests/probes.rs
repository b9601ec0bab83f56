//! Probes and metrics of an in-process replica: gRPC health (default service for liveness,
//! `bigfleet.v1alpha1.Coordinator` for leadership), HTTP /healthz and /readyz, and the
//! coordinator metrics.

use crate::common;

use std::time::Duration;

use bigfleet_mesh::binary::Ops;
use bigfleet_proto::v1alpha1::{self as pb};
use clap::Parser;
use common::{assign, client, http_get, metric, report};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn args(dir: &std::path::Path, bootstrap: bool) -> svc_coordinator::Args {
    let mut v = vec![
        "bigfleet-coordinator".to_owned(),
        "--id".into(),
        "probe".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--raft-bind".into(),
        "127.0.0.1:0".into(),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        dir.to_str().unwrap().into(),
    ];
    if bootstrap {
        v.push("--bootstrap".into());
    }
    svc_coordinator::Args::try_parse_from(v).unwrap()
}

/// A replica as the binary runs it: the ops endpoint first, the replica on its registry and
/// readiness.
async fn start_served(args: svc_coordinator::Args) -> (svc_coordinator::Running, Ops, u16) {
    let ops = Ops::start("127.0.0.1:0", svc_coordinator::NO_LEADER)
        .await
        .unwrap();
    let running = svc_coordinator::start_with(args, ops.registry.clone(), ops.readiness.clone())
        .await
        .unwrap();
    let port = ops.addr().unwrap().port();
    (running, ops, port)
}

async fn health(addr: std::net::SocketAddr, service: &str) -> i32 {
    let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_follow_leadership_and_metrics_are_exposed() {
    let dir = tempfile::tempdir().unwrap();

    // A replica that never bootstraps sees no leader: alive, not ready.
    let (idle, idle_ops, mport) = start_served(args(&dir.path().join("idle"), false)).await;
    assert_eq!(
        health(idle.api_addr, "").await,
        ServingStatus::Serving as i32
    );
    assert_eq!(
        health(idle.api_addr, "bigfleet.v1alpha1.Coordinator").await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(http_get(mport, "/healthz").await.unwrap().0, 200);
    assert_eq!(http_get(mport, "/readyz").await.unwrap().0, 503);
    let mut c = client(&idle.api_addr.to_string()).await.unwrap();
    let err = c.list_shards(pb::ListShardsRequest {}).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    idle_ops
        .drain_after(async {}, idle.shutdown())
        .await
        .unwrap();

    // A bootstrapped one leads: both probes pass.
    let (r, ops, mport) = start_served(args(&dir.path().join("leader"), true)).await;
    bigfleet_testkit::wait_until(Duration::from_secs(10), "SERVING", async || {
        health(r.api_addr, "bigfleet.v1alpha1.Coordinator").await == ServingStatus::Serving as i32
    })
    .await;
    assert_eq!(http_get(mport, "/readyz").await.unwrap().0, 200);

    let mut c = client(&r.api_addr.to_string()).await.unwrap();
    c.report_shard(report("s1", 1)).await.unwrap();
    c.assign_domain(assign("rack", "r1", "s1")).await.unwrap();
    assert!(c.assign_domain(assign("rack", "r1", "nope")).await.is_err());
    assert!(
        metric(mport, "bigfleet_coordinator_raft_term")
            .await
            .unwrap()
            >= 1.0
    );
    assert_eq!(
        metric(
            mport,
            "bigfleet_coordinator_apply_total{outcome=\"success\"}"
        )
        .await,
        Some(2.0)
    );
    assert_eq!(
        metric(
            mport,
            "bigfleet_coordinator_apply_total{outcome=\"fsm_error\"}"
        )
        .await,
        Some(1.0)
    );
    assert_eq!(
        metric(
            mport,
            "bigfleet_coordinator_pending_instructions{shard=\"s1\"}"
        )
        .await,
        Some(1.0)
    );
    // The shard acknowledges: the queue empties.
    let ack = c.report_shard(report("s1", 2)).await.unwrap().into_inner();
    let id = ack.instructions[0].instruction_id.clone();
    let mut rep = report("s1", 3);
    rep.instruction_acks = vec![pb::InstructAck {
        instruction_id: id,
        outcome: pb::instruct_ack::Outcome::Accepted as i32,
        reason: String::new(),
    }];
    let ack = c.report_shard(rep).await.unwrap().into_inner();
    assert!(ack.instructions.is_empty());
    assert_eq!(
        metric(
            mport,
            "bigfleet_coordinator_pending_instructions{shard=\"s1\"}"
        )
        .await,
        Some(0.0)
    );
    // Stopping: not ready while the replica drains, though it still sees its leader.
    ops.drain_after(async {}, async {
        let (code, body) = http_get(mport, "/readyz").await.unwrap();
        assert_eq!((code, body.trim()), (503, "draining"));
        r.shutdown().await
    })
    .await
    .unwrap();
}
