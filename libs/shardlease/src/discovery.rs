//! Following the shard leader's Work endpoint (`<shard>/work`) for remote execute workers.
//!
//! The key is written by the leader in the same transaction that wins its term, under the
//! term's lease, so it always names the current leader (or is absent between terms). The
//! watcher reads it once and then watches from the revision of that read, so no change
//! between the read and the watch is missed; when the watch breaks (etcd restart, dead
//! connection) it reads again.

use std::time::Duration;

use etcd_client::{EventType, KeyValue, WatchOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{EtcdShards, ShardKeys};
use crate::gate::retry_backoff;
use crate::{ShardLeaseError, bounded};

/// The current Work endpoint of one shard. `None` while no leader publishes one (no
/// leader, or a leader without `--work-listen`); etcd being unreachable does NOT clear
/// it — the last known endpoint is the best guess until etcd says otherwise.
#[derive(Debug)]
pub struct WorkEndpointWatcher {
    rx: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl WorkEndpointWatcher {
    pub(crate) fn spawn(etcd: EtcdShards, shard_id: &str) -> Self {
        let keys = etcd.config().keys(shard_id);
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(follow(etcd, keys, tx));
        Self { rx, task }
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.rx.clone()
    }

    pub fn current(&self) -> Option<String> {
        self.rx.borrow().clone()
    }

    /// Waits (up to `timeout`) until an endpoint is published and returns it.
    pub async fn wait_for_endpoint(&self, timeout: Duration) -> Option<String> {
        let mut rx = self.rx.clone();
        tokio::time::timeout(timeout, rx.wait_for(Option::is_some))
            .await
            .ok()?
            .ok()
            .and_then(|v| v.clone())
    }
}

impl Drop for WorkEndpointWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn endpoint_of(keys: &ShardKeys, kv: Option<&KeyValue>) -> Option<String> {
    let kv = kv?;
    match kv.value_str() {
        Ok(s) if !s.is_empty() => Some(s.to_owned()),
        Ok(_) => None,
        Err(_) => {
            tracing::warn!(key = %keys.work, "work endpoint is not utf-8; ignoring it");
            None
        }
    }
}

fn publish(tx: &watch::Sender<Option<String>>, keys: &ShardKeys, value: Option<String>) {
    tx.send_if_modified(|cur| {
        if *cur == value {
            return false;
        }
        tracing::info!(
            shard_id = %keys.shard_id,
            endpoint = value.as_deref().unwrap_or("<none>"),
            "shard work endpoint changed"
        );
        *cur = value;
        true
    });
}

async fn follow(etcd: EtcdShards, keys: ShardKeys, tx: watch::Sender<Option<String>>) {
    let mut backoff = retry_backoff(&etcd);
    loop {
        match follow_once(&etcd, &keys, &tx).await {
            Ok(()) => {}
            Err(e) => {
                tracing::debug!(shard_id = %keys.shard_id, error = %e, "work endpoint watch broke")
            }
        }
        if tx.is_closed() {
            return;
        }
        backoff.sleep().await;
    }
}

/// One read + watch; returns when the watch ends.
async fn follow_once(
    etcd: &EtcdShards,
    keys: &ShardKeys,
    tx: &watch::Sender<Option<String>>,
) -> Result<(), ShardLeaseError> {
    let timeout = etcd.timing().request_timeout;
    let mut c = etcd.client();
    let resp = bounded(
        "get work endpoint",
        timeout,
        c.get(keys.work.as_str(), None),
    )
    .await?;
    let revision = resp.header().map_or(0, |h| h.revision());
    publish(tx, keys, endpoint_of(keys, resp.kvs().first()));
    let stream = bounded(
        "watch work endpoint",
        timeout,
        c.watch(
            keys.work.as_str(),
            Some(WatchOptions::new().with_start_revision(revision + 1)),
        ),
    )
    .await?;
    let (_requests, mut responses) = stream.split();
    while let Some(resp) = responses.message().await? {
        if resp.canceled() {
            return Ok(());
        }
        for ev in resp.events() {
            let value = match ev.event_type() {
                EventType::Put => endpoint_of(keys, ev.kv()),
                EventType::Delete => None,
            };
            publish(tx, keys, value);
        }
    }
    Ok(())
}
