//! `bigfleet shortfalls`, `domains` and `transfers`: what the fleet could not place, where
//! its topology domains are pinned, and the transfers moving them.

use serde::{Deserialize, Serialize};
use svc_inspect::view::{DomainView, ShortfallView, TransfersView, resources_text};

use super::{fleet_overview, fleet_summary, timestamp_cell};
use crate::Context;
use crate::error::CliError;
use crate::output::{Column, Listing, Render, dash_unless, or_dash};

/// `bigfleet shortfalls`: serialised as a plain list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shortfalls(pub Vec<ShortfallView>);

/// `bigfleet domains`: serialised as a plain list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Domains(pub Vec<DomainView>);

/// The fleet's shortfalls, oldest first.
pub async fn shortfalls(ctx: &Context, limit: usize) -> Result<Shortfalls, CliError> {
    if let Some(addr) = &ctx.inspect {
        let max = u32::try_from(limit.max(1)).unwrap_or(u32::MAX);
        let s = fleet_summary(ctx, addr, max).await?;
        return Ok(Shortfalls(
            s.shortfalls.iter().map(ShortfallView::from_proto).collect(),
        ));
    }
    let o = fleet_overview(ctx).await?;
    Ok(Shortfalls(
        o.shortfalls
            .iter()
            .take(limit.max(1))
            .map(ShortfallView::from_proto)
            .collect(),
    ))
}

impl Render for Shortfalls {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "shortfall",
            vec![
                Column::number("AGE (CYCLES)"),
                Column::number("PRIO"),
                Column::text("SHARD"),
                Column::text("CLUSTER"),
                Column::text("DEFICIT"),
                Column::text("REQUIREMENTS"),
                Column::text("INTERRUPTION").wide(),
            ],
        )
        .when_empty("no shard reports unmet demand");
        for (i, s) in self.0.iter().enumerate() {
            // Shortfalls have no identity of their own: shard, cluster and rank.
            let cluster = if s.cluster_id.is_empty() {
                "-"
            } else {
                &s.cluster_id
            };
            t.row(
                format!("{}/{cluster}/{}", s.shard_id, i + 1),
                vec![
                    s.age_cycles.to_string(),
                    s.priority.to_string(),
                    s.shard_id.clone(),
                    or_dash(s.cluster_id.clone()),
                    or_dash(resources_text(&s.deficit)),
                    or_dash(s.requirements.join("; ")),
                    or_dash(s.interruption_penalty_bucket.clone()),
                ],
            );
        }
        t
    }
}

/// Topology domains pinned to shards (always from the coordinator).
pub async fn domains(ctx: &Context) -> Result<Domains, CliError> {
    let list = ctx
        .on_coordinator(async |c| c.list_domain_assignments().await)
        .await?;
    Ok(Domains(list.iter().map(DomainView::from_proto).collect()))
}

impl Render for Domains {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "domain",
            vec![
                Column::text("KEY"),
                Column::text("VALUE"),
                Column::text("SHARD"),
            ],
        )
        .when_empty("no domain is pinned to a shard");
        for d in &self.0 {
            t.row(
                format!("{}={}", d.topology_key, d.topology_value),
                vec![
                    d.topology_key.clone(),
                    d.topology_value.clone(),
                    d.shard_id.clone(),
                ],
            );
        }
        t
    }
}

/// `bigfleet transfers`: the coordinator's transfer picture (ADR-0139).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Transfers(pub TransfersView);

/// Transfers in flight and recently finished, and each shard's domains (always from the
/// coordinator; `shard` non-empty: only what involves that shard).
pub async fn transfers(ctx: &Context, shard: &str) -> Result<Transfers, CliError> {
    let v = ctx
        .on_coordinator(async |c| c.list_transfers(shard).await)
        .await?;
    Ok(Transfers(TransfersView::from_proto(&v)))
}

impl Render for Transfers {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "transfer",
            vec![
                Column::text("TRANSFER"),
                Column::text("KIND"),
                Column::text("PHASE"),
                Column::text("DONOR"),
                Column::text("RECIPIENT"),
                Column::text("ASKED"),
                Column::number("MOVED"),
                Column::text("PENDING"),
                Column::number("PRIO").wide(),
                Column::text("MACHINES").wide(),
                Column::text("STARTED").wide(),
                Column::text("UPDATED").wide(),
                Column::text("REASON").wide(),
            ],
        )
        .when_empty("no transfer in flight or recently finished");
        // Ownership first: which shard owns what, and what it has not acknowledged yet.
        for s in &self.0.shards {
            t.preamble.push(format!(
                "shard {}: domains {}; pending instructions {}",
                s.shard_id,
                or_dash(s.domains.join(",")),
                or_dash(s.pending_instruction_ids.join(",")),
            ));
        }
        if !self.0.shards.is_empty() {
            t.preamble.push(String::new());
        }
        for x in self.0.active.iter().chain(&self.0.recent) {
            t.row(
                x.transfer_id.clone(),
                vec![
                    x.transfer_id.clone(),
                    x.kind.clone(),
                    x.phase.clone(),
                    x.donor_shard_id.clone(),
                    x.recipient_shard_id.clone(),
                    x.selector_text(),
                    x.moved.to_string(),
                    dash_unless(x.is_active(), || {
                        format!("{}->{}", x.pending_instruction_id, x.pending_shard_id)
                    }),
                    x.priority.to_string(),
                    or_dash(x.machine_ids.join(",")),
                    timestamp_cell(x.started_at_unix_ns),
                    timestamp_cell(x.updated_at_unix_ns),
                    or_dash(x.reason.clone()),
                ],
            );
        }
        t
    }
}
