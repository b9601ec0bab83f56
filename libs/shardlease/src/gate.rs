//! The leader lease: campaign for `<shard>/leader`, hold it with keep-alives, and tell the
//! shard — through [`LeaderGate`] — exactly when it may hand out work.
//!
//! A term is won by ONE transaction that requires the leader key to be absent, writes it
//! (and the Work endpoint) under a fresh lease and advances the epoch (see `epoch.rs`).
//! The term lasts while its [`LeaseClock`] holds a proof; the moment the proof runs out
//! the gate reports "not actuating" and the holder starts over: it revokes the old lease
//! (if etcd answers) and campaigns again like any standby, so it can only come back with
//! a new, higher epoch — which fences whatever it stamped in the lost term.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bigfleet_mesh::backoff::{Backoff, BackoffPolicy};
use etcd_client::{EventType, KeyValue, WatchOptions};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::LeaseClock;
use crate::config::{EtcdShards, ShardKeys};
use crate::epoch::{self, Claim, LeaderClaim};
use crate::{ShardLeaseError, bounded};

/// What to campaign for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Campaign {
    pub shard_id: String,
    /// Written as the leader key's value (diagnostics: who holds the shard).
    pub holder: String,
    /// Published under `<shard>/work` for remote execute workers while leading.
    pub work_endpoint: Option<String>,
    /// Every term's epoch is above this (a shard moving over from the epoch file passes
    /// its last file epoch).
    pub epoch_floor: u64,
}

impl Campaign {
    /// A campaign with a unique holder id, no Work endpoint and no floor.
    pub fn new(shard_id: impl Into<String>) -> Self {
        Self {
            shard_id: shard_id.into(),
            holder: default_holder_id(),
            work_endpoint: None,
            epoch_floor: 0,
        }
    }

    pub fn with_work_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.work_endpoint = Some(endpoint.into());
        self
    }

    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    pub fn with_epoch_floor(mut self, floor: u64) -> Self {
        self.epoch_floor = floor;
        self
    }
}

/// `<hostname>-<pid>-<random>`: unique even for two processes of one pod.
pub fn default_holder_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "decide".to_owned());
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &nonce[..8])
}

/// One leadership term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// The fencing epoch of this term (strictly above every earlier term's).
    pub epoch: u64,
    pub lease_id: i64,
    /// etcd revision of the winning transaction.
    pub revision: i64,
}

#[derive(Debug)]
struct Shared {
    term: watch::Sender<Option<Term>>,
    epoch: watch::Sender<Option<u64>>,
    actuating: watch::Sender<bool>,
}

impl Shared {
    fn begin(&self, term: Term) {
        // Term first, flag last: whoever wakes on the flag finds the term already there.
        self.term.send_replace(Some(term));
        self.epoch.send_replace(Some(term.epoch));
        self.actuating.send_replace(true);
    }

    fn end(&self) {
        self.actuating.send_replace(false);
        self.epoch.send_replace(None);
        self.term.send_replace(None);
    }
}

/// Whether this process may hand out work, and under which epoch.
///
/// The authority is [`LeaderGate::current`] (or a [`LeaderGate::terms`] receiver's
/// `borrow()`): `Some(term)` means "actuate, stamping `term.epoch`". [`LeaderGate::is_actuating`]
/// is the same fact as a bool, for waking up. Dropping the gate stops campaigning WITHOUT
/// releasing the lease (like a crash: a standby takes over when it expires);
/// [`LeaderGate::resign`] releases it at once.
#[derive(Debug)]
pub struct LeaderGate {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl LeaderGate {
    pub(crate) fn spawn(
        etcd: EtcdShards,
        campaign: Campaign,
        epoch: watch::Sender<Option<u64>>,
    ) -> Self {
        epoch.send_replace(None);
        let shared = Arc::new(Shared {
            term: watch::channel(None).0,
            epoch,
            actuating: watch::channel(false).0,
        });
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(etcd, campaign, shared.clone(), cancel.clone()));
        Self {
            shared,
            cancel,
            task: Some(task),
        }
    }

    /// Flips to `true` when a term begins and to `false` the moment it ends.
    pub fn is_actuating(&self) -> watch::Receiver<bool> {
        self.shared.actuating.subscribe()
    }

