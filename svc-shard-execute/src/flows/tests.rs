//! The flows against the shard's doubles (decide and gateway) and the one fake provider,
//! served on a Unix socket and reached through the worker's own gRPC provider link.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_fake_provider::{
    Completion, FakeProvider, Injection, Mark, OpKind, ProviderConfig, ServeOptions, ServerHandle,
    spawn_uds_with,
};
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use super::*;
use crate::doubles::fixtures::{self, machine, release as release_action};
use crate::doubles::{BlobScript, DecideDouble, GatewayDouble};
use crate::links::GrpcProvider;

/// One mutating call the provider received: the operation, the machine and the token.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    rpc: &'static str,
    machine: String,
    epoch: i64,
    sequence: i64,
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
    ex: Executor<DecideDouble, GatewayDouble, GrpcProvider>,
    _server: ServerHandle,
    _dir: TempDir,
}

/// The worker's executor with `cfg`, over a fake provider that waits `latency` before
/// each mutating call.
async fn harness_slow(cfg: ExecConfig, latency: Duration) -> Harness {
    let dir = tempfile::Builder::new()
        .prefix("bf-flows")
        .tempdir()
        .unwrap();
    let decide = DecideDouble::new("shard-a", 3);
    let gateway = GatewayDouble::new(BlobScript::blob(b"#cloud-config join"));
    let provider = Arc::new(FakeProvider::new(ProviderConfig::default()));
    let opts = ServeOptions {
        rpc_latency: latency,
        ..ServeOptions::default()
    };
    let server = spawn_uds_with(&dir.path().join("provider.sock"), provider.clone(), opts)
        .await
        .unwrap();
    let link = GrpcProvider::new(crate::connect::channel(&server.target(), None, None).unwrap());
    let ex = Executor::new(
        decide.clone(),
        gateway.clone(),
        link,
        ExecuteMetrics::detached(),
        cfg,
    );
    Harness {
        decide,
        gateway,
        provider,
        ex,
        _server: server,
        _dir: dir,
    }
}

async fn harness_with(cfg: ExecConfig) -> Harness {
    harness_slow(cfg, Duration::ZERO).await
}

async fn harness() -> Harness {
    harness_with(fixtures::fast_exec()).await
}

impl Harness {
    fn seed(&self, m: pb::Machine) {
        self.decide.insert_machine(&m).unwrap();
        self.provider.add_machine(m).unwrap();
    }

    /// The provider's mutating calls so far, fenced and refused ones included.
    fn calls(&self) -> Vec<Call> {
        self.provider
            .mutation_calls()
            .into_iter()
            .map(|c| Call {
                rpc: c.op.as_str(),
                machine: c.machine_id,
                epoch: c.epoch,
                sequence: c.sequence,
            })
            .collect()
    }

    /// The provider's next `rpc` call on `m1` fails with `code`.
    fn fail_next(&self, rpc: OpKind, code: Code, message: &str) {
        self.provider.fail_next(
            "m1",
            rpc,
            Injection::Reject {
                code,
                message: message.to_owned(),
            },
        );
    }

    /// The provider's `rpc` calls complete only later (an asynchronous provider).
    fn asynchronous(&self, rpc: OpKind) {
        self.provider
            .update_config(|c| c.transitions.set(rpc, Completion::Staged));
    }

