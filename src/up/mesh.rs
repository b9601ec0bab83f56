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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_fake_provider::Catalog;
use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy};
use bigfleet_proto::mesh::v1 as meshpb;
use bigfleet_proto::v1alpha1 as pb;
use serde::Serialize;

use super::UpError;
use super::child::{ChildProc, ChildSpec};
use super::pki::Pki;
use super::probe::{self, Sample};

/// How the mesh gets its capacity provider.
#[derive(Debug, Clone)]
pub enum ProviderSpec {
    /// One fake provider per shard. One seed applies to every shard; otherwise one seed
    /// per shard.
    Fake(Vec<FakeSeed>),
    /// Every shard uses this provider URI (`http://host:port`, `unix:///path`).
    External(String),
}

/// What a fake provider starts with.
#[derive(Debug, Clone)]
pub enum FakeSeed {
    /// `Catalog::builtin()`.
    Builtin,
    /// A catalog file (fake-provider catalog format).
    File(PathBuf),
    /// A catalog written into the provider's directory.
    Catalog(Box<Catalog>),
    /// `--generate N --seed S`.
    Generate { machines: u64, seed: u64 },
}

/// Everything needed to start a mesh.
#[derive(Debug, Clone)]
pub struct MeshSpec {
    /// The `bigfleet` executable (`std::env::current_exe()` in `up`,
    /// `env!("CARGO_BIN_EXE_bigfleet")` in tests).
    pub exe: PathBuf,
    pub run_dir: PathBuf,
    pub shards: usize,
    pub provider: ProviderSpec,
    /// Start a single-node coordinator (and report to it).
    pub coordinator: bool,
    /// Coordinator replicas (one Raft cluster: `coord-0` bootstraps, the others join).
    /// One is named `coordinator`; several are `coordinator-<i>`.
    pub coordinators: usize,
    /// Start svc-inspect (needs the coordinator).
    pub inspect: bool,
    /// mTLS everywhere with a throwaway CA.
    pub tls: bool,
    /// Extra flags appended per service.
    pub decide_flags: Vec<String>,
    pub gateway_flags: Vec<String>,
    pub execute_flags: Vec<String>,
    pub provider_flags: Vec<String>,
    pub coordinator_flags: Vec<String>,
    pub inspect_flags: Vec<String>,
    /// Extra gateway flags of one shard (by shard id), after `gateway_flags`.
    pub gateway_shard_flags: BTreeMap<String, Vec<String>>,
    /// Each fake provider persists its fencing marks (`provider-<i>/fence.jsonl`, so a
    /// restarted provider still refuses a zombie) and logs every accepted mutating call
    /// (`provider-<i>/actuations.jsonl`), for `up --chaos`'s audit.
    pub provider_audit: bool,
    /// Extra environment of every child (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`, `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Bound on each tier's readiness wait.
    pub ready_timeout: Duration,
    /// SIGTERM → SIGKILL deadline per child.
    pub stop_timeout: Duration,
}

impl MeshSpec {
    /// One shard, built-in fake provider, coordinator and inspect, plaintext.
    pub fn new(exe: impl Into<PathBuf>, run_dir: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            run_dir: run_dir.into(),
            shards: 1,
            provider: ProviderSpec::Fake(vec![FakeSeed::Builtin]),
            coordinator: true,
            coordinators: 1,
            inspect: true,
            tls: false,
            decide_flags: Vec::new(),
            gateway_flags: Vec::new(),
            execute_flags: Vec::new(),
            provider_flags: Vec::new(),
            coordinator_flags: Vec::new(),
            inspect_flags: Vec::new(),
            gateway_shard_flags: BTreeMap::new(),
            provider_audit: false,
            env: Vec::new(),
            ready_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

/// Endpoints of the coordinator.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CoordinatorPorts {
    pub grpc: String,
    pub raft_grpc: String,
    pub http: String,
}

/// Endpoints of one shard.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShardPorts {
    pub id: String,
    /// The public port operators dial (Session, ShardRead, ShardInfo).
    pub gateway_grpc: String,
    pub gateway_http: String,
    /// decide's Unix socket (gRPC, with health and reflection).
    pub decide_unix: String,
    pub decide_http: String,
    pub execute_http: String,
    /// The provider URI this shard's decide and execute use.
    pub provider: String,
    #[serde(skip)]
    pub socket_dir: PathBuf,
    #[serde(skip)]
    pub data_dir: PathBuf,
}

