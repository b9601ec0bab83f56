//! svc-inspect's gRPC surface against coordinator and shard doubles (plaintext).

use crate::common;

use std::time::Duration;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_client::InspectClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::UnmetReason;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use common::{Harness, Options};
use svc_inspect::doubles::{
    CoordinatorDouble, CoordinatorState, ShardDouble, need, registry_entry,
};
use svc_inspect::grpc::{COORDINATOR_ERROR_METADATA_KEY, UNREACHABLE_SHARDS_METADATA_KEY};
use tonic::transport::Channel;
use tonic::{Code, Status};

async fn client(h: &Harness) -> ShardReadClient<Channel> {
    ShardReadClient::connect(h.grpc_uri()).await.unwrap()
}

/// The default doubles (s3 down) and a ShardRead client of svc-inspect in front of them.
async fn default_fleet() -> (Harness, ShardReadClient<Channel>) {
    let h = Harness::start(Options::default()).await;
    let c = client(&h).await;
    (h, c)
}

/// (header, rows, response metadata) of one InspectNeeds call.
type Answer = (
    pb::InspectNeedsHeader,
    Vec<pb::NeedView>,
    tonic::metadata::MetadataMap,
);

async fn inspect(
    c: &mut ShardReadClient<Channel>,
    cluster: &str,
    limit: i32,
) -> Result<Answer, tonic::Status> {
    let resp = c
        .inspect_needs(pb::InspectNeedsRequest {
            cluster_id: cluster.into(),
            limit,
        })
        .await?;
    let md = resp.metadata().clone();
    let mut stream = resp.into_inner();
    let first = stream.message().await?.expect("a first frame");
    let Some(pb::inspect_needs_response::Frame::Header(header)) = first.frame else {
        panic!("the first frame must be the header, got {first:?}");
    };
    let mut rows = Vec::new();
    while let Some(f) = stream.message().await? {
        match f.frame {
            Some(pb::inspect_needs_response::Frame::Need(v)) => rows.push(v),
            other => panic!("only need frames after the header, got {other:?}"),
        }
    }
    Ok((header, rows, md))
}

/// (cluster, priority, arrival) of each row.
fn keys(rows: &[pb::NeedView]) -> Vec<(&str, i32, i64)> {
    rows.iter()
        .map(|r| {
            (
                r.cluster_id.as_str(),
                r.need.as_ref().unwrap().priority,
                r.arrival_unix_nanos,
            )
        })
        .collect()
}

/// Every row of the default doubles in fleet order (priority ↓, arrival ↑, cluster ↑), as
/// [`keys`] gives them.
const FLEET_ORDER: [(&str, i32, i64); 6] = [
    ("c-a", 100, 7),
    ("c-c", 50, 9),
    ("c-a", 10, 2),
    // Same priority and arrival on two shards: cluster id decides.
    ("c-a", 10, 5),
    ("c-c", 10, 5),
    ("c-b", 1, 1),
];

/// How many ListShards calls reached the coordinator double.
fn list_shards_calls(h: &Harness) -> usize {
    h.coordinator
        .state()
        .calls
        .iter()
        .filter(|c| *c == "ListShards")
        .count()
}

#[tokio::test]
async fn needs_merge_across_shards_in_priority_arrival_cluster_order() {
    let (h, mut c) = default_fleet().await;
    let (header, rows, md) = inspect(&mut c, "", 0).await.unwrap();
    assert_eq!(keys(&rows), FLEET_ORDER);
    // Oldest cycle of the reachable shards, their summed counts.
    assert_eq!(
        (
            header.cycle,
            header.computed_at_unix_nanos,
            header.total_needs
        ),
        (17, 1_000, 6)
    );
    // s3 is registered but nothing listens there: the rest is served and s3 is named.
    let down = md
        .get(UNREACHABLE_SHARDS_METADATA_KEY)
        .expect("unreachable shards named");
    let down = down.to_str().unwrap();
    assert!(down.starts_with("s3="), "{down}");
    assert!(!down.contains("s1=") && !down.contains("s2="), "{down}");
    assert!(md.get(COORDINATOR_ERROR_METADATA_KEY).is_none());
    h.shutdown().await;
}

