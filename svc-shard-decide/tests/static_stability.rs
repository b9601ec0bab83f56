//! Static stability end to end: with its coordinator unreachable, decide
//! becomes ready and keeps running cycles — in-process and as the real binary.

use bigfleet_fake_provider::{FakeProvider, spawn_uds};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::ingest_client::IngestClient;
use bigfleet_testkit::wait_until;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use svc_shard_decide::{CoordinatorConfig, StartConfig, start};

#[tokio::test]
async fn in_process_decide_with_a_dead_coordinator_is_ready_and_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(FakeProvider::builtin());
    let server = spawn_uds(&dir.path().join("provider.sock"), provider.clone())
        .await
        .unwrap();
    let mut cfg = StartConfig::new(dir.path(), server.target());
    cfg.decide.cycle_interval = Duration::from_millis(50);
    cfg.coordinator = Some(CoordinatorConfig {
        // Nothing listens on port 1.
        addr: "http://127.0.0.1:1".into(),
        advertise_addr: "shard-0:7780".into(),
        report_interval: Duration::from_millis(20),
        ownership_file: None,
    });
    let readiness = cfg.readiness.clone();
    let running = start(cfg).await.unwrap();
    assert!(running.coordinator_running());
    let d = running.decide().clone();
    wait_until(Duration::from_secs(10), "ready and 5 cycles", async || {
        if readiness.is_ready() && d.cycle_count() >= 5 {
            Ok(())
        } else {
            Err(format!(
                "ready={} cycles={}",
                readiness.is_ready(),
                d.cycle_count()
            ))
        }
    })
    .await;
    assert_eq!(d.coordinator_term(), 0);
    let machines: u64 = d.machines_by_state().await.values().sum();
    assert_eq!(machines as usize, provider.len());

    // decide.sock answers while the coordinator stays dead.
    let channel = bigfleet_mesh::connect_lazy(
        &format!("unix://{}", running.socket_path().display())
            .parse()
            .unwrap(),
        &Default::default(),
    )
    .unwrap();
    let mut client = IngestClient::new(channel);
    let resp = client
        .apply_rollup(mesh::ApplyRollupRequest {
            session_id: 1,
            ..svc_shard_decide_core::testing::rollup_request("c1", 1, vec![])
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.outcome, mesh::RollupOutcome::Accepted as i32);
    running.shutdown().await.unwrap();
    server.shutdown().await;
}

/// A bare HTTP/1.0 GET; returns (status, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Some((status, body))
}

fn cycles_from_metrics(body: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix("bigfleet_shard_cycles_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_decide(dir: &std::path::Path, provider: &str, metrics_port: u16) -> Child {
    let bin = env!("CARGO_BIN_EXE_bigfleet-shard-decide");
    Child(
        std::process::Command::new(bin)
            .args([
                "--provider-addr",
                provider,
                "--socket-dir",
                dir.to_str().unwrap(),
                "--data-dir",
                dir.join("data").to_str().unwrap(),
                "--cycle-interval",
                "100ms",
                "--coordinator-addr",
                "http://127.0.0.1:1",
                "--report-interval",
                "50ms",
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
            ])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn bigfleet-shard-decide"),
    )
}

#[tokio::test]
async fn the_binary_with_a_dead_coordinator_is_ready_and_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_uds(
        &dir.path().join("provider.sock"),
        Arc::new(FakeProvider::builtin()),
    )
    .await
    .unwrap();
    let port = bigfleet_testkit::free_tcp_port().unwrap();
    let clock = unix_seconds();
    let child = spawn_decide(dir.path(), &server.target(), port);
    wait_until(Duration::from_secs(20), "/readyz to turn 200", async || {
        matches!(http_get(port, "/readyz"), Some((200, _)))
    })
    .await;
    wait_until(Duration::from_secs(20), "cycles on /metrics", async || {
        http_get(port, "/metrics").is_some_and(|(_, b)| cycles_from_metrics(&b) >= 3)
    })
    .await;
    // A first start takes the wall-clock floor (ADR-0103).
    let first = read_epoch(dir.path());
    assert!(first >= clock, "epoch {first} below the clock {clock}");
    drop(child);

    // A restart fences strictly above the previous incarnation.
    let port = bigfleet_testkit::free_tcp_port().unwrap();
    let _child = spawn_decide(dir.path(), &server.target(), port);
    wait_until(
        Duration::from_secs(20),
        "/readyz after the restart",
        async || matches!(http_get(port, "/readyz"), Some((200, _))),
    )
    .await;
    let second = read_epoch(dir.path());
    assert!(second > first, "epoch {second} after {first}");
    server.shutdown().await;
}

fn read_epoch(dir: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("data/epoch")).unwrap();
    text.trim().parse().unwrap()
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
