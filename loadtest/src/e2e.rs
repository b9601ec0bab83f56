//! The scale harness (`e2e-bench`): a whole shard — session gateway, decide and execute
//! workers over Unix sockets, against an in-process fake provider (instant, or with a delay
//! before every mutating call) — driven by simulated operators.
//!
//! * [`run_bench`]: N single-machine units of demand against N Idle machines; how long
//!   until every unit is Configured, actions per second, cycle p99, and whether every
//!   machine was handled exactly once.
//! * [`crate::soak::run_soak`] (its own module): many cycles of churning demand, then a
//!   settle and checks for leaked, phantom or stuck records.
//!
//! Gateway, decide and provider run in-process (the same `start` APIs the binaries' `run`
//! wraps). Execute runs either as one in-process pool ([`ExecuteMode::InProcess`]) or as N
//! separate OS processes of the real service ([`ExecuteMode::Processes`], [`workers`]),
//! each dialing decide's Work socket, so the hand-out across processes is what a
//! multi-replica execute Deployment sees.

pub mod workers;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_fake_provider::{
    CapacityKind, Catalog, FakeProvider, InstanceType, Pool, ProviderConfig, StateCounts,
};
use bigfleet_mesh::poll_until;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::MetricsRegistry;
use clap::Parser;
use serde::Serialize;

use crate::demand::{Demand, NeedSpec};
use crate::operator::{Operator, OperatorConfig, OperatorHandle};
pub use workers::{WorkerCommand, WorkerProcesses, WorkerTargets};

/// Decide's count of the actions workers reported done, by kind and outcome (execute's own
/// count is [`workers::OUTCOMES_METRIC`]; one name per meaning, docs/metrics.md).
pub const DECIDE_OUTCOMES_METRIC: &str = "bigfleet_shard_decide_action_outcomes_total";

/// Instance type of a bench unit: one unit fills one machine.
pub const UNIT_TYPE: &str = "c.unit.16";
/// CPU cores and memory (GiB) of a unit.
pub const UNIT_CORES: u32 = 16;
pub const UNIT_MEMORY_GIB: u32 = 64;

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{what}: {reason}")]
    Start { what: &'static str, reason: String },
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Catalog(#[from] bigfleet_fake_provider::CatalogError),
}

fn start_err(what: &'static str) -> impl Fn(String) -> HarnessError {
    move |reason| HarnessError::Start { what, reason }
}

/// Where execute runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ExecuteMode {
    /// One worker pool inside this process.
    #[default]
    InProcess,
    /// `count` worker processes started with `command`, each with the shard's concurrency.
    Processes { count: u32, command: WorkerCommand },
}

impl ExecuteMode {
    /// Worker processes (0 for the in-process pool).
    pub fn processes(&self) -> u32 {
        match self {
            Self::InProcess => 0,
            Self::Processes { count, .. } => *count,
        }
    }
}

/// How the in-process shard is configured.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    pub catalog: Catalog,
    pub cycle_interval: Duration,
    /// Execute actions in flight (per process in [`ExecuteMode::Processes`]).
    pub concurrency: u32,
    pub reclaim_cap_fraction: f64,
    /// Per-cluster roll-ups per second at the gateway.
    pub rollup_rate: f64,
    pub execute: ExecuteMode,
    /// Delay before every mutating provider call is handled.
    pub provider_latency: Duration,
}

impl ShardConfig {
    pub fn new(catalog: Catalog) -> Self {
        Self {
            catalog,
            cycle_interval: Duration::from_millis(100),
            concurrency: 256,
            reclaim_cap_fraction: 0.05,
            rollup_rate: 50.0,
            execute: ExecuteMode::InProcess,
            provider_latency: Duration::ZERO,
        }
    }
}

