//! The `bigfleet` CLI: reads and administers a running fleet (and, later, runs the local
//! mesh with `bigfleet up`).
//!
//! * [`cli`] — the command line (clap); global flags have `BIGFLEET_*` variables.
//! * [`read`] — `shards`, `needs`, `shortfalls`, `domains`: through svc-inspect with
//!   `--inspect`, else straight from the coordinator and the shards.
//! * [`admin`] — `admin assign-domain | unassign-domain | remove-shard | snapshot save |
//!   snapshot restore`.
//! * [`output`] — human tables and `-o json`.
//! * [`pki`] — `pki install-secrets` (the chart's CA hook Job, ADR-0110) and `pki issue`.
//!
//! Coordinator calls follow the leader hint of a follower once; refusals say which role the
//! call needs and unreachable servers are named ([`CliError`]).

pub mod admin;
pub mod cli;
pub mod context;
mod error;
pub mod lab;
pub mod output;
pub mod pki;
pub mod read;
pub mod svc;
pub mod up;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::{TlsContext, TlsFlags};
use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy};
use svc_inspect::coordinator::{CoordinatorClient, CoordinatorConfig};
use svc_inspect::fleet::{Fleet, FleetConfig};

pub use error::{CliError, RemoteError};

use crate::cli::{AdminCommand, Cli, Command, GlobalArgs, OutputFormat, SnapshotCommand};

/// Where and how the CLI connects.
#[derive(Debug, Clone)]
pub struct Context {
    pub coordinator: String,
    pub inspect: Option<String>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub timeout: Duration,
    pub output: OutputFormat,
}

/// Where the CLI connects when neither flag nor environment says.
pub const DEFAULT_COORDINATOR: &str = "http://127.0.0.1:7790";

impl Context {
    /// The connection settings: flags and environment first, then the context file
    /// `bigfleet up` wrote (only when no address was given at all, so a flag never mixes
    /// with a file's certificates), then the defaults.
    pub fn from_args(g: &GlobalArgs) -> Result<Self, CliError> {
        let file = if g.coordinator.is_none() && g.inspect.is_none() {
            match context::default_path(|k| std::env::var(k).ok()) {
                Some(path) => context::load(&path)?,
                None => None,
            }
        } else {
            None
        };
        let mut flags = TlsFlags {
            cert: g.tls_cert.clone(),
            key: g.tls_key.clone(),
            ca: g.tls_ca.clone(),
            crl: g.tls_crl.clone(),
            insecure_plaintext: false,
        };
        if flags.cert.is_none()
            && flags.key.is_none()
            && flags.ca.is_none()
            && let Some(t) = file.as_ref().and_then(|f| f.tls.as_ref())
        {
            flags.cert = Some(t.cert.clone());
            flags.key = Some(t.key.clone());
            flags.ca = Some(t.ca.clone());
        }
        let tls = match flags.resolve()? {
            None => None,
            Some(files) => Some(TlsContext::load(&files)?.client_config()?),
        };
        let coordinator = g
            .coordinator
            .clone()
            .or_else(|| file.as_ref().map(|f| f.coordinator.clone()))
            .unwrap_or_else(|| DEFAULT_COORDINATOR.to_owned());
        let inspect = g
            .inspect
            .clone()
            .or_else(|| file.as_ref().and_then(|f| f.inspect.clone()));
        Ok(Self {
            coordinator,
            inspect: inspect.filter(|a| !a.trim().is_empty()),
            tls,
            timeout: g.timeout,
            output: g.output,
        })
    }

    /// A leader-following coordinator client; `timeout` bounds each call (`None`: unbounded).
    pub fn coordinator_client(
        &self,
        timeout: Option<Duration>,
    ) -> Result<CoordinatorClient, CliError> {
        CoordinatorClient::new(CoordinatorConfig {
            addr: self.coordinator.clone(),
            tls: self.tls.clone(),
            timeout,
            // One attempt: a person is waiting, and the error names the address.
            retry: RetryPolicy::none(),
        })
        .map_err(|e| CliError::coordinator(e, timeout))
    }

