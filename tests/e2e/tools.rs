//! External tools against a whole mesh started by `bigfleet up` (simulated operators supply
//! the demand): headless Chromium renders the dashboard svc-inspect serves, and grpcurl
//! lists, describes and calls every gRPC endpoint named in the ports file.
//!
//! The tools come from `.tools/env` (`BIGFLEET_CHROMIUM`, `BIGFLEET_GRPCURL`). Unset, the
//! test skips with a notice — except under `CI`, where a silently skipped check would pass
//! for a green one.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{exe, wait_until};
use bigfleet_testkit::tools::{dump_and_shoot, run, tool};

/// Renders `url` with Chromium (a screenshot into the target dir as `png`) and asserts the
/// page's text holds every `expected`; returns the text.
async fn page_shows(bin: &Path, url: &str, png: &str, expected: &[&str]) -> String {
    let target = target_dir();
    std::fs::create_dir_all(&target).unwrap();
    let page = dump_and_shoot(bin, url, &target.join(png)).await;
    for want in expected {
        assert!(page.contains(want), "{url} lacks {want:?}: {page}");
    }
    page
}

/// `bigfleet up` with its ports file written; stopped with SIGTERM (or killed on drop).
struct Up {
    child: tokio::process::Child,
    ports: serde_json::Value,
    _dir: tempfile::TempDir,
}

impl Up {
    async fn start() -> Up {
        let dir = tempfile::Builder::new()
            .prefix("bf-e2e-tools-")
            .tempdir()
            .unwrap();
        let ports = dir.path().join("ports.json");
        let child = tokio::process::Command::new(exe())
            .args([
                "up",
                "--quiet",
                "--clusters",
                "2",
                "--rollup-interval",
                "1s",
                "--cycle-interval",
                "200ms",
            ])
            .arg("--ports-file")
            .arg(&ports)
            .arg("--data-dir")
            .arg(dir.path().join("run"))
            // Its own CLI context, never the user's.
            .env("BIGFLEET_CONTEXT", dir.path().join("context.json"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn bigfleet up");
        let ports = wait_until(
            Duration::from_secs(60),
            "the ports file of bigfleet up",
            async || {
                let text = std::fs::read_to_string(&ports).map_err(|e| e.to_string())?;
                serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())
            },
        )
        .await;
        Up {
            child,
            ports,
            _dir: dir,
        }
    }

    fn inspect_http(&self) -> String {
        self.ports["inspect"]["http"].as_str().unwrap().to_owned()
    }

    /// Waits until svc-inspect shows verdicts for `cluster`'s demand.
    async fn wait_for_needs(&self, cluster: &str) {
        let addr = self.inspect_http();
        let path = format!("/api/v1/clusters/{cluster}/needs");
        let what = format!("needs of {cluster} in inspect");
        wait_until(Duration::from_secs(60), &what, async || {
            let body = http_get(&addr, &path).await;
            let total = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["needs"]["total"].as_u64())
                .unwrap_or(0);
            if total > 0 { Ok(()) } else { Err(body) }
        })
        .await
    }

    async fn stop(mut self) {
        let pid = self.child.id().expect("still running");
        let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("bigfleet up stops on SIGTERM")
            .unwrap();
        assert!(status.success(), "bigfleet up: {status}");
    }
}

/// The body of an HTTP/1.0 GET (1.0 so the answer is never chunked); empty on any error,
/// which the caller treats as "not yet".
async fn http_get(addr: &str, path: &str) -> String {
    let (addr, path) = (addr.to_owned(), path.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
    })
    .await
    .unwrap()
    .unwrap_or_default()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The services an endpoint must list, by its ports-file key. An endpoint this table does
