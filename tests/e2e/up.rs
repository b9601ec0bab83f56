//! `bigfleet up` as a user runs it: the real binary, `--duration`, `--ports-file`, signals,
//! a crashing child, and `bigfleet svc` flag parity.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, RetryPolicy};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tonic_reflection::pb::v1 as refl;

use crate::harness::{exe, wait_until};

/// Pids of the direct children of `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` is a live (not zombie) process.
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

/// The processes of `pids` that are still alive.
fn still_alive(pids: &[u32]) -> Vec<u32> {
    pids.iter().copied().filter(|p| alive(*p)).collect()
}

fn assert_none_alive(pids: &[u32]) {
    let left = still_alive(pids);
    assert!(left.is_empty(), "children left running: {left:?}");
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

pub(crate) fn up(args: &[&str]) -> Child {
    // A context file of its own per run, never the user's ~/.config/bigfleet/context.json.
    let ctx = std::env::temp_dir().join(format!(
        "bigfleet-e2e-context-{}-{}.json",
        std::process::id(),
        NEXT_CONTEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    up_with_context(args, &ctx)
}

static NEXT_CONTEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub(crate) fn up_with_context(args: &[&str], context: &Path) -> Child {
    Command::new(exe())
        .arg("up")
        .args(args)
        .env("BIGFLEET_CONTEXT", context)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bigfleet up")
}

/// A scratch directory for one `bigfleet up`: its data dir, its ports file and its CLI
/// context file.
pub(crate) struct UpDirs {
    _dir: tempfile::TempDir,
    /// `--data-dir`: child logs, TLS material, state.
    pub(crate) run: PathBuf,
    /// `--ports-file`: written once every child is ready.
    pub(crate) ports: PathBuf,
    /// `BIGFLEET_CONTEXT`: where `up` writes the context the CLI finds it by.
    pub(crate) context: PathBuf,
}

impl UpDirs {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        UpDirs {
            run: dir.path().join("run"),
            ports: dir.path().join("ports.json"),
            context: dir.path().join("context.json"),
            _dir: dir,
        }
    }

    /// `bigfleet up <args> --ports-file <ports> --data-dir <run>`.
    pub(crate) fn up(&self, args: &[&str]) -> Child {
        let mut all = args.to_vec();
        all.extend([
            "--ports-file",
            self.ports.to_str().unwrap(),
            "--data-dir",
            self.run.to_str().unwrap(),
        ]);
        up_with_context(&all, &self.context)
    }

    /// `bigfleet lab <args>` against this `up` (found through its context file), which
    /// must succeed; its stdout.
    pub(crate) async fn lab(&self, args: &[&str]) -> String {
        let out = self.lab_output(args).await;
        assert!(
            out.status.success(),
            "lab {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `bigfleet lab <args>` against this `up`, however it ends.
    pub(crate) async fn lab_output(&self, args: &[&str]) -> std::process::Output {
        Command::new(exe())
            .arg("lab")
            .args(args)
            .env("BIGFLEET_CONTEXT", &self.context)
            .output()
            .await
            .unwrap()
    }

    /// Waits for the ports file: every child is ready. Its document.
    pub(crate) async fn ready(&self) -> serde_json::Value {
        wait_file(&self.ports, READY_TIMEOUT).await
    }
}

/// Sends `signal` to the process `pid`.
pub(crate) fn signal(pid: u32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
}

/// How long `up` may take to bring every child to ready. Generous on purpose: CI has two cores
/// and runs other server-starting tests beside this one.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(180);

pub(crate) async fn wait_file(path: &Path, timeout: Duration) -> serde_json::Value {
    let what = format!("a ports file at {}", path.display());
    wait_until(timeout, &what, async || {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        serde_json::from_str(&text).map_err(|e| e.to_string())
    })
    .await
}

pub(crate) async fn output(
    mut child: Child,
    timeout: Duration,
) -> (std::process::ExitStatus, String, String) {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let (mut o, mut e) = (String::new(), String::new());
    let status = tokio::time::timeout(timeout, async {
        let (a, b, s) = tokio::join!(
            out.read_to_string(&mut o),
            err.read_to_string(&mut e),
            child.wait()
        );
        a.unwrap();
        b.unwrap();
        s.unwrap()
    })
    .await
    .expect("bigfleet up did not exit in time");
    (status, o, e)
}

/// Health `SERVING` and reflection listing services, in plaintext.
async fn check_health_and_reflection(name: &str, addr: &str) {
    let ch = bigfleet_mesh::dial(
        &format!("http://{addr}"),
        &ChannelConfig::default(),
        &ClientStackConfig {
            metrics: None,
            retry: RetryPolicy::none(),
            attempt_timeout: Some(Duration::from_secs(5)),
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{name} {addr}: {e}"));
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("{name} {addr} health: {e}"))
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
        "{name}"
    );
    let mut reflection = refl::server_reflection_client::ServerReflectionClient::new(ch);
    let req = refl::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = reflection
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap_or_else(|e| panic!("{name} {addr} reflection: {e}"))
        .into_inner();
    let msg = stream
        .message()
        .await
        .unwrap()
        .expect("a reflection answer");
    let services = match msg.message_response {
        Some(refl::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
        }
        other => panic!("{name}: {other:?}"),
    };
    assert!(
        services.iter().any(|s| s.starts_with("bigfleet.")),
        "{name} lists {services:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_brings_the_mesh_up_satisfies_demand_and_prints_a_summary() {
    let dirs = UpDirs::new();
    let child = dirs.up(&["--duration", "12s", "--quiet"]);
    let doc = dirs.ready().await;
    let children = children_of(child.id().unwrap());
    assert_eq!(
        children.len(),
        6,
        "coordinator, provider, decide, gateway, execute, inspect"
    );
    let mut endpoints = Vec::new();
    crate::harness::grpc_endpoints(&doc, "", &mut endpoints);
    let names: Vec<&str> = endpoints.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        ".coordinator.grpc",
        ".shards[0].gateway_grpc",
        ".inspect.grpc",
        ".provider.grpc",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for (name, addr) in &endpoints {
        check_health_and_reflection(name, addr).await;
    }
    assert!(
        doc["inspect"]["dashboard"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );

    let (status, stdout, stderr) = output(child, Duration::from_secs(90)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line of JSON on stdout: {stdout:?}");
    let summary: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    for key in [
        "configured",
        "shortfalls",
        "machines_by_state",
        "actions_executed",
        "errors",
    ] {
        assert!(summary.get(key).is_some(), "{key} missing: {summary}");
    }
    assert_eq!(summary["errors"], 0, "{summary}\n{stderr}");
    for key in ["configured", "actions_executed", "needs_satisfied"] {
        assert!(summary[key].as_u64().unwrap() > 0, "{key}: {summary}");
    }
    assert!(stderr.contains("dashboard"), "{stderr}");
    assert_none_alive(&children);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_every_child_and_leaves_nothing_running() {
    let dirs = UpDirs::new();
    let child = dirs.up(&["--quiet", "--shards", "2"]);
    dirs.ready().await;
    let up_pid = child.id().unwrap();
    let children = children_of(up_pid);
    // coordinator, one shared provider (the multi-shard demo, ADR-0139), 2 × (decide,
    // gateway, execute), inspect
    assert_eq!(children.len(), 9, "{children:?}");
    signal(up_pid, rustix::process::Signal::TERM);
    let (status, _, stderr) = output(child, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}\n{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    assert_none_alive(&children);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_child_is_reported_with_its_last_log_lines() {
    let dirs = UpDirs::new();
    let child = dirs.up(&["--quiet", "--restart=false", "--duration", "10s"]);
    dirs.ready().await;
    let children = children_of(child.id().unwrap());
    let decide = children
        .iter()
        .copied()
        .find(|p| cmdline(*p).contains("shard-decide"))
        .expect("the decide child");
    signal(decide, rustix::process::Signal::KILL);
    let (status, _, stderr) = output(child, Duration::from_secs(60)).await;
    // A crash is reported and survived; only a crash loop fails `up`.
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("child shard-0-decide exited"), "{stderr}");
    assert!(stderr.contains("last log lines"), "{stderr}");
    assert!(stderr.contains("  | "), "the log tail is shown: {stderr}");
    assert!(stderr.contains("logs kept in") || dirs.run.join("logs/shard-0-decide.log").exists());
    assert!(stderr.contains("stays down"), "{stderr}");
    assert_none_alive(&children);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_with_tls_runs_every_edge_over_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Long enough for the first roll-ups to clear the restart quarantine (the catalog binds
    // more capacity to each cluster than its operator asks for: two confirmations at the
    // 5 s roll-up interval, ADR-0105) and for actions to run.
    let child = up(&[
        "--tls",
        "--duration",
        "20s",
        "--quiet",
        "--data-dir",
        run.to_str().unwrap(),
    ]);
    let (status, stdout, stderr) = output(child, Duration::from_secs(90)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["errors"], 0, "{summary}\n{stderr}");
    assert!(
        summary["actions_executed"].as_u64().unwrap() > 0,
        "{summary}"
    );
    assert!(run.join("tls/ca.crt").exists());
    // Child logs are files: no colour escape sequences in any of them (issue 23).
    for entry in std::fs::read_dir(run.join("logs")).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(!bytes.is_empty(), "{} is empty", path.display());
        assert!(
            !bytes.contains(&0x1b),
            "{} contains an escape byte",
            path.display()
        );
    }
    let gateway_args = std::fs::read_to_string(run.join("logs/shard-0-gateway.log")).unwrap();
    assert!(
        gateway_args.contains("--tls-cert"),
        "the gateway ran with mTLS"
    );
}

#[tokio::test]
async fn svc_help_is_the_services_own_help() {
    for service in bigfleet::svc::SERVICES {
        let out = Command::new(exe())
            .args(["svc", service, "--help"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{service}");
        let printed = String::from_utf8(out.stdout).unwrap();
        let expected = bigfleet::svc::long_help(service).unwrap();
        assert_eq!(printed.trim_end(), expected.trim_end(), "{service}");
    }
    let out = Command::new(exe())
        .args(["svc", "nope"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_up_takes_its_children_along() {
    let dirs = UpDirs::new();
    let mut child = dirs.up(&["--quiet", "--operators", "0"]);
    dirs.ready().await;
    let children = children_of(child.id().unwrap());
    assert_eq!(children.len(), 6, "{children:?}");
    child.kill().await.unwrap();
    wait_until(Duration::from_secs(20), "the orphans to exit", async || {
        let left = still_alive(&children);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("still running: {left:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_finds_a_running_up_with_no_flags() {
    let dirs = UpDirs::new();
    let mut child = dirs.up(&["--quiet", "--operators", "0"]);
    dirs.ready().await;
    let context = &dirs.context;
    let ctx: serde_json::Value = serde_json::from_slice(&std::fs::read(context).unwrap()).unwrap();
    assert!(
        ctx["coordinator"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    // `bigfleet shards`: no --coordinator, no BIGFLEET_COORDINATOR, only the context.
    let out = Command::new(exe())
        .arg("shards")
        .env_remove("BIGFLEET_COORDINATOR")
        .env_remove("BIGFLEET_INSPECT")
        .env("BIGFLEET_CONTEXT", context)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("shard-0"), "{stdout}");
    // A flag still wins over the context: a dead address fails, naming it.
    let out = Command::new(exe())
        .args(["shards", "--coordinator", "http://127.0.0.1:9"])
        .env("BIGFLEET_CONTEXT", context)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:9"));
    child.kill().await.unwrap();
}

/// A sample from a Prometheus text page (sum over label sets).
pub(crate) async fn metric_sum(addr: &str, name: &str) -> f64 {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return 0.0;
    };
    use tokio::io::AsyncWriteExt;
    let _ = s
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf)
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

pub(crate) fn child_running(parent: u32, needle: &str) -> Option<u32> {
    children_of(parent)
        .into_iter()
        .find(|p| cmdline(*p).contains(needle))
}

/// Static stability, live: with the coordinator killed (and left down), the shard keeps
/// executing actions; `up` reports the crash and keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_coordinator_down_the_shard_keeps_working() {
    let dirs = UpDirs::new();
    let child = dirs.up(&[
        "--quiet",
        "--restart=false",
        "--rollup-interval",
        "1s",
        "--cycle-interval",
        "200ms",
        "--duration",
        "30s",
    ]);
    let p = dirs.ready().await;
    let execute = p["shards"][0]["execute_http"].as_str().unwrap().to_owned();
    let up_pid = child.id().unwrap();
    let coord = child_running(up_pid, "svc coordinator").expect("a coordinator child");
    signal(coord, rustix::process::Signal::KILL);
    // SIGKILL is delivered at once but a process with many threads takes a moment to exit:
    // wait for that before asserting it stays gone (read at once, it could still be alive).
    wait_until(
        Duration::from_secs(10),
        "the coordinator to exit after SIGKILL",
        async || !alive(coord),
    )
    .await;
    let killed_at = metric_sum(&execute, "bigfleet_shard_action_execute_outcomes_total").await;
    wait_until(
        Duration::from_secs(30),
        "an action to complete with the coordinator down",
        async || {
            assert!(
                !alive(coord) && child_running(up_pid, "svc coordinator").is_none(),
                "the coordinator came back"
            );
            let now = metric_sum(&execute, "bigfleet_shard_action_execute_outcomes_total").await;
            if now > killed_at {
                Ok(())
            } else {
                Err(format!("{killed_at} outcomes before the kill, {now} now"))
            }
        },
    )
    .await;
    let (status, stdout, stderr) = output(child, Duration::from_secs(90)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        summary["crashed"],
        serde_json::json!(["coordinator"]),
        "{summary}"
    );
    assert_eq!(summary["restarts"], 0, "{summary}");
    assert!(stderr.contains("stays down"), "{stderr}");
}

/// Failure on demand by hand: `bigfleet lab kill|restart <child>` against a running `up`,
/// found through the CLI context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_kills_and_restarts_a_named_child() {
    let dirs = UpDirs::new();
    let mut child = dirs.up(&["--quiet", "--operators", "0"]);
    dirs.ready().await;
    let up_pid = child.id().unwrap();
    let before = child_running(up_pid, "svc coordinator").expect("a coordinator child");
    assert_eq!(
        dirs.lab(&["kill", "coordinator"]).await.trim(),
        "killed coordinator"
    );
    assert!(!alive(before), "the coordinator is gone");
    dirs.lab(&["restart", "coordinator"]).await;
    let after = child_running(up_pid, "svc coordinator").expect("a new coordinator child");
    assert_ne!(after, before);
    // An unknown child is an error naming it.
    let out = dirs.lab_output(&["kill", "nope"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    child.kill().await.unwrap();
}

/// `bigfleet lab provider-lists`: the fake provider's Lists lie on request (the queue is
/// replaced, not appended to), `honest` ends it, and a shard without a fake provider is an
/// error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_makes_the_provider_lie_and_honest_again() {
    let dirs = UpDirs::new();
    let mut child = dirs.up(&["--quiet", "--operators", "0"]);
    let doc = dirs.ready().await;
    let admin: std::net::SocketAddr = doc["providers"][0]["admin_http"]
        .as_str()
        .expect("provider-0's admin address")
        .parse()
        .unwrap();
    let pending = async || {
        let (code, text) =
            bigfleet::up::probe::http_request(admin, "POST", "/admin/list-faults", Some("{}"))
                .await
                .unwrap();
        assert_eq!(code, 200, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["pending"]
            .as_u64()
            .unwrap()
    };

    let said = dirs
        .lab(&[
            "provider-lists",
            "truncated",
            "--keep",
            "3",
            "--lists",
            "500",
        ])
        .await;
    assert!(
        said.starts_with("provider-0: the next 500 Lists answer truncated:3"),
        "{said}"
    );
    let queued = pending().await;
    assert!(queued > 0 && queued <= 500, "{queued} queued");
    // A second request replaces the first one's lies.
    dirs.lab(&["provider-lists", "down", "--lists", "1000"])
        .await;
    let queued = pending().await;
    assert!(queued > 500 && queued <= 1000, "{queued} queued");
    let said = dirs.lab(&["provider-lists", "honest"]).await;
    assert!(said.contains("honest again; 0 queued"), "{said}");
    assert_eq!(pending().await, 0);

    let out = dirs
        .lab_output(&["provider-lists", "empty", "--shard", "3"])
        .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("provider-3"), "{stderr}");
    let out = dirs
        .lab_output(&["provider-lists", "empty", "--lists", "0"])
        .await;
    assert!(!out.status.success(), "0 Lists is refused by the parser");
    child.kill().await.unwrap();
}

/// A crashed child is restarted (with backoff) and counted; the run ends clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_child_is_restarted_and_reported() {
    let dirs = UpDirs::new();
    let child = dirs.up(&["--quiet", "--duration", "20s"]);
    dirs.ready().await;
    let up_pid = child.id().unwrap();
    let exec = child_running(up_pid, "svc shard-execute").expect("an execute child");
    signal(exec, rustix::process::Signal::KILL);
    let (status, stdout, stderr) = output(child, Duration::from_secs(90)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["restarts"], 1, "{summary}\n{stderr}");
    assert_eq!(summary["crashed"].as_array().unwrap().len(), 1, "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_drives_an_external_provider() {
    let dirs = UpDirs::new();
    let port = bigfleet_testkit::free_tcp_port().unwrap();
    // Any implementation of the public contract will do; here: the fake, run by hand.
    let mut provider = Command::new(exe())
        .args([
            "svc",
            "fake-provider",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--catalog")
        .arg(crate::harness::catalog("small-gpu.json"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let child = dirs.up(&[
        "--provider",
        &format!("http://127.0.0.1:{port}"),
        "--clusters",
        "1",
        "--duration",
        "8s",
        "--quiet",
    ]);
    let (status, stdout, stderr) = output(child, Duration::from_secs(90)).await;
    assert!(status.success(), "{status}\n{stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dirs.ports).unwrap()).unwrap();
    assert_eq!(
        doc["provider"]["target"],
        format!("http://127.0.0.1:{port}")
    );
    assert!(
        doc["providers"].as_array().unwrap().is_empty(),
        "no fake provider started"
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["errors"], 0, "{summary}\n{stderr}");
    // The typical demand asks for two 8-GPU pods: the external provider's machines.
    assert!(
        summary["configured_by_cluster"]["cluster-0"]
            .as_u64()
            .unwrap_or(0)
            >= 2,
        "{summary}"
    );
    assert!(
        provider.try_wait().unwrap().is_none(),
        "the external provider is not ours to stop"
    );
    provider.kill().await.unwrap();
}
