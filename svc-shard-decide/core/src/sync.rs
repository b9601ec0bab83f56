//! Provider sync: List the provider and merge the answer into the inventory.
//!
//! The sync room ([`SyncRoom`], level 3 in [`crate::locks`]) holds the incremental
//! cursor, the last full listing's order, the removal guard (ADR-0106) and the
//! worker transitions a listing may predate. A merge takes the inventory, then
//! the work room (what is in flight), then this room.

use crate::reconcile::{MergeReport, RemovalGuard, RemovalPolicy, merge};
use crate::shard::{Decide, ReconcileStats};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The sync room.
#[derive(Debug)]
pub(crate) struct SyncRoom {
    cursor: Vec<u8>,
    /// Inventory positions of the last full listing, in listing order.
    list_order: Vec<u32>,
    removal_guard: RemovalGuard,
    /// Worker transitions a provider listing may not reflect yet.
    pub(crate) local_changes: LocalChanges,
    /// When the last complete (cursor-less) List started.
    last_full: Option<Instant>,
    /// When the quarantine's holdings were last refreshed from the inventory.
    holdings_at: Option<Instant>,
}

/// How often the quarantine's holdings baseline is rebuilt from the inventory.
const HOLDINGS_REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

impl SyncRoom {
    pub(crate) fn new(removals: RemovalPolicy) -> Self {
        SyncRoom {
            cursor: Vec::new(),
            list_order: Vec::new(),
            removal_guard: RemovalGuard::new(removals),
            local_changes: LocalChanges::default(),
            last_full: None,
            holdings_at: None,
        }
    }
}

/// Worker transitions stamped in the order they were applied, so reconcile
/// can tell which ones a listing may predate.
///
/// The provider is listed before the merge takes the inventory lock, and a
/// worker can finish an action in between: its Done clears the in-flight
/// mark, so the in-flight check alone lets the merge write the listing's
/// older record over the transition — a Configured machine back to Idle (and
/// a second action for it), or a machine that moved clusters back to its old
/// binding, which the state-only fast path then never corrects.
#[derive(Debug, Default)]
pub(crate) struct LocalChanges {
    clock: u64,
    stamps: FxHashMap<String, u64>,
}

impl LocalChanges {
    /// Stamps a transition of `id`; call with the inventory write lock held.
    pub(crate) fn record(&mut self, id: &str) {
        self.clock += 1;
        self.stamps.insert(id.to_owned(), self.clock);
    }

    /// The fence of a listing that starts now: transitions stamped after it
    /// may be missing from that listing.
    pub(crate) fn fence(&self) -> u64 {
        self.clock
    }

    /// Whether `id` changed after a listing fenced at `fence` started.
    pub(crate) fn newer_than(&self, id: &str, fence: u64) -> bool {
        self.stamps.get(id).is_some_and(|&s| s > fence)
    }

    /// Forgets the transitions a listing fenced at `fence` already covers.
    pub(crate) fn settle(&mut self, fence: u64) {
        self.stamps.retain(|_, s| *s > fence);
    }
}

