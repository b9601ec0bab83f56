use clap::Parser;
use svc_shard_execute::{Args, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = bigfleet_telemetry::TelemetryConfig::from_env(
        "bigfleet-shard-execute",
        args.log.log_format,
    );
    let _telemetry = bigfleet_telemetry::init(&cfg)?;
    run(args).await
}
