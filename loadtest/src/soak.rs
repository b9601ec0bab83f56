//! The soak (`e2e-bench --soak-cycles N`): an in-process shard driven through many cycles
//! of churning demand, then settled and checked for what a long run leaks.
//!
//! Churn: every operator redraws its units within ±spread on every roll-up (roll-ups every
//! `churn_every` cycles), so machines are bootstrapped, provisioned from Speculative,
//! reclaimed and released again all the time. At the end the churning operators are
//! replaced by steady ones (a reconnect with a resync), the shard is given time to settle,
//! and the checks run:
//!
//! * **phantom records** — decide's inventory per state must equal the provider's, and
//!   every machine an operator was told is Configured must be Configured for that cluster
//!   at the provider (and the reverse);
//! * **stuck transitional** — no machine Creating / Configuring / Draining / Deleting, none
//!   Failed, no action queued or in flight;
//! * **RSS flat** — resident memory after the first tenth of the run versus the end.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bigfleet_proto::v1alpha1 as pb;
use serde::Serialize;

use crate::demand::Churn;
use crate::e2e::{HarnessError, InProcessShard, ShardConfig, round3, unit_catalog, unit_demand};
use crate::gateway_load::rss_mb;
use crate::operator::OperatorHandle;

/// Soak settings.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    pub cycles: u64,
    pub clusters: u32,
    /// Base units per cluster (churn moves it by ±spread).
    pub units_per_cluster: u32,
    pub spread: f64,
    pub cycle_interval: Duration,
    /// Roll-ups (and so demand changes) every this many cycles.
    pub churn_every: u32,
    /// Idle machines and Speculative slots in the catalog.
    pub idle: u32,
    pub speculative: u32,
    /// Bound on the settle phase.
    pub settle_timeout: Duration,
}

impl Default for SoakConfig {
    fn default() -> Self {
        Self {
            cycles: 10_000,
            clusters: 8,
            units_per_cluster: 30,
            spread: 0.5,
            cycle_interval: Duration::from_millis(5),
            churn_every: 5,
            idle: 200,
            speculative: 200,
            settle_timeout: Duration::from_secs(60),
        }
    }
}

/// What the soak prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SoakReport {
    pub cycles: u64,
    pub seconds: f64,
    pub clusters: u32,
    pub machines: usize,
    pub rollups_sent: u64,
    pub actions_executed: u64,
    pub actions_succeeded: u64,
    pub cycle_p99_ms: f64,
    /// Decide's counts per state that differ from the provider's: state → (decide, provider).
    pub inventory_mismatch: BTreeMap<String, (u64, u64)>,
    /// Machines an operator believes Configured for it that the provider does not, plus
    /// the reverse.
    pub phantom_records: usize,
    /// Up to ten of them: what the operator was told versus the provider.
    pub phantom_examples: Vec<String>,
    /// Machines in a transitional state after settling.
    pub stuck_transitional: usize,
    pub failed: usize,
    /// Actions queued / in flight at decide after settling.
    pub actions_pending: (usize, usize),
    pub settled: bool,
    pub rss_mb_after_warmup: f64,
    pub rss_mb_end: f64,
    pub rss_flat: bool,
    pub ok: bool,
}

fn transitional(state: i32) -> bool {
    [
        pb::MachineState::Creating,
        pb::MachineState::Configuring,
        pb::MachineState::Draining,
        pb::MachineState::Deleting,
    ]
    .iter()
    .any(|s| *s as i32 == state)
}

fn state_name(state: i32) -> String {
    pb::MachineState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("MACHINE_STATE_")
                .to_owned()
        })
        .unwrap_or_else(|_| state.to_string())
}

fn start_operators(
    shard: &InProcessShard,
    cfg: &SoakConfig,
    churn: Option<Churn>,
) -> Vec<OperatorHandle> {
    let period = cfg.cycle_interval * cfg.churn_every.max(1);
    (0..cfg.clusters)
        .map(|c| {
            shard.operator(
                &format!("soak-{c}"),
                unit_demand(cfg.units_per_cluster, 100 + i32::try_from(c).unwrap_or(0)),
                period.max(Duration::from_millis(10)),
                churn,
            )
        })
        .collect()
}

async fn stop(ops: Vec<OperatorHandle>) -> u64 {
    let sent = ops.iter().map(|o| o.stats().rollups_sent).sum();
    for o in &ops {
        o.stop();
    }
    for o in ops {
        o.join().await;
    }
    sent
}

