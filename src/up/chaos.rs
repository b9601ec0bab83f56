//! `bigfleet up --chaos` (issue 23): kill components at random — seeded, so a run can be
//! repeated — let them come back, and prove from the fake providers' actuation logs and the
//! final state that the invariants held.
//!
//! * Victims: the coordinator leader (asked through each replica's
//!   `bigfleet_coordinator_is_leader`; with a single replica, that one), each shard's decide
//!   (its restart mints a higher epoch from its data dir, ADR-0103, so anything the old one
//!   still had in flight is fenced), execute worker and session gateway (the simulated
//!   operators reconnect), and each fake provider (decide and execute see reconcile errors
//!   while it is down; it keeps its fencing marks in a fence file, but reseeds its machines
//!   from the catalog, like a provider that lost its state).
//! * Victims are drawn by component, every target once per round in a seeded order (then a
//!   child of that component at random), so even a short run hits each kind.
//! * Kills are SIGKILL to the child's process group — what `bigfleet lab kill` does — and the
//!   child is started again [`RESTART_DELAY`] later. One victim is down at a time.
//! * The interval between kills is uniform in [½, 1½] × `--chaos-every`. With `--duration`
//!   the last `--chaos-settle` has no kills, so "every need is met" is checked on a mesh that
//!   had time to recover.
//!
//! Invariants in the summary's `chaos` object: every need met at the end; no machine
//! actuated twice and zero calls accepted with an epoch older than one already accepted for
//! the shard (both from the actuation logs, [`bigfleet_fake_provider::actuation`]); no
//! reclaim storm — Drains accepted in the [`STORM_WINDOW`] after each restart stay within
//! [`storm_bound`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bigfleet_fake_provider::actuation::{Actuation, ActuationAudit, audit, read_actuation_log};
// The victims' and the jitter's generator; runs start it from the raw seed (`from_state`),
// so a printed `--chaos-seed` keeps replaying the same victims.
use bigfleet_model::SplitMix64 as Rng;
use serde::Serialize;

use super::progress::Snapshot;

/// How long a killed child stays down before it is started again.
pub const RESTART_DELAY: Duration = Duration::from_secs(1);
/// After each restart, Drains accepted within this window count towards a reclaim storm.
pub const STORM_WINDOW: Duration = Duration::from_secs(10);
/// Drains within [`STORM_WINDOW`] that never count as a storm (ordinary churn).
pub const STORM_FLOOR: u64 = 5;

/// What chaos may kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    Coordinator,
    Decide,
    Execute,
    Gateway,
    Provider,
}

impl Component {
    /// Every component.
    pub const ALL: [Component; 5] = [
        Component::Coordinator,
        Component::Decide,
        Component::Execute,
        Component::Gateway,
        Component::Provider,
    ];

    /// The component a child of `up` is (`shard-0-decide` ⇒ decide); `None` for children
    /// chaos leaves alone (inspect).
    pub fn of_child(name: &str) -> Option<Component> {
        if name == "coordinator" || name.starts_with("coordinator-") {
            return Some(Component::Coordinator);
        }
        if name.starts_with("provider-") {
            return Some(Component::Provider);
        }
        if !name.starts_with("shard-") {
            return None;
        }
        match name.rsplit('-').next() {
            Some("decide") => Some(Component::Decide),
            Some("execute") => Some(Component::Execute),
            Some("gateway") => Some(Component::Gateway),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Component::Coordinator => "coordinator",
            Component::Decide => "decide",
            Component::Execute => "execute",
            Component::Gateway => "gateway",
            Component::Provider => "provider",
        }
    }
}

/// A seed for a run without `--chaos-seed` (printed, so the run can be repeated).
pub fn random_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng::from_state(nanos ^ (u64::from(std::process::id()) << 32)).next_u64()
}

/// The chaos settings of one run.
#[derive(Debug, Clone)]
pub struct ChaosPlan {
    pub seed: u64,
    pub every: Duration,
    pub settle: Duration,
    pub targets: Vec<Component>,
}

