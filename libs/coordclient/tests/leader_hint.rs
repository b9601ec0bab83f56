//! Leader hints: with three coordinators a report to a follower comes back
//! NotLeader with the leader's address; the client re-sends it there at once
//! and keeps reporting there, and falls back to its configured address when
//! the hinted leader stops answering.

use bigfleet_coordclient::{ClientConfig, CoordClient, Redial};
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_instruction::Payload;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

use crate::common;
use common::{CoordinatorDouble, RunningServer, View, serve};

/// What the leader answers: term 2 and one domain instruction (the same one each time, so
/// a second leader's answer is a redelivery).
fn assign_ack() -> Result<pb::ReportAck, Status> {
    Ok(pb::ReportAck {
        coordinator_term: 2,
        acknowledged: true,
        instructions: vec![pb::CoordinatorInstruction {
            coordinator_term: 2,
            sequence_number: 1,
            instruction_id: "assign-1".into(),
            payload: Some(Payload::AssignDomain(pb::AssignDomain {
                topology_key: "rack".into(),
                topology_value: "r1".into(),
            })),
        }],
    })
}

/// How many reports reached `replica`, refused ones included.
fn reports(replica: &CoordinatorDouble) -> usize {
    replica.state().received_reports.len()
}

fn channel(addr: &str) -> Result<bigfleet_mesh::MeshChannel, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_millis(500));
    Ok(bigfleet_mesh::client_stack(
        endpoint.connect_lazy(),
        &bigfleet_mesh::ClientStackConfig {
            retry: bigfleet_mesh::RetryPolicy::none(),
            ..Default::default()
        },
    ))
}

fn client(home: &str, view: Arc<View>, dialled: Arc<Mutex<Vec<String>>>) -> CoordClient<View> {
    let redial: Redial = Arc::new(move |addr: &str| {
        dialled.lock().push(addr.to_owned());
        channel(addr)
    });
    CoordClient::new(
        ClientConfig {
            shard_id: "shard-1".into(),
            shard_epoch: 1,
            advertise_address: "shard-1:7780".into(),
            report_interval: Duration::from_millis(20),
        },
        view,
        channel(home).unwrap(),
    )
    .with_redial(redial)
}

/// A replica answering with `leader_answers` and a follower hinting at it, both served: each
/// replica, its address and its server.
struct Replicas {
    leader: CoordinatorDouble,
    leader_addr: String,
    follower: CoordinatorDouble,
    follower_addr: String,
    _servers: [RunningServer; 2],
}

async fn leader_and_follower(
    leader_answers: impl IntoIterator<Item = Result<pb::ReportAck, Status>>,
) -> Replicas {
    let leader = CoordinatorDouble::default();
    leader.state().report_answers.extend(leader_answers);
    let (leader_addr, leader_server) = serve(&leader).await;
    let follower = CoordinatorDouble::default();
    follower.state().follower_of = Some(leader_addr.to_string());
    let (follower_addr, follower_server) = serve(&follower).await;
    Replicas {
        leader,
        leader_addr: leader_addr.to_string(),
        follower,
        follower_addr: follower_addr.to_string(),
        _servers: [leader_server, follower_server],
    }
}

#[tokio::test]
async fn a_follower_hint_is_followed_at_once_and_kept() {
    let Replicas {
        leader,
        leader_addr,
        follower,
        follower_addr,
        ..
    } = leader_and_follower([assign_ack(), assign_ack()]).await;

    let view = Arc::new(View::default());
    let dialled = Arc::new(Mutex::new(Vec::new()));
    let c = client(&follower_addr, view.clone(), dialled.clone());

    // The report a follower refused reaches the leader in the same call.
    let o = c.report_once().await.expect("the hinted leader answers");
    assert_eq!(o.acks.len(), 1);
    assert_eq!(*view.applied.lock(), 1);
    assert_eq!((reports(&follower), reports(&leader)), (1, 1));
    assert_eq!(
        dialled.lock().as_slice(),
        std::slice::from_ref(&leader_addr)
    );
    assert_eq!(c.hinted_leader(), Some(leader_addr.clone()));

    // Later reports go straight to the leader, carrying the ack.
    c.report_once().await.unwrap();
    assert_eq!((reports(&follower), reports(&leader)), (1, 2));
    assert_eq!(
        dialled.lock().len(),
        1,
        "no re-dial while the leader answers"
    );
}

#[tokio::test]
async fn a_failing_hinted_leader_sends_reports_home_again() {
    // The leader answers once, then steps down.
    let Replicas {
        follower,
        follower_addr,
        ..
    } = leader_and_follower([assign_ack(), Err(Status::unavailable("stepping down"))]).await;
    follower.state().report_answers.push_back(assign_ack());
    let dialled = Arc::new(Mutex::new(Vec::new()));
    let c = client(&follower_addr, Arc::new(View::default()), dialled.clone());
    c.report_once().await.unwrap();

    // The leader steps down: that report fails and its acks wait...
    assert!(c.report_once().await.is_err());
    assert_eq!(c.hinted_leader(), None);
    assert_eq!(
        c.pending_acks().len(),
        1,
        "acks are kept for the next report"
    );
    // ...and the next one starts from the configured address, which now
    // names a new leader (the old follower).
    follower.state().follower_of = None;
    c.report_once().await.unwrap();
    assert_eq!(reports(&follower), 2);
    // The new leader redelivers the instruction: re-acked, not re-applied.
    let acks = c.pending_acks();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].reason, "duplicate-redelivery");
}
