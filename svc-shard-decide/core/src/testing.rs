//! Test support that decide's own tests and the decide binary's share (feature `testing`,
//! enabled from dev-dependencies only; production builds never compile it): a valid
//! provider record, a provider the test edits in process, a decide built around one,
//! and an execute worker on the Work stream.

use crate::reconcile::{MachineSource, RawMachineList};
use crate::shard::{Clock, Decide, DecideConfig};
use crate::{Publisher, ShardMetrics};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::work_client::WorkClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_telemetry::Readiness;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, mpsc};
use tonic::transport::Channel;

/// A valid on-demand m5.xlarge record (4 cpu, 16Gi, zone z1, $0.20/h) as a provider lists
/// it: hosted unless Speculative or Creating, bound to `cluster` (empty: unbound).
pub fn provider_machine(id: &str, state: pb::MachineState, cluster: &str) -> pb::Machine {
    use pb::MachineState as S;
    let hosted = !matches!(state, S::Speculative | S::Creating);
    pb::Machine {
        id: id.to_owned(),
        state: state as i32,
        host: hosted.then(|| pb::HostRef {
            provider: "test".into(),
            r#ref: format!("i-{id}"),
        }),
        instance_type: "m5.xlarge".into(),
        zone: "z1".into(),
        capacity_type: pb::CapacityType::OnDemand as i32,
        price_per_hour: 0.2,
        interruption_probability: 0.0,
        resources: Some(pb::Resources {
            resources: [
                ("cpu".to_owned(), "4".to_owned()),
                ("memory".to_owned(), "16Gi".to_owned()),
            ]
            .into_iter()
            .collect(),
        }),
        cluster: cluster.to_owned(),
        ..Default::default()
    }
}

/// A need for `cpu` cores on `instance_type` machines at `priority`: the $8 interruption and
/// $0 reclamation penalty buckets, in pieces of at least one core.
pub fn need_on(instance_type: &str, cpu: u32, priority: i32) -> pb::CapacityNeed {
    pb::CapacityNeed {
        requirements: vec![pb::NodeSelectorRequirement {
            key: bigfleet_model::INSTANCE_TYPE_KEY.into(),
            operator: pb::node_selector_requirement::Operator::In as i32,
            values: vec![instance_type.to_owned()],
        }],
        aggregate_resources: [("cpu".to_owned(), cpu.to_string())].into(),
        priority,
        interruption_penalty_bucket: pb::PenaltyBucket::PenaltyBucket8 as i32,
        reclamation_penalty_bucket: pb::PenaltyBucket::Zero as i32,
        min_unit: [("cpu".to_owned(), "1".to_owned())].into(),
        ..Default::default()
    }
}

/// `cluster`'s full-replacement roll-up of `needs`, stamped `at` by the operator, as the
/// gateway forwards it: with no receive time, and not tied to a session (id 0 skips the
/// supersession check; tests of session ordering set `session_id`).
pub fn rollup_request(
    cluster: &str,
    at: i64,
    needs: Vec<pb::CapacityNeed>,
) -> mesh::ApplyRollupRequest {
    mesh::ApplyRollupRequest {
        rollup: Some(pb::ClusterCapacityNeeds {
            cluster_id: cluster.to_owned(),
            timestamp_unix_nanos: at,
            needs,
        }),
        received_at_unix_nanos: 0,
        session_id: 0,
    }
}

/// The provider as a map the test edits, listed in process (no socket), in id order.
/// Clones share the map (and the gate).
#[derive(Clone, Default)]
pub struct MapSource {
    machines: Arc<Mutex<BTreeMap<String, pb::Machine>>>,
    /// When set, every List waits for one of its permits: a slow provider the test
    /// releases call by call.
    gate: Option<Arc<Semaphore>>,
    /// Woken each time a List starts (before it waits at the gate).
    entered: Arc<Notify>,
}

impl MapSource {
    /// An empty provider whose every List waits for a permit of `gate`.
    pub fn gated(gate: Arc<Semaphore>) -> Self {
        MapSource {
            gate: Some(gate),
            ..MapSource::default()
        }
    }

    pub fn put(&self, m: pb::Machine) {
        self.machines.lock().insert(m.id.clone(), m);
    }

    /// The provider no longer lists `id`.
    pub fn remove(&self, id: &str) {
        self.machines.lock().remove(id);
    }

