//! `e2e-bench`: the scale harness — a whole shard against an in-process fake provider.
//! `--units N` measures time to Configure N single-machine units (execute in-process, or
//! `--execute-processes N` separate worker processes; `--provider-latency` delays every
//! mutating provider call); `--soak-cycles N` churns demand for N cycles and checks for
//! leaked or stuck records. `e2e-bench execute-worker <flags>` is the execute service
//! itself (the worker processes' default command).

use std::time::Duration;

use bigfleet_loadtest::e2e::workers::EXECUTE_WORKER_ARG;
use bigfleet_loadtest::e2e::{BenchConfig, ExecuteMode, WorkerCommand, run_bench};
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
    /// Execute actions in flight, per worker pool (the service's default).
    #[arg(long, default_value_t = 64)]
    concurrency: u32,
    /// Run execute as this many separate worker processes (0: one pool in this process).
    #[arg(long, default_value_t = 0)]
    execute_processes: u32,
    /// Command of a worker process, e.g. `target/release/bigfleet-shard-execute` or
    /// `target/release/bigfleet svc shard-execute`; default: `<this binary> execute-worker`.
    #[arg(long)]
    execute_cmd: Option<String>,
    /// Delay before every mutating provider call (Create, Configure, Drain, Delete).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    provider_latency: Duration,
    /// Give up on the bench after this long.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// One line of JSON instead of a human summary.
    #[arg(long)]
    json: bool,
}

/// `e2e-bench execute-worker <flags>`: exactly `bigfleet-shard-execute <flags>`.
async fn execute_worker(argv: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    let args = svc_shard_execute::Args::parse_from(argv);
    let cfg = bigfleet_telemetry::TelemetryConfig::from_env(
        "bigfleet-shard-execute",
        args.service.log.log_format,
    );
    let _telemetry = bigfleet_telemetry::init(&cfg)?;
    svc_shard_execute::run(args).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == EXECUTE_WORKER_ARG) {
        argv.remove(1);
        return execute_worker(argv).await;
    }
    let cli = Cli::parse_from(argv);
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
    let execute = if cli.execute_processes == 0 {
        ExecuteMode::InProcess
    } else {
        let command = match cli.execute_cmd.as_deref() {
            Some(line) => WorkerCommand::parse(line)
                .ok_or_else(|| anyhow::anyhow!("--execute-cmd is empty"))?,
            None => WorkerCommand::this_binary()?,
        };
        ExecuteMode::Processes {
            count: cli.execute_processes,
            command,
        }
    };
    let cfg = BenchConfig {
        clusters: cli.clusters.unwrap_or(4),
        cycle_interval: cli.cycle_interval.unwrap_or(Duration::from_millis(100)),
        concurrency: cli.concurrency,
        timeout: cli.timeout,
        execute,
        provider_latency: cli.provider_latency,
        ..BenchConfig::new(cli.units)
    };
    let r = run_bench(&cfg).await?;
    if cli.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} units: {} configured in {} — {:.1} actions/s, cycle p99 {:.1} ms ({} cycles)\n\
             execute: {}, {} in flight each, provider latency {} ms; outcomes {:?}, \
             per process {:?}, provider transitions {} — {}",
            r.units,
            r.configured,
            r.seconds_to_all_configured
                .map_or_else(|| "(not all)".to_owned(), |s| format!("{s:.3}s")),
            r.actions_per_s,
            r.cycle_p99_ms,
            r.cycles,
            match r.execute_processes {
                0 => "in-process pool".to_owned(),
                n => format!("{n} processes"),
            },
            r.concurrency_per_pool,
            r.provider_latency_ms,
            r.outcomes,
            r.per_process_actions,
            r.provider_operations,
            if r.exactly_once {
                "each machine handled exactly once"
            } else {
                "DUPLICATE OR MISSING WORK"
            }
        );
    }
    anyhow::ensure!(
        r.configured >= u64::from(r.units),
        "only {} of {} units configured",
        r.configured,
        r.units
    );
    anyhow::ensure!(r.exactly_once, "work was not done exactly once: {r:?}");
    Ok(())
}
