//! The command line of every child — coordinator replicas, fake providers, each shard's
//! decide, gateway and execute, inspect — and the tiers they start in.

use std::net::SocketAddr;
use std::path::Path;

use super::ports::{PortPool, socket_path};
use super::{
    ACTUATION_LOG, CoordinatorPorts, FENCE_FILE, FakeSeed, InspectPorts, Mesh, ProviderPorts,
    ProviderSpec, ShardPorts, UpError,
};
use crate::up::child::ChildSpec;

pub(super) fn mkdir(p: &Path) -> Result<(), UpError> {
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

impl Mesh {
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

    pub(super) async fn plan_and_start(&mut self) -> Result<(), UpError> {
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
                let providers = if self.spec.shared_provider {
                    1
                } else {
                    self.spec.shards
                };
                for i in 0..providers {
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
                if self.spec.shared_provider
                    && let Some(one) = targets.first().cloned()
                {
                    targets = vec![one; self.spec.shards];
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
}
