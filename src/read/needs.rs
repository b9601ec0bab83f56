//! `bigfleet needs`: one cluster's needs with the newest verdicts.

use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use serde::{Deserialize, Serialize};
use svc_inspect::grpc::{COORDINATOR_ERROR_METADATA_KEY, UNREACHABLE_SHARDS_METADATA_KEY};
use svc_inspect::view::{NeedRow, resources_text};
use tonic::Status;

use super::{fleet_error, inspect_call, svc_inspect_timestamp, timestamp_cell};
use crate::Context;
use crate::error::CliError;
use crate::output::{Column, Listing, Render, dash_unless, or_dash};

/// `bigfleet needs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeedsOutput {
    pub cluster_id: String,
    /// Oldest cycle among the shards that answered; 0: no verdicts yet.
    pub cycle: i64,
    pub computed_at_unix_nanos: i64,
    /// The cluster's needs before `--unmet` and `--limit`.
    pub total_needs: i32,
    /// `shard=error` for every shard that did not answer.
    pub unreachable_shards: Vec<String>,
    pub coordinator_error: String,
    pub needs: Vec<NeedRow>,
}

/// One cluster's needs (newest verdicts), optionally only the unmet ones.
pub async fn needs(
    ctx: &Context,
    cluster: &str,
    unmet: bool,
    limit: usize,
) -> Result<NeedsOutput, CliError> {
    // The unmet filter runs here, so the limit can only be pushed down without it.
    let fetch_limit = if unmet { 0 } else { limit };
    let mut out = match &ctx.inspect {
        Some(addr) => needs_via_inspect(ctx, addr, cluster, fetch_limit).await?,
        None => needs_direct(ctx, cluster, fetch_limit).await?,
    };
    if unmet {
        out.needs.retain(|n| !n.satisfied);
    }
    if limit > 0 {
        out.needs.truncate(limit);
    }
    Ok(out)
}

