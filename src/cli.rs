//! The command line of `bigfleet` (clap derive). Every connection flag also reads an
//! environment variable, so a shell can point the CLI at a fleet once.
//!
//! [`command`] is the full command: the derive plus the examples every subcommand shows
//! under `--help` (kept in one table, [`EXAMPLES`], and checked to parse by the tests).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

pub use crate::output::OutputFormat;

/// `bigfleet --version`: the package version and the git commit it was built from
/// (`unknown` when built outside a git checkout), with `dirty tree` when tracked files
/// differed from that commit.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("BIGFLEET_GIT_DESCRIBE"),
    ")"
);

/// `bigfleet`: read and administer a BigFleet mesh.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bigfleet",
    version = VERSION,
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

    /// svc-inspect gRPC address. When set, `shards`, `needs`, `shortfalls`, `actions` and
    /// `machines` read through it; otherwise the CLI asks the coordinator and the shards
    /// itself.
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

    /// Table and wide output: print data rows only (no header row, summary or notices).
    #[arg(long, global = true)]
    pub no_headers: bool,
}

impl GlobalArgs {
    pub fn output_options(&self) -> crate::output::OutputOptions {
        crate::output::OutputOptions {
            format: self.output,
            no_headers: self.no_headers,
        }
    }
}

/// `--watch` on read commands.
#[derive(Debug, Clone, Copy, Args)]
pub struct WatchArgs {
    /// Keep polling and print the result again whenever it changes (Ctrl-C ends).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// How often `--watch` polls.
    #[arg(long, default_value = "2s", value_parser = positive_duration, requires = "watch")]
    pub watch_interval: Duration,
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be more than zero".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Registered shards: reachability, machines by state, sessions, needs.
    Shards(ShardsArgs),
    /// One cluster's needs with the last cycle's verdicts.
    Needs(NeedsArgs),
    /// Unmet demand across the fleet, oldest first.
    Shortfalls(ShortfallsArgs),
    /// Topology domains pinned to shards.
    Domains(DomainsArgs),
    /// Cross-shard transfers in flight and recently finished, and each shard's domains
    /// and unacknowledged instructions (from the coordinator).
    Transfers(TransfersArgs),
    /// What BigFleet did: recent actions with their reason and outcome, newest first.
    Actions(ActionsArgs),
    /// Machines as their shards see them, in id order.
    Machines(MachinesArgs),
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
    /// `shard-0-gateway`, `provider-0`, `inspect`), or make a fake provider's Lists lie.
    /// Finds `up` through the CLI context.
    #[command(subcommand)]
    Lab(LabCommand),
    /// Run one service in this process (`bigfleet svc <service> [flags]`, ADR-0005); used
    /// by `bigfleet up`. Dispatched before the CLI parses its own flags (see `main`).
    #[command(hide = true)]
    Svc(SvcArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(CompletionArgs),
}

#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Clone, Args)]
pub struct ShardsArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
}

#[derive(Debug, Clone, Args)]
pub struct DomainsArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
}

#[derive(Debug, Clone, Args)]
pub struct TransfersArgs {
    /// Only transfers this shard gives or receives (and only its ownership line).
    #[arg(long)]
    pub shard: Option<String>,
    #[command(flatten)]
    pub watch: WatchArgs,
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
    #[command(flatten)]
    pub watch: WatchArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ShortfallsArgs {
    /// At most this many rows.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[command(flatten)]
    pub watch: WatchArgs,
}

// `--watch` is the shared `WatchArgs`, but here it appends, and its help says so.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("watch", |a| a.help(
    "Keep polling and print only actions that finished since (oldest first; Ctrl-C ends)"
)))]
pub struct ActionsArgs {
    /// Only actions of this cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only actions decided by this shard.
    #[arg(long)]
    pub shard: Option<String>,
    /// Only actions finished within this long (e.g. 15m, 1h); default: all recorded.
    #[arg(long, value_parser = positive_duration)]
    pub since: Option<Duration>,
    /// At most this many actions per answer (the shards keep a bounded history).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    #[command(flatten)]
    pub watch: WatchArgs,
}