/// One kill.
#[derive(Debug, Clone, Serialize)]
pub struct Kill {
    pub victim: String,
    pub component: Component,
    /// Seconds since `up` started.
    pub at_seconds: f64,
    /// Seconds until it answered `/readyz` again (None: not (yet) back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_seconds: Option<f64>,
    /// A coordinator replica that was the Raft leader when it was killed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub leader: bool,
    /// Machines Configured when it was killed (the base of the reclaim-storm bound).
    pub configured_at_kill: u64,
    /// Drains accepted in the window after its restart, and their bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drains_after_restart: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_bound: Option<u64>,
    #[serde(skip)]
    restarted_unix_ms: Option<u64>,
}

/// The chaos loop's state (driven by `up`'s supervision tick).
#[derive(Debug)]
pub struct Chaos {
    plan: ChaosPlan,
    rng: Rng,
    started: Instant,
    next_kill: Instant,
    /// No kills from here on (the settle period).
    kills_until: Option<Instant>,
    /// The victim that is down and when it is due to start again.
    down: Option<(String, Instant)>,
    kills: Vec<Kill>,
    /// Components still to hit this round: every target once per round, in a seeded
    /// order, so a short run hits each of them.
    bag: Vec<Component>,
}

/// What to do this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Nothing,
    Kill(String),
    Restart(String),
}

impl Chaos {
    /// `deadline`: when the run ends (`--duration`), so kills stop `settle` before it.
    pub fn new(plan: ChaosPlan, started: Instant, deadline: Option<Instant>) -> Self {
        let mut rng = Rng::from_state(plan.seed);
        let first = started + jitter(&mut rng, plan.every);
        Self {
            kills_until: deadline.map(|d| d.checked_sub(plan.settle).unwrap_or(started)),
            plan,
            rng,
            started,
            next_kill: first,
            down: None,
            kills: Vec::new(),
            bag: Vec::new(),
        }
    }

    pub fn plan(&self) -> &ChaosPlan {
        &self.plan
    }

    /// The next step at `now`, given the children and which of them may be killed
    /// (`eligible`: running, not held down by `lab kill` or a pending restart).
    /// Whether [`Chaos::step`] would kill at `now` (so `up` asks the coordinators who
    /// leads only then).
    pub fn kill_due(&self, now: Instant) -> bool {
        self.down.is_none() && now >= self.next_kill && self.kills_until.is_none_or(|u| now < u)
    }

    /// `leader`: the coordinator replica that leads now, the one a coordinator kill hits
    /// (with several replicas and no leader known, no coordinator is killed this round).
    pub fn step(
        &mut self,
        now: Instant,
        children: &[String],
        eligible: impl Fn(&str) -> bool,
        leader: Option<&str>,
    ) -> Step {
        if let Some((name, due)) = &self.down {
            return if now >= *due {
                Step::Restart(name.clone())
            } else {
                Step::Nothing
            };
        }
        if now < self.next_kill || self.kills_until.is_some_and(|u| now >= u) {
            return Step::Nothing;
        }
        self.next_kill = now + jitter(&mut self.rng, self.plan.every);
        let candidates = |kind: Component| -> Vec<&String> {
            children
                .iter()
                .filter(|c| Component::of_child(c) == Some(kind))
                .filter(|c| eligible(c))
                .collect()
        };
        // The next component from the bag that has a child to kill; a component with none
        // right now (down, or absent: an external provider) is skipped this round.
        for _ in 0..=self.plan.targets.len() {
            if self.bag.is_empty() {
                self.bag = self.plan.targets.clone();
                // Fisher–Yates; drawn from the back.
                for i in (1..self.bag.len()).rev() {
                    let j = self.rng.below(i + 1);
                    self.bag.swap(i, j);
                }
            }
            let Some(kind) = self.bag.pop() else {
                break;
            };
            let c = candidates(kind);
            if kind == Component::Coordinator && c.len() > 1 {
                // Several replicas: the leader, or none this round (an election is on).
                match leader {
                    Some(l) if c.iter().any(|n| n.as_str() == l) => {
                        return Step::Kill(l.to_owned());
                    }
                    _ => continue,
                }
            }
            if !c.is_empty() {
                return Step::Kill(c[self.rng.below(c.len())].clone());
            }
        }
        Step::Nothing
    }

