//! `/actions` and `/machines`: what the shards did recently, and the fleet's machines.

use super::{Nav, Shell, cluster_link, layout, shard_link};
use maud::{Markup, html};

use crate::chart::{span_text, sparkline};
use crate::history::FleetHistory;
use crate::html::{coarse, pct, timestamp};
use crate::view::short_state;

/// `/actions`: what the shards did recently and why, newest first (ADR-0125), with the
/// fleet's actions-per-sample history.
pub fn actions(
    shell: Shell,
    v: &crate::http::ActionsResponse,
    cluster: &str,
    shard: &str,
    history: &FleetHistory,
) -> String {
    let content = html! {
        h1 { "Recent actions" }
        @if !cluster.is_empty() {
            p { "Cluster " strong.mono { (cluster) } " · " a href="/actions" { "all clusters" } }
        }
        @if !shard.is_empty() {
            p { "Shard " strong.mono { (shard) } " · " a href="/actions" { "all shards" } }
        }
        @if cluster.is_empty() && shard.is_empty() && history.interval_ms > 0 {
            div.sparks {
                (sparkline("actions", "actions per sample",
                    &history.samples.iter().map(|s| s.actions).collect::<Vec<_>>(),
                    &span_text(history.samples.len(), history.interval_ms)))
            }
        }
        (shard_errors(&v.unreachable))
        @if v.actions.is_empty() {
            p.muted { "No action recorded yet." }
        } @else {
            div.scroll { table {
                thead { tr {
                    th { "Finished" } th { "Kind" } th { "Reason" } th { "Outcome" } th { "Cluster" }
                    th { "Machine" } th { "Need" } th { "Priority" } th { "Ran" } th { "Shard" }
                } }
                tbody { @for a in &v.actions {
                    @let class = match a.outcome.as_str() {
                        "succeeded" => "ok",
                        "failed" | "abandoned" => "bad",
                        _ => "warn",
                    };
                    tr {
                        td { (timestamp(a.finished_at_unix_nanos)) }
                        td { (a.kind) }
                        td.mono { (a.reason) }
                        td class=(class) { (a.outcome) }
                        td.mono { a href=(format!("/actions?cluster={}", pct(&a.cluster_id))) { (a.cluster_id) } }
                        td.mono { (a.machine_id) }
                        td.mono { (a.need_fingerprint) }
                        td { (a.priority) }
                        td { @if a.started_at_unix_nanos != 0 { (coarse(a.run_nanos / 1_000_000)) } }
                        td { (shard_link(&a.shard_id)) }
                    }
                } }
            } }
        }
    };
    layout(
        shell,
        "Recent actions",
        Nav::Actions,
        true,
        crate::fleet::now_unix_nanos(),
        content,
    )
}

/// The filters a machine list was asked with (shown, and kept by the next-page link).
#[derive(Debug, Clone, Default)]
pub struct MachineFilters<'a> {
    pub cluster: &'a str,
    pub shard: &'a str,
    pub state: &'a str,
    /// Raw `&k=v` pairs (values percent-encoded) for the next-page link.
    pub keep: String,
}

/// `/machines`: one page of the fleet's machines in id order.
pub fn machines(shell: Shell, v: &crate::http::MachinesResponse, f: &MachineFilters<'_>) -> String {
    let content = html! {
        h1 { "Machines" }
        @if !f.cluster.is_empty() || !f.shard.is_empty() || !f.state.is_empty() {
            p.filters {
                @if !f.cluster.is_empty() { "Cluster " (cluster_link(f.cluster)) " " }
                @if !f.shard.is_empty() { "Shard " (shard_link(f.shard)) " " }
                @if !f.state.is_empty() { "State " span.mono { (f.state) } " " }
                "· " a href="/machines" { "all machines" }
            }
        }
        (shard_errors(&v.unreachable))
        @if v.machines.is_empty() {
            p.muted { "No machine matches." }
        } @else {
            div.scroll { table {
                thead { tr {
                    th { "Machine" } th { "State" } th { "Cluster" } th { "Instance type" }
                    th { "Zone" } th { "Capacity" } th { "$/h" } th { "Shard" }
                } }
                tbody { @for m in &v.machines { tr {
                    td.mono { (m.id) }
                    td { (short_state(&m.state)) }
                    td.mono { @if !m.cluster.is_empty() { (cluster_link(&m.cluster)) } }
                    td.mono { (m.instance_type) }
                    td.mono { (m.zone) }
                    td { (m.capacity_type.trim_start_matches("CAPACITY_TYPE_")) }
                    td { (format!("{:.4}", m.price_per_hour)) }
                    td { (shard_link(&m.shard_id)) }
                } } }
            } }
        }
        div.pager.muted {
            (v.total_matching) " machines match"
            @if !v.next_after.is_empty() {
                " · "
                a href=(format!("/machines?after={}{}", pct(&v.next_after), f.keep)) rel="next" { "Next »" }
            }
        }
    };
    layout(
        shell,
        "Machines",
        Nav::Machines,
        false,
        crate::fleet::now_unix_nanos(),
        content,
    )
}

pub(super) fn shard_errors(errors: &[crate::view::ShardErrorView]) -> Markup {
    html! {
        @for e in errors {
            div.note {
                "Shard " strong.mono { (e.shard_id) } " did not answer: " span.mono { (e.error) }
                ". Its rows are missing below."
            }
        }
    }
}
