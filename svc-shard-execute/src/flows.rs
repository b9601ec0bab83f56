//! The action flows: one WorkItem in, every state change reported to decide,
//! one classified outcome out.
//!
//! Decide is the only authority on machine state, so a flow never assumes a
//! transition happened: it asks decide (compare-and-swap on the from-state
//! and the action id) and stops the moment decide says no. Provider calls
//! are stamped from the item's fencing window and retried only on transport
//! codes; a fenced call is never retried. Asynchronous providers (an ack in
//! a transitional state) are left to decide's reconcile, which owns the
//! machine once the action is Done.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bigfleet_conv as conv;
use bigfleet_mesh::{Attempts, RetryPolicy};
use bigfleet_model::{Action, ActionKind, Assignment, Machine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::request_bootstrap_response::Outcome as BootstrapReply;
use bigfleet_proto::v1alpha1 as pb;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use tracing::Instrument;

use crate::fence::{Stamp, StampError, Stamper};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::metrics::ExecuteMetrics;
use crate::outcome::Outcome;
use crate::trace;

/// Timeouts and retries of the flows.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Budget of one action, independent of decide's cycles (`--action-timeout`).
    pub action_timeout: Duration,
    /// Longest wait for a bootstrap blob (ref: 30 s).
    pub bootstrap_timeout: Duration,
    /// Longest single provider call when the action has more time left
    /// (ref dial deadline for lifecycle calls: 30 s).
    pub call_timeout: Duration,
    /// Budget of a rollback or failure report after the action's own
    /// deadline passed: the machine must not be left transitional because
    /// the work ran out of time.
    pub cleanup_timeout: Duration,
    /// Re-stamped attempts of one provider call: the mesh default (4 attempts,
    /// 50 ms doubling to 2 s with jitter, on UNAVAILABLE and DEADLINE_EXCEEDED).
    pub retry: RetryPolicy,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            action_timeout: Duration::from_secs(30),
            bootstrap_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(30),
            cleanup_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
        }
    }
}

/// What became of one work item; the body of its `Done`.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub action_id: String,
    /// `None` when the item's kind could not be read.
    pub kind: Option<ActionKind>,
    pub outcome: Outcome,
    pub detail: String,
    pub elapsed: Duration,
}

