//! The command line of `bigfleet` (clap derive). Every global flag also reads an environment
//! variable, so a shell can point the CLI at a fleet once.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `bigfleet`: read and administer a BigFleet mesh.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bigfleet",
    version,
    about = "Read and administer a BigFleet fleet.",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand accepts (before or after the subcommand name).
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Coordinator address (any replica; calls follow the leader hint). Default: the
    /// context `bigfleet up` wrote (see BIGFLEET_CONTEXT), else http://127.0.0.1:7790.
    #[arg(long, global = true, env = "BIGFLEET_COORDINATOR", value_name = "URI")]
    pub coordinator: Option<String>,

    /// svc-inspect gRPC address. When set, `shards`, `needs` and `shortfalls` read through
    /// it; otherwise the CLI asks the coordinator and the shards itself.
    #[arg(long, global = true, env = "BIGFLEET_INSPECT", value_name = "URI")]
    pub inspect: Option<String>,

    /// PEM client certificate (role readonly for reads, admin for `admin` commands).
    #[arg(
        long = "tls-cert",
        global = true,
        env = "BIGFLEET_TLS_CERT",
        value_name = "PATH"
    )]
    pub tls_cert: Option<PathBuf>,

    /// PEM key of --tls-cert.
    #[arg(
        long = "tls-key",
        global = true,
        env = "BIGFLEET_TLS_KEY",
        value_name = "PATH"
    )]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle the servers' certificates chain to.
    #[arg(
        long = "tls-ca",
        global = true,
        env = "BIGFLEET_TLS_CA",
        value_name = "PATH"
    )]
    pub tls_ca: Option<PathBuf>,

    /// PEM revocation lists the servers' certificates are checked against.
    #[arg(long, global = true, env = "BIGFLEET_TLS_CRL", value_name = "PATH")]
    pub tls_crl: Option<PathBuf>,

    /// Bound on each call (not on `admin snapshot save`).
    #[arg(long, global = true, env = "BIGFLEET_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// Output format.
    #[arg(short = 'o', long, global = true, env = "BIGFLEET_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    Table,
    /// One JSON document for tools.
    Json,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Registered shards: reachability, machines by state, sessions, needs.
    Shards,
    /// One cluster's needs with the last cycle's verdicts.
    Needs(NeedsArgs),
    /// Unmet demand across the fleet, oldest first.
    Shortfalls(ShortfallsArgs),
    /// Topology domains pinned to shards.
    Domains,
    /// Change the fleet (needs an admin certificate under mTLS).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Certificates: the chart's CA hook (`install-secrets`) and one-off leaves (`issue`).
    #[command(subcommand)]
    Pki(crate::pki::PkiCommand),
    /// Run the whole mesh locally: coordinator, shards, fake provider, inspect and
    /// simulated operators, each a separate child process.
    Up(crate::up::UpArgs),
    /// Break and mend the running `bigfleet up` by hand: kill or restart one of its
    /// children by name (e.g. `coordinator`, `shard-0-decide`, `shard-0-execute`,
    /// `shard-0-gateway`, `provider-0`, `inspect`). Finds `up` through the CLI context.
    #[command(subcommand)]
    Lab(LabCommand),
    /// Run one service in this process (`bigfleet svc <service> [flags]`, ADR-0005); used
    /// by `bigfleet up`. Dispatched before the CLI parses its own flags (see `main`).
    #[command(hide = true)]
    Svc(SvcArgs),
}

/// `bigfleet svc <service> [service flags]` (handled by [`crate::svc`]).
#[derive(Debug, Clone, Args)]
#[command(disable_help_flag = true)]
pub struct SvcArgs {
    /// The service and its own flags.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Args)]
pub struct NeedsArgs {
    /// The cluster whose needs to show.
    #[arg(long)]
    pub cluster: String,
    /// Only needs the last cycle left unmet.
    #[arg(long)]
    pub unmet: bool,
    /// At most this many rows (0: all).
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ShortfallsArgs {
    /// At most this many rows.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Pin a topology domain (label key=value) to a shard.
    AssignDomain {
        #[arg(long)]
        key: String,
        #[arg(long)]
        value: String,
        #[arg(long)]
        shard: String,
    },
    /// Unpin a topology domain (succeeds when it was not pinned).
    UnassignDomain {
        #[arg(long)]
        key: String,
        #[arg(long)]
        value: String,
    },
    /// Forget a shard and its cluster and domain bindings.
    RemoveShard {
        #[arg(long)]
        shard: String,
    },
    /// Back up or restore the coordinator's state.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Debug, Clone, Subcommand)]
pub enum SnapshotCommand {
    /// Download the leader's latest snapshot into FILE.
    Save { file: PathBuf },
    /// Offline: rebuild a STOPPED replica's data directory from FILE (or an export
    /// directory) as a single-voter cluster; start it first, then the others empty.
    Restore {
        #[arg(long)]
        data_dir: PathBuf,
        /// The replica's --id.
        #[arg(long)]
        node_id: String,
        /// The replica's Raft address (`host:port`).
        #[arg(long)]
        raft_advertise: String,
        file: PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_flags_work_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "bigfleet",
            "needs",
            "--cluster",
            "c1",
            "--unmet",
            "-o",
            "json",
            "--coordinator",
            "http://c:1",
            "--timeout",
            "2s",
        ])
        .unwrap();
        assert_eq!(cli.global.output, OutputFormat::Json);
        assert_eq!(cli.global.coordinator.as_deref(), Some("http://c:1"));
        assert_eq!(cli.global.timeout, Duration::from_secs(2));
        match cli.command {
            Command::Needs(n) => assert!(n.unmet && n.cluster == "c1" && n.limit == 0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn admin_commands_parse() {
        let cli = Cli::try_parse_from([
            "bigfleet",
            "admin",
            "snapshot",
            "restore",
            "--data-dir",
            "/d",
            "--node-id",
            "coord-0",
            "--raft-advertise",
            "h:7791",
            "/f",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Admin(AdminCommand::Snapshot(SnapshotCommand::Restore { ref node_id, .. })) if node_id == "coord-0"
        ));
        assert!(
            Cli::try_parse_from(["bigfleet", "admin", "assign-domain", "--key", "rack"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["bigfleet", "needs"]).is_err(),
            "--cluster is required"
        );
    }
}

/// `bigfleet lab ...`: requests to the running `bigfleet up`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum LabCommand {
    /// SIGKILL one child, as a crash would; `up` leaves it down (no automatic restart).
    Kill {
        /// The child's name, as in `up`'s logs directory.
        child: String,
    },
    /// Start one child again (stopping it first if it runs) and wait until it is ready.
    Restart { child: String },
}
