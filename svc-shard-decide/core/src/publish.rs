//! Outbound session frames (NodeStateUpdate, AvailableCapacityUpdate) on
//! their way to the gateway's `Publish` stream.
//!
//! Best effort by design: the gateway drops frames for clusters without a
//! session, and a reconnecting operator gets a full resync. So a slow or absent
//! gateway never blocks decide — a full buffer drops the frame and counts it.
//!
//! Fair by construction (issue 16): frames wait in one queue per cluster, a newer frame
//! replaces a queued one with the same `supersedes_key` (only the latest state of a node
//! matters), the forwarder takes one frame per cluster in turn, and no cluster may hold
//! more than a quarter of the buffer. A cluster's session-open resync (one frame per
//! machine it holds) therefore neither delays nor drops other clusters' frames.

use bigfleet_mesh::{Backoff, BackoffPolicy, MeshChannel};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::outbox_client::OutboxClient;
use prometheus::IntCounter;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, Notify};

/// Default number of frames buffered for the gateway.
pub const DEFAULT_EVENT_BUFFER: usize = 65_536;

/// One cluster's waiting frames, in order, at most one per coalescing key.
#[derive(Default)]
struct ClusterQueue {
    order: VecDeque<String>,
    frames: FxHashMap<String, mesh::ShardEvent>,
}

#[derive(Default)]
struct State {
    queues: FxHashMap<String, ClusterQueue>,
    /// Clusters with frames waiting, in the order they are served.
    ring: VecDeque<String>,
    total: usize,
    /// Keys for frames without a `supersedes_key` (never coalesced).
    unkeyed: u64,
}

struct Shared {
    state: parking_lot::Mutex<State>,
    ready: Notify,
    capacity: usize,
    per_cluster: usize,
    publishers: AtomicUsize,
}

/// Cheap-to-clone handle that queues frames for the gateway.
pub struct Publisher {
    shared: Arc<Shared>,
    dropped: Option<IntCounter>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("capacity", &self.shared.capacity)
            .finish_non_exhaustive()
    }
}

impl Clone for Publisher {
    fn clone(&self) -> Self {
        self.shared.publishers.fetch_add(1, Ordering::AcqRel);
        Self {
            shared: Arc::clone(&self.shared),
            dropped: self.dropped.clone(),
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if self.shared.publishers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.ready.notify_one();
        }
    }
}

/// The receiving end: frames in cluster round-robin order.
pub struct Events {
    shared: Arc<Shared>,
}

/// [`Events::try_recv`] found nothing waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Empty;

impl Events {
    /// The next frame: one per waiting cluster in turn. `None` once every publisher is
    /// gone and nothing waits.
    pub async fn recv(&mut self) -> Option<mesh::ShardEvent> {
        let shared = Arc::clone(&self.shared);
        loop {
            // Registered before looking, so a publish between the look and the wait wakes us.
            let notified = shared.ready.notified();
            if let Ok(ev) = self.try_recv() {
                return Some(ev);
            }
            if self.is_closed() {
                return None;
            }
            notified.await;
        }
    }

    /// The next frame if one waits.
    pub fn try_recv(&mut self) -> Result<mesh::ShardEvent, Empty> {
        let mut st = self.shared.state.lock();
        let cluster = st.ring.pop_front().ok_or(Empty)?;
        let (ev, more) = {
            let q = st.queues.get_mut(&cluster).ok_or(Empty)?;
            let key = q.order.pop_front().ok_or(Empty)?;
            let ev = q.frames.remove(&key).ok_or(Empty)?;
            (ev, !q.order.is_empty())
        };
        st.total -= 1;
        if more {
            st.ring.push_back(cluster);
        } else {
            st.queues.remove(&cluster);
        }
        Ok(ev)
    }

    /// Whether every publisher has been dropped.
    pub fn is_closed(&self) -> bool {
        self.shared.publishers.load(Ordering::Acquire) == 0
    }
}

impl Publisher {
    /// A publisher and the receiving end its frames arrive on; `capacity` frames may wait
    /// in all, a quarter of that per cluster.
    pub fn channel(capacity: usize) -> (Publisher, Events) {
        let capacity = capacity.max(1);
        let shared = Arc::new(Shared {
            state: parking_lot::Mutex::new(State::default()),
            ready: Notify::new(),
            capacity,
            per_cluster: (capacity / 4).max(1),
            publishers: AtomicUsize::new(1),
        });
        (
            Publisher {
                shared: Arc::clone(&shared),
                dropped: None,
            },
            Events { shared },
        )
    }

    /// Counts dropped frames in `counter`.
    pub fn with_drop_counter(mut self, counter: IntCounter) -> Self {
        self.dropped = Some(counter);
        self
    }

