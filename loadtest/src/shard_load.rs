//! `shard-load`: a benchmark of the whole shard as it is deployed — the real
//! `bigfleet-fake-provider`, `bigfleet-shard-decide`, `bigfleet-session-gateway` and
//! `bigfleet-shard-execute` binaries as separate processes talking over Unix sockets in a
//! temporary directory — driven by N simulated operators on loopback.
//!
//! A run:
//!
//! 1. writes a fake-provider catalog of `machines` CPU machines: `needs_per_operator`
//!    machines already Configured into each operator's cluster (one per need at its base
//!    size), the rest Idle (30 %) and Speculative, so every operator's demand fits;
//! 2. starts provider, then decide and gateway, then the execute workers, each waiting for
//!    the previous tier's `/readyz`;
//! 3. connects every operator (bounded concurrent set-ups) and starts the demand driver: each
//!    operator sends a roll-up every `rollup_interval` (operators evenly phased), of which a
//!    `changed_fraction` carry changed demand (one need resized) and the rest are identical
//!    re-sends;
//! 4. warms up for `warmup`, then waits (bounded) until decide's action queue has drained;
//! 5. measures for `duration`: roll-up acknowledgement latency at the operators; from
//!    decide's `/metrics` scraped at both ends of the window, the cycle time
//!    (`bigfleet_shard_cycle_duration_seconds`), the demand-to-decision latency
//!    (`bigfleet_shard_demand_to_decision_seconds`) and recognised identical re-sends
//!    (`bigfleet_shard_rollups_unchanged_total`) when decide exports them; per-process CPU
//!    from `/proc/<pid>/stat` and RSS from `/proc/<pid>/status`;
//! 6. stops the operators and every child, and returns a [`ShardLoadReport`].
//!
//! Histogram quantiles are interpolated within Prometheus buckets (decide's cycle buckets
//! double from 1 ms, with 50, 75, 100, 150 and 200 ms added), so they are estimates; `cycle_p99_bucket_ms` is the bucket's upper
//! bound, a reading that is never low.

pub mod procs;
pub mod prom;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bigfleet_fake_provider::{CapacityKind, Catalog, InstanceType, Pool, StateCounts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::demand::{Demand, NeedSpec};
use crate::gateway_load::{cpu_seconds, rss_mb};
use crate::latency::LatencyRecorder;
use crate::operator::{Backoff, Operator, OperatorConfig, OperatorHandle, SessionErrors, Totals};

use self::procs::{Binaries, Children, Role};
use self::prom::Scrape;
use svc_shard_decide_core::CyclePhase;

/// decide's cycle histogram.
pub const CYCLE_METRIC: &str = "bigfleet_shard_cycle_duration_seconds";
/// decide's roll-up-accepted → first-cycle-that-used-it histogram.
pub const DEMAND_TO_DECISION_METRIC: &str = "bigfleet_shard_demand_to_decision_seconds";
/// Identical re-sends recognised as such.
pub const ROLLUPS_UNCHANGED_METRIC: &str = "bigfleet_shard_rollups_unchanged_total";
const ACTIONS_METRIC: &str = "bigfleet_shard_actions_total";
const QUEUE_METRIC: &str = "bigfleet_shard_action_queue_depth";
const INFLIGHT_METRIC: &str = "bigfleet_shard_execute_inflight";
const SHORTFALLS_METRIC: &str = "bigfleet_shard_shortfalls";

/// The instance type of every machine in the catalog.
const MACHINE_TYPE: &str = "m.xlarge.32";

/// Why a run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ShardLoadError {
    #[error("{0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "service binaries missing in {}: {missing} (build them: cargo build --bins, or pass --bin-dir)",
        dir.display()
    )]
    MissingBinaries { dir: PathBuf, missing: String },
    #[error("not ready after {}: {names}\n{tails}", humantime::format_duration(*timeout))]
    NotReady {
        names: String,
        timeout: Duration,
        tails: String,
    },
    #[error("{name} exited ({status}); its log {}:\n{tail}", log.display())]
    ChildExited {
        name: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("scraping {what}: {source}")]
    Scrape {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct ShardLoadConfig {
    pub operators: usize,
    pub needs_per_operator: usize,
    /// Machines in the fake provider.
    pub machines: u64,
    pub rollup_interval: Duration,
    /// Fraction of roll-ups that change demand; the rest are identical re-sends.
    pub changed_fraction: f64,
    pub warmup: Duration,
    /// Measurement window.
    pub duration: Duration,
    /// Upper bound on waiting for decide's action queue to drain after the warm-up.
    pub settle_timeout: Duration,
    pub execute_workers: usize,
    /// decide's `--cycle-interval`.
    pub cycle_interval: Duration,
    /// decide's `--incremental-reconcile`.
    pub incremental_reconcile: bool,
    /// Where the service binaries are (default: next to the running executable).
    pub bin_dir: Option<PathBuf>,
    /// Keep sockets, catalog and logs here instead of a temporary directory.
    pub run_dir: Option<PathBuf>,
    pub seed: u64,
    /// Operator connection set-ups in flight at once during the ramp.
    pub connect_concurrency: usize,
}

impl Default for ShardLoadConfig {
    fn default() -> Self {
        Self {
            operators: 1000,
            needs_per_operator: 3,
            machines: 100_000,
            rollup_interval: Duration::from_secs(2),
            changed_fraction: 0.1,
            warmup: Duration::from_secs(10),
            duration: Duration::from_secs(30),
            settle_timeout: Duration::from_secs(60),
            execute_workers: 1,
            cycle_interval: Duration::from_secs(1),
            incremental_reconcile: true,
            bin_dir: None,
            run_dir: None,
            seed: 1,
            connect_concurrency: 256,
        }
    }
}

impl ShardLoadConfig {
    fn validate(&self) -> Result<(), ShardLoadError> {
        let bad = |m: &str| Err(ShardLoadError::Config(m.to_owned()));
        if self.operators == 0 {
            return bad("--operators must be at least 1");
        }
        if self.needs_per_operator == 0 {
            return bad("--needs-per-operator must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.changed_fraction) {
            return bad("--changed-fraction must be in [0, 1]");
        }
        if self.execute_workers == 0 {
            return bad("--execute-workers must be at least 1");
        }
        if self.rollup_interval.is_zero() || self.duration.is_zero() {
            return bad("--rollup-interval and --duration must be positive");
        }
        let bound = (self.operators * self.needs_per_operator) as u64;
        if self.machines < bound.saturating_mul(2) {
            return Err(ShardLoadError::Config(format!(
                "--machines {} cannot hold the demand: at least {} (two per need) are needed",
                self.machines,
                bound * 2
            )));
        }
        Ok(())
    }
}

/// A target of the issue and how this run did against it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetCheck {
    pub limit: f64,
    pub value: Option<f64>,
    /// `None` when the value was not measured (e.g. the metric is absent).
    pub pass: Option<bool>,
}

/// The targets that apply to this run's shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Targets {
    /// `"10k"`, `"1k"` or `"n/a"` (targets are defined for a roll-up every 2 s with 10 %
    /// changed, at 10,000 and at 1,000 operators).
    pub shape: String,
    pub checks: std::collections::BTreeMap<String, TargetCheck>,
}

