//! The Decide gRPC API end to end: the Work stream, Transition, session
//! events and hints, and ShardRead.InspectNeeds.

use crate::common;

use bigfleet_fake_provider::ListFault;
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use bigfleet_testkit::wait_until;
use common::*;
use std::collections::HashSet;
use std::time::Duration;
use svc_shard_decide_core::edge;
use tonic::transport::Channel;

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(3);

/// `n` Idle machines and a c1 demand for all of them.
async fn bootstrap_harness(n: usize) -> Harness {
    let h = Harness::listing(cfg_rails_off(), idle_fleet(n, |i| format!("i{i:03}"))).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4 * n as u32, 50)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, n);
    h
}

fn machine_of(item: &mesh::WorkItem) -> String {
    item.action.as_ref().unwrap().machine_id.clone()
}

#[tokio::test]
async fn two_workers_never_get_the_same_machine() {
    let h = bootstrap_harness(40).await;
    let mut client = h.client();
    let mut a = TestWorker::connect(&mut client, "a", "").await;
    let mut b = TestWorker::connect(&mut client, "b", "").await;
    a.credit(100).await;
    b.credit(100).await;
    let mut seen = HashSet::new();
    let mut per_worker = [0, 0];
    while seen.len() < 40 {
        tokio::select! {
            Some(item) = a.next(LONG) => { assert!(seen.insert(machine_of(&item)), "duplicate"); per_worker[0] += 1; }
            Some(item) = b.next(LONG) => { assert!(seen.insert(machine_of(&item)), "duplicate"); per_worker[1] += 1; }
            else => break,
        }
    }
    assert_eq!(seen.len(), 40);
    assert_eq!(per_worker[0] + per_worker[1], 40);
    // A second cycle re-derives nothing new: everything is in flight.
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 0);
    assert!(a.next(SHORT).await.is_none() && b.next(SHORT).await.is_none());
    assert_eq!(h.decide.action_counts(), (0, 40));
}

#[tokio::test]
async fn credits_bound_the_in_flight_count() {
    let h = bootstrap_harness(10).await;
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(3).await;
    for _ in 0..3 {
        assert!(w.next(LONG).await.is_some());
    }
    assert!(w.next(SHORT).await.is_none(), "no credit, no work");
    assert_eq!(h.decide.action_counts(), (7, 3));
    // Finishing does not return a credit by itself.
    w.credit(2).await;
    assert!(w.next(LONG).await.is_some());
    assert!(w.next(LONG).await.is_some());
    assert!(w.next(SHORT).await.is_none());
    assert_eq!(h.decide.action_counts().1, 5);
}

#[tokio::test]
async fn a_disconnected_worker_frees_its_machine_for_rederivation() {
    let h = bootstrap_harness(1).await;
    let mut client = h.client();
    let mut a = TestWorker::connect(&mut client, "a", "").await;
    a.credit(1).await;
    let item = a.next(LONG).await.unwrap();
    start_configuring(&mut client, &item, "c1").await.unwrap();
    drop(a);
    wait_until(LONG, "abandoned when the stream ends", async || {
        h.decide.action_counts().1 == 0
    })
    .await;
    assert_eq!(
        h.decide
            .metrics()
            .action_execute_outcomes
            .with_label_values(&["Bootstrap", "abandoned"])
            .get(),
        1
    );
    // The old hand-out can no longer report.
    let err = report(
        &mut client,
        &item,
        pb::MachineState::Configuring,
        pb::MachineState::Configured,
        Default::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    // The provider never configured it: reconcile takes its view (Idle) and the
    // next cycle re-derives the bootstrap for another worker.
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 1);
    let mut b = TestWorker::connect(&mut client, "b", "").await;
    b.credit(1).await;
    let again = b.next(LONG).await.unwrap();
    assert_eq!(machine_of(&again), machine_of(&item));
    assert_ne!(again.action_id, item.action_id);
    assert!(
        again.fencing.unwrap().sequence_base > item.fencing.unwrap().sequence_base,
        "fresh, higher sequence window"
    );
}