#[tokio::test]
async fn cluster_filter_and_limit_apply_fleet_wide() {
    let (h, mut c) = default_fleet().await;
    let (header, rows, _) = inspect(&mut c, "c-a", 0).await.unwrap();
    assert_eq!(
        keys(&rows),
        [("c-a", 100, 7), ("c-a", 10, 2), ("c-a", 10, 5)]
    );
    assert_eq!(header.total_needs, 3);

    let (header, rows, _) = inspect(&mut c, "c-a", 2).await.unwrap();
    assert_eq!(keys(&rows), [("c-a", 100, 7), ("c-a", 10, 2)]);
    assert_eq!(header.total_needs, 3, "the count is taken before the limit");

    let (header, rows, _) = inspect(&mut c, "nobody", 0).await.unwrap();
    assert!(rows.is_empty());
    assert_eq!(header.total_needs, 0);

    let err = inspect(&mut c, "", -1).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    h.shutdown().await;
}

#[tokio::test]
async fn verdicts_and_reasons_pass_through_unchanged() {
    let (h, mut c) = default_fleet().await;
    let (_, rows, _) = inspect(&mut c, "", 0).await.unwrap();
    let reason_of = |cluster: &str, prio: i32| {
        rows.iter()
            .find(|r| r.cluster_id == cluster && r.need.as_ref().unwrap().priority == prio)
            .map(|r| (r.satisfied, r.unmet_reason))
            .unwrap()
    };
    assert_eq!(
        reason_of("c-b", 1),
        (false, UnmetReason::NoMatchingSupply as i32)
    );
    assert_eq!(
        reason_of("c-a", 100),
        (false, UnmetReason::PriorityStarved as i32)
    );
    assert_eq!(
        reason_of("c-c", 50),
        (false, UnmetReason::TopologyUnsatisfiable as i32)
    );
    let preempt = rows
        .iter()
        .find(|r| r.cluster_id == "c-a" && r.arrival_unix_nanos == 2)
        .unwrap();
    assert_eq!(
        preempt.unmet_reason,
        UnmetReason::PreemptionExhausted as i32
    );
    assert_eq!(preempt.matching_supply.as_ref().unwrap().configured, 3);
    assert_eq!(reason_of("c-c", 10), (true, 0));
    h.shutdown().await;
}

#[tokio::test]
async fn cycle_zero_before_any_shard_has_run_a_cycle() {
    let mut shards = common::shard_doubles();
    shards[1].header.cycle = 0;
    shards[1].header.computed_at_unix_nanos = 0;
    shards[1].needs.clear();
    let h = Harness::start(Options {
        shards,
        ..Options::default()
    })
    .await;
    let mut c = client(&h).await;
    let (header, rows, _) = inspect(&mut c, "", 0).await.unwrap();
    assert_eq!(header.cycle, 0, "one reachable shard has no verdicts yet");
    assert_eq!(header.computed_at_unix_nanos, 0);
    assert_eq!(rows.len(), 3, "the other shard's rows are still served");
    h.shutdown().await;
}

#[tokio::test]
async fn fleet_summary_reports_down_shards_and_counts_the_rest() {
    let h = Harness::start(Options::default()).await;
    let mut c = InspectClient::connect(h.grpc_uri()).await.unwrap();
    let s = c
        .fleet_summary(mesh::FleetSummaryRequest { max_shortfalls: 2 })
        .await
        .unwrap()
        .into_inner();
    assert!(s.coordinator_reachable);
    assert!(s.coordinator_error.is_empty());
    let ids: Vec<_> = s
        .shards
        .iter()
        .map(|s| (s.shard_id.as_str(), s.reachable))
        .collect();
    assert_eq!(ids, vec![("s1", true), ("s2", true), ("s3", false)]);
    assert!(!s.shards[2].error.is_empty());
    assert_eq!(
        s.shards[0]
            .machines_by_state
            .get("MACHINE_STATE_CONFIGURED"),
        Some(&7)
    );
    assert_eq!(
        (
            s.shards[0].sessions,
            s.shards[0].needs,
            s.shards[0].unmet_needs
        ),
        (2, 3, 1)
    );
    // s2 has no ShardInfo: known from its InspectNeeds header only.
    assert_eq!((s.shards[1].cycle, s.shards[1].needs), (17, 3));
    assert!(s.shards[1].machines_by_state.is_empty());
    assert_eq!(
        s.machines_by_state.get("MACHINE_STATE_CONFIGURED"),
        Some(&7)
    );
    assert_eq!(s.sessions, 2);
    // Oldest first, capped at the request's maximum.
    let ages: Vec<_> = s
        .shortfalls
        .iter()
        .map(|f| (f.shard_id.as_str(), f.age_cycles))
        .collect();
    assert_eq!(ages, vec![("s1", 40), ("s3", 12)]);
    h.shutdown().await;
}

