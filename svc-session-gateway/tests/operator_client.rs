//! The simulated operator (bigfleet-loadtest) against a real gateway and a Decide double
//! over a Unix socket: roll-ups, demand changes, node updates, bootstrap, reclaim,
//! reconnect after a gateway restart, and mTLS with a cluster certificate.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_loadtest::{
    Backoff, BootstrapBehavior, Demand, MachineState, NeedSpec, Operator, OperatorConfig,
};
use bigfleet_proto::mesh::v1::{
    BootstrapError, SendReclaimRequest, ShardEvent, request_bootstrap_response,
};
use bigfleet_testkit::wait_until;
use common::*;

fn fast(cluster: &str, target: &str) -> OperatorConfig {
    let mut cfg = OperatorConfig::new(cluster, target);
    cfg.rollup_interval = Duration::from_secs(3600); // only the immediate and demand-driven ones
    cfg.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    cfg
}

fn node(cluster: &str, machine: &str, state: MachineState) -> ShardEvent {
    node_event(cluster, machine, i32::from(state.ordinal()))
}

#[tokio::test]
async fn the_simulated_operator_speaks_the_whole_protocol() {
    let h = Harness::start(Options::default()).await;
    let op = Operator::spawn(fast("op-1", &h.target()));
    assert!(op.wait_connected(Duration::from_secs(5)).await);
    assert!(
        op.wait_for(Duration::from_secs(5), |s| s.rollup_acks >= 1)
            .await
    );
    assert_eq!(
        h.stub.rollup("op-1").unwrap().needs.len(),
        3,
        "typical demand"
    );
    let st = op.stats();
    assert_eq!(
        (st.last_shard_epoch, st.last_coordinator_term),
        (EPOCH, TERM)
    );

    // A demand change goes out at once, as a full replacement.
    op.set_demand(Demand::new(vec![NeedSpec::rack_gang("train", 4, 8, 5000)]));
    assert!(
        op.wait_for(Duration::from_secs(5), |s| s.rollup_acks >= 2)
            .await
    );
    let r = h.stub.rollup("op-1").unwrap();
    assert_eq!(r.needs.len(), 1);
    assert_eq!(r.needs[0].group, "train");

    // Node state updates land in the operator's view, newest state per machine.
    let mut gw = h.gateway_client().await;
    gw.publish(tokio_stream::iter(vec![
        node("op-1", "m-1", MachineState::Configuring),
        node("op-1", "m-2", MachineState::Idle),
        node("op-1", "m-1", MachineState::Configured),
    ]))
    .await
    .unwrap();
    wait_until(WAIT, "the node states in the operator's view", async || {
        let nodes = op.nodes();
        if nodes.get("m-1").and_then(|n| n.state) == Some(MachineState::Configured)
            && nodes.contains_key("m-2")
        {
            Ok(())
        } else {
            Err(format!("operator saw {nodes:?}"))
        }
    })
    .await;

    // Bootstrap: the operator renders a blob for its cluster.
    let r = gw.bootstrap(ask_bootstrap("op-1", 5_000)).await;
    let Some(request_bootstrap_response::Outcome::Blob(blob)) = r.outcome else {
        panic!("expected a blob, got {r:?}");
    };
    assert!(String::from_utf8(blob).unwrap().contains("cluster op-1"));
    assert_eq!(r.ttl_seconds, 600);

    // Reclaim: delivered and acknowledged.
    let resp = gw
        .send_reclaim(SendReclaimRequest {
            cluster_id: "op-1".into(),
            nodes: vec!["m-1".into()],
            grace_period_seconds: 600,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.delivered);
    let m = h.gw().metrics().clone();
    wait_until(WAIT, "the reclaim ack", async || m.reclaim_acks.get() == 1).await;
    assert_eq!(op.stats().reclaim_instructions, 1);
    assert_eq!(op.stats().errors(), 0, "{:?}", op.stats());
    op.shutdown().await;
    h.wait_no_sessions().await;
    h.stop().await;
}

#[tokio::test]
async fn operator_errors_and_silence_become_distinct_bootstrap_errors() {
    let h = Harness::start(Options::default()).await;
    let mut erring = fast("op-err", &h.target());
    erring.bootstrap = BootstrapBehavior::Error("kubelet version skew".into());
    let erring = Operator::spawn(erring);
    let mut silent = fast("op-silent", &h.target());
    silent.bootstrap = BootstrapBehavior::Ignore;
    let silent = Operator::spawn(silent);
    assert!(erring.wait_connected(Duration::from_secs(5)).await);
    assert!(
        silent.wait_connected(Duration::from_secs(5)).await,
        "{:?}",
        silent.stats()
    );
    let mut gw = h.gateway_client().await;
    let ask = |cluster: &str| ask_bootstrap(cluster, 200);
    let e = gw
        .request_bootstrap(ask("op-err"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        e.outcome,
        Some(request_bootstrap_response::Outcome::Error(
            BootstrapError::OperatorError as i32
        ))
    );
    assert!(e.message.contains("skew"));
    let t = gw
        .request_bootstrap(ask("op-silent"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        t.outcome,
        Some(request_bootstrap_response::Outcome::Error(
            BootstrapError::Timeout as i32
        ))
    );
    assert_eq!(silent.stats().bootstrap_requests, 1);
    erring.shutdown().await;
    silent.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn the_operator_reconnects_after_a_gateway_restart() {
    let mut h = Harness::start(Options::default()).await;
    let addr = h.addr;
    let op = Operator::spawn(fast("op-r", &h.target()));
    assert!(
        op.wait_for(Duration::from_secs(5), |s| s.rollup_acks == 1)
            .await
    );
    h.gateway.take().unwrap().shutdown().await.unwrap();
    assert!(
        op.wait_for(Duration::from_secs(5), |s| s.disconnects == 1
            && !s.connected)
            .await
    );

    // A new gateway on the same port, same decide.
    let mut cfg = svc_session_gateway::GatewayConfig::new(h.dir.path());
    cfg.listen = Some(addr);
    let gw2 = svc_session_gateway::start(cfg).await.unwrap();
    assert!(
        op.wait_for(Duration::from_secs(10), |s| s.sessions == 2 && s.connected)
            .await,
        "{:?}",
        op.stats()
    );
    assert!(
        op.wait_for(Duration::from_secs(5), |s| s.rollup_acks >= 2)
            .await,
        "{:?} received={} accepted={} throttled={}",
        op.stats(),
        gw2.metrics().rollups_received.get(),
        gw2.metrics().rollups_accepted.get(),
        gw2.metrics().rollups_throttled.get(),
    );
    assert_eq!(h.stub.opened.load(Ordering::SeqCst), 2);
    op.shutdown().await;
    gw2.shutdown().await.unwrap();
    h.stop().await;
}

#[tokio::test]
async fn the_operator_connects_with_its_cluster_certificate() {
    let ca = bigfleet_testkit::TestCa::new("op test ca").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let load = |role: &str| {
        let p = ca.write_role_bundle(dir.path(), role).unwrap();
        TlsContext::load(&TlsFiles::new(p.cert, p.key, p.ca)).unwrap()
    };
    let h = Harness::start(Options {
        tls: Some(load("shard/shard-0")),
        ..Options::default()
    })
    .await;
    let target = format!("https://{}", h.addr);
    let mut good = fast("tls-a", &target);
    good.tls = Some(load("cluster/tls-a").client_config().unwrap());
    let good = Operator::spawn(good);
    assert!(
        good.wait_connected(Duration::from_secs(5)).await,
        "{:?}",
        good.stats()
    );

    // An operator claiming another cluster with this certificate never gets a session.
    let mut forger = fast("tls-b", &target);
    forger.tls = Some(load("cluster/tls-a").client_config().unwrap());
    let forger = Operator::spawn(forger);
    assert!(
        forger
            .wait_for(Duration::from_secs(5), |s| s.connect_failures >= 2)
            .await
    );
    assert!(
        forger.stats().last_error.contains("PermissionDenied"),
        "{}",
        forger.stats().last_error
    );
    assert_eq!(forger.stats().sessions, 0);
    assert!(h.gw().metrics().identity_rejected.get() >= 2);
    good.shutdown().await;
    forger.shutdown().await;
    h.stop().await;
}

#[tokio::test]
async fn the_load_runner_reports_a_clean_small_run() {
    let h = Harness::start(Options::default()).await;
    let mut cfg = bigfleet_loadtest::gateway_load::LoadConfig::new(&h.addr.to_string(), 20);
    cfg.rollup_interval = Duration::from_millis(200);
    cfg.duration = Duration::from_secs(1);
    cfg.gateway_pid = Some(std::process::id());
    let mut lines = 0;
    let report = bigfleet_loadtest::gateway_load::run(cfg, |_| lines += 1)
        .await
        .unwrap();
    assert!(lines >= 2, "progress lines");
    assert_eq!((report.sessions, report.connected), (20, 20));
    assert_eq!(report.errors.total, 0, "{report:?}");
    assert!(report.acks > 20, "{report:?}");
    assert!(report.rollups_per_s > 20.0, "{report:?}");
    assert!(report.ack_p99_ms > 0.0 && report.ack_p99_ms >= report.ack_p50_ms);
    assert!(report.rss_mb_gateway.unwrap() > 0.0);
    wait_until(WAIT, "every load session to close", async || {
        h.gw().active_sessions() == 0
    })
    .await;
    h.stop().await;
}
