use clap::Parser;

// jemalloc, configured at build time (.cargo/config.toml), returns the pages a
// cycle frees within a second; glibc kept them (ADR-0031).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = svc_shard_decide::Args::parse();
    let _telemetry = args.service.init_telemetry("bigfleet-shard-decide")?;
    svc_shard_decide::run(args).await
}
