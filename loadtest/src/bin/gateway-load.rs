//! `gateway-load`: N simulated operators against a session gateway on this machine.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use bigfleet_loadtest::certs::DirCa;
use bigfleet_loadtest::gateway_load::{self, LoadConfig};
use clap::Parser;

/// Load-tests a bigfleet session gateway (loopback targets only; stops by itself).
#[derive(Debug, Parser)]
#[command(name = "gateway-load")]
struct Cli {
    /// The gateway's public address, e.g. 127.0.0.1:7780.
    #[arg(long, required_unless_present = "write_tls_dir")]
    target: Option<String>,
    /// Simulated operators (one session and one cluster each).
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Roll-up period per operator (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    rollup_interval: Duration,
    /// Measurement window after every operator connected (e.g. 30s).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// mTLS: directory with ca.crt and `cluster-<id>.crt/.key` files or ca.key to mint them.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// TLS server name to verify (default: the target host).
    #[arg(long)]
    server_name: Option<String>,
    /// The gateway's pid, to report its resident memory.
    #[arg(long)]
    gateway_pid: Option<u32>,
    /// Connection set-ups in flight at once during the ramp.
    #[arg(long, default_value_t = 256)]
    connect_concurrency: usize,
    /// Stop waiting for every operator to connect after this long.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    ramp_timeout: Duration,
    /// Cluster id prefix.
    #[arg(long, default_value = "load-")]
    cluster_prefix: String,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Create a throwaway CA (ca.crt, ca.key) and a gateway certificate
    /// (shard-shard-0.crt/.key) in DIR, then exit.
    #[arg(long, value_name = "DIR")]
    write_tls_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(dir) = &cli.write_tls_dir {
        DirCa::create(dir, "shard/shard-0")
            .with_context(|| format!("writing a CA into {}", dir.display()))?;
        eprintln!(
            "wrote ca.crt, ca.key, shard-shard-0.crt, shard-shard-0.key to {}",
            dir.display()
        );
        return Ok(());
    }
    let target = cli.target.clone().context("--target is required")?;
    let mut cfg = LoadConfig::new(&target, cli.sessions);
    cfg.rollup_interval = cli.rollup_interval;
    cfg.duration = cli.duration;
    cfg.tls_dir = cli.tls_dir;
    cfg.server_name = cli.server_name;
    cfg.gateway_pid = cli.gateway_pid;
    cfg.connect_concurrency = cli.connect_concurrency;
    cfg.ramp_timeout = cli.ramp_timeout;
    cfg.cluster_prefix = cli.cluster_prefix;
    let report = gateway_load::run(cfg, |line| eprintln!("gateway-load: {line}")).await?;
    if cli.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{report:#?}");
    }
    Ok(())
}