/// A catalog of `idle` Idle unit machines (reserved) and `speculative` Speculative spot
/// slots of the same shape, over three zones.
pub fn unit_catalog(idle: u32, speculative: u32) -> Catalog {
    let mut instance_types = BTreeMap::new();
    instance_types.insert(
        UNIT_TYPE.to_owned(),
        InstanceType {
            resources: [
                ("cpu".to_owned(), UNIT_CORES.to_string()),
                ("memory".to_owned(), format!("{UNIT_MEMORY_GIB}Gi")),
            ]
            .into_iter()
            .collect(),
            allocatable: None,
            labels: BTreeMap::new(),
        },
    );
    let zones: Vec<String> = ["fake-1a", "fake-1b", "fake-1c"]
        .iter()
        .map(|z| (*z).to_owned())
        .collect();
    let mut pools = Vec::new();
    if idle > 0 {
        pools.push(Pool {
            name: "unit".into(),
            instance_type: UNIT_TYPE.into(),
            capacity_type: CapacityKind::Reserved,
            zones: zones.clone(),
            price_per_hour: 0.5,
            interruption_probability: 0.0,
            labels: BTreeMap::new(),
            rack_size: None,
            clusters: Vec::new(),
            counts: StateCounts {
                idle,
                ..StateCounts::default()
            },
        });
    }
    if speculative > 0 {
        pools.push(Pool {
            name: "spot".into(),
            instance_type: UNIT_TYPE.into(),
            capacity_type: CapacityKind::Spot,
            zones,
            price_per_hour: 0.2,
            interruption_probability: 0.02,
            labels: BTreeMap::new(),
            rack_size: None,
            clusters: Vec::new(),
            counts: StateCounts {
                speculative,
                ..StateCounts::default()
            },
        });
    }
    Catalog {
        provider: "fake".into(),
        instance_types,
        pools,
    }
}

/// `units` single-machine units at `priority` for one cluster.
pub fn unit_demand(units: u32, priority: i32) -> Demand {
    Demand::new(vec![NeedSpec::cpu(
        units,
        UNIT_CORES,
        UNIT_MEMORY_GIB,
        priority,
    )])
}

enum Execute {
    InProcess(svc_shard_execute::Running),
    Processes(WorkerProcesses),
}

/// One shard in this process (execute possibly in child processes).
pub struct InProcessShard {
    pub provider: Arc<FakeProvider>,
    provider_server: bigfleet_fake_provider::ServerHandle,
    decide: svc_shard_decide::Running,
    gateway: svc_session_gateway::Running,
    execute: Execute,
    decide_registry: MetricsRegistry,
    gateway_target: String,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for InProcessShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessShard")
            .field("gateway", &self.gateway_target)
            .finish_non_exhaustive()
    }
}

impl InProcessShard {
    /// Provider, decide (ready after its first reconcile), gateway and execute workers
    /// (connected, for worker processes).
    pub async fn start(cfg: ShardConfig) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("bf-bench-").tempdir()?;
        let provider = Arc::new(FakeProvider::from_catalog(
            &cfg.catalog,
            ProviderConfig::default(),
        )?);
        let provider_server = bigfleet_fake_provider::server::spawn_uds_with(
            &dir.path().join("provider.sock"),
            provider.clone(),
            bigfleet_fake_provider::server::ServeOptions {
                rpc_latency: cfg.provider_latency,
                ..Default::default()
            },
        )
        .await?;
        let provider_target = provider_server.target();

        let args = svc_shard_decide::Args::try_parse_from([
            "bigfleet-shard-decide",
            "--provider-addr",
            &provider_target,
        ])
        .map_err(|e| HarnessError::Start {
            what: "decide flags",
            reason: e.to_string(),
        })?;
        let mut decide_cfg = svc_shard_decide::StartConfig::new(dir.path(), &provider_target);
        decide_cfg.decide = svc_shard_decide::decide_config(&args, 1);
        decide_cfg.decide.cycle_interval = cfg.cycle_interval;
        decide_cfg.decide.rails.reclaim_budget_fraction = cfg.reclaim_cap_fraction;
        decide_cfg.drain_timeout = Duration::from_secs(2);
        let decide_registry = decide_cfg.registry.clone();
        let decide = svc_shard_decide::start(decide_cfg)
            .await
            .map_err(|e| start_err("decide")(e.to_string()))?;

        let mut gw = svc_session_gateway::GatewayConfig::new(dir.path());
        gw.settings.rollup_rate = svc_session_gateway::RollupRate {
            per_second: cfg.rollup_rate,
            burst: svc_session_gateway::burst_for(cfg.rollup_rate),
        };
        gw.drain_timeout = Duration::from_secs(2);
        let gateway = svc_session_gateway::start(gw)
            .await
            .map_err(|e| start_err("gateway")(e.to_string()))?;
        let gateway_target = format!(
            "http://{}",
            gateway
                .public_addr()
                .ok_or_else(|| start_err("gateway")("no public address".into()))?
        );

