//! The local mesh as child processes: plan, start in tiers, wait for readiness, supervise,
//! restart, stop. `bigfleet up` runs on it, and so do the end-to-end tests (which start the
//! real `bigfleet` binary's services through it and poke at single children).
//!
//! Layout of a run directory:
//!
//! ```text
//! `<run>/logs/<child>.log`        stdout + stderr of every child (appended across restarts)
//! `<run>/tls/`                    CA and role certificates (--tls)
//! `<run>/coordinator/`            the single-node coordinator's data
//! `<run>/coordinator-<i>/`        replica i's data (`--coordinators` above 1)
//! `<run>/provider-<i>/`           a fake provider's catalog (and socket under --tls); with
//!                                 `provider_audit`, fence.jsonl and actuations.jsonl
//! `<run>/shard-<i>/`              decide.sock, gateway.sock; decide-data/{epoch,decide.lock}
//! ```
//!
//! Each shard gets its own fake provider (one provider per region, as deployed): shards
//! sharing one pool of machines would fight over them. Children are started by tier —
//! coordinator and providers, then decides and gateways, then execute workers, then
//! inspect — and each tier must answer `/readyz` before the next starts.
//!
//! * `spec` — what to start ([`MeshSpec`]).
//! * `plan` — the command line of every child, and the order they start in.
//! * `ports` — the endpoints children listen on, and the reservations that keep them free.
//! * `tls` — the `--tls` material children and clients present.
//! * `children` — start, stop, kill, restart and crash reports of children.
//! * `ready` — waiting for a tier's `/readyz`.
//! * `clients` — calls into a running mesh (provider, shard, inspect, admin, metrics).
//! * `counts` — machines per state.

mod children;
mod clients;
mod counts;
mod plan;
mod ports;
mod ready;
mod spec;
mod tls;

use std::path::{Path, PathBuf};

use super::UpError;
use crate::up::pki::Pki;

use self::children::Managed;
pub use self::children::{CRASH_TAIL_LINES, Crash};
pub use self::clients::{inspect_needs, list_machines};
pub use self::counts::{count_by_state, state_name};
use self::plan::mkdir;
pub use self::ports::{CoordinatorPorts, InspectPorts, Ports, ProviderPorts, ShardPorts};
pub use self::spec::{ACTUATION_LOG, FENCE_FILE, FakeSeed, MeshSpec, ProviderSpec};

/// A running local mesh.
pub struct Mesh {
    spec: MeshSpec,
    ports: Ports,
    children: Vec<Managed>,
    pki: Option<Pki>,
    log_dir: PathBuf,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("run_dir", &self.spec.run_dir)
            .field("children", &self.child_names())
            .finish()
    }
}

impl Mesh {
    /// Plans, starts and waits for every child; on failure everything started is stopped
    /// and the error carries the failing child's last log lines.
    pub async fn start(spec: MeshSpec) -> Result<Mesh, UpError> {
        if spec.shards == 0 {
            return Err(UpError::Config("--shards must be at least 1".into()));
        }
        if spec.inspect && !spec.coordinator {
            return Err(UpError::Config(
                "inspect discovers shards through the coordinator".into(),
            ));
        }
        if let ProviderSpec::Fake(seeds) = &spec.provider
            && seeds.len() != 1
            && seeds.len() != spec.shards
        {
            return Err(UpError::Config(format!(
                "{} provider seeds for {} shards",
                seeds.len(),
                spec.shards
            )));
        }
        mkdir(&spec.run_dir)?;
        let log_dir = spec.run_dir.join("logs");
        mkdir(&log_dir)?;
        let pki = if spec.tls {
            Some(Pki::create(&spec.run_dir.join("tls"))?)
        } else {
            None
        };
        let mut mesh = Mesh {
            ports: Ports {
                run_dir: spec.run_dir.display().to_string(),
                tls: spec.tls,
                coordinator: None,
                coordinators: Vec::new(),
                shards: Vec::new(),
                inspect: None,
                provider: ProviderPorts {
                    grpc: None,
                    unix: None,
                    target: String::new(),
                    admin_http: None,
                    metrics_http: None,
                },
                providers: Vec::new(),
            },
            spec,
            children: Vec::new(),
            pki,
            log_dir,
        };
        match mesh.plan_and_start().await {
            Ok(()) => Ok(mesh),
            Err(e) => {
                mesh.stop_all().await;
                Err(e)
            }
        }
    }

    /// The fake providers' actuation logs (with [`MeshSpec::provider_audit`]; none with an
    /// external provider).
    pub fn actuation_logs(&self) -> Vec<PathBuf> {
        match (&self.spec.provider, self.spec.provider_audit) {
            (ProviderSpec::Fake(_), true) => (0..if self.spec.shared_provider {
                1
            } else {
                self.spec.shards
            })
                .map(|i| {
                    self.spec
                        .run_dir
                        .join(format!("provider-{i}"))
                        .join(ACTUATION_LOG)
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Every endpoint.
    pub fn ports(&self) -> &Ports {
        &self.ports
    }

    pub fn spec(&self) -> &MeshSpec {
        &self.spec
    }

    pub fn run_dir(&self) -> &Path {
        &self.spec.run_dir
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn start_rejects_inconsistent_specs() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = MeshSpec::new("/nonexistent/bigfleet", dir.path());
        spec.shards = 0;
        assert!(matches!(
            Mesh::start(spec.clone()).await,
            Err(UpError::Config(_))
        ));
        spec.shards = 1;
        spec.coordinator = false;
        assert!(matches!(
            Mesh::start(spec.clone()).await,
            Err(UpError::Config(_))
        ));
        spec.coordinator = true;
        // A missing executable is a spawn error naming the child, and nothing is left.
        match Mesh::start(spec).await {
            Err(UpError::Spawn { name, .. }) => assert_eq!(name, "coordinator"),
            other => panic!("{other:?}"),
        }
    }

    /// A stand-in for the `bigfleet` executable: every child runs `script`.
    fn spec_running(dir: &Path, script: &str) -> MeshSpec {
        use std::os::unix::fs::PermissionsExt;
        let exe = dir.join("fake-bigfleet");
        std::fs::write(&exe, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut spec = MeshSpec::new(&exe, dir.join("run"));
        spec.ready_timeout = Duration::from_millis(600);
        spec
    }

    #[tokio::test]
    async fn a_child_that_exits_before_ready_fails_start_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        // Only the coordinator fails (its arguments alone have --raft-bind); the providers
        // started beside it keep running, so the crash must name the one that exited.
        let spec = spec_running(
            dir.path(),
            r#"case "$*" in *--raft-bind*) echo boom-before-ready; exit 3;; esac; exec sleep 60"#,
        );
        match Mesh::start(spec).await {
            Err(UpError::ChildFailed(crash)) => {
                assert_eq!(crash.name, "coordinator");
                assert!(
                    crash.tail.iter().any(|l| l.contains("boom-before-ready")),
                    "{crash}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_child_never_ready_fails_start_at_the_deadline_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec_running(dir.path(), "echo still-starting; exec sleep 60");
        let started = std::time::Instant::now();
        match Mesh::start(spec).await {
            Err(UpError::NotReady {
                children,
                tails,
                timeout,
            }) => {
                assert_eq!(timeout, Duration::from_millis(600));
                assert!(children.starts_with("coordinator ("), "{children}");
                assert!(tails.contains("still-starting"), "{tails}");
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(600));
    }
}