/// not know fails the test, so a new one cannot slip by unchecked.
fn expected_services(name: &str) -> &'static [&'static str] {
    if name == ".coordinator.grpc" {
        &["bigfleet.v1alpha1.Coordinator"]
    } else if name == ".coordinator.raft_grpc" {
        &["bigfleet.mesh.v1.Raft"]
    } else if name.ends_with(".gateway_grpc") {
        &[
            "bigfleet.v1alpha1.Shard",
            "bigfleet.v1alpha1.ShardRead",
            "bigfleet.mesh.v1.ShardInfo",
        ]
    } else if name == ".inspect.grpc" {
        &["bigfleet.v1alpha1.ShardRead", "bigfleet.mesh.v1.Inspect"]
    } else if name == ".provider.grpc" || name.starts_with(".providers[") {
        &["bigfleet.v1alpha1.CapacityProvider"]
    } else {
        panic!("no expected services for endpoint {name}: extend expected_services")
    }
}

fn grpcurl(bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["-plaintext", "-max-time", "10"]).args(args);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_grpcurl_against_a_running_mesh() {
    let chromium_bin = tool("BIGFLEET_CHROMIUM");
    let grpcurl_bin = tool("BIGFLEET_GRPCURL");
    if chromium_bin.is_none() && grpcurl_bin.is_none() {
        return;
    }
    let up = Up::start().await;
    up.wait_for_needs("cluster-0").await;

    if let Some(bin) = &chromium_bin {
        let base = format!("http://{}", up.inspect_http());
        page_shows(
            bin,
            &format!("{base}/"),
            "e2e-dashboard-overview.png",
            &[
                "Fleet overview",
                "1 / 1 shards reachable",
                "shard-0",
                "Machines by state",
            ],
        )
        .await;
        let cluster = page_shows(
            bin,
            &format!("{base}/clusters/cluster-0"),
            "e2e-dashboard-cluster.png",
            &[
                "Cluster cluster-0",
                // The needs table's header and a row's shard column.
                "Unmet reason",
                "Residual deficit",
                "Matching supply",
                "shard-0",
            ],
        )
        .await;
        assert!(
            !cluster.contains("No reachable shard holds demand"),
            "{cluster}"
        );
    }

    if let Some(bin) = &grpcurl_bin {
        let mut endpoints = Vec::new();
        crate::harness::grpc_endpoints(&up.ports, "", &mut endpoints);
        for want in [
            ".coordinator.grpc",
            ".shards[0].gateway_grpc",
            ".inspect.grpc",
        ] {
            assert!(
                endpoints.iter().any(|(n, _)| n == want),
                "{want} missing from {endpoints:?}"
            );
        }
        for (name, addr) in &endpoints {
            let (ok, out, err) = run(grpcurl(bin, &[addr, "list"])).await;
            assert!(ok, "grpcurl list {name} {addr}: {err}");
            let listed: Vec<&str> = out.lines().map(str::trim).collect();
            let expected = expected_services(name);
            for svc in expected.iter().chain(&["grpc.health.v1.Health"]) {
                assert!(listed.contains(svc), "{name} lacks {svc}: {out}");
            }
            let (ok, out, err) = run(grpcurl(bin, &[addr, "describe", expected[0]])).await;
            assert!(ok, "grpcurl describe {name} {}: {err}", expected[0]);
            assert!(
                out.contains(&format!("{} is a service:", expected[0])) && out.contains("rpc "),
                "{name} describe {}: {out}",
                expected[0]
            );
        }

        let gateway = up.ports["shards"][0]["gateway_grpc"].as_str().unwrap();
        let inspect = up.ports["inspect"]["grpc"].as_str().unwrap();
        for (name, addr) in [("gateway", gateway), ("inspect", inspect)] {
            let (ok, out, err) = run(grpcurl(
                bin,
                &["-d", "{}", addr, "bigfleet.v1alpha1.ShardRead/InspectNeeds"],
            ))
            .await;
            assert!(ok, "InspectNeeds on {name}: {err}");
            let header_at = out
                .find("\"header\"")
                .unwrap_or_else(|| panic!("no header from {name}: {out}"));
            assert!(
                out.find("\"need\"").is_none_or(|n| header_at < n),
                "{name}: header first: {out}"
            );
            assert!(out.contains("\"totalNeeds\""), "{name}: {out}");
            assert!(
                out.contains("\"clusterId\": \"cluster-0\""),
                "{name}: {out}"
            );
        }
    }
    up.stop().await;
}