        let targets = WorkerTargets {
            decide: workers::unix_target(decide.socket_path()),
            gateway: workers::unix_target(gateway.socket_path()),
            provider: provider_target.clone(),
        };
        let mut execute = match &cfg.execute {
            ExecuteMode::InProcess => {
                let mut x = svc_shard_execute::Config::new(
                    &targets.decide,
                    &targets.gateway,
                    &targets.provider,
                );
                x.concurrency = cfg.concurrency;
                x.drain_timeout = Duration::from_secs(2);
                Execute::InProcess(
                    svc_shard_execute::start(x)
                        .await
                        .map_err(|e| start_err("execute")(e.to_string()))?,
                )
            }
            ExecuteMode::Processes { count, command } => Execute::Processes(
                WorkerProcesses::spawn(command, *count, cfg.concurrency, &targets)?,
            ),
        };

        let (within, every) = (Duration::from_secs(30), Duration::from_millis(10));
        let Ok(ready) = poll_until(within, every, async || {
            Ok::<_, Infallible>(decide.decide().is_ready().then_some(()))
        })
        .await;
        ready.ok_or_else(|| start_err("decide")("not ready after 30s".into()))?;
        // Every worker process holds a Work stream before any demand arrives, so the
        // hand-out is shared from the first action on.
        if let Execute::Processes(procs) = &mut execute {
            let want = procs.len() as u64;
            poll_until(within, every, async || {
                procs.check_alive()?;
                let text = decide_registry.encode_text().unwrap_or_default();
                let streams = sum_metric(&text, "bigfleet_shard_work_streams", None);
                Ok::<_, HarnessError>((streams >= want).then_some(()))
            })
            .await?
            .ok_or_else(|| {
                start_err("execute processes")(format!("fewer than {want} work streams after 30s"))
            })?;
        }
        Ok(Self {
            provider,
            provider_server,
            decide,
            gateway,
            execute,
            decide_registry,
            gateway_target,
            _dir: dir,
        })
    }

    /// What operators dial.
    pub fn gateway_target(&self) -> &str {
        &self.gateway_target
    }

    pub fn decide(&self) -> &svc_shard_decide_core::Decide {
        self.decide.decide()
    }

    /// Decision cycles so far.
    pub fn cycles(&self) -> u64 {
        self.decide.decide().cycle_count()
    }

    /// Actions the workers reported done to decide (any outcome) and how many succeeded,
    /// from decide's own counter (one source whatever runs execute).
    pub fn actions_executed(&self) -> (u64, u64) {
        let text = self.decide_registry.encode_text().unwrap_or_default();
        let name = DECIDE_OUTCOMES_METRIC;
        (
            sum_metric(&text, name, None),
            sum_metric(&text, name, Some(("outcome", "success"))),
        )
    }

    /// Decide's finished actions per outcome label.
    pub fn outcomes(&self) -> BTreeMap<String, u64> {
        let text = self.decide_registry.encode_text().unwrap_or_default();
        label_counts(&text, DECIDE_OUTCOMES_METRIC, "outcome")
    }

    /// Per worker process: actions it finished and how many succeeded, from its own
    /// metrics (empty for the in-process pool).
    pub async fn per_process_executed(&self) -> Result<Vec<(u64, u64)>, HarnessError> {
        match &self.execute {
            Execute::InProcess(_) => Ok(Vec::new()),
            Execute::Processes(p) => p.executed().await,
        }
    }

    /// CPU seconds used so far by this process (decide, gateway, provider, operators and
    /// an in-process pool) and by the worker processes together (`None` off Linux).
    pub fn cpu_seconds(&self) -> Option<(f64, f64)> {
        let own = workers::process_cpu_seconds(std::process::id())?;
        let workers = match &self.execute {
            Execute::InProcess(_) => 0.0,
            Execute::Processes(p) => p.cpu_seconds()?.iter().sum(),
        };
        Some((own, workers))
    }

    /// An error when a worker process died.
    pub fn check_workers(&mut self) -> Result<(), HarnessError> {
        match &mut self.execute {
            Execute::InProcess(_) => Ok(()),
            Execute::Processes(p) => p.check_alive(),
        }
    }

    /// Machines in `state` at the provider (a counter read, no listing).
    pub fn provider_count(&self, state: pb::MachineState) -> u64 {
        let name = state.as_str_name().trim_start_matches("MACHINE_STATE_");
        self.provider
            .stats()
            .by_state
            .get(&name.to_ascii_lowercase())
            .map_or(0, |n| *n as u64)
    }

    /// p99 of decide's cycle duration (upper bound of the bucket holding it), ms.
    pub fn cycle_p99_ms(&self) -> f64 {
        let text = self.decide_registry.encode_text().unwrap_or_default();
        histogram_quantile(&text, "bigfleet_shard_cycle_duration_seconds", 0.99) * 1000.0
    }

    /// Machines of the provider per state.
    pub fn provider_machines(&self) -> Vec<pb::Machine> {
        self.provider.list(&pb::ListFilter::default()).machines
    }

    /// Starts an operator for `cluster` on this shard.
    pub fn operator(
        &self,
        cluster: &str,
        demand: Demand,
        rollup_interval: Duration,
        churn: Option<crate::demand::Churn>,
    ) -> OperatorHandle {
        let mut cfg = OperatorConfig::new(cluster, &self.gateway_target);
        cfg.demand = demand;
        cfg.rollup_interval = rollup_interval;
        cfg.churn = churn;
        Operator::spawn(cfg)
    }

    /// Stops everything, workers first.
    pub async fn shutdown(self) {
        match self.execute {
            Execute::InProcess(x) => x.shutdown().await,
            Execute::Processes(p) => p.shutdown().await,
        }
        let _ = self.gateway.shutdown().await;
        let _ = self.decide.shutdown().await;
        self.provider_server.shutdown().await;
    }
}

