//! The dashboard's time axis (ADR-0136): a sampler that reads the fleet every
//! `--sample-interval` and keeps bounded rings of fleet-wide, per-shard and per-cluster
//! figures, served as JSON under `/api/v1/history` and drawn as sparklines on the pages.
//!
//! Memory is bounded three ways: every ring holds at most `--history-samples` samples (the
//! oldest is dropped first), at most `--history-max-shards` shards and
//! `--history-max-clusters` clusters are tracked, and a series is only created for a key
//! seen in a sample. The tracking rule when a table is full: a newcomer takes the place of
//! the tracked key whose last sighting is the oldest, provided that key was absent from
//! the current sample; when every tracked key is still present, the newcomer is not
//! tracked (and counted as such). Incumbents that keep reporting are never displaced, so
//! a chart does not lose its past because other keys came and went.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::fleet::{ClusterIndex, Fleet, FleetOverview};

/// Default bounds (see the flags in `cli`).
pub const DEFAULT_SAMPLES: usize = 720;
pub const DEFAULT_MAX_CLUSTERS: usize = 256;
pub const DEFAULT_MAX_SHARDS: usize = 64;

/// A ring that never holds more than its capacity: pushing onto a full ring drops the
/// oldest item.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    cap: usize,
    items: VecDeque<T>,
}

impl<T> Ring<T> {
    /// `cap` zero is treated as one.
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Self {
            cap,
            items: VecDeque::with_capacity(cap.min(64)),
        }
    }

    pub fn push(&mut self, item: T) {
        if self.items.len() == self.cap {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.items.iter()
    }

    pub fn last(&self) -> Option<&T> {
        self.items.back()
    }
}

/// Fleet-wide figures at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetSample {
    pub at_unix_ms: i64,
    pub coordinator_reachable: bool,
    pub shards_total: u32,
    pub shards_reachable: u32,
    /// Machines on reachable shards, all states.
    pub machines: i64,
    pub idle: i64,
    pub configured: i64,
    pub failed: i64,
    pub sessions: i64,
    pub needs: i64,
    pub unmet_needs: i64,
    /// Shortfalls in the shards' latest reports to the coordinator.
    pub shortfalls: i64,
    /// Clusters with demand on a reachable shard; `None` when the index could not be read.
    pub clusters: Option<i64>,
    /// Actions the shards recorded since the previous sample; `None` on the first sample,
    /// when the set of answering shards changed, or when a shard's counter went backwards
    /// (a restart), because the difference would then count the wrong thing.
    pub actions: Option<i64>,
}

/// One shard's figures at one instant (zeros while unreachable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardSample {
    pub at_unix_ms: i64,
    pub reachable: bool,
    pub machines: i64,
    pub sessions: i64,
    pub needs: i64,
    pub unmet_needs: i64,
    pub cycle: i64,
}

/// One cluster's figures at one instant (zeros when it had no demand on a reachable shard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterSample {
    pub at_unix_ms: i64,
    pub needs: i64,
    pub unmet_needs: i64,
    pub max_age_cycles_unmet: i64,
}

/// The bounds of a [`History`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Samples per ring.
    pub samples: usize,
    pub max_shards: usize,
    pub max_clusters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            samples: DEFAULT_SAMPLES,
            max_shards: DEFAULT_MAX_SHARDS,
            max_clusters: DEFAULT_MAX_CLUSTERS,
        }
    }
}

#[derive(Debug)]
struct Tracked<T> {
    last_seen_ms: i64,
    ring: Ring<T>,
}

/// Keyed rings under a cap on the number of keys (the rule is in the module docs).
#[derive(Debug)]
struct Series<T> {
    max_keys: usize,
    samples: usize,
    map: BTreeMap<String, Tracked<T>>,
    /// Keys seen in the latest sample that are not tracked because the table is full.
    untracked: usize,
}

impl<T> Series<T> {
    fn new(max_keys: usize, samples: usize) -> Self {
        Self {
            max_keys,
            samples,
            map: BTreeMap::new(),
            untracked: 0,
        }
    }

