//! A scripted Decide: work hand-out with credits and the transition authority.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use bigfleet_conv as conv;
use bigfleet_model::{Host, Machine, MachineState, check_transition};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::work_server::{Work, WorkServer};
use bigfleet_proto::mesh::v1::worker_message::Msg;
use bigfleet_proto::v1alpha1 as pb;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status, Streaming};

use super::{Served, serve_uds};
use crate::links::DecideLink;
use bigfleet_mesh::MAX_MESSAGE_SIZE;

/// Sequence numbers reserved per hand-out (the real decide's spacing).
pub const WINDOW: i64 = 1 << 16;

/// One Transition call and decide's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRecord {
    pub action_id: String,
    pub machine_id: String,
    pub from: i32,
    pub to: i32,
    pub reason: String,
    pub patch: mesh::MachinePatch,
    /// `Ok` when applied, else the refusal code.
    pub result: Result<(), Code>,
}

impl TransitionRecord {
    pub fn edge(&self) -> (MachineState, MachineState) {
        let s = |v| MachineState::from_ordinal(v).unwrap_or(MachineState::Unspecified);
        (s(self.from), s(self.to))
    }
}

/// One Done frame.
#[derive(Debug, Clone, PartialEq)]
pub struct DoneRecord {
    pub stream: u64,
    pub worker_id: String,
    pub action_id: String,
    pub machine_id: Option<String>,
    pub outcome: String,
    pub detail: String,
    /// The action was no longer in flight on this stream (abandoned or unknown).
    pub late: bool,
}

/// One Work stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRecord {
    pub id: u64,
    pub worker_id: String,
    pub open: bool,
    pub handed_out: Vec<String>,
    /// Actions in flight when the stream ended.
    pub abandoned: Vec<String>,
}

#[derive(Debug, Clone)]
struct Pending {
    action: mesh::Action,
    trace_context: HashMap<String, String>,
}

#[derive(Debug)]
struct InFlight {
    machine_id: String,
    stream: u64,
    pending: Pending,
    /// The record when handed out, restored when the action is re-issued.
    handed_out_as: Option<Machine>,
}

#[derive(Debug)]
struct State {
    shard_id: String,
    epoch: i64,
    reissue_abandoned: bool,
    machines: BTreeMap<String, Machine>,
    queue: VecDeque<Pending>,
    inflight: HashMap<String, InFlight>,
    busy: HashMap<String, String>,
    next_action: u64,
    next_base: i64,
    next_stream: u64,
    transitions: Vec<TransitionRecord>,
    dones: Vec<DoneRecord>,
    streams: Vec<StreamRecord>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    work_added: Notify,
    version: watch::Sender<u64>,
    end_streams: Mutex<CancellationToken>,
}

/// A Decide double. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct DecideDouble {
    shared: Arc<Shared>,
}

/// As decide would hand it out: the assignment travels in `shard_metadata`.
fn snapshot(m: &Machine) -> pb::Machine {
    let mut m = m.clone();
    m.shard_metadata = if m.assigned_need_fingerprint.is_empty() && m.cluster.is_empty() {
        BTreeMap::new()
    } else {
        m.encode_shard_metadata()
    };
    conv::machine_to_proto(&m)
}