#[tokio::test]
async fn reconcile_skips_in_flight_machines_configuring_to_idle_race() {
    let mut h = bootstrap_harness(1).await;
    edge::session_opened(
        &h.decide,
        &mesh::SessionOpenedRequest {
            cluster_id: "c1".into(),
            session_id: 7,
            protocol_version: "v1alpha1".into(),
        },
    )
    .await
    .expect("session opened");
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1).await;
    let item = w.next(LONG).await.unwrap();
    let id = machine_of(&item);
    let a = item.action.clone().unwrap();
    start_configuring(&mut client, &item, "c1").await.unwrap();
    // The provider still lists Idle: without the skip this would flip the
    // machine back and fail the worker's next transition.
    h.decide.run_cycle().await.unwrap();
    assert_eq!(
        h.decide.machine(&id).await.unwrap().state,
        MachineState::Configuring
    );
    let resp = report(
        &mut client,
        &item,
        pb::MachineState::Configuring,
        pb::MachineState::Configured,
        mesh::MachinePatch {
            assigned_priority: Some(a.priority),
            assigned_interruption_penalty_dollars: Some(a.interruption_penalty_dollars),
            assigned_reclamation_penalty_dollars: Some(a.reclamation_penalty_dollars),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(resp.state, pb::MachineState::Configured as i32);
    assert_eq!(resp.cluster, "c1");
    assert_eq!(
        resp.shard_metadata["bigfleet.lucy.sh/assigned-priority"],
        "50"
    );
    let m = h.decide.machine(&id).await.unwrap();
    assert_eq!(
        (m.assigned_priority, m.assigned_need_fingerprint.as_str()),
        (50, a.need_fingerprint.as_str())
    );
    // The cluster's operator learns the final state; the Configuring frame may have been
    // replaced by it while both waited (frames coalesce per node, ADR-0107), but nothing
    // older ever follows a newer one.
    let states: Vec<i32> = h
        .drain_events()
        .into_iter()
        .filter(|e| e.cluster_id == "c1")
        .filter_map(|e| match e.frame {
            Some(mesh::shard_event::Frame::NodeStateUpdate(u)) if u.machine_id == id => {
                Some(u.state)
            }
            _ => None,
        })
        .collect();
    let configuring = pb::MachineState::Configuring as i32;
    let configured = pb::MachineState::Configured as i32;
    assert!(
        states == [configuring, configured] || states == [configured],
        "{states:?}"
    );
    w.done(&item.action_id, "success").await;
    wait_until(LONG, "no action in flight", async || {
        h.decide.action_counts().1 == 0
    })
    .await;
}

#[tokio::test]
async fn transition_errors_map_to_their_codes() {
    use pb::MachineState as S;
    use tonic::Code;
    let h = bootstrap_harness(1).await;
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1).await;
    let item = w.next(LONG).await.unwrap();
    let unknown_machine: Edit = |r| r.machine_id = "nope".into();
    let other_action: Edit = |r| r.action_id = "e1-999".into();
    let unchanged: Edit = |_| {};
    let refused_while_idle = [
        (S::Idle, S::Configuring, unknown_machine, Code::NotFound),
        (S::Configured, S::Draining, unchanged, Code::Aborted),
        (S::Idle, S::Configured, unchanged, Code::InvalidArgument),
        (S::Idle, S::Configuring, other_action, Code::Aborted),
    ];
    for (from, to, edit, code) in refused_while_idle {
        assert_refused(
            &mut client,
            &item,
            (from, to),
            Default::default(),
            edit,
            code,
        )
        .await;
    }
    report(
        &mut client,
        &item,
        S::Idle,
        S::Configuring,
        mesh::MachinePatch {
            cluster: Some("c1".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Failed needs a last_error.
    let no_error = mesh::MachinePatch::default();
    let bad_view = mesh::MachinePatch {
        provider_view: Some(pb::Machine {
            price_per_hour: -1.0,
            ..pm("x", S::Idle, "")
        }),
        ..Default::default()
    };
    for (to, patch) in [(S::Failed, no_error), (S::Configured, bad_view)] {
        let code = Code::InvalidArgument;
        assert_refused(
            &mut client,
            &item,
            (S::Configuring, to),
            patch,
            unchanged,
            code,
        )
        .await;
    }
    assert_eq!(
        h.decide.machine(&machine_of(&item)).await.unwrap().state,
        MachineState::Configuring
    );
}

/// A change to a transition request before it is sent.
type Edit = fn(&mut mesh::TransitionRequest);

/// Sends `item`'s transition `from_to` with `patch`, edited, and checks decide refuses
/// it with `code`.
async fn assert_refused(
    client: &mut WorkClient<Channel>,
    item: &mesh::WorkItem,
    (from, to): (pb::MachineState, pb::MachineState),
    patch: mesh::MachinePatch,
    edit: Edit,
    code: tonic::Code,
) {
    let mut request = transition(item, from, to, patch);
    edit(&mut request);
    let err = client.transition(request).await.unwrap_err();
    assert_eq!(err.code(), code, "{from:?} -> {to:?}: {err}");
}

#[tokio::test]
async fn drain_completion_notifies_the_cluster_it_left() {
    let mut m = pm("m1", pb::MachineState::Configured, "c1");
    m.shard_metadata
        .insert("bigfleet.lucy.sh/assigned-priority".into(), "3".into());
    let mut h = Harness::listing(cfg_rails_off(), [m]).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 1);
    h.drain_events();
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1).await;
    let item = w.next(LONG).await.unwrap();
    assert_eq!(
        item.machine.as_ref().unwrap().shard_metadata["bigfleet.lucy.sh/assigned-priority"],
        "3"
    );
    begin_drain(&mut client, &item).await.unwrap();
    let idle = report(
        &mut client,
        &item,
        pb::MachineState::Draining,
        pb::MachineState::Idle,
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(idle.cluster, "");
    assert!(idle.shard_metadata.is_empty());
    let events = h.drain_events();
    let last = events.last().unwrap();
    assert_eq!(
        last.cluster_id, "c1",
        "routed with the binding captured before the change"
    );
    assert_eq!(last.supersedes_key, "node:m1");
    match &last.frame {
        Some(mesh::shard_event::Frame::NodeStateUpdate(u)) => {
            assert_eq!(u.state, pb::MachineState::Idle as i32);
            assert_eq!(u.labels["node.kubernetes.io/instance-type"], "m5.xlarge");
        }
        other => panic!("unexpected frame {other:?}"),
    }
}

#[tokio::test]
async fn sessions_resync_and_hints_are_deduplicated() {
    let p = provider();
    p.add_machine(pm("b1", pb::MachineState::Configured, "c1"))
        .unwrap();
    p.add_machine(pm("b2", pb::MachineState::Configured, "c2"))
        .unwrap();
    for i in 0..3 {
        p.add_machine(pm(&format!("i{i}"), pb::MachineState::Idle, ""))
            .unwrap();
    }
    let mut h = Harness::start_with(cfg_rails_off(), p).await;
    h.decide.reconcile().await.unwrap();
    h.drain_events();
    let mut client = h.ingest();
    let resp = client
        .session_opened(mesh::SessionOpenedRequest {
            cluster_id: "c1".into(),
            session_id: 10,
            protocol_version: "v1alpha1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((resp.resync_machines, resp.shard_epoch), (1, 1));
    let ev = h.drain_events();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].cluster_id.as_str(), ev[0].supersedes_key.as_str()),
        ("c1", "node:b1")
    );

    // A need that cannot be met with what is idle keeps a stable hint.

    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(400, 1)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.hints_sent, 1);
    let hint = h
        .drain_events()
        .into_iter()
        .find_map(|e| match e.frame {
            Some(mesh::shard_event::Frame::AvailableCapacity(a)) => Some((e.cluster_id, a)),
            _ => None,
        })
        .expect("a hint");
    assert_eq!(hint.0, "c1");
    assert!(hint.1.supersedes_key.starts_with("available:"));
    assert_eq!(
        hint.1.confidence,
        pb::available_capacity_update::Confidence::High as i32
    );
    assert_eq!(hint.1.cost_per_hour, 0.2);
    // Unchanged value: no re-send. The cluster without a session gets nothing.
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.hints_sent, 0);

    // A stale close (older session id) is ignored; the real close forgets.
    client
        .session_closed(mesh::SessionClosedRequest {
            cluster_id: "c1".into(),
            session_id: 9,
            reason: "replaced".into(),
        })
        .await
        .unwrap();
    assert_eq!(h.decide.connected_clusters(), ["c1"]);
    client
        .session_closed(mesh::SessionClosedRequest {
            cluster_id: "c1".into(),
            session_id: 10,
            reason: "client_closed".into(),
        })
        .await
        .unwrap();
    assert!(h.decide.connected_clusters().is_empty());
    assert_eq!(h.decide.run_cycle().await.unwrap().hints_sent, 0);
    client
        .session_opened(mesh::SessionOpenedRequest {
            cluster_id: "c1".into(),
            session_id: 11,
            protocol_version: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        h.decide.run_cycle().await.unwrap().hints_sent,
        1,
        "fresh session, fresh hint"
    );
}

