use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_inspect::Args::parse();
    let telemetry = bigfleet_telemetry::TelemetryConfig::from_env(
        "bigfleet-inspect",
        args.service.log.log_format,
    );
    let _guard = bigfleet_telemetry::init(&telemetry)?;
    svc_inspect::run(args).await
}
