//! Safety rails at the actuation and ingest boundary (ADR-0105).
//!
//! None of these change what the engine decides; they only govern what crosses
//! from decision to execution (reclaim budget, kill switch, dry-run, per-cycle
//! action limit) and what a roll-up may do to the NeedsTable (quarantine).
//! Both budgets that matter for a bad roll-up are measured in wall-clock time,
//! not in cycles: cycles run every `--cycle-interval` *and* on every accepted
//! roll-up, so a per-cycle limit is no limit at all.

use crate::inventory::Inventory;
use bigfleet_model::{Action, ActionKind, MachineState, Need, ResourceVector};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The row rule only considers clusters whose accepted baseline had at least this many rows.
pub const QUARANTINE_MIN_BASELINE_ROWS: usize = 10;
/// The quantity rule only considers a resource that at least this many of the
/// cluster's Configured machines provide: below that a drop cannot release
/// enough machines to matter.
pub const QUARANTINE_MIN_BASELINE_MACHINES: u64 = 10;
/// A roll-up keeping fewer than this fraction of the baseline rows, or of the
/// baseline's total of one resource, is suspicious.
pub const QUARANTINE_FRACTION: f64 = 0.1;
/// The n-th consecutive suspicious roll-up is accepted.
pub const QUARANTINE_CONFIRMATIONS: u32 = 3;
/// Production default of `--reclaim-budget-fraction`.
pub const DEFAULT_RECLAIM_BUDGET_FRACTION: f64 = 0.05;
/// Production default of `--reclaim-budget-window`.
pub const DEFAULT_RECLAIM_BUDGET_WINDOW: Duration = Duration::from_secs(600);
/// Quiet period between two "reclaims deferred" log lines of one cluster, so a
/// long budgeted drain logs once a minute rather than once a cycle.
pub const DEFERRED_LOG_EVERY: Duration = Duration::from_secs(60);

/// Rail configuration (flags of the binary).
#[derive(Debug, Clone, PartialEq)]
pub struct RailsConfig {
    /// Kill switch: decide everything, execute nothing.
    pub actuation_paused: bool,
    /// Shadow mode: decide and log everything, execute nothing.
    pub dry_run: bool,
    /// Reclaims started per cluster within any `reclaim_budget_window` ≤
    /// max(1, ⌊fraction × (Configured + Draining)⌋), Draining machines counted
    /// as started; 0 disables.
    pub reclaim_budget_fraction: f64,
    pub reclaim_budget_window: Duration,
    pub empty_rollup_guard: bool,
    /// 0 = unlimited; truncation asks for a follow-up cycle.
    pub max_actions_per_cycle: usize,
    pub audit_log: Option<PathBuf>,
}

impl Default for RailsConfig {
    fn default() -> Self {
        RailsConfig {
            actuation_paused: false,
            dry_run: false,
            reclaim_budget_fraction: DEFAULT_RECLAIM_BUDGET_FRACTION,
            reclaim_budget_window: DEFAULT_RECLAIM_BUDGET_WINDOW,
            empty_rollup_guard: true,
            max_actions_per_cycle: 0,
            audit_log: None,
        }
    }
}

impl RailsConfig {
    /// Every rail off (what the engine decides is what executes).
    pub fn off() -> Self {
        RailsConfig {
            reclaim_budget_fraction: 0.0,
            empty_rollup_guard: false,
            ..RailsConfig::default()
        }
    }

    /// Whether the reclaim budget is on.
    pub fn budget_enabled(&self) -> bool {
        self.reclaim_budget_fraction > 0.0 && !self.reclaim_budget_window.is_zero()
    }
}