async fn inspect(
    client: &mut ShardReadClient<tonic::transport::Channel>,
    cluster: &str,
    limit: i32,
) -> (pb::InspectNeedsHeader, Vec<pb::NeedView>) {
    let mut s = client
        .inspect_needs(pb::InspectNeedsRequest {
            cluster_id: cluster.into(),
            limit,
        })
        .await
        .unwrap()
        .into_inner();
    let header = match s.message().await.unwrap().unwrap().frame {
        Some(pb::inspect_needs_response::Frame::Header(h)) => h,
        other => panic!("first frame must be the header, got {other:?}"),
    };
    let mut rows = Vec::new();
    while let Some(f) = s.message().await.unwrap() {
        match f.frame {
            Some(pb::inspect_needs_response::Frame::Need(n)) => rows.push(n),
            other => panic!("unexpected frame {other:?}"),
        }
    }
    (header, rows)
}

#[tokio::test]
async fn inspect_needs_header_filter_limit_and_order() {
    let h = Harness::listing(cfg_rails_off(), idle_fleet(2, |i| format!("i{i}"))).await;
    let mut reader = ShardReadClient::new(uds_channel(&h.decide_sock));
    let (hdr, rows) = inspect(&mut reader, "", 0).await;
    assert_eq!((hdr.cycle, hdr.total_needs, rows.len()), (0, 0, 0));

    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(400, 1), need(4, 9)])).unwrap();
    edge::apply_rollup(&h.decide, &rollup("c2", vec![need(4, 5)])).unwrap();
    h.decide.run_cycle().await.unwrap();
    let (hdr, rows) = inspect(&mut reader, "", 0).await;
    assert_eq!((hdr.cycle, hdr.total_needs), (1, 3));
    assert!(hdr.computed_at_unix_nanos > 0);
    let prios: Vec<i32> = rows
        .iter()
        .map(|r| r.need.as_ref().unwrap().priority)
        .collect();
    assert_eq!(prios, [9, 5, 1]);
    let big = &rows[2];
    assert!(!big.satisfied);
    // Matching supply exists but higher-priority needs hold it.
    assert_eq!(big.unmet_reason, pb::UnmetReason::PriorityStarved as i32);
    assert!(big.matching_supply.is_some());
    assert!(big.residual_deficit.is_some());
    assert_eq!(big.age_cycles_unmet, 1);
    assert!(rows[0].satisfied && rows[1].satisfied);
    assert!(rows[0].residual_deficit.is_none());
    assert_eq!(rows[0].bootstrap_count, 1);
    assert!(!rows[0].profile_fingerprint.is_empty());

    let (hdr, rows) = inspect(&mut reader, "c2", 0).await;
    assert_eq!((hdr.total_needs, rows.len()), (1, 1));
    assert_eq!(rows[0].cluster_id, "c2");
    let (hdr, rows) = inspect(&mut reader, "", 1).await;
    assert_eq!((hdr.total_needs, rows.len()), (3, 1));
    let err = reader
        .inspect_needs(pb::InspectNeedsRequest {
            cluster_id: String::new(),
            limit: -1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let mut info = ShardInfoClient::new(uds_channel(&h.decide_sock));
    let d = info
        .describe(mesh::DescribeShardRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((d.cycle, d.needs, d.unmet_needs), (1, 3, 1));
    assert_eq!(d.machines_by_state.values().sum::<i32>(), 2);
}

#[tokio::test]
async fn the_run_loop_wakes_on_accepted_rollups() {
    let cfg = svc_shard_decide_core::DecideConfig {
        cycle_interval: Duration::from_secs(3600),
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, [pm("i0", pb::MachineState::Idle, "")]).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let d = h.decide.clone();
    let task = tokio::spawn(async move {
        d.run(async {
            let _ = stopped.await;
        })
        .await;
    });
    // The first tick fires at once.
    wait_until(LONG, "the first cycle", async || {
        h.decide.cycle_count() == 1
    })
    .await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 1)])).unwrap();
    wait_until(LONG, "roll-up woke a cycle", async || {
        h.decide.cycle_count() == 2
    })
    .await;
    assert_eq!(h.decide.action_counts().0, 1);
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_roll_up_from_a_replaced_session_never_overwrites_the_newer_demand() {
    let h = Harness::start_with(cfg_rails_off(), provider()).await;
    let open = |session: u64| mesh::SessionOpenedRequest {
        cluster_id: "c1".into(),
        session_id: session,
        protocol_version: "v1alpha1".into(),
    };
    let from = |session: u64, needs: Vec<pb::CapacityNeed>| mesh::ApplyRollupRequest {
        session_id: session,
        ..rollup("c1", needs)
    };
    edge::session_opened(&h.decide, &open(10))
        .await
        .expect("session opened");
    let r = edge::apply_rollup(&h.decide, &from(10, vec![need(1, 1)])).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    // The operator reconnects: session 11 replaces 10 and reports three needs.
    edge::session_opened(&h.decide, &open(11))
        .await
        .expect("session opened");
    let r = edge::apply_rollup(
        &h.decide,
        &from(11, vec![need(1, 1), need(2, 1), need(3, 1)]),
    )
    .unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    assert_eq!(h.decide.need_rows(), 3);
    // Session 10's last roll-up arrives late: dropped, the newer demand stands.
    let r = edge::apply_rollup(&h.decide, &from(10, vec![need(9, 1)])).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Superseded as i32);
    assert_eq!(h.decide.need_rows(), 3);
    assert_eq!(h.decide.metrics().rollups_superseded.get(), 1);
    // A restarted gateway's sessions carry larger ids, so they are never mistaken for stale.
    edge::session_opened(&h.decide, &open(5_000))
        .await
        .expect("session opened");
    let r = edge::apply_rollup(&h.decide, &from(5_000, vec![need(4, 1)])).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    assert_eq!(h.decide.need_rows(), 1);
}

