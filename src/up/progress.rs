//! What `bigfleet up` shows every second and prints at the end, and how it is drawn.
//!
//! Every figure is read over the mesh's gRPC except one: machines by state and configured
//! machines per cluster come from the providers' `List`; needs, needs met, unmet needs
//! and cycles from each shard's `ShardInfo.Describe`. Executed actions are counted only
//! by execute's outcome counter (`bigfleet_shard_action_execute_outcomes_total`): no RPC
//! carries them (decide forgets an action once it is done), so that one figure still
//! comes from execute's `/metrics`.
//!
//! On a terminal the line is redrawn in place (indicatif); otherwise, for scripts and
//! tests that parse it, each sample is one plain line on stderr.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use bigfleet_proto::mesh::v1 as meshpb;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::local::{Mesh, count_by_state};

/// The figures a [`Snapshot`] reads and the end-of-run [`Summary`] reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MeshCounts {
    /// Machines per state over every provider (`CONFIGURED`, `IDLE`, ...).
    pub machines_by_state: BTreeMap<String, u64>,
    /// Configured machines per cluster.
    pub configured_by_cluster: BTreeMap<String, u64>,
    /// Demand rows held by the shards and how many the last cycle satisfied.
    pub needs: u64,
    pub needs_satisfied: u64,
    /// Actions the execute workers finished (any outcome).
    pub actions_executed: u64,
    /// Of those, successful.
    pub actions_succeeded: u64,
    /// Decision cycles run, summed over shards.
    pub cycles: u64,
}

/// One look at the mesh.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    #[serde(flatten)]
    pub counts: MeshCounts,
    /// Demand rows the shards' last cycles left unmet (`Describe`'s `unmet_needs`,
    /// summed over shards).
    pub shortfalls: u64,
    /// Unmet demand rows per shard (`shard-<i>`), as [`Snapshot::shortfalls`] sums them.
    pub shortfalls_by_shard: BTreeMap<String, u64>,
    /// With several shards: the coordinator's transfers (ADR-0139).
    pub transfers: Option<TransferCounts>,
    /// What could not be read this time.
    pub problems: Vec<String>,
}

/// The coordinator's transfers as `up` counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TransferCounts {
    /// Finished transfers that moved machines to their recipient.
    pub moved: u64,
    /// Finished cross-shard drains.
    pub drains: u64,
    /// Transfers in flight.
    pub active: u64,
}

impl TransferCounts {
    pub fn of(v: &svc_inspect::view::TransfersView) -> Self {
        let (moved, drains) = v.counts();
        Self {
            moved: moved as u64,
            drains: drains as u64,
            active: v.active.len() as u64,
        }
    }
}

impl Snapshot {
    pub fn configured(&self) -> u64 {
        self.counts
            .machines_by_state
            .get("CONFIGURED")
            .copied()
            .unwrap_or(0)
    }

    pub fn total_machines(&self) -> u64 {
        self.counts.machines_by_state.values().sum()
    }
}

/// Reads the mesh (each source independently; failures become `problems`).
pub async fn sample(mesh: &Mesh) -> Snapshot {
    let mut snap = Snapshot::default();
    let shards = mesh.ports().shards.len();
    let mut all = Vec::new();
    for i in 0..shards {
        // One shared provider lists every shard's machines: count them once.
        if i == 0 || !mesh.spec().shared_provider {
            match mesh.list_machines(i).await {
                Ok(m) => all.extend(m),
                Err(e) => snap.problems.push(format!("provider of shard-{i}: {e}")),
            }
        }
        match mesh.describe(i).await {
            Ok(d) => {
                snap.add_description(&d);
                snap.shortfalls_by_shard.insert(
                    format!("shard-{i}"),
                    u64::try_from(d.unmet_needs).unwrap_or(0),
                );
            }
            Err(e) => snap.problems.push(format!("shard-{i} Describe: {e}")),
        }
        match mesh.metrics(&format!("shard-{i}-execute")).await {
            Ok(m) => {
                let name = "bigfleet_shard_action_execute_outcomes_total";
                snap.counts.actions_executed += super::probe::sum(&m, name, &[]) as u64;
                snap.counts.actions_succeeded +=
                    super::probe::sum(&m, name, &[("outcome", "success")]) as u64;
            }
            Err(e) => snap.problems.push(format!("shard-{i}-execute: {e}")),
        }
    }
    if shards > 1 {
        match super::demo::transfers(mesh).await {
            Ok(v) => snap.transfers = Some(TransferCounts::of(&v)),
            Err(e) => snap.problems.push(format!("coordinator transfers: {e}")),
        }
    }
    snap.counts.machines_by_state = count_by_state(&all);
    for m in &all {
        if m.state == bigfleet_proto::v1alpha1::MachineState::Configured as i32 {
            *snap
                .counts
                .configured_by_cluster
                .entry(m.cluster.clone())
                .or_default() += 1;
        }
    }
    snap
}

