//! Following decide through etcd (`--etcd-endpoints`): the worker pool runs against the
//! Work endpoint the shard's current leader publishes, and moves when another decide
//! takes over.
//!
//! A move ends the current pool like a dropped stream: its actions are abandoned (the
//! old leader is dead or, having lost its lease, no longer acts on them; the new one
//! re-derives them) and the pool starts over against the new endpoint, Transition calls
//! included. An endpoint that disappears (no leader for a moment) does not stop a
//! running pool — its own reconnect loop copes with a dead decide — only a DIFFERENT
//! endpoint moves it.

use std::sync::Arc;

use bigfleet_identity::TlsContext;
use bigfleet_mesh::GrpcMetrics;
use bigfleet_telemetry::Readiness;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::flows::Executor;
use crate::links::{GatewayLink, GrpcDecide, ProviderLink};
use crate::pool::{PoolConfig, run_pool};
use crate::{TRANSITION_TIMEOUT, connect};

/// Runs the pool against whatever `endpoints` names until `shutdown` (then drains).
/// `make` builds the executor for one decide.
pub async fn follow_decide<G, P>(
    mut endpoints: watch::Receiver<Option<String>>,
    tls: Option<TlsContext>,
    client_metrics: GrpcMetrics,
    make: impl Fn(GrpcDecide) -> Arc<Executor<GrpcDecide, G, P>>,
    cfg: PoolConfig,
    shutdown: CancellationToken,
    readiness: Readiness,
) where
    G: GatewayLink,
    P: ProviderLink,
{
    loop {
        readiness.set_not_ready("no decide work endpoint published in etcd");
        let endpoint = tokio::select! {
            _ = shutdown.cancelled() => return,
            found = endpoints.wait_for(Option::is_some) => match found {
                Ok(e) => e.clone().unwrap_or_default(),
                // The watcher is gone: nothing will ever be published again.
                Err(_) => return,
            },
        };
        let channel = match connect::channel(&endpoint, tls.as_ref(), Some(&client_metrics)) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(endpoint = %endpoint, error = %e, "unusable decide work endpoint in etcd; waiting for another");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = endpoints.changed() => if r.is_err() { return },
                }
                continue;
            }
        };
        tracing::info!(endpoint = %endpoint, "following the shard leader's work endpoint");
        let decide = GrpcDecide::new(channel, TRANSITION_TIMEOUT);
        let client = decide.client();
        let executor = make(decide);
        let metrics = executor.metrics().clone();
        let pool = run_pool(
            client,
            executor,
            cfg.clone(),
            shutdown.child_token(),
            readiness.clone(),
        );
        tokio::pin!(pool);
        loop {
            tokio::select! {
                // Returns only after shutdown, drained.
                () = &mut pool => return,
                changed = endpoints.changed() => {
                    if changed.is_err() {
                        // No more news: stay with this decide until shutdown.
                        pool.await;
                        return;
                    }
                    let now = endpoints.borrow_and_update().clone();
                    if now.as_ref().is_some_and(|e| *e != endpoint) {
                        tracing::warn!(from = %endpoint, to = ?now, "shard leader moved; abandoning this stream and following");
                        metrics.stream_reconnects.inc();
                        // Dropping the pool aborts its actions and closes the stream.
                        break;
                    }
                }
            }
        }
    }
}
