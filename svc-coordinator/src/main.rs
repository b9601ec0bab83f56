use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_coordinator::Args::parse();
    let cfg =
        bigfleet_telemetry::TelemetryConfig::from_env("bigfleet-coordinator", args.log.log_format);
    let _telemetry = bigfleet_telemetry::init(&cfg)?;
    svc_coordinator::run(args).await
}
