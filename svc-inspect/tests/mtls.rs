//! Role gating under mTLS: readonly and admin read everything; shard and cluster
//! certificates are refused; svc-inspect itself only ever reads from the coordinator.

use crate::common;

use std::sync::Arc;

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_client::InspectClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use common::{Harness, Options};
use tonic::Code;

/// A fleet of doubles under mTLS, with svc-inspect presenting `role`.
async fn mtls_harness(role: &'static str) -> Harness {
    Harness::start(Options {
        tls_role: Some(role),
        ..Options::default()
    })
    .await
}

/// No retries: a refusal must surface as the first call's error.
fn no_retries() -> ClientStackConfig {
    ClientStackConfig {
        retry: RetryPolicy::none(),
        ..ClientStackConfig::default()
    }
}

async fn channel(h: &Harness, tls: Option<Arc<rustls::ClientConfig>>) -> MeshChannel {
    bigfleet_mesh::dial(
        &h.grpc_uri(),
        &ChannelConfig::default().with_tls(tls),
        &no_retries(),
    )
    .await
    .unwrap()
}

async fn read_needs(ch: MeshChannel) -> Result<usize, tonic::Status> {
    let mut c = ShardReadClient::new(ch);
    let mut stream = c
        .inspect_needs(pb::InspectNeedsRequest::default())
        .await?
        .into_inner();
    let mut frames = 0;
    while stream.message().await?.is_some() {
        frames += 1;
    }
    Ok(frames)
}

async fn summary(ch: MeshChannel) -> Result<mesh::FleetSummaryResponse, tonic::Status> {
    InspectClient::new(ch)
        .fleet_summary(mesh::FleetSummaryRequest::default())
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn readonly_and_admin_read_shard_and_cluster_certificates_are_refused() {
    let h = mtls_harness("readonly").await;
    let pki = h.pki.as_ref().unwrap();

    for role in ["readonly", "admin"] {
        let ch = channel(&h, Some(pki.client(role))).await;
        assert_eq!(
            read_needs(ch.clone()).await.unwrap(),
            7,
            "{role}: header + 6 rows"
        );
        let s = summary(ch).await.unwrap();
        assert!(s.coordinator_reachable, "{role}: {}", s.coordinator_error);
        assert_eq!(s.shards.iter().filter(|s| s.reachable).count(), 2, "{role}");
    }

    for role in ["shard/s1", "cluster/c-a", "shard/s1/execute"] {
        let ch = channel(&h, Some(pki.client(role))).await;
        let err = read_needs(ch.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{role}: {err:?}");
        let err = summary(ch).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{role}: {err:?}");
    }

    // svc-inspect, holding a readonly certificate, never asked the coordinator to mutate.
    let calls = h.coordinator.state().calls.clone();
    assert!(!calls.is_empty());
    assert!(calls.iter().all(|c| c.starts_with("List")), "{calls:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn plaintext_and_certificate_less_clients_cannot_reach_an_mtls_inspect() {
    let h = mtls_harness("readonly").await;
    // No client certificate at all: the handshake (or the first call) fails.
    let plain =
        bigfleet_mesh::dial_lazy(&h.grpc_uri(), &ChannelConfig::default(), &no_retries()).unwrap();
    let err = read_needs(plain).await.unwrap_err();
    assert_ne!(err.code(), Code::Ok);
    // Health stays open to every verified caller, whatever its role.
    let pki = h.pki.as_ref().unwrap();
    let ch = channel(&h, Some(pki.client("cluster/c-a"))).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "bigfleet.v1alpha1.ShardRead".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    h.shutdown().await;
}

#[tokio::test]
async fn an_inspect_with_a_shard_certificate_is_refused_by_coordinator_and_shards() {
    let h = mtls_harness("shard/s9").await;
    let pki = h.pki.as_ref().unwrap();
    let ch = channel(&h, Some(pki.client("readonly"))).await;
    let s = summary(ch.clone()).await.unwrap();
    assert!(!s.coordinator_reachable);
    assert!(
        s.coordinator_error.contains("permission denied"),
        "{}",
        s.coordinator_error
    );
    assert!(
        s.shards.is_empty(),
        "nothing learnt from a coordinator that refused"
    );
    let err = read_needs(ch).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        h.coordinator.state().calls.is_empty(),
        "refused before any handler"
    );
    h.shutdown().await;
}
