//! Ingest: roll-ups and session events. Never waits for a cycle (issue 17).
//!
//! Everything ingest touches lives in one room, [`Intake`], behind the intake
//! lock (level 1, [`crate::locks`]); the cycle takes that lock only for a moment
//! to collect what changed. Conversion and validation run before the lock. An
//! identical re-send — the same [`RollupFingerprint`] as the demand in force,
//! nothing held by the quarantine — is answered from the fingerprint alone: no
//! conversion, no demand applied, no cycle woken (ADR-0111).

use crate::demand::{ClusterChange, DemandChanges};
use crate::errors::DecideError;
use crate::needs::NeedsTable;
use crate::publish::SessionSink;
use crate::rails::{Admission, QuarantineGuard};
use crate::shard::Decide;
use crate::trace::{RollupTraces, current_trace_context};
use bigfleet_conv::{
    ConvError, RollupFingerprint, node_state_update, rollup_fingerprint, rollup_from_proto_with,
};
use bigfleet_model::Machine;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use rustc_hash::FxHashMap;
use std::time::Instant;

/// The ingest room: demand in force, sessions, the quarantine, the first-roll-up
/// gate and what changed since the last cycle took it.
#[derive(Debug)]
pub(crate) struct Intake {
    pub(crate) needs: NeedsTable,
    pub(crate) guard: QuarantineGuard,
    /// Live session per cluster (the gateway's view).
    pub(crate) sessions: FxHashMap<String, u64>,
    /// Per cluster, the trace of the roll-up that last changed its demand (ADR-0080).
    pub(crate) traces: RollupTraces,
    /// Fingerprint of each cluster's demand in force.
    applied: FxHashMap<String, RollupFingerprint>,
    /// Clusters whose demand changed since the last take, and when the first change was
    /// accepted.
    changed: FxHashMap<String, Instant>,
    /// Clusters whose first-roll-up gate opened since the last take.
    gate_opened: Vec<String>,
    /// Clusters whose session opened since the last take (their hints start over).
    sessions_opened: Vec<String>,
}

/// What the cycle collects from ingest at its start.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub(crate) demand: DemandChanges,
    pub(crate) gate_opened: Vec<String>,
    pub(crate) sessions_opened: Vec<String>,
}

impl Intake {
    pub(crate) fn new(guard: QuarantineGuard) -> Self {
        Intake {
            needs: NeedsTable::new(),
            guard,
            sessions: FxHashMap::default(),
            traces: RollupTraces::default(),
            applied: FxHashMap::default(),
            changed: FxHashMap::default(),
            gate_opened: Vec::new(),
            sessions_opened: Vec::new(),
        }
    }

    /// Whether `fp` is `cluster`'s demand in force with nothing held against it (a
    /// held drop must see the re-send to reset its count of consecutive drops).
    fn unchanged(&self, cluster: &str, fp: RollupFingerprint) -> bool {
        self.applied.get(cluster) == Some(&fp) && self.guard.held(cluster) == 0
    }

    /// Everything that changed since the last call.
    pub(crate) fn take(&mut self) -> Taken {
        let mut clusters: Vec<ClusterChange> = self
            .changed
            .drain()
            .map(|(cluster, accepted_at)| ClusterChange {
                needs: self.needs.needs_of(&cluster).to_vec(),
                cluster,
                accepted_at,
            })
            .collect();
        clusters.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        Taken {
            demand: DemandChanges { clusters },
            gate_opened: std::mem::take(&mut self.gate_opened),
            sessions_opened: std::mem::take(&mut self.sessions_opened),
        }
    }
}