impl Report {
    /// The `Done` frame for decide.
    pub fn done(&self) -> mesh::worker_message::Done {
        mesh::worker_message::Done {
            action_id: self.action_id.clone(),
            outcome: self.outcome.as_str().to_owned(),
            detail: self.detail.clone(),
            elapsed_ms: u64::try_from(self.elapsed.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// Runs work items against decide, the gateway and the provider.
#[derive(Debug)]
pub struct Executor<D, G, P> {
    decide: D,
    gateway: G,
    provider: P,
    metrics: ExecuteMetrics,
    cfg: ExecConfig,
}

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Executor<D, G, P> {
    pub fn new(
        decide: D,
        gateway: G,
        provider: P,
        metrics: ExecuteMetrics,
        cfg: ExecConfig,
    ) -> Self {
        Self {
            decide,
            gateway,
            provider,
            metrics,
            cfg,
        }
    }

    pub fn metrics(&self) -> &ExecuteMetrics {
        &self.metrics
    }

    pub fn config(&self) -> &ExecConfig {
        &self.cfg
    }

    /// Runs one item to its outcome. `cancel` fires when the item's Work
    /// stream is gone: decide has abandoned the action, so the flow stops
    /// at once without further calls or reports. Never panics on bad input:
    /// a malformed item is an `other` (or `missing_profile`) outcome.
    pub async fn execute(&self, item: mesh::WorkItem, cancel: CancellationToken) -> Report {
        let span = trace::item_span(&item);
        self.execute_inner(item, cancel).instrument(span).await
    }

    async fn execute_inner(&self, item: mesh::WorkItem, cancel: CancellationToken) -> Report {
        let started = Instant::now();
        self.metrics.inflight.inc();
        let kind = item
            .action
            .as_ref()
            .and_then(|a| conv::action_kind_from_proto(a.kind).ok());
        let result = match Stamper::new(item.fencing.as_ref()) {
            Err(e) => Err(Fail::new(Outcome::Other, e.to_string())),
            Ok(stamper) => {
                let mut run = Run {
                    ex: self,
                    action_id: item.action_id.clone(),
                    machine_id: item
                        .action
                        .as_ref()
                        .map(|a| a.machine_id.clone())
                        .unwrap_or_default(),
                    stamper,
                    deadline: started + self.cfg.action_timeout,
                    cancel,
                };
                run.run(&item).await
            }
        };
        self.metrics.inflight.dec();
        let (outcome, detail) = match result {
            Ok(detail) => (Outcome::Success, detail),
            Err(f) => (f.outcome, f.detail),
        };
        self.metrics.count(kind, outcome);
        match outcome {
            Outcome::Success => {
                tracing::debug!(outcome = %outcome, detail = %detail, "action done")
            }
            Outcome::Fenced => {
                tracing::error!(outcome = %outcome, detail = %detail, "action fenced")
            }
            _ => tracing::warn!(outcome = %outcome, detail = %detail, "action failed"),
        }
        Report {
            action_id: item.action_id,
            kind,
            outcome,
            detail,
            elapsed: started.elapsed(),
        }
    }
}

/// A flow that ended without success.
#[derive(Debug)]
struct Fail {
    outcome: Outcome,
    detail: String,
}

impl Fail {
    fn new(outcome: Outcome, detail: impl Into<String>) -> Self {
        Self {
            outcome,
            detail: detail.into(),
        }
    }
}

type Flow<T> = Result<T, Fail>;

/// Why a step stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    /// The action's own deadline passed.
    Deadline,
    /// The Work stream ended; decide abandoned the action.
    Abandoned,
}

/// How one attempt of a provider call failed.
#[derive(Debug)]
enum Attempt {
    Status(Status),
    /// No fencing token left to stamp it with: never retried.
    Window(StampError),
}

impl Attempt {
    /// The code the retry policy judges; a fenced call is never retried,
    /// whatever the policy says.
    fn code(&self) -> Option<Code> {
        match self {
            Attempt::Status(s) if s.code() != Code::FailedPrecondition => Some(s.code()),
            Attempt::Status(_) | Attempt::Window(_) => None,
        }
    }
}

/// How a provider call ended without an acknowledgement.
#[derive(Debug)]
enum CallError {
    Fenced(Status),
    Refused(Status),
    GaveUp { last: Status, attempts: u32 },
    Window(StampError),
    Interrupted(Interrupt),
}

fn describe(status: &Status) -> String {
    if status.message().is_empty() {
        format!("{:?}", status.code()).to_lowercase()
    } else {
        status.message().to_owned()
    }
}

fn state_name(s: MachineState) -> &'static str {
    s.as_str()
}

fn wire(s: MachineState) -> i32 {
    conv::machine_state_to_proto(s)
}

/// The five `bigfleet.lucy.sh/` keys for an assignment, encoded by the model.
fn assignment_metadata(a: &Assignment) -> BTreeMap<String, String> {
    Machine {
        assigned_priority: a.priority,
        assigned_interruption_penalty_dollars: a.interruption_penalty_dollars,
        assigned_reclamation_penalty_dollars: a.reclamation_penalty_dollars,
        assigned_need_fingerprint: a.need_fingerprint.clone(),
        assigned_group: a.group.clone(),
        ..Machine::default()
    }
    .encode_shard_metadata()
}

/// A provider's view of the machine from an acknowledgement, validated like
/// any provider record.
struct AckView {
    /// The provider's operation id (for the logs of an unfinished transition).
    operation_id: String,
    state: MachineState,
    last_error: String,
    host: Option<pb::HostRef>,
    raw: pb::Machine,
}

/// What a provider mutation's acknowledgement says next.
enum Answer {
    /// The machine as the provider now reports it.
    View(Box<AckView>),
    /// The provider finishes asynchronously; reconcile completes the transition.
    Async(String),
}

/// One action in progress.
struct Run<'a, D, G, P> {
    ex: &'a Executor<D, G, P>,
    action_id: String,
    machine_id: String,
    stamper: Stamper,
    deadline: Instant,
    cancel: CancellationToken,
}

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    async fn run(&mut self, item: &mesh::WorkItem) -> Flow<String> {
        let wire_action = item
            .action
            .as_ref()
            .ok_or_else(|| Fail::new(Outcome::Other, "work item without an action"))?;
        let action = conv::action_from_proto(wire_action).map_err(|e| {
            if e.path() == Some("action.need_fingerprint") {
                Fail::new(Outcome::MissingProfile, format!("invalid action: {e}"))
            } else {
                Fail::new(Outcome::Other, format!("invalid action: {e}"))
            }
        })?;
        let snapshot = item
            .machine
            .as_ref()
            .ok_or_else(|| Fail::new(Outcome::Other, "work item without a machine snapshot"))?;
        if snapshot.id != action.machine_id() {
            return Err(Fail::new(
                Outcome::Other,
                format!(
                    "machine snapshot {:?} does not match action machine {:?}",
                    snapshot.id,
                    action.machine_id()
                ),
            ));
        }
        let mut machine = conv::machine_from_proto(snapshot)
            .map_err(|e| Fail::new(Outcome::Other, format!("invalid machine snapshot: {e}")))?;
        let echoed = std::mem::take(&mut machine.shard_metadata);
        if let Err(e) = machine.apply_shard_metadata(&echoed) {
            // Only the already-done check reads these; a bad value just
            // means the action runs instead of being skipped.
            tracing::warn!(error = %e, "ignoring malformed assignment in the machine snapshot");
        }
        match &action {
            Action::Provision {
                cluster,
                assignment,
                ..
            } => self.provision(&machine, cluster, assignment).await,
            Action::Bootstrap {
                cluster,
                assignment,
                ..
            } => self.bootstrap(&machine, cluster, assignment).await,
            Action::Reclaim { cluster, grace, .. } => {
                self.drain(&machine, ActionKind::Reclaim, cluster, *grace, 0)
                    .await
            }
            Action::Preempt {
                cluster,
                grace,
                preemptor_priority,
                ..
            } => {
                self.drain(
                    &machine,
                    ActionKind::Preempt,
                    cluster,
                    *grace,
                    *preemptor_priority,
                )
                .await
            }
            Action::Release { .. } => self.release(&machine).await,
        }
    }

