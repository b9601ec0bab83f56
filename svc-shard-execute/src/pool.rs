//! The Work stream: pull work from decide with credits, run each item on its
//! own task, report Done and free the slot, and re-open the stream with
//! backoff when decide goes away.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_mesh::{Backoff, BackoffPolicy, MeshChannel};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::mesh::v1::worker_message::{Credit, Hello, Msg};
use bigfleet_telemetry::Readiness;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::flows::Executor;
use crate::links::{DecideLink, GatewayLink, ProviderLink};

/// How a worker pool runs its stream.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// Unique among the shard's live workers (logs, decide's records).
    pub worker_id: String,
    /// Checked by decide against its own; empty skips the check.
    pub shard_id: String,
    /// Actions in flight at most (credits granted).
    pub concurrency: u32,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// On shutdown, how long running actions may take to finish and report.
    pub drain_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            worker_id: "execute".to_owned(),
            shard_id: String::new(),
            concurrency: 64,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

fn msg(m: Msg) -> mesh::WorkerMessage {
    mesh::WorkerMessage { msg: Some(m) }
}

/// How one stream ended.
enum StreamEnd {
    Shutdown,
    /// Opened and later ended by decide or the transport.
    Ended,
    OpenFailed(tonic::Status),
}

/// Runs the pool until `shutdown` fires, then drains (see
/// [`PoolConfig::drain_timeout`]) and returns.
pub async fn run_pool<D, G, P>(
    client: WorkClient<MeshChannel>,
    executor: Arc<Executor<D, G, P>>,
    cfg: PoolConfig,
    shutdown: CancellationToken,
    readiness: Readiness,
) where
    D: DecideLink,
    G: GatewayLink,
    P: ProviderLink,
{
    let mut backoff = Backoff::new(BackoffPolicy::new(cfg.reconnect_min, cfg.reconnect_max));
    loop {
        match run_stream(client.clone(), &executor, &cfg, &shutdown, &readiness).await {
            StreamEnd::Shutdown => break,
            StreamEnd::Ended => {
                // The stream worked; decide probably restarted, so come back quickly.
                backoff.reset();
            }
            StreamEnd::OpenFailed(status) => tracing::warn!(
                code = ?status.code(),
                error = %status.message(),
                retry_within = ?backoff.policy().ceiling(backoff.retries()),
                "cannot open the work stream to decide"
            ),
        }
        readiness.set_not_ready("no work stream to decide");
        let pause = backoff.next_delay();
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        executor.metrics().stream_reconnects.inc();
    }
    readiness.set_not_ready("shutting down");
}

async fn drain_tasks(tasks: &mut JoinSet<()>) {
    while let Some(res) = tasks.join_next().await {
        if let Err(e) = res
            && e.is_panic()
        {
            tracing::error!(error = %e, "an action task panicked");
        }
    }
}

async fn run_stream<D, G, P>(
    mut client: WorkClient<MeshChannel>,
    executor: &Arc<Executor<D, G, P>>,
    cfg: &PoolConfig,
    shutdown: &CancellationToken,
    readiness: &Readiness,
) -> StreamEnd
where
    D: DecideLink,
    G: GatewayLink,
    P: ProviderLink,
{
    // Room for every slot's Done + Credit, so a finishing action never
    // waits on the channel.
    let (tx, rx) = mpsc::channel(cfg.concurrency as usize * 2 + 8);
    let hello = msg(Msg::Hello(Hello {
        worker_id: cfg.worker_id.clone(),
        shard_id: cfg.shard_id.clone(),
    }));
    let credit = msg(Msg::Credit(Credit { n: cfg.concurrency }));
    if tx.try_send(hello).is_err() || tx.try_send(credit).is_err() {
        unreachable!("a fresh channel has room for two frames");
    }
    let opened = tokio::select! {
        _ = shutdown.cancelled() => return StreamEnd::Shutdown,
        r = client.pull(ReceiverStream::new(rx)) => r,
    };
    let mut inbound = match opened {
        Ok(resp) => resp.into_inner(),
        Err(status) => return StreamEnd::OpenFailed(status),
    };
    readiness.set_ready();
    tracing::info!(worker_id = %cfg.worker_id, concurrency = cfg.concurrency, "work stream open");

    // Fires when this stream is gone: decide has abandoned its actions.
    let abandon = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let graceful = loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break true,
            Some(res) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = res && e.is_panic() {
                    tracing::error!(error = %e, "an action task panicked");
                }
            }
            next = inbound.message() => match next {
                Ok(Some(item)) => {
                    let ex = Arc::clone(executor);
                    let tx = tx.clone();
                    let cancel = abandon.clone();
                    tasks.spawn(async move {
                        let report = ex.execute(item, cancel).await;
                        // Nothing to do if the stream is gone: decide has
                        // already abandoned the action.
                        let _ = tx.send(msg(Msg::Done(report.done()))).await;
                        let _ = tx.send(msg(Msg::Credit(Credit { n: 1 }))).await;
                    });
                }
                Ok(None) => {
                    tracing::warn!(in_flight = tasks.len(), "decide ended the work stream");
                    break false;
                }
                Err(status) => {
                    tracing::warn!(
                        in_flight = tasks.len(),
                        code = ?status.code(),
                        error = %status.message(),
                        "work stream broke"
                    );
                    break false;
                }
            },
        }
    };

    if !graceful {
        abandon.cancel();
        drain_tasks(&mut tasks).await;
        return StreamEnd::Ended;
    }

    // Shutdown: take no new work, let running actions finish and report.
    tracing::info!(in_flight = tasks.len(), "draining the worker pool");
    if tokio::time::timeout(cfg.drain_timeout, drain_tasks(&mut tasks))
        .await
        .is_err()
    {
        tracing::warn!(
            in_flight = tasks.len(),
            "drain timeout passed; abandoning the remaining actions"
        );
        abandon.cancel();
        if tokio::time::timeout(Duration::from_secs(1), drain_tasks(&mut tasks))
            .await
            .is_err()
        {
            tasks.abort_all();
        }
    }
    // Closing our half tells decide we are done; waiting for its half to
    // close makes sure the last Done frames went out before the connection
    // is dropped.
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    StreamEnd::Shutdown
}
