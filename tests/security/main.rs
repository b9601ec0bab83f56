//! The adversary suite (issue 15, `docs/security.md`): the real services as separate
//! processes with mTLS, attacked with the wrong identity, with none, and with hostile
//! transport behaviour. Every row of the threat-model table names the test here that tries
//! it; each attempt must be refused with the stated code and, where the row says so,
//! counted in a metric.

mod harness;
mod transport;

use std::time::Duration;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::coordinator_info_client::CoordinatorInfoClient;
use bigfleet_proto::mesh::v1::ingest_client::IngestClient;
use bigfleet_proto::mesh::v1::outbox_client::OutboxClient;
use bigfleet_proto::mesh::v1::raft_client::RaftClient;
use bigfleet_proto::mesh::v1::relay_client::RelayClient;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::shard_client::ShardClient;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use harness::*;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// An encoded openraft vote request from `node`, as a replica would send it.
fn vote_payload(node: u64) -> Vec<u8> {
    let req: openraft::raft::VoteRequest<u64> =
        openraft::raft::VoteRequest::new(openraft::Vote::new(99, node), None);
    serde_json::to_vec(&req).unwrap()
}

async fn raft_vote(
    addr: std::net::SocketAddr,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    from: u64,
    payload_node: u64,
) -> Result<(), tonic::Status> {
    let ch = channel(addr, tls)
        .await
        .map_err(tonic::Status::unavailable)?;
    RaftClient::new(ch)
        .vote(mesh::RaftRequest {
            payload: vote_payload(payload_node),
            from_node_id: from,
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raft_port_admits_only_this_groups_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let coord = Coordinator::start(dir.path(), &pki).await;
    let denied_before = metric_sum(
        coord.metrics,
        "grpc_server_handled_total",
        &["grpc_service=\"bigfleet.mesh.v1.Raft\"", "PermissionDenied"],
    )
    .await;

    // Every non-replica role, each claiming to be a replica.
    let member = svc_coordinator::node_id_of("coord-0");
    let mut refused = 0.0;
    for role in [
        "shard/shard-0",
        "shard/shard-0/execute",
        "cluster/c1",
        "readonly",
        "admin",
    ] {
        let r = raft_vote(coord.raft, Some(pki.client(role)), member, member).await;
        assert_eq!(code(&r), Code::PermissionDenied, "{role}: {r:?}");
        refused += 1.0;
    }
    // A replica certificate of a node that is not in the group, speaking for itself, for
    // another node id, or naming another candidate.
    let intruder = svc_coordinator::node_id_of("intruder");
    for (from, named, why) in [
        (intruder, intruder, Some("not a member")),
        (member, member, None),
        (intruder, member, None),
    ] {
        let r = raft_vote(
            coord.raft,
            Some(pki.client("coordinator/intruder")),
            from,
            named,
        )
        .await;
        assert_eq!(code(&r), Code::PermissionDenied, "{r:?}");
        if let Some(why) = why {
            assert!(r.as_ref().unwrap_err().message().contains(why), "{r:?}");
        }
        refused += 1.0;
    }
    // No certificate at all: the TLS handshake itself fails.
    let r = raft_vote(coord.raft, None, member, member).await;
    assert_ne!(code(&r), Code::Ok, "plaintext reached the raft port");
    // ClientWrite no longer exists on the port, whoever asks.
    let ch = channel(coord.raft, Some(pki.client("coordinator/coord-0")))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.unwrap();
    let r: Result<tonic::Response<mesh::RaftReply>, _> = grpc
        .unary(
            tonic::Request::new(mesh::RaftRequest::default()),
            http::uri::PathAndQuery::from_static("/bigfleet.mesh.v1.Raft/ClientWrite"),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(code(&r), Code::Unimplemented, "{r:?}");

    let denied_after = metric_sum(
        coord.metrics,
        "grpc_server_handled_total",
        &["grpc_service=\"bigfleet.mesh.v1.Raft\"", "PermissionDenied"],
    )
    .await;
    assert_eq!(
        denied_after - denied_before,
        refused,
        "every refusal is counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_admin_rpcs_and_reports_are_bound_to_roles() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let coord = Coordinator::start(dir.path(), &pki).await;
    let client = |role: &str| {
        let tls = pki.client(role);
        let addr = coord.api;
        async move { CoordinatorClient::new(channel(addr, Some(tls)).await.unwrap()) }
    };
    let mut ro = client("readonly").await;
    let assign = ro
        .assign_domain(pb::AssignDomainRequest {
            topology_key: "zone".into(),
            topology_value: "z1".into(),
            shard_id: "shard-0".into(),
        })
        .await;
    assert_eq!(code(&assign), Code::PermissionDenied);
    let remove = ro
        .remove_shard(pb::RemoveShardRequest {
            shard_id: "shard-0".into(),
        })
        .await;
    assert_eq!(code(&remove), Code::PermissionDenied);
    let save = ro.snapshot_save(pb::SnapshotSaveRequest::default()).await;
    assert_eq!(code(&save), Code::PermissionDenied);
    // A shard may report only as itself.
    let mut s1 = client("shard/s1").await;
    let r = s1
        .report_shard(pb::ShardReport {
            shard_id: "s2".into(),
            cycle: 1,
            shard_address: "s2:7780".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(&r), Code::PermissionDenied);
    // An execute worker or an operator cannot join the group.
    for role in ["shard/s1/execute", "cluster/c1", "coordinator/other"] {
        let r = client(role)
            .await
            .join_raft_cluster(pb::JoinRaftClusterRequest {
                node_id: "coord-9".into(),
                raft_address: "127.0.0.1:1".into(),
            })
            .await;
        assert_eq!(code(&r), Code::PermissionDenied, "{role}");
    }
    let denied = metric_sum(
        coord.metrics,
        "grpc_server_handled_total",
        &[
            "grpc_service=\"bigfleet.v1alpha1.Coordinator\"",
            "PermissionDenied",
        ],
    )
    .await;
    assert_eq!(denied, 7.0, "every refusal is counted");
}

/// The coordinator's transfer read (ADR-0139) names every shard's domains and pending
/// instructions: readers only — never a shard, a worker, an operator or another replica, and
/// nobody without a certificate.
#[tokio::test(flavor = "multi_thread")]
async fn the_transfers_read_admits_only_readers() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let coord = Coordinator::start(dir.path(), &pki).await;
    let list = |tls: Option<std::sync::Arc<rustls::ClientConfig>>| {
        let addr = coord.api;
        async move {
            match channel(addr, tls).await {
                Ok(ch) => code(
                    &CoordinatorInfoClient::new(ch)
                        .list_transfers(mesh::ListTransfersRequest::default())
                        .await,
                ),
                Err(_) => Code::Unavailable,
            }
        }
    };
    for role in [
        "shard/s1",
        "shard/s1/execute",
        "cluster/c1",
        "coordinator/other",
    ] {
        assert_eq!(
            list(Some(pki.client(role))).await,
            Code::PermissionDenied,
            "{role}"
        );
    }
    assert_ne!(list(None).await, Code::Ok, "plaintext read the transfers");
    // Readers are served (the refusals above are not vacuous).
    for role in ["readonly", "admin"] {
        assert_eq!(list(Some(pki.client(role))).await, Code::Ok, "{role}");
    }
}

fn hello(cluster: &str) -> pb::OperatorMessage {
    pb::OperatorMessage {
        payload: Some(pb::operator_message::Payload::Hello(pb::Hello {
            cluster_id: cluster.into(),
            protocol_version: "v1alpha1".into(),
        })),
    }
}

/// Opens a Session presenting `role` and sends a Hello for `cluster`; returns the first
/// answer (an ack, or the refusal).
async fn hello_as(
    shard: &Shard,
    pki: &Pki,
    role: &str,
    cluster: &str,
) -> Result<pb::ShardMessage, tonic::Status> {
    let ch = channel(shard.gateway_addr, Some(pki.client(role)))
        .await
        .map_err(tonic::Status::unavailable)?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(hello(cluster)).await.unwrap();
    let mut inbound = ShardClient::new(ch)
        .session(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(WAIT, inbound.message())
        .await
        .expect("an answer to the hello")?;
    drop(tx);
    first.ok_or_else(|| tonic::Status::aborted("stream ended without an answer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_public_port_serves_each_caller_only_its_contract() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shard = Shard::start(dir.path(), &pki, &[]).await;

    // Hello as another cluster: refused and counted as a security event.
    let r = hello_as(&shard, &pki, "cluster/c1", "c2").await;
    assert_eq!(code(&r), Code::PermissionDenied, "{r:?}");
    assert_eq!(
        metric(
            shard.gateway_metrics,
            "bigfleet_shard_session_identity_rejected_total"
        )
        .await,
        1.0
    );
    // As itself it is served.
    let ack = hello_as(&shard, &pki, "cluster/c1", "c1").await.unwrap();
    assert!(ack.payload.is_some());

    let relay = |role: &str| {
        let tls = pki.client(role);
        let addr = shard.gateway_addr;
        async move {
            let mut c = RelayClient::new(channel(addr, Some(tls)).await.unwrap());
            let boot = c
                .request_bootstrap(mesh::RequestBootstrapRequest {
                    cluster_id: "c1".into(),
                    timeout_ms: 100,
                    ..Default::default()
                })
                .await
                .map(|_| ());
            let reclaim = c
                .send_reclaim(mesh::SendReclaimRequest {
                    cluster_id: "c1".into(),
                    ..Default::default()
                })
                .await
                .map(|_| ());
            (code(&boot), code(&reclaim))
        }
    };
    // An operator asking for its own bootstrap blob or ordering its own drain.
    assert_eq!(
        relay("cluster/c1").await,
        (Code::PermissionDenied, Code::PermissionDenied)
    );
    // Another shard's execute worker.
    assert_eq!(
        relay("shard/shard-1/execute").await,
        (Code::PermissionDenied, Code::PermissionDenied)
    );
    // This shard's execute worker is served (the row is not vacuous).
    assert_eq!(relay("shard/shard-0/execute").await, (Code::Ok, Code::Ok));

    // Decide's Outbox (Publish, Status) is not on the public port for anyone.
    for role in [
        "shard/shard-0/execute",
        "shard/shard-0",
        "admin",
        "cluster/c1",
    ] {
        let ch = channel(shard.gateway_addr, Some(pki.client(role)))
            .await
            .unwrap();
        let r = OutboxClient::new(ch.clone())
            .status(mesh::StatusRequest::default())
            .await;
        assert_eq!(code(&r), Code::PermissionDenied, "{role} Status");
        let r = OutboxClient::new(ch)
            .publish(tokio_stream::iter(Vec::<mesh::ShardEvent>::new()))
            .await;
        assert_eq!(code(&r), Code::PermissionDenied, "{role} Publish");
    }
    // Reads are for readers only.
    let r = ShardReadClient::new(
        channel(shard.gateway_addr, Some(pki.client("cluster/c1")))
            .await
            .unwrap(),
    )
    .inspect_needs(pb::InspectNeedsRequest::default())
    .await;
    assert_eq!(code(&r), Code::PermissionDenied);
    // The action history and the machine list name every cluster's machines and why they
    // moved: readers only, never an operator or a worker, and nobody without a certificate.
    let history = |tls: Option<std::sync::Arc<rustls::ClientConfig>>| {
        let addr = shard.gateway_addr;
        async move {
            let ch = match channel(addr, tls).await {
                Ok(ch) => ch,
                Err(_) => return (Code::Unavailable, Code::Unavailable),
            };
            let mut c = ShardInfoClient::new(ch);
            let actions = c
                .recent_actions(mesh::RecentActionsRequest::default())
                .await
                .map(|_| ());
            let machines = c
                .list_machines(mesh::ListMachinesRequest::default())
                .await
                .map(|_| ());
            (code(&actions), code(&machines))
        }
    };
    for role in ["cluster/c1", "shard/shard-0/execute", "shard/shard-0"] {
        assert_eq!(
            history(Some(pki.client(role))).await,
            (Code::PermissionDenied, Code::PermissionDenied),
            "{role}"
        );
    }
    let (a, m) = history(None).await;
    assert!(
        a != Code::Ok && m != Code::Ok,
        "plaintext read the history: {a:?} {m:?}"
    );
    // A reader is served (the rows above are not vacuous).
    assert_eq!(
        history(Some(pki.client("readonly"))).await,
        (Code::Ok, Code::Ok)
    );
    let denied = metric_sum(
        shard.gateway_metrics,
        "grpc_server_handled_total",
        &["PermissionDenied"],
    )
    .await;
    assert!(denied >= 19.0, "refusals are counted: {denied}");
}

/// Opens a Work stream with a worker Hello for shard-0, as an execute worker would.
async fn pull_as_worker(
    ch: tonic::transport::Channel,
) -> Result<tonic::Response<tonic::Streaming<mesh::WorkItem>>, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(mesh::WorkerMessage {
        msg: Some(mesh::worker_message::Msg::Hello(
            mesh::worker_message::Hello {
                worker_id: "w".into(),
                shard_id: "shard-0".into(),
            },
        )),
    })
    .await
    .unwrap();
    let r = WorkClient::new(ch).pull(ReceiverStream::new(rx)).await;
    drop(tx);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decides_work_port_serves_only_this_shards_workers() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shard = Shard::start(dir.path(), &pki, &[]).await;
    let ch = |role: &str| {
        let tls = pki.client(role);
        let addr = shard.work_addr;
        async move { channel(addr, Some(tls)).await.unwrap() }
    };
    // A leaked execute certificate cannot inject demand: Ingest is not on the port.
    let r = IngestClient::new(ch("shard/shard-0/execute").await)
        .apply_rollup(mesh::ApplyRollupRequest {
            rollup: Some(pb::ClusterCapacityNeeds {
                cluster_id: "c1".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(code(&r), Code::PermissionDenied, "{r:?}");
    for (role, what) in [
        ("cluster/c1", "an operator"),
        ("shard/shard-1/execute", "another shard's worker"),
        ("readonly", "a reader"),
    ] {
        let r = pull_as_worker(ch(role).await).await;
        assert_eq!(code(&r), Code::PermissionDenied, "{what}");
        let r = WorkClient::new(ch(role).await)
            .transition(mesh::TransitionRequest::default())
            .await;
        assert_eq!(code(&r), Code::PermissionDenied, "{what} Transition");
    }
    let r = ShardReadClient::new(ch("readonly").await)
        .inspect_needs(pb::InspectNeedsRequest::default())
        .await;
    assert_eq!(code(&r), Code::PermissionDenied, "reads stay on the socket");
    // This shard's worker is served.
    let r = pull_as_worker(ch("shard/shard-0/execute").await).await;
    assert_eq!(code(&r), Code::Ok, "{r:?}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // 1 ingest + 3 × (pull + transition) + 1 read, each counted by the serving decide.
    let denied = metric_sum(
        shard.decide_metrics,
        "grpc_server_handled_total",
        &["PermissionDenied"],
    )
    .await;
    assert_eq!(denied, 8.0, "every refusal is counted");
}
