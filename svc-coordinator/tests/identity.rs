//! The coordinator's identity matrix under mTLS (`docs/security.md`, ADR-0100), against an
//! in-process single-replica coordinator.

use crate::common;

use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::{self as pb};
use bigfleet_testkit::{LeafSpec, TlsPaths};
use common::{MtlsSolo, assign, code, report};
use tonic::Code;
use tonic::transport::Channel;

async fn connect(solo: &MtlsSolo, paths: &TlsPaths) -> CoordinatorClient<Channel> {
    CoordinatorClient::new(solo.channel(paths).await)
}

/// The rpcs [`matrix`] calls, in its order.
const RPCS: [&str; 9] = [
    "ReportShard",
    "ListShards",
    "ListDomainAssignments",
    "ListShardReports",
    "AssignDomain",
    "UnassignDomain",
    "RemoveShard",
    "JoinRaftCluster",
    "SnapshotSave",
];

/// `codes` named by [`RPCS`], to compare with a [`matrix`].
fn expect(codes: [Code; 9]) -> Vec<(&'static str, Code)> {
    RPCS.into_iter().zip(codes).collect()
}

/// Every call of the surface by one caller, as (rpc, code).
async fn matrix(c: &mut CoordinatorClient<Channel>, shard: &str) -> Vec<(&'static str, Code)> {
    vec![
        ("ReportShard", code(c.report_shard(report(shard, 1)).await)),
        (
            "ListShards",
            code(c.list_shards(pb::ListShardsRequest {}).await),
        ),
        (
            "ListDomainAssignments",
            code(
                c.list_domain_assignments(pb::ListDomainAssignmentsRequest {})
                    .await,
            ),
        ),
        (
            "ListShardReports",
            code(
                c.list_shard_reports(pb::ListShardReportsRequest::default())
                    .await,
            ),
        ),
        (
            "AssignDomain",
            code(c.assign_domain(assign("rack", "r1", "s1")).await),
        ),
        (
            "UnassignDomain",
            code(
                c.unassign_domain(pb::UnassignDomainRequest {
                    topology_key: "rack".into(),
                    topology_value: "r9".into(),
                })
                .await,
            ),
        ),
        (
            "RemoveShard",
            code(
                c.remove_shard(pb::RemoveShardRequest {
                    shard_id: "ghost".into(),
                })
                .await,
            ),
        ),
        (
            "JoinRaftCluster",
            code(
                c.join_raft_cluster(pb::JoinRaftClusterRequest {
                    node_id: String::new(),
                    raft_address: String::new(),
                })
                .await,
            ),
        ),
        (
            "SnapshotSave",
            code(c.snapshot_save(pb::SnapshotSaveRequest {}).await),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_matrix_under_mtls() {
    let solo = MtlsSolo::start().await;
    let admin = solo.role("admin");
    let readonly = solo.role("readonly");
    let shard1 = solo.role("shard/s1");
    let cluster = solo.role("cluster/c1");
    let no_san = solo.leaf("nosan", &LeafSpec::loopback("nosan"));
    let two_sans = solo.leaf(
        "twosans",
        &LeafSpec::role("admin").with_uri("bigfleet://readonly"),
    );

    use Code::{AlreadyExists, InvalidArgument, NotFound, Ok as OK, PermissionDenied as PD};

    // A shard may report as itself only, and nothing else.
    let mut s1 = connect(&solo, &shard1).await;
    assert_eq!(
        matrix(&mut s1, "s1").await,
        expect([OK, PD, PD, PD, PD, PD, PD, PD, PD])
    );
    // Same certificate claiming another shard.
    assert_eq!(code(s1.report_shard(report("s2", 1)).await), PD);
    // Empty shard id is refused before the identity binding.
    assert_eq!(code(s1.report_shard(report("", 1)).await), InvalidArgument);

    // Admin: everything but ReportShard (strict binding); argument errors come after the
    // identity check.
    let mut a = connect(&solo, &admin).await;
    assert_eq!(
        matrix(&mut a, "s1").await,
        expect([PD, OK, OK, OK, OK, OK, NotFound, InvalidArgument, OK])
    );
    let conflict = a.assign_domain(assign("rack", "r1", "s2")).await;
    // s2 never registered: NOT_FOUND; the conflict path is exercised next.
    assert_eq!(code(conflict), NotFound);
    s1.report_shard(report("s1", 1)).await.unwrap();
    let mut s2 = connect(&solo, &solo.role("shard/s2")).await;
    s2.report_shard(report("s2", 1)).await.unwrap();
    let conflict = a.assign_domain(assign("rack", "r1", "s2")).await;
    assert_eq!(code(conflict), AlreadyExists);

    // Readonly: every read, no mutation.
    let mut ro = connect(&solo, &readonly).await;
    assert_eq!(
        matrix(&mut ro, "s1").await,
        expect([PD, OK, OK, OK, PD, PD, PD, PD, PD])
    );

    // A cluster identity, a certificate without identity and one with two: nothing.
    for paths in [&cluster, &no_san, &two_sans] {
        let mut c = connect(&solo, paths).await;
        let got = matrix(&mut c, "c1").await;
        assert!(
            got.iter().all(|(_, c)| *c == PD),
            "{:?}: {got:?}",
            paths.cert
        );
    }

    // The removed RPCs answer UNIMPLEMENTED.
    assert_eq!(
        code(a.list_quotas(pb::ListQuotasRequest {}).await),
        Code::Unimplemented
    );
    assert_eq!(
        code(a.list_providers(pb::ListProvidersRequest {}).await),
        Code::Unimplemented
    );

    // A client without a certificate does not get through the handshake.
    let plain = Channel::from_shared(format!("http://127.0.0.1:{}", solo.running.api_addr.port()))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        let r = CoordinatorClient::new(ch)
            .list_shards(pb::ListShardsRequest {})
            .await;
        assert!(r.is_err(), "plaintext client served by an mTLS coordinator");
    }

    solo.running.shutdown().await.unwrap();
}