impl DecideDouble {
    /// A double handing out fencing windows for `shard_id` at `epoch`.
    pub fn new(shard_id: &str, epoch: i64) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    shard_id: shard_id.to_owned(),
                    epoch,
                    reissue_abandoned: false,
                    machines: BTreeMap::new(),
                    queue: VecDeque::new(),
                    inflight: HashMap::new(),
                    busy: HashMap::new(),
                    next_action: 1,
                    next_base: WINDOW,
                    next_stream: 1,
                    transitions: Vec::new(),
                    dones: Vec::new(),
                    streams: Vec::new(),
                }),
                work_added: Notify::new(),
                version: watch::channel(0).0,
                end_streams: Mutex::new(CancellationToken::new()),
            }),
        }
    }

    fn changed(&self) {
        self.shared.version.send_modify(|v| *v += 1);
    }

    /// Adds a machine to the inventory (validated like a provider record).
    pub fn insert_machine(&self, m: &pb::Machine) -> Result<(), conv::ConvError> {
        let mut machine = conv::machine_from_proto(m)?;
        let echoed = std::mem::take(&mut machine.shard_metadata);
        let _ = machine.apply_shard_metadata(&echoed);
        self.shared
            .state
            .lock()
            .machines
            .insert(machine.id.clone(), machine);
        self.changed();
        Ok(())
    }

    /// Queues an action for hand-out.
    pub fn enqueue(&self, action: mesh::Action) {
        self.enqueue_traced(action, HashMap::new());
    }

    /// Queues an action carrying a W3C trace context.
    pub fn enqueue_traced(&self, action: mesh::Action, trace_context: HashMap<String, String>) {
        self.shared.state.lock().queue.push_back(Pending {
            action,
            trace_context,
        });
        self.shared.work_added.notify_waiters();
        self.changed();
    }

    /// Whether actions abandoned by a dead stream go back to the front of
    /// the queue (as decide's next cycle would re-derive them). Their
    /// machines are restored to the record handed out, standing in for
    /// decide's reconcile (exact when the provider was never touched).
    pub fn set_reissue_abandoned(&self, on: bool) {
        self.shared.state.lock().reissue_abandoned = on;
    }

    /// The epoch stamped into future hand-outs.
    pub fn set_epoch(&self, epoch: i64) {
        self.shared.state.lock().epoch = epoch;
    }

    /// Ends every open Work stream (as if decide went away); the server
    /// keeps accepting new ones.
    pub fn end_streams(&self) {
        let old = std::mem::take(&mut *self.shared.end_streams.lock());
        old.cancel();
    }

    /// The machine as decide holds it.
    pub fn machine(&self, id: &str) -> Option<pb::Machine> {
        self.shared.state.lock().machines.get(id).map(snapshot)
    }

    pub fn state_of(&self, id: &str) -> Option<MachineState> {
        self.shared.state.lock().machines.get(id).map(|m| m.state)
    }

    pub fn transitions(&self) -> Vec<TransitionRecord> {
        self.shared.state.lock().transitions.clone()
    }

    pub fn dones(&self) -> Vec<DoneRecord> {
        self.shared.state.lock().dones.clone()
    }

    /// How many Done frames arrived (cheap, for polling).
    pub fn done_count(&self) -> usize {
        self.shared.state.lock().dones.len()
    }

    pub fn streams(&self) -> Vec<StreamRecord> {
        self.shared.state.lock().streams.clone()
    }

    pub fn queued(&self) -> usize {
        self.shared.state.lock().queue.len()
    }

    pub fn in_flight(&self) -> usize {
        self.shared.state.lock().inflight.len()
    }

    /// Ticks on every change to the double's records (for waits that must wake at
    /// once, like the bench's clock; tests poll with `bigfleet_testkit::wait_until`).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.shared.version.subscribe()
    }

    /// The compare-and-swap transition authority (in memory).
    pub fn apply_transition(&self, req: &mesh::TransitionRequest) -> Result<pb::Machine, Status> {
        let result = {
            // One lock for verdict and record, so records keep the order in
            // which verdicts were given.
            let mut st = self.shared.state.lock();
            let result = st.apply(req);
            st.transitions.push(TransitionRecord {
                action_id: req.action_id.clone(),
                machine_id: req.machine_id.clone(),
                from: req.from_state,
                to: req.to_state,
                reason: req.reason.clone(),
                patch: req.patch.clone().unwrap_or_default(),
                result: result.as_ref().map(|_| ()).map_err(Status::code),
            });
            result
        };
        self.changed();
        result
    }

    /// The `bigfleet.mesh.v1.Work` service of this double, to add to a
    /// server of your own (e.g. one with TLS).
    pub fn service(&self) -> WorkServer<WorkDoubleService> {
        WorkServer::new(WorkDoubleService {
            double: self.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
    }

    /// A tonic router serving this double as `bigfleet.mesh.v1.Work`.
    pub fn router(&self) -> tonic::transport::server::Router {
        Server::builder().add_service(self.service())
    }

    /// Serves the double on a Unix socket.
    pub fn serve_uds(&self, path: &Path) -> std::io::Result<Served> {
        serve_uds(self.router(), path)
    }

    /// Hands out the next queued item without a stream (in-memory tests
    /// drive the executor directly). Report it with [`DecideDouble::finish`].
    pub fn take_work(&self) -> Option<mesh::WorkItem> {
        self.take_next(0)
    }

    /// Records the Done of an item from [`DecideDouble::take_work`].
    pub fn finish(&self, done: mesh::worker_message::Done) {
        self.record_done(0, "in-memory", done);
    }

    fn open_stream(&self, worker_id: &str) -> u64 {
        let mut st = self.shared.state.lock();
        let id = st.next_stream;
        st.next_stream += 1;
        st.streams.push(StreamRecord {
            id,
            worker_id: worker_id.to_owned(),
            open: true,
            handed_out: Vec::new(),
            abandoned: Vec::new(),
        });
        drop(st);
        self.changed();
        id
    }

    fn take_next(&self, stream: u64) -> Option<mesh::WorkItem> {
        let item = self.shared.state.lock().take_next(stream);
        if item.is_some() {
            self.changed();
        }
        item
    }

    fn record_done(&self, stream: u64, worker_id: &str, done: mesh::worker_message::Done) {
        self.shared.state.lock().done(stream, worker_id, done);
        self.changed();
    }

    fn close_stream(&self, stream: u64) {
        let reissued = self.shared.state.lock().close(stream);
        if reissued {
            self.shared.work_added.notify_waiters();
        }
        self.changed();
    }

    /// One worker's stream: hand out an item per credit, record Done frames,
    /// abandon what is left when the stream ends.
    async fn session(
        self,
        stream: u64,
        worker_id: String,
        mut inbound: Streaming<mesh::WorkerMessage>,
        tx: mpsc::Sender<Result<mesh::WorkItem, Status>>,
        end: CancellationToken,
    ) {
        let mut credits: u64 = 0;
        'session: loop {
            // Registered before the queue is checked, so an enqueue between
            // the check and the wait is not missed.
            let added = self.shared.work_added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            while credits > 0 {
                let Some(item) = self.take_next(stream) else {
                    break;
                };
                credits -= 1;
                if tx.send(Ok(item)).await.is_err() {
                    break 'session;
                }
            }
            tokio::select! {
                _ = end.cancelled() => break,
                _ = tx.closed() => break,
                _ = &mut added => {}
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => match m.msg {
                        Some(Msg::Credit(c)) => credits += u64::from(c.n),
                        Some(Msg::Done(d)) => self.record_done(stream, &worker_id, d),
                        Some(Msg::Hello(_)) | None => {}
                    },
                    Ok(None) | Err(_) => break,
                },
            }
        }
        self.close_stream(stream);
    }
}

