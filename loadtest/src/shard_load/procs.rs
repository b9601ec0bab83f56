//! The shard's real service binaries as child processes: where they are, how each one is
//! started, its log file, readiness on `/readyz`, and stopping.
//!
//! Every child runs in its own process group with its stdout and stderr appended to
//! `<run dir>/logs/<name>.log`. [`Children::stop_all`] sends SIGTERM to each group, waits,
//! then SIGKILLs; dropping [`Children`] (an error, a panic, Ctrl-C dropping the run)
//! SIGKILLs every group that is still there, so a run never leaves services behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};

use super::ShardLoadError;
use super::prom;

/// Standalone binary names of the services a shard is made of.
pub const DECIDE_BIN: &str = "bigfleet-shard-decide";
pub const GATEWAY_BIN: &str = "bigfleet-session-gateway";
pub const EXECUTE_BIN: &str = "bigfleet-shard-execute";
pub const PROVIDER_BIN: &str = "bigfleet-fake-provider";

/// Every binary `shard-load` starts.
pub const ALL_BINS: [&str; 4] = [PROVIDER_BIN, DECIDE_BIN, GATEWAY_BIN, EXECUTE_BIN];

/// Where the service binaries are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub dir: PathBuf,
}

impl Binaries {
    /// `dir` when given; otherwise the directory of the running executable (its parent
    /// when that is cargo's `deps/`, as for a test binary). Every binary must exist there.
    pub fn locate(dir: Option<&Path>) -> Result<Self, ShardLoadError> {
        let dir = match dir {
            Some(d) => d.to_owned(),
            None => default_dir().map_err(|e| ShardLoadError::Io {
                what: "locating the running executable".into(),
                source: e,
            })?,
        };
        let missing: Vec<&str> = ALL_BINS
            .iter()
            .copied()
            .filter(|b| !dir.join(b).is_file())
            .collect();
        if missing.is_empty() {
            Ok(Self { dir })
        } else {
            Err(ShardLoadError::MissingBinaries {
                dir,
                missing: missing.join(", "),
            })
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The directory of the current executable, skipping cargo's `deps/`.
pub fn default_dir() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .map(Path::to_owned)
        .ok_or_else(|| std::io::Error::other("executable has no parent directory"))?;
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_owned).unwrap_or(dir)
    } else {
        dir
    })
}

/// What a child is, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Provider,
    Decide,
    Gateway,
    Execute,
}

struct Proc {
    name: String,
    role: Role,
    child: Child,
    pid: u32,
    /// `/readyz` and `/metrics`.
    ops: SocketAddr,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.exited = Some(s);
        }
        self.exited
    }

    fn signal_group(&self, signal: Signal) {
        signal_group(self.pid, signal);
    }
}

