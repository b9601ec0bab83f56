//! coord-bench: a 3-replica loopback cluster of the real `bigfleet-coordinator` binary
//! (separate processes), measuring ReportShard throughput and latency with N shards
//! reporting in a closed loop, admin write commit latency, and leader failover time.
//! Prints one JSON document. Bounded in time and talks to 127.0.0.1 only.
//!
//! `cargo build --release -p svc-coordinator --features bench && target/release/coord-bench`

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient;
use bigfleet_proto::v1alpha1::{self as pb};
use clap::Parser;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(
    name = "coord-bench",
    about = "Coordinator benchmark on a 3-replica loopback cluster"
)]
struct Cli {
    /// Shards reporting concurrently (closed loop, one connection each).
    #[arg(long, default_value_t = 200)]
    shards: usize,
    /// Measured ReportShard window.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Sequential AssignDomain writes to time.
    #[arg(long, default_value_t = 300)]
    admin_writes: usize,
    /// Leader kills to time.
    #[arg(long, default_value_t = 3)]
    failovers: usize,
    /// Shortfalls per report (the shard's report carries up to 100), each with a zone
    /// requirement and a three-resource deficit: what the leader turns into release tokens.
    #[arg(long, default_value_t = 1)]
    shortfalls: usize,
    /// The coordinator binary (default: next to this one).
    #[arg(long)]
    coordinator_bin: Option<PathBuf>,
}

struct Proc {
    name: String,
    api: u16,
    raft: u16,
    metrics: u16,
    data: PathBuf,
    child: Option<Child>,
}

