//! Scripted List faults reach a client on both List paths: the served fast path
//! (`FakeProviderService`) and the generated trait impl (`ProviderGrpc`).

use std::sync::Arc;

use bigfleet_fake_provider::grpc::ProviderGrpc;
use bigfleet_fake_provider::{FakeProvider, ListFault, connect, spawn_uds};
use bigfleet_mesh::BareServer;
use bigfleet_proto::v1alpha1::ListFilter;
use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use bigfleet_proto::v1alpha1::capacity_provider_server::CapacityProviderServer;
use tonic::transport::{Channel, Server};

/// Asks four Lists of a provider scripted to be down, empty and truncated, then honest.
async fn lists_follow_the_script(
    provider: &FakeProvider,
    client: &mut CapacityProviderClient<Channel>,
) {
    let all = provider.len();
    provider.script_lists([
        ListFault::Unavailable,
        ListFault::Empty,
        ListFault::Truncated(3),
    ]);
    let down = client.list(ListFilter::default()).await.unwrap_err();
    assert_eq!(down.code(), tonic::Code::Unavailable, "{down:?}");
    let empty = client
        .list(ListFilter::default())
        .await
        .unwrap()
        .into_inner();
    assert!(empty.machines.is_empty() && empty.revision.is_empty());
    let cut = client
        .list(ListFilter::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!((cut.machines.len(), cut.revision.len()), (3, 0));
    let truth = client
        .list(ListFilter::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(truth.machines.len(), all);
    assert!(!truth.revision.is_empty());
    assert_eq!(provider.list_calls(), 4);
}

#[tokio::test]
async fn the_served_fast_path_answers_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(FakeProvider::builtin());
    let server = spawn_uds(&dir.path().join("p.sock"), provider.clone())
        .await
        .unwrap();
    let mut client = connect(&server.target()).await.unwrap();
    lists_follow_the_script(&provider, &mut client).await;
    server.shutdown().await;
}

#[tokio::test]
async fn the_generated_trait_path_answers_the_script() {
    let provider = Arc::new(FakeProvider::builtin());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _server = BareServer::spawn(
        Server::builder().add_service(CapacityProviderServer::new(ProviderGrpc::new(
            provider.clone(),
            None,
        ))),
        tokio_stream::wrappers::TcpListenerStream::new(listener),
    );
    let mut client = CapacityProviderClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    lists_follow_the_script(&provider, &mut client).await;
}