/// A command for a supervised service child (here and in `bigfleet up`): in its own process
/// group, so a terminal's Ctrl-C reaches only the supervisor, which stops the children in
/// order, and a group signal reaches anything the child starts; stdout and stderr appended
/// to `log`; killed when dropped. The caller's `BIGFLEET_*` variables other than `keep_env`
/// are removed: every service flag also reads `BIGFLEET_<FLAG>`, and the children are
/// configured entirely by flags.
pub fn group_command(
    program: &Path,
    log: std::fs::File,
    keep_env: &[&str],
) -> std::io::Result<Command> {
    let err = log.try_clone()?;
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key
            .to_str()
            .is_some_and(|k| k.starts_with("BIGFLEET_") && !keep_env.contains(&k))
        {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(true);
    Ok(cmd)
}

/// Sends `signal` to the process group of the child `pid` started by [`group_command`].
pub fn signal_group(pid: u32, signal: Signal) {
    // Never pid 0 or 1: those would address our own group or everything.
    if pid > 1
        && let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Running service processes.
pub struct Children {
    procs: Vec<Proc>,
    log_dir: PathBuf,
}

impl std::fmt::Debug for Children {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field(
                "procs",
                &self
                    .procs
                    .iter()
                    .map(|p| (&p.name, p.pid))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Lines of a dead child's log shown in errors.
const TAIL_LINES: usize = 30;

impl Children {
    pub fn new(log_dir: &Path) -> Result<Self, ShardLoadError> {
        std::fs::create_dir_all(log_dir).map_err(|source| ShardLoadError::Io {
            what: format!("creating {}", log_dir.display()),
            source,
        })?;
        Ok(Self {
            procs: Vec::new(),
            log_dir: log_dir.to_owned(),
        })
    }

    /// Starts `program args` as `name`, serving `/readyz` and `/metrics` on `ops`.
    pub fn spawn(
        &mut self,
        name: &str,
        role: Role,
        program: &Path,
        args: &[String],
        ops: SocketAddr,
    ) -> Result<(), ShardLoadError> {
        let log = self.log_dir.join(format!("{name}.log"));
        let io = |source| ShardLoadError::Io {
            what: format!("opening {}", log.display()),
            source,
        };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io)?;
        let mut cmd = group_command(program, out, &[]).map_err(io)?;
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        cmd.args(args);
        let child = cmd.spawn().map_err(|source| ShardLoadError::Io {
            what: format!("starting {} ({})", name, program.display()),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        self.procs.push(Proc {
            name: name.to_owned(),
            role,
            child,
            pid,
            ops,
            log,
            exited: None,
        });
        Ok(())
    }

    /// Waits until every child whose name starts with one of `names` answers `/readyz`
    /// with 200; fails at once, with its log, when one exits.
    pub async fn wait_ready(
        &mut self,
        names: &[&str],
        timeout: Duration,
    ) -> Result<(), ShardLoadError> {
        let mut pending = Vec::new();
        let ready = bigfleet_mesh::poll_until(timeout, Duration::from_millis(100), async || {
            self.check_alive()?;
            pending.clear();
            for p in self
                .procs
                .iter()
                .filter(|p| names.contains(&p.name.as_str()))
            {
                if !matches!(prom::http_get(p.ops, "/readyz").await, Ok((200, _))) {
                    pending.push(p.name.clone());
                }
            }
            Ok::<_, ShardLoadError>(pending.is_empty().then_some(()))
        })
        .await?;
        if ready.is_some() {
            return Ok(());
        }
        let tails = pending
            .iter()
            .filter_map(|n| self.procs.iter().find(|p| &p.name == n))
            .map(|p| format!("--- {} ({}) ---\n{}", p.name, p.log.display(), tail(&p.log)))
            .collect::<Vec<_>>()
            .join("\n");
        Err(ShardLoadError::NotReady {
            names: pending.join(", "),
            timeout,
            tails,
        })
    }

    /// An error naming (with its log) the first child that exited.
    pub fn check_alive(&mut self) -> Result<(), ShardLoadError> {
        for p in &mut self.procs {
            if let Some(status) = p.poll_exit() {
                return Err(ShardLoadError::ChildExited {
                    name: p.name.clone(),
                    status: status.to_string(),
                    log: p.log.clone(),
                    tail: tail(&p.log),
                });
            }
        }
        Ok(())
    }

    /// `(pid, ops address)` of every child of `role`.
    pub fn of(&self, role: Role) -> Vec<(u32, SocketAddr)> {
        self.procs
            .iter()
            .filter(|p| p.role == role)
            .map(|p| (p.pid, p.ops))
            .collect()
    }

    /// SIGTERM to every group (last started first), SIGKILL after `deadline`.
    pub async fn stop_all(&mut self, deadline: Duration) {
        for p in self.procs.iter_mut().rev() {
            if p.poll_exit().is_none() {
                p.signal_group(Signal::TERM);
                if tokio::time::timeout(deadline, p.child.wait())
                    .await
                    .is_err()
                {
                    p.signal_group(Signal::KILL);
                    let _ = p.child.wait().await;
                }
            }
            // Anything else the child left in its group goes with it.
            p.signal_group(Signal::KILL);
            p.exited = Some(p.exited.unwrap_or_default());
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if p.poll_exit().is_none() {
                p.signal_group(Signal::KILL);
                let _ = p.child.start_kill();
            }
        }
    }
}

/// The last lines of a log file (its last 32 KiB at most).
pub fn tail(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let start = bytes.len().saturating_sub(32 * 1024);
    let text = String::from_utf8_lossy(&bytes[start..]);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..]
        .iter()
        .map(|l| format!("  | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binaries_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DECIDE_BIN), "").unwrap();
        let err = Binaries::locate(Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains(GATEWAY_BIN), "{err}");
        assert!(err.contains(PROVIDER_BIN), "{err}");
        assert!(!err.contains(&format!("{DECIDE_BIN},")), "{err}");
        for b in ALL_BINS {
            std::fs::write(dir.path().join(b), "").unwrap();
        }
        assert_eq!(
            Binaries::locate(Some(dir.path()))
                .unwrap()
                .path(GATEWAY_BIN),
            dir.path().join(GATEWAY_BIN)
        );
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        let body: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, body).unwrap();
        let t = tail(&p);
        assert!(t.ends_with("  | line 99"), "{t}");
        assert!(!t.contains("line 69\n"), "{t}");
        assert_eq!(tail(&dir.path().join("absent")), "");
    }

    #[tokio::test]
    async fn a_child_that_exits_is_reported_with_its_log_and_drop_kills_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Children::new(&dir.path().join("logs")).unwrap();
        let ops: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut sh = |name: &str, role: Role, script: &str| {
            c.spawn(
                name,
                role,
                Path::new("/bin/sh"),
                &["-c".into(), script.into()],
                ops,
            )
            .unwrap();
        };
        sh("sleeper", Role::Execute, "sleep 60");
        sh("quitter", Role::Decide, "echo boom; exit 3");
        let sleeper = c.of(Role::Execute)[0].0;
        let err = c
            .wait_ready(&["sleeper", "quitter"], Duration::from_secs(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("quitter"), "{err}");
        assert!(err.contains("boom"), "{err}");
        drop(c);
        // The sleeper's group was killed: its pid goes away (reaped by tokio's orphan queue
        // or left a zombie only briefly).
        bigfleet_testkit::wait_until(Duration::from_secs(10), "the sleeper to go", async || {
            let state =
                std::fs::read_to_string(format!("/proc/{sleeper}/stat")).unwrap_or_default();
            if state.is_empty() || state.contains(") Z ") {
                Ok(())
            } else {
                Err(format!("still running: {state}"))
            }
        })
        .await;
    }
}
