//! The cycle end to end against the fake provider over a Unix socket:
//! reconcile, readiness, the first-roll-up gate, rails and the ledgers.

use crate::common;

use bigfleet_model::machine::{
    META_ASSIGNED_GROUP, META_ASSIGNED_INTERRUPTION_PENALTY, META_ASSIGNED_NEED_FINGERPRINT,
    META_ASSIGNED_PRIORITY, META_ASSIGNED_RECLAMATION_PENALTY,
};
use bigfleet_model::{ActionKind, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::ingest_client::IngestClient;
use bigfleet_proto::v1alpha1 as pb;
use common::*;
use std::time::Duration;
use svc_shard_decide_core::edge;
use svc_shard_decide_core::rails::{AuditRecord, reclaim_budget};
use svc_shard_decide_core::{CyclePhase, DecideConfig, RailsConfig};
use tonic::transport::Channel;

fn configured_with_metadata(id: &str, cluster: &str, priority: i32) -> pb::Machine {
    let mut m = pm(id, pb::MachineState::Configured, cluster);
    m.shard_metadata = [
        (META_ASSIGNED_PRIORITY, priority.to_string()),
        (META_ASSIGNED_INTERRUPTION_PENALTY, "8".to_owned()),
        (META_ASSIGNED_RECLAMATION_PENALTY, "0".to_owned()),
        (META_ASSIGNED_NEED_FINGERPRINT, format!("fp-{cluster}")),
        (META_ASSIGNED_GROUP, "rack\0g1".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    m
}

#[tokio::test]
async fn readiness_latches_after_first_reconcile_and_restart_rebuilds_assignment() {
    let p = provider();
    p.add_machine(configured_with_metadata("m1", "c1", 700))
        .unwrap();
    p.add_machine(pm("m2", pb::MachineState::Idle, "")).unwrap();
    // More failures than the client's retries: the List fails for real.
    list_down(&p);
    let h = Harness::start_with(cfg_rails_off(), p).await;
    assert!(!h.decide.is_ready());
    assert!(
        h.decide.run_cycle().await.is_err(),
        "provider down: no decision"
    );
    assert!(!h.readiness.is_ready());
    assert_eq!(h.decide.cycle_count(), 0);

    h.provider.clear_list_script();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.machines, 2);
    assert!(h.decide.is_ready() && h.readiness.is_ready());
    let m = h.decide.machine("m1").await.unwrap();
    assert_eq!(m.assigned_priority, 700);
    assert_eq!(m.assigned_interruption_penalty_dollars, 8.0);
    assert_eq!(m.assigned_need_fingerprint, "fp-c1");
    assert_eq!(m.assigned_group, "rack\0g1");
    assert_eq!(m.cluster, "c1");

    // A later provider outage never un-readies the shard, and the shard keeps deciding
    // on what it last knew (ADR-0118).
    list_down(&h.provider);
    let r = h.decide.run_cycle().await.unwrap();
    assert!(r.stale);
    assert!(h.readiness.is_ready());
    assert_eq!(h.decide.metrics().reconcile_errors.get(), 2);
}

/// m1..m3 Idle, c1 holds 4 Configured machines with demand for them.
async fn stale_fixture() -> Harness {
    let idle = idle_fleet(3, |i| format!("m{}", i + 1));
    let serving = (0..4).map(|i| configured_with_metadata(&format!("c1-{i}"), "c1", 10));
    let h = Harness::listing(cfg_rails_off(), idle.chain(serving)).await;
    let r = h.decide.run_cycle().await.unwrap();
    assert!(!r.stale);
    h
}

#[tokio::test]
async fn a_failed_list_keeps_serving_demand_from_known_idle_machines() {
    let h = stale_fixture().await;
    list_down(&h.provider);
    // Demand arrives while the provider cannot be listed.
    edge::apply_rollup(&h.decide, &rollup("c2", vec![need(8, 5)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert!(r.stale, "decided on the last-known inventory");
    assert_eq!((r.enqueued, r.held_stale), (2, 0), "{r:?}");
    let (queued, _) = h.decide.action_counts();
    assert_eq!(queued, 2);
    let table = h.decide.verdicts();
    assert!(table.inventory_stale);
    assert!(table.inventory_listed_at_unix_nanos > 0);
    // ShardInfo.Describe says so (what `bigfleet shards` shows).
    let mut info = bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient::new(uds_channel(
        &h.decide_sock,
    ));
    let d = info
        .describe(mesh::DescribeShardRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(d.inventory_stale, "{d:?}");
    assert_eq!(
        d.inventory_listed_at_unix_nanos,
        table.inventory_listed_at_unix_nanos
    );
    assert!(h.decide.metrics().inventory_age.get() >= 0.0);
    // The staleness reaches InspectNeeds callers as response metadata.
    let mut read = bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient::new(uds_channel(
        &h.decide_sock,
    ));
    let resp = read
        .inspect_needs(pb::InspectNeedsRequest::default())
        .await
        .unwrap();
    assert_eq!(
        resp.metadata()
            .get(svc_shard_decide_core::service::INVENTORY_STALE_METADATA)
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
}

#[tokio::test]
async fn a_failed_list_never_reclaims_and_reclaims_resume_after_it() {
    let h = stale_fixture().await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(16, 10)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.decided, 0, "c1's demand holds its machines");
    list_down(&h.provider);
    // c1 withdraws its demand while the provider cannot be listed: its machines may have
    // changed in ways decide cannot see, so nothing is taken away.
    edge::apply_rollup(&h.decide, &rollup("c1", vec![])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert!(r.stale);
    assert_eq!((r.decided, r.enqueued, r.held_stale), (4, 0, 4), "{r:?}");
    assert_eq!(
        h.decide
            .metrics()
            .actions_held_stale
            .with_label_values(&["Reclaim"])
            .get(),
        4
    );
    assert_eq!(h.decide.action_counts(), (0, 0));
    // The List recovers: the same reclaims go out.
    h.provider.clear_list_script();
    let r = h.decide.run_cycle().await.unwrap();
    assert!(!r.stale && !h.decide.verdicts().inventory_stale);
    assert_eq!((r.enqueued, r.held_stale), (4, 0), "{r:?}");
}

#[tokio::test]
async fn warmup_cycles_stay_out_of_the_duration_histograms() {
    let cfg = DecideConfig {
        metrics_warmup_cycles: 2,
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, [pm("m1", pb::MachineState::Idle, "")]).await;
    for _ in 0..3 {
        h.decide.run_cycle().await.unwrap();
    }
    let m = h.decide.metrics();
    assert_eq!(m.cycles_total.get(), 3, "counters count every cycle");
    assert_eq!(m.cycle_duration.get_sample_count(), 1);
    // Every phase the cycle runs is observed once past the warm-up, under the label
    // `CyclePhase` names (the benchmarks read them back by that list).
    for p in CyclePhase::ALL {
        assert_eq!(
            m.cycle_phase_duration
                .with_label_values(&[p.as_str()])
                .get_sample_count(),
            1,
            "{p:?}"
        );
    }
}

#[tokio::test]
async fn needs_starved_by_others_are_counted_as_retries_exhausted() {
    let h = Harness::listing(cfg_rails_off(), [pm("m1", pb::MachineState::Idle, "")]).await;
    h.decide.run_cycle().await.unwrap();
    // One machine, two needs for it: the higher priority claims it, the other is starved
    // with matching supply in sight (contention-bound, not catalog-bound).
    edge::apply_rollup(&h.decide, &rollup("hi", vec![need(4, 9)])).unwrap();
    edge::apply_rollup(&h.decide, &rollup("lo", vec![need(4, 1)])).unwrap();
    h.decide.run_cycle().await.unwrap();
    assert_eq!(h.decide.metrics().retries_exhausted.get(), 1);
    // A need nothing matches is catalog-bound: not counted.
    let mut gpu = need(4, 1);
    gpu.requirements[0].values = vec!["p4d.24xlarge".into()];
    edge::apply_rollup(&h.decide, &rollup("gpu", vec![gpu])).unwrap();
    h.decide.run_cycle().await.unwrap();
    assert_eq!(h.decide.metrics().retries_exhausted.get(), 2);
}

#[tokio::test]
async fn rejected_records_keep_last_known_good_over_the_wire() {
    let h = Harness::listing(cfg_rails_off(), [pm("m1", pb::MachineState::Idle, "")]).await;
    h.decide.run_cycle().await.unwrap();
    h.provider
        .update_machine("m1", |m| {
            m.state = pb::MachineState::Configured as i32;
            m.cluster = "c1".into();
            m.price_per_hour = f64::NAN;
        })
        .unwrap();
    let mut bad = pm("m2", pb::MachineState::Idle, "");
    bad.interruption_probability = 1.5;
    h.provider.add_machine(bad).unwrap();
    h.decide.run_cycle().await.unwrap();
    let m = h.decide.machine("m1").await.unwrap();
    assert_eq!(m.state, MachineState::Idle, "last-known-good kept");
    assert!(h.decide.machine("m2").await.is_none());
    let rejected = &h.decide.metrics().machines_rejected;
    assert_eq!(rejected.with_label_values(&["price"]).get(), 1);
    assert_eq!(
        rejected
            .with_label_values(&["interruption_probability"])
            .get(),
        1
    );
    // Still listed (with a bad record) ⇒ not removed on the next cycle either.
    h.decide.run_cycle().await.unwrap();
    assert!(h.decide.machine("m1").await.is_some());
}

#[tokio::test]
async fn incremental_mode_pumps_the_cursor_and_skips_removals() {
    let cfg = DecideConfig {
        incremental_reconcile: true,
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, idle_fleet(5, |i| format!("m{i}"))).await;
    let stats = h.decide.reconcile().await.unwrap();
    assert_eq!(
        (stats.counts.listed, stats.incremental),
        (5, false),
        "cold start lists everything"
    );
    assert!(h.provider.last_since_revision().is_empty());
    let cursor = h.provider.revision().to_string().into_bytes();

    h.provider
        .update_machine("m3", |m| m.state = pb::MachineState::Speculative as i32)
        .unwrap();
    h.provider.update_machine("m3", |m| m.host = None).unwrap();
    h.provider.remove_machine("m4").unwrap();
    let stats = h.decide.reconcile().await.unwrap();
    assert_eq!(h.provider.last_since_revision(), cursor);
    assert!(stats.incremental);
    assert_eq!(
        (
            stats.counts.listed,
            stats.counts.updated,
            stats.counts.removed
        ),
        (1, 1, 0)
    );
    assert_eq!(
        h.decide.machine("m3").await.unwrap().state,
        MachineState::Speculative
    );
    assert!(
        h.decide.machine("m4").await.is_some(),
        "a delta cannot express removal"
    );

    let stats = h.decide.reconcile().await.unwrap();
    assert_eq!(stats.counts.listed, 0);
}

#[tokio::test]
async fn incremental_mode_lists_everything_every_full_list_interval() {
    let cfg = DecideConfig {
        incremental_reconcile: true,
        full_list_interval: Duration::from_millis(300),
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, idle_fleet(10, |i| format!("m{i}"))).await;
    assert!(!h.decide.reconcile().await.unwrap().incremental);
    h.provider.remove_machine("m9").unwrap();
    let stats = h.decide.reconcile().await.unwrap();
    assert!(stats.incremental);
    assert!(
        h.decide.machine("m9").await.is_some(),
        "not seen by a delta"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    let stats = h.decide.reconcile().await.unwrap();
    assert!(!stats.incremental, "the interval passed: a full List");
    assert_eq!((stats.counts.listed, stats.counts.removed), (9, 1));
    assert!(h.decide.machine("m9").await.is_none());
    assert!(
        h.decide.reconcile().await.unwrap().incremental,
        "then deltas again"
    );
}

#[tokio::test]
async fn full_mode_removes_unlisted_machines() {
    let h = Harness::listing(
        cfg_rails_off(),
        [
            pm("a", pb::MachineState::Idle, ""),
            pm("b", pb::MachineState::Idle, ""),
        ],
    )
    .await;
    h.decide.reconcile().await.unwrap();
    h.provider.remove_machine("b").unwrap();
    let s = h.decide.reconcile().await.unwrap();
    assert_eq!(s.counts.removed, 1);
    assert!(h.decide.machine("b").await.is_none());
    let s = h.decide.reconcile().await.unwrap();
    assert_eq!(
        (s.counts.fast_path, s.counts.updated, s.counts.inserted),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn first_rollup_gate_blocks_reclaims_until_the_cluster_reports() {
    let c1 = (0..100).map(|i| configured_with_metadata(&format!("a{i:03}"), "c1", 10));
    let c2 = (0..50).map(|i| configured_with_metadata(&format!("b{i:03}"), "c2", 10));
    let h = Harness::listing(cfg_rails_off(), c1.chain(c2)).await;
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.decided, 0, "no roll-up yet: no reclaim");
    assert_eq!(r.enqueued, 0);

    let resp = edge::apply_rollup(&h.decide, &rollup("c1", vec![])).unwrap();
    assert_eq!(resp.outcome, mesh::RollupOutcome::Accepted as i32);
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!((r.decided, r.enqueued), (100, 100));
    // Everything queued is a c1 reclaim; c2 (no roll-up) is untouched.
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1000).await;
    let mut got = 0;
    while let Some(item) = w.next(Duration::from_millis(500)).await {
        let a = item.action.unwrap();
        assert_eq!(a.kind, mesh::ActionKind::Reclaim as i32);
        assert_eq!(a.cluster_id, "c1");
        got += 1;
        if got == 100 {
            break;
        }
    }
    assert_eq!(got, 100);
}

#[tokio::test]
async fn reclaim_budget_spans_cycles_and_counts_at_hand_out() {
    let cfg = DecideConfig {
        rails: RailsConfig {
            // The quarantine is not what this test looks at.
            empty_rollup_guard: false,
            ..RailsConfig::default()
        },
        ..cfg_rails_off()
    };
    let h = Harness::listing(
        cfg,
        (0..100).map(|i| configured_with_metadata(&format!("a{i:03}"), "c1", 10)),
    )
    .await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![])).unwrap();
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(10_000).await;
    let budget = reclaim_budget(0.05, 100).unwrap();
    // Six cycles well within one window (as roll-ups wake them): one budget between
    // them, not one per cycle as the reference's cap had it.
    let mut total = 0u64;
    let mut capped = 0u64;
    for k in 0..6 {
        let r = h.decide.run_cycle().await.unwrap();
        assert_eq!(r.decided, 100 - total as usize);
        let want = if k == 0 { budget } else { 0 };
        assert_eq!(r.enqueued as u64, want, "cycle {k}");
        assert_eq!(r.capped as u64, r.decided as u64 - want);
        capped += r.capped as u64;
        for _ in 0..r.enqueued {
            let item = w.next(Duration::from_secs(2)).await.expect("handed out");
            // The drain starts and the provider agrees; it is still draining next cycle.
            let id = item.action.as_ref().unwrap().machine_id.clone();
            begin_drain(&mut client, &item).await.unwrap();
            h.provider
                .update_machine(&id, |m| m.state = pb::MachineState::Draining as i32)
                .unwrap();
            total += 1;
        }
    }
    assert_eq!(total, budget);
    assert_eq!(h.decide.metrics().reclaims_capped.get(), capped);
    assert_eq!(
        h.decide
            .metrics()
            .actions_total
            .with_label_values(&["Reclaim"])
            .get(),
        budget
    );
}

async fn pause_or_dry_run(paused: bool, dry_run: bool) -> (Harness, tempfile::TempDir) {
    let audit_dir = tempfile::tempdir().unwrap();
    let serving = (0..10).map(|i| configured_with_metadata(&format!("a{i}"), "c1", 10));
    let machines = serving.chain(idle_fleet(4, |i| format!("i{i}")));
    let cfg = DecideConfig {
        rails: RailsConfig {
            actuation_paused: paused,
            dry_run,
            audit_log: Some(audit_dir.path().join("audit.jsonl")),
            // Ten machines dropping to nothing would be held; not what this looks at.
            empty_rollup_guard: false,
            ..RailsConfig::default()
        },
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, machines).await;
    // c1 drops its demand (reclaims), c9 asks for 2 machines (bootstraps).
    edge::apply_rollup(&h.decide, &rollup("c1", vec![])).unwrap();
    edge::apply_rollup(&h.decide, &rollup("c9", vec![need(8, 100)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.decided, 12);
    assert_eq!(r.enqueued, 0, "nothing executes");
    assert_eq!((r.capped, r.deferred), (0, 0), "cap skipped");
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(100).await;
    assert!(w.next(Duration::from_millis(300)).await.is_none());
    (h, audit_dir)
}

fn audit_lines(dir: &tempfile::TempDir) -> Vec<AuditRecord> {
    std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line parses"))
        .collect()
}

#[tokio::test]
async fn kill_switch_suppresses_and_counts_per_kind() {
    let (h, dir) = pause_or_dry_run(true, true).await;
    let m = h.decide.metrics();
    assert_eq!(
        m.actions_suppressed.with_label_values(&["Reclaim"]).get(),
        10
    );
    assert_eq!(
        m.actions_suppressed.with_label_values(&["Bootstrap"]).get(),
        2
    );
    assert_eq!(
        m.actions_dryrun.with_label_values(&["Reclaim"]).get(),
        0,
        "pause wins"
    );
    assert_eq!(m.actuation_paused.get(), 1);
    assert_eq!(m.actions_total.with_label_values(&["Reclaim"]).get(), 0);
    let lines = audit_lines(&dir);
    assert_eq!(lines.len(), 12);
    assert!(
        lines
            .iter()
            .all(|l| l.outcome == "suppressed" && l.msg == "action" && l.cycle == 1)
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.kind == "Reclaim" && l.grace_seconds == 600.0)
            .count(),
        10
    );
}

#[tokio::test]
async fn dry_run_reports_and_counts_per_kind() {
    let (h, dir) = pause_or_dry_run(false, true).await;
    let m = h.decide.metrics();
    assert_eq!(m.actions_dryrun.with_label_values(&["Reclaim"]).get(), 10);
    assert_eq!(m.actions_dryrun.with_label_values(&["Bootstrap"]).get(), 2);
    assert_eq!(m.actuation_paused.get(), 0);
    let lines = audit_lines(&dir);
    assert_eq!(lines.len(), 12);
    assert!(lines.iter().all(|l| l.outcome == "dryrun"));
    assert!(
        lines
            .iter()
            .any(|l| l.kind == "Bootstrap" && l.cluster == "c9")
    );
}

#[tokio::test]
async fn quarantine_holds_two_drops_and_accepts_the_third() {
    use mesh::RollupOutcome::{Accepted, Quarantined};
    let h = Harness::start(DecideConfig {
        rails: RailsConfig::default(),
        ..cfg_rails_off()
    })
    .await;
    let mut client = h.ingest();
    let quarantined = || {
        h.decide
            .metrics()
            .rollup_quarantined
            .with_label_values(&["c1"])
            .get()
    };
    // Before decide has listed the provider it cannot judge a cluster it has not heard
    // from since it started (ADR-0105): UNAVAILABLE, the operator re-sends.
    let err = send_c1(&mut client, vec![need(1, 0)]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    h.decide.reconcile().await.unwrap();
    let rows: Vec<_> = (0..20).map(|i| need(1, i)).collect();
    let r = send_c1(&mut client, rows).await.unwrap();
    assert_eq!(r, (Accepted as i32, 20));
    for held in 1..=2 {
        let r = send_c1(&mut client, vec![need(1, 0)]).await.unwrap();
        assert_eq!(
            r,
            (Quarantined as i32, 20),
            "previous demand stays in force"
        );
        assert_eq!(quarantined(), held);
    }
    let r = send_c1(&mut client, vec![need(1, 0)]).await.unwrap();
    assert_eq!(r, (Accepted as i32, 1));
    assert_eq!(quarantined(), 0);
    assert_eq!(h.decide.need_rows(), 1);
}

/// Sends cluster c1's roll-up of `needs` over the gateway's contract: (outcome, the
/// need rows in force).
async fn send_c1(
    client: &mut IngestClient<Channel>,
    needs: Vec<pb::CapacityNeed>,
) -> Result<(i32, i32), tonic::Status> {
    let r = client.apply_rollup(rollup("c1", needs)).await?.into_inner();
    Ok((r.outcome, r.need_rows))
}

#[tokio::test]
async fn bad_rollups_are_invalid_argument_and_counted() {
    let h = Harness::start(cfg_rails_off()).await;
    let mut client = h.ingest();
    let mut bad = need(1, 1);
    bad.interruption_penalty_bucket = 99;
    let err = send_c1(&mut client, vec![bad]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        h.decide
            .metrics()
            .rollups_rejected
            .with_label_values(&["c1", "enum_out_of_range"])
            .get(),
        1
    );
    assert_eq!(h.decide.need_rows(), 0);
}

#[tokio::test]
async fn max_actions_per_cycle_truncates_and_asks_for_follow_up() {
    let cfg = DecideConfig {
        rails: RailsConfig {
            max_actions_per_cycle: 3,
            ..RailsConfig::off()
        },
        ..cfg_rails_off()
    };
    let h = Harness::listing(cfg, idle_fleet(10, |i| format!("i{i}"))).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(40, 5)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(
        (r.decided, r.enqueued, r.deferred, r.follow_up),
        (10, 3, 7, true)
    );
    assert_eq!(h.decide.metrics().actions_deferred.get(), 7);
}

#[tokio::test]
async fn shortfalls_age_and_report_top_by_priority() {
    let h = Harness::listing(cfg_rails_off(), [pm("i0", pb::MachineState::Idle, "")]).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(400, 5)])).unwrap();
    for _ in 0..3 {
        h.decide.run_cycle().await.unwrap();
    }
    let s = h.decide.shortfalls(100);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].age_cycles, 3);
    assert_eq!(s[0].deficit.get("cpu"), 396_000);
    assert_eq!(h.decide.metrics().shortfalls.get(), 1);
    assert_eq!(
        h.decide
            .metrics()
            .shortfalls_aged
            .with_label_values(&["1-9"])
            .get(),
        1
    );
    // Demand withdrawn: the shortfall vanishes.
    edge::apply_rollup(&h.decide, &rollup("c1", vec![])).unwrap();
    h.decide.run_cycle().await.unwrap();
    assert!(h.decide.shortfalls(100).is_empty());
}

#[tokio::test]
async fn idle_machines_bootstrap_for_demand() {
    let h = Harness::listing(cfg_rails_off(), idle_fleet(4, |i| format!("i{i}"))).await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(8, 5)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!((r.decided, r.enqueued), (2, 2));
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(5).await;
    let item = w.next(Duration::from_secs(2)).await.unwrap();
    let a = item.action.as_ref().unwrap();
    assert_eq!(a.kind, mesh::ActionKind::Bootstrap as i32);
    assert_eq!(a.cluster_id, "c1");
    assert_eq!(a.priority, 5);
    assert!(!a.need_fingerprint.is_empty());
    assert_eq!(a.interruption_penalty_dollars, 8.0);
    let f = item.fencing.as_ref().unwrap();
    assert_eq!((f.shard_id.as_str(), f.epoch), ("shard-0", 1));
    assert!(f.sequence_base > 0 && f.sequence_limit > f.sequence_base);
    let item2 = w.next(Duration::from_secs(2)).await.unwrap();
    let f2 = item2.fencing.unwrap();
    assert!(
        f2.sequence_base >= f.sequence_limit,
        "windows never overlap"
    );
    assert_eq!(ActionKind::Bootstrap.reason(), a.reason);
}
