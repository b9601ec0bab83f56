//! The children of a running mesh: starting a tier, stopping, killing and restarting one
//! child, stopping them all in reverse tier order, and reporting the ones that crashed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;

use super::{Mesh, UpError};
use crate::up::child::{ChildProc, ChildSpec};

/// A child that exited while it was supposed to run.
#[derive(Debug, Clone)]
pub struct Crash {
    pub name: String,
    pub status: Option<ExitStatus>,
    pub log_path: PathBuf,
    /// Its last log lines.
    pub tail: Vec<String>,
}

impl std::fmt::Display for Crash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self
            .status
            .map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
        writeln!(
            f,
            "child {} exited ({status}); last log lines ({}):",
            self.name,
            self.log_path.display()
        )?;
        for l in &self.tail {
            writeln!(f, "  | {l}")?;
        }
        Ok(())
    }
}

/// Lines of a crashed child's log shown in reports.
pub const CRASH_TAIL_LINES: usize = 20;

pub(super) struct Managed {
    pub(super) proc: ChildProc,
    /// `/readyz` address.
    pub(super) ready: Option<SocketAddr>,
    /// Tier (stop order is the reverse).
    pub(super) tier: u8,
    /// False once stopped on purpose or reported as crashed.
    pub(super) supervised: bool,
}

impl Mesh {
    pub(super) async fn start_tier(
        &mut self,
        tier: u8,
        specs: Vec<(ChildSpec, Option<SocketAddr>)>,
    ) -> Result<(), UpError> {
        let first = self.children.len();
        for (spec, ready) in specs {
            let proc = ChildProc::spawn(&spec, &self.log_dir)?;
            tracing::info!(child = %spec.name, pid = proc.pid(), "started");
            self.children.push(Managed {
                proc,
                ready,
                tier,
                supervised: true,
            });
        }
        let idx: Vec<usize> = (first..self.children.len()).collect();
        self.wait_ready(&idx).await
    }

    pub fn child_names(&self) -> Vec<String> {
        self.children
            .iter()
            .map(|c| c.proc.name().to_owned())
            .collect()
    }

    /// Pids of children that have not exited (as far as we know).
    pub fn running_pids(&mut self) -> Vec<(String, u32)> {
        self.children
            .iter_mut()
            .filter_map(|c| {
                c.proc
                    .try_exited()
                    .is_none()
                    .then(|| (c.proc.name().to_owned(), c.proc.pid()))
            })
            .collect()
    }

    /// Children that exited while supervised since the last call (each reported once).
    pub fn crashes(&mut self) -> Vec<Crash> {
        let mut out = Vec::new();
        for c in &mut self.children {
            if c.supervised
                && let Some(status) = c.proc.try_exited()
            {
                c.supervised = false;
                out.push(Crash {
                    name: c.proc.name().to_owned(),
                    status: Some(status),
                    log_path: c.proc.log_path().to_owned(),
                    tail: c.proc.log_tail(CRASH_TAIL_LINES),
                });
            }
        }
        out
    }

    pub(super) fn index(&self, name: &str) -> Result<usize, UpError> {
        // The latest child of that name (a restart replaces the entry in place).
        self.children
            .iter()
            .rposition(|c| c.proc.name() == name)
            .ok_or_else(|| UpError::Config(format!("no child named {name:?}")))
    }

    /// Stops one child gracefully (SIGTERM, then SIGKILL after the deadline).
    pub async fn stop(&mut self, name: &str) -> Result<Option<ExitStatus>, UpError> {
        let i = self.index(name)?;
        let deadline = self.spec.stop_timeout;
        let c = &mut self.children[i];
        c.supervised = false;
        Ok(c.proc.stop(deadline).await)
    }

    /// Kills one child outright (SIGKILL), like a crash.
    pub async fn kill(&mut self, name: &str) -> Result<Option<ExitStatus>, UpError> {
        let i = self.index(name)?;
        let c = &mut self.children[i];
        c.supervised = false;
        Ok(c.proc.kill().await)
    }

    /// Starts a stopped child again with the same command line and waits for readiness.
    pub async fn restart(&mut self, name: &str) -> Result<(), UpError> {
        let i = self.index(name)?;
        if self.children[i].proc.try_exited().is_none() {
            let deadline = self.spec.stop_timeout;
            self.children[i].proc.stop(deadline).await;
        }
        let spec = self.children[i].proc.spec().clone();
        self.children[i].proc = ChildProc::spawn(&spec, &self.log_dir)?;
        self.children[i].supervised = true;
        self.wait_ready(&[i]).await
    }

    /// Starts an extra child (tests) and waits for `/readyz` on `ready`.
    pub async fn spawn(
        &mut self,
        spec: ChildSpec,
        ready: Option<SocketAddr>,
    ) -> Result<(), UpError> {
        self.start_tier(2, vec![(spec, ready)]).await
    }

    /// Stops every child, highest tier first (each tier in parallel).
    pub async fn stop_all(&mut self) {
        let deadline = self.spec.stop_timeout;
        for tier in (0..=3u8).rev() {
            let stops = self
                .children
                .iter_mut()
                .filter(|c| c.tier == tier)
                .map(|c| {
                    c.supervised = false;
                    c.proc.stop(deadline)
                });
            futures::future::join_all(stops).await;
        }
    }

    /// Stops everything and returns each child's exit status.
    pub async fn shutdown(mut self) -> BTreeMap<String, Option<ExitStatus>> {
        self.stop_all().await;
        self.children
            .iter_mut()
            .map(|c| (c.proc.name().to_owned(), c.proc.try_exited()))
            .collect()
    }
}
