//! The scale harness (`e2e-bench`): a whole shard — session gateway, decide and an execute
//! worker pool over Unix sockets, against an instant in-process fake provider — in this
//! process, driven by simulated operators.
//!
//! * [`run_bench`]: N single-machine units of demand against N Idle machines; how long
//!   until every unit is Configured, actions per second, cycle p99.
//! * [`crate::soak::run_soak`] (its own module): many cycles of churning demand, then a
//!   settle and checks for leaked, phantom or stuck records.
//!
//! Everything runs in-process (the same `start` APIs the binaries' `run` wraps) so the
//! numbers measure the services, not process start-up; `bigfleet up` is the multi-process
//! counterpart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_fake_provider::{
    CapacityKind, Catalog, FakeProvider, InstanceType, Pool, ProviderConfig, StateCounts,
};
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::MetricsRegistry;
use clap::Parser;
use serde::Serialize;

use crate::demand::{Demand, NeedSpec};
use crate::operator::{Operator, OperatorConfig, OperatorHandle};

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

/// How the in-process shard is configured.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    pub catalog: Catalog,
    pub cycle_interval: Duration,
    /// Execute actions in flight.
    pub concurrency: u32,
    pub reclaim_cap_fraction: f64,
    /// Per-cluster roll-ups per second at the gateway.
    pub rollup_rate: f64,
}

impl ShardConfig {
    pub fn new(catalog: Catalog) -> Self {
        Self {
            catalog,
            cycle_interval: Duration::from_millis(100),
            concurrency: 256,
            reclaim_cap_fraction: 0.05,
            rollup_rate: 50.0,
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

/// One shard in this process.
pub struct InProcessShard {
    pub provider: Arc<FakeProvider>,
    provider_server: bigfleet_fake_provider::ServerHandle,
    decide: svc_shard_decide::Running,
    gateway: svc_session_gateway::Running,
    execute: svc_shard_execute::Running,
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
    /// Provider, decide (ready after its first reconcile), gateway and execute pool.
    pub async fn start(cfg: ShardConfig) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("bf-bench-").tempdir()?;
        let provider = Arc::new(FakeProvider::from_catalog(
            &cfg.catalog,
            ProviderConfig::default(),
        )?);
        let provider_server =
            bigfleet_fake_provider::spawn_uds(&dir.path().join("provider.sock"), provider.clone())
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
        decide_cfg.decide.rails.reclaim_cap_fraction = cfg.reclaim_cap_fraction;
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

        let mut x = svc_shard_execute::Config::new(
            &format!("unix://{}", decide.socket_path().display()),
            &format!("unix://{}", gateway.socket_path().display()),
            &provider_target,
        );
        x.concurrency = cfg.concurrency;
        x.drain_timeout = Duration::from_secs(2);
        let execute = svc_shard_execute::start(x)
            .await
            .map_err(|e| start_err("execute")(e.to_string()))?;

        let deadline = Instant::now() + Duration::from_secs(30);
        while !decide.decide().is_ready() {
            if Instant::now() > deadline {
                return Err(start_err("decide")("not ready after 30s".into()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
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

    /// Actions the worker pool finished (any outcome) and how many succeeded.
    pub fn actions_executed(&self) -> (u64, u64) {
        let text = self.execute.registry().encode_text().unwrap_or_default();
        let name = "bigfleet_shard_action_execute_outcomes_total";
        (
            sum_metric(&text, name, None),
            sum_metric(&text, name, Some(("outcome", "success"))),
        )
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
        self.execute.shutdown().await;
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
    pub concurrency: u32,
    pub timeout: Duration,
}

/// What `e2e-bench --units N --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchReport {
    pub units: u32,
    pub configured: u64,
    /// From the demand change to the last unit Configured (`null` when it never happened).
    pub seconds_to_all_configured: Option<f64>,
    /// Executed actions per second over that window.
    pub actions_per_s: f64,
    pub cycle_p99_ms: f64,
    pub cycles: u64,
    pub clusters: u32,
    pub actions_executed: u64,
    pub actions_succeeded: u64,
}

/// N single-machine units against N Idle machines.
pub async fn run_bench(cfg: &BenchConfig) -> Result<BenchReport, HarnessError> {
    let mut shard_cfg = ShardConfig::new(unit_catalog(cfg.units, 0));
    shard_cfg.cycle_interval = cfg.cycle_interval;
    shard_cfg.concurrency = cfg.concurrency;
    let shard = InProcessShard::start(shard_cfg).await?;
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
    let started = Instant::now();
    for (c, o) in ops.iter().enumerate() {
        let c = c as u32;
        let share = cfg.units / clusters + u32::from(c < cfg.units % clusters);
        o.set_demand(unit_demand(share, 1000));
    }
    let target = u64::from(cfg.units);
    let mut configured = 0u64;
    let mut took = None;
    while started.elapsed() < cfg.timeout {
        configured = shard
            .provider
            .ids_in_state(pb::MachineState::Configured)
            .len() as u64;
        if configured >= target {
            took = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let window = took.unwrap_or_else(|| started.elapsed());
    // The provider shows Configured a moment before the workers count the action as done.
    let drain = Instant::now() + Duration::from_secs(5);
    while shard.decide().action_counts() != (0, 0) && Instant::now() < drain {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (a1, s1) = shard.actions_executed();
    let report = BenchReport {
        units: cfg.units,
        configured,
        seconds_to_all_configured: took.map(|d| round3(d.as_secs_f64())),
        actions_per_s: round3((a1 - a0) as f64 / window.as_secs_f64().max(1e-9)),
        cycle_p99_ms: round3(shard.cycle_p99_ms()),
        cycles: shard.cycles(),
        clusters,
        actions_executed: a1 - a0,
        actions_succeeded: s1 - s0,
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
            units: 20,
            clusters: 2,
            cycle_interval: Duration::from_millis(50),
            concurrency: 32,
            timeout: Duration::from_secs(30),
        })
        .await
        .unwrap();
        assert_eq!(report.configured, 20, "{report:?}");
        assert!(report.seconds_to_all_configured.is_some(), "{report:?}");
        assert!(report.actions_executed >= 20, "{report:?}");
        assert!(report.cycles > 0);
    }
}
