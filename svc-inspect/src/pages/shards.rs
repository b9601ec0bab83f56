//! `/shards/{id}`: one shard's page, and the shard rows the overview lists.

use super::{
    Nav, Shell, card, coordinator_banner, key_history_section, layout, shard_link, shard_status,
    shortfall_table,
};
use maud::{Markup, html};

use crate::fleet::FleetOverview;
use crate::history::{KeyHistory, ShardSample};
use crate::html::{coarse, pct, timestamp};
use crate::view::{MACHINE_STATES, ShardView, ShortfallView, TransfersView, short_state};

pub(super) fn unknown_if_down(sh: &ShardView, v: impl ToString) -> String {
    if sh.reachable {
        v.to_string()
    } else {
        "–".to_owned()
    }
}

/// Live counts when the shard described itself; otherwise what it last reported to the
/// coordinator, marked as such.
pub(super) fn shard_machines(sh: &ShardView) -> (String, String) {
    if sh.reachable && sh.source == "shard-info" {
        let parts: Vec<String> = MACHINE_STATES
            .iter()
            .filter_map(|st| {
                let n = sh
                    .machines_by_state
                    .get(st.as_str_name())
                    .copied()
                    .unwrap_or(0);
                (n != 0).then(|| format!("{} {n}", short_state(st.as_str_name()).to_lowercase()))
            })
            .collect();
        (
            sh.machines_by_state.values().sum::<i32>().to_string(),
            parts.join(" · "),
        )
    } else {
        match sh.reported_total_machines {
            Some(n) => (n.to_string(), "as last reported".to_owned()),
            None => ("–".to_owned(), String::new()),
        }
    }
}

pub(super) fn last_report(sh: &ShardView) -> String {
    if sh.last_report_age_ms < 0 {
        "never".to_owned()
    } else {
        format!("{} ago", coarse(sh.last_report_age_ms))
    }
}

/// How old the inventory the shard decides on is (at `now`), and whether its provider's
/// Lists fail (stale) or leave known machines out (removals held).
pub(super) fn inventory(sh: &ShardView, now: i64) -> Markup {
    html! {
        @if !sh.reachable || sh.source != "shard-info" {
            "–"
        } @else {
            @if sh.inventory_stale { span.bad { "stale" } " · " }
            @if sh.inventory_listed_at_unix_ns > 0 {
                "listed " (coarse((now - sh.inventory_listed_at_unix_ns).max(0) / 1_000_000)) " ago"
            } @else {
                "never listed"
            }
            @if sh.removals_held > 0 {
                " · " span.warn { (sh.removals_held) " removals held" }
            }
        }
    }
}

pub(super) fn unmet_text(sh: &ShardView) -> String {
    if sh.unmet_needs < 0 {
        "?".to_owned()
    } else {
        sh.unmet_needs.to_string()
    }
}

pub(super) fn shard_row(sh: &ShardView) -> Markup {
    let (machines, by_state) = shard_machines(sh);
    html! {
        tr {
            td { (shard_link(&sh.shard_id)) }
            td.mono { (sh.address) }
            td { (shard_status(sh.reachable, &sh.error)) }
            td { (last_report(sh)) }
            td.num { (unknown_if_down(sh, sh.cycle)) }
            td.num { (machines) }
            td.muted { (by_state) }
            td.num { (unknown_if_down(sh, sh.sessions)) }
            td.num { (unknown_if_down(sh, sh.needs)) }
            td.num { (unknown_if_down(sh, unmet_text(sh))) }
        }
    }
}