/// A cluster's reclaim budget per window: `max(1, ⌊fraction × machines⌋)`,
/// `None` when disabled. `machines` is the cluster's Configured plus Draining
/// machines: its size before the reclaims in flight, so a drain in progress
/// does not shrink the budget it is already counted against (that would
/// count it twice, and make the hand-out check disagree with the cycle's).
pub fn reclaim_budget(fraction: f64, machines: u64) -> Option<u64> {
    (fraction > 0.0).then(|| ((fraction * machines as f64).floor() as u64).max(1))
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// What the reclaim budget reads about a cluster right now (the inventory; a
/// model in tests).
pub trait ClusterOccupancy {
    /// Configured machines bound to `cluster`.
    fn configured(&self, cluster: &str) -> u64;
    /// Draining machines bound to `cluster`: reclaims (or preemptions) in flight.
    fn draining(&self, cluster: &str) -> u64;
    /// Whether `machine` is Draining while bound to `cluster`.
    fn is_draining_in(&self, machine: &str, cluster: &str) -> bool;
}

impl ClusterOccupancy for Inventory {
    fn configured(&self, cluster: &str) -> u64 {
        self.configured_in(cluster)
    }

    fn draining(&self, cluster: &str) -> u64 {
        self.draining_in(cluster)
    }

    fn is_draining_in(&self, machine: &str, cluster: &str) -> bool {
        self.state_of(machine) == Some(MachineState::Draining)
            && self.cluster_of(machine) == Some(cluster)
    }
}

/// The per-cluster reclaim budget over wall-clock time (ADR-0105).
///
/// Each reclaim handed to a worker spends one token of its cluster, and that
/// token comes back exactly one window later — a sliding-window limiter, so
/// *every* window of that length holds at most the budget (a bucket refilling
/// continuously would allow twice the budget in one window: a full bucket at
/// its start plus a whole refill during it). Machines of the cluster that are
/// Draining count as spent tokens too, whoever started them and whenever: a
/// drain longer than the window, a preemption, or one started before this
/// process did, all keep capacity out of the cluster.
#[derive(Debug, Default)]
pub struct ReclaimBudget {
    /// Per cluster, reclaims handed out within the window, oldest first.
    spent: FxHashMap<String, VecDeque<(i64, String)>>,
    /// Per cluster, when its last "deferred" log line was written.
    logged: FxHashMap<String, i64>,
}

impl ReclaimBudget {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the tokens spent at or before `now - window`.
    pub fn expire(&mut self, now_unix_nanos: i64, window: Duration) {
        let horizon = now_unix_nanos.saturating_sub(nanos(window));
        self.spent.retain(|_, q| {
            while q.front().is_some_and(|(t, _)| *t <= horizon) {
                q.pop_front();
            }
            !q.is_empty()
        });
    }

    /// Tokens of `cluster` in use: reclaims spent within the window plus its
    /// Draining machines not among them (call [`ReclaimBudget::expire`] first).
    pub fn in_use(&self, cluster: &str, occ: &impl ClusterOccupancy) -> u64 {
        let spent = self.spent.get(cluster);
        let n = spent.map_or(0, VecDeque::len) as u64;
        let spent_draining = spent.map_or(0, |q| {
            q.iter()
                .filter(|(_, m)| occ.is_draining_in(m, cluster))
                .count()
        }) as u64;
        n + occ.draining(cluster).saturating_sub(spent_draining)
    }

    /// (budget, in use) of `cluster`; `None` when the budget is disabled.
    pub fn state(
        &self,
        fraction: f64,
        cluster: &str,
        occ: &impl ClusterOccupancy,
    ) -> Option<(u64, u64)> {
        let machines = occ.configured(cluster) + occ.draining(cluster);
        reclaim_budget(fraction, machines).map(|b| (b, self.in_use(cluster, occ)))
    }

    /// Records that a reclaim of `machine` in `cluster` was handed out now.
    pub fn spend(&mut self, cluster: &str, machine: &str, now_unix_nanos: i64) {
        self.spent
            .entry(cluster.to_owned())
            .or_default()
            .push_back((now_unix_nanos, machine.to_owned()));
    }

    /// The hand-out check: may `action` start now? Only Reclaims are budgeted.
    pub fn admits(&self, cfg: &RailsConfig, action: &Action, occ: &impl ClusterOccupancy) -> bool {
        if action.kind() != ActionKind::Reclaim || !cfg.budget_enabled() {
            return true;
        }
        self.state(cfg.reclaim_budget_fraction, action.cluster(), occ)
            .is_none_or(|(budget, used)| used < budget)
    }

    /// Whether a "deferred" line for `cluster` is due; records it when it is.
    pub fn should_log(&mut self, cluster: &str, now_unix_nanos: i64) -> bool {
        let due = self
            .logged
            .get(cluster)
            .is_none_or(|t| now_unix_nanos.saturating_sub(*t) >= nanos(DEFERRED_LOG_EVERY));
        if due {
            self.logged.insert(cluster.to_owned(), now_unix_nanos);
        }
        due
    }

    /// Forgets log stamps of clusters with nothing deferred any more.
    pub fn retain_logged(&mut self, keep: impl Fn(&str) -> bool) {
        self.logged.retain(|c, _| keep(c));
    }
}

/// Reclaims of one cluster the budget deferred in one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub cluster: String,
    pub deferred: usize,
    pub budget: u64,
    /// Tokens in use when the cycle started (spent in the window + Draining).
    pub in_use: u64,
}

/// What the rails let through in one cycle.
#[derive(Debug, Default, PartialEq)]
pub struct RailsOutcome {
    /// Actions to enqueue, in emission order.
    pub execute: Vec<Action>,
    /// Suppressed by the kill switch (counted per kind, audited, never run).
    pub suppressed: Vec<Action>,
    /// Reported by dry-run (counted per kind, logged, audited, never run).
    pub dry_run: Vec<Action>,
    /// Reclaims deferred by the budget (they re-derive next cycle).
    pub capped: usize,
    /// The same, per cluster, in cluster order.
    pub deferrals: Vec<Deferral>,
    /// Actions cut by `max_actions_per_cycle`.
    pub deferred: usize,
    /// Whether a follow-up cycle should run right away (only for truncation).
    pub follow_up: bool,
}

