//! `shard-load` end to end on a tiny shape (not timed): the real debug service binaries as
//! processes, 20 operators, 2,000 machines, a 3 s window. The run must produce one JSON
//! object with roll-ups acknowledged, cycles counted, ack latencies and no errors.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The service binaries `shard-load` starts, next to it in cargo's target directory.
const SERVICES: [(&str, &str); 4] = [
    ("svc-shard-decide", "bigfleet-shard-decide"),
    ("svc-session-gateway", "bigfleet-session-gateway"),
    ("svc-shard-execute", "bigfleet-shard-execute"),
    ("bigfleet-fake-provider", "bigfleet-fake-provider"),
];

/// `scripts/test` builds every binary before the suite runs; a bare
/// `cargo nextest run -p bigfleet-loadtest` may not have, so build what is missing.
fn ensure_service_binaries(dir: &Path) {
    let missing: Vec<&str> = SERVICES
        .iter()
        .filter(|(_, bin)| !dir.join(bin).is_file())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return;
    }
    let mut cmd = Command::new(env!("CARGO"));
    cmd.arg("build").arg("--bins");
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    for pkg in &missing {
        cmd.args(["-p", pkg]);
    }
    let status = cmd.status().expect("run cargo build");
    assert!(status.success(), "building {missing:?}: {status}");
}

#[test]
fn a_tiny_shard_reports_throughput_latency_and_no_errors() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_shard-load"));
    let dir = bin.parent().expect("target dir").to_owned();
    ensure_service_binaries(&dir);
    let out = Command::new(&bin)
        .args([
            "--operators",
            "20",
            "--machines",
            "2000",
            "--rollup-interval",
            "1s",
            "--changed-fraction",
            "0.5",
            "--warmup",
            "2s",
            "--duration",
            "3s",
            "--settle-timeout",
            "5s",
            "--cycle-interval",
            "200ms",
        ])
        .output()
        .expect("run shard-load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "shard-load failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("one JSON object on stdout ({e}): {stdout}\nstderr: {stderr}"));
    let f = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} is not a number: {r}"))
    };
    assert_eq!(r["operators"], 20, "{r}");
    assert_eq!(r["connected"], 20, "{r}");
    assert!(f("rollups_per_second") > 0.0, "{r}");
    assert_eq!(r["errors"], 0, "{r}\nstderr: {stderr}");
    assert!(f("cycles") > 0.0, "{r}");
    assert!(f("ack_p50_ms") > 0.0, "{r}");
    assert!(f("ack_p99_ms") >= f("ack_p50_ms"), "{r}");
    assert!(f("cycle_p99_ms") > 0.0, "{r}");
    assert!(f("decide_cpu_cores") >= 0.0, "{r}");
    assert!(f("gateway_rss_mib") > 0.0, "{r}");
    assert!(f("rollups_changed") + f("rollups_identical") > 0.0, "{r}");
    // Not the shape: no targets apply.
    assert_eq!(r["targets"]["shape"], "n/a", "{r}");
}