    /// Queues one frame: replaces a waiting frame with the same key, or drops it when its
    /// cluster's share or the whole buffer is full.
    pub fn publish(&self, event: mesh::ShardEvent) {
        let shared = &self.shared;
        let accepted = {
            let mut st = shared.state.lock();
            let key = if event.supersedes_key.is_empty() {
                st.unkeyed += 1;
                format!("\u{0}{}", st.unkeyed)
            } else {
                event.supersedes_key.clone()
            };
            let total = st.total;
            let q = st.queues.entry(event.cluster_id.clone()).or_default();
            if let Some(slot) = q.frames.get_mut(&key) {
                *slot = event;
                true
            } else if q.order.len() >= shared.per_cluster || total >= shared.capacity {
                if q.order.is_empty() {
                    let cluster = event.cluster_id.clone();
                    st.queues.remove(&cluster);
                }
                false
            } else {
                let was_idle = q.order.is_empty();
                let cluster = event.cluster_id.clone();
                q.order.push_back(key.clone());
                q.frames.insert(key, event);
                st.total += 1;
                if was_idle {
                    st.ring.push_back(cluster);
                }
                true
            }
        };
        if accepted {
            shared.ready.notify_one();
        } else if let Some(c) = &self.dropped {
            c.inc();
        }
    }
}

/// What the forwarder learns from `Outbox.Status` when it (re)connects.
pub trait SessionSink: Send + Sync + 'static {
    /// The gateway's live sessions: (cluster, session id).
    fn sessions_live(&self, sessions: Vec<(String, u64)>);
}

/// Forwards frames from `rx` to the gateway's `Publish` stream until
/// `shutdown` resolves, redialling with backoff when the stream breaks. After
/// each (re)connect it asks `Outbox.Status` for the live sessions, so a
/// restarted decide learns which clusters are connected.
pub async fn forward_to_gateway(
    channel: MeshChannel,
    rx: Events,
    sink: Arc<dyn SessionSink>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let rx = Arc::new(Mutex::new(rx));
    let client = bigfleet_mesh::with_message_limits!(OutboxClient::new(channel));
    let run = async {
        let mut backoff = Backoff::new(BackoffPolicy::new(
            Duration::from_millis(100),
            Duration::from_secs(5),
        ));
        loop {
            let mut c = client.clone();
            match c
                .status(mesh::StatusRequest {
                    include_sessions: true,
                })
                .await
            {
                Ok(resp) => {
                    let sessions = resp
                        .into_inner()
                        .sessions
                        .into_iter()
                        .map(|s| (s.cluster_id, s.session_id))
                        .collect();
                    sink.sessions_live(sessions);
                    backoff.reset();
                    let stream = futures::stream::unfold(rx.clone(), |rx| async move {
                        let ev = rx.lock().await.recv().await;
                        ev.map(|e| (e, rx))
                    });
                    match c.publish(stream).await {
                        Ok(summary) => {
                            let s = summary.into_inner();
                            tracing::info!(
                                received = s.received,
                                queued = s.queued,
                                "gateway publish stream ended"
                            );
                            // The sender side is gone only at shutdown.
                            if rx.lock().await.is_closed() {
                                return;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "gateway publish stream failed"),
                    }
                }
                Err(e) => tracing::debug!(error = %e, "gateway not reachable yet"),
            }
            backoff.sleep().await;
        }
    };
    tokio::select! {
        () = run => {}
        () = shutdown => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(cluster: &str, key: &str) -> mesh::ShardEvent {
        mesh::ShardEvent {
            cluster_id: cluster.into(),
            supersedes_key: key.into(),
            frame: None,
        }
    }

    fn drain(rx: &mut Events) -> Vec<(String, String)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| (e.cluster_id, e.supersedes_key))
            .collect()
    }

    #[test]
    fn one_clusters_resync_neither_drops_nor_delays_the_others() {
        let (p, mut rx) = Publisher::channel(400);
        // A big cluster floods its share (100) and beyond...
        for i in 0..1_000 {
            p.publish(ev("big", &format!("node:{i}")));
        }
        // ...and the others still get in, and out first-come in turn.
        for c in ["a", "b", "c"] {
            p.publish(ev(c, "node:x"));
        }
        let out = drain(&mut rx);
        assert_eq!(out.iter().filter(|(c, _)| c == "big").count(), 100);
        for c in ["a", "b", "c"] {
            let pos = out.iter().position(|(x, _)| x == c).unwrap();
            assert!(pos < 8, "{c} waited behind the resync (position {pos})");
        }
    }

    #[test]
    fn a_newer_frame_replaces_a_waiting_one_with_the_same_key() {
        let (p, mut rx) = Publisher::channel(10);
        let mut first = ev("a", "node:1");
        first.frame = None;
        p.publish(first);
        p.publish(ev("a", "node:2"));
        let mut newer = ev("a", "node:1");
        newer.frame = Some(mesh::shard_event::Frame::NodeStateUpdate(Default::default()));
        p.publish(newer);
        let out: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].supersedes_key, "node:1");
        assert!(out[0].frame.is_some(), "the newer state went out");
    }

    #[test]
    fn unkeyed_frames_are_never_coalesced_and_the_total_is_bounded() {
        let (p, mut rx) = Publisher::channel(8);
        for i in 0..20 {
            p.publish(ev(&format!("c{i}"), ""));
        }
        assert_eq!(drain(&mut rx).len(), 8);
    }

    #[tokio::test]
    async fn recv_ends_when_every_publisher_is_gone() {
        let (p, mut rx) = Publisher::channel(4);
        let q = p.clone();
        p.publish(ev("a", "k"));
        drop(p);
        assert!(rx.recv().await.is_some());
        drop(q);
        assert!(rx.recv().await.is_none());
    }
}
