//! Command-line flags (docs/flags.md, `bigfleet-coordinator`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bigfleet_mesh::ServiceFlags;

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

    /// How often the leader's rebalancer decides (docs/multi-shard.md); `0s` turns it off.
    #[arg(long, env = "BIGFLEET_REBALANCE_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub rebalance_interval: Duration,

    /// Hysteresis: a shortfall must have stayed unmet this many of its shard's cycles.
    #[arg(long, env = "BIGFLEET_REBALANCE_MIN_AGE_CYCLES", default_value_t = 3)]
    pub rebalance_min_age_cycles: i32,

    /// Hysteresis: and the leader must have seen it short this long.
    #[arg(long, env = "BIGFLEET_REBALANCE_MIN_PERSIST", default_value = "60s", value_parser = humantime::parse_duration)]
    pub rebalance_min_persist: Duration,

    /// Transfers in flight per (donor, recipient) pair.
    #[arg(
        long,
        env = "BIGFLEET_REBALANCE_MAX_IN_FLIGHT_PER_PAIR",
        default_value_t = 1
    )]
    pub rebalance_max_in_flight_per_pair: usize,

    /// Transfers started per --rebalance-window, fleet-wide (one that finished having moved
    /// nothing does not count).
    #[arg(long, env = "BIGFLEET_REBALANCE_MAX_PER_WINDOW", default_value_t = 4)]
    pub rebalance_max_per_window: usize,

    /// The rate-limit window.
    #[arg(long, env = "BIGFLEET_REBALANCE_WINDOW", default_value = "5m", value_parser = humantime::parse_duration)]
    pub rebalance_window: Duration,

    /// A type moved from shard A to B is not moved from B back to A for this long.
    #[arg(long, env = "BIGFLEET_REBALANCE_COOLDOWN", default_value = "10m", value_parser = humantime::parse_duration)]
    pub rebalance_cooldown: Duration,

    /// Shortfall priority from which another shard's busy machines may be drained for it
    /// (CrossShardDrain).
    #[arg(
        long,
        env = "BIGFLEET_REBALANCE_DRAIN_MIN_PRIORITY",
        default_value_t = 1_000_000
    )]
    pub rebalance_drain_min_priority: i32,

    /// Machines one transfer asks for at most.
    #[arg(long, env = "BIGFLEET_REBALANCE_MAX_MACHINES", default_value_t = 4)]
    pub rebalance_max_machines: u32,

    /// After a transfer delivered machines, the recipient's shortfall of that type is left
    /// alone this long (its next cycles still report it until it has used them).
    #[arg(long, env = "BIGFLEET_REBALANCE_SETTLE", default_value = "2m", value_parser = humantime::parse_duration)]
    pub rebalance_settle: Duration,

    /// Reports older than this are not used (a shard that stopped reporting is neither donor
    /// nor recipient).
    #[arg(long, env = "BIGFLEET_REBALANCE_REPORT_MAX_AGE", default_value = "2m", value_parser = humantime::parse_duration)]
    pub rebalance_report_max_age: Duration,

    /// `--drain-timeout`, TLS and log flags, alike in every service (ADR-0140).
    #[command(flatten)]
    pub service: ServiceFlags,
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

    /// The rebalancer's policy from the `--rebalance-*` flags.
    pub fn rebalance_policy(&self) -> crate::rebalance::Policy {
        crate::rebalance::Policy {
            min_age_cycles: self.rebalance_min_age_cycles,
            min_persist: self.rebalance_min_persist,
            max_in_flight_per_pair: self.rebalance_max_in_flight_per_pair.max(1),
            max_per_window: self.rebalance_max_per_window,
            window: self.rebalance_window,
            cooldown: self.rebalance_cooldown,
            drain_min_priority: self.rebalance_drain_min_priority,
            max_machines_per_transfer: self.rebalance_max_machines.max(1),
            settle: self.rebalance_settle,
        }
    }

    pub fn export_interval(&self) -> Duration {
        if self.snapshot_export_interval.is_zero() {
            DEFAULT_EXPORT_INTERVAL
        } else {
            self.snapshot_export_interval
        }
    }
}

/// Parses a listen address; `:port` means every interface of both families (`[::]`,
/// bound dual-stack by `bigfleet_mesh::bind_tcp`).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    bigfleet_mesh::parse_listen_addr(s).map_err(|e| format!("invalid listen address {s:?}: {e}"))
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
        assert_eq!(a.service.drain_timeout, Duration::from_secs(10));
        assert!(a.service.tls.resolve().unwrap().is_none());
        assert!(!a.bootstrap);
        assert_eq!(a.export_interval(), DEFAULT_EXPORT_INTERVAL);
        assert!(a.join_addrs().is_empty());
        assert_eq!(a.rebalance_interval, Duration::from_secs(15));
        assert_eq!(a.rebalance_policy(), crate::rebalance::Policy::default());
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
        assert!(parse_listen(":7790").unwrap().ip().is_unspecified());
        // The dual-stack wildcard is dialled over IPv4 loopback, which it also accepts.
        assert_eq!(dialable(parse_listen(":5").unwrap()), "127.0.0.1:5");
    }
}