/// Applies the actuation rails to one cycle's actions against the budget's
/// state now (`budget` expired to now; nothing is spent here: tokens are
/// spent when a worker takes the action, see [`ReclaimBudget::admits`]).
pub fn apply(
    cfg: &RailsConfig,
    actions: Vec<Action>,
    budget: &ReclaimBudget,
    occ: &impl ClusterOccupancy,
) -> RailsOutcome {
    let mut out = RailsOutcome::default();
    // Pause wins over dry-run; the budget and truncation are skipped under
    // both: nothing executes, so there is no drain to bound and a truncation
    // would only busy-loop follow-up cycles.
    if cfg.actuation_paused {
        out.suppressed = actions;
        return out;
    }
    if cfg.dry_run {
        out.dry_run = actions;
        return out;
    }
    // Per cluster: (budget, in use, kept this cycle, deferred this cycle).
    let mut clusters: BTreeMap<String, (u64, u64, u64, usize)> = BTreeMap::new();
    let mut execute = Vec::with_capacity(actions.len());
    for a in actions {
        if a.kind() == ActionKind::Reclaim && cfg.budget_enabled() {
            let cluster = a.cluster();
            if !clusters.contains_key(cluster) {
                let (b, used) = budget
                    .state(cfg.reclaim_budget_fraction, cluster, occ)
                    .unwrap_or((u64::MAX, 0));
                clusters.insert(cluster.to_owned(), (b, used, 0, 0));
            }
            let c = clusters.get_mut(cluster).expect("just inserted");
            // Keep the head of Phase 3's emission order (its release order),
            // defer the tail.
            if c.1 + c.2 >= c.0 {
                c.3 += 1;
                out.capped += 1;
                continue;
            }
            c.2 += 1;
        }
        execute.push(a);
    }
    out.deferrals = clusters
        .into_iter()
        .filter(|(_, c)| c.3 > 0)
        .map(|(cluster, (budget, in_use, _, deferred))| Deferral {
            cluster,
            deferred,
            budget,
            in_use,
        })
        .collect();
    if cfg.max_actions_per_cycle > 0 && execute.len() > cfg.max_actions_per_cycle {
        out.deferred = execute.len() - cfg.max_actions_per_cycle;
        execute.truncate(cfg.max_actions_per_cycle);
        out.follow_up = true;
    }
    out.execute = execute;
    out
}

/// What the quarantine decided about one roll-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Accept,
    /// Accepted as the confirming roll-up of a held drop.
    AcceptConfirmed,
    /// Held; the value is the consecutive held count.
    Hold(u32),
    /// Not judged: decide has not read the inventory yet, so it has no
    /// baseline for a cluster it heard nothing from since it started.
    Unjudged,
}

impl Admission {
    /// Whether this roll-up opens the cluster's first-roll-up gate (the original's ADR-0036).
    /// A held roll-up opens it only when an earlier roll-up of this process is
    /// in force: right after a restart the NeedsTable has no demand for the
    /// cluster, so opening the gate on a held drop would let Phase 3 reclaim
    /// exactly what the quarantine is holding back.
    pub fn opens_gate(self, accepted_before: bool) -> bool {
        match self {
            Admission::Accept | Admission::AcceptConfirmed => true,
            Admission::Hold(_) => accepted_before,
            Admission::Unjudged => false,
        }
    }
}

/// What a cluster's Configured machines provide: the quarantine's baseline
/// after a restart, and its "big enough to matter" test.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holding {
    /// Σ allocatable over the cluster's Configured machines.
    pub capacity: ResourceVector,
    /// Per resource, how many of them provide some of it.
    pub providers: BTreeMap<String, u64>,
}

/// Every cluster's [`Holding`], read off the inventory.
pub fn holdings(inv: &Inventory) -> FxHashMap<String, Holding> {
    let mut out: FxHashMap<String, Holding> = FxHashMap::default();
    for (cluster, alloc, n) in inv.configured_shapes() {
        let h = out.entry(cluster.to_owned()).or_default();
        h.capacity
            .add_assign(&alloc.scale(i64::try_from(n).unwrap_or(i64::MAX)));
        for (r, v) in alloc.iter() {
            if v > 0 {
                *h.providers.entry(r.to_owned()).or_default() += n;
            }
        }
    }
    out
}

/// Σ aggregate_resources over a roll-up's rows.
pub fn requested_totals(needs: &[Need]) -> ResourceVector {
    let mut t = ResourceVector::new();
    for n in needs {
        t.add_assign(&n.aggregate_resources);
    }
    t
}

/// The quantity rule. Only resources big enough to matter count: the baseline
/// has some, and enough of the cluster's Configured machines provide them that
/// a drop could release ten.
fn quantity_drop(
    baseline: &ResourceVector,
    from_inventory: bool,
    holding: Option<&Holding>,
    totals: &ResourceVector,
) -> bool {
    let mut considered = baseline.iter().filter(|&(r, base)| {
        base > 0
            && holding
                .and_then(|h| h.providers.get(r))
                .is_some_and(|n| *n >= QUARANTINE_MIN_BASELINE_MACHINES)
    });
    let dropped =
        |(r, base): (&str, i64)| (totals.get(r) as f64) < QUARANTINE_FRACTION * base as f64;
    if from_inventory {
        // Capacity has dimensions demand never asks for (memory under cpu-only
        // demand, pods, ephemeral storage): against it a roll-up is a drop only
        // when it keeps under 10% of every one, i.e. would fit in a tenth of the
        // cluster.
        let mut any = false;
        let all = considered.all(|d| {
            any = true;
            dropped(d)
        });
        any && all
    } else {
        considered.any(dropped)
    }
}

#[derive(Debug, Default, Clone)]
struct GuardState {
    /// Rows of the baseline (0 when it came from the inventory).
    rows: usize,
    /// Requested totals of the baseline (the inventory's capacity after a restart).
    totals: ResourceVector,
    /// The baseline is the inventory's capacity, not a roll-up.
    from_inventory: bool,
    held: u32,
    /// A roll-up of this cluster was accepted since the process started.
    accepted: bool,
}

/// Empty-roll-up quarantine: a roll-up keeping fewer than 10% of a ≥10-row
/// baseline, or fewer than 10% of the baseline's total of any resource that
/// ≥10 of the cluster's Configured machines provide, is held until the third
/// consecutive such roll-up confirms it. The baseline is the last accepted
/// roll-up; after a restart it is what the cluster's Configured machines
/// provide (from the provider's listing), so a restart does not reset it —
/// against that capacity a roll-up is a drop when it keeps under 10% of every
/// such resource.
#[derive(Debug, Default)]
pub struct QuarantineGuard {
    enabled: bool,
    clusters: FxHashMap<String, GuardState>,
    holdings: FxHashMap<String, Holding>,
    /// Set by the first [`QuarantineGuard::refresh_holdings`] (the first reconcile).
    holdings_known: bool,
}