/// Sum of a counter/gauge in Prometheus text, optionally filtered by one label.
pub fn sum_metric(text: &str, name: &str, label: Option<(&str, &str)>) -> u64 {
    let mut total = 0.0;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if let Some((k, v)) = label
            && !rest.contains(&format!("{k}=\"{v}\""))
        {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            total += v;
        }
    }
    total as u64
}

/// A counter's values summed per value of `label`.
pub fn label_counts(text: &str, name: &str, label: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let key = format!("{label}=\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !rest.starts_with('{') {
            continue;
        }
        let Some(start) = rest.find(&key) else {
            continue;
        };
        let value_text = &rest[start + key.len()..];
        let Some(end) = value_text.find('"') else {
            continue;
        };
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *out.entry(value_text[..end].to_owned()).or_insert(0) += v as u64;
        }
    }
    out
}

/// The upper bound of the first histogram bucket whose cumulative count reaches `q` of
/// the total (seconds); 0 with no observations.
pub fn histogram_quantile(text: &str, name: &str, q: f64) -> f64 {
    let bucket = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&bucket) else {
            continue;
        };
        let Some(le_start) = rest.find("le=\"") else {
            continue;
        };
        let le_text = &rest[le_start + 4..];
        let Some(le_end) = le_text.find('"') else {
            continue;
        };
        let le = match &le_text[..le_end] {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or(f64::INFINITY),
        };
        let count = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        buckets.push((le, count));
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some(&(_, total)) = buckets.last() else {
        return 0.0;
    };
    if total == 0.0 {
        return 0.0;
    }
    let mut last_finite = 0.0;
    for (le, c) in &buckets {
        if le.is_finite() {
            last_finite = *le;
        }
        if *c >= q * total {
            return if le.is_finite() { *le } else { last_finite };
        }
    }
    last_finite
}

/// `e2e-bench --units N` settings.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub units: u32,
    /// Clusters sharing the units (each one need).
    pub clusters: u32,
    pub cycle_interval: Duration,
    /// Actions in flight per execute pool (per process in [`ExecuteMode::Processes`]).
    pub concurrency: u32,
    pub timeout: Duration,
    pub execute: ExecuteMode,
    /// Delay before every mutating provider call is handled.
    pub provider_latency: Duration,
}

impl BenchConfig {
    /// `units` over 4 clusters, 100 ms cycles, 64 in flight, in-process execute, instant
    /// provider, 120 s budget.
    pub fn new(units: u32) -> Self {
        Self {
            units,
            clusters: 4,
            cycle_interval: Duration::from_millis(100),
            concurrency: 64,
            timeout: Duration::from_secs(120),
            execute: ExecuteMode::InProcess,
            provider_latency: Duration::ZERO,
        }
    }
}

