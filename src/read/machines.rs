//! `bigfleet machines`: machines in id order, paged.

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use serde::{Deserialize, Serialize};
use svc_inspect::view::{MachineView, short_state};

use super::{inspect_or_fleet, short_duration, unreachable_warnings};
use crate::Context;
use crate::error::CliError;
use crate::output::{Column, Listing, Render, dash_unless, or_dash};

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
}