    /// Records one round. `present` holds the keys seen this round in the caller's order of
    /// preference for a free slot; tracked keys missing from it get `absent(at)`.
    fn record(&mut self, at: i64, present: Vec<(String, T)>, absent: impl Fn(i64) -> T) {
        let mut newcomers = Vec::new();
        for (key, sample) in present {
            match self.map.get_mut(&key) {
                Some(t) => {
                    t.last_seen_ms = at;
                    t.ring.push(sample);
                }
                None => newcomers.push((key, sample)),
            }
        }
        self.untracked = 0;
        for (key, sample) in newcomers {
            if self.map.len() >= self.max_keys {
                let stalest = self
                    .map
                    .iter()
                    .filter(|(_, t)| t.last_seen_ms < at)
                    .min_by_key(|(k, t)| (t.last_seen_ms, *k))
                    .map(|(k, _)| k.clone());
                match stalest {
                    Some(k) => {
                        self.map.remove(&k);
                    }
                    None => {
                        self.untracked += 1;
                        continue;
                    }
                }
            }
            let mut ring = Ring::new(self.samples);
            ring.push(sample);
            self.map.insert(
                key,
                Tracked {
                    last_seen_ms: at,
                    ring,
                },
            );
        }
        for t in self.map.values_mut().filter(|t| t.last_seen_ms < at) {
            t.ring.push(absent(at));
        }
    }

    fn get(&self, key: &str) -> Option<&Ring<T>> {
        self.map.get(key).map(|t| &t.ring)
    }
}

#[derive(Debug)]
struct Inner {
    fleet: Ring<FleetSample>,
    shards: Series<ShardSample>,
    clusters: Series<ClusterSample>,
    /// `recorded` summed over the shards that answered, and which shards those were.
    last_actions: Option<(u64, Vec<String>)>,
}

/// What the sampler read in one round.
#[derive(Debug, Clone)]
pub struct Round<'a> {
    pub at_unix_ms: i64,
    pub overview: &'a FleetOverview,
    /// `None`: the cluster index could not be read this round.
    pub clusters: Option<&'a ClusterIndex>,
    /// Actions recorded since start, summed over the shards that answered, and their ids
    /// (sorted); `None` when RecentActions failed.
    pub actions_recorded: Option<(u64, Vec<String>)>,
}

/// The bounded history behind `/api/v1/history` and the sparklines.
#[derive(Debug)]
pub struct History {
    limits: Limits,
    interval: Duration,
    inner: Mutex<Inner>,
}

/// `GET /api/v1/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetHistory {
    /// Milliseconds between samples; 0 when sampling is off.
    pub interval_ms: u64,
    /// The most samples any ring keeps.
    pub capacity: usize,
    pub max_shards: usize,
    pub max_clusters: usize,
    /// Shards and clusters tracked now, and those seen in the latest sample but not tracked
    /// because their table is full.
    pub shards_tracked: usize,
    pub clusters_tracked: usize,
    pub shards_untracked: usize,
    pub clusters_untracked: usize,
    /// Oldest first.
    pub samples: Vec<FleetSample>,
}

/// `GET /api/v1/clusters/{id}/history` and `GET /api/v1/shards/{id}/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyHistory<T> {
    pub id: String,
    pub interval_ms: u64,
    pub capacity: usize,
    /// Oldest first.
    pub samples: Vec<T>,
}