    /// The machine the provider lists as `id`, if any.
    pub fn get(&self, id: &str) -> Option<pb::Machine> {
        self.machines.lock().get(id).cloned()
    }

    /// Changes a machine the provider lists; panics if it lists no `id`.
    pub fn update(&self, id: &str, f: impl FnOnce(&mut pb::Machine)) {
        f(self.machines.lock().get_mut(id).expect("known machine"));
    }

    /// Waits until a List starts (one started before this call counts once).
    pub async fn list_started(&self) {
        self.entered.notified().await;
    }
}

impl FromIterator<pb::Machine> for MapSource {
    fn from_iter<I: IntoIterator<Item = pb::Machine>>(machines: I) -> Self {
        let source = MapSource::default();
        for m in machines {
            source.put(m);
        }
        source
    }
}

impl MachineSource for MapSource {
    fn list(&self, _since: Vec<u8>) -> BoxFuture<'_, Result<RawMachineList, tonic::Status>> {
        Box::pin(async move {
            self.entered.notify_one();
            if let Some(gate) = &self.gate {
                gate.acquire().await.expect("gate open").forget();
            }
            let list = pb::MachineList {
                machines: self.machines.lock().values().cloned().collect(),
                revision: Vec::new(),
            };
            Ok(RawMachineList::from(&list))
        })
    }
}

/// A decide over `source` for tests that look at decide's own state, on the wall clock;
/// see [`decide_on_clock`].
pub fn decide(cfg: DecideConfig, source: Arc<impl MachineSource>) -> Decide {
    decide_on_clock(cfg, source, Arc::new(crate::shard::system_clock))
}

/// A decide over `source` whose clock is `clock` (UNIX nanos), for tests that look at
/// decide's own state: nobody reads its session frames (they queue one deep and are
/// dropped), its metrics are in no registry, and it is not ready before its first
/// reconcile. Panics if the config is refused: the test is wrong then.
pub fn decide_on_clock(cfg: DecideConfig, source: Arc<impl MachineSource>, clock: Clock) -> Decide {
    let (publisher, _) = Publisher::channel(1);
    Decide::with_clock(
        cfg,
        source,
        publisher,
        ShardMetrics::unregistered(),
        Readiness::not_ready("test"),
        clock,
    )
    .expect("decide")
}

/// An execute worker on a Work stream. Panics when the stream cannot be sent to: a test
/// whose decide went away has failed anyway.
pub struct TestWorker {
    tx: mpsc::Sender<mesh::WorkerMessage>,
    items: tonic::Streaming<mesh::WorkItem>,
}

impl TestWorker {
    /// Opens the stream and says hello as `worker_id` of `shard_id` (empty: any shard).
    pub async fn connect(
        client: &mut WorkClient<Channel>,
        worker_id: &str,
        shard_id: &str,
    ) -> TestWorker {
        let (tx, rx) = mpsc::channel(64);
        // Hello goes first, queued before the stream opens: decide reads it before it
        // answers the call.
        let hello = mesh::worker_message::Hello {
            worker_id: worker_id.to_owned(),
            shard_id: shard_id.to_owned(),
        };
        tx.send(mesh::WorkerMessage {
            msg: Some(mesh::worker_message::Msg::Hello(hello)),
        })
        .await
        .expect("fresh channel");
        let items = client
            .pull(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("work stream")
            .into_inner();
        TestWorker { tx, items }
    }

    /// Asks for `n` more items.
    pub async fn credit(&self, n: u32) {
        self.send(mesh::worker_message::Msg::Credit(
            mesh::worker_message::Credit { n },
        ))
        .await;
    }

    /// Reports an action finished with `outcome`.
    pub async fn done(&self, action_id: &str, outcome: &str) {
        self.send(mesh::worker_message::Msg::Done(
            mesh::worker_message::Done {
                action_id: action_id.to_owned(),
                outcome: outcome.to_owned(),
                detail: String::new(),
                elapsed_ms: 1,
            },
        ))
        .await;
    }

    /// The next item, or None if none arrives within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<mesh::WorkItem> {
        tokio::time::timeout(wait, self.items.message())
            .await
            .ok()
            .and_then(|r| r.ok().flatten())
    }

    async fn send(&self, msg: mesh::worker_message::Msg) {
        self.tx
            .send(mesh::WorkerMessage { msg: Some(msg) })
            .await
            .expect("work stream open");
    }
}
