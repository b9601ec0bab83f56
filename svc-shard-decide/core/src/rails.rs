//! Safety rails at the actuation and ingest boundary (ARCHITECTURE.md §5.7).
//!
//! None of these change what the engine decides; they only govern what crosses
//! from decision to execution (reclaim cap, kill switch, dry-run, per-cycle
//! action limit) and what a roll-up may do to the NeedsTable (quarantine).

use bigfleet_model::{Action, ActionKind};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Quarantine only considers clusters whose accepted baseline had at least this many rows.
pub const QUARANTINE_MIN_BASELINE_ROWS: usize = 10;
/// A roll-up keeping fewer than this fraction of the baseline rows is suspicious.
pub const QUARANTINE_FRACTION: f64 = 0.1;
/// The n-th consecutive suspicious roll-up is accepted.
pub const QUARANTINE_CONFIRMATIONS: u32 = 3;
/// Production default of `--reclaim-cap-fraction`.
pub const DEFAULT_RECLAIM_CAP_FRACTION: f64 = 0.05;

/// Rail configuration (flags of the binary).
#[derive(Debug, Clone, PartialEq)]
pub struct RailsConfig {
    /// Kill switch: decide everything, execute nothing.
    pub actuation_paused: bool,
    /// Shadow mode: decide and log everything, execute nothing.
    pub dry_run: bool,
    /// Reclaims per cluster per cycle ≤ max(1, ⌊f·C⌋); 0 disables.
    pub reclaim_cap_fraction: f64,
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
            reclaim_cap_fraction: DEFAULT_RECLAIM_CAP_FRACTION,
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
            reclaim_cap_fraction: 0.0,
            empty_rollup_guard: false,
            ..RailsConfig::default()
        }
    }
}

/// The per-cluster reclaim cap: `max(1, ⌊fraction × configured⌋)`, `None` when disabled.
pub fn reclaim_cap(fraction: f64, configured: u64) -> Option<u64> {
    (fraction > 0.0).then(|| ((fraction * configured as f64).floor() as u64).max(1))
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
    /// Reclaims deferred by the cap (they re-derive next cycle).
    pub capped: usize,
    /// Actions cut by `max_actions_per_cycle`.
    pub deferred: usize,
    /// Whether a follow-up cycle should run right away (only for truncation).
    pub follow_up: bool,
}

/// Applies the actuation rails to one cycle's actions. `configured_in(c)` is
/// cluster `c`'s Configured count in this cycle's snapshot.
pub fn apply(
    cfg: &RailsConfig,
    actions: Vec<Action>,
    configured_in: impl Fn(&str) -> u64,
) -> RailsOutcome {
    let mut out = RailsOutcome::default();
    // Pause wins over dry-run; cap and truncation are skipped under both:
    // nothing executes, so there is no drain rate to bound and a truncation
    // would only busy-loop follow-up cycles.
    if cfg.actuation_paused {
        out.suppressed = actions;
        return out;
    }
    if cfg.dry_run {
        out.dry_run = actions;
        return out;
    }
    let mut kept: FxHashMap<String, u64> = FxHashMap::default();
    let mut caps: FxHashMap<String, Option<u64>> = FxHashMap::default();
    let mut execute = Vec::with_capacity(actions.len());
    for a in actions {
        if a.kind() == ActionKind::Reclaim {
            let cluster = a.cluster();
            let cap = *caps
                .entry(cluster.to_owned())
                .or_insert_with(|| reclaim_cap(cfg.reclaim_cap_fraction, configured_in(cluster)));
            if let Some(cap) = cap {
                let n = kept.entry(cluster.to_owned()).or_default();
                // Keep the head of Phase 3's emission order (its release
                // order), defer the tail.
                if *n >= cap {
                    out.capped += 1;
                    continue;
                }
                *n += 1;
            }
        }
        execute.push(a);
    }
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
}

#[derive(Debug, Default, Clone, Copy)]
struct GuardState {
    baseline: usize,
    held: u32,
}

/// Empty-roll-up quarantine: a roll-up keeping fewer than 10% of a ≥10-row
/// baseline is held until the third consecutive such roll-up confirms it.
/// Baselines live in memory only, so the first roll-up after a restart is
/// always accepted.
#[derive(Debug, Default)]
pub struct QuarantineGuard {
    enabled: bool,
    clusters: FxHashMap<String, GuardState>,
}

impl QuarantineGuard {
    pub fn new(enabled: bool) -> Self {
        QuarantineGuard {
            enabled,
            clusters: FxHashMap::default(),
        }
    }

