//! Read commands: `shards`, `needs`, `shortfalls`, `domains`.
//!
//! With `--inspect` they read through svc-inspect (one call, its cache); without it the CLI
//! does the same fan-out itself — the coordinator's `ListShards`, then every shard's read
//! services — using svc-inspect's library, so both paths show the same data.

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_client::InspectClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use serde::{Deserialize, Serialize};
use svc_inspect::InspectError;
use svc_inspect::grpc::{COORDINATOR_ERROR_METADATA_KEY, UNREACHABLE_SHARDS_METADATA_KEY};
use svc_inspect::view::{DomainView, NeedRow, ShardView, ShortfallView, resources_text};
use tonic::Status;

use crate::Context;
use crate::error::{CliError, RemoteError};
use crate::output::{Column, Listing, Render, or_dash};

/// `bigfleet shards`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardsOutput {
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    pub shards: Vec<ShardView>,
}

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

fn inspect_error(ctx: &Context, addr: &str, rpc: &'static str, status: Status) -> CliError {
    CliError::Remote(Box::new(RemoteError {
        service: "inspect",
        addr: addr.to_owned(),
        rpc,
        roles: "readonly or admin",
        status,
        timeout: Some(ctx.timeout),
    }))
}

fn fleet_error(ctx: &Context, e: InspectError) -> CliError {
    match e {
        InspectError::NoShardsKnown(c) | InspectError::Coordinator(c) => {
            CliError::coordinator(c, Some(ctx.timeout))
        }
        InspectError::AllShardsUnreachable(m) => CliError::NoShardReachable(m),
        other => CliError::NoShardReachable(other.to_string()),
    }
}

async fn fleet_summary(
    ctx: &Context,
    addr: &str,
    max_shortfalls: u32,
) -> Result<mesh::FleetSummaryResponse, CliError> {
    let mut client = InspectClient::new(ctx.inspect_channel(addr)?);
    let call = client.fleet_summary(mesh::FleetSummaryRequest { max_shortfalls });
    match tokio::time::timeout(ctx.timeout, call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(inspect_error(ctx, addr, "FleetSummary", s)),
        Err(_) => Err(inspect_error(
            ctx,
            addr,
            "FleetSummary",
            Status::deadline_exceeded("timed out"),
        )),
    }
}

fn shard_from_overview(s: &mesh::ShardOverview) -> ShardView {
    ShardView {
        shard_id: s.shard_id.clone(),
        address: s.address.clone(),
        reachable: s.reachable,
        error: s.error.clone(),
        registered_at_unix_ns: 0,
        last_report_age_ms: s.last_report_age_ms,
        cycle: s.cycle,
        machines_by_state: s
            .machines_by_state
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        sessions: s.sessions,
        needs: s.needs,
        unmet_needs: s.unmet_needs,
        shard_epoch: 0,
        actions_in_flight: 0,
        reported_total_machines: None,
        reported_free_machines: None,
        source: if s.machines_by_state.is_empty() {
            String::new()
        } else {
            "shard-info".to_owned()
        },
    }
}

/// Registered shards with their live numbers.
pub async fn shards(ctx: &Context) -> Result<ShardsOutput, CliError> {
    if let Some(addr) = &ctx.inspect {
        let s = fleet_summary(ctx, addr, 1).await?;
        return Ok(ShardsOutput {
            coordinator_reachable: s.coordinator_reachable,
            coordinator_error: s.coordinator_error,
            shards: s.shards.iter().map(shard_from_overview).collect(),
        });
    }
    let o = ctx.fleet()?.overview().await;
    if let Some(e) = &o.coordinator_failure {
        return Err(CliError::coordinator(e.clone(), Some(ctx.timeout)));
    }
    Ok(ShardsOutput {
        coordinator_reachable: o.coordinator_reachable,
        coordinator_error: o.coordinator_error.clone(),
        shards: o.shards.clone(),
    })
}

fn age_text(ms: i64) -> String {
    if ms < 0 {
        return "never".to_owned();
    }
    format!(
        "{} ago",
        humantime::format_duration(std::time::Duration::from_secs(
            u64::try_from(ms / 1000).unwrap_or(0)
        ))
    )
}