/// Runs the soak and the end checks.
pub async fn run_soak(cfg: &SoakConfig) -> Result<SoakReport, HarnessError> {
    let mut shard_cfg = ShardConfig::new(unit_catalog(cfg.idle, cfg.speculative));
    shard_cfg.cycle_interval = cfg.cycle_interval;
    let shard = InProcessShard::start(shard_cfg).await?;
    let started = Instant::now();
    let churning = start_operators(
        &shard,
        cfg,
        Some(Churn {
            probability: 1.0,
            spread: cfg.spread,
        }),
    );
    let pid = std::process::id();
    let c0 = shard.cycles();
    let warmup_at = c0 + (cfg.cycles / 10).max(1);
    let mut rss_warm = None;
    while shard.cycles() < c0 + cfg.cycles {
        if rss_warm.is_none() && shard.cycles() >= warmup_at {
            rss_warm = rss_mb(pid);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut rollups_sent = stop(churning).await;

    // Settle: steady demand through fresh sessions (exercising resync), then quiet.
    let steady = start_operators(&shard, cfg, None);
    let settle_deadline = Instant::now() + cfg.settle_timeout;
    let mut settled = false;
    while Instant::now() < settle_deadline {
        let quiet = shard.decide().action_counts() == (0, 0);
        let machines = shard.provider_machines();
        let moving = machines.iter().any(|m| transitional(m.state));
        let all_met = {
            let v = shard.decide().verdicts();
            !v.rows.is_empty() && v.rows.iter().all(|r| r.verdict.satisfied)
        };
        let connected = steady.iter().all(OperatorHandle::is_connected);
        if quiet && !moving && all_met && connected {
            // Twice in a row, a few cycles apart: not just a lull.
            tokio::time::sleep(cfg.cycle_interval * 20).await;
            if shard.decide().action_counts() == (0, 0)
                && !shard
                    .provider_machines()
                    .iter()
                    .any(|m| transitional(m.state))
            {
                settled = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give the last NodeStateUpdates a moment to reach the operators.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let machines = shard.provider_machines();
    let mut provider_by_state: BTreeMap<String, u64> = BTreeMap::new();
    for m in &machines {
        *provider_by_state.entry(state_name(m.state)).or_default() += 1;
    }
    let decide_by_state: BTreeMap<String, u64> = shard
        .decide()
        .machines_by_state()
        .await
        .into_iter()
        .map(|(s, n)| (state_name(i32::from(s.ordinal())), n))
        .collect();
    let mut inventory_mismatch = BTreeMap::new();
    let keys: BTreeSet<&String> = provider_by_state
        .keys()
        .chain(decide_by_state.keys())
        .collect();
    for k in keys {
        let (d, p) = (
            decide_by_state.get(k).copied().unwrap_or(0),
            provider_by_state.get(k).copied().unwrap_or(0),
        );
        if d != p {
            inventory_mismatch.insert(k.clone(), (d, p));
        }
    }
    let mut phantom_records = 0usize;
    let mut phantom_examples = Vec::new();
    for op in &steady {
        let believed: BTreeSet<String> = op
            .nodes()
            .into_iter()
            .filter(|(_, v)| v.state == Some(crate::MachineState::Configured))
            .map(|(id, _)| id)
            .collect();
        let actual: BTreeSet<String> = machines
            .iter()
            .filter(|m| {
                m.state == pb::MachineState::Configured as i32 && m.cluster == op.cluster_id()
            })
            .map(|m| m.id.clone())
            .collect();
        for id in believed.symmetric_difference(&actual) {
            phantom_records += 1;
            if phantom_examples.len() < 10 {
                let told = op.nodes().get(id).map(|v| (v.state, v.seq));
                let real = machines
                    .iter()
                    .find(|m| &m.id == id)
                    .map(|m| format!("{}/{}", state_name(m.state), m.cluster));
                phantom_examples.push(format!(
                    "{} {id}: operator {told:?}, provider {real:?}",
                    op.cluster_id()
                ));
            }
        }
    }
    let stuck_transitional = machines.iter().filter(|m| transitional(m.state)).count();
    let failed = machines
        .iter()
        .filter(|m| m.state == pb::MachineState::Failed as i32)
        .count();
    let actions_pending = shard.decide().action_counts();
    let rss_end = rss_mb(pid).unwrap_or(0.0);
    let rss_warm = rss_warm.unwrap_or(rss_end);
    // Flat: within a quarter of the warmed-up footprint (or 32 MiB, whichever is larger).
    let rss_flat = rss_end <= rss_warm + (rss_warm * 0.25).max(32.0);
    let (executed, succeeded) = shard.actions_executed();
    let cycles = shard.cycles() - c0;
    let cycle_p99_ms = round3(shard.cycle_p99_ms());
    rollups_sent += stop(steady).await;
    shard.shutdown().await;
    let ok = settled
        && inventory_mismatch.is_empty()
        && phantom_records == 0
        && stuck_transitional == 0
        && failed == 0
        && actions_pending == (0, 0)
        && rss_flat;
    Ok(SoakReport {
        cycles,
        seconds: round3(started.elapsed().as_secs_f64()),
        clusters: cfg.clusters,
        machines: machines.len(),
        rollups_sent,
        actions_executed: executed,
        actions_succeeded: succeeded,
        cycle_p99_ms,
        inventory_mismatch,
        phantom_records,
        phantom_examples,
        stuck_transitional,
        failed,
        actions_pending,
        settled,
        rss_mb_after_warmup: round3(rss_warm),
        rss_mb_end: round3(rss_end),
        rss_flat,
        ok,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_soak_leaves_nothing_behind() {
        let report = run_soak(&SoakConfig {
            cycles: 150,
            clusters: 3,
            units_per_cluster: 8,
            idle: 16,
            speculative: 16,
            cycle_interval: Duration::from_millis(10),
            settle_timeout: Duration::from_secs(30),
            ..SoakConfig::default()
        })
        .await
        .unwrap();
        assert!(report.cycles >= 150, "{report:?}");
        assert!(report.actions_executed > 0, "{report:?}");
        assert!(report.settled, "{report:?}");
        assert!(report.inventory_mismatch.is_empty(), "{report:?}");
        assert_eq!(report.phantom_records, 0, "{report:?}");
        assert_eq!(report.stuck_transitional, 0, "{report:?}");
        assert_eq!(report.machines, 32);
    }
}