    /// The current term (`None`: standby, or between terms).
    pub fn terms(&self) -> watch::Receiver<Option<Term>> {
        self.shared.term.subscribe()
    }

    /// Just the current term's epoch (`None`: do not actuate) — the shape an actuation
    /// gate that knows nothing about etcd consumes.
    pub fn epochs(&self) -> watch::Receiver<Option<u64>> {
        self.shared.epoch.subscribe()
    }

    pub fn current(&self) -> Option<Term> {
        *self.shared.term.borrow()
    }

    /// Stops actuating, releases the lease (so a standby takes over at once) and stops
    /// campaigning.
    pub async fn resign(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "leader lease task failed");
        }
        self.shared.end();
    }
}

impl Drop for LeaderGate {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.shared.end();
    }
}

/// Aborts a helper task when its owner's future is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The retry delay of the background loops: 100 ms doubling, with jitter, to the
/// keep-alive interval — never longer, so a broken keep-alive stream is re-opened well
/// inside the lease's TTL.
pub(crate) fn retry_backoff(etcd: &EtcdShards) -> Backoff {
    Backoff::new(BackoffPolicy::new(
        Duration::from_millis(100),
        etcd.timing().keepalive_interval,
    ))
}

/// Why a term ended.
#[derive(Debug)]
enum HoldEnd {
    Cancelled,
    Lapsed(&'static str),
}

async fn run(etcd: EtcdShards, campaign: Campaign, shared: Arc<Shared>, cancel: CancellationToken) {
    let keys = etcd.config().keys(&campaign.shard_id);
    let mut stale_leases: Vec<i64> = Vec::new();
    loop {
        let won = tokio::select! {
            _ = cancel.cancelled() => None,
            won = acquire(&etcd, &keys, &campaign, &mut stale_leases) => Some(won),
        };
        let Some((term, clock, granted_ttl)) = won else {
            revoke_all(&etcd, &mut stale_leases).await;
            return;
        };
        tracing::info!(
            shard_id = %keys.shard_id,
            epoch = term.epoch,
            lease_id = term.lease_id,
            holder = %campaign.holder,
            "leader term won; actuating"
        );
        shared.begin(term);
        let end = hold(&etcd, term, clock, granted_ttl, &cancel).await;
        shared.end();
        stale_leases.push(term.lease_id);
        match end {
            HoldEnd::Cancelled => {
                tracing::info!(shard_id = %keys.shard_id, epoch = term.epoch, "resigning leadership");
                revoke_all(&etcd, &mut stale_leases).await;
                return;
            }
            HoldEnd::Lapsed(reason) => tracing::warn!(
                shard_id = %keys.shard_id,
                epoch = term.epoch,
                reason,
                "leader lease no longer provable; actuation paused until a new term"
            ),
        }
    }
}

/// Revokes leases this process no longer trusts; keeps the ones etcd did not confirm.
async fn revoke_all(etcd: &EtcdShards, leases: &mut Vec<i64>) {
    let timeout = etcd.timing().request_timeout;
    let mut kept = Vec::new();
    for lease in leases.drain(..) {
        let mut c = etcd.client();
        match bounded("lease revoke", timeout, c.lease_revoke(lease)).await {
            Ok(_) => {}
            // Already expired: nothing left to release.
            Err(ShardLeaseError::Etcd(etcd_client::Error::GRpcStatus(s)))
                if s.code() == tonic::Code::NotFound => {}
            Err(e) => {
                tracing::debug!(lease_id = lease, error = %e, "lease revoke failed; will retry");
                kept.push(lease);
            }
        }
    }
    *leases = kept;
}

/// Campaigns until a term is won.
async fn acquire(
    etcd: &EtcdShards,
    keys: &ShardKeys,
    campaign: &Campaign,
    stale_leases: &mut Vec<i64>,
) -> (Term, LeaseClock, i64) {
    let timing = *etcd.timing();
    let mut backoff = retry_backoff(etcd);
    loop {
        // Our own earlier lease may still hold the key; releasing it beats waiting it out.
        revoke_all(etcd, stale_leases).await;
        let mut c = etcd.client();
        match bounded(
            "get leader",
            timing.request_timeout,
            c.get(keys.leader.as_str(), None),
        )
        .await
        {
            Err(e) => {
                tracing::debug!(shard_id = %keys.shard_id, error = %e, "cannot read the leader key");
                backoff.sleep().await;
                continue;
            }
            Ok(resp) => {
                if let Some(kv) = resp.kvs().first() {
                    if stale_leases.contains(&kv.lease()) {
                        backoff.sleep().await;
                    } else {
                        wait_for_vacancy(etcd, keys, kv).await;
                    }
                    continue;
                }
            }
        }

        let sent = Instant::now();
        let grant = match bounded(
            "lease grant",
            timing.request_timeout,
            c.lease_grant(timing.ttl_secs(), None),
        )
        .await
        {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(shard_id = %keys.shard_id, error = %e, "lease grant failed");
                backoff.sleep().await;
                continue;
            }
        };
        let lease = grant.id();
        let granted_ttl = grant.ttl();
        let mut clock = LeaseClock::new(timing.safety_margin);
        clock.renewed(sent, grant.ttl(), Instant::now());
        let claim = LeaderClaim {
            lease,
            holder: &campaign.holder,
            work_endpoint: campaign.work_endpoint.as_deref(),
        };
        match epoch::mint(
            &etcd.client(),
            keys,
            campaign.epoch_floor,
            timing.request_timeout,
            Some(&claim),
        )
        .await
        {
            Ok(Claim::Won(grant)) if clock.is_valid(Instant::now()) => {
                return (
                    Term {
                        epoch: grant.epoch,
                        lease_id: lease,
                        revision: grant.revision,
                    },
                    clock,
                    granted_ttl,
                );
            }
            Ok(Claim::Won(grant)) => {
                // Won, but etcd was so slow that the lease cannot be proven any more.
                tracing::warn!(
                    shard_id = %keys.shard_id,
                    epoch = grant.epoch,
                    "won the leader key too late to use it; campaigning again"
                );
                stale_leases.push(lease);
            }
            Ok(Claim::Held(kv)) => {
                stale_leases.push(lease);
                revoke_all(etcd, stale_leases).await;
                wait_for_vacancy(etcd, keys, &kv).await;
            }
            Err(e) => {
                stale_leases.push(lease);
                match e {
                    ShardLeaseError::CorruptEpoch { .. }
                    | ShardLeaseError::EpochOverflow { .. } => {
                        tracing::error!(shard_id = %keys.shard_id, error = %e, "cannot mint an epoch; not campaigning until it is repaired");
                    }
                    _ => {
                        tracing::debug!(shard_id = %keys.shard_id, error = %e, "leader claim failed")
                    }
                }
                backoff.sleep().await;
            }
        }
    }
}

