//! `bigfleet up --chaos` (issue 23): seeded kills of every component under a running mesh,
//! and the invariants proven from the summary and the fake provider's actuation log; and
//! static stability with the coordinator killed through `bigfleet lab kill`.

use std::time::Duration;

use bigfleet_fake_provider::actuation::{audit, read_actuation_log};

use crate::harness::wait_until;
use crate::up::{READY_TIMEOUT, UpDirs, alive, child_running, metric_sum, output};

/// Epochs decide minted, in order, from its log (`fencing epoch advanced epoch=N`).
fn minted_epochs(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("fencing epoch advanced"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("epoch="))
                .and_then(|e| e.parse().ok())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_components_and_the_invariants_hold() {
    let dirs = UpDirs::new();
    let child = dirs.up(&[
        "--chaos",
        "--chaos-seed",
        "7",
        "--chaos-every",
        "3s",
        "--chaos-settle",
        "15s",
        "--duration",
        "45s",
        "--quiet",
        "--rollup-interval",
        "1s",
        "--cycle-interval",
        "500ms",
    ]);
    // Start-up, 45 s, and a shutdown: generous for a loaded 2-core machine.
    let (status, stdout, stderr) = output(child, READY_TIMEOUT + Duration::from_secs(60)).await;
    assert!(status.success(), "{status}\n{stderr}");
    assert!(
        stderr.contains("chaos: seed 7 (repeat with --chaos-seed 7)"),
        "{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let chaos = &summary["chaos"];
    assert_eq!(chaos["seed"], 7, "{summary}");

    // Kills happened, each victim came back, and up did not count them as crashes.
    let events = chaos["events"].as_array().unwrap();
    let kills: u64 = chaos["kills"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(
        kills >= 3,
        "too few kills to prove anything: {chaos}\n{stderr}"
    );
    assert_eq!(kills as usize, events.len(), "{chaos}");
    assert_eq!(
        chaos["restarts"].as_u64().unwrap(),
        kills,
        "{chaos}\n{stderr}"
    );
    assert_eq!(summary["crashed"], serde_json::json!([]), "{summary}");
    // Seed 7's first round starts decide, gateway, provider: the kills that matter most
    // (fencing, operator reconnects, reconcile errors and a reseeded provider).
    let first: Vec<&str> = events[..3]
        .iter()
        .map(|e| e["victim"].as_str().unwrap())
        .collect();
    assert_eq!(
        first,
        ["shard-0-decide", "shard-0-gateway", "provider-0"],
        "{chaos}"
    );
    // The decide's restart must have minted a higher epoch (ADR-0103).
    let decide_kills = chaos["kills"]["decide"].as_u64().unwrap();
    let log = std::fs::read_to_string(dirs.run.join("logs/shard-0-decide.log")).unwrap();
    let epochs = minted_epochs(&log);
    assert_eq!(epochs.len() as u64, decide_kills + 1, "{epochs:?}");
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs must increase across restarts: {epochs:?}"
    );

    // The invariants.
    assert_eq!(chaos["audited"], true, "{chaos}");
    assert_eq!(chaos["needs_met_at_end"]["met"], true, "{chaos}\n{stderr}");
    assert_eq!(chaos["machines_actuated_twice"], 0, "{chaos}");
    assert_eq!(chaos["fenced_calls_accepted"], 0, "{chaos}");
    assert_eq!(chaos["reclaim_storm"]["storm"], false, "{chaos}");
    assert_eq!(chaos["invariants_held"], true, "{chaos}");

    // The summary's audit is the provider's own log, read again here.
    let log = read_actuation_log(&dirs.run.join("provider-0/actuations.jsonl")).unwrap();
    assert!(!log.is_empty(), "the provider accepted no mutating call");
    let a = audit(&log);
    assert_eq!(a.accepted, chaos["actuations_accepted"].as_u64().unwrap());
    assert!(a.machines_actuated_twice.is_empty(), "{a:?}");
    assert_eq!(a.fenced_calls_accepted, 0, "{a:?}");
    // Every accepted fenced call carries an epoch decide actually minted.
    for x in log.iter().filter(|x| !x.shard.is_empty()) {
        assert!(
            epochs.contains(&(x.epoch as u64)),
            "{x:?} carries an epoch decide never minted: {epochs:?}"
        );
    }
}

/// Static stability through `bigfleet lab kill`: with the coordinator down, actions keep
/// completing — the execute worker's outcomes and the provider's accepted operations both
/// grow — and the coordinator comes back on request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_keep_completing_while_lab_kill_holds_the_coordinator_down() {
    let dirs = UpDirs::new();
    let child = dirs.up(&[
        "--quiet",
        "--rollup-interval",
        "1s",
        "--cycle-interval",
        "200ms",
    ]);
    let p = dirs.ready().await;
    let execute = p["shards"][0]["execute_http"].as_str().unwrap().to_owned();
    let admin = p["provider"]["admin_http"].as_str().unwrap().to_owned();
    let up_pid = child.id().unwrap();
    let coord = child_running(up_pid, "svc coordinator").expect("a coordinator child");
    dirs.lab(&["kill", "coordinator"]).await;
    assert!(!alive(coord));
    let executed = || metric_sum(&execute, "bigfleet_shard_action_execute_outcomes_total");
    let operations = || async {
        let (code, body) = bigfleet::up::probe::http_get(
            admin.parse().unwrap(),
            "/admin/stats",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["operations"].as_u64().unwrap()
    };
    let (executed_at_kill, operations_at_kill) = (executed().await, operations().await);
    // Churning roll-ups every second keep decide busy; give a loaded machine time.
    wait_until(
        Duration::from_secs(60),
        "an action completed with the coordinator down",
        async || {
            assert!(
                child_running(up_pid, "svc coordinator").is_none(),
                "the coordinator came back by itself"
            );
            let (x, o) = (executed().await, operations().await);
            if x > executed_at_kill && o > operations_at_kill {
                Ok(())
            } else {
                Err(format!(
                    "executed {executed_at_kill} → {x}, provider operations \
                     {operations_at_kill} → {o}"
                ))
            }
        },
    )
    .await;
    dirs.lab(&["restart", "coordinator"]).await;
    assert!(child_running(up_pid, "svc coordinator").is_some());
    let mut child = child;
    child.kill().await.unwrap();
}

/// `--coordinators 3` under chaos that only kills coordinators: every kill hits the replica
/// that leads at that moment (so consecutive kills hit different replicas: the killed one
/// comes back as a follower), the cluster keeps electing, and the shard keeps its needs met.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kills_the_coordinator_leader_of_three_replicas() {
    let dirs = UpDirs::new();
    let child = dirs.up(&[
        "--coordinators",
        "3",
        "--chaos",
        "--chaos-seed",
        "11",
        "--chaos-every",
        "3s",
        "--chaos-targets",
        "coordinator",
        "--chaos-settle",
        "10s",
        "--duration",
        "30s",
        "--quiet",
        "--rollup-interval",
        "1s",
    ]);
    let (status, stdout, stderr) = output(child, READY_TIMEOUT + Duration::from_secs(60)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let chaos = &summary["chaos"];
    let events = chaos["events"].as_array().unwrap();
    assert!(events.len() >= 2, "{chaos}\n{stderr}");
    let victims: Vec<&str> = events
        .iter()
        .map(|e| e["victim"].as_str().unwrap())
        .collect();
    for e in events {
        assert!(
            e["victim"].as_str().unwrap().starts_with("coordinator-"),
            "{e}"
        );
        assert_eq!(
            e["leader"], true,
            "killed a replica that was not leading: {chaos}"
        );
    }
    assert!(
        victims.windows(2).all(|w| w[0] != w[1]),
        "the next leader is another replica: {victims:?}"
    );
    assert_eq!(chaos["restarts"].as_u64().unwrap(), events.len() as u64);
    assert_eq!(chaos["needs_met_at_end"]["met"], true, "{chaos}");
    assert_eq!(chaos["invariants_held"], true, "{chaos}");
}
