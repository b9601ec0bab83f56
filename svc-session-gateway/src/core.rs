//! What every gateway service shares: the session registry, the link to decide, metrics and
//! settings.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::decide::DecideLink;
use crate::metrics::GatewayMetrics;
use crate::registry::Registry;
use crate::session::RollupRate;

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
            hello_timeout: Duration::from_secs(30),
        }
    }
}

/// Shared state behind every service of one gateway.
#[derive(Debug)]
pub struct Core {
    pub settings: GatewaySettings,
    pub registry: Registry,
    pub decide: DecideLink,
    pub metrics: GatewayMetrics,
    /// Cancelled when the gateway starts draining: long-lived streams end.
    pub shutdown: CancellationToken,
}

impl Core {
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
