//! A provider listing taken before an action finished must not undo it: the
//! List is answered before the merge takes the inventory lock, and a worker's
//! Done in between clears the in-flight mark the merge relies on.

use crate::common;

use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::Readiness;
use bigfleet_testkit::wait_until;
use common::*;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use svc_shard_decide_core::edge;
use svc_shard_decide_core::reconcile::RawMachineList;
use svc_shard_decide_core::{
    Decide, DecideService, MachineSource, ProviderClient, Publisher, ShardMetrics,
};
use tokio::net::UnixListener;
use tokio::sync::Notify;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

const LONG: Duration = Duration::from_secs(3);

/// The provider's List, held after the answer arrived while `armed`: the
/// test finishes an action between the listing and its merge.
struct GatedSource {
    inner: ProviderClient,
    armed: AtomicBool,
    listed: Notify,
    release: Notify,
}

impl MachineSource for GatedSource {
    fn list(&self, since: Vec<u8>) -> BoxFuture<'_, Result<RawMachineList, tonic::Status>> {
        Box::pin(async move {
            let answer = self.inner.list(since).await;
            if self.armed.swap(false, Ordering::AcqRel) {
                self.listed.notify_one();
                self.release.notified().await;
            }
            answer
        })
    }
}

#[tokio::test]
async fn a_listing_older_than_a_finished_action_does_not_roll_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider();
    provider
        .add_machine(pm("i000", pb::MachineState::Idle, ""))
        .unwrap();
    let (provider_sock, _stop_provider) = serve_provider(dir.path(), provider.clone()).await;
    let source = Arc::new(GatedSource {
        inner: ProviderClient::new(bigfleet_mesh::client_stack(
            uds_channel(&provider_sock),
            &bigfleet_mesh::ClientStackConfig::default(),
        )),
        armed: AtomicBool::new(false),
        listed: Notify::new(),
        release: Notify::new(),
    });
    let (publisher, mut events) = Publisher::channel(10_000);
    let decide = Decide::new(
        cfg_rails_off(),
        source.clone(),
        publisher,
        ShardMetrics::unregistered(),
        Readiness::not_ready("test"),
    )
    .unwrap();
    let decide_sock = dir.path().join("decide.sock");
    let svc = DecideService::new(decide.clone());
    tokio::spawn(
        Server::builder()
            .add_service(svc.ingest_server())
            .add_service(svc.work_server())
            .serve_with_incoming(UnixListenerStream::new(
                UnixListener::bind(&decide_sock).unwrap(),
            )),
    );
    edge::session_opened(
        &decide,
        &mesh::SessionOpenedRequest {
            cluster_id: "c1".into(),
            session_id: 1,
            protocol_version: "v1alpha1".into(),
        },
    )
    .await
    .expect("session opened");
    edge::apply_rollup(&decide, &rollup("c1", vec![need(4, 50)])).unwrap();
    assert_eq!(decide.run_cycle().await.unwrap().enqueued, 1);

    let mut client =
        bigfleet_proto::mesh::v1::work_client::WorkClient::new(uds_channel(&decide_sock));
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1).await;
    let item = w.next(LONG).await.unwrap();
    start_configuring(&mut client, &item, "c1").await.unwrap();

    // A cycle lists the provider (still Idle there) and is held before merging.
    source.armed.store(true, Ordering::Release);
    let cycle = tokio::spawn({
        let decide = decide.clone();
        async move { decide.run_cycle().await }
    });
    tokio::time::timeout(LONG, source.listed.notified())
        .await
        .expect("the cycle lists the provider");

    // Meanwhile the worker configures the machine and finishes the action.
    provider
        .update_machine("i000", |m| {
            m.state = pb::MachineState::Configured as i32;
            m.cluster = "c1".into();
        })
        .unwrap();
    report(
        &mut client,
        &item,
        pb::MachineState::Configuring,
        pb::MachineState::Configured,
        mesh::MachinePatch::default(),
    )
    .await
    .unwrap();
    w.done(&item.action_id, "success").await;
    wait_until(LONG, "no action left", async || {
        decide.action_counts() == (0, 0)
    })
    .await;

    source.release.notify_one();
    let report = cycle.await.unwrap().unwrap();
    let m = decide.machine("i000").await.unwrap();
    assert_eq!(
        (m.state, m.cluster.as_str()),
        (MachineState::Configured, "c1"),
        "the stale listing (Idle) must not overwrite the finished transition"
    );
    assert_eq!(
        report.enqueued, 0,
        "no second action for a configured machine"
    );
    let last = last_node_state(&mut events, "c1", "i000");
    assert_eq!(last, Some(pb::MachineState::Configured as i32));

    // The next listing agrees and changes nothing.
    let report = decide.run_cycle().await.unwrap();
    assert_eq!(report.enqueued, 0);
    assert_eq!(
        decide.machine("i000").await.unwrap().state,
        MachineState::Configured
    );
    assert_eq!(last_node_state(&mut events, "c1", "i000"), None);
}

/// The state of the last NodeStateUpdate for `machine` sent to `cluster` since
/// the previous call.
fn last_node_state(
    events: &mut svc_shard_decide_core::Events,
    cluster: &str,
    machine: &str,
) -> Option<i32> {
    let mut last = None;
    while let Ok(e) = events.try_recv() {
        if let Some(mesh::shard_event::Frame::NodeStateUpdate(u)) = e.frame
            && e.cluster_id == cluster
            && u.machine_id == machine
        {
            last = Some(u.state);
        }
    }
    last
}
