use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_coordinator::Args::parse();
    let _telemetry = args.service.init_telemetry("bigfleet-coordinator")?;
    svc_coordinator::run(args).await
}