/// Endpoints of svc-inspect.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InspectPorts {
    pub grpc: String,
    pub http: String,
    pub metrics_http: String,
    pub dashboard: String,
}

/// Endpoints of one fake provider.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProviderPorts {
    /// TCP gRPC address (plaintext meshes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<String>,
    /// Unix socket (under --tls, where TCP edges are mTLS and the fake serves none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix: Option<String>,
    /// Dialable URI.
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_http: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_http: Option<String>,
}

/// Every endpoint of a started mesh (the `--ports-file` document).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ports {
    pub run_dir: String,
    pub tls: bool,
    /// The first replica (`coord-0`), which every other component is pointed at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<CoordinatorPorts>,
    /// Every replica (with `--coordinators` above 1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub coordinators: Vec<CoordinatorPorts>,
    pub shards: Vec<ShardPorts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inspect: Option<InspectPorts>,
    /// The first shard's provider (the only one with one shard).
    pub provider: ProviderPorts,
    pub providers: Vec<ProviderPorts>,
}

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

/// A fake provider's fence file, in its directory (with [`MeshSpec::provider_audit`]).
pub const FENCE_FILE: &str = "fence.jsonl";
/// A fake provider's actuation log, in its directory (with [`MeshSpec::provider_audit`]).
pub const ACTUATION_LOG: &str = "actuations.jsonl";

/// Lines of a crashed child's log shown in reports.
pub const CRASH_TAIL_LINES: usize = 20;

struct Managed {
    proc: ChildProc,
    /// `/readyz` address.
    ready: Option<SocketAddr>,
    /// Tier (stop order is the reverse).
    tier: u8,
    /// False once stopped on purpose or reported as crashed.
    supervised: bool,
}

/// Ports reserved for children, each held until just before its tier starts: a tier that
/// starts seconds after planning (shards wait for the coordinator) must not find its ports
/// taken in the meantime.
#[derive(Default)]
struct PortPool(Vec<(u8, bigfleet_mesh::ports::PortReservation)>);

impl PortPool {
    fn take(&mut self, tier: u8) -> Result<SocketAddr, UpError> {
        let r = bigfleet_mesh::ports::reserve_loopback_port().map_err(|source| UpError::Io {
            what: "reserving a loopback port".into(),
            source,
        })?;
        let addr = r.addr();
        self.0.push((tier, r));
        Ok(addr)
    }

    /// Lets tier `tier`'s children bind their ports.
    fn release(&mut self, tier: u8) {
        self.0.retain(|(t, _)| *t != tier);
    }
}

fn mkdir(p: &Path) -> Result<(), UpError> {
    std::fs::create_dir_all(p).map_err(|source| UpError::Io {
        what: format!("creating {}", p.display()),
        source,
    })
}