impl State {
    fn take_next(&mut self, stream: u64) -> Option<mesh::WorkItem> {
        let pos = self
            .queue
            .iter()
            .position(|p| !self.busy.contains_key(&p.action.machine_id))?;
        let pending = self.queue.remove(pos)?;
        let action_id = format!("act-{}", self.next_action);
        self.next_action += 1;
        let base = self.next_base;
        self.next_base += WINDOW;
        let machine_id = pending.action.machine_id.clone();
        let item = mesh::WorkItem {
            action_id: action_id.clone(),
            action: Some(pending.action.clone()),
            machine: self.machines.get(&machine_id).map(snapshot),
            fencing: Some(mesh::Fencing {
                shard_id: self.shard_id.clone(),
                epoch: self.epoch,
                sequence_base: base,
                sequence_limit: base + WINDOW,
            }),
            cycle: 1,
            trace_context: pending.trace_context.clone(),
        };
        self.busy.insert(machine_id.clone(), action_id.clone());
        let handed_out_as = self.machines.get(&machine_id).cloned();
        self.inflight.insert(
            action_id.clone(),
            InFlight {
                machine_id,
                stream,
                pending,
                handed_out_as,
            },
        );
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.handed_out.push(action_id);
        }
        Some(item)
    }

    fn done(&mut self, stream: u64, worker_id: &str, done: mesh::worker_message::Done) {
        let machine_id = self
            .inflight
            .get(&done.action_id)
            .map(|f| f.machine_id.clone());
        let live = matches!(self.inflight.get(&done.action_id), Some(f) if f.stream == stream);
        if live
            && let Some(f) = self.inflight.remove(&done.action_id)
            && self.busy.get(&f.machine_id) == Some(&done.action_id)
        {
            self.busy.remove(&f.machine_id);
        }
        self.dones.push(DoneRecord {
            stream,
            worker_id: worker_id.to_owned(),
            action_id: done.action_id,
            machine_id,
            outcome: done.outcome,
            detail: done.detail,
            late: !live,
        });
    }

    /// Returns whether anything was re-queued.
    fn close(&mut self, stream: u64) -> bool {
        let mut abandoned: Vec<(String, InFlight)> = Vec::new();
        let ids: Vec<String> = self
            .inflight
            .iter()
            .filter(|(_, f)| f.stream == stream)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(f) = self.inflight.remove(&id) {
                if self.busy.get(&f.machine_id) == Some(&id) {
                    self.busy.remove(&f.machine_id);
                }
                abandoned.push((id, f));
            }
        }
        // Hand-out order, so re-issued work keeps its place.
        abandoned.sort_by_key(|(id, _)| {
            id.trim_start_matches("act-")
                .parse::<u64>()
                .unwrap_or(u64::MAX)
        });
        if let Some(s) = self.streams.iter_mut().find(|s| s.id == stream) {
            s.open = false;
            s.abandoned = abandoned.iter().map(|(id, _)| id.clone()).collect();
        }
        if !self.reissue_abandoned || abandoned.is_empty() {
            return false;
        }
        for (_, f) in abandoned.into_iter().rev() {
            // Stands in for decide's reconcile re-deriving the machine from
            // the provider; faithful when the provider was not touched.
            if let Some(m) = f.handed_out_as {
                self.machines.insert(f.machine_id.clone(), m);
            }
            self.queue.push_front(f.pending);
        }
        true
    }

    fn apply(&mut self, req: &mesh::TransitionRequest) -> Result<pb::Machine, Status> {
        let invalid = |e: String| Status::invalid_argument(e);
        let from =
            conv::machine_state_from_proto(req.from_state).map_err(|e| invalid(e.to_string()))?;
        let to =
            conv::machine_state_from_proto(req.to_state).map_err(|e| invalid(e.to_string()))?;
        if self.busy.get(&req.machine_id) != Some(&req.action_id) {
            if !self.machines.contains_key(&req.machine_id) {
                return Err(Status::not_found(format!(
                    "machine {} unknown",
                    req.machine_id
                )));
            }
            return Err(Status::aborted(format!(
                "action {} is not in flight for machine {}",
                req.action_id, req.machine_id
            )));
        }
        let current = self
            .machines
            .get(&req.machine_id)
            .ok_or_else(|| Status::not_found(format!("machine {} unknown", req.machine_id)))?;
        if current.state != from {
            return Err(Status::aborted(format!(
                "machine {} is {}, not {from}",
                req.machine_id, current.state
            )));
        }
        check_transition(from, to).map_err(|e| invalid(e.to_string()))?;
        let patch = req.patch.clone().unwrap_or_default();
        let mut next = current.clone();
        if let Some(view) = &patch.provider_view {
            let v = conv::machine_from_proto(view)
                .map_err(|e| invalid(format!("provider_view: {e}")))?;
            next.profile = v.profile;
            next.price_per_hour = v.price_per_hour;
            next.interruption_probability = v.interruption_probability;
            next.allocatable = v.allocatable;
            if patch.host.is_none() {
                next.host = v.host;
            }
        }
        if let Some(h) = &patch.host {
            next.host = Host {
                provider: h.provider.clone(),
                reference: h.r#ref.clone(),
            };
        }
        if let Some(c) = &patch.cluster {
            next.cluster.clone_from(c);
        }
        if let Some(p) = patch.assigned_priority {
            next.assigned_priority = p;
        }
        if let Some(d) = patch.assigned_interruption_penalty_dollars {
            next.assigned_interruption_penalty_dollars = d;
        }
        if let Some(d) = patch.assigned_reclamation_penalty_dollars {
            next.assigned_reclamation_penalty_dollars = d;
        }
        if let Some(f) = &patch.assigned_need_fingerprint {
            next.assigned_need_fingerprint.clone_from(f);
        }
        if let Some(g) = &patch.assigned_group {
            next.assigned_group.clone_from(g);
        }
        if let Some(e) = &patch.last_error {
            next.last_error.clone_from(e);
        }
        next.state = to;
        if matches!(to, MachineState::Idle | MachineState::Speculative) {
            next.clear_assignment();
        }
        if to == MachineState::Failed && next.last_error.is_empty() {
            return Err(invalid("entering failed requires last_error".to_owned()));
        }
        next.invariant().map_err(|e| invalid(e.to_string()))?;
        let out = snapshot(&next);
        self.machines.insert(req.machine_id.clone(), next);
        Ok(out)
    }
}

