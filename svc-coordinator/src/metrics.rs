//! The coordinator's Prometheus metrics (names from the original where it had them).

use bigfleet_telemetry::{MetricsRegistry, TelemetryError};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use crate::rebalance::SkipReason;
use crate::transfers::{Phase, TransferKind};

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
    pub membership_settled: IntGauge,
    pub snapshot_exports: IntCounterVec,
    pub rebalance_rounds: IntCounter,
    pub rebalance_decisions: IntCounterVec,
    pub rebalance_skipped: IntCounterVec,
    pub rebalance_finished: IntCounterVec,
    pub rebalance_machines_moved: IntCounter,
    pub rebalance_in_flight: IntGauge,
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
        let rebalance_decisions = reg.int_counter_vec(
            "bigfleet_coordinator_rebalance_decisions_total",
            "Transfers the leader's rebalancer started, by kind (transfer_ownership, reassign_speculative, cross_shard_drain).",
            &["kind"],
        )?;
        let rebalance_skipped = reg.int_counter_vec(
            "bigfleet_coordinator_rebalance_skipped_total",
            "Rebalancer rounds that left a shortfall alone, by reason (hysteresis, in_flight, rate_limited, no_supply).",
            &["reason"],
        )?;
        let rebalance_finished = reg.int_counter_vec(
            "bigfleet_coordinator_rebalance_transfers_finished_total",
            "Transfers that finished, by kind and outcome (done, failed).",
            &["kind", "outcome"],
        )?;
        for k in [
            TransferKind::Idle,
            TransferKind::Speculative,
            TransferKind::Drain,
        ] {
            rebalance_decisions.with_label_values(&[k.label()]);
            for o in [Phase::Done, Phase::Failed] {
                rebalance_finished.with_label_values(&[k.label(), o.label()]);
            }
        }
        for r in [
            SkipReason::Hysteresis,
            SkipReason::InFlight,
            SkipReason::RateLimited,
            SkipReason::NoSupply,
        ] {
            rebalance_skipped.with_label_values(&[r.label()]);
        }
        Ok(Self {
            rebalance_rounds: reg.int_counter(
                "bigfleet_coordinator_rebalance_rounds_total",
                "Rebalancer rounds run by this replica while it led.",
            )?,
            rebalance_decisions,
            rebalance_skipped,
            rebalance_finished,
            rebalance_machines_moved: reg.int_counter(
                "bigfleet_coordinator_rebalance_machines_moved_total",
                "Machines whose ownership moved to another shard through a finished transfer.",
            )?,
            rebalance_in_flight: reg.int_gauge(
                "bigfleet_coordinator_rebalance_transfers_in_flight",
                "Transfers in flight in the replicated state (leader only).",
            )?,
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
                "Voters in the membership this replica knows (during a joint change, of both configurations).",
            )?,
            membership_settled: reg.int_gauge(
                "bigfleet_coordinator_raft_membership_settled",
                "1 while the membership this replica knows is one configuration, not a joint change, and applied here.",
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