/// Issue 16: a provider that restarts empty, then answers truncated, then with garbage,
/// moves nothing — no removal, no replacement, no reclaim — and when it recovers the shard
/// is exactly where it was.
#[tokio::test]
async fn a_lying_provider_causes_no_removal_wave() {
    let p = provider();
    for i in 0..40 {
        p.add_machine(pm(&format!("b{i:02}"), pb::MachineState::Configured, "c1"))
            .unwrap();
    }
    for i in 0..10 {
        p.add_machine(pm(&format!("i{i:02}"), pb::MachineState::Idle, ""))
            .unwrap();
    }
    let mut h = Harness::start_with(cfg_rails_off(), p.clone()).await;
    h.decide.reconcile().await.unwrap();
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(160, 5)])).unwrap();
    // Settle: whatever the engine wants to do with the truth, it has done.
    for _ in 0..3 {
        h.decide.reconcile().await.unwrap();
        h.decide.run_cycle().await.unwrap();
    }
    let before = h.decide.machines_by_state().await;
    let steady = h.decide.run_cycle().await.unwrap().decided;
    h.drain_events();

    p.script_lists([
        ListFault::Empty,
        ListFault::Empty,
        ListFault::Empty,
        ListFault::Truncated(5),
        ListFault::Invalid,
    ]);
    // Every scripted answer is consumed (a cycle may List too); after each, nothing moved.
    let mut info = ShardInfoClient::new(uds_channel(&h.decide_sock));
    let mut held = 0;
    let mut described = 0;
    let mut round = 0;
    while p.list_script_len() > 0 {
        h.decide.reconcile().await.unwrap();
        held = held.max(h.decide.metrics().removals_held.get());
        let d = info.describe(mesh::DescribeShardRequest::default()).await;
        described = described.max(d.unwrap().into_inner().removals_held);
        assert_eq!(
            h.decide.machines_by_state().await,
            before,
            "round {round}: machines moved"
        );
        let report = h.decide.run_cycle().await.unwrap();
        held = held.max(h.decide.metrics().removals_held.get());
        assert_eq!(
            report.decided, steady,
            "round {round}: the engine reacted to the lie"
        );
        round += 1;
    }
    assert_eq!(held, 50, "the held removal was visible in the metric");
    assert_eq!(described, 50, "and in ShardInfo.Describe");
    let gone = h
        .drain_events()
        .into_iter()
        .filter(|e| format!("{e:?}").contains("Speculative"))
        .count();
    assert_eq!(gone, 0, "no operator was told its nodes are gone");

    // The provider recovers: nothing moved.
    h.decide.reconcile().await.unwrap();
    assert_eq!(h.decide.machines_by_state().await, before);
    assert_eq!(h.decide.metrics().removals_held.get(), 0);
    assert_eq!(h.decide.run_cycle().await.unwrap().decided, steady);
}