impl Proc {
    fn spawn(
        &mut self,
        bin: &PathBuf,
        join: &str,
        log_dir: &std::path::Path,
    ) -> anyhow::Result<()> {
        let log = std::fs::File::create(log_dir.join(format!("{}.log", self.name)))?;
        let child = Command::new(bin)
            .args([
                "--id",
                &self.name,
                "--listen",
                &format!("127.0.0.1:{}", self.api),
                "--raft-bind",
                &format!("127.0.0.1:{}", self.raft),
                "--metrics-addr",
                &format!("127.0.0.1:{}", self.metrics),
                "--data-dir",
                self.data.to_str().context("data dir")?,
                "--bootstrap",
                "--join-addr",
                join,
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, body) =
        bigfleet_testkit::http_request(([127, 0, 0, 1], port).into(), "/metrics", &[]).await?;
    body.lines().find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

async fn client(port: u16) -> Option<CoordinatorClient<Channel>> {
    let ch = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .ok()?;
    Some(CoordinatorClient::new(ch))
}

async fn leader(procs: &[Proc]) -> Option<usize> {
    for (i, p) in procs.iter().enumerate() {
        if p.child.is_none() {
            continue;
        }
        if let Some(mut c) = client(p.api).await
            && c.list_shards(pb::ListShardsRequest {}).await.is_ok()
        {
            return Some(i);
        }
    }
    None
}

async fn wait_formed(procs: &[Proc], within: Duration) -> anyhow::Result<usize> {
    let start = Instant::now();
    loop {
        let mut all = true;
        for p in procs.iter().filter(|p| p.child.is_some()) {
            // Settled too: killing a leader mid-promotion can leave no quorum (see
            // `membership_settled`), which would be measured as a failover that never ends.
            if metric(p.metrics, "bigfleet_coordinator_raft_voters").await != Some(3.0)
                || metric(p.metrics, "bigfleet_coordinator_raft_membership_settled").await
                    != Some(1.0)
            {
                all = false;
            }
        }
        if all && let Some(l) = leader(procs).await {
            return Ok(l);
        }
        if start.elapsed() > within {
            bail!("cluster did not form within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    let ms = |v: u64| v as f64 / 1000.0;
    serde_json::json!({
        "count": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.50)),
        "p90_ms": ms(h.value_at_quantile(0.90)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "max_ms": ms(h.max()),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let bin = match cli.coordinator_bin.clone() {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("bigfleet-coordinator"),
    };
    let dir = tempfile::tempdir()?;
    let mut procs = Vec::new();
    for i in 0..3 {
        procs.push(Proc {
            name: format!("coord-{i}"),
            api: bigfleet_testkit::free_tcp_port()?,
            raft: bigfleet_testkit::free_tcp_port()?,
            metrics: bigfleet_testkit::free_tcp_port()?,
            data: dir.path().join(format!("coord-{i}")),
            child: None,
        });
    }
    let join = procs
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.api))
        .collect::<Vec<_>>()
        .join(",");
    for p in &mut procs {
        p.spawn(&bin, &join, dir.path())?;
    }
    let formed = Instant::now();
    let l = wait_formed(&procs, Duration::from_secs(30)).await?;
    let formation = formed.elapsed();
    let leader_port = procs[l].api;

    // --- ReportShard: N shards in a closed loop ---
    let mut clients = Vec::new();
    for _ in 0..cli.shards {
        clients.push(client(leader_port).await.context("connect to leader")?);
    }
    // Registration (first sight goes through Raft) outside the measured window.
    let reg_start = Instant::now();
    let mut regs = Vec::new();
    let n = cli.shortfalls;
    for (i, c) in clients.iter().enumerate() {
        let mut c = c.clone();
        regs.push(tokio::spawn(async move {
            c.report_shard(report(i, 1, n)).await.map(|_| ())
        }));
    }
    for r in regs {
        r.await??;
    }
    let registration = reg_start.elapsed();
    let deadline = Instant::now() + cli.duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let mut c = c;
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            let mut errors = 0u64;
            let mut cycle = 2;
            while Instant::now() < deadline {
                let t = Instant::now();
                match c.report_shard(report(i, cycle, n)).await {
                    Ok(_) => h.record(t.elapsed().as_micros() as u64).expect("record"),
                    Err(_) => errors += 1,
                }
                cycle += 1;
            }
            (h, errors)
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await?;
        hist.add(h)?;
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let reports = serde_json::json!({
        "shards": cli.shards,
        "window_s": elapsed,
        "reports": hist.len(),
        "errors": errors,
        "reports_per_s": hist.len() as f64 / elapsed,
        "latency": summary(&hist),
        "registration_of_all_shards_ms": registration.as_secs_f64() * 1000.0,
    });

    // --- admin writes: sequential AssignDomain, each a Raft commit on 3 replicas ---
    let mut admin = client(leader_port).await.context("admin client")?;
    let mut wh = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for i in 0..cli.admin_writes {
        let t = Instant::now();
        admin
            .assign_domain(pb::AssignDomainRequest {
                topology_key: "topology.kubernetes.io/rack".into(),
                topology_value: format!("r{i}"),
                shard_id: format!("shard-{}", i % cli.shards.max(1)),
            })
            .await?;
        wh.record(t.elapsed().as_micros() as u64)?;
    }

    // --- failover: kill the leader, time until another replica serves ---
    let mut failovers = Vec::new();
    for _ in 0..cli.failovers {
        let l = wait_formed(&procs, Duration::from_secs(30)).await?;
        // Let the followers see a few heartbeats from this leader first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        procs[l].kill();
        let killed = Instant::now();
        loop {
            if leader(&procs).await.is_some() {
                break;
            }
            if killed.elapsed() > Duration::from_secs(30) {
                bail!("no new leader within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        failovers.push(killed.elapsed().as_secs_f64() * 1000.0);
        procs[l].spawn(&bin, &join, dir.path())?;
    }

    let out = serde_json::json!({
        "cluster": { "replicas": 3, "formation_ms": formation.as_secs_f64() * 1000.0 },
        "report_shard": reports,
        "admin_write_commit": summary(&wh),
        "leader_failover_ms": failovers,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn report(i: usize, cycle: i64, shortfalls: usize) -> pb::ShardReport {
    pb::ShardReport {
        shard_id: format!("shard-{i}"),
        cycle,
        shard_epoch: 1,
        timestamp_unix_nanos: 0,
        shard_address: format!("shard-{i}.bench:7780"),
        summary: Some(pb::ShardSummary {
            total_machines: 5000,
            free_machines: 100,
            ..Default::default()
        }),
        shortfalls: (0..shortfalls)
            .map(|k| pb::Shortfall {
                requirements: vec![pb::NodeSelectorRequirement {
                    key: "topology.kubernetes.io/zone".into(),
                    operator: pb::node_selector_requirement::Operator::In as i32,
                    values: vec![format!("zone-{}", k % 3)],
                }],
                deficit: Some(pb::Resources {
                    resources: [
                        ("cpu".to_owned(), format!("{}", 8 + k)),
                        ("memory".to_owned(), "64Gi".to_owned()),
                        ("nvidia.com/gpu".to_owned(), "8".to_owned()),
                    ]
                    .into(),
                }),
                priority: 10,
                age_cycles: 1,
                ..Default::default()
            })
            .collect(),
        instruction_acks: Vec::new(),
    }
}
