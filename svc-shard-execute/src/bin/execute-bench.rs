//! Throughput of the worker pool: a Decide double hands out N Provision
//! actions (Create + blob + Configure, four Transitions each) to 1, 2 or 4
//! worker pools, all over Unix sockets, against the in-repo fake provider
//! (instant, or with a fixed delay before every mutation answers). Prints
//! one JSON line per run.
//!
//! `cargo run --release -p svc-shard-execute --features bench --bin execute-bench -- --json`

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bigfleet_fake_provider::FakeProvider;
use bigfleet_fake_provider::grpc::ProviderGrpc;
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1::capacity_provider_server::CapacityProviderServer;
use clap::Parser;
use svc_shard_execute::doubles::{DecideDouble, GatewayDouble, fixtures, serve_uds};
use svc_shard_execute::{Config, start};

#[derive(Debug, Parser)]
#[command(
    name = "execute-bench",
    about = "Provision actions per second through decide → execute → fake provider"
)]
struct Args {
    /// Provision actions per run.
    #[arg(long, default_value_t = 5000)]
    actions: usize,
    /// Worker pool counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pools: Vec<usize>,
    /// Concurrency of each pool.
    #[arg(long, default_value_t = 64)]
    concurrency: u32,
    /// Provider latencies to run (milliseconds before each mutation answers), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,50")]
    latency_ms: Vec<u64>,
    /// Actions per run when the provider has latency (runs get long otherwise).
    #[arg(long, default_value_t = 2000)]
    latency_actions: usize,
    /// Only JSON lines on stdout.
    #[arg(long)]
    json: bool,
}

async fn run_once(args: &Args, pools: usize, latency_ms: u64) -> anyhow::Result<serde_json::Value> {
    let n = if latency_ms == 0 {
        args.actions
    } else {
        args.latency_actions
    };
    let dir = tempfile::Builder::new().prefix("bf-bench").tempdir()?;
    let decide = DecideDouble::new("bench", 1);
    let gateway = GatewayDouble::default();
    let provider = Arc::new(FakeProvider::new(Default::default()));
    for i in 0..n {
        let m = fixtures::machine(&format!("m-{i:07}"), MachineState::Speculative, "");
        decide.insert_machine(&m)?;
        provider
            .add_machine(m)
            .map_err(|e| anyhow::anyhow!("seeding the provider: {e}"))?;
    }
    let decide_srv = decide.serve_uds(&dir.path().join("decide.sock"))?;
    let gateway_srv = gateway.serve_uds(&dir.path().join("gateway.sock"))?;
    let provider_path = dir.path().join("provider.sock");
    // A fixed delay in front of every mutation; Get and List stay immediate.
    let grpc = ProviderGrpc::new(Arc::clone(&provider), None)
        .with_rpc_latency(Duration::from_millis(latency_ms));
    let provider_srv = serve_uds(
        tonic::transport::Server::builder().add_service(CapacityProviderServer::new(grpc)),
        &provider_path,
    )?;

    let started = Instant::now();
    let mut running = Vec::new();
    for p in 0..pools {
        let mut cfg = Config::new(&decide_srv.uri(), &gateway_srv.uri(), &provider_srv.uri());
        cfg.shard_id = "bench".into();
        cfg.worker_id = format!("bench-pool-{p}");
        cfg.concurrency = args.concurrency;
        running.push(start(cfg).await.context("starting a worker pool")?);
    }
    for i in 0..n {
        decide.enqueue(fixtures::acquire(
            mesh::ActionKind::Provision,
            &format!("m-{i:07}"),
            "bench-cluster",
        ));
    }
    let mut changes = decide.changes();
    let all = tokio::time::timeout(
        Duration::from_secs(600),
        changes.wait_for(|_| decide.done_count() >= n),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(all, "only {} of {n} actions finished", decide.done_count());
    let dones = decide.dones();
    let success = dones.iter().filter(|d| d.outcome == "success").count();
    let per_pool: Vec<usize> = (0..pools)
        .map(|p| {
            let w = format!("bench-pool-{p}");
            dones.iter().filter(|d| d.worker_id == w).count()
        })
        .collect();
    for r in running {
        r.shutdown().await;
    }
    decide.end_streams();
    decide_srv.stop().await;
    Ok(serde_json::json!({
        "bench": "execute",
        "actions": n,
        "pools": pools,
        "concurrency_per_pool": args.concurrency,
        "provider_latency_ms": latency_ms,
        "seconds": (seconds * 1000.0).round() / 1000.0,
        "actions_per_s": (n as f64 / seconds).round(),
        "success": success,
        "per_pool": per_pool,
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    for &latency in &args.latency_ms {
        for &pools in &args.pools {
            let line = run_once(&args, pools, latency).await?;
            if !args.json {
                eprintln!(
                    "{pools} pool(s), provider latency {latency} ms: {} actions/s",
                    line["actions_per_s"]
                );
            }
            println!("{line}");
        }
    }
    Ok(())
}
