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
use bigfleet_conv::{ConvError, Rollup, RollupFingerprint, node_state_update};
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

/// What became of a roll-up, in domain terms; the service edge turns it into the wire
/// answer (`crate::edge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollupVerdict {
    /// The roll-up's demand is in force (applied now, or identical to what was):
    /// `need_rows` rows for its cluster.
    Accepted { need_rows: usize },
    /// It came from `session`, which `current` has replaced: dropped.
    Superseded { session: u64, current: u64 },
    /// The quarantine holds it: `held` consecutive drops so far, `need_rows` rows of
    /// earlier demand stay in force.
    Quarantined { held: u32, need_rows: usize },
}

impl Decide {
    /// The answer to a roll-up that needs no conversion: one from a replaced session,
    /// or an identical re-send of the cluster's demand in force with nothing held
    /// against it (ADR-0111). `None`: convert it and call [`Decide::apply_rollup`].
    pub fn rollup_precheck(
        &self,
        cluster: &str,
        session: u64,
        fingerprint: RollupFingerprint,
    ) -> Option<RollupVerdict> {
        let inner = &self.inner;
        let intake = inner.intake.lock();
        // A roll-up from a replaced session may still be in flight when the newer
        // session's first roll-up has landed; applying it would overwrite newer demand
        // with older (issue 16). Session ids grow across gateway restarts
        // (clock-seeded), and the gateway reports SessionOpened before it forwards any
        // roll-up of that session.
        if session != 0
            && let Some(&current) = intake.sessions.get(cluster)
            && current > session
        {
            drop(intake);
            inner.metrics.rollups_superseded.inc();
            tracing::info!(
                cluster = %bigfleet_telemetry::clip(cluster),
                session,
                current,
                "roll-up from a replaced session dropped"
            );
            return Some(RollupVerdict::Superseded { session, current });
        }
        if !cluster.is_empty() && intake.unchanged(cluster, fingerprint) {
            let need_rows = intake.needs.rows_of(cluster);
            drop(intake);
            inner.metrics.rollups_unchanged.inc();
            return Some(RollupVerdict::Accepted { need_rows });
        }
        None
    }

    /// Counts and logs a roll-up refused as invalid, and gives the error to return.
    pub(crate) fn rollup_rejected(&self, cluster: &str, e: ConvError) -> DecideError {
        if !cluster.is_empty() {
            self.inner
                .metrics
                .rollups_rejected
                .with_label_values(&[bigfleet_telemetry::id_label(cluster), e.reason()])
                .inc();
        }
        tracing::warn!(
            cluster = %bigfleet_telemetry::clip(cluster),
            error = %bigfleet_telemetry::clip(&e.to_string()),
            "roll-up rejected"
        );
        DecideError::Rollup(e)
    }

    /// The single ingest point for demand: applies a converted, validated roll-up
    /// (its wire form's `fingerprint` recognises later identical re-sends) through
    /// the shard-wide dimension bound, the quarantine and the first-roll-up gate,
    /// replaces the cluster's demand and wakes the cycle if it changed.
    /// `received_at_unix_nanos` is when the gateway received it (0: now).
    pub fn apply_rollup(
        &self,
        rollup: Rollup,
        fingerprint: RollupFingerprint,
        received_at_unix_nanos: i64,
    ) -> Result<RollupVerdict, DecideError> {
        let inner = &self.inner;
        let config = self.config();
        let cluster = rollup.cluster.clone();
        let rows = rollup.needs.len();
        let totals = crate::rails::requested_totals(&rollup.needs);
        let fps: Vec<String> = rollup
            .needs
            .iter()
            .map(|n| n.fingerprint().to_owned())
            .collect();
        let now = self.now();
        let received = if received_at_unix_nanos > 0 {
            received_at_unix_nanos
        } else {
            now
        };
        let trace = current_trace_context();
        let mut intake = inner.intake.lock();
        // The shard-wide dimension bound (ADR-0104), before the roll-up has any effect
        // (first-roll-up gate, quarantine), under the same lock that replaces the demand
        // so two clusters' roll-ups cannot pass it together.
        if let Err(e) =
            intake
                .needs
                .check_dimensions(&cluster, &rollup.needs, config.max_shard_dimensions)
        {
            drop(intake);
            return Err(self.rollup_rejected(&cluster, e));
        }
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
        // Any roll-up proves the operator reported (the original's ADR-0036); a held one
        // opens the gate only while earlier demand of this process stays in force
        // (ADR-0105).
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
            return Ok(RollupVerdict::Quarantined {
                held: n,
                need_rows: in_force,
            });
        }
        let in_force = intake.needs.replace(&cluster, rollup.needs, received);
        let changed = intake.applied.insert(cluster.clone(), fingerprint) != Some(fingerprint);
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
        if changed {
            inner
                .metrics
                .cycle_wakeups
                .with_label_values(&["rollup"])
                .inc();
            self.wake();
        }
        Ok(RollupVerdict::Accepted {
            need_rows: in_force,
        })
    }

    /// A session became live: mark the cluster connected and resync every
    /// machine bound to it.
    /// Returns how many machines were resynced.
    pub async fn session_opened(&self, cluster: &str, session: u64, protocol: &str) -> usize {
        let inner = &self.inner;
        {
            let mut intake = inner.intake.lock();
            let s = &mut intake.sessions;
            let event = match s.insert(cluster.to_owned(), session) {
                Some(prev) if prev != session => "replaced",
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
            intake.sessions_opened.push(cluster.to_owned());
        }
        inner.hints.lock().forget(cluster);
        debug_assert_eq!(
            crate::locks::tracked_held(),
            0,
            "inventory is the outermost lock"
        );
        let inv = inner.inventory.read().await;
        let mut n = 0;
        for m in inv.bound_to(cluster) {
            self.publish_node(&m, cluster);
            n += 1;
        }
        tracing::info!(cluster = %cluster, session, protocol = %protocol, resync = n, "session opened");
        n
    }

    /// A session ended: forget the cluster's hint state (a stale close for a
    /// replaced session is ignored).
    pub fn session_closed(&self, cluster: &str, session: u64, reason: &str) {
        let inner = &self.inner;
        {
            let mut intake = inner.intake.lock();
            let s = &mut intake.sessions;
            match s.get(cluster) {
                Some(&current) if current != session => {
                    tracing::debug!(cluster = %cluster, session, current, "stale session close ignored");
                    return;
                }
                Some(_) => {
                    s.remove(cluster);
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
        inner.hints.lock().forget(cluster);
        tracing::info!(cluster = %cluster, session, reason = %reason, "session closed");
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