/// Waits until the leader key `held` is deleted (its lease expired or was revoked), or at
/// most one TTL — the caller re-reads then, so a watch that hangs on a dead connection costs
/// at most one TTL.
async fn wait_for_vacancy(etcd: &EtcdShards, keys: &ShardKeys, held: &KeyValue) {
    let timing = *etcd.timing();
    let mut c = etcd.client();
    let from = held.mod_revision() + 1;
    let watch = async {
        let stream = bounded(
            "watch leader",
            timing.request_timeout,
            c.watch(
                keys.leader.as_str(),
                Some(WatchOptions::new().with_start_revision(from)),
            ),
        )
        .await?;
        // Keep the request half open: closing it ends the watch on some servers.
        let (_requests, mut responses) = stream.split();
        while let Some(resp) = responses.message().await? {
            if resp.canceled()
                || resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
            {
                return Ok(());
            }
        }
        Ok::<(), ShardLeaseError>(())
    };
    match tokio::time::timeout(timing.ttl, watch).await {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(e)) => {
            tracing::debug!(shard_id = %keys.shard_id, error = %e, "leader watch failed");
            tokio::time::sleep(timing.keepalive_interval.min(Duration::from_millis(500))).await;
        }
    }
}

/// A keep-alive answer: sent at `sent`, etcd said `ttl` seconds remain.
#[derive(Debug, Clone, Copy)]
struct Proof {
    sent: Instant,
    ttl: i64,
}