#[tokio::test]
async fn every_shard_down_is_unavailable() {
    let h = Harness::start(Options {
        shards: vec![],
        ..Options::default()
    })
    .await;
    let mut c = client(&h).await;
    let err = inspect(&mut c, "", 0).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("s3"), "{}", err.message());
    h.shutdown().await;
}

#[tokio::test]
async fn a_slow_shard_times_out_without_holding_up_the_rest() {
    let mut shards = common::shard_doubles();
    shards[1].delay = Some(Duration::from_secs(5));
    let h = Harness::start(Options {
        shards,
        with_dead_shard: false,
        shard_timeout: Duration::from_millis(300),
        ..Options::default()
    })
    .await;
    let mut c = client(&h).await;
    let started = std::time::Instant::now();
    let (_, rows, md) = inspect(&mut c, "", 0).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(rows.len(), 3, "s1's rows");
    let down = md
        .get(UNREACHABLE_SHARDS_METADATA_KEY)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        down.starts_with("s2=") && down.contains("no answer within"),
        "{down}"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_down_coordinator_falls_back_to_the_known_shards() {
    let mut h = Harness::start(Options::default()).await;
    let mut c = client(&h).await;
    inspect(&mut c, "", 0).await.unwrap();
    h.stop_coordinator().await;

    let (_, rows, md) = inspect(&mut c, "", 0).await.unwrap();
    assert_eq!(rows.len(), 6, "still served from the shards learnt earlier");
    assert!(md.get(COORDINATOR_ERROR_METADATA_KEY).is_some());

    let mut i = InspectClient::connect(h.grpc_uri()).await.unwrap();
    let s = i
        .fleet_summary(mesh::FleetSummaryRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(!s.coordinator_reachable);
    assert!(
        s.coordinator_error.contains("ListShards"),
        "{}",
        s.coordinator_error
    );
    assert_eq!(s.shards.iter().filter(|s| s.reachable).count(), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn a_coordinator_never_seen_and_down_is_unavailable() {
    let inspect = common::start_without_coordinator().await;
    let mut c = ShardReadClient::connect(format!("http://{}", inspect.grpc_addr()))
        .await
        .unwrap();
    let err = inspect_err(&mut c).await;
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().contains("no shard known"),
        "{}",
        err.message()
    );
    inspect.shutdown().await.unwrap();
}

async fn inspect_err(c: &mut ShardReadClient<Channel>) -> tonic::Status {
    inspect(c, "", 0).await.unwrap_err()
}

#[tokio::test]
async fn reads_follow_the_leader_hint() {
    let shard = ShardDouble::with_verdicts("s1", 5, 1, vec![need("c-a", 1, 1, None)])
        .serve(None)
        .await
        .unwrap();
    let leader = CoordinatorDouble::new(CoordinatorState {
        shards: vec![registry_entry("s1", shard.tcp_addr().unwrap())],
        ..Default::default()
    });
    let leader_server = leader.serve(None).await.unwrap();
    let follower = CoordinatorDouble::new(CoordinatorState {
        follower_of: Some(leader_server.tcp_addr().unwrap().to_string()),
        ..Default::default()
    });
    let follower_server = follower.serve(None).await.unwrap();

    let mut cfg =
        svc_inspect::Config::local(&format!("http://{}", follower_server.tcp_addr().unwrap()));
    cfg.cache_ttl = Duration::ZERO;
    let inspect = svc_inspect::start(cfg).await.unwrap();
    let mut c = ShardReadClient::connect(format!("http://{}", inspect.grpc_addr()))
        .await
        .unwrap();
    let (_, rows, md) = inspect_rows(&mut c).await;
    assert_eq!(rows.len(), 1);
    assert!(md.get(COORDINATOR_ERROR_METADATA_KEY).is_none());
    assert_eq!(leader.state().calls, vec!["ListShards"]);
    assert!(
        follower.state().calls.is_empty(),
        "the follower refuses before its handler"
    );
    // The leader is remembered: the follower is not asked again.
    inspect_rows(&mut c).await;
    assert_eq!(leader.state().calls.len(), 2);

    inspect.shutdown().await.unwrap();
    follower_server.shutdown().await.unwrap();
    leader_server.shutdown().await.unwrap();
    shard.shutdown().await.unwrap();
}

async fn inspect_rows(c: &mut ShardReadClient<Channel>) -> Answer {
    inspect(c, "", 0).await.unwrap()
}

#[tokio::test]
async fn answers_are_cached_for_the_ttl() {
    let h = Harness::start(Options {
        cache_ttl: Duration::from_secs(60),
        ..Options::default()
    })
    .await;
    let mut c = client(&h).await;
    inspect(&mut c, "c-a", 0).await.unwrap();
    inspect(&mut c, "c-a", 0).await.unwrap();
    assert_eq!(
        list_shards_calls(&h),
        1,
        "the second read came from the cache"
    );
    inspect(&mut c, "c-b", 0).await.unwrap();
    assert_eq!(list_shards_calls(&h), 2, "another filter is another answer");
    h.shutdown().await;
}

#[tokio::test]
async fn the_coordinator_double_records_then_refuses_what_it_does_not_serve() {
    use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
    let double = CoordinatorDouble::default();
    let server = double.serve(None).await.unwrap();
    let mut c = CoordinatorClient::connect(format!("http://{}", server.tcp_addr().unwrap()))
        .await
        .unwrap();
    let refused = [
        c.join_raft_cluster(pb::JoinRaftClusterRequest::default())
            .await
            .unwrap_err(),
        c.list_quotas(pb::ListQuotasRequest::default())
            .await
            .unwrap_err(),
        c.list_providers(pb::ListProvidersRequest::default())
            .await
            .unwrap_err(),
    ];
    for (status, why) in refused.iter().zip([
        "the double has no raft group",
        "removed in the current revision",
        "removed in the current revision",
    ]) {
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
        assert_eq!(status.message(), why);
    }
    assert_eq!(
        double.state().calls,
        ["JoinRaftCluster", "ListQuotas", "ListProviders"]
    );

    // A follower refuses them as it refuses everything, before recording.
    double.state().follower_of = Some(String::new());
    let err = c
        .list_quotas(pb::ListQuotasRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(
        bigfleet_mesh::leader_hint(&err),
        None,
        "an empty hint is none"
    );
    assert_eq!(double.state().calls.len(), 3);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_coordinator_double_answers_reports_from_its_script() {
    use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
    let double = CoordinatorDouble::default();
    double.state().report_answers.extend([
        Ok(pb::ReportAck {
            coordinator_term: 5,
            acknowledged: true,
            instructions: vec![],
        }),
        Err(Status::unavailable("stepping down")),
    ]);
    let server = double.serve(None).await.unwrap();
    let mut c = CoordinatorClient::connect(format!("http://{}", server.tcp_addr().unwrap()))
        .await
        .unwrap();
    let report = |shard: &str| pb::ShardReport {
        shard_id: shard.into(),
        ..Default::default()
    };

    let first = c.report_shard(report("s-1")).await.unwrap().into_inner();
    assert_eq!((first.coordinator_term, first.acknowledged), (5, true));
    let second = c.report_shard(report("s-2")).await.unwrap_err();
    assert_eq!(
        (second.code(), second.message()),
        (Code::Unavailable, "stepping down")
    );
    // The script is spent: a plain acknowledgement.
    let third = c.report_shard(report("s-3")).await.unwrap().into_inner();
    assert_eq!((third.coordinator_term, third.acknowledged), (0, true));

    // A follower refuses reports with the leader's address, and still records them.
    double.state().follower_of = Some("10.0.0.9:7790".into());
    let refused = c.report_shard(report("s-4")).await.unwrap_err();
    assert_eq!(
        bigfleet_mesh::leader_hint(&refused).as_deref(),
        Some("10.0.0.9:7790")
    );
    let (shards, calls): (Vec<String>, _) = {
        let st = double.state();
        let shards = st.received_reports.iter().map(|r| r.shard_id.clone());
        (shards.collect(), st.calls.clone())
    };
    assert_eq!(shards, ["s-1", "s-2", "s-3", "s-4"]);
    assert_eq!(calls, ["ReportShard", "ReportShard", "ReportShard"]);
    server.shutdown().await.unwrap();
}
