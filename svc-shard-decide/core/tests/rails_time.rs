//! The rails over wall-clock time (ADR-0105), with a simulated clock and an in-process
//! provider: the reclaim budget under 1 s cycles plus roll-up wake-ups, the quarantine's
//! quantity rule, and its baseline across a restart.

use crate::common;

use bigfleet_model::machine::{
    META_ASSIGNED_GROUP, META_ASSIGNED_INTERRUPTION_PENALTY, META_ASSIGNED_NEED_FINGERPRINT,
    META_ASSIGNED_PRIORITY, META_ASSIGNED_RECLAMATION_PENALTY,
};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use common::{finish_draining, need, pm, rollup, start_draining};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use svc_shard_decide_core::edge;
use svc_shard_decide_core::{Decide, DecideConfig, DecideError, RailsConfig};

const SEC: i64 = 1_000_000_000;
/// 2026-11-27T00:00:00Z: any fixed start does.
const T0: i64 = 1_795_737_600 * SEC;
const WINDOW: i64 = 600 * SEC;

type Source = common::MapSource;

/// A Configured 4-core machine of `cluster` as the provider lists it, with decide's
/// assignment in its metadata. Reserved capacity: never released when it goes Idle,
/// so the only actions with no demand are reclaims.
fn configured(id: &str, cluster: &str) -> pb::Machine {
    let mut m = pm(id, pb::MachineState::Configured, cluster);
    m.capacity_type = pb::CapacityType::Reserved as i32;
    m.shard_metadata = [
        (META_ASSIGNED_PRIORITY, "10".to_owned()),
        (META_ASSIGNED_INTERRUPTION_PENALTY, "8".to_owned()),
        (META_ASSIGNED_RECLAMATION_PENALTY, "0".to_owned()),
        (META_ASSIGNED_NEED_FINGERPRINT, format!("fp-{cluster}")),
        (META_ASSIGNED_GROUP, String::new()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    m
}

fn source_with(cluster: &str, machines: usize) -> Source {
    let s = Source::default();
    for i in 0..machines {
        s.put(configured(&format!("{cluster}-m{i:03}"), cluster));
    }
    s
}

/// A decide on `source` whose clock reads `clock`.
fn decide(cfg: DecideConfig, source: &Source, clock: &Arc<AtomicI64>) -> Decide {
    let cfg = DecideConfig {
        engine_threads: 1,
        queue_capacity: 100_000,
        ..cfg
    };
    common::decide_on_clock(cfg, source.clone(), clock)
}

/// One drain the simulated worker holds: started at `started`, done at `until`.
struct Drain {
    item: mesh::WorkItem,
    started: i64,
    until: i64,
}

/// The simulated execute worker plus the test's own record of every reclaim start,
/// kept apart from anything the rail computes.
struct World {
    d: Decide,
    source: Source,
    clock: Arc<AtomicI64>,
    drain_for: i64,
    draining: Vec<Drain>,
    /// (start time, the cluster's Configured + Draining machines just before it).
    starts: Vec<(i64, u64)>,
    /// The cluster's machines (Configured + Draining) as the test counts them.
    size: u64,
    max_draining: usize,
}

impl World {
    fn now(&self) -> i64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// Takes every action decide hands out; reclaims start draining at once.
    async fn take_all(&mut self) {
        while let Some(item) = edge::hand_out(&self.d, 1).await {
            let action = item.action.as_ref().unwrap();
            assert_eq!(action.kind, mesh::ActionKind::Reclaim as i32, "{action:?}");
            start_draining(&self.d, &self.source, &item).await;
            let now = self.now();
            self.starts.push((now, self.size));
            self.draining.push(Drain {
                item,
                started: now,
                until: now + self.drain_for,
            });
            self.max_draining = self.max_draining.max(self.draining.len());
        }
    }

    /// Finishes the drains that are due: Draining → Idle, unbound, done.
    async fn finish_drains(&mut self) {
        let now = self.now();
        let (done, rest): (Vec<Drain>, Vec<Drain>) =
            self.draining.drain(..).partition(|d| d.until <= now);
        self.draining = rest;
        for d in done {
            assert!(d.started < now);
            finish_draining(&self.d, &self.source, &d.item).await;
            edge::done(
                &self.d,
                &mesh::worker_message::Done {
                    action_id: d.item.action_id.clone(),
                    outcome: "success".into(),
                    detail: String::new(),
                    elapsed_ms: 1,
                },
            );
            self.size -= 1;
        }
    }

    async fn cycle(&mut self) {
        self.d.run_cycle().await.unwrap();
        self.take_all().await;
    }
}

fn budget_of(size: u64) -> u64 {
    // max(1, ⌊5% × the cluster's machines⌋), the documented default.
    (size * 5 / 100).max(1)
}

#[tokio::test]
async fn a_withdrawal_under_one_second_cycles_never_exceeds_the_budget_in_any_window() {
    let clock = Arc::new(AtomicI64::new(T0));
    let source = source_with("c1", 100);
    let d = decide(
        DecideConfig {
            rails: RailsConfig::default(),
            ..DecideConfig::default()
        },
        &source,
        &clock,
    );
    let mut w = World {
        d,
        source,
        clock: Arc::clone(&clock),
        // Longer than the window: only counting Draining machines keeps a second
        // batch from starting while the first still drains.
        drain_for: 12 * 60 * SEC,
        draining: Vec::new(),
        starts: Vec::new(),
        size: 100,
        max_draining: 0,
    };
    w.cycle().await;
    // 40 simulated minutes: a cycle every second, and every 10 s the operator's
    // roll-up withdrawing all demand, which wakes one more cycle whenever accepted.
    let mut accepted_at = None;
    for sec in 0..=2400i64 {
        clock.store(T0 + sec * SEC, Ordering::SeqCst);
        w.finish_drains().await;
        if sec % 10 == 0 {
            let r = edge::apply_rollup(&w.d, &rollup("c1", vec![])).unwrap();
            if r.outcome == mesh::RollupOutcome::Accepted as i32 {
                accepted_at.get_or_insert(sec);
                w.cycle().await;
            }
        }
        w.cycle().await;
        let by_state = w.d.machines_by_state().await;
        assert_eq!(
            by_state
                .get(&bigfleet_model::MachineState::Draining)
                .copied()
                .unwrap_or(0),
            w.draining.len() as u64
        );
    }
    // The withdrawal is a drop from 100 machines' worth: the third roll-up applies it.
    assert_eq!(accepted_at, Some(20));
    let first = w.starts.first().expect("reclaims started").0;
    assert_eq!(
        first,
        T0 + 20 * SEC,
        "nothing reclaimed before the withdrawal applied"
    );

    // Every 10-minute window, from the recorded start times alone. A window holding the
    // most starts can always be slid right until a start opens it, so anchoring one at
    // every start covers every sliding window. The cluster only shrinks here, so the
    // largest budget within a window is the one when it opens.
    for (i, &(t, size)) in w.starts.iter().enumerate() {
        let n = w.starts[i..]
            .iter()
            .take_while(|(u, _)| *u < t + WINDOW)
            .count() as u64;
        assert!(
            n <= budget_of(size),
            "{n} reclaims started in the 10 minutes from {}s; budget {}",
            (t - T0) / SEC,
            budget_of(size)
        );
    }
    // Reclaims in flight count: never more Draining at once than the budget.
    assert!(
        w.max_draining as u64 <= budget_of(100),
        "{} draining at once",
        w.max_draining
    );
    // And the rail is a budget, not a stop: the first window used all of it, and every
    // batch of drains finishing let the next batch start.
    let in_first_window = w.starts.iter().filter(|(t, _)| *t < first + WINDOW).count();
    assert_eq!(in_first_window, 5);
    assert!(
        w.starts.len() >= 15,
        "{} reclaims in 40 minutes",
        w.starts.len()
    );
    assert!(w.d.metrics().reclaims_capped.get() > 0);
    // The old per-cycle cap would have started ~5 a cycle: everything within a minute.
    assert!(w.size >= 80, "{} machines left", w.size);
}

/// Twenty rows of 4 cores each.
fn twenty_rows(cpu: u32) -> Vec<pb::CapacityNeed> {
    (0..20)
        .map(|i| {
            let mut n = need(4, i);
            n.aggregate_resources.insert("cpu".into(), cpu.to_string());
            n
        })
        .collect()
}

#[tokio::test]
async fn quarantine_catches_a_rollup_whose_quantities_drop_to_zero() {
    let clock = Arc::new(AtomicI64::new(T0));
    let source = source_with("c1", 20);
    let d = decide(DecideConfig::default(), &source, &clock);
    d.reconcile().await.unwrap();
    let r = edge::apply_rollup(&d, &rollup("c1", twenty_rows(4))).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    // The same twenty rows, every quantity zero: the row count alone never noticed.
    for held in 1..=2 {
        let r = edge::apply_rollup(&d, &rollup("c1", twenty_rows(0))).unwrap();
        assert_eq!(r.outcome, mesh::RollupOutcome::Quarantined as i32, "{r:?}");
        assert_eq!(
            d.metrics()
                .rollup_quarantined
                .with_label_values(&["c1"])
                .get(),
            held
        );
        let cpu: i64 = d
            .cluster_needs("c1")
            .iter()
            .map(|n| n.aggregate_resources.get("cpu"))
            .sum();
        assert_eq!(cpu, 80_000, "the previous demand stays in force");
    }
    // The third consecutive drop applies.
    let r = edge::apply_rollup(&d, &rollup("c1", twenty_rows(0))).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
}

#[tokio::test]
async fn after_a_restart_the_quarantine_baseline_still_holds() {
    let clock = Arc::new(AtomicI64::new(T0));
    let source = source_with("c1", 20);
    let cfg = DecideConfig::default();
    // The first incarnation accepts the cluster's demand (80 cores on 20 machines)...
    let first = decide(cfg.clone(), &source, &clock);
    first.reconcile().await.unwrap();
    let r = edge::apply_rollup(&first, &rollup("c1", twenty_rows(4))).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    drop(first);

    // ...and a second one, over the same provider, starts with nothing in memory.
    clock.fetch_add(60 * SEC, Ordering::SeqCst);
    let d = decide(cfg, &source, &clock);
    // Before it has listed the provider it cannot judge the cluster: not applied.
    let err = edge::apply_rollup(&d, &rollup("c1", twenty_rows(0))).unwrap_err();
    assert!(matches!(err, DecideError::NotReady(_)), "{err}");
    assert_eq!(tonic::Status::from(err).code(), tonic::Code::Unavailable);
    // Listed: the 20 machines the cluster holds are the baseline, and a roll-up asking
    // for nothing of them is held.
    d.reconcile().await.unwrap();
    for held in 1..=2 {
        let r = edge::apply_rollup(&d, &rollup("c1", twenty_rows(0))).unwrap();
        assert_eq!(r.outcome, mesh::RollupOutcome::Quarantined as i32, "{r:?}");
        assert_eq!(r.need_rows, 0, "no demand of this process is in force");
        // Held with no demand in force: the first-roll-up gate stays closed, so the
        // cycle reclaims nothing of what the quarantine holds back.
        let c = d.run_cycle().await.unwrap();
        assert_eq!((c.decided, c.enqueued), (0, 0), "held {held}");
    }
    // The third consecutive drop confirms it; then the reclaim budget paces the drain.
    let r = edge::apply_rollup(&d, &rollup("c1", twenty_rows(0))).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    let c = d.run_cycle().await.unwrap();
    assert_eq!((c.decided, c.enqueued, c.capped), (20, 1, 19));

    // A legitimate first roll-up after a restart (what the machines hold) is accepted.
    let clock2 = Arc::new(AtomicI64::new(T0));
    let d = decide(DecideConfig::default(), &source_with("c2", 20), &clock2);
    d.reconcile().await.unwrap();
    let r = edge::apply_rollup(&d, &rollup("c2", twenty_rows(4))).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
}

#[tokio::test]
async fn clusters_holding_little_and_guard_off_are_never_unjudged_or_held() {
    let clock = Arc::new(AtomicI64::new(T0));
    // The guard off: accepted before any reconcile, as the original.
    let d = decide(
        DecideConfig {
            rails: RailsConfig {
                empty_rollup_guard: false,
                ..RailsConfig::default()
            },
            ..DecideConfig::default()
        },
        &source_with("c1", 20),
        &clock,
    );
    let r = edge::apply_rollup(&d, &rollup("c1", vec![])).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    // Nine machines: a drop cannot release ten, so it is not held.
    let d = decide(DecideConfig::default(), &source_with("c1", 9), &clock);
    d.reconcile().await.unwrap();
    let r = edge::apply_rollup(&d, &rollup("c1", vec![])).unwrap();
    assert_eq!(r.outcome, mesh::RollupOutcome::Accepted as i32);
    assert!(d.cluster_needs("c1").is_empty());
}
