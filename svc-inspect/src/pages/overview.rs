//! `/`: the fleet overview page.

use super::shards::shard_row;
use super::{Nav, Shell, card, coordinator_banner, fleet_charts, layout, pager, shortfall_table};
use maud::html;

use crate::fleet::FleetOverview;
use crate::history::FleetHistory;
use crate::view::{MACHINE_STATES, Page, ShardView, ShortfallView, short_state};

/// `/`: fleet totals, history, machines by state, shards (one page of them), the oldest
/// shortfalls.
pub fn overview(
    shell: Shell,
    o: &FleetOverview,
    shards: &Page<ShardView>,
    history: &FleetHistory,
) -> String {
    let s = o.summary();
    let machines: i64 = s.machines_by_state.values().sum();
    let state = |name: &str| s.machines_by_state.get(name).copied().unwrap_or(0);
    let down: Vec<&str> = o
        .shards
        .iter()
        .filter(|s| !s.reachable)
        .map(|s| s.shard_id.as_str())
        .collect();
    let content = html! {
        h1 { "Fleet overview" }
        (coordinator_banner(o.coordinator_reachable, &o.coordinator_error))
        div.cards {
            (card("shards reachable", format!("{} / {}", s.shards_reachable, s.shards_total)))
            (card("machines", machines))
            (card("configured", state("MACHINE_STATE_CONFIGURED")))
            (card("idle", state("MACHINE_STATE_IDLE")))
            (card("failed", state("MACHINE_STATE_FAILED")))
            (card("sessions", s.sessions))
            (card("needs", s.needs))
            (card("unmet needs", s.unmet_needs))
            (card("shortfalls", s.shortfalls))
        }
        (fleet_charts(history))

        h2 { "Machines by state" }
        div.scroll { table {
            thead { tr { @for st in MACHINE_STATES { th.num { (short_state(st.as_str_name())) } } } }
            tbody { tr { @for st in MACHINE_STATES {
                td.num { (s.machines_by_state.get(st.as_str_name()).copied().unwrap_or(0)) }
            } } }
        } }
        p { a href="/machines" { "Machine list →" } }

        h2 { "Shards" }
        @if shards.total == 0 {
            p.muted { "No shard has registered with the coordinator yet." }
        } @else {
            div.scroll { table {
                thead { tr {
                    th { "Shard" } th { "Address" } th { "Status" } th { "Last report" }
                    th.num { "Cycle" } th.num { "Machines" } th { "By state" }
                    th.num { "Sessions" } th.num { "Needs" } th.num { "Unmet" }
                } }
                tbody { @for sh in &shards.items { (shard_row(sh)) } }
            } }
            (pager("/", "", shards, "shards"))
            @if !down.is_empty() {
                div.note {
                    (down.len()) " of " (o.shards.len()) " shards did not answer: "
                    span.mono { (down.join(", ")) }
                    ". Their machines and needs are not counted above."
                }
            }
        }

        h2 { "Oldest shortfalls" }
        @if o.shortfalls.is_empty() {
            p.muted { "No shard reports unmet demand." }
        } @else {
            (shortfall_table(&o.shortfalls.iter().take(10).map(ShortfallView::from_proto).collect::<Vec<_>>()))
            p { a href="/shortfalls" { "All " (o.shortfalls.len()) " shortfalls by age →" } }
        }
    };
    layout(
        shell,
        "Fleet overview",
        Nav::Overview,
        true,
        o.computed_at_unix_nanos,
        content,
    )
}
