//! The server-rendered dashboard: maud templates (every interpolated value is HTML-escaped
//! by the template library; ids, addresses, errors and label values are not ours), a
//! stylesheet and one small script served by inspect itself, sparklines as inline SVG.
//!
//! Live pages wrap their content in `<main id="live">` and carry `data-refresh` on the
//! body: `/static/live.js` refetches the page and swaps that element in place (ADR-0136).
//! Without JavaScript every page is complete; it just does not update.

use maud::{DOCTYPE, Markup, html};

use crate::chart::{span_text, sparkline};
use crate::fleet::{ClusterIndex, FleetOverview};
use crate::history::{ClusterSample, FleetHistory, KeyHistory, ShardSample};
use crate::html::{coarse, pct, timestamp};
use crate::view::{
    ClusterNeedsView, ClusterView, DomainView, MACHINE_STATES, NeedRow, Page, ShardFetchView,
    ShardView, ShortfallView, TransfersView, resources_text, short_state,
};

/// Seconds between in-place refreshes of live pages unless configured otherwise.
pub const REFRESH_SECONDS: u64 = 5;

/// The stylesheet served at `/static/dashboard.css`.
pub const STYLESHEET: &str = include_str!("assets/dashboard.css");
/// The refresh script served at `/static/live.js`.
pub const LIVE_SCRIPT: &str = include_str!("assets/live.js");

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Clusters,
    Shortfalls,
    Domains,
    Actions,
    Machines,
    None,
}

/// Page-independent settings.
#[derive(Debug, Clone, Copy)]
pub struct Shell {
    /// Seconds between in-place refreshes of live pages; 0: never.
    pub refresh_secs: u64,
}

impl Default for Shell {
    fn default() -> Self {
        Self {
            refresh_secs: REFRESH_SECONDS,
        }
    }
}

/// The document around a page's content; `live` pages refresh in place.
/// `assembled_at`: when the page's data was put together (0: not said), shown below the
/// content inside the part live refresh replaces, so it stays current.
fn layout(
    shell: Shell,
    title: &str,
    nav: Nav,
    live: bool,
    assembled_at: i64,
    content: Markup,
) -> String {
    let refresh = (live && shell.refresh_secs > 0).then_some(shell.refresh_secs);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · BigFleet" }
                link rel="stylesheet" href="/static/dashboard.css";
                @if refresh.is_some() {
                    script src="/static/live.js" defer {}
                }
            }
            body data-refresh=[refresh] {
                header {
                    a.brand href="/" { "BigFleet" }
                    nav {
                        @for (entry, href, label) in [
                            (Nav::Overview, "/", "Overview"),
                            (Nav::Clusters, "/clusters", "Clusters"),
                            (Nav::Shortfalls, "/shortfalls", "Shortfalls"),
                            (Nav::Domains, "/domains", "Domains"),
                            (Nav::Actions, "/actions", "Actions"),
                            (Nav::Machines, "/machines", "Machines"),
                        ] {
                            a href=(href) aria-current=[(entry == nav).then_some("page")] { (label) }
                        }
                    }
                    form action="/cluster" method="get" {
                        input name="id" placeholder="cluster id" aria-label="cluster id";
                        " "
                        button { "Open" }
                    }
                }
                main #live { (content) (assembled(assembled_at)) }
                footer {
                    span #live-status {
                        @if let Some(s) = refresh { "Updates in place every " (s) " s." }
                    }
                    " JSON: "
                    a href="/api/v1/summary" { "/api/v1/summary" }
                    " · "
                    a href="/api/v1/history" { "/api/v1/history" }
                }
            }
        }
    }
    .into_string()
}

fn assembled(computed_at: i64) -> Markup {
    html! {
        @if computed_at > 0 {
            p.muted.assembled { "Data assembled " (timestamp(computed_at)) "." }
        }
    }
}

fn coordinator_banner(reachable: bool, error: &str) -> Markup {
    html! {
        @if !reachable {
            div.banner role="alert" {
                strong { "Coordinator unreachable." }
                " Showing the shards known from its last answer. "
                span.mono { (error) }
            }
        } @else if !error.is_empty() {
            div.note {
                strong { "Coordinator partly unreadable:" }
                " "
                span.mono { (error) }
            }
        }
    }
}