impl Snapshot {
    /// Adds one shard's `Describe`. A shard that has not finished a cycle yet (a fresh or
    /// restarted decide) has judged none of its rows, so none of them counts as met.
    fn add_description(&mut self, d: &meshpb::ShardDescription) {
        let count = |n: i32| u64::try_from(n).unwrap_or(0);
        let (needs, unmet) = (count(d.needs), count(d.unmet_needs));
        self.counts.needs += needs;
        if d.cycle > 0 {
            self.counts.needs_satisfied += needs.saturating_sub(unmet);
        }
        self.shortfalls += unmet;
        self.counts.cycles += u64::try_from(d.cycle).unwrap_or(0);
    }
}

/// Where progress lines go: redrawn in place on a terminal, plain lines otherwise. Other
/// messages go through [`ProgressView::println`] so they scroll above the live line
/// instead of being overwritten by it.
#[derive(Debug)]
pub struct ProgressView {
    bar: Option<ProgressBar>,
}

impl ProgressView {
    /// In place when stderr (where progress goes) is a terminal.
    pub fn new() -> Self {
        Self::with_terminal(std::io::stderr().is_terminal())
    }

    /// Plain lines whatever stderr is (`--quiet`: only messages, no live line to keep).
    pub fn plain() -> Self {
        Self::with_terminal(false)
    }

    fn with_terminal(terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(ProgressStyle::with_template("{msg}").expect("static template"));
            bar
        });
        Self { bar }
    }

    /// Whether lines are redrawn in place.
    pub fn in_place(&self) -> bool {
        self.bar.is_some()
    }

    /// Shows the current progress line.
    pub fn show(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(line.to_owned()),
            None => eprintln!("{line}"),
        }
    }

    /// Prints a message that stays (above the live line on a terminal).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    /// Leaves the last progress line on screen and stops redrawing.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

