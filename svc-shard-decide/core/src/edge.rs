//! The service edge of decide's ingest and work hand-out: where the internal wire messages become
//! domain values and domain answers become wire messages, once (issue 19, ADR-0113).
//!
//! [`Decide`]'s own methods take and return domain types. The tonic services in
//! [`crate::service`] call these functions, and so do tests and tools that hold a
//! [`Decide`] in-process and speak the gateway's messages.
//!
//! A roll-up is fingerprinted on its wire form first: a re-send identical to the demand
//! in force, or one from a replaced session, is answered without being converted
//! ([`Decide::rollup_precheck`]); anything else is converted (which validates it) and
//! applied ([`Decide::apply_rollup`]).

use crate::errors::DecideError;
use crate::intake::RollupVerdict;
use crate::rails::QUARANTINE_CONFIRMATIONS;
use crate::shard::{Decide, machine_view};
use crate::work::{MachinePatch, Transition, WorkGrant};
use bigfleet_conv::{
    action_to_proto, machine_from_proto, machine_state_from_proto, rollup_fingerprint,
    rollup_from_proto_with,
};
use bigfleet_model::Host;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;

/// ApplyRollup: one roll-up from the gateway, answered with its outcome.
pub fn apply_rollup(
    decide: &Decide,
    req: &mesh::ApplyRollupRequest,
) -> Result<mesh::ApplyRollupResponse, DecideError> {
    let empty = pb::ClusterCapacityNeeds::default();
    let wire = req.rollup.as_ref().unwrap_or(&empty);
    let fingerprint = rollup_fingerprint(wire);
    let verdict = match decide.rollup_precheck(&wire.cluster_id, req.session_id, fingerprint) {
        Some(v) => v,
        None => {
            let rollup = rollup_from_proto_with(wire, &decide.config().rollup_limits)
                .map_err(|e| decide.rollup_rejected(&wire.cluster_id, e))?;
            decide.apply_rollup(rollup, fingerprint, req.received_at_unix_nanos)?
        }
    };
    Ok(rollup_response(decide, verdict))
}

/// The wire answer to a roll-up's verdict, stamped with decide's epoch and term.
fn rollup_response(decide: &Decide, verdict: RollupVerdict) -> mesh::ApplyRollupResponse {
    let rows = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let (outcome, need_rows, detail) = match verdict {
        RollupVerdict::Accepted { need_rows } => (
            mesh::RollupOutcome::Accepted,
            rows(need_rows),
            String::new(),
        ),
        RollupVerdict::Superseded { session, current } => (
            mesh::RollupOutcome::Superseded,
            0,
            format!("session {session} was replaced by session {current}"),
        ),
        RollupVerdict::Quarantined { held, need_rows } => (
            mesh::RollupOutcome::Quarantined,
            rows(need_rows),
            format!(
                "held {held} consecutive drop(s); {} more confirmation(s) apply it",
                QUARANTINE_CONFIRMATIONS.saturating_sub(held)
            ),
        ),
    };
    mesh::ApplyRollupResponse {
        outcome: outcome as i32,
        need_rows,
        detail,
        shard_epoch: decide.epoch_i64(),
        coordinator_term: decide.coordinator_term(),
    }
}

/// SessionOpened: the gateway installed a session; its machines are resynced.
pub async fn session_opened(
    decide: &Decide,
    req: &mesh::SessionOpenedRequest,
) -> Result<mesh::SessionOpenedResponse, DecideError> {
    if req.cluster_id.is_empty() {
        return Err(DecideError::Invalid(
            "cluster_id must not be empty".to_owned(),
        ));
    }
    let resynced = decide
        .session_opened(&req.cluster_id, req.session_id, &req.protocol_version)
        .await;
    Ok(mesh::SessionOpenedResponse {
        shard_epoch: decide.epoch_i64(),
        coordinator_term: decide.coordinator_term(),
        resync_machines: i32::try_from(resynced).unwrap_or(i32::MAX),
    })
}

/// SessionClosed: the gateway's session for a cluster ended.
pub fn session_closed(decide: &Decide, req: &mesh::SessionClosedRequest) {
    decide.session_closed(&req.cluster_id, req.session_id, &req.reason);
}

/// The wire form of a hand-out.
pub fn work_item(grant: WorkGrant) -> mesh::WorkItem {
    let wire = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    mesh::WorkItem {
        action_id: grant.action_id,
        action: Some(action_to_proto(&grant.action)),
        machine: grant.machine.as_ref().map(machine_view),
        fencing: Some(mesh::Fencing {
            shard_id: grant.shard_id,
            epoch: wire(grant.epoch),
            sequence_base: wire(grant.sequence_base),
            sequence_limit: wire(grant.sequence_limit),
        }),
        cycle: grant.cycle,
        trace_context: grant.trace_context.into_iter().collect(),
    }
}

/// The next hand-out for Work stream `stream`, in wire form.
pub async fn hand_out(decide: &Decide, stream: u64) -> Option<mesh::WorkItem> {
    decide.hand_out(stream).await.map(work_item)
}

/// A worker's Done report.
pub fn done(decide: &Decide, done: &mesh::worker_message::Done) {
    decide.done(&done.action_id, &done.outcome);
}

/// Transition: validates and converts a worker's report (a malformed provider view is
/// counted as a rejected machine), applies it, and answers with the machine as decide
/// now holds it.
pub async fn transition(
    decide: &Decide,
    req: &mesh::TransitionRequest,
) -> Result<pb::Machine, DecideError> {
    let state =
        |s: i32| machine_state_from_proto(s).map_err(|e| DecideError::Invalid(e.to_string()));
    let (from, to) = (state(req.from_state)?, state(req.to_state)?);
    let wire = req.patch.clone().unwrap_or_default();
    let provider_view = match &wire.provider_view {
        Some(v) => Some(machine_from_proto(v).map_err(|e| {
            decide
                .metrics()
                .machines_rejected
                .with_label_values(&[e.reason()])
                .inc();
            DecideError::Invalid(format!("provider_view: {e}"))
        })?),
        None => None,
    };
    let patch = MachinePatch {
        cluster: wire.cluster,
        host: wire.host.map(|h| Host {
            provider: h.provider,
            reference: h.r#ref,
        }),
        assigned_priority: wire.assigned_priority,
        assigned_interruption_penalty_dollars: wire.assigned_interruption_penalty_dollars,
        assigned_reclamation_penalty_dollars: wire.assigned_reclamation_penalty_dollars,
        assigned_need_fingerprint: wire.assigned_need_fingerprint,
        assigned_group: wire.assigned_group,
        last_error: wire.last_error,
        shard_metadata: wire.shard_metadata.into_iter().collect(),
        provider_view,
    };
    let machine = decide
        .transition(Transition {
            machine_id: req.machine_id.clone(),
            action_id: req.action_id.clone(),
            from,
            to,
            patch,
            reason: req.reason.clone(),
        })
        .await?;
    Ok(machine_view(&machine))
}