fn card(label: &str, value: impl maud::Render) -> Markup {
    html! {
        div.card { div.n { (value) } div.l { (label) } }
    }
}

/// « Prev · Page x of y (n items) · Next », preserving `extra` query parameters (raw, the
/// template escapes them).
fn pager<T>(base: &str, extra: &str, page: &Page<T>, noun: &str) -> Markup {
    let link = |p: usize| format!("{base}?page={p}&page_size={}{extra}", page.page_size);
    html! {
        @if page.pages <= 1 {
            div.pager.muted { (page.total) " " (noun) }
        } @else {
            nav.pager aria-label="pages" {
                @if page.page > 1 {
                    a href=(link(page.page - 1)) rel="prev" { "« Prev" }
                }
                span { "Page " (page.page) " of " (page.pages) " (" (page.total) " " (noun) ")" }
                @if page.page < page.pages {
                    a href=(link(page.page + 1)) rel="next" { "Next »" }
                }
            }
        }
    }
}

fn shard_status(reachable: bool, error: &str) -> Markup {
    html! {
        @if reachable {
            span.ok { "reachable" }
        } @else {
            span.bad { "unreachable" } " " span.mono { (error) }
        }
    }
}

fn shard_link(id: &str) -> Markup {
    html! { a.mono href=(format!("/shards/{}", pct(id))) { (id) } }
}

fn cluster_link(id: &str) -> Markup {
    html! { a href=(format!("/clusters/{}", pct(id))) { (id) } }
}

const SAMPLING_OFF: &str = "Sampling is off (--sample-interval 0).";

/// A "History" section: a heading that says how far back it reaches, then the charts.
fn history_section(
    interval_ms: u64,
    samples: usize,
    what: &str,
    charts: Vec<(&str, &str, Vec<Option<i64>>)>,
) -> Markup {
    let span = span_text(samples, interval_ms);
    html! {
        section.history data-samples=(samples) {
            h2 { "History" }
            @if interval_ms == 0 {
                p.muted { (SAMPLING_OFF) }
            } @else {
                p.muted {
                    (what) ", one sample every " (humantime::format_duration(std::time::Duration::from_millis(interval_ms)))
                    @if samples <= 1 {
                        "; " (samples) " sample so far."
                    } @else {
                        "; " (samples) " samples (" (span) ")."
                    }
                }
                div.sparks {
                    @for (series, label, values) in &charts {
                        (sparkline(series, label, values, &span))
                    }
                }
            }
        }
    }
}

/// One chart of a per-shard or per-cluster history: series name, label, and the sample's
/// value (`None` draws a gap).
type KeyChart<T> = (&'static str, &'static str, fn(&T) -> Option<i64>);

/// The "History" section of a shard or cluster page. `history` is `None` when the key has
/// no samples: sampling is off, nothing was sampled yet, or the key is past the bound that
/// `bound_flag` sets.
fn key_history_section<T>(
    history: Option<&KeyHistory<T>>,
    interval_ms: u64,
    what: &str,
    bound_flag: &str,
    charts: &[KeyChart<T>],
) -> Markup {
    let Some(h) = history else {
        return html! {
            h2 { "History" }
            p.muted {
                @if interval_ms == 0 { (SAMPLING_OFF) }
                @else { "Not sampled yet (or beyond " (bound_flag) ")." }
            }
        };
    };
    let charts = charts
        .iter()
        .map(|(series, label, value)| (*series, *label, h.samples.iter().map(value).collect()))
        .collect();
    history_section(interval_ms, h.samples.len(), what, charts)
}

fn fleet_charts(h: &FleetHistory) -> Markup {
    let col = |f: &dyn Fn(&crate::history::FleetSample) -> Option<i64>| -> Vec<Option<i64>> {
        h.samples.iter().map(f).collect()
    };
    let charts = vec![
        ("machines", "machines", col(&|s| Some(s.machines))),
        ("idle", "idle machines", col(&|s| Some(s.idle))),
        ("sessions", "sessions", col(&|s| Some(s.sessions))),
        ("needs", "needs", col(&|s| Some(s.needs))),
        ("unmet_needs", "unmet needs", col(&|s| Some(s.unmet_needs))),
        ("shortfalls", "shortfalls", col(&|s| Some(s.shortfalls))),
        ("actions", "actions per sample", col(&|s| s.actions)),
        (
            "shards_reachable",
            "shards reachable",
            col(&|s| Some(i64::from(s.shards_reachable))),
        ),
        ("clusters", "clusters with demand", col(&|s| s.clusters)),
    ];
    history_section(h.interval_ms, h.samples.len(), "Fleet-wide figures", charts)
}

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

