//! Command-line flags (docs/flags.md, `bigfleet-coordinator`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bigfleet_identity::TlsFlags;
use bigfleet_telemetry::LogArgs;

/// `bigfleet-coordinator`: one replica of the fleet coordinator. Every replica of a
/// StatefulSet gets the same flags; the ordinal in `--id` decides who bootstraps.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "bigfleet-coordinator", version, about)]
pub struct Args {
    /// Replica id; a trailing `-<n>` is the StatefulSet ordinal (only ordinal 0 bootstraps
    /// when --join-addr is set).
    #[arg(long, env = "BIGFLEET_ID", default_value = "node-1")]
    pub id: String,

    /// Coordinator gRPC listen address.
    #[arg(long, env = "BIGFLEET_LISTEN", default_value = ":7790")]
    pub listen: String,

    /// Raft gRPC listen address (plaintext; replicas only).
    #[arg(long, env = "BIGFLEET_RAFT_BIND", default_value = ":7791")]
    pub raft_bind: String,

    /// Raft address peers dial (`host:port`); default: --raft-bind (an unspecified host
    /// becomes 127.0.0.1). Its host plus the --listen port is this replica's Coordinator
    /// address in leader hints.
    #[arg(long, env = "BIGFLEET_RAFT_ADVERTISE")]
    pub raft_advertise: Option<String>,

    /// Directory of the replica's Raft log, vote, state machine and snapshots.
    #[arg(long, env = "BIGFLEET_DATA_DIR", default_value = "./coord-data")]
    pub data_dir: PathBuf,

    /// Form a new single-voter cluster if this replica has no state. With --join-addr only
    /// ordinal 0 honours it.
    #[arg(long, env = "BIGFLEET_BOOTSTRAP", default_value_t = false)]
    pub bootstrap: bool,

    /// Any replica's Coordinator address (`host:port`; several comma-separated). Every
    /// replica reconciles its membership through it until it is a voter at its current
    /// address.
    #[arg(long, env = "BIGFLEET_JOIN_ADDR")]
    pub join_addr: Option<String>,

    /// Where the leader exports snapshots periodically (unset: no export).
    #[arg(long, env = "BIGFLEET_SNAPSHOT_EXPORT_DIR")]
    pub snapshot_export_dir: Option<PathBuf>,

    /// Export period (0 means the default, 5m).
    #[arg(long, env = "BIGFLEET_SNAPSHOT_EXPORT_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub snapshot_export_interval: Duration,

    /// HTTP /metrics, /healthz, /readyz; `0` disables.
    #[arg(long, env = "BIGFLEET_METRICS_ADDR", default_value = ":8790")]
    pub metrics_addr: String,

    /// Graceful-shutdown deadline after SIGTERM.
    #[arg(long, env = "BIGFLEET_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    #[command(flatten)]
    pub tls: TlsFlags,

    #[command(flatten)]
    pub log: LogArgs,
}

/// Default snapshot export period.
pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(300);

impl Args {
    /// Join targets from --join-addr.
    pub fn join_addrs(&self) -> Vec<String> {
        self.join_addr
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    pub fn export_interval(&self) -> Duration {
        if self.snapshot_export_interval.is_zero() {
            DEFAULT_EXPORT_INTERVAL
        } else {
            self.snapshot_export_interval
        }
    }
}

/// Parses a listen address; `:port` means every interface.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map_err(|e| format!("invalid listen address {s:?}: {e}"))
}

/// A dialable `host:port` for a bound address: unspecified hosts become loopback.
pub fn dialable(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        addr.ip()
    };
    SocketAddr::new(ip, addr.port()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_follow_the_flag_contract() {
        let a = Args::try_parse_from(["x"]).unwrap();
        assert_eq!(a.id, "node-1");
        assert_eq!(a.listen, ":7790");
        assert_eq!(a.raft_bind, ":7791");
        assert_eq!(a.metrics_addr, ":8790");
        assert!(!a.bootstrap);
        assert_eq!(a.export_interval(), DEFAULT_EXPORT_INTERVAL);
        assert!(a.join_addrs().is_empty());
    }

    #[test]
    fn join_addrs_split_and_listen_parses() {
        let a = Args::try_parse_from([
            "x",
            "--join-addr",
            "a:1, b:2,,",
            "--bootstrap",
            "--snapshot-export-interval",
            "0s",
        ])
        .unwrap();
        assert_eq!(a.join_addrs(), ["a:1", "b:2"]);
        assert!(a.bootstrap);
        assert_eq!(a.export_interval(), DEFAULT_EXPORT_INTERVAL);
        assert_eq!(parse_listen(":7790").unwrap().port(), 7790);
        assert!(parse_listen("127.0.0.1:1").unwrap().ip().is_loopback());
        assert!(parse_listen("nope").is_err());
        assert_eq!(dialable("0.0.0.0:5".parse().unwrap()), "127.0.0.1:5");
    }
}
