//! The `bigfleet-inspect` command line (docs/flags.md), shared with `bigfleet svc inspect`.

use std::net::SocketAddr;
use std::time::Duration;

use bigfleet_mesh::ServiceFlags;

use crate::error::InspectError;

/// Flags of `bigfleet-inspect`; every flag also reads `BIGFLEET_<FLAG>`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "bigfleet-inspect",
    version,
    about = "The read-only fleet view: fleet-wide ShardRead and Inspect over gRPC, a JSON API and a web dashboard."
)]
pub struct Args {
    /// Coordinator address (`http://host:port`, `https://host:port`); any replica works,
    /// calls follow the leader hint.
    #[arg(long, env = "BIGFLEET_COORDINATOR_ADDR", value_name = "URI")]
    pub coordinator_addr: String,

    /// gRPC listen address (ShardRead, Inspect, health, reflection).
    #[arg(
        long,
        env = "BIGFLEET_LISTEN",
        default_value = ":7795",
        value_name = "ADDR"
    )]
    pub listen: String,

    /// HTTP listen address of the dashboard and the JSON API (plaintext HTTP). Loopback by
    /// default (reach it with `kubectl port-forward`); any other address needs
    /// --http-token-file (or --insecure-plaintext).
    #[arg(
        long,
        env = "BIGFLEET_HTTP_LISTEN",
        default_value = "127.0.0.1:8795",
        value_name = "ADDR"
    )]
    pub http_listen: String,

    /// File holding the bearer token every HTTP request must carry (`Authorization: Bearer
    /// <token>` or the `bigfleet_token` cookie); at least 16 characters.
    #[arg(long, env = "BIGFLEET_HTTP_TOKEN_FILE", value_name = "PATH")]
    pub http_token_file: Option<std::path::PathBuf>,

    /// HTTP requests per second across all callers (burst twice that); each page fans out to
    /// every shard.
    #[arg(long, env = "BIGFLEET_HTTP_RATE", default_value_t = 20.0)]
    pub http_rate: f64,

    /// HTTP requests in flight before new ones get 503.
    #[arg(long, env = "BIGFLEET_HTTP_MAX_IN_FLIGHT", default_value_t = 16)]
    pub http_max_in_flight: usize,

    /// How long a fleet answer is reused before the shards are asked again.
    #[arg(long, env = "BIGFLEET_CACHE_TTL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub cache_ttl: Duration,

    /// Bound on each call to a shard or to the coordinator; a slower one is reported as
    /// unreachable.
    #[arg(long, env = "BIGFLEET_SHARD_TIMEOUT", default_value = "3s", value_parser = humantime::parse_duration)]
    pub shard_timeout: Duration,

    /// HTTP address for /metrics, /healthz and /readyz; `0` disables.
    #[arg(
        long,
        env = "BIGFLEET_METRICS_ADDR",
        default_value = ":8796",
        value_name = "ADDR"
    )]
    pub metrics_addr: String,

    /// Between samples of the dashboard's history (fleet, per-shard and per-cluster
    /// figures); `0s` turns sampling off. Each sample reads the fleet overview, the cluster
    /// index (every shard's needs) and one RecentActions call per shard.
    #[arg(long, env = "BIGFLEET_SAMPLE_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub sample_interval: std::time::Duration,

    /// Samples kept per history ring (fleet, each shard, each cluster); the oldest is
    /// dropped first. 720 at 5s is one hour.
    #[arg(long, env = "BIGFLEET_HISTORY_SAMPLES", default_value_t = crate::history::DEFAULT_SAMPLES)]
    pub history_samples: usize,

    /// Clusters whose history is kept. When full, a new cluster replaces the tracked one
    /// seen longest ago if that one is gone from the latest sample, else it is not tracked.
    /// Memory is bounded by about 32 bytes x samples x this.
    #[arg(long, env = "BIGFLEET_HISTORY_MAX_CLUSTERS", default_value_t = crate::history::DEFAULT_MAX_CLUSTERS)]
    pub history_max_clusters: usize,

    /// Shards whose history is kept (same rule as --history-max-clusters).
    #[arg(long, env = "BIGFLEET_HISTORY_MAX_SHARDS", default_value_t = crate::history::DEFAULT_MAX_SHARDS)]
    pub history_max_shards: usize,

    /// Between in-place refreshes of live dashboard pages (by the page's own script, no
    /// reload); `0s` turns them off.
    #[arg(long, env = "BIGFLEET_PAGE_REFRESH", default_value = "5s", value_parser = humantime::parse_duration)]
    pub page_refresh: std::time::Duration,

    /// `--drain-timeout`, TLS and log flags, alike in every service.
    #[command(flatten)]
    pub service: ServiceFlags,
}

/// `:7795` ⇒ `[::]:7795` (both families, see `bigfleet_mesh::bind_tcp`); `host:port` is
/// resolved (first address).
pub fn parse_listen(addr: &str) -> Result<SocketAddr, InspectError> {
    bigfleet_mesh::parse_listen_addr(addr).map_err(|reason| InspectError::Listen {
        addr: addr.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The parsing is `bigfleet_mesh`'s (its forms are tested there); the wrapper adds the
    /// flag's value to the error.
    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen(":7795").unwrap(), "[::]:7795".parse().unwrap());
        assert!(
            matches!(parse_listen("nope"), Err(InspectError::Listen { addr, .. }) if addr == "nope")
        );
    }

    #[test]
    fn defaults_match_the_flag_contract() {
        let a = Args::try_parse_from(["bigfleet-inspect", "--coordinator-addr", "http://c:7790"])
            .unwrap();
        assert_eq!(a.listen, ":7795");
        assert_eq!(a.http_listen, "127.0.0.1:8795");
        assert!(a.http_token_file.is_none());
        assert_eq!(a.metrics_addr, ":8796");
        assert_eq!(a.cache_ttl, Duration::from_secs(2));
        assert_eq!(a.service.drain_timeout, Duration::from_secs(10));
        assert_eq!(a.sample_interval, Duration::from_secs(5));
        assert_eq!(
            (
                a.history_samples,
                a.history_max_clusters,
                a.history_max_shards
            ),
            (720, 256, 64)
        );
        assert_eq!(a.page_refresh, Duration::from_secs(5));
        assert!(
            Args::try_parse_from(["bigfleet-inspect"]).is_err(),
            "--coordinator-addr is required"
        );
    }
}
