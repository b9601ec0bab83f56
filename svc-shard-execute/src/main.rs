use clap::Parser;
use svc_shard_execute::{Args, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = args.service.init_telemetry("bigfleet-shard-execute")?;
    run(args).await
}