/// Holds a won term until its proof runs out or the gate is cancelled.
async fn hold(
    etcd: &EtcdShards,
    term: Term,
    mut clock: LeaseClock,
    granted_ttl: i64,
    cancel: &CancellationToken,
) -> HoldEnd {
    let (tx, mut proofs) = mpsc::channel(64);
    let _keepalive = AbortOnDrop(tokio::spawn(keep_alive(
        etcd.clone(),
        term.lease_id,
        granted_ttl,
        tx,
    )));
    loop {
        let Some(deadline) = clock.valid_until() else {
            return HoldEnd::Lapsed("lease proof lapsed");
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return HoldEnd::Cancelled,
            // The deadline is checked before any answer that may be waiting: once it has
            // passed, the term is over whatever etcd says next.
            _ = tokio::time::sleep_until(deadline.into()) => {
                if !clock.is_valid(Instant::now()) {
                    return HoldEnd::Lapsed("no keep-alive answered within the ttl minus the safety margin");
                }
            }
            proof = proofs.recv() => match proof {
                Some(p) => {
                    if !clock.renewed(p.sent, p.ttl, Instant::now()) {
                        return HoldEnd::Lapsed(if p.ttl <= 0 {
                            "etcd no longer knows the lease"
                        } else {
                            "keep-alive answered after the proof ran out"
                        });
                    }
                }
                None => return HoldEnd::Lapsed("keep-alive loop ended"),
            },
        }
    }
}

/// Sends a keep-alive every interval and reports each answer with the instant its request
/// was sent. Re-opens the stream when it breaks; never decides validity itself.
async fn keep_alive(etcd: EtcdShards, lease: i64, granted_ttl: i64, proofs: mpsc::Sender<Proof>) {
    let timing = *etcd.timing();
    let mut backoff = retry_backoff(&etcd);
    let mut first = true;
    loop {
        if !first {
            backoff.sleep().await;
        }
        first = false;
        let mut c = etcd.client();
        let sent = Instant::now();
        // Opening the stream sends one keep-alive and waits for its answer; an error
        // saying the lease is gone is final, anything else is retried.
        let (mut keeper, mut stream) = match bounded(
            "open keep-alive",
            timing.request_timeout,
            c.lease_keep_alive(lease),
        )
        .await
        {
            Ok(pair) => pair,
            Err(ShardLeaseError::Etcd(etcd_client::Error::LeaseKeepAliveError(msg)))
                if msg.contains("not found") =>
            {
                let _ = proofs.send(Proof { sent, ttl: 0 }).await;
                return;
            }
            Err(e) => {
                tracing::debug!(lease_id = lease, error = %e, "cannot open keep-alive stream");
                continue;
            }
        };
        if proofs
            .send(Proof {
                sent,
                ttl: granted_ttl,
            })
            .await
            .is_err()
        {
            return;
        }
        backoff.reset();
        let mut pending: VecDeque<Instant> = VecDeque::new();
        let start = tokio::time::Instant::now() + timing.keepalive_interval;
        let mut tick = tokio::time::interval_at(start, timing.keepalive_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let sent = Instant::now();
                    match tokio::time::timeout(timing.request_timeout, keeper.keep_alive()).await {
                        Ok(Ok(())) => pending.push_back(sent),
                        _ => break,
                    }
                }
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => {
                        // Answers come in request order on one stream.
                        let Some(sent) = pending.pop_front() else { continue };
                        if proofs.send(Proof { sent, ttl: resp.ttl() }).await.is_err() || resp.ttl() <= 0 {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => break,
                },
            }
        }
        tracing::debug!(lease_id = lease, "keep-alive stream broke; re-opening");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_are_unique() {
        let a = default_holder_id();
        let b = default_holder_id();
        assert_ne!(a, b);
        assert!(a.contains(&std::process::id().to_string()));
    }

    #[test]
    fn campaign_builder() {
        let c = Campaign::new("s")
            .with_holder("h")
            .with_work_endpoint("http://a:1")
            .with_epoch_floor(7);
        assert_eq!(
            (
                c.shard_id.as_str(),
                c.holder.as_str(),
                c.work_endpoint.as_deref(),
                c.epoch_floor
            ),
            ("s", "h", Some("http://a:1"), 7)
        );
    }
}