/// The result of a run (printed as one JSON object).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardLoadReport {
    pub operators: usize,
    pub needs_per_operator: usize,
    pub machines: u64,
    pub execute_workers: usize,
    pub rollup_interval_s: f64,
    pub changed_fraction: f64,
    pub cycle_interval_s: f64,
    /// Operators connected at the end of the window.
    pub connected: usize,
    pub ramp_s: f64,
    /// Time spent after the warm-up waiting for decide's action queue to drain.
    pub settle_s: f64,
    /// Whether it drained before `--settle-timeout`.
    pub settled: bool,
    pub window_s: f64,
    /// Roll-ups acknowledged per second in the window.
    pub rollups_per_second: f64,
    pub rollups_acked: u64,
    /// Roll-ups the driver asked for in the window, with changed demand / identical.
    pub rollups_changed: u64,
    pub rollups_identical: u64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    pub demand_to_decision_p50_ms: Option<f64>,
    pub demand_to_decision_p99_ms: Option<f64>,
    /// Observations of the demand-to-decision histogram in the window.
    pub demand_to_decision_samples: Option<u64>,
    pub cycle_p50_ms: Option<f64>,
    pub cycle_p99_ms: Option<f64>,
    /// Upper bound of the bucket holding the cycle p99.
    pub cycle_p99_bucket_ms: Option<f64>,
    /// Cycles decide finished in the window.
    pub cycles: u64,
    /// Mean duration of each cycle phase in the window (decide's phase histogram).
    pub cycle_phase_mean_ms: std::collections::BTreeMap<String, f64>,
    /// Identical re-sends decide recognised in the window (when it exports the counter).
    pub rollups_unchanged: Option<u64>,
    /// Frames pushed to the operators per second besides acks: node states, capacity
    /// hints, bootstrap requests, reclaim instructions.
    pub pushes_per_second: f64,
    /// Actions decide emitted in the window.
    pub actions: u64,
    /// decide's unresolved shortfalls at the end.
    pub shortfalls_at_end: Option<u64>,
    pub decide_cpu_cores: Option<f64>,
    pub gateway_cpu_cores: Option<f64>,
    /// Sum over the execute workers.
    pub execute_cpu_cores: Option<f64>,
    pub provider_cpu_cores: Option<f64>,
    /// This process: the simulated operators and the driver.
    pub loadgen_cpu_cores: Option<f64>,
    pub decide_rss_mib: Option<f64>,
    pub gateway_rss_mib: Option<f64>,
    pub execute_rss_mib: Option<f64>,
    pub provider_rss_mib: Option<f64>,
    /// Everything that went wrong in the operators' sessions over the whole run, and its sum.
    #[serde(flatten)]
    pub errors: SessionErrors,
    /// 1-minute load average when the run started (other work on the machine).
    pub load_average_at_start: Option<f64>,
    pub targets: Targets,
}

