//! The flows against in-memory fakes: the decide and gateway doubles and a
//! tiny provider with per-(shard, machine) fencing marks.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_fencing::{FencingToken, HighWaterMarks};
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use super::*;
use crate::doubles::fixtures::{self, machine, release as release_action};
use crate::doubles::{BlobScript, DecideDouble, GatewayDouble};
use crate::links::ProviderLink;

// ---- a tiny provider ----------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct Call {
    rpc: &'static str,
    machine: String,
    epoch: i64,
    sequence: i64,
}

#[derive(Default)]
struct PState {
    machines: HashMap<String, pb::Machine>,
    marks: HighWaterMarks,
    asynchronous: HashSet<&'static str>,
    delete_unimplemented: bool,
    bad_create_ack: bool,
    /// Acks of an rpc that report this state and last error, whatever the
    /// machine became.
    forced_acks: HashMap<&'static str, (pb::MachineState, &'static str)>,
    errors: HashMap<(String, &'static str), VecDeque<Status>>,
    latency: Duration,
    calls: Vec<Call>,
    blobs: Vec<Vec<u8>>,
    metadata: Vec<std::collections::BTreeMap<String, String>>,
}

#[derive(Default)]
struct FakeProvider {
    st: Mutex<PState>,
}

impl FakeProvider {
    fn seed(&self, m: &pb::Machine) {
        self.st.lock().machines.insert(m.id.clone(), m.clone());
    }

    fn calls(&self) -> Vec<Call> {
        self.st.lock().calls.clone()
    }

    fn fail_next(&self, id: &str, rpc: &'static str, status: Status) {
        self.st
            .lock()
            .errors
            .entry((id.to_owned(), rpc))
            .or_default()
            .push_back(status);
    }

    fn state(&self, id: &str) -> i32 {
        self.st.lock().machines[id].state
    }

    async fn op(
        &self,
        rpc: &'static str,
        id: &str,
        token: (&str, i64, i64),
        apply: impl FnOnce(&mut pb::Machine, bool) -> Result<(), Status>,
    ) -> Result<pb::TransitionAck, Status> {
        let latency = self.st.lock().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut st = self.st.lock();
        st.calls.push(Call {
            rpc,
            machine: id.to_owned(),
            epoch: token.1,
            sequence: token.2,
        });
        // The fence runs before anything else, as the contract demands.
        let tok = FencingToken::new(token.0, token.1 as u64, token.2 as u64);
        st.marks
            .check_and_record(id, &tok)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        if let Some(s) = st
            .errors
            .get_mut(&(id.to_owned(), rpc))
            .and_then(VecDeque::pop_front)
        {
            return Err(s);
        }
        let asynchronous = st.asynchronous.contains(rpc);
        let bad = rpc == "create" && st.bad_create_ack;
        let forced = st.forced_acks.get(rpc).copied();
        let m = st
            .machines
            .get_mut(id)
            .ok_or_else(|| Status::not_found(format!("no machine {id}")))?;
        apply(m, asynchronous)?;
        let mut snap = m.clone();
        if bad {
            snap.price_per_hour = -1.0;
        }
        if let Some((state, last_error)) = forced {
            snap.state = state as i32;
            snap.last_error = last_error.to_owned();
        }
        Ok(pb::TransitionAck {
            operation_id: format!("op-{rpc}-{id}"),
            machine: Some(snap),
        })
    }
}

fn expect(m: &pb::Machine, states: &[pb::MachineState]) -> Result<(), Status> {
    if states.iter().any(|s| *s as i32 == m.state) {
        Ok(())
    } else {
        Err(Status::internal(format!(
            "invalid transition from state {}",
            m.state
        )))
    }
}

impl FakeProvider {
    /// [`FakeProvider::op`] for a mutation that takes a machine in `from` to `pending`
    /// when the rpc is asynchronous, else to `done`; `effect` makes the provider's other
    /// changes.
    async fn transit(
        &self,
        rpc: &'static str,
        id: &str,
        token: (&str, i64, i64),
        [from, pending, done]: [pb::MachineState; 3],
        effect: impl FnOnce(&mut pb::Machine, bool),
    ) -> Result<pb::TransitionAck, Status> {
        self.op(rpc, id, token, |m, asy| {
            expect(m, &[from])?;
            m.state = if asy { pending } else { done } as i32;
            effect(m, asy);
            Ok(())
        })
        .await
    }
}

