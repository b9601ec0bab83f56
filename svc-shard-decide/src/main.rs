use clap::Parser;

// jemalloc, configured at build time (.cargo/config.toml), returns the pages a
// cycle frees within a second; glibc kept them (ADR-0031).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_shard_decide::Args::parse();
    let _telemetry = bigfleet_telemetry::init(&bigfleet_telemetry::TelemetryConfig::from_env(
        "bigfleet-shard-decide",
        args.service.log.log_format,
    ))?;
    svc_shard_decide::run(args).await
}
