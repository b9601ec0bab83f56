//! Reclaim and Preempt: tell the operator, then Configured → Draining →
//! (Drain) → Idle.

use std::time::Duration;

use bigfleet_model::{ActionKind, Machine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use tokio::time::Instant;

use super::provider::Answer;
use super::steps::describe;
use super::{Fail, Flow, Run};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    /// Reclaim / Preempt: the operator is told first (cordon and evict within
    /// the grace), then Configured → Draining → (Drain) → Idle.
    pub(super) async fn drain(
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
            // Asynchronous drain (the original's ADR-0059): the binding is cleared only when
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
}
