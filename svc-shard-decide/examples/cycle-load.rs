//! Decide alone under a whole shard's ingest: C clusters × K needs, each cluster
//! re-sending its roll-up every interval with a fraction of them changed, against an
//! in-memory List of M machines. Prints one JSON object: ingest cost per roll-up
//! (unchanged and changed), cycles run, cycle and phase means, demand-to-decision.
//!
//! ```text
//! cargo run --release -p svc-shard-decide --example cycle-load -- \
//!     --clusters 10000 --needs 3 --machines 100000 --changed 0.1 --seconds 20
//! ```
//! The operators' side (gRPC, gateway) is not here: `shard-load` in `loadtest/` runs
//! the whole shard. This isolates what decide itself costs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::{MetricsRegistry, Readiness};
use futures::future::BoxFuture;
use prost::Message as _;
use svc_shard_decide_core::edge;
use svc_shard_decide_core::reconcile::{MachineSource, RawMachineList};
use svc_shard_decide_core::{CyclePhase, Decide, DecideConfig, Publisher, ShardMetrics};

struct Opts {
    clusters: usize,
    needs: usize,
    machines: usize,
    changed: f64,
    seconds: u64,
    interval: Duration,
}

fn parse() -> anyhow::Result<Opts> {
    let mut o = Opts {
        clusters: 10_000,
        needs: 3,
        machines: 100_000,
        changed: 0.1,
        seconds: 20,
        interval: Duration::from_secs(2),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().context("missing flag value");
        match a.as_str() {
            "--clusters" => o.clusters = val()?.parse()?,
            "--needs" => o.needs = val()?.parse()?,
            "--machines" => o.machines = val()?.parse()?,
            "--changed" => o.changed = val()?.parse()?,
            "--seconds" => o.seconds = val()?.parse()?,
            "--interval" => o.interval = humantime::parse_duration(&val()?)?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(o)
}

const TYPES: [&str; 4] = ["c.large.16", "m.xlarge.32", "r.xlarge.64", "g.2xlarge.8"];

/// A List of encoded machines, all Idle, built once.
struct Listing(Vec<bytes::Bytes>);

impl MachineSource for Listing {
    fn list(&self, _: Vec<u8>) -> BoxFuture<'_, Result<RawMachineList, tonic::Status>> {
        Box::pin(async move {
            Ok(RawMachineList {
                machines: self.0.clone(),
                revision: Vec::new(),
            })
        })
    }
}

fn machines(n: usize) -> Vec<bytes::Bytes> {
    (0..n)
        .map(|i| {
            pb::Machine {
                id: format!("m-{i:07}"),
                state: pb::MachineState::Idle as i32,
                host: Some(pb::HostRef {
                    provider: "bench".into(),
                    r#ref: format!("i-{i}"),
                }),
                instance_type: TYPES[i % TYPES.len()].into(),
                zone: format!("z{}", i % 3),
                capacity_type: pb::CapacityType::OnDemand as i32,
                price_per_hour: 0.2 + (i % 7) as f64 * 0.05,
                resources: Some(pb::Resources {
                    resources: [
                        ("cpu".to_owned(), "16".to_owned()),
                        ("memory".to_owned(), "64Gi".to_owned()),
                    ]
                    .into_iter()
                    .collect(),
                }),
                ..Default::default()
            }
            .encode_to_vec()
            .into()
        })
        .collect()
}

/// Cluster `c`'s roll-up in version `v` (versions differ in one need's size).
fn rollup(c: usize, needs: usize, v: u64) -> mesh::ApplyRollupRequest {
    let rows = (0..needs)
        .map(|r| pb::CapacityNeed {
            requirements: vec![pb::NodeSelectorRequirement {
                key: "node.kubernetes.io/instance-type".into(),
                operator: pb::node_selector_requirement::Operator::In as i32,
                values: vec![TYPES[(c + r) % TYPES.len()].into()],
            }],
            aggregate_resources: [(
                "cpu".to_owned(),
                format!(
                    "{}",
                    4 + (r % 5) * 8 + if r == 0 { (v % 4) as usize } else { 0 }
                ),
            )]
            .into_iter()
            .collect(),
            min_unit: [("cpu".to_owned(), "2".to_owned())].into_iter().collect(),
            priority: i32::try_from((c * 7 + r) % 100).unwrap_or(0),
            interruption_penalty_bucket: 3 + i32::try_from(r % 6).unwrap_or(0),
            reclamation_penalty_bucket: 1,
            ..Default::default()
        })
        .collect();
    svc_shard_decide_core::testing::rollup_request(
        &format!("cluster-{c:05}"),
        i64::try_from(v).unwrap_or(0),
        rows,
    )
}

/// Sum and count of a histogram family's samples (optionally one label value).
fn hist(reg: &MetricsRegistry, name: &str, label: Option<&str>) -> (f64, u64) {
    let mut out = (0.0, 0);
    for f in reg.prometheus().gather() {
        if f.name() != name {
            continue;
        }
        for m in f.get_metric() {
            if label.is_some_and(|l| !m.get_label().iter().any(|p| p.value() == l)) {
                continue;
            }
            let h = m.get_histogram();
            out.0 += h.get_sample_sum();
            out.1 += h.get_sample_count();
        }
    }
    out
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    let reg = MetricsRegistry::new();
    let (publisher, mut events) = Publisher::channel(65_536);
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let decide = Decide::new(
        DecideConfig {
            engine_threads: 1,
            ..DecideConfig::default()
        },
        Arc::new(Listing(machines(o.machines))),
        publisher,
        ShardMetrics::register(&reg)?,
        Readiness::not_ready("bench"),
    )?;
    decide.run_cycle().await?;
    let mut versions = vec![0u64; o.clusters];
    for c in 0..o.clusters {
        edge::apply_rollup(&decide, &rollup(c, o.needs, 0))?;
    }
    decide.run_cycle().await?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let d = decide.clone();
        async move {
            d.run(async {
                let _ = stop_rx.await;
            })
            .await;
        }
    });
    let base_cycles = decide.cycle_count();
    let base = (
        hist(&reg, "bigfleet_shard_cycle_duration_seconds", None),
        hist(&reg, "bigfleet_shard_demand_to_decision_seconds", None),
    );
    let phases = CyclePhase::ALL.map(CyclePhase::as_str);
    let base_phases: Vec<_> = phases
        .iter()
        .map(|p| hist(&reg, "bigfleet_shard_cycle_phase_duration_seconds", Some(p)))
        .collect();
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    // Every cluster once per interval, spread evenly; `changed` of them with new demand.
    let per_tick = Duration::from_millis(10);
    let ticks = o.interval.as_millis() as usize / per_tick.as_millis() as usize;
    let per = o.clusters.div_ceil(ticks.max(1));
    let mut next = 0usize;
    let mut rng_state = 0x2545_f491_4f6c_dd1du64;
    let (mut same_ns, mut same_n, mut changed_ns, mut changed_n) = (0u128, 0u64, 0u128, 0u64);
    let mut ticker = tokio::time::interval(per_tick);
    while started.elapsed() < Duration::from_secs(o.seconds) {
        ticker.tick().await;
        for _ in 0..per {
            let c = next % o.clusters;
            next += 1;
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            let change = (rng_state % 10_000) as f64 / 10_000.0 < o.changed;
            if change {
                versions[c] += 1;
            }
            let req = rollup(c, o.needs, versions[c]);
            let t = Instant::now();
            edge::apply_rollup(&decide, &req)?;
            let ns = t.elapsed().as_nanos();
            if change {
                (changed_ns, changed_n) = (changed_ns + ns, changed_n + 1);
            } else {
                (same_ns, same_n) = (same_ns + ns, same_n + 1);
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let _ = stop_tx.send(());
    runner.await?;
    let delta = |now: (f64, u64), then: (f64, u64)| {
        let n = now.1 - then.1;
        if n == 0 {
            0.0
        } else {
            ((now.0 - then.0) / n as f64 * 1e6).round() / 1e3
        }
    };
    let phase_means: serde_json::Map<String, serde_json::Value> = phases
        .iter()
        .zip(&base_phases)
        .map(|(p, b)| {
            let now = hist(&reg, "bigfleet_shard_cycle_phase_duration_seconds", Some(p));
            ((*p).to_owned(), delta(now, *b).into())
        })
        .collect();
    let out = serde_json::json!({
        "command": format!(
            "cargo run --release -p svc-shard-decide --example cycle-load -- --clusters {} --needs {} --machines {} --changed {} --seconds {}",
            o.clusters, o.needs, o.machines, o.changed, o.seconds
        ),
        "rollups_per_second": ((same_n + changed_n) as f64 / wall).round(),
        "ingest_unchanged_us": if same_n > 0 { (same_ns / u128::from(same_n)) as f64 / 1e3 } else { 0.0 },
        "ingest_changed_us": if changed_n > 0 { (changed_ns / u128::from(changed_n)) as f64 / 1e3 } else { 0.0 },
        "cycles": decide.cycle_count() - base_cycles,
        "cycle_mean_ms": delta(hist(&reg, "bigfleet_shard_cycle_duration_seconds", None), base.0),
        "phase_mean_ms": phase_means,
        "demand_to_decision_mean_ms": delta(hist(&reg, "bigfleet_shard_demand_to_decision_seconds", None), base.1),
        "process_cpu_cores": (cpu / wall * 100.0).round() / 100.0,
        "need_rows": decide.need_rows(),
    });
    println!("{out}");
    Ok(())
}