impl QuarantineGuard {
    pub fn new(enabled: bool) -> Self {
        QuarantineGuard {
            enabled,
            ..QuarantineGuard::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Replaces what each cluster's Configured machines provide (after each reconcile).
    /// Replaces the holdings; returns the old ones, so a caller holding a lock can drop
    /// them after releasing it.
    pub fn refresh_holdings(
        &mut self,
        holdings: FxHashMap<String, Holding>,
    ) -> FxHashMap<String, Holding> {
        self.holdings_known = true;
        std::mem::replace(&mut self.holdings, holdings)
    }

    /// Whether a roll-up of `cluster` was accepted since the process started.
    pub fn accepted(&self, cluster: &str) -> bool {
        self.clusters.get(cluster).is_some_and(|s| s.accepted)
    }

    pub fn admit(&mut self, cluster: &str, rows: usize, totals: &ResourceVector) -> Admission {
        if !self.enabled {
            return Admission::Accept;
        }
        let holding = self.holdings.get(cluster);
        if !self.clusters.contains_key(cluster) && !self.holdings_known {
            return Admission::Unjudged;
        }
        let st = self
            .clusters
            .entry(cluster.to_owned())
            .or_insert_with(|| GuardState {
                totals: holding.map(|h| h.capacity.clone()).unwrap_or_default(),
                from_inventory: true,
                ..GuardState::default()
            });
        let rows_drop = st.rows >= QUARANTINE_MIN_BASELINE_ROWS
            && (rows as f64) < QUARANTINE_FRACTION * st.rows as f64;
        let quantity_drop = quantity_drop(&st.totals, st.from_inventory, holding, totals);
        let suspicious = rows_drop || quantity_drop;
        if suspicious {
            st.held += 1;
            if st.held < QUARANTINE_CONFIRMATIONS {
                return Admission::Hold(st.held);
            }
        }
        *st = GuardState {
            rows,
            totals: totals.clone(),
            from_inventory: false,
            held: 0,
            accepted: true,
        };
        if suspicious {
            Admission::AcceptConfirmed
        } else {
            Admission::Accept
        }
    }

    /// Consecutive held roll-ups of `cluster` (the `rollup_quarantined` gauge).
    pub fn held(&self, cluster: &str) -> u32 {
        self.clusters.get(cluster).map_or(0, |s| s.held)
    }
}

/// One audit record (JSONL, one per executed / suppressed / dry-run action).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct AuditRecord {
    pub time: String,
    pub level: String,
    pub msg: String,
    pub cycle: u64,
    pub kind: String,
    pub machine: String,
    pub cluster: String,
    pub reason: String,
    pub grace_seconds: f64,
    pub outcome: String,
}

impl AuditRecord {
    pub fn new(cycle: u64, action: &Action, outcome: &str) -> Self {
        AuditRecord {
            time: humantime::format_rfc3339_nanos(SystemTime::now()).to_string(),
            level: "INFO".to_owned(),
            msg: "action".to_owned(),
            cycle,
            kind: kind_label(action.kind()).to_owned(),
            machine: action.machine_id().to_owned(),
            cluster: action.cluster().to_owned(),
            reason: action.kind().reason().to_owned(),
            grace_seconds: action.grace().map_or(0.0, |g| g.as_secs_f64()),
            outcome: outcome.to_owned(),
        }
    }
}

/// Append-only JSONL audit log. Rotation is the operator's job.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: File,
}

impl AuditLog {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(AuditLog {
            path: path.to_owned(),
            file,
        })
    }

    /// Appends one record. Errors are logged, never fatal: the audit trail
    /// must not stop actuation.
    pub fn write(&mut self, record: &AuditRecord) {
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "encoding audit record failed");
                return;
            }
        };
        line.push(b'\n');
        if let Err(e) = self.file.write_all(&line) {
            tracing::error!(path = %self.path.display(), error = %e, "writing audit log failed");
        }
    }
}

