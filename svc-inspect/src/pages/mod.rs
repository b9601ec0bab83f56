//! The server-rendered dashboard: maud templates (every interpolated value is HTML-escaped
//! by the template library; ids, addresses, errors and label values are not ours), a
//! stylesheet and one small script served by inspect itself, sparklines as inline SVG.
//!
//! Live pages wrap their content in `<main id="live">` and carry `data-refresh` on the
//! body: `/static/live.js` refetches the page and swaps that element in place (ADR-0136).
//! Without JavaScript every page is complete; it just does not update.
//!
//! This module holds the shell, the shared pieces (banners, cards, pager, history charts) and
//! the error page; each page family has its own file.

mod activity;
mod clusters;
mod overview;
mod placement;
mod shards;

pub use activity::{MachineFilters, actions, machines};
pub use clusters::{cluster, clusters};
pub use overview::overview;
pub use placement::{domains, shortfalls};
pub use shards::shard;

use maud::{DOCTYPE, Markup, html};

use crate::chart::{span_text, sparkline};
use crate::history::{FleetHistory, KeyHistory};
use crate::html::{pct, timestamp};
use crate::view::{Page, ShortfallView, resources_text};

/// Seconds between in-place refreshes of live pages unless configured otherwise.
pub const REFRESH_SECONDS: u64 = 5;

/// The stylesheet served at `/static/dashboard.css`.
pub const STYLESHEET: &str = include_str!("../assets/dashboard.css");
/// The refresh script served at `/static/live.js`.
pub const LIVE_SCRIPT: &str = include_str!("../assets/live.js");

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
    use crate::fleet::FleetOverview;
    use crate::view::{ClusterNeedsView, NeedRow, ShardView, SupplyView};

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
            unmet_reason: "PRIORITY_STARVED".into(),
            requirements: vec!["zone In [a]".into()],
            aggregate_resources: [("cpu".to_owned(), "8".to_owned())].into(),
            residual_deficit: [("cpu".to_owned(), "4".to_owned())].into(),
            claimed_machine_count: 1,
            same_domain: "rack-<1>".into(),
            age_cycles_unmet: 12,
            matching_supply: Some(SupplyView {
                idle: 0,
                configured: 9,
                speculative: 0,
                capped: true,
            }),
            ..NeedRow::default()
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