impl ProviderLink for FakeProvider {
    async fn create(
        &self,
        req: pb::CreateRequest,
        _: Duration,
    ) -> Result<pb::TransitionAck, Status> {
        use pb::MachineState::*;
        let token = (req.shard_id.as_str(), req.shard_epoch, req.sequence_number);
        self.transit(
            "create",
            &req.machine_id,
            token,
            [Speculative, Creating, Idle],
            |m, asy| {
                if !asy {
                    m.host = Some(pb::HostRef {
                        provider: "fake".into(),
                        r#ref: m.id.clone(),
                    });
                }
            },
        )
        .await
    }

    async fn configure(
        &self,
        req: pb::ConfigureRequest,
        _: Duration,
    ) -> Result<pb::TransitionAck, Status> {
        use pb::MachineState::*;
        {
            let mut st = self.st.lock();
            st.blobs.push(req.bootstrap_blob.clone());
            st.metadata.push(req.shard_metadata.clone());
        }
        let token = (req.shard_id.as_str(), req.shard_epoch, req.sequence_number);
        self.transit(
            "configure",
            &req.machine_id,
            token,
            [Idle, Configuring, Configured],
            |m, _| {
                m.cluster.clone_from(&req.cluster_id);
                m.shard_metadata.clone_from(&req.shard_metadata);
            },
        )
        .await
    }

    async fn drain(&self, req: pb::DrainRequest, _: Duration) -> Result<pb::TransitionAck, Status> {
        use pb::MachineState::*;
        let token = (req.shard_id.as_str(), req.shard_epoch, req.sequence_number);
        self.transit(
            "drain",
            &req.machine_id,
            token,
            [Configured, Draining, Idle],
            |m, asy| {
                if !asy {
                    m.cluster.clear();
                    m.shard_metadata.clear();
                }
            },
        )
        .await
    }

    async fn delete(
        &self,
        req: pb::DeleteRequest,
        _: Duration,
    ) -> Result<pb::TransitionAck, Status> {
        use pb::MachineState::*;
        let token = (req.shard_id.as_str(), req.shard_epoch, req.sequence_number);
        if self.st.lock().delete_unimplemented {
            // Still through `op`: the fence runs first and the call is recorded.
            return self
                .op("delete", &req.machine_id, token, |_, _| {
                    Err(Status::unimplemented("bare metal cannot be deleted"))
                })
                .await;
        }
        self.transit(
            "delete",
            &req.machine_id,
            token,
            [Idle, Deleting, Speculative],
            |m, asy| {
                if !asy {
                    m.host = None;
                }
            },
        )
        .await
    }
}

// ---- fixtures -----------------------------------------------------------

const FP: &str = fixtures::NEED_FINGERPRINT;

/// The shared acquire item with a gang group and an unbounded reclamation
/// penalty, which the assignment must carry through to decide and the
/// provider's metadata.
fn acquire(kind: mesh::ActionKind, id: &str, cluster: &str) -> mesh::Action {
    mesh::Action {
        group: "topology.bigfleet/rack\u{0}gang-7".to_owned(),
        reclamation_penalty_dollars: f64::INFINITY,
        ..fixtures::acquire(kind, id, cluster)
    }
}

fn drain_action(kind: mesh::ActionKind, id: &str, cluster: &str, preemptor: i32) -> mesh::Action {
    mesh::Action {
        grace_seconds: 30,
        ..fixtures::drain(kind, id, cluster, preemptor)
    }
}

struct Harness {
    decide: DecideDouble,
    gateway: GatewayDouble,
    provider: Arc<FakeProvider>,
    ex: Executor<DecideDouble, GatewayDouble, Arc<FakeProvider>>,
}

fn harness_with(cfg: ExecConfig) -> Harness {
    let decide = DecideDouble::new("shard-a", 3);
    let gateway = GatewayDouble::new(BlobScript::blob(b"#cloud-config join"));
    let provider = Arc::new(FakeProvider::default());
    let ex = Executor::new(
        decide.clone(),
        gateway.clone(),
        Arc::clone(&provider),
        ExecuteMetrics::detached(),
        cfg,
    );
    Harness {
        decide,
        gateway,
        provider,
        ex,
    }
}