    fn provider_state(&self, id: &str) -> pb::MachineState {
        pb::MachineState::try_from(self.provider.get(id).unwrap().state).unwrap()
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

    /// Makes the provider acknowledge the next `rpc` on `m1` with `state` and `last_error`,
    /// whatever the machine became.
    fn force_ack(&self, rpc: OpKind, state: pb::MachineState, last_error: &str) {
        self.provider.fail_next(
            "m1",
            rpc,
            Injection::Ack {
                state,
                last_error: last_error.to_owned(),
            },
        );
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
    let h = harness().await;
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
    let calls = h.calls();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.rpc, c.machine.as_str(), c.epoch, c.sequence))
            .collect::<Vec<_>>(),
        [("create", "m1", 3, 65_536), ("configure", "m1", 3, 65_537)]
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
    let h = harness().await;
    h.asynchronous(OpKind::Create);
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
    let h = harness().await;
    h.seed(machine("m1", Speculative, ""));
    // The provider's record (and so its acknowledgement) carries a price no machine has.
    h.provider
        .update_machine("m1", |m| m.price_per_hour = -1.0)
        .unwrap();
    let r = h.run(provision()).await;
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
            (OpKind::Create, "out of capacity"),
            Outcome::ProviderError,
            [Speculative, Creating, Failed],
        ),
        (
            machine("m1", Idle, ""),
            bootstrap(),
            (OpKind::Configure, "image pull failed"),
            Outcome::ConfigureError,
            [Idle, Configuring, Failed],
        ),
        (
            machine("m1", Configured, "c1"),
            reclaim(),
            (OpKind::Drain, "pdb blocked"),
            Outcome::ProviderError,
            [Configured, Draining, Failed],
        ),
    ];
    for (seeded, action, (rpc, error), outcome, path) in cases {
        let h = harness().await;
        h.fail_next(rpc, Code::Internal, error);
        let r = h.run_seeded(seeded, action).await;
        assert_eq!(r.outcome, outcome, "{rpc}");
        assert_eq!(h.edges(), accepted(&path), "{rpc}");
        assert_eq!(h.state("m1"), Failed, "{rpc}");
        assert_eq!(h.last_error("m1"), format!("{rpc}: {error}"));
        assert_eq!(h.calls().len(), 1, "{rpc}: INTERNAL is not retryable");
    }
}

#[tokio::test]
async fn transport_errors_are_retried_with_a_fresh_sequence_each_time() {
    let h = harness().await;
    h.fail_next(OpKind::Create, Code::Unavailable, "connection reset");
    h.fail_next(OpKind::Create, Code::DeadlineExceeded, "slow");
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    let seqs: Vec<_> = h.calls().iter().map(|c| (c.rpc, c.sequence)).collect();
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
async fn creates_unavailable() -> Harness {
    let h = harness().await;
    h.seed(machine("m1", Speculative, ""));
    for _ in 0..4 {
        h.fail_next(OpKind::Create, Code::Unavailable, "down");
    }
    h
}

#[tokio::test]
async fn retries_give_up_and_fail_the_machine() {
    let h = creates_unavailable().await;
    let r = h.run(provision()).await;
    assert_eq!(r.outcome, Outcome::ProviderError);
    assert_eq!(h.calls().len(), 4);
    assert_eq!(
        h.last_error("m1"),
        "create: down (gave up after 4 attempts)"
    );
}

#[tokio::test]
async fn the_sequence_window_is_never_overrun() {
    let h = creates_unavailable().await;
    let r = h
        .run_edited(provision(), |item| {
            let f = item.fencing.as_mut().unwrap();
            f.sequence_limit = f.sequence_base + 2;
        })
        .await;
    assert_eq!(r.outcome, Outcome::Other);
    assert_eq!(h.calls().len(), 2, "only two numbers in the window");
    assert!(
        h.last_error("m1").contains("exhausted"),
        "{}",
        h.last_error("m1")
    );
}

#[tokio::test]
async fn a_zombie_epoch_is_fenced_logged_and_never_retried() {
    let h = harness().await;
    // A newer incarnation of the shard (epoch 4) already touched the machine.
    let newer = Mark {
        epoch: 4,
        sequence: 1,
    };
    h.provider.record_fence("shard-a", "m1", newer).unwrap();
    let r = h
        .run_seeded(machine("m1", Speculative, ""), provision())
        .await;
    assert_eq!(r.outcome, Outcome::Fenced);
    assert_eq!(h.calls().len(), 1);
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
    let h = harness().await;
    let r = h.run_seeded(machine("m1", Idle, ""), bootstrap()).await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(h.edges(), accepted(&[Idle, Configuring, Configured]));
    let blobs: Vec<_> = h
        .provider
        .mutation_calls()
        .into_iter()
        .map(|c| c.bootstrap_blob)
        .collect();
    assert_eq!(blobs, [b"#cloud-config join".to_vec()]);
    let md = &h.provider.get("m1").unwrap().shard_metadata;
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
    let h = harness().await;
    let r = h
        .run_seeded(machine("m1", Configured, "c1"), bootstrap())
        .await;
    assert_eq!(r.outcome, Outcome::Success);
    assert!(h.edges().is_empty());
    assert!(h.calls().is_empty());
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
    assert!(h.calls().is_empty());
}

#[tokio::test]
async fn an_asynchronous_configure_stays_configuring() {
    let h = harness().await;
    h.asynchronous(OpKind::Configure);
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
        let h = harness().await;
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
            h.calls().is_empty(),
            "{case}: the provider is never touched"
        );
        // The gateway was told how long to wait.
        assert_eq!(h.gateway.bootstraps()[0].timeout_ms, 300, "{case}");
    }
}