impl DecideLink for DecideDouble {
    async fn transition(
        &self,
        req: mesh::TransitionRequest,
    ) -> Result<mesh::TransitionResponse, Status> {
        self.apply_transition(&req)
            .map(|machine| mesh::TransitionResponse {
                machine: Some(machine),
            })
    }
}

/// The gRPC face of a [`DecideDouble`].
#[derive(Debug)]
pub struct WorkDoubleService {
    double: DecideDouble,
}

#[tonic::async_trait]
impl Work for WorkDoubleService {
    type PullStream = ReceiverStream<Result<mesh::WorkItem, Status>>;

    async fn pull(
        &self,
        request: Request<Streaming<mesh::WorkerMessage>>,
    ) -> Result<Response<Self::PullStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("work stream closed before hello"))?;
        let Some(Msg::Hello(hello)) = first.msg else {
            return Err(Status::invalid_argument("first work frame must be hello"));
        };
        let shard = self.double.shared.state.lock().shard_id.clone();
        if !hello.shard_id.is_empty() && hello.shard_id != shard {
            return Err(Status::invalid_argument(format!(
                "worker serves shard {}, this is {shard}",
                hello.shard_id
            )));
        }
        let stream = self.double.open_stream(&hello.worker_id);
        let end = self.double.shared.end_streams.lock().clone();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(
            self.double
                .clone()
                .session(stream, hello.worker_id, inbound, tx, end),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn transition(
        &self,
        request: Request<mesh::TransitionRequest>,
    ) -> Result<Response<mesh::TransitionResponse>, Status> {
        let req = request.into_inner();
        self.double.apply_transition(&req).map(|machine| {
            Response::new(mesh::TransitionResponse {
                machine: Some(machine),
            })
        })
    }
}
