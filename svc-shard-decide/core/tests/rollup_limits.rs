//! Roll-up bounds at decide's ingest (ADR-0104): a violating roll-up is INVALID_ARGUMENT
//! with its fixed reason in the status metadata, counted by that reason, and the cluster's
//! previous demand stays in force.

use crate::common;

use bigfleet_conv::{REJECT_REASON_METADATA, RollupLimits};
use bigfleet_proto::v1alpha1 as pb;
use common::*;
use svc_shard_decide_core::DecideConfig;
use svc_shard_decide_core::edge;
use svc_shard_decide_core::shard::DecideError;

fn with_resources(names: &[String]) -> pb::CapacityNeed {
    let mut n = need(1, 100);
    n.min_unit.clear();
    n.aggregate_resources = names.iter().map(|d| (d.clone(), "1".to_owned())).collect();
    n
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("example.com/{prefix}{i}")).collect()
}

fn rejected_reason(h: &Harness, cluster: &str, reason: &str) -> u64 {
    h.decide
        .metrics()
        .rollups_rejected
        .with_label_values(&[cluster, reason])
        .get()
}

#[tokio::test]
async fn decide_keeps_the_previous_demand_after_a_rejected_rollup() {
    let h = Harness::start(DecideConfig {
        rollup_limits: RollupLimits {
            max_needs: 3,
            max_priority: 1_000,
            ..RollupLimits::default()
        },
        ..cfg_rails_off()
    })
    .await;
    let mut ingest = h.ingest();
    ingest
        .apply_rollup(rollup("c1", vec![need(4, 100), need(8, 900)]))
        .await
        .unwrap();
    let before = h.decide.cluster_needs("c1");
    assert_eq!(before.len(), 2);

    let mut bad_enum = need(1, 1);
    bad_enum.interruption_penalty_bucket = 99;
    let mut bad_name = need(1, 1);
    bad_name
        .aggregate_resources
        .insert("Not A Name".into(), "1".into());
    let cases = [
        (vec![need(1, 1), bad_enum], "enum_out_of_range", "needs[1]"),
        (
            vec![need(1, 1), need(1, 1_001)],
            "priority_ceiling",
            "max-priority = 1000",
        ),
        (
            vec![need(1, 1); 4],
            "limit_needs",
            "max-needs-per-rollup = 3",
        ),
        (vec![bad_name], "resource_name", "qualified name"),
    ];
    for (needs, reason, text) in cases {
        let err = ingest.apply_rollup(rollup("c1", needs)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{reason}");
        assert!(err.message().contains(text), "{reason}: {}", err.message());
        assert_eq!(
            err.metadata()
                .get(REJECT_REASON_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some(reason)
        );
        assert_eq!(rejected_reason(&h, "c1", reason), 1, "{reason}");
        assert_eq!(
            h.decide.cluster_needs("c1"),
            before,
            "{reason}: demand kept"
        );
    }
    assert_eq!(h.decide.need_rows(), 2);
    // The next good roll-up replaces the demand as usual.
    ingest
        .apply_rollup(rollup("c1", vec![need(2, 1_000)]))
        .await
        .unwrap();
    assert_eq!(h.decide.need_rows(), 1);
}

#[tokio::test]
async fn a_rollup_naming_100k_distinct_resources_is_rejected() {
    let h = Harness::start(cfg_rails_off()).await;
    let all = names("r", 100_000);
    let per_need = RollupLimits::DEFAULT_MAX_RESOURCE_ENTRIES;
    let huge = rollup("c1", all.chunks(per_need).map(with_resources).collect());
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 100)])).unwrap();
    let before = h.decide.cluster_needs("c1");

    let err = edge::apply_rollup(&h.decide, &huge).unwrap_err();
    assert!(matches!(&err, DecideError::Rollup(e) if e.reason() == "limit_rollup_dimensions"));
    assert_eq!(rejected_reason(&h, "c1", "limit_rollup_dimensions"), 1);
    assert_eq!(h.decide.cluster_needs("c1"), before);
    assert_eq!(h.decide.demand_dimensions(), 1);
}

#[tokio::test]
async fn the_shard_bound_stops_what_the_rollup_bounds_let_through() {
    // Every per-roll-up bound lifted: only the shard-wide one is left to refuse.
    let h = Harness::start(DecideConfig {
        rollup_limits: RollupLimits::UNBOUNDED,
        ..cfg_rails_off()
    })
    .await;
    let all = names("r", 100_000);
    let err = edge::apply_rollup(
        &h.decide,
        &rollup("c1", all.chunks(1_000).map(with_resources).collect()),
    )
    .unwrap_err();
    let DecideError::Rollup(e) = &err else {
        panic!("{err}")
    };
    assert_eq!(e.reason(), "limit_shard_dimensions");
    assert_eq!(
        e.to_string(),
        format!(
            "max-shard-resource-dimensions = 128 exceeded at \
             needs[0].aggregate_resources[{:?}]: 129 distinct resource names",
            // Names are read in name order within a map.
            {
                let mut first: Vec<&String> = all[..1_000].iter().collect();
                first.sort();
                first[128].clone()
            }
        )
    );
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(h.decide.need_rows(), 0);
    assert_eq!(h.decide.demand_dimensions(), 0);
}

#[tokio::test]
async fn the_shard_dimension_bound_spans_clusters() {
    let h = Harness::start(DecideConfig {
        max_shard_dimensions: 4,
        ..cfg_rails_off()
    })
    .await;
    let d = &h.decide;
    let v = |xs: &[&str]| xs.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    edge::apply_rollup(
        d,
        &rollup("c1", vec![with_resources(&v(&["cpu", "memory"]))]),
    )
    .unwrap();
    edge::apply_rollup(
        d,
        &rollup(
            "c2",
            vec![with_resources(&v(&[
                "cpu",
                "nvidia.com/gpu",
                "example.com/x",
            ]))],
        ),
    )
    .unwrap();
    assert_eq!(d.demand_dimensions(), 4);
    let c3 = rollup("c3", vec![with_resources(&v(&["example.com/y"]))]);
    let err = edge::apply_rollup(d, &c3).unwrap_err();
    assert!(
        err.to_string()
            .contains("max-shard-resource-dimensions = 4"),
        "{err}"
    );
    assert_eq!(rejected_reason(&h, "c3", "limit_shard_dimensions"), 1);
    assert!(d.cluster_needs("c3").is_empty());
    // c2 re-sending its own names is not growth.
    edge::apply_rollup(
        d,
        &rollup(
            "c2",
            vec![with_resources(&v(&["example.com/x", "nvidia.com/gpu"]))],
        ),
    )
    .unwrap();
    // c1 stops naming memory: the slot is free for c3.
    edge::apply_rollup(d, &rollup("c1", vec![with_resources(&v(&["cpu"]))])).unwrap();
    edge::apply_rollup(d, &c3).unwrap();
    assert_eq!(d.demand_dimensions(), 4);
}

#[tokio::test]
async fn the_default_ceiling_accepts_every_priority() {
    let h = Harness::start(cfg_rails_off()).await;
    edge::apply_rollup(
        &h.decide,
        &rollup("c1", vec![need(1, i32::MAX), need(1, i32::MIN)]),
    )
    .unwrap();
    assert_eq!(h.decide.need_rows(), 2);
}