#[derive(Debug, Clone, Args)]
pub struct MachinesArgs {
    /// Only machines bound to this cluster.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only machines of this shard.
    #[arg(long)]
    pub shard: Option<String>,
    /// Only machines in these states (comma-separated: speculative, creating, idle,
    /// configuring, configured, draining, deleting, failed).
    #[arg(long, value_delimiter = ',', value_parser = crate::read::parse_machine_state)]
    pub state: Vec<bigfleet_proto::v1alpha1::MachineState>,
    /// At most this many machines (0: all).
    #[arg(long, default_value_t = 500)]
    pub limit: usize,
    /// Machines asked for per call while paging.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub chunk_size: u32,
    #[command(flatten)]
    pub watch: WatchArgs,
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

/// Examples shown under `--help`, by subcommand path (`""` is `bigfleet` itself). Every
/// visible subcommand has an entry; every `bigfleet ...` line parses (both are tested).
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "",
        "  bigfleet up                          # run a local mesh; later commands find it
  bigfleet shards
  bigfleet needs --cluster c-0 --unmet -o wide
  bigfleet shortfalls -o yaml
  source <(bigfleet completion bash)",
    ),
    (
        "shards",
        "  bigfleet shards
  bigfleet shards -o wide
  bigfleet shards -o name --no-headers
  bigfleet shards --watch --watch-interval 5s
  bigfleet shards --inspect http://127.0.0.1:7795 -o json",
    ),
    (
        "needs",
        "  bigfleet needs --cluster c-0
  bigfleet needs --cluster c-0 --unmet --limit 20 -o wide
  bigfleet needs --cluster c-0 -o yaml
  bigfleet needs --cluster c-0 --unmet -w",
    ),
    (
        "shortfalls",
        "  bigfleet shortfalls
  bigfleet shortfalls --limit 10 -o json
  bigfleet shortfalls --no-headers
  bigfleet shortfalls --watch",
    ),
    (
        "domains",
        "  bigfleet domains
  bigfleet domains -o name
  bigfleet domains -o yaml --watch",
    ),
    (
        "transfers",
        "  bigfleet transfers
  bigfleet transfers -o wide
  bigfleet transfers --shard shard-1 -o json
  bigfleet transfers --watch",
    ),
    (
        "actions",
        "  bigfleet actions --since 1h
  bigfleet actions --cluster c-0 --since 15m -o wide
  bigfleet actions --shard shard-1 --limit 20 -o json
  bigfleet actions --cluster c-0 --watch          # new actions as they finish",
    ),
    (
        "machines",
        "  bigfleet machines
  bigfleet machines --state idle,configured -o wide
  bigfleet machines --cluster c-0 -o name
  bigfleet machines --shard shard-0 --limit 0 -o yaml",
    ),
    (
        "admin",
        "  bigfleet admin assign-domain --key topology.kubernetes.io/zone --value us-east-1a --shard shard-0
  bigfleet admin snapshot save coordinator.snap",
    ),
    (
        "admin assign-domain",
        "  bigfleet admin assign-domain --key topology.kubernetes.io/zone --value us-east-1a --shard shard-0
  bigfleet admin assign-domain --key rack --value r7 --shard shard-1 -o json",
    ),
    (
        "admin unassign-domain",
        "  bigfleet admin unassign-domain --key rack --value r7",
    ),
    (
        "admin remove-shard",
        "  bigfleet admin remove-shard --shard shard-3",
    ),
    (
        "admin snapshot",
        "  bigfleet admin snapshot save coordinator.snap
  bigfleet admin snapshot restore --data-dir /var/lib/bigfleet --node-id coord-0 --raft-advertise coord-0:7791 coordinator.snap",
    ),
    (
        "admin snapshot save",
        "  bigfleet admin snapshot save coordinator.snap
  bigfleet admin snapshot save coordinator.snap --tls-cert admin.crt --tls-key admin.key --tls-ca ca.crt",
    ),
    (
        "admin snapshot restore",
        "  # with coord-0 stopped; start it, then the other replicas with empty data directories
  bigfleet admin snapshot restore --data-dir /var/lib/bigfleet --node-id coord-0 --raft-advertise coord-0:7791 coordinator.snap",
    ),
    (
        "pki",
        "  bigfleet pki issue --ca-cert ca.crt --ca-key ca.key --identity bigfleet://readonly --out-dir ./certs
  bigfleet pki crl --ca-cert ca.crt --ca-key ca.key --revoke certs/old.crt --out ca.crl",
    ),
    (
        "pki install-secrets",
        "  # in the chart's hook Job (service-account credentials from the pod)
  bigfleet pki install-secrets --prefix bigfleet --coordinators 3 --shards 2
  bigfleet pki install-secrets --prefix bigfleet --coordinators 3 --shards 2 --dry-run -o json",
    ),
    (
        "pki issue",
        "  bigfleet pki issue --ca-cert ca.crt --ca-key ca.key --identity bigfleet://admin --out-dir ./certs
  bigfleet pki issue --ca-cert ca.crt --ca-key ca.key --identity bigfleet://shard/shard-0 --dns shard-0.bigfleet --validity 720h --out-dir ./certs",
    ),
    (
        "pki crl",
        "  bigfleet pki crl --ca-cert ca.crt --ca-key ca.key --out ca.crl
  bigfleet pki crl --ca-cert ca.crt --ca-key ca.key --revoke certs/admin.crt --out ca.crl",
    ),
    (
        "up",
        "  bigfleet up
  bigfleet up --shards 3 --clusters 20 --tls
  bigfleet up --duration 2m --chaos --chaos-seed 7",
    ),
    (
        "lab",
        "  bigfleet lab kill shard-0-decide
  bigfleet lab restart shard-0-decide
  bigfleet lab provider-lists empty",
    ),
    ("lab kill", "  bigfleet lab kill coordinator"),
    ("lab restart", "  bigfleet lab restart provider-0"),
    (
        "lab provider-lists",
        "  bigfleet lab provider-lists empty --lists 60
  bigfleet lab provider-lists truncated --keep 3 --shard 1
  bigfleet lab provider-lists honest",
    ),
    (
        "completion",
        "  source <(bigfleet completion bash)
  bigfleet completion zsh > \"${fpath[1]}/_bigfleet\"
  bigfleet completion fish > ~/.config/fish/completions/bigfleet.fish",
    ),
];

