//! `/shortfalls` and `/domains`: what the fleet could not place and where its topology
//! domains are pinned.

use super::{Nav, Shell, coordinator_banner, layout, pager, shard_link, shortfall_table};
use maud::html;

use crate::fleet::FleetOverview;
use crate::view::{DomainView, Page, ShortfallView};

/// `/shortfalls`: every reported shortfall, oldest first, paginated.
pub fn shortfalls(shell: Shell, o: &FleetOverview, page: &Page<ShortfallView>) -> String {
    let content = html! {
        h1 { "Shortfalls by age" }
        (coordinator_banner(o.coordinator_reachable, &o.coordinator_error))
        p.muted { "From each shard's latest report to the coordinator (the worst 100 per shard, without cluster attribution). A cluster's own page shows its needs with reasons." }
        @if page.total == 0 {
            p.muted { "No shard reports unmet demand." }
        } @else {
            (shortfall_table(&page.items))
            (pager("/shortfalls", "", page, "shortfalls"))
        }
    };
    layout(
        shell,
        "Shortfalls",
        Nav::Shortfalls,
        true,
        o.computed_at_unix_nanos,
        content,
    )
}

/// `/domains`: topology domains pinned to shards.
pub fn domains(shell: Shell, o: &FleetOverview, page: &Page<DomainView>) -> String {
    let content = html! {
        h1 { "Topology domains" }
        (coordinator_banner(o.coordinator_reachable, &o.coordinator_error))
        @if page.total == 0 {
            p.muted { "No domain is pinned to a shard." }
        } @else {
            div.scroll { table {
                thead { tr { th { "Key" } th { "Value" } th { "Shard" } } }
                tbody { @for d in &page.items { tr {
                    td.mono { (d.topology_key) }
                    td.mono { (d.topology_value) }
                    td { (shard_link(&d.shard_id)) }
                } } }
            } }
            (pager("/domains", "", page, "domains"))
        }
    };
    layout(
        shell,
        "Domains",
        Nav::Domains,
        false,
        o.computed_at_unix_nanos,
        content,
    )
}
