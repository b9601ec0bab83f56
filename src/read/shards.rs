//! `bigfleet shards`: registered shards with their live numbers.

use bigfleet_proto::mesh::v1 as mesh;
use serde::{Deserialize, Serialize};
use svc_inspect::view::ShardView;

use super::{fleet_overview, fleet_summary};
use crate::Context;
use crate::error::CliError;
use crate::output::{Column, Listing, Render, dash_unless, or_dash};

/// `bigfleet shards`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardsOutput {
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    pub shards: Vec<ShardView>,
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
