//! Read commands: `shards`, `needs`, `shortfalls`, `domains`, `transfers`, `actions`,
//! `machines`.
//!
//! With `--inspect` they read through svc-inspect (one call, its cache); without it the CLI
//! does the same fan-out itself — the coordinator's `ListShards`, then every shard's read
//! services — using svc-inspect's library, so both paths show the same data.

use std::sync::Arc;

use bigfleet_mesh::MeshChannel;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_client::InspectClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_client::ShardReadClient;
use serde::{Deserialize, Serialize};
use svc_inspect::InspectError;
use svc_inspect::fleet::{Fleet, FleetOverview};
use svc_inspect::grpc::{COORDINATOR_ERROR_METADATA_KEY, UNREACHABLE_SHARDS_METADATA_KEY};
use svc_inspect::view::{
    ActionView, DomainView, MachineView, NeedRow, ShardView, ShortfallView, TransfersView,
    resources_text, short_state,
};
use tonic::Status;

use crate::Context;
use crate::error::{CliError, RemoteError};
use crate::output::{Column, Listing, Render, dash_unless, or_dash};

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

/// Awaits one svc-inspect call under the context's timeout; its failure, or the timeout,
/// becomes an error naming `rpc` at `addr`.
async fn inspect_call<T>(
    ctx: &Context,
    addr: &str,
    rpc: &'static str,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, CliError> {
    let status = match tokio::time::timeout(ctx.timeout, call).await {
        Ok(Ok(r)) => return Ok(r),
        Ok(Err(s)) => s,
        Err(_) => Status::deadline_exceeded("timed out"),
    };
    Err(CliError::Remote(Box::new(RemoteError {
        service: "inspect",
        addr: addr.to_owned(),
        rpc,
        roles: "readonly or admin",
        status,
        timeout: Some(ctx.timeout),
    })))
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

/// `rpc` on svc-inspect's `Inspect` service at `addr`, under the context's timeout.
async fn on_inspect<T>(
    ctx: &Context,
    addr: &str,
    rpc: &'static str,
    call: impl AsyncFnOnce(InspectClient<MeshChannel>) -> Result<tonic::Response<T>, Status>,
) -> Result<T, CliError> {
    let client = InspectClient::new(ctx.inspect_channel(addr)?);
    Ok(inspect_call(ctx, addr, rpc, call(client))
        .await?
        .into_inner())
}

/// A read both paths answer alike: `rpc` through svc-inspect when `--inspect` is set,
/// otherwise `direct` on the CLI's own fan-out.
async fn inspect_or_fleet<T>(
    ctx: &Context,
    rpc: &'static str,
    via_inspect: impl AsyncFnOnce(InspectClient<MeshChannel>) -> Result<tonic::Response<T>, Status>,
    direct: impl AsyncFnOnce(Fleet) -> Result<T, InspectError>,
) -> Result<T, CliError> {
    match &ctx.inspect {
        Some(addr) => on_inspect(ctx, addr, rpc, via_inspect).await,
        None => direct(ctx.fleet()?).await.map_err(|e| fleet_error(ctx, e)),
    }
}

async fn fleet_summary(
    ctx: &Context,
    addr: &str,
    max_shortfalls: u32,
) -> Result<mesh::FleetSummaryResponse, CliError> {
    let req = mesh::FleetSummaryRequest { max_shortfalls };
    on_inspect(ctx, addr, "FleetSummary", async |mut c| {
        c.fleet_summary(req).await
    })
    .await
}

/// The CLI's own fleet overview; a coordinator that could not be asked fails the read.
async fn fleet_overview(ctx: &Context) -> Result<Arc<FleetOverview>, CliError> {
    let o = ctx.fleet()?.overview().await;
    match &o.coordinator_failure {
        Some(e) => Err(CliError::coordinator(e.clone(), Some(ctx.timeout))),
        None => Ok(o),
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
        inventory_stale: s.inventory_stale,
        inventory_listed_at_unix_ns: s.inventory_listed_at_unix_nanos,
        removals_held: s.removals_held,
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
    let o = fleet_overview(ctx).await?;
    Ok(ShardsOutput {
        coordinator_reachable: o.coordinator_reachable,
        coordinator_error: o.coordinator_error.clone(),
        shards: o.shards.clone(),
    })
}

/// `listed 12s ago` (or `never listed`) and, when any, the removals held.
fn inventory_text(s: &ShardView) -> String {
    let listed = listed_text(s.inventory_listed_at_unix_ns);
    if s.removals_held > 0 {
        format!("{listed}; {} removals held", s.removals_held)
    } else {
        listed
    }
}

fn listed_text(listed_at_unix_ns: i64) -> String {
    if listed_at_unix_ns <= 0 {
        return "never listed".to_owned();
    }
    let age_ns = (svc_inspect::fleet::now_unix_nanos() - listed_at_unix_ns).max(0);
    format!("listed {}", age_text(age_ns / 1_000_000))
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
                Column::text("INVENTORY").wide(),
                Column::text("SOURCE").wide(),
                Column::text("ERROR").wide(),
            ],
        )
        .when_empty("no shard has registered with the coordinator yet");
        for s in &self.shards {
            let counted = s.reachable && s.source == "shard-info";
            let state = |name: &str| {
                dash_unless(counted, || {
                    s.machines_by_state
                        .get(name)
                        .copied()
                        .unwrap_or(0)
                        .to_string()
                })
            };
            let machines = if counted {
                s.machines_by_state.values().sum::<i32>().to_string()
            } else {
                s.reported_total_machines
                    .map_or("-".to_owned(), |n| format!("~{n}"))
            };
            let live = |v: String| dash_unless(s.reachable, || v);
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
                    if !s.reachable {
                        "UNREACHABLE".to_owned()
                    } else if s.inventory_stale {
                        "INVENTORY STALE".to_owned()
                    } else {
                        "ok".to_owned()
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
                    dash_unless(counted, || inventory_text(s)),
                    or_dash(s.source.clone()),
                    or_dash(s.error.clone()),
                ],
            );
        }
        for s in &self.shards {
            if !s.reachable {
                t.footer
                    .push(format!("{} is unreachable: {}", s.shard_id, s.error));
                continue;
            }
            if s.inventory_stale {
                t.footer.push(format!(
                    "{} decides on stale inventory: its provider List fails ({}); only \
                     Bootstrap and Provision run",
                    s.shard_id,
                    listed_text(s.inventory_listed_at_unix_ns)
                ));
            }
            if s.removals_held > 0 {
                t.footer.push(format!(
                    "{} holds the removal of {} machines its provider's Lists left out",
                    s.shard_id, s.removals_held
                ));
            }
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

/// A timestamp table cell: RFC 3339 seconds, `-` when unset.
fn timestamp_cell(nanos: i64) -> String {
    svc_inspect_timestamp(nanos).unwrap_or_else(|| "-".to_owned())
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

/// `bigfleet actions`: a plain list, newest first (oldest first under `--watch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Actions(pub Vec<ActionView>);

/// Warnings for shards a fan-out could not ask: their records are missing, not empty.
fn unreachable_warnings(what: &str, unreachable: &[mesh::ShardError]) -> Vec<String> {
    unreachable
        .iter()
        .map(|s| {
            format!(
                "shard {} did not answer ({}); its {what} are missing",
                s.shard_id, s.error
            )
        })
        .collect()
}

/// Recent actions (newest first) and a warning per shard that did not answer.
pub async fn actions(
    ctx: &Context,
    req: &mesh::RecentActionsRequest,
) -> Result<(Actions, Vec<String>), CliError> {
    let resp = inspect_or_fleet(
        ctx,
        "RecentActions",
        async |mut c| c.recent_actions(req.clone()).await,
        async |f| f.recent_actions(req).await,
    )
    .await?;
    Ok((
        Actions(resp.actions.iter().map(ActionView::from_proto).collect()),
        unreachable_warnings("actions", &resp.unreachable),
    ))
}

/// A compact duration for tables: `850ms`, `4.2s`, `3m12s`, `5h4m`, `3d2h`.
pub fn short_duration(nanos: i64) -> String {
    let nanos = nanos.max(0);
    let ms = nanos / 1_000_000;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = nanos / 1_000_000_000;
    if secs < 60 {
        return format!("{}.{}s", secs, (ms % 1000) / 100);
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if h == 0 {
        format!("{m}m{}s", secs % 60)
    } else if d == 0 {
        format!("{h}h{}m", m % 60)
    } else {
        format!("{d}d{}h", h % 24)
    }
}

impl Render for Actions {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "action",
            vec![
                Column::text("FINISHED"),
                Column::text("SHARD"),
                Column::text("CLUSTER"),
                Column::text("KIND"),
                Column::text("MACHINE"),
                Column::text("OUTCOME"),
                Column::text("REASON"),
                Column::number("PRIO").wide(),
                Column::number("CYCLE").wide(),
                Column::text("NEED").wide(),
                Column::text("GROUP").wide(),
                Column::text("WAITED").wide(),
                Column::text("RAN").wide(),
                Column::text("ACTION ID").wide(),
            ],
        )
        .when_empty("no recorded action matches");
        for a in &self.0 {
            // Queueing: from the cycle's decision until a worker took the action.
            let waited = dash_unless(
                a.started_at_unix_nanos > 0 && a.decided_at_unix_nanos > 0,
                || short_duration(a.started_at_unix_nanos - a.decided_at_unix_nanos),
            );
            t.row(
                // seq is unique within one decide process of a shard.
                format!("{}/{}", a.shard_id, a.seq),
                vec![
                    timestamp_cell(a.finished_at_unix_nanos),
                    a.shard_id.clone(),
                    or_dash(a.cluster_id.clone()),
                    a.kind.clone(),
                    or_dash(a.machine_id.clone()),
                    or_dash(a.outcome.clone()),
                    or_dash(a.reason.clone()),
                    a.priority.to_string(),
                    a.cycle.to_string(),
                    or_dash(a.need_fingerprint.clone()),
                    or_dash(a.group.clone()),
                    waited,
                    dash_unless(a.started_at_unix_nanos > 0, || short_duration(a.run_nanos)),
                    or_dash(a.action_id.clone()),
                ],
            );
        }
        t
    }
}

/// The actions a watch has printed: the newest finish time and which records finished
/// exactly then (the next poll asks from that time on, so those come again).
#[derive(Debug, Default)]
pub struct SeenActions {
    newest: i64,
    at_newest: std::collections::HashSet<(String, u64)>,
}

impl SeenActions {
    /// The newest finish time admitted so far (0: none).
    pub fn newest(&self) -> i64 {
        self.newest
    }

    /// Keeps the records not printed yet, oldest first, and remembers them.
    pub fn admit(&mut self, mut batch: Vec<ActionView>) -> Vec<ActionView> {
        batch.retain(|a| {
            a.finished_at_unix_nanos > self.newest
                || (a.finished_at_unix_nanos == self.newest
                    && !self.at_newest.contains(&(a.shard_id.clone(), a.seq)))
        });
        batch.sort_by(|a, b| {
            (a.finished_at_unix_nanos, &a.shard_id, a.seq).cmp(&(
                b.finished_at_unix_nanos,
                &b.shard_id,
                b.seq,
            ))
        });
        for a in &batch {
            if a.finished_at_unix_nanos > self.newest {
                self.newest = a.finished_at_unix_nanos;
                self.at_newest.clear();
            }
            self.at_newest.insert((a.shard_id.clone(), a.seq));
        }
        batch
    }
}

/// Prints one batch of a watch on actions: the first as a listing (header included), later
/// ones as rows only; JSON and YAML print each action as its own document.
pub fn print_actions(
    out: &mut dyn std::io::Write,
    opts: crate::output::OutputOptions,
    batch: Vec<ActionView>,
    first: bool,
) -> Result<(), CliError> {
    let text = match opts.format {
        crate::output::OutputFormat::Json => batch
            .iter()
            .map(crate::output::json_string)
            .collect::<Result<String, _>>()?,
        crate::output::OutputFormat::Yaml => batch
            .iter()
            .map(|a| crate::output::yaml_string(a).map(|y| format!("---\n{y}")))
            .collect::<Result<String, _>>()?,
        crate::output::OutputFormat::Table
        | crate::output::OutputFormat::Wide
        | crate::output::OutputFormat::Name => {
            if !first && batch.is_empty() {
                return Ok(());
            }
            let rows_only = crate::output::OutputOptions {
                no_headers: opts.no_headers || !first,
                ..opts
            };
            crate::output::render(&Actions(batch), rows_only)?
        }
    };
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// `bigfleet machines`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachinesOutput {
    /// Machines matching the filters on the shards that answered, before `--limit`.
    pub total_matching: u64,
    /// In machine-id order.
    pub machines: Vec<MachineView>,
    /// When the list was read: `IDLE FOR` is measured to it (not serialised: the
    /// documents carry `idle_since_unix_nanos`).
    #[serde(skip)]
    pub as_of_unix_nanos: i64,
}

async fn machines_page(
    ctx: &Context,
    req: &mesh::ListMachinesRequest,
) -> Result<mesh::ListMachinesResponse, CliError> {
    inspect_or_fleet(
        ctx,
        "ListMachines",
        async |mut c| c.list_machines(req.clone()).await,
        async |f| f.list_machines(req).await,
    )
    .await
}

/// Machines in id order, paging `chunk` at a time until `limit` (0: all) or the last page.
pub async fn machines(
    ctx: &Context,
    filter: &mesh::ListMachinesRequest,
    limit: usize,
    chunk: usize,
) -> Result<(MachinesOutput, Vec<String>), CliError> {
    let mut out = MachinesOutput {
        total_matching: 0,
        machines: Vec::new(),
        as_of_unix_nanos: svc_inspect::fleet::now_unix_nanos(),
    };
    let mut unreachable: Vec<mesh::ShardError> = Vec::new();
    let mut after = String::new();
    let mut first = true;
    loop {
        let want = if limit == 0 {
            chunk
        } else {
            chunk.min(limit - out.machines.len())
        };
        let page = machines_page(
            ctx,
            &mesh::ListMachinesRequest {
                limit: u32::try_from(want.max(1)).unwrap_or(u32::MAX),
                after_machine_id: after.clone(),
                ..filter.clone()
            },
        )
        .await?;
        if first {
            // Later pages count the same machines; a shard may move between pages.
            out.total_matching = page.total_matching;
            first = false;
        }
        for u in page.unreachable {
            if !unreachable.iter().any(|k| k.shard_id == u.shard_id) {
                unreachable.push(u);
            }
        }
        out.machines
            .extend(page.machines.iter().map(MachineView::from_proto));
        if page.next_after_machine_id.is_empty()
            || page.machines.is_empty()
            || (limit > 0 && out.machines.len() >= limit)
        {
            break;
        }
        after = page.next_after_machine_id;
    }
    if limit > 0 {
        out.machines.truncate(limit);
    }
    Ok((out, unreachable_warnings("machines", &unreachable)))
}

/// `--state idle` (or `IDLE`, `MACHINE_STATE_IDLE`) ⇒ the state.
pub fn parse_machine_state(s: &str) -> Result<pb::MachineState, String> {
    let upper = s.trim().to_ascii_uppercase().replace('-', "_");
    let name = upper.strip_prefix("MACHINE_STATE_").unwrap_or(&upper);
    match pb::MachineState::from_str_name(&format!("MACHINE_STATE_{name}")) {
        Some(pb::MachineState::Unspecified) | None => Err(format!(
            "unknown machine state {s:?} (speculative, creating, idle, configuring, configured, draining, deleting, failed)"
        )),
        Some(state) => Ok(state),
    }
}

impl Render for MachinesOutput {
    fn listing(&self) -> Listing {
        let mut t = Listing::new(
            "machine",
            vec![
                Column::text("ID"),
                Column::text("SHARD"),
                Column::text("STATE"),
                Column::text("TYPE"),
                Column::text("ZONE"),
                Column::text("CLUSTER"),
                Column::number("PRICE/H"),
                Column::text("IDLE FOR"),
                Column::text("CAPACITY").wide(),
                Column::text("LABELS").wide(),
                Column::text("LAST ERROR").wide(),
            ],
        )
        .when_empty("no machine matches");
        if !self.machines.is_empty() {
            t.preamble.push(format!(
                "{} of {} matching machines",
                self.machines.len(),
                self.total_matching
            ));
        }
        for m in &self.machines {
            let idle_for = dash_unless(m.idle_since_unix_nanos > 0, || {
                short_duration(self.as_of_unix_nanos - m.idle_since_unix_nanos)
            });
            t.row(
                m.id.clone(),
                vec![
                    m.id.clone(),
                    m.shard_id.clone(),
                    short_state(&m.state).to_owned(),
                    or_dash(m.instance_type.clone()),
                    or_dash(m.zone.clone()),
                    or_dash(m.cluster.clone()),
                    format!("{:.4}", m.price_per_hour),
                    idle_for,
                    m.capacity_type
                        .strip_prefix("CAPACITY_TYPE_")
                        .unwrap_or(&m.capacity_type)
                        .to_owned(),
                    or_dash(
                        m.labels
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(","),
                    ),
                    or_dash(m.last_error.clone()),
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

    #[test]
    fn short_durations_keep_two_units() {
        assert_eq!(short_duration(-5), "0ms");
        assert_eq!(short_duration(850_000_000), "850ms");
        assert_eq!(short_duration(4_250_000_000), "4.2s");
        assert_eq!(short_duration(192 * 1_000_000_000), "3m12s");
        assert_eq!(
            short_duration((5 * 3600 + 4 * 60 + 59) * 1_000_000_000),
            "5h4m"
        );
        assert_eq!(
            short_duration((3 * 86_400 + 2 * 3600 + 30) * 1_000_000_000),
            "3d2h"
        );
    }

    #[test]
    fn machine_states_parse_in_any_spelling() {
        for s in ["idle", "IDLE", "machine_state_idle", " Idle "] {
            assert_eq!(parse_machine_state(s), Ok(pb::MachineState::Idle), "{s}");
        }
        assert_eq!(
            parse_machine_state("configured"),
            Ok(pb::MachineState::Configured)
        );
        for bad in ["", "unspecified", "busy"] {
            assert!(parse_machine_state(bad).is_err(), "{bad}");
        }
    }

    fn act(shard: &str, seq: u64, finished: i64) -> ActionView {
        ActionView {
            shard_id: shard.into(),
            seq,
            cycle: 1,
            kind: "provision".into(),
            reason: "phase1.idle".into(),
            machine_id: format!("m-{seq}"),
            cluster_id: "c".into(),
            need_fingerprint: String::new(),
            group: String::new(),
            priority: 0,
            grace_seconds: 0.0,
            action_id: String::new(),
            outcome: "succeeded".into(),
            decided_at_unix_nanos: 0,
            started_at_unix_nanos: 0,
            finished_at_unix_nanos: finished,
            run_nanos: 0,
        }
    }

    #[test]
    fn a_watch_admits_each_action_once_oldest_first() {
        let mut seen = SeenActions::default();
        let keys = |v: Vec<ActionView>| {
            v.iter()
                .map(|a| format!("{}/{}", a.shard_id, a.seq))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(seen.admit(vec![act("s1", 2, 20), act("s1", 1, 10)])),
            ["s1/1", "s1/2"]
        );
        // The newest comes again (the poll asks from its time on): not admitted twice, but
        // another action finished at the same instant is.
        assert_eq!(
            keys(seen.admit(vec![act("s2", 5, 20), act("s1", 2, 20), act("s2", 4, 15)])),
            ["s2/5"]
        );
        assert_eq!(
            keys(seen.admit(vec![act("s1", 2, 20), act("s2", 5, 20)])),
            Vec::<String>::new()
        );
        assert_eq!(keys(seen.admit(vec![act("s1", 3, 30)])), ["s1/3"]);
    }

    #[test]
    fn watched_tables_print_the_header_once() {
        let print = |batch, first| {
            let mut out = Vec::new();
            print_actions(&mut out, table(), batch, first).unwrap();
            String::from_utf8(out).unwrap()
        };
        let first = print(vec![act("s1", 1, 10)], true);
        assert!(first.starts_with("FINISHED "), "{first}");
        assert_eq!(first.lines().count(), 2, "{first}");
        let later = print(vec![act("s1", 2, 20)], false);
        assert!(
            later.starts_with("1970-01-01T00:00:00Z  s1  c  provision  m-2"),
            "{later}"
        );
        assert_eq!(later.lines().count(), 1);
        assert_eq!(print(vec![], false), "", "a quiet poll prints nothing");
        let mut json = Vec::new();
        let opts = crate::output::OutputOptions::new(crate::output::OutputFormat::Json);
        print_actions(
            &mut json,
            opts,
            vec![act("s1", 1, 10), act("s1", 2, 20)],
            true,
        )
        .unwrap();
        let docs: Vec<ActionView> = serde_json::Deserializer::from_slice(&json)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(docs.len(), 2, "one document per action");
    }
}