fn harness() -> Harness {
    harness_with(fixtures::fast_exec())
}

impl Harness {
    fn seed(&self, m: pb::Machine) {
        self.decide.insert_machine(&m).unwrap();
        self.provider.seed(&m);
    }

    async fn run(&self, action: mesh::Action) -> Report {
        self.decide.enqueue(action);
        let item = self.decide.take_work().expect("queued work");
        let report = self.ex.execute(item, CancellationToken::new()).await;
        self.decide.finish(report.done());
        report
    }

    fn edges(&self) -> Vec<(MachineState, MachineState, Result<(), Code>)> {
        self.decide
            .transitions()
            .iter()
            .map(|t| {
                let (a, b) = t.edge();
                (a, b, t.result)
            })
            .collect()
    }

    fn state(&self, id: &str) -> MachineState {
        self.decide.state_of(id).unwrap()
    }

    fn last_error(&self, id: &str) -> String {
        self.decide.machine(id).unwrap().last_error
    }

    /// Actions of `kind` that ended with `outcome`.
    fn outcomes(&self, kind: ActionKind, outcome: Outcome) -> u64 {
        self.ex.metrics().outcome_count(Some(kind), outcome)
    }

    /// Makes the provider acknowledge every `rpc` with `state` and `last_error`.
    fn force_ack(&self, rpc: &'static str, state: pb::MachineState, last_error: &'static str) {
        self.provider
            .st
            .lock()
            .forced_acks
            .insert(rpc, (state, last_error));
    }
}

use MachineState::*;

/// Most tests act on machine `m1` for cluster `c1`.
fn provision() -> mesh::Action {
    acquire(mesh::ActionKind::Provision, "m1", "c1")
}

fn bootstrap() -> mesh::Action {
    acquire(mesh::ActionKind::Bootstrap, "m1", "c1")
}

fn reclaim() -> mesh::Action {
    drain_action(mesh::ActionKind::Reclaim, "m1", "c1", 0)
}

/// The transitions decide records for a machine walking `path`, each one accepted.
fn accepted(path: &[MachineState]) -> Vec<(MachineState, MachineState, Result<(), Code>)> {
    path.windows(2).map(|w| (w[0], w[1], Ok(()))).collect()
}

impl Harness {
    /// Seeds `seeded` with decide and the provider, then runs `action`.
    async fn run_seeded(&self, seeded: pb::Machine, action: mesh::Action) -> Report {
        self.seed(seeded);
        self.run(action).await
    }

    /// Hands `action` out and lets `edit` spoil the work item before it is executed.
    async fn run_edited(
        &self,
        action: mesh::Action,
        edit: impl FnOnce(&mut mesh::WorkItem),
    ) -> Report {
        self.decide.enqueue(action);
        let mut item = self.decide.take_work().expect("queued work");
        edit(&mut item);
        self.ex.execute(item, CancellationToken::new()).await
    }
}

// ---- provision ----------------------------------------------------------

