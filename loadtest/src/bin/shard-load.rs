//! `shard-load`: the whole shard — fake provider, decide, execute and gateway as their real
//! binaries in separate processes — under N simulated operators; prints one JSON object.
//!
//! ```text
//! cargo build --release --bins
//! target/release/shard-load --operators 10000 --rollup-interval 2s --changed-fraction 0.1
//! ```

use std::path::PathBuf;
use std::time::Duration;

use bigfleet_loadtest::shard_load::{self, ShardLoadConfig};
use clap::Parser;

/// Benchmarks a whole shard on this machine (see `bigfleet_loadtest::shard_load`).
#[derive(Debug, Parser)]
#[command(name = "shard-load")]
struct Cli {
    /// Simulated operators (one cluster and one session each).
    #[arg(long, default_value_t = 1000)]
    operators: usize,
    /// Needs in each operator's roll-up.
    #[arg(long, default_value_t = 3)]
    needs_per_operator: usize,
    /// Machines in the fake provider.
    #[arg(long, default_value_t = 100_000)]
    machines: u64,
    /// Roll-up period of each operator.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    rollup_interval: Duration,
    /// Fraction of roll-ups that change demand; the rest are identical re-sends.
    #[arg(long, default_value_t = 0.1)]
    changed_fraction: f64,
    /// Load before the measurement window.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Measurement window.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// After the warm-up, wait at most this long for decide's action queue to drain.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    settle_timeout: Duration,
    /// Execute worker processes.
    #[arg(long, default_value_t = 1)]
    execute_workers: usize,
    /// decide's --cycle-interval.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    cycle_interval: Duration,
    /// decide's --incremental-reconcile (on here, as the original's scale harness does at
    /// 100 clusters and more; decide's own default is a full List every cycle).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    incremental_reconcile: bool,
    /// Directory holding bigfleet-shard-decide, bigfleet-session-gateway,
    /// bigfleet-shard-execute and bigfleet-fake-provider (default: next to this binary).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Keep sockets, the catalog and the services' logs here (default: a temporary
    /// directory, removed after a successful run).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Seed of the demand changes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Operator connection set-ups in flight at once during the ramp.
    #[arg(long, default_value_t = 256)]
    connect_concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let cfg = ShardLoadConfig {
        operators: cli.operators,
        needs_per_operator: cli.needs_per_operator,
        machines: cli.machines,
        rollup_interval: cli.rollup_interval,
        changed_fraction: cli.changed_fraction,
        warmup: cli.warmup,
        duration: cli.duration,
        settle_timeout: cli.settle_timeout,
        execute_workers: cli.execute_workers,
        cycle_interval: cli.cycle_interval,
        incremental_reconcile: cli.incremental_reconcile,
        bin_dir: cli.bin_dir,
        run_dir: cli.run_dir,
        seed: cli.seed,
        connect_concurrency: cli.connect_concurrency,
    };
    // On a signal the run is dropped, and with it every child process group (SIGKILL).
    let report = tokio::select! {
        r = shard_load::run(cfg, |line| eprintln!("shard-load: {line}")) => r?,
        () = bigfleet_mesh::stop_signal() => {
            eprintln!("shard-load: interrupted; every service process was killed");
            std::process::exit(130);
        }
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
