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
//!
//! This module holds the entry point ([`Executor`]) and the dispatch by
//! action kind; each concern lives in its own file:
//!
//! * `steps` — waiting under the action's deadline and cancellation, and
//!   reporting transitions (and rollbacks and failures) to decide.
//! * `provider` — provider mutations: fencing stamps, retries on transport
//!   codes, classifying failures, reading acknowledgements, and the one leg
//!   (fenced call → answer → report) every flow below runs.
//! * `acquire` — Provision and Bootstrap, including the operator's blob.
//! * `drain` — Reclaim and Preempt.
//! * `release` — Release.

mod acquire;
mod drain;
mod provider;
mod release;
mod steps;

use std::time::Duration;

use bigfleet_conv as conv;
use bigfleet_mesh::RetryPolicy;
use bigfleet_model::{Action, ActionKind};
use bigfleet_proto::mesh::v1 as mesh;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::fence::Stamper;
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

    /// Decide handed out the machine in a state (`found`) the flow cannot start from.
    fn stale(needs: impl std::fmt::Display, found: impl std::fmt::Display) -> Self {
        Self::new(
            Outcome::StaleState,
            format!("{needs}, decide handed out one in {found}"),
        )
    }
}

type Flow<T> = Result<T, Fail>;
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
}

#[cfg(test)]
mod tests;
