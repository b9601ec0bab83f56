//! Reconcile and memory benchmark of decide against the fake provider over a
//! Unix socket. The provider runs in a child process (this same program with
//! `--serve-provider`), so the reported RSS is decide's alone.
//!
//! ```text
//! cargo run --release -p svc-shard-decide --example reconcile-bench -- \
//!     --machines 500000 --needs 50000
//! ```
//!
//! Prints one JSON object: cold and steady full reconciles, incremental
//! reconciles after 1% of the machines changed, one decision cycle over
//! `--needs` demand rows, and decide's RSS (current and peak) afterwards,
//! next to the bytes the allocator holds for live objects.

// The binary's allocator and its build-time configuration (ADR-0031), so the
// memory figures are the ones a running decide shows.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Bytes in live allocations, MiB (jemalloc's `stats.allocated`).
fn heap_live_mib() -> u64 {
    let _ = tikv_jemalloc_ctl::epoch::advance();
    tikv_jemalloc_ctl::stats::allocated::read().map_or(0, |b| (b >> 20) as u64)
}

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::capacity_provider_client::CapacityProviderClient;
use bigfleet_telemetry::Readiness;
use svc_shard_decide_core::edge;
use svc_shard_decide_core::{
    CyclePhase, Decide, DecideConfig, ProviderClient, Publisher, RailsConfig, ShardMetrics,
};

struct Opts {
    machines: u64,
    needs: usize,
    seed: u64,
    runs: usize,
    serve: Option<PathBuf>,
}

