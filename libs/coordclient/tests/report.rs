//! The client against the Coordinator double on 127.0.0.1:0, its answers scripted per test.

use bigfleet_coordclient::{ClientConfig, CoordClient};
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_instruction::Payload;
use bigfleet_proto::v1alpha1::instruct_ack::Outcome;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

use crate::common;
use common::{CoordinatorDouble, View, serve};

/// The double with ReportShard answered from `answers`, in order.
fn scripted(answers: impl IntoIterator<Item = Result<pb::ReportAck, Status>>) -> CoordinatorDouble {
    let coord = CoordinatorDouble::default();
    coord.state().report_answers.extend(answers);
    coord
}

fn received(coord: &CoordinatorDouble) -> Vec<pb::ShardReport> {
    coord.state().received_reports.clone()
}

fn client_for(addr: &str, view: Arc<View>) -> CoordClient<View> {
    let channel = bigfleet_mesh::client_stack(
        tonic::transport::Endpoint::from_shared(addr.to_owned())
            .unwrap()
            .connect_timeout(Duration::from_millis(500))
            .connect_lazy(),
        &bigfleet_mesh::ClientStackConfig {
            retry: bigfleet_mesh::RetryPolicy::none(),
            ..Default::default()
        },
    );
    CoordClient::new(
        ClientConfig {
            shard_id: "shard-7".into(),
            shard_epoch: 3,
            advertise_address: "shard-7.svc:7780".into(),
            report_interval: Duration::from_millis(20),
        },
        view,
        channel,
    )
}

fn instruction(id: &str, term: i64, seq: i64, payload: Payload) -> pb::CoordinatorInstruction {
    pb::CoordinatorInstruction {
        coordinator_term: term,
        sequence_number: seq,
        instruction_id: id.into(),
        payload: Some(payload),
    }
}

fn assign(value: &str) -> Payload {
    Payload::AssignDomain(pb::AssignDomain {
        topology_key: "rack".into(),
        topology_value: value.into(),
    })
}

fn reply(
    term: i64,
    instructions: Vec<pb::CoordinatorInstruction>,
) -> Result<pb::ReportAck, Status> {
    Ok(pb::ReportAck {
        coordinator_term: term,
        acknowledged: true,
        instructions,
    })
}

fn acks_of(r: &pb::ShardReport) -> Vec<(String, i32, String)> {
    r.instruction_acks
        .iter()
        .map(|a| (a.instruction_id.clone(), a.outcome, a.reason.clone()))
        .collect()
}

#[tokio::test]
async fn reports_carry_summary_shortfalls_and_address() {
    let coord = CoordinatorDouble::default();
    let (addr, _server) = serve(&coord).await;
    let c = client_for(&format!("http://{addr}"), Arc::new(View::default()));
    c.report_once().await.unwrap();
    c.report_once().await.unwrap();
    let reports = received(&coord);
    assert_eq!(reports.len(), 2);
    let r = &reports[0];
    assert_eq!(
        (r.shard_id.as_str(), r.shard_epoch, r.cycle),
        ("shard-7", 3, 1)
    );
    assert_eq!(reports[1].cycle, 2, "monotonic report counter");
    assert_eq!(r.shard_address, "shard-7.svc:7780");
    assert_eq!(r.summary.as_ref().unwrap().total_machines, 10);
    assert_eq!(r.shortfalls.len(), 3);
    assert!(r.timestamp_unix_nanos > 0);
}

#[tokio::test]
async fn stale_terms_are_rejected_and_redeliveries_re_acked() {
    let coord = scripted([
        reply(5, vec![instruction("i1", 5, 1, assign("r1"))]),
        // Redelivery of i1 (its ack is in this very report) plus a stale one.
        reply(
            5,
            vec![
                instruction("i1", 5, 1, assign("r1")),
                instruction("i2", 4, 2, assign("r2")),
            ],
        ),
        // A whole reply from a deposed leader.
        reply(3, vec![instruction("i3", 3, 3, assign("r3"))]),
    ]);
    let (addr, _server) = serve(&coord).await;
    let view = Arc::new(View::default());
    let c = client_for(&format!("http://{addr}"), view.clone());
    for _ in 0..4 {
        c.report_once().await.unwrap();
    }
    let reports = received(&coord);
    assert!(acks_of(&reports[0]).is_empty());
    assert_eq!(
        acks_of(&reports[1]),
        [("i1".to_owned(), Outcome::Accepted as i32, String::new())]
    );
    assert_eq!(
        acks_of(&reports[2]),
        [
            (
                "i1".to_owned(),
                Outcome::Accepted as i32,
                "duplicate-redelivery".to_owned()
            ),
            (
                "i2".to_owned(),
                Outcome::RejectedStale as i32,
                "term 4 below high-water mark 5".to_owned()
            ),
        ]
    );
    assert!(acks_of(&reports[3]).is_empty(), "stale reply dropped whole");
    assert_eq!(*view.applied.lock(), 1, "applied exactly once");
    assert_eq!(view.domains.lock().len(), 1);
    assert_eq!((c.term_hwm(), *view.term.lock()), (5, 5));
}

#[tokio::test]
async fn acks_are_requeued_after_a_failed_report() {
    let coord = scripted([
        reply(2, vec![instruction("u1", 2, 1, assign("r1"))]),
        Err(Status::failed_precondition("coordinator: not leader")),
        reply(2, vec![]),
    ]);
    let (addr, _server) = serve(&coord).await;
    let c = client_for(&format!("http://{addr}"), Arc::new(View::default()));
    c.report_once().await.unwrap();
    assert!(c.report_once().await.is_err());
    assert_eq!(c.pending_acks().len(), 1, "re-queued");
    c.report_once().await.unwrap();
    let reports = received(&coord);
    assert_eq!(acks_of(&reports[1]).len(), 1, "sent, but not delivered");
    assert_eq!(
        acks_of(&reports[2]),
        [("u1".to_owned(), Outcome::Accepted as i32, String::new())]
    );
    assert!(c.pending_acks().is_empty());
}

#[tokio::test]
async fn an_unreachable_coordinator_only_fails_reports() {
    let view = Arc::new(View::default());
    let c = Arc::new(client_for("http://127.0.0.1:1", view));
    let err = c.report_once().await.unwrap_err();
    assert!(err.to_string().contains("report_shard"));
    // run() keeps going and stops on shutdown.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let c2 = c.clone();
    let task = tokio::spawn(async move {
        c2.run(async {
            let _ = rx.await;
        })
        .await;
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
