//! A stand-in for decide's `Ingest` service: enough of it for the gateway to run against
//! (gateway tests, the gateway load test) without inventory, provider or cycles.
//!
//! It applies roll-ups by remembering the last one per cluster, answers session events with
//! a fixed epoch and term, and can be slowed down (a fixed delay, or a gate that holds every
//! ApplyRollup until the test releases it). `ShardRead.InspectNeeds` lists the remembered
//! needs (cycle 0: no decisions are ever made). It serves no `Work`: it hands out nothing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bigfleet_mesh::{MeshServer, RunningServer, ServerError, ServerStackConfig};
use bigfleet_proto::mesh::v1::ingest_server::{Ingest, IngestServer};
use bigfleet_proto::mesh::v1::{
    ApplyRollupRequest, ApplyRollupResponse, RollupOutcome, SessionClosedRequest,
    SessionClosedResponse, SessionOpenedRequest, SessionOpenedResponse,
};
use bigfleet_proto::v1alpha1::shard_read_server::{ShardRead, ShardReadServer};
use bigfleet_proto::v1alpha1::{
    ClusterCapacityNeeds, InspectNeedsHeader, InspectNeedsRequest, InspectNeedsResponse, NeedView,
    inspect_needs_response,
};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

/// How the stub behaves.
#[derive(Debug, Clone, Default)]
pub struct StubConfig {
    pub shard_epoch: i64,
    pub coordinator_term: i64,
    /// Every ApplyRollup takes at least this long.
    pub apply_delay: Duration,
    /// When set, every ApplyRollup waits for (and consumes) one permit.
    pub apply_gate: Option<Arc<Semaphore>>,
}

/// Counters and remembered state, shared with the test that started the stub.
#[derive(Debug, Default)]
pub struct StubState {
    pub applied: AtomicU64,
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    /// ApplyRollup calls that have started (including ones still waiting at the gate).
    pub apply_started: AtomicU64,
    rollups: Mutex<HashMap<String, ClusterCapacityNeeds>>,
    sessions: Mutex<HashMap<String, u64>>,
    closes: Mutex<Vec<SessionClosedRequest>>,
}

impl StubState {
    /// The last roll-up applied for `cluster`.
    pub fn rollup(&self, cluster: &str) -> Option<ClusterCapacityNeeds> {
        self.rollups.lock().get(cluster).cloned()
    }

    /// Clusters decide believes are connected, with their session ids.
    pub fn open_sessions(&self) -> HashMap<String, u64> {
        self.sessions.lock().clone()
    }

    /// Every SessionClosed received, in order.
    pub fn closes(&self) -> Vec<SessionClosedRequest> {
        self.closes.lock().clone()
    }
}

/// The Decide double.
#[derive(Debug, Clone)]
pub struct DecideStub {
    cfg: StubConfig,
    state: Arc<StubState>,
}

impl DecideStub {
    pub fn new(cfg: StubConfig) -> Self {
        Self {
            cfg,
            state: Arc::new(StubState::default()),
        }
    }

    pub fn state(&self) -> Arc<StubState> {
        Arc::clone(&self.state)
    }

    /// Serves the stub on a Unix socket (e.g. `<socket-dir>/decide.sock`).
    pub async fn serve_unix(self, path: &Path) -> Result<RunningServer, ServerError> {
        MeshServer::new("decide-stub", ServerStackConfig::default())
            .unix(path)
            .descriptor_set(bigfleet_proto::FILE_DESCRIPTOR_SET)
            .drain_deadline(Duration::from_secs(1))
            .add_service(bigfleet_mesh::with_message_limits!(ShardReadServer::new(
                self.clone()
            )))
            .add_service(bigfleet_mesh::with_message_limits!(IngestServer::new(self)))
            .start()
            .await
    }
}

#[tonic::async_trait]
impl Ingest for DecideStub {
    async fn apply_rollup(
        &self,
        request: Request<ApplyRollupRequest>,
    ) -> Result<Response<ApplyRollupResponse>, Status> {
        self.state.apply_started.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.cfg.apply_gate {
            gate.acquire()
                .await
                .map_err(|_| Status::unavailable("stub closed"))?
                .forget();
        }
        if !self.cfg.apply_delay.is_zero() {
            tokio::time::sleep(self.cfg.apply_delay).await;
        }
        let rollup = request
            .into_inner()
            .rollup
            .ok_or_else(|| Status::invalid_argument("apply_rollup without a rollup"))?;
        let rows = i32::try_from(rollup.needs.len()).unwrap_or(i32::MAX);
        self.state
            .rollups
            .lock()
            .insert(rollup.cluster_id.clone(), rollup);
        self.state.applied.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(ApplyRollupResponse {
            outcome: RollupOutcome::Accepted as i32,
            detail: String::new(),
            need_rows: rows,
            shard_epoch: self.cfg.shard_epoch,
            coordinator_term: self.cfg.coordinator_term,
        }))
    }

    async fn session_opened(
        &self,
        request: Request<SessionOpenedRequest>,
    ) -> Result<Response<SessionOpenedResponse>, Status> {
        let req = request.into_inner();
        self.state
            .sessions
            .lock()
            .insert(req.cluster_id, req.session_id);
        self.state.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(SessionOpenedResponse {
            shard_epoch: self.cfg.shard_epoch,
            coordinator_term: self.cfg.coordinator_term,
            resync_machines: 0,
        }))
    }

    async fn session_closed(
        &self,
        request: Request<SessionClosedRequest>,
    ) -> Result<Response<SessionClosedResponse>, Status> {
        let req = request.into_inner();
        {
            // A close for an older session than the open one is stale: ignore it.
            let mut sessions = self.state.sessions.lock();
            if sessions.get(&req.cluster_id) == Some(&req.session_id) {
                sessions.remove(&req.cluster_id);
            }
        }
        self.state.closes.lock().push(req);
        self.state.closed.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(SessionClosedResponse {}))
    }
}

type NeedsStream = futures::stream::Iter<std::vec::IntoIter<Result<InspectNeedsResponse, Status>>>;

#[tonic::async_trait]
impl ShardRead for DecideStub {
    type InspectNeedsStream = NeedsStream;

    async fn inspect_needs(
        &self,
        request: Request<InspectNeedsRequest>,
    ) -> Result<Response<NeedsStream>, Status> {
        let req = request.into_inner();
        let mut views: Vec<NeedView> = {
            let rollups = self.state.rollups.lock();
            let mut clusters: Vec<_> = rollups
                .keys()
                .filter(|c| req.cluster_id.is_empty() || **c == req.cluster_id)
                .cloned()
                .collect();
            clusters.sort();
            clusters
                .iter()
                .flat_map(|c| {
                    rollups[c].needs.iter().map(move |n| NeedView {
                        need: Some(n.clone()),
                        cluster_id: c.clone(),
                        ..NeedView::default()
                    })
                })
                .collect()
        };
        let total = i32::try_from(views.len()).unwrap_or(i32::MAX);
        if let Ok(limit) = usize::try_from(req.limit)
            && limit > 0
        {
            views.truncate(limit);
        }
        let frame = |f| Ok(InspectNeedsResponse { frame: Some(f) });
        let mut frames = vec![frame(inspect_needs_response::Frame::Header(
            InspectNeedsHeader {
                cycle: 0,
                computed_at_unix_nanos: 0,
                total_needs: total,
            },
        ))];
        frames.extend(
            views
                .into_iter()
                .map(|v| frame(inspect_needs_response::Frame::Need(v))),
        );
        Ok(Response::new(futures::stream::iter(frames)))
    }
}
