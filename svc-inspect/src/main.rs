use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_inspect::Args::parse();
    let _telemetry = args.service.init_telemetry("bigfleet-inspect")?;
    svc_inspect::run(args).await
}
