//! `decide-stub`: a stand-in `Decide` service on a Unix socket, for running a session
//! gateway (and `gateway-load` against it) without a real decide.

use std::path::PathBuf;
use std::time::Duration;

use bigfleet_loadtest::decide_stub::{DecideStub, StubConfig};
use clap::Parser;

/// Serves a Decide double on `<socket-dir>/decide.sock` until SIGTERM or SIGINT.
#[derive(Debug, Parser)]
#[command(name = "decide-stub")]
struct Cli {
    /// Directory of the shard's sockets; serves decide.sock there.
    #[arg(long, default_value = "/run/bigfleet")]
    socket_dir: PathBuf,
    /// Shard epoch reported to the gateway.
    #[arg(long, default_value_t = 1)]
    epoch: i64,
    /// Coordinator term reported to the gateway.
    #[arg(long, default_value_t = 0)]
    term: i64,
    /// Extra time every ApplyRollup takes.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    apply_delay: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _telemetry = bigfleet_telemetry::init(&bigfleet_telemetry::TelemetryConfig::from_env(
        "decide-stub",
        bigfleet_telemetry::LogFormat::Text,
    ))?;
    let stub = DecideStub::new(StubConfig {
        shard_epoch: cli.epoch,
        coordinator_term: cli.term,
        apply_delay: cli.apply_delay,
        apply_gate: None,
    });
    let running = stub.serve_unix(&cli.socket_dir.join("decide.sock")).await?;
    running.run_until_signal().await?;
    Ok(())
}