async fn needs_via_inspect(
    ctx: &Context,
    addr: &str,
    cluster: &str,
    limit: usize,
) -> Result<NeedsOutput, CliError> {
    let mut client = ShardReadClient::new(ctx.inspect_channel(addr)?);
    let call = async {
        let resp = client
            .inspect_needs(pb::InspectNeedsRequest {
                cluster_id: cluster.to_owned(),
                limit: i32::try_from(limit).unwrap_or(i32::MAX),
            })
            .await?;
        let md = resp.metadata().clone();
        let mut stream = resp.into_inner();
        let mut header = None;
        let mut rows = Vec::new();
        while let Some(frame) = stream.message().await? {
            match frame.frame {
                Some(pb::inspect_needs_response::Frame::Header(h)) if header.is_none() => {
                    header = Some(h)
                }
                Some(pb::inspect_needs_response::Frame::Need(v)) if header.is_some() => {
                    rows.push(NeedRow::from_proto(None, &v));
                }
                _ => {
                    return Err(Status::internal(
                        "protocol error: header must come first and once",
                    ));
                }
            }
        }
        let header = header.ok_or_else(|| Status::internal("protocol error: no header frame"))?;
        Ok::<_, Status>((header, rows, md))
    };
    let (header, rows, md) = inspect_call(ctx, addr, "InspectNeeds", call).await?;
    let meta = |key: &str| {
        md.get(key)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    Ok(NeedsOutput {
        cluster_id: cluster.to_owned(),
        cycle: header.cycle,
        computed_at_unix_nanos: header.computed_at_unix_nanos,
        total_needs: header.total_needs,
        unreachable_shards: meta(UNREACHABLE_SHARDS_METADATA_KEY)
            .split("; ")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        coordinator_error: meta(COORDINATOR_ERROR_METADATA_KEY),
        needs: rows,
    })
}

async fn needs_direct(ctx: &Context, cluster: &str, limit: usize) -> Result<NeedsOutput, CliError> {
    let n = ctx
        .fleet()?
        .needs(cluster, limit)
        .await
        .map_err(|e| fleet_error(ctx, e))?;
    let unreachable: Vec<String> = n
        .unreachable()
        .map(|s| format!("{}={}", s.shard_id, s.error))
        .collect();
    if !n.shards.is_empty() && unreachable.len() == n.shards.len() {
        return Err(CliError::NoShardReachable(unreachable.join("; ")));
    }
    let header = n.header();
    Ok(NeedsOutput {
        cluster_id: cluster.to_owned(),
        cycle: header.cycle,
        computed_at_unix_nanos: header.computed_at_unix_nanos,
        total_needs: header.total_needs,
        unreachable_shards: unreachable,
        coordinator_error: n.coordinator_error.clone(),
        needs: n
            .rows
            .iter()
            .map(|r| NeedRow::from_proto(Some(&r.shard_id), &r.view))
            .collect(),
    })
}

fn reason_label(reason: &str) -> &str {
    match reason {
        "PRIORITY_STARVED" => "priority-starved",
        "NO_MATCHING_SUPPLY" => "no-matching-supply",
        "TOPOLOGY_UNSATISFIABLE" => "topology-unsatisfiable",
        "PREEMPTION_EXHAUSTED" => "preemption-exhausted",
        "" => "unclassified",
        other => other,
    }
}

impl Render for NeedsOutput {
    fn listing(&self) -> Listing {
        // Through svc-inspect the shard of a row is not known: no empty column then.
        let with_shard = self.needs.iter().any(|n| n.shard_id.is_some());
        let mut columns = vec![
            Column::number("#"),
            Column::number("PRIO"),
            Column::text("STATUS"),
            Column::text("REASON"),
            Column::text("DEMAND"),
            Column::text("DEFICIT"),
            Column::number("CLAIMED"),
            Column::text("SUPPLY I/C/S"),
            Column::text("PREEMPT"),
            Column::text("SAME-DOMAIN"),
            Column::number("UNMET CYCLES"),
        ];
        if with_shard {
            columns.push(Column::text("SHARD"));
        }
        columns.extend([
            Column::text("ARRIVED").wide(),
            Column::text("GROUP").wide(),
            Column::text("REQUIREMENTS").wide(),
            Column::text("FINGERPRINT").wide(),
        ]);
        let mut t = Listing::new("need", columns);
        if self.cycle == 0 && self.needs.is_empty() {
            t.empty = format!(
                "cluster {}: no verdicts yet (no decision cycle has run on a shard holding it)",
                self.cluster_id
            );
            return t;
        }
        let unmet = self.needs.iter().filter(|n| !n.satisfied).count();
        t.preamble.push(format!(
            "cluster {}: {} needs on the shards; showing {} ({} unmet); verdicts from cycle {}{}",
            self.cluster_id,
            self.total_needs,
            self.needs.len(),
            unmet,
            self.cycle,
            match svc_inspect_timestamp(self.computed_at_unix_nanos) {
                Some(t) => format!(" at {t}"),
                None => String::new(),
            }
        ));
        for (i, n) in self.needs.iter().enumerate() {
            let supply = n.matching_supply.as_ref().map_or(String::new(), |m| {
                format!(
                    "{}/{}/{}{}",
                    m.idle,
                    m.configured,
                    m.speculative,
                    if m.capped { "+" } else { "" }
                )
            });
            let preempt = n.preemption.as_ref().map_or(String::new(), |p| {
                format!(
                    "{} victims, {}",
                    p.victims_found,
                    resources_text(&p.capacity_freed)
                )
            });
            let mut same = n.same_domain.clone();
            if let Some(best) = n.same_candidates.first()
                && same.is_empty()
            {
                same = format!("best {} {}‰", best.domain, best.coverage_per_mille);
            }
            if n.acquisition_parked {
                same.push_str(" (parked)");
            }
            let mut row = vec![
                (i + 1).to_string(),
                n.priority.to_string(),
                if n.satisfied {
                    "satisfied".to_owned()
                } else {
                    "UNMET".to_owned()
                },
                dash_unless(!n.satisfied, || reason_label(&n.unmet_reason).to_owned()),
                or_dash(resources_text(&n.aggregate_resources)),
                or_dash(resources_text(&n.residual_deficit)),
                n.claimed_machine_count.to_string(),
                or_dash(supply),
                or_dash(preempt),
                or_dash(same.trim().to_owned()),
                n.age_cycles_unmet.to_string(),
            ];
            if with_shard {
                row.push(or_dash(n.shard_id.clone().unwrap_or_default()));
            }
            row.extend([
                timestamp_cell(n.arrival_unix_nanos),
                or_dash(n.group.clone()),
                or_dash(n.requirements.join("; ")),
                or_dash(n.profile_fingerprint.clone()),
            ]);
            // A need is known by its cluster and profile fingerprint (ADR-0116).
            let name = if n.profile_fingerprint.is_empty() {
                format!("{}/{}", n.cluster_id, i + 1)
            } else {
                format!("{}/{}", n.cluster_id, n.profile_fingerprint)
            };
            t.row(name, row);
        }
        t
    }
}

pub fn needs_warnings(o: &NeedsOutput) -> Vec<String> {
    let mut w: Vec<String> = o
        .unreachable_shards
        .iter()
        .map(|s| match s.split_once('=') {
            Some((id, e)) => format!("shard {id} did not answer ({e}); its needs are missing"),
            None => format!("a shard did not answer: {s}"),
        })
        .collect();
    if !o.coordinator_error.is_empty() {
        w.push(format!(
            "coordinator unreachable; shard list from an earlier answer: {}",
            o.coordinator_error
        ));
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use svc_inspect::view::SupplyView;

    fn row(satisfied: bool, reason: &str) -> NeedRow {
        NeedRow {
            shard_id: Some("s1".into()),
            cluster_id: "c".into(),
            priority: 5,
            satisfied,
            unmet_reason: reason.into(),
            aggregate_resources: [("cpu".to_owned(), "8".to_owned())].into(),
            claimed_machine_count: 2,
            matching_supply: (!satisfied).then_some(SupplyView {
                idle: 1,
                configured: 2,
                speculative: 3,
                capped: true,
            }),
            ..NeedRow::default()
        }
    }

    fn table() -> crate::output::OutputOptions {
        crate::output::OutputOptions::new(crate::output::OutputFormat::Table)
    }

    #[test]
    fn needs_tables_show_verdicts() {
        let o = NeedsOutput {
            cluster_id: "c".into(),
            cycle: 7,
            computed_at_unix_nanos: 0,
            total_needs: 2,
            unreachable_shards: vec!["s3=unavailable: refused".into()],
            coordinator_error: String::new(),
            needs: vec![row(false, "NO_MATCHING_SUPPLY"), row(true, "")],
        };
        let text = crate::output::render(&o, table()).unwrap();
        assert!(
            text.starts_with(
                "cluster c: 2 needs on the shards; showing 2 (1 unmet); verdicts from cycle 7\n"
            ),
            "{text}"
        );
        assert!(text.contains("UNMET"));
        assert!(text.contains("no-matching-supply"));
        assert!(text.contains("1/2/3+"));
        assert_eq!(
            needs_warnings(&o),
            vec!["shard s3 did not answer (unavailable: refused); its needs are missing"]
        );
        let empty = NeedsOutput {
            cycle: 0,
            needs: vec![],
            ..o
        };
        assert!(
            crate::output::render(&empty, table())
                .unwrap()
                .contains("no verdicts yet")
        );
    }
}
