//! `e2e-bench`: the scale harness — a whole shard in-process against an instant fake
//! provider. `--units N` measures time to Configure N single-machine units; `--soak-cycles N`
//! churns demand for N cycles and checks for leaked or stuck records.

use std::time::Duration;

use bigfleet_loadtest::e2e::{BenchConfig, run_bench};
use bigfleet_loadtest::soak::{SoakConfig, run_soak};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "e2e-bench")]
struct Cli {
    /// Single-machine units of demand (and Idle machines to satisfy them).
    #[arg(long, default_value_t = 1000)]
    units: u32,
    /// Run the soak instead: this many decision cycles with churning demand.
    #[arg(long)]
    soak_cycles: Option<u64>,
    /// Clusters (operators) sharing the demand.
    #[arg(long)]
    clusters: Option<u32>,
    /// Decide's cycle ticker (default 100ms for the bench, 5ms for the soak).
    #[arg(long, value_parser = humantime::parse_duration)]
    cycle_interval: Option<Duration>,
    /// Execute actions in flight.
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Give up on the bench after this long.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// One line of JSON instead of a human summary.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _telemetry = bigfleet_telemetry::init(&bigfleet_telemetry::TelemetryConfig::from_lookup(
        "e2e-bench",
        Default::default(),
        |k| {
            std::env::var(k)
                .ok()
                .or_else(|| (k == "RUST_LOG").then(|| "warn".to_owned()))
        },
    ))?;
    if let Some(cycles) = cli.soak_cycles {
        let mut cfg = SoakConfig {
            cycles,
            ..SoakConfig::default()
        };
        if let Some(c) = cli.clusters {
            cfg.clusters = c;
        }
        if let Some(i) = cli.cycle_interval {
            cfg.cycle_interval = i;
        }
        let r = run_soak(&cfg).await?;
        if cli.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "soak: {} cycles in {:.1}s over {} clusters, {} actions, cycle p99 {:.1} ms\n\
                 phantom records {}, stuck transitional {}, failed {}, inventory mismatches {}, \
                 pending actions {:?}, RSS {:.1} → {:.1} MiB ({}) — {}",
                r.cycles,
                r.seconds,
                r.clusters,
                r.actions_executed,
                r.cycle_p99_ms,
                r.phantom_records,
                r.stuck_transitional,
                r.failed,
                r.inventory_mismatch.len(),
                r.actions_pending,
                r.rss_mb_after_warmup,
                r.rss_mb_end,
                if r.rss_flat { "flat" } else { "GROWING" },
                if r.ok { "ok" } else { "FAILED" }
            );
        }
        anyhow::ensure!(r.ok, "soak checks failed");
        return Ok(());
    }
    let cfg = BenchConfig {
        units: cli.units,
        clusters: cli.clusters.unwrap_or(4),
        cycle_interval: cli.cycle_interval.unwrap_or(Duration::from_millis(100)),
        concurrency: cli.concurrency,
        timeout: cli.timeout,
    };
    let r = run_bench(&cfg).await?;
    if cli.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} units: {} configured in {} — {:.1} actions/s, cycle p99 {:.1} ms ({} cycles)",
            r.units,
            r.configured,
            r.seconds_to_all_configured
                .map_or_else(|| "(not all)".to_owned(), |s| format!("{s:.3}s")),
            r.actions_per_s,
            r.cycle_p99_ms,
            r.cycles
        );
    }
    anyhow::ensure!(
        r.configured >= u64::from(r.units),
        "only {} of {} units configured",
        r.configured,
        r.units
    );
    Ok(())
}