impl Default for ProgressView {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ProgressView {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One progress line: `elapsed`, the snapshot, actions per second since `previous`.
pub fn render(
    elapsed: Duration,
    snap: &Snapshot,
    previous: Option<(&Snapshot, Duration)>,
    operators: (usize, usize),
) -> String {
    let st = |k: &str| snap.counts.machines_by_state.get(k).copied().unwrap_or(0);
    let transitional = st("CREATING") + st("CONFIGURING") + st("DRAINING") + st("DELETING");
    let rate = match previous {
        Some((p, dt)) if !dt.is_zero() => {
            snap.counts
                .actions_executed
                .saturating_sub(p.counts.actions_executed) as f64
                / dt.as_secs_f64()
        }
        _ => 0.0,
    };
    let mut line = format!(
        "[{:>5}s] machines {}: configured {} · idle {} · speculative {} · in transition {} · failed {} | needs met {}/{} | shortfalls {} | actions {:.1}/s ({} total) | operators {}/{} connected",
        elapsed.as_secs(),
        snap.total_machines(),
        st("CONFIGURED"),
        st("IDLE"),
        st("SPECULATIVE"),
        transitional,
        st("FAILED"),
        snap.counts.needs_satisfied,
        snap.counts.needs,
        snap.shortfalls,
        rate,
        snap.counts.actions_executed,
        operators.0,
        operators.1,
    );
    if let Some(t) = &snap.transfers {
        line.push_str(&format!(
            " | transfers {} done, {} in flight · drains {}",
            t.moved, t.active, t.drains
        ));
    }
    if !snap.problems.is_empty() {
        line.push_str(&format!(" | unreadable: {}", snap.problems.len()));
    }
    line
}

/// The one-line JSON `bigfleet up --duration` prints at the end.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Machines Configured at the end.
    pub configured: u64,
    pub shortfalls: u64,
    #[serde(flatten)]
    pub counts: MeshCounts,
    /// Children that crash-looped (up gave up on them) + operator errors (failed connects,
    /// lost sessions, rejected or unapplied roll-ups) + sources unreadable at the end.
    pub errors: u64,
    /// Every child crash, in order (a restarted child appears once per crash).
    pub crashed: Vec<String>,
    /// Successful restarts of crashed children.
    pub restarts: u64,
    pub elapsed_seconds: f64,
    pub shards: usize,
    pub clusters: usize,
    pub operators: usize,
    pub run_dir: String,
    /// `--chaos`: the kills and whether the invariants held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chaos: Option<super::chaos::ChaosReport>,
    /// With several shards: finished transfers that moved machines (ADR-0139).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfers: Option<u64>,
    /// With several shards: finished cross-shard drains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_shard_drains: Option<u64>,
    /// With several shards: unmet demand rows per shard at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shortfalls_by_shard: Option<BTreeMap<String, u64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_rates_and_states() {
        let mut a = Snapshot::default();
        a.counts.machines_by_state.insert("CONFIGURED".into(), 3);
        a.counts.machines_by_state.insert("IDLE".into(), 2);
        a.counts.machines_by_state.insert("CONFIGURING".into(), 1);
        a.counts.actions_executed = 10;
        a.counts.needs = 4;
        a.counts.needs_satisfied = 3;
        let mut b = a.clone();
        b.counts.actions_executed = 30;
        let line = render(
            Duration::from_secs(7),
            &b,
            Some((&a, Duration::from_secs(2))),
            (2, 3),
        );
        assert!(line.contains("machines 6"), "{line}");
        assert!(line.contains("configured 3"), "{line}");
        assert!(line.contains("in transition 1"), "{line}");
        assert!(line.contains("needs met 3/4"), "{line}");
        assert!(line.contains("actions 10.0/s (30 total)"), "{line}");
        assert!(line.contains("operators 2/3"), "{line}");
        assert_eq!(b.configured(), 3);
        // One shard: no transfer segment.
        assert!(!line.contains("transfers"), "{line}");
        b.transfers = Some(TransferCounts {
            moved: 2,
            drains: 1,
            active: 1,
        });
        let line = render(Duration::from_secs(8), &b, None, (2, 3));
        assert!(
            line.contains("| transfers 2 done, 1 in flight · drains 1"),
            "{line}"
        );
    }

    #[test]
    fn the_summary_line_keeps_its_counts_at_the_top_level() {
        let mut counts = MeshCounts {
            needs: 4,
            needs_satisfied: 3,
            cycles: 9,
            ..MeshCounts::default()
        };
        counts.machines_by_state.insert("IDLE".into(), 2);
        let summary = Summary {
            configured: 0,
            shortfalls: 1,
            counts,
            errors: 0,
            crashed: Vec::new(),
            restarts: 0,
            elapsed_seconds: 1.0,
            shards: 1,
            clusters: 1,
            operators: 1,
            run_dir: "/tmp/up".into(),
            chaos: None,
            transfers: None,
            cross_shard_drains: None,
            shortfalls_by_shard: None,
        };
        let v = serde_json::to_value(&summary).unwrap();
        assert!(v.get("counts").is_none(), "{v}");
        assert_eq!(v["needs"], 4);
        assert_eq!(v["needs_satisfied"], 3);
        assert_eq!(v["cycles"], 9);
        assert_eq!(v["machines_by_state"]["IDLE"], 2);
    }

    #[test]
    fn describe_feeds_needs_shortfalls_and_cycles() {
        let mut s = Snapshot::default();
        s.add_description(&meshpb::ShardDescription {
            cycle: 12,
            needs: 5,
            unmet_needs: 2,
            ..Default::default()
        });
        // A decide that has not cycled yet has met nothing, whatever it holds.
        s.add_description(&meshpb::ShardDescription {
            cycle: 0,
            needs: 4,
            unmet_needs: 0,
            ..Default::default()
        });
        assert_eq!((s.counts.needs, s.counts.needs_satisfied), (9, 3));
        assert_eq!(s.shortfalls, 2);
        assert_eq!(s.counts.cycles, 12);
    }

    #[test]
    fn a_pipe_gets_plain_lines_and_a_terminal_an_in_place_line() {
        assert!(!ProgressView::with_terminal(false).in_place());
        let tty = ProgressView::with_terminal(true);
        assert!(tty.in_place());
        tty.show("[    1s] machines 0");
        assert_eq!(
            tty.bar.as_ref().map(|b| b.message()).as_deref(),
            Some("[    1s] machines 0")
        );
    }
}