/// What `e2e-bench --units N --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchReport {
    pub units: u32,
    pub configured: u64,
    /// From the demand change to the last unit Configured (`null` when it never happened).
    pub seconds_to_all_configured: Option<f64>,
    /// From decide's first action to the last unit Configured: the window of
    /// `actions_per_s` (cycle and roll-up latency before the first action excluded).
    pub seconds_first_action_to_all_configured: Option<f64>,
    /// Actions decide saw done per second over that window.
    pub actions_per_s: f64,
    pub cycle_p99_ms: f64,
    pub cycles: u64,
    pub clusters: u32,
    /// Execute worker processes; 0 = one pool inside the bench process.
    pub execute_processes: u32,
    pub concurrency_per_pool: u32,
    pub provider_latency_ms: f64,
    /// Actions reported done to decide (any outcome) and the successful ones.
    pub actions_executed: u64,
    pub actions_succeeded: u64,
    /// Decide's done actions per outcome.
    pub outcomes: BTreeMap<String, u64>,
    /// Per worker process: actions it finished, from its own metrics.
    pub per_process_actions: Vec<u64>,
    /// Transitions the provider started (a replayed call starts none).
    pub provider_operations: u64,
    /// CPU seconds over the run (demand change to all Configured) of the bench process
    /// (decide, gateway, provider, operators; plus the pool when in-process) and of the
    /// worker processes; `null` off Linux.
    pub cpu_seconds_shard: Option<f64>,
    pub cpu_seconds_workers: Option<f64>,
    /// Every unit Configured by exactly one successful action and exactly one provider
    /// transition, and (processes) the workers' own counts add up to decide's.
    pub exactly_once: bool,
}

