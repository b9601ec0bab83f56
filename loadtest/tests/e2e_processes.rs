//! The bench's multi-process mode end to end (not timed): two execute worker processes
//! (`e2e-bench execute-worker`, the execute service's own `run`) on one real decide over
//! Unix sockets, a few units, every unit Configured and every machine handled exactly once
//! by one of the two processes.

use std::process::Command;

#[test]
fn two_execute_processes_configure_every_unit_exactly_once() {
    let bin = env!("CARGO_BIN_EXE_e2e-bench");
    let out = Command::new(bin)
        .args([
            "--units",
            "16",
            "--clusters",
            "2",
            "--execute-processes",
            "2",
            // Two in flight each: neither process can take all the work alone.
            "--concurrency",
            "2",
            "--cycle-interval",
            "50ms",
            "--timeout",
            "15s",
            "--json",
        ])
        .output()
        .expect("run e2e-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "e2e-bench failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(r["execute_processes"], 2, "{r}");
    assert_eq!(r["configured"], 16, "{r}");
    assert_eq!(r["actions_succeeded"], 16, "{r}");
    assert_eq!(r["actions_executed"], 16, "{r}");
    assert_eq!(r["provider_operations"], 16, "{r}");
    assert_eq!(r["exactly_once"], true, "{r}");
    let per: Vec<u64> = r["per_process_actions"]
        .as_array()
        .expect("per_process_actions")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(per.len(), 2, "{r}");
    assert_eq!(per.iter().sum::<u64>(), 16, "{r}");
    assert!(per.iter().all(|&n| n > 0), "both processes did work: {r}");
}
