//! The coordinator's Prometheus metrics (names from the original where it had them).

use bigfleet_telemetry::{MetricsRegistry, TelemetryError};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

/// Apply outcome labels of `bigfleet_coordinator_apply_total`.
pub const OUTCOME_SUCCESS: &str = "success";
/// Raft refused or timed out (not leader, no quorum within the apply timeout, shutdown).
pub const OUTCOME_ERROR: &str = "error";
/// Committed, but the state machine refused the command (e.g. domain already assigned).
pub const OUTCOME_FSM_ERROR: &str = "fsm_error";

#[derive(Clone, Debug)]
pub struct Metrics {
    pub raft_term: IntGauge,
    pub apply_total: IntCounterVec,
    pub pending_instructions: IntGaugeVec,
    pub leader_changes: IntCounter,
    pub is_leader: IntGauge,
    pub last_applied_index: IntGauge,
    pub state_entries: IntGaugeVec,
    pub voters: IntGauge,
    pub snapshot_exports: IntCounterVec,
}

impl Metrics {
    pub fn register(reg: &MetricsRegistry) -> Result<Self, TelemetryError> {
        let apply_total = reg.int_counter_vec(
            "bigfleet_coordinator_apply_total",
            "Raft applies by outcome (success, error, fsm_error).",
            &["outcome"],
        )?;
        // Zero-initialise every outcome so rates work from the first scrape.
        for o in [OUTCOME_SUCCESS, OUTCOME_ERROR, OUTCOME_FSM_ERROR] {
            apply_total.with_label_values(&[o]);
        }
        Ok(Self {
            raft_term: reg.int_gauge(
                "bigfleet_coordinator_raft_term",
                "Current Raft term seen by this replica.",
            )?,
            apply_total,
            pending_instructions: reg.int_gauge_vec(
                "bigfleet_coordinator_pending_instructions",
                "Instructions waiting for a shard's acknowledgement (leader only).",
                &["shard"],
            )?,
            leader_changes: reg.int_counter(
                "bigfleet_coordinator_leader_changes_total",
                "Times this replica observed the Raft leader change (including to none).",
            )?,
            is_leader: reg.int_gauge(
                "bigfleet_coordinator_is_leader",
                "1 while this replica is the Raft leader.",
            )?,
            last_applied_index: reg.int_gauge(
                "bigfleet_coordinator_raft_last_applied_index",
                "Index of the last log entry applied to this replica's state machine.",
            )?,
            state_entries: reg.int_gauge_vec(
                "bigfleet_coordinator_state_entries",
                "Entries in this replica's replicated table (table = shards, clusters, domains).",
                &["table"],
            )?,
            voters: reg.int_gauge(
                "bigfleet_coordinator_raft_voters",
                "Voters in the membership this replica knows.",
            )?,
            snapshot_exports: reg.int_counter_vec(
                "bigfleet_coordinator_snapshot_exports_total",
                "Periodic snapshot exports by outcome.",
                &["outcome"],
            )?,
        })
    }

    pub fn apply(&self, outcome: &str) {
        self.apply_total.with_label_values(&[outcome]).inc();
    }
}
