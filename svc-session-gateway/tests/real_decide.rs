//! The gateway with the real decide (svc-shard-decide) and the fake provider, all over Unix
//! sockets, driven by the simulated operator: roll-ups reach the NeedsTable (seen through
//! the proxied ShardRead) and decide's resync of the cluster's machines reaches the operator.

use crate::common;

use std::time::Duration;

use bigfleet_loadtest::{Backoff, Demand, MachineState, NeedSpec, Operator, OperatorConfig};
use bigfleet_proto::v1alpha1::InspectNeedsRequest;
use bigfleet_proto::v1alpha1::inspect_needs_response::Frame;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use bigfleet_testkit::wait_until;
use common::decide_over_builtin_provider;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_gateway_and_real_decide() {
    let dir = bigfleet_testkit::temp_dir("bfrd").unwrap();
    let (mut dcfg, provider_srv) = decide_over_builtin_provider(dir.path()).await;
    dcfg.decide.cycle_interval = Duration::from_millis(100);
    let readiness = dcfg.readiness.clone();
    let decide = svc_shard_decide::start(dcfg).await.unwrap();
    let gateway = svc_session_gateway::start(svc_session_gateway::GatewayConfig::new(dir.path()))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "decide's first reconcile",
        async || readiness.is_ready(),
    )
    .await;

    let target = format!("http://{}", gateway.public_addr().unwrap());
    let mut cfg = OperatorConfig::new("cluster-0", &target);
    // Re-sent like a real operator: the catalog binds far more capacity to cluster-0 than
    // this demand asks for, so right after decide starts the first roll-ups are a
    // quarantined "drop" until consecutive ones confirm it (ADR-0105).
    cfg.rollup_interval = Duration::from_millis(200);
    cfg.backoff = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    cfg.demand = Demand::new(vec![NeedSpec::cpu(8, 4, 8, 100)]);
    let op = Operator::spawn(cfg);
    assert!(
        op.wait_connected(Duration::from_secs(10)).await,
        "{:?}",
        op.stats()
    );
    assert!(
        op.wait_for(Duration::from_secs(10), |s| s.rollup_acks >= 1)
            .await,
        "{:?}",
        op.stats()
    );
    let st = op.stats();
    assert!(
        st.last_shard_epoch >= 1,
        "decide's epoch in the ack: {st:?}"
    );

    // The roll-up is in decide's NeedsTable, read through the gateway's ShardRead proxy.
    let mut read = ShardReadClient::new(
        bigfleet_mesh::connect(&target.parse().unwrap(), &Default::default())
            .await
            .unwrap(),
    );
    wait_until(
        Duration::from_secs(10),
        "the need in decide's table",
        async || {
            let Ok(resp) = read
                .inspect_needs(InspectNeedsRequest {
                    cluster_id: "cluster-0".into(),
                    limit: 0,
                })
                .await
            else {
                return false;
            };
            let mut s = resp.into_inner();
            let mut needs = 0;
            while let Ok(Some(f)) = s.message().await {
                if matches!(f.frame, Some(Frame::Need(ref v)) if v.cluster_id == "cluster-0") {
                    needs += 1;
                }
            }
            needs == 1
        },
    )
    .await;

    // Decide resynced the machines the catalog binds to cluster-0 (and any it configures
    // now) through Gateway.Publish into this operator's session.
    wait_until(
        Duration::from_secs(10),
        "node states at the operator",
        async || {
            op.nodes()
                .values()
                .any(|n| n.state == Some(MachineState::Configured))
        },
    )
    .await;
    assert_eq!(op.stats().errors(), 0, "{:?}", op.stats());

    op.shutdown().await;
    gateway.shutdown().await.unwrap();
    decide.shutdown().await.unwrap();
    provider_srv.shutdown().await;
}