// ---- reclaim / preempt --------------------------------------------------

#[tokio::test]
async fn reclaim_instructs_the_operator_then_drains_to_idle() {
    let h = harness().await;
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
    assert_eq!(h.calls()[0].rpc, "drain");
}

#[tokio::test]
async fn preempt_with_an_asynchronous_drain_is_left_draining() {
    let h = harness().await;
    h.asynchronous(OpKind::Drain);
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
    let h = harness().await;
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
    let h = harness().await;
    h.provider.update_config(|c| c.delete_supported = false);
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
    assert_eq!(h.calls().len(), 1, "never retried");
    assert_eq!(h.outcomes(ActionKind::Release, Outcome::ProviderError), 1);
}

// ---- reading acknowledgements -------------------------------------------

#[tokio::test]
async fn an_ack_still_in_the_from_state_is_left_to_reconcile() {
    let h = harness().await;
    h.force_ack(OpKind::Configure, pb::MachineState::Idle, "");
    let r = h.run_seeded(machine("m1", Idle, ""), bootstrap()).await;
    assert_eq!(r.outcome, Outcome::Success, "{}", r.detail);
    assert_eq!(
        r.detail,
        "configure accepted as \"op-1\", provider still configuring; reconcile \
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
            (OpKind::Create, pb::MachineState::Failed, "out of quota"),
            machine("m1", Speculative, ""),
            provision(),
            [Speculative, Creating, Failed],
            "create: out of quota",
        ),
        (
            (OpKind::Delete, pb::MachineState::Creating, ""),
            machine("m1", Idle, ""),
            release_action("m1"),
            [Idle, Deleting, Failed],
            "delete: provider acknowledged in unexpected state creating",
        ),
    ];
    for ((rpc, state, last_error), seeded, action, path, recorded) in cases {
        let h = harness().await;
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
    let h = harness().await;
    h.seed(machine("m1", Speculative, ""));
    // Not the machine's action in flight any more: ABORTED ⇒ stale_state.
    let r = h
        .run_edited(provision(), |item| item.action_id = "act-gone".into())
        .await;
    assert_eq!(r.outcome, Outcome::StaleState, "{}", r.detail);
    assert!(h.calls().is_empty());

    // A machine decide does not know: NOT_FOUND ⇒ inventory_miss.
    let ghost = machine("ghost", Idle, "");
    h.provider.add_machine(ghost.clone()).unwrap();
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
        let h = harness().await;
        let r = h.run_seeded(seeded, action).await;
        assert_eq!(r.outcome, Outcome::StaleState, "{detail}");
        assert_eq!(r.detail, detail);
        assert!(h.edges().is_empty(), "{detail}");
        assert!(h.calls().is_empty(), "{detail}");
        assert!(h.gateway.reclaims().is_empty(), "{detail}");
    }
}

#[tokio::test]
async fn malformed_items_are_classified_not_executed() {
    let h = harness().await;
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
    assert!(h.calls().is_empty());
}

#[tokio::test]
async fn an_action_out_of_time_during_a_provider_call_fails_the_machine() {
    let mut cfg = fixtures::fast_exec();
    cfg.action_timeout = Duration::from_millis(150);
    let h = harness_slow(cfg, Duration::from_secs(5)).await;
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
    let h = harness_slow(fixtures::fast_exec(), Duration::from_secs(5)).await;
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
    assert_eq!(h.provider_state("m1"), pb::MachineState::Speculative);
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
