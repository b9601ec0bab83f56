//! `--rpc-latency`: every mutating call waits before it is handled; reads do not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_fake_provider::server::{ServeOptions, spawn_uds_with};
use bigfleet_fake_provider::{FakeProvider, connect};
use bigfleet_proto::v1alpha1::{CreateRequest, ListFilter, MachineRef, MachineState};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutations_wait_for_the_configured_latency() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(FakeProvider::builtin());
    let latency = Duration::from_millis(120);
    let server = spawn_uds_with(
        &dir.path().join("provider.sock"),
        provider.clone(),
        ServeOptions {
            rpc_latency: latency,
            ..ServeOptions::default()
        },
    )
    .await
    .unwrap();
    let mut client = connect(&server.target()).await.unwrap();
    let speculative = client
        .list(ListFilter {
            states: vec![MachineState::Speculative as i32],
            ..ListFilter::default()
        })
        .await
        .unwrap()
        .into_inner()
        .machines;
    let id = speculative[0].id.clone();

    let started = Instant::now();
    let ack = client
        .create(CreateRequest {
            machine_id: id.clone(),
            shard_id: "shard-0".into(),
            shard_epoch: 1,
            sequence_number: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    assert!(took >= latency, "create answered after {took:?}");
    assert!(!ack.operation_id.is_empty());
    let m = client
        .get(MachineRef { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.state, MachineState::Idle as i32);
    server.shutdown().await;
}