impl Decide {
    /// Lists the provider and merges the answer into the inventory.
    pub async fn reconcile(&self) -> Result<ReconcileStats, tonic::Status> {
        let inner = &self.inner;
        let incremental = inner.cfg.incremental_reconcile;
        let (since, fence) = {
            let sync = inner.sync.lock();
            // An incremental List cannot express removals: every full_list_interval a full
            // one (with its removal walk) takes its place.
            let full_due = sync
                .last_full
                .is_none_or(|t| t.elapsed() >= inner.cfg.full_list_interval);
            let since = if incremental && !full_due {
                sync.cursor.clone()
            } else {
                Vec::new()
            };
            (since, sync.local_changes.fence())
        };
        let t = Instant::now();
        let t0 = t;
        let started_at = self.now();
        let list = inner.source.list(since.clone()).await?;
        let list_time = t.elapsed();
        let t = Instant::now();
        // A listing without a cursor is complete, so removals are visible even
        // in incremental mode (cold start).
        let full = !incremental || since.is_empty();
        let this = self.clone();
        let report = tokio::task::spawn_blocking(move || {
            let inner = &this.inner;
            // Never 0, the mark of a machine not seen yet.
            let generation = (inner.generation.fetch_add(1, Ordering::AcqRel)
                % u64::from(u32::MAX - 1)) as u32
                + 1;
            let now = this.now();
            let mut inv = inner.inventory.blocking_write();
            let work = inner.work.lock();
            let mut sync = inner.sync.lock();
            let sync = &mut *sync;
            let mut scratch = Vec::new();
            // Incremental deltas are small and unordered: no hint for them.
            let order: &mut Vec<u32> = if full {
                &mut sync.list_order
            } else {
                &mut scratch
            };
            let changes = &sync.local_changes;
            let mut r = merge(
                &mut inv,
                &list.machines,
                full,
                generation,
                now,
                |id| work.ledger.is_in_flight(id) || changes.newer_than(id, fence),
                order,
                &mut sync.removal_guard,
            );
            sync.local_changes.settle(fence);
            drop(work);
            // Published before the lock is released, so no transition applied
            // after this merge can have its frame overtaken by an older one.
            for (cluster, frame) in std::mem::take(&mut r.notify) {
                this.publish_frame(&cluster, frame);
            }
            drop(inv);
            (r, list.revision)
        })
        .await
        .map_err(|e| tonic::Status::internal(format!("reconcile task: {e}")))?;
        let (r, revision) = report;
        let merge_time = t.elapsed();
        {
            let mut sync = inner.sync.lock();
            if incremental {
                sync.cursor = revision;
            }
            if full {
                sync.last_full = Some(t0);
            }
        }
        let stats = ReconcileStats {
            counts: r.counts,
            rejected: r.rejected.len(),
            incremental: !full,
            list_time,
            merge_time,
        };
        tracing::debug!(
            listed = stats.counts.listed,
            changed = stats.counts.updated + stats.counts.inserted + stats.counts.removed,
            list_ms = list_time.as_secs_f64() * 1e3,
            merge_ms = merge_time.as_secs_f64() * 1e3,
            "reconciled"
        );
        self.after_merge(r);
        inner.listed_at.store(started_at, Ordering::Release);
        self.refresh_quarantine_holdings().await;
        if !inner.ready.swap(true, Ordering::AcqRel) {
            inner.readiness.set_ready();
            tracing::info!(
                machines = stats.counts.listed,
                "first provider reconcile complete; ready"
            );
        }
        Ok(stats)
    }

    /// Gives the quarantine what each cluster's Configured machines provide: its
    /// baseline for clusters not heard from since the start, and its "big enough to
    /// matter" test (ADR-0105).
    async fn refresh_quarantine_holdings(&self) {
        if !self.inner.intake.lock().guard.enabled() {
            return;
        }
        // A walk over every cluster's Configured shapes: at 10,000 clusters not worth
        // repeating every cycle for a baseline that moves slowly.
        {
            let mut sync = self.inner.sync.lock();
            if sync
                .holdings_at
                .is_some_and(|t| t.elapsed() < HOLDINGS_REFRESH)
            {
                return;
            }
            sync.holdings_at = Some(Instant::now());
        }
        let holdings = crate::rails::holdings(&*self.inner.inventory.read().await);
        // The old map (10,000 clusters' worth) is freed after the intake lock is released.
        let old = self.inner.intake.lock().guard.refresh_holdings(holdings);
        drop(old);
    }

    fn after_merge(&self, r: MergeReport) {
        let inner = &self.inner;
        let held = r.held.as_ref().map_or(0, |(_, n)| *n);
        inner
            .removals_held
            .store(u64::try_from(held).unwrap_or(u64::MAX), Ordering::Release);
        inner
            .metrics
            .removals_held
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        if let Some((reason, n)) = &r.held {
            tracing::warn!(
                machines = n,
                reason = reason.label(),
                detail = ?reason,
                "provider List left machines out; removal held (they keep their last known state)"
            );
        }
        for reason in &r.rejected {
            inner
                .metrics
                .machines_rejected
                .with_label_values(&[reason])
                .inc();
        }
        let now = self.now();
        let mut prov = inner.provisioning.lock();
        for (cluster, fp) in &r.configured {
            if let Some(d) = prov.observe_configured(cluster, fp, now) {
                inner.metrics.provisioning_latency.observe(d.as_secs_f64());
            }
        }
    }
}