// === Demand ===

/// The base of need `j`: a CPU service of 24 cores (one 32-core machine) split into pods
/// of 2, 4 or 8 cores with 4 GiB per core, at a priority unique within the cluster.
fn base_need(j: usize) -> (u32, u32, i32) {
    let cores = [2u32, 4, 8][j % 3];
    let replicas = 24 / cores;
    let priority = 100 + 10 * i32::try_from(j).unwrap_or(0);
    (replicas, cores, priority)
}

/// One operator's current demand, as replica counts per need.
#[derive(Debug, Clone, PartialEq)]
struct OperatorDemand {
    replicas: Vec<u32>,
}

impl OperatorDemand {
    fn base(needs: usize) -> Self {
        Self {
            replicas: (0..needs).map(|j| base_need(j).0).collect(),
        }
    }

    fn demand(&self) -> Demand {
        Demand::new(
            self.replicas
                .iter()
                .enumerate()
                .map(|(j, &r)| {
                    let (_, cores, priority) = base_need(j);
                    NeedSpec::cpu(r, cores, cores * 4, priority)
                })
                .collect(),
        )
    }

    /// Resizes one need to a different count within half to one and a half times its
    /// base (at most two machines), so the demand always differs from the last roll-up.
    fn change(&mut self, rng: &mut StdRng) {
        let j = rng.random_range(0..self.replicas.len());
        let base = base_need(j).0;
        let (lo, hi) = ((base / 2).max(1), base + base / 2);
        let current = self.replicas[j];
        let mut next = rng.random_range(lo..=hi - 1);
        if next >= current {
            next += 1;
        }
        self.replicas[j] = next;
    }
}