impl Decide {
    /// The single ingest point for demand: recognises an identical re-send, else
    /// converts and validates, applies the quarantine and the first-roll-up gate,
    /// replaces the cluster's demand and wakes the cycle.
    pub fn apply_rollup(
        &self,
        req: &mesh::ApplyRollupRequest,
    ) -> Result<mesh::ApplyRollupResponse, DecideError> {
        let inner = &self.inner;
        let empty = pb::ClusterCapacityNeeds::default();
        let wire = req.rollup.as_ref().unwrap_or(&empty);
        let fp = rollup_fingerprint(wire);
        let mut resp = mesh::ApplyRollupResponse {
            shard_epoch: self.epoch_i64(),
            coordinator_term: self.coordinator_term(),
            ..Default::default()
        };
        {
            let intake = inner.intake.lock();
            // A roll-up from a replaced session may still be in flight when the newer
            // session's first roll-up has landed; applying it would overwrite newer demand
            // with older (issue 16). Session ids grow across gateway restarts
            // (clock-seeded), and the gateway reports SessionOpened before it forwards any
            // roll-up of that session.
            if req.session_id != 0
                && let Some(&current) = intake.sessions.get(&wire.cluster_id)
                && current > req.session_id
            {
                drop(intake);
                inner.metrics.rollups_superseded.inc();
                tracing::info!(
                    cluster = %bigfleet_telemetry::clip(&wire.cluster_id),
                    session = req.session_id,
                    current,
                    "roll-up from a replaced session dropped"
                );
                resp.outcome = mesh::RollupOutcome::Superseded as i32;
                resp.detail = format!(
                    "session {} was replaced by session {current}",
                    req.session_id
                );
                return Ok(resp);
            }
            if !wire.cluster_id.is_empty() && intake.unchanged(&wire.cluster_id, fp) {
                let rows = intake.needs.rows_of(&wire.cluster_id);
                drop(intake);
                inner.metrics.rollups_unchanged.inc();
                resp.outcome = mesh::RollupOutcome::Accepted as i32;
                resp.need_rows = i32::try_from(rows).unwrap_or(i32::MAX);
                return Ok(resp);
            }
        }
        let rejected = |e: ConvError| {
            if !wire.cluster_id.is_empty() {
                inner
                    .metrics
                    .rollups_rejected
                    .with_label_values(&[
                        bigfleet_telemetry::id_label(&wire.cluster_id),
                        e.reason(),
                    ])
                    .inc();
            }
            tracing::warn!(
                cluster = %bigfleet_telemetry::clip(&wire.cluster_id),
                error = %bigfleet_telemetry::clip(&e.to_string()),
                "roll-up rejected"
            );
            DecideError::Rollup(e)
        };
        let config = self.config();
        let rollup = rollup_from_proto_with(wire, &config.rollup_limits).map_err(rejected)?;
        let cluster = rollup.cluster.clone();
        let rows = rollup.needs.len();
        let totals = crate::rails::requested_totals(&rollup.needs);
        let fps: Vec<String> = rollup
            .needs
            .iter()
            .map(|n| n.fingerprint().to_owned())
            .collect();
        let now = self.now();
        let received = if req.received_at_unix_nanos > 0 {
            req.received_at_unix_nanos
        } else {
            now
        };
        let trace = current_trace_context();
        let mut intake = inner.intake.lock();
        // The shard-wide dimension bound (ADR-0104), before the roll-up has any effect
        // (first-roll-up gate, quarantine), under the same lock that replaces the demand
        // so two clusters' roll-ups cannot pass it together.
        intake
            .needs
            .check_dimensions(&cluster, &rollup.needs, config.max_shard_dimensions)
            .map_err(rejected)?;
        let accepted_before = intake.guard.accepted(&cluster);
        let admission = intake.guard.admit(&cluster, rows, &totals);
        let held = intake.guard.held(&cluster);
        if admission == Admission::Unjudged {
            drop(intake);
            // Before the first reconcile decide has no baseline for a cluster it has not
            // heard from since it started (ADR-0105); the operator re-sends on its interval.
            tracing::info!(cluster = %bigfleet_telemetry::clip(&cluster), rows, "roll-up before the first provider reconcile; not judged");
            return Err(DecideError::NotReady(
                "the quarantine baseline is rebuilt from the first provider reconcile; re-send"
                    .to_owned(),
            ));
        }
        // Any roll-up proves the operator reported (ADR-0036); a held one opens the gate
        // only while earlier demand of this process stays in force (ADR-0105).
        if admission.opens_gate(accepted_before) {
            intake.gate_opened.push(cluster.clone());
        }
        if let Admission::Hold(n) = admission {
            let in_force = intake.needs.rows_of(&cluster);
            drop(intake);
            inner
                .metrics
                .rollup_quarantined
                .with_label_values(&[&cluster])
                .set(i64::from(held));
            tracing::warn!(cluster = %cluster, rows, held = n, "roll-up drops most demand; quarantined");
            resp.outcome = mesh::RollupOutcome::Quarantined as i32;
            resp.detail = format!(
                "held {n} consecutive drop(s); {} more confirmation(s) apply it",
                crate::rails::QUARANTINE_CONFIRMATIONS - n
            );
            resp.need_rows = i32::try_from(in_force).unwrap_or(i32::MAX);
            return Ok(resp);
        }
        let in_force = intake.needs.replace(&cluster, rollup.needs, received);
        let changed = intake.applied.insert(cluster.clone(), fp) != Some(fp);
        if changed {
            intake
                .changed
                .entry(cluster.clone())
                .or_insert_with(Instant::now);
            intake.traces.record(&cluster, trace, Instant::now());
        }
        drop(intake);
        inner
            .metrics
            .rollup_quarantined
            .with_label_values(&[&cluster])
            .set(0);
        if admission == Admission::AcceptConfirmed {
            tracing::warn!(cluster = %cluster, rows, "demand drop confirmed by consecutive roll-ups; applying");
        }
        inner
            .provisioning
            .lock()
            .observe_demand(&cluster, fps.iter().map(String::as_str), now);
        resp.outcome = mesh::RollupOutcome::Accepted as i32;
        resp.need_rows = i32::try_from(in_force).unwrap_or(i32::MAX);
        if changed {
            inner
                .metrics
                .cycle_wakeups
                .with_label_values(&["rollup"])
                .inc();
            self.wake();
        }
        Ok(resp)
    }