/// The `kind` label of metrics and audit records, with the reference's values
/// (`Release` is the reference's `Delete`).
pub fn kind_label(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::Bootstrap => "Bootstrap",
        ActionKind::Provision => "Provision",
        ActionKind::Reclaim => "Reclaim",
        ActionKind::Preempt => "Preempt",
        ActionKind::Release => "Delete",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    const SEC: i64 = 1_000_000_000;
    const WINDOW: Duration = Duration::from_secs(600);

    fn reclaim(cluster: &str, i: usize) -> Action {
        Action::Reclaim {
            machine_id: format!("{cluster}-m{i:04}"),
            cluster: cluster.to_owned(),
            grace: Duration::from_secs(600),
        }
    }

    /// Clusters as plain counts and Draining sets.
    #[derive(Default)]
    struct Occ {
        configured: BTreeMap<String, u64>,
        draining: BTreeMap<String, BTreeSet<String>>,
    }

    impl Occ {
        fn with(configured: &[(&str, u64)]) -> Occ {
            Occ {
                configured: configured
                    .iter()
                    .map(|(c, n)| ((*c).to_owned(), *n))
                    .collect(),
                ..Occ::default()
            }
        }
    }

    impl ClusterOccupancy for Occ {
        fn configured(&self, cluster: &str) -> u64 {
            self.configured.get(cluster).copied().unwrap_or(0)
        }
        fn draining(&self, cluster: &str) -> u64 {
            self.draining.get(cluster).map_or(0, |s| s.len() as u64)
        }
        fn is_draining_in(&self, machine: &str, cluster: &str) -> bool {
            self.draining
                .get(cluster)
                .is_some_and(|s| s.contains(machine))
        }
    }

    #[test]
    fn budget_formula() {
        assert_eq!(reclaim_budget(0.0, 1000), None);
        assert_eq!(reclaim_budget(0.05, 0), Some(1));
        assert_eq!(reclaim_budget(0.05, 19), Some(1));
        assert_eq!(reclaim_budget(0.05, 40), Some(2));
        assert_eq!(reclaim_budget(0.05, 1000), Some(50));
    }

    #[test]
    fn budget_keeps_head_per_cluster_and_leaves_other_kinds() {
        let mut actions: Vec<Action> = (0..5).map(|i| reclaim("a", i)).collect();
        actions.extend((0..3).map(|i| reclaim("b", i)));
        actions.push(Action::Release {
            machine_id: "r".into(),
        });
        actions.push(Action::Preempt {
            machine_id: "p".into(),
            cluster: "a".into(),
            grace: Duration::from_secs(1),
            preemptor_priority: 9,
        });
        let occ = Occ::with(&[("a", 40), ("b", 10)]);
        let out = apply(
            &RailsConfig::default(),
            actions,
            &ReclaimBudget::new(),
            &occ,
        );
        let ids: Vec<_> = out
            .execute
            .iter()
            .map(|a| a.machine_id().to_owned())
            .collect();
        assert_eq!(ids, ["a-m0000", "a-m0001", "b-m0000", "r", "p"]);
        assert_eq!(out.capped, 5);
        assert_eq!(
            out.deferrals,
            [
                Deferral {
                    cluster: "a".into(),
                    deferred: 3,
                    budget: 2,
                    in_use: 0
                },
                Deferral {
                    cluster: "b".into(),
                    deferred: 2,
                    budget: 1,
                    in_use: 0
                }
            ]
        );
        assert!(!out.follow_up);
    }

    #[test]
    fn spent_and_draining_tokens_count_until_the_window_passes() {
        let cfg = RailsConfig::default();
        let mut occ = Occ::with(&[("a", 100)]);
        let mut b = ReclaimBudget::new();
        for i in 0..3 {
            b.spend("a", &format!("a-m{i:04}"), i * SEC);
        }
        // Two of the three are Draining, one drained already; one more
        // Draining machine was started by someone else (a preemption).
        occ.draining.insert(
            "a".into(),
            ["a-m0000", "a-m0001", "x"].map(str::to_owned).into(),
        );
        b.expire(10 * SEC, WINDOW);
        assert_eq!(b.in_use("a", &occ), 4);
        assert!(b.admits(&cfg, &reclaim("a", 9), &occ));
        b.spend("a", "a-m0009", 10 * SEC);
        assert!(!b.admits(&cfg, &reclaim("a", 10), &occ), "5 of 5 in use");
        assert!(b.admits(
            &cfg,
            &Action::Release {
                machine_id: "r".into()
            },
            &occ
        ));
        // The first spend comes back exactly one window after it was made...
        b.expire(600 * SEC, WINDOW);
        // ...but a000 is still Draining, so it still counts.
        assert_eq!(b.in_use("a", &occ), 5);
        occ.draining.get_mut("a").unwrap().remove("a-m0000");
        assert_eq!(b.in_use("a", &occ), 4);
        b.expire(610 * SEC, WINDOW);
        // Only the Draining ones remain (a001 and x).
        assert_eq!(b.in_use("a", &occ), 2);
        assert!(b.spent.is_empty());
    }

    #[test]
    fn pause_wins_over_dry_run_and_skips_budget() {
        let actions: Vec<Action> = (0..5).map(|i| reclaim("a", i)).collect();
        let cfg = RailsConfig {
            actuation_paused: true,
            dry_run: true,
            max_actions_per_cycle: 1,
            ..RailsConfig::default()
        };
        let occ = Occ::with(&[("a", 10)]);
        let b = ReclaimBudget::new();
        let out = apply(&cfg, actions.clone(), &b, &occ);
        assert_eq!(out.suppressed.len(), 5);
        assert!(out.execute.is_empty() && out.dry_run.is_empty());
        assert_eq!((out.capped, out.deferred, out.follow_up), (0, 0, false));
        let cfg = RailsConfig {
            dry_run: true,
            actuation_paused: false,
            ..cfg
        };
        let out = apply(&cfg, actions, &b, &occ);
        assert_eq!(out.dry_run.len(), 5);
        assert!(out.execute.is_empty());
    }

    #[test]
    fn truncation_defers_and_asks_for_follow_up() {
        let actions: Vec<Action> = (0..5)
            .map(|i| Action::Release {
                machine_id: format!("m{i}"),
            })
            .collect();
        let cfg = RailsConfig {
            max_actions_per_cycle: 2,
            ..RailsConfig::default()
        };
        let out = apply(&cfg, actions, &ReclaimBudget::new(), &Occ::default());
        assert_eq!(out.execute.len(), 2);
        assert_eq!(out.deferred, 3);
        assert!(out.follow_up);
    }

    #[test]
    fn deferred_lines_are_rate_limited_per_cluster() {
        let mut b = ReclaimBudget::new();
        assert!(b.should_log("a", 0));
        assert!(!b.should_log("a", 59 * SEC));
        assert!(b.should_log("b", 59 * SEC));
        assert!(b.should_log("a", 60 * SEC));
        b.retain_logged(|c| c == "b");
        assert!(b.should_log("a", 61 * SEC));
    }

    fn cpu(cores: i64) -> ResourceVector {
        ResourceVector::from_milli([("cpu", cores * 1000)])
    }

    /// A guard that has seen the inventory: `cluster` holds `machines`
    /// Configured machines of 4 cores each.
    fn guard_holding(cluster: &str, machines: u64) -> QuarantineGuard {
        let mut g = QuarantineGuard::new(true);
        let mut h = FxHashMap::default();
        if machines > 0 {
            h.insert(
                cluster.to_owned(),
                Holding {
                    capacity: cpu(4 * machines as i64),
                    providers: [("cpu".to_owned(), machines)].into(),
                },
            );
        }
        g.refresh_holdings(h);
        g
    }

    #[test]
    fn quarantine_holds_two_and_accepts_third() {
        let mut g = guard_holding("a", 0);
        assert_eq!(g.admit("a", 20, &cpu(20)), Admission::Accept);
        assert_eq!(g.admit("a", 1, &cpu(1)), Admission::Hold(1));
        assert_eq!(g.held("a"), 1);
        assert_eq!(g.admit("a", 0, &cpu(0)), Admission::Hold(2));
        assert_eq!(g.admit("a", 0, &cpu(0)), Admission::AcceptConfirmed);
        assert_eq!(g.held("a"), 0);
        // The baseline is now 0: anything goes.
        assert_eq!(g.admit("a", 0, &cpu(0)), Admission::Accept);
    }

    #[test]
    fn quarantine_resets_on_normal_rollup_and_ignores_small_baselines() {
        let mut g = guard_holding("a", 0);
        g.admit("a", 100, &cpu(100));
        assert_eq!(g.admit("a", 9, &cpu(9)), Admission::Hold(1));
        // 10 of 100 is not < 10%: accepted, resets the streak.
        assert_eq!(g.admit("a", 10, &cpu(10)), Admission::Accept);
        assert_eq!(g.held("a"), 0);
        g.admit("b", 9, &cpu(9));
        assert_eq!(g.admit("b", 0, &cpu(0)), Admission::Accept);
        let mut off = QuarantineGuard::new(false);
        off.admit("a", 100, &cpu(100));
        assert_eq!(off.admit("a", 0, &cpu(0)), Admission::Accept);
    }

    #[test]
    fn quarantine_catches_quantities_dropping_with_rows_kept() {
        // One row asking for 400 cores on 100 machines, then the same row
        // asking for nothing: rows alone never notice.
        let mut g = guard_holding("a", 100);
        assert_eq!(g.admit("a", 1, &cpu(400)), Admission::Accept);
        assert_eq!(g.admit("a", 1, &cpu(0)), Admission::Hold(1));
        // 39 of 400 is < 10% too; 40 is not and resets.
        assert_eq!(g.admit("a", 1, &cpu(39)), Admission::Hold(2));
        assert_eq!(g.admit("a", 1, &cpu(40)), Admission::Accept);
        // Twenty rows whose quantities all go to zero.
        assert_eq!(g.admit("a", 20, &cpu(400)), Admission::Accept);
        let zeroed = ResourceVector::from_milli([("cpu", 0)]);
        assert_eq!(g.admit("a", 20, &zeroed), Admission::Hold(1));
        assert_eq!(g.admit("a", 20, &zeroed), Admission::Hold(2));
        assert_eq!(g.admit("a", 20, &zeroed), Admission::AcceptConfirmed);
    }

    #[test]
    fn quarantine_quantity_rule_needs_enough_machines_behind_the_resource() {
        // Nine machines: dropping everything cannot release ten.
        let mut g = guard_holding("a", 9);
        g.admit("a", 1, &cpu(36));
        assert_eq!(g.admit("a", 1, &cpu(0)), Admission::Accept);
        // A resource no Configured machine provides (here: gpu) never counts,
        // whatever its total: 100 cpu machines, one gpu row going away.
        let mut g = guard_holding("a", 100);
        let both = ResourceVector::from_milli([("cpu", 400_000), ("nvidia.com/gpu", 8_000)]);
        g.admit("a", 2, &both);
        assert_eq!(g.admit("a", 1, &cpu(400)), Admission::Accept);
    }

    #[test]
    fn quarantine_baseline_after_restart_is_the_inventory() {
        // A fresh process: nothing is judged before the inventory is read.
        let mut g = QuarantineGuard::new(true);
        assert_eq!(g.admit("a", 0, &cpu(0)), Admission::Unjudged);
        assert!(!g.accepted("a"));
        // 100 Configured 4-core machines: the first roll-up asking for
        // nothing is a drop from 400 cores.
        let mut g = guard_holding("a", 100);
        assert_eq!(g.admit("a", 0, &cpu(0)), Admission::Hold(1));
        assert!(!g.accepted("a"));
        assert!(!Admission::Hold(1).opens_gate(g.accepted("a")));
        // What the machines hold (within 10×) is accepted, and then the usual
        // baseline applies.
        assert_eq!(g.admit("a", 3, &cpu(41)), Admission::Accept);
        assert!(g.accepted("a"));
        assert!(Admission::Hold(1).opens_gate(g.accepted("a")));
        assert_eq!(g.admit("a", 3, &cpu(4)), Admission::Hold(1));
        // A cluster holding nothing has nothing to protect.
        assert_eq!(g.admit("b", 0, &cpu(0)), Admission::Accept);
        // Capacity in dimensions the demand never asks for: a cpu-only roll-up
        // keeping the cpu is no drop, one keeping under 10% of both is.
        let mut g = QuarantineGuard::new(true);
        let gib = 1024 * 1024 * 1024 * 1000;
        g.refresh_holdings(FxHashMap::from_iter([(
            "a".to_owned(),
            Holding {
                capacity: ResourceVector::from_milli([("cpu", 400_000), ("memory", 1600 * gib)]),
                providers: [("cpu".to_owned(), 100), ("memory".to_owned(), 100)].into(),
            },
        )]));
        assert_eq!(g.admit("a", 1, &cpu(300)), Admission::Accept);
        let mut g2 = QuarantineGuard::new(true);
        g2.refresh_holdings(g.holdings.clone());
        let small = ResourceVector::from_milli([("cpu", 39_000), ("memory", 100 * gib)]);
        assert_eq!(g2.admit("a", 1, &small), Admission::Hold(1));
        // Disabled: never unjudged.
        assert_eq!(
            QuarantineGuard::new(false).admit("a", 0, &cpu(0)),
            Admission::Accept
        );
    }

    #[test]
    fn held_rollups_open_the_gate_only_with_demand_in_force() {
        assert!(Admission::Accept.opens_gate(false));
        assert!(Admission::AcceptConfirmed.opens_gate(false));
        assert!(Admission::Hold(2).opens_gate(true));
        assert!(!Admission::Hold(2).opens_gate(false));
        assert!(!Admission::Unjudged.opens_gate(true));
    }

    #[test]
    fn holdings_read_each_configured_machines_effective_allocatable() {
        use crate::inventory::tests::machine;
        let mut inv = Inventory::new();
        // No allocatable reported: the profile's resources count (as in the engine).
        for i in 0..3 {
            let mut m = machine(&format!("r{i}"), MachineState::Configured);
            m.profile.resources = cpu(4);
            inv.upsert(m, 0);
        }
        let mut m = machine("g", MachineState::Configured);
        m.profile.resources = cpu(96);
        m.allocatable = ResourceVector::from_milli([("cpu", 90_000), ("nvidia.com/gpu", 8_000)]);
        inv.upsert(m, 0);
        // Draining and unbound machines provide nothing to the cluster's demand.
        let mut d = machine("d", MachineState::Draining);
        d.profile.resources = cpu(4);
        inv.upsert(d, 0);
        inv.upsert(machine("i", MachineState::Idle), 0);
        let h = holdings(&inv);
        assert_eq!(h.len(), 1);
        let c1 = &h["c1"];
        assert_eq!(c1.capacity.get("cpu"), 102_000);
        assert_eq!(c1.capacity.get("nvidia.com/gpu"), 8_000);
        assert_eq!(
            c1.providers,
            BTreeMap::from([("cpu".to_owned(), 4), ("nvidia.com/gpu".to_owned(), 1)])
        );
        assert_eq!(inv.draining_in("c1"), 1);
        assert!(inv.is_draining_in("d", "c1") && !inv.is_draining_in("d", "c2"));
    }

    #[test]
    fn requested_totals_sum_every_row() {
        let p = std::sync::Arc::new(bigfleet_model::Profile::new(
            vec![],
            vec![],
            1,
            bigfleet_model::PenaltyBucket::Zero,
            bigfleet_model::PenaltyBucket::Zero,
        ));
        let mut a = Need::new("c", p.clone());
        a.aggregate_resources = ResourceVector::from_milli([("cpu", 1500), ("memory", 7)]);
        let mut b = Need::new("c", p);
        b.aggregate_resources = ResourceVector::from_milli([("cpu", 500)]);
        let t = requested_totals(&[a, b]);
        assert_eq!((t.get("cpu"), t.get("memory")), (2000, 7));
    }

    #[test]
    fn audit_lines_parse_with_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let mut log = AuditLog::open(&path).unwrap();
        log.write(&AuditRecord::new(7, &reclaim("a", 1), "suppressed"));
        log.write(&AuditRecord::new(
            8,
            &Action::Release {
                machine_id: "r".into(),
            },
            "success",
        ));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        for field in [
            "time",
            "level",
            "msg",
            "cycle",
            "kind",
            "machine",
            "cluster",
            "reason",
            "grace_seconds",
            "outcome",
        ] {
            assert!(lines.iter().all(|l| l.get(field).is_some()), "{field}");
        }
        assert_eq!(lines[0]["kind"], "Reclaim");
        assert_eq!(lines[0]["grace_seconds"], 600.0);
        assert_eq!(lines[0]["reason"], "phase3.excess");
        assert_eq!(lines[1]["kind"], "Delete");
        assert_eq!(lines[1]["cycle"], 8);
        assert!(humantime::parse_rfc3339(lines[0]["time"].as_str().unwrap()).is_ok());
    }

    /// One cluster as the property test's model sees it: machine i is
    /// Configured, Draining until some time, or gone (drained).
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum M {
        Configured,
        DrainingUntil(i64),
        Gone,
    }

    struct Model {
        machines: Vec<M>,
    }

    impl Model {
        fn configured_count(&self) -> u64 {
            self.machines
                .iter()
                .filter(|m| **m == M::Configured)
                .count() as u64
        }
        fn draining_count(&self) -> usize {
            self.machines
                .iter()
                .filter(|m| matches!(m, M::DrainingUntil(_)))
                .count()
        }
        fn finish_drains(&mut self, now: i64) {
            for m in &mut self.machines {
                if matches!(m, M::DrainingUntil(t) if *t <= now) {
                    *m = M::Gone;
                }
            }
        }
    }

    impl ClusterOccupancy for Model {
        fn configured(&self, _: &str) -> u64 {
            self.configured_count()
        }
        fn draining(&self, _: &str) -> u64 {
            self.draining_count() as u64
        }
        fn is_draining_in(&self, machine: &str, _: &str) -> bool {
            machine
                .strip_prefix("a-m")
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|i| self.machines.get(i))
                .is_some_and(|m| matches!(m, M::DrainingUntil(_)))
        }
    }

    /// One reclaim start as the property test records it.
    struct Start {
        at: i64,
        /// The cluster's Configured + Draining machines just before it started.
        size_before: u64,
        machine: usize,
    }

    /// In use at `now`, from the record and the model alone: starts within
    /// the window, plus machines still Draining that started before it.
    fn in_use_by_record(starts: &[Start], model: &Model, now: i64, window: i64) -> u64 {
        let in_window = starts.iter().filter(|s| s.at > now - window).count();
        let older_draining = starts
            .iter()
            .filter(|s| s.at <= now - window)
            .filter(|s| matches!(model.machines[s.machine], M::DrainingUntil(_)))
            .count();
        (in_window + older_draining) as u64
    }

    proptest! {
        /// The cycle-time rail and the hand-out check driven together over
        /// random cycle timings (several cycles at one instant, as roll-ups
        /// wake them, up to minutes apart) and drain durations (some longer
        /// than the window). Checked only against the test's own record of
        /// when each reclaim started and what the model looked like then:
        /// 1. every window of 10 minutes holds at most the budget of the
        ///    cluster as it was when the window's first reclaim started (the
        ///    cluster only shrinks here, so that is the largest budget in the
        ///    window);
        /// 2. never more machines Draining at once than the budget;
        /// 3. nothing deferred without cause and nothing more: each cycle
        ///    keeps exactly what the budget minus what the record shows in
        ///    use leaves, and a worker asking for one more is refused exactly
        ///    when that is nothing;
        /// 4. the kept reclaims are the head of the engine's order.
        #[test]
        fn reclaims_respect_the_budget_over_every_window(
            configured in 1usize..300,
            fraction_pct in 1u32..30,
            steps in proptest::collection::vec((0i64..240, 0usize..40), 1..80),
            drains in proptest::collection::vec(0i64..1500, 300),
        ) {
            let cfg = RailsConfig {
                reclaim_budget_fraction: f64::from(fraction_pct) / 100.0,
                ..RailsConfig::default()
            };
            let w = 600 * SEC;
            let budget_of = |c: u64| ((cfg.reclaim_budget_fraction * c as f64).floor() as u64).max(1);
            let size = |m: &Model| m.configured_count() + m.draining_count() as u64;
            let mut model = Model { machines: vec![M::Configured; configured] };
            let mut rail = ReclaimBudget::new();
            let mut starts: Vec<Start> = Vec::new();
            let mut now = 0i64;
            for (dt, wanted) in steps {
                now += dt * SEC;
                model.finish_drains(now);
                // The engine asks to reclaim its first `wanted` Configured machines.
                let asked: Vec<Action> = (0..model.machines.len())
                    .filter(|&i| model.machines[i] == M::Configured)
                    .take(wanted)
                    .map(|i| reclaim("a", i))
                    .collect();
                rail.expire(now, cfg.reclaim_budget_window);
                let out = apply(&cfg, asked.clone(), &rail, &model);
                // 4
                prop_assert_eq!(&out.execute[..], &asked[..out.execute.len()]);
                prop_assert_eq!(out.capped, asked.len() - out.execute.len());
                // 3
                let free = budget_of(size(&model))
                    .saturating_sub(in_use_by_record(&starts, &model, now, w));
                prop_assert_eq!(out.execute.len() as u64, free.min(asked.len() as u64));
                // Workers take every kept reclaim at once.
                for a in out.execute {
                    prop_assert!(rail.admits(&cfg, &a, &model));
                    rail.spend("a", a.machine_id(), now);
                    let i: usize = a.machine_id()[3..].parse().unwrap();
                    starts.push(Start { at: now, size_before: size(&model), machine: i });
                    model.machines[i] = M::DrainingUntil(now + drains[i] * SEC);
                    // 2
                    prop_assert!(model.draining_count() as u64 <= budget_of(configured as u64));
                }
                // 3, at hand-out: one more at the same instant.
                if let Some(next) = (0..model.machines.len()).find(|&i| model.machines[i] == M::Configured) {
                    let full = in_use_by_record(&starts, &model, now, w)
                        >= budget_of(size(&model));
                    prop_assert_eq!(rail.admits(&cfg, &reclaim("a", next), &model), !full);
                }
            }
            // 1: every window, anchored at each start (a window holding the
            // most starts can always be slid right until a start opens it).
            for (i, s) in starts.iter().enumerate() {
                let n = starts[i..].iter().take_while(|x| x.at < s.at + w).count() as u64;
                let b = budget_of(s.size_before);
                prop_assert!(n <= b, "{} reclaims in the window from {}s, budget {}", n, s.at / SEC, b);
            }
        }
    }
}