    pub fn admit(&mut self, cluster: &str, rows: usize) -> Admission {
        let st = self.clusters.entry(cluster.to_owned()).or_default();
        let suspicious = self.enabled
            && st.baseline >= QUARANTINE_MIN_BASELINE_ROWS
            && (rows as f64) < QUARANTINE_FRACTION * st.baseline as f64;
        if !suspicious {
            *st = GuardState {
                baseline: rows,
                held: 0,
            };
            return Admission::Accept;
        }
        st.held += 1;
        if st.held >= QUARANTINE_CONFIRMATIONS {
            *st = GuardState {
                baseline: rows,
                held: 0,
            };
            return Admission::AcceptConfirmed;
        }
        Admission::Hold(st.held)
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
    use std::time::Duration;

    fn reclaim(cluster: &str, i: usize) -> Action {
        Action::Reclaim {
            machine_id: format!("{cluster}-m{i:04}"),
            cluster: cluster.to_owned(),
            grace: Duration::from_secs(600),
        }
    }

    #[test]
    fn cap_formula() {
        assert_eq!(reclaim_cap(0.0, 1000), None);
        assert_eq!(reclaim_cap(0.05, 0), Some(1));
        assert_eq!(reclaim_cap(0.05, 19), Some(1));
        assert_eq!(reclaim_cap(0.05, 40), Some(2));
        assert_eq!(reclaim_cap(0.05, 1000), Some(50));
    }

    #[test]
    fn cap_keeps_head_per_cluster_and_leaves_other_kinds() {
        let mut actions: Vec<Action> = (0..5).map(|i| reclaim("a", i)).collect();
        actions.extend((0..3).map(|i| reclaim("b", i)));
        actions.push(Action::Release {
            machine_id: "r".into(),
        });
        let cfg = RailsConfig {
            reclaim_cap_fraction: 0.05,
            ..RailsConfig::default()
        };
        let out = apply(&cfg, actions, |c| if c == "a" { 40 } else { 10 });
        let ids: Vec<_> = out
            .execute
            .iter()
            .map(|a| a.machine_id().to_owned())
            .collect();
        assert_eq!(ids, ["a-m0000", "a-m0001", "b-m0000", "r"]);
        assert_eq!(out.capped, 5);
        assert!(!out.follow_up);
    }

    #[test]
    fn pause_wins_over_dry_run_and_skips_cap() {
        let actions: Vec<Action> = (0..5).map(|i| reclaim("a", i)).collect();
        let cfg = RailsConfig {
            actuation_paused: true,
            dry_run: true,
            max_actions_per_cycle: 1,
            ..RailsConfig::default()
        };
        let out = apply(&cfg, actions.clone(), |_| 10);
        assert_eq!(out.suppressed.len(), 5);
        assert!(out.execute.is_empty() && out.dry_run.is_empty());
        assert_eq!((out.capped, out.deferred, out.follow_up), (0, 0, false));
        let cfg = RailsConfig {
            dry_run: true,
            ..cfg
        };
        let cfg = RailsConfig {
            actuation_paused: false,
            ..cfg
        };
        let out = apply(&cfg, actions, |_| 10);
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
        let out = apply(&cfg, actions, |_| 0);
        assert_eq!(out.execute.len(), 2);
        assert_eq!(out.deferred, 3);
        assert!(out.follow_up);
    }

    #[test]
    fn quarantine_holds_two_and_accepts_third() {
        let mut g = QuarantineGuard::new(true);
        assert_eq!(g.admit("a", 20), Admission::Accept);
        assert_eq!(g.admit("a", 1), Admission::Hold(1));
        assert_eq!(g.held("a"), 1);
        assert_eq!(g.admit("a", 0), Admission::Hold(2));
        assert_eq!(g.admit("a", 0), Admission::AcceptConfirmed);
        assert_eq!(g.held("a"), 0);
        // The baseline is now 0: anything goes.
        assert_eq!(g.admit("a", 0), Admission::Accept);
    }

    #[test]
    fn quarantine_resets_on_normal_rollup_and_ignores_small_baselines() {
        let mut g = QuarantineGuard::new(true);
        g.admit("a", 100);
        assert_eq!(g.admit("a", 9), Admission::Hold(1));
        // 10 of 100 is not < 10%: accepted, resets the streak.
        assert_eq!(g.admit("a", 10), Admission::Accept);
        assert_eq!(g.held("a"), 0);
        g.admit("b", 9);
        assert_eq!(g.admit("b", 0), Admission::Accept);
        let mut off = QuarantineGuard::new(false);
        off.admit("a", 100);
        assert_eq!(off.admit("a", 0), Admission::Accept);
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

    proptest! {
        /// Σ over k cycles of executed reclaims per cluster ≤ k·max(1,⌊f·C⌋).
        #[test]
        fn reclaims_over_k_cycles_stay_under_cap(
            configured in 0u64..400,
            wanted in 0usize..200,
            k in 1usize..10,
        ) {
            let cfg = RailsConfig::default();
            let cap = reclaim_cap(cfg.reclaim_cap_fraction, configured).unwrap();
            let mut total = 0u64;
            let mut remaining = wanted;
            for _ in 0..k {
                let actions: Vec<Action> = (0..remaining).map(|i| reclaim("a", i)).collect();
                let out = apply(&cfg, actions, |_| configured);
                let n = out.execute.len();
                prop_assert!(n as u64 <= cap);
                prop_assert_eq!(out.capped, remaining - n);
                total += n as u64;
                remaining -= n;
            }
            prop_assert!(total <= k as u64 * cap);
        }
    }
}
