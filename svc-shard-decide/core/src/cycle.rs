//! The cycle: reconcile → take what changed from ingest → engine → ledgers →
//! hints → rails → enqueue.
//!
//! The cycle's working state ([`CycleRoom`]: its demand view, the parking ledger,
//! the first-roll-up gate it reads) is owned by whoever holds the async
//! one-cycle-at-a-time lock, so the engine never reads anything ingest could be
//! waiting for. Wake-ups from roll-ups coalesce: at most one extra cycle per
//! `wake_interval` (ADR-0111).

use crate::demand::DemandView;
use crate::errors::CycleError;
use crate::inventory::Inventory;
use crate::ledgers::{AGE_BUCKETS, HintValue, VerdictTable};
use crate::metrics::CyclePhase;
use crate::rails::{AuditRecord, kind_label};
use crate::shard::{CycleReport, Decide, applicable, label_bucket, label_capacity_type};
use crate::trace::current_trace_context;
use bigfleet_conv::requirements_to_proto;
use bigfleet_decision::{CycleInput, CycleOptions, ParkingLedger, ParkingTiming, run_cycle};
use bigfleet_model::{Action, ActionKind, Need};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A cycle asked for by a wake-up starts no sooner than this many times the last
/// cycle's duration after the last one started (ADR-0111).
const WAKE_DUTY_FACTOR: u32 = 4;

/// What only the cycle reads and writes.
#[derive(Debug)]
pub(crate) struct CycleRoom {
    pub(crate) demand: DemandView,
    parking: ParkingLedger,
    /// Clusters whose first roll-up arrived (the original's ADR-0036): Phase 3 may reclaim there.
    gate: FxHashSet<String>,
    /// Since when provider Lists have been failing (cycles decide on stale inventory).
    stale_since: Option<Instant>,
    /// Where the rolling hint sweep stands (ADR-0127).
    hints: HintSweep,
}

/// What a cycle hands on for its verdict table, built once its actions are enqueued.
struct PendingVerdicts {
    cycle: u64,
    now: i64,
    demand: Arc<Vec<Need>>,
    verdicts: Vec<bigfleet_decision::NeedVerdict>,
    listed_at: i64,
    stale: bool,
}

/// Slots the connected clusters are hashed into for the rolling hint sweep.
const HINT_SLOTS: u64 = 64;

/// The rolling hint sweep (ADR-0127): every connected cluster's hints are evaluated
/// once per available-capacity interval, but a slice of the clusters per cycle — those
/// whose hash slot came due since the last cycle — so the frames a changed supply
/// causes leave spread over the interval instead of in one burst that stalls the
/// gateway and every operator at once.
#[derive(Debug)]
pub(crate) struct HintSweep {
    started: Instant,
    /// Slots evaluated since `started` (a running count, not modulo).
    done: u64,
}

impl HintSweep {
    fn new(now: Instant) -> Self {
        HintSweep {
            started: now,
            done: 0,
        }
    }

    /// The slots that came due since the last call, as a filter over cluster ids
    /// (`None`: nothing is due). A gap of a whole interval or more makes every slot due.
    fn due(&mut self, interval: Duration, now: Instant) -> Option<SlotRange> {
        let interval = interval.as_nanos().max(1);
        let elapsed = now.saturating_duration_since(self.started).as_nanos();
        let due = u64::try_from(elapsed.saturating_mul(u128::from(HINT_SLOTS)) / interval)
            .unwrap_or(u64::MAX);
        if due <= self.done {
            return None;
        }
        let range = SlotRange {
            from: self.done,
            to: due,
        };
        self.done = due;
        Some(range)
    }
}

/// Running slot numbers `(from, to]` that came due in one cycle.
#[derive(Debug, Clone, Copy)]
struct SlotRange {
    from: u64,
    to: u64,
}

impl SlotRange {
    fn contains(&self, cluster: &str) -> bool {
        if self.to - self.from >= HINT_SLOTS {
            return true;
        }
        let slot = hint_slot(cluster);
        // The running slots from+1..=to, taken modulo HINT_SLOTS.
        let first = (self.from + 1) % HINT_SLOTS;
        let offset = (slot + HINT_SLOTS - first) % HINT_SLOTS;
        offset < self.to - self.from
    }
}