    // ---- building blocks ------------------------------------------------

    /// Waits for `fut` unless the action is abandoned or out of time.
    async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, Interrupt> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Interrupt::Abandoned),
            _ = tokio::time::sleep_until(self.deadline) => Err(Interrupt::Deadline),
            out = fut => Ok(out),
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn interrupted(&self, why: Interrupt, what: &str) -> Fail {
        match why {
            Interrupt::Deadline => Fail::new(
                Outcome::CtxCanceled,
                format!(
                    "{what}: action timed out after {}",
                    humantime::format_duration(self.ex.cfg.action_timeout)
                ),
            ),
            Interrupt::Abandoned => Fail::new(
                Outcome::CtxCanceled,
                format!("{what}: abandoned, the work stream ended"),
            ),
        }
    }

    fn request(
        &self,
        from: MachineState,
        to: MachineState,
        patch: mesh::MachinePatch,
        reason: &str,
    ) -> mesh::TransitionRequest {
        mesh::TransitionRequest {
            machine_id: self.machine_id.clone(),
            from_state: wire(from),
            to_state: wire(to),
            patch: Some(patch),
            reason: reason.to_owned(),
            action_id: self.action_id.clone(),
        }
    }

    /// A forward transition on the action's main path.
    async fn transition(
        &self,
        from: MachineState,
        to: MachineState,
        patch: mesh::MachinePatch,
        reason: &str,
    ) -> Flow<pb::Machine> {
        let what = format!("transition {} -> {}", state_name(from), state_name(to));
        let req = self.request(from, to, patch, reason);
        match self.guard(self.ex.decide.transition(req)).await {
            Ok(Ok(resp)) => Ok(resp.machine.unwrap_or_default()),
            Ok(Err(status)) => Err(Fail::new(
                Outcome::from_transition_error(status.code()),
                format!("{what}: {}", describe(&status)),
            )),
            Err(why) => Err(self.interrupted(why, &what)),
        }
    }

    /// A rollback or failure report: runs on its own budget even after the
    /// action's deadline, but not for an abandoned action (decide no longer
    /// accepts reports for it and re-derives the machine itself).
    async fn cleanup(
        &self,
        from: MachineState,
        to: MachineState,
        patch: mesh::MachinePatch,
        reason: &str,
    ) -> Result<(), String> {
        if self.cancel.is_cancelled() {
            return Err("not reported: the work stream ended".to_owned());
        }
        let req = self.request(from, to, patch, reason);
        let call =
            tokio::time::timeout(self.ex.cfg.cleanup_timeout, self.ex.decide.transition(req));
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err("not reported: the work stream ended".to_owned()),
            r = call => match r {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(s)) => Err(format!(
                    "decide refused {} -> {}: {}",
                    state_name(from),
                    state_name(to),
                    describe(&s)
                )),
                Err(_) => Err("decide did not answer the report in time".to_owned()),
            },
        }
    }

    /// Configuring → Idle: the provider was never touched, so the machine
    /// is still good hardware.
    async fn rollback(&self, outcome: Outcome, why: String) -> Fail {
        match self
            .cleanup(
                MachineState::Configuring,
                MachineState::Idle,
                mesh::MachinePatch::default(),
                "bootstrap rolled back",
            )
            .await
        {
            Ok(()) => Fail::new(outcome, format!("{why}; rolled back to idle")),
            Err(e) => Fail::new(outcome, format!("{why}; rollback: {e}")),
        }
    }

    /// `from` → Failed with `last_error`.
    async fn mark_failed(&self, from: MachineState, outcome: Outcome, last_error: String) -> Fail {
        let patch = mesh::MachinePatch {
            last_error: Some(last_error.clone()),
            ..Default::default()
        };
        match self
            .cleanup(from, MachineState::Failed, patch, "provider failure")
            .await
        {
            Ok(()) => Fail::new(outcome, last_error),
            Err(e) => Fail::new(outcome, format!("{last_error}; marking failed: {e}")),
        }
    }

    /// A provider mutation with fencing, per-attempt stamping and retries
    /// on transport codes (all four mutations are idempotent on
    /// (machine, target), so a retry after a lost answer is safe).
    async fn provider_call<F, Fut>(
        &mut self,
        rpc: &'static str,
        mut call: F,
    ) -> Result<pb::TransitionAck, CallError>
    where
        F: FnMut(Stamp, Duration) -> Fut,
        Fut: Future<Output = Result<pb::TransitionAck, Status>>,
    {
        let ex = self.ex;
        let deadline = self.deadline;
        let stamper = &mut self.stamper;
        let attempts = ex.cfg.retry.run_with(
            |_| {
                let per_call = ex
                    .cfg
                    .call_timeout
                    .min(deadline.saturating_duration_since(Instant::now()));
                let sent = stamper.stamp().map(|stamp| call(stamp, per_call));
                async move {
                    let sent = sent.map_err(Attempt::Window)?;
                    match tokio::time::timeout(per_call, sent).await {
                        Ok(answer) => answer.map_err(Attempt::Status),
                        Err(_) => Err(Attempt::Status(Status::deadline_exceeded(format!(
                            "no answer within {}",
                            humantime::format_duration(per_call)
                        )))),
                    }
                }
            },
            Attempt::code,
            |retry, err, _wait| {
                ex.metrics.provider_retries.with_label_values(&[rpc]).inc();
                if let Attempt::Status(status) = err {
                    tracing::warn!(
                        rpc,
                        attempts = retry,
                        code = ?status.code(),
                        error = %describe(status),
                        "retryable provider error; retrying with a fresh sequence number"
                    );
                }
            },
        );
        // The whole retry loop, backoff sleeps included, stops when the action is
        // abandoned or out of time.
        let guarded = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Interrupt::Abandoned),
            _ = tokio::time::sleep_until(deadline) => Err(Interrupt::Deadline),
            out = attempts => Ok(out),
        };
        match guarded.map_err(CallError::Interrupted)? {
            Ok(ack) => Ok(ack),
            Err(Attempts {
                last: Attempt::Window(e),
                ..
            }) => Err(CallError::Window(e)),
            Err(Attempts {
                last: Attempt::Status(status),
                attempts,
            }) => Err(match status.code() {
                Code::FailedPrecondition => CallError::Fenced(status),
                code if ex.cfg.retry.is_retryable(code) => CallError::GaveUp {
                    last: status,
                    attempts,
                },
                _ => CallError::Refused(status),
            }),
        }
    }

    /// Classifies a failed provider call and reports the machine Failed
    /// (except for an abandoned action, which decide re-derives).
    async fn call_failed(
        &self,
        from: MachineState,
        prefix: &str,
        err: CallError,
        on_error: Outcome,
    ) -> Fail {
        let (outcome, last_error) = match err {
            CallError::Interrupted(Interrupt::Abandoned) => {
                return self.interrupted(Interrupt::Abandoned, prefix);
            }
            CallError::Interrupted(Interrupt::Deadline) => {
                let f = self.interrupted(Interrupt::Deadline, prefix);
                (f.outcome, f.detail)
            }
            CallError::Fenced(status) => {
                tracing::error!(
                    machine = %self.machine_id,
                    action_id = %self.action_id,
                    rpc = prefix,
                    error = %describe(&status),
                    "zombie-shard incident: the provider refused our fencing token, a newer \
                     incarnation of this shard has acted on the machine"
                );
                (
                    Outcome::Fenced,
                    format!("{prefix}: fenced: {}", describe(&status)),
                )
            }
            CallError::Refused(status) if status.code() == Code::Unimplemented => (
                on_error,
                format!(
                    "{prefix}: not supported by the provider (contract violation): {}",
                    describe(&status)
                ),
            ),
            CallError::Refused(status) => (on_error, format!("{prefix}: {}", describe(&status))),
            CallError::GaveUp { last, attempts } => (
                on_error,
                format!(
                    "{prefix}: {} (gave up after {attempts} attempts)",
                    describe(&last)
                ),
            ),
            CallError::Window(e) => (Outcome::Other, format!("{prefix}: {e}")),
        };
        self.mark_failed(from, outcome, last_error).await
    }

    /// Validates an acknowledgement's machine snapshot through the provider
    /// ingest rules. `Ok(None)`: the provider sent no snapshot.
    /// Reads a mutation's answer: the machine as the provider now reports it, or a note
    /// that the provider finishes asynchronously (reconcile completes the transition). A
    /// failed call or an unusable acknowledgement fails the action from `from`.
    async fn read_answer(
        &self,
        from: MachineState,
        rpc: &'static str,
        result: Result<pb::TransitionAck, CallError>,
        on_error: Outcome,
    ) -> Result<Answer, Fail> {
        let ack = match result {
            Ok(ack) => ack,
            Err(e) => return Err(self.call_failed(from, rpc, e, on_error).await),
        };
        let op = ack.operation_id.clone();
        match self.ack_view(rpc, ack) {
            Ok(Some(view)) => Ok(Answer::View(Box::new(view))),
            Ok(None) => Ok(Answer::Async(format!(
                "{rpc} accepted as {op:?}; reconcile completes it"
            ))),
            Err(e) => Err(self.mark_failed(from, on_error, e).await),
        }
    }

    fn ack_view(&self, prefix: &str, ack: pb::TransitionAck) -> Result<Option<AckView>, String> {
        let operation_id = ack.operation_id;
        let Some(raw) = ack.machine else {
            return Ok(None);
        };
        let m = conv::machine_from_proto(&raw)
            .map_err(|e| format!("{prefix}: invalid acknowledgement: {e}"))?;
        if m.id != self.machine_id {
            return Err(format!(
                "{prefix}: acknowledgement is for machine {:?}",
                m.id
            ));
        }
        Ok(Some(AckView {
            operation_id,
            state: m.state,
            last_error: m.last_error,
            host: raw.host.clone(),
            raw,
        }))
    }

    // ---- flows ----------------------------------------------------------

    /// Speculative → Creating → (Create) → Idle, then Bootstrap.
    async fn provision(
        &mut self,
        machine: &Machine,
        cluster: &str,
        a: &Assignment,
    ) -> Flow<String> {
        if machine.state != MachineState::Speculative {
            return Err(Fail::new(
                Outcome::StaleState,
                format!(
                    "provision needs a speculative machine, decide handed out one in {}",
                    machine.state
                ),
            ));
        }
        // ADR-0052: the planned need is stamped at Creating so decide can
        // credit the in-flight machine to it.
        self.transition(
            MachineState::Speculative,
            MachineState::Creating,
            mesh::MachinePatch {
                assigned_need_fingerprint: Some(a.need_fingerprint.clone()),
                assigned_group: Some(a.group.clone()),
                ..Default::default()
            },
            "provision: create requested",
        )
        .await?;
        let ex = self.ex;
        let machine_id = self.machine_id.clone();
        let result = self
            .provider_call("create", |s, t| {
                ex.provider.create(
                    pb::CreateRequest {
                        machine_id: machine_id.clone(),
                        shard_id: s.shard_id,
                        shard_epoch: s.epoch,
                        sequence_number: s.sequence,
                    },
                    t,
                )
            })
            .await;
        let view = match self
            .read_answer(
                MachineState::Creating,
                "create",
                result,
                Outcome::ProviderError,
            )
            .await?
        {
            Answer::View(v) => *v,
            Answer::Async(note) => return Ok(note),
        };
        let op = &view.operation_id;
        match view.state {
            MachineState::Idle => {
                self.transition(
                    MachineState::Creating,
                    MachineState::Idle,
                    mesh::MachinePatch {
                        host: view.host,
                        provider_view: Some(view.raw),
                        ..Default::default()
                    },
                    "provision: create acknowledged idle",
                )
                .await?;
                self.bootstrap_idle(cluster, a)
                    .await
                    .map(|d| format!("created; {d}"))
            }
            MachineState::Speculative | MachineState::Creating => Ok(format!(
                "create accepted as {op:?}, provider still creating; reconcile completes it"
            )),
            MachineState::Failed => Err(self
                .mark_failed(
                    MachineState::Creating,
                    Outcome::ProviderError,
                    format!("create: {}", view.last_error),
                )
                .await),
            other => Err(self
                .mark_failed(
                    MachineState::Creating,
                    Outcome::ProviderError,
                    format!("create: provider acknowledged in unexpected state {other}"),
                )
                .await),
        }
    }

    /// Idle → Configuring → (blob, Configure) → Configured; a machine
    /// already Configured for the same cluster and need is success.
    async fn bootstrap(
        &mut self,
        machine: &Machine,
        cluster: &str,
        a: &Assignment,
    ) -> Flow<String> {
        if machine.state == MachineState::Configured
            && machine.cluster == cluster
            && machine.assigned_need_fingerprint == a.need_fingerprint
        {
            return Ok("already configured for this cluster and need".to_owned());
        }
        if machine.state != MachineState::Idle {
            return Err(Fail::new(
                Outcome::StaleState,
                format!(
                    "bootstrap needs an idle machine, decide handed out one in {}",
                    machine.state
                ),
            ));
        }
        self.bootstrap_idle(cluster, a).await
    }

    async fn bootstrap_idle(&mut self, cluster: &str, a: &Assignment) -> Flow<String> {
        let phase_started = Instant::now();
        // Cluster, need and group are stamped early so decide's Phase 1
        // credits the in-flight machine to its need.
        self.transition(
            MachineState::Idle,
            MachineState::Configuring,
            mesh::MachinePatch {
                cluster: Some(cluster.to_owned()),
                assigned_need_fingerprint: Some(a.need_fingerprint.clone()),
                assigned_group: Some(a.group.clone()),
                ..Default::default()
            },
            "bootstrap: configuring",
        )
        .await?;

        let blob = self.fetch_blob(cluster, a).await?;

        let metadata = assignment_metadata(a);
        let ex = self.ex;
        let machine_id = self.machine_id.clone();
        let wire_metadata: std::collections::BTreeMap<String, String> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let result = self
            .provider_call("configure", |s, t| {
                ex.provider.configure(
                    pb::ConfigureRequest {
                        machine_id: machine_id.clone(),
                        cluster_id: cluster.to_owned(),
                        bootstrap_blob: blob.clone(),
                        shard_id: s.shard_id,
                        shard_epoch: s.epoch,
                        sequence_number: s.sequence,
                        shard_metadata: wire_metadata.clone(),
                    },
                    t,
                )
            })
            .await;
        let view = match self
            .read_answer(
                MachineState::Configuring,
                "configure",
                result,
                Outcome::ConfigureError,
            )
            .await?
        {
            Answer::View(v) => *v,
            Answer::Async(note) => return Ok(note),
        };
        let op = &view.operation_id;
        match view.state {
            MachineState::Configured => {
                self.transition(
                    MachineState::Configuring,
                    MachineState::Configured,
                    mesh::MachinePatch {
                        assigned_priority: Some(a.priority),
                        assigned_interruption_penalty_dollars: Some(a.interruption_penalty_dollars),
                        assigned_reclamation_penalty_dollars: Some(a.reclamation_penalty_dollars),
                        assigned_need_fingerprint: Some(a.need_fingerprint.clone()),
                        assigned_group: Some(a.group.clone()),
                        shard_metadata: wire_metadata.into_iter().collect(),
                        provider_view: Some(view.raw),
                        ..Default::default()
                    },
                    "bootstrap: configured",
                )
                .await?;
                self.ex
                    .metrics
                    .configure_phase
                    .observe(phase_started.elapsed().as_secs_f64());
                Ok(format!("configured for {cluster}"))
            }
            MachineState::Idle | MachineState::Configuring => Ok(format!(
                "configure accepted as {op:?}, provider still configuring; reconcile completes it"
            )),
            MachineState::Failed => Err(self
                .mark_failed(
                    MachineState::Configuring,
                    Outcome::ConfigureError,
                    format!("configure: {}", view.last_error),
                )
                .await),
            other => Err(self
                .mark_failed(
                    MachineState::Configuring,
                    Outcome::ConfigureError,
                    format!("configure: provider acknowledged in unexpected state {other}"),
                )
                .await),
        }
    }

    /// The operator's bootstrap blob; every way of not getting one happens
    /// before the provider is touched, so each rolls the machine back to
    /// Idle (§1.3's rollback edge) rather than failing good hardware.
    async fn fetch_blob(&self, cluster: &str, a: &Assignment) -> Flow<Vec<u8>> {
        let wait = self.ex.cfg.bootstrap_timeout.min(self.remaining());
        let req = mesh::RequestBootstrapRequest {
            cluster_id: cluster.to_owned(),
            requirements: conv::requirements_to_proto(&a.requirements),
            timeout_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX).max(1),
            machine_id: self.machine_id.clone(),
            need_fingerprint: a.need_fingerprint.clone(),
        };
        let started = Instant::now();
        // A little slack past the gateway's own timeout, so its TIMEOUT
        // answer (not our local clock) normally decides.
        let local = tokio::time::timeout(
            wait + Duration::from_millis(250),
            self.ex.gateway.request_bootstrap(req, wait),
        );
        let answer = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Interrupt::Abandoned),
            r = local => Ok(r),
        };
        self.ex
            .metrics
            .request_bootstrap
            .observe(started.elapsed().as_secs_f64());
        let resp = match answer {
            Err(why) => return Err(self.interrupted(why, "bootstrap blob")),
            Ok(Err(_)) => {
                return Err(self
                    .rollback(
                        Outcome::BlobError,
                        format!(
                            "bootstrap blob: no answer within {}",
                            humantime::format_duration(wait)
                        ),
                    )
                    .await);
            }
            Ok(Ok(Err(status))) => {
                return Err(self
                    .rollback(
                        Outcome::BlobError,
                        format!("bootstrap blob: gateway: {}", describe(&status)),
                    )
                    .await);
            }
            Ok(Ok(Ok(resp))) => resp,
        };
        let message = resp.message;
        match resp.outcome {
            Some(BootstrapReply::Blob(blob)) => Ok(blob),
            Some(BootstrapReply::Error(code)) => {
                let (outcome, why) = match mesh::BootstrapError::try_from(code) {
                    Ok(mesh::BootstrapError::NoSession) => (
                        Outcome::NoSession,
                        format!("bootstrap blob: cluster {cluster} has no session"),
                    ),
                    Ok(mesh::BootstrapError::Timeout) => (
                        Outcome::BlobError,
                        format!("bootstrap blob: operator did not answer: {message}"),
                    ),
                    Ok(mesh::BootstrapError::OperatorError) => (
                        Outcome::BlobError,
                        format!("bootstrap blob: operator cannot satisfy the need: {message}"),
                    ),
                    _ => (
                        Outcome::BlobError,
                        format!("bootstrap blob: unknown gateway error {code}: {message}"),
                    ),
                };
                Err(self.rollback(outcome, why).await)
            }
            None => Err(self
                .rollback(
                    Outcome::BlobError,
                    "bootstrap blob: gateway answered with neither blob nor error".to_owned(),
                )
                .await),
        }
    }

    /// Reclaim / Preempt: the operator is told first (cordon and evict within
    /// the grace), then Configured → Draining → (Drain) → Idle.
    async fn drain(
        &mut self,
        machine: &Machine,
        kind: ActionKind,
        cluster: &str,
        grace: Duration,
        preemptor_priority: i32,
    ) -> Flow<String> {
        if machine.state != MachineState::Configured || machine.cluster != cluster {
            return Err(Fail::new(
                Outcome::StaleState,
                format!(
                    "{kind} needs a machine configured for {cluster}, decide handed out one in {} \
                     for {:?}",
                    machine.state, machine.cluster
                ),
            ));
        }
        let grace_seconds = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
        let reclaim = mesh::SendReclaimRequest {
            cluster_id: cluster.to_owned(),
            // The node name is the machine id, as in the reference shard.
            nodes: vec![self.machine_id.clone()],
            grace_period_seconds: grace_seconds,
            preemptor_priority,
            machine_id: self.machine_id.clone(),
        };
        let wait = self.ex.cfg.call_timeout.min(self.remaining());
        // The instruction is advisory (acks are telemetry): an operator that
        // is offline or a failing gateway must not pin the machine forever,
        // the provider's drain still honours the grace.
        match self
            .guard(self.ex.gateway.send_reclaim(reclaim, wait))
            .await
        {
            Err(why) => return Err(self.interrupted(why, "reclaim instruction")),
            Ok(Ok(r)) if r.delivered => {
                tracing::debug!(instruction_id = %r.instruction_id, "reclaim instruction delivered");
            }
            Ok(Ok(_)) => tracing::warn!(
                cluster,
                "cluster has no session; draining without a reclaim instruction"
            ),
            Ok(Err(status)) => tracing::warn!(
                cluster,
                error = %describe(&status),
                "reclaim instruction not sent; draining anyway"
            ),
        }
        let phase_started = Instant::now();
        let reason = match kind {
            ActionKind::Preempt => "preempt: draining",
            _ => "reclaim: draining",
        };
        self.transition(
            MachineState::Configured,
            MachineState::Draining,
            mesh::MachinePatch::default(),
            reason,
        )
        .await?;
        let ex = self.ex;
        let machine_id = self.machine_id.clone();
        let result = self
            .provider_call("drain", |s, t| {
                ex.provider.drain(
                    pb::DrainRequest {
                        machine_id: machine_id.clone(),
                        grace_period_seconds: grace_seconds,
                        shard_id: s.shard_id,
                        shard_epoch: s.epoch,
                        sequence_number: s.sequence,
                    },
                    t,
                )
            })
            .await;
        let view = match self
            .read_answer(
                MachineState::Draining,
                "drain",
                result,
                Outcome::ProviderError,
            )
            .await?
        {
            Answer::View(v) => *v,
            Answer::Async(note) => return Ok(note),
        };
        let op = &view.operation_id;
        match view.state {
            MachineState::Idle => {
                // Decide clears the binding and assignment on entering Idle.
                self.transition(
                    MachineState::Draining,
                    MachineState::Idle,
                    mesh::MachinePatch {
                        provider_view: Some(view.raw),
                        ..Default::default()
                    },
                    "drain: idle",
                )
                .await?;
                self.ex
                    .metrics
                    .drain_phase
                    .observe(phase_started.elapsed().as_secs_f64());
                Ok("drained to idle".to_owned())
            }
            // Asynchronous drain (ADR-0059): the binding is cleared only when
            // reconcile sees Idle.
            MachineState::Configured | MachineState::Draining => Ok(format!(
                "drain accepted as {op:?}, provider still draining; reconcile completes it"
            )),
            MachineState::Failed => Err(self
                .mark_failed(
                    MachineState::Draining,
                    Outcome::ProviderError,
                    format!("drain: {}", view.last_error),
                )
                .await),
            other => Err(self
                .mark_failed(
                    MachineState::Draining,
                    Outcome::ProviderError,
                    format!("drain: provider acknowledged in unexpected state {other}"),
                )
                .await),
        }
    }

    /// Release: Idle → Deleting → (Delete) → Speculative. Any refusal,
    /// including UNIMPLEMENTED, is a contract violation: decide only
    /// releases capacity types a provider must be able to delete.
    async fn release(&mut self, machine: &Machine) -> Flow<String> {
        if machine.state != MachineState::Idle {
            return Err(Fail::new(
                Outcome::StaleState,
                format!(
                    "release needs an idle machine, decide handed out one in {}",
                    machine.state
                ),
            ));
        }
        self.transition(
            MachineState::Idle,
            MachineState::Deleting,
            mesh::MachinePatch::default(),
            "release: deleting",
        )
        .await?;
        let ex = self.ex;
        let machine_id = self.machine_id.clone();
        let result = self
            .provider_call("delete", |s, t| {
                ex.provider.delete(
                    pb::DeleteRequest {
                        machine_id: machine_id.clone(),
                        shard_id: s.shard_id,
                        shard_epoch: s.epoch,
                        sequence_number: s.sequence,
                    },
                    t,
                )
            })
            .await;
        let view = match self
            .read_answer(
                MachineState::Deleting,
                "delete",
                result,
                Outcome::ProviderError,
            )
            .await?
        {
            Answer::View(v) => *v,
            Answer::Async(note) => return Ok(note),
        };
        let op = &view.operation_id;
        match view.state {
            MachineState::Speculative => {
                self.transition(
                    MachineState::Deleting,
                    MachineState::Speculative,
                    mesh::MachinePatch {
                        // An empty HostRef clears the host: the id survives
                        // as a quota slot without hardware.
                        host: Some(pb::HostRef::default()),
                        provider_view: Some(view.raw),
                        ..Default::default()
                    },
                    "release: deleted",
                )
                .await?;
                Ok("released to speculative".to_owned())
            }
            MachineState::Idle | MachineState::Deleting => Ok(format!(
                "delete accepted as {op:?}, provider still deleting; reconcile completes it"
            )),
            MachineState::Failed => Err(self
                .mark_failed(
                    MachineState::Deleting,
                    Outcome::ProviderError,
                    format!("delete: {}", view.last_error),
                )
                .await),
            other => Err(self
                .mark_failed(
                    MachineState::Deleting,
                    Outcome::ProviderError,
                    format!("delete: provider acknowledged in unexpected state {other}"),
                )
                .await),
        }
    }
}

#[cfg(test)]
mod tests;