    pub fn inspect_channel(&self, addr: &str) -> Result<MeshChannel, CliError> {
        let channel = ChannelConfig {
            connect_timeout: self.timeout,
            ..ChannelConfig::default()
        }
        .with_tls(self.tls.clone());
        let stack = ClientStackConfig {
            metrics: None,
            retry: RetryPolicy::none(),
            attempt_timeout: Some(self.timeout),
        };
        bigfleet_mesh::dial_lazy(addr, &channel, &stack).map_err(|e| CliError::Address {
            what: "inspect",
            addr: addr.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The in-process fan-out used when no `--inspect` is given (no caching: one command,
    /// one answer).
    pub fn fleet(&self) -> Result<Fleet, CliError> {
        Ok(Fleet::new(
            self.coordinator_client(Some(self.timeout))?,
            FleetConfig {
                shard_timeout: self.timeout,
                cache_ttl: Duration::ZERO,
                tls: self.tls.clone(),
            },
            None,
        ))
    }
}

fn warn(err: &mut dyn Write, warnings: &[String]) -> Result<(), CliError> {
    for w in warnings {
        writeln!(err, "warning: {w}")?;
    }
    Ok(())
}

/// Runs one command: results go to `out`, warnings to `err`.
pub async fn run(
    cli: Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    // The offline restore needs no connection (nor TLS files).
    if let Command::Admin(AdminCommand::Snapshot(SnapshotCommand::Restore {
        data_dir,
        node_id,
        raft_advertise,
        file,
    })) = &cli.command
    {
        let outcome = admin::snapshot_restore(data_dir, node_id, raft_advertise, file).await?;
        return print_outcome(cli.global.output, out, &outcome);
    }
    // Neither does `pki`: it talks to the Kubernetes API or only to files.
    if let Command::Pki(cmd) = &cli.command {
        let output = match cmd {
            pki::PkiCommand::InstallSecrets(a) => {
                pki::run_install_secrets(a, cli.global.timeout, |k| std::env::var(k).ok()).await?
            }
            pki::PkiCommand::Issue(a) => pki::run_issue(a)?,
            pki::PkiCommand::Crl(a) => pki::run_crl(a)?,
        };
        if let pki::PkiOutput::Installed(report) = &output {
            warn(err, &report.warnings)?;
        }
        return match cli.global.output {
            OutputFormat::Json => output::json(out, &output),
            OutputFormat::Table => Ok(out.write_all(output.render().as_bytes())?),
        };
    }
    // `lab` talks to the running `up` through its run directory, not over the network.
    if let Command::Lab(cmd) = &cli.command {
        let answer = lab::run(cmd, cli.global.timeout).await?;
        return Ok(out.write_all(answer.as_bytes())?);
    }
    let ctx = Context::from_args(&cli.global)?;
    let json = ctx.output == OutputFormat::Json;
    match &cli.command {
        Command::Shards => {
            let o = read::shards(&ctx).await?;
            warn(err, &read::shard_warnings(&o))?;
            if json {
                output::json(out, &o)?;
            } else {
                out.write_all(read::render_shards(&o).as_bytes())?;
            }
        }
        Command::Needs(a) => {
            let o = read::needs(&ctx, &a.cluster, a.unmet, a.limit).await?;
            warn(err, &read::needs_warnings(&o))?;
            if json {
                output::json(out, &o)?;
            } else {
                out.write_all(read::render_needs(&o).as_bytes())?;
            }
        }
        Command::Shortfalls(a) => {
            let rows = read::shortfalls(&ctx, a.limit).await?;
            if json {
                output::json(out, &rows)?;
            } else {
                out.write_all(read::render_shortfalls(&rows).as_bytes())?;
            }
        }
        Command::Domains => {
            let rows = read::domains(&ctx).await?;
            if json {
                output::json(out, &rows)?;
            } else {
                out.write_all(read::render_domains(&rows).as_bytes())?;
            }
        }
        Command::Pki(_) | Command::Lab(_) => unreachable!("handled above"),
        Command::Up(_) | Command::Svc(_) => {
            // Process-level commands: `main` runs them (`up::main`, `svc::main`) before
            // this function is reached.
            return Err(CliError::Output(std::io::Error::other(
                "`up` and `svc` run only from the bigfleet binary",
            )));
        }
        Command::Admin(cmd) => {
            let outcome = match cmd {
                AdminCommand::AssignDomain { key, value, shard } => {
                    admin::assign_domain(&ctx, key, value, shard).await?
                }
                AdminCommand::UnassignDomain { key, value } => {
                    admin::unassign_domain(&ctx, key, value).await?
                }
                AdminCommand::RemoveShard { shard } => admin::remove_shard(&ctx, shard).await?,
                AdminCommand::Snapshot(SnapshotCommand::Save { file }) => {
                    admin::snapshot_save(&ctx, file).await?
                }
                AdminCommand::Snapshot(SnapshotCommand::Restore {
                    data_dir,
                    node_id,
                    raft_advertise,
                    file,
                }) => admin::snapshot_restore(data_dir, node_id, raft_advertise, file).await?,
            };
            print_outcome(ctx.output, out, &outcome)?;
        }
    }
    Ok(())
}

fn print_outcome(
    format: OutputFormat,
    out: &mut dyn Write,
    outcome: &admin::AdminOutcome,
) -> Result<(), CliError> {
    match format {
        OutputFormat::Json => output::json(out, outcome),
        OutputFormat::Table => {
            writeln!(out, "{}", outcome.message)?;
            Ok(())
        }
    }
}
