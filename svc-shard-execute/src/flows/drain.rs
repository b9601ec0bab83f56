//! Reclaim and Preempt: tell the operator, then Configured → Draining →
//! (Drain) → Idle.

use std::time::Duration;

use bigfleet_model::{ActionKind, Machine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use tokio::time::Instant;

use super::provider::Leg;
use super::steps::describe;
use super::{Fail, Flow, Run};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

const DRAIN: Leg = Leg {
    rpc: "drain",
    doing: "draining",
    from: MachineState::Configured,
    via: MachineState::Draining,
    to: MachineState::Idle,
    on_error: Outcome::ProviderError,
    reason: "drain: idle",
};

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
            return Err(Fail::stale(
                format_args!("{kind} needs a machine configured for {cluster}"),
                format_args!("{} for {:?}", machine.state, machine.cluster),
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
        self.transition(DRAIN.from, DRAIN.via, mesh::MachinePatch::default(), reason)
            .await?;
        let landed = self
            .actuate(
                &DRAIN,
                pb::DrainRequest {
                    grace_period_seconds: grace_seconds,
                    ..Default::default()
                },
                // Decide clears the binding and assignment on entering Idle.
                |view| mesh::MachinePatch {
                    provider_view: Some(view.raw),
                    ..Default::default()
                },
            )
            .await?;
        // Asynchronous drain (the original's ADR-0059) lands Pending: the binding is
        // cleared only when reconcile sees Idle.
        Ok(
            landed.timed_note(&self.ex.metrics.drain_phase, phase_started, || {
                "drained to idle".to_owned()
            }),
        )
    }
}
