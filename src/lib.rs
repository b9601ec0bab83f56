//! The `bigfleet` CLI: reads and administers a running fleet (and, later, runs the local
//! mesh with `bigfleet up`).
//!
//! * [`cli`] — the command line (clap); global flags have `BIGFLEET_*` variables.
//! * [`read`] — `shards`, `needs`, `shortfalls`, `domains`, `actions`, `machines`: through
//!   svc-inspect with `--inspect`, else straight from the coordinator and the shards.
//! * [`admin`] — `admin assign-domain | unassign-domain | remove-shard | snapshot save |
//!   snapshot restore`.
//! * [`output`] — one output layer: `-o table|wide|json|yaml|name`, `--no-headers`
//!   (ADR-0122); read commands also take `--watch`.
//! * [`cli`] also prints shell completions (`bigfleet completion bash|zsh|fish`) and
//!   stamps `--version` with the git commit.
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
use svc_inspect::coordinator::{CoordinatorClient, CoordinatorConfig, CoordinatorError};
use svc_inspect::fleet::{Fleet, FleetConfig};

pub use error::{CliError, RemoteError};

use crate::cli::{ActionsArgs, AdminCommand, Cli, Command, GlobalArgs, SnapshotCommand, WatchArgs};
use crate::output::{OutputFormat, OutputOptions, Render};

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

    /// One call through a fresh coordinator client bounded by the context's timeout; a
    /// failure becomes the error naming the coordinator's address.
    pub(crate) async fn on_coordinator<T>(
        &self,
        call: impl AsyncFnOnce(&CoordinatorClient) -> Result<T, CoordinatorError>,
    ) -> Result<T, CliError> {
        let client = self.coordinator_client(Some(self.timeout))?;
        call(&client)
            .await
            .map_err(|e| CliError::coordinator(e, Some(self.timeout)))
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

/// Runs one command: results go to `out`, warnings to `err`. `--watch` runs until the
/// process is killed; see [`run_until`].
pub async fn run(
    cli: Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    run_until(cli, out, err, std::future::pending()).await
}

/// A read command's answer: the document and the warnings for stderr.
type Answer<T> = Result<(T, Vec<String>), CliError>;

/// One read command: once, or with `--watch` until `stop` resolves.
///
/// Watching reprints the whole answer whenever its rendering changes (JSON documents
/// follow each other, YAML documents are separated by `---`, tables by a blank line), and
/// warnings only when they change. An error on the first poll ends the command; later ones
/// are reported on stderr and polling goes on, so a watch outlives a leader change.
async fn read_command<T, F, Fut>(
    opts: OutputOptions,
    watch: WatchArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    stop: impl Future<Output = ()>,
    mut fetch: F,
) -> Result<(), CliError>
where
    T: Render,
    F: FnMut() -> Fut,
    Fut: Future<Output = Answer<T>>,
{
    tokio::pin!(stop);
    // Polled once now so a Ctrl-C handler is in place before anything is printed: an
    // interrupt right after the first answer must still end the watch cleanly.
    if watch.watch && futures::FutureExt::now_or_never(&mut stop).is_some() {
        return Ok(());
    }
    let (doc, warnings) = fetch().await?;
    warn(err, &warnings)?;
    let mut last = output::render(&doc, opts)?;
    let first = if watch.watch && opts.format == OutputFormat::Yaml {
        format!("---\n{last}")
    } else {
        last.clone()
    };
    out.write_all(first.as_bytes())?;
    out.flush()?;
    if !watch.watch {
        return Ok(());
    }
    poll_until_stopped(watch.watch_interval, stop, err, warnings, fetch, |doc| {
        let text = output::render(&doc, opts)?;
        if text == last {
            return Ok(());
        }
        let sep = match opts.format {
            OutputFormat::Yaml => "---\n",
            OutputFormat::Table | OutputFormat::Wide => "\n",
            OutputFormat::Json | OutputFormat::Name => "",
        };
        out.write_all(sep.as_bytes())?;
        out.write_all(text.as_bytes())?;
        out.flush()?;
        last = text;
        Ok(())
    })
    .await
}

/// The polling half of every `--watch`: after each `interval` (the first answer is the
/// caller's, already shown) asks `fetch` again and hands the document to `show`. Warnings
/// are printed when they change, a failed poll once per distinct error; polling goes on
/// either way, so a watch outlives a leader change. Ends when `stop` resolves.
async fn poll_until_stopped<T, F, Fut>(
    interval: Duration,
    mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
    err: &mut (dyn Write + Send),
    mut last_warnings: Vec<String>,
    mut fetch: F,
    mut show: impl FnMut(T) -> Result<(), CliError>,
) -> Result<(), CliError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Answer<T>>,
{
    let mut last_error: Option<String> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            _ = tick.tick() => {}
        }
        let answer = tokio::select! {
            () = &mut stop => return Ok(()),
            a = fetch() => a,
        };
        match answer {
            Ok((doc, warnings)) => {
                last_error = None;
                if warnings != last_warnings {
                    warn(err, &warnings)?;
                    last_warnings = warnings;
                }
                show(doc)?;
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    writeln!(err, "warning: {msg} (still watching)")?;
                    last_error = Some(msg);
                }
            }
        }
    }
}