    /// A session became live: mark the cluster connected and resync every
    /// machine bound to it.
    pub async fn session_opened(
        &self,
        req: &mesh::SessionOpenedRequest,
    ) -> mesh::SessionOpenedResponse {
        let inner = &self.inner;
        {
            let mut intake = inner.intake.lock();
            let s = &mut intake.sessions;
            let event = match s.insert(req.cluster_id.clone(), req.session_id) {
                Some(prev) if prev != req.session_id => "replaced",
                Some(_) => "reopened",
                None => "installed",
            };
            if event != "reopened" {
                inner
                    .metrics
                    .session_lifecycle
                    .with_label_values(&[event])
                    .inc();
            }
            inner.metrics.active_sessions.set(s.len() as i64);
            intake.sessions_opened.push(req.cluster_id.clone());
        }
        inner.hints.lock().forget(&req.cluster_id);
        debug_assert_eq!(
            crate::locks::tracked_held(),
            0,
            "inventory is the outermost lock"
        );
        let inv = inner.inventory.read().await;
        let mut n: i32 = 0;
        for m in inv.bound_to(&req.cluster_id) {
            self.publish_node(&m, &req.cluster_id);
            n += 1;
        }
        tracing::info!(cluster = %req.cluster_id, session = req.session_id, protocol = %req.protocol_version, resync = n, "session opened");
        mesh::SessionOpenedResponse {
            shard_epoch: self.epoch_i64(),
            coordinator_term: self.coordinator_term(),
            resync_machines: n,
        }
    }

    /// A session ended: forget the cluster's hint state (a stale close for a
    /// replaced session is ignored).
    pub fn session_closed(&self, req: &mesh::SessionClosedRequest) {
        let inner = &self.inner;
        {
            let mut intake = inner.intake.lock();
            let s = &mut intake.sessions;
            match s.get(&req.cluster_id) {
                Some(&current) if current != req.session_id => {
                    tracing::debug!(cluster = %req.cluster_id, session = req.session_id, current, "stale session close ignored");
                    return;
                }
                Some(_) => {
                    s.remove(&req.cluster_id);
                    inner
                        .metrics
                        .session_lifecycle
                        .with_label_values(&["removed"])
                        .inc();
                }
                None => {}
            }
            inner.metrics.active_sessions.set(s.len() as i64);
        }
        inner.hints.lock().forget(&req.cluster_id);
        tracing::info!(cluster = %req.cluster_id, session = req.session_id, reason = %req.reason, "session closed");
    }

    pub(crate) fn publish_node(&self, m: &Machine, cluster: &str) {
        self.publish_frame(cluster, node_state_update(m, cluster));
    }

    pub(crate) fn publish_frame(&self, cluster: &str, frame: pb::NodeStateUpdate) {
        self.inner.publisher.publish(mesh::ShardEvent {
            cluster_id: cluster.to_owned(),
            supersedes_key: frame.supersedes_key.clone(),
            frame: Some(mesh::shard_event::Frame::NodeStateUpdate(frame)),
        });
    }
}

impl SessionSink for Decide {
    fn sessions_live(&self, sessions: Vec<(String, u64)>) {
        let mut intake = self.inner.intake.lock();
        // Only the gateway knows which sessions exist; replace our view.
        intake.sessions = sessions.into_iter().collect();
        self.inner
            .metrics
            .active_sessions
            .set(intake.sessions.len() as i64);
    }
}