/// `/shards/{id}`: one shard's figures, history, shortfalls and links to its machines and
/// actions.
pub fn shard(
    shell: Shell,
    o: &FleetOverview,
    sh: &ShardView,
    history: Option<&KeyHistory<ShardSample>>,
    interval_ms: u64,
    transfers: &Result<TransfersView, String>,
) -> String {
    let (machines, by_state) = shard_machines(sh);
    let shortfalls: Vec<ShortfallView> = o
        .shortfalls
        .iter()
        .filter(|s| s.shard_id == sh.shard_id)
        .map(ShortfallView::from_proto)
        .collect();
    let id = pct(&sh.shard_id);
    let content = html! {
        h1 { "Shard " span.mono { (sh.shard_id) } }
        (coordinator_banner(o.coordinator_reachable, &o.coordinator_error))
        div.cards {
            (card("status", shard_status(sh.reachable, &sh.error)))
            (card("machines", &machines))
            (card("sessions", unknown_if_down(sh, sh.sessions)))
            (card("needs", unknown_if_down(sh, sh.needs)))
            (card("unmet needs", unknown_if_down(sh, unmet_text(sh))))
            (card("cycle", unknown_if_down(sh, sh.cycle)))
            (card("actions in flight", unknown_if_down(sh, sh.actions_in_flight)))
            (card("inventory", inventory(sh, o.computed_at_unix_nanos)))
            (card("last report", last_report(sh)))
        }
        p.muted {
            "Address " span.mono { (sh.address) } " · epoch " (sh.shard_epoch)
            @if !by_state.is_empty() { " · " (by_state) }
        }
        p.filters {
            a href=(format!("/machines?shard={id}")) { "Machines on this shard" }
            a href=(format!("/actions?shard={id}")) { "Recent actions" }
            a.muted href=(format!("/api/v1/shards/{id}/history")) { "History JSON" }
        }
        (key_history_section(history, interval_ms, "This shard's figures (gaps: unreachable)", "--history-max-shards", &[
            ("machines", "machines", |s| s.reachable.then_some(s.machines)),
            ("sessions", "sessions", |s| s.reachable.then_some(s.sessions)),
            ("needs", "needs", |s| s.reachable.then_some(s.needs)),
            ("unmet_needs", "unmet needs", |s| s.reachable.then_some(s.unmet_needs)),
            ("cycle", "cycle", |s| s.reachable.then_some(s.cycle)),
        ]))
        h2 { "Shortfalls" }
        @if shortfalls.is_empty() {
            p.muted { "This shard reports no unmet demand." }
        } @else {
            (shortfall_table(&shortfalls))
        }
        (ownership_section(&sh.shard_id, transfers))
    };
    layout(
        shell,
        &format!("Shard {}", sh.shard_id),
        Nav::None,
        true,
        o.computed_at_unix_nanos,
        content,
    )
}

/// The shard's domains, unacknowledged instructions and the transfers it gives or receives
/// (in flight first, then recent, newest first), from the coordinator (ADR-0139).
pub(super) fn ownership_section(
    shard_id: &str,
    transfers: &Result<TransfersView, String>,
) -> Markup {
    html! {
        h2 id="transfers" { "Domains and transfers" }
        @match transfers {
            Err(e) => {
                p.muted { "The coordinator's transfer read failed: " span.mono { (e) } }
            }
            Ok(v) => {
                @let own = v.shards.iter().find(|s| s.shard_id == shard_id);
                p {
                    "Owned domains: "
                    @match own.filter(|s| !s.domains.is_empty()) {
                        Some(s) => { span.mono.domains { (s.domains.join(", ")) } }
                        None => { span.muted { "none pinned" } }
                    }
                    " · pending instructions: "
                    @match own.filter(|s| !s.pending_instruction_ids.is_empty()) {
                        Some(s) => { span.mono.pending { (s.pending_instruction_ids.join(", ")) } }
                        None => { span.muted { "none" } }
                    }
                }
                @if v.active.is_empty() && v.recent.is_empty() {
                    p.muted { "No transfer gives or receives machines of this shard." }
                } @else {
                    div.scroll { table.transfers {
                        thead { tr {
                            th { "Transfer" } th { "Kind" } th { "Phase" } th { "Donor" }
                            th { "Recipient" } th { "Asked" } th.num { "Moved" }
                            th { "Pending instruction" } th { "Started" } th { "Updated" }
                            th { "Reason" }
                        } }
                        tbody { @for t in v.active.iter().chain(&v.recent) {
                            tr data-phase=(t.phase) {
                                td.mono { (t.transfer_id) }
                                td { (t.kind) }
                                td { (t.phase) }
                                td { (shard_link(&t.donor_shard_id)) }
                                td { (shard_link(&t.recipient_shard_id)) }
                                td.mono { (t.selector_text()) }
                                td.num { (t.moved) }
                                td.mono {
                                    @if t.is_active() {
                                        (t.pending_instruction_id) " → " (t.pending_shard_id)
                                    } @else { span.muted { "-" } }
                                }
                                td { (timestamp(t.started_at_unix_ns)) }
                                td { (timestamp(t.updated_at_unix_ns)) }
                                td { (t.reason) }
                            }
                        } }
                    } }
                }
            }
        }
    }
}
