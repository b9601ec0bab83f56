//! Epoch-file mode with the real `bigfleet-shard-decide` binary (ADR-0103): a start that
//! finds no epoch file still fences above every token providers have seen, so the machines
//! an earlier incarnation touched are not fenced and failed; and a second decide on the
//! same data dir refuses to start while the first keeps running.
//!
//! Actuation goes through the real worker pool (svc-shard-execute, in-process) against the
//! fake provider with a fence log, the file of every token the provider accepted.

use crate::fixtures;

use std::path::Path;
use std::time::Duration;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::wait_until;
use fixtures::{DecideProc, provider, rollup};
use svc_shard_execute::doubles::{GatewayDouble, Served};

const SHARD: &str = "shard-f";

/// This test's decide on `socket_dir` and `data_dir`.
fn spawn(socket_dir: &Path, data_dir: &Path, provider: &str, log: &Path) -> DecideProc {
    DecideProc::spawn(SHARD, socket_dir, data_dir, provider, log, &[], "info")
}

/// Sends c1's demand for `machines` machines; decide accepts it.
async fn send_rollup(d: &DecideProc, machines: u32) {
    let resp = d
        .ingest()
        .apply_rollup(rollup(machines))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.outcome, mesh::RollupOutcome::Accepted as i32);
}

/// Every (shard, machine, epoch, sequence) the provider accepted, from its fence log.
fn fence_log(path: &Path) -> Vec<(String, String, i64, i64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["shard"].as_str().unwrap().to_owned(),
                v["machine"].as_str().unwrap().to_owned(),
                v["epoch"].as_i64().unwrap(),
                v["sequence"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn epoch_file(data_dir: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(data_dir.join("epoch")).ok()?;
    Some(text.trim().parse().unwrap())
}

/// Provider calls the worker pool saw refused as fenced (FAILED_PRECONDITION), over every
/// action kind.
fn fenced_calls(worker: &svc_shard_execute::Running) -> u64 {
    worker
        .registry()
        .encode_text()
        .unwrap()
        .lines()
        .filter(|l| {
            l.starts_with("bigfleet_shard_action_execute_outcomes_total{")
                && l.contains("outcome=\"fenced\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_epoch_file_does_not_fence_the_shard_out_of_its_machines() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = dir.join("data");
    let fences = dir.join("fence.jsonl");
    let (fake, provider_server) = provider(dir, 2, Some(&fences)).await;
    let provider_uri = provider_server.target();
    let gateway = GatewayDouble::default();
    let relay: Served = gateway.serve_uds(&dir.join("relay.sock")).unwrap();

    // First incarnation: both machines are bootstrapped for c1, through the real workers.
    let mut first = spawn(dir, &data, &provider_uri, &dir.join("decide-1.log"));
    first.ready().await;
    let mut cfg = svc_shard_execute::Config::new(&first.uri(), &relay.uri(), &provider_uri);
    cfg.shard_id = SHARD.to_owned();
    cfg.concurrency = 4;
    let worker = svc_shard_execute::start(cfg).await.unwrap();
    send_rollup(&first, 2).await;
    wait_until(
        Duration::from_secs(30),
        "both machines configured",
        async || {
            let configured = fake.ids_in_state(pb::MachineState::Configured);
            if configured.len() == 2 {
                Ok(())
            } else {
                Err(format!("{configured:?}; log:\n{}", first.log()))
            }
        },
    )
    .await;
    let first_epoch = first.describe().await.shard_epoch;
    first.kill();

    let before = fence_log(&fences);
    let touched: Vec<&str> = before.iter().map(|(_, m, _, _)| m.as_str()).collect();
    assert!(
        touched.contains(&"m0") && touched.contains(&"m1"),
        "{before:?}"
    );
    let highest_seen = before.iter().map(|(_, _, e, _)| *e).max().unwrap();
    assert_eq!(highest_seen, first_epoch);
    assert!(before.iter().all(|(s, _, _, _)| s == SHARD), "{before:?}");

    // The data dir loses its epoch file (a wiped or replaced volume).
    std::fs::remove_file(data.join("epoch")).unwrap();

    // Second incarnation: still above every token the provider has seen.
    let second = spawn(dir, &data, &provider_uri, &dir.join("decide-2.log"));
    second.ready().await;
    let second_epoch = second.describe().await.shard_epoch;
    assert!(
        second_epoch > highest_seen,
        "epoch {second_epoch} after a lost epoch file is not above {highest_seen}, the \
         highest the provider has seen"
    );
    assert_eq!(epoch_file(&data), Some(second_epoch));

    // Demand goes away: the new incarnation drains the machines the first one configured
    // (one is enough, and the reclaim rails may defer the other). Without the floor, the
    // first drain's token (the same epoch, the first sequence base) would not be newer than
    // either machine's mark.
    send_rollup(&second, 0).await;
    wait_until(
        Duration::from_secs(30),
        "a machine drained under the new epoch",
        async || {
            let configured = fake.ids_in_state(pb::MachineState::Configured);
            let marks: Vec<_> = ["m0", "m1"]
                .iter()
                .map(|m| fake.fence_mark(SHARD, m).map(|k| k.epoch))
                .collect();
            let drained = ["m0", "m1"]
                .iter()
                .zip(&marks)
                .any(|(m, e)| *e == Some(second_epoch) && !configured.iter().any(|c| c == m));
            if drained {
                Ok(())
            } else {
                Err(format!(
                    "configured {configured:?}, marks {marks:?}, fenced calls {}; log:\n{}",
                    fenced_calls(&worker),
                    second.log()
                ))
            }
        },
    )
    .await;
    // A few more cycles for whatever else the new incarnation does to those machines.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Nothing was fenced, and no machine is Failed at the provider or in decide.
    assert_eq!(fenced_calls(&worker), 0);
    assert_eq!(
        fake.ids_in_state(pb::MachineState::Failed),
        Vec::<String>::new()
    );
    let by_state = second.describe().await.machines_by_state;
    assert_eq!(
        by_state.get("MACHINE_STATE_FAILED").copied().unwrap_or(0),
        0,
        "{by_state:?}"
    );
    // Every token accepted since is the new epoch's; none went backwards.
    let after = fence_log(&fences);
    assert!(
        after[before.len()..]
            .iter()
            .all(|(_, _, e, _)| *e == second_epoch),
        "{after:?}"
    );

    worker.abort().await;
    drop(second);
    relay.stop().await;
    provider_server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_decide_on_the_same_data_dir_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = dir.join("data");
    let (_fake, provider_server) = provider(dir, 1, None).await;
    let provider_uri = provider_server.target();

    let mut first = spawn(dir, &data, &provider_uri, &dir.join("decide-1.log"));
    first.ready().await;
    let epoch = epoch_file(&data).expect("the first decide wrote its epoch");

    // Same data dir, its own sockets: refused before it touches the epoch file.
    let other_sockets = dir.join("other");
    let mut second = spawn(
        &other_sockets,
        &data,
        &provider_uri,
        &dir.join("decide-2.log"),
    );
    let status = second.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success(), "{status:?}");
    let log = second.log();
    let expected = format!(
        "data dir {} is in use by another process (pid {})",
        data.display(),
        first.pid()
    );
    assert!(log.contains(&expected), "expected {expected:?} in:\n{log}");
    assert!(!other_sockets.join("decide.sock").exists());

    // The first one is untouched: still running, still answering, same epoch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.exited().is_none(), "{}", first.log());
    assert_eq!(first.describe().await.shard_epoch, epoch);
    assert_eq!(epoch_file(&data), Some(epoch));
    drop(first);
    provider_server.shutdown().await;
}