#[tokio::test]
async fn provision_creates_then_bootstraps_to_configured() {
    let h = harness();
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(r.kind, Some(ActionKind::Provision));
    assert_eq!(
        h.edges(),
        accepted(&[Speculative, Creating, Idle, Configuring, Configured])
    );
    let t = h.decide.transitions();
    // ADR-0052: need and group stamped at Creating.
    assert_eq!(t[0].patch.assigned_need_fingerprint.as_deref(), Some(FP));
    assert_eq!(
        t[0].patch.assigned_group.as_deref(),
        Some("topology.bigfleet/rack\u{0}gang-7")
    );
    // The Idle ack's host and provider view travel to decide.
    assert_eq!(t[1].patch.host.as_ref().unwrap().r#ref, "m1");
    assert!(t[1].patch.provider_view.is_some());
    // Cluster stamped early at Configuring; priority and penalties at Configured.
    assert_eq!(t[2].patch.cluster.as_deref(), Some("c1"));
    assert_eq!(t[3].patch.assigned_priority, Some(500));
    assert_eq!(t[3].patch.assigned_interruption_penalty_dollars, Some(8.0));
    assert_eq!(
        t[3].patch.assigned_reclamation_penalty_dollars,
        Some(f64::INFINITY)
    );
    let m = h.decide.machine("m1").unwrap();
    assert_eq!(m.cluster, "c1");
    assert_eq!(m.host.unwrap().r#ref, "m1");
    // One action, one window: create at base, configure at base + 1.
    let calls = h.provider.calls();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.rpc, c.epoch, c.sequence))
            .collect::<Vec<_>>(),
        [("create", 3, 65_536), ("configure", 3, 65_537)]
    );
    assert_eq!(h.gateway.bootstraps().len(), 1);
    assert_eq!(h.gateway.bootstraps()[0].need_fingerprint, FP);
    assert_eq!(h.ex.metrics().configure_phase.get_sample_count(), 1);
    assert_eq!(h.ex.metrics().request_bootstrap.get_sample_count(), 1);
    assert_eq!(h.outcomes(ActionKind::Provision, Outcome::Success), 1);
    assert_eq!(h.ex.metrics().inflight.get(), 0);
}

#[tokio::test]
async fn provision_leaves_an_asynchronous_create_to_reconcile() {
    let h = harness();
    h.provider.st.lock().asynchronous.insert("create");
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert!(r.detail.contains("reconcile"), "{}", r.detail);
    assert_eq!(h.edges(), accepted(&[Speculative, Creating]));
    assert_eq!(h.state("m1"), Creating);
    assert!(h.gateway.bootstraps().is_empty());
}

#[tokio::test]
async fn a_create_ack_with_bad_cost_fields_fails_the_machine() {
    let h = harness();
    h.provider.st.lock().bad_create_ack = true;
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::ProviderError);
    assert_eq!(h.edges(), accepted(&[Speculative, Creating, Failed]));
    assert_eq!(h.state("m1"), Failed);
    let err = h.last_error("m1");
    assert!(err.starts_with("create: invalid acknowledgement"), "{err}");
    assert!(err.contains("price"), "{err}");
}

/// A provider error on any leg (create, configure, drain) fails the machine at once:
/// INTERNAL is not retryable, and the error is what decide records.
#[tokio::test]
async fn a_provider_failure_on_any_leg_fails_the_machine_without_retrying() {
    let cases = [
        (
            machine("m1", Speculative, ""),
            provision(),
            ("create", "out of capacity"),
            Outcome::ProviderError,
            [Speculative, Creating, Failed],
        ),
        (
            machine("m1", Idle, ""),
            bootstrap(),
            ("configure", "image pull failed"),
            Outcome::ConfigureError,
            [Idle, Configuring, Failed],
        ),
        (
            machine("m1", Configured, "c1"),
            reclaim(),
            ("drain", "pdb blocked"),
            Outcome::ProviderError,
            [Configured, Draining, Failed],
        ),
    ];
    for (seeded, action, (rpc, error), outcome, path) in cases {
        let h = harness();
        h.provider.fail_next("m1", rpc, Status::internal(error));
        let r = h.run_seeded(seeded, action).await;
        assert_eq!(r.outcome, outcome, "{rpc}");
        assert_eq!(h.edges(), accepted(&path), "{rpc}");
        assert_eq!(h.state("m1"), Failed, "{rpc}");
        assert_eq!(h.last_error("m1"), format!("{rpc}: {error}"));
        assert_eq!(
            h.provider.calls().len(),
            1,
            "{rpc}: INTERNAL is not retryable"
        );
    }
}

#[tokio::test]
async fn transport_errors_are_retried_with_a_fresh_sequence_each_time() {
    let h = harness();
    h.provider
        .fail_next("m1", "create", Status::unavailable("connection reset"));
    h.provider
        .fail_next("m1", "create", Status::deadline_exceeded("slow"));
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    let seqs: Vec<_> = h
        .provider
        .calls()
        .iter()
        .map(|c| (c.rpc, c.sequence))
        .collect();
    assert_eq!(
        seqs,
        [
            ("create", 65_536),
            ("create", 65_537),
            ("create", 65_538),
            ("configure", 65_539)
        ]
    );
    assert_eq!(
        h.ex.metrics()
            .provider_retries
            .with_label_values(&["create"])
            .get(),
        2
    );
}

