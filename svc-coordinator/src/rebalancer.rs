//! The rebalancer's leader-local loop: every `--rebalance-interval`, while this replica
//! leads, it reads the latest reports (soft state) and the transfers (FSM), asks the pure
//! policy in `rebalance` what to do, and proposes the decided transfers through Raft. It
//! never talks to a shard: the transfers' instructions ride back on the shards' own
//! `ReportShard` answers (`service`), and their acks advance the FSM there too.
//!
//! Leadership: the loop runs on every replica but acts only while `leader_term` says this
//! replica leads; on any term change it drops its hysteresis memory (a new leader starts
//! cautious). Transfers themselves are replicated, so a failover loses none of them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::fsm::Command;
use crate::metrics::Metrics;
use crate::rebalance::{self, Inputs, Persistence, Policy, ShardView};
use crate::replica::{Replica, now_unix_ns};
use crate::soft::new_instruction_id;
use crate::transfers::Transfer;

/// The loop's settings (`--rebalance-*`).
#[derive(Debug, Clone)]
pub struct Config {
    pub policy: Policy,
    /// Zero: the loop does not run.
    pub interval: Duration,
    /// Reports older than this are ignored.
    pub report_max_age: Duration,
}

/// Runs until `stop`.
pub async fn run(replica: Arc<Replica>, cfg: Config, stop: CancellationToken) {
    if cfg.interval.is_zero() {
        tracing::info!("rebalancer disabled (--rebalance-interval 0s)");
        return;
    }
    let mut persistence = Persistence::default();
    let mut led: Option<u64> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(cfg.interval) => {}
            () = stop.cancelled() => return,
        }
        let Ok(term) = replica.leader_term() else {
            if led.take().is_some() {
                tracing::info!("rebalancer paused: not the leader");
                persistence.clear();
                replica.metrics.rebalance_in_flight.set(0);
            }
            continue;
        };
        if led != Some(term) {
            persistence.clear();
            led = Some(term);
            let active = replica.shared.read().state.active_transfers().len();
            tracing::info!(
                term,
                transfers_in_flight = active,
                "rebalancer active on the leader; resuming transfers from the replicated state"
            );
        }
        round(&replica, &cfg, term, &mut persistence).await;
    }
}

/// One decision round.
async fn round(replica: &Replica, cfg: &Config, term: u64, persistence: &mut Persistence) {
    let now = now_unix_ns();
    replica.metrics.rebalance_rounds.inc();
    let max_age = i64::try_from(cfg.report_max_age.as_nanos()).unwrap_or(i64::MAX);
    let (registered, active, recent) = {
        let shared = replica.shared.read();
        let st = &shared.state;
        (
            st.shards().into_iter().map(|s| s.id).collect::<Vec<_>>(),
            st.active_transfers(),
            st.recent_transfers(),
        )
    };
    let reports = {
        let mut soft = replica.soft.lock();
        soft.ensure_term(term);
        soft.retain_transfer_sequences(&active.iter().map(|t| t.instruction_id.clone()).collect());
        soft.reports(None)
    };
    let fresh: Vec<_> = reports
        .into_iter()
        .filter(|(id, r)| {
            registered.contains(id) && now.saturating_sub(r.received_at_unix_ns) <= max_age
        })
        .collect();
    let persisted = persistence.observe(
        fresh.iter().flat_map(|(id, r)| {
            r.needs
                .iter()
                .map(move |n| (id.clone(), n.instance_type.clone()))
        }),
        now,
    );
    let views: Vec<ShardView> = fresh
        .iter()
        .map(|(id, r)| rebalance::view_of(id, r.summary.as_ref(), &r.needs, &persisted))
        .collect();
    let decided = rebalance::decide(
        &cfg.policy,
        Inputs {
            shards: &views,
            active: &active,
            recent: &recent,
            now_unix_ns: now,
        },
    );
    for s in &decided.skips {
        replica
            .metrics
            .rebalance_skipped
            .with_label_values(&[s.reason.label()])
            .inc();
        tracing::debug!(
            recipient = %s.recipient,
            instance_type = %s.instance_type,
            reason = s.reason.label(),
            detail = %s.detail,
            "rebalance: shortfall left alone"
        );
    }
    let mut in_flight = active.len();
    for planned in decided.decisions {
        let t = planned.transfer(new_instruction_id(), new_instruction_id(), now);
        match replica
            .apply(Command::StartTransfer {
                transfer: t.clone(),
            })
            .await
        {
            Ok(_) => {
                in_flight += 1;
                replica
                    .metrics
                    .rebalance_decisions
                    .with_label_values(&[t.kind.label()])
                    .inc();
                tracing::info!(
                    transfer = %t.id,
                    kind = t.kind.label(),
                    donor = %t.donor,
                    recipient = %t.recipient,
                    instance_type = %t.instance_type,
                    count = t.count,
                    priority = t.priority,
                    instruction = %t.instruction_id,
                    why = %t.reason,
                    "rebalance: transfer started"
                );
            }
            Err(e) => {
                tracing::warn!(
                    kind = t.kind.label(),
                    donor = %t.donor,
                    recipient = %t.recipient,
                    error = %e,
                    "rebalance: could not start transfer"
                );
                // Leadership lost or no quorum: the next round decides afresh.
                break;
            }
        }
    }
    replica
        .metrics
        .rebalance_in_flight
        .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
}

/// Logs and counts a transfer's step after an ack was applied.
pub fn record_step(metrics: &Metrics, shard: &str, t: &Transfer) {
    tracing::info!(
        transfer = %t.id,
        kind = t.kind.label(),
        donor = %t.donor,
        recipient = %t.recipient,
        acked_by = shard,
        phase = t.phase.label(),
        machines = t.machine_ids.len(),
        reason = %t.reason,
        "rebalance: transfer advanced"
    );
    if !t.phase.is_active() {
        metrics
            .rebalance_finished
            .with_label_values(&[t.kind.label(), t.phase.label()])
            .inc();
        metrics
            .rebalance_machines_moved
            .inc_by(u64::try_from(t.moved()).unwrap_or(0));
    }
}
