//! `bigfleet up --shards 3` as a user runs it (ADR-0139): shard-0's simulated clusters ask
//! for GPUs that only shard-1's zone has, and the coordinator's rebalancer clears shard-0's
//! shortfall by a transfer — seen in the progress lines and the `--duration` summary.

use std::time::Duration;

use crate::up::{UpDirs, output};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_with_three_shards_clears_shard_zeros_shortfall_by_transfer() {
    let dirs = UpDirs::new();
    let child = dirs.up(&["--shards", "3", "--duration", "90s"]);
    let (status, stdout, stderr) = output(child, Duration::from_secs(300)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let line = stdout.lines().last().unwrap_or_default();
    let summary: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout:?}\n{stderr}"));
    assert!(
        summary["crashed"].as_array().is_some_and(Vec::is_empty),
        "{summary}\n{stderr}"
    );
    assert!(
        summary["transfers"].as_u64().unwrap_or(0) >= 1,
        "no transfer moved machines: {summary}\n{stderr}"
    );
    assert!(summary["cross_shard_drains"].is_u64(), "{summary}");
    assert_eq!(
        summary["shortfalls_by_shard"]["shard-0"].as_u64(),
        Some(0),
        "shard-0's shortfall did not clear: {summary}\n{stderr}"
    );
    assert!(stderr.contains("multi-shard demo"), "{stderr}");
    // The progress lines show the transfer once it finished.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("| transfers ") && !l.contains("| transfers 0 done")),
        "{stderr}"
    );
}
