//! Provider mutations: each attempt stamped from the item's fencing window,
//! retried only on transport codes (never when fenced), classified when it
//! fails, and its acknowledgement read as the machine's next state.

use std::future::Future;
use std::time::Duration;

use bigfleet_conv as conv;
use bigfleet_mesh::Attempts;
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::steps::{Interrupt, describe};
use super::{Fail, Flow, Run};
use crate::fence::{Stamp, StampError};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

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

/// A provider's view of the machine from an acknowledgement, validated like
/// any provider record.
pub(super) struct AckView {
    /// The provider's operation id (for the logs of an unfinished transition).
    pub(super) operation_id: String,
    pub(super) state: MachineState,
    pub(super) last_error: String,
    pub(super) host: Option<pb::HostRef>,
    pub(super) raw: pb::Machine,
}

/// What a provider mutation's acknowledgement says next.
enum Answer {
    /// The machine as the provider now reports it.
    View(Box<AckView>),
    /// The provider finishes asynchronously; reconcile completes the transition.
    Async(String),
}

/// A provider mutation's request. [`Run::actuate`] takes it with only its own fields set
/// and fences a copy for every attempt, so no mutation can be sent unfenced.
pub(super) trait Mutation: Clone {
    /// Sets the machine and the four fencing fields every mutation carries.
    fn fence(&mut self, machine_id: &str, stamp: Stamp);

    /// Sends the request over its RPC.
    fn send<P: ProviderLink>(
        self,
        provider: &P,
        timeout: Duration,
    ) -> impl Future<Output = Result<pb::TransitionAck, Status>> + Send;
}

/// The four mutations carry the same fencing fields and differ only in their RPC.
macro_rules! mutations {
    ($($req:ty => $rpc:ident;)*) => {$(
        impl Mutation for $req {
            fn fence(&mut self, machine_id: &str, stamp: Stamp) {
                machine_id.clone_into(&mut self.machine_id);
                self.shard_id = stamp.shard_id;
                self.shard_epoch = stamp.epoch;
                self.sequence_number = stamp.sequence;
            }

            fn send<P: ProviderLink>(
                self,
                provider: &P,
                timeout: Duration,
            ) -> impl Future<Output = Result<pb::TransitionAck, Status>> + Send {
                provider.$rpc(self, timeout)
            }
        }
    )*};
}

mutations! {
    pb::CreateRequest => create;
    pb::ConfigureRequest => configure;
    pb::DrainRequest => drain;
    pb::DeleteRequest => delete;
}

/// One provider mutation of a flow: the machine was moved `from` → `via`
/// before the call, and the provider is asked to take it on to `to`.
pub(super) struct Leg {
    /// The mutation, also the prefix of its errors (`"create"`).
    pub(super) rpc: &'static str,
    /// What the provider is still doing when it answers before `to` (`"creating"`).
    pub(super) doing: &'static str,
    pub(super) from: MachineState,
    pub(super) via: MachineState,
    pub(super) to: MachineState,
    /// The outcome of a failed call or an unusable answer.
    pub(super) on_error: Outcome,
    /// The reason reported with `via` → `to`.
    pub(super) reason: &'static str,
}

/// Where a [`Leg`] left the machine.
pub(super) enum Landed {
    /// In `to`, reported to decide.
    Arrived,
    /// Still on its way: the provider finishes asynchronously and reconcile
    /// completes the transition; the note says so.
    Pending(String),
}

impl Landed {
    /// The flow's note: `arrived` once the machine is in `to`, with the phase that began
    /// at `started` observed into `phase`; a pending leg's own note otherwise, unobserved
    /// because the phase has not ended yet.
    pub(super) fn timed_note(
        self,
        phase: &prometheus::Histogram,
        started: Instant,
        arrived: impl FnOnce() -> String,
    ) -> String {
        match self {
            Landed::Arrived => {
                phase.observe(started.elapsed().as_secs_f64());
                arrived()
            }
            Landed::Pending(note) => note,
        }
    }
}

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    /// Runs one leg for a machine already in `leg.via`: `request`, fenced
    /// for each attempt, then its answer read as the machine's next state. An
    /// answer in `leg.to` is reported to decide with the patch `settle` builds
    /// from the provider's view; an answer still in `from` or `via` is left to
    /// reconcile; a failed call, a Failed machine or any other state fails
    /// the machine from `via`.
    pub(super) async fn actuate(
        &mut self,
        leg: &Leg,
        request: impl Mutation,
        settle: impl FnOnce(AckView) -> mesh::MachinePatch,
    ) -> Flow<Landed> {
        let ex = self.ex;
        let machine_id = self.machine_id.clone();
        let result = self
            .provider_call(leg.rpc, |stamp, timeout| {
                let mut attempt = request.clone();
                attempt.fence(&machine_id, stamp);
                attempt.send(&ex.provider, timeout)
            })
            .await;
        let view = match self
            .read_answer(leg.via, leg.rpc, result, leg.on_error)
            .await?
        {
            Answer::View(v) => *v,
            Answer::Async(note) => return Ok(Landed::Pending(note)),
        };
        let (rpc, via) = (leg.rpc, leg.via);
        match view.state {
            s if s == leg.to => {
                self.transition(via, leg.to, settle(view), leg.reason)
                    .await?;
                Ok(Landed::Arrived)
            }
            s if s == leg.from || s == via => Ok(Landed::Pending(format!(
                "{rpc} accepted as {:?}, provider still {}; reconcile completes it",
                view.operation_id, leg.doing
            ))),
            MachineState::Failed => Err(self
                .mark_failed(via, leg.on_error, format!("{rpc}: {}", view.last_error))
                .await),
            other => Err(self
                .mark_failed(
                    via,
                    leg.on_error,
                    format!("{rpc}: provider acknowledged in unexpected state {other}"),
                )
                .await),
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

    /// Validates an acknowledgement's machine snapshot through the provider
    /// ingest rules. `Ok(None)`: the provider sent no snapshot.
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
}