impl History {
    pub fn new(limits: Limits, interval: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                fleet: Ring::new(limits.samples),
                shards: Series::new(limits.max_shards, limits.samples),
                clusters: Series::new(limits.max_clusters, limits.samples),
                last_actions: None,
            }),
            limits,
            interval,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Adds one round's samples.
    pub fn record(&self, round: &Round<'_>) {
        let at = round.at_unix_ms;
        let o = round.overview;
        let s = o.summary();
        let state = |name: &str| s.machines_by_state.get(name).copied().unwrap_or(0);
        let mut inner = self.inner.lock();
        let actions = match (&inner.last_actions, &round.actions_recorded) {
            (Some((before, who_before)), Some((now, who_now)))
                if who_before == who_now && now >= before =>
            {
                Some(i64::try_from(now - before).unwrap_or(i64::MAX))
            }
            _ => None,
        };
        inner.last_actions = round.actions_recorded.clone();
        inner.fleet.push(FleetSample {
            at_unix_ms: at,
            coordinator_reachable: o.coordinator_reachable,
            shards_total: u32::try_from(s.shards_total).unwrap_or(u32::MAX),
            shards_reachable: u32::try_from(s.shards_reachable).unwrap_or(u32::MAX),
            machines: s.machines_by_state.values().sum(),
            idle: state("MACHINE_STATE_IDLE"),
            configured: state("MACHINE_STATE_CONFIGURED"),
            failed: state("MACHINE_STATE_FAILED"),
            sessions: i64::try_from(s.sessions).unwrap_or(i64::MAX),
            needs: s.needs,
            unmet_needs: s.unmet_needs,
            shortfalls: i64::try_from(s.shortfalls).unwrap_or(i64::MAX),
            clusters: round
                .clusters
                .map(|c| i64::try_from(c.clusters.len()).unwrap_or(i64::MAX)),
            actions,
        });
        let shards = o
            .shards
            .iter()
            .map(|sh| {
                let up = sh.reachable;
                let live = |v: i64| if up { v } else { 0 };
                (
                    sh.shard_id.clone(),
                    ShardSample {
                        at_unix_ms: at,
                        reachable: up,
                        machines: live(sh.machines_by_state.values().map(|n| i64::from(*n)).sum()),
                        sessions: live(i64::from(sh.sessions)),
                        needs: live(i64::from(sh.needs)),
                        unmet_needs: live(i64::from(sh.unmet_needs.max(0))),
                        cycle: live(sh.cycle),
                    },
                )
            })
            .collect();
        inner.shards.record(at, shards, |at| ShardSample {
            at_unix_ms: at,
            reachable: false,
            machines: 0,
            sessions: 0,
            needs: 0,
            unmet_needs: 0,
            cycle: 0,
        });
        if let Some(index) = round.clusters {
            // A free slot goes to the cluster with the most unmet demand first.
            let mut present: Vec<(String, ClusterSample)> = index
                .clusters
                .iter()
                .map(|c| {
                    (
                        c.cluster_id.clone(),
                        ClusterSample {
                            at_unix_ms: at,
                            needs: i64::from(c.needs),
                            unmet_needs: i64::from(c.unmet_needs),
                            max_age_cycles_unmet: i64::from(c.max_age_cycles_unmet),
                        },
                    )
                })
                .collect();
            present.sort_by(|(ka, a), (kb, b)| {
                (b.unmet_needs, b.needs)
                    .cmp(&(a.unmet_needs, a.needs))
                    .then_with(|| ka.cmp(kb))
            });
            inner.clusters.record(at, present, |at| ClusterSample {
                at_unix_ms: at,
                needs: 0,
                unmet_needs: 0,
                max_age_cycles_unmet: 0,
            });
        }
    }

    pub fn fleet(&self) -> FleetHistory {
        let inner = self.inner.lock();
        FleetHistory {
            interval_ms: u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            capacity: self.limits.samples.max(1),
            max_shards: self.limits.max_shards,
            max_clusters: self.limits.max_clusters,
            shards_tracked: inner.shards.map.len(),
            clusters_tracked: inner.clusters.map.len(),
            shards_untracked: inner.shards.untracked,
            clusters_untracked: inner.clusters.untracked,
            samples: inner.fleet.iter().cloned().collect(),
        }
    }

    /// `None`: the cluster is not tracked.
    pub fn cluster(&self, id: &str) -> Option<KeyHistory<ClusterSample>> {
        let inner = self.inner.lock();
        inner.clusters.get(id).map(|r| self.key_history(id, r))
    }

    /// `None`: the shard is not tracked.
    pub fn shard(&self, id: &str) -> Option<KeyHistory<ShardSample>> {
        let inner = self.inner.lock();
        inner.shards.get(id).map(|r| self.key_history(id, r))
    }

    fn key_history<T: Clone>(&self, id: &str, ring: &Ring<T>) -> KeyHistory<T> {
        KeyHistory {
            id: id.to_owned(),
            interval_ms: u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            capacity: ring.capacity(),
            samples: ring.iter().cloned().collect(),
        }
    }
}