fn with_examples(mut cmd: clap::Command, path: &str) -> clap::Command {
    if let Some((_, text)) = EXAMPLES.iter().find(|(p, _)| *p == path) {
        cmd = cmd.after_help(format!("Examples:\n{text}"));
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    for name in names {
        let sub = if path.is_empty() {
            name.clone()
        } else {
            format!("{path} {name}")
        };
        cmd = cmd.mut_subcommand(&name, |c| with_examples(c, &sub));
    }
    cmd
}

/// The whole command line, examples included (for parsing, `--help` and completions).
pub fn command() -> clap::Command {
    with_examples(Cli::command(), "")
}

/// Parses `argv` (exits with usage, `--help` or `--version` text as clap does).
pub fn parse_from<I, T>(argv: I) -> Cli
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command().get_matches_from(argv);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Writes the completion script for `shell`.
pub fn completion(
    shell: clap_complete::Shell,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    // Generated into memory first: clap_complete panics on a failed write (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), "bigfleet", &mut script);
    out.write_all(&script)
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

    /// Every visible subcommand path, e.g. `admin snapshot save`.
    fn paths(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for c in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            if c.get_name() == "help" {
                continue;
            }
            let p = if prefix.is_empty() {
                c.get_name().to_owned()
            } else {
                format!("{prefix} {}", c.get_name())
            };
            paths(c, &p, out);
            out.push(p);
        }
    }

    #[test]
    fn every_subcommand_shows_examples_that_parse() {
        let mut all = vec![String::new()];
        paths(&Cli::command(), "", &mut all);
        assert!(all.len() > 15, "{all:?}");
        let mut cmd = command();
        cmd.build();
        for path in &all {
            let mut c = &cmd;
            for part in path.split_whitespace() {
                c = c.find_subcommand(part).unwrap();
            }
            let help = c
                .get_after_help()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(help.starts_with("Examples:\n"), "{path:?} has no examples");
            let lines: Vec<&str> = help
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("bigfleet "))
                .collect();
            assert!(!lines.is_empty(), "{path:?}: {help}");
            for line in lines {
                // Only the command: not a trailing comment, redirection or pipe.
                let argv = line
                    .split(['#', '>', '|'])
                    .next()
                    .unwrap()
                    .split_whitespace();
                if let Err(e) = command().try_get_matches_from(argv) {
                    panic!("{path:?}: example {line:?} does not parse: {e}");
                }
                assert!(
                    line.starts_with(&format!("bigfleet {path}").trim_end().to_owned())
                        || path.is_empty(),
                    "{path:?}: example {line:?} is about another command"
                );
            }
        }
        let stale: Vec<_> = EXAMPLES
            .iter()
            .filter(|(p, _)| !all.iter().any(|a| a == p))
            .collect();
        assert!(stale.is_empty(), "examples for no command: {stale:?}");
    }

    #[test]
    fn version_names_the_commit() {
        let v = command().render_version();
        let git = v
            .split("(git ")
            .nth(1)
            .and_then(|r| r.split([',', ')']).next())
            .unwrap();
        assert!(
            git == "unknown"
                || ((7..=40).contains(&git.len()) && git.bytes().all(|b| b.is_ascii_hexdigit())),
            "{v}"
        );
    }

    #[test]
    fn watch_flags_parse_on_reads_only() {
        let cli =
            Cli::try_parse_from(["bigfleet", "shards", "-w", "--watch-interval", "5s"]).unwrap();
        match cli.command {
            Command::Shards(a) => {
                assert!(a.watch.watch);
                assert_eq!(a.watch.watch_interval, Duration::from_secs(5));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            &["bigfleet", "domains", "--watch-interval", "5s"][..],
            &["bigfleet", "domains", "-w", "--watch-interval", "0s"],
            &[
                "bigfleet",
                "admin",
                "remove-shard",
                "--shard",
                "s",
                "--watch",
            ],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
        let cli =
            Cli::try_parse_from(["bigfleet", "domains", "-o", "yaml", "--no-headers"]).unwrap();
        assert_eq!(cli.global.output, OutputFormat::Yaml);
        assert!(cli.global.no_headers);
    }

    #[test]
    fn actions_watch_help_says_it_appends() {
        let help = |sub: &str| {
            let cmd = command();
            let arg = cmd
                .find_subcommand(sub)
                .unwrap()
                .get_arguments()
                .find(|a| a.get_id() == "watch")
                .unwrap()
                .clone();
            arg.get_help().unwrap().to_string()
        };
        assert!(
            help("actions").contains("only actions that finished since"),
            "{}",
            help("actions")
        );
        assert!(
            help("shards").contains("print the result again whenever it changes"),
            "{}",
            help("shards")
        );
    }

    #[test]
    fn actions_and_machines_flags_parse() {
        let cli = Cli::try_parse_from([
            "bigfleet",
            "actions",
            "--cluster",
            "c",
            "--since",
            "1h",
            "--limit",
            "5",
            "-w",
        ])
        .unwrap();
        match cli.command {
            Command::Actions(a) => {
                assert_eq!(a.cluster.as_deref(), Some("c"));
                assert_eq!(a.since, Some(Duration::from_secs(3600)));
                assert_eq!(a.limit, 5);
                assert!(a.watch.watch);
            }
            other => panic!("{other:?}"),
        }
        let cli =
            Cli::try_parse_from(["bigfleet", "machines", "--state", "idle,Configured"]).unwrap();
        match cli.command {
            Command::Machines(m) => {
                use bigfleet_proto::v1alpha1::MachineState;
                assert_eq!(m.state, vec![MachineState::Idle, MachineState::Configured]);
                assert_eq!((m.limit, m.chunk_size), (500, 500));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            &["bigfleet", "machines", "--state", "busy"][..],
            &["bigfleet", "machines", "--chunk-size", "0"],
            &["bigfleet", "actions", "--limit", "0"],
            &["bigfleet", "actions", "--since", "0s"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
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
    /// Make a fake provider's next Lists lie or fail, as a provider that restarted empty,
    /// answers truncated or sends garbage would (decide holds the removals and moves
    /// nothing); `honest` drops the lies still queued.
    ProviderLists {
        /// How the Lists answer.
        #[arg(value_enum)]
        answer: ListAnswer,
        /// How many Lists answer so (decide lists the provider about once a cycle).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        lists: u32,
        /// Machines a `truncated` answer keeps.
        #[arg(long, default_value_t = 10)]
        keep: u32,
        /// Whose provider: `up --shards N` runs one per shard.
        #[arg(long, default_value_t = 0)]
        shard: usize,
    },
}

/// What `bigfleet lab provider-lists` makes the Lists answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListAnswer {
    /// UNAVAILABLE: the provider is down.
    Down,
    /// No machines: a provider that restarted with an empty store.
    Empty,
    /// Only the first --keep machines.
    Truncated,
    /// Every machine with a negative price: records that fail validation.
    Invalid,
    /// The truth again: drop the lies still queued.
    Honest,
}