/// Copies the regular files of `from` into `to` (created). A copied lock file is a new,
/// unlocked file, so the copy is free for another process.
fn copy_files(from: &Path, to: &Path) -> Result<(), UpError> {
    mkdir(to)?;
    let io = |what: String| move |source| UpError::Io { what, source };
    let entries = std::fs::read_dir(from).map_err(io(format!("reading {}", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", from.display())))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            let dest = to.join(entry.file_name());
            std::fs::copy(entry.path(), &dest).map_err(io(format!(
                "copying {} to {}",
                entry.path().display(),
                dest.display()
            )))?;
        }
    }
    Ok(())
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// The planned children of a shard (before ports are released).
struct ShardPlan {
    ports: ShardPorts,
    decide: (ChildSpec, SocketAddr),
    gateway: (ChildSpec, SocketAddr),
    execute: (ChildSpec, SocketAddr),
}

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

    fn tls_flags(&self, role: &str) -> Result<Vec<String>, UpError> {
        match &self.pki {
            Some(p) => p.flags(role),
            None => Ok(Vec::new()),
        }
    }

    fn scheme(&self) -> &'static str {
        if self.spec.tls { "https" } else { "http" }
    }

    fn child(
        &self,
        name: &str,
        service: &str,
        mut args: Vec<String>,
        extra: &[String],
    ) -> ChildSpec {
        args.extend(extra.iter().cloned());
        let mut c = ChildSpec::new(name, &self.spec.exe, service, args);
        c.env.clone_from(&self.spec.env);
        c
    }

    async fn plan_and_start(&mut self) -> Result<(), UpError> {
        let mut pool = PortPool::default();
        let run = self.spec.run_dir.clone();

        // Tier 0: coordinator and providers.
        let mut tier0 = Vec::new();
        if self.spec.coordinator {
            let n = self.spec.coordinators.max(1);
            let mut planned = Vec::new();
            for _ in 0..n {
                planned.push((pool.take(0)?, pool.take(0)?, pool.take(0)?));
            }
            let join = planned
                .iter()
                .map(|(grpc, _, _)| s(grpc))
                .collect::<Vec<_>>()
                .join(",");
            for (i, (grpc, raft, http)) in planned.into_iter().enumerate() {
                let (name, dir) = if n == 1 {
                    (s("coordinator"), run.join("coordinator"))
                } else {
                    (
                        format!("coordinator-{i}"),
                        run.join(format!("coordinator-{i}")),
                    )
                };
                let id = format!("coord-{i}");
                let mut args = vec![
                    s("--id"),
                    s(&id),
                    s("--listen"),
                    s(grpc),
                    s("--raft-bind"),
                    s(raft),
                    s("--data-dir"),
                    dir.display().to_string(),
                    // Only ordinal 0 honours it, and only with no state.
                    s("--bootstrap"),
                    s("--metrics-addr"),
                    s(http),
                    s("--drain-timeout"),
                    s("3s"),
                ];
                if n > 1 {
                    args.extend([s("--join-addr"), join.clone()]);
                }
                // A replica's identity is bigfleet://coordinator/<its --id> (the Raft port
                // binds message senders to it); admin stays the operators' CLI role.
                args.extend(self.tls_flags(&format!("coordinator/{id}"))?);
                let extra = self.spec.coordinator_flags.clone();
                tier0.push((self.child(&name, "coordinator", args, &extra), Some(http)));
                let ports = CoordinatorPorts {
                    grpc: s(grpc),
                    raft_grpc: s(raft),
                    http: s(http),
                };
                if i == 0 {
                    self.ports.coordinator = Some(ports.clone());
                }
                if n > 1 {
                    self.ports.coordinators.push(ports);
                }
            }
        }
        let provider_targets = match self.spec.provider.clone() {
            ProviderSpec::External(addr) => {
                self.ports.provider = ProviderPorts {
                    grpc: addr.strip_prefix("http://").map(str::to_owned),
                    unix: None,
                    target: addr.clone(),
                    admin_http: None,
                    metrics_http: None,
                };
                vec![addr; self.spec.shards]
            }
            ProviderSpec::Fake(seeds) => {
                let mut targets = Vec::new();
                for i in 0..self.spec.shards {
                    let seed = seeds.get(i).unwrap_or(&seeds[0]).clone();
                    let dir = run.join(format!("provider-{i}"));
                    mkdir(&dir)?;
                    let (admin, metrics) = (pool.take(0)?, pool.take(0)?);
                    let mut args = Vec::new();
                    let mut ports = ProviderPorts {
                        grpc: None,
                        unix: None,
                        target: String::new(),
                        admin_http: Some(s(admin)),
                        metrics_http: Some(s(metrics)),
                    };
                    if self.spec.tls {
                        let sock = socket_path(&dir, "provider.sock")?;
                        args.extend([s("--socket"), sock.display().to_string()]);
                        ports.unix = Some(sock.display().to_string());
                        ports.target = format!("unix://{}", sock.display());
                    } else {
                        let grpc = pool.take(0)?;
                        args.extend([s("--listen"), s(grpc)]);
                        ports.grpc = Some(s(grpc));
                        ports.target = format!("http://{grpc}");
                    }
                    match seed {
                        FakeSeed::Builtin => {}
                        FakeSeed::File(p) => {
                            args.extend([s("--catalog"), p.display().to_string()]);
                        }
                        FakeSeed::Catalog(c) => {
                            let p = dir.join("catalog.json");
                            std::fs::write(&p, c.to_json_pretty()).map_err(|source| {
                                UpError::Io {
                                    what: format!("writing {}", p.display()),
                                    source,
                                }
                            })?;
                            args.extend([s("--catalog"), p.display().to_string()]);
                        }
                        FakeSeed::Generate { machines, seed } => {
                            args.extend([s("--generate"), s(machines), s("--seed"), s(seed)]);
                        }
                    }
                    args.extend([s("--admin-addr"), s(admin), s("--metrics-addr"), s(metrics)]);
                    if self.spec.provider_audit {
                        args.extend([
                            s("--fence-file"),
                            dir.join(FENCE_FILE).display().to_string(),
                            s("--actuation-log"),
                            dir.join(ACTUATION_LOG).display().to_string(),
                        ]);
                    }
                    let extra = self.spec.provider_flags.clone();
                    tier0.push((
                        self.child(&format!("provider-{i}"), "fake-provider", args, &extra),
                        Some(metrics),
                    ));
                    targets.push(ports.target.clone());
                    if i == 0 {
                        self.ports.provider = ports.clone();
                    }
                    self.ports.providers.push(ports);
                }
                targets
            }
        };

        // Tiers 1 and 2: shards.
        let mut plans = Vec::new();
        for (i, provider) in provider_targets.iter().enumerate() {
            let id = format!("shard-{i}");
            let dir = run.join(&id);
            plans.push(self.plan_shard(
                &mut pool,
                &id,
                &id,
                &dir,
                &dir.join("decide-data"),
                provider,
            )?);
        }

        // Tier 3: inspect.
        let mut inspect = None;
        if self.spec.inspect {
            let coord = self.ports.coordinator.clone().expect("checked above");
            let (grpc, http, metrics) = (pool.take(3)?, pool.take(3)?, pool.take(3)?);
            let mut args = vec![
                s("--coordinator-addr"),
                format!("{}://{}", self.scheme(), coord.grpc),
                s("--listen"),
                s(grpc),
                s("--http-listen"),
                s(http),
                s("--metrics-addr"),
                s(metrics),
                s("--cache-ttl"),
                s("1s"),
                s("--drain-timeout"),
                s("3s"),
            ];
            args.extend(self.tls_flags("readonly")?);
            let extra = self.spec.inspect_flags.clone();
            inspect = Some((
                self.child("inspect", "inspect", args, &extra),
                Some(metrics),
            ));
            self.ports.inspect = Some(InspectPorts {
                grpc: s(grpc),
                http: s(http),
                metrics_http: s(metrics),
                dashboard: format!("http://{http}/"),
            });
        }

        // Each tier's children bind what was reserved for them.
        pool.release(0);
        self.start_tier(0, tier0).await?;
        let mut tier1 = Vec::new();
        let mut tier2 = Vec::new();
        for p in plans {
            tier1.push((p.decide.0, Some(p.decide.1)));
            tier1.push((p.gateway.0, Some(p.gateway.1)));
            tier2.push((p.execute.0, Some(p.execute.1)));
            self.ports.shards.push(p.ports);
        }
        pool.release(1);
        self.start_tier(1, tier1).await?;
        pool.release(2);
        self.start_tier(2, tier2).await?;
        if let Some(i) = inspect {
            pool.release(3);
            self.start_tier(3, vec![i]).await?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_shard(
        &self,
        pool: &mut PortPool,
        shard_id: &str,
        child_prefix: &str,
        socket_dir: &Path,
        data_dir: &Path,
        provider: &str,
    ) -> Result<ShardPlan, UpError> {
        mkdir(socket_dir)?;
        let decide_sock = socket_path(socket_dir, "decide.sock")?;
        let gateway_sock = socket_path(socket_dir, "gateway.sock")?;
        let (gw, gw_http, d_http, x_http) =
            (pool.take(1)?, pool.take(1)?, pool.take(1)?, pool.take(2)?);
        let mut dargs = vec![
            s("--shard-id"),
            s(shard_id),
            s("--socket-dir"),
            socket_dir.display().to_string(),
            s("--provider-addr"),
            s(provider),
            s("--data-dir"),
            data_dir.display().to_string(),
            s("--metrics-addr"),
            s(d_http),
            s("--drain-timeout"),
            s("3s"),
        ];
        if let Some(c) = &self.ports.coordinator {
            dargs.extend([
                s("--coordinator-addr"),
                format!("{}://{}", self.scheme(), c.grpc),
                s("--advertise-addr"),
                s(gw),
                s("--report-interval"),
                s("2s"),
            ]);
        }
        dargs.extend(self.tls_flags(&format!("shard/{shard_id}"))?);
        let mut gargs = vec![
            s("--shard-id"),
            s(shard_id),
            s("--listen"),
            s(gw),
            s("--socket-dir"),
            socket_dir.display().to_string(),
            s("--metrics-addr"),
            s(gw_http),
            s("--drain-timeout"),
            s("3s"),
        ];
        gargs.extend(self.tls_flags(&format!("shard/{shard_id}"))?);
        let mut gateway_flags = self.spec.gateway_flags.clone();
        if let Some(extra) = self.spec.gateway_shard_flags.get(shard_id) {
            gateway_flags.extend(extra.iter().cloned());
        }
        let mut xargs = vec![
            s("--shard-id"),
            s(shard_id),
            s("--decide-addr"),
            format!("unix://{}", decide_sock.display()),
            s("--gateway-addr"),
            format!("unix://{}", gateway_sock.display()),
            s("--provider-addr"),
            s(provider),
            s("--metrics-addr"),
            s(x_http),
            s("--drain-timeout"),
            s("3s"),
        ];
        xargs.extend(self.tls_flags(&format!("shard/{shard_id}/execute"))?);
        Ok(ShardPlan {
            ports: ShardPorts {
                id: shard_id.to_owned(),
                gateway_grpc: s(gw),
                gateway_http: s(gw_http),
                decide_unix: decide_sock.display().to_string(),
                decide_http: s(d_http),
                execute_http: s(x_http),
                provider: provider.to_owned(),
                socket_dir: socket_dir.to_owned(),
                data_dir: data_dir.to_owned(),
            },
            decide: (
                self.child(
                    &format!("{child_prefix}-decide"),
                    "shard-decide",
                    dargs,
                    &self.spec.decide_flags,
                ),
                d_http,
            ),
            gateway: (
                self.child(
                    &format!("{child_prefix}-gateway"),
                    "session-gateway",
                    gargs,
                    &gateway_flags,
                ),
                gw_http,
            ),
            execute: (
                self.child(
                    &format!("{child_prefix}-execute"),
                    "shard-execute",
                    xargs,
                    &self.spec.execute_flags,
                ),
                x_http,
            ),
        })
    }

    async fn start_tier(
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

    /// Waits until every listed child answers `/readyz` 200; fails early when one exits.
    async fn wait_ready(&mut self, idx: &[usize]) -> Result<(), UpError> {
        let deadline = Instant::now() + self.spec.ready_timeout;
        let mut pending: Vec<usize> = idx.to_vec();
        loop {
            for &i in &pending {
                let c = &mut self.children[i];
                if let Some(status) = c.proc.try_exited() {
                    c.supervised = false;
                    return Err(UpError::ChildFailed(Box::new(Crash {
                        name: c.proc.name().to_owned(),
                        status: Some(status),
                        log_path: c.proc.log_path().to_owned(),
                        tail: c.proc.log_tail(CRASH_TAIL_LINES),
                    })));
                }
            }
            let mut still = Vec::new();
            for &i in &pending {
                let ready = match self.children[i].ready {
                    None => true,
                    Some(addr) => probe::is_ready(addr).await,
                };
                if !ready {
                    still.push(i);
                }
            }
            pending = still;
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut names = Vec::new();
                let mut tails = String::new();
                for &i in &pending {
                    let c = &self.children[i];
                    let why = match c.ready {
                        Some(a) => probe::http_get(a, "/readyz", Duration::from_secs(1))
                            .await
                            .map_or_else(
                                |e| e.to_string(),
                                |(code, b)| format!("{code} {}", b.trim()),
                            ),
                        None => String::new(),
                    };
                    names.push(format!("{} ({why})", c.proc.name()));
                    tails.push_str(&format!("--- {} ---\n", c.proc.name()));
                    for l in c.proc.log_tail(CRASH_TAIL_LINES) {
                        tails.push_str(&format!("  | {l}\n"));
                    }
                }
                return Err(UpError::NotReady {
                    children: names.join(", "),
                    timeout: self.spec.ready_timeout,
                    tails,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The fake providers' actuation logs (with [`MeshSpec::provider_audit`]; none with an
    /// external provider).
    pub fn actuation_logs(&self) -> Vec<PathBuf> {
        match (&self.spec.provider, self.spec.provider_audit) {
            (ProviderSpec::Fake(_), true) => (0..self.spec.shards)
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

    /// The coordinator replica that is the Raft leader now (`bigfleet_coordinator_is_leader`
    /// on its ops port), by child name.
    pub async fn coordinator_leader(&self) -> Option<String> {
        for name in self.child_names() {
            if (name == "coordinator" || name.starts_with("coordinator-"))
                && let Ok(m) = self.metrics(&name).await
                && probe::sum(&m, "bigfleet_coordinator_is_leader", &[]) >= 1.0
            {
                return Some(name);
            }
        }
        None
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

    fn index(&self, name: &str) -> Result<usize, UpError> {
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

    /// Starts a second incarnation of shard `index` — same shard id, a copy of its data
    /// directory (so a strictly higher epoch), new sockets and ports — alongside the first,
    /// as a zombie-shard test needs. Children are named `<shard>-<tag>-{decide,gateway,execute}`.
    pub async fn start_shard_incarnation(
        &mut self,
        index: usize,
        tag: &str,
    ) -> Result<ShardPorts, UpError> {
        let base = self
            .ports
            .shards
            .get(index)
            .cloned()
            .ok_or_else(|| UpError::Config(format!("no shard {index}")))?;
        let mut pool = PortPool::default();
        let socket_dir = self.spec.run_dir.join(format!("{}-{tag}", base.id));
        // A copy, as a cloned volume would be: the running decide holds its own data dir's
        // lock (ADR-0103), and the copied epoch file puts the new epoch above the old one.
        let mut copy_name = base.data_dir.file_name().unwrap_or_default().to_owned();
        copy_name.push(format!("-{tag}"));
        let data_dir = base.data_dir.with_file_name(copy_name);
        copy_files(&base.data_dir, &data_dir)?;
        let plan = self.plan_shard(
            &mut pool,
            &base.id,
            &format!("{}-{tag}", base.id),
            &socket_dir,
            &data_dir,
            &base.provider,
        )?;
        pool.release(1);
        self.start_tier(
            1,
            vec![
                (plan.decide.0, Some(plan.decide.1)),
                (plan.gateway.0, Some(plan.gateway.1)),
            ],
        )
        .await?;
        pool.release(2);
        self.start_tier(2, vec![(plan.execute.0, Some(plan.execute.1))])
            .await?;
        Ok(plan.ports)
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

    // === Clients ===

    /// TLS client configuration presenting `role` (None in plaintext meshes).
    pub fn client_tls(&self, role: &str) -> Result<Option<Arc<rustls::ClientConfig>>, UpError> {
        self.pki.as_ref().map(|p| p.client_config(role)).transpose()
    }

    /// The PKI of a `--tls` mesh.
    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    /// A channel to `target` presenting `role` under TLS.
    pub async fn channel(&self, target: &str, role: &str) -> Result<MeshChannel, UpError> {
        let cfg = ChannelConfig {
            connect_timeout: Duration::from_secs(5),
            ..ChannelConfig::default()
        }
        .with_tls(self.client_tls(role)?);
        let stack = ClientStackConfig {
            metrics: None,
            retry: RetryPolicy::none(),
            attempt_timeout: Some(Duration::from_secs(10)),
        };
        bigfleet_mesh::dial(target, &cfg, &stack)
            .await
            .map_err(|e| UpError::Rpc(format!("dialling {target}: {e}")))
    }

    fn tcp_target(&self, hostport: &str) -> String {
        format!("{}://{hostport}", self.scheme())
    }

    /// The gateway URI of shard `i` (what operators dial).
    pub fn gateway_target(&self, i: usize) -> String {
        self.tcp_target(&self.ports.shards[i].gateway_grpc)
    }

    /// Every machine of shard `i`'s provider.
    pub async fn list_machines(&self, i: usize) -> Result<Vec<pb::Machine>, UpError> {
        let target = self.ports.shards[i].provider.clone();
        list_machines(&self.channel(&target, &format!("shard/shard-{i}")).await?).await
    }

    /// `ShardRead.InspectNeeds` on shard `i`'s public port (`cluster` empty: all).
    pub async fn inspect_needs(
        &self,
        i: usize,
        cluster: &str,
    ) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
        let ch = self.channel(&self.gateway_target(i), "readonly").await?;
        inspect_needs(ch, cluster).await
    }

    /// `ShardRead.InspectNeeds` on any gateway's public port (`host:port`), e.g. a second
    /// incarnation's.
    pub async fn inspect_needs_at(
        &self,
        gateway_grpc: &str,
        cluster: &str,
    ) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
        let ch = self
            .channel(&self.tcp_target(gateway_grpc), "readonly")
            .await?;
        inspect_needs(ch, cluster).await
    }

    /// `ShardRead.InspectNeeds` fleet-wide through svc-inspect.
    pub async fn fleet_inspect_needs(
        &self,
        cluster: &str,
    ) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
        let p = self
            .ports
            .inspect
            .as_ref()
            .ok_or_else(|| UpError::Config("no inspect in this mesh".into()))?;
        let ch = self.channel(&self.tcp_target(&p.grpc), "readonly").await?;
        inspect_needs(ch, cluster).await
    }

    /// `Inspect.FleetSummary` through svc-inspect.
    pub async fn fleet_summary(&self) -> Result<meshpb::FleetSummaryResponse, UpError> {
        let p = self
            .ports
            .inspect
            .as_ref()
            .ok_or_else(|| UpError::Config("no inspect in this mesh".into()))?;
        let ch = self.channel(&self.tcp_target(&p.grpc), "readonly").await?;
        let mut c =
            bigfleet_mesh::with_message_limits!(meshpb::inspect_client::InspectClient::new(ch));
        c.fleet_summary(meshpb::FleetSummaryRequest { max_shortfalls: 0 })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| UpError::Rpc(format!("FleetSummary: {e}")))
    }

    /// `ShardInfo.Describe` of shard `i`.
    pub async fn describe(&self, i: usize) -> Result<meshpb::ShardDescription, UpError> {
        let ch = self.channel(&self.gateway_target(i), "readonly").await?;
        let mut c = bigfleet_mesh::with_message_limits!(
            meshpb::shard_info_client::ShardInfoClient::new(ch)
        );
        c.describe(meshpb::DescribeShardRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| UpError::Rpc(format!("Describe: {e}")))
    }

    /// Shard `i`'s fake provider admin address (failure injection).
    pub fn provider_admin(&self, i: usize) -> Option<SocketAddr> {
        self.ports
            .providers
            .get(i)
            .and_then(|p| p.admin_http.as_deref())
            .and_then(|a| a.parse().ok())
    }

    /// `POST` a JSON body to shard `i`'s fake provider admin API; returns the response body.
    pub async fn provider_admin_post(
        &self,
        i: usize,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, UpError> {
        let addr = self
            .provider_admin(i)
            .ok_or_else(|| UpError::Config("no fake provider admin api".into()))?;
        let (code, text) = probe::http_request(addr, "POST", path, Some(&body.to_string()))
            .await
            .map_err(|e| UpError::Rpc(format!("admin {path}: {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        if code != 200 {
            return Err(UpError::Rpc(format!("admin {path}: {code} {text}")));
        }
        Ok(v)
    }

    /// `GET` from shard `i`'s fake provider admin API.
    pub async fn provider_admin_get(
        &self,
        i: usize,
        path: &str,
    ) -> Result<serde_json::Value, UpError> {
        let addr = self
            .provider_admin(i)
            .ok_or_else(|| UpError::Config("no fake provider admin api".into()))?;
        let (code, text) = probe::http_request(addr, "GET", path, None)
            .await
            .map_err(|e| UpError::Rpc(format!("admin {path}: {e}")))?;
        if code != 200 {
            return Err(UpError::Rpc(format!("admin {path}: {code} {text}")));
        }
        serde_json::from_str(&text).map_err(|e| UpError::Rpc(format!("admin {path}: {e}")))
    }

    /// `/metrics` of a child (by name: `shard-0-decide`, `shard-0-execute`, ...).
    pub async fn metrics(&self, name: &str) -> Result<Vec<Sample>, UpError> {
        let i = self.index(name)?;
        let addr = self.children[i]
            .ready
            .ok_or_else(|| UpError::Config(format!("{name} has no ops port")))?;
        let (code, body) = probe::http_get(addr, "/metrics", Duration::from_secs(3))
            .await
            .map_err(|e| UpError::Rpc(format!("{name} /metrics: {e}")))?;
        if code != 200 {
            return Err(UpError::Rpc(format!("{name} /metrics: {code}")));
        }
        Ok(probe::parse_metrics(&body))
    }
}

/// `dir/name` within the kernel's Unix socket path limit.
fn socket_path(dir: &Path, name: &str) -> Result<PathBuf, UpError> {
    bigfleet_mesh::ports::unix_socket_path(dir, name).map_err(|len| {
        UpError::Config(format!(
            "unix socket path {} is {len} bytes, longer than the kernel's limit of 107; \
             pass a shorter --data-dir (Unix sockets live under it)",
            dir.join(name).display()
        ))
    })
}

/// Every machine a provider lists.
pub async fn list_machines(ch: &MeshChannel) -> Result<Vec<pb::Machine>, UpError> {
    let mut c = bigfleet_mesh::with_message_limits!(
        pb::capacity_provider_client::CapacityProviderClient::new(ch.clone())
    );
    c.list(pb::ListFilter::default())
        .await
        .map(|r| r.into_inner().machines)
        .map_err(|e| UpError::Rpc(format!("provider List: {e}")))
}

/// Reads a whole `InspectNeeds` stream.
pub async fn inspect_needs(
    ch: MeshChannel,
    cluster: &str,
) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
    let mut c =
        bigfleet_mesh::with_message_limits!(pb::shard_read_client::ShardReadClient::new(ch));
    let mut stream = c
        .inspect_needs(pb::InspectNeedsRequest {
            cluster_id: cluster.to_owned(),
            limit: 0,
        })
        .await
        .map_err(|e| UpError::Rpc(format!("InspectNeeds: {e}")))?
        .into_inner();
    let mut header = pb::InspectNeedsHeader::default();
    let mut needs = Vec::new();
    while let Some(frame) = stream
        .message()
        .await
        .map_err(|e| UpError::Rpc(format!("InspectNeeds: {e}")))?
    {
        match frame.frame {
            Some(pb::inspect_needs_response::Frame::Header(h)) => header = h,
            Some(pb::inspect_needs_response::Frame::Need(n)) => needs.push(n),
            None => {}
        }
    }
    Ok((header, needs))
}

/// Machines per state name (`CONFIGURED`, `IDLE`, ...), every state present.
pub fn count_by_state(machines: &[pb::Machine]) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = [
        pb::MachineState::Speculative,
        pb::MachineState::Creating,
        pb::MachineState::Idle,
        pb::MachineState::Configuring,
        pb::MachineState::Configured,
        pb::MachineState::Draining,
        pb::MachineState::Deleting,
        pb::MachineState::Failed,
    ]
    .into_iter()
    .map(|s| (state_name(s as i32), 0))
    .collect();
    for machine in machines {
        *m.entry(state_name(machine.state)).or_default() += 1;
    }
    m
}

/// `MACHINE_STATE_CONFIGURED` ⇒ `CONFIGURED`.
pub fn state_name(state: i32) -> String {
    pb::MachineState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("MACHINE_STATE_")
                .to_owned()
        })
        .unwrap_or_else(|_| format!("STATE_{state}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_state() {
        let m = |id: &str, st: pb::MachineState| pb::Machine {
            id: id.into(),
            state: st as i32,
            ..Default::default()
        };
        let c = count_by_state(&[
            m("a", pb::MachineState::Configured),
            m("b", pb::MachineState::Configured),
            m("c", pb::MachineState::Idle),
        ]);
        assert_eq!(c["CONFIGURED"], 2);
        assert_eq!(c["IDLE"], 1);
        assert_eq!(c["FAILED"], 0);
        assert_eq!(c.len(), 8);
    }

    #[test]
    fn ports_serialize_with_grpc_keys() {
        let p = Ports {
            run_dir: "/r".into(),
            tls: false,
            coordinator: Some(CoordinatorPorts {
                grpc: "127.0.0.1:1".into(),
                raft_grpc: "127.0.0.1:2".into(),
                http: "127.0.0.1:3".into(),
            }),
            coordinators: vec![],
            shards: vec![],
            inspect: None,
            provider: ProviderPorts {
                grpc: Some("127.0.0.1:4".into()),
                unix: None,
                target: "http://127.0.0.1:4".into(),
                admin_http: None,
                metrics_http: None,
            },
            providers: vec![],
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["coordinator"]["grpc"], "127.0.0.1:1");
        assert_eq!(v["provider"]["grpc"], "127.0.0.1:4");
        assert!(v.get("inspect").is_none());
        assert!(
            v.get("coordinators").is_none(),
            "only with several replicas"
        );
    }

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
}