/// A cluster's sweep slot: stable for the process's life, spread evenly.
fn hint_slot(cluster: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(cluster) % HINT_SLOTS
}

impl CycleRoom {
    pub(crate) fn new(parking: ParkingTiming) -> Self {
        CycleRoom {
            demand: DemandView::new(),
            parking: ParkingLedger::with_timing(parking),
            gate: FxHashSet::default(),
            stale_since: None,
            hints: HintSweep::new(Instant::now()),
        }
    }
}

impl Decide {
    /// Runs cycles until `shutdown` resolves: every `cycle_interval` since the
    /// last one, and after a wake-up (changed demand, abandoned work, truncated
    /// cycles) once `wake_interval` — or four times the last cycle's duration, if
    /// longer — has passed since the last one started.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) {
        let cfg = &self.inner.cfg;
        let mut ticker = tokio::time::interval(cfg.cycle_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        // When the last cycle started, and how long it took.
        let mut last: Option<(tokio::time::Instant, Duration)> = None;
        loop {
            let woken = tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = ticker.tick() => false,
                () = self.inner.wake.notified() => true,
            };
            if woken && let Some((started, took)) = last {
                // Wake-ups arriving meanwhile fold into this one (Notify keeps one permit).
                // A slow cycle spaces the next one further: woken cycles take at most
                // 1/WAKE_DUTY_FACTOR of the time, whatever the shard's size.
                let due = started + cfg.wake_interval.max(took * WAKE_DUTY_FACTOR);
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep_until(due) => {}
                }
            }
            let started = tokio::time::Instant::now();
            let result = self.run_cycle().await;
            last = Some((started, started.elapsed()));
            match result {
                Ok(r) if r.follow_up => {
                    self.inner
                        .metrics
                        .cycle_wakeups
                        .with_label_values(&["follow_up"])
                        .inc();
                    self.wake();
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cycle skipped"),
            }
            // The interval counts from the last cycle, whatever started it.
            ticker.reset();
        }
    }

    /// One cycle: reconcile → snapshot → engine → ledgers → hints → rails → enqueue.
    pub async fn run_cycle(&self) -> Result<CycleReport, CycleError> {
        let mut room = self.inner.cycle_room.clone().lock_owned().await;
        let started = Instant::now();
        let m = &self.inner.metrics;
        // The first cycles of a cold start (a full List into an empty inventory) are not
        // what the cycle SLO measures; their durations stay out of the histograms.
        let observe = self.cycle_count() >= self.inner.cfg.metrics_warmup_cycles;
        let t = Instant::now();
        let rec = self.reconcile().await;
        if observe {
            m.cycle_phase_duration
                .with_label_values(&[CyclePhase::Reconcile.as_str()])
                .observe(t.elapsed().as_secs_f64());
        }
        let stale = match rec {
            Ok(_) => {
                if std::mem::take(&mut room.stale_since).is_some() {
                    tracing::info!("provider List succeeds again; deciding on fresh inventory");
                }
                false
            }
            Err(e) => {
                m.reconcile_errors.inc();
                // With no inventory at all there is nothing to decide on.
                if !self.is_ready() {
                    return Err(CycleError::Reconcile(e));
                }
                // Static stability (ADR-0118): keep serving demand from what was last
                // known; nothing that takes capacity away runs on a stale view.
                if room.stale_since.is_none() {
                    room.stale_since = Some(Instant::now());
                    tracing::warn!(error = %e, "provider List failed; deciding on the last-known inventory (bootstrap and provision only) until it succeeds");
                } else {
                    tracing::debug!(error = %e, "provider List still failing");
                }
                true
            }
        };
        let listed_at = self
            .inner
            .listed_at
            .load(std::sync::atomic::Ordering::Acquire);
        m.inventory_age
            .set((self.now().saturating_sub(listed_at)).max(0) as f64 / 1e9);
        let this = self.clone();
        let span = tracing::info_span!("decide_cycle", shard = %self.inner.cfg.shard_id);
        let (report, verdicts, room) = tokio::task::spawn_blocking(move || {
            let (report, verdicts) =
                this.decide_blocking(&mut room, span, observe, stale, listed_at)?;
            Ok::<_, CycleError>((report, verdicts, room))
        })
        .await
        .map_err(|e| CycleError::Join(e.to_string()))??;
        m.cycles_total.inc();
        if observe {
            m.cycle_duration.observe(started.elapsed().as_secs_f64());
        }
        self.inner.work_ready.notify_waiters();
        // The decision is out; the verdict table readers see (InspectNeeds, reports) is
        // published next, off the path from demand to enqueued action (ADR-0134). The
        // room stays held, so tables are published in cycle order and the next cycle's
        // demand view finds the generation the previous table released.
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _room = room;
            let t = Instant::now();
            this.publish_verdicts(verdicts);
            if observe {
                this.inner
                    .metrics
                    .cycle_phase_duration
                    .with_label_values(&[CyclePhase::Verdicts.as_str()])
                    .observe(t.elapsed().as_secs_f64());
            }
        })
        .await
        .map_err(|e| CycleError::Join(e.to_string()))?;
        Ok(report)
    }

    /// Builds the cycle's verdict table, carrying unmet ages over from the one it
    /// replaces, and swaps it in whole.
    fn publish_verdicts(&self, job: PendingVerdicts) {
        let prev = self.verdicts();
        let mut table = VerdictTable::build(&prev, job.cycle, job.now, &job.demand, job.verdicts);
        table.inventory_listed_at_unix_nanos = job.listed_at;
        table.inventory_stale = job.stale;
        // The previous table is freed outside the lock readers wait on.
        let old = std::mem::replace(&mut *self.inner.verdicts.write(), Arc::new(table));
        drop((prev, old));
    }

    fn decide_blocking(
        &self,
        room: &mut CycleRoom,
        span: tracing::Span,
        observe: bool,
        stale: bool,
        listed_at: i64,
    ) -> Result<(CycleReport, PendingVerdicts), CycleError> {
        let _entered = span.enter();
        let trace = current_trace_context();
        let inner = &self.inner;
        let m = &inner.metrics;
        let phase = |p: CyclePhase, t: Instant| {
            if observe {
                m.cycle_phase_duration
                    .with_label_values(&[p.as_str()])
                    .observe(t.elapsed().as_secs_f64());
            }
        };
        let now = self.now();
        let t = Instant::now();
        // Owned domains and transfers as of now (ADR-0128): taken alone, before the inventory.
        let ownership = inner.ownership.lock().clone();
        // Drained machines waiting for their transfer are foreign to the engine only.
        let held = self.engine_ownership(&ownership, now);
        let inv = inner.inventory.blocking_read();
        // The only moment the cycle touches ingest's room: collect what changed.
        let taken = inner.intake.lock().take();
        room.demand.apply(&taken.demand);
        room.gate.extend(taken.gate_opened);
        room.parking.prepare(now);
        let destinations = inner.work.lock().ledger.creating_destinations();
        phase(CyclePhase::Snapread, t);

        let t = Instant::now();
        let gate = &room.gate;
        let ready = move |c: &str| gate.contains(c);
        let demand = Arc::clone(room.demand.sorted());
        let demand = &demand;
        let input = CycleInput {
            creating_destinations: Some(&destinations),
            demand,
            now_unix_nanos: now,
            parking: Some(&room.parking),
            cluster_ready: Some(&ready),
            ownership: Some(held.as_ref().unwrap_or(&ownership)),
            demand_dimensions: Some(room.demand.dimensions()),
            ..CycleInput::with_fleet(inv.fleet(), demand)
        };
        let opts = CycleOptions {
            verdicts: true,
            threads: inner.cfg.engine_threads,
            release: inner.cfg.release,
            phase2: inner.cfg.phase2,
            ..CycleOptions::default()
        };
        let out = run_cycle(&input, &opts)?;
        phase(CyclePhase::Engine, t);
        let cycle = inner.cycle.fetch_add(1, Ordering::AcqRel) + 1;
        // The original counts a need whose OCC proposals never committed; without OCC the
        // same signal is a need starved by others' claims while matching supply exists.
        m.retries_exhausted.inc_by(
            out.verdicts
                .iter()
                .filter(|v| {
                    !v.satisfied
                        && v.claimed_machine_count == 0
                        && v.unmet_reason == bigfleet_decision::UnmetReason::PriorityStarved
                })
                .count() as u64,
        );

        let t = Instant::now();
        room.parking.observe_at(&out.parking, now);
        let shortfall_count = {
            let mut s = inner.shortfalls.lock();
            s.record(&out.shortfalls, now);
            let aged = s.aged(now);
            for (label, n) in AGE_BUCKETS.iter().zip(aged) {
                m.shortfalls_aged.with_label_values(&[label]).set(n as i64);
            }
            m.shortfalls.set(s.len() as i64);
            s.len()
        };
        let verdicts = PendingVerdicts {
            cycle,
            now,
            demand: Arc::clone(demand),
            verdicts: out.verdicts,
            listed_at,
            stale,
        };
        phase(CyclePhase::Ledgers, t);

        let t = Instant::now();
        // Every connected cluster's hints once per available-capacity interval, a slice
        // of the clusters per cycle (ADR-0127); besides, at once, clusters whose demand
        // changed or whose session just opened.
        let due = room
            .hints
            .due(inner.cfg.available_capacity_interval, Instant::now());
        let touched: FxHashSet<&str> = taken
            .demand
            .clusters
            .iter()
            .map(|c| c.cluster.as_str())
            .chain(taken.sessions_opened.iter().map(String::as_str))
            .collect();
        let hints_sent = self.emit_hints(&inv, &room.demand, |cluster| {
            touched.contains(cluster) || due.is_some_and(|d| d.contains(cluster))
        });
        phase(CyclePhase::Emit, t);

        let t = Instant::now();
        let decided = out.actions.len();
        inner.history.lock().cycle_decided(cycle, now);
        let mut traces = inner
            .intake
            .lock()
            .traces
            .for_cycle(cycle, Instant::now(), trace);
        let mut held: Vec<Action> = Vec::new();
        // Cross-shard drains join the engine's actions before the rails (ADR-0137).
        let actions = self.with_drains(&inv, &ownership, out.actions);
        let (rails, stats) = {
            let mut work = inner.work.lock();
            let work = &mut *work;
            work.reclaim_budget
                .expire(now, inner.cfg.rails.reclaim_budget_window);
            let rails = crate::rails::apply(&inner.cfg.rails, actions, &work.reclaim_budget, &*inv);
            for d in &rails.deferrals {
                if work.reclaim_budget.should_log(&d.cluster, now) {
                    tracing::info!(
                        cycle,
                        cluster = %bigfleet_telemetry::clip(&d.cluster),
                        deferred = d.deferred,
                        budget = d.budget,
                        in_use = d.in_use,
                        window_seconds = inner.cfg.rails.reclaim_budget_window.as_secs_f64(),
                        "reclaims over the cluster's budget deferred (at most one such line a minute per cluster)"
                    );
                }
            }
            work.reclaim_budget
                .retain_logged(|c| rails.deferrals.iter().any(|d| d.cluster == c));
            let mut rails = rails;
            if stale {
                let (keep, hold): (Vec<Action>, Vec<Action>) = std::mem::take(&mut rails.execute)
                    .into_iter()
                    .partition(|a| {
                        matches!(a.kind(), ActionKind::Bootstrap | ActionKind::Provision)
                    });
                rails.execute = keep;
                held = hold;
            }
            let stats = work.ledger.replace_queue_traced(
                std::mem::take(&mut rails.execute),
                cycle,
                |a| traces.of(a),
                |a| applicable(&inv, a),
            );
            (rails, stats)
        };
        for a in &rails.suppressed {
            m.actions_suppressed
                .with_label_values(&[kind_label(a.kind())])
                .inc();
            self.audit(cycle, a, "suppressed");
        }
        if !rails.suppressed.is_empty() {
            tracing::info!(
                cycle,
                suppressed = rails.suppressed.len(),
                "actuation paused; actions suppressed"
            );
        }
        for a in &rails.dry_run {
            m.actions_dryrun
                .with_label_values(&[kind_label(a.kind())])
                .inc();
            tracing::info!(
                cycle,
                kind = kind_label(a.kind()),
                machine = %a.machine_id(),
                cluster = %a.cluster(),
                reason = a.kind().reason(),
                grace_seconds = a.grace().map_or(0.0, |g| g.as_secs_f64()),
                "dry-run action"
            );
            self.audit(cycle, a, "dryrun");
        }
        for a in &held {
            m.actions_held_stale
                .with_label_values(&[kind_label(a.kind())])
                .inc();
            self.audit(cycle, a, "held_stale");
        }
        m.reclaims_capped.inc_by(rails.capped as u64);
        m.actions_deferred.inc_by(rails.deferred as u64);
        m.actions_deduped.inc_by(stats.deduped as u64);
        m.actions_dropped.inc_by(stats.dropped as u64);
        phase(CyclePhase::Execute, t);
        m.actuation_paused
            .set(i64::from(inner.cfg.rails.actuation_paused));
        self.export_gauges(&inv, demand);
        let (queued, inflight) = self.action_counts();
        m.action_queue_depth.set(queued as i64);
        m.execute_inflight.set(inflight as i64);
        // Every change this cycle took has now been decided on.
        let decided_at = Instant::now();
        for c in &taken.demand.clusters {
            m.demand_to_decision
                .observe(decided_at.duration_since(c.accepted_at).as_secs_f64());
        }

        let report = CycleReport {
            cycle,
            machines: inv.len(),
            needs: demand.len(),
            decided,
            enqueued: stats.enqueued,
            deduped: stats.deduped,
            dropped: stats.dropped,
            suppressed: rails.suppressed.len(),
            dry_run: rails.dry_run.len(),
            capped: rails.capped,
            deferred: rails.deferred,
            follow_up: rails.follow_up,
            hints_sent,
            shortfalls: shortfall_count,
            stale,
            held_stale: held.len(),
        };
        Ok((report, verdicts))
    }

    pub(crate) fn audit(&self, cycle: u64, action: &Action, outcome: &str) {
        self.record_action(cycle, action, outcome, None);
        if let Some(log) = &self.inner.audit {
            log.lock().write(&AuditRecord::new(cycle, action, outcome));
        }
    }

    fn export_gauges(&self, inv: &Inventory, demand: &[Need]) {
        let m = &self.inner.metrics;
        let mut cells: BTreeMap<(&'static str, &'static str, &'static str), i64> = BTreeMap::new();
        for (k, n) in &inv.buckets() {
            *cells
                .entry((
                    k.state.as_str(),
                    label_capacity_type(k.capacity_type),
                    label_bucket(k.interruption_bucket),
                ))
                .or_default() += *n as i64;
        }
        m.inventory_machines.reset();
        for ((s, c, b), n) in cells {
            m.inventory_machines.with_label_values(&[s, c, b]).set(n);
        }
        let mut rows: BTreeMap<&'static str, i64> = BTreeMap::new();
        for n in demand {
            *rows
                .entry(label_bucket(n.profile.interruption_bucket()))
                .or_default() += 1;
        }
        m.demand_machines.reset();
        for (b, n) in rows {
            m.demand_machines.with_label_values(&[b]).set(n);
        }
    }

    /// One AvailableCapacity hint per (connected cluster, demanded
    /// fingerprint), sent only when its value changed enough and the key's rate
    /// limit allows; over the connected clusters `include` selects. The supply
    /// behind a fingerprint is computed once per cycle, however many clusters
    /// demand it.
    fn emit_hints(
        &self,
        inv: &Inventory,
        demand: &DemandView,
        include: impl Fn(&str) -> bool,
    ) -> usize {
        let inner = &self.inner;
        let sessions: Vec<String> = {
            let intake = inner.intake.lock();
            intake
                .sessions
                .keys()
                .filter(|c| include(c))
                .cloned()
                .collect()
        };
        if sessions.is_empty() {
            return 0;
        }
        let now = Instant::now();
        let mut values: FxHashMap<&str, HintValue> = FxHashMap::default();
        let mut hints = inner.hints.lock();
        let mut sent = 0;
        for cluster in sessions {
            let mut seen: FxHashSet<&str> = FxHashSet::default();
            for n in demand.needs_of(&cluster) {
                let fp = n.fingerprint();
                if !seen.insert(fp) {
                    continue;
                }
                let value = *values.entry(fp).or_insert_with(|| {
                    let supply = inv.free_supply(n.profile.pinned_instance_types());
                    let confidence = if supply.idle > 0 {
                        pb::available_capacity_update::Confidence::High
                    } else if supply.speculative > 0 {
                        pb::available_capacity_update::Confidence::Medium
                    } else {
                        pb::available_capacity_update::Confidence::None
                    };
                    HintValue {
                        count: i32::try_from(supply.idle + supply.speculative).unwrap_or(i32::MAX),
                        confidence: confidence as i32,
                        cost_per_hour: supply.cheapest_idle_price.unwrap_or(0.0),
                    }
                });
                if !hints.should_emit(&cluster, fp, value, now) {
                    continue;
                }
                let key = format!("available:{fp}");
                let frame = pb::AvailableCapacityUpdate {
                    supersedes_key: key.clone(),
                    requirements: requirements_to_proto(n.profile.requirements()),
                    resources: None,
                    available_count: value.count,
                    confidence: value.confidence,
                    cost_per_hour: value.cost_per_hour,
                };
                inner.publisher.publish(mesh::ShardEvent {
                    cluster_id: cluster.clone(),
                    supersedes_key: key,
                    frame: Some(mesh::shard_event::Frame::AvailableCapacity(frame)),
                });
                sent += 1;
            }
            hints.retain(&cluster, |fp| seen.contains(fp));
        }
        sent
    }
}