    /// Records a kill carried out at `now`.
    pub fn killed(&mut self, victim: &str, now: Instant, snap: Option<&Snapshot>, leader: bool) {
        let Some(component) = Component::of_child(victim) else {
            return;
        };
        self.kills.push(Kill {
            victim: victim.to_owned(),
            component,
            at_seconds: now.duration_since(self.started).as_secs_f64(),
            down_seconds: None,
            leader,
            configured_at_kill: snap.map_or(0, Snapshot::configured),
            drains_after_restart: None,
            drain_bound: None,
            restarted_unix_ms: None,
        });
        self.down = Some((victim.to_owned(), now + RESTART_DELAY));
    }

    /// The victim is running again (or failed to start and is left to supervision).
    pub fn restarted(&mut self, victim: &str, now: Instant, ok: bool) {
        self.down = None;
        if let Some(k) = self.kills.iter_mut().rev().find(|k| k.victim == victim)
            && ok
        {
            let killed_at = self.started + Duration::from_secs_f64(k.at_seconds);
            k.down_seconds = Some(now.duration_since(killed_at).as_secs_f64());
            k.restarted_unix_ms = Some(unix_ms());
        }
    }

    /// The victim that is down right now, if any.
    pub fn down(&self) -> Option<&str> {
        self.down.as_ref().map(|(n, _)| n.as_str())
    }

    pub fn kill_count(&self) -> usize {
        self.kills.len()
    }

    pub fn last_victim(&self) -> Option<&str> {
        self.kills.last().map(|k| k.victim.as_str())
    }

    /// The summary's `chaos` object: the kills and the invariants, from the final snapshot
    /// and the providers' actuation logs.
    pub fn report(&self, last: Option<&Snapshot>, logs: &[PathBuf]) -> ChaosReport {
        let mut actuations: Vec<Actuation> = Vec::new();
        let mut problems = Vec::new();
        let mut audits = Vec::new();
        for p in logs {
            match read_actuation_log(p) {
                Ok(l) => {
                    audits.push(audit(&l));
                    actuations.extend(l);
                }
                Err(e) => problems.push(format!("{}: {e}", p.display())),
            }
        }
        let mut total = ActuationAudit::default();
        for a in audits {
            total.accepted += a.accepted;
            total.replays += a.replays;
            total.fenced_calls_accepted += a.fenced_calls_accepted;
            total
                .machines_actuated_twice
                .extend(a.machines_actuated_twice);
            for (shard, e) in a.epochs {
                let hw = total.epochs.entry(shard).or_insert(e);
                *hw = (*hw).max(e);
            }
        }
        let mut kills = self.kills.clone();
        let mut storm = false;
        let window = STORM_WINDOW.as_millis() as u64;
        for k in &mut kills {
            let Some(from) = k.restarted_unix_ms else {
                continue;
            };
            let drains = actuations
                .iter()
                .filter(|a| a.op == "drain" && !a.replay)
                .filter(|a| a.unix_ms >= from && a.unix_ms <= from + window)
                .count() as u64;
            let bound = storm_bound(k.configured_at_kill);
            storm |= drains > bound;
            k.drains_after_restart = Some(drains);
            k.drain_bound = Some(bound);
        }
        let mut by_component: BTreeMap<Component, u64> = BTreeMap::new();
        for k in &kills {
            *by_component.entry(k.component).or_default() += 1;
        }
        let (needs, satisfied) =
            last.map_or((0, 0), |s| (s.counts.needs, s.counts.needs_satisfied));
        let needs_met = NeedsMet {
            met: needs > 0 && satisfied == needs,
            needs,
            satisfied,
        };
        let twice = total.machines_actuated_twice.len() as u64;
        let audited = !logs.is_empty() && problems.is_empty();
        let invariants_held =
            needs_met.met && audited && twice == 0 && total.fenced_calls_accepted == 0 && !storm;
        ChaosReport {
            seed: self.plan.seed,
            every_seconds: self.plan.every.as_secs_f64(),
            settle_seconds: self.plan.settle.as_secs_f64(),
            targets: self.plan.targets.clone(),
            kills: by_component,
            restarts: kills.iter().filter(|k| k.down_seconds.is_some()).count() as u64,
            events: kills,
            needs_met_at_end: needs_met,
            machines_actuated_twice: twice,
            machines_actuated_twice_ids: total.machines_actuated_twice,
            fenced_calls_accepted: total.fenced_calls_accepted,
            actuations_accepted: total.accepted,
            actuation_replays: total.replays,
            epochs: total.epochs,
            reclaim_storm: ReclaimStorm {
                storm,
                window_seconds: STORM_WINDOW.as_secs_f64(),
            },
            audited,
            audit_problems: problems,
            invariants_held,
        }
    }
}

