//! The steps every flow is built from: waiting under the action's deadline and
//! the Work stream's cancellation, and reporting transitions to decide — a
//! forward step on the main path, or a rollback or failure report on its own
//! budget.

use std::future::Future;
use std::time::Duration;

use bigfleet_conv as conv;
use bigfleet_model::MachineState;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use tokio::time::Instant;
use tonic::Status;

use super::{Fail, Flow, Run};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

/// Why a step stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Interrupt {
    /// The action's own deadline passed.
    Deadline,
    /// The Work stream ended; decide abandoned the action.
    Abandoned,
}

pub(super) fn describe(status: &Status) -> String {
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

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    /// Waits for `fut` unless the action is abandoned or out of time.
    pub(super) async fn guard<F: Future>(&self, fut: F) -> Result<F::Output, Interrupt> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Interrupt::Abandoned),
            _ = tokio::time::sleep_until(self.deadline) => Err(Interrupt::Deadline),
            out = fut => Ok(out),
        }
    }

    pub(super) fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub(super) fn interrupted(&self, why: Interrupt, what: &str) -> Fail {
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

    pub(super) fn request(
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
    pub(super) async fn transition(
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
    pub(super) async fn cleanup(
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
    pub(super) async fn rollback(&self, outcome: Outcome, why: String) -> Fail {
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
    pub(super) async fn mark_failed(
        &self,
        from: MachineState,
        outcome: Outcome,
        last_error: String,
    ) -> Fail {
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
}