impl Render for ShardsOutput {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "shard",
            vec![
                Column::text("SHARD"),
                Column::text("ADDRESS"),
                Column::text("STATUS"),
                Column::text("LAST REPORT"),
                Column::number("CYCLE"),
                Column::number("MACHINES"),
                Column::number("CONFIGURED"),
                Column::number("IDLE"),
                Column::number("FAILED"),
                Column::number("SESSIONS"),
                Column::number("NEEDS"),
                Column::number("UNMET"),
                Column::text("REPORTED TOTAL/FREE").wide(),
                Column::text("SOURCE").wide(),
                Column::text("ERROR").wide(),
            ],
        )
        .when_empty("no shard has registered with the coordinator yet");
        for s in &self.shards {
            let counted = s.reachable && s.source == "shard-info";
            let state = |name: &str| {
                if counted {
                    s.machines_by_state
                        .get(name)
                        .copied()
                        .unwrap_or(0)
                        .to_string()
                } else {
                    "-".to_owned()
                }
            };
            let machines = if counted {
                s.machines_by_state.values().sum::<i32>().to_string()
            } else {
                s.reported_total_machines
                    .map_or("-".to_owned(), |n| format!("~{n}"))
            };
            let live = |v: String| if s.reachable { v } else { "-".to_owned() };
            let reported = match (s.reported_total_machines, s.reported_free_machines) {
                (None, None) => "-".to_owned(),
                (t, f) => format!(
                    "{}/{}",
                    t.map_or("-".to_owned(), |n| n.to_string()),
                    f.map_or("-".to_owned(), |n| n.to_string())
                ),
            };
            t.row(
                s.shard_id.clone(),
                vec![
                    s.shard_id.clone(),
                    s.address.clone(),
                    if s.reachable {
                        "ok".to_owned()
                    } else {
                        "UNREACHABLE".to_owned()
                    },
                    age_text(s.last_report_age_ms),
                    live(s.cycle.to_string()),
                    machines,
                    state("MACHINE_STATE_CONFIGURED"),
                    state("MACHINE_STATE_IDLE"),
                    state("MACHINE_STATE_FAILED"),
                    live(s.sessions.to_string()),
                    live(s.needs.to_string()),
                    live(if s.unmet_needs < 0 {
                        "?".to_owned()
                    } else {
                        s.unmet_needs.to_string()
                    }),
                    reported,
                    or_dash(s.source.clone()),
                    or_dash(s.error.clone()),
                ],
            );
        }
        for s in self.shards.iter().filter(|s| !s.reachable) {
            t.footer
                .push(format!("{} is unreachable: {}", s.shard_id, s.error));
        }
        t
    }
}

/// Warnings a read wants printed on stderr.
pub fn shard_warnings(o: &ShardsOutput) -> Vec<String> {
    let mut w = Vec::new();
    if !o.coordinator_reachable {
        w.push(format!(
            "coordinator unreachable; shards are from an earlier answer: {}",
            o.coordinator_error
        ));
    }
    w
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
    let err = |s: Status| inspect_error(ctx, addr, "InspectNeeds", s);
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
    let (header, rows, md) = match tokio::time::timeout(ctx.timeout, call).await {
        Ok(r) => r.map_err(err)?,
        Err(_) => return Err(err(Status::deadline_exceeded("timed out"))),
    };
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
                if n.satisfied {
                    "-".to_owned()
                } else {
                    reason_label(&n.unmet_reason).to_owned()
                },
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
                svc_inspect_timestamp(n.arrival_unix_nanos).unwrap_or_else(|| "-".to_owned()),
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

fn svc_inspect_timestamp(nanos: i64) -> Option<String> {
    (nanos > 0).then(|| {
        let t = std::time::UNIX_EPOCH
            + std::time::Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
        humantime::format_rfc3339_seconds(t).to_string()
    })
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
    let o = ctx.fleet()?.overview().await;
    if let Some(e) = &o.coordinator_failure {
        return Err(CliError::coordinator(e.clone(), Some(ctx.timeout)));
    }
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
    let c = ctx.coordinator_client(Some(ctx.timeout))?;
    let list = c
        .list_domain_assignments()
        .await
        .map_err(|e| CliError::coordinator(e, Some(ctx.timeout)))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use svc_inspect::view::SupplyView;

    fn row(satisfied: bool, reason: &str) -> NeedRow {
        NeedRow {
            shard_id: Some("s1".into()),
            cluster_id: "c".into(),
            priority: 5,
            arrival_unix_nanos: 0,
            profile_fingerprint: String::new(),
            satisfied,
            unmet_reason: reason.into(),
            requirements: vec![],
            aggregate_resources: [("cpu".to_owned(), "8".to_owned())].into(),
            min_unit: BTreeMap::new(),
            residual_deficit: BTreeMap::new(),
            spread: vec![],
            group: String::new(),
            interruption_penalty_bucket: String::new(),
            reclamation_penalty_bucket: String::new(),
            claimed_machine_count: 2,
            bootstrap_count: 0,
            provision_count: 0,
            same_domain: String::new(),
            same_satisfiable: false,
            acquisition_parked: false,
            parked_age_cycles: 0,
            age_cycles_unmet: 0,
            matching_supply: (!satisfied).then_some(SupplyView {
                idle: 1,
                configured: 2,
                speculative: 3,
                capped: true,
            }),
            preemption: None,
            same_candidates: vec![],
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