/// The catalog: operator clusters pre-provisioned at their base demand, the rest spare.
pub fn catalog(operators: usize, needs_per_operator: usize, machines: u64) -> Catalog {
    let bound = u32::try_from(operators * needs_per_operator).unwrap_or(u32::MAX);
    let spare = machines.saturating_sub(u64::from(bound));
    let idle = u32::try_from(spare * 3 / 10).unwrap_or(u32::MAX);
    let speculative = u32::try_from(spare - u64::from(idle)).unwrap_or(u32::MAX);
    let cpu = InstanceType {
        resources: [("cpu", "32"), ("memory", "128Gi")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        allocatable: None,
        labels: Default::default(),
    };
    Catalog {
        provider: "fake".into(),
        instance_types: [(MACHINE_TYPE.to_owned(), cpu)].into_iter().collect(),
        pools: vec![Pool {
            name: "cpu-od".into(),
            instance_type: MACHINE_TYPE.into(),
            capacity_type: CapacityKind::OnDemand,
            zones: ["fake-1a", "fake-1b", "fake-1c"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            price_per_hour: 1.5,
            interruption_probability: 0.0,
            labels: Default::default(),
            rack_size: None,
            // Bound machines go round-robin over the clusters: `needs` each.
            clusters: (0..operators).map(cluster_id).collect(),
            counts: StateCounts {
                speculative,
                idle,
                configured: bound,
                ..StateCounts::default()
            },
        }],
    }
}

/// Cluster id of operator `i`.
pub fn cluster_id(i: usize) -> String {
    format!("cluster-{i:05}")
}

/// Roll-ups the driver has asked for.
#[derive(Debug, Default)]
struct DriveCounts {
    changed: AtomicU64,
    identical: AtomicU64,
}

/// Sends operator `m mod N`'s roll-up at `m × interval / N` after the start: every
/// operator once per interval, evenly phased.
async fn drive(
    ops: Arc<Vec<OperatorHandle>>,
    mut demands: Vec<OperatorDemand>,
    interval: Duration,
    changed_fraction: f64,
    seed: u64,
    counts: Arc<DriveCounts>,
    stop: CancellationToken,
) {
    let n = ops.len() as u128;
    let step = interval.as_nanos();
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut m: u128 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = start.elapsed().as_nanos();
        while m * step / n <= now {
            let k = usize::try_from(m % n).unwrap_or(0);
            if rng.random_bool(changed_fraction) {
                demands[k].change(&mut rng);
                counts.changed.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.identical.fetch_add(1, Ordering::Relaxed);
            }
            ops[k].set_demand(demands[k].demand());
            m += 1;
        }
    }
}

// === Processes and measurements ===

fn s(v: impl ToString) -> String {
    v.to_string()
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ShardLoadError {
    let what = what.into();
    move |source| ShardLoadError::Io { what, source }
}

fn reserve() -> Result<bigfleet_mesh::ports::PortReservation, ShardLoadError> {
    bigfleet_mesh::ports::reserve_loopback_port().map_err(io("reserving a loopback port"))
}

fn socket(dir: &Path, name: &str) -> Result<PathBuf, ShardLoadError> {
    bigfleet_mesh::ports::unix_socket_path(dir, name).map_err(|len| {
        ShardLoadError::Config(format!(
            "unix socket path {} is {len} bytes, over the kernel's limit; pass a shorter --run-dir",
            dir.join(name).display()
        ))
    })
}

/// CPU seconds per role (summed over its processes) and of this process.
#[derive(Debug, Clone, Default)]
struct Cpu {
    decide: Option<f64>,
    gateway: Option<f64>,
    execute: Option<f64>,
    provider: Option<f64>,
    me: Option<f64>,
}

fn role_sum(children: &Children, role: Role, f: fn(u32) -> Option<f64>) -> Option<f64> {
    children
        .of(role)
        .iter()
        .map(|(pid, _)| f(*pid))
        .sum::<Option<f64>>()
}

impl Cpu {
    fn now(children: &Children) -> Self {
        Self {
            decide: role_sum(children, Role::Decide, cpu_seconds),
            gateway: role_sum(children, Role::Gateway, cpu_seconds),
            execute: role_sum(children, Role::Execute, cpu_seconds),
            provider: role_sum(children, Role::Provider, cpu_seconds),
            me: cpu_seconds(std::process::id()),
        }
    }
}

fn cores(start: Option<f64>, end: Option<f64>, wall: f64) -> Option<f64> {
    start
        .zip(end)
        .map(|(a, b)| round3((b - a) / wall.max(1e-9)))
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn ms(seconds: Option<f64>) -> Option<f64> {
    seconds.map(|s| round3(s * 1000.0))
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

async fn scrape_role(
    children: &Children,
    role: Role,
    what: &'static str,
) -> Result<Scrape, ShardLoadError> {
    let mut all = Scrape::default();
    for (_, addr) in children.of(role) {
        let one = prom::scrape(addr)
            .await
            .map_err(|source| ShardLoadError::Scrape { what, source })?;
        all.samples.extend(one.samples);
    }
    Ok(all)
}

/// The targets of issue 17 for this run's shape.
pub fn targets(cfg: &ShardLoadConfig, r: &ShardLoadReport) -> Targets {
    let standard =
        cfg.rollup_interval == Duration::from_secs(2) && (cfg.changed_fraction - 0.1).abs() < 1e-9;
    let check = |limit: f64, value: Option<f64>| TargetCheck {
        limit,
        value,
        pass: value.map(|v| v <= limit),
    };
    let mut checks = std::collections::BTreeMap::new();
    let shape = match (standard, cfg.operators) {
        (true, 10_000) => {
            checks.insert("ack_p99_ms".into(), check(50.0, Some(r.ack_p99_ms)));
            checks.insert(
                "demand_to_decision_p99_ms".into(),
                check(1000.0, r.demand_to_decision_p99_ms),
            );
            checks.insert("decide_cpu_cores".into(), check(0.5, r.decide_cpu_cores));
            checks.insert("cycle_p99_ms".into(), check(100.0, r.cycle_p99_ms));
            checks.insert("errors".into(), check(0.0, Some(r.errors.total as f64)));
            "10k"
        }
        (true, 1000) => {
            checks.insert("decide_cpu_cores".into(), check(0.1, r.decide_cpu_cores));
            "1k"
        }
        _ => "n/a",
    };
    Targets {
        shape: shape.into(),
        checks,
    }
}

/// Runs the benchmark; `progress` receives human-readable lines (about one a second).
pub async fn run(
    cfg: ShardLoadConfig,
    mut progress: impl FnMut(&str),
) -> Result<ShardLoadReport, ShardLoadError> {
    cfg.validate()?;
    let bins = Binaries::locate(cfg.bin_dir.as_deref())?;
    let load_average_at_start = load_average();
    let (run_dir, temp) = match &cfg.run_dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("shard-load-")
                .tempdir()
                .map_err(io("creating a run directory"))?;
            (t.path().to_owned(), Some(t))
        }
    };
    let mut children = Children::new(&run_dir.join("logs"))?;
    let result = run_in(&cfg, &bins, &run_dir, &mut children, &mut progress).await;
    children.stop_all(Duration::from_secs(5)).await;
    let mut report = match result {
        Ok(r) => r,
        Err(e) => {
            // Keep the logs of a failed run.
            if let Some(t) = temp {
                let kept = t.keep();
                progress(&format!("logs kept in {}", kept.display()));
            }
            return Err(e);
        }
    };
    report.load_average_at_start = load_average_at_start;
    report.targets = targets(&cfg, &report);
    Ok(report)
}

async fn run_in(
    cfg: &ShardLoadConfig,
    bins: &Binaries,
    run_dir: &Path,
    children: &mut Children,
    progress: &mut impl FnMut(&str),
) -> Result<ShardLoadReport, ShardLoadError> {
    // --- the shard ---
    let catalog_path = run_dir.join("catalog.json");
    let cat = catalog(cfg.operators, cfg.needs_per_operator, cfg.machines);
    cat.validate()
        .map_err(|e| ShardLoadError::Config(format!("catalog: {e}")))?;
    std::fs::write(&catalog_path, cat.to_json_pretty())
        .map_err(io(format!("writing {}", catalog_path.display())))?;
    let sock_dir = run_dir.join("sock");
    let data_dir = run_dir.join("decide-data");
    for d in [&sock_dir, &data_dir] {
        std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
    }
    let provider_sock = socket(&sock_dir, "provider.sock")?;
    let provider = format!("unix://{}", provider_sock.display());
    let decide_sock = socket(&sock_dir, "decide.sock")?;
    let gateway_sock = socket(&sock_dir, "gateway.sock")?;
    progress(&format!(
        "starting the shard in {} ({} machines, {} execute worker(s), binaries from {})",
        run_dir.display(),
        cfg.machines,
        cfg.execute_workers,
        bins.dir.display()
    ));

    let p_ops = reserve()?;
    let p_addr = p_ops.release();
    children.spawn(
        "provider",
        Role::Provider,
        &bins.path(procs::PROVIDER_BIN),
        &[
            s("--socket"),
            s(provider_sock.display()),
            s("--catalog"),
            s(catalog_path.display()),
            s("--metrics-addr"),
            s(p_addr),
        ],
        p_addr,
    )?;
    children
        .wait_ready(&["provider"], Duration::from_secs(120))
        .await?;

    let (d_ops, g_ops, g_public) = (reserve()?, reserve()?, reserve()?);
    let (d_addr, g_addr, public) = (d_ops.release(), g_ops.release(), g_public.release());
    children.spawn(
        "decide",
        Role::Decide,
        &bins.path(procs::DECIDE_BIN),
        &[
            s("--shard-id"),
            s("shard-0"),
            s("--socket-dir"),
            s(sock_dir.display()),
            s("--provider-addr"),
            provider.clone(),
            s("--data-dir"),
            s(data_dir.display()),
            s("--metrics-addr"),
            s(d_addr),
            s("--cycle-interval"),
            s(humantime::format_duration(cfg.cycle_interval)),
            s(format!(
                "--incremental-reconcile={}",
                cfg.incremental_reconcile
            )),
            s("--drain-timeout"),
            s("3s"),
        ],
        d_addr,
    )?;
    children.spawn(
        "gateway",
        Role::Gateway,
        &bins.path(procs::GATEWAY_BIN),
        &[
            s("--shard-id"),
            s("shard-0"),
            s("--listen"),
            s(public),
            s("--socket-dir"),
            s(sock_dir.display()),
            s("--metrics-addr"),
            s(g_addr),
            s("--max-sessions"),
            s(cfg.operators + 64),
            s("--drain-timeout"),
            s("3s"),
        ],
        g_addr,
    )?;
    children
        .wait_ready(&["decide", "gateway"], Duration::from_secs(180))
        .await?;

    let mut names = Vec::new();
    for i in 0..cfg.execute_workers {
        let x_addr = reserve()?.release();
        let name = format!("execute-{i}");
        children.spawn(
            &name,
            Role::Execute,
            &bins.path(procs::EXECUTE_BIN),
            &[
                s("--shard-id"),
                s("shard-0"),
                s("--decide-addr"),
                format!("unix://{}", decide_sock.display()),
                s("--gateway-addr"),
                format!("unix://{}", gateway_sock.display()),
                s("--provider-addr"),
                provider.clone(),
                s("--metrics-addr"),
                s(x_addr),
                s("--drain-timeout"),
                s("3s"),
            ],
            x_addr,
        )?;
        names.push(name);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    children.wait_ready(&names, Duration::from_secs(60)).await?;

    // --- the operators ---
    let target = format!("http://{public}");
    let latency = LatencyRecorder::new();
    let gate = Arc::new(Semaphore::new(cfg.connect_concurrency.max(1)));
    let demands: Vec<OperatorDemand> = (0..cfg.operators)
        .map(|_| OperatorDemand::base(cfg.needs_per_operator))
        .collect();
    let ops: Vec<OperatorHandle> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut oc = OperatorConfig::new(&cluster_id(i), &target);
            // The driver sends every roll-up after the one on connect.
            oc.rollup_interval = Duration::from_secs(24 * 3600);
            oc.demand = d.demand();
            oc.churn = None;
            oc.latency = Some(latency.clone());
            oc.connect_gate = Some(Arc::clone(&gate));
            oc.backoff = Backoff {
                initial: Duration::from_millis(200),
                max: Duration::from_secs(5),
            };
            Operator::spawn(oc)
        })
        .collect();
    let ops = Arc::new(ops);
    let stop = CancellationToken::new();
    let outcome = measure(cfg, children, &ops, demands, &latency, &stop, progress).await;
    stop.cancel();
    for op in ops.iter() {
        op.stop();
    }
    // The driver holds the other reference until it sees the cancellation.
    let mut ops = ops;
    let deadline = Instant::now() + Duration::from_secs(5);
    let owned = loop {
        match Arc::try_unwrap(ops) {
            Ok(v) => break Some(v),
            Err(back) if Instant::now() < deadline => {
                ops = back;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => break None,
        }
    };
    for op in owned.into_iter().flatten() {
        op.join().await;
    }
    outcome
}

/// Ramp, warm-up, settle and the measurement window.
/// Per phase of decide's cycle, the mean duration (ms) between two scrapes.
fn phase_means(a: &Scrape, b: &Scrape) -> std::collections::BTreeMap<String, f64> {
    const PHASE_SUM: &str = "bigfleet_shard_cycle_phase_duration_seconds_sum";
    const PHASE_COUNT: &str = "bigfleet_shard_cycle_phase_duration_seconds_count";
    CyclePhase::ALL
        .map(CyclePhase::as_str)
        .into_iter()
        .filter_map(|p| {
            let n = b.sum_where(PHASE_COUNT, "phase", p) - a.sum_where(PHASE_COUNT, "phase", p);
            let secs = b.sum_where(PHASE_SUM, "phase", p) - a.sum_where(PHASE_SUM, "phase", p);
            (n > 0.0).then(|| (p.to_owned(), round3(secs / n * 1e3)))
        })
        .collect()
}

async fn measure(
    cfg: &ShardLoadConfig,
    children: &mut Children,
    ops: &Arc<Vec<OperatorHandle>>,
    demands: Vec<OperatorDemand>,
    latency: &LatencyRecorder,
    stop: &CancellationToken,
    progress: &mut impl FnMut(&str),
) -> Result<ShardLoadReport, ShardLoadError> {
    let n = cfg.operators;
    let ramp_start = Instant::now();
    let ramp_timeout = Duration::from_secs(60) + Duration::from_millis(10 * n as u64);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        children.check_alive()?;
        let t = Totals::of(ops);
        progress(&format!(
            "ramp t={:.1}s connected={}/{n} errors={}",
            ramp_start.elapsed().as_secs_f64(),
            t.connected,
            t.errors()
        ));
        if t.connected >= n || ramp_start.elapsed() >= ramp_timeout {
            break;
        }
    }
    let ramp_s = ramp_start.elapsed().as_secs_f64();

    let counts = Arc::new(DriveCounts::default());
    tokio::spawn(drive(
        Arc::clone(ops),
        demands,
        cfg.rollup_interval,
        cfg.changed_fraction,
        cfg.seed,
        Arc::clone(&counts),
        stop.clone(),
    ));

    // Warm-up, then until decide's queue has (nearly) drained.
    let warm_start = Instant::now();
    while warm_start.elapsed() < cfg.warmup {
        tokio::time::sleep(Duration::from_secs(1).min(cfg.warmup)).await;
        children.check_alive()?;
        let d = scrape_role(children, Role::Decide, "decide").await?;
        let t = Totals::of(ops);
        progress(&format!(
            "warm-up t={:.0}s connected={}/{n} acks={} actions={} queued={} errors={}",
            warm_start.elapsed().as_secs_f64(),
            t.connected,
            t.acks,
            d.sum(ACTIONS_METRIC) as u64,
            (d.sum(QUEUE_METRIC) + d.sum(INFLIGHT_METRIC)) as u64,
            t.errors()
        ));
    }
    let settle_start = Instant::now();
    let backlog_ok = (n as f64 / 100.0).max(10.0);
    let settled = loop {
        children.check_alive()?;
        let d = scrape_role(children, Role::Decide, "decide").await?;
        let backlog = (d.sum(QUEUE_METRIC) + d.sum(INFLIGHT_METRIC)) as u64;
        if backlog as f64 <= backlog_ok {
            break true;
        }
        if settle_start.elapsed() >= cfg.settle_timeout {
            progress(&format!(
                "decide's action backlog is still {backlog} after {}; measuring anyway",
                humantime::format_duration(cfg.settle_timeout)
            ));
            break false;
        }
        progress(&format!("settling: decide's action backlog {backlog}"));
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let settle_s = settle_start.elapsed().as_secs_f64();

    // --- the window ---
    let d0 = scrape_role(children, Role::Decide, "decide").await?;
    let g0 = scrape_role(children, Role::Gateway, "gateway").await?;
    let cpu0 = Cpu::now(children);
    let t0 = Totals::of(ops);
    let (c0, i0) = (
        counts.changed.load(Ordering::Relaxed),
        counts.identical.load(Ordering::Relaxed),
    );
    latency.reset();
    let start = Instant::now();
    let mut last = (t0, start);
    while start.elapsed() < cfg.duration {
        let left = cfg.duration.saturating_sub(start.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        children.check_alive()?;
        let t = Totals::of(ops);
        let dt = last.1.elapsed().as_secs_f64().max(1e-6);
        progress(&format!(
            "measure t={:.0}s connected={}/{n} acks/s={:.0} pushes/s={:.0} ack_p99={:.1}ms errors={}",
            start.elapsed().as_secs_f64(),
            t.connected,
            (t.acks - last.0.acks) as f64 / dt,
            (t.pushes() - last.0.pushes()) as f64 / dt,
            latency.quantile_ms(0.99),
            t.errors()
        ));
        last = (t, Instant::now());
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu1 = Cpu::now(children);
    let t1 = Totals::of(ops);
    let (ack_p50, ack_p99) = (latency.quantile_ms(0.5), latency.quantile_ms(0.99));
    let d1 = scrape_role(children, Role::Decide, "decide").await?;
    let g1 = scrape_role(children, Role::Gateway, "gateway").await?;
    let (c1, i1) = (
        counts.changed.load(Ordering::Relaxed),
        counts.identical.load(Ordering::Relaxed),
    );

    let window = |name: &str, a: &Scrape, b: &Scrape| {
        b.has(name)
            .then(|| prom::bucket_delta(&a.buckets(name), &b.buckets(name)))
    };
    let cycle = window(CYCLE_METRIC, &d0, &d1).unwrap_or_default();
    let d2d = window(DEMAND_TO_DECISION_METRIC, &d0, &d1);
    let count = |b: &[(f64, f64)]| b.last().map_or(0, |(_, n)| *n as u64);
    let unchanged =
        (d1.has(ROLLUPS_UNCHANGED_METRIC) || g1.has(ROLLUPS_UNCHANGED_METRIC)).then(|| {
            (d1.sum(ROLLUPS_UNCHANGED_METRIC) + g1.sum(ROLLUPS_UNCHANGED_METRIC)
                - d0.sum(ROLLUPS_UNCHANGED_METRIC)
                - g0.sum(ROLLUPS_UNCHANGED_METRIC)) as u64
        });
    let rss = |role| role_sum(children, role, rss_mb).map(round3);
    let acks = t1.acks - t0.acks;
    Ok(ShardLoadReport {
        operators: n,
        needs_per_operator: cfg.needs_per_operator,
        machines: cfg.machines,
        execute_workers: cfg.execute_workers,
        rollup_interval_s: cfg.rollup_interval.as_secs_f64(),
        changed_fraction: cfg.changed_fraction,
        cycle_interval_s: cfg.cycle_interval.as_secs_f64(),
        connected: t1.connected,
        ramp_s: round3(ramp_s),
        settle_s: round3(settle_s),
        settled,
        window_s: round3(wall),
        rollups_per_second: round3(acks as f64 / wall.max(1e-9)),
        rollups_acked: acks,
        rollups_changed: c1 - c0,
        rollups_identical: i1 - i0,
        ack_p50_ms: ack_p50,
        ack_p99_ms: ack_p99,
        demand_to_decision_p50_ms: d2d.as_deref().and_then(|b| ms(prom::quantile(b, 0.5))),
        demand_to_decision_p99_ms: d2d.as_deref().and_then(|b| ms(prom::quantile(b, 0.99))),
        demand_to_decision_samples: d2d.as_deref().map(count),
        cycle_p50_ms: ms(prom::quantile(&cycle, 0.5)),
        cycle_p99_ms: ms(prom::quantile(&cycle, 0.99)),
        cycle_p99_bucket_ms: ms(prom::quantile_bucket_bound(&cycle, 0.99)),
        cycles: count(&cycle),
        cycle_phase_mean_ms: phase_means(&d0, &d1),
        rollups_unchanged: unchanged,
        pushes_per_second: round3((t1.pushes() - t0.pushes()) as f64 / wall.max(1e-9)),
        actions: (d1.sum(ACTIONS_METRIC) - d0.sum(ACTIONS_METRIC)).max(0.0) as u64,
        shortfalls_at_end: d1
            .has(SHORTFALLS_METRIC)
            .then(|| d1.sum(SHORTFALLS_METRIC) as u64),
        decide_cpu_cores: cores(cpu0.decide, cpu1.decide, wall),
        gateway_cpu_cores: cores(cpu0.gateway, cpu1.gateway, wall),
        execute_cpu_cores: cores(cpu0.execute, cpu1.execute, wall),
        provider_cpu_cores: cores(cpu0.provider, cpu1.provider, wall),
        loadgen_cpu_cores: cores(cpu0.me, cpu1.me, wall),
        decide_rss_mib: rss(Role::Decide),
        gateway_rss_mib: rss(Role::Gateway),
        execute_rss_mib: rss(Role::Execute),
        provider_rss_mib: rss(Role::Provider),
        errors: t1.errors,
        load_average_at_start: None,
        targets: Targets {
            shape: "n/a".into(),
            checks: Default::default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_always_differs_and_stays_within_two_machines() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut d = OperatorDemand::base(5);
        assert_eq!(d.replicas, [12, 6, 3, 12, 6]);
        for _ in 0..2000 {
            let before = d.clone();
            d.change(&mut rng);
            assert_ne!(before, d);
            let diffs = before
                .replicas
                .iter()
                .zip(&d.replicas)
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(diffs, 1);
            for (j, &r) in d.replicas.iter().enumerate() {
                let (base, cores, _) = base_need(j);
                assert!(r >= 1 && r <= base + base / 2, "need {j}: {r}");
                // At most 36 cores: two 32-core machines.
                assert!(r * cores <= 36, "need {j}: {r} × {cores}");
            }
        }
        let rollup = d.demand().rollup("cluster-00001", 1);
        assert_eq!(rollup.needs.len(), 5);
        assert!(bigfleet_conv::rollup_from_proto(&rollup).is_ok());
    }

    #[test]
    fn the_catalog_binds_one_machine_per_need_to_every_cluster() {
        let c = catalog(10, 3, 1000);
        c.validate().unwrap();
        assert_eq!(c.machine_count(), 1000);
        let counts = c.pools[0].counts;
        assert_eq!(counts.configured, 30);
        assert_eq!(counts.idle, 291);
        assert_eq!(counts.speculative, 679);
        assert_eq!(c.pools[0].clusters.len(), 10);
        assert_eq!(c.pools[0].clusters[3], "cluster-00003");
    }

    #[test]
    fn configs_that_cannot_work_are_refused() {
        let ok = ShardLoadConfig::default();
        assert!(ok.validate().is_ok());
        for bad in [
            ShardLoadConfig {
                operators: 0,
                ..ok.clone()
            },
            ShardLoadConfig {
                changed_fraction: 1.5,
                ..ok.clone()
            },
            ShardLoadConfig {
                machines: 5000,
                ..ok.clone()
            },
            ShardLoadConfig {
                execute_workers: 0,
                ..ok.clone()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(ShardLoadError::Config(_))),
                "{bad:?}"
            );
        }
    }

    fn report() -> ShardLoadReport {
        ShardLoadReport {
            operators: 10_000,
            needs_per_operator: 3,
            machines: 100_000,
            execute_workers: 1,
            rollup_interval_s: 2.0,
            changed_fraction: 0.1,
            cycle_interval_s: 1.0,
            connected: 10_000,
            ramp_s: 1.0,
            settle_s: 0.0,
            settled: true,
            window_s: 30.0,
            rollups_per_second: 5000.0,
            rollups_acked: 150_000,
            rollups_changed: 15_000,
            rollups_identical: 135_000,
            ack_p50_ms: 2.0,
            ack_p99_ms: 20.0,
            demand_to_decision_p50_ms: None,
            demand_to_decision_p99_ms: None,
            demand_to_decision_samples: None,
            cycle_p50_ms: Some(20.0),
            cycle_p99_ms: Some(120.0),
            cycle_p99_bucket_ms: Some(128.0),
            cycles: 30,
            cycle_phase_mean_ms: Default::default(),
            rollups_unchanged: None,
            pushes_per_second: 0.0,
            actions: 0,
            shortfalls_at_end: Some(0),
            decide_cpu_cores: Some(0.3),
            gateway_cpu_cores: Some(0.4),
            execute_cpu_cores: Some(0.01),
            provider_cpu_cores: Some(0.01),
            loadgen_cpu_cores: Some(0.5),
            decide_rss_mib: Some(100.0),
            gateway_rss_mib: Some(300.0),
            execute_rss_mib: Some(10.0),
            provider_rss_mib: Some(50.0),
            errors: SessionErrors::default(),
            load_average_at_start: Some(1.0),
            targets: Targets {
                shape: "n/a".into(),
                checks: Default::default(),
            },
        }
    }

    #[test]
    fn targets_apply_to_the_issue_shapes_only() {
        let mut cfg = ShardLoadConfig {
            operators: 10_000,
            ..ShardLoadConfig::default()
        };
        let r = report();
        let t = targets(&cfg, &r);
        assert_eq!(t.shape, "10k");
        assert_eq!(t.checks["ack_p99_ms"].pass, Some(true));
        assert_eq!(t.checks["cycle_p99_ms"].pass, Some(false));
        assert_eq!(t.checks["decide_cpu_cores"].pass, Some(true));
        assert_eq!(t.checks["errors"].pass, Some(true));
        // Not measured: neither pass nor fail.
        assert_eq!(t.checks["demand_to_decision_p99_ms"].pass, None);

        cfg.operators = 1000;
        let t = targets(&cfg, &r);
        assert_eq!(t.shape, "1k");
        assert_eq!(t.checks.len(), 1);
        assert_eq!(t.checks["decide_cpu_cores"].pass, Some(false));

        cfg.changed_fraction = 0.5;
        assert_eq!(targets(&cfg, &r).shape, "n/a");
        assert!(targets(&cfg, &r).checks.is_empty());
    }

    #[test]
    fn the_report_serializes_missing_metrics_as_null() {
        let v = serde_json::to_value(report()).unwrap();
        assert!(v["demand_to_decision_p99_ms"].is_null());
        assert_eq!(v["cycles"], 30);
        assert_eq!(v["targets"]["shape"], "n/a");
    }
}
