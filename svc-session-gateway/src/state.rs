//! What every gateway service shares: the session registry, the link to decide, metrics and
//! settings.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::decide::DecideLink;
use crate::metrics::GatewayMetrics;
use crate::registry::Registry;
use crate::session::RollupRate;

/// A stream that has not said Hello within this is closed: it holds a concurrency permit
/// and a connection slot while saying nothing.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// A Hello is a few hundred bytes; 64 KiB leaves room for any protocol growth.
pub const DEFAULT_MAX_HELLO_BYTES: usize = 64 * 1024;
/// Roll-ups of the largest scale rungs (60,000 needs) are a few MiB.
pub const DEFAULT_MAX_ROLLUP_BYTES: usize = 32 * 1024 * 1024;
/// Session opens per cluster: a reconnect loop gets a few quick tries, then one per second.
pub const DEFAULT_SESSION_OPEN_RATE: bigfleet_mesh::RateLimit = bigfleet_mesh::RateLimit {
    per_second: 1.0,
    burst: 10,
};

/// Gateway behaviour settings (the service-specific flags).
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// This shard's id; remote execute workers must present `bigfleet://shard/<id>/execute`.
    pub shard_id: String,
    /// Concurrent sessions beyond which new clusters are refused (RESOURCE_EXHAUSTED).
    pub max_sessions: usize,
    /// Per-cluster roll-up rate (burst is twice the rate, at least 1).
    pub rollup_rate: RollupRate,
    /// RequestBootstrap timeout when the caller sets none.
    pub bootstrap_timeout: Duration,
    /// Per-cluster outbound frames (distinct coalescing keys).
    pub outbox_capacity: usize,
    /// How long an operator has to send its Hello after opening the stream.
    pub hello_timeout: Duration,
    /// Largest first frame (the Hello) a session may send: it is decoded before anything
    /// is known about the caller, so it is kept small.
    pub max_hello_bytes: usize,
    /// Largest frame after the Hello (a roll-up).
    pub max_rollup_bytes: usize,
    /// Session opens per second per cluster identity (mTLS) or per source address
    /// (callers without an identity yet); `None`: unlimited.
    pub session_open_rate: Option<bigfleet_mesh::RateLimit>,
    /// Shape bounds and priority ceiling every roll-up is validated against (ADR-0104).
    pub rollup_limits: bigfleet_conv::RollupLimits,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            shard_id: "shard-0".into(),
            max_sessions: 10_000,
            rollup_rate: RollupRate {
                per_second: 2.0,
                burst: 4,
            },
            bootstrap_timeout: Duration::from_secs(30),
            outbox_capacity: 1024,
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            max_hello_bytes: DEFAULT_MAX_HELLO_BYTES,
            max_rollup_bytes: DEFAULT_MAX_ROLLUP_BYTES,
            session_open_rate: Some(DEFAULT_SESSION_OPEN_RATE),
            rollup_limits: bigfleet_conv::RollupLimits::default(),
        }
    }
}

/// Shared state behind every service of one gateway.
#[derive(Debug)]
pub struct GatewayState {
    pub settings: GatewaySettings,
    pub registry: Registry,
    pub decide: DecideLink,
    pub metrics: GatewayMetrics,
    /// Cancelled when the gateway starts draining: long-lived streams end.
    pub shutdown: CancellationToken,
}

impl GatewayState {
    pub fn new(
        settings: GatewaySettings,
        decide: DecideLink,
        metrics: GatewayMetrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            registry: Registry::new(settings.max_sessions, metrics.clone()),
            settings,
            decide,
            metrics,
            shutdown: CancellationToken::new(),
        })
    }
}