/// Reads the fleet once and records it.
pub async fn sample_once(fleet: &Fleet, history: &History) {
    let req = bigfleet_proto::mesh::v1::RecentActionsRequest {
        limit: 1,
        ..Default::default()
    };
    let (overview, clusters, actions) = tokio::join!(
        fleet.overview(),
        fleet.clusters(),
        fleet.recent_actions(&req)
    );
    let clusters = match clusters {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::debug!(error = %e, "history: cluster index unavailable this round");
            None
        }
    };
    let actions_recorded = actions.ok().map(|r| {
        let down: Vec<&str> = r.unreachable.iter().map(|e| e.shard_id.as_str()).collect();
        let mut up: Vec<String> = overview
            .shards
            .iter()
            .map(|s| s.shard_id.clone())
            .filter(|id| !down.contains(&id.as_str()))
            .collect();
        up.sort();
        (r.recorded, up)
    });
    history.record(&Round {
        at_unix_ms: crate::fleet::now_unix_nanos() / 1_000_000,
        overview: &overview,
        clusters: clusters.as_deref(),
        actions_recorded,
    });
}

/// Samples every `interval` until `stop`; a zero interval samples nothing.
pub fn spawn_sampler(
    fleet: Arc<Fleet>,
    history: Arc<History>,
    stop: CancellationToken,
) -> Option<JoinHandle<()>> {
    let interval = history.interval();
    if interval.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        // A slow fleet read delays the next sample instead of bunching samples up.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = sample_once(&fleet, &history) => {}
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::overview;
    use crate::view::{ClusterView, ShardView};

    /// A shard whose machines are all `idle`.
    fn shard(id: &str, reachable: bool, idle: i32) -> ShardView {
        ShardView {
            machines_by_state: [("MACHINE_STATE_IDLE".to_owned(), idle)].into(),
            ..crate::fixtures::shard(id, reachable)
        }
    }

    fn index(clusters: &[(&str, u32)]) -> ClusterIndex {
        ClusterIndex {
            computed_at_unix_nanos: 1,
            coordinator_error: String::new(),
            shards: vec![],
            clusters: clusters
                .iter()
                .map(|(id, unmet)| ClusterView {
                    cluster_id: (*id).into(),
                    shards: vec![],
                    needs: unmet + 1,
                    unmet_needs: *unmet,
                    max_priority: 0,
                    max_age_cycles_unmet: 0,
                })
                .collect(),
        }
    }

    fn round<'a>(
        at: i64,
        o: &'a FleetOverview,
        c: Option<&'a ClusterIndex>,
        actions: Option<(u64, &[&str])>,
    ) -> Round<'a> {
        Round {
            at_unix_ms: at,
            overview: o,
            clusters: c,
            actions_recorded: actions
                .map(|(n, who)| (n, who.iter().map(|s| (*s).to_owned()).collect())),
        }
    }

    #[test]
    fn a_ring_never_exceeds_its_capacity_and_drops_the_oldest() {
        let mut r = Ring::new(3);
        for i in 0..10 {
            r.push(i);
            assert!(r.len() <= 3);
        }
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), [7, 8, 9]);
        assert_eq!(Ring::<u8>::new(0).capacity(), 1);
    }

    #[test]
    fn the_fleet_ring_is_bounded_and_samples_the_summary() {
        let h = History::new(
            Limits {
                samples: 5,
                ..Limits::default()
            },
            Duration::from_secs(5),
        );
        let o = overview(vec![shard("s1", true, 4), shard("s2", false, 9)]);
        for at in 0..12 {
            h.record(&round(at, &o, None, None));
        }
        let f = h.fleet();
        assert_eq!(f.samples.len(), 5);
        assert_eq!(f.samples[0].at_unix_ms, 7);
        let last = f.samples.last().unwrap();
        assert_eq!((last.shards_total, last.shards_reachable), (2, 1));
        // The unreachable shard's machines are not counted.
        assert_eq!((last.machines, last.idle), (4, 4));
        assert_eq!(last.clusters, None);
        assert_eq!(h.shard("s1").unwrap().samples.len(), 5);
        assert!(!h.shard("s2").unwrap().samples[0].reachable);
    }

    #[test]
    fn actions_are_the_difference_of_comparable_counters() {
        let h = History::new(Limits::default(), Duration::from_secs(1));
        let o = overview(vec![]);
        h.record(&round(1, &o, None, Some((10, &["a", "b"]))));
        h.record(&round(2, &o, None, Some((14, &["a", "b"]))));
        // A shard stopped answering: not comparable.
        h.record(&round(3, &o, None, Some((15, &["a"]))));
        h.record(&round(4, &o, None, Some((18, &["a"]))));
        // A restart reset a counter.
        h.record(&round(5, &o, None, Some((2, &["a"]))));
        h.record(&round(6, &o, None, None));
        let got: Vec<Option<i64>> = h.fleet().samples.iter().map(|s| s.actions).collect();
        assert_eq!(got, [None, Some(4), None, Some(3), None, None]);
    }

    #[test]
    fn clusters_beyond_the_cap_are_not_tracked_until_a_tracked_one_goes_away() {
        let h = History::new(
            Limits {
                samples: 4,
                max_shards: 1,
                max_clusters: 2,
            },
            Duration::from_secs(1),
        );
        let o = overview(vec![shard("s1", true, 1), shard("s2", true, 1)]);
        // Three clusters, room for two: the two with the most unmet demand win.
        let three = index(&[("a", 1), ("b", 5), ("c", 3)]);
        h.record(&round(1, &o, Some(&three), None));
        assert!(h.cluster("b").is_some() && h.cluster("c").is_some());
        assert!(h.cluster("a").is_none());
        let f = h.fleet();
        assert_eq!((f.clusters_tracked, f.clusters_untracked), (2, 1));
        // Shards are capped the same way.
        assert_eq!((f.shards_tracked, f.shards_untracked), (1, 1));
        assert!(h.shard("s1").is_some() && h.shard("s2").is_none());

        // While both stay present, "a" still cannot get in, even with more unmet demand.
        let again = index(&[("a", 9), ("b", 5), ("c", 3)]);
        h.record(&round(2, &o, Some(&again), None));
        assert!(h.cluster("a").is_none());

        // "c" goes away: it is recorded as zero this round, then "a" takes its slot.
        let without_c = index(&[("b", 5)]);
        h.record(&round(3, &o, Some(&without_c), None));
        let c = h.cluster("c").unwrap();
        assert_eq!(c.samples.last().unwrap().needs, 0);
        let back = index(&[("a", 2), ("b", 5)]);
        h.record(&round(4, &o, Some(&back), None));
        assert!(
            h.cluster("c").is_none(),
            "the stalest absent cluster is evicted"
        );
        assert_eq!(h.cluster("a").unwrap().samples.len(), 1);
        assert_eq!(h.cluster("b").unwrap().samples.len(), 4);
        assert_eq!(h.fleet().clusters_tracked, 2);

        // Rings stay bounded however long the sampler runs.
        for at in 5..100 {
            h.record(&round(at, &o, Some(&back), None));
        }
        assert_eq!(h.cluster("b").unwrap().samples.len(), 4);
        assert_eq!(h.fleet().samples.len(), 4);
    }

    #[test]
    fn a_round_without_the_cluster_index_leaves_cluster_series_alone() {
        let h = History::new(Limits::default(), Duration::from_secs(1));
        let o = overview(vec![]);
        let one = index(&[("a", 1)]);
        h.record(&round(1, &o, Some(&one), None));
        h.record(&round(2, &o, None, None));
        assert_eq!(h.cluster("a").unwrap().samples.len(), 1);
        assert_eq!(h.fleet().samples[1].clusters, None);
    }
}