/// A harness with `m1` speculative and each of its next four creates refused as unavailable.
fn creates_unavailable() -> Harness {
    let h = harness();
    h.seed(machine("m1", Speculative, ""));
    for _ in 0..4 {
        h.provider
            .fail_next("m1", "create", Status::unavailable("down"));
    }
    h
}

#[tokio::test]
async fn retries_give_up_and_fail_the_machine() {
    let h = creates_unavailable();
    let r = h.run(provision()).await;
    assert_eq!(r.outcome, Outcome::ProviderError);
    assert_eq!(h.provider.calls().len(), 4);
    assert_eq!(
        h.last_error("m1"),
        "create: down (gave up after 4 attempts)"
    );
}

#[tokio::test]
async fn the_sequence_window_is_never_overrun() {
    let h = creates_unavailable();
    let r = h
        .run_edited(provision(), |item| {
            let f = item.fencing.as_mut().unwrap();
            f.sequence_limit = f.sequence_base + 2;
        })
        .await;
    assert_eq!(r.outcome, Outcome::Other);
    assert_eq!(
        h.provider.calls().len(),
        2,
        "only two numbers in the window"
    );
    assert!(
        h.last_error("m1").contains("exhausted"),
        "{}",
        h.last_error("m1")
    );
}

#[tokio::test]
async fn a_zombie_epoch_is_fenced_logged_and_never_retried() {
    let h = harness();
    // A newer incarnation of the shard (epoch 4) already touched the machine.
    h.provider
        .st
        .lock()
        .marks
        .check_and_record("m1", &FencingToken::new("shard-a", 4, 1))
        .unwrap();
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::Fenced);
    assert_eq!(h.provider.calls().len(), 1);
    assert_eq!(h.state("m1"), Failed);
    assert!(
        h.last_error("m1").starts_with("create: fenced:"),
        "{}",
        h.last_error("m1")
    );
    assert_eq!(h.outcomes(ActionKind::Provision, Outcome::Fenced), 1);
}

// ---- bootstrap ----------------------------------------------------------

#[tokio::test]
async fn bootstrap_configures_with_the_blob_and_the_five_metadata_keys() {
    let h = harness();
    let r = h.run_seeded(machine("m1", Idle, ""), bootstrap()).await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(h.edges(), accepted(&[Idle, Configuring, Configured]));
    let st = h.provider.st.lock();
    assert_eq!(st.blobs, [b"#cloud-config join".to_vec()]);
    let md = &st.metadata[0];
    assert_eq!(md.len(), 5);
    assert_eq!(md["bigfleet.lucy.sh/assigned-priority"], "500");
    assert_eq!(
        md["bigfleet.lucy.sh/assigned-interruption-penalty-dollars"],
        "8"
    );
    assert_eq!(
        md["bigfleet.lucy.sh/assigned-reclamation-penalty-dollars"],
        "+Inf"
    );
    assert_eq!(md["bigfleet.lucy.sh/assigned-need-fingerprint"], FP);
    assert_eq!(
        md["bigfleet.lucy.sh/assigned-group"],
        "topology.bigfleet/rack\u{0}gang-7"
    );
    drop(st);
    assert_eq!(h.state("m1"), Configured);
    let held = h.decide.machine("m1").unwrap();
    assert_eq!(
        held.shard_metadata["bigfleet.lucy.sh/assigned-priority"],
        "500"
    );
    assert_eq!(h.gateway.bootstraps()[0].requirements, 1);
}

#[tokio::test]
async fn bootstrap_of_a_machine_already_configured_for_the_need_is_success_without_calls() {
    let h = harness();
    let r = h
        .run_seeded(machine("m1", Configured, "c1"), bootstrap())
        .await;
    assert_eq!(r.outcome, Outcome::Success);
    assert!(h.edges().is_empty());
    assert!(h.provider.calls().is_empty());
    assert!(h.gateway.bootstraps().is_empty());
    // Configured for another cluster is not "done": decide is out of date.
    let r = h
        .run_seeded(
            machine("m2", Configured, "other"),
            acquire(mesh::ActionKind::Bootstrap, "m2", "c1"),
        )
        .await;
    assert_eq!(r.outcome, Outcome::StaleState);
    assert_eq!(
        r.detail,
        "bootstrap needs an idle machine, decide handed out one in configured"
    );
    assert!(h.provider.calls().is_empty());
}

