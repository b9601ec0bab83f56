//! Leader hints: with three coordinators a report to a follower comes back
//! NotLeader with the leader's address; the client re-sends it there at once
//! and keeps reporting there, and falls back to its configured address when
//! the hinted leader stops answering.

use bigfleet_coordclient::{ClientConfig, CoordClient, Redial, leader_hint};
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_instruction::Payload;
use bigfleet_proto::v1alpha1::coordinator_server::Coordinator;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

use crate::common;
use common::{View, serve};

/// A coordinator replica: a follower hints at `leader`, the leader answers
/// (or fails with UNAVAILABLE while `down`).
#[derive(Clone, Default)]
struct Replica {
    leader: Arc<Mutex<Option<String>>>,
    down: Arc<Mutex<bool>>,
    reports: Arc<Mutex<u32>>,
}

fn not_leader(hint: &str) -> Status {
    let mut s = Status::failed_precondition("not leader: this replica is a follower");
    s.metadata_mut()
        .insert(bigfleet_mesh::LEADER_HINT_METADATA, hint.parse().unwrap());
    s
}

common::coordinator_reporting_to!(Replica);

impl Replica {
    async fn report(&self, _: Request<pb::ShardReport>) -> Result<Response<pb::ReportAck>, Status> {
        *self.reports.lock() += 1;
        if let Some(hint) = self.leader.lock().clone() {
            return Err(not_leader(&hint));
        }
        if *self.down.lock() {
            return Err(Status::unavailable("stepping down"));
        }
        Ok(Response::new(pb::ReportAck {
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
        }))
    }
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

/// A leader replica and a follower hinting at it, both served, with their addresses.
async fn leader_and_follower() -> (Replica, String, Replica, String) {
    let leader = Replica::default();
    let leader_addr = serve(leader.clone()).await.to_string();
    let follower = Replica::default();
    *follower.leader.lock() = Some(leader_addr.clone());
    let follower_addr = serve(follower.clone()).await.to_string();
    (leader, leader_addr, follower, follower_addr)
}

#[tokio::test]
async fn a_follower_hint_is_followed_at_once_and_kept() {
    let (leader, leader_addr, follower, follower_addr) = leader_and_follower().await;

    let view = Arc::new(View::default());
    let dialled = Arc::new(Mutex::new(Vec::new()));
    let c = client(&follower_addr, view.clone(), dialled.clone());

    // The report a follower refused reaches the leader in the same call.
    let o = c.report_once().await.expect("the hinted leader answers");
    assert_eq!(o.acks.len(), 1);
    assert_eq!(*view.applied.lock(), 1);
    assert_eq!((*follower.reports.lock(), *leader.reports.lock()), (1, 1));
    assert_eq!(
        dialled.lock().as_slice(),
        std::slice::from_ref(&leader_addr)
    );
    assert_eq!(c.hinted_leader(), Some(leader_addr.clone()));

    // Later reports go straight to the leader, carrying the ack.
    c.report_once().await.unwrap();
    assert_eq!((*follower.reports.lock(), *leader.reports.lock()), (1, 2));
    assert_eq!(
        dialled.lock().len(),
        1,
        "no re-dial while the leader answers"
    );
}

#[tokio::test]
async fn a_failing_hinted_leader_sends_reports_home_again() {
    let (leader, _, follower, follower_addr) = leader_and_follower().await;
    let dialled = Arc::new(Mutex::new(Vec::new()));
    let c = client(&follower_addr, Arc::new(View::default()), dialled.clone());
    c.report_once().await.unwrap();

    // The leader steps down: that report fails and its acks wait...
    *leader.down.lock() = true;
    assert!(c.report_once().await.is_err());
    assert_eq!(c.hinted_leader(), None);
    assert_eq!(
        c.pending_acks().len(),
        1,
        "acks are kept for the next report"
    );
    // ...and the next one starts from the configured address, which now
    // names a new leader (the old follower).
    *follower.leader.lock() = None;
    c.report_once().await.unwrap();
    assert_eq!(*follower.reports.lock(), 2);
    // The new leader redelivers the instruction: re-acked, not re-applied.
    let acks = c.pending_acks();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].reason, "duplicate-redelivery");
}

#[test]
fn only_a_not_leader_answer_is_a_hint() {
    assert_eq!(
        leader_hint(&not_leader("10.0.0.2:7790")).as_deref(),
        Some("10.0.0.2:7790")
    );
    let mut other = Status::failed_precondition("fenced");
    other
        .metadata_mut()
        .insert(bigfleet_mesh::LEADER_HINT_METADATA, "x:1".parse().unwrap());
    assert_eq!(leader_hint(&other), None);
    assert_eq!(leader_hint(&Status::unavailable("down")), None);
    assert_eq!(
        leader_hint(&Status::failed_precondition("not leader: no leader known")),
        None
    );
}
