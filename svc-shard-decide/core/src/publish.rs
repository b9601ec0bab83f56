//! Outbound session frames (NodeStateUpdate, AvailableCapacityUpdate) on
//! their way to the gateway's `Publish` stream.
//!
//! Best effort by design: the gateway drops frames for clusters without a
//! session, and a reconnecting operator gets a full resync. So a slow or absent
//! gateway never blocks decide — a full buffer drops the frame and counts it.

use bigfleet_mesh::MeshChannel;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::outbox_client::OutboxClient;
use prometheus::IntCounter;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc};

/// Default number of frames buffered for the gateway.
pub const DEFAULT_EVENT_BUFFER: usize = 65_536;

/// Cheap-to-clone handle that queues frames for the gateway.
#[derive(Clone, Debug)]
pub struct Publisher {
    tx: mpsc::Sender<mesh::ShardEvent>,
    dropped: Option<IntCounter>,
}

impl Publisher {
    /// A publisher and the receiving end its frames arrive on.
    pub fn channel(capacity: usize) -> (Publisher, mpsc::Receiver<mesh::ShardEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Publisher { tx, dropped: None }, rx)
    }

    /// Counts dropped frames in `counter`.
    pub fn with_drop_counter(mut self, counter: IntCounter) -> Self {
        self.dropped = Some(counter);
        self
    }

    /// Queues one frame; drops it when the buffer is full or nobody listens.
    pub fn publish(&self, event: mesh::ShardEvent) {
        if self.tx.try_send(event).is_err()
            && let Some(c) = &self.dropped
        {
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
    rx: mpsc::Receiver<mesh::ShardEvent>,
    sink: Arc<dyn SessionSink>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let rx = Arc::new(Mutex::new(rx));
    let client = OutboxClient::new(channel)
        .max_decoding_message_size(crate::MAX_MESSAGE_SIZE)
        .max_encoding_message_size(crate::MAX_MESSAGE_SIZE);
    let run = async {
        let mut backoff = Duration::from_millis(100);
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
                    backoff = Duration::from_millis(100);
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
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    };
    tokio::select! {
        () = run => {}
        () = shutdown => {}
    }
}
