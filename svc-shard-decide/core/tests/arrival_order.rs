//! Arrival order among equal priorities (ADR-0116): a need's arrival is the
//! shard's receipt of the first roll-up that carried it, kept across re-sends,
//! so an operator that re-sends its demand often is not pushed behind a
//! cluster that asked later. InspectNeeds shows that same arrival and orders
//! rows by it.

use crate::common;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use common::{MapSource, need, pm};
use futures::StreamExt;
use pb::shard_read_server::ShardRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use svc_shard_decide_core::edge;
use svc_shard_decide_core::testing::rollup_request;
use svc_shard_decide_core::{Decide, DecideConfig, DecideService, RailsConfig};

const SEC: i64 = 1_000_000_000;
/// 2026-11-27T00:00:00Z: any fixed start does.
const T0: i64 = 1_795_737_600 * SEC;

fn decide(clock: &Arc<AtomicI64>) -> Decide {
    let cfg = DecideConfig {
        rails: RailsConfig::off(),
        engine_threads: 1,
        queue_capacity: 100_000,
        ..DecideConfig::default()
    };
    // One Idle 4-core machine.
    let source: MapSource = [pm("m0", pb::MachineState::Idle, "")].into_iter().collect();
    common::decide_on_clock(cfg, source, clock)
}

/// A roll-up built (operator clock) and received (decide's clock) at `at`:
/// one need for the whole machine at priority 5, plus `more` needs at priority
/// 1 when given (a cluster whose other demand keeps changing).
fn ask_with(d: &Decide, clock: &AtomicI64, cluster: &str, at: i64, more: &[u32]) {
    clock.store(at, Ordering::SeqCst);
    let mut needs = vec![need(4, 5)];
    needs.extend(more.iter().map(|cpu| need(*cpu, 1)));
    let req = rollup_request(cluster, at, needs);
    let resp = edge::apply_rollup(d, &req).unwrap();
    assert_eq!(resp.outcome, mesh::RollupOutcome::Accepted as i32);
}

fn ask(d: &Decide, clock: &AtomicI64, cluster: &str, at: i64) {
    ask_with(d, clock, cluster, at, &[]);
}

/// InspectNeeds rows as (cluster, arrival, satisfied), in the order served.
async fn inspect(d: &Decide) -> Vec<(String, i64, bool)> {
    let svc = DecideService::new(d.clone());
    let stream = svc
        .inspect_needs(tonic::Request::new(pb::InspectNeedsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let frames: Vec<_> = stream.collect().await;
    frames
        .into_iter()
        .filter_map(|f| match f.unwrap().frame {
            Some(pb::inspect_needs_response::Frame::Need(v)) => {
                Some((v.cluster_id, v.arrival_unix_nanos, v.satisfied))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_cluster_that_asked_first_gets_the_machine_however_often_it_resends() {
    let clock = Arc::new(AtomicI64::new(T0));
    let d = decide(&clock);
    // The first reconcile: roll-ups before it are not judged.
    d.run_cycle().await.unwrap();

    // "zchatty" asks first; "quiet" asks once, after it. Chatty then re-sends
    // every second: its priority-5 need unchanged, its priority-1 demand
    // changing (identical re-sends would not even reach the table). Cluster ids
    // put chatty last on the final tie-break, so only arrival can favour it.
    ask(&d, &clock, "zchatty", T0 + SEC);
    ask(&d, &clock, "quiet", T0 + 2 * SEC);
    for k in 3..6 {
        ask_with(&d, &clock, "zchatty", T0 + k * SEC, &[k as u32]);
    }
    clock.store(T0 + 6 * SEC, Ordering::SeqCst);
    d.run_cycle().await.unwrap();

    // One machine for two equal needs: the earlier arrival wins it. Chatty's
    // priority-1 need keeps the arrival of the first re-send that carried it.
    assert_eq!(
        inspect(&d).await,
        [
            ("zchatty".to_owned(), T0 + SEC, true),
            ("quiet".to_owned(), T0 + 2 * SEC, false),
            ("zchatty".to_owned(), T0 + 3 * SEC, false),
        ]
    );
    let table = d.verdicts();
    let quiet = table
        .rows
        .iter()
        .find(|r| r.need().cluster == "quiet")
        .unwrap();
    assert_eq!(
        quiet.verdict.unmet_reason,
        bigfleet_decision::UnmetReason::PriorityStarved
    );

    // Withdrawing ends the claim to the old arrival: asking again queues anew.
    ask_nothing(&d, &clock, "zchatty", T0 + 7 * SEC);
    ask(&d, &clock, "zchatty", T0 + 8 * SEC);
    d.run_cycle().await.unwrap();
    let rows = inspect(&d).await;
    assert_eq!(
        rows.iter()
            .map(|(c, a, _)| (c.as_str(), *a))
            .collect::<Vec<_>>(),
        [("quiet", T0 + 2 * SEC), ("zchatty", T0 + 8 * SEC)]
    );
}

/// An empty roll-up (withdrawal) at `at`.
fn ask_nothing(d: &Decide, clock: &AtomicI64, cluster: &str, at: i64) {
    clock.store(at, Ordering::SeqCst);
    let req = rollup_request(cluster, at, vec![]);
    edge::apply_rollup(d, &req).unwrap();
}