/// N single-machine units against N Idle machines.
pub async fn run_bench(cfg: &BenchConfig) -> Result<BenchReport, HarnessError> {
    let mut shard_cfg = ShardConfig::new(unit_catalog(cfg.units, 0));
    shard_cfg.cycle_interval = cfg.cycle_interval;
    shard_cfg.concurrency = cfg.concurrency;
    shard_cfg.execute = cfg.execute.clone();
    shard_cfg.provider_latency = cfg.provider_latency;
    let mut shard = InProcessShard::start(shard_cfg).await?;
    let clusters = cfg.clusters.clamp(1, cfg.units.max(1));
    let mut ops = Vec::new();
    for c in 0..clusters {
        ops.push(shard.operator(
            &format!("bench-{c}"),
            Demand::empty(),
            Duration::from_secs(30),
            None,
        ));
    }
    for o in &ops {
        if !o.wait_connected(Duration::from_secs(30)).await {
            return Err(start_err("operators")(format!(
                "{} did not connect",
                o.cluster_id()
            )));
        }
    }
    let (a0, s0) = shard.actions_executed();
    let outcomes0 = shard.outcomes();
    let ops0 = shard.provider.stats().operations;
    let workers0 = shard.per_process_executed().await?;
    let cpu0 = shard.cpu_seconds();
    let started = Instant::now();
    for (c, o) in ops.iter().enumerate() {
        let c = c as u32;
        let share = cfg.units / clusters + u32::from(c < cfg.units % clusters);
        o.set_demand(unit_demand(share, 1000));
    }
    let target = u64::from(cfg.units);
    let mut configured = 0u64;
    let mut took = None;
    let mut first_action = None;
    let mut last_liveness = Instant::now();
    while started.elapsed() < cfg.timeout {
        if first_action.is_none() && shard.decide().action_counts() != (0, 0) {
            first_action = Some(started.elapsed());
        }
        configured = shard.provider_count(pb::MachineState::Configured);
        if configured >= target {
            took = Some(started.elapsed());
            break;
        }
        if last_liveness.elapsed() > Duration::from_secs(1) {
            shard.check_workers()?;
            last_liveness = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let end = took.unwrap_or_else(|| started.elapsed());
    let cpu1 = shard.cpu_seconds();
    // An action shorter than the 5 ms poll can come and go unseen: then it started
    // within the last poll before the first Configured.
    let first = first_action.unwrap_or_default().min(end);
    let window = end.saturating_sub(first);
    // The provider shows Configured a moment before the workers report the action done.
    let drain = Instant::now() + Duration::from_secs(5);
    while shard.decide().action_counts() != (0, 0) && Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (a1, s1) = shard.actions_executed();
    let mut outcomes = shard.outcomes();
    for (k, v) in outcomes0 {
        if let Some(n) = outcomes.get_mut(&k) {
            *n = n.saturating_sub(v);
        }
    }
    outcomes.retain(|_, n| *n > 0);
    let workers1 = shard.per_process_executed().await?;
    let per_process: Vec<(u64, u64)> = workers1
        .iter()
        .enumerate()
        .map(|(i, &(a, s))| {
            let (a0, s0) = workers0.get(i).copied().unwrap_or_default();
            (a - a0, s - s0)
        })
        .collect();
    let provider_operations = shard.provider.stats().operations - ops0;
    let executed = a1 - a0;
    let succeeded = s1 - s0;
    let workers_agree = per_process.is_empty()
        || (per_process.iter().map(|p| p.0).sum::<u64>() == executed
            && per_process.iter().map(|p| p.1).sum::<u64>() == succeeded);
    let report = BenchReport {
        units: cfg.units,
        configured,
        seconds_to_all_configured: took.map(|d| round3(d.as_secs_f64())),
        seconds_first_action_to_all_configured: took.map(|_| round3(window.as_secs_f64())),
        actions_per_s: round3(executed as f64 / window.as_secs_f64().max(1e-9)),
        cycle_p99_ms: round3(shard.cycle_p99_ms()),
        cycles: shard.cycles(),
        clusters,
        execute_processes: cfg.execute.processes(),
        concurrency_per_pool: cfg.concurrency,
        provider_latency_ms: round3(cfg.provider_latency.as_secs_f64() * 1000.0),
        actions_executed: executed,
        actions_succeeded: succeeded,
        outcomes,
        per_process_actions: per_process.iter().map(|p| p.0).collect(),
        provider_operations,
        cpu_seconds_shard: cpu0.zip(cpu1).map(|(a, b)| round3(b.0 - a.0)),
        cpu_seconds_workers: cpu0.zip(cpu1).map(|(a, b)| round3(b.1 - a.1)),
        exactly_once: configured == target
            && succeeded == target
            && provider_operations == target
            && workers_agree,
    };
    for o in &ops {
        o.stop();
    }
    for o in ops {
        o.join().await;
    }
    shard.shutdown().await;
    Ok(report)
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_and_histograms() {
        let text = "# TYPE x counter\n\
            bigfleet_shard_action_execute_outcomes_total{kind=\"bootstrap\",outcome=\"success\"} 7\n\
            bigfleet_shard_action_execute_outcomes_total{kind=\"bootstrap\",outcome=\"fenced\"} 2\n\
            bigfleet_shard_action_execute_outcomes_totalx 100\n\
            h_bucket{le=\"0.001\"} 50\n\
            h_bucket{le=\"0.01\"} 98\n\
            h_bucket{le=\"0.1\"} 100\n\
            h_bucket{le=\"+Inf\"} 100\n";
        let n = "bigfleet_shard_action_execute_outcomes_total";
        assert_eq!(sum_metric(text, n, None), 9);
        assert_eq!(sum_metric(text, n, Some(("outcome", "success"))), 7);
        assert_eq!(histogram_quantile(text, "h", 0.99), 0.1);
        assert_eq!(histogram_quantile(text, "h", 0.5), 0.001);
        assert_eq!(histogram_quantile("", "h", 0.99), 0.0);
        let by = label_counts(text, n, "outcome");
        assert_eq!(by.get("success"), Some(&7));
        assert_eq!(by.get("fenced"), Some(&2));
        assert_eq!(by.len(), 2);
    }

    #[test]
    fn unit_catalog_counts() {
        let c = unit_catalog(10, 5);
        assert_eq!(c.machine_count(), 15);
        assert!(c.validate().is_ok());
        let d = unit_demand(3, 1);
        let r = d.rollup("c", 1);
        assert_eq!(r.needs[0].aggregate_resources["cpu"], "48");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_bench_configures_every_unit() {
        let report = run_bench(&BenchConfig {
            clusters: 2,
            cycle_interval: Duration::from_millis(50),
            concurrency: 32,
            timeout: Duration::from_secs(30),
            ..BenchConfig::new(20)
        })
        .await
        .unwrap();
        assert_eq!(report.configured, 20, "{report:?}");
        assert!(report.seconds_to_all_configured.is_some(), "{report:?}");
        assert!(report.actions_executed >= 20, "{report:?}");
        assert!(report.exactly_once, "{report:?}");
        assert_eq!(report.provider_operations, 20, "{report:?}");
        assert!(report.per_process_actions.is_empty(), "{report:?}");
        assert!(report.cycles > 0);
    }
}