/// Drains after a restart beyond which it was a reclaim storm: a tenth of what was
/// Configured when the victim was killed, and never fewer than [`STORM_FLOOR`].
pub fn storm_bound(configured_at_kill: u64) -> u64 {
    (configured_at_kill / 10).max(STORM_FLOOR)
}

fn jitter(rng: &mut Rng, every: Duration) -> Duration {
    every.mul_f64(0.5 + rng.unit())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `needs_met_at_end`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NeedsMet {
    pub met: bool,
    pub needs: u64,
    pub satisfied: u64,
}

/// `reclaim_storm`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReclaimStorm {
    pub storm: bool,
    pub window_seconds: f64,
}

/// The summary's `chaos` object.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub seed: u64,
    pub every_seconds: f64,
    pub settle_seconds: f64,
    pub targets: Vec<Component>,
    /// Kills per component.
    pub kills: BTreeMap<Component, u64>,
    /// Victims that came back.
    pub restarts: u64,
    /// Every kill, in order.
    pub events: Vec<Kill>,
    pub needs_met_at_end: NeedsMet,
    pub machines_actuated_twice: u64,
    pub machines_actuated_twice_ids: Vec<String>,
    pub fenced_calls_accepted: u64,
    pub actuations_accepted: u64,
    pub actuation_replays: u64,
    /// Highest epoch the providers accepted per shard.
    pub epochs: BTreeMap<String, i64>,
    pub reclaim_storm: ReclaimStorm,
    /// False when there was no actuation log to audit (an external provider) or one could
    /// not be read: the invariants are then not proven.
    pub audited: bool,
    pub audit_problems: Vec<String>,
    pub invariants_held: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seed: u64) -> ChaosPlan {
        ChaosPlan {
            seed,
            every: Duration::from_secs(3),
            settle: Duration::from_secs(10),
            targets: Component::ALL.to_vec(),
        }
    }

    /// A last sample that saw `needs` demand rows, `satisfied` of them met.
    fn snapshot_with_needs(needs: u64, satisfied: u64) -> Snapshot {
        let mut snap = Snapshot::default();
        snap.counts.needs = needs;
        snap.counts.needs_satisfied = satisfied;
        snap
    }

    fn children() -> Vec<String> {
        [
            "coordinator",
            "provider-0",
            "shard-0-decide",
            "shard-0-gateway",
            "shard-0-execute",
            "inspect",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn children_map_to_components() {
        assert_eq!(
            Component::of_child("coordinator"),
            Some(Component::Coordinator)
        );
        assert_eq!(Component::of_child("provider-3"), Some(Component::Provider));
        assert_eq!(
            Component::of_child("shard-12-decide"),
            Some(Component::Decide)
        );
        assert_eq!(
            Component::of_child("shard-0-gateway"),
            Some(Component::Gateway)
        );
        assert_eq!(
            Component::of_child("shard-0-execute"),
            Some(Component::Execute)
        );
        assert_eq!(Component::of_child("inspect"), None);
    }

    /// Runs a plan over simulated time: the sequence of victims.
    fn victims(seed: u64, targets: &[Component]) -> Vec<String> {
        let t0 = Instant::now();
        let mut p = plan(seed);
        p.targets = targets.to_vec();
        let mut c = Chaos::new(p, t0, Some(t0 + Duration::from_secs(60)));
        let mut out = Vec::new();
        for ms in (0..70_000).step_by(100) {
            let now = t0 + Duration::from_millis(ms);
            match c.step(now, &children(), |_| true, None) {
                Step::Kill(v) => {
                    c.killed(&v, now, None, false);
                    out.push(v);
                }
                Step::Restart(v) => c.restarted(&v, now, true),
                Step::Nothing => {}
            }
        }
        out
    }

    #[test]
    fn the_same_seed_kills_the_same_children_and_settles() {
        let a = victims(7, &Component::ALL);
        assert_eq!(a, victims(7, &Component::ALL));
        assert_ne!(a, victims(8, &Component::ALL));
        // 50 s of kills at a mean of one per 3 s; none in the last 10 s, never inspect.
        assert!((8..=34).contains(&a.len()), "{a:?}");
        assert!(!a.iter().any(|v| v == "inspect"));
        // Every component once per round of five.
        let kinds: std::collections::BTreeSet<_> = a[..5]
            .iter()
            .filter_map(|v| Component::of_child(v))
            .collect();
        assert_eq!(kinds.len(), 5, "every component in the first round: {a:?}");
        let only = victims(7, &[Component::Decide]);
        assert!(!only.is_empty() && only.iter().all(|v| v == "shard-0-decide"));
    }

    #[test]
    fn a_coordinator_kill_hits_the_leader() {
        let t0 = Instant::now();
        let mut p = plan(3);
        p.targets = vec![Component::Coordinator];
        let mut c = Chaos::new(p, t0, None);
        let replicas: Vec<String> = (0..3).map(|i| format!("coordinator-{i}")).collect();
        let mut hit = Vec::new();
        for ms in (0..60_000).step_by(100) {
            let now = t0 + Duration::from_millis(ms);
            let leader = format!("coordinator-{}", (ms / 10_000) % 3);
            match c.step(now, &replicas, |_| true, Some(&leader)) {
                Step::Kill(v) => {
                    assert_eq!(v, leader);
                    c.killed(&v, now, None, false);
                    hit.push(v);
                }
                Step::Restart(v) => c.restarted(&v, now, true),
                Step::Nothing => {}
            }
        }
        assert!(hit.len() > 5, "{hit:?}");
        // No leader known (an election in progress): no coordinator is killed this round.
        let now = t0 + Duration::from_secs(3600);
        assert_eq!(c.step(now, &replicas, |_| true, None), Step::Nothing);
        // A single replica is the leader by definition.
        let now = now + Duration::from_secs(3600);
        let one = ["coordinator".to_owned()];
        assert_eq!(
            c.step(now, &one, |_| true, None),
            Step::Kill("coordinator".into())
        );
    }

    #[test]
    fn no_kill_in_the_settle_period_and_one_victim_down_at_a_time() {
        let t0 = Instant::now();
        let mut c = Chaos::new(plan(1), t0, Some(t0 + Duration::from_secs(20)));
        let mut last_kill = None;
        for ms in (0..20_000).step_by(50) {
            let now = t0 + Duration::from_millis(ms);
            match c.step(now, &children(), |_| true, None) {
                Step::Kill(v) => {
                    assert!(c.down().is_none());
                    c.killed(&v, now, None, false);
                    last_kill = Some(ms);
                }
                // Restarts are left pending: nothing else is killed meanwhile.
                Step::Restart(_) | Step::Nothing => {}
            }
        }
        assert_eq!(c.kill_count(), 1, "one victim down blocks further kills");
        assert!(last_kill.unwrap() < 10_000);
    }

    #[test]
    fn the_report_fails_on_a_stale_epoch_or_unmet_needs() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("actuations.jsonl");
        let line = |op: &str, m: &str, epoch: i64| {
            serde_json::json!({"incarnation": 1, "unix_ms": 1, "op": op, "machine": m,
                "shard": "shard-0", "epoch": epoch, "sequence": 1, "operation": "op-1",
                "replay": false})
            .to_string()
        };
        std::fs::write(
            &log,
            format!("{}\n{}\n", line("create", "a", 5), line("create", "b", 6)),
        )
        .unwrap();
        let t0 = Instant::now();
        let c = Chaos::new(plan(1), t0, None);
        let snap = snapshot_with_needs(3, 3);
        let r = c.report(Some(&snap), std::slice::from_ref(&log));
        assert!(r.invariants_held, "{r:?}");
        assert_eq!(r.epochs["shard-0"], 6);
        // A call of epoch 5 after epoch 6 was accepted.
        std::fs::write(
            &log,
            format!("{}\n{}\n", line("create", "b", 6), line("create", "a", 5)),
        )
        .unwrap();
        let r = c.report(Some(&snap), std::slice::from_ref(&log));
        assert_eq!(r.fenced_calls_accepted, 1);
        assert!(!r.invariants_held);
        // Needs not met.
        std::fs::write(&log, "").unwrap();
        let unmet = snapshot_with_needs(3, 2);
        let r = c.report(Some(&unmet), std::slice::from_ref(&log));
        assert!(!r.needs_met_at_end.met && !r.invariants_held);
        // Nothing to audit proves nothing.
        assert!(!c.report(Some(&snap), &[]).invariants_held);
    }

    #[test]
    fn drains_right_after_a_restart_beyond_the_bound_are_a_storm() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("actuations.jsonl");
        let t0 = Instant::now();
        let mut c = Chaos::new(plan(1), t0, None);
        c.killed("shard-0-decide", t0, None, false);
        c.restarted("shard-0-decide", t0 + Duration::from_secs(1), true);
        let from = c.kills[0].restarted_unix_ms.unwrap();
        let drains = |n: u64, at: u64| -> String {
            (0..n)
                .map(|i| {
                    format!(
                        "{}\n",
                        serde_json::json!({"incarnation": 1, "unix_ms": at, "op": "drain",
                            "machine": format!("m-{at}-{i}"), "shard": "shard-0", "epoch": 9,
                            "sequence": i + 1, "operation": "op-1", "replay": false})
                    )
                })
                .collect()
        };
        let snap = snapshot_with_needs(1, 1);
        // Five drains right after the restart, plenty long after: no storm.
        std::fs::write(
            &log,
            drains(STORM_FLOOR, from + 10) + &drains(50, from + 60_000),
        )
        .unwrap();
        let r = c.report(Some(&snap), std::slice::from_ref(&log));
        assert!(!r.reclaim_storm.storm && r.invariants_held, "{r:?}");
        assert_eq!(r.events[0].drains_after_restart, Some(STORM_FLOOR));
        // One more inside the window is.
        std::fs::write(&log, drains(STORM_FLOOR + 1, from + 10)).unwrap();
        let r = c.report(Some(&snap), std::slice::from_ref(&log));
        assert!(r.reclaim_storm.storm && !r.invariants_held, "{r:?}");
        assert_eq!(r.kills[&Component::Decide], 1);
    }

    #[test]
    fn storms_are_bounded_by_what_was_configured() {
        assert_eq!(storm_bound(0), STORM_FLOOR);
        assert_eq!(storm_bound(40), STORM_FLOOR);
        assert_eq!(storm_bound(88), 8);
        assert_eq!(storm_bound(1000), 100);
    }
}
