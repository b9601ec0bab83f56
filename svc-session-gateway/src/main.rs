use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_session_gateway::Args::parse();
    let _telemetry = bigfleet_telemetry::init(&bigfleet_telemetry::TelemetryConfig::from_env(
        "bigfleet-session-gateway",
        args.log.log_format,
    ))?;
    svc_session_gateway::run(args).await
}