#[tokio::test]
async fn an_asynchronous_configure_stays_configuring() {
    let h = harness();
    h.provider.st.lock().asynchronous.insert("configure");
    let r = h.run_seeded(machine("m1", Idle, ""), bootstrap()).await;
    assert_eq!(r.outcome, Outcome::Success);
    assert_eq!(h.edges(), accepted(&[Idle, Configuring]));
    assert_eq!(h.state("m1"), Configuring);
    assert_eq!(h.ex.metrics().configure_phase.get_sample_count(), 0);
}

/// Every way of not getting a blob rolls the machine back to Idle with the provider never
/// touched; each ends with its outcome and, where given, says why in the report.
#[tokio::test]
async fn a_missing_blob_rolls_back_to_idle() {
    let cases = [
        (BlobScript::Timeout, Outcome::BlobError, None),
        // Our own clock cuts a hung gateway off.
        (BlobScript::Hang, Outcome::BlobError, Some("no answer")),
        (BlobScript::NoSession, Outcome::NoSession, None),
        // An operator error is not the hardware's fault.
        (
            BlobScript::OperatorError("no template for gpu".into()),
            Outcome::BlobError,
            Some("no template for gpu"),
        ),
        (
            BlobScript::Fail(Code::Unavailable),
            Outcome::BlobError,
            None,
        ),
    ];
    for (script, outcome, says) in cases {
        let case = format!("{script:?}");
        let h = harness();
        h.gateway.script("c1", script);
        let r = h.run_seeded(machine("m1", Idle, ""), bootstrap()).await;
        assert_eq!(r.outcome, outcome, "{case}: {}", r.detail);
        if let Some(says) = says {
            assert!(r.detail.contains(says), "{case}: {}", r.detail);
        }
        assert_eq!(h.edges(), accepted(&[Idle, Configuring, Idle]), "{case}");
        assert_eq!(h.state("m1"), Idle, "{case}");
        assert!(h.decide.machine("m1").unwrap().cluster.is_empty(), "{case}");
        assert!(
            h.provider.calls().is_empty(),
            "{case}: the provider is never touched"
        );
        // The gateway was told how long to wait.
        assert_eq!(h.gateway.bootstraps()[0].timeout_ms, 300, "{case}");
    }
}

// ---- reclaim / preempt --------------------------------------------------

#[tokio::test]
async fn reclaim_instructs_the_operator_then_drains_to_idle() {
    let h = harness();
    let r = h
        .run_seeded(machine("m1", Configured, "c1"), reclaim())
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    let reclaims = h.gateway.reclaims();
    assert_eq!(reclaims.len(), 1);
    assert_eq!(reclaims[0].request.cluster_id, "c1");
    assert_eq!(reclaims[0].request.nodes, ["m1"]);
    assert_eq!(reclaims[0].request.grace_period_seconds, 30);
    assert_eq!(h.edges(), accepted(&[Configured, Draining, Idle]));
    let m = h.decide.machine("m1").unwrap();
    assert!(m.cluster.is_empty() && m.shard_metadata.is_empty());
    assert_eq!(h.ex.metrics().drain_phase.get_sample_count(), 1);
    assert_eq!(h.provider.calls()[0].rpc, "drain");
}

#[tokio::test]
async fn preempt_with_an_asynchronous_drain_is_left_draining() {
    let h = harness();
    h.provider.st.lock().asynchronous.insert("drain");
    h.gateway.set_reclaim_delivered(false);
    let r = h
        .run_seeded(
            machine("m1", Configured, "c1"),
            drain_action(mesh::ActionKind::Preempt, "m1", "c1", 1_000_000),
        )
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(
        h.gateway.reclaims()[0].request.preemptor_priority,
        1_000_000
    );
    assert_eq!(h.edges(), accepted(&[Configured, Draining]));
    assert_eq!(h.state("m1"), Draining);
    assert_eq!(h.ex.metrics().drain_phase.get_sample_count(), 0);
}

