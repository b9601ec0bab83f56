//! `cycle-bench`: times the decision engine on a synthetic rung.
//!
//! `cargo run --release -p bigfleet-decision --bin cycle-bench -- --rung uber-5k --json`

use anyhow::{Context, bail};
use bigfleet_decision::CycleOptions;
use bigfleet_decision::synth::{RUNGS, measure, rung};
use clap::Parser;
use std::io::Write;

/// Time decision cycles (snapshot build included) on a synthetic fleet.
///
/// Rungs: aggregated-500k (500K machines, 50 clusters, 800 pinned needs, 10%
/// bound), reprovision-1to1 (500K machines, demand ≈ inventory, heavy churn),
/// uber-5k (20 clusters × 388 needs, 93% Same gangs, ~6K machines), uber-50k
/// (200 clusters × 213 needs, ~225K machines); the uber rungs are settled to a
/// steady state and churned 2%. See `bigfleet_decision::synth`.
///
/// Each cycle runs over a `Fleet` built once up front, as a shard maintains it
/// incrementally; the snapshot build from it is inside every timed cycle.
/// `floor_ms` is one plain pass over the machine slice in the same run.
#[derive(Parser, Debug)]
#[command(name = "cycle-bench", version)]
struct Args {
    /// aggregated-500k | reprovision-1to1 | uber-5k | uber-50k
    #[arg(long)]
    rung: String,
    /// Timed cycles (after two warm-up cycles).
    #[arg(long, default_value_t = 50)]
    cycles: usize,
    /// Engine threads (1 = sequential).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Also compute per-need verdicts.
    #[arg(long)]
    verdicts: bool,
    /// Change this many machines before each timed cycle (Idle ones get
    /// configured into a cluster, the others go back to Idle) and put back the
    /// previous cycle's (0 = an unchanged fleet). Times a cycle after the
    /// shard's fleet changed: the cached snapshot parts are patched, not rebuilt.
    #[arg(long, default_value_t = 0)]
    churn: usize,
    /// Print one JSON object (otherwise a human line).
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let Some(scenario) = rung(&args.rung) else {
        bail!("unknown rung {:?}; one of {}", args.rung, RUNGS.join(", "));
    };
    let opts = CycleOptions {
        threads: args.threads,
        verdicts: args.verdicts,
        ..CycleOptions::default()
    };
    let r = measure(&scenario, args.cycles, &opts, args.churn).context("running cycles")?;
    let mut out = std::io::stdout().lock();
    if args.json {
        // Field order as documented (serde_json's `json!` would sort keys).
        #[derive(serde::Serialize)]
        struct Line<'a> {
            rung: &'a str,
            machines: usize,
            needs: usize,
            clusters: usize,
            cycles: usize,
            p50_ms: f64,
            p99_ms: f64,
            max_ms: f64,
            floor_ms: f64,
            snapshot_bytes_per_machine: f64,
        }
        let v = serde_json::to_string(&Line {
            rung: &r.rung,
            machines: r.machines,
            needs: r.needs,
            clusters: r.clusters,
            cycles: r.cycles,
            p50_ms: r.p50_ms,
            p99_ms: r.p99_ms,
            max_ms: r.max_ms,
            floor_ms: r.floor_ms,
            snapshot_bytes_per_machine: r.snapshot_bytes_per_machine,
        })?;
        writeln!(out, "{v}")?;
    } else {
        writeln!(
            out,
            "{}: {} machines, {} needs, {} clusters, {} cycles: p50 {} ms, p99 {} ms, max {} ms, floor {} ms, {} B/machine, {} actions/cycle, fleet build {} ms (once)",
            r.rung,
            r.machines,
            r.needs,
            r.clusters,
            r.cycles,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.floor_ms,
            r.snapshot_bytes_per_machine,
            r.actions,
            r.fleet_build_ms
        )?;
        writeln!(out, "  last cycle: {}", serde_json::to_string(&r.stats)?)?;
        if !r.unmet.is_empty() {
            writeln!(out, "  unmet: {}", serde_json::to_string(&r.unmet)?)?;
        }
    }
    Ok(())
}