fn unknown_if_down(sh: &ShardView, v: impl ToString) -> String {
    if sh.reachable {
        v.to_string()
    } else {
        "–".to_owned()
    }
}

/// Live counts when the shard described itself; otherwise what it last reported to the
/// coordinator, marked as such.
fn shard_machines(sh: &ShardView) -> (String, String) {
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

fn last_report(sh: &ShardView) -> String {
    if sh.last_report_age_ms < 0 {
        "never".to_owned()
    } else {
        format!("{} ago", coarse(sh.last_report_age_ms))
    }
}

/// How old the inventory the shard decides on is (at `now`), and whether its provider's
/// Lists fail (stale) or leave known machines out (removals held).
fn inventory(sh: &ShardView, now: i64) -> Markup {
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

fn unmet_text(sh: &ShardView) -> String {
    if sh.unmet_needs < 0 {
        "?".to_owned()
    } else {
        sh.unmet_needs.to_string()
    }
}

fn shard_row(sh: &ShardView) -> Markup {
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
fn ownership_section(shard_id: &str, transfers: &Result<TransfersView, String>) -> Markup {
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

fn shortfall_table(rows: &[ShortfallView]) -> Markup {
    html! {
        div.scroll { table {
            thead { tr {
                th.num { "Unmet for (cycles)" } th.num { "Priority" } th { "Shard" } th { "Cluster" }
                th { "Deficit" } th { "Requirements" } th { "Interruption penalty" }
            } }
            tbody { @for s in rows { tr {
                td.num { (s.age_cycles) }
                td.num { (s.priority) }
                td { (shard_link(&s.shard_id)) }
                td {
                    @if s.cluster_id.is_empty() { span.muted { "unknown" } }
                    @else { (cluster_link(&s.cluster_id)) }
                }
                td.mono { (resources_text(&s.deficit)) }
                td.mono { (s.requirements.join("; ")) }
                td { (s.interruption_penalty_bucket) }
            } } }
        } }
    }
}

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

fn unreachable_notes(shards: &[ShardFetchView]) -> Markup {
    html! {
        @for s in shards.iter().filter(|s| !s.reachable) {
            div.note {
                "Shard " strong.mono { (s.shard_id) } " (" span.mono { (s.address) } ") is unreachable: "
                span.mono { (s.error) } ". Its rows are missing below."
            }
        }
    }
}

/// `/clusters`: every cluster with demand on a reachable shard.
pub fn clusters(shell: Shell, index: &ClusterIndex, page: &Page<ClusterView>) -> String {
    let content = html! {
        h1 { "Clusters" }
        @if !index.coordinator_error.is_empty() {
            (coordinator_banner(false, &index.coordinator_error))
        }
        (unreachable_notes(&index.shards))
        @if page.total == 0 {
            p.muted { "No cluster has demand on a reachable shard." }
        } @else {
            div.scroll { table {
                thead { tr {
                    th { "Cluster" } th { "Shards" } th.num { "Needs" } th.num { "Unmet" }
                    th.num { "Top priority" } th.num { "Longest unmet (cycles)" }
                } }
                tbody { @for c in &page.items { tr {
                    td { (cluster_link(&c.cluster_id)) }
                    td.mono { (c.shards.join(", ")) }
                    td.num { (c.needs) }
                    td.num {
                        @if c.unmet_needs > 0 { span.bad { (c.unmet_needs) } } @else { "0" }
                    }
                    td.num { (c.max_priority) }
                    td.num { (c.max_age_cycles_unmet) }
                } } }
            } }
            (pager("/clusters", "", page, "clusters"))
        }
    };
    layout(
        shell,
        "Clusters",
        Nav::Clusters,
        true,
        index.computed_at_unix_nanos,
        content,
    )
}

fn reason_label(reason: &str) -> (&'static str, &'static str) {
    match reason {
        "PRIORITY_STARVED" => (
            "priority-starved",
            "fitting machines exist but are held: by equal-or-higher precedence work, this need itself, or machines in transit",
        ),
        "NO_MATCHING_SUPPLY" => (
            "no matching supply",
            "no fitting machine exists in the shard",
        ),
        "TOPOLOGY_UNSATISFIABLE" => (
            "topology unsatisfiable",
            "no single domain of this shard can host the co-located need",
        ),
        "PREEMPTION_EXHAUSTED" => (
            "preemption exhausted",
            "preemption found victims but not enough to cover the deficit",
        ),
        "" => ("unclassified", "the shard did not classify why"),
        _ => ("other", "a reason this dashboard does not know"),
    }
}

fn same_domain_text(n: &NeedRow) -> String {
    let mut same = String::new();
    if !n.same_domain.is_empty() {
        same.push_str("chosen ");
        same.push_str(&n.same_domain);
    }
    if !n.same_candidates.is_empty() {
        let list: Vec<String> = n
            .same_candidates
            .iter()
            .map(|c| {
                format!(
                    "{} {}.{}%{}",
                    c.domain,
                    c.coverage_per_mille / 10,
                    c.coverage_per_mille % 10,
                    if c.satisfiable { " ✓" } else { "" }
                )
            })
            .collect();
        if !same.is_empty() {
            same.push_str("; ");
        }
        same.push_str("candidates: ");
        same.push_str(&list.join(", "));
    }
    if n.acquisition_parked {
        same.push_str(&format!(" (parked {} cycles)", n.parked_age_cycles));
    }
    same
}

fn need_row(index: usize, n: &NeedRow) -> Markup {
    let supply = n.matching_supply.as_ref().map(|m| {
        format!(
            "idle {} · configured {} · speculative {}{}",
            m.idle,
            m.configured,
            m.speculative,
            if m.capped { " (capped)" } else { "" }
        )
    });
    let preemption = n.preemption.as_ref().map(|p| {
        format!(
            "{} victims freeing {}",
            p.victims_found,
            resources_text(&p.capacity_freed)
        )
    });
    html! {
        tr {
            td.num.muted { (index) }
            td.num { (n.priority) }
            td {
                @if n.satisfied { span.ok { "satisfied" } } @else { span.bad { "unmet" } }
            }
            td {
                @if !n.satisfied {
                    @let (label, help) = reason_label(&n.unmet_reason);
                    span.warn title=(help) { (label) }
                }
            }
            td.mono { (resources_text(&n.aggregate_resources)) }
            td.mono { (resources_text(&n.residual_deficit)) }
            td.num.nowrap {
                (n.claimed_machine_count)
                @if n.bootstrap_count + n.provision_count > 0 {
                    " " span.muted { "(+" (n.bootstrap_count) " boot, +" (n.provision_count) " prov)" }
                }
            }
            td.mono { (supply.unwrap_or_default()) }
            td.mono { (preemption.unwrap_or_default()) }
            td.mono { (same_domain_text(n)) }
            td.num { (n.age_cycles_unmet) }
            td.mono { (n.requirements.join("; ")) }
            td.mono { (n.shard_id.as_deref().unwrap_or("")) }
        }
    }
}

/// `/clusters/{id}`: the cluster's history and needs with verdicts, one page at a time.
pub fn cluster(
    shell: Shell,
    v: &ClusterNeedsView,
    history: Option<&KeyHistory<ClusterSample>>,
    interval_ms: u64,
) -> String {
    let id = pct(&v.cluster_id);
    let base = format!("/clusters/{id}");
    let reachable: Vec<&ShardFetchView> = v.shards.iter().filter(|s| s.reachable).collect();
    let cycles: Vec<String> = reachable
        .iter()
        .map(|s| {
            format!(
                "{} cycle {} at {}",
                s.shard_id,
                s.cycle,
                timestamp(s.computed_at_unix_nanos)
            )
        })
        .collect();
    let content = html! {
        h1 { "Cluster " span.mono { (v.cluster_id) } }
        @if !v.coordinator_error.is_empty() {
            (coordinator_banner(false, &v.coordinator_error))
        }
        (unreachable_notes(&v.shards))
        div.cards {
            (card("needs", v.satisfied + v.unmet))
            (card("satisfied", v.satisfied))
            (card("unmet", v.unmet))
        }
        p.filters {
            a href=(base) class=[(!v.unmet_only).then_some("on")] { "All needs" }
            a href=(format!("{base}?unmet=true")) class=[v.unmet_only.then_some("on")] { "Unmet only" }
            " "
            a href=(format!("/machines?cluster={id}")) { "Machines" }
            a href=(format!("/actions?cluster={id}")) { "Recent actions" }
            a.muted href=(format!("/api/v1/clusters/{id}/needs{}", if v.unmet_only { "?unmet=true" } else { "" })) { "JSON" }
            a.muted href=(format!("/api/v1/clusters/{id}/history")) { "History JSON" }
        }
        (key_history_section(history, interval_ms, "This cluster's demand", "--history-max-clusters", &[
            ("needs", "needs", |s| Some(s.needs)),
            ("unmet_needs", "unmet needs", |s| Some(s.unmet_needs)),
            ("max_age_cycles_unmet", "longest unmet (cycles)", |s| Some(s.max_age_cycles_unmet)),
        ]))
        h2 { "Needs" }
        @if v.needs.total == 0 {
            @if !reachable.is_empty() && reachable.iter().all(|s| s.cycle == 0) {
                p.muted { "No decision cycle has run yet, so there are no verdicts (not the same as no demand)." }
            } @else if v.unmet_only && v.satisfied > 0 {
                p.ok { "Every need of this cluster is satisfied." }
            } @else {
                p.muted { "No reachable shard holds demand from this cluster." }
            }
        } @else {
            div.scroll { table {
                thead { tr {
                    th.num { "#" } th.num { "Priority" } th { "Status" } th { "Unmet reason" }
                    th { "Demand" } th { "Residual deficit" } th.num { "Claimed" }
                    th { "Matching supply" } th { "Preemption" } th { "Same-domain" }
                    th.num { "Unmet for (cycles)" } th { "Requirements" } th { "Shard" }
                } }
                tbody {
                    @let first = (v.needs.page - 1) * v.needs.page_size + 1;
                    @for (i, n) in v.needs.items.iter().enumerate() { (need_row(first + i, n)) }
                }
            } }
            (pager(&base, if v.unmet_only { "&unmet=true" } else { "" }, &v.needs, "needs"))
        }
        @if !cycles.is_empty() {
            p.muted { "Verdicts are from each shard's last cycle: " (cycles.join("; ")) "." }
        }
    };
    layout(
        shell,
        &format!("Cluster {}", v.cluster_id),
        Nav::None,
        true,
        v.computed_at_unix_nanos,
        content,
    )
}

fn shard_errors(errors: &[crate::view::ShardErrorView]) -> Markup {
    html! {
        @for e in errors {
            div.note {
                "Shard " strong.mono { (e.shard_id) } " did not answer: " span.mono { (e.error) }
                ". Its rows are missing below."
            }
        }
    }
}

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

/// An error page (coordinator and every shard unknown, bad query, unknown path or id).
pub fn error(title: &str, message: &str) -> String {
    let content = html! {
        h1 { (title) }
        div.banner role="alert" { (message) }
        p { a href="/" { "Back to the overview" } }
    };
    layout(Shell::default(), title, Nav::None, false, 0, content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{overview as fleet, shard};
    use crate::view::SupplyView;
    use std::collections::BTreeMap;

    fn empty_history() -> FleetHistory {
        crate::history::History::new(Default::default(), std::time::Duration::from_secs(5)).fleet()
    }

    /// Cluster `c` with `rows` on one page and no shard answers recorded.
    fn needs_of_c(rows: &[NeedRow]) -> ClusterNeedsView {
        let unmet = rows.iter().filter(|r| !r.satisfied).count();
        ClusterNeedsView {
            cluster_id: "c".into(),
            unmet_only: false,
            computed_at_unix_nanos: 1,
            coordinator_error: String::new(),
            shards: vec![],
            satisfied: rows.len() - unmet,
            unmet,
            needs: Page::of(rows, 1, 50),
        }
    }

    #[test]
    fn the_overview_names_down_shards_and_escapes_their_errors() {
        let o = fleet(vec![shard("s1", true), shard("s<2>", false)]);
        let page = Page::of(&o.shards, 1, 50);
        let html = overview(Shell::default(), &o, &page, &empty_history());
        assert!(html.contains("s&lt;2&gt;"));
        assert!(!html.contains("s<2>"));
        assert!(html.contains("unavailable: &lt;refused&gt;"));
        assert!(html.contains("1 of 2 shards did not answer"));
        // Refreshed in place by the script, never by a full reload.
        assert!(!html.contains("http-equiv"));
        assert!(html.contains("<body data-refresh=\"5\">"), "{html}");
        assert!(html.contains("<script src=\"/static/live.js\" defer>"));
        assert!(html.contains("<main id=\"live\">"));
        assert!(html.contains("href=\"/shards/s%3C2%3E\""));
        assert!(!html.contains("Coordinator unreachable"));
    }

    #[test]
    fn a_down_coordinator_shows_a_banner() {
        let o = FleetOverview {
            coordinator_reachable: false,
            coordinator_error: "coordinator http://x:1: ListShards failed".into(),
            ..fleet(vec![])
        };
        let html = overview(
            Shell::default(),
            &o,
            &Page::of(&o.shards, 1, 50),
            &empty_history(),
        );
        assert!(html.contains("Coordinator unreachable."));
        assert!(html.contains("ListShards failed"));
    }

    #[test]
    fn cluster_rows_show_the_verdict_details() {
        let row = NeedRow {
            shard_id: Some("s1".into()),
            cluster_id: "c".into(),
            priority: 100,
            arrival_unix_nanos: 0,
            profile_fingerprint: String::new(),
            satisfied: false,
            unmet_reason: "PRIORITY_STARVED".into(),
            requirements: vec!["zone In [a]".into()],
            aggregate_resources: [("cpu".to_owned(), "8".to_owned())].into(),
            min_unit: BTreeMap::new(),
            residual_deficit: [("cpu".to_owned(), "4".to_owned())].into(),
            spread: vec![],
            group: String::new(),
            interruption_penalty_bucket: String::new(),
            reclamation_penalty_bucket: String::new(),
            claimed_machine_count: 1,
            bootstrap_count: 0,
            provision_count: 0,
            same_domain: "rack-<1>".into(),
            same_satisfiable: false,
            acquisition_parked: false,
            parked_age_cycles: 0,
            age_cycles_unmet: 12,
            matching_supply: Some(SupplyView {
                idle: 0,
                configured: 9,
                speculative: 0,
                capped: true,
            }),
            preemption: None,
            same_candidates: vec![],
        };
        let v = needs_of_c(&[row]);
        let html = cluster(Shell::default(), &v, None, 5000);
        assert!(html.contains("priority-starved"));
        assert!(html.contains("idle 0 · configured 9 · speculative 0 (capped)"));
        assert!(html.contains("cpu=4"));
        assert!(html.contains("chosen rack-&lt;1&gt;"));
    }

    #[test]
    fn an_unsampled_shard_or_cluster_says_why_it_has_no_history() {
        let o = fleet(vec![shard("s1", true)]);
        let transfers = Err("coordinator down".to_owned());
        let v = needs_of_c(&[]);
        for interval_ms in [0, 5000] {
            let shard_page = super::shard(
                Shell::default(),
                &o,
                &o.shards[0],
                None,
                interval_ms,
                &transfers,
            );
            let cluster_page = super::cluster(Shell::default(), &v, None, interval_ms);
            for (page, flag) in [
                (&shard_page, "--history-max-shards"),
                (&cluster_page, "--history-max-clusters"),
            ] {
                assert!(page.contains("<h2>History</h2>"), "{page}");
                assert!(!page.contains("<figure class=\"spark\""), "{page}");
                let why = format!("Not sampled yet (or beyond {flag}).");
                if interval_ms == 0 {
                    assert!(
                        page.contains("Sampling is off (--sample-interval 0)."),
                        "{page}"
                    );
                    assert!(!page.contains(&why), "{page}");
                } else {
                    assert!(page.contains(&why), "{page}");
                }
            }
        }
    }

    #[test]
    fn the_shard_page_says_when_its_inventory_is_stale_or_removals_are_held() {
        let now = 1_000_000_000_000;
        let stale = ShardView {
            inventory_stale: true,
            inventory_listed_at_unix_ns: now - 90_000_000_000,
            removals_held: 4,
            ..shard("s1", true)
        };
        let fresh = ShardView {
            inventory_listed_at_unix_ns: now - 2_000_000_000,
            ..shard("s2", true)
        };
        let o = FleetOverview {
            computed_at_unix_nanos: now,
            ..fleet(vec![stale, fresh])
        };
        let transfers = Err("coordinator down".to_owned());
        let page = |i: usize| super::shard(Shell::default(), &o, &o.shards[i], None, 0, &transfers);
        let html = page(0);
        assert!(
            html.contains("<span class=\"bad\">stale</span> · listed 1m 30s ago · <span class=\"warn\">4 removals held</span>"),
            "{html}"
        );
        let html = page(1);
        assert!(html.contains("listed 2s ago"), "{html}");
        assert!(
            !html.contains("removals held") && !html.contains(">stale<"),
            "{html}"
        );
    }

    #[test]
    fn the_actions_page_escapes_what_shards_send() {
        let v = crate::http::ActionsResponse {
            actions: vec![crate::view::ActionView {
                shard_id: "s<1>".into(),
                seq: 1,
                cycle: 1,
                kind: "bootstrap".into(),
                reason: "phase1.idle".into(),
                machine_id: "m\"1".into(),
                cluster_id: "c&1".into(),
                need_fingerprint: "fp".into(),
                group: String::new(),
                priority: 5,
                grace_seconds: 0.0,
                action_id: "a".into(),
                outcome: "failed".into(),
                decided_at_unix_nanos: 1,
                started_at_unix_nanos: 2,
                finished_at_unix_nanos: 3_000_000_000,
                run_nanos: 2_000_000_000,
            }],
            unreachable: vec![],
        };
        let html = actions(Shell::default(), &v, "<c>", "", &empty_history());
        assert!(
            html.contains("s&lt;1&gt;") && html.contains("m&quot;1") && html.contains("c&amp;1")
        );
        assert!(html.contains("/actions?cluster=c%261") && html.contains("&lt;c&gt;"));
        assert!(!html.contains("<c>") && !html.contains("s<1>"));
        assert!(html.contains("class=\"bad\">failed"));
    }

    #[test]
    fn pages_without_a_refresh_carry_no_script_and_a_zero_refresh_turns_it_off() {
        let e = error("Not found", "<nope>");
        assert!(!e.contains("live.js") && !e.contains("data-refresh"));
        assert!(e.contains("&lt;nope&gt;"));
        let o = fleet(vec![]);
        let off = overview(
            Shell { refresh_secs: 0 },
            &o,
            &Page::of(&o.shards, 1, 50),
            &empty_history(),
        );
        assert!(!off.contains("live.js") && !off.contains("data-refresh"));
    }

    #[test]
    fn the_overview_draws_the_fleet_history() {
        let h = crate::history::History::new(Default::default(), std::time::Duration::from_secs(5));
        let o = fleet(vec![shard("s1", true)]);
        for at in [1_000, 6_000] {
            h.record(&crate::history::Round {
                at_unix_ms: at,
                overview: &o,
                clusters: None,
                actions_recorded: None,
            });
        }
        let html = overview(
            Shell::default(),
            &o,
            &Page::of(&o.shards, 1, 50),
            &h.fleet(),
        );
        assert_eq!(html.matches("<figure class=\"spark\"").count(), 9, "{html}");
        assert!(html.contains("data-series=\"machines\" data-samples=\"2\" data-last=\"7\""));
        assert!(
            html.contains("one sample every 5s; 2 samples (the last 5s)"),
            "{html}"
        );
        let shard_page = super::shard(
            Shell::default(),
            &o,
            &o.shards[0],
            h.shard("s1").as_ref(),
            5000,
            &Err("coordinator down".to_owned()),
        );
        assert!(shard_page.contains("transfer read failed"));
        assert_eq!(shard_page.matches("<figure class=\"spark\"").count(), 5);
        assert!(shard_page.contains("href=\"/machines?shard=s1\""));
    }
}