// ---- release ------------------------------------------------------------

#[tokio::test]
async fn release_deletes_back_to_speculative() {
    let h = harness();
    let r = h
        .run_seeded(machine("m1", Idle, ""), release_action("m1"))
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(r.kind, Some(ActionKind::Release));
    assert_eq!(h.edges(), accepted(&[Idle, Deleting, Speculative]));
    assert!(h.decide.machine("m1").unwrap().host.is_none());
}

#[tokio::test]
async fn an_unsupported_delete_is_a_contract_violation() {
    let h = harness();
    h.provider.st.lock().delete_unimplemented = true;
    let r = h
        .run_seeded(machine("m1", Idle, ""), release_action("m1"))
        .await;
    assert_eq!(r.outcome, Outcome::ProviderError);
    assert_eq!(h.edges(), accepted(&[Idle, Deleting, Failed]));
    assert!(
        h.last_error("m1")
            .starts_with("delete: not supported by the provider (contract violation)"),
        "{}",
        h.last_error("m1")
    );
    assert_eq!(h.provider.calls().len(), 1, "never retried");
    assert_eq!(h.outcomes(ActionKind::Release, Outcome::ProviderError), 1);
}

// ---- reading acknowledgements -------------------------------------------

#[tokio::test]
async fn an_ack_still_in_the_from_state_is_left_to_reconcile() {
    let h = harness();
    h.force_ack("configure", pb::MachineState::Idle, "");
    let r = h.run_seeded(machine("m1", Idle, ""), bootstrap()).await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(
        r.detail,
        "configure accepted as \"op-configure-m1\", provider still configuring; reconcile \
         completes it"
    );
    assert_eq!(h.edges(), accepted(&[Idle, Configuring]));
    assert_eq!(h.ex.metrics().configure_phase.get_sample_count(), 0);
}

/// An acknowledgement the flow cannot use fails the machine from the leg's `via` state
/// with the provider's error, or with what was wrong with the answer.
#[tokio::test]
async fn an_ack_reporting_failed_or_an_unexpected_state_fails_the_machine() {
    let cases = [
        (
            ("create", pb::MachineState::Failed, "out of quota"),
            machine("m1", Speculative, ""),
            provision(),
            [Speculative, Creating, Failed],
            "create: out of quota",
        ),
        (
            ("delete", pb::MachineState::Creating, ""),
            machine("m1", Idle, ""),
            release_action("m1"),
            [Idle, Deleting, Failed],
            "delete: provider acknowledged in unexpected state creating",
        ),
    ];
    for ((rpc, state, last_error), seeded, action, path, recorded) in cases {
        let h = harness();
        h.force_ack(rpc, state, last_error);
        let r = h.run_seeded(seeded, action).await;
        assert_eq!(r.outcome, Outcome::ProviderError, "{rpc}");
        assert_eq!(h.edges(), accepted(&path), "{rpc}");
        assert_eq!(h.last_error("m1"), recorded);
        assert!(h.gateway.bootstraps().is_empty(), "{rpc}");
    }
}

// ---- decide's verdicts, bad items, time ---------------------------------

#[tokio::test]
async fn decide_refusals_map_to_outcomes() {
    let h = harness();
    h.seed(machine("m1", Speculative, ""));
    // Not the machine's action in flight any more: ABORTED ⇒ stale_state.
    let r = h
        .run_edited(provision(), |item| item.action_id = "act-gone".into())
        .await;
    assert_eq!(r.outcome, Outcome::StaleState, "{}", r.detail);
    assert!(h.provider.calls().is_empty());

    // A machine decide does not know: NOT_FOUND ⇒ inventory_miss.
    let ghost = machine("ghost", Idle, "");
    h.provider.seed(&ghost);
    let r = h
        .run_edited(
            acquire(mesh::ActionKind::Bootstrap, "ghost", "c1"),
            |item| item.machine = Some(ghost),
        )
        .await;
    assert_eq!(r.outcome, Outcome::InventoryMiss, "{}", r.detail);
}

