use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_shard_decide::Args::parse();
    let _telemetry = bigfleet_telemetry::init(&bigfleet_telemetry::TelemetryConfig::from_env(
        "bigfleet-shard-decide",
        args.log.log_format,
    ))?;
    svc_shard_decide::run(args).await
}
