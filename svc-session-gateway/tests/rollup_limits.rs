//! Roll-up bounds at the gateway (ADR-0104): a roll-up over a bound is rejected whole
//! before it reaches decide, counted under a fixed reason label, and the cluster keeps its
//! last-known-good demand; decide's own rejections (the shard-wide dimension bound) are
//! counted under the reason decide names.

use crate::common;

use std::time::Duration;

use bigfleet_conv::{ConvError, RollupLimits};
use bigfleet_loadtest::Demand;
use bigfleet_proto::v1alpha1::{CapacityNeed, ClusterCapacityNeeds, operator_message};
use common::*;
use svc_session_gateway::GatewaySettings;

fn rollup_msg(r: ClusterCapacityNeeds) -> bigfleet_proto::v1alpha1::OperatorMessage {
    msg(operator_message::Payload::Rollup(r))
}

fn typical(cluster: &str, ts: i64) -> ClusterCapacityNeeds {
    let mut r = Demand::typical().rollup(cluster, ts);
    r.timestamp_unix_nanos = ts;
    r
}

/// Needs each naming `per_need` of `total` distinct resources.
fn many_names(cluster: &str, ts: i64, total: usize, per_need: usize) -> ClusterCapacityNeeds {
    let names: Vec<String> = (0..total).map(|i| format!("example.com/r{i}")).collect();
    let template = typical(cluster, ts).needs[0].clone();
    let needs = names
        .chunks(per_need)
        .map(|chunk| CapacityNeed {
            aggregate_resources: chunk.iter().map(|c| (c.clone(), "1".to_owned())).collect(),
            min_unit: Default::default(),
            ..template.clone()
        })
        .collect();
    ClusterCapacityNeeds {
        cluster_id: cluster.to_owned(),
        timestamp_unix_nanos: ts,
        needs,
    }
}

/// Every `reason` label value the gateway has used so far.
fn reason_labels(h: &Harness) -> Vec<String> {
    let mut out = Vec::new();
    for family in [&h.gw().metrics().rollups_rejected] {
        for m in prometheus::core::Collector::collect(family)
            .iter()
            .flat_map(|f| f.get_metric())
        {
            for l in m.get_label() {
                if l.name() == "reason" {
                    out.push(l.value().to_owned());
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn a_rollup_over_a_bound_is_rejected_whole_under_a_fixed_reason() {
    let h = Harness::start(Options {
        settings: GatewaySettings {
            rollup_limits: RollupLimits {
                max_priority: 1_000_000,
                ..RollupLimits::default()
            },
            ..Options::default().settings
        },
        ..Options::default()
    })
    .await;
    let mut s = open(&h.target(), "a").await;
    s.send(rollup_msg(typical("a", 1))).await;
    assert_eq!(s.next_ack().await.echo, "rollup");

    // Above the priority ceiling.
    let mut high = typical("a", 2);
    high.needs[1].priority = 1_000_001;
    s.send(rollup_msg(high)).await;
    let ack = s.next_ack().await;
    assert_eq!(
        ack.echo,
        "rollup rejected: needs[1].priority: priority 1000001 is above max-priority = 1000000"
    );

    // A hundred thousand distinct resource names (3 MB, under the byte cap).
    s.send(rollup_msg(many_names(
        "a",
        3,
        100_000,
        RollupLimits::DEFAULT_MAX_RESOURCE_ENTRIES,
    )))
    .await;
    // 3 MB to decode and check: more than the usual frame wait on a loaded machine.
    let ack = s.next_ack_within(Duration::from_secs(30)).await;
    assert!(
        ack.echo.starts_with(
            "rollup rejected: max-rollup-resource-dimensions = 64 exceeded at \
             needs[2].aggregate_resources["
        ),
        "{}",
        ack.echo
    );

    // Attacker text in every field a label could be built from: the label stays fixed.
    let mut odd = typical("a", 4);
    odd.needs[0]
        .aggregate_resources
        .insert("reason=\"x\" ü".repeat(50), "1".into());
    s.send(rollup_msg(odd)).await;
    let ack = s.next_ack().await;
    assert!(
        ack.echo
            .starts_with("rollup rejected: needs[0].aggregate_resources["),
        "{}",
        ack.echo
    );

    h.assert_only_the_first_rollup_forwarded("a");
    let m = h.gw().metrics();
    for reason in [
        "priority_ceiling",
        "limit_rollup_dimensions",
        "resource_name",
    ] {
        assert_eq!(
            m.rollups_rejected.with_label_values(&["a", reason]).get(),
            1,
            "{reason}"
        );
    }
    for label in reason_labels(&h) {
        assert!(
            ConvError::rollup_reason_label(&label).is_some(),
            "{label:?} is not a fixed reason"
        );
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_rejections_are_counted_under_the_reason_decide_names() {
    let dir = bigfleet_testkit::temp_dir("bfrl").unwrap();
    let (mut dcfg, provider_srv) = decide_over_builtin_provider(dir.path()).await;
    dcfg.decide.max_shard_dimensions = 8;
    let decide = svc_shard_decide::start(dcfg).await.unwrap();
    let mut gcfg = svc_session_gateway::GatewayConfig::new(dir.path());
    gcfg.settings.rollup_rate.per_second = 0.0;
    let gateway = svc_session_gateway::start(gcfg).await.unwrap();
    let target = format!("http://{}", gateway.public_addr().unwrap());

    let mut s = open(&target, "a").await;
    s.send(rollup_msg(typical("a", 1))).await;
    assert_eq!(s.next_ack_among_pushes().await.echo, "rollup");
    let before = decide.decide().cluster_needs("a");
    assert!(!before.is_empty());

    // Within every per-roll-up bound, over the shard's: only decide can refuse it.
    s.send(rollup_msg(many_names("a", 2, 20, 10))).await;
    let ack = s.next_ack_among_pushes().await;
    assert!(
        ack.echo.starts_with(
            "rollup rejected: decide: roll-up rejected: max-shard-resource-dimensions = 8 \
             exceeded at needs[0].aggregate_resources["
        ),
        "{}",
        ack.echo
    );
    assert_eq!(
        gateway
            .metrics()
            .rollups_rejected
            .with_label_values(&["a", "limit_shard_dimensions"])
            .get(),
        1
    );
    assert_eq!(decide.decide().cluster_needs("a"), before, "demand kept");

    gateway.shutdown().await.unwrap();
    decide.shutdown().await.unwrap();
    provider_srv.shutdown().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
}