/// A flow handed a machine in a state it cannot start from touches nothing and says what
/// it needed.
#[tokio::test]
async fn a_machine_in_the_wrong_state_is_stale() {
    let cases = [
        (
            machine("m1", Idle, ""),
            provision(),
            "provision needs a speculative machine, decide handed out one in idle",
        ),
        (
            machine("m1", Idle, ""),
            reclaim(),
            "reclaim needs a machine configured for c1, decide handed out one in idle for \"\"",
        ),
        (
            machine("m1", Configured, "c1"),
            release_action("m1"),
            "release needs an idle machine, decide handed out one in configured",
        ),
    ];
    for (seeded, action, detail) in cases {
        let h = harness();
        let r = h.run_seeded(seeded, action).await;
        assert_eq!(r.outcome, Outcome::StaleState, "{detail}");
        assert_eq!(r.detail, detail);
        assert!(h.edges().is_empty(), "{detail}");
        assert!(h.provider.calls().is_empty(), "{detail}");
        assert!(h.gateway.reclaims().is_empty(), "{detail}");
    }
}

#[tokio::test]
async fn malformed_items_are_classified_not_executed() {
    let h = harness();
    let mut no_need = bootstrap();
    no_need.need_fingerprint.clear();
    let r = h.run_seeded(machine("m1", Idle, ""), no_need).await;
    assert_eq!(r.outcome, Outcome::MissingProfile);

    let r =
        h.ex.execute(mesh::WorkItem::default(), CancellationToken::new())
            .await;
    assert_eq!(r.outcome, Outcome::Other);
    assert_eq!(r.kind, None);
    assert_eq!(
        h.ex.metrics().outcome_count(None, Outcome::Other),
        1,
        "counted as Unspecified"
    );
    assert!(h.edges().is_empty());
    assert!(h.provider.calls().is_empty());
}

#[tokio::test]
async fn an_action_out_of_time_during_a_provider_call_fails_the_machine() {
    let mut cfg = fixtures::fast_exec();
    cfg.action_timeout = Duration::from_millis(150);
    let h = harness_with(cfg);
    h.provider.st.lock().latency = Duration::from_secs(5);
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::CtxCanceled);
    assert!(r.elapsed < Duration::from_secs(2), "{:?}", r.elapsed);
    assert_eq!(h.state("m1"), Failed);
    assert!(h.last_error("m1").starts_with("create: action timed out"));
}

#[tokio::test]
async fn an_abandoned_action_stops_without_reporting() {
    let h = harness();
    h.provider.st.lock().latency = Duration::from_secs(5);
    h.seed(machine("m1", Speculative, ""));
    h.decide.enqueue(provision());
    let item = h.decide.take_work().unwrap();
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        canceller.cancel();
    });
    let r = h.ex.execute(item, cancel).await;
    assert_eq!(r.outcome, Outcome::CtxCanceled);
    assert!(r.detail.contains("abandoned"), "{}", r.detail);
    // Only the first transition; decide re-derives the machine itself.
    assert_eq!(h.edges(), accepted(&[Speculative, Creating]));
    assert_eq!(h.provider.state("m1"), pb::MachineState::Speculative as i32);
}

#[test]
fn provider_retries_keep_their_policy() {
    // Transport codes only (FAILED_PRECONDITION is fencing and never retried), four
    // attempts, 50 ms doubling to at most 2 s.
    let p = ExecConfig::default().retry;
    assert_eq!(p.max_attempts, 4);
    assert_eq!(p.initial_backoff, Duration::from_millis(50));
    assert_eq!(p.max_backoff, Duration::from_secs(2));
    let retried: Vec<Code> = (0..17)
        .map(Code::from_i32)
        .filter(|c| p.is_retryable(*c))
        .collect();
    assert_eq!(retried, [Code::DeadlineExceeded, Code::Unavailable]);
}

#[test]
fn backoff_grows_caps_and_jitters() {
    let p = RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(300),
        ..RetryPolicy::default()
    };
    for _ in 0..50 {
        let b1 = p.backoff(1);
        assert!(b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100));
        let b2 = p.backoff(2);
        assert!(b2 >= Duration::from_millis(100) && b2 <= Duration::from_millis(200));
        let b9 = p.backoff(9);
        assert!(b9 >= Duration::from_millis(150) && b9 <= Duration::from_millis(300));
    }
}