#[cfg(test)]
mod hint_sweep_tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nothing_is_due_before_the_first_slot_and_everything_after_a_whole_interval() {
        let t0 = Instant::now();
        let mut s = HintSweep::new(t0);
        let interval = Duration::from_secs(64);
        assert!(s.due(interval, t0).is_none());
        assert!(s.due(interval, t0 + Duration::from_millis(999)).is_none());
        let one = s.due(interval, t0 + Duration::from_secs(1)).unwrap();
        let hits = (0..1000).filter(|i| one.contains(&format!("c{i}"))).count();
        // One slot of 64: about 1/64 of the clusters, never all of them.
        assert!(hits > 0 && hits < 100, "{hits}");
        let all = s.due(interval, t0 + Duration::from_secs(200)).unwrap();
        assert!((0..1000).all(|i| all.contains(&format!("c{i}"))));
    }

    proptest! {
        /// However the cycles fall, every cluster is swept exactly once per
        /// HINT_SLOTS slots: the sweep neither skips nor doubles a cluster.
        #[test]
        fn every_cluster_exactly_once_per_round(steps in proptest::collection::vec(1u64..20, 1..40)) {
            let t0 = Instant::now();
            let mut s = HintSweep::new(t0);
            let interval = Duration::from_secs(HINT_SLOTS);
            let clusters: Vec<String> = (0..300).map(|i| format!("cluster-{i}")).collect();
            let mut seen = vec![0u32; clusters.len()];
            let mut at = 0u64;
            for step in steps {
                // Never more than a whole round per cycle here.
                at += step.min(HINT_SLOTS);
                if let Some(r) = s.due(interval, t0 + Duration::from_secs(at)) {
                    for (i, c) in clusters.iter().enumerate() {
                        if r.contains(c) {
                            seen[i] += 1;
                        }
                    }
                }
            }
            let rounds = at / HINT_SLOTS;
            for (i, c) in clusters.iter().enumerate() {
                let slot = hint_slot(c);
                // Slots 1..=at were swept; a cluster's slot s comes due at s, s+64, ...
                let due_times = (1..=at).filter(|t| t % HINT_SLOTS == slot).count() as u32;
                prop_assert_eq!(seen[i], due_times, "cluster {} slot {} rounds {}", c, slot, rounds);
            }
        }
    }
}
