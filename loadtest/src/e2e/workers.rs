//! Execute worker pools as separate OS processes, for the bench's multi-process mode.
//!
//! Each child is the execute service's real `run` (the `bigfleet-shard-execute` binary,
//! `bigfleet svc shard-execute`, or `e2e-bench execute-worker`, which calls the same
//! library function) connected to the in-process decide, gateway and provider over their
//! Unix sockets. Children publish `/metrics` on a loopback port so the bench can count
//! what each one did.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::{HarnessError, sum_metric};

/// The argument of `e2e-bench` that turns the process into an execute worker.
pub const EXECUTE_WORKER_ARG: &str = "execute-worker";

/// The metric both decide and execute count finished actions with.
pub const OUTCOMES_METRIC: &str = "bigfleet_shard_action_execute_outcomes_total";

/// How to start one execute worker: a program and the arguments before the service flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl WorkerCommand {
    /// `program` with no leading arguments (e.g. `target/release/bigfleet-shard-execute`).
    pub fn program(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
        }
    }

    /// A whitespace-separated command line (`target/release/bigfleet svc shard-execute`).
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let program = words.next()?;
        Some(Self {
            program: program.into(),
            args: words.map(str::to_owned).collect(),
        })
    }

    /// `e2e-bench execute-worker` of the running binary.
    pub fn this_binary() -> std::io::Result<Self> {
        Ok(Self {
            program: std::env::current_exe()?,
            args: vec![EXECUTE_WORKER_ARG.to_owned()],
        })
    }
}

/// The three endpoints every worker dials.
#[derive(Debug, Clone)]
pub struct WorkerTargets {
    pub decide: String,
    pub gateway: String,
    pub provider: String,
}

struct WorkerProcess {
    child: Child,
    metrics: SocketAddr,
}

/// Running worker processes; killed on drop.
pub struct WorkerProcesses {
    children: Vec<WorkerProcess>,
}

impl std::fmt::Debug for WorkerProcesses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerProcesses")
            .field(
                "metrics",
                &self.children.iter().map(|c| c.metrics).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A loopback port nobody listens on right now (the child binds it a moment later).
fn free_port() -> std::io::Result<SocketAddr> {
    Ok(bigfleet_mesh::ports::reserve_loopback_port()?.release())
}

impl WorkerProcesses {
    /// Starts `count` workers with `concurrency` actions in flight each.
    pub fn spawn(
        command: &WorkerCommand,
        count: u32,
        concurrency: u32,
        targets: &WorkerTargets,
    ) -> Result<Self, HarnessError> {
        let mut children = Vec::new();
        for i in 0..count {
            let metrics = free_port()?;
            let mut cmd = Command::new(&command.program);
            cmd.args(&command.args)
                .args(["--shard-id", "shard-0"])
                .args(["--decide-addr", &targets.decide])
                .args(["--gateway-addr", &targets.gateway])
                .args(["--provider-addr", &targets.provider])
                .args(["--concurrency", &concurrency.to_string()])
                .args(["--metrics-addr", &metrics.to_string()])
                .args(["--drain-timeout", "2s"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            if std::env::var_os("RUST_LOG").is_none() {
                cmd.env("RUST_LOG", "warn");
            }
            let child = cmd.spawn().map_err(|e| HarnessError::Start {
                what: "execute process",
                reason: format!("{} (worker {i}): {e}", command.program.display()),
            })?;
            children.push(WorkerProcess { child, metrics });
        }
        Ok(Self { children })
    }

    pub fn len(&self) -> usize {
        self.children.len()
    }

    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// An error naming the first worker that exited.
    pub fn check_alive(&mut self) -> Result<(), HarnessError> {
        for (i, c) in self.children.iter_mut().enumerate() {
            if let Some(status) = c.child.try_wait()? {
                return Err(HarnessError::Start {
                    what: "execute process",
                    reason: format!("worker {i} exited: {status}"),
                });
            }
        }
        Ok(())
    }

    /// Actions each worker finished (any outcome) and how many succeeded, from its
    /// `/metrics`.
    pub async fn executed(&self) -> Result<Vec<(u64, u64)>, HarnessError> {
        let mut out = Vec::new();
        for c in &self.children {
            let text = scrape(c.metrics).await?;
            out.push((
                sum_metric(&text, OUTCOMES_METRIC, None),
                sum_metric(&text, OUTCOMES_METRIC, Some(("outcome", "success"))),
            ));
        }
        Ok(out)
    }

    /// CPU seconds (user + system) each worker used so far (`None` off Linux).
    pub fn cpu_seconds(&self) -> Option<Vec<f64>> {
        self.children
            .iter()
            .map(|c| c.child.id().and_then(process_cpu_seconds))
            .collect()
    }

    /// Kills every worker and reaps it.
    pub async fn shutdown(mut self) {
        for c in &mut self.children {
            let _ = c.child.start_kill();
        }
        for c in &mut self.children {
            let _ = c.child.wait().await;
        }
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, 100 on every Linux
/// architecture the bench runs on.
const USER_HZ: f64 = 100.0;

/// User + system CPU seconds of process `pid`, from `/proc` (Linux only).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_from_stat(&stat)
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds. The command name may contain
/// spaces and parentheses, so fields are counted after its last `)`.
fn cpu_from_stat(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// `GET /metrics` of a worker, body only.
async fn scrape(addr: SocketAddr) -> Result<String, HarnessError> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| HarnessError::Start {
            what: "execute metrics",
            reason: format!("{addr}: timed out"),
        })??;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => Err(HarnessError::Start {
            what: "execute metrics",
            reason: format!("{addr}: unexpected answer"),
        }),
    }
}

/// `unix://<path>`.
pub fn unix_target(path: &Path) -> String {
    format!("unix://{}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        let c = WorkerCommand::parse("  target/release/bigfleet svc shard-execute ").unwrap();
        assert_eq!(c.program, PathBuf::from("target/release/bigfleet"));
        assert_eq!(c.args, ["svc", "shard-execute"]);
        assert_eq!(WorkerCommand::parse("   "), None);
        assert!(WorkerCommand::program("x").args.is_empty());
    }

    #[test]
    fn cpu_from_proc_stat() {
        let line = "4242 (e2e (bench) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(cpu_from_stat(line), Some(3.0));
        assert_eq!(cpu_from_stat("garbage"), None);
        if cfg!(target_os = "linux") {
            assert!(process_cpu_seconds(std::process::id()).is_some());
        }
    }

    #[tokio::test]
    async fn a_missing_program_is_a_start_error() {
        let targets = WorkerTargets {
            decide: "unix:///nowhere/d.sock".into(),
            gateway: "unix:///nowhere/g.sock".into(),
            provider: "unix:///nowhere/p.sock".into(),
        };
        let err = WorkerProcesses::spawn(
            &WorkerCommand::program("/nonexistent/bigfleet-shard-execute"),
            1,
            4,
            &targets,
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent"), "{err}");
    }
}
