//! The command line of `bigfleet-session-gateway` (docs/flags.md is the contract).

use std::path::PathBuf;
use std::time::Duration;

use bigfleet_mesh::ServiceFlags;

/// Terminates cluster operators' `Shard/Session` streams for one shard.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "bigfleet-session-gateway", version, about)]
pub struct Args {
    /// This shard's id; remote execute workers must present `bigfleet://shard/<id>/execute`.
    #[arg(long, env = "BIGFLEET_SHARD_ID", default_value = "shard-0")]
    pub shard_id: String,

    /// Public gRPC address (Session, ShardRead, ShardInfo, and — with mTLS only — Relay for
    /// remote execute workers).
    #[arg(long, env = "BIGFLEET_LISTEN", default_value = ":7780")]
    pub listen: String,

    /// Directory of the shard's Unix sockets: gateway.sock (served) and decide.sock (dialled).
    #[arg(long, env = "BIGFLEET_SOCKET_DIR", default_value = "/run/bigfleet")]
    pub socket_dir: PathBuf,

    /// Also accept Unix-socket peers whose primary gid is this (containers of one pod that
    /// run as different uids but share a group); by default only this process's uid.
    #[arg(long, env = "BIGFLEET_SOCKET_PEER_GID", value_name = "GID")]
    pub socket_peer_gid: Option<u32>,

    /// Concurrent sessions cap; new clusters beyond it get RESOURCE_EXHAUSTED.
    #[arg(long, env = "BIGFLEET_MAX_SESSIONS", default_value_t = 10_000)]
    pub max_sessions: usize,

    /// Per-cluster roll-ups per second (burst twice that, at least 1); 0 disables the limit.
    #[arg(long, env = "BIGFLEET_ROLLUP_RATE", default_value_t = 2.0)]
    pub rollup_rate: f64,

    /// Requests in flight before new ones are shed with RESOURCE_EXHAUSTED.
    #[arg(long, env = "BIGFLEET_MAX_CONCURRENT_REQUESTS", default_value_t = 4096)]
    pub max_concurrent_requests: usize,

    /// RequestBootstrap timeout when the caller sets none.
    #[arg(long, env = "BIGFLEET_BOOTSTRAP_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub bootstrap_timeout: Duration,

    /// Per-cluster outbound frames (distinct coalescing keys) before new ones are dropped.
    #[arg(long, env = "BIGFLEET_OUTBOX_CAPACITY", default_value_t = 1024)]
    pub outbox_capacity: usize,

    /// How long a new stream may stay silent before its Hello; then it is closed.
    #[arg(long, env = "BIGFLEET_HELLO_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub hello_timeout: Duration,

    /// Largest frame after the Hello (a roll-up), in bytes; larger frames end the session
    /// with RESOURCE_EXHAUSTED before they are buffered.
    #[arg(long, env = "BIGFLEET_MAX_ROLLUP_BYTES", default_value_t = crate::state::DEFAULT_MAX_ROLLUP_BYTES)]
    pub max_rollup_bytes: usize,

    /// Session opens per second per cluster (per source address for callers without an
    /// identity; loopback plaintext callers are exempt); burst is ten times that, at least
    /// 1. 0 disables.
    #[arg(long, env = "BIGFLEET_SESSION_OPEN_RATE", default_value_t = 1.0)]
    pub session_open_rate: f64,

    /// Roll-up shape bounds and the priority ceiling (ADR-0104); decide takes the same.
    #[command(flatten)]
    pub rollup_limits: bigfleet_conv::RollupLimitArgs,

    /// HTTP address of /metrics, /healthz and /readyz; 0 disables.
    #[arg(long, env = "BIGFLEET_METRICS_ADDR", default_value = ":8781")]
    pub metrics_addr: String,

    /// `--drain-timeout`, TLS and log flags, alike in every service.
    #[command(flatten)]
    pub service: ServiceFlags,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_match_the_flag_contract() {
        let a = Args::try_parse_from(["gw"]).unwrap();
        assert_eq!(a.shard_id, "shard-0");
        assert_eq!(a.listen, ":7780");
        assert_eq!(a.socket_dir, PathBuf::from("/run/bigfleet"));
        assert_eq!(a.max_sessions, 10_000);
        assert_eq!(a.rollup_rate, 2.0);
        assert_eq!(a.max_concurrent_requests, 4096);
        assert_eq!(a.bootstrap_timeout, Duration::from_secs(30));
        assert_eq!(a.outbox_capacity, 1024);
        assert_eq!(a.metrics_addr, ":8781");
        assert_eq!(a.service.drain_timeout, Duration::from_secs(10));
        assert!(a.service.tls.resolve().unwrap().is_none());
        assert_eq!(
            a.rollup_limits.limits(),
            bigfleet_conv::RollupLimits::default()
        );
    }

    #[test]
    fn rollup_limit_flags_parse() {
        let a = Args::try_parse_from([
            "gw",
            "--max-needs-per-rollup",
            "10",
            "--max-requirements-per-need",
            "2",
            "--max-values-per-requirement",
            "3",
            "--max-spreads-per-need",
            "4",
            "--max-resource-entries",
            "5",
            "--max-string-bytes",
            "6",
            "--max-rollup-resource-dimensions",
            "7",
            "--max-priority",
            "-8",
        ])
        .unwrap();
        assert_eq!(
            a.rollup_limits.limits(),
            bigfleet_conv::RollupLimits {
                max_needs: 10,
                max_requirements: 2,
                max_values: 3,
                max_spreads: 4,
                max_resource_entries: 5,
                max_string_bytes: 6,
                max_dimensions: 7,
                max_priority: -8,
            }
        );
    }

    #[test]
    fn flags_parse() {
        let a = Args::try_parse_from([
            "gw",
            "--bootstrap-timeout",
            "500ms",
            "--max-sessions",
            "3",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--tls-ca",
            "ca",
        ])
        .unwrap();
        assert_eq!(a.bootstrap_timeout, Duration::from_millis(500));
        assert_eq!(a.max_sessions, 3);
        assert!(a.service.tls.resolve().unwrap().is_some());
    }
}