fn parse() -> anyhow::Result<Opts> {
    let mut o = Opts {
        machines: 500_000,
        needs: 50_000,
        seed: 7,
        runs: 5,
        serve: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().context("missing flag value");
        match a.as_str() {
            "--machines" => o.machines = val()?.parse()?,
            "--needs" => o.needs = val()?.parse()?,
            "--seed" => o.seed = val()?.parse()?,
            "--runs" => o.runs = val()?.parse()?,
            "--serve-provider" => o.serve = Some(val()?.into()),
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(o)
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn stats(samples: &mut [f64]) -> serde_json::Value {
    samples.sort_by(f64::total_cmp);
    serde_json::json!({
        "runs": samples.len(),
        "min_ms": samples.first(),
        "median_ms": samples[samples.len() / 2],
        "max_ms": samples.last(),
    })
}

/// Child mode: serve a generated fleet until killed.
async fn serve(path: &Path, o: &Opts) -> anyhow::Result<()> {
    let provider = Arc::new(bigfleet_fake_provider::FakeProvider::generate(
        o.machines, o.seed,
    ));
    let _server = bigfleet_fake_provider::spawn_uds(path, provider).await?;
    println!("ready");
    std::future::pending::<()>().await;
    Ok(())
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn decide(sock: &Path, incremental: bool) -> anyhow::Result<Decide> {
    let target: bigfleet_mesh::Target = format!("unix://{}", sock.display()).parse()?;
    let channel = bigfleet_mesh::client_stack(
        bigfleet_mesh::connect_lazy(&target, &Default::default())?,
        &Default::default(),
    );
    let (publisher, mut events) = Publisher::channel(1024);
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    Ok(Decide::new(
        DecideConfig {
            incremental_reconcile: incremental,
            rails: RailsConfig::default(),
            engine_threads: 0,
            ..DecideConfig::default()
        },
        Arc::new(ProviderClient::new(channel)),
        publisher,
        ShardMetrics::unregistered(),
        Readiness::not_ready("bench"),
    )?)
}

fn rollups(needs: usize) -> Vec<mesh::ApplyRollupRequest> {
    let clusters = (needs / 25).max(1);
    let types = ["c.large.16", "m.xlarge.32"];
    (0..clusters)
        .map(|c| {
            let rows = (0..25)
                .filter(|r| c * 25 + r < needs)
                .map(|r| pb::CapacityNeed {
                    requirements: vec![pb::NodeSelectorRequirement {
                        key: "node.kubernetes.io/instance-type".into(),
                        operator: pb::node_selector_requirement::Operator::In as i32,
                        values: vec![types[(c + r) % 2].into()],
                    }],
                    aggregate_resources: [("cpu".to_owned(), format!("{}", 4 + (r % 7) * 8))]
                        .into_iter()
                        .collect(),
                    min_unit: [("cpu".to_owned(), "2".to_owned())].into_iter().collect(),
                    priority: i32::try_from((c * 7 + r) % 1000).unwrap_or(0),
                    interruption_penalty_bucket: 3 + i32::try_from(r % 10).unwrap_or(0),
                    reclamation_penalty_bucket: 1,
                    ..Default::default()
                })
                .collect();
            mesh::ApplyRollupRequest {
                session_id: 1,
                ..svc_shard_decide_core::testing::rollup_request(&format!("cluster-{c}"), 1, rows)
            }
        })
        .collect()
}

/// Changes `n` machines at the provider: Create on Speculative slots.
async fn churn(sock: &Path, ids: &[String], round: usize) -> anyhow::Result<usize> {
    let target = format!("unix://{}", sock.display());
    let mut client: CapacityProviderClient<_> = bigfleet_fake_provider::connect(&target).await?;
    let mut changed = 0;
    for id in ids {
        let r = client
            .create(pb::CreateRequest {
                machine_id: id.clone(),
                shard_id: "bench".into(),
                shard_epoch: 1,
                sequence_number: i64::try_from(round + 1).unwrap_or(1),
            })
            .await;
        changed += usize::from(r.is_ok());
    }
    Ok(changed)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    if let Some(path) = &o.serve {
        return serve(path, &o).await;
    }
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("provider.sock");
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--serve-provider",
            sock.to_str().context("socket path")?,
            "--machines",
            &o.machines.to_string(),
            "--seed",
            &o.seed.to_string(),
        ])
        .stdout(Stdio::piped())
        // A profiler preloaded into this process (heaptrack, …) measures
        // decide, not the provider child.
        .env_remove("LD_PRELOAD")
        .spawn()?;
    {
        use std::io::BufRead as _;
        let out = child.stdout.take().context("child stdout")?;
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "provider child failed to start");
    }
    let _child = Guard(child);
    let rss_base = rss_kib("VmRSS:");

    // Full mode.
    let d = decide(&sock, false)?;
    let t = Instant::now();
    let cold = d.reconcile().await?;
    let cold_ms = ms(t.elapsed());
    anyhow::ensure!(
        cold.counts.listed as u64 == o.machines,
        "listed {}",
        cold.counts.listed
    );
    let mut steady = Vec::new();
    let mut steady_merge = Vec::new();
    for _ in 0..o.runs {
        let t = Instant::now();
        let s = d.reconcile().await?;
        steady.push(ms(t.elapsed()));
        steady_merge.push(ms(s.merge_time));
        anyhow::ensure!(
            s.counts.fast_path as u64 == o.machines,
            "steady state is all fast path"
        );
    }
    let rss_after_inventory = rss_kib("VmRSS:");
    let live_after_inventory = heap_live_mib();

    for r in rollups(o.needs) {
        edge::apply_rollup(&d, &r)?;
    }
    anyhow::ensure!(d.need_rows() == o.needs, "needs in force {}", d.need_rows());
    let rss_after_needs = rss_kib("VmRSS:");
    let live_after_needs = heap_live_mib();
    let mut cycles = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let t = Instant::now();
        last = Some(d.run_cycle().await?);
        cycles.push(ms(t.elapsed()));
    }
    let report = last.context("cycle")?;
    // Mean time per cycle phase over those cycles (decide's own histograms).
    let phases: serde_json::Map<String, serde_json::Value> = [
        CyclePhase::Reconcile,
        CyclePhase::Snapread,
        CyclePhase::Engine,
        CyclePhase::Emit,
        CyclePhase::Execute,
    ]
    .map(CyclePhase::as_str)
    .iter()
    .map(|p| {
        let h = d.metrics().cycle_phase_duration.with_label_values(&[p]);
        let n = h.get_sample_count().max(1) as f64;
        (
            (*p).to_owned(),
            serde_json::json!(ms(Duration::from_secs_f64(h.get_sample_sum() / n))),
        )
    })
    .collect();
    let rss = rss_kib("VmRSS:");
    let live = heap_live_mib();
    // Between cycles: the allocator hands freed pages back within its decay
    // time (1 s, ADR-0031), so this is what a decide idling between cycles holds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_settled = rss_kib("VmRSS:");
    let hwm = rss_kib("VmHWM:");
    let spec_ids = {
        let target = format!("unix://{}", sock.display());
        let mut c = bigfleet_fake_provider::connect(&target).await?;
        let list = c
            .list(pb::ListFilter {
                states: vec![pb::MachineState::Speculative as i32],
                ..Default::default()
            })
            .await?
            .into_inner();
        list.machines.into_iter().map(|m| m.id).collect::<Vec<_>>()
    };
    drop(d);

    // Incremental mode: cold start, then 1% of the fleet changes per round.
    let d = decide(&sock, true)?;
    let t = Instant::now();
    let cold_inc = d.reconcile().await?;
    let cold_inc_ms = ms(t.elapsed());
    anyhow::ensure!(!cold_inc.incremental, "the first listing is complete");
    let per_round = usize::try_from(o.machines / 100).unwrap_or(usize::MAX);
    let mut inc = Vec::new();
    let mut inc_merge = Vec::new();
    let mut changed_total = 0;
    for (round, ids) in spec_ids.chunks(per_round).take(o.runs).enumerate() {
        let changed = churn(&sock, ids, round).await?;
        changed_total += changed;
        let t = Instant::now();
        let s = d.reconcile().await?;
        inc.push(ms(t.elapsed()));
        inc_merge.push(ms(s.merge_time));
        anyhow::ensure!(
            s.incremental && s.counts.listed == changed,
            "listed {} of {changed}",
            s.counts.listed
        );
    }
    let inc_noop = {
        let t = Instant::now();
        d.reconcile().await?;
        ms(t.elapsed())
    };

    // Floors: one List round trip decoded fully (what a naive client pays),
    // and decoded only to record boundaries (what reconcile pays), nothing else.
    let mut list_only = Vec::new();
    {
        let target = format!("unix://{}", sock.display());
        let mut c = bigfleet_fake_provider::connect(&target).await?;
        for _ in 0..o.runs {
            let t = Instant::now();
            let n = c
                .list(pb::ListFilter::default())
                .await?
                .into_inner()
                .machines
                .len();
            list_only.push(ms(t.elapsed()));
            anyhow::ensure!(n as u64 == o.machines);
        }
    }
    let mut list_raw = Vec::new();
    {
        use svc_shard_decide_core::MachineSource as _;
        let target: bigfleet_mesh::Target = format!("unix://{}", sock.display()).parse()?;
        let src = ProviderClient::new(bigfleet_mesh::client_stack(
            bigfleet_mesh::connect_lazy(&target, &Default::default())?,
            &Default::default(),
        ));
        for _ in 0..o.runs {
            let t = Instant::now();
            let n = src.list(Vec::new()).await?.machines.len();
            list_raw.push(ms(t.elapsed()));
            anyhow::ensure!(n as u64 == o.machines);
        }
    }

    let out = serde_json::json!({
        "benchmark": "svc-shard-decide reconcile + RSS",
        "command": format!(
            "cargo run --release -p svc-shard-decide --example reconcile-bench -- --machines {} --needs {} --runs {}",
            o.machines, o.needs, o.runs
        ),
        "machines": o.machines,
        "needs": o.needs,
        "transport": "fake provider in a child process, Unix socket",
        "list_rpc_full_decode": stats(&mut list_only),
        "list_rpc_raw_records": stats(&mut list_raw),
        "full_reconcile_cold_ms": cold_ms,
        "full_reconcile_steady": stats(&mut steady),
        "full_reconcile_steady_merge_only": stats(&mut steady_merge),
        "incremental_reconcile_cold_ms": cold_inc_ms,
        "incremental_changes_per_round": per_round,
        "incremental_changed_total": changed_total,
        // Every round, in order, before `stats` sorts them: the spread matters here.
        "incremental_reconcile_1pct_rounds_ms": inc.iter().map(|v| (v * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        "incremental_reconcile_1pct": stats(&mut inc),
        "incremental_reconcile_1pct_merge_only": stats(&mut inc_merge),
        "incremental_reconcile_no_changes_ms": inc_noop,
        "cycle": stats(&mut cycles),
        "cycle_phase_mean_ms": phases,
        "cycle_last": {
            "decided": report.decided,
            "enqueued": report.enqueued,
            "dropped": report.dropped,
            "capped": report.capped,
            "shortfalls": report.shortfalls,
        },
        "rss_mib": {
            "process_start": rss_base / 1024,
            "after_inventory": rss_after_inventory / 1024,
            "after_needs": rss_after_needs / 1024,
            "after_needs_and_cycles": rss / 1024,
            "after_needs_and_cycles_settled_2s": rss_settled / 1024,
            "peak": hwm / 1024,
        },
        "heap_live_mib": {
            "after_inventory": live_after_inventory,
            "after_needs": live_after_needs,
            "after_needs_and_cycles": live,
        },
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