/// `bigfleet actions`: once like any read, or with `--watch` append-only — each poll asks
/// for actions finished since the newest one printed and prints only those not seen yet.
async fn actions_command(
    ctx: &Context,
    a: &ActionsArgs,
    opts: OutputOptions,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    stop: impl Future<Output = ()>,
) -> Result<(), CliError> {
    let since = a.since.map_or(0, |d| {
        svc_inspect::fleet::now_unix_nanos()
            .saturating_sub(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    });
    let mut req = bigfleet_proto::mesh::v1::RecentActionsRequest {
        cluster_id: a.cluster.clone().unwrap_or_default(),
        since_unix_nanos: since,
        limit: a.limit,
        after_seq: 0,
        shard_id: a.shard.clone().unwrap_or_default(),
    };
    if !a.watch.watch {
        let (doc, warnings) = read::actions(ctx, &req).await?;
        warn(err, &warnings)?;
        out.write_all(output::render(&doc, opts)?.as_bytes())?;
        return Ok(());
    }
    tokio::pin!(stop);
    if futures::FutureExt::now_or_never(&mut stop).is_some() {
        return Ok(());
    }
    let (doc, warnings) = read::actions(ctx, &req).await?;
    warn(err, &warnings)?;
    // Shared by the poll (which asks only from the newest printed on) and the printer.
    let seen = parking_lot::Mutex::new(read::SeenActions::default());
    read::print_actions(out, opts, seen.lock().admit(doc.0), true)?;
    let fetch = || {
        req.since_unix_nanos = req.since_unix_nanos.max(seen.lock().newest());
        let req = req.clone();
        async move { read::actions(ctx, &req).await }
    };
    poll_until_stopped(a.watch.watch_interval, stop, err, warnings, fetch, |doc| {
        read::print_actions(out, opts, seen.lock().admit(doc.0), false)
    })
    .await
}

/// Runs one command; a `--watch` read ends cleanly when `stop` resolves (the binary
/// passes Ctrl-C).
pub async fn run_until(
    cli: Cli,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    stop: impl Future<Output = ()>,
) -> Result<(), CliError> {
    let opts = cli.global.output_options();
    if let Command::Completion(a) = &cli.command {
        return Ok(cli::completion(a.shell, out)?);
    }
    // The offline restore needs no connection (nor TLS files).
    if let Command::Admin(AdminCommand::Snapshot(SnapshotCommand::Restore {
        data_dir,
        node_id,
        raft_advertise,
        file,
    })) = &cli.command
    {
        let outcome = admin::snapshot_restore(data_dir, node_id, raft_advertise, file).await?;
        return print_outcome(opts.format, out, &outcome);
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
        return output::document(out, opts.format, &output, || output.render());
    }
    // `lab` talks to the running `up` through its run directory, not over the network.
    if let Command::Lab(cmd) = &cli.command {
        let answer = lab::run(cmd, cli.global.timeout).await?;
        return Ok(out.write_all(answer.as_bytes())?);
    }
    let ctx = Context::from_args(&cli.global)?;
    let ctx = &ctx;
    match &cli.command {
        Command::Shards(a) => {
            read_command(opts, a.watch, out, err, stop, || async move {
                let o = read::shards(ctx).await?;
                let w = read::shard_warnings(&o);
                Ok((o, w))
            })
            .await?;
        }
        Command::Needs(a) => {
            read_command(opts, a.watch, out, err, stop, || async move {
                let o = read::needs(ctx, &a.cluster, a.unmet, a.limit).await?;
                let w = read::needs_warnings(&o);
                Ok((o, w))
            })
            .await?;
        }
        Command::Shortfalls(a) => {
            read_command(opts, a.watch, out, err, stop, || async move {
                Ok((read::shortfalls(ctx, a.limit).await?, Vec::new()))
            })
            .await?;
        }
        Command::Domains(a) => {
            read_command(opts, a.watch, out, err, stop, || async move {
                Ok((read::domains(ctx).await?, Vec::new()))
            })
            .await?;
        }
        Command::Transfers(a) => {
            let shard = a.shard.clone().unwrap_or_default();
            read_command(opts, a.watch, out, err, stop, || {
                let shard = shard.clone();
                async move { Ok((read::transfers(ctx, &shard).await?, Vec::new())) }
            })
            .await?;
        }
        Command::Actions(a) => actions_command(ctx, a, opts, out, err, stop).await?,
        Command::Machines(a) => {
            let filter = bigfleet_proto::mesh::v1::ListMachinesRequest {
                cluster_id: a.cluster.clone().unwrap_or_default(),
                states: a.state.iter().map(|s| *s as i32).collect(),
                limit: 0,
                after_machine_id: String::new(),
                shard_id: a.shard.clone().unwrap_or_default(),
            };
            let filter = &filter;
            let chunk = usize::try_from(a.chunk_size).unwrap_or(500);
            read_command(opts, a.watch, out, err, stop, || async move {
                read::machines(ctx, filter, a.limit, chunk).await
            })
            .await?;
        }
        Command::Pki(_) | Command::Lab(_) | Command::Completion(_) => {
            unreachable!("handled above")
        }
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
                    admin::assign_domain(ctx, key, value, shard).await?
                }
                AdminCommand::UnassignDomain { key, value } => {
                    admin::unassign_domain(ctx, key, value).await?
                }
                AdminCommand::RemoveShard { shard } => admin::remove_shard(ctx, shard).await?,
                AdminCommand::Snapshot(SnapshotCommand::Save { file }) => {
                    admin::snapshot_save(ctx, file).await?
                }
                AdminCommand::Snapshot(SnapshotCommand::Restore {
                    data_dir,
                    node_id,
                    raft_advertise,
                    file,
                }) => admin::snapshot_restore(data_dir, node_id, raft_advertise, file).await?,
            };
            print_outcome(opts.format, out, &outcome)?;
        }
    }
    Ok(())
}

fn print_outcome(
    format: OutputFormat,
    out: &mut dyn Write,
    outcome: &admin::AdminOutcome,
) -> Result<(), CliError> {
    output::document(out, format, outcome, || format!("{}\n", outcome.message))
}
