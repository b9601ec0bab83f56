//! One supervised child process: `bigfleet svc <service> ...` in its own process group, its
//! stdout and stderr appended to `<log dir>/<name>.log`.
//!
//! Stopping signals the whole group (a service never forks today, but a group kill is what
//! guarantees "nothing left running" if one ever does): SIGTERM, then SIGKILL after the
//! deadline.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use bigfleet_loadtest::shard_load::procs::{group_command, signal_group as group_signal};
use rustix::process::Signal;

use super::UpError;
use crate::svc::PARENT_PID_ENV;

/// How to start a child: `exe svc <service> <args>` with extra environment.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildSpec {
    /// Unique within a mesh (`shard-0-decide`); names the log file.
    pub name: String,
    /// The `bigfleet` executable.
    pub exe: PathBuf,
    /// A name from [`crate::svc::SERVICES`].
    pub service: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl ChildSpec {
    pub fn new(name: &str, exe: &Path, service: &str, args: Vec<String>) -> Self {
        Self {
            name: name.to_owned(),
            exe: exe.to_owned(),
            service: service.to_owned(),
            args,
            env: Vec::new(),
        }
    }

    /// The command line, for logs and crash reports.
    pub fn command_line(&self) -> String {
        let mut s = format!("{} svc {}", self.exe.display(), self.service);
        for a in &self.args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

/// A running (or exited) child.
#[derive(Debug)]
pub struct ChildProc {
    spec: ChildSpec,
    child: tokio::process::Child,
    pid: u32,
    log_path: PathBuf,
    exited: Option<ExitStatus>,
}

impl ChildProc {
    /// Starts the child; its output is appended to `<log_dir>/<name>.log`.
    pub fn spawn(spec: &ChildSpec, log_dir: &Path) -> Result<Self, UpError> {
        let log_path = log_dir.join(format!("{}.log", spec.name));
        let io = |source| UpError::Io {
            what: format!("log file {}", log_path.display()),
            source,
        };
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io)?;
        writeln!(out, "=== bigfleet up: starting {}", spec.command_line()).map_err(io)?;
        // A user's shell settings (say BIGFLEET_TLS_CERT) must not leak into the children;
        // the span-export filter is telemetry's, read by each child, not a service flag.
        let keep = [bigfleet_telemetry::OTEL_FILTER_ENV];
        let mut cmd = group_command(&spec.exe, out, &keep).map_err(io)?;
        cmd.arg("svc")
            .arg(&spec.service)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env(PARENT_PID_ENV, std::process::id().to_string());
        let child = cmd.spawn().map_err(|source| UpError::Spawn {
            name: spec.name.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        Ok(Self {
            spec: spec.clone(),
            child,
            pid,
            log_path,
            exited: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn spec(&self) -> &ChildSpec {
        &self.spec
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The exit status once the child has exited (non-blocking).
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited = Some(status);
        }
        self.exited
    }

    /// Sends `signal` to the child's process group.
    pub fn signal_group(&self, signal: Signal) {
        // Once reaped, the pid (and its group id) may belong to someone else.
        if self.exited.is_none() {
            group_signal(self.pid, signal);
        }
    }

    /// SIGTERM to the group; SIGKILL to the group if the child has not exited by
    /// `deadline`. Returns the exit status.
    pub async fn stop(&mut self, deadline: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.try_exited() {
            self.signal_group(Signal::KILL);
            return Some(s);
        }
        self.signal_group(Signal::TERM);
        let status = match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(r) => r.ok(),
            Err(_) => {
                tracing::warn!(child = %self.spec.name, "did not stop in time; killing");
                self.signal_group(Signal::KILL);
                self.child.wait().await.ok()
            }
        };
        // Stragglers of the group (if any) go with it.
        self.signal_group(Signal::KILL);
        self.exited = status;
        status
    }

    /// SIGKILL to the group, then reap.
    pub async fn kill(&mut self) -> Option<ExitStatus> {
        self.signal_group(Signal::KILL);
        let status = self.child.wait().await.ok();
        self.exited = status;
        status
    }

    /// The last `n` lines of the child's log.
    pub fn log_tail(&self, n: usize) -> Vec<String> {
        tail_lines(&self.log_path, n)
    }
}

/// The last `n` lines of a text file (reads at most the last 64 KiB).
pub fn tail_lines(path: &Path, n: usize) -> Vec<String> {
    const WINDOW: u64 = 64 * 1024;
    let Ok(mut f) = File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(WINDOW);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    // A window that starts mid-file starts mid-line: drop the fragment.
    let skip = usize::from(start > 0);
    lines[skip.min(lines.len())..]
        .iter()
        .rev()
        .take(n)
        .rev()
        .map(|l| (*l).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.log");
        let body: String = (0..50).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, body).unwrap();
        let t = tail_lines(&p, 3);
        assert_eq!(t, ["line 47", "line 48", "line 49"]);
        assert!(tail_lines(&dir.path().join("missing"), 3).is_empty());
    }

    #[test]
    fn command_line_names_the_service() {
        let s = ChildSpec::new(
            "shard-0-decide",
            Path::new("/bin/bigfleet"),
            "shard-decide",
            vec!["--shard-id".into(), "shard-0".into()],
        );
        assert_eq!(
            s.command_line(),
            "/bin/bigfleet svc shard-decide --shard-id shard-0"
        );
    }
}
